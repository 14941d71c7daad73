// Attention sublayer on the GPU (twin of src/model/attention.cpp, compressor.cpp, indexer.cpp): query and KV
// paths, the CSA/HCA compressors with their device caches, the lightning indexer, sparse attention with the
// sink, the grouped output projection. Shapes: x [n, D] (attn_norm-ed), out [n, D].
#ifdef PLUMB_WITH_CUDA
#include "cuda/gpu_attention.h"

#include <cmath>
#include <optional>

namespace plumb::cuda {

using namespace detail;

namespace {

// Appends this chunk's compressor rows to the pending ones and emits every completed window as an entry
// (pooled, RMS-normed, rotated at position entry * m). Returns the number emitted.
int64_t compressor_step(const GpuComp& w, const GpuRope& rope, double eps, const float* x, int n, GpuCompState& st, Scratch& sc) {
  const int64_t m = w.rate, c = w.dim, width = w.overlap ? 2 * c : c;
  const size_t row_bytes = size_t(width) * 4;
  grow_keep(st.pend_kv, size_t(st.pending + n) * row_bytes, size_t(st.pending) * row_bytes);
  grow_keep(st.pend_gate, size_t(st.pending + n) * row_bytes, size_t(st.pending) * row_bytes);
  float* pkv = st.pend_kv.as<float>();
  float* pg = st.pend_gate.as<float>();
  const int64_t D = w.wkv.d.cols;
  linear(w.wkv, x, n, D, pkv + st.pending * width, width, sc);
  linear(w.wgate, x, n, D, pg + st.pending * width, width, sc);
  const int64_t total = st.pending + n, nw = total / m;
  if (nw > 0) {
    grow_keep(st.entries, size_t(st.n_entries + nw) * size_t(c) * 4, size_t(st.n_entries) * size_t(c) * 4);
    if (w.overlap && !st.prev_kv.get()) {
      st.prev_kv = DeviceBuffer(size_t(m * c) * 4);
      st.prev_gate = DeviceBuffer(size_t(m * c) * 4);
    }
    float* out = st.entries.as<float>() + st.n_entries * c;
    PoolArgs a;
    a.pend_kv = pkv;
    a.pend_gate = pg;
    a.ape = f32(w.ape);
    a.prev_kv = st.prev_kv.as<float>();
    a.prev_gate = st.prev_gate.as<float>();
    a.has_prev = st.has_prev;
    a.overlap = w.overlap;
    a.nw = int(nw);
    a.m = int(m);
    a.c = c;
    a.entries = out;
    fwd_compress_pool(a, nullptr);
    fwd_rms_norm(out, nw, c, c, f32(w.norm), eps, nullptr);
    rope.apply(out, nw, c, c - rope.dim, st.n_entries * m, 1, m, false);
    if (w.overlap) st.has_prev = true;
    st.n_entries += nw;
    const int64_t rem = total - nw * m;  // < m rows, and nw * m >= m: source and destination never overlap
    if (rem > 0) {
      copy_d2d(pkv, pkv + nw * m * width, size_t(rem) * row_bytes);
      copy_d2d(pg, pg + nw * m * width, size_t(rem) * row_bytes);
    }
    st.pending = rem;
  } else {
    st.pending = total;
  }
  return nw;
}

}  // namespace

void gpu_attention(const GpuAttn& w, const ModelConfig& c, AttnType type, const GpuRope& rope, const float* x, int n, int64_t pos0,
                   GpuLayerState& st, Scratch& sc, const Tap& tap, float* out) {
  const int64_t D = c.hidden, H = c.n_heads, Dh = c.head_dim, rd = rope.dim, W = c.window, QL = c.q_lora;

  OpTimer& tm = sc.timer;
  std::optional<OpRegion> region(std::in_place, tm, "attn.q_kv");
  // Query: q_norm(wq_a x) -> wq_b -> per-head unweighted RMS -> RoPE on the last rd dims.
  float* qr = sc.f("attn.qr", n * QL);
  linear(w.wq_a, x, n, D, qr, QL, sc);
  fwd_rms_norm(qr, n, QL, QL, f32(w.q_norm), c.rms_eps, nullptr);
  float* q = sc.f("attn.q", n * H * Dh);
  linear(w.wq_b, qr, n, QL, q, H * Dh, sc);
  fwd_rms_norm(q, n * H, Dh, Dh, nullptr, c.rms_eps, nullptr);
  rope.apply(q, n * H, Dh, Dh - rd, pos0, H, 1, false);
  tap_put(tap, "attn.q", q, {n, H, Dh});

  // Shared key/value row: kv_norm(wkv x), RoPE on the last rd dims.
  float* kv = sc.f("attn.kv", n * Dh);
  linear(w.wkv, x, n, D, kv, Dh, sc);
  fwd_rms_norm(kv, n, Dh, Dh, f32(w.kv_norm), c.rms_eps, nullptr);
  rope.apply(kv, n, Dh, Dh - rd, pos0, 1, 1, false);
  tap_put(tap, "attn.kv", kv, {n, Dh});

  AttendArgs a;
  a.type = type == AttnType::Sliding ? 0 : type == AttnType::CSA ? 1 : 2;
  int64_t max_keys = std::min<int64_t>(W, pos0 + n);
  region.emplace(tm, "attn.compressor");
  if (type != AttnType::Sliding) {
    compressor_step(*w.comp, rope, c.rms_eps, x, n, st.comp, sc);
    a.entries = st.comp.entries.as<float>();
    a.ne = st.comp.n_entries;
    a.rate = w.comp->rate;
    if (type == AttnType::HCA) max_keys += a.ne;
  }
  if (type == AttnType::CSA) {
    compressor_step(*w.icomp, rope, c.rms_eps, x, n, st.icomp, sc);
    region.emplace(tm, "attn.indexer");
    const int64_t nh = c.index_heads, dh = c.index_head_dim, ne = st.icomp.n_entries;
    float* iq = sc.f("attn.index.q", n * nh * dh);
    linear(w.iwq_b, qr, n, QL, iq, nh * dh, sc);
    rope.apply(iq, n * nh, dh, dh - rd, pos0, nh, 1, false);
    float* hw = sc.f("attn.index.w", n * nh);
    linear(w.iweights, x, n, D, hw, nh, sc);
    IndexArgs ia;
    ia.q = iq;
    ia.keys = st.icomp.entries.as<float>();
    ia.hw = hw;
    ia.n = n;
    ia.nh = int(nh);
    ia.k = int(std::min<int64_t>(c.index_topk, ne));
    ia.dh = dh;
    ia.ne = ne;
    ia.pos0 = pos0;
    ia.rate = w.icomp->rate;
    ia.qscale = 1.0f / std::sqrt(float(dh));
    ia.wscale = 1.0f / std::sqrt(float(nh));
    ia.scores = sc.f("attn.index.scores", n * ne);
    ia.topk = static_cast<int64_t*>(sc.get("attn.index.topk", size_t(n) * size_t(std::max(ia.k, 1)) * 8));
    fwd_indexer(ia, nullptr);
    tap_put(tap, "attn.indexer.scores", ia.scores, {n, ne});
    if (tap.on("attn.indexer.topk")) {
      IndexTensor sel({n, int64_t(ia.k)});
      if (sel.numel()) d2h(sel.ptr(), ia.topk, size_t(sel.numel()) * 8);
      tap.index("attn.indexer.topk", sel);
    }
    a.sel = ia.topk;
    a.ksel = ia.k;
    max_keys += ia.k;
  }

  region.emplace(tm, "attn.core");
  float* o = sc.f("attn.o", n * H * Dh);
  a.q = q;
  a.chunk_kv = kv;
  a.ring = st.ring.as<float>();
  a.sink = f32(w.sink);
  a.n = n;
  a.Hq = int(H);
  a.Dh = Dh;
  a.pos0 = pos0;
  a.window = W;
  a.scale = 1.0f / std::sqrt(float(Dh));
  a.out = o;
  fwd_attend(a, max_keys, nullptr);
  // K = V, so each output carries the keys' rotation on its rope dims: undo it at the query's position.
  rope.apply(o, n * H, Dh, Dh - rd, pos0, H, 1, true);
  fwd_ring_store(kv, n, Dh, pos0, W, st.ring.as<float>(), nullptr);

  region.emplace(tm, "attn.out_proj");
  // Grouped output projection: heads of group g -> wo_a rows [g*R, (g+1)*R); then wo_b.
  const int64_t G = c.o_groups, R = c.o_lora, gw = H * Dh / G;
  float* mid = sc.f("attn.mid", n * G * R);
  if (w.wo_a.fp8 && R % 128 == 0)
    fp8_linear_grouped(*w.wo_a.fp8, int(G), o, cuda::Act::F32, n, mid, sc.ws);
  else
    for (int64_t g = 0; g < G; ++g) fwd_linear(w.wo_a.d, o + g * gw, n, H * Dh, g * R, R, mid + g * R, G * R, nullptr);
  linear(w.wo_b, mid, n, G * R, out, D, sc);
  region.reset();
  tap_io(tap, "attn.out", out, {n, D});
}

}  // namespace plumb::cuda
#endif  // PLUMB_WITH_CUDA
