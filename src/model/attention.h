// Attention sublayer: low-rank q with per-head RMS, shared K=V, partial RoPE, sliding window + compressed entries
// (HCA: all visible; CSA: the indexer's top-k), attention sink, conjugate RoPE on the output, grouped output projection.
#pragma once
#include "core/tensor.h"
#include "model/config.h"
#include "model/numerics.h"
#include "model/ops.h"
#include "model/state.h"
#include "model/taps.h"
#include "model/weights.h"

namespace plumb {

// x: [n, D], the attn_norm-ed collapsed stream of tokens at positions pos0 .. pos0+n-1 (contiguous with the
// state). Updates the layer's window and compressor state; returns the sublayer output [n, D].
Tensor attention_forward(const AttentionWeights& w, const ModelConfig& c, AttnType type, const ops::Rope& rope,
                         const Tensor& x, int64_t pos0, LayerState& st, const Numerics& nm, const Tap& tap);

}  // namespace plumb
