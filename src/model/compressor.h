// KV compressor shared by CSA (overlapping windows, m = 4), HCA (plain windows) and the lightning indexer's keys.
#pragma once
#include "core/tensor.h"
#include "model/numerics.h"
#include "model/ops.h"
#include "model/state.h"
#include "model/weights.h"

namespace plumb {

// Feeds the n rows of x ([n, D], the normed attention input) into the compressor. Every time `rate` rows
// complete window w (global, counted from position 0), one entry is emitted:
//   HCA: C[ch] = sum_{j in window} softmax_j(gate_j[ch] + ape[j][ch]) * kv_j[ch]
//   CSA: the softmax runs over 2*rate slots: window w-1's first-half series, then window w's second half
// then RMS-normed (weights.norm) and rotated at position w * rate. Returns the number of entries emitted.
// Official numerics round the pooled entry to bf16 before the norm, then simulate its storage: FP8 on the nope
// dims (main compressor) or Hadamard + FP4 (the indexer's, `rotate`).
int64_t compressor_step(const CompressorWeights& w, const ops::Rope& rope, double eps, const Tensor& x, CompressorState& st,
                        const Numerics& nm, bool rotate);

}  // namespace plumb
