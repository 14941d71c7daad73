// Expert FFN and MoE combine reference (spec section 6.4-6.5): fp32, shared expert added with weight 1.
// The router/runner pairing lives here; the faults that break the routed-scaling contract are confined to the
// fault branch of moe_forward, the only code that may relabel a weight placement.
#include "model/experts.h"

#include <algorithm>

#include "model/ops.h"

namespace plumb {

Tensor expert_ffn(const ExpertWeights& e, double limit, const Tensor& x, const Numerics& nm, const float* pre_scale, ExpertAct act) {
  Tensor g = nm.proj(x, e.w1), u = nm.proj(x, e.w3);
  const int64_t n = x.dim(0), I = g.dim(1);
  const float L = float(limit);
  const bool clamp = limit != kSwigluNoClamp;
  const bool bias = !e.b1.data.empty() && !nm.official();  // (F.linear's: the product in fp32, then + b)
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < I; ++i) {
      float gv = g[t * I + i], uv = u[t * I + i];
      if (bias) gv += e.b1[i], uv += e.b3[i];
      if (clamp) {  // gate: upper bound only; up: both sides, torch's order (std::clamp is undefined for L < 0)
        gv = std::min(gv, L);
        uv = std::min(std::max(uv, -L), L);
      }
      g[t * I + i] = nm.act(ops::expert_act(act, gv) * uv * (pre_scale ? pre_scale[t] : 1.0f));
    }
  Tensor y = nm.proj(g, e.w2);
  if (bias) {
    const int64_t D = y.dim(1);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t d = 0; d < D; ++d) y[t * D + d] += e.b2[d];
  }
  return y;
}

RouterOptions router_options(const ModelOptions& o) {
  RouterOptions r;
  r.bf16_logits = o.router_bf16;
  r.softplus_naive = o.fault_softplus_naive;
  r.unfloored = o.fault_renorm_unfloored;
  r.renorm = true;  // per-config: see moe_forward (the official code does not renormalize softmax scores)
  return r;
}

namespace {

// A runner that consumes Folded weights but scales its output anyway: the double application (fault only).
struct FaultRunnerScalesFoldedAgain {
  static constexpr Rsf consumes = Rsf::Folded;
  static float output_scale(const ModelConfig& c) { return float(c.routed_scaling); }
};

// Reinterprets a placement without changing the numbers: the mechanism of every "missing" bug (fault only).
template <Rsf To, Rsf From>
RoutedWeights<To> fault_relabel(RoutedWeights<From>&& r) {
  return RoutedWeights<To>{std::move(r.idx), std::move(r.weight), std::move(r.logits), std::move(r.select)};
}

struct MoeCtx {
  const MoeWeights& w;
  const ModelConfig& c;
  const Numerics& nm;
  MlpType type;
  const Tensor& x;
  std::span<const int32_t> tokens;
  const ModelOptions& opt;
  const RouterOptions& ropt;
  const Tap& tap;
  int64_t expert_begin = 0, expert_end = -1;  // this rank's experts (-1: all)
};

template <class Runner>
Tensor run_routed(const Runner&, const MoeCtx& m, const RoutedWeights<Runner::consumes>& r) {
  const auto& c = m.c;
  const int64_t n = m.x.dim(0), D = c.hidden, K = r.idx.dim(1);
  const double limit = m.opt.fault_swiglu_unclamped ? kSwigluNoClamp : swiglu_clamp_limit(c, m.nm.official());
  const ExpertAct act = expert_activation(c, m.nm.official());
  Tensor out({n, D});
  // Gather, per expert, the tokens routed to it (a token may list an expert twice in a hash table: each
  // listing counts, as in the official code).
  const int64_t e_end = m.expert_end < 0 ? c.n_experts : m.expert_end;
  for (int64_t e = m.expert_begin; e < e_end; ++e) {
    std::vector<int64_t> rows;
    std::vector<float> wts;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t k = 0; k < K; ++k)
        if (r.idx[t * K + k] == e) rows.push_back(t), wts.push_back(r.weight[t * K + k]);
    if (rows.empty()) continue;
    Tensor xe({int64_t(rows.size()), D});
    for (size_t i = 0; i < rows.size(); ++i) std::copy(m.x.row(rows[i]), m.x.row(rows[i]) + D, xe.row(int64_t(i)));
    const bool before = m.opt.weight_before_down || m.nm.official();  // the official order
    const Tensor ye = expert_ffn(m.w.experts[size_t(e)], limit, xe, m.nm, before ? wts.data() : nullptr, act);
    for (size_t i = 0; i < rows.size(); ++i) {
      const float wt = before ? 1.0f : wts[i];
      for (int64_t d = 0; d < D; ++d) out[rows[i] * D + d] += wt * ye[int64_t(i) * D + d];
    }
  }
  const float s = Runner::output_scale(c);
  if (s != 1.0f)
    for (auto& v : out.data) v *= s;
  return out;
}

// routed + shared; `total_scale` != 1 only for fault.shared_scaled.
template <class Runner, Rsf P>
  requires RunnerAccepts<Runner, P>
Tensor combine(const Runner& runner, const MoeCtx& m, const RoutedWeights<P>& r, float total_scale = 1.0f) {
  tap_routing(m.tap, r, m.c.routed_scaling);
  Tensor out = run_routed(runner, m, r);
  m.tap.io("ffn.routed", out);
  if (m.w.shared) {  // the shared expert: weight 1, never scaled by routed_scaling_factor
    const bool unclamped = m.opt.fault_swiglu_unclamped || m.nm.official_initial();
    Tensor shared = expert_ffn(*m.w.shared, unclamped ? kSwigluNoClamp : swiglu_clamp_limit(m.c, m.nm.official()), m.x, m.nm, nullptr,
                               expert_activation(m.c, m.nm.official()));
    m.tap.io("ffn.shared", shared);
    for (int64_t i = 0; i < out.numel(); ++i) out[i] += shared[i];
  }
  if (total_scale != 1.0f)
    for (auto& v : out.data) v *= total_scale;
  m.nm.act(out);  // fp32 accumulation of routed + shared, stored as an activation
  m.tap.io("ffn.out", out);
  return out;
}

template <class Runner>
Tensor moe_with(const Runner& runner, const MoeCtx& m) {
  return combine(runner, m, route<Runner::consumes>(m.w, m.c, m.type, RouterInputs{m.x, m.tokens}, m.ropt));
}

}  // namespace

Tensor moe_forward_ep_simulated(const MoeWeights& w, const ModelConfig& c, MlpType type, const Tensor& x,
                                std::span<const int32_t> tokens, const ModelOptions& opt, int ep_size,
                                std::vector<Tensor>* rank_outputs, bool fault_shared_unscaled) {
  PLUMB_CHECK(ep_size >= 1 && c.n_experts % ep_size == 0, "expert parallelism: {} experts do not split over ep_size {}",
              c.n_experts, ep_size);
  const Numerics nm(opt);
  const RouterOptions ropt = router_options(opt);
  const Tap none;
  const auto r = route<RunnerFoldedWeights::consumes>(w, c, type, RouterInputs{x, tokens}, ropt);
  const Tensor shared = w.shared ? expert_ffn(*w.shared, swiglu_clamp_limit(c, nm.official()), x, nm, nullptr, expert_activation(c, nm.official()))
                                  : Tensor({x.dim(0), c.hidden});
  const float share = fault_shared_unscaled ? 1.0f : 1.0f / float(ep_size);
  const int64_t per_rank = c.n_experts / ep_size;
  Tensor total({x.dim(0), c.hidden});
  for (int rank = 0; rank < ep_size; ++rank) {
    MoeCtx m{w, c, nm, type, x, tokens, opt, ropt, none, rank * per_rank, (rank + 1) * per_rank};
    Tensor part = run_routed(RunnerFoldedWeights{}, m, r);
    for (int64_t i = 0; i < part.numel(); ++i) part[i] += share * shared[i];
    for (int64_t i = 0; i < part.numel(); ++i) total[i] += part[i];  // the all-reduce
    if (rank_outputs) rank_outputs->push_back(std::move(part));
  }
  return total;
}

Tensor moe_forward(const MoeWeights& w, const ModelConfig& c, MlpType type, const Tensor& x, std::span<const int32_t> tokens,
                   const ModelOptions& opt, const Numerics& nm, const Tap& tap) {
  RouterOptions ropt = router_options(opt);
  ropt.renorm = !(nm.official() && c.score == ScoreFunc::Softmax);  // DeepSeek's Gate skips it for softmax
  ropt.bf16_weight = ropt.cuda_ties = nm.official();
  const MoeCtx m{w, c, nm, type, x, tokens, opt, ropt, tap};
  const RouterInputs in{x, tokens};
  if (opt.fault_rsf_twice) return moe_with(FaultRunnerScalesFoldedAgain{}, m);
  if (opt.fault_rsf_missing)
    return combine(RunnerFoldedWeights{}, m, fault_relabel<Rsf::Folded>(route<Rsf::Unfolded>(w, c, type, in, ropt)));
  if (opt.fault_rsf_missing_hash_layers && type == MlpType::Hash)
    return combine(RunnerFoldedWeights{}, m, fault_relabel<Rsf::Folded>(route<Rsf::Unfolded>(w, c, type, in, ropt)));
  if (opt.fault_shared_scaled)
    return combine(RunnerFoldedWeights{}, m, fault_relabel<Rsf::Folded>(route<Rsf::Unfolded>(w, c, type, in, ropt)),
                   float(c.routed_scaling));
  return opt.rsf_on_output ? moe_with(RunnerScalesOutput{}, m) : moe_with(RunnerFoldedWeights{}, m);
}

}  // namespace plumb
