// Expert FFN and MoE combine reference (spec section 6.4-6.5): fp32, shared expert added with weight 1.
#include "model/experts.h"

#include <algorithm>

#include "model/ops.h"

namespace plumb {

Tensor expert_ffn(const ExpertWeights& e, double limit, const Tensor& x, const float* pre_scale) {
  Tensor g = ops::linear(x, e.w1), u = ops::linear(x, e.w3);
  const int64_t n = x.dim(0), I = g.dim(1);
  const float L = float(limit);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < I; ++i) {
      float gv = g[t * I + i], uv = u[t * I + i];
      if (L > 0) {  // gate: upper bound only; up: both sides
        gv = std::min(gv, L);
        uv = std::clamp(uv, -L, L);
      }
      g[t * I + i] = ops::silu(gv) * uv * (pre_scale ? pre_scale[t] : 1.0f);
    }
  return ops::linear(g, e.w2);
}

namespace {

template <class Runner>
Tensor run_routed(const Runner&, const MoeWeights& w, const ModelConfig& c, const Tensor& x,
                  const RoutedWeights<Runner::consumes>& r, const MoeOptions& opt) {
  const int64_t n = x.dim(0), D = c.hidden, K = r.idx.dim(1);
  Tensor out({n, D});
  // Gather, per expert, the tokens routed to it (a token may list an expert twice in a hash table: each
  // listing counts, as in the official code).
  for (int64_t e = 0; e < c.n_experts; ++e) {
    std::vector<int64_t> rows;
    std::vector<float> wts;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t k = 0; k < K; ++k)
        if (r.idx[t * K + k] == e) rows.push_back(t), wts.push_back(r.weight[t * K + k]);
    if (rows.empty()) continue;
    Tensor xe({int64_t(rows.size()), D});
    for (size_t i = 0; i < rows.size(); ++i) std::copy(x.row(rows[i]), x.row(rows[i]) + D, xe.row(int64_t(i)));
    const Tensor ye = expert_ffn(w.experts[size_t(e)], c.swiglu_limit, xe, opt.weight_before_down ? wts.data() : nullptr);
    for (size_t i = 0; i < rows.size(); ++i) {
      const float wt = opt.weight_before_down ? 1.0f : wts[i];
      for (int64_t d = 0; d < D; ++d) out[rows[i] * D + d] += wt * ye[int64_t(i) * D + d];
    }
  }
  const float s = Runner::output_scale(c);
  if (s != 1.0f)
    for (auto& v : out.data) v *= s;
  return out;
}

template <class Runner>
Tensor moe_with(const Runner& runner, const MoeWeights& w, const ModelConfig& c, MlpType type, const Tensor& x,
                std::span<const int32_t> tokens, const MoeOptions& opt, const Tap& tap) {
  const auto r = route<Runner::consumes>(w, c, type, RouterInputs{x, tokens});
  tap_routing(tap, r, c.routed_scaling);
  Tensor routed = run_routed(runner, w, c, x, r, opt);
  tap("ffn.routed", routed);
  Tensor out = routed;
  if (w.shared) {  // the shared expert: weight 1, never scaled by routed_scaling_factor
    const Tensor shared = expert_ffn(*w.shared, c.swiglu_limit, x);
    tap("ffn.shared", shared);
    for (int64_t i = 0; i < out.numel(); ++i) out[i] += shared[i];
  }
  tap("ffn.out", out);
  return out;
}

}  // namespace

Tensor moe_forward(const MoeWeights& w, const ModelConfig& c, MlpType type, const Tensor& x, std::span<const int32_t> tokens,
                   const MoeOptions& opt, const Tap& tap) {
  return opt.rsf_on_output ? moe_with(RunnerScalesOutput{}, w, c, type, x, tokens, opt, tap)
                           : moe_with(RunnerFoldedWeights{}, w, c, type, x, tokens, opt, tap);
}

}  // namespace plumb
