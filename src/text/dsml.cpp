// DSML tool markup (dsml.h): the tools block, an assistant turn's calls, and reading them back.
#include "text/dsml.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace plumb::dsml {

using ojson = nlohmann::ordered_json;

namespace {

// The official encoder's tools block, verbatim (the model was trained on exactly this text): head, the schemas, tail.
constexpr std::string_view kToolsHead = R"(## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<｜DSML｜tool_calls>" block like the following:

<｜DSML｜tool_calls>
<｜DSML｜invoke name="$TOOL_NAME">
<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>
...
</｜DSML｜invoke>
<｜DSML｜invoke name="$TOOL_NAME2">
...
</｜DSML｜invoke>
</｜DSML｜tool_calls>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.

Otherwise, output directly after </think> with tool calls or final response.

### Available Tool Schemas

)";
constexpr std::string_view kToolsTail = R"(

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
)";

std::string scalar(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

// A float as Python's repr writes it: the shortest digits that read back the same, in positional notation for decimal
// exponents -4 to 15 (with ".0" when integral), else as d.ddde+XX (nlohmann switches at other exponents).
std::string python_float(double x) {
  if (!std::isfinite(x)) return std::isnan(x) ? "NaN" : x > 0 ? "Infinity" : "-Infinity";  // (json.dumps' spellings)
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);  // shortest: "-3.25e+02"
  const std::string sci(buf, res.ptr);
  const size_t e = sci.find('e');
  const int exp = std::stoi(sci.substr(e + 1));
  std::string digits;  // the significant digits, without sign and point
  for (size_t i = 0; i < e; ++i)
    if (std::isdigit(static_cast<unsigned char>(sci[i]))) digits += sci[i];
  const std::string sign = std::signbit(x) ? "-" : "";
  if (exp < -4 || exp >= 16) {
    std::string m(1, digits[0]);
    if (digits.size() > 1) m += '.', m.append(digits, 1);
    return fmt::format("{}{}e{}{:02d}", sign, m, exp < 0 ? '-' : '+', std::abs(exp));
  }
  std::string out = sign;
  if (exp < 0) {
    out += "0.";
    out.append(size_t(-exp - 1), '0');
    out += digits;
  } else if (size_t(exp) + 1 >= digits.size()) {
    out += digits;
    out.append(size_t(exp) + 1 - digits.size(), '0');
    out += ".0";
  } else {
    out.append(digits, 0, size_t(exp) + 1);
    out += '.';
    out.append(digits, size_t(exp) + 1);
  }
  return out;
}

// JSON text that a caller gave (a tools array, a call's arguments), parsed with its key order, refused when nested
// deeper than kMaxDepth (rendering it recurses) or holding a number beyond a double's range.
constexpr int kMaxDepth = 64;
ojson parse_checked(const std::string& text, const std::string& what) {
  int deepest = 0;
  const ojson::parser_callback_t depth = [&](int d, ojson::parse_event_t, ojson&) {
    deepest = std::max(deepest, d);
    return true;
  };
  ojson j = ojson::parse(text, depth);  // (a parse_error propagates: the callers decide what text that is not JSON means)
  PLUMB_CHECK(deepest <= kMaxDepth, "{} is nested {} deep, more than {}", what, deepest, kMaxDepth);
  return j;
}

void append_python(const ojson& j, std::string& out) {
  if (j.is_object()) {
    out += '{';
    bool first = true;
    for (const auto& [k, v] : j.items()) {
      if (!first) out += ", ";
      first = false;
      out += scalar(ojson(k));
      out += ": ";
      append_python(v, out);
    }
    out += '}';
  } else if (j.is_array()) {
    out += '[';
    for (size_t i = 0; i < j.size(); ++i) {
      if (i) out += ", ";
      append_python(j[i], out);
    }
    out += ']';
  } else if (j.is_number_float()) {
    out += python_float(j.get<double>());
  } else {
    out += scalar(j);  // (strings escaped as Python escapes them with ensure_ascii off: ", \\ and control characters)
  }
}

// The text between `open` at `at` and the next `close`; advances `at` past `close`. nullopt if either is missing.
std::optional<std::string_view> between(std::string_view s, size_t& at, std::string_view open, std::string_view close) {
  if (s.substr(at, open.size()) != open) return std::nullopt;
  const size_t end = s.find(close, at + open.size());
  if (end == std::string_view::npos) return std::nullopt;
  const std::string_view inner = s.substr(at + open.size(), end - at - open.size());
  at = end + close.size();
  return inner;
}

bool skip(std::string_view s, size_t& at, std::string_view what) {
  if (s.substr(at, what.size()) != what) return false;
  at += what.size();
  return true;
}

}  // namespace

std::string python_json(const ojson& j) {
  std::string out;
  append_python(j, out);
  return out;
}

std::string render_tools(const std::string& tools_json) {
  ojson tools;
  try {
    tools = parse_checked(tools_json, "tools");
  } catch (const ojson::exception& e) {
    fail("tools: not valid JSON: {}", e.what());
  }
  PLUMB_CHECK(tools.is_array(), "tools must be an array of {{\"type\": \"function\", \"function\": {{...}}}} objects");
  std::string schemas;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    PLUMB_CHECK(t.is_object() && t.contains("function") && t["function"].is_object(),
                "tools[{}] must be {{\"type\": \"function\", \"function\": {{...}}}}", i);
    const ojson& f = t["function"];
    PLUMB_CHECK(f.contains("name") && f["name"].is_string() && !f["name"].get<std::string>().empty(),
                "tools[{}].function needs a name", i);
    if (i) schemas += '\n';
    schemas += python_json(f);
  }
  return std::string(kToolsHead) + schemas + std::string(kToolsTail);
}

std::string call_opening(std::string_view name) {
  return fmt::format("\n\n{}\n{}{}\">\n", kCallsOpen, kInvokeOpen, name);
}

std::string render_calls(const std::vector<ToolCall>& calls, const std::string& what) {
  if (calls.empty()) return {};
  std::string out;
  for (size_t i = 0; i < calls.size(); ++i) {
    const ToolCall& c = calls[i];
    PLUMB_CHECK(!c.name.empty(), "{}: tool_calls[{}] has no function name", what, i);
    ojson args;
    const std::string name = fmt::format("{}: tool_calls[{}].arguments", what, i);
    try {
      args = parse_checked(c.arguments, name);
    } catch (const ojson::parse_error&) {
      args = ojson{{"arguments", c.arguments}};  // (the official encoder's fallback for text that is not JSON)
    } catch (const ojson::exception& e) {
      fail("{}: {}", name, e.what());
    }
    PLUMB_CHECK(args.is_object(), "{} must be a JSON object, got {}", name, args.type_name());
    if (i) out += fmt::format("\n{}{}\">\n", kInvokeOpen, c.name);
    else out = call_opening(c.name);  // (the block's opening and the first call's)
    bool first = true;
    for (const auto& [k, v] : args.items()) {
      if (!first) out += '\n';
      first = false;
      out += fmt::format("{}{}\" string=\"{}\">{}{}", kParamOpen, k, v.is_string() ? "true" : "false",
                         v.is_string() ? v.get<std::string>() : python_json(v), kParamClose);
    }
    out += '\n';
    out += kInvokeClose;
  }
  out += '\n';
  out += kCallsClose;
  return out;
}

std::optional<std::vector<ToolCall>> parse_calls(std::string_view s) {
  size_t at = 0;
  if (!skip(s, at, kCallsOpen) || !skip(s, at, "\n")) return std::nullopt;
  std::vector<ToolCall> calls;
  for (;;) {
    if (skip(s, at, kCallsClose)) return at == s.size() ? std::optional(calls) : std::nullopt;
    if (!calls.empty() && !skip(s, at, "\n")) return std::nullopt;
    if (skip(s, at, kCallsClose)) return at == s.size() ? std::optional(calls) : std::nullopt;
    const auto name = between(s, at, kInvokeOpen, "\">\n");
    if (!name || name->empty()) return std::nullopt;
    ToolCall c;
    c.name = std::string(*name);
    std::string args = "{";
    std::vector<std::string> seen;
    while (s.substr(at, kParamOpen.size()) == kParamOpen) {
      const auto key = between(s, at, kParamOpen, "\" string=\"");
      if (!key) return std::nullopt;
      const bool is_string = skip(s, at, "true\">");
      if (!is_string && !skip(s, at, "false\">")) return std::nullopt;
      const size_t end = s.find(kParamClose, at);
      if (end == std::string_view::npos) return std::nullopt;
      const std::string value(s.substr(at, end - at));
      at = end + kParamClose.size();
      if (std::find(seen.begin(), seen.end(), *key) != seen.end()) return std::nullopt;  // (a name twice)
      seen.emplace_back(*key);
      std::string v = value;
      if (is_string || !ojson::accept(value)) v = scalar(ojson(value));  // (a value that is not JSON: as a string)
      args += (seen.size() > 1 ? ", " : "") + scalar(ojson(std::string(*key))) + ": " + v;
      if (!skip(s, at, "\n")) return std::nullopt;
    }
    if (seen.empty()) skip(s, at, "\n");  // (no parameters: the encoder's empty line)
    if (!skip(s, at, kInvokeClose)) return std::nullopt;
    c.arguments = args + "}";
    calls.push_back(std::move(c));
  }
}

}  // namespace plumb::dsml
