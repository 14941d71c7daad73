// A `plumb serve` server in process for the server tests: the bundled tiny model on the CPU, on a free port, serving
// on its own thread while it lives; requests whole or streamed.
#pragma once
#include <gtest/gtest.h>
#include <httplib.h>

#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <thread>
#include <vector>

#include "../unit/sanitized.h"
#include "server/server.h"
#include "tiny_model.h"

namespace plumb::server::testing {

// A server on a free port, serving on its own thread while it lives; its log lines are kept.
struct Running {
  std::vector<std::string> log;
  std::mutex log_mu;
  std::unique_ptr<Server> srv;
  std::thread thread;
  int port = 0;
  explicit Running(ServerOptions o = {}, const Defaults& d = tiny_model_defaults()) {
    o.port = 0;
    o.log = [this](std::string_view s) {
      std::lock_guard<std::mutex> lock(log_mu);
      log.emplace_back(s);
    };
    srv = std::make_unique<Server>(o);
    port = srv->bind();
    srv->set_model(tiny_engine(), tiny_tok(), d);
    thread = std::thread([this] { srv->run(); });
  }
  ~Running() {
    srv->stop();
    thread.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(120, 0);
    return c;
  }
  json post(const std::string& path, const json& body, int expect_status = 200) const {
    auto c = client();
    auto res = c.Post(path.c_str(), body.dump(), "application/json");
    EXPECT_TRUE(res) << httplib::to_string(res.error());
    if (!res) return {};
    EXPECT_EQ(res->status, expect_status) << res->body;
    return json::parse(res->body);
  }
  // The same request streamed ("stream": true): its events (events() below).
  std::vector<json> stream(const std::string& path, json body) const;
};


// The data lines of an event stream, parsed; "[DONE]" as the string "[DONE]".
inline std::vector<json> events(const std::string& body) {
  std::vector<json> out;
  size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const size_t end = body.find("\n\n", at);
    const std::string data = body.substr(at + 6, end - at - 6);
    out.push_back(data == "[DONE]" ? json("[DONE]") : json::parse(data));
    at = end;
  }
  return out;
}

inline std::vector<json> Running::stream(const std::string& path, json body) const {
  body["stream"] = true;
  auto c = client();
  auto res = c.Post(path.c_str(), body.dump(), "application/json");
  EXPECT_TRUE(res) << httplib::to_string(res.error());
  return res ? events(res->body) : std::vector<json>();
}

// A server's options for --parallel n (ServerOptions::parallel), with or without the prefix cache.
inline ServerOptions with_parallel(int n, bool cache = true, int max_queue = ServerOptions{}.max_queue) {
  ServerOptions o;
  o.parallel = n;
  o.prefix_cache = cache;
  o.max_queue = max_queue;
  return o;
}

// Each request (path, body) posted from a thread of its own, all at once; their responses in order.
inline std::vector<json> post_at_once(const Running& s, const std::vector<std::pair<std::string, json>>& requests) {
  std::vector<json> got(requests.size());
  std::vector<std::thread> ts;
  for (size_t i = 0; i < requests.size(); ++i) ts.emplace_back([&, i] { got[i] = s.post(requests[i].first, requests[i].second); });
  for (auto& t : ts) t.join();
  return got;
}

}  // namespace plumb::server::testing
