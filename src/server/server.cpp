// `plumb serve`'s HTTP server (server.h): routes, the one-at-a-time generation with its queue, the prefix cache, and
// the event streams. Request checks and bodies are openai.cpp's.
#include "server/server.h"

#include <fmt/format.h>
#include <httplib.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <deque>
#include <future>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

namespace plumb::server {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string random_id(const char* prefix) {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mu);
  return fmt::format("{}{:016x}{:08x}", prefix, rng(), uint32_t(rng()));
}

void send_error(httplib::Response& res, const RequestError& e) {
  res.status = e.status;
  res.set_content(to_text(error_body(e.what(), e.type, e.param)), "application/json");
}

// One server-sent event: "data: <json>\n\n".
std::string event(const json& j) { return "data: " + to_text(j) + "\n\n"; }

}  // namespace

// The one thread every generation runs on, in arrival order: the session is created, fed and destroyed there (backend
// cuda keeps per-thread state, the cuBLASLt workspaces and plans, and its sessions want one thread at a time).
// run(f) queues f and waits for it; f's exception comes back to the caller.
class EngineThread {
 public:
  EngineThread() : thread_([this] { loop(); }) {}
  ~EngineThread() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  template <typename F>
  void run(F&& f) {
    std::packaged_task<void()> task(std::forward<F>(f));
    auto done = task.get_future();
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(std::move(task));
    }
    cv_.notify_one();
    done.get();
  }

 private:
  void loop() {
    for (;;) {
      std::packaged_task<void()> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return quit_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // (quit, and nothing left)
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> jobs_;
  bool quit_ = false;
  std::thread thread_;  // (last: started once the members above exist)
};

struct Server::Impl {
  ServerOptions opt;
  httplib::Server http;
  // The model, set once by set_model(); read by the handlers only after `ready` (acquire) says it is there.
  std::shared_ptr<Engine> engine;
  std::optional<Tokenizer> tok;
  Defaults defaults;
  std::atomic<bool> ready{false};
  std::atomic<bool> entered{false};  // run() called (stop() before it must not be lost: see stop())
  std::atomic<bool> left{false};     // run() returned

  EngineThread engine_thread;        // one generation at a time; the session and the cache below are its own
  std::atomic<int> in_flight{0};     // requests generating or waiting to
  std::atomic<bool> stopping{false};
  std::unique_ptr<Session> session;
  std::vector<int32_t> fed;          // the tokens the session holds, in order
  // The last prompt but its last token (prefix cache): always the first cp->position() tokens of `fed` (taken there,
  // and the session since then only grew from it, came back to it, or dropped it with a reset).
  std::shared_ptr<const SessionCheckpoint> cp;

  mutable std::mutex stats_mu;
  Stats stats;

  explicit Impl(ServerOptions o) : opt(std::move(o)) {}

  void log(const std::string& line) {
    if (opt.log) opt.log(line);
    else fmt::print(stderr, "{}\n", line);
  }

  // Puts the session at the longest prefix of `prompt` it can return to, shorter than the prompt (generate() needs a
  // token to feed); returns its length.
  int64_t reuse(const std::vector<int32_t>& prompt) {
    if (!session) session = engine->new_session();
    // Whether fed's first n tokens are a prefix of the prompt, shorter than it.
    auto is_prefix = [&](size_t n) { return n < prompt.size() && std::equal(fed.begin(), fed.begin() + n, prompt.begin()); };
    if (opt.prefix_cache) {
      if (!fed.empty() && is_prefix(fed.size())) return int64_t(fed.size());
      if (cp && is_prefix(size_t(cp->position()))) {
        try {
          session->restore(*cp);
          fed.resize(size_t(cp->position()));
          return int64_t(fed.size());
        } catch (const Error&) {  // (left behind: start over below)
        }
      }
    }
    return start_over();
  }

  int64_t start_over() {
    if (!session) session = engine->new_session();
    session->reset();
    fed.clear();
    cp.reset();
    return 0;
  }

  // Feeds `head` (the prompt's tokens from fed.size() on, but its last) and appends to `scored` each one's log
  // probability given the tokens before it but the first's (an echoed prompt's logprobs; nullptr: none): each
  // position's logits predict the next token, so the rows of head[0..m-1] score prompt[fed.size()+1 .. +m]. In
  // passes of kScorePass tokens (their logits come to the host: n x vocab floats), fed growing with each, so that
  // a stop part way leaves fed what the session holds.
  static constexpr size_t kScorePass = 256;
  void feed_head(std::span<const int32_t> head, const std::vector<int32_t>& prompt, int top, std::vector<TokenLogprob>* scored) {
    if (!scored) {
      session->forward(head);
      fed.insert(fed.end(), head.begin(), head.end());
      return;
    }
    const size_t vocab = size_t(engine->info().vocab_size);
    while (!head.empty()) {
      const auto pass = head.first(std::min(head.size(), kScorePass));
      const std::vector<float> logits = session->forward_all(pass);
      for (size_t i = 0; i < pass.size(); ++i)
        scored->push_back(token_logprob(std::span(logits).subspan(i * vocab, vocab), prompt[fed.size() + i + 1], top));
      fed.insert(fed.end(), pass.begin(), pass.end());
      head = head.subspan(pass.size());
    }
  }

  struct Outcome {
    GenerateResult r;
    int64_t cached = 0;
    double seconds = 0;
  };

  // Runs one request on the session (on the engine thread). Any failure drops the session's state: what it holds is then
  // unknown, and the next request starts on an empty cache.
  Outcome generate_locked(const Request& q, const std::function<void(std::string_view)>& on_text,
                          const std::function<bool()>& should_stop, std::vector<TokenLogprob>* logprobs = nullptr) {
    const auto t0 = std::chrono::steady_clock::now();
    Outcome out;
    GenerateOptions gen = q.gen;
    gen.should_stop = should_stop;
    if (logprobs && q.top_logprobs >= 0)
      gen.on_logits = [&](std::span<const float> logits, int32_t id) { logprobs->push_back(token_logprob(logits, id, q.top_logprobs)); };
    // An echoed prompt with logprobs is scored token by token: fed from an empty cache, whose logits it needs.
    const bool score = q.echo && q.top_logprobs >= 0 && logprobs;
    auto ended = [&](StopReason why) {
      out.r.stop = why;
      out.r.prompt_tokens = int64_t(q.prompt.size());
      out.seconds = seconds_since(t0);
      return out;
    };
    if (q.gen.max_tokens == 0 && !score) return ended(StopReason::Length);  // (echo alone: nothing to compute)
    try {
      out.cached = score ? start_over() : reuse(q.prompt);
      std::span<const int32_t> rest(q.prompt);
      rest = rest.subspan(size_t(out.cached));
      if (score) {
        TokenLogprob first;
        first.id = q.prompt[0];
        first.unscored = true;
        logprobs->push_back(first);
      }
      if ((opt.prefix_cache || score) && rest.size() > 1) {
        // All but the last prompt token, then a checkpoint there: a next prompt that shares this one but its end (a
        // retry, a thinking chat's next turn) comes back to it.
        const auto prev = session->set_prefill_stop(should_stop);
        try {
          feed_head(rest.first(rest.size() - 1), q.prompt, q.top_logprobs, score ? logprobs : nullptr);
        } catch (const Stopped&) {
          session->set_prefill_stop(prev);
          return ended(StopReason::Cancelled);
        }
        session->set_prefill_stop(prev);
        if (opt.prefix_cache) cp = session->checkpoint();
        rest = rest.last(1);
      }
      if (q.gen.max_tokens == 0) return ended(StopReason::Length);  // (the prompt scored: the last token's logits did it)
      gen.history_before = fed;  // (the penalties see the cached prefix as if it had been fed with the rest)
      out.r = generate(*session, *tok, rest, gen, on_text);
      out.r.prompt_tokens = int64_t(q.prompt.size());
      if (!(out.r.stop == StopReason::Cancelled && out.r.tokens.empty())) {  // (a prefill stopped: nothing fed)
        fed.insert(fed.end(), rest.begin(), rest.end());
        fed.insert(fed.end(), out.r.tokens.begin(), out.r.tokens.end() - (out.r.unfed >= 0 ? 1 : 0));
      }
    } catch (...) {
      session.reset();
      fed.clear();
      cp.reset();
      throw;
    }
    out.seconds = seconds_since(t0);
    return out;
  }

  static RequestError shutting_down() { return RequestError(503, "server_busy", "", "the server is shutting down"); }

  // generate_locked on the engine thread, after the requests queued before this one; refused once stop() was asked.
  Outcome run_request(const Request& q, const std::function<void(std::string_view)>& on_text,
                      const std::function<bool()>& should_stop, std::vector<TokenLogprob>* logprobs = nullptr) {
    Outcome o;
    engine_thread.run([&] {
      if (stopping) throw shutting_down();
      o = generate_locked(q, on_text, should_stop, logprobs);
    });
    return o;
  }

  static json usage_of(const Request& q, const Outcome& o) {
    return usage_json(int64_t(q.prompt.size()), int64_t(o.r.tokens.size()), o.cached);
  }

  void count(const Outcome& o) {
    std::lock_guard<std::mutex> lock(stats_mu);
    ++stats.requests;
    stats.generated_tokens += int64_t(o.r.tokens.size());
    stats.cached_tokens += o.cached;
    stats.cancelled += o.r.stop == StopReason::Cancelled;
  }

  void log_done(const char* path, const Request& q, const Outcome& o) {
    const auto n = int64_t(o.r.tokens.size());
    log(fmt::format("{} 200{}: {} prompt tokens ({} cached), {} generated ({}), {:.2f} s{}", path, q.stream ? " stream" : "",
                    q.prompt.size(), o.cached, n, stop_reason_name(o.r.stop), o.seconds,
                    n > 1 && o.r.decode_seconds > 0 ? fmt::format(", decode {:.1f} tok/s", double(n - 1) / o.r.decode_seconds)
                                                    : std::string()));
  }

  ResponseIds ids_for(const Request& q) const {
    return {random_id(q.chat ? "chatcmpl-" : "cmpl-"), int64_t(std::time(nullptr)), defaults.model_id};
  }

  void handle(const httplib::Request& req, httplib::Response& res, bool chat) {
    const char* path = chat ? "/v1/chat/completions" : "/v1/completions";
    Request q;
    try {
      if (!ready.load(std::memory_order_acquire)) throw RequestError(503, "server_busy", "", "the model is loading");
      const json body = parse_body(req.body);
      q = chat ? parse_chat(body, *tok, defaults) : parse_completion(body, *tok, defaults);
      if (stopping) throw shutting_down();
      // (the one generating counts too: max_queue wait behind it)
      if (in_flight.fetch_add(1) >= opt.max_queue + 1) {
        in_flight.fetch_sub(1);
        res.set_header("Retry-After", "1");
        throw RequestError(503, "server_busy", "", fmt::format("the server is busy: {} requests are waiting (--max-queue)",
                                                               opt.max_queue));
      }
    } catch (const RequestError& e) {
      log(fmt::format("{} {}{}: {}", path, e.status, e.param.empty() ? "" : " " + e.param, e.what()));
      send_error(res, e);
      return;
    }
    if (q.stream) stream(q, res, path);
    else whole(q, res, path);
  }

  void whole(const Request& q, httplib::Response& res, const char* path) {
    struct Release {
      std::atomic<int>& n;
      ~Release() { n.fetch_sub(1); }
    } release{in_flight};
    std::string text;
    Outcome o;
    std::vector<TokenLogprob> lp;
    try {
      o = run_request(q, [&](std::string_view s) { text += s; }, [&] { return stopping.load(); }, &lp);
    } catch (const RequestError& e) {
      send_error(res, e);
      return;
    } catch (const std::exception& e) {
      log(fmt::format("{} 500: {}", path, e.what()));
      send_error(res, RequestError(500, "server_error", "", e.what()));
      return;
    }
    count(o);
    log_done(path, q, o);
    if (o.r.stop == StopReason::Cancelled) {  // (only stop() cancels a whole response: its client cannot be seen)
      send_error(res, RequestError(503, "server_busy", "", "the generation was cancelled: the server is stopping"));
      return;
    }
    const json usage = usage_of(q, o);
    const ResponseIds ids = ids_for(q);
    // (chat: a stop token ends the reply without being part of its content, so its entry is left out as its text is;
    // completions list every sampled token, as completion_tokens counts them and vLLM lists them: a harness that
    // scores an echoed prompt by dropping the last entry, the one generated token, must find it there)
    if (q.chat && o.r.stop == StopReason::Token && !o.r.tokens.empty() && !lp.empty()) lp.pop_back();
    json logprobs;
    if (q.top_logprobs >= 0) logprobs = q.chat ? chat_logprobs(lp, *tok) : completion_logprobs(lp, *tok, q.top_logprobs > 0);
    json body;
    if (q.chat) {
      std::string reasoning, content;
      ReasoningSplit split(q.thinking);
      split.push(text, reasoning, content);
      split.flush(reasoning, content);
      body = chat_response(ids, reasoning, content, q.thinking, finish_reason(o.r.stop), usage, logprobs);
    } else {
      body = completion_response(ids, q.echo_text + text, finish_reason(o.r.stop), usage, logprobs);
    }
    res.set_content(to_text(body), "application/json");
  }

  void stream(const Request& q, httplib::Response& res, const char* path) {
    res.set_header("Cache-Control", "no-cache");
    auto done = std::make_shared<std::atomic<bool>>(false);
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, q, path, done](size_t, httplib::DataSink& sink) {
          struct Release {
            std::atomic<int>& n;
            std::atomic<bool>& done;
            ~Release() { n.fetch_sub(1), done = true; }
          } release{in_flight, *done};
          bool gone = false;
          auto send = [&](const std::string& s) {
            if (!gone && !sink.write(s.data(), s.size())) gone = true;
          };
          const ResponseIds ids = ids_for(q);
          ReasoningSplit split(q.thinking);
          if (q.chat) send(event(chat_chunk(ids, {{"role", "assistant"}, {"content", ""}}, nullptr)));
          if (q.echo && !q.echo_text.empty()) send(event(completion_chunk(ids, q.echo_text, nullptr)));
          auto piece = [&](std::string_view s, bool last) {
            if (!q.chat) {
              if (!s.empty()) send(event(completion_chunk(ids, std::string(s), nullptr)));
              return;
            }
            std::string reasoning, content;
            split.push(s, reasoning, content);
            if (last) split.flush(reasoning, content);
            if (!reasoning.empty()) send(event(chat_chunk(ids, {{"reasoning_content", reasoning}}, nullptr)));
            if (!content.empty()) send(event(chat_chunk(ids, {{"content", content}}, nullptr)));
          };
          Outcome o;
          try {
            // (the sink is written from the engine thread while this one waits for it)
            o = run_request(q, [&](std::string_view s) { piece(s, false); },
                            [&] { return stopping.load() || gone || !sink.is_writable(); });
          } catch (const std::exception& e) {
            const auto* re = dynamic_cast<const RequestError*>(&e);
            log(fmt::format("{} {} stream: {}", path, re ? re->status : 500, e.what()));
            send(event(error_body(e.what(), re ? re->type : "server_error", "")));
            sink.done();
            return true;
          }
          piece({}, true);
          count(o);
          log_done(path, q, o);
          if (o.r.stop == StopReason::Cancelled) {  // (its client gone, or stop(): no finish_reason for it in OpenAI's set)
            send(event(error_body("the generation was cancelled: the server is stopping", "server_busy", "")));
            sink.done();
            return true;
          }
          const json usage = usage_of(q, o);
          send(event(q.chat ? chat_chunk(ids, json::object(), finish_reason(o.r.stop))
                            : completion_chunk(ids, "", finish_reason(o.r.stop))));
          if (q.include_usage) send(event(usage_chunk(ids, q.chat, usage)));
          send("data: [DONE]\n\n");
          sink.done();
          return true;
        },
        [this, done](bool) {
          if (!done->exchange(true)) in_flight.fetch_sub(1);  // (the provider never ran: the client left first)
        });
  }

  void routes() {
    http.set_payload_max_length(opt.max_body_bytes);
    // Threads for the requests waiting on the generation, and a few more so /health and /v1/models answer meanwhile.
    // (an idle keep-alive connection holds a thread: kept short, so those spare threads stay free)
    const size_t threads = size_t(opt.max_queue) + 8;
    http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    http.set_keep_alive_timeout(2);
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (opt.api_key.empty() || req.path.rfind("/v1/", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
      if (req.get_header_value("Authorization") == "Bearer " + opt.api_key) return httplib::Server::HandlerResponse::Unhandled;
      log(fmt::format("{} 401: no or wrong API key", req.path));
      send_error(res, RequestError(401, "authentication_error", "", "this server needs an API key: \"Authorization: Bearer <key>\""));
      return httplib::Server::HandlerResponse::Handled;
    });
    // 503 while the model loads (as vLLM's and llama.cpp's servers answer), so a client or a load balancer can wait.
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      const bool up = ready.load(std::memory_order_acquire);
      res.status = up ? 200 : 503;
      res.set_content(up ? R"({"status":"ok"})" : R"({"status":"loading"})", "application/json");
    });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      if (!ready.load(std::memory_order_acquire)) return send_error(res, RequestError(503, "server_busy", "", "the model is loading"));
      const json m = {{"id", defaults.model_id}, {"object", "model"}, {"created", 0}, {"owned_by", "plumb"},
                      {"max_model_len", defaults.context}};
      res.set_content(to_text(json{{"object", "list"}, {"data", json::array({m})}}), "application/json");
    });
    http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) { handle(req, res, false); });
    http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) { handle(req, res, true); });
    http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;  // (an error a handler already explained)
      const std::string msg = res.status == 404 ? fmt::format("no such endpoint: {} {} (POST /v1/completions, POST "
                                                              "/v1/chat/completions, GET /v1/models, GET /health)", req.method, req.path)
                              : res.status == 413 ? fmt::format("the body is larger than the server takes ({})", res.status)
                                                  : fmt::format("HTTP {}", res.status);
      res.set_content(to_text(error_body(msg, "invalid_request_error", "")), "application/json");
    });
    http.set_exception_handler([this](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      log(fmt::format("{} 500: {}", req.path, what));
      send_error(res, RequestError(500, "server_error", "", what));
    });
  }
};

Server::Server(ServerOptions opt) : impl_(std::make_unique<Impl>(std::move(opt))) { impl_->routes(); }

void Server::set_model(std::shared_ptr<Engine> engine, Tokenizer tok, Defaults defaults) {
  if (impl_->ready) throw Error("plumb serve: set_model called twice (the server serves one model)");
  impl_->engine = std::move(engine);
  impl_->tok.emplace(std::move(tok));
  impl_->defaults = std::move(defaults);
  impl_->ready.store(true, std::memory_order_release);
}

Server::~Server() {
  stop();
  // The session goes where it was made (its GPU graphs and buffers with it), before the engine thread ends.
  impl_->engine_thread.run([this] { impl_->session.reset(), impl_->cp.reset(); });
  // (the engine, if this held the last reference, goes after: Impl's members)
}

int Server::bind() {
  const auto& o = impl_->opt;
  errno = 0;
  const int port = o.port == 0 ? impl_->http.bind_to_any_port(o.host) : (impl_->http.bind_to_port(o.host, o.port) ? o.port : -1);
  if (port < 0)
    throw Error(fmt::format("cannot listen on {}:{}{}", o.host, o.port,
                            errno ? fmt::format(": {}", std::strerror(errno)) : std::string(" (in use, or not an address of this machine)")));
  return port;
}

void Server::run() {
  impl_->entered = true;
  if (!impl_->stopping) impl_->http.listen_after_bind();
  impl_->left = true;
}

void Server::stop() {
  auto& i = *impl_;
  i.stopping = true;
  // httplib's stop() does nothing until its loop runs: once run() has been entered (and has not seen `stopping`),
  // wait for the loop, or for run() to return. (entered and stopping are both sequentially consistent: a run() that
  // starts after this reads stopping and returns at once.)
  if (i.entered)
    while (!i.http.is_running() && !i.left) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  i.http.stop();
}

Server::Stats Server::stats() const {
  std::lock_guard<std::mutex> lock(impl_->stats_mu);
  return impl_->stats;
}

}  // namespace plumb::server
