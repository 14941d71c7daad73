// Tap filter: which taps, layers, steps and token positions a trace keeps (`--taps`, `--layers`, `--steps`,
// `--positions`). An empty filter keeps everything.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace plumb::toolkit {

// A set of integers written as "0-3,7,9-10" (inclusive ranges); empty = all.
struct IntRanges {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  bool empty() const { return ranges.empty(); }
  bool contains(int64_t v) const;
  std::string describe() const;  // "0-3,7" as parsed; "all" when empty
  static IntRanges of(std::vector<int64_t> values);  // the runs of these values ({0,1,2,7} -> 0-2,7)
  // Throws Error naming `option` for anything but non-negative integers and ranges a-b with a <= b.
  static IntRanges parse(const std::string& text, const std::string& option);
};

// '*' matches any run of characters (dots included), '?' one character.
bool glob_match(const std::string& pattern, const std::string& text);

struct TapFilter {
  std::vector<std::string> globs;  // --taps: comma-separated globs; empty = every tap
  IntRanges layers;                // --layers: restricts L<i>.* taps; model-level taps are not affected
  std::vector<std::string> steps;  // --steps: step names ("s0") or indices ("0"); empty = every step
  IntRanges positions;             // --positions: absolute token positions whose rows are kept

  static TapFilter parse(const std::string& taps, const std::string& layers, const std::string& steps,
                         const std::string& positions);
  bool keeps_tap(const std::string& name) const;  // "logits" is always kept
  bool keeps_step(const std::string& name, size_t index) const;
  // One --steps item names a step by its name ("s0") or its index ("0").
  static bool step_item_names(const std::string& item, const std::string& name, size_t index);
  bool keeps_position(int64_t pos) const { return positions.empty() || positions.contains(pos); }
  std::string describe() const;
  // Throws Error when the filter names what `names` (a run's taps) do not have: a --taps glob that matches none of
  // the names --layers keeps, or a --layers range with no tap in it. A filter that keeps nothing of what it names
  // is a typo far more often than a wish.
  void check_matches(const std::vector<std::string>& names) const;
};

}  // namespace plumb::toolkit
