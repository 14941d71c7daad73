// Routed and shared experts (SwiGLU with clamps) and the MoE block that composes router and expert runner
// under the routed-scaling contract (router.h).
#pragma once
#include "core/tensor.h"
#include "model/numerics.h"
#include "model/options.h"
#include "model/router.h"

namespace plumb {

// y = W2( silu(min(W1 x, L)) * clamp(W3 x, -L, L) ) for the rows of x; L = swiglu_limit (no clamp if <= 0).
// `pre_scale` (per row, optional) multiplies the activation before W2 (the official code's order). Official
// numerics: FP8/FP4 GEMMs with bf16 outputs, SwiGLU in fp32, the W2 input rounded to bf16.
Tensor expert_ffn(const ExpertWeights& e, double limit, const Tensor& x, const Numerics& nm, const float* pre_scale = nullptr);

// The routed-expert runner's and router's choices that ModelOptions makes (patches and faults).
RouterOptions router_options(const ModelOptions& o);

// Expert runners. Each declares the placement it consumes; see router.h.
struct RunnerFoldedWeights {  // weights already contain the factor: sum_k w_k E_k(x), nothing else
  static constexpr Rsf consumes = Rsf::Folded;
  static float output_scale(const ModelConfig&) { return 1.0f; }
};
struct RunnerScalesOutput {  // weights sum to one: rsf * sum_k w_k E_k(x), the factor applied on the output
  static constexpr Rsf consumes = Rsf::Unfolded;
  static float output_scale(const ModelConfig& c) { return float(c.routed_scaling); }
};

// x: [n, D] ffn_norm-ed input. Returns routed + shared ([n, D]); taps ffn.gate.*, ffn.routed, ffn.shared, ffn.out.
Tensor moe_forward(const MoeWeights& w, const ModelConfig& c, MlpType type, const Tensor& x, std::span<const int32_t> tokens,
                   const ModelOptions& opt, const Numerics& nm, const Tap& tap);

}  // namespace plumb
