// `plumb serve`'s request checks and response bodies (openai.h): OpenAI's field names and shapes, plumb's rules.
#include "server/openai.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

namespace plumb::server {

void bad_request(const std::string& param, const std::string& message) {
  throw RequestError(400, "invalid_request_error", param, message);
}

std::string to_text(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json error_body(const std::string& message, const std::string& type, const std::string& param) {
  return {{"error", {{"message", message}, {"type", type}, {"param", param.empty() ? json() : json(param)}, {"code", nullptr}}}};
}

json parse_body(const std::string& text) {
  json body;
  // (a body nested deeper than any request needs is refused: serializing it again, as a tools array is, recurses)
  int deepest = 0;
  const json::parser_callback_t depth = [&](int d, json::parse_event_t, json&) {
    deepest = std::max(deepest, d);
    return true;
  };
  try {
    body = json::parse(text, depth);
  } catch (const json::parse_error& e) {
    bad_request("", fmt::format("the body is not valid JSON (at byte {}): {}", e.byte, e.what()));
  } catch (const json::exception& e) {  // (a number beyond a double's range)
    bad_request("", fmt::format("the body is not valid JSON: {}", e.what()));
  }
  if (deepest > kMaxJsonDepth)
    bad_request("", fmt::format("the body is nested {} deep, more than the {} plumb serve reads", deepest, kMaxJsonDepth));
  if (!body.is_object()) bad_request("", fmt::format("the body must be a JSON object, got {}", body.type_name()));
  return body;
}

namespace {

// A present, non-null field (OpenAI's clients send null for "not given").
const json* field(const json& body, const char* name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

double number(const json& body, const char* name, double fallback) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_number()) bad_request(name, fmt::format("{} must be a number, got {}", name, v->type_name()));
  return v->get<double>();
}

// An integer within [lo, hi]; JSON numbers like 5.0 are accepted, 5.5 is not.
int64_t integer(const json& v, const std::string& name, int64_t lo, int64_t hi) {
  if (!v.is_number()) bad_request(name, fmt::format("{} must be an integer, got {}", name, v.type_name()));
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    bad_request(name, fmt::format("{} must be at most {}, got {}", name, hi, v.dump()));
  const double d = v.get<double>();
  if (!v.is_number_integer() && d != double(int64_t(d)))
    bad_request(name, fmt::format("{} must be an integer, got {}", name, v.dump()));
  const int64_t x = v.is_number_integer() ? v.get<int64_t>() : int64_t(d);
  if (x < lo || x > hi) bad_request(name, fmt::format("{} must be in [{}, {}], got {}", name, lo, hi, x));
  return x;
}

bool boolean(const json& body, const char* name, bool fallback) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_boolean()) bad_request(name, fmt::format("{} must be true or false, got {}", name, v->type_name()));
  return v->get<bool>();
}

std::string string_field(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return {};
  if (!v->is_string()) bad_request(name, fmt::format("{} must be a string, got {}", name, v->type_name()));
  return v->get<std::string>();
}

const char* format_name(OutputFormat f) { return f == OutputFormat::JsonSchema ? "json_schema" : "json_object"; }

// Fields of OpenAI's API that plumb does not implement: refused by name rather than ignored, so a client does not
// take plain text for what it asked (token biases, a suffix to fill in, a predicted output, audio).
void refuse_unsupported(const json& body) {
  for (const char* name : {"logit_bias", "functions", "function_call",
                           "suffix", "audio", "modalities", "prediction"}) {
    const json* v = field(body, name);
    // (false, 0, "", [] and {} ask for nothing: clients send them as defaults)
    const bool asks = v && !(v->is_boolean() && !v->get<bool>()) && !(v->is_number() && v->get<double>() == 0) &&
                      !((v->is_string() || v->is_array() || v->is_object()) && v->empty());
    if (asks) bad_request(name, fmt::format("{} is not supported by plumb serve", name));
  }
}

// response_format: {"type": "text"} (the default), {"type": "json_object"} (JSON mode: generate()'s
// OutputFormat::JsonObject) or {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}} (structured
// output: OutputFormat::JsonSchema; the schema compiled here, so what plumb does not support is a 400 naming it).
void response_format(const json& body, GenerateOptions& g) {
  const json* v = field(body, "response_format");
  if (!v) return;
  const json* type = v->is_object() ? field(*v, "type") : nullptr;
  if (!type || !type->is_string())
    bad_request("response_format", "response_format must be an object with a \"type\": \"text\", \"json_object\" or "
                "\"json_schema\"");
  if (*type == "text") return;
  if (*type == "json_object") {
    g.format = OutputFormat::JsonObject;
    return;
  }
  if (*type != "json_schema")
    bad_request("response_format", fmt::format("response_format type \"{}\" is not supported by plumb serve (\"text\", "
                                               "\"json_object\" and \"json_schema\" are)", type->get<std::string>()));
  const json* spec = field(*v, "json_schema");
  const json* schema = spec && spec->is_object() ? field(*spec, "schema") : nullptr;
  if (!schema) bad_request("response_format", "response_format json_schema needs \"json_schema\": {\"schema\": {...}}");
  g.format = OutputFormat::JsonSchema, g.json_schema = schema->dump();  // (compiled by check_output)
}

std::vector<std::string> stop_strings(const json& body, const Defaults& d) {
  std::vector<std::string> out = d.stop_strings;
  const json* v = field(body, "stop");
  if (!v) return out;
  auto add = [&](const json& s, const std::string& name) {
    if (!s.is_string()) bad_request(name, fmt::format("{} must be a string, got {}", name, s.type_name()));
    if (s.get<std::string>().empty()) bad_request(name, fmt::format("{} is empty: a stop string needs text", name));
    out.push_back(s.get<std::string>());
  };
  if (v->is_array()) {
    for (size_t i = 0; i < v->size(); ++i) add((*v)[i], fmt::format("stop[{}]", i));
  } else {
    add(*v, "stop");
  }
  return out;
}

// The fields both endpoints share whatever the prompt: stream, sampling, stop, n.
void common_fields(const json& body, const Defaults& d, Request& r) {
  refuse_unsupported(body);
  if (const json* v = field(body, "n")) r.n = int(integer(*v, "n", 1, kMaxChoices));
  // (best_of > n would sample more and return the most likely n: not built)
  if (const json* v = field(body, "best_of"); v && integer(*v, "best_of", 1, kMaxChoices) != r.n)
    bad_request("best_of", fmt::format("best_of must equal n ({}): plumb serve does not rank extra samples", r.n));
  r.model = string_field(body, "model");
  r.stream = boolean(body, "stream", false);
  if (r.stream && r.top_logprobs >= 0)
    bad_request("logprobs", "logprobs with \"stream\": true is not supported by plumb serve (ask without stream)");
  if (const json* so = field(body, "stream_options")) {
    if (!r.stream) bad_request("stream_options", "stream_options needs \"stream\": true");
    if (!so->is_object()) bad_request("stream_options", fmt::format("stream_options must be an object, got {}", so->type_name()));
    r.include_usage = boolean(*so, "include_usage", false);
  }
  SamplingParams& s = r.gen.sampling;
  s = d.sampling;
  s.temperature = float(number(body, "temperature", s.temperature));
  s.top_p = float(number(body, "top_p", s.top_p));
  s.min_p = float(number(body, "min_p", s.min_p));
  s.presence_penalty = float(number(body, "presence_penalty", s.presence_penalty));
  s.frequency_penalty = float(number(body, "frequency_penalty", s.frequency_penalty));
  // (vLLM names it repetition_penalty, llama.cpp's server repeat_penalty: both are read)
  s.repeat_penalty = float(number(body, "repetition_penalty", number(body, "repeat_penalty", s.repeat_penalty)));
  if (const json* v = field(body, "top_k")) {
    const int64_t k = integer(*v, "top_k", -1, std::numeric_limits<int32_t>::max());
    s.top_k = k < 0 ? 0 : int(k);  // (-1: off, as vLLM reads it)
  }
  // OpenAI's ranges for its two penalties, and a bound on the multiplicative one: beyond them a logit can overflow
  // to infinity and the generation fail part way (a 500) instead of the request being refused.
  for (const char* name : {"presence_penalty", "frequency_penalty"})
    if (const json* v = field(body, name); v && v->is_number() && std::abs(v->get<double>()) > 2)
      bad_request(name, fmt::format("{} must be in [-2, 2], got {}", name, v->dump()));
  for (const char* name : {"repetition_penalty", "repeat_penalty"})
    if (const json* v = field(body, name); v && v->is_number() && !(v->get<double>() > 0 && v->get<double>() <= 100))
      bad_request(name, fmt::format("{} must be in (0, 100], got {}", name, v->dump()));
  if (const json* v = field(body, "temperature"); v && v->is_number() && v->get<double>() > 100)
    bad_request("temperature", fmt::format("temperature must be at most 100, got {}", v->dump()));
  if (const json* v = field(body, "seed")) s.seed = uint64_t(integer(*v, "seed", 0, std::numeric_limits<int64_t>::max()));
  else if (!d.fixed_seed) s.seed = std::random_device{}();
  try {
    check_sampling(s);
  } catch (const SamplingError& e) {
    // (named as the body names it; a value from the server's command line is no field of the request)
    std::string param = e.field == "repeat_penalty" && body.contains("repetition_penalty") ? "repetition_penalty" : e.field;
    if (!body.contains(param)) param.clear();
    bad_request(param, fmt::format("{} {}", param.empty() ? e.field : param, e.rule));
  }
  r.gen.stop_strings = stop_strings(body, d);
  r.gen.stop_tokens = d.stop_tokens;
  r.gen.stop_at_eos = true;
  // vLLM's ignore_eos (benchmarks, tests): EOS no longer stops; --stop-token ids and stop strings still do.
  if (boolean(body, "ignore_eos", false)) {
    r.gen.stop_at_eos = false;
    std::erase_if(r.gen.stop_tokens, [&](int32_t id) { return id == d.eos_token || id == d.tokenizer_eos; });
  }
  r.gen.skip_special = true;  // (a reply's text; BOS/EOS are not part of it)
  response_format(body, r.gen);
}

// generate()'s output rules (check_output_options), answered before queueing with the request's field: the format's
// end token and schema (response_format, or tool_choice's), a tool that cannot be called (tools), a stop inside a tool
// call's fixed text (stop, or tool_choice for the server's own stops). Tool calls under tool_choice "auto" that cannot
// be held (no end token: ignore_eos; a stop token that is text; a strict tool plumb cannot hold, two tools of one name;
// a spaced tokenizer) are served unmasked, as before the mask, with a line in the server's log (Request::note): "auto"
// asks for no call.
void check_output(const json& body, Request& r, const Tokenizer& tok, const Defaults& d) {
  if (r.gen.format == OutputFormat::ToolCalls && !r.gen.tool_calls.required) {
    try {
      check_output_options(r.gen, tok, d.eos_token);
    } catch (const OptionError& e) {
      r.note = fmt::format("tool_choice \"auto\": the reply's calls are read as written, not held to the tools ({}: {})",
                           e.field, e.rule);
      r.gen.format = OutputFormat::Text;
    }
    return;
  }
  try {
    check_output_options(r.gen, tok, d.eos_token);
  } catch (const OptionError& e) {
    // (a stop string the request did not send is the server's own --stop: tool_choice is what cannot be held to)
    if (e.field == "stop_strings" && field(body, "stop"))
      bad_request("stop", fmt::format("stop {} (tool_choice holds the reply to it)", e.rule));
    if (e.field == "stop_strings" || e.field == "stop_tokens")
      bad_request("tool_choice", fmt::format("tool_choice cannot be held to here: the server's stops ({}) {}", e.flag,
                                             e.rule));
    if (e.field == "tool_calls") {  // (a tool that cannot be called names tools[i]; the rest is tool_choice's)
      if (e.rule.rfind("tools", 0) == 0) bad_request("tools", e.rule);
      bad_request("tool_choice", fmt::format("tool_choice {}", e.rule));
    }
    if (e.field == "format")
      bad_request(r.gen.format == OutputFormat::ToolCalls ? "tool_choice" : "response_format",
                  fmt::format("{} {} (ignore_eos takes EOS away; the server's --stop-token gives others)",
                              r.gen.format == OutputFormat::ToolCalls ? "tool_choice" : "response_format " + std::string(format_name(r.gen.format)),
                              e.rule));
    bad_request("response_format", e.rule);
  }
}

// The max tokens of `r`'s prompt (named `prompt_name` in errors): the request's, or the default cut to the context
// left after the prompt.
void fit_max_tokens(const json& body, const Defaults& d, const char* max_tokens_name, const std::string& prompt_name,
                    Request& r) {
  const int64_t n = int64_t(r.prompt.size());
  const int64_t room = d.context > 0 ? d.context - n : std::numeric_limits<int32_t>::max();
  const json* mt = field(body, max_tokens_name);
  if (!mt && r.chat) mt = field(body, "max_tokens");  // (chat: the older name too)
  // (echo with max_tokens 0 only scores the prompt: a prompt that fills the context is fine then)
  const int64_t want = mt ? integer(*mt, max_tokens_name, r.echo ? 0 : 1, std::numeric_limits<int32_t>::max()) : -1;
  if (room <= 0 && want != 0)
    bad_request(prompt_name, fmt::format("{}: the prompt is {} tokens, but the model's context is {} tokens: no room to "
                "generate", prompt_name, n, d.context));
  if (room < 0)
    bad_request(prompt_name, fmt::format("{}: the prompt is {} tokens, but the model's context is {} tokens", prompt_name,
                                         n, d.context));
  if (mt) {
    if (want > room)
      bad_request(max_tokens_name, fmt::format("the model's context is {} tokens, but {} tokens were requested ({} in the {}, "
                  "{} to generate)", d.context, n + want, n, prompt_name == "messages" ? "prompt" : prompt_name, want));
    r.gen.max_tokens = int(want);
  } else {
    r.gen.max_tokens = int(std::min<int64_t>(d.max_tokens, room));
  }
}

void check_ids(const std::vector<int32_t>& ids, const Defaults& d, const std::string& name) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] >= d.vocab) bad_request(name, fmt::format("{}: token {} at index {} is outside the model's vocabulary [0, {})",
                                                         name, ids[i], i, d.vocab));
}

// A message's content: a string, or an array of {"type": "text", "text": ...} parts, joined by `joint` (a tool's
// result: a blank line between parts, as DeepSeek's encoder joins them; a user's: nothing).
std::string content_text(const json& m, const std::string& name, const std::string& joint = {}) {
  const auto it = m.find("content");
  if (it == m.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array())
    bad_request(name + ".content", fmt::format("{}.content must be a string or an array of text parts, got {}", name, it->type_name()));
  std::string out;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& p = (*it)[i];
    const std::string pn = fmt::format("{}.content[{}]", name, i);
    if (!p.is_object() || !p.contains("type") || p["type"] != "text" || !p.contains("text") || !p["text"].is_string())
      bad_request(pn, fmt::format("{}: only text parts ({{\"type\": \"text\", \"text\": ...}}) are supported", pn));
    if (i) out += joint;
    out += p["text"].get<std::string>();
  }
  return out;
}

// An assistant message's tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}].
std::vector<ToolCall> tool_calls(const json& v, const std::string& name) {
  if (!v.is_array()) bad_request(name, fmt::format("{} must be an array, got {}", name, v.type_name()));
  std::vector<ToolCall> out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string n = fmt::format("{}[{}]", name, i);
    const json& t = v[i];
    if (!t.is_object()) bad_request(n, fmt::format("{} must be an object, got {}", n, t.type_name()));
    const json* f = field(t, "function");
    if (!f || !f->is_object()) bad_request(n + ".function", fmt::format("{} needs a function object {{name, arguments}}", n));
    ToolCall c;
    c.id = string_field(t, "id");
    c.name = string_field(*f, "name");
    if (c.name.empty()) bad_request(n + ".function.name", fmt::format("{}.function.name is required", n));
    c.arguments = string_field(*f, "arguments");
    if (c.arguments.empty()) c.arguments = "{}";
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace

std::vector<Request> parse_completion(const json& body, const Tokenizer& tok, const Defaults& d) {
  const json* p = field(body, "prompt");
  if (!p) bad_request("prompt", "prompt is required");
  // The prompts: a string or an array of token ids is one; an array of strings, or of arrays of ids, several.
  std::vector<std::pair<const json*, std::string>> prompts;  // (the prompt, its name in errors)
  if (p->is_array() && !p->empty() && !(*p)[0].is_number()) {
    if (p->size() > size_t(kMaxChoices))
      bad_request("prompt", fmt::format("prompt: {} prompts, more than the {} a request may hold", p->size(), kMaxChoices));
    for (size_t i = 0; i < p->size(); ++i) prompts.emplace_back(&(*p)[i], fmt::format("prompt[{}]", i));
  } else {
    prompts.emplace_back(p, "prompt");
  }
  // The fields every prompt's request shares (one seed for all: each prompt's choices alike), then each prompt's own.
  Request shared;
  for (const char* chat_only : {"tools", "tool_choice"})
    if (field(body, chat_only)) bad_request(chat_only, fmt::format("{} is a field of /v1/chat/completions", chat_only));
  shared.echo = boolean(body, "echo", false);
  if (const json* v = field(body, "logprobs")) {
    if (v->is_boolean()) bad_request("logprobs", "logprobs (completions) is the number of alternatives, 0 to 20");
    shared.top_logprobs = int(integer(*v, "logprobs", 0, 20));
  }
  common_fields(body, d, shared);
  check_output(body, shared, tok, d);
  // (an echoed completion's text is the prompt and then the object: not JSON)
  if (shared.echo && shared.gen.format != OutputFormat::Text)
    bad_request("response_format", fmt::format("response_format {} cannot be combined with echo: the text would start "
                                               "with the prompt", format_name(shared.gen.format)));
  std::vector<Request> out;
  for (const auto& [one, name] : prompts) {
    Request r = shared;
    if (one->is_string()) {
      if (one->get<std::string>().empty()) bad_request(name, fmt::format("{} is empty: there is nothing to continue", name));
      r.prompt = encode_prompt(tok, one->get<std::string>(), d.config_bos);
    } else if (one->is_array() && !one->empty() && (*one)[0].is_number()) {
      for (size_t i = 0; i < one->size(); ++i)
        r.prompt.push_back(int32_t(integer((*one)[i], fmt::format("{}[{}]", name, i), 0, std::numeric_limits<int32_t>::max())));
      check_ids(r.prompt, d, name);
    } else {
      bad_request(name, fmt::format("{} must be a string or an array of token ids{}", name,
                                    name == "prompt" ? " (or an array of several of those)" : ""));
    }
    if (r.prompt.empty()) bad_request(name, fmt::format("{} is empty: there is nothing to continue", name));
    if (r.echo) r.echo_text = one->is_string() ? one->get<std::string>() : tok.decode(r.prompt, true);
    fit_max_tokens(body, d, "max_tokens", name, r);
    out.push_back(std::move(r));
  }
  if (out.size() * size_t(out.front().n) > size_t(kMaxChoices))
    bad_request("n", fmt::format("{} prompts x n {} = {} choices, more than the {} a request may hold", out.size(),
                                 out.front().n, out.size() * size_t(out.front().n), kMaxChoices));
  return out;
}

Request parse_chat(const json& body, const Tokenizer& tok, const Defaults& d) {
  Request r;
  r.chat = true;
  const json* ms = field(body, "messages");
  if (!ms) bad_request("messages", "messages is required");
  if (!ms->is_array() || ms->empty()) bad_request("messages", "messages must be a non-empty array of {role, content} objects");
  std::vector<ChatMessage> msgs;
  for (size_t i = 0; i < ms->size(); ++i) {
    const json& m = (*ms)[i];
    const std::string name = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad_request(name, fmt::format("{} must be an object, got {}", name, m.type_name()));
    const std::string role = string_field(m, "role");
    if (role != "system" && role != "user" && role != "assistant" && role != "developer" && role != "tool")
      bad_request(name + ".role", fmt::format("{}.role \"{}\" is not supported (system, user, assistant, developer, tool)",
                                              name, role));
    ChatMessage c(role, content_text(m, name, role == "tool" ? "\n\n" : ""), string_field(m, "reasoning_content"));
    if (role == "developer" && c.content.empty()) bad_request(name + ".content", fmt::format("{}: a developer message needs content", name));
    if (role == "tool") c.tool_call_id = string_field(m, "tool_call_id");
    if (const json* tc = field(m, "tool_calls")) {
      if (role != "assistant") bad_request(name + ".tool_calls", fmt::format("{}: only an assistant message has tool_calls", name));
      c.tool_calls = tool_calls(*tc, name + ".tool_calls");
    }
    msgs.push_back(std::move(c));
  }
  if (msgs.back().role != "user" && msgs.back().role != "developer" && msgs.back().role != "tool")
    bad_request(fmt::format("messages[{}].role", msgs.size() - 1), fmt::format("the last message must be a user turn (or a "
                "tool's result) for the assistant to answer, got role \"{}\"", msgs.back().role));
  ChatOptions co;
  r.thinking = boolean(body, "thinking", false);
  if (const json* k = field(body, "chat_template_kwargs")) {
    if (!k->is_object()) bad_request("chat_template_kwargs", "chat_template_kwargs must be an object");
    r.thinking = boolean(*k, "thinking", r.thinking);
  }
  co.thinking = r.thinking;
  const std::string effort = string_field(body, "reasoning_effort");
  if (!effort.empty()) {
    if (effort != "high" && effort != "max")
      bad_request("reasoning_effort", fmt::format("reasoning_effort must be \"high\" or \"max\" (DeepSeek-V4's), got \"{}\"", effort));
    if (!r.thinking) bad_request("reasoning_effort", "reasoning_effort needs thinking mode (\"thinking\": true)");
    co.reasoning_effort = effort;
  }
  // Tools: rendered into the prompt; with tool_choice "auto" (the default) the reply is read for calls, with "none" it
  // is not (the prompt stays the same either way, as vLLM renders it, so the cache and the reasoning kept do too).
  // OutputFormat::ToolCalls holds a call block to the tools' parameters: with "auto" a block the reply begins, with
  // "required" or a named function the whole reply (after a thinking reply's reasoning), calling that function.
  if (const json* t = field(body, "tools")) {
    if (!t->is_array()) bad_request("tools", fmt::format("tools must be an array, got {}", t->type_name()));
    std::string choice = "auto", named;
    if (const json* c = field(body, "tool_choice")) {
      if (c->is_string()) {
        choice = c->get<std::string>();
        if (choice != "auto" && choice != "none" && choice != "required")
          bad_request("tool_choice", fmt::format("tool_choice must be \"auto\", \"none\", \"required\" or "
                                                 "{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got \"{}\"", choice));
      } else {
        const json* ty = c->is_object() ? field(*c, "type") : nullptr;
        const json* f = ty && *ty == "function" ? field(*c, "function") : nullptr;
        const json* n = f && f->is_object() ? field(*f, "name") : nullptr;
        if (!n || !n->is_string())
          bad_request("tool_choice", "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                      "\"function\": {\"name\": ...}}");
        choice = "named", named = n->get<std::string>();
      }
    }
    r.gen.tool_calls.parallel = boolean(body, "parallel_tool_calls", true);
    if (t->empty() && choice != "auto" && choice != "none")
      bad_request("tool_choice", fmt::format("tool_choice {} needs at least one tool", choice == "named" ? "naming a function" : "\"required\""));
    if (!t->empty()) co.tools = t->dump(), r.tools = choice != "none";
    if (r.tools) {
      r.gen.format = OutputFormat::ToolCalls;
      r.gen.tool_calls.tools = t->dump();
      r.gen.tool_calls.required = choice != "auto";
      r.gen.tool_calls.thinking = r.thinking;
    }
    if (choice == "required" || choice == "named") {
      bool found = choice == "required";
      for (const json& tool : *t) {  // (a tool without a name is the encoder's error, below, naming it)
        const json* f = tool.is_object() ? field(tool, "function") : nullptr;
        const json* n = f && f->is_object() ? field(*f, "name") : nullptr;
        found = found || (n && *n == named);
      }
      if (!found)
        bad_request("tool_choice", fmt::format("tool_choice names function \"{}\", which is not among the tools", named));
      if (choice == "named") r.gen.tool_calls.names = {named};
    }
  } else if (field(body, "tool_choice")) {
    bad_request("tool_choice", "tool_choice needs tools");
  }
  try {
    require_chat_tokens(tok);
  } catch (const Error& e) {
    bad_request("messages", e.what());
  }
  try {
    r.prompt = tok.encode(encode_chat(msgs, co));
  } catch (const Error& e) {  // (a tool schema or a call's arguments the encoder cannot render: it names which)
    const std::string m = e.what();
    bad_request(m.rfind("tools", 0) == 0 ? "tools" : "messages", m);
  }
  if (boolean(body, "echo", false)) bad_request("echo", "echo is a field of /v1/completions, not of chat");
  if (boolean(body, "logprobs", false)) r.top_logprobs = 0;
  if (const json* v = field(body, "top_logprobs")) {
    if (r.top_logprobs < 0) bad_request("top_logprobs", "top_logprobs needs \"logprobs\": true");
    r.top_logprobs = int(integer(*v, "top_logprobs", 0, 20));
  }
  common_fields(body, d, r);
  fit_max_tokens(body, d, "max_completion_tokens", "messages", r);
  if (r.tools) r.gen.skip_special = false;  // (the reply is parsed for DSML markup: keep every string the model wrote)
  // JSON mode masks the reply from its first token: a thinking reply's reasoning, or a tool-call block, could not be
  // written. (With tool_choice "none" the tools are only in the prompt: JSON mode applies.)
  // (response_format, read after the tools, replaced ToolCalls by a JSON format: refused here as with "auto")
  if (r.gen.format != OutputFormat::Text && r.gen.format != OutputFormat::ToolCalls && (r.thinking || r.tools))
    bad_request("response_format", fmt::format("response_format {} cannot be combined with {}: JSON mode holds the whole "
                                               "reply to one JSON object", format_name(r.gen.format),
                                               r.thinking ? "thinking mode" : "tools whose calls are read (tool_choice \"none\" can)"));
  check_output(body, r, tok, d);
  return r;
}

TokenLogprob token_logprob(std::span<const float> logits, int32_t id, int n) {
  double m = -std::numeric_limits<double>::infinity();
  for (const float l : logits)
    if (std::isfinite(l)) m = std::max(m, double(l));
  double sum = 0;
  for (const float l : logits)
    if (std::isfinite(l)) sum += std::exp(double(l) - m);
  const double lse = m + std::log(sum);
  auto lp = [&](int32_t i) {
    const float l = logits[size_t(i)];
    return std::isfinite(l) ? double(l) - lse : -std::numeric_limits<double>::infinity();
  };
  TokenLogprob t;
  t.id = id;
  t.logprob = lp(id);
  const size_t k = std::min(logits.size(), size_t(std::max(n, 0)));
  if (k == 0) return t;  // (no alternatives asked: no pass over the vocabulary for them)
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + std::ptrdiff_t(k), order.end(), [&](int32_t a, int32_t b) {
    const double la = lp(a), lb = lp(b);
    return la != lb ? la > lb : a < b;
  });
  for (size_t i = 0; i < k; ++i) t.top.emplace_back(order[i], lp(order[i]));
  return t;
}

namespace {
// A log probability as JSON: -inf (a token the model gives no chance) as OpenAI's clients can read it.
json logprob_json(double x) { return std::isfinite(x) ? json(x) : json(-9999.0); }
}  // namespace

json completion_logprobs(const std::vector<TokenLogprob>& lp, const Tokenizer& tok, bool with_top) {
  json tokens = json::array(), values = json::array(), tops = json::array(), offsets = json::array();
  int64_t at = 0;
  for (const TokenLogprob& t : lp) {
    tokens.push_back(tok.decode({t.id}));
    values.push_back(t.unscored ? json() : logprob_json(t.logprob));
    offsets.push_back(at);
    at += int64_t(tok.decode({t.id}, true).size());
    json top = json::object();
    for (const auto& [id, v] : t.top) top[tok.decode({id})] = logprob_json(v);
    tops.push_back(with_top && !t.unscored ? top : json());
  }
  return {{"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json chat_logprobs(const std::vector<TokenLogprob>& lp, const Tokenizer& tok) {
  auto entry = [&](int32_t id, double v) {
    const std::string text = tok.decode({id});
    json bytes = json::array();
    for (const unsigned char c : text) bytes.push_back(int(c));
    return json{{"token", text}, {"logprob", logprob_json(v)}, {"bytes", bytes}};
  };
  json content = json::array();
  for (const TokenLogprob& t : lp) {
    json e = entry(t.id, t.logprob);
    json top = json::array();
    for (const auto& [id, v] : t.top) top.push_back(entry(id, v));
    e["top_logprobs"] = top;
    content.push_back(e);
  }
  return {{"content", content}};
}

const char* finish_reason(StopReason r) {
  switch (r) {
    case StopReason::Token:
    case StopReason::String: return "stop";
    case StopReason::Length:
    case StopReason::Context: return "length";
    case StopReason::Cancelled: return "cancelled";
  }
  return "stop";
}

void ReasoningSplit::push(std::string_view piece, std::string& reasoning, std::string& content) {
  if (!in_reasoning_) {
    content += piece;
    return;
  }
  bool ended = false;
  reasoning += end_.push(piece, ended);  // (a tail that may still become "</think>" is held back)
  if (ended) in_reasoning_ = false, content += end_.flush();  // (what followed it in the piece)
}

void ReasoningSplit::flush(std::string& reasoning, std::string& content) {
  (in_reasoning_ ? reasoning : content) += end_.flush();
}

void ToolCallSplit::push(std::string_view piece, std::string& content) {
  text_ += piece;
  if (block_ != std::string::npos) return;
  const std::string_view open = kToolCallsOpen;
  block_ = text_.find(open, sent_ > 2 ? sent_ - 2 : 0);
  size_t end = block_;  // (what may go out: up to the block, less its blank line)
  if (block_ == std::string::npos) {
    // Hold back a tail that may become "\n\n<｜DSML｜tool_calls>" (or the block without the blank line).
    end = text_.size();
    for (size_t k = std::min(text_.size(), open.size() + 1); k > 0; --k) {
      const std::string_view tail = std::string_view(text_).substr(text_.size() - k);
      const std::string with_blank = "\n\n" + std::string(open);
      if (with_blank.compare(0, k, tail) == 0 || open.substr(0, k) == tail) {
        end = text_.size() - k;
        break;
      }
    }
  } else if (end >= 2 && text_.compare(end - 2, 2, "\n\n") == 0) {
    end -= 2;
  }
  if (end > sent_) content += text_.substr(sent_, end - sent_), sent_ = end;
}

std::optional<std::vector<ToolCall>> ToolCallSplit::finish(std::string& content) {
  if (block_ != std::string::npos)
    if (ChatMessage m = parse_reply(std::string_view(text_).substr(block_), false); !m.tool_calls.empty()) return m.tool_calls;
  content += text_.substr(sent_);
  sent_ = text_.size();
  return std::nullopt;
}

void ChatReplySplit::push(std::string_view piece, std::string& reasoning, std::string& content) {
  std::string text;
  reasoning_.push(piece, reasoning, text);
  if (tools_) calls_.push(text, content);
  else content += text;
}

std::optional<std::vector<ToolCall>> ChatReplySplit::finish(std::string& reasoning, std::string& content) {
  std::string text;
  reasoning_.flush(reasoning, text);
  if (!tools_) {
    content += text;
    return std::nullopt;
  }
  calls_.push(text, content);
  return calls_.finish(content);
}

json tool_calls_json(const std::vector<ToolCall>& calls) {
  json out = json::array();
  for (const ToolCall& c : calls)
    out.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  return out;
}

json usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

namespace {
json head(const ResponseIds& ids, const char* object) {
  return {{"id", ids.id}, {"object", object}, {"created", ids.created}, {"model", ids.model}};
}
json finish_json(const char* finish) { return finish ? json(finish) : json(); }
}  // namespace

json completion_choice(int index, const std::string& text, const char* finish, const json& logprobs) {
  return {{"index", index}, {"text", text}, {"logprobs", logprobs}, {"finish_reason", finish_json(finish)}};
}

json chat_choice(int index, const std::string& reasoning, const std::string& content, bool thinking, const char* finish,
                 const json& logprobs, const json& tool_calls) {
  json msg = {{"role", "assistant"}, {"content", tool_calls.is_null() || !content.empty() ? json(content) : json()}};
  if (thinking) msg["reasoning_content"] = reasoning;
  if (!tool_calls.is_null()) msg["tool_calls"] = tool_calls;
  return {{"index", index}, {"message", msg}, {"logprobs", logprobs}, {"finish_reason", finish_json(finish)}};
}

json completion_response(const ResponseIds& ids, json choices, const json& usage) {
  json r = head(ids, "text_completion");
  r["choices"] = std::move(choices);
  r["usage"] = usage;
  return r;
}

json chat_response(const ResponseIds& ids, json choices, const json& usage) {
  json r = head(ids, "chat.completion");
  r["choices"] = std::move(choices);
  r["usage"] = usage;
  return r;
}

json completion_chunk(const ResponseIds& ids, const std::string& text, const char* finish, int index) {
  json r = head(ids, "text_completion");
  r["choices"] = json::array({completion_choice(index, text, finish)});
  return r;
}

json chat_chunk(const ResponseIds& ids, const json& delta, const char* finish, int index) {
  json r = head(ids, "chat.completion.chunk");
  r["choices"] = json::array({{{"index", index}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", finish_json(finish)}}});
  return r;
}

json usage_chunk(const ResponseIds& ids, bool chat, const json& usage) {
  json r = head(ids, chat ? "chat.completion.chunk" : "text_completion");
  r["choices"] = json::array();
  r["usage"] = usage;
  return r;
}

}  // namespace plumb::server
