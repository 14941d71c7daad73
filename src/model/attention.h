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
// state). Updates the layer's window and compressor state; returns the sublayer output [n, D]. opt: the patches
// that change the attention's structure (indexer.skip_short); numerics come with nm.
Tensor attention_forward(const AttentionWeights& w, const ModelConfig& c, AttnType type, const ops::Rope& rope,
                         const Tensor& x, int64_t pos0, LayerState& st, const ModelOptions& opt, const Numerics& nm,
                         const Tap& tap);

// indexer.skip_short: whether a CSA chunk ending before position pos_end needs no indexer. While a chunk's last
// query sees at most index_topk compressed entries of `rate` tokens each, every query's top-k selects all the
// entries it sees (the rest are invisible: -1), so the attention can take them in entry order, as HCA does. Only
// the order of the keys changes, and the attention's sums are fp64: the same set, the same result up to the
// rounding of a reordered fp64 sum.
bool indexer_skippable(const ModelConfig& c, int64_t rate, int64_t pos_end);
// The selection indexer.skip_short stands in for, as the top-k tap's layout [n, k] (k = min(index_topk, entries)):
// row t (position pos0 + t) lists the entries it sees, (pos0 + t + 1) / rate of them, in entry order, then -1.
IndexTensor all_entries_selection(const ModelConfig& c, int64_t n, int64_t pos0, int64_t rate, int64_t n_entries);

}  // namespace plumb
