// Manifold-constrained hyper-connections (mHC): collapse hc_mult residual streams into a sublayer input and
// mix the sublayer output back (hc_pre / hc_post), plus the final hc head.
#pragma once
#include "core/tensor.h"
#include "model/config.h"
#include "model/options.h"
#include "model/taps.h"
#include "model/weights.h"

namespace plumb {

struct HcPre {
  Tensor post;       // [n, H]     2 * sigmoid(...), where the sublayer output lands in each stream
  Tensor comb;       // [n, H, H]  Sinkhorn-projected (doubly stochastic) stream mixer C[j][k]
  Tensor collapsed;  // [n, D]     sum_j pre[j] * X[j], the sublayer input
};

// X: [n, H, D] residual streams. `site` is the tap prefix ("hc_attn" or "hc_ffn").
HcPre hc_pre(const HyperConnWeights& w, const ModelConfig& c, const ModelOptions& o, const Tensor& X, const Tap& tap,
             const char* site);
// Xout[k] = post[k] * y + sum_j C[j][k] * X[j]   (C transposed: column k gathers every stream j into stream k).
Tensor hc_post(const Tensor& y, const Tensor& X, const HcPre& p, const ModelOptions& o);
// Final collapse: sum_j (sigmoid(mix_j * scale + base_j) + hc_eps) * X[j]  -> [n, D].
Tensor hc_head(const HyperConnWeights& w, const ModelConfig& c, const ModelOptions& o, const Tensor& X);

}  // namespace plumb
