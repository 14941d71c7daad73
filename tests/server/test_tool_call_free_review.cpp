// A review of commit 1ff2174 (plumb serve: tool_choice "auto" masked as OutputFormat::ToolCalls with required false,
// thinking mode with tool_choice "required" / a named function allowed): requests the auto path used to serve (FINDING
// tests: refused by 1ff2174, served again since), and the auto path over HTTP with thinking, logprobs, streaming, stop
// strings, n > 1 and the prefix cache against generate() itself.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <mutex>
#include <thread>

#include "server/openai.h"
#include "server/server.h"

#include "../unit/json_test_util.h"
#include "tiny_model.h"

namespace plumb::server {
namespace {

Defaults free_review_defaults() {
  Defaults d = testing::tiny_model_defaults();
  d.sampling.temperature = 0;
  d.fixed_seed = true;
  return d;
}

// A chat with tools and no tool_choice (OpenAI's default, "auto").
json free_review_body(const json& extra = json::object()) {
  const auto tt = testing::tool_turns();
  json body = {{"messages", json::parse(tt.messages.dump())}, {"tools", json::parse(tt.tools.dump())},
               {"temperature", 0}, {"max_tokens", 40}};
  for (const auto& [k, v] : extra.items()) body[k] = v;
  return body;
}

// The request parse_chat makes of `body`, or the RequestError's "status param: message".
std::string free_review_refusal(const json& body, const Tokenizer& tok, const Defaults& d) {
  try {
    parse_chat(body, tok, d);
  } catch (const RequestError& e) {
    return std::to_string(e.status) + " " + e.param + ": " + e.what();
  }
  return {};
}

struct FreeReviewServer {
  std::unique_ptr<Server> srv;
  std::thread thread;
  int port = 0;
  explicit FreeReviewServer(const Defaults& d, bool prefix_cache = true) {
    ServerOptions o;
    o.port = 0;
    o.prefix_cache = prefix_cache;
    o.log = [](std::string_view) {};
    srv = std::make_unique<Server>(o);
    port = srv->bind();
    srv->set_model(testing::tiny_engine(), testing::tiny_tok(), d);
    thread = std::thread([this] { srv->run(); });
  }
  ~FreeReviewServer() {
    srv->stop();
    thread.join();
  }
  std::pair<int, json> post(const json& body) const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(300, 0);
    auto res = c.Post("/v1/chat/completions", body.dump(), "application/json");
    if (!res) return {0, json()};
    json j;
    try {
      j = json::parse(res->body);
    } catch (const std::exception&) {
      j = res->body;
    }
    return {res->status, j};
  }
  std::vector<json> stream(json body) const {
    body["stream"] = true;
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(300, 0);
    auto res = c.Post("/v1/chat/completions", body.dump(), "application/json");
    std::vector<json> out;
    if (!res) return out;
    size_t at = 0;
    while ((at = res->body.find("data: ", at)) != std::string::npos) {
      const size_t end = res->body.find("\n\n", at);
      const std::string data = res->body.substr(at + 6, end - at - 6);
      out.push_back(data == "[DONE]" ? json("[DONE]") : json::parse(data));
      at = end;
    }
    return out;
  }
};

// FINDING: ignore_eos (vLLM's, for benchmarks) with tools and no tool_choice: before 1ff2174 the reply was text, read
// for calls, and the request was served; now every such request is a 400 naming tool_choice (which the request did not
// send): "tool_choice needs a token that ends the call block: EOS does not stop". The auto path needs no end token in
// its free text (max_tokens ends it, as it ends any text); only a block, once complete, needs one.
TEST(ToolCallFreeServeReview, IgnoreEosWithToolsUnderAutoIsStillServed) {
  const Defaults d = free_review_defaults();
  const json body = free_review_body({{"ignore_eos", true}, {"max_tokens", 12}});
  EXPECT_EQ(free_review_refusal(body, testing::tiny_tok(), d), "");
  FreeReviewServer s(d, false);
  const auto [status, r] = s.post(body);
  EXPECT_EQ(status, 200) << r.dump();
}

// FINDING: a server whose own --stop-token has text inside the DSML block's fixed text ("\n" here; or any token inside
// a tool's name, which call_opening puts in the fixed texts) used to serve every tool chat under "auto" (the stop token
// ending the reply as in any chat); now each is a 400 naming tool_choice. (Documented for "required"; under "auto" the
// mask could let such a token end the free text and keep it out of a block only.)
TEST(ToolCallFreeServeReview, AServerStopTokenInTheBlockTextDoesNotRefuseAutoToolChats) {
  Defaults d = free_review_defaults();
  d.stop_tokens.push_back(testing::tiny_tok().encode("\n").at(0));
  EXPECT_EQ(free_review_refusal(free_review_body(), testing::tiny_tok(), d), "");
}

// FINDING (minor): a tokenizer without a byte-level decoder (spaced tokens) now has every tool chat refused under
// "auto" (400 tool_choice: "needs a byte-level tokenizer"), where its replies used to be served as text and read for
// calls.
TEST(ToolCallFreeServeReview, ASpacedTokenizerStillServesAutoToolChats) {
  const auto dir = std::filesystem::temp_directory_path() / ("plumb_free_serve_spaced_" + std::to_string(::getpid()));
  const Tokenizer tok = Tokenizer::load(plumb::testing::write_byte_level_tokenizer(
      dir, {"Time", "?"}, true, {"<｜begin▁of▁sentence｜>", "<｜User｜>", "<think>", "</think>"}));
  Defaults d = free_review_defaults();
  d.vocab = std::max(d.vocab, tok.vocab_size());
  // (the same chat with tool_choice "none": served; with "auto": the question)
  EXPECT_EQ(free_review_refusal(free_review_body({{"tool_choice", "none"}}), tok, d), "");
  EXPECT_EQ(free_review_refusal(free_review_body(), tok, d), "");
  std::filesystem::remove_all(dir);
}

// FINDING: tools that the mask cannot hold used to be served under "auto" (the reply read for calls as written): a tool
// with "strict": true whose parameters use a keyword plumb does not hold ("pattern", "multipleOf": both in OpenAI's
// strict subset; the OpenAI Agents SDK marks its function tools strict by default), or two tools of one name. Since
// 1ff2174 every chat with such tools and no tool_choice is a 400 (naming tools / tool_choice), because ToolCallSpec::
// build refuses them for the auto mask too.
TEST(ToolCallFreeServeReview, ToolsTheMaskCannotHoldAreStillServedUnderAuto) {
  const Defaults d = free_review_defaults();
  json strict = free_review_body();
  strict["tools"].push_back({{"type", "function"}, {"function", {{"name", "lookup"}, {"strict", true},
      {"parameters", {{"type", "object"}, {"properties", {{"code", {{"type", "string"}, {"pattern", "^[A-Z]{3}$"}}}}},
                      {"required", {"code"}}, {"additionalProperties", false}}}}}});
  EXPECT_EQ(free_review_refusal(strict, testing::tiny_tok(), d), "");
  json twice = free_review_body();
  twice["tools"].push_back(twice["tools"][0]);
  EXPECT_EQ(free_review_refusal(twice, testing::tiny_tok(), d), "");
  // (with tool_choice "none" both are served: the tools are only rendered)
  strict["tool_choice"] = "none", twice["tool_choice"] = "none";
  EXPECT_EQ(free_review_refusal(strict, testing::tiny_tok(), d), "");
  EXPECT_EQ(free_review_refusal(twice, testing::tiny_tok(), d), "");
}

// The auto path over HTTP equals generate() with OutputFormat::ToolCalls, required false (thinking from the request):
// whole, streamed, with logprobs, n = 2, and from the prefix cache; stop strings inside the block are taken under auto
// (refused under required); thinking with tool_choice required is served (it was a 400 before).
TEST(ToolCallFreeServeReview, TheAutoPathIsGeneratesToolCallsMask) {
  const Defaults d = free_review_defaults();
  const auto tt = testing::tool_turns();
  FreeReviewServer s(d);
  int checked = 0;
  for (int thinking = 0; thinking < 2; ++thinking) {
    SCOPED_TRACE(thinking ? "thinking" : "chat");
    const json body = free_review_body({{"thinking", bool(thinking)}, {"max_tokens", 40}});
    ChatOptions co = tt.options;
    co.thinking = thinking;
    GenerateOptions g;
    g.sampling = d.sampling;
    g.sampling.temperature = 0;
    g.max_tokens = 40;
    g.stop_tokens = d.stop_tokens;
    g.skip_special = false;
    g.format = OutputFormat::ToolCalls, g.tool_calls.tools = tt.tools.dump(), g.tool_calls.required = false;
    g.tool_calls.thinking = thinking;
    const std::vector<int32_t> prompt = testing::tiny_tok().encode(encode_chat(tt.chat, co));
    auto session = testing::tiny_engine()->new_session();
    const GenerateResult want = generate(*session, testing::tiny_tok(), prompt, g);
    const ChatMessage parsed = parse_reply(want.text, thinking);
    const auto [status, r] = s.post(body);
    ASSERT_EQ(status, 200) << r.dump();
    const json& m = r["choices"][0]["message"];
    EXPECT_EQ(r["usage"]["completion_tokens"].get<size_t>(), want.tokens.size());
    if (thinking) {
      EXPECT_EQ(m["reasoning_content"], parsed.reasoning);
    }
    EXPECT_EQ(m["content"].is_null() ? std::string() : m["content"].get<std::string>(), parsed.content) << want.text;
    EXPECT_EQ(m.contains("tool_calls"), !parsed.tool_calls.empty());
    ++checked;
    // Again: the prefix cache's, the same reply.
    const auto [status2, r2] = s.post(body);
    ASSERT_EQ(status2, 200);
    EXPECT_EQ(r2["choices"][0]["message"], m);
    EXPECT_GT(r2["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), 0);
    // Streamed: the same content.
    std::string streamed, streamed_reasoning;
    for (const json& e : s.stream(body))
      if (e.is_object()) {
        streamed += e["choices"][0]["delta"].value("content", std::string());
        streamed_reasoning += e["choices"][0]["delta"].value("reasoning_content", std::string());
      }
    EXPECT_EQ(streamed, parsed.content);
    if (thinking) {
      EXPECT_EQ(streamed_reasoning, parsed.reasoning);
    }
    // Logprobs (the host path): the same reply, one entry per token but a final stop token.
    json with_lp = body;
    with_lp["logprobs"] = true, with_lp["top_logprobs"] = 2;
    const auto [status3, r3] = s.post(with_lp);
    ASSERT_EQ(status3, 200) << r3.dump();
    EXPECT_EQ(r3["choices"][0]["message"], m);
    EXPECT_EQ(r3["choices"][0]["logprobs"]["content"].size(),
              want.tokens.size() - (want.stop == StopReason::Token ? 1 : 0));
    // n = 2 at a temperature: two choices, each a 200's.
    json two = body;
    two["n"] = 2, two["temperature"] = 1.0, two["seed"] = 5;
    const auto [status4, r4] = s.post(two);
    ASSERT_EQ(status4, 200) << r4.dump();
    EXPECT_EQ(r4["choices"].size(), 2u);
    // Stop strings inside the block: taken under auto.
    json stopped = body;
    stopped["stop"] = json::array({"\n", "<｜DSML｜invoke"});
    const auto [status5, r5] = s.post(stopped);
    EXPECT_EQ(status5, 200) << r5.dump();
    // Thinking (or not) with tool_choice "required": served.
    json req = body;
    req["tool_choice"] = "required", req["max_tokens"] = 120, req["parallel_tool_calls"] = false;
    const auto [status6, r6] = s.post(req);
    EXPECT_EQ(status6, 200) << r6.dump();
    if (status6 == 200 && r6["choices"][0]["finish_reason"] == "tool_calls") {
      EXPECT_EQ(r6["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "now");
    }
  }
  EXPECT_EQ(checked, 2);
}

}  // namespace
}  // namespace plumb::server
