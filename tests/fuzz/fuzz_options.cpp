// Fuzz harness for the option parsers the toolkit and every command take, chosen by the first byte:
// - glob_match (`--taps`): against a plain dynamic-programming matcher ('*' any run, '?' one character);
// - IntRanges::parse (`--layers`, `--positions`): plumb::Error or ranges of non-negative a <= b, and contains()
//   agreeing with them; TapFilter::check_matches refusing exactly the --layers with a range that reaches no tap;
//   accepted exactly when a rule written here says so, with the rule's ranges (over a small alphabet, and any bytes);
// - parse_config (`--patches`, the toolkit's `[cpu:|cuda:]PATCHES`): plumb::Error or a patch set whose names parse
//   back to the same set (presets expanded).
// Other exceptions, crashes and sanitizer reports are bugs.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "fuzz_util.h"
#include "patches/registry.h"
#include "toolkit/tap_filter.h"

namespace {

bool glob_reference(const std::string& p, const std::string& t) {
  // m[i][j]: p[0..i) matches t[0..j).
  std::vector<std::vector<char>> m(p.size() + 1, std::vector<char>(t.size() + 1, 0));
  m[0][0] = 1;
  for (size_t i = 1; i <= p.size(); ++i)
    for (size_t j = 0; j <= t.size(); ++j) {
      if (p[i - 1] == '*') m[i][j] = m[i - 1][j] || (j > 0 && m[i][j - 1]);
      else m[i][j] = j > 0 && m[i - 1][j - 1] && (p[i - 1] == '?' || p[i - 1] == t[j - 1]);
    }
  return m[p.size()][t.size()];
}

void globs(plumb_fuzz::Reader& in) {
  const size_t np = in.byte() % 16;
  std::string p(in.bytes(np)), t(in.rest());
  if (t.size() > 64) t.resize(64);
  PLUMB_FUZZ_CHECK(plumb::toolkit::glob_match(p, t) == glob_reference(p, t));
}

// The --layers / --positions rule, written apart from IntRanges::parse: items between commas, blanks (spaces, tabs)
// around them dropped, empty items skipped; an item is N or A-B (at its first '-'), each an unsigned decimal below
// 2^63, A <= B. nullopt where the text must be refused.
std::optional<std::vector<std::pair<int64_t, int64_t>>> ranges_by_rule(const std::string& text) {
  auto number = [](const std::string& s) -> std::optional<int64_t> {
    constexpr uint64_t kPast = uint64_t(INT64_MAX) + 1;  // saturated there: leading zeros may make it long
    if (s.empty()) return std::nullopt;
    uint64_t v = 0;
    for (char c : s) {
      if (c < '0' || c > '9') return std::nullopt;
      v = v >= kPast / 10 + 1 ? kPast : std::min(kPast, v * 10 + uint64_t(c - '0'));
    }
    if (v == kPast) return std::nullopt;
    return int64_t(v);
  };
  std::vector<std::pair<int64_t, int64_t>> out;
  std::string item;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && text[i] != ',') {
      item += text[i];
      continue;
    }
    while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.pop_back();
    size_t b = 0;
    while (b < item.size() && (item[b] == ' ' || item[b] == '\t')) ++b;
    item = item.substr(b);
    if (!item.empty()) {
      const size_t dash = item.find('-');
      const auto a = number(item.substr(0, dash));
      const auto z = dash == std::string::npos ? a : number(item.substr(dash + 1));
      if (!a || !z || *a > *z) return std::nullopt;
      out.emplace_back(*a, *z);
    }
    item.clear();
  }
  return out;
}

void ranges(plumb_fuzz::Reader& in) {
  const bool small = in.byte() & 1;
  std::string text(in.rest());
  if (small) {  // an alphabet where the rule's cases are common
    static constexpr char kAlphabet[] = "0179-, \t+x";
    for (auto& c : text) c = kAlphabet[uint8_t(c) % (sizeof(kAlphabet) - 1)];
  }
  const auto want = ranges_by_rule(text);
  plumb::toolkit::IntRanges r;
  try {
    r = plumb::toolkit::IntRanges::parse(text, "--layers");
  } catch (const plumb::Error&) {
    PLUMB_FUZZ_CHECK(!want);
    return;
  }
  PLUMB_FUZZ_CHECK(want && r.ranges == *want);
  for (const auto& [a, b] : r.ranges) {
    PLUMB_FUZZ_CHECK(a >= 0 && a <= b);
    PLUMB_FUZZ_CHECK(r.contains(a) && r.contains(b));
  }
  // TapFilter::check_matches as --layers: it refuses exactly the filters with a range holding none of the run's
  // layers (here 0, 2 and 7).
  plumb::toolkit::TapFilter f;
  f.layers = r;
  bool every_range_hits = true;
  for (const auto& [a, b] : r.ranges) every_range_hits = every_range_hits && ((a <= 0 && 0 <= b) || (a <= 2 && 2 <= b) || (a <= 7 && 7 <= b));
  bool accepted = true;
  try {
    f.check_matches({"L0.attn.out", "L2.ffn.routed", "L7.out", "hc_head.out", "logits"});
  } catch (const plumb::Error&) {
    accepted = false;
  }
  PLUMB_FUZZ_CHECK(accepted == every_range_hits);
}

void patches(plumb_fuzz::Reader& in) {
  const std::string text(in.rest());
  try {
    const plumb::RunConfig c = plumb::parse_config(text);
    PLUMB_FUZZ_CHECK(c.backend == "cpu" || c.backend == "cuda");
    const plumb::PatchSet again = plumb::parse_patches(c.patches.names());
    PLUMB_FUZZ_CHECK(again.names() == c.patches.names() && again.options == c.patches.options);
  } catch (const plumb::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  plumb_fuzz::Reader in(data, size);
  switch (in.byte() % 3) {
    case 0: globs(in); break;
    case 1: ranges(in); break;
    default: patches(in); break;
  }
  return 0;
}
