// The OpenAI-compatible request and response bodies of `plumb serve` (/v1/completions, /v1/chat/completions): a
// request's JSON checked field by field into a prompt and GenerateOptions, and the responses and stream chunks built
// from a generation. No sockets here (server.cpp has them), so every rule is testable on its own. Built on the public
// API only (plumb/engine.h, plumb/text.h), as the CLI is.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plumb/text.h"

namespace plumb::server {

using json = nlohmann::ordered_json;  // (fields in OpenAI's order: "id" first)

// A request the server refuses: the HTTP status, OpenAI's error type and the field at fault ("" for the body).
struct RequestError : std::runtime_error {
  RequestError(int status, std::string type, std::string param, const std::string& message)
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)) {}
  int status;
  std::string type;   // "invalid_request_error", "authentication_error", "server_busy", "server_error"
  std::string param;  // "temperature", "messages[2].content", ...
};
// 400 invalid_request_error naming `param`.
[[noreturn]] void bad_request(const std::string& param, const std::string& message);
// JSON text for a response: bytes that are not UTF-8 (a request's, quoted in an error; a model's partial character)
// become U+FFFD instead of an exception.
std::string to_text(const json& j);
// {"error": {"message", "type", "param", "code"}}, as OpenAI's API answers.
json error_body(const std::string& message, const std::string& type, const std::string& param);

// What every request starts from: the server's command line (`plumb serve`'s sampling options), the model's
// tokens. A request's fields override the sampling parameters and max tokens.
struct Defaults {
  SamplingParams sampling;            // the seed is drawn per request unless `fixed_seed`
  bool fixed_seed = false;            // --seed given: requests without "seed" use sampling.seed
  int max_tokens = 2048;              // a request without max_tokens; cut to the context left in any case
  std::vector<int32_t> stop_tokens;   // EOS (the model's and the tokenizer's) and --stop-token ids
  std::vector<std::string> stop_strings;
  std::string model_id;               // what /v1/models lists and responses name
  int32_t config_bos = -1;            // config.json's BOS (encode_prompt)
  int64_t context = 0;                // the model's max_position_embeddings (0: none named)
  int32_t vocab = 0;                  // the model's vocab_size: token-id prompts are checked against it
  int32_t eos_token = -1, tokenizer_eos = -1;  // config.json's and tokenizer_config.json's EOS (ignore_eos drops them)
};

// A checked request, ready to generate.
struct Request {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with the usage
  bool thinking = false;       // chat: thinking mode (the reply's reasoning comes back as reasoning_content)
  bool tools = false;          // chat: tools were rendered into the prompt; the reply is read for tool calls
  std::vector<int32_t> prompt;
  GenerateOptions gen;         // max_tokens already cut to the context left after the prompt
  std::string model;           // the request's "model", echoed (the server has one model)
  // Log probabilities of the sampled tokens: -1 none; else with this many alternatives each (completions:
  // "logprobs": N; chat: "logprobs": true, "top_logprobs": N). Not with stream.
  int top_logprobs = -1;
  // Completions' "echo": the reply's text starts with the prompt's (`echo_text`: the prompt string as sent, or its ids
  // decoded), and with logprobs the prompt's tokens come first in them, each scored by the model (the first null).
  // max_tokens may then be 0: the prompt scored, nothing generated (how evaluation harnesses score a text).
  bool echo = false;
  std::string echo_text;
  // "n": choices for this prompt, sampled one after another; choice j draws with the seed + j (so a request's choices
  // differ, and each prompt of a request has the same choices whatever the others are).
  int n = 1;
  std::string note;  // a line for the server's log (tool_choice "auto" served unmasked, and why)
};
// The most choices (prompts x n) one request may ask for.
inline constexpr int kMaxChoices = 128;
// The deepest nesting of arrays and objects a body may have.
inline constexpr int kMaxJsonDepth = 64;

// POST /v1/completions: "prompt" a string, as `plumb run` encodes it (BOS as transformers adds it), or an array of
// token ids; or an array of several of those (evaluation harnesses' batches): a Request per prompt, each with the
// body's other fields, one seed for all. Throws RequestError naming the field ("prompt[2][5]").
std::vector<Request> parse_completion(const json& body, const Tokenizer& tok, const Defaults& d);
// POST /v1/chat/completions: "messages" rendered in DeepSeek-V4's chat format (encode_chat; roles system, user,
// assistant, developer, tool; content a string or text parts; an assistant turn's reasoning_content and tool_calls, a
// tool's tool_call_id), the last one a user (or developer) turn or a tool's result; "tools" with tool_choice "auto"
// (the reply read for calls) or "none". Thinking mode with "thinking": true or "chat_template_kwargs":
// {"thinking": true}; the reasoning effort with "reasoning_effort": "high" or "max".
Request parse_chat(const json& body, const Tokenizer& tok, const Defaults& d);
// The body as JSON: 400 naming the offset of a syntax error, or that it is not an object.
json parse_body(const std::string& text);

// One token's log probability under the model's own distribution (log-softmax of the raw logits, before the
// penalties and the temperature, as vLLM reports them by default) and the `n` most likely tokens' (ties: lower id
// first). Non-finite logits count as -inf.
struct TokenLogprob {
  int32_t id = -1;
  double logprob = 0;
  std::vector<std::pair<int32_t, double>> top;
  bool unscored = false;  // an echoed prompt's first token: nothing predicts it (null logprob and alternatives)
};
TokenLogprob token_logprob(std::span<const float> logits, int32_t id, int n);
// The choice's "logprobs" object: completions' {tokens, token_logprobs, top_logprobs, text_offset}, chat's {content:
// [{token, logprob, bytes, top_logprobs}]}; token texts as the tokenizer decodes each token alone. text_offset is
// where each token's text starts in the choice's text, which has no special tokens (BOS, EOS): those count as empty.
json completion_logprobs(const std::vector<TokenLogprob>& lp, const Tokenizer& tok, bool with_top);
json chat_logprobs(const std::vector<TokenLogprob>& lp, const Tokenizer& tok);

// OpenAI's finish_reason: "stop" (a stop token or string), "length" (max tokens or the context full).
const char* finish_reason(StopReason r);

// Splits a thinking-mode reply as it streams: text before "</think>" is reasoning, after it content. A piece that may
// be the start of "</think>" is held back until it is decided.
class ReasoningSplit {
 public:
  explicit ReasoningSplit(bool thinking) : in_reasoning_(thinking) {}
  // Appends to `reasoning` / `content` the text of `piece` that is final now.
  void push(std::string_view piece, std::string& reasoning, std::string& content);
  void flush(std::string& reasoning, std::string& content);  // at the end: what is held back

 private:
  bool in_reasoning_;
  StopMatcher end_{{"</think>"}};  // (the stop strings' matching: "</think>" across pieces)
};

// Takes a tool-call block out of a chat reply's content as it streams (with tools): content before
// "<｜DSML｜tool_calls>" (less the blank line before it) is final; a piece that may be the start of the block is held
// back; from the block on nothing is emitted until finish().
class ToolCallSplit {
 public:
  // Appends to `content` the text of `piece` that is final now.
  void push(std::string_view piece, std::string& content);
  // At the end: the calls of a complete block ending the reply (ids empty); else nullopt, and the held-back text (a
  // block cut off or malformed, as text) appended to `content`.
  std::optional<std::vector<ToolCall>> finish(std::string& content);

 private:
  std::string text_;                    // the content so far
  size_t sent_ = 0;                     // how much of it went out
  size_t block_ = std::string::npos;    // where the block starts
};
// A chat reply as it comes, split: its reasoning (ReasoningSplit), its content, and with tools its tool-call block
// taken out of the content (ToolCallSplit). One per choice, for whole responses and streams alike.
class ChatReplySplit {
 public:
  ChatReplySplit(bool thinking, bool tools) : reasoning_(thinking), tools_(tools) {}
  // Appends to `reasoning` / `content` the text of `piece` that is final now.
  void push(std::string_view piece, std::string& reasoning, std::string& content);
  // At the end: what was held back, and (with tools) the calls of a complete block ending the reply, else nullopt.
  std::optional<std::vector<ToolCall>> finish(std::string& reasoning, std::string& content);

 private:
  ReasoningSplit reasoning_;
  ToolCallSplit calls_;
  bool tools_;
};
// The message's tool_calls array: ids, "type": "function", the function's name and arguments.
json tool_calls_json(const std::vector<ToolCall>& calls);

// The usage object: prompt, completion and total tokens, and the prompt tokens the server's cache already held
// (prompt_tokens_details.cached_tokens).
json usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens);

// Whole responses (stream false) and stream chunks ("data: <chunk>\n\n" lines of an event stream).
struct ResponseIds {
  std::string id;   // "cmpl-..." / "chatcmpl-..."
  int64_t created;  // Unix seconds
  std::string model;
};
// A whole response's choice: its index, text (chat: the message), finish_reason, logprobs object (null: none).
json completion_choice(int index, const std::string& text, const char* finish, const json& logprobs = nullptr);
// `tool_calls` (tool_calls_json; null: none): the message's calls, its content null when it has none.
json chat_choice(int index, const std::string& reasoning, const std::string& content, bool thinking, const char* finish,
                 const json& logprobs = nullptr, const json& tool_calls = nullptr);
// Whole responses (stream false) from their choices.
json completion_response(const ResponseIds& ids, json choices, const json& usage);
json chat_response(const ResponseIds& ids, json choices, const json& usage);
// A completion chunk of choice `index`: `text`, and `finish` (nullptr: null) on its last.
json completion_chunk(const ResponseIds& ids, const std::string& text, const char* finish, int index = 0);
// A chat chunk's delta: {"role": "assistant"} first, then reasoning_content / content pieces, then {} with `finish`.
json chat_chunk(const ResponseIds& ids, const json& delta, const char* finish, int index = 0);
// The chunk with the usage after the last (stream_options.include_usage): "choices": [].
json usage_chunk(const ResponseIds& ids, bool chat, const json& usage);

}  // namespace plumb::server
