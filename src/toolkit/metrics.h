// Tensor comparison metrics (all sums in fp64): max abs error with its coordinate and both values, relative L2
// error, cosine similarity, bf16 ULP distance, NaN/Inf counts, best scale fit; set agreement for index taps.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace plumb::toolkit {

struct FloatStats {
  int64_t numel = 0;
  int64_t finite_pairs = 0;       // elements finite on both sides: what max|err|, rel L2 and cosine are over
  double max_abs = 0;             // max |a - b| over positions finite on both sides
  int64_t at = -1;                // flat index of max_abs inside the tensor it came from
  Shape at_shape;                 // that tensor's shape (for the coordinate)
  int at_step = -1;               // set by the caller when merging steps
  int64_t at_pos = -1;            // the token position of that row, where the caller knows it (diff: A's positions)
  double a_at = 0, b_at = 0;      // both values there
  double ref_max = 0;             // max |a| over finite a
  double saa = 0, sbb = 0, sab = 0, sdd = 0;
  int64_t nan_a = 0, nan_b = 0, inf_a = 0, inf_b = 0;
  int64_t nonfinite_mismatch = 0;  // positions where exactly one side is NaN/Inf, or both are but differ
  int64_t max_ulp = 0;             // max distance in bf16 ULPs (both values rounded to bf16, RNE)

  double rel_l2() const;      // ||a - b|| / ||a||; 0 when both are zero, inf when only a is
  double cosine() const;      // <a, b> / (||a|| ||b||); 1 when both are zero
  double err_scaled() const;  // max_abs / max(1, max|a|): the registry's tolerance metric
  std::string coord() const;  // "[t, h, d]" of the max, "-" when none
  void merge(const FloatStats& o);
};

// a is the reference side (A), b the candidate (B); shapes must match.
FloatStats compare_f32(const Tensor& a, const Tensor& b);

// Distance between bf16(a) and bf16(b) counted in bf16 steps (+0 and -0 are the same point).
int64_t bf16_ulp_distance(float a, float b);

// Least-squares scale: b ~= c * a with c = <a, b> / <a, a>; resid = ||b - c a|| / ||b|| (0: a pure scale).
struct ScaleFit {
  double c = 1, resid = 0;
  bool valid = false;  // false when a is all zero or nothing finite
};
ScaleFit fit_scale(const Tensor& a, const Tensor& b);
// c within `rel` (relative) of `target`.
inline bool near(double c, double target, double rel = 0.02) { return target != 0 && std::abs(c / target - 1) <= rel; }

// Per-row set agreement of two index tensors [rows, k] (negative entries = none). A row whose sets differ is a
// near tie when the selection scores of the swapped entries moved by at most tol * max(1, max|row of sa|) and by
// more than zero (rounding moved a score across the boundary), or when they are exactly equal on both sides (an
// exact tie, which two implementations may break in different orders: `exact_ties` counts those rows); otherwise it
// is a real change (scores moved beyond tolerance, unequal unchanged scores selected differently, or a table lookup
// such as hash routing).
struct IndexStats {
  int64_t rows = 0, agree = 0, ties = 0, real = 0;
  int64_t exact_ties = 0;      // near-tie rows whose swapped entries' scores are exactly equal (and unmoved)
  int64_t unscored = 0;        // differing rows without scores to classify (counted as real)
  double max_tie_move = 0;     // largest score move among near-tie rows
  std::string first_bad;       // "position 3: A {1,4} B {1,5}" ("row 3" where the rows' positions are not known)
  int first_bad_step = -1;
  void merge(const IndexStats& o);
  bool diverges() const { return agree != rows; }
};
// `positions` (may be null): the token position of each row, named in first_bad.
IndexStats compare_index(const IndexTensor& a, const IndexTensor& b, const Tensor* scores_a, const Tensor* scores_b,
                         bool table_lookup, double tol, const std::vector<int64_t>* positions = nullptr);

// Relative L2 distance ||x - y|| / ||y|| of two equally shaped tensors (0 when both are zero).
double rel_l2(const Tensor& x, const Tensor& y);

// An error or metric for the reports: "0", "nan", "inf", "-inf" or 3 significant digits in e notation.
std::string err_text(double v);

}  // namespace plumb::toolkit
