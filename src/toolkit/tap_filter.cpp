// Tap filter parsing and matching (globs over tap names, integer ranges for layers and positions).
#include "toolkit/tap_filter.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <fmt/format.h>

#include "core/error.h"
#include "core/strings.h"
#include "toolkit/tap_names.h"

namespace plumb::toolkit {

namespace {

int64_t parse_int(const std::string& s, const std::string& option, const std::string& whole) {
  uint64_t v = 0;  // unsigned, so that from_chars takes no sign ("0--0" was the range 0-0)
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  PLUMB_CHECK(ec == std::errc() && p == s.data() + s.size() && v <= uint64_t(INT64_MAX) && !s.empty(),
              "{} '{}': '{}' is not a non-negative integer (expected e.g. 0-3,7)", option, whole, s);
  return int64_t(v);
}

}  // namespace

bool IntRanges::contains(int64_t v) const {
  for (const auto& [a, b] : ranges)
    if (v >= a && v <= b) return true;
  return false;
}

IntRanges IntRanges::parse(const std::string& text, const std::string& option) {
  IntRanges r;
  for (const auto& item : split_list(text)) {
    const auto dash = item.find('-');
    if (dash == std::string::npos) {
      const int64_t v = parse_int(item, option, text);
      r.ranges.emplace_back(v, v);
    } else {
      // (A sign is no range: "-1" names its item, not the empty text before the dash.)
      PLUMB_CHECK(dash > 0 && dash + 1 < item.size(), "{} '{}': '{}' is not a non-negative integer or a range a-b (expected "
                  "e.g. 0-3,7)", option, text, item);
      const int64_t a = parse_int(item.substr(0, dash), option, text), b = parse_int(item.substr(dash + 1), option, text);
      PLUMB_CHECK(a <= b, "{} '{}': range {}-{} is empty", option, text, a, b);
      r.ranges.emplace_back(a, b);
    }
  }
  return r;
}

bool glob_match(const std::string& p, const std::string& t) {
  // Iterative matcher with one backtrack point for the last '*': linear for the patterns we see.
  size_t i = 0, j = 0, star = std::string::npos, mark = 0;
  // ('*' is tested first: a '*' in the text is an ordinary character, matched by the pattern's '*' as a wildcard;
  // tests/fuzz/fuzz_options found the pattern's '*' consumed as a literal there.)
  while (j < t.size()) {
    if (i < p.size() && p[i] == '*') {
      star = i++, mark = j;
    } else if (i < p.size() && (p[i] == '?' || p[i] == t[j])) {
      ++i, ++j;
    } else if (star != std::string::npos) {
      i = star + 1, j = ++mark;
    } else {
      return false;
    }
  }
  while (i < p.size() && p[i] == '*') ++i;
  return i == p.size();
}

TapFilter TapFilter::parse(const std::string& taps, const std::string& layers, const std::string& steps,
                           const std::string& positions) {
  TapFilter f;
  f.globs = split_list(taps);
  f.layers = IntRanges::parse(layers, "--layers");
  f.steps = split_list(steps);
  f.positions = IntRanges::parse(positions, "--positions");
  return f;
}

bool TapFilter::keeps_tap(const std::string& name) const {
  if (name == "logits") return true;
  const TapName t = parse_tap(name);
  if (t.layer >= 0 && !layers.empty() && !layers.contains(t.layer)) return false;
  if (globs.empty()) return true;
  for (const auto& g : globs)
    if (glob_match(g, name)) return true;
  return false;
}

bool TapFilter::keeps_step(const std::string& name, size_t index) const {
  if (steps.empty()) return true;
  for (const auto& s : steps)
    if (step_item_names(s, name, index)) return true;
  return false;
}

bool TapFilter::step_item_names(const std::string& item, const std::string& name, size_t index) {
  return item == name || item == std::to_string(index);
}

void TapFilter::check_matches(const std::vector<std::string>& names) const {
  for (const auto& [a, b] : layers.ranges) {
    bool hit = false;
    for (const auto& n : names) {
      const int l = parse_tap(n).layer;
      hit = hit || (l >= a && l <= b);
    }
    PLUMB_CHECK(hit, "--layers: no tap of layer{} {} in this run", a == b ? "" : "s", a == b ? fmt::format("{}", a)
                : fmt::format("{}-{}", a, b));
  }
  for (const auto& g : globs) {
    bool hit = false;
    for (const auto& n : names) {
      const int l = parse_tap(n).layer;  // model-level taps (-1) are not restricted by --layers
      hit = hit || ((layers.empty() || l < 0 || layers.contains(l)) && glob_match(g, n));
    }
    PLUMB_CHECK(hit, "--taps: '{}' matches no tap of this run{} (`plumb trace` without --taps records every tap, "
                "and its .json index lists them)", g, layers.empty() ? "" : " in the layers --layers keeps");
  }
}

IntRanges IntRanges::of(std::vector<int64_t> values) {
  std::sort(values.begin(), values.end());
  IntRanges r;
  for (int64_t v : values) {
    if (!r.ranges.empty() && v <= r.ranges.back().second + 1) r.ranges.back().second = std::max(r.ranges.back().second, v);
    else r.ranges.emplace_back(v, v);
  }
  return r;
}

std::string IntRanges::describe() const {
  std::string s;
  for (const auto& [a, b] : ranges) append_item(s, a == b ? fmt::format("{}", a) : fmt::format("{}-{}", a, b));
  return s.empty() ? std::string("all") : s;
}

std::string TapFilter::describe() const {
  std::string g, st;
  for (const auto& x : globs) g += (g.empty() ? "" : ",") + x;
  for (const auto& x : steps) st += (st.empty() ? "" : ",") + x;
  return fmt::format("taps {}, layers {}, steps {}, positions {}", g.empty() ? "all" : g, layers.describe(),
                     st.empty() ? "all" : st, positions.describe());
}

}  // namespace plumb::toolkit
