// The MoE sublayer of the CUDA forward pass (see gpu_moe.cpp).
#pragma once
#include "cuda/gpu_common.h"

namespace plumb::cuda {

// The routed experts' combine left to the launch that reads the sublayer's output (gpu_moe's `defer`; the next
// hc_pre's fused hc_post, HcArgs::y_slots): out[t, :] = scale * sum_k w[t, k] * ys[t * K + k, :] (+ add[t, :]),
// the combine launch's arithmetic. scale is the runner's output scale (the routed-scaling contract's one place).
struct GpuCombine {
  const float* ys = nullptr;  // [n * K, D]; null: nothing deferred, out was written
  const float* w = nullptr;   // [n, K] or null (unit weights)
  const float* add = nullptr;  // [n, D] (the shared expert) or null
  int K = 0;
  float scale = 1.0f;
  // cuda.branch_flags: the shared expert's stream, not joined yet (add's producer): the reader waits for it in-kernel
  // or joins it (Scratch::wait_or_join); null if joined.
  Stream branch = nullptr;
};

// x: [n, D] device (ffn_norm-ed); x16: the same as f16 or null (then the tensor-core kernels convert x
// themselves); tokens: [n] device int32 (hash routing); out: [n, D] device = routed + shared. Taps ffn.gate.*,
// ffn.routed, ffn.shared, ffn.out as the reference does. defer (optional, no taps): where the routed experts run
// on the decode kernels and nothing follows their combine (fp32 twin numerics, no fault scale), the combine is not
// launched but described in *defer, and out is not written; else defer->ys is null.
void gpu_moe(const GpuMoe& w, const ModelConfig& c, MlpType type, const ModelOptions& opt, const float* x, const uint16_t* x16,
             int n, const int32_t* tokens, Scratch& sc, const Tap& tap, float* out, GpuCombine* defer = nullptr);

}  // namespace plumb::cuda
