// The attention sublayer of the CUDA forward pass (see gpu_attention.cpp).
#pragma once
#include "cuda/gpu_common.h"
#include "cuda/gpu_numerics.h"

namespace plumb::cuda {

// x: [n, D] device (attn_norm-ed collapsed streams); x16: the same as f16 or null (then the FP8 GEMVs convert
// x themselves); out: [n, D] device. Taps attn.q, attn.kv, attn.indexer.*, attn.out (substitutable). Updates the
// layer's window ring and compressor caches. nm: the numerics policy.
void gpu_attention(const GpuAttn& w, const ModelConfig& c, AttnType type, const GpuRope& rope, const float* x, const uint16_t* x16,
                   int n, const Step& step, GpuLayerState& st, Scratch& sc, const GpuNumerics& nm, const Tap& tap, float* out);

// A fresh session's caches for this layer: the window ring and the compressors' fixed buffers.
void init_attention_state(const GpuAttn& w, const ModelConfig& c, GpuLayerState& st);
// Grows the compressors' entry buffers to hold every entry up to position pos_end (doubling, contents kept);
// bumps sc.generation when one moves. Called before a step (and before replaying a graph).
void reserve_attention_state(const GpuAttn& w, int64_t pos_end, GpuLayerState& st, Scratch& sc);

}  // namespace plumb::cuda
