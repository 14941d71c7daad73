// MoE routers: learned top-k (sqrtsoftplus / sigmoid / softmax scores, bias for selection only) and hash top-k
// (tid2eid), both renormalized with a floor. Where routed_scaling_factor lives is part of the weights' type.
#pragma once
#include <span>

#include "core/tensor.h"
#include "model/config.h"
#include "model/taps.h"
#include "model/weights.h"

namespace plumb {

// The routed-scaling contract. A router states whether its weights already contain routed_scaling_factor
// (Folded) or sum to one (Unfolded); an expert runner states which of the two it consumes. The runner that
// consumes Unfolded weights multiplies its routed sum by the factor; the one that consumes Folded weights
// never does. Composition is only defined for matching placements, so the factor is applied exactly once.
enum class Rsf { Folded, Unfolded };

template <Rsf P>
struct RoutedWeights {
  IndexTensor idx;  // [n, K] expert ids, in selection order
  Tensor weight;    // [n, K] fp32; includes routed_scaling_factor iff P == Rsf::Folded
  Tensor logits;    // [n, E] router logits (fp32)
  Tensor select;    // [n, E] learned layers: the selection scores (score + bias); empty for hash layers
};

// Renormalization floor: sum + 1e-20 as transformers does; keeps rows whose scores all underflow finite.
inline constexpr float kRenormFloor = 1e-20f;

// DeepSeek-V3 grouped top-k: keeps the topk_group best groups (by the sum of their two best scores) of
// sel[0..E), setting every other group's entries to -inf.
void mask_groups(float* sel, int64_t E, int n_group, int topk_group);

// Router scores from logits, numerically stable for any finite logit.
float router_score(ScoreFunc f, float logit, bool naive_softplus = false);

struct RouterInputs {
  const Tensor& x;                      // [n, D] ffn_norm-ed input
  std::span<const int32_t> tokens;      // the input token ids (hash layers select by them)
};

struct RouterOptions {
  bool bf16_logits = false;     // router.bf16
  bool bf16_weight = false;     // official: the gate weight is a bf16 parameter (logits still fp32)
  bool cuda_ties = false;       // official: equal selection scores resolve to the lower expert id
  bool renorm = true;           // false: official softmax scoring (weights are the softmax, not renormalized)
  bool softplus_naive = false;  // fault.softplus_naive
  bool unfloored = false;       // fault.renorm_unfloored
};

// Unfolded weights: renormalized to sum 1 (sum + floor). Hash layers ignore the bias and use tid2eid[token].
RoutedWeights<Rsf::Unfolded> route_unfolded(const MoeWeights& w, const ModelConfig& c, MlpType type, const RouterInputs& in,
                                            const RouterOptions& opt = {});

template <Rsf P>
RoutedWeights<P> route(const MoeWeights& w, const ModelConfig& c, MlpType type, const RouterInputs& in,
                       const RouterOptions& opt = {}) {
  auto u = route_unfolded(w, c, type, in, opt);
  if constexpr (P == Rsf::Folded)
    for (auto& v : u.weight.data) v *= float(c.routed_scaling);
  return RoutedWeights<P>{std::move(u.idx), std::move(u.weight), std::move(u.logits), std::move(u.select)};
}

// Golden taps: ffn.gate.logits, and indices sorted ascending with their weights (factor applied) as
// ffn.gate.indices / ffn.gate.weights.
template <Rsf P>
void tap_routing(const Tap& tap, const RoutedWeights<P>& r, double rsf);

}  // namespace plumb
