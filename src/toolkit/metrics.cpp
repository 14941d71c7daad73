// Comparison metrics; every accumulation is in fp64 on the fp32 values.
#include "toolkit/metrics.h"

#include <algorithm>

#include <cmath>
#include <limits>
#include <set>

#include <fmt/format.h>

#include "core/strings.h"
#include "formats/numeric.h"

namespace plumb::toolkit {

double FloatStats::rel_l2() const {
  if (saa == 0) return sdd == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(sdd / saa);
}

double FloatStats::cosine() const {
  if (saa == 0 && sbb == 0) return 1.0;
  if (saa == 0 || sbb == 0) return 0.0;
  return sab / std::sqrt(saa * sbb);
}

double FloatStats::err_scaled() const { return max_abs / std::max(1.0, ref_max); }

std::string FloatStats::coord() const {
  if (at < 0) return "-";
  std::vector<int64_t> c(at_shape.size());
  int64_t flat = at;
  for (size_t i = at_shape.size(); i-- > 0;) c[i] = flat % at_shape[i], flat /= at_shape[i];
  return shape_str(c);
}

void FloatStats::merge(const FloatStats& o) {
  if (o.at >= 0 && (at < 0 || o.max_abs > max_abs)) {
    max_abs = o.max_abs, at = o.at, at_shape = o.at_shape, at_step = o.at_step, at_pos = o.at_pos, a_at = o.a_at;
    b_at = o.b_at;
  }
  numel += o.numel, finite_pairs += o.finite_pairs;
  ref_max = std::max(ref_max, o.ref_max);
  saa += o.saa, sbb += o.sbb, sab += o.sab, sdd += o.sdd;
  nan_a += o.nan_a, nan_b += o.nan_b, inf_a += o.inf_a, inf_b += o.inf_b;
  nonfinite_mismatch += o.nonfinite_mismatch;
  max_ulp = std::max(max_ulp, o.max_ulp);
}

int64_t bf16_ulp_distance(float a, float b) {
  // bf16 bit patterns as a monotone integer line: sign-magnitude folded around zero.
  auto line = [](float x) {
    const uint16_t u = fmt8::f32_to_bf16(x);
    return (u & 0x8000) ? -int64_t(u & 0x7fff) : int64_t(u & 0x7fff);
  };
  return std::llabs(line(a) - line(b));
}

FloatStats compare_f32(const Tensor& a, const Tensor& b) {
  FloatStats s;
  s.numel = a.numel();
  s.at_shape = a.shape;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const float x = a[i], y = b[i];
    const bool fx = std::isfinite(x), fy = std::isfinite(y);
    s.nan_a += std::isnan(x), s.nan_b += std::isnan(y);
    s.inf_a += std::isinf(x), s.inf_b += std::isinf(y);
    if (!fx || !fy) {
      // Equal infinities (same sign) and NaN against NaN are agreements; anything else is a mismatch.
      const bool same = (std::isnan(x) && std::isnan(y)) || (std::isinf(x) && x == y);
      if (!same) ++s.nonfinite_mismatch;
      continue;
    }
    ++s.finite_pairs;
    const double dx = x, dy = y, d = dx - dy;
    s.ref_max = std::max(s.ref_max, std::fabs(dx));
    s.saa += dx * dx, s.sbb += dy * dy, s.sab += dx * dy, s.sdd += d * d;
    if (std::fabs(d) > s.max_abs) s.max_abs = std::fabs(d), s.at = i, s.a_at = dx, s.b_at = dy;
    s.max_ulp = std::max(s.max_ulp, bf16_ulp_distance(x, y));
  }
  if (s.max_abs == 0) s.at = -1;  // no error: no coordinate to show
  return s;
}

ScaleFit fit_scale(const Tensor& a, const Tensor& b) {
  ScaleFit f;
  double saa = 0, sab = 0, sbb = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) continue;
    saa += double(a[i]) * a[i], sab += double(a[i]) * b[i], sbb += double(b[i]) * b[i];
  }
  if (saa == 0) return f;
  f.valid = true;
  f.c = sab / saa;
  double r = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) continue;
    const double d = double(b[i]) - f.c * a[i];
    r += d * d;
  }
  f.resid = sbb > 0 ? std::sqrt(r / sbb) : 0.0;
  return f;
}

double rel_l2(const Tensor& x, const Tensor& y) {
  double dd = 0, yy = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double d = double(x[i]) - y[i];
    dd += d * d, yy += double(y[i]) * y[i];
  }
  if (yy == 0) return dd == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(dd / yy);
}

void IndexStats::merge(const IndexStats& o) {
  if (first_bad.empty() && !o.first_bad.empty()) first_bad = o.first_bad, first_bad_step = o.first_bad_step;
  rows += o.rows, agree += o.agree, ties += o.ties, real += o.real, unscored += o.unscored;
  max_tie_move = std::max(max_tie_move, o.max_tie_move);
  exact_ties += o.exact_ties;
}

IndexStats compare_index(const IndexTensor& a, const IndexTensor& b, const Tensor* sa, const Tensor* sb, bool table_lookup,
                         double tol, const std::vector<int64_t>* positions) {
  IndexStats s;
  s.rows = a.dim(0);
  const int64_t ka = a.numel() / std::max<int64_t>(1, a.dim(0)), kb = b.numel() / std::max<int64_t>(1, b.dim(0));
  auto set_of = [](const IndexTensor& t, int64_t r, int64_t k) {
    std::multiset<int64_t> out;
    for (int64_t j = 0; j < k; ++j)
      if (t[r * k + j] >= 0) out.insert(t[r * k + j]);
    return out;
  };
  auto str = [](const std::multiset<int64_t>& x) {
    std::string o;
    for (auto v : x) append_item(o, std::to_string(v));
    return "{" + o + "}";
  };
  const bool scored = sa && sb && sa->shape == sb->shape && sa->dim(0) == a.dim(0);
  for (int64_t r = 0; r < s.rows; ++r) {
    const auto x = set_of(a, r, ka), y = set_of(b, r, kb);
    if (x == y) {
      ++s.agree;
      continue;
    }
    if (s.first_bad.empty())
      s.first_bad = positions && int64_t(positions->size()) == s.rows
                        ? fmt::format("position {}: A {} B {}", (*positions)[size_t(r)], str(x), str(y))
                        : fmt::format("row {}: A {} B {}", r, str(x), str(y));
    if (table_lookup) {
      ++s.real;
      continue;
    }
    if (!scored) {
      ++s.real, ++s.unscored;
      continue;
    }
    const int64_t E = sa->dim(-1);
    const float* ra = sa->row(r);
    const float* rb = sb->row(r);
    // The scale of the tolerance: the row's largest finite score (the indexer's masked entries are -inf, which
    // would make any move "within" an infinite tolerance). A swapped entry without a finite score on both sides is
    // no tie.
    double scale = 1, move = 0;
    for (int64_t e = 0; e < E; ++e)
      if (std::isfinite(ra[e])) scale = std::max(scale, double(std::fabs(ra[e])));
    bool in_range = true;
    std::vector<int64_t> only_x, only_y;  // the swapped entries
    auto account = [&](const std::multiset<int64_t>& p, const std::multiset<int64_t>& q, std::vector<int64_t>& only) {
      for (auto e : p)
        if (!q.count(e)) {
          if (e >= E || !std::isfinite(ra[e]) || !std::isfinite(rb[e])) in_range = false;
          else move = std::max(move, std::fabs(double(rb[e]) - ra[e])), only.push_back(e);
        }
    };
    account(x, y, only_x);
    account(y, x, only_y);
    // An exact tie: the swapped entries have exactly equal scores on both sides, so both selections are the top-k
    // (two implementations may order equal scores differently, e.g. PyTorch's CPU and CUDA top-k). Unequal scores
    // with unchanged values are a wrong top-k, however close.
    double gap = 0;
    for (auto e : only_x)
      for (auto f : only_y) gap = std::max({gap, std::fabs(double(ra[e]) - ra[f]), std::fabs(double(rb[e]) - rb[f])});
    const bool boundary_tie = in_range && !only_x.empty() && !only_y.empty() && gap == 0;
    if (in_range && ((move > 0 && move <= tol * scale) || boundary_tie)) {
      ++s.ties;
      s.exact_ties += move == 0;
      s.max_tie_move = std::max(s.max_tie_move, move);
    } else {
      ++s.real;
    }
  }
  return s;
}

std::string err_text(double v) {
  if (v == 0) return "0";
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return fmt::format("{:.3e}", v);
}

}  // namespace plumb::toolkit
