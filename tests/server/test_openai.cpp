// `plumb serve`'s request checks and bodies (server/openai.h) without sockets: what a request becomes, what is
// refused and how the refusal names the field, the streamed reasoning split.
#include <gtest/gtest.h>

#include "plumb/engine.h"
#include "server/openai.h"

#include "tiny_model.h"

namespace plumb::server {
namespace {

using testing::tiny_tok;

Defaults tiny_defaults() {
  Defaults d;
  d.sampling.temperature = 0.7f;
  d.sampling.seed = 5;
  d.fixed_seed = true;
  d.max_tokens = 100;
  d.stop_tokens = {1};
  d.model_id = "tiny";
  d.config_bos = 0;
  d.context = 2048;
  d.vocab = 1216;
  d.eos_token = 1;
  d.tokenizer_eos = 1;
  return d;
}

// A completion body of one prompt: its one Request.
Request one_completion(const json& body, const Tokenizer& tok, const Defaults& d) {
  std::vector<Request> r = parse_completion(body, tok, d);
  EXPECT_EQ(r.size(), 1u) << body.dump();
  return r.at(0);
}

// The RequestError a body gets: its status and param, and that its message contains `text`.
void expect_refused(const json& body, bool chat, const std::string& param, const std::string& text, int status = 400) {
  SCOPED_TRACE(body.dump());
  try {
    if (chat) parse_chat(body, tiny_tok(), tiny_defaults());
    else one_completion(body, tiny_tok(), tiny_defaults());
    ADD_FAILURE() << "accepted";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.status, status);
    EXPECT_EQ(e.param, param);
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

TEST(ServeRequests, CompletionTakesTheFieldsOverTheDefaults) {
  const Tokenizer& tok = tiny_tok();
  const Defaults d = tiny_defaults();
  const Request a = one_completion(json{{"prompt", "Once upon a time"}}, tok, d);
  EXPECT_EQ(a.prompt, encode_prompt(tok, "Once upon a time", 0));
  EXPECT_FALSE(a.chat);
  EXPECT_FALSE(a.stream);
  EXPECT_EQ(a.gen.sampling.temperature, 0.7f);
  EXPECT_EQ(a.gen.sampling.seed, 5u);
  EXPECT_EQ(a.gen.max_tokens, 100);
  EXPECT_EQ(a.gen.stop_tokens, std::vector<int32_t>{1});
  EXPECT_TRUE(a.gen.stop_at_eos);

  const json b = {{"prompt", json::array({json::array({5, 6, 7})})}, {"temperature", 0}, {"top_p", 0.5}, {"top_k", -1},
                  {"min_p", 0.1}, {"seed", 42}, {"max_tokens", 7}, {"stop", json::array({"x", "yz"})}, {"stream", true},
                  {"stream_options", {{"include_usage", true}}}, {"repetition_penalty", 1.1}, {"presence_penalty", 0.5},
                  {"frequency_penalty", 0.25}, {"ignore_eos", true}, {"n", 1}, {"logprobs", nullptr}, {"user", "u"}};
  const Request r = one_completion(b, tok, d);
  EXPECT_EQ(r.prompt, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(r.gen.sampling.temperature, 0.f);
  EXPECT_EQ(r.gen.sampling.top_p, 0.5f);
  EXPECT_EQ(r.gen.sampling.top_k, 0);
  EXPECT_EQ(r.gen.sampling.min_p, 0.1f);
  EXPECT_EQ(r.gen.sampling.seed, 42u);
  EXPECT_EQ(r.gen.sampling.repeat_penalty, 1.1f);
  EXPECT_EQ(r.gen.sampling.presence_penalty, 0.5f);
  EXPECT_EQ(r.gen.sampling.frequency_penalty, 0.25f);
  EXPECT_EQ(r.gen.max_tokens, 7);
  EXPECT_EQ(r.gen.stop_strings, (std::vector<std::string>{"x", "yz"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_FALSE(r.gen.stop_at_eos);  // ignore_eos
  EXPECT_TRUE(r.gen.stop_tokens.empty());
}

TEST(ServeRequests, MaxTokensDefaultIsCutToTheContextLeft) {
  Defaults d = tiny_defaults();
  d.context = 10;
  const Request r = one_completion(json{{"prompt", json::array({5, 6, 7, 8})}}, tiny_tok(), d);
  EXPECT_EQ(r.gen.max_tokens, 6);
  // Asked for explicitly, more than fits is refused (OpenAI's rule), naming both counts.
  try {
    one_completion(json{{"prompt", json::array({5, 6, 7, 8})}, {"max_tokens", 7}}, tiny_tok(), d);
    ADD_FAILURE() << "accepted";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.param, "max_tokens");
    EXPECT_NE(std::string(e.what()).find("11 tokens were requested (4 in the prompt, 7 to generate)"), std::string::npos) << e.what();
  }
}

TEST(ServeRequests, SeedIsDrawnPerRequestWithoutAFixedOne) {
  Defaults d = tiny_defaults();
  d.fixed_seed = false;
  std::set<uint64_t> seeds;
  for (int i = 0; i < 8; ++i) seeds.insert(one_completion(json{{"prompt", "a"}}, tiny_tok(), d).gen.sampling.seed);
  EXPECT_GT(seeds.size(), 1u);
}

TEST(ServeRequests, ChatPromptIsTheOfficialEncoding) {
  const Tokenizer& tok = tiny_tok();
  const json msgs = json::array({{{"role", "system"}, {"content", "Be brief."}},
                                 {{"role", "user"}, {"content", "Hi"}},
                                 {{"role", "assistant"}, {"content", "Hello."}, {"reasoning_content", "greet"}},
                                 {{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", "How "}},
                                                                             {{"type", "text"}, {"text", "are you?"}}})}}});
  const std::vector<ChatMessage> cm = {{"system", "Be brief.", ""}, {"user", "Hi", ""}, {"assistant", "Hello.", "greet"},
                                       {"user", "How are you?", ""}};
  const Request plain = parse_chat(json{{"messages", msgs}}, tok, tiny_defaults());
  EXPECT_TRUE(plain.chat);
  EXPECT_FALSE(plain.thinking);
  EXPECT_EQ(plain.prompt, tok.encode(encode_chat(cm, ChatOptions{false, true, true, "", {}})));
  const Request think = parse_chat(json{{"messages", msgs}, {"chat_template_kwargs", {{"thinking", true}}},
                                        {"reasoning_effort", "max"}}, tok, tiny_defaults());
  EXPECT_TRUE(think.thinking);
  EXPECT_EQ(think.prompt, tok.encode(encode_chat(cm, ChatOptions{true, true, true, "max", {}})));
  EXPECT_NE(think.prompt, plain.prompt);
  EXPECT_EQ(parse_chat(json{{"messages", msgs}, {"thinking", true}, {"reasoning_effort", "max"}}, tok, tiny_defaults()).prompt,
            think.prompt);
}

// response_format: text by default, json_object sets JSON mode on either endpoint (and with tools only in the prompt).
TEST(ServeRequests, ResponseFormatSetsJsonMode) {
  const json user = json::array({{{"role", "user"}, {"content", "Hi, in JSON"}}});
  const json tools = json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}});
  const Defaults d = tiny_defaults();
  EXPECT_EQ(parse_chat({{"messages", user}}, tiny_tok(), d).gen.format, OutputFormat::Text);
  EXPECT_EQ(parse_chat({{"messages", user}, {"response_format", {{"type", "text"}}}}, tiny_tok(), d).gen.format,
            OutputFormat::Text);
  const json js = {{"type", "json_object"}};
  EXPECT_EQ(parse_chat({{"messages", user}, {"response_format", js}}, tiny_tok(), d).gen.format, OutputFormat::JsonObject);
  EXPECT_EQ(parse_chat({{"messages", user}, {"response_format", js}, {"tools", tools}, {"tool_choice", "none"}}, tiny_tok(), d)
                .gen.format,
            OutputFormat::JsonObject);
  EXPECT_EQ(one_completion({{"prompt", "a"}, {"response_format", js}}, tiny_tok(), d).gen.format, OutputFormat::JsonObject);
  // json_schema: OpenAI's shape, the schema carried as text.
  const json schema = {{"type", "object"}, {"properties", {{"name", {{"type", "string"}}}}}, {"required", {"name"}}};
  const Request r = parse_chat({{"messages", user}, {"response_format", {{"type", "json_schema"},
                                {"json_schema", {{"name", "person"}, {"strict", true}, {"schema", schema}}}}}}, tiny_tok(), d);
  EXPECT_EQ(r.gen.format, OutputFormat::JsonSchema);
  EXPECT_EQ(json::parse(r.gen.json_schema), schema);
}

TEST(ServeRequests, RefusalsNameTheField) {
  const json user = json::array({{{"role", "user"}, {"content", "Hi"}}});
  expect_refused(json::object(), false, "prompt", "prompt is required");
  expect_refused(json{{"prompt", ""}}, false, "prompt", "empty");
  expect_refused(json{{"prompt", 3}}, false, "prompt", "must be a string");
  expect_refused(json{{"prompt", json::array({"a", 5})}}, false, "prompt[1]", "must be a string or an array of token ids");
  expect_refused(json{{"prompt", json::array({json::array({5}), json::array()})}}, false, "prompt[1]", "must be a string");
  expect_refused(json{{"prompt", json::array({"a", ""})}}, false, "prompt[1]", "is empty");
  expect_refused(json{{"prompt", json::array({json::array({5, 9999})})}}, false, "prompt[0]", "outside the model's vocabulary");
  expect_refused(json{{"prompt", json::array({5, 5000})}}, false, "prompt", "token 5000 at index 1 is outside");
  expect_refused(json{{"prompt", json::array({5, -1})}}, false, "prompt[1]", "must be in [0,");
  expect_refused(json{{"prompt", "a"}, {"temperature", "hot"}}, false, "temperature", "must be a number, got string");
  expect_refused(json{{"prompt", "a"}, {"top_p", 2}}, false, "top_p", "top_p must be in (0, 1], got 2");
  expect_refused(json{{"prompt", "a"}, {"top_k", 2.5}}, false, "top_k", "must be an integer");
  expect_refused(json{{"prompt", "a"}, {"seed", -3}}, false, "seed", "must be in [0,");
  expect_refused(json{{"prompt", "a"}, {"max_tokens", 0}}, false, "max_tokens", "must be in [1,");
  expect_refused(json{{"prompt", "a"}, {"stream", "yes"}}, false, "stream", "true or false");
  expect_refused(json{{"prompt", "a"}, {"stream_options", {{"include_usage", true}}}}, false, "stream_options", "needs");
  expect_refused(json{{"prompt", "a"}, {"stop", json::array({"x", 1})}}, false, "stop[1]", "must be a string");
  expect_refused(json{{"prompt", "a"}, {"stop", ""}}, false, "stop", "empty");
  expect_refused(json{{"prompt", "a"}, {"presence_penalty", 2.5}}, false, "presence_penalty", "[-2, 2]");
  expect_refused(json{{"prompt", "a"}, {"frequency_penalty", -3e38}}, false, "frequency_penalty", "[-2, 2]");
  expect_refused(json{{"prompt", "a"}, {"repetition_penalty", 0}}, false, "repetition_penalty", "(0, 100]");
  expect_refused(json{{"prompt", "a"}, {"temperature", 1e9}}, false, "temperature", "at most 100");
  expect_refused(json{{"prompt", "a"}, {"n", 0}}, false, "n", "must be in [1, 128]");
  expect_refused(json{{"prompt", "a"}, {"n", 2}, {"best_of", 3}}, false, "best_of", "best_of must equal n (2)");
  expect_refused(json{{"prompt", json::array({"a", "b", "c"})}, {"n", 50}}, false, "n", "3 prompts x n 50 = 150 choices");
  expect_refused(json{{"prompt", "a"}, {"logprobs", 21}}, false, "logprobs", "must be in [0, 20]");
  expect_refused(json{{"prompt", "a"}, {"logprobs", true}}, false, "logprobs", "number of alternatives");
  expect_refused(json{{"prompt", "a"}, {"logprobs", 2}, {"stream", true}}, false, "logprobs", "not supported");
  expect_refused(json{{"messages", user}, {"top_logprobs", 2}}, true, "top_logprobs", "needs \"logprobs\": true");
  expect_refused(json{{"messages", user}, {"logprobs", "yes"}}, true, "logprobs", "true or false");
  expect_refused(json{{"messages", user}, {"tools", json::array({{{"type", "function"}}})}}, true, "tools", "tools[0] must be");
  const json tools = json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}});
  expect_refused(json{{"messages", user}, {"tools", tools}, {"tool_choice", "any"}}, true, "tool_choice", "got \"any\"");
  expect_refused(json{{"messages", user}, {"tools", tools}, {"tool_choice", {{"type", "function"}}}}, true, "tool_choice",
                 "{\"type\": \"function\", \"function\": {\"name\": ...}}");
  expect_refused(json{{"messages", user}, {"tools", tools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "g"}}}}}},
                 true, "tool_choice", "names function \"g\", which is not among the tools");
  expect_refused(json{{"messages", user}, {"tools", json::array()}, {"tool_choice", "required"}}, true, "tool_choice",
                 "needs at least one tool");
  expect_refused(json{{"messages", user}, {"tools", tools}, {"tool_choice", "required"}, {"response_format", {{"type", "json_object"}}}},
                 true, "response_format", "tools whose calls are read");
  expect_refused(json{{"messages", user}, {"tool_choice", "auto"}}, true, "tool_choice", "needs tools");
  const json call = {{"id", "c"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", "[1]"}}}};
  expect_refused(json{{"messages", json::array({user[0], {{"role", "assistant"}, {"tool_calls", json::array({call})}},
                                                {{"role", "tool"}, {"content", "r"}}})}}, true, "messages", "arguments must be a JSON object");
  expect_refused(json{{"messages", json::array({{{"role", "user"}, {"content", "x"}, {"tool_calls", json::array()}}})}}, true,
                 "messages[0].tool_calls", "only an assistant message");
  json no_function = json::array({user[0]});
  no_function.push_back({{"role", "assistant"}, {"tool_calls", json::array({json{{"id", "c"}}})}});
  no_function.push_back({{"role", "user"}, {"content", "y"}});
  expect_refused(json{{"messages", no_function}}, true, "messages[1].tool_calls[0].function", "needs a function object");
  expect_refused(json{{"messages", user}, {"response_format", {{"type", "json_schema"}}}}, true, "response_format",
                 "needs \"json_schema\": {\"schema\"");
  expect_refused(json{{"messages", user}, {"response_format", {{"type", "xml"}}}}, true, "response_format",
                 "\"xml\" is not supported");
  const json pattern = {{"type", "object"}, {"properties", {{"a", {{"type", "string"}, {"pattern", "^x"}}}}}};
  expect_refused(json{{"messages", user}, {"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", pattern}}}}}},
                 true, "response_format", "keyword \"pattern\" at #/properties/a is not supported");
  expect_refused(json{{"messages", user}, {"response_format", "json"}}, true, "response_format", "must be an object");
  expect_refused(json{{"messages", user}, {"response_format", {{"type", "json_object"}}}, {"thinking", true}}, true,
                 "response_format", "cannot be combined with thinking mode");
  expect_refused(json{{"messages", user}, {"response_format", {{"type", "json_object"}}}, {"tools", tools}}, true,
                 "response_format", "cannot be combined with tools");
  expect_refused(json{{"prompt", "a"}, {"response_format", {{"type", "json_object"}}}, {"ignore_eos", true}}, false,
                 "response_format", "needs a token that ends the object's text");
  expect_refused(json{{"prompt", "a"}, {"response_format", {{"type", "json_object"}}}, {"echo", true}}, false,
                 "response_format", "cannot be combined with echo");
  expect_refused(json::object(), true, "messages", "messages is required");
  expect_refused(json{{"messages", json::array()}}, true, "messages", "non-empty array");
  expect_refused(json{{"messages", json::array({"hi"})}}, true, "messages[0]", "must be an object");
  expect_refused(json{{"messages", json::array({{{"role", "function"}, {"content", "x"}}})}}, true, "messages[0].role", "\"function\"");
  expect_refused(json{{"messages", json::array({{{"role", "user"}, {"content", json::array({{{"type", "image_url"}}})}}})}}, true,
                 "messages[0].content[0]", "only text parts");
  expect_refused(json{{"messages", json::array({{{"role", "user"}, {"content", "a"}}, {{"role", "assistant"}, {"content", "b"}}})}},
                 true, "messages[1].role", "the last message must be a user turn");
  expect_refused(json{{"messages", user}, {"reasoning_effort", "max"}}, true, "reasoning_effort", "needs thinking mode");
  expect_refused(json{{"messages", user}, {"thinking", true}, {"reasoning_effort", "low"}}, true, "reasoning_effort", "\"high\" or \"max\"");
  expect_refused(json{{"messages", user}, {"max_completion_tokens", 5000}}, true, "max_completion_tokens", "context is 2048 tokens");
  // The body itself.
  try {
    parse_body("{\"prompt\": ");
    ADD_FAILURE() << "accepted";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_body("[1, 2]"), RequestError);
  const json err = error_body("m", "invalid_request_error", "top_k");
  EXPECT_EQ(err["error"]["param"], "top_k");
  EXPECT_TRUE(error_body("m", "t", "")["error"]["param"].is_null());
}

TEST(ServeRequests, ReasoningSplitHoldsBackAPartialEndTag) {
  // The same text in pieces of every size splits the same way as whole.
  const std::string text = "I think </ not yet</thin k></think>The answer</think> stays";
  for (size_t step = 1; step <= text.size(); ++step) {
    ReasoningSplit split(true);
    std::string reasoning, content;
    for (size_t i = 0; i < text.size(); i += step) {
      std::string r, c;
      split.push(std::string_view(text).substr(i, step), r, c);
      reasoning += r, content += c;
    }
    split.flush(reasoning, content);
    EXPECT_EQ(reasoning, "I think </ not yet</thin k>") << step;
    EXPECT_EQ(content, "The answer</think> stays") << step;
  }
  ReasoningSplit open(true), plain(false);
  std::string r1, c1, r2, c2;
  open.push("no end </thi", r1, c1);
  open.flush(r1, c1);
  EXPECT_EQ(r1, "no end </thi");  // (no </think>: all reasoning, as parse_reply reads it)
  EXPECT_EQ(c1, "");
  plain.push("a</think>b", r2, c2);
  EXPECT_EQ(r2, "");
  EXPECT_EQ(c2, "a</think>b");
}

TEST(ServeRequests, LogprobsAreTheModelsLogSoftmax) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  // p = 1/7, 2/7, 4/7 over the finite logits; -inf and NaN count as no chance.
  const std::vector<float> l = {0.f, std::log(2.f), std::log(4.f), -inf, nan, std::log(2.f)};
  const double z = std::log(9.0);  // (1 + 2 + 4 + 2)
  const TokenLogprob t = token_logprob(l, 1, 3);
  EXPECT_EQ(t.id, 1);
  EXPECT_NEAR(t.logprob, std::log(2.0) - z, 1e-7);
  ASSERT_EQ(t.top.size(), 3u);
  EXPECT_EQ(t.top[0].first, 2);
  EXPECT_EQ(t.top[1].first, 1);  // (a tie with id 5: the lower id first)
  EXPECT_EQ(t.top[2].first, 5);
  EXPECT_NEAR(t.top[0].second, std::log(4.0) - z, 1e-7);
  EXPECT_TRUE(std::isinf(token_logprob(l, 4, 0).logprob));
  EXPECT_TRUE(token_logprob(l, 0, 0).top.empty());

  const Request c = one_completion(json{{"prompt", "a"}, {"logprobs", 3}}, tiny_tok(), tiny_defaults());
  EXPECT_EQ(c.top_logprobs, 3);
  EXPECT_EQ(one_completion(json{{"prompt", "a"}}, tiny_tok(), tiny_defaults()).top_logprobs, -1);
  const json user = json::array({{{"role", "user"}, {"content", "Hi"}}});
  EXPECT_EQ(parse_chat(json{{"messages", user}, {"logprobs", true}}, tiny_tok(), tiny_defaults()).top_logprobs, 0);
  EXPECT_EQ(parse_chat(json{{"messages", user}, {"logprobs", true}, {"top_logprobs", 4}}, tiny_tok(), tiny_defaults()).top_logprobs, 4);
  EXPECT_EQ(parse_chat(json{{"messages", user}, {"logprobs", false}}, tiny_tok(), tiny_defaults()).top_logprobs, -1);

  // The bodies: a token's text, its value, the alternatives (completions: an object per token, null without them).
  const std::vector<TokenLogprob> lp = {{5, -0.5, {{5, -0.5}, {6, -1.5}}}};
  const json cl = completion_logprobs(lp, tiny_tok(), true);
  EXPECT_EQ(cl["tokens"][0], tiny_tok().decode({5}));
  EXPECT_EQ(cl["token_logprobs"][0], -0.5);
  EXPECT_EQ(cl["top_logprobs"][0][tiny_tok().decode({6})], -1.5);
  EXPECT_EQ(cl["text_offset"][0], 0);
  EXPECT_TRUE(completion_logprobs(lp, tiny_tok(), false)["top_logprobs"][0].is_null());
  const json ch = chat_logprobs(lp, tiny_tok());
  EXPECT_EQ(ch["content"][0]["token"], tiny_tok().decode({5}));
  EXPECT_EQ(ch["content"][0]["top_logprobs"][1]["logprob"], -1.5);
  EXPECT_EQ(ch["content"][0]["bytes"].size(), tiny_tok().decode({5}).size());
}

// echo (completions): the prompt's text kept as sent (ids: decoded without BOS), max_tokens 0 allowed with it alone,
// refused by chat; the logprobs body's unscored first entry and offsets into a text without special tokens.
TEST(ServeRequests, EchoKeepsThePromptText) {
  const Tokenizer& tok = tiny_tok();
  const Request a = one_completion(json{{"prompt", "Once upon"}, {"echo", true}, {"max_tokens", 0}, {"logprobs", 1}}, tok,
                                     tiny_defaults());
  EXPECT_TRUE(a.echo);
  EXPECT_EQ(a.echo_text, "Once upon");
  EXPECT_EQ(a.gen.max_tokens, 0);
  const std::vector<int32_t> ids = encode_prompt(tok, "Once upon", 0);
  ASSERT_EQ(ids.front(), 0);  // (BOS)
  const Request b = one_completion(json{{"prompt", json::array({ids})}, {"echo", true}}, tok, tiny_defaults());
  EXPECT_EQ(b.echo_text, "Once upon");
  EXPECT_FALSE(one_completion(json{{"prompt", "a"}}, tok, tiny_defaults()).echo);
  expect_refused(json{{"prompt", "a"}, {"echo", false}, {"max_tokens", 0}}, false, "max_tokens", "must be in [1,");
  expect_refused(json{{"prompt", "a"}, {"echo", 1}}, false, "echo", "true or false");
  const json user = json::array({{{"role", "user"}, {"content", "Hi"}}});
  expect_refused(json{{"messages", user}, {"echo", true}}, true, "echo", "/v1/completions");
  // A prompt that fills the context: scored with max_tokens 0, refused with more, or without max_tokens.
  Defaults d = tiny_defaults();
  d.context = int64_t(ids.size());
  EXPECT_EQ(one_completion(json{{"prompt", "Once upon"}, {"echo", true}, {"max_tokens", 0}}, tok, d).gen.max_tokens, 0);
  for (const json& extra : {json{{"max_tokens", 1}}, json::object()}) {
    json body = {{"prompt", "Once upon"}, {"echo", true}};
    body.update(extra);
    try {
      one_completion(body, tok, d);
      ADD_FAILURE() << body.dump() << " accepted";
    } catch (const RequestError& e) {
      EXPECT_EQ(e.param, "prompt") << e.what();
      EXPECT_NE(std::string(e.what()).find("no room to generate"), std::string::npos) << e.what();
    }
  }

  std::vector<TokenLogprob> lp(3);
  lp[0].id = 0, lp[0].unscored = true;  // (BOS)
  lp[1].id = ids[1], lp[1].logprob = -2, lp[1].top = {{7, -1.0}};
  lp[2].id = ids[2], lp[2].logprob = -3;
  const json cl = completion_logprobs(lp, tok, true);
  EXPECT_TRUE(cl["token_logprobs"][0].is_null());
  EXPECT_TRUE(cl["top_logprobs"][0].is_null());
  EXPECT_EQ(cl["token_logprobs"][1], -2.0);
  EXPECT_EQ(cl["top_logprobs"][1][tok.decode({7})], -1.0);
  EXPECT_EQ(cl["tokens"][0], tok.decode({0}));  // (BOS's own text in the list: it is a token of the prompt)
  EXPECT_FALSE(tok.decode({0}).empty());
  // Offsets into "Once upon": BOS has no text there.
  EXPECT_EQ(cl["text_offset"], json::array({0, 0, tok.decode({ids[1]}).size()}));
}

// Tools: rendered as encode_chat renders them (with tool_choice "none" not at all); a conversation that ends with a
// tool's result is answered; the reply is then decoded with its special strings, to find the calls.
TEST(ServeRequests, ToolsAndToolCallsAreRendered) {
  const Tokenizer& tok = tiny_tok();
  const auto tt = testing::tool_turns();
  const json& tools = tt.tools;
  const json& msgs = tt.messages;
  const Request r = parse_chat(json{{"messages", msgs}, {"tools", tools}}, tok, tiny_defaults());
  EXPECT_EQ(r.prompt, tok.encode(encode_chat(tt.chat, tt.options)));
  EXPECT_TRUE(r.tools);
  EXPECT_FALSE(r.gen.skip_special);
  EXPECT_EQ(r.gen.format, OutputFormat::ToolCalls);  // ("auto": a block the reply begins is held to the tools)
  EXPECT_FALSE(r.gen.tool_calls.required);
  const Request none = parse_chat(json{{"messages", msgs}, {"tools", tools}, {"tool_choice", "none"}}, tok, tiny_defaults());
  EXPECT_EQ(none.prompt, r.prompt);  // (the same prompt, as vLLM renders it; the reply is not read for calls)
  EXPECT_FALSE(none.tools);
  EXPECT_TRUE(none.gen.skip_special);
  // "required": the reply is a call block of the tools; a named function: of that one; parallel_tool_calls. The
  // prompt stays.
  json two = tools;
  two.push_back({{"type", "function"}, {"function", {{"name", "weather"}, {"parameters", {{"type", "object"}}}}}});
  const Request req = parse_chat(json{{"messages", msgs}, {"tools", two}, {"tool_choice", "required"}}, tok, tiny_defaults());
  EXPECT_TRUE(req.tools);
  EXPECT_EQ(req.gen.format, OutputFormat::ToolCalls);
  EXPECT_EQ(json::parse(req.gen.tool_calls.tools), two);
  EXPECT_TRUE(req.gen.tool_calls.names.empty());
  EXPECT_TRUE(req.gen.tool_calls.parallel);
  const Request named = parse_chat(json{{"messages", msgs}, {"tools", two}, {"parallel_tool_calls", false},
                                        {"tool_choice", {{"type", "function"}, {"function", {{"name", "weather"}}}}}},
                                   tok, tiny_defaults());
  EXPECT_EQ(named.gen.format, OutputFormat::ToolCalls);
  EXPECT_EQ(named.gen.tool_calls.names, std::vector<std::string>{"weather"});
  EXPECT_FALSE(named.gen.tool_calls.parallel);
  // "auto" that the mask cannot hold (here ignore_eos leaves nothing to end a block) is served unmasked, with a note
  // for the log; "required" is refused.
  const Request loose = parse_chat(json{{"messages", msgs}, {"tools", two}, {"ignore_eos", true}}, tok, tiny_defaults());
  EXPECT_EQ(loose.gen.format, OutputFormat::Text);
  EXPECT_NE(loose.note.find("tool_choice \"auto\""), std::string::npos) << loose.note;
  EXPECT_TRUE(r.note.empty());
  // In thinking mode the block follows the reasoning.
  const Request thinking = parse_chat(json{{"messages", msgs}, {"tools", two}, {"tool_choice", "required"}, {"thinking", true}},
                                      tok, tiny_defaults());
  EXPECT_TRUE(thinking.gen.tool_calls.required && thinking.gen.tool_calls.thinking);
  // parallel_tool_calls is read with any tool_choice (the mask holds "auto"'s block too), and must be a boolean.
  EXPECT_FALSE(parse_chat(json{{"messages", msgs}, {"tools", two}, {"parallel_tool_calls", false}}, tok, tiny_defaults())
                   .gen.tool_calls.parallel);
  try {
    parse_chat(json{{"messages", msgs}, {"tools", two}, {"parallel_tool_calls", "no"}}, tok, tiny_defaults());
    ADD_FAILURE() << "parallel_tool_calls \"no\" accepted";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.param, "parallel_tool_calls") << e.what();
  }
  EXPECT_EQ(named.prompt, parse_chat(json{{"messages", msgs}, {"tools", two}}, tok, tiny_defaults()).prompt);
  // A strict tool whose parameters plumb cannot hold: 400 naming tools.
  json strict = two;
  strict[1]["function"]["strict"] = true;
  strict[1]["function"]["parameters"] = {{"type", "object"}, {"properties", {{"id", {{"type", "string"}, {"pattern", "^a"}}}}}};
  try {
    parse_chat(json{{"messages", msgs}, {"tools", strict}, {"tool_choice", "required"}}, tok, tiny_defaults());
    ADD_FAILURE() << "a strict tool with a pattern was accepted";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.param, "tools") << e.what();
    EXPECT_NE(std::string(e.what()).find("pattern"), std::string::npos) << e.what();
  }
  // A tool's result in text parts: a blank line between them, as DeepSeek's encoder joins a result's parts.
  json parts = msgs;
  parts[2]["content"] = json::array({{{"type", "text"}, {"text", "12"}}, {{"type", "text"}, {"text", "00"}}});
  auto chat = tt.chat;
  chat[2].content = "12\n\n00";
  EXPECT_EQ(parse_chat(json{{"messages", parts}, {"tools", tools}}, tok, tiny_defaults()).prompt,
            tok.encode(encode_chat(chat, tt.options)));
  expect_refused(json{{"prompt", "a"}, {"tools", tools}}, false, "tools", "a field of /v1/chat/completions");
}

// The block is taken out of a streamed reply at any split of its pieces: the content before it (less the blank line)
// streams, then the calls; a block cut off comes back as text, in full.
TEST(ServeRequests, ToolCallSplitTakesTheBlockOutAtAnyPieceSize) {
  const std::string block = std::string(kToolCallsOpen) + "\n<｜DSML｜invoke name=\"now\">\n<｜DSML｜parameter name=\"tz\" "
                            "string=\"true\">UTC</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  for (const std::string& reply : {"Let me check.\n\n" + block, "Checking " + block, block}) {
    const std::string before = reply.substr(0, reply.find(kToolCallsOpen));
    const std::string want = before.size() >= 2 && before.substr(before.size() - 2) == "\n\n" ? before.substr(0, before.size() - 2) : before;
    for (size_t step = 1; step <= reply.size(); step += 3) {
      ToolCallSplit split;
      std::string content;
      for (size_t at = 0; at < reply.size(); at += step) {
        split.push(std::string_view(reply).substr(at, step), content);
        EXPECT_EQ(want.compare(0, content.size(), content), 0) << "streamed past the content at step " << step;
      }
      const auto calls = split.finish(content);
      ASSERT_TRUE(calls) << step;
      ASSERT_EQ(calls->size(), 1u);
      EXPECT_EQ((*calls)[0].name, "now");
      EXPECT_EQ(json::parse((*calls)[0].arguments), json({{"tz", "UTC"}}));
      EXPECT_EQ(content, want) << step;
    }
  }
  ToolCallSplit cut;
  std::string content;
  const std::string partial = "Hi.\n\n" + block.substr(0, 40);
  cut.push(partial, content);
  EXPECT_FALSE(cut.finish(content));
  EXPECT_EQ(content, partial);
  ToolCallSplit plain;
  std::string text;
  plain.push("a\n\n<｜DS", text);  // (may become a block: held back)
  EXPECT_EQ(text, "a");
  plain.push("ML is a word", text);
  EXPECT_FALSE(plain.finish(text));
  EXPECT_EQ(text, "a\n\n<｜DSML is a word");
  // A thinking reply through both splits, in 5-byte pieces: its reasoning, its content, its call.
  ChatReplySplit both(true, true);
  const std::string thought = "Use the clock.</think>Checking.\n\n" + block;
  std::string reasoning, said;
  for (size_t at = 0; at < thought.size(); at += 5) both.push(std::string_view(thought).substr(at, 5), reasoning, said);
  const auto both_calls = both.finish(reasoning, said);
  ASSERT_TRUE(both_calls);
  EXPECT_EQ((*both_calls)[0].name, "now");
  EXPECT_EQ(reasoning, "Use the clock.");
  EXPECT_EQ(said, "Checking.");
  ChatReplySplit no_tools(false, false);  // (without tools a block is only text)
  std::string none_reasoning, none_said;
  no_tools.push(thought, none_reasoning, none_said);
  EXPECT_FALSE(no_tools.finish(none_reasoning, none_said));
  EXPECT_EQ(none_said, thought);
  // The message: content null beside calls, "tool_calls" in the shape OpenAI's clients read.
  const json c = chat_choice(0, "", "", false, "tool_calls", nullptr, tool_calls_json({{"call_1", "now", "{}"}}));
  EXPECT_TRUE(c["message"]["content"].is_null());
  EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["name"], "now");
  EXPECT_EQ(c["message"]["tool_calls"][0]["id"], "call_1");
  EXPECT_EQ(c["finish_reason"], "tool_calls");
}

// Bodies a parser would take but the server must not: nesting deeper than any request (rendering it again
// recurses), a number beyond a double, a call's arguments nested too deep: each a 400, never a crash or a 500.
TEST(ServeRequests, HostileBodiesAreRefused) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  for (const std::string& body : {"{\"prompt\": " + deep + "}", std::string("{\"prompt\": \"a\", \"seed\": 1e999}")}) {
    try {
      parse_body(body);
      ADD_FAILURE() << body.substr(0, 40) << " accepted";
    } catch (const RequestError& e) {
      EXPECT_EQ(e.status, 400) << e.what();
    }
  }
  EXPECT_NO_THROW(parse_body("{\"a\": " + std::string(60, '[') + std::string(60, ']') + "}"));
  const auto tt = testing::tool_turns();
  json msgs = tt.messages;
  msgs[1]["tool_calls"][0]["function"]["arguments"] = "{\"x\": " + std::string(200, '[') + std::string(200, ']') + "}";
  expect_refused(json{{"messages", msgs}, {"tools", tt.tools}}, true, "messages", "deep, more than 64");
  msgs[1]["tool_calls"][0]["function"]["arguments"] = "{\"x\": 1e999}";
  expect_refused(json{{"messages", msgs}, {"tools", tt.tools}}, true, "messages", "arguments");
  expect_refused(json{{"messages", json::array({{{"role", "user"}, {"content", json::array({{{"type", 1}, {"text", "x"}}})}}})}},
                 true, "messages[0].content[0]", "only text parts");
  expect_refused(json{{"prompt", "a"}, {"response_format", {{"type", 5}}}}, false, "response_format", "must be an object with");
}

TEST(ServeRequests, FinishReasonsAreOpenAis) {
  EXPECT_STREQ(finish_reason(StopReason::Token), "stop");
  EXPECT_STREQ(finish_reason(StopReason::String), "stop");
  EXPECT_STREQ(finish_reason(StopReason::Length), "length");
  EXPECT_STREQ(finish_reason(StopReason::Context), "length");
}

}  // namespace
}  // namespace plumb::server
