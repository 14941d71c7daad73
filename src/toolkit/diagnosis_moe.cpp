// MoE analysis of one layer: router logits, selection, gate-weight row sums, routed / shared scale fits and the
// combine relation, condensed into a verdict (factor twice / missing, shared scaled, underflow, NaN, ...).
#include <algorithm>
#include <cmath>

#include "core/strings.h"
#include "toolkit/diagnosis_util.h"

namespace plumb::toolkit::detail {

bool cat_pair(const Trace& a, const Trace& b, const std::string& tap, Tensor& ta, Tensor& tb) {
  ta = Tensor(), tb = Tensor();
  Shape row;
  for (size_t si = 0; si < a.data.size() && si < b.data.size(); ++si) {
    const Tensor* x = a.data[si].f(tap);
    const Tensor* y = b.data[si].f(tap);
    if (!x || !y || x->shape != y->shape || x->shape.empty()) continue;
    Shape r(x->shape.begin() + 1, x->shape.end());
    if (ta.shape.empty()) row = r, ta.shape = x->shape, tb.shape = x->shape, ta.shape[0] = tb.shape[0] = 0;
    if (r != row) continue;
    ta.data.insert(ta.data.end(), x->data.begin(), x->data.end());
    tb.data.insert(tb.data.end(), y->data.begin(), y->data.end());
    ta.shape[0] += x->shape[0], tb.shape[0] += y->shape[0];
  }
  return !ta.shape.empty() && ta.shape[0] > 0;
}

bool cat_pair_index(const Trace& a, const Trace& b, const std::string& tap, IndexTensor& ia, IndexTensor& ib) {
  ia = IndexTensor(), ib = IndexTensor();
  for (size_t si = 0; si < a.data.size() && si < b.data.size(); ++si) {
    const IndexTensor* x = a.data[si].i(tap);
    const IndexTensor* y = b.data[si].i(tap);
    if (!x || !y || x->shape != y->shape || x->shape.size() != 2) continue;
    if (ia.shape.empty()) ia.shape = ib.shape = {0, x->shape[1]};
    if (x->shape[1] != ia.shape[1]) continue;
    ia.data.insert(ia.data.end(), x->data.begin(), x->data.end());
    ib.data.insert(ib.data.end(), y->data.begin(), y->data.end());
    ia.shape[0] += x->shape[0], ib.shape[0] += y->shape[0];
  }
  return !ia.shape.empty() && ia.shape[0] > 0;
}

bool within(const Tensor& a, const Tensor& b, double tol) {
  const FloatStats s = compare_f32(a, b);
  return s.nonfinite_mismatch == 0 && s.err_scaled() <= tol;
}

std::string layers_str(const std::vector<int>& v) {
  std::string s;
  for (int x : v) append_item(s, std::to_string(x));
  return s;
}

std::string fmt_g(double v) { return fmt::format("{:.4g}", v); }

const char* verdict_name(MoeVerdict v) {
  switch (v) {
    case MoeVerdict::Absent: return "absent";
    case MoeVerdict::Ok: return "ok";
    case MoeVerdict::NanWeights: return "NaN gate weights";
    case MoeVerdict::ZeroWeights: return "all-zero gate weights";
    case MoeVerdict::RouterLogits: return "router logits differ";
    case MoeVerdict::Flip: return "selection differs";
    case MoeVerdict::Missing: return "routed_scaling_factor missing";
    case MoeVerdict::Twice: return "routed_scaling_factor applied twice";
    case MoeVerdict::SharedScaled: return "shared expert scaled";
    case MoeVerdict::Weights: return "gate weights differ";
    case MoeVerdict::Scale: return "routed output scaled";
    case MoeVerdict::Expert: return "expert outputs differ";
    case MoeVerdict::Combine: return "combine differs";
  }
  return "?";
}

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 1.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

MoeLayer analyze_moe_layer(const Trace& a, const Trace& b, bool b_forced, int layer, double tol, const ModelConfig* cfg,
                           bool reliable_inputs) {
  MoeLayer m;
  m.layer = layer;
  m.hash = cfg && size_t(layer) < cfg->mlp.size() && cfg->mlp[size_t(layer)] == MlpType::Hash;
  const double rsf = cfg ? cfg->routed_scaling : 1.0;
  const bool has_rsf = std::abs(rsf - 1.0) > 1e-6;
  const std::string p = fmt::format("L{}.ffn.", layer);
  Tensor la, lb, wa, wb, ra, rb, sa, sb, oa, ob;
  IndexTensor ia, ib;
  const bool have_logits = cat_pair(a, b, p + "gate.logits", la, lb);
  const bool have_w = cat_pair(a, b, p + "gate.weights", wa, wb);
  const bool have_idx = cat_pair_index(a, b, p + "gate.indices", ia, ib);
  const bool have_r = cat_pair(a, b, p + "routed", ra, rb);
  const bool have_s = cat_pair(a, b, p + "shared", sa, sb);
  const bool have_o = cat_pair(a, b, p + "out", oa, ob);
  if (!have_w && !have_r && !have_o) return m;
  m.verdict = MoeVerdict::Ok;

  if (have_logits) {
    const FloatStats s = compare_f32(la, lb);
    m.logits_err = s.nonfinite_mismatch ? INFINITY : s.err_scaled();
  }
  if (have_idx) {
    Tensor ga, gb;  // the selection scores (score + bias) when tapped, else the logits
    const bool have_scores = cat_pair(a, b, p + "gate.scores", ga, gb);
    const Tensor* sa = have_scores ? &ga : have_logits ? &la : nullptr;
    const Tensor* sb = have_scores ? &gb : have_logits ? &lb : nullptr;
    const IndexStats s = compare_index(ia, ib, sa, sb, m.hash, tol);
    m.rows = s.rows, m.flips = s.real, m.ties = s.ties;
  }
  if (have_w) {
    const int64_t n = wa.dim(0), K = wa.dim(1);
    std::vector<double> ratios, suma, sumb;
    for (int64_t t = 0; t < n; ++t) {
      double x = 0, y = 0;
      bool nan_b = false;
      for (int64_t k = 0; k < K; ++k) {
        x += wa[t * K + k], y += wb[t * K + k];
        nan_b |= !std::isfinite(wb[t * K + k]);
      }
      const bool a_ok = std::isfinite(x) && x > 0;
      double max_sel = -1e300;  // A's largest selected router logit in this row
      if (have_logits && have_idx)
        for (int64_t k = 0; k < K; ++k)
          if (const int64_t e = ia[t * K + k]; e >= 0 && e < la.dim(1)) max_sel = std::max(max_sel, double(la[t * la.dim(1) + e]));
      if (a_ok && nan_b) {
        ++m.nan_rows;
        if (max_sel > 88.7) ++m.nan_overflow_rows, m.nan_overflow_max_logit = std::max(m.nan_overflow_max_logit, max_sel);
        else if (max_sel > -1e300 && max_sel < -16.6)
          ++m.nan_zero_rows, m.nan_zero_rows_max_logit = std::max(m.nan_zero_rows_max_logit, max_sel);
      } else if (a_ok && y == 0) {
        ++m.zero_rows, m.zero_rows_max_logit = std::max(m.zero_rows_max_logit, max_sel);
      } else if (!a_ok && x == 0 && nan_b) {
        // A itself underflowed to all-zero scores (floored: weights 0); B divided 0 by 0.
        ++m.nan_rows, ++m.nan_zero_rows, m.nan_zero_rows_max_logit = std::max(m.nan_zero_rows_max_logit, max_sel);
      }
      if (a_ok && std::isfinite(y)) ratios.push_back(y / x), suma.push_back(x), sumb.push_back(y);
    }
    m.w_ratio = median(ratios);
    m.w_sum_a = median(suma), m.w_sum_b = median(sumb);
  }
  if (have_r) m.routed = fit_scale(ra, rb), m.routed_ok = within(ra, rb, tol);
  if (have_s) m.shared = fit_scale(sa, sb), m.shared_ok = within(sa, sb, tol);
  if (have_o) {
    m.out_ok = within(oa, ob, tol);
    // ffn.out is computed from the routed and shared values the run continued with: B's own when free-running,
    // A's when teacher-forced (they were substituted).
    if (have_r) {
      Tensor sum = b_forced ? ra : rb;
      if (have_s)
        for (int64_t i = 0; i < sum.numel(); ++i) sum[i] += b_forced ? sa[i] : sb[i];
      Tensor scaled = sum;
      for (auto& v : scaled.data) v = float(v * rsf);
      m.out_vs_sum = rel_l2(ob, sum);
      m.out_vs_scaled = rel_l2(ob, scaled);
    }
  }

  const bool w_ok = m.w_ok = !have_w || within(wa, wb, tol);
  const bool scaled_combine = has_rsf && have_s && m.out_vs_scaled <= std::max(1e-4, tol) && m.out_vs_scaled < 0.1 * m.out_vs_sum;
  const bool pure_routed = m.routed.valid && m.routed.resid < 1e-3;
  if (m.nan_rows) return m.verdict = MoeVerdict::NanWeights, m;
  if (m.zero_rows) return m.verdict = MoeVerdict::ZeroWeights, m;
  // Row sums of the gate weights do not depend on the layer input (they are rsf after renormalization), nor
  // does B's own combine relation: both hold for every layer, even free-running after a divergence.
  if (has_rsf && have_w && !w_ok && (near(m.w_ratio, 1 / rsf) || near(m.w_ratio, 1 / (rsf * rsf))))
    return m.verdict = scaled_combine ? MoeVerdict::SharedScaled : MoeVerdict::Missing, m;
  if (has_rsf && have_w && !w_ok && (near(m.w_ratio, rsf) || near(m.w_ratio, rsf * rsf)))
    return m.verdict = MoeVerdict::Twice, m;
  if (scaled_combine && !m.out_ok) return m.verdict = MoeVerdict::SharedScaled, m;
  if (!reliable_inputs) {
    // Input-dependent checks: only the relation of routed output to weights is still meaningful.
    m.verdict = MoeVerdict::Ok;
    return m;
  }
  if (m.logits_err > tol) return m.verdict = MoeVerdict::RouterLogits, m;
  if (m.flips || m.ties) return m.verdict = MoeVerdict::Flip, m;
  if (!w_ok) return m.verdict = MoeVerdict::Weights, m;
  if (!m.routed_ok) {
    if (pure_routed && has_rsf && !rsf_relation(m.routed.c, rsf).empty()) {
      int power = 0;
      rsf_relation(m.routed.c, rsf, &power);
      return m.verdict = power > 0 ? MoeVerdict::Twice : MoeVerdict::Missing, m;
    }
    return m.verdict = pure_routed ? MoeVerdict::Scale : MoeVerdict::Expert, m;
  }
  if (!m.shared_ok) return m.verdict = MoeVerdict::Expert, m;
  if (!m.out_ok) return m.verdict = MoeVerdict::Combine, m;
  return m;
}

GroupedCheck check_grouped_topk(const Trace& a, const Trace& b, int layer) {
  GroupedCheck g;
  Tensor ta, tb;
  if (!cat_pair(a, b, fmt::format("L{}.ffn.gate.scores", layer), ta, tb) || ta.shape.size() != 2) return g;
  const int64_t n = ta.dim(0), E = ta.dim(1);
  // Per row: which experts B masked (-inf where A is finite); every other score must be A's.
  std::vector<std::vector<char>> masked(static_cast<size_t>(n), std::vector<char>(static_cast<size_t>(E), 0));
  for (int64_t r = 0; r < n; ++r) {
    bool any = false;
    for (int64_t e = 0; e < E; ++e) {
      const float x = ta[r * E + e], y = tb[r * E + e];
      if (std::isinf(y) && y < 0 && std::isfinite(x)) masked[size_t(r)][size_t(e)] = 1, any = true;
      else if (!(x == y || std::abs(double(x) - y) <= 1e-6 * std::max(1.0, std::abs(double(x))))) return g;
    }
    g.masked_rows += any;
  }
  if (g.masked_rows == 0) return g;
  // The largest aligned group size whose groups are masked whole on every row.
  for (int64_t per = E / 2; per >= 2 && !g.matches; --per) {
    if (E % per) continue;
    bool whole = true;
    for (int64_t r = 0; r < n && whole; ++r)
      for (int64_t e = 0; e < E && whole; ++e) whole = masked[size_t(r)][size_t(e)] == masked[size_t(r)][size_t(e - e % per)];
    if (!whole) continue;
    g.matches = true, g.per = per, g.groups = E / per, g.rows = n;
    g.kept_min = g.groups, g.kept_max = 0;
    for (int64_t r = 0; r < n; ++r) {
      int64_t kept = 0;
      for (int64_t q = 0; q < g.groups; ++q) kept += !masked[size_t(r)][size_t(q * per)];
      if (kept < g.groups) g.kept_min = std::min(g.kept_min, kept), g.kept_max = std::max(g.kept_max, kept);
    }
  }
  return g;
}

}  // namespace plumb::toolkit::detail
