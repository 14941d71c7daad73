// Fuzz harness for JSON mode (src/generate/json_mode.h), chosen by the first byte:
// - the recognizer on any bytes: a text it takes whole and calls complete must be a JSON object to nlohmann-json
//   (but for the two texts RFC 8259's grammar allows and nlohmann does not read: a lone surrogate escape, a number
//   beyond a double); when nlohmann reads an object from a text with no whitespace outside its strings (where the
//   recognizer's whitespace bounds do not apply) and numbers within the bound, the recognizer takes it and calls it
//   complete; the state after any accepted prefix still lets some byte through (no dead end);
// - the mask on the bundled model's tokenizer, driven by token ids from the input: apply() keeps exactly the tokens
//   allows() keeps, some token always passes, and the decoded text of the accepted tokens is taken by a fresh
//   recognizer (complete exactly when the mask says so).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "generate/json_mode.h"
#include "plumb/text.h"

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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  plumb_fuzz::Reader in(data, size);
  if (in.byte() % 2) mask(in);
  else recognizer(in);
  return 0;
}
