// Routed and shared experts (SwiGLU with clamps) and the MoE block that composes router and expert runner
// under the routed-scaling contract (router.h).
#pragma once
#include <limits>

#include "core/tensor.h"
#include "model/numerics.h"
#include "model/options.h"
#include "model/router.h"

namespace plumb {

// y = W2( act(min(W1 x, L)) * min(max(W3 x, -L), L) ) for the rows of x (torch's clamp order: for L < 0 up is L);
// with e's biases (mlp_bias: W1 x + b1 and W3 x + b3 before the clamps, + b2 after W2; left out under the official
// numerics, whose code has none).
// L = kSwigluNoClamp: no clamp; act SiLU unless a config's hidden_act says otherwise (expert_activation). `pre_scale`
// (per row, optional) multiplies the activation before W2 (the official code's order). Official numerics: FP8/FP4
// GEMMs with bf16 outputs, SwiGLU in fp32, the W2 input rounded to bf16.
Tensor expert_ffn(const ExpertWeights& e, double limit, const Tensor& x, const Numerics& nm, const float* pre_scale = nullptr,
                  ExpertAct act = ExpertAct::Silu);

// expert_ffn's limit for no clamp: the release-day official shared expert, fault.swiglu_unclamped.
inline constexpr double kSwigluNoClamp = std::numeric_limits<double>::infinity();
// The clamp a config's swiglu_limit means, per numerics mode. transformers (the default numerics) clamps gate and up
// at the value whatever it is (swiglu_limit 0 makes every expert output 0); the official code clamps only when it is
// positive (`if swiglu_limit > 0`), so numerics.official takes 0 or less as no clamp.
inline double swiglu_clamp_limit(const ModelConfig& c, bool official) {
  return official && !(c.swiglu_limit > 0) ? kSwigluNoClamp : c.swiglu_limit;
}
// The experts' activation per numerics mode: transformers (the default numerics) applies config.json's hidden_act,
// the official code SiLU whatever the config says.
inline ExpertAct expert_activation(const ModelConfig& c, bool official) { return official ? ExpertAct::Silu : c.act; }

// The routed-expert runner's and router's choices that ModelOptions makes (patches and faults).
RouterOptions router_options(const ModelOptions& o);

// Expert runners. Each declares the placement it consumes; see router.h. RunnerAccepts is the constraint the
// MoE composition is written against: a runner accepts exactly the placement it declares, so pairing a Folded
// router with a runner that scales its output (or the reverse) does not compile.
template <class Runner, Rsf P>
concept RunnerAccepts = (P == Runner::consumes);

struct RunnerFoldedWeights {  // weights already contain the factor: sum_k w_k E_k(x), nothing else
  static constexpr Rsf consumes = Rsf::Folded;
  static float output_scale(const ModelConfig&) { return 1.0f; }
};
struct RunnerScalesOutput {  // weights sum to one: rsf * sum_k w_k E_k(x), the factor applied on the output
  static constexpr Rsf consumes = Rsf::Unfolded;
  static float output_scale(const ModelConfig& c) { return float(c.routed_scaling); }
};

// Expert parallelism, simulated on one process (the contract multi-GPU code must keep): rank r owns experts
// [r*E/ep, (r+1)*E/ep) and every rank also computes the shared expert, scaled by 1/ep_size, so that the
// all-reduce (a sum over ranks) adds the shared expert exactly once; routed_scaling_factor stays in the top-k
// weights, applied once whichever rank runs an expert. Returns the all-reduced output; `rank_outputs`, if given,
// receives each rank's partial. `fault_shared_unscaled` drops the 1/ep_size (the bug: shared counted ep times).
Tensor moe_forward_ep_simulated(const MoeWeights& w, const ModelConfig& c, MlpType type, const Tensor& x,
                                std::span<const int32_t> tokens, const ModelOptions& opt, int ep_size,
                                std::vector<Tensor>* rank_outputs = nullptr, bool fault_shared_unscaled = false);

// x: [n, D] ffn_norm-ed input. Returns routed + shared ([n, D]); taps ffn.gate.*, ffn.routed, ffn.shared, ffn.out.
Tensor moe_forward(const MoeWeights& w, const ModelConfig& c, MlpType type, const Tensor& x, std::span<const int32_t> tokens,
                   const ModelOptions& opt, const Numerics& nm, const Tap& tap);

}  // namespace plumb
