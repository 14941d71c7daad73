// Fuzz harness for three small text pieces, chosen by the first byte:
// - StopMatcher: up to 3 stop strings (over a 3-letter alphabet, so that they match) and the text in pieces. The
//   output must be the text cut where the first push that completes a stop string finds its earliest start, or
//   the whole text when none completes; no stop string may ever be emitted (the held-back rule).
// - the escaped line form: unescape_line(escape_line(x)) == x for any bytes, escape_line's output is one line
//   (no \n or \r), and unescape_line of any bytes returns or throws plumb::Error.
// - parse_token_ids: text over an alphabet of digits, signs, letters, spaces and commas must parse exactly when a
//   rule written here independently says so (split at commas, each piece must hold an id when there is a comma;
//   every whitespace-separated word a decimal below 2^31), to the ids the rule reads; any bytes return or throw
//   plumb::Error.
#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz_util.h"
#include "plumb/text.h"
#include "text/escape.h"

namespace {

void stop_strings(plumb_fuzz::Reader& in) {
  std::vector<std::string> stops(size_t(1 + in.byte() % 3));
  for (auto& s : stops) {
    const size_t len = 1 + in.byte() % 4;
    for (size_t i = 0; i < len; ++i) s += char('a' + in.byte() % 3);
  }
  std::vector<std::string> pieces;
  while (!in.empty()) {
    const size_t len = in.byte() % 5;
    std::string p;
    for (size_t i = 0; i < len && !in.empty(); ++i) p += char('a' + in.byte() % 4);  // 'd' never in a stop
    pieces.push_back(p);
  }
  plumb::StopMatcher m(stops);
  std::string out, so_far, expect;
  bool stopped = false, expect_stop = false;
  for (const auto& p : pieces) {
    out += m.push(p, stopped);
    so_far += p;
    size_t first = std::string::npos;
    for (const auto& s : stops) first = std::min(first, so_far.find(s));
    if (first != std::string::npos) {
      expect = so_far.substr(0, first), expect_stop = true;
      break;
    }
    PLUMB_FUZZ_CHECK(!stopped);
    for (const auto& s : stops) PLUMB_FUZZ_CHECK(out.find(s) == std::string::npos);
  }
  PLUMB_FUZZ_CHECK(stopped == expect_stop);
  if (!stopped) out += m.flush(), expect = so_far;
  PLUMB_FUZZ_CHECK(out == expect);
}

void escapes(plumb_fuzz::Reader& in) {
  const std::string_view bytes = in.rest();
  const std::string line = plumb::text::escape_line(bytes);
  PLUMB_FUZZ_CHECK(line.find('\n') == std::string::npos && line.find('\r') == std::string::npos);
  PLUMB_FUZZ_CHECK(plumb::text::unescape_line(line) == bytes);
  try {
    (void)plumb::text::unescape_line(bytes);
  } catch (const plumb::Error&) {
  }
}

// The rule of parse_token_ids, written apart from it: nullopt where the text must be refused.
std::optional<std::vector<int32_t>> ids_by_rule(const std::string& text) {
  auto space = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
  std::vector<std::string> pieces{""};  // the text split at every comma, empty pieces kept
  for (char c : text) {
    if (c == ',') pieces.emplace_back();
    else pieces.back().push_back(c);
  }
  std::vector<int32_t> ids;
  for (const auto& piece : pieces) {
    size_t words = 0;
    for (size_t i = 0; i < piece.size();) {
      if (space(piece[i])) {
        ++i;
        continue;
      }
      size_t j = i;
      int64_t v = 0;
      bool digits = true;
      for (; j < piece.size() && !space(piece[j]); ++j) {
        digits = digits && piece[j] >= '0' && piece[j] <= '9';
        if (digits) v = std::min<int64_t>(int64_t(INT32_MAX) + 1, v * 10 + (piece[j] - '0'));
      }
      if (!digits || v > INT32_MAX) return std::nullopt;
      ids.push_back(int32_t(v)), ++words, i = j;
    }
    if (pieces.size() > 1 && words == 0) return std::nullopt;  // a comma with no id on one side
  }
  return ids;
}

void token_ids(plumb_fuzz::Reader& in) {
  if (in.byte() & 1) {  // any bytes
    try {
      (void)plumb::parse_token_ids(in.rest(), "fuzz");
    } catch (const plumb::Error&) {
    }
    return;
  }
  static constexpr char kAlphabet[] = "0129 ,\t\n-x+";
  std::string text;
  while (!in.empty()) text += kAlphabet[in.byte() % (sizeof(kAlphabet) - 1)];
  const auto want = ids_by_rule(text);
  try {
    const auto got = plumb::parse_token_ids(text, "fuzz");
    PLUMB_FUZZ_CHECK(want && got == *want);
  } catch (const plumb::Error&) {
    PLUMB_FUZZ_CHECK(!want);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  plumb_fuzz::Reader in(data, size);
  switch (in.byte() % 3) {
    case 0: stop_strings(in); break;
    case 1: escapes(in); break;
    default: token_ids(in);
  }
  return 0;
}
