// Fuzz harness for two small text pieces, chosen by the first byte:
// - StopMatcher: up to 3 stop strings (over a 3-letter alphabet, so that they match) and the text in pieces. The
//   output must be the text cut where the first push that completes a stop string finds its earliest start, or
//   the whole text when none completes; no stop string may ever be emitted (the held-back rule).
// - the escaped line form: unescape_line(escape_line(x)) == x for any bytes, escape_line's output is one line
//   (no \n or \r), and unescape_line of any bytes returns or throws plumb::Error.
#include <algorithm>
#include <cstddef>
#include <cstdint>
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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  plumb_fuzz::Reader in(data, size);
  if (in.byte() & 1) escapes(in);
  else stop_strings(in);
  return 0;
}
