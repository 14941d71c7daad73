// The attention sublayer of the CUDA forward pass (see gpu_attention.cpp).
#pragma once
#include "cuda/gpu_common.h"

namespace plumb::cuda {

// x: [n, D] device (attn_norm-ed collapsed streams); out: [n, D] device. Taps attn.q, attn.kv, attn.indexer.*,
// attn.out (substitutable). Updates the layer's window ring and compressor caches.
void gpu_attention(const GpuAttn& w, const ModelConfig& c, AttnType type, const GpuRope& rope, const float* x, int n, int64_t pos0,
                   GpuLayerState& st, Scratch& sc, const Tap& tap, float* out);

}  // namespace plumb::cuda
