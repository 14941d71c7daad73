// Attention reference (spec section 5): exact softmax with sink over window keys and compressed entries.
#include "model/attention.h"

#include <algorithm>

#include "core/parallel.h"
#include "model/compressor.h"
#include "model/indexer.h"
#include "model/official_math.h"

namespace plumb {

namespace {

// Softmax attention of one query head over `keys`, with the sink in the denominator only. A null key is a hole
// (the official index list's -1): logit -inf, probability exactly 0, no value; it only takes its place in a block.
// Reference: exact fp32 softmax. Official: the sparse_attn kernel's online softmax over blocks of 64 keys, with
// the probabilities rounded to bf16 before P.V and the output stored as bf16.
void attend(const float* qh, const std::vector<const float*>& keys, float sink, float scale, int64_t Dh, const Numerics& nm,
            std::vector<float>& logits, float* out) {
  const int64_t nk = int64_t(keys.size());
  logits.resize(size_t(nk + 1));
  for (int64_t j = 0; j < nk; ++j) {
    if (!keys[size_t(j)]) {
      logits[size_t(j)] = -INFINITY;
      continue;
    }
    double dot = 0;
    for (int64_t i = 0; i < Dh; ++i) dot += double(qh[i]) * keys[size_t(j)][i];
    logits[size_t(j)] = float(dot) * scale;
  }
  if (!nm.official()) {
    logits[size_t(nk)] = sink;
    ops::softmax(logits.data(), nk + 1);
    for (int64_t i = 0; i < Dh; ++i) {
      double acc = 0;
      for (int64_t j = 0; j < nk; ++j)
        if (keys[size_t(j)]) acc += double(logits[size_t(j)]) * keys[size_t(j)][i];
      out[i] = float(acc);
    }
    return;
  }
  constexpr int64_t kBlock = official_math::kAttnBlock;
  float m_run = -INFINITY, l_run = 0;
  std::vector<double> acc(static_cast<size_t>(Dh), 0.0);
  std::vector<float> p(static_cast<size_t>(kBlock));
  for (int64_t b0 = 0; b0 < nk; b0 += kBlock) {
    const int64_t b1 = std::min(nk, b0 + kBlock);
    float m_new = m_run;
    for (int64_t j = b0; j < b1; ++j) m_new = std::max(m_new, logits[size_t(j)]);
    const float alpha = std::exp(m_run - m_new);
    float psum = 0;
    for (int64_t j = b0; j < b1; ++j) psum += (p[size_t(j - b0)] = std::exp(logits[size_t(j)] - m_new));
    l_run = std::fma(l_run, alpha, psum);
    for (int64_t i = 0; i < Dh; ++i) {
      double blk = 0;
      for (int64_t j = b0; j < b1; ++j)
        if (keys[size_t(j)]) blk += double(nm.act(p[size_t(j - b0)])) * keys[size_t(j)][i];
      acc[size_t(i)] = double(float(float(acc[size_t(i)]) * alpha) + float(blk));
    }
    m_run = m_new;
  }
  l_run += std::exp(sink - m_run);
  for (int64_t i = 0; i < Dh; ++i) out[i] = nm.act(float(acc[size_t(i)]) / l_run);
}

}  // namespace

bool indexer_skippable(const ModelConfig& c, int64_t rate, int64_t pos_end) {
  return rate > 0 && pos_end / rate <= c.index_topk;
}

IndexTensor all_entries_selection(const ModelConfig& c, int64_t n, int64_t pos0, int64_t rate, int64_t n_entries) {
  const int64_t k = std::min<int64_t>(c.index_topk, n_entries);
  IndexTensor sel({n, k}, -1);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t e = 0; e < std::min<int64_t>((pos0 + t + 1) / rate, k); ++e) sel[t * k + e] = e;
  return sel;
}

Tensor attention_forward(const AttentionWeights& w, const ModelConfig& c, AttnType type, const ops::Rope& rope,
                         const Tensor& x, int64_t pos0, LayerState& st, const ModelOptions& opt, const Numerics& nm,
                         const Tap& tap) {
  const int64_t n = x.dim(0), H = c.n_heads, Dh = c.head_dim, rd = rope.dim(), W = c.window;

  // Query: q_norm(wq_a x) -> wq_b -> per-head unweighted RMS -> RoPE on the last rd dims.
  Tensor qr = nm.proj(x, w.wq_a);
  nm.rms_norm(qr.ptr(), n, w.q_norm, c.rms_eps);
  Tensor q = nm.proj(qr, w.wq_b);  // [n, H * Dh]
  nm.head_rms(q.ptr(), n * H, Dh, c.rms_eps);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < H; ++h) nm.rope(rope, q.ptr() + (t * H + h) * Dh + (Dh - rd), pos0 + t);
  q.shape = {n, H, Dh};
  tap("attn.q", q);

  // Shared key/value: kv_norm(wkv x), RoPE on the last rd dims (official: FP8 simulation of the nope dims).
  Tensor kv = nm.proj(x, w.wkv);  // [n, Dh]
  nm.rms_norm(kv.ptr(), n, w.kv_norm, c.rms_eps);
  for (int64_t t = 0; t < n; ++t) {
    nm.rope(rope, kv.ptr() + t * Dh + (Dh - rd), pos0 + t);
    nm.kv_fp8_sim(kv.ptr() + t * Dh, Dh - rd);
  }
  tap("attn.kv", kv);

  // Window keys: the cached (window - 1) rows followed by this chunk.
  std::vector<float> keys(st.win_kv);
  std::vector<int64_t> key_pos(st.win_pos);
  keys.insert(keys.end(), kv.data.begin(), kv.data.end());
  for (int64_t t = 0; t < n; ++t) key_pos.push_back(pos0 + t);

  // Compressed entries (emitted by this chunk too: an entry is complete once its last source token is in).
  IndexTensor sel;
  const CompressorState& cs = st.comp;
  // indexer.skip_short: the CSA queries take every visible entry in entry order (HCA's key set) while the top-k
  // would select them all. The indexer's own keys are still compressed: later chunks need them.
  const bool all_entries = type == AttnType::CSA && opt.indexer_skip_short && indexer_skippable(c, w.indexer->comp.rate, pos0 + n);
  if (type != AttnType::Sliding) {
    compressor_step(*w.comp, rope, c.rms_eps, x, st.comp, nm, /*rotate=*/false);
    if (type == AttnType::CSA) {
      compressor_step(w.indexer->comp, rope, c.rms_eps, x, st.index_comp, nm, /*rotate=*/true);
      if (all_entries) {
        // The taps still show what the indexer stands for: its scores (computed for the tap only) and the
        // selection the attention takes (the same set as the top-k's, in entry order).
        if (tap.on("attn.indexer.scores"))
          tap("attn.indexer.scores", indexer_select(*w.indexer, c, rope, x, qr, pos0, st.index_comp, nm).scores);
        sel = all_entries_selection(c, n, pos0, w.indexer->comp.rate, st.index_comp.n_entries);
      } else {
        auto ix = indexer_select(*w.indexer, c, rope, x, qr, pos0, st.index_comp, nm);
        tap("attn.indexer.scores", ix.scores);
        sel = std::move(ix.topk);
      }
      tap.index("attn.indexer.topk", sel);
    }
  }

  const float scale = 1.0f / std::sqrt(float(Dh));
  Tensor o({n, H * Dh});
  std::vector<const float*> kset;
  for (int64_t t = 0; t < n; ++t) {
    const int64_t p = pos0 + t;
    kset.clear();
    for (size_t j = 0; j < key_pos.size(); ++j)
      if (key_pos[j] <= p && key_pos[j] > p - W) kset.push_back(keys.data() + j * Dh);
    // Official: the window as the official index list lays it out (official_math::window_slots; never fewer slots
    // than visible keys), which decides which keys share a block: holes after the newest key, before the entries,
    // while the window is not yet full.
    if (nm.official()) kset.resize(size_t(official_math::window_slots(pos0, n, W)), nullptr);
    if (type == AttnType::HCA) {
      const int64_t visible = std::min<int64_t>((p + 1) / w.comp->rate, cs.n_entries);
      for (int64_t e = 0; e < visible; ++e) kset.push_back(cs.entries.data() + e * Dh);
    } else if (type == AttnType::CSA) {
      for (int64_t j = 0; j < sel.dim(1); ++j)
        if (int64_t e = sel[t * sel.dim(1) + j]; e >= 0) kset.push_back(cs.entries.data() + e * Dh);
    }
    // Heads are independent (each its own softmax and sums): split over threads (core/parallel.h), the same bits.
    parallel_for(H, double(H) * double(kset.size()) * double(Dh) * 2, [&](int64_t ha, int64_t hb) {
      std::vector<float> logits;
      for (int64_t h = ha; h < hb; ++h) {
        float* oh = o.ptr() + (t * H + h) * Dh;
        attend(q.ptr() + (t * H + h) * Dh, kset, w.sink[h], scale, Dh, nm, logits, oh);
        // K = V, so the value carries rotation on its rope dims: undo it at the query position.
        nm.rope(rope, oh + (Dh - rd), p, /*inverse=*/true);
      }
    });
  }

  // Keep the last (window - 1) rows for the next call.
  const int64_t keep = std::min<int64_t>(W - 1, int64_t(key_pos.size()));
  st.win_pos.assign(key_pos.end() - keep, key_pos.end());
  st.win_kv.assign(keys.end() - keep * Dh, keys.end());

  // Grouped output projection: group g (heads [g*H/G, (g+1)*H/G)) -> wo_a rows [g*R, (g+1)*R); then wo_b.
  const int64_t G = c.o_groups, R = c.o_lora, gw = H * Dh / G;
  Tensor mid({n, G * R});
  for (int64_t g = 0; g < G; ++g) nm.proj_rows_bf16(o.ptr() + g * gw, n, H * Dh, w.wo_a, g * R, R, mid.ptr() + g * R, G * R);
  Tensor out = nm.proj(mid, w.wo_b);
  tap.io("attn.out", out);
  return out;
}

}  // namespace plumb
