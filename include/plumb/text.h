// plumb's public text API: tokenizer, DeepSeek-V4 chat encoding, sampling and the generation loop, over the
// Engine/Session of plumb/engine.h. `plumb run` and `plumb chat` are built on these two (plus plumb/check.h for their
// own option checks); so is tests/api/embed_example.cpp.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "plumb/error.h"

#include "plumb/engine.h"

namespace plumb {

// The one-line escaped text form `plumb tokenize` reads and writes (and the tokenizer parity fixtures use), so any
// byte string fits on one line: \\ \n \t \r and \xHH (one raw byte) escapes, everything else literal.
// unescape_line throws plumb::Error naming the column of a bad escape; escape_line escapes backslash, \n \t \r,
// other control bytes and DEL, and every byte of an ill-formed UTF-8 sequence (as \xHH).
std::string unescape_line(std::string_view line);
std::string escape_line(std::string_view bytes);
// Token ids written as "0 15 27" (whitespace or single commas between them), as `plumb run --ids`, `plumb tokenize
// --decode` and token files take them: each a non-negative integer below 2^31. Throws plumb::Error naming `what` and
// the column of the first item that is not one, or of a comma with no id on one side.
std::vector<int32_t> parse_token_ids(std::string_view text, const std::string& what);
// The whole of a text file a user names (a prompt, a token file, a text to trace), byte for byte. Throws plumb::Error
// "<what> <path> is a folder" (an ifstream opens a folder and reads it as empty), "cannot open <what> <path>" or
// "cannot read <what> <path>".
std::string read_text_file(const std::string& path, std::string_view what);

// ---------------------------------------------------------------------------------------------------------
// Tokenizer: a Hugging Face tokenizer.json (byte-level BPE, exact parity with the `tokenizers` library) plus
// what tokenizer_config.json says about BOS/EOS.
// ---------------------------------------------------------------------------------------------------------
class Tokenizer {
 public:
  // `path`: a model folder (reads tokenizer.json and, if present, tokenizer_config.json) or a tokenizer.json
  // file. Throws plumb::Error naming the file and field for a missing or malformed file.
  static Tokenizer load(const std::string& path);

  // Like tokenizers' encode(text, add_special_tokens=add_special). Added tokens such as "<｜User｜>" are
  // matched before BPE and come out as one id.
  std::vector<int32_t> encode(std::string_view text, bool add_special = false) const;
  // Ids the tokenizer has no token for (a model's vocabulary is often padded past the tokenizer's) decode to nothing,
  // as the `tokenizers` library skips them; `plumb tokenize --decode` refuses ids outside [0, vocab_size()).
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;
  int32_t token_id(std::string_view token) const;  // -1 if the tokenizer has no such (single) token
  std::string token_text(int32_t id) const;        // "" for an unknown id
  int32_t vocab_size() const;                      // one past the largest id
  bool is_special(int32_t id) const;
  // A token of tokenizer.json's added_tokens, special or not (DeepSeek's <｜User｜>, <｜Assistant｜> and <think> are
  // added tokens not marked special: chat markers all the same).
  bool is_added(int32_t id) const;
  // The bytes `id` adds to decode()'s output, before its UTF-8 repair (a byte-level token may end inside a character;
  // special tokens give their text); "" for an id the tokenizer does not know. A tokenizer without a byte-level
  // decoder (none of DeepSeek's) puts a space between tokens, which these bytes leave out: spaced_tokens() says so.
  std::string token_bytes(int32_t id) const;
  bool spaced_tokens() const;
  // From tokenizer_config.json (bos_token / eos_token / add_bos_token); -1 / false when it does not say.
  int32_t bos_id() const;
  int32_t eos_id() const;
  bool add_bos() const;
  const std::string& path() const;  // the tokenizer.json read

 private:
  struct Impl;
  Tokenizer() = default;
  std::shared_ptr<const Impl> impl_;
  friend class TextStream;
  friend struct TokenizerCache;  // (the library's tables derived from a tokenizer, kept with it: src/generate)
};

// Incremental detokenization for streaming: push() returns the text that is complete so far (a token may end
// inside a UTF-8 character); the concatenation of all push() and flush() results equals decode() of all ids.
class TextStream {
 public:
  explicit TextStream(const Tokenizer& tok, bool skip_special = false);
  ~TextStream();
  TextStream(TextStream&&) noexcept;
  std::string push(int32_t id);
  std::string flush();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A plain (not chat) prompt's ids as transformers' tokenizer(text) gives them for DeepSeek: BOS first when
// tokenizer_config.json says add_bos_token (its default is true), or, with no tokenizer_config.json naming a BOS, when
// the model's config.json does (`config_bos` >= 0); then the text without tokenizer.json's post-processor tokens
// (transformers replaces that post-processor by the BOS rule, so BOS is never added twice). `plumb run` and the
// toolkit's --text inputs both use it.
std::vector<int32_t> encode_prompt(const Tokenizer& tok, std::string_view text, int32_t config_bos);

// ---------------------------------------------------------------------------------------------------------
// Chat encoding: the DeepSeek-V4 prompt format (the model repository's encoding/encoding_dsv4.py rules, see
// docs/generation.md). Roles: system, user, assistant, developer, tool (consecutive user and tool messages are one
// user turn, as the official encoder merges them).
// ---------------------------------------------------------------------------------------------------------
// A function call an assistant turn made (OpenAI's tool_calls[i]): rendered in DeepSeek's DSML markup.
struct ToolCall {
  std::string id;         // the client's id ("call_..."): the tool results that answer it are put in call order
  std::string name;
  std::string arguments;  // a JSON object, as text (OpenAI's function.arguments)
};

struct ChatMessage {
  ChatMessage() = default;
  ChatMessage(std::string role, std::string content, std::string reasoning = {})
      : role(std::move(role)), content(std::move(content)), reasoning(std::move(reasoning)) {}
  std::string role;       // system, user, assistant, developer, tool
  std::string content;    // tool: the call's result
  std::string reasoning;  // an assistant turn's thinking (reasoning_content); "" when none
  std::vector<ToolCall> tool_calls;  // assistant: the calls it made (after its content)
  std::string tool_call_id;          // tool: the call it answers
};

struct ChatOptions {
  bool thinking = false;      // thinking_mode "thinking" (the assistant turn opens with <think>) vs "chat"
  bool drop_thinking = true;  // drop earlier turns' reasoning (the official default; off when tools are given)
  bool add_bos = true;        // start with <｜begin▁of▁sentence｜>
  std::string reasoning_effort;  // "" / "high": nothing; "max": the official effort prompt (thinking only)
  // The tools the model may call: a JSON array of OpenAI tool objects ({"type": "function", "function": {"name",
  // "description", "parameters"}}), "" for none. Rendered as the official "## Tools" block after the first system
  // message's content (an empty system message is put first if there is none).
  std::string tools;
};

// The whole conversation as the official encoder renders it. A conversation ending with a user turn ends with
// the generation prompt "<｜Assistant｜><think>" (thinking) or "<｜Assistant｜></think>" (chat).
std::string encode_chat(const std::vector<ChatMessage>& messages, const ChatOptions& opt);

// The same format in pieces, for a session that keeps its cache between turns (`plumb chat`): prefix, then per
// turn chat_user_turn(), the model's own reply tokens, then chat_turn_end(). Their concatenation equals
// encode_chat(..., drop_thinking = false): earlier reasoning stays in the cache instead of being re-rendered.
std::string chat_prefix(const std::string& system, const ChatOptions& opt);
std::string chat_user_turn(const std::string& content, bool thinking);
std::string chat_turn_end();  // <｜end▁of▁sentence｜>
// Throws plumb::Error naming the first chat-format string (<｜User｜>, <｜Assistant｜>, <think>, ...) that the
// tokenizer does not hold as one token: such a model cannot be prompted in the chat format.
void require_chat_tokens(const Tokenizer& tok);
// What opens a DSML tool-call block in a reply (the block: "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=...>...").
inline constexpr std::string_view kToolCallsOpen = "<｜DSML｜tool_calls>";
// Splits a thinking-mode reply "reasoning</think>content" (no </think>: all reasoning if `thinking`), and takes a
// complete DSML tool-call block at the end of the content into tool_calls (ids left empty; the content keeps what came
// before the block). A block that is cut off or malformed stays in the content, as text. `text` must hold the special
// strings (decoded without skip_special).
ChatMessage parse_reply(std::string_view text, bool thinking);

// ---------------------------------------------------------------------------------------------------------
// Sampling
// ---------------------------------------------------------------------------------------------------------
struct SamplingParams {
  float temperature = 0.8f;  // <= 0: greedy (argmax; ties to the lowest id)
  int top_k = 40;            // 0: off
  float top_p = 0.95f;       // 1: off
  float min_p = 0.05f;       // 0: off; keeps tokens with p >= min_p * p(top token)
  float repeat_penalty = 1.0f;  // 1: off; tokens in the window: logit / r if > 0, logit * r otherwise
  float presence_penalty = 0.0f;   // logit -= presence if the token is in the window
  float frequency_penalty = 0.0f;  // logit -= frequency * (its count in the window)
  int penalty_last_n = 64;         // the penalty window (last N tokens of prompt + output); -1: all
  uint64_t seed = 0;
};

// An option out of its range, or in conflict with another. what() names the field and its CLI flag ("top_p (--top-p)
// must be in (0, 1], got 2"); the parts are kept for a front end that names the field its own way (plumb serve: the
// request's field).
struct OptionError : Error {
  OptionError(std::string field, std::string flag, std::string rule)
      : Error(field + " (" + flag + ") " + rule), field(std::move(field)), flag(std::move(flag)), rule(std::move(rule)) {}
  std::string field;  // the options' member: "top_p"
  std::string flag;   // its CLI option: "--top-p"
  std::string rule;   // "must be in (0, 1], got 2"
};
using SamplingError = OptionError;  // (check_sampling's)

// Throws SamplingError for parameters out of range. The Sampler checks them too; a front end calls it before loading
// a model, so a typo does not wait for the load.
void check_sampling(const SamplingParams& p);

// Deterministic: the same seed, logits and history give the same tokens on every run and machine.
class Sampler {
 public:
  Sampler(const SamplingParams& p, int32_t vocab);
  ~Sampler();
  Sampler(Sampler&&) noexcept;
  int32_t vocab() const;  // the logits per row it takes
  // Picks a token from one row of logits; `history` are the tokens so far (for the penalties). A NaN logit counts as
  // -inf. Throws plumb::Error for a row with no finite logit after the penalties (all NaN or -inf, or a +inf), saying
  // what it held and whether the penalties made it so: a broken model's output is an error, never a token.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history);
  // The distribution sample() draws from: (id, probability) in decreasing probability, after penalties,
  // temperature, top-k, top-p and min-p, renormalized. Greedy: the argmax with probability 1. Throws as sample().
  std::vector<std::pair<int32_t, float>> distribution(std::span<const float> logits,
                                                      std::span<const int32_t> history) const;

  // For a backend that samples on its device (backend cuda) with this sampler's parameters and RNG: the penalty
  // window as distinct (token, count) pairs, and the uniform draw the next sample() would make. sample() draws
  // only when the distribution keeps more than one token; so does the device, which then calls commit_draw().
  const SamplingParams& params() const;
  std::vector<std::pair<int32_t, int>> penalty_window(std::span<const int32_t> history) const;
  double peek_draw();
  void commit_draw();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------------------------------------
// Generation
// ---------------------------------------------------------------------------------------------------------
// What the generated text must be. JsonObject (JSON mode; OpenAI's response_format {"type": "json_object"}): one JSON
// object, nothing before it but whitespace and nothing after it, ended by EOS (or a stop token) as soon as it closes.
// At each step every token that cannot continue a valid object (RFC 8259; nesting at most 64 deep, numbers at most 64
// bytes, whitespace between tokens one space or tab, or one line break and at most 32 spaces or tabs of indentation)
// gets the logit -inf before the penalties and the sampling; added tokens (is_added: the chat markers) pass only as the
// end. The mask is built on the host (Session::forward_sample_masked: on backend cuda while the GPU runs the step's pass,
// its bits uploaded and applied there, the sampling on the GPU; with on_logits, on the host after the pass). The text is
// valid JSON unless a limit (max tokens, a stop string, the context) cuts it first. Ask for JSON in the prompt too: the
// mask only removes the tokens that would break the syntax.
// JsonSchema (structured outputs; OpenAI's response_format {"type": "json_schema"}): the same, the object also an
// instance of GenerateOptions::json_schema, a JSON Schema of the subset docs/generation.md lists (type, properties,
// required, additionalProperties, items, minItems / maxItems, minLength / maxLength, minimum / maximum on integers,
// enum / const of scalars, anyOf / oneOf, $ref to $defs);
// any other constraint keyword is refused (plumb::Error naming it, before the session is touched). Keys are written as
// the schema spells them, enum values as JSON writes them compactly.
// ToolCalls (plumb serve's tools): the reply's DSML tool-call block as DeepSeek-V4's chat encoder renders an assistant
// turn's calls (parse_reply reads it back), each invoke naming one of GenerateOptions::tool_calls' functions and its
// parameters an instance of that function's `parameters` schema (the subset above; string parameters as raw text with
// string="true", the others as JSON with string="false"), then the end. With `required` (tool_choice "required" or a
// named function) the reply is that block (after a thinking reply's reasoning); without (tool_choice "auto") it is any
// text, and a block it begins (at its tag, as parse_reply finds it) is held so. A tool whose parameters fall outside the
// subset has its arguments held to a JSON object only (a notice says so), unless the tool says "strict": true (refused
// then). Masked as JSON mode is; the block is whole unless a limit cuts it first.
enum class OutputFormat { Text, JsonObject, JsonSchema, ToolCalls };
// OutputFormat::ToolCalls' functions.
struct ToolCallOptions {
  std::string tools;               // OpenAI's tools array (JSON text), as the prompt renders them (ChatOptions::tools)
  std::vector<std::string> names;  // the functions the block may call (empty: any of the tools)
  bool parallel = true;            // more than one call in the block (OpenAI's parallel_tool_calls)
  bool required = true;            // the reply is the block; false: any text, a block it begins held whole
  bool thinking = false;           // a thinking-mode reply: its reasoning, up to "</think>", comes first (free text)
};
// Compiles a schema as OutputFormat::JsonSchema would: throws plumb::Error naming what it does not support (a front end
// checks a request's schema before queueing it).
void check_json_schema(std::string_view schema);
struct GenerateOptions;
// The output options' rules that need the tokenizer and the model's EOS (`eos_token`, -1 if none), which generate()
// checks before feeding anything (a front end may check first, as plumb serve does to answer 400 before queueing):
//  - JsonObject / JsonSchema / ToolCalls: a token that ends the output (a stop token, or EOS while stop_at_eos) -> "format";
//    JsonSchema: the schema given, compiled (check_json_schema's errors), a byte-level tokenizer -> "json_schema";
//  - ToolCalls: the tools compiled (a name missing or not among them, a strict tool's schema) and a byte-level
//    tokenizer -> "tool_calls"; no stop token (EOS too, while stop_at_eos) that is text (not an added token), which the
//    mask would have to keep out of the block where it may be needed, nor, thinking and required, "</think>" ->
//    "stop_tokens"; with `required`, no stop string inside the block's fixed text (a function's opening, the tags,
//    "</think>" before them), which would end every reply early -> "stop_strings"; not skip_special (tags written as
//    added tokens would be dropped) -> "skip_special".
// Throws OptionError naming the field (and the CLI flag that sets it).
void check_output_options(const GenerateOptions& opt, const Tokenizer& tok, int32_t eos_token);

struct GenerateOptions {
  SamplingParams sampling;
  OutputFormat format = OutputFormat::Text;
  std::string json_schema;  // OutputFormat::JsonSchema's schema (JSON text)
  ToolCallOptions tool_calls;  // OutputFormat::ToolCalls' functions
  int max_tokens = 256;                   // sampled tokens, a final stop token included
  std::vector<std::string> stop_strings;  // matched on the decoded text, across token boundaries
  std::vector<int32_t> stop_tokens;       // more stop tokens (EOS stops already, see stop_at_eos); not emitted
  bool stop_at_eos = true;                // the model's EOS (ModelInfo::eos_token, where it names one) stops too
  bool skip_special = false;              // drop special tokens from the emitted text
  // Asked after each sampled token (its text emitted): true stops the generation there, as a stop would
  // (StopReason::Cancelled, the held-back text flushed, the result complete: `unfed` continues the session). Also
  // asked while the prompt prefills, as the session's prefill stop (Session::set_prefill_stop; the library's
  // sessions ask it after each layer on the CPU, each pass on the GPU): true there returns StopReason::Cancelled
  // with no token (`unfed` -1: nothing to feed) and the session as it was before the call. (So a predicate that counts
  // its calls is asked during the prefill too; the session's own prefill stop, if it has one, is asked beside it.)
  // May be empty. A front end's Ctrl-C, a client gone, a deadline.
  std::function<bool()> should_stop;
  // Called with each sampled token and the logits it was drawn from (vocab floats: the model's own, before the
  // penalties and the temperature), before the token's text is emitted. While set, every step's logits come to the host
  // and the token is drawn there (Sampler::sample, the draws the device sampler makes too): log probabilities, a
  // front end's inspection. Slower on backend cuda. May be empty (the default).
  std::function<void(std::span<const float> logits, int32_t token)> on_logits;
  // Tokens the session already holds before `prompt` that the penalties should see, in order (the penalty window is
  // the last penalty_last_n of these, the prompt and the output): a session continued, such as a server's cached
  // prefix, samples as if the whole sequence had been its prompt. Empty (the default): the prompt and the output only.
  std::vector<int32_t> history_before;
};

// The sampling parameters (check_sampling) and --max-tokens; generate() checks them too (before any forward).
void check_generate_options(const GenerateOptions& opt);

enum class StopReason { Token, String, Length, Context, Cancelled };
// "stop token" (EOS or another), "stop string", "max tokens", "context full", "cancelled"
const char* stop_reason_name(StopReason r);

struct GenerateResult {
  std::vector<int32_t> tokens;  // every sampled token, in order
  std::string text;             // the emitted text (a matched stop string and what follows it excluded)
  StopReason stop = StopReason::Length;
  // The last sampled token is never fed to the session (nothing needs its logits). A caller that continues
  // the same session (a chat's next turn) feeds it first; -1 when nothing was sampled.
  int32_t unfed = -1;
  int64_t prompt_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
};

// Prefills `prompt` at the session's position, then samples until a stop. The vocabulary, EOS and context are the
// session's model's (Session::info()). `on_text` receives each piece of text as soon as it is final (streaming).
// Throws plumb::Error before touching the session for a session whose info() names no vocabulary, an empty prompt, a
// prompt or stop token outside the model's vocabulary, options out of range, or a prompt that does not fit the
// context. An error during the generation (a backend failure, logits without a finite value: Sampler) is thrown as it
// happens, naming the token and position ("generating token 3 (from the logits of position 41): ..."); the session
// then holds what was fed (the prompt and the tokens before; see Session::forward for a failure inside a pass, after
// which a checkpoint taken before the call is the way back), and the text already passed to on_text is all of the
// result there is. A stop during the prompt's prefill (should_stop) is no error: StopReason::Cancelled with no token
// and `unfed` -1, the session as it was before the call.
GenerateResult generate(Session& session, const Tokenizer& tok, std::span<const int32_t> prompt, const GenerateOptions& opt,
                        const std::function<void(std::string_view)>& on_text = {});

// Holds back text that may be the start of a stop string (the piece of generate() that does the matching).
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  // Returns the text that can be emitted now; sets `stopped` when a stop string completed (the text before it is
  // returned; the stop string is dropped, and what followed it in the pieces is kept for flush()).
  std::string push(std::string_view piece, bool& stopped);
  // The held-back text: at the end of generation, or after a stop what followed the stop string (generate() drops
  // it; `plumb serve` splits a thinking reply at "</think>" with it).
  std::string flush();

 private:
  std::vector<std::string> stops_;
  std::string held_;
};

}  // namespace plumb
