// OutputFormat::ToolCalls: the DSML tool-call block's recognizer and its mask (tool_call_mask.h).
#include "generate/tool_call_mask.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "generate/json_mode.h"
#include "text/chat.h"
#include "text/dsml.h"

namespace plumb::gen {

namespace {

using json = nlohmann::json;

// The parameters of a function that declares none (OpenAI: omitting parameters defines an empty parameter list), and
// what a tool whose parameters cannot be held is held to.
constexpr std::string_view kNoParameters = R"({"type": "object", "properties": {}, "additionalProperties": false})";
constexpr std::string_view kAnyObject = R"({"type": "object"})";

// A name DSML writes between quotes as is: an invoke's, no '"', backslash or control character (parse_calls reads up to
// the quote, and the server's clients match names as written).
bool dsml_name_ok(std::string_view s) {
  return !s.empty() && std::none_of(s.begin(), s.end(), [](char c) { return c == '"' || c == '\\' || uint8_t(c) < 0x20; });
}

// A property the arguments' object may have at the top (through $ref and unions) whose name holds a '"', which a
// DSML parameter's name cannot (other characters are written raw and read back by parse_calls), or "".
std::string unwritable_key(const SchemaNode* n, std::vector<const SchemaNode*>& seen) {
  if (!n || std::find(seen.begin(), seen.end(), n) != seen.end()) return {};
  seen.push_back(n);
  for (const auto& [key, value] : n->props) {  // (keys JSON-escaped as nlohmann writes them)
    const std::string name = json::parse("\"" + key + "\"").get<std::string>();
    if (name.find('"') != std::string::npos) return name;
  }
  if (std::string k = unwritable_key(n->ref, seen); !k.empty()) return k;
  for (const SchemaNode* b : n->any_of)
    if (std::string k = unwritable_key(b, seen); !k.empty()) return k;
  return {};
}

// Why `params` (a function's parameters) cannot be held, or "" if it can: the schema must compile, take an object,
// and every property name it may take at the top (DSML's parameter names) must be writable.
std::string params_problem(const json& params, std::shared_ptr<const JsonSchema>& compiled) {
  try {
    compiled = JsonSchema::compile(params.dump());
  } catch (const Error& e) {
    return e.what();
  }
  if (SchemaRecognizer r(compiled); !r.feed(uint8_t('{')))
    return "it does not describe an object (a call's arguments are one)";
  std::vector<const SchemaNode*> seen;
  if (const std::string k = unwritable_key(compiled->root(), seen); !k.empty())
    return fmt::format("property \"{}\": a DSML parameter name cannot hold '\"'", k);
  return {};
}

// The point's fixed texts (at most two; none a prefix of another).
const std::array<std::string, 2>& choices(int point) {
  using namespace dsml;
  static const std::array<std::array<std::string, 2>, 5> texts = {{
      {"\n\n" + std::string(kCallsOpen) + "\n" + std::string(kInvokeOpen), ""},                     // Open
      {std::string(kParamOpen), "\n" + std::string(kInvokeClose)},                                  // Head
      {"\n" + std::string(kParamOpen), "\n" + std::string(kInvokeClose)},                           // AfterParam
      {" string=\"true\">", " string=\"false\">"},                                                  // Kind
      {"\n" + std::string(kInvokeOpen), "\n" + std::string(kCallsClose)},                           // AfterInvoke
  }};
  return texts[size_t(point)];
}

// A raw byte as nlohmann's dump escapes it inside a string (so an enum's text compares equal).
std::string escaped(uint8_t c) {
  switch (c) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\b': return "\\b";
    case '\f': return "\\f";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    default: return c < 0x20 ? fmt::format("\\u{:04x}", c) : std::string(1, char(c));
  }
}

bool is_space(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

}  // namespace

std::shared_ptr<const ToolCallSpec> ToolCallSpec::build(std::string_view tools_json, const std::vector<std::string>& names,
                                                       bool parallel, bool thinking, bool required) {
  json tools;
  try {
    tools = json::parse(tools_json);
  } catch (const json::exception& e) {
    fail("tools: not valid JSON: {}", e.what());
  }
  PLUMB_CHECK(tools.is_array(), "tools must be an array of {{\"type\": \"function\", \"function\": {{...}}}} objects");
  auto spec = std::make_shared<ToolCallSpec>();
  spec->parallel = parallel, spec->thinking = thinking, spec->required = required;
  std::map<std::string, size_t> first;  // (each name's first tool)
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const json* f = t.is_object() && t.contains("function") && t["function"].is_object() ? &t["function"] : nullptr;
    PLUMB_CHECK(f && f->contains("name") && (*f)["name"].is_string(), "tools[{}] needs {{\"function\": {{\"name\": ...}}}}", i);
    const std::string name = (*f)["name"];
    if (!names.empty() && std::find(names.begin(), names.end(), name) == names.end()) continue;
    PLUMB_CHECK(dsml_name_ok(name), "tools[{}].function.name \"{}\": a DSML invoke cannot name it (empty, or it holds "
                "'\"', a backslash or a control character)", i, name);
    const auto [seen, fresh] = first.emplace(name, i);
    PLUMB_CHECK(fresh, "tools[{}] and tools[{}] are both named \"{}\": a call could not say which it calls", seen->second,
                i, name);
    Tool tool{name, nullptr};
    const bool strict = f->contains("strict") && (*f)["strict"] == true;
    const json params = f->contains("parameters") ? (*f)["parameters"] : json::parse(kNoParameters);
    if (const std::string why = params_problem(params, tool.params); !why.empty()) {
      PLUMB_CHECK(!strict, "tools[{}].function.parameters (\"{}\", strict): {}", i, name, why);
      spec->loose.push_back(fmt::format("tool \"{}\": its arguments are held to be a JSON object only, not to its "
                                        "parameters: {}", name, why));
      tool.params = JsonSchema::compile(kAnyObject);
    }
    spec->tools.push_back(std::move(tool));
  }
  for (const std::string& n : names)
    PLUMB_CHECK(std::any_of(spec->tools.begin(), spec->tools.end(), [&](const Tool& t) { return t.name == n; }),
                "function \"{}\" is not among the tools", n);
  PLUMB_CHECK(!spec->tools.empty(), "tool calls need at least one tool");
  return spec;
}

ToolCallRecognizer::ToolCallRecognizer(std::shared_ptr<const ToolCallSpec> spec, std::vector<int32_t> tried)
    : spec_(std::move(spec)), tried_(std::make_shared<const std::vector<int32_t>>(std::move(tried))) {
  PLUMB_CHECK(spec_ && !spec_->tools.empty(), "tool calls: no tool to call");
  if (spec_->thinking) phase_ = Phase::Reasoning, at_ = 0;
  else if (!spec_->required) phase_ = Phase::Text, at_ = 0;
  else enter(Point::Open);
}

std::string_view ToolCallRecognizer::free_end() const {
  return phase_ == Phase::Reasoning ? chat::kThinkEnd : dsml::kCallsOpen;
}

// Free text, watching for its end: "</think>" after the reasoning, the block's tag after the text. Neither has a '<'
// past its first byte, so a byte that breaks a partial match can only begin a new one.
bool ToolCallRecognizer::free_byte(uint8_t c) {
  const std::string_view end = free_end();
  if (uint8_t(end[at_]) != c) {
    at_ = uint8_t(end[0]) == c ? 1 : 0;
    return true;
  }
  if (++at_ < end.size()) return true;
  if (phase_ == Phase::Reasoning) {  // (the reasoning is over: the block, or free text before one)
    if (spec_->required) return enter(Point::Open);
    phase_ = Phase::Text, at_ = 0;
    return true;
  }
  // The tag: the block goes on from there, as the Open text does after its blank line and tag.
  phase_ = Phase::Choice, point_ = Point::Open, alts_ = 1, at_ = uint32_t(2 + dsml::kCallsOpen.size());
  return true;
}

bool ToolCallRecognizer::feed(std::string_view bytes) {
  for (char c : bytes)
    if (!feed(uint8_t(c))) return false;
  return true;
}

bool ToolCallRecognizer::feed(uint8_t c) {
  switch (phase_) {
    case Phase::Reasoning:
    case Phase::Text: return free_byte(c);
    case Phase::Choice: return choose(c);
    case Phase::Name: return name_byte(c);
    case Phase::Key: return key_byte(c);
    case Phase::Value: return value_byte(c);
    case Phase::Done: return false;
  }
  return false;
}

bool ToolCallRecognizer::args_take_key() const {
  SchemaRecognizer a = args_;
  return (!keys_ || keys_->empty() || a.feed(uint8_t(','))) && a.feed(uint8_t('"'));
}

bool ToolCallRecognizer::args_take_close() const {
  SchemaRecognizer a = args_;
  return a.feed(uint8_t('}')) && a.complete();
}

bool ToolCallRecognizer::enter(Point p) {
  phase_ = Phase::Choice, point_ = p, at_ = 0;
  switch (p) {
    case Point::Open: alts_ = 1; break;
    case Point::Head:
    case Point::AfterParam: alts_ = uint8_t(args_take_key() | args_take_close() << 1); break;
    case Point::Kind: {
      SchemaRecognizer s = args_;
      bool other = false;  // (a JSON value that is not a string: its first byte)
      for (char c : std::string_view("{[-0123456789tfn")) {
        SchemaRecognizer o = args_;
        other = other || o.feed(uint8_t(c));
      }
      alts_ = uint8_t(s.feed(uint8_t('"')) | other << 1);
      break;
    }
    case Point::AfterInvoke: alts_ = uint8_t(spec_->parallel | 2); break;
  }
  return alts_ != 0;
}

bool ToolCallRecognizer::choose(uint8_t c) {
  const auto& texts = choices(int(point_));
  uint8_t left = 0;
  for (int i = 0; i < 2; ++i)
    if ((alts_ >> i & 1) && at_ < texts[size_t(i)].size() && uint8_t(texts[size_t(i)][at_]) == c) left |= uint8_t(1 << i);
  if (!left) return false;
  alts_ = left, ++at_;
  const int i = left & 1 ? 0 : 1;
  if (left != (1 << i) || at_ < texts[size_t(i)].size()) return true;  // (still between texts, or in one)
  // Text i is whole.
  switch (point_) {
    case Point::Open: phase_ = Phase::Name, text_.clear(); return true;
    case Point::Head:
    case Point::AfterParam:
      if (i == 1) return args_.feed(uint8_t('}')) && enter(Point::AfterInvoke);
      if (keys_ && !keys_->empty() && !args_.feed(uint8_t(','))) return false;
      phase_ = Phase::Key, text_.clear();
      return args_.feed(uint8_t('"'));
    case Point::Kind:
      phase_ = Phase::Value, raw_ = i == 0, begun_ = false, held_ = 0;
      esc_ = 0, u_ = 0, need_low_ = false, number_.clear();
      return !raw_ || args_.feed(uint8_t('"'));
    case Point::AfterInvoke:
      if (i == 1) return phase_ = Phase::Done, true;
      phase_ = Phase::Name, text_.clear();
      return true;
  }
  return false;
}

bool ToolCallRecognizer::name_byte(uint8_t c) {
  text_ += char(c);
  static constexpr std::string_view kEnd = "\">\n";
  for (const ToolCallSpec::Tool& t : spec_->tools) {
    const size_t n = t.name.size();
    const std::string_view have = text_;
    if (have.size() <= n ? t.name.compare(0, have.size(), have) != 0
                         : have.compare(0, n, t.name) != 0 || kEnd.substr(0, have.size() - n) != have.substr(n))
      continue;
    if (have.size() < n + kEnd.size()) return true;
    // The header is whole: this function's arguments begin.
    args_ = SchemaRecognizer(t.params);
    keys_.reset();
    return args_.feed(uint8_t('{')) && enter(Point::Head);
  }
  return false;
}

bool ToolCallRecognizer::key_byte(uint8_t c) {
  // (a backslash or control character is written raw, as parse_calls reads it back: the key the JSON escape spells)
  if (c != '"') return text_ += char(c), args_.feed(escaped(c));
  if (text_.empty()) return false;
  if (keys_ && std::find(keys_->begin(), keys_->end(), text_) != keys_->end()) return false;
  if (!args_.feed(uint8_t('"')) || !args_.feed(uint8_t(':'))) return false;
  auto keys = keys_ ? std::make_shared<std::vector<std::string>>(*keys_) : std::make_shared<std::vector<std::string>>();
  keys->push_back(text_);
  keys_ = std::move(keys);
  return enter(Point::Kind);
}

bool ToolCallRecognizer::content(uint8_t c) {
  if (raw_) return args_.feed(escaped(c));
  if (!begun_ && !is_space(c)) {
    if (c == '"') return false;  // (a string is written raw, with string="true")
    begun_ = true;
  }
  // (outside a string at the arguments' own level, ',' and '}' would be the arguments' next key or their end: the
  // DSML around the value writes those)
  if ((c == ',' || c == '}') && args_.depth() == 1 && !args_.in_string()) return false;
  return json_text(c) && args_.feed(c);
}

// parse_calls reads a string="false" value with nlohmann, which refuses two texts JSON's grammar (and JsonRecognizer)
// allows, and would then keep the value as a string: a lone surrogate escape and a number beyond a double. Both are
// refused at the byte that makes them so; some other byte always remains (the escape's other digits, the number's end).
bool ToolCallRecognizer::json_text(uint8_t c) {
  auto hex = [](uint8_t h) { return h >= '0' && h <= '9' ? h - '0' : (h | 0x20) >= 'a' && (h | 0x20) <= 'f' ? (h | 0x20) - 'a' + 10 : -1; };
  if (args_.in_string()) {
    number_.clear();
    if (esc_ == 0) {
      if (need_low_ && c != '\\') return false;  // (a high surrogate's escape: its low half must follow)
      if (c == '\\') esc_ = 1;
      return true;
    }
    if (esc_ == 1) {
      if (c != 'u') return !need_low_ && (esc_ = 0, true);
      esc_ = 2, u_ = 0;
      return true;
    }
    const int h = hex(c);
    if (h < 0) return true;  // (the syntax refuses it)
    u_ = uint16_t(u_ * 16 + h);
    const int digit = esc_ - 2;  // 0-3
    // After two digits the range is known: dc-df a low surrogate (only right after a high one), d8-db a high one.
    if (digit == 1) {
      const bool low = u_ >= 0xDC && u_ <= 0xDF;
      if (low != need_low_) return false;
    }
    if (digit == 0 && need_low_ && h != 0xD) return false;
    if (++esc_ < 6) return true;
    esc_ = 0;
    const bool high = u_ >= 0xD800 && u_ <= 0xDBFF;
    need_low_ = high;
    return true;
  }
  // Outside strings: a number's text so far (its bytes; anything else ends it).
  const bool num = (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
  if (!num || (number_.empty() && c != '-' && !(c >= '0' && c <= '9'))) {
    number_.clear();
    return true;
  }
  number_ += char(c);
  return !(c >= '0' && c <= '9') || std::isfinite(std::strtod(number_.c_str(), nullptr));
}

bool ToolCallRecognizer::content(std::string_view bytes) {
  for (char c : bytes)
    if (!content(uint8_t(c))) return false;
  return true;
}

bool ToolCallRecognizer::value_may_end() const {
  if (!raw_ && !begun_) return false;
  SchemaRecognizer a = args_;
  if (raw_ && !a.feed(uint8_t('"'))) return false;
  // What enter(Point::AfterParam) asks, at the arguments' own level (a ',' inside a value still open continues it).
  SchemaRecognizer key = a;
  if (key.feed(uint8_t(',')) && key.depth() == 1 && key.feed(uint8_t('"'))) return true;
  return a.feed(uint8_t('}')) && a.complete();
}

bool ToolCallRecognizer::value_byte(uint8_t c) {
  const std::string_view close = dsml::kParamClose;
  if (uint8_t(close[held_]) == c) {
    // The close goes on: possible if the value could end where it began (the held bytes were not fed: the arguments
    // are as they were there), or its bytes could still be text.
    const bool may_end = value_may_end();
    if (!may_end) {
      ToolCallRecognizer t = *this;
      if (!t.content(close.substr(0, held_ + 1))) return false;
    }
    if (++held_ < close.size()) return true;
    if (!may_end) return false;  // (the whole close ends the value, as parse_calls reads it)
    held_ = 0;
    if (raw_ && !args_.feed(uint8_t('"'))) return false;
    return enter(Point::AfterParam);
  }
  // Not the close: what was held back is text after all.
  if (held_) {
    if (!content(close.substr(0, held_))) return false;
    held_ = 0;
    if (uint8_t(close[0]) == c) return value_byte(c);
  }
  return content(c);
}

// Why the shortcut holds (TokenMask takes every plain token here untried, then tries recheck_first_byte's and
// recheck_ids'): plain text has no '"' and no control character, and within a free string every such text is taken,
// but for the parameter's close (and, in a JSON value, a lone surrogate escape, which a plain token cannot hold: a
// plain token with a surrogate's escape is tried). A plain token that holds a whole close is tried (recheck_ids); any
// other can only begin one, which is then held back (text or close, decided later). With bytes
// held back, a token that does not go on with the close makes them text (a free string takes them) and goes on from
// there as above; one that does is tried (recheck_first_byte). In a key, any plain text without a '"' is some key's
// (escapes are written raw; a plain token with a '"', an escaped quote, is tried).
bool ToolCallRecognizer::between_string_chars(int64_t longest_plain) const {
  if (phase_ == Phase::Reasoning || phase_ == Phase::Text) return true;  // (recheck_first_byte and recheck_ids: as a close)
  if (phase_ == Phase::Key) return args_.between_string_chars(longest_plain);
  if (phase_ != Phase::Value || need_low_) return false;
  if (held_ == 0) return args_.between_string_chars(longest_plain);
  ToolCallRecognizer t = *this;  // (where the held bytes would be text)
  return t.content(dsml::kParamClose.substr(0, held_)) && !t.need_low_ && t.args_.between_string_chars(longest_plain);
}

int ToolCallRecognizer::recheck_first_byte() const {
  if ((phase_ == Phase::Reasoning || phase_ == Phase::Text) && at_ > 0) return int(uint8_t(free_end()[at_]));
  return phase_ == Phase::Value && held_ > 0 ? int(uint8_t(dsml::kParamClose[held_])) : -1;
}

std::unique_ptr<OutputMask> tool_call_mask(const Tokenizer& tok, int32_t vocab, std::vector<int32_t> ends,
                                           std::shared_ptr<const ToolCallSpec> spec) {
  // (a tokenizer that holds a DSML tag, or part of one, as an added token: the model was trained to write that token;
  // so is DeepSeek's "</think>", which ends a thinking reply's reasoning)
  auto tags = tool_call_fixed_texts(ToolCallSpec{});
  if (spec->thinking) tags.emplace_back(chat::kThinkEnd);
  const auto tables = TokenTables::of(tok, vocab, spec->thinking ? "DSML tags, </think>" : "DSML tags", [&](std::string_view text) {
    return std::any_of(tags.begin(), tags.end(), [&](const std::string& t) { return t.find(text) != std::string::npos; });
  });
  // The plain tokens the shortcut must try (between_string_chars): those that hold a whole parameter close, a
  // surrogate's \u escape (plain JSON text, which a JSON value takes only as a whole pair), an escaped quote (plain
  // JSON text, which would end a DSML key), or the whole text that ends a free phase (the block's tag, "</think>").
  auto surrogate_escape = [](const std::string& b) {
    for (size_t i = b.find("\\u"); i != std::string::npos && i + 3 < b.size(); i = b.find("\\u", i + 1))
      if ((b[i + 2] | 0x20) == 'd' && std::string_view("89abcdefABCDEF").find(b[i + 3]) != std::string_view::npos) return true;
    return false;
  };
  std::vector<int32_t> tried;
  for (int32_t id : tables->plain) {
    const std::string& b = tables->bytes[size_t(id)];
    if (b.find(dsml::kParamClose) != std::string::npos || surrogate_escape(b) || b.find('"') != std::string::npos ||
        b.find(dsml::kCallsOpen) != std::string::npos || b.find(chat::kThinkEnd) != std::string::npos)
      tried.push_back(id);
  }
  return std::make_unique<ToolCallMask>(tok, vocab, std::move(ends), ToolCallRecognizer(std::move(spec), std::move(tried)),
                                        tables);
}

std::vector<std::string> tool_call_fixed_texts(const ToolCallSpec& spec) {
  using namespace dsml;
  std::vector<std::string> out;
  for (const ToolCallSpec::Tool& t : spec.tools) {
    out.push_back(call_opening(t.name));
    // (a thinking reply's reasoning ends right before a required block)
    if (spec.thinking && spec.required) out.push_back(std::string(chat::kThinkEnd) + call_opening(t.name));
  }
  for (int p = 0; p < 5; ++p)
    for (const std::string& s : choices(p))
      if (!s.empty()) out.push_back(s);
  // (the texts that always meet across two pieces: a parameter's close and what follows it, an invoke's close and
  // what follows it, the block's end)
  out.push_back(std::string(kParamClose) + "\n<");
  out.push_back("\n" + std::string(kInvokeClose) + "\n<");
  out.push_back("\n" + std::string(kInvokeClose) + "\n" + std::string(kCallsClose));
  return out;
}

}  // namespace plumb::gen
