// Fuzz harness for JSON mode (src/generate/json_mode.h), chosen by the first byte:
// - the recognizer on any bytes: a text it takes whole and calls complete must be a JSON object to nlohmann-json
//   (but for the two texts RFC 8259's grammar allows and nlohmann does not read: a lone surrogate escape, a number
//   beyond a double); when nlohmann reads an object from a text with no whitespace outside its strings (where the
//   recognizer's whitespace bounds do not apply) and numbers within the bound, the recognizer takes it and calls it
//   complete; the state after any accepted prefix still lets some byte through (no dead end);
// - the mask on the bundled model's tokenizer, driven by token ids from the input: apply() keeps exactly the tokens
//   allows() keeps, some token always passes, and the decoded text of the accepted tokens is taken by a fresh
//   recognizer (complete exactly when the mask says so);
// - a schema of tests/data/json_schema/cases.json (chosen by a byte) and the rest as bytes for its recognizer: what
//   it takes is taken by JSON mode's recognizer too (the schema only narrows the syntax), and no accepted prefix is a
//   dead end;
// - two of those schemas as the parameters of two tools (f, g) and the rest as bytes for the DSML tool-call block's
//   recognizer (tool_call_mask.h; refused bytes skipped, after an optional opening): the state it ends in is no dead
//   end, and a complete block is read back by dsml::parse_calls, each call's arguments taken by its tool's schema.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "generate/json_mode.h"
#include "generate/json_schema.h"
#include "generate/tool_call_mask.h"
#include "plumb/text.h"
#include "text/dsml.h"

namespace {

using plumb::gen::JsonRecognizer;

// Whitespace outside strings, a number longer than the recognizer's bound (64 bytes), or nesting deeper than 64.
bool outside_the_bounds(std::string_view s) {
  bool in_string = false, escaped = false;
  size_t number = 0;
  int depth = 0;
  for (char c : s) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') return true;
    const bool num = (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
    number = num ? number + 1 : 0;
    if (number > 64) return true;
    if (c == '"') in_string = true;
    depth += c == '{' || c == '[' ? 1 : c == '}' || c == ']' ? -1 : 0;
    if (depth > 64) return true;
  }
  return false;
}

void recognizer(plumb_fuzz::Reader& in) {
  const std::string_view s = in.rest();
  JsonRecognizer r;
  size_t taken = 0;
  while (taken < s.size()) {
    JsonRecognizer before = r;
    if (!r.feed(uint8_t(s[taken]))) {
      r = before;
      break;
    }
    ++taken;
  }
  if (!r.complete()) {  // no dead end: some byte continues it
    bool some = false;
    for (int b = 0; b < 256 && !some; ++b) {
      JsonRecognizer t = r;
      some = t.feed(uint8_t(b));
    }
    PLUMB_FUZZ_CHECK(some);
  }
  const bool whole = taken == s.size() && r.complete();
  bool object = false;
  try {
    object = nlohmann::json::parse(s).is_object();
  } catch (const nlohmann::json::parse_error& e) {
    if (std::string(e.what()).find("surrogate") != std::string::npos) return;
  } catch (const nlohmann::json::out_of_range&) {
    return;
  }
  if (whole) PLUMB_FUZZ_CHECK(object);
  if (object && !outside_the_bounds(s)) PLUMB_FUZZ_CHECK(whole);
}

void mask(plumb_fuzz::Reader& in) {
  static const plumb::Tokenizer tok = plumb::Tokenizer::load(PLUMB_SOURCE_DIR "/models/tiny");
  const int32_t vocab = 1216, eos = 1;
  plumb::gen::JsonMask m(tok, vocab, {eos});
  std::vector<int32_t> ids;
  while (!in.empty() && !m.complete()) {
    std::vector<float> l(size_t(vocab), 0.0f);
    m.apply(l);  // (throws if no token passes: an uncaught exception is a finding)
    std::vector<int32_t> ok;
    for (int32_t id = 0; id < vocab; ++id) {
      PLUMB_FUZZ_CHECK(std::isfinite(l[size_t(id)]) == m.allows(id));
      if (m.allows(id)) ok.push_back(id);
    }
    PLUMB_FUZZ_CHECK(!ok.empty());
    const size_t pick = (size_t(in.byte()) << 8 | in.byte()) % ok.size();
    m.accept(ok[pick]);
    ids.push_back(ok[pick]);
  }
  JsonRecognizer r;
  PLUMB_FUZZ_CHECK(r.feed(tok.decode(ids)));
  PLUMB_FUZZ_CHECK(r.complete() == m.complete());
}

const nlohmann::json& case_schemas() {
  static const nlohmann::json data = [] {
    std::ifstream f(PLUMB_SOURCE_DIR "/tests/data/json_schema/cases.json");
    return nlohmann::json::parse(f)["schemas"];
  }();
  return data;
}

void schema(plumb_fuzz::Reader& in) {
  static const std::vector<std::shared_ptr<const plumb::gen::JsonSchema>> schemas = [] {
    std::vector<std::shared_ptr<const plumb::gen::JsonSchema>> out;
    for (const auto& s : case_schemas()) out.push_back(plumb::gen::JsonSchema::compile(s.dump()));
    return out;
  }();
  plumb::gen::SchemaRecognizer r(schemas[in.byte() % schemas.size()]);
  JsonRecognizer syntax;
  const std::string_view s = in.rest();
  for (char c : s) {
    plumb::gen::SchemaRecognizer next = r;
    if (!next.feed(uint8_t(c))) break;
    PLUMB_FUZZ_CHECK(syntax.feed(uint8_t(c)));
    r = next;
  }
  PLUMB_FUZZ_CHECK(r.complete() == syntax.complete());
  if (!r.complete()) {
    bool some = false;
    for (int b = 0; b < 256 && !some; ++b) {
      plumb::gen::SchemaRecognizer t = r;
      some = t.feed(uint8_t(b));
    }
    PLUMB_FUZZ_CHECK(some);
  }
}

void tool_calls(plumb_fuzz::Reader& in) {
  const nlohmann::json& schemas = case_schemas();
  const size_t a = in.byte() % schemas.size(), b = in.byte() % schemas.size();
  const bool parallel = in.byte() & 1;
  const nlohmann::json tools = {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", schemas[a]}}}},
                                {{"type", "function"}, {"function", {{"name", "g"}, {"parameters", schemas[b]}}}}};
  const auto spec = plumb::gen::ToolCallSpec::build(tools.dump(), {}, parallel);
  plumb::gen::ToolCallRecognizer r(spec);
  std::string text;
  auto feed = [&](std::string_view bytes) {
    for (char c : bytes) {
      plumb::gen::ToolCallRecognizer next = r;
      if (next.feed(uint8_t(c))) r = std::move(next), text += c;
    }
  };
  // (an opening, so that short inputs reach the parameters)
  const int start = in.byte() % 3;
  if (start >= 1) feed("\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"");
  if (start == 2) feed("f\">\n");
  feed(in.rest());
  if (!r.complete()) {
    bool some = false;
    for (int c = 0; c < 256 && !some; ++c) {
      plumb::gen::ToolCallRecognizer t = r;
      some = t.feed(uint8_t(c));
    }
    PLUMB_FUZZ_CHECK(some);
    return;
  }
  const auto calls = plumb::dsml::parse_calls(std::string_view(text).substr(2));
  PLUMB_FUZZ_CHECK(calls.has_value() && !calls->empty() && (parallel || calls->size() == 1));
  // (a JSON value nlohmann could not read, which parse_calls would keep as a string, the recognizer refuses: every
  // argument read back is what the recognizer read)
  for (const auto& c : *calls) {
    plumb::gen::SchemaRecognizer s(spec->tools.at(c.name == "f" ? 0 : 1).params);
    PLUMB_FUZZ_CHECK(s.feed(nlohmann::ordered_json::parse(c.arguments).dump()) && s.complete());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  plumb_fuzz::Reader in(data, size);
  switch (in.byte() % 4) {
    case 0: recognizer(in); break;
    case 1: mask(in); break;
    case 2: schema(in); break;
    default: tool_calls(in);
  }
  return 0;
}
