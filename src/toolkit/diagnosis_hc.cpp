// Recomputed hypotheses: the hc_post stream mixing with comb transposed or not, and the SwiGLU expert with or
// without clamps, evaluated on A's taps (and the checkpoint's embedding / weights) and matched against B.
#include <cmath>

#include "model/experts.h"
#include "model/hyper_connection.h"
#include "model/numerics.h"
#include "model/ops.h"
#include "toolkit/diagnosis_util.h"

namespace plumb::toolkit::detail {

namespace {

// out[t][k] = post[t][k] * y[t] + sum_j C[t][j][k] * X[t][j]   (transposed: column k gathers every stream j),
// or with C[t][k][j] when `untransposed`. Accumulates in fp32 in the model's order; the result is stored as
// an activation of A's numerics (bf16 under numerics.official).
Tensor mix_streams(const Tensor& y, const Tensor& X, const Tensor& post, const Tensor& comb, bool untransposed,
                   const Numerics& nm) {
  const int64_t n = X.dim(0), H = X.dim(1), D = X.dim(2);
  Tensor out({n, H, D});
  for (int64_t t = 0; t < n; ++t) {
    const float* C = comb.ptr() + t * H * H;
    for (int64_t k = 0; k < H; ++k)
      for (int64_t d = 0; d < D; ++d) {
        float acc = post[t * H + k] * y[t * D + d];
        for (int64_t j = 0; j < H; ++j) acc += C[untransposed ? k * H + j : j * H + k] * X[(t * H + j) * D + d];
        out[(t * H + k) * D + d] = nm.act(acc);
      }
  }
  return out;
}

struct Acc {
  double dd = 0, yy = 0;
  void add(const Tensor& x, const Tensor& ref) {
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double d = double(x[i]) - ref[i];
      dd += d * d, yy += double(ref[i]) * ref[i];
    }
  }
  double rel() const { return yy > 0 ? std::sqrt(dd / yy) : (dd > 0 ? INFINITY : 0.0); }
};

}  // namespace

HcCheck check_hc_post(const DiagnosisInput& in, const Trace& b, int layer, const std::string& suffix) {
  HcCheck c;
  c.tap = fmt::format("L{}.{}", layer, suffix);
  const bool want_out = suffix == "out";
  if (!want_out && suffix.rfind("hc_ffn.", 0) != 0) return c.why_not = "not an hc_post output", c;
  if (!want_out && !in.model) return c.why_not = "hc_ffn.* needs the checkpoint's hc weights (model folder not readable)", c;
  if (layer == 0 && !in.model) return c.why_not = "layer 0 needs the checkpoint's embedding (model folder not readable)", c;
  const std::string p = fmt::format("L{}.", layer);
  Acc eu, ea, eb;
  for (size_t si = 0; si < in.a.data.size() && si < b.data.size(); ++si) {
    const StepTaps& A = in.a.data[si];
    const Tensor* bt = b.data[si].f(c.tap);
    const Tensor* at = A.f(c.tap);
    const Tensor *pa = A.f(p + "hc_attn.post"), *ca = A.f(p + "hc_attn.comb"), *ya = A.f(p + "attn.out");
    const Tensor *pf = A.f(p + "hc_ffn.post"), *cf = A.f(p + "hc_ffn.comb"), *yf = A.f(p + "ffn.out");
    if (!bt || !at || !pa || !ca || !ya || (want_out && (!pf || !cf || !yf))) continue;
    const int64_t n = ya->dim(0), H = pa->dim(1), D = ya->dim(1);
    Tensor X({n, H, D});
    if (layer == 0) {
      // Layer 0 reads the token embedding copied into every stream.
      const GoldenStep& st = in.a.steps[si];
      const auto& rows = A.positions;
      if (int64_t(rows.size()) != n) continue;
      std::vector<float> e(static_cast<size_t>(D));
      const Numerics nm(in.a_options);
      for (int64_t t = 0; t < n; ++t) {
        in.model->w.embed.row(st.tokens[size_t(rows[size_t(t)] - st.start_pos)], e.data());
        nm.act(e.data(), D);
        for (int64_t j = 0; j < H; ++j) std::copy(e.begin(), e.end(), X.ptr() + (t * H + j) * D);
      }
    } else {
      const Tensor* prev = A.f(fmt::format("L{}.out", layer - 1));
      if (!prev || prev->shape != Shape{n, H, D}) continue;
      X = *prev;
    }
    const Numerics nm(in.a_options);
    const Tensor mid_t = mix_streams(*ya, X, *pa, *ca, false, nm), mid_u = mix_streams(*ya, X, *pa, *ca, true, nm);
    Tensor hyp_t, hyp_u;
    if (want_out) {
      hyp_t = mix_streams(*yf, mid_t, *pf, *cf, false, nm);
      hyp_u = mix_streams(*yf, mid_u, *pf, *cf, true, nm);
    } else {
      const auto& w = in.model->w.layers[size_t(layer)].hc_ffn;
      const Tap none{};
      const HcPre qt = hc_pre(w, in.model->cfg, in.a_options, mid_t, none, "hc_ffn");
      const HcPre qu = hc_pre(w, in.model->cfg, in.a_options, mid_u, none, "hc_ffn");
      const std::string s = suffix.substr(7);
      const auto pick = [&](const HcPre& q) { return s == "post" ? q.post : s == "comb" ? q.comb : q.collapsed; };
      hyp_t = pick(qt), hyp_u = pick(qu);
    }
    if (hyp_t.shape != at->shape || hyp_u.shape != bt->shape) continue;
    c.evaluated = true;
    eu.add(*bt, hyp_u);
    ea.add(*at, hyp_t);
    eb.add(*bt, *at);
  }
  if (!c.evaluated) return c.why_not = "A's taps of the layer (hc_attn.*, attn.out, hc_ffn.*, ffn.out) are incomplete", c;
  c.err_untransposed = eu.rel(), c.err_recompute_a = ea.rel(), c.err_b_vs_a = eb.rel();
  // The recomputation must reproduce A (to rounding: summation order under bf16 numerics) far more closely than
  // B differs from A, and the untransposed one must explain B about as well as the transposed one explains A.
  c.matches_untransposed = c.err_recompute_a <= 0.02 * c.err_b_vs_a &&
                           c.err_untransposed <= std::max(1e-5, 2 * c.err_recompute_a) &&
                           c.err_untransposed <= 0.02 * c.err_b_vs_a;
  return c;
}

SwigluCheck check_swiglu(const DiagnosisInput& in, const Trace& b, int layer) {
  SwigluCheck c;
  if (!in.model) return c.why_not = "needs the checkpoint's expert weights (model folder not readable)", c;
  const auto& cfg = in.model->cfg;
  const Numerics nm(in.a_options);
  const double limit = swiglu_clamp_limit(cfg, nm.official());
  const ExpertAct act = expert_activation(cfg, nm.official());
  if (limit == kSwigluNoClamp) return c.why_not = "the config's swiglu_limit means no clamp in A's numerics", c;
  const auto& L = in.model->w.layers[size_t(layer)];
  const std::string p = fmt::format("L{}.", layer);
  Tensor xa, xb;
  if (!cat_pair(in.a, b, p + "hc_ffn.collapsed", xa, xb)) return c.why_not = "no hc_ffn.collapsed tap", c;
  // The experts of the layer ran on A's input: substituted when teacher-forced, within tolerance when free-running.
  Tensor x = xa;
  nm.rms_norm(x.ptr(), x.dim(0), L.ffn_norm, cfg.rms_eps);
  // One candidate per expert output tap: B against the unclamped recompute, A against the clamped one.
  struct One {
    std::string tap;
    Acc eu, ea, eb;
  };
  std::vector<One> cands;
  Tensor sa, sb;
  if (L.moe.shared && cat_pair(in.a, b, p + "ffn.shared", sa, sb)) {
    One o{p + "ffn.shared", {}, {}, {}};
    o.eu.add(sb, expert_ffn(*L.moe.shared, kSwigluNoClamp, x, nm, nullptr, act));
    o.ea.add(sa, expert_ffn(*L.moe.shared, limit, x, nm, nullptr, act));
    o.eb.add(sb, sa);
    cands.push_back(std::move(o));
  }
  Tensor wa, wb, ra, rb;
  IndexTensor ia, ib;
  if (cat_pair(in.a, b, p + "ffn.gate.weights", wa, wb) && cat_pair_index(in.a, b, p + "ffn.gate.indices", ia, ib) &&
      cat_pair(in.a, b, p + "ffn.routed", ra, rb)) {
    // sum_k w_k E_k(x) with A's selection and weights (the weights tap includes the factor).
    const int64_t n = x.dim(0), K = ia.dim(1), D = x.dim(1);
    Tensor clamped({n, D}), unclamped({n, D});
    for (int64_t t = 0; t < n; ++t)
      for (int64_t k = 0; k < K; ++k) {
        const int64_t e = ia[t * K + k];
        if (e < 0 || e >= int64_t(L.moe.experts.size())) continue;
        Tensor xt({1, D}, std::vector<float>(x.row(t), x.row(t) + D));
        const Tensor yc = expert_ffn(L.moe.experts[size_t(e)], limit, xt, nm, nullptr, act);
        const Tensor yu = expert_ffn(L.moe.experts[size_t(e)], kSwigluNoClamp, xt, nm, nullptr, act);
        for (int64_t d = 0; d < D; ++d) {
          clamped[t * D + d] += wa[t * K + k] * yc[d];
          unclamped[t * D + d] += wa[t * K + k] * yu[d];
        }
      }
    One o{p + "ffn.routed", {}, {}, {}};
    o.eu.add(rb, unclamped), o.ea.add(ra, clamped), o.eb.add(rb, ra);
    cands.push_back(std::move(o));
  }
  if (cands.empty()) return c.why_not = "no expert output taps", c;
  // Judge on the outputs that differ: every one must be the unclamped expert, and the recompute must give A.
  c.evaluated = true;
  c.matches_unclamped = true;
  bool any = false;
  for (const auto& o : cands) {
    if (o.eb.rel() <= 1e-6) continue;
    any = true;
    const bool ok = o.ea.rel() <= 1e-4 && o.eu.rel() <= std::max(1e-4, 0.05 * o.eb.rel());
    c.matches_unclamped &= ok;
    if (c.tap.empty() || o.eb.rel() > c.err_b_vs_a)
      c.tap = o.tap, c.err_unclamped = o.eu.rel(), c.err_clamped_vs_a = o.ea.rel(), c.err_b_vs_a = o.eb.rel();
  }
  if (!any) c.matches_unclamped = false, c.why_not = "the expert outputs agree";
  return c;
}

}  // namespace plumb::toolkit::detail
