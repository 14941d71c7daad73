// The MoE sublayer of the CUDA forward pass (see gpu_moe.cpp).
#pragma once
#include "cuda/gpu_common.h"

namespace plumb::cuda {

// x: [n, D] device (ffn_norm-ed); x16: the same as f16 or null (then the tensor-core kernels convert x
// themselves); tokens: [n] device int32 (hash routing); out: [n, D] device = routed + shared. Taps ffn.gate.*,
// ffn.routed, ffn.shared, ffn.out as the reference does.
void gpu_moe(const GpuMoe& w, const ModelConfig& c, MlpType type, const ModelOptions& opt, const float* x, const uint16_t* x16,
             int n, const int32_t* tokens, Scratch& sc, const Tap& tap, float* out);

}  // namespace plumb::cuda
