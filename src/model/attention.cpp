// Attention reference (spec section 5): exact softmax with sink over window keys and compressed entries.
#include "model/attention.h"

#include <algorithm>

#include "model/compressor.h"
#include "model/indexer.h"

namespace plumb {

Tensor attention_forward(const AttentionWeights& w, const ModelConfig& c, AttnType type, const ops::Rope& rope,
                         const Tensor& x, int64_t pos0, LayerState& st, const Tap& tap) {
  const int64_t n = x.dim(0), H = c.n_heads, Dh = c.head_dim, rd = rope.dim(), W = c.window;

  // Query: q_norm(wq_a x) -> wq_b -> per-head unweighted RMS -> RoPE on the last rd dims.
  Tensor qr = ops::linear(x, w.wq_a);
  ops::rms_norm(qr.ptr(), n, w.q_norm, c.rms_eps);
  Tensor q = ops::linear(qr, w.wq_b);  // [n, H * Dh]
  ops::rms_norm_plain(q.ptr(), n * H, Dh, c.rms_eps);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < H; ++h) rope.apply(q.ptr() + (t * H + h) * Dh + (Dh - rd), pos0 + t);
  q.shape = {n, H, Dh};
  tap("attn.q", q);

  // Shared key/value: kv_norm(wkv x), RoPE on the last rd dims.
  Tensor kv = ops::linear(x, w.wkv);  // [n, Dh]
  ops::rms_norm(kv.ptr(), n, w.kv_norm, c.rms_eps);
  for (int64_t t = 0; t < n; ++t) rope.apply(kv.ptr() + t * Dh + (Dh - rd), pos0 + t);
  tap("attn.kv", kv);

  // Window keys: the cached (window - 1) rows followed by this chunk.
  std::vector<float> keys(st.win_kv);
  std::vector<int64_t> key_pos(st.win_pos);
  keys.insert(keys.end(), kv.data.begin(), kv.data.end());
  for (int64_t t = 0; t < n; ++t) key_pos.push_back(pos0 + t);

  // Compressed entries (emitted by this chunk too: an entry is complete once its last source token is in).
  IndexTensor sel;
  const CompressorState& cs = st.comp;
  if (type != AttnType::Sliding) {
    compressor_step(*w.comp, rope, c.rms_eps, x, st.comp);
    if (type == AttnType::CSA) {
      compressor_step(w.indexer->comp, rope, c.rms_eps, x, st.index_comp);
      auto ix = indexer_select(*w.indexer, c, rope, x, qr, pos0, st.index_comp);
      tap("attn.indexer.scores", ix.scores);
      sel = std::move(ix.topk);
      tap.index("attn.indexer.topk", sel);
    }
  }

  const float scale = 1.0f / std::sqrt(float(Dh));
  Tensor o({n, H * Dh});
  std::vector<const float*> kset;
  std::vector<float> logits;
  for (int64_t t = 0; t < n; ++t) {
    const int64_t p = pos0 + t;
    kset.clear();
    for (size_t j = 0; j < key_pos.size(); ++j)
      if (key_pos[j] <= p && key_pos[j] > p - W) kset.push_back(keys.data() + j * Dh);
    if (type == AttnType::HCA) {
      const int64_t visible = std::min<int64_t>((p + 1) / w.comp->rate, cs.n_entries);
      for (int64_t e = 0; e < visible; ++e) kset.push_back(cs.entries.data() + e * Dh);
    } else if (type == AttnType::CSA) {
      for (int64_t j = 0; j < sel.dim(1); ++j)
        if (int64_t e = sel[t * sel.dim(1) + j]; e >= 0) kset.push_back(cs.entries.data() + e * Dh);
    }
    const int64_t nk = int64_t(kset.size());
    logits.resize(size_t(nk + 1));
    for (int64_t h = 0; h < H; ++h) {
      const float* qh = q.ptr() + (t * H + h) * Dh;
      for (int64_t j = 0; j < nk; ++j) {
        double dot = 0;
        for (int64_t i = 0; i < Dh; ++i) dot += double(qh[i]) * kset[size_t(j)][i];
        logits[size_t(j)] = float(dot) * scale;
      }
      logits[size_t(nk)] = w.sink[h];  // the sink joins the softmax denominator, carries no value
      ops::softmax(logits.data(), nk + 1);
      float* oh = o.ptr() + (t * H + h) * Dh;
      for (int64_t i = 0; i < Dh; ++i) {
        double acc = 0;
        for (int64_t j = 0; j < nk; ++j) acc += double(logits[size_t(j)]) * kset[size_t(j)][i];
        oh[i] = float(acc);
      }
      // K = V, so the value carries rotation on its rope dims: undo it at the query position.
      rope.apply(oh + (Dh - rd), p, /*inverse=*/true);
    }
  }

  // Keep the last (window - 1) rows for the next call.
  const int64_t keep = std::min<int64_t>(W - 1, int64_t(key_pos.size()));
  st.win_pos.assign(key_pos.end() - keep, key_pos.end());
  st.win_kv.assign(keys.end() - keep * Dh, keys.end());

  // Grouped output projection: group g (heads [g*H/G, (g+1)*H/G)) -> wo_a rows [g*R, (g+1)*R); then wo_b.
  const int64_t G = c.o_groups, R = c.o_lora, gw = H * Dh / G;
  Tensor mid({n, G * R});
  for (int64_t g = 0; g < G; ++g) ops::linear_rows(o.ptr() + g * gw, n, H * Dh, w.wo_a, g * R, R, mid.ptr() + g * R, G * R);
  Tensor out = ops::linear(mid, w.wo_b);
  tap.io("attn.out", out);
  return out;
}

}  // namespace plumb
