// `plumb serve` over HTTP in process (server/server.h, the bundled tiny model on the CPU): responses equal what
// generate() gives for the same prompt and options, streams equal whole responses, the prefix cache feeds only what a
// prompt adds and gives the same tokens, errors are OpenAI's JSON, a client that leaves cancels its generation.
#include <gtest/gtest.h>
#include <httplib.h>

#include <thread>

#include "server/server.h"

#include "running_server.h"
#include "tiny_model.h"

namespace plumb::server {
namespace {

using testing::tiny_engine;
using testing::tiny_tok;
using testing::Running;
using testing::events;

Defaults defaults() { return testing::tiny_model_defaults(); }

ServerOptions no_cache() {
  ServerOptions o;
  o.prefix_cache = false;
  return o;
}

// generate() on a fresh session: what a request must give.
GenerateResult direct(const std::vector<int32_t>& prompt, const GenerateOptions& g) {
  auto s = tiny_engine()->new_session();
  return generate(*s, tiny_tok(), prompt, g);
}

GenerateOptions greedy(int max_tokens) {
  GenerateOptions g;
  g.sampling.temperature = 0;
  g.max_tokens = max_tokens;
  g.stop_tokens = {tiny_engine()->info().eos_token};
  g.skip_special = true;
  return g;
}

// A streamed completion of 1500 tokens that EOS does not end: a request still generating when the client acts.
httplib::Request long_stream() {
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = json{{"prompt", "Once"}, {"max_tokens", 1500}, {"ignore_eos", true}, {"stream", true}}.dump();
  req.set_header("Content-Type", "application/json");
  return req;
}

TEST(Serve, CompletionEqualsGenerate) {
  Running s(no_cache());
  const std::string prompt = "Once upon a time";
  const json r = s.post("/v1/completions", {{"prompt", prompt}, {"temperature", 0}, {"max_tokens", 24}, {"model", "x"}});
  const GenerateResult want = direct(encode_prompt(tiny_tok(), prompt, tiny_engine()->info().bos_token), greedy(24));
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["model"], "tiny");
  EXPECT_EQ(r["choices"][0]["text"], want.text);
  EXPECT_EQ(r["choices"][0]["finish_reason"], want.stop == StopReason::Length ? "length" : "stop");
  EXPECT_EQ(r["usage"]["completion_tokens"], want.tokens.size());
  EXPECT_EQ(r["usage"]["prompt_tokens"], want.prompt_tokens);
  EXPECT_EQ(r["usage"]["total_tokens"], want.prompt_tokens + int64_t(want.tokens.size()));
  EXPECT_FALSE(want.text.empty());

  // Sampled with a seed: generate()'s tokens for that seed, every time.
  GenerateOptions g = greedy(24);
  g.sampling = SamplingParams{};
  g.sampling.seed = 77;
  const GenerateResult sampled = direct(encode_prompt(tiny_tok(), prompt, tiny_engine()->info().bos_token), g);
  for (int i = 0; i < 2; ++i) {
    const json q = s.post("/v1/completions", {{"prompt", prompt}, {"seed", 77}, {"max_tokens", 24}, {"temperature", 0.8},
                                              {"top_k", 40}, {"top_p", 0.95}, {"min_p", 0.05}});
    EXPECT_EQ(q["choices"][0]["text"], sampled.text) << i;
  }
}

TEST(Serve, StreamEqualsTheWholeResponse) {
  Running s;
  const json msgs = json::array({{{"role", "user"}, {"content", "Tell me about the sea."}}});
  const json whole = s.post("/v1/chat/completions", {{"messages", msgs}, {"temperature", 0}, {"max_tokens", 30}});
  EXPECT_EQ(whole["object"], "chat.completion");
  EXPECT_EQ(whole["choices"][0]["message"]["role"], "assistant");
  EXPECT_FALSE(whole["choices"][0]["message"].contains("reasoning_content"));  // (chat mode)

  auto c = s.client();
  const json body = {{"messages", msgs}, {"temperature", 0}, {"max_tokens", 30}, {"stream", true},
                     {"stream_options", {{"include_usage", true}}}};
  auto res = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/event-stream");
  const std::vector<json> ev = events(res->body);
  ASSERT_GE(ev.size(), 4u) << res->body;
  EXPECT_EQ(ev.front()["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(ev.back(), "[DONE]");
  const json& usage = ev[ev.size() - 2];
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], whole["usage"]["completion_tokens"]);
  const json& last = ev[ev.size() - 3];
  EXPECT_EQ(last["choices"][0]["finish_reason"], whole["choices"][0]["finish_reason"]);
  std::string text;
  for (size_t i = 1; i + 3 < ev.size(); ++i) {
    EXPECT_EQ(ev[i]["object"], "chat.completion.chunk");
    EXPECT_EQ(ev[i]["id"], ev.front()["id"]);
    EXPECT_TRUE(ev[i]["choices"][0]["finish_reason"].is_null());
    text += ev[i]["choices"][0]["delta"].value("content", std::string());
  }
  EXPECT_EQ(text, whole["choices"][0]["message"]["content"]);

  // A completion stream: its pieces are the whole text too.
  auto rc = c.Post("/v1/completions", json{{"prompt", "The sea"}, {"temperature", 0}, {"max_tokens", 20}, {"stream", true}}.dump(),
                   "application/json");
  ASSERT_TRUE(rc);
  const json wc = s.post("/v1/completions", {{"prompt", "The sea"}, {"temperature", 0}, {"max_tokens", 20}});
  std::string ct;
  for (const json& e : events(rc->body))
    if (e.is_object()) ct += e["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(ct, wc["choices"][0]["text"]);
}

TEST(Serve, PrefixCacheFeedsWhatThePromptAddsAndGivesTheSameTokens) {
  Running cached, fresh(no_cache());
  const Tokenizer& tok = tiny_tok();
  json msgs = json::array({{{"role", "user"}, {"content", "What is a lighthouse?"}}});
  const json first = cached.post("/v1/chat/completions", {{"messages", msgs}, {"temperature", 0}, {"max_tokens", 16}});
  EXPECT_EQ(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  const int64_t p1 = first["usage"]["prompt_tokens"];
  // The next turn: the history this server's reply came from, then a new question. The session holds the first
  // prompt and the reply but its last token: every one of those is cached when the reply re-encodes to its tokens.
  msgs.push_back({{"role", "assistant"}, {"content", first["choices"][0]["message"]["content"]}});
  msgs.push_back({{"role", "user"}, {"content", "And a harbour?"}});
  const json second = cached.post("/v1/chat/completions", {{"messages", msgs}, {"temperature", 0}, {"max_tokens", 16}});
  const int64_t hit = second["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_GE(hit, p1);
  const json ref = fresh.post("/v1/chat/completions", {{"messages", msgs}, {"temperature", 0}, {"max_tokens", 16}});
  EXPECT_EQ(ref["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(second["choices"][0]["message"]["content"], ref["choices"][0]["message"]["content"]);
  // The same prompt again (a retry): all of it but its last token from the checkpoint.
  const json again = cached.post("/v1/chat/completions", {{"messages", msgs}, {"temperature", 0}, {"max_tokens", 16}});
  EXPECT_EQ(again["usage"]["prompt_tokens_details"]["cached_tokens"], second["usage"]["prompt_tokens"].get<int64_t>() - 1);
  EXPECT_EQ(again["choices"][0]["message"]["content"], ref["choices"][0]["message"]["content"]);
  // A thinking-mode turn after a thinking turn: the history drops the reasoning, and the prompt leaves the previous
  // one at its last token (<think> becomes </think>): that checkpoint is the prefix.
  json tm = json::array({{{"role", "user"}, {"content", "Why is the sky blue?"}}});
  const json t1 = cached.post("/v1/chat/completions", {{"messages", tm}, {"thinking", true}, {"temperature", 0}, {"max_tokens", 12}});
  ASSERT_TRUE(t1["choices"][0]["message"].contains("reasoning_content"));
  tm.push_back({{"role", "assistant"}, {"content", "Rayleigh."}, {"reasoning_content", t1["choices"][0]["message"]["reasoning_content"]}});
  tm.push_back({{"role", "user"}, {"content", "And at sunset?"}});
  const json t2 = cached.post("/v1/chat/completions", {{"messages", tm}, {"thinking", true}, {"temperature", 0}, {"max_tokens", 12}});
  EXPECT_EQ(t2["usage"]["prompt_tokens_details"]["cached_tokens"], t1["usage"]["prompt_tokens"].get<int64_t>() - 1);
  const json t2ref = fresh.post("/v1/chat/completions", {{"messages", tm}, {"thinking", true}, {"temperature", 0}, {"max_tokens", 12}});
  EXPECT_EQ(t2["choices"][0]["message"], t2ref["choices"][0]["message"]);
  // Something else entirely: from an empty cache.
  const json other = cached.post("/v1/completions", {{"prompt", "Zebras"}, {"temperature", 0}, {"max_tokens", 4}});
  EXPECT_EQ(other["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(cached.srv->stats().requests, 6);
  (void)tok;
}

TEST(Serve, ErrorsAreOpenAiJson) {
  ServerOptions o;
  o.api_key = "sekrit";
  Running s(o);
  auto c = s.client();
  // /health needs no key; /v1/ does.
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto u = c.Get("/v1/models");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->status, 401);
  EXPECT_EQ(json::parse(u->body)["error"]["type"], "authentication_error");
  c.set_bearer_token_auth("sekrit");
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  EXPECT_EQ(json::parse(m->body)["data"][0]["id"], "tiny");
  auto bad = c.Post("/v1/completions", "{\"prompt\": \"a\", \"top_k\": \"many\"}", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(json::parse(bad->body)["error"]["param"], "top_k");
  auto junk = c.Post("/v1/chat/completions", "not json", "application/json");
  ASSERT_TRUE(junk);
  EXPECT_EQ(junk->status, 400);
  EXPECT_NE(json::parse(junk->body)["error"]["message"].get<std::string>().find("not valid JSON"), std::string::npos);
  auto none = c.Get("/v1/engines");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 404);
  EXPECT_NE(json::parse(none->body)["error"]["message"].get<std::string>().find("no such endpoint"), std::string::npos);
  // A stream refused before it starts is a plain JSON error, not an event stream.
  auto sb = c.Post("/v1/completions", json{{"prompt", "a"}, {"stream", true}, {"logprobs", 1}}.dump(), "application/json");
  ASSERT_TRUE(sb);
  EXPECT_EQ(sb->status, 400);
  EXPECT_EQ(json::parse(sb->body)["error"]["param"], "logprobs");
  EXPECT_EQ(s.srv->stats().requests, 0);
}

TEST(Serve, AClientThatLeavesCancelsItsGeneration) {
  Running s;
  httplib::Client c = s.client();
  httplib::Request req = long_stream();
  int chunks = 0;
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  c.send(req, res, err);  // (ends with an error: the receiver stopped it)
  c.stop();
  // The server notices at its next writes: the generation ends as cancelled, far before its 1500 tokens.
  for (int i = 0; i < 600 && s.srv->stats().requests == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto st = s.srv->stats();
  EXPECT_EQ(st.requests, 1);
  EXPECT_EQ(st.cancelled, 1);
  EXPECT_LT(st.generated_tokens, 1500);
  // And the server goes on.
  const json after = s.post("/v1/completions", {{"prompt", "Once"}, {"temperature", 0}, {"max_tokens", 3}});
  EXPECT_EQ(after["usage"]["completion_tokens"], 3);
}

// Log probabilities: the model's log-softmax at each step (the first against the prompt's own forward), greedy's token
// the most likely, the texts the reply's pieces.
TEST(Serve, LogprobsAreTheModelsOwn) {
  Running s(no_cache());
  const std::string prompt = "Once upon a time";
  const json r = s.post("/v1/completions", {{"prompt", prompt}, {"temperature", 0}, {"max_tokens", 8}, {"logprobs", 2}});
  const json& lp = r["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 8u);
  std::string text;
  for (size_t i = 0; i < 8; ++i) {
    text += lp["tokens"][i].get<std::string>();
    const double v = lp["token_logprobs"][i];
    EXPECT_LE(v, 0.0);
    ASSERT_EQ(lp["top_logprobs"][i].size(), 2u);
    EXPECT_EQ(lp["top_logprobs"][i].begin().value().get<double>(), v) << i;  // (greedy: the most likely one)
  }
  EXPECT_EQ(text, r["choices"][0]["text"]);
  auto session = tiny_engine()->new_session();
  const std::vector<float> l = session->forward(encode_prompt(tiny_tok(), prompt, tiny_engine()->info().bos_token));
  const float m = *std::max_element(l.begin(), l.end());
  double sum = 0;
  for (const float x : l) sum += std::exp(double(x) - m);
  EXPECT_NEAR(lp["token_logprobs"][0].get<double>(), double(m) - (m + std::log(sum)), 1e-9);
  // Chat: one entry per content token, EOS (the stop) left out; the same reply as without logprobs.
  const json msgs = json::array({{{"role", "user"}, {"content", "Hi"}}});
  const json a = s.post("/v1/chat/completions", {{"messages", msgs}, {"temperature", 0}, {"max_tokens", 30}, {"logprobs", true},
                                                 {"top_logprobs", 1}});
  const json b = s.post("/v1/chat/completions", {{"messages", msgs}, {"temperature", 0}, {"max_tokens", 30}});
  EXPECT_EQ(a["choices"][0]["message"], b["choices"][0]["message"]);
  EXPECT_TRUE(b["choices"][0]["logprobs"].is_null());
  const json& content = a["choices"][0]["logprobs"]["content"];
  const int64_t n = a["usage"]["completion_tokens"];
  EXPECT_EQ(int64_t(content.size()), a["choices"][0]["finish_reason"] == "stop" ? n - 1 : n);
  std::string chat_text;
  for (const json& e : content) chat_text += e["token"].get<std::string>();
  EXPECT_EQ(chat_text, a["choices"][0]["message"]["content"]);
}

// log-softmax of one row of logits at `id`, in fp64: what a logprob must be.
double log_softmax_at(std::span<const float> row, int32_t id) {
  const float m = *std::max_element(row.begin(), row.end());
  double sum = 0;
  for (const float x : row) sum += std::exp(double(x) - m);
  return double(row[size_t(id)]) - (m + std::log(sum));
}

// echo with logprobs (how evaluation harnesses score a text): each prompt token scored by the logits of the
// position before it (forward_all on a fresh session), the first null, across the server's scoring passes of 256
// tokens; with max_tokens 1 the generated token follows, as a request without echo samples it; the prefix cache
// works after it; a stream's first chunk is the prompt.
TEST(Serve, EchoScoresThePrompt) {
  Running s;  // (the prefix cache on: scoring starts from an empty cache, then leaves its checkpoint)
  std::string prompt;
  for (int i = 0; i < 70; ++i) prompt += i % 2 ? "the sea was calm. " : "Once upon a time ";
  const std::vector<int32_t> ids = encode_prompt(tiny_tok(), prompt, tiny_engine()->info().bos_token);
  ASSERT_GT(ids.size(), 300u);  // (more than one scoring pass)
  const json r = s.post("/v1/completions", {{"prompt", prompt}, {"echo", true}, {"max_tokens", 0}, {"logprobs", 1}});
  EXPECT_EQ(r["choices"][0]["text"], prompt);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["completion_tokens"], 0);
  EXPECT_EQ(r["usage"]["prompt_tokens"], ids.size());
  const json& lp = r["choices"][0]["logprobs"];
  ASSERT_EQ(lp["token_logprobs"].size(), ids.size());
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  const int32_t vocab = tiny_engine()->info().vocab_size;
  auto fresh = tiny_engine()->new_session();
  // (in the server's passes of 256 tokens: the reference breaks exact indexer-score ties, ReLU zeros, in PyTorch's
  // order, which depends on the pass's entries, so another split can differ at such a row: docs/serving.md)
  std::vector<float> all = fresh->forward_all(std::span(ids).first(256));
  const std::vector<float> more = fresh->forward_all(std::span(ids).subspan(256, ids.size() - 257));
  all.insert(all.end(), more.begin(), more.end());
  double worst = 0;
  size_t at = 0;
  for (size_t i = 1; i < ids.size(); ++i) {
    EXPECT_EQ(lp["tokens"][i], tiny_tok().decode({ids[i]})) << i;
    const double want = log_softmax_at(std::span(all).subspan((i - 1) * size_t(vocab), size_t(vocab)), ids[i]);
    const double d = std::abs(lp["token_logprobs"][i].get<double>() - want);
    if (d > worst) worst = d, at = i;
    ASSERT_EQ(lp["top_logprobs"][i].size(), 1u) << i;
    EXPECT_GE(lp["top_logprobs"][i].begin().value().get<double>(), lp["token_logprobs"][i].get<double>()) << i;
  }
  EXPECT_LT(worst, 1e-9) << "at prompt token " << at;

  // max_tokens 1: the prompt's entries, then the generated token, as a request without echo scores it.
  const std::string shorter = "Once upon a time";
  const json a = s.post("/v1/completions", {{"prompt", shorter}, {"echo", true}, {"max_tokens", 1}, {"logprobs", 1}, {"temperature", 0}});
  const json b = s.post("/v1/completions", {{"prompt", shorter}, {"max_tokens", 1}, {"logprobs", 1}, {"temperature", 0}});
  const size_t n = encode_prompt(tiny_tok(), shorter, tiny_engine()->info().bos_token).size();
  EXPECT_EQ(a["choices"][0]["text"], shorter + b["choices"][0]["text"].get<std::string>());
  ASSERT_EQ(a["choices"][0]["logprobs"]["tokens"].size(), n + 1);
  EXPECT_EQ(a["choices"][0]["logprobs"]["tokens"][n], b["choices"][0]["logprobs"]["tokens"][0]);
  EXPECT_NEAR(a["choices"][0]["logprobs"]["token_logprobs"][n].get<double>(),
              b["choices"][0]["logprobs"]["token_logprobs"][0].get<double>(), 1e-4);

  // The cache after scoring: the same reply as an uncached server's, part of the prompt from the cache.
  Running uncached(no_cache());
  const json body = {{"prompt", shorter + " there"}, {"temperature", 0}, {"max_tokens", 8}};
  s.post("/v1/completions", {{"prompt", shorter + " there"}, {"echo", true}, {"max_tokens", 0}, {"logprobs", 0}});
  const json c = s.post("/v1/completions", body);
  EXPECT_GT(c["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(c["choices"][0]["text"], uncached.post("/v1/completions", body)["choices"][0]["text"]);

  // A stream with echo: the prompt first, then the reply's pieces; echo alone with max_tokens 0 is the prompt.
  auto cl = s.client();
  auto rs = cl.Post("/v1/completions", json{{"prompt", shorter}, {"echo", true}, {"max_tokens", 6}, {"temperature", 0},
                                            {"stream", true}}.dump(), "application/json");
  ASSERT_TRUE(rs);
  const std::vector<json> ev = events(rs->body);
  ASSERT_GE(ev.size(), 3u) << rs->body;
  EXPECT_EQ(ev[0]["choices"][0]["text"], shorter);
  std::string st;
  for (const json& e : ev)
    if (e.is_object()) st += e["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(st, s.post("/v1/completions", {{"prompt", shorter}, {"echo", true}, {"max_tokens", 6}, {"temperature", 0}})["choices"][0]["text"]);
  const json only = s.post("/v1/completions", {{"prompt", shorter}, {"echo", true}, {"max_tokens", 0}});
  EXPECT_EQ(only["choices"][0]["text"], shorter);
  EXPECT_TRUE(only["choices"][0]["logprobs"].is_null());
}

// Several prompts (an evaluation harness's batch) and n choices each: choice index prompt * n + j, each equal to
// generate() of its prompt with the seed + j; the usage counts each prompt once; the prefix cache feeds a prompt's later
// choices from its checkpoint; a stream sends each choice's chunks in order, each ended by its finish_reason.
TEST(Serve, SeveralPromptsAndChoices) {
  Running fresh(no_cache()), cached;
  const std::vector<std::string> prompts = {"Once upon a time", "The sea"};
  const json body = {{"prompt", prompts}, {"n", 2}, {"seed", 5}, {"temperature", 0.8}, {"max_tokens", 12}};
  const json r = fresh.post("/v1/completions", body);
  ASSERT_EQ(r["choices"].size(), 4u) << r.dump();
  int64_t prompt_tokens = 0, completion_tokens = 0;
  std::vector<std::string> texts;
  for (size_t p = 0; p < 2; ++p) {
    const std::vector<int32_t> ids = encode_prompt(tiny_tok(), prompts[p], tiny_engine()->info().bos_token);
    prompt_tokens += int64_t(ids.size());
    for (size_t j = 0; j < 2; ++j) {
      const json& c = r["choices"][p * 2 + j];
      EXPECT_EQ(c["index"], p * 2 + j);
      GenerateOptions g = greedy(12);
      g.sampling = SamplingParams{};
      g.sampling.temperature = 0.8f;
      g.sampling.seed = 5 + j;
      const GenerateResult want = direct(ids, g);
      EXPECT_EQ(c["text"], want.text) << "prompt " << p << ", choice " << j;
      completion_tokens += int64_t(want.tokens.size());
      texts.push_back(c["text"]);
    }
  }
  EXPECT_NE(texts[0], texts[1]);  // (the seeds differ)
  EXPECT_EQ(r["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(r["usage"]["completion_tokens"], completion_tokens);

  // The cache: each prompt's second choice from the first's checkpoint (greedy: the same text as without the cache).
  json g = body;
  g["temperature"] = 0;
  const json a = fresh.post("/v1/completions", g), b = cached.post("/v1/completions", g);
  for (size_t c = 0; c < 4; ++c) EXPECT_EQ(a["choices"][c]["text"], b["choices"][c]["text"]) << c;
  // (cached_tokens counts what each prompt's first choice found in the cache, here nothing, the server's first request:
  // the later choices' reuse of their prompt is not counted again, so cached_tokens never exceeds prompt_tokens)
  EXPECT_EQ(b["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

  // The stream: the whole response's choices, in order, one finish_reason each.
  json sbody = body;
  sbody["stream"] = true;
  auto cl = fresh.client();
  auto res = cl.Post("/v1/completions", sbody.dump(), "application/json");
  ASSERT_TRUE(res);
  std::vector<std::string> streamed(4);
  std::vector<int> finishes(4, 0);
  int last = 0;
  for (const json& e : events(res->body)) {
    if (!e.is_object()) continue;
    const int i = e["choices"][0]["index"];
    EXPECT_GE(i, last) << "choice " << i << " after choice " << last;
    last = i;
    streamed[size_t(i)] += e["choices"][0]["text"].get<std::string>();
    finishes[size_t(i)] += !e["choices"][0]["finish_reason"].is_null();
  }
  for (size_t c = 0; c < 4; ++c) {
    EXPECT_EQ(streamed[c], texts[c]) << c;
    EXPECT_EQ(finishes[c], 1) << c;
  }

  // Chat with n 2: two messages; streamed, each choice opens with the assistant's role.
  const json msgs = json::array({{{"role", "user"}, {"content", "Hi"}}});
  const json ch = fresh.post("/v1/chat/completions", {{"messages", msgs}, {"n", 2}, {"seed", 3}, {"max_tokens", 10}});
  ASSERT_EQ(ch["choices"].size(), 2u);
  EXPECT_EQ(ch["choices"][1]["index"], 1);
  EXPECT_EQ(ch["choices"][1]["message"]["role"], "assistant");
  auto cs = cl.Post("/v1/chat/completions", json{{"messages", msgs}, {"n", 2}, {"seed", 3}, {"max_tokens", 10}, {"stream", true}}.dump(),
                    "application/json");
  ASSERT_TRUE(cs);
  std::vector<std::string> content(2);
  int roles = 0;
  for (const json& e : events(cs->body)) {
    if (!e.is_object()) continue;
    const json& d = e["choices"][0]["delta"];
    roles += d.contains("role");
    content[e["choices"][0]["index"].get<size_t>()] += d.value("content", std::string());
  }
  EXPECT_EQ(roles, 2);
  for (size_t c = 0; c < 2; ++c) EXPECT_EQ(content[c], ch["choices"][c]["message"]["content"]) << c;

  // An echoed prompt's scores, computed once, in every choice.
  const json e = cached.post("/v1/completions", {{"prompt", "Once upon a time"}, {"n", 2}, {"echo", true}, {"logprobs", 0},
                                                 {"max_tokens", 2}, {"seed", 1}});
  const size_t n = encode_prompt(tiny_tok(), "Once upon a time", tiny_engine()->info().bos_token).size();
  for (size_t c = 0; c < 2; ++c) {
    const json& lp = e["choices"][c]["logprobs"]["token_logprobs"];
    ASSERT_GT(lp.size(), n) << c;  // (the prompt's entries, then the generated tokens')
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(lp[i], e["choices"][0]["logprobs"]["token_logprobs"][i]) << c << " " << i;
    EXPECT_TRUE(lp[0].is_null());
  }
}

// A chat with tools and a tool's result to answer: the prompt encode_chat renders (its tokens counted in the usage),
// from the cache on the next turn; the reply (the tiny model calls no tool) is content with a plain finish_reason,
// whole and streamed alike.
TEST(Serve, ToolConversationsAreServed) {
  Running s;
  const auto tt = testing::tool_turns();
  const json& tools = tt.tools;
  const json& msgs = tt.messages;
  const json body = {{"messages", msgs}, {"tools", tools}, {"temperature", 0}, {"max_tokens", 12}};
  const json r = s.post("/v1/chat/completions", body);
  EXPECT_EQ(r["usage"]["prompt_tokens"], tiny_tok().encode(encode_chat(tt.chat, tt.options)).size());
  const json& m = r["choices"][0]["message"];
  EXPECT_TRUE(m["content"].is_string());
  EXPECT_FALSE(m.contains("tool_calls"));
  EXPECT_NE(r["choices"][0]["finish_reason"], "tool_calls");
  std::string streamed;
  for (const json& e : s.stream("/v1/chat/completions", body))
    if (e.is_object()) streamed += e["choices"][0]["delta"].value("content", std::string());
  EXPECT_EQ(streamed, m["content"]);
  // The next turn: the conversation so far from the cache.
  json next = msgs;
  next.push_back(m);
  next.push_back({{"role", "user"}, {"content", "Thanks."}});
  const json r2 = s.post("/v1/chat/completions", {{"messages", next}, {"tools", tools}, {"temperature", 0}, {"max_tokens", 4}});
  EXPECT_GT(r2["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), r["usage"]["prompt_tokens"].get<int64_t>() / 2);
}

// tool_choice naming a function: the reply is what generate() gives held to that function's call block
// (OutputFormat::ToolCalls), read for the call: a call named so, its arguments an instance of its parameters, with
// finish_reason tool_calls (or, where max_tokens cuts the block, the text as content); streamed alike.
TEST(Serve, ANamedToolChoiceIsAWholeCall) {
  Running s(no_cache());
  const auto tt = testing::tool_turns();
  json tools = tt.tools;
  tools.push_back({{"type", "function"}, {"function", {{"name", "pick"}, {"parameters", {{"type", "object"},
      {"properties", {{"n", {{"type", "integer"}, {"minimum", 1}, {"maximum", 3}}}, {"ok", {{"type", "boolean"}}}}},
      {"required", {"n", "ok"}}, {"additionalProperties", false}}}}}});
  // (the bundled tokenizer spells the DSML markup nearly byte by byte: ~45 tokens for the opening)
  // (parallel_tool_calls false: the tiny model, never trained on calls, would go on calling until max_tokens)
  const json body = {{"messages", tt.messages}, {"tools", tools}, {"temperature", 0}, {"max_tokens", 300},
                     {"tool_choice", {{"type", "function"}, {"function", {{"name", "pick"}}}}}, {"parallel_tool_calls", false}};
  ChatOptions co = tt.options;
  co.tools = tools.dump();
  GenerateOptions g = greedy(300);
  g.skip_special = false;
  g.format = OutputFormat::ToolCalls, g.tool_calls.tools = tools.dump(), g.tool_calls.names = {"pick"};
  g.tool_calls.parallel = false;
  const GenerateResult want = direct(tiny_tok().encode(encode_chat(tt.chat, co)), g);
  const ChatMessage parsed = parse_reply(want.text, false);
  ASSERT_EQ(want.stop, StopReason::Token) << "[" << want.text << "] " << want.tokens.size() << " tokens";
  ASSERT_FALSE(parsed.tool_calls.empty()) << want.text;
  const json r = s.post("/v1/chat/completions", body);
  const json& m = r["choices"][0]["message"];
  ASSERT_TRUE(m.contains("tool_calls")) << m.dump();
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls");
  for (const json& c : m["tool_calls"]) {
    EXPECT_EQ(c["function"]["name"], "pick");
    const json args = json::parse(c["function"]["arguments"].get<std::string>());
    EXPECT_TRUE(args.at("n").is_number_integer() && args["n"] >= 1 && args["n"] <= 3 && args.at("ok").is_boolean() &&
                args.size() == 2) << args.dump();
  }
  EXPECT_EQ(m["tool_calls"].size(), 1u);
  std::printf("tool_choice pick: %s\n", m.dump().c_str());
  std::string streamed;
  json calls = json::array();
  for (const json& e : s.stream("/v1/chat/completions", body))
    if (e.is_object()) {
      const json& d = e["choices"][0]["delta"];
      streamed += d.value("content", std::string());
      if (d.contains("tool_calls")) calls = d["tool_calls"];
    }
  EXPECT_EQ(streamed, "");
  EXPECT_TRUE(m["content"].is_null());
  EXPECT_EQ(calls.size(), m["tool_calls"].size());
}

// JSON mode: a chat's reply and a completion are what generate() gives with OutputFormat::JsonObject, whole and
// streamed, and their text a prefix of a JSON object (the bundled model has not learned JSON: it rarely closes one).
TEST(Serve, JsonModeRepliesAreGeneratesJsonMode) {
  Running s(no_cache());
  const json fmt = {{"type", "json_object"}};
  const std::vector<ChatMessage> chat = {{"user", "Describe a cat in JSON.", ""}};
  const json body = {{"messages", json::array({{{"role", "user"}, {"content", chat[0].content}}})},
                     {"temperature", 0}, {"max_tokens", 30}, {"response_format", fmt}};
  GenerateOptions g = greedy(30);
  g.format = OutputFormat::JsonObject;
  const GenerateResult want = direct(tiny_tok().encode(encode_chat(chat, ChatOptions{})), g);
  const json r = s.post("/v1/chat/completions", body);
  const std::string text = r["choices"][0]["message"]["content"];
  EXPECT_EQ(text, want.text);
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.find_first_not_of(" \n"), text.find('{'));
  std::string streamed;
  for (const json& e : s.stream("/v1/chat/completions", body))
    if (e.is_object()) streamed += e["choices"][0]["delta"].value("content", std::string());
  EXPECT_EQ(streamed, text);
  // A completion, sampled with a seed.
  const json cr = s.post("/v1/completions", {{"prompt", "A cat as JSON:"}, {"seed", 4}, {"max_tokens", 25},
                                              {"response_format", fmt}});
  GenerateOptions gs = greedy(25);
  gs.sampling = defaults().sampling;
  gs.sampling.seed = 4;
  gs.format = OutputFormat::JsonObject;
  EXPECT_EQ(cr["choices"][0]["text"], direct(encode_prompt(tiny_tok(), "A cat as JSON:", defaults().config_bos), gs).text);
}

// A completion that ends at EOS lists it in its logprobs (as completion_tokens counts it), with no text for it.
TEST(Serve, CompletionLogprobsListTheStopToken) {
  Running s(no_cache());
  // (the chat format's prompt as token ids: greedy's reply ends with EOS)
  const std::vector<int32_t> ids = tiny_tok().encode(encode_chat({ChatMessage{"user", "Hi", ""}}, {}));
  const json r = s.post("/v1/completions", {{"prompt", ids}, {"temperature", 0}, {"max_tokens", 60}, {"logprobs", 0}});
  ASSERT_EQ(r["choices"][0]["finish_reason"], "stop") << r.dump();
  const json& lp = r["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), r["usage"]["completion_tokens"].get<size_t>());
  EXPECT_EQ(lp["tokens"].back(), tiny_tok().decode({tiny_engine()->info().eos_token}));
  EXPECT_EQ(lp["text_offset"].back(), r["choices"][0]["text"].get<std::string>().size());
}

// The penalties see the whole sequence whatever the cache fed: the same tokens as on an empty cache. The prompt
// repeats itself, so the penalties decide what greedy picks.
TEST(Serve, PrefixCacheKeepsThePromptInThePenaltyWindow) {
  Running cached, fresh(no_cache());
  const json body = {{"prompt", "1 2 3 1 2 3 1 2 3 1 2"}, {"temperature", 0}, {"max_tokens", 10}, {"repetition_penalty", 3},
                     {"presence_penalty", 2}};
  const json want = fresh.post("/v1/completions", body);
  EXPECT_EQ(cached.post("/v1/completions", body)["choices"][0]["text"], want["choices"][0]["text"]);
  const json again = cached.post("/v1/completions", body);  // (from the checkpoint this time)
  EXPECT_GT(again["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(again["choices"][0]["text"], want["choices"][0]["text"]);
  json plain = body;
  plain.erase("repetition_penalty"), plain.erase("presence_penalty");
  EXPECT_NE(fresh.post("/v1/completions", plain)["choices"][0]["text"], want["choices"][0]["text"]);  // (the premise)
}

TEST(Serve, AnswersLoadingUntilItHasItsModel) {
  ServerOptions o;
  o.port = 0;
  o.log = [](std::string_view) {};
  Server srv(o);
  const int port = srv.bind();
  std::thread t([&] { srv.run(); });
  httplib::Client c("127.0.0.1", port);
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 503);
  EXPECT_EQ(json::parse(h->body)["status"], "loading");
  auto p = c.Post("/v1/completions", R"({"prompt": "a"})", "application/json");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->status, 503);
  EXPECT_NE(p->body.find("the model is loading"), std::string::npos);
  srv.set_model(tiny_engine(), tiny_tok(), defaults());
  EXPECT_EQ(c.Get("/health")->status, 200);
  EXPECT_EQ(c.Post("/v1/completions", R"({"prompt": "a", "max_tokens": 2})", "application/json")->status, 200);
  EXPECT_THROW(srv.set_model(tiny_engine(), tiny_tok(), defaults()), Error);
  srv.stop();
  t.join();
}

// stop() before run(), or as run() starts, is not lost (httplib's own stop does nothing until its loop runs).
TEST(Serve, StopBeforeOrAsRunStartsEndsRun) {
  for (int i = 0; i < 20; ++i) {
    ServerOptions o;
    o.port = 0;
    Server srv(o);
    srv.bind();
    if (i == 0) {
      srv.stop();
      srv.run();  // (returns at once)
      continue;
    }
    std::thread t([&] { srv.run(); });
    if (i % 2) std::this_thread::sleep_for(std::chrono::microseconds(50 * i));
    srv.stop();
    t.join();
  }
}

TEST(Serve, BodiesThatAreNotUtf8AreRefusedAsSuch) {
  Running s;
  auto c = s.client();
  auto r = c.Post("/v1/completions", std::string("{\"prompt\": \"\xff\"}"), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(json::parse(r->body)["error"]["message"].get<std::string>().find("not valid JSON"), std::string::npos);
}

// --max-queue 0: one request generating, the next refused with 503 and Retry-After while it runs.
TEST(Serve, AFullQueueRefusesWith503) {
  ServerOptions o;
  o.max_queue = 0;
  Running s(o);
  httplib::Client c = s.client();
  httplib::Request req = long_stream();
  int second = 0;
  std::string retry;
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
    auto c2 = s.client();
    auto r = c2.Post("/v1/completions", R"({"prompt": "a", "max_tokens": 2})", "application/json");
    second = r ? r->status : -1;
    retry = r ? r->get_header_value("Retry-After") : "";
    return false;  // (then leave: the first generation is cancelled)
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  c.send(req, res, err);
  EXPECT_EQ(second, 503);
  EXPECT_EQ(retry, "1");
  for (int i = 0; i < 600 && s.srv->stats().requests == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(s.post("/v1/completions", {{"prompt", "a"}, {"max_tokens", 2}})["usage"]["completion_tokens"], 2);
}

}  // namespace
}  // namespace plumb::server
