// Indexer reference: fp32 scores, causal visibility w < floor((p+1)/m), top-k by score (ties as PyTorch breaks them).
#include "model/indexer.h"

#include <algorithm>
#include <numeric>

#include "core/parallel.h"

namespace plumb {

IndexerResult indexer_select(const IndexerWeights& w, const ModelConfig& c, const ops::Rope& rope, const Tensor& x,
                             const Tensor& qr, int64_t pos0, const CompressorState& keys, const Numerics& nm) {
  const int64_t n = x.dim(0), nh = c.index_heads, dh = c.index_head_dim, ne = keys.n_entries, m = w.comp.rate;
  Tensor q = nm.proj(qr, w.wq_b);  // [n, nh * dh]
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < nh; ++h) {
      float* qh = q.ptr() + (t * nh + h) * dh;
      nm.rope(rope, qh + (dh - rope.dim()), pos0 + t);
      nm.indexer_rotate(qh, dh);  // the keys are rotated the same way: q.k is preserved up to FP4 rounding
    }
  Tensor hw = nm.proj_bf16(x, w.weights_proj);  // [n, nh]
  const float wscale = 1.0f / std::sqrt(float(nh)), qscale = 1.0f / std::sqrt(float(dh));
  if (nm.official())  // official: weights_proj(x) * (dh^-1/2 * nh^-1/2), one bf16 tensor
    for (auto& v : hw.data) v = nm.act(v * float(1.0 / std::sqrt(double(dh) * double(nh))));

  const int64_t k = std::min<int64_t>(c.index_topk, ne);
  IndexerResult r{IndexTensor({n, k}, -1), Tensor({n, ne})};
  for (int64_t t = 0; t < n; ++t) {
    const int64_t visible = (pos0 + t + 1) / m;
    float* s = r.scores.ptr() + t * ne;
    // Entries are independent (each its own sums over heads and dims): split over threads (core/parallel.h).
    parallel_for(ne, double(ne) * double(nh) * double(dh), [&](int64_t ea, int64_t eb) {
      for (int64_t e = ea; e < eb; ++e) {
        if (e >= visible) {
          s[e] = -INFINITY;
          continue;
        }
        const float* key = keys.entries.data() + e * dh;
        double acc = 0;
        for (int64_t h = 0; h < nh; ++h) {
          const float* qh = q.ptr() + (t * nh + h) * dh;
          double dot = 0;
          for (int64_t i = 0; i < dh; ++i) dot += double(qh[i]) * key[i];
          if (nm.official())  // bf16 einsum, relu, bf16 product with the bf16 weights, fp32 sum over heads
            acc += nm.act(std::max(nm.act(float(dot)), 0.0f) * hw[t * nh + h]);
          else
            acc += std::max(dot, 0.0) * qscale * (hw[t * nh + h] * wscale);
        }
        s[e] = nm.act(float(acc));
      }
    });
    const auto order = nm.official() ? ops::topk_lowest_index_first(s, ne, k) : ops::topk_like_torch(s, ne, k, /*sorted=*/true);
    for (int64_t j = 0; j < k; ++j) r.topk[t * k + j] = order[size_t(j)] < visible ? order[size_t(j)] : -1;
  }
  return r;
}

}  // namespace plumb
