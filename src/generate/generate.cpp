// plumb::generate (plumb/text.h): prefill, then sample / stream / feed one token at a time until a stop token,
// a stop string, max tokens or the end of the context. Everything is validated before the session is touched.
#include <algorithm>
#include <chrono>
#include <memory>

#include "core/error.h"
#include "core/notice.h"
#include "generate/json_mode.h"
#include "generate/json_schema.h"
#include "generate/tool_call_mask.h"
#include "plumb/text.h"
#include "text/chat.h"

namespace plumb {

const char* stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::Token: return "stop token";
    case StopReason::String: return "stop string";
    case StopReason::Length: return "max tokens";
    case StopReason::Context: return "context full";
    case StopReason::Cancelled: return "cancelled";
  }
  return "?";
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void check_tokens(std::span<const int32_t> ids, int32_t vocab, const Tokenizer& tok, const char* what) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab) {
      const std::string text = ids[i] >= 0 ? tok.token_text(ids[i]) : std::string();
      fail("{} token {} at index {}{} is outside the model's vocabulary [0, {}) (vocab_size in config.json)", what,
           ids[i], i, text.empty() ? "" : fmt::format(" (\"{}\")", text), vocab);
    }
}

// The tokens that end a generation: the stop tokens, and the model's EOS while it stops.
std::vector<int32_t> end_tokens(const GenerateOptions& opt, int32_t eos_token) {
  std::vector<int32_t> ends = opt.stop_tokens;
  if (opt.stop_at_eos && eos_token >= 0) ends.push_back(eos_token);
  return ends;
}

}  // namespace

void check_json_schema(std::string_view schema) { gen::JsonSchema::compile(schema); }

namespace {

// What check_output compiled, for generate()'s mask.
struct CompiledOutput {
  std::shared_ptr<const gen::JsonSchema> schema;    // JsonSchema
  std::shared_ptr<const gen::ToolCallSpec> tools;   // ToolCalls
};

// (The tool-call mask writes the block byte by byte, so it needs a tokenizer's bytes as decode writes them, no stop
// token that is text (keeping it out could leave no way on) and, where the block is required, no stop string inside
// its fixed text (it would end every reply before the block is whole).)
std::shared_ptr<const gen::ToolCallSpec> check_tool_calls(const GenerateOptions& opt, const Tokenizer& tok,
                                                          int32_t eos_token) {
  if (tok.spaced_tokens())
    throw OptionError("tool_calls", "tool_choice", fmt::format("needs a byte-level tokenizer: {} puts a space between "
                      "tokens", tok.path()));
  // (the block's tags may come as added tokens, which skip_special would drop from the text parse_reply reads)
  if (opt.skip_special)
    throw OptionError("skip_special", "skip_special", "cannot be combined with tool calls: the DSML tags a tokenizer "
                      "holds as special tokens would be dropped from the reply, which is then no call block");
  std::shared_ptr<const gen::ToolCallSpec> spec;
  try {
    spec = gen::ToolCallSpec::build(opt.tool_calls.tools, opt.tool_calls.names, opt.tool_calls.parallel,
                                    opt.tool_calls.thinking, opt.tool_calls.required);
  } catch (const Error& e) {
    throw OptionError("tool_calls", "tool_choice", e.what());
  }
  // A stop token that is text (not an added token) would be needed wherever its text comes in the block, in a tag, a
  // key or a value, where the mask keeps it out (it only ends the reply): a key that must hold it has no way on. An
  // added token that is "</think>" ends a thinking reply's reasoning, after which a required block must come.
  for (int32_t id : end_tokens(opt, eos_token)) {
    const std::string b = id >= 0 && id < tok.vocab_size() ? tok.token_bytes(id) : std::string();
    const bool think_end = spec->thinking && spec->required && b == chat::kThinkEnd;
    if (!b.empty() && (!tok.is_added(id) || think_end))
      throw OptionError("stop_tokens", "--stop-token", fmt::format("holds token {} (\"{}\"){}, which is {}: tool calls "
                        "take no such stop token", id, escape_line(b), id == eos_token ? " (the model's EOS)" : "",
                        think_end ? "the end of the reasoning before a required call" : "text a call may need to write"));
  }
  // (with required false the reply need not call: a stop string there cuts a block as it cuts any text, and the
  // block cut comes back as text, as it did before the mask)
  if (opt.tool_calls.required)
    for (const std::string& o : gen::tool_call_fixed_texts(*spec))
      for (const std::string& s : opt.stop_strings)
        if (!s.empty() && o.find(s) != std::string::npos)
          throw OptionError("stop_strings", "--stop", fmt::format("holds \"{}\", which is text inside a tool call's "
                            "\"{}\": it would end the call there", escape_line(s), escape_line(o)));
  return spec;
}

// check_output_options, returning what generate() builds its mask on.
CompiledOutput check_output(const GenerateOptions& opt, const Tokenizer& tok, int32_t eos_token) {
  CompiledOutput out;
  if (opt.format == OutputFormat::Text) return out;
  const char* flag = opt.format == OutputFormat::JsonObject ? "--json"
                     : opt.format == OutputFormat::JsonSchema ? "--json-schema" : "tool_choice";
  if (end_tokens(opt, eos_token).empty())
    throw OptionError("format", flag, fmt::format("needs a token that ends {}: {} and no stop token is given",
                      opt.format == OutputFormat::ToolCalls ? "the call block" : "the object's text",
                      eos_token < 0 ? "the model names no EOS (eos_token_id in config.json)" : "EOS does not stop (stop_at_eos)"));
  if (opt.format == OutputFormat::JsonSchema) {
    if (opt.json_schema.empty()) throw OptionError("json_schema", flag, "is empty: OutputFormat::JsonSchema needs the schema");
    // (keys and enum values must be written byte by byte; a space between every two tokens would split them)
    if (tok.spaced_tokens())
      throw OptionError("json_schema", flag, fmt::format("needs a byte-level tokenizer: {} puts a space between tokens",
                                                         tok.path()));
    try {
      out.schema = gen::JsonSchema::compile(opt.json_schema);
    } catch (const Error& e) {
      throw OptionError("json_schema", flag, e.what());
    }
  }
  if (opt.format == OutputFormat::ToolCalls) out.tools = check_tool_calls(opt, tok, eos_token);
  return out;
}

}  // namespace

void check_output_options(const GenerateOptions& opt, const Tokenizer& tok, int32_t eos_token) {
  check_output(opt, tok, eos_token);
}

void check_generate_options(const GenerateOptions& opt) {
  check_sampling(opt.sampling);
  PLUMB_CHECK(opt.max_tokens >= 1, "max_tokens (--max-tokens) must be at least 1, got {}", opt.max_tokens);
}

GenerateResult generate(Session& session, const Tokenizer& tok, std::span<const int32_t> prompt, const GenerateOptions& opt,
                        const std::function<void(std::string_view)>& on_text) {
  const ModelInfo& info = session.info();
  PLUMB_CHECK(info.vocab_size > 0, "generate: the session's info() names no vocabulary (a Session of your own returns "
              "its model's ModelInfo there)");
  PLUMB_CHECK(!prompt.empty(), "empty prompt: there is nothing to generate from");
  check_generate_options(opt);
  check_tokens(prompt, info.vocab_size, tok, "prompt");
  check_tokens(opt.stop_tokens, info.vocab_size, tok, "stop");
  const int64_t start = session.position(), ctx = info.max_positions;
  if (ctx > 0)
    PLUMB_CHECK(start + int64_t(prompt.size()) <= ctx,
                "the prompt is {} tokens{} but the model's context is {} tokens (max_position_embeddings)",
                prompt.size(), start ? fmt::format(" after {} tokens already in the session", start) : "", ctx);

  // JSON mode's, the schema's or the tool calls' mask (OutputFormat::JsonObject / JsonSchema / ToolCalls)
  std::unique_ptr<gen::OutputMask> mask;
  const CompiledOutput compiled = check_output(opt, tok, info.eos_token);
  const std::vector<int32_t> ends = end_tokens(opt, info.eos_token);
  if (opt.format == OutputFormat::JsonObject) mask = std::make_unique<gen::JsonMask>(tok, info.vocab_size, ends);
  if (opt.format == OutputFormat::JsonSchema)
    mask = std::make_unique<gen::SchemaMask>(tok, info.vocab_size, ends, gen::SchemaRecognizer(compiled.schema));
  if (opt.format == OutputFormat::ToolCalls) {
    for (const std::string& line : compiled.tools->loose) notice(line);
    mask = gen::tool_call_mask(tok, info.vocab_size, ends, compiled.tools);
  }

  session.reserve(start + int64_t(prompt.size()) + opt.max_tokens);  // no cache growth on the way (backend cuda)
  Sampler sampler(opt.sampling, info.vocab_size);
  StopMatcher stops(opt.stop_strings);
  TextStream stream(tok, opt.skip_special);
  GenerateResult r;
  r.prompt_tokens = int64_t(prompt.size());
  auto emit = [&](const std::string& s) {
    if (s.empty()) return;
    r.text += s;
    if (on_text) on_text(s);
  };
  std::vector<int32_t> history = opt.history_before;
  history.insert(history.end(), prompt.begin(), prompt.end());
  // One feed + sample; an error from there (a backend failure, a row with no finite logit) says which token of the
  // generation it was, from which position's logits (the first: after the prompt's prefill, which may be what failed).
  auto feed_sample = [&](std::span<const int32_t> tokens) {
    const int64_t from = session.position(), at = from + int64_t(tokens.size()) - 1;
    try {
      if (!opt.on_logits && !mask) return session.forward_sample(tokens, sampler, history);
      if (!opt.on_logits) {  // the mask built while the GPU runs the pass (the host's: after it), the draw there
        const int32_t id = session.forward_sample_masked(tokens, sampler, history,
                                                         [&](std::span<uint32_t> bits) { mask->allowed(bits); });
        mask->accept(id);
        return id;
      }
      const std::vector<float> logits = session.forward(tokens);
      int32_t id;
      if (mask) {  // (the mask on a copy: on_logits sees the model's own logits)
        std::vector<float> masked = logits;
        mask->apply(masked);
        id = sampler.sample(masked, history);
        mask->accept(id);
      } else {
        id = sampler.sample(logits, history);
      }
      if (opt.on_logits) opt.on_logits(logits, id);
      return id;
    } catch (const Stopped&) {
      throw;  // (not a failure: the prompt's feed was stopped, below)
    } catch (const Error& e) {
      if (r.tokens.empty())
        fail("prefilling the prompt's {} tokens (positions {}-{}) and sampling token 1 from the last one's logits: {}",
             tokens.size(), from, at, e.what());
      fail("generating token {} (from the logits of position {}): {}", r.tokens.size() + 1, at, e.what());
    }
  };

  // forward_sample: the logits stay on the device where the backend has one (the first sample counts as prefill).
  // should_stop joins the session's prefill stop meanwhile (either stops it): a stop there ends the generation before
  // its first token, the session as it was (Session::set_prefill_stop).
  auto t0 = std::chrono::steady_clock::now();
  int32_t id = -1;
  {
    struct PutBack {  // the session's own stop function back, however the feed ends (none set here: nothing to do)
      Session* s = nullptr;
      std::function<bool()> own;
      ~PutBack() {
        try {
          if (s) s->set_prefill_stop(std::move(own));
        } catch (...) {  // (a Session of one's own that throws here: its stop stays ours, which outlives nothing)
        }
      }
    } put_back;
    if (opt.should_stop) {
      put_back.own = session.set_prefill_stop({});
      put_back.s = &session;
      session.set_prefill_stop([stop = opt.should_stop, own = put_back.own] { return stop() || (own && own()); });
    }
    try {
      id = feed_sample(prompt);
    } catch (const Stopped&) {
      r.stop = StopReason::Cancelled;
      r.prefill_seconds = seconds_since(t0);
      return r;
    }
  }
  r.prefill_seconds = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  bool stopped_by_string = false;
  for (;;) {
    r.tokens.push_back(id);
    history.push_back(id);
    r.unfed = id;
    if (std::find(opt.stop_tokens.begin(), opt.stop_tokens.end(), id) != opt.stop_tokens.end() ||
        (opt.stop_at_eos && info.eos_token >= 0 && id == info.eos_token)) {
      r.stop = StopReason::Token;
      break;
    }
    emit(stops.push(stream.push(id), stopped_by_string));
    if (stopped_by_string) {
      r.stop = StopReason::String;
      break;
    }
    if (int64_t(r.tokens.size()) >= opt.max_tokens) {
      r.stop = StopReason::Length;
      break;
    }
    if (opt.should_stop && opt.should_stop()) {
      r.stop = StopReason::Cancelled;
      break;
    }
    if (ctx > 0 && session.position() >= ctx) {  // no room to feed the token just sampled
      r.stop = StopReason::Context;
      break;
    }
    id = feed_sample(std::span<const int32_t>(&id, 1));
  }
  if (!stopped_by_string) {
    emit(stops.push(stream.flush(), stopped_by_string));
    if (stopped_by_string) r.stop = StopReason::String;
    else emit(stops.flush());
  }
  r.decode_seconds = seconds_since(t0);
  return r;
}

}  // namespace plumb
