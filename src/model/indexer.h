// Lightning indexer (CSA layers): scores every visible compressed entry per query and keeps the top-k.
#pragma once
#include "core/tensor.h"
#include "model/config.h"
#include "model/numerics.h"
#include "model/ops.h"
#include "model/state.h"
#include "model/weights.h"

namespace plumb {

struct IndexerResult {
  IndexTensor topk;  // [n, k], k = min(index_topk, entries so far); -1 = no entry (not yet visible)
  Tensor scores;     // [n, entries]; -inf where entry w >= floor((p + 1) / rate) (not visible to query p)
};

// x: [n, D] normed attention input; qr: [n, q_lora] normed low-rank query; keys: the indexer compressor state.
// score[p][w] = sum_h relu(q_h . K_w) * index_head_dim^-1/2 * weights_proj(x)[h] * index_heads^-1/2
IndexerResult indexer_select(const IndexerWeights& w, const ModelConfig& c, const ops::Rope& rope, const Tensor& x,
                             const Tensor& qr, int64_t pos0, const CompressorState& keys, const Numerics& nm);

}  // namespace plumb
