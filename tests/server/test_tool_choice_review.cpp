// A review of session 80: plumb serve's tool_choice "required" / a named function (then the opening's mask; since
// session 81 the whole block's, OutputFormat::ToolCalls).
#include <gtest/gtest.h>
#include <httplib.h>

#include <thread>

#include "server/openai.h"
#include "server/server.h"

#include "tiny_model.h"

namespace plumb::server {
namespace {

Defaults review_defaults() {
  Defaults d = testing::tiny_model_defaults();
  d.sampling.temperature = 0;
  d.fixed_seed = true;
  return d;
}

json required_body(const json& extra = json::object()) {
  const auto tt = testing::tool_turns();
  json body = {{"messages", json::parse(tt.messages.dump())}, {"tools", json::parse(tt.tools.dump())},
               {"tool_choice", "required"}, {"max_tokens", 80}};
  for (const auto& [k, v] : extra.items()) body[k] = v;
  return body;
}

// Found by a review (fixed since): a stop string inside the DSML opening ("\n", "<", "name", ...) is taken: the reply then stops inside the
// opening (at its first byte for "\n") and can never be a call, yet the request is a 200 with no tool_calls. It should
// be refused (400 naming stop, or tool_choice), as generate() refuses a stop token inside an opening.
TEST(ToolChoiceReview, AStopStringInsideTheOpeningIsRefused) {
  for (const char* stop : {"\n", "DSML", "name="}) {
    SCOPED_TRACE(stop);
    try {
      const Request r = parse_chat(required_body({{"stop", stop}}), testing::tiny_tok(), review_defaults());
      // Accepted: then what generate() gives must at least open the call.
      auto s = testing::tiny_engine()->new_session();
      const GenerateResult g = generate(*s, testing::tiny_tok(), r.prompt, r.gen);
      EXPECT_EQ(g.text.rfind("\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"now\">\n", 0), 0u)
          << "accepted, and the reply [" << g.text << "] stops (" << stop_reason_name(g.stop) << ") inside the opening";
    } catch (const RequestError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_TRUE(e.param == "stop" || e.param == "tool_choice") << e.param;
    }
  }
}

// Found by a review (fixed since): the server's own --stop-token (Defaults::stop_tokens) whose text lies inside the opening (here "\n") makes
// every tool_choice "required" request fail inside generate() ("is text inside the reply's opening"): a 500 after the
// request was accepted, where parse_chat could refuse it up front (or the server drop such a stop token until the
// opening is written).
TEST(ToolChoiceReview, AServerStopTokenInsideTheOpeningIsNoServerError) {
  Defaults d = review_defaults();
  d.stop_tokens.push_back(testing::tiny_tok().encode("\n").at(0));
  ServerOptions o;
  o.port = 0;
  o.prefix_cache = false;
  o.log = [](std::string_view) {};
  Server srv(o);
  const int port = srv.bind();
  srv.set_model(testing::tiny_engine(), testing::tiny_tok(), d);
  std::thread t([&] { srv.run(); });
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(120, 0);
  auto res = c.Post("/v1/chat/completions", required_body().dump(), "application/json");
  srv.stop();
  t.join();
  ASSERT_TRUE(res);
  EXPECT_LT(res->status, 500) << res->body;
}

// Every malformed tool_choice (with tools) is a 400 naming tool_choice: no other status, no other exception.
TEST(ToolChoiceReview, MalformedToolChoicesAre400sNamingIt) {
  const json shapes = json::array({5, true, json::array(), json::array({"required"}), json::object(), "", "REQUIRED",
                                   {{"type", 1}}, {{"type", "function"}}, {{"type", "function"}, {"function", "now"}},
                                   {{"type", "function"}, {"function", {{"name", 3}}}},
                                   {{"type", "function"}, {"function", {{"name", nullptr}}}},
                                   {{"type", "function"}, {"function", {{"name", ""}}}},
                                   {{"type", "function"}, {"function", {{"name", "now "}}}},
                                   {{"type", "tool"}, {"function", {{"name", "now"}}}}, {{"name", "now"}}});
  for (const json& c : shapes) {
    SCOPED_TRACE(c.dump());
    try {
      parse_chat(required_body({{"tool_choice", c}}), testing::tiny_tok(), review_defaults());
      ADD_FAILURE() << "accepted";
    } catch (const RequestError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.param, "tool_choice") << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a RequestError: " << e.what();
    }
  }
  // Accepted: the named tool, "required", "auto", "none", null (as absent).
  for (const json& c : json::array({"required", "auto", "none", nullptr,
                                    {{"type", "function"}, {"function", {{"name", "now"}}}}})) {
    SCOPED_TRACE(c.dump());
    EXPECT_NO_THROW(parse_chat(required_body({{"tool_choice", c}}), testing::tiny_tok(), review_defaults()));
  }
}

}  // namespace
}  // namespace plumb::server
