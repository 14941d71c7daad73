// Attention on the GPU: sparse softmax attention with the sink over window + compressed keys, the window ring,
// the compressor's softmax pooling (the lightning indexer: fwd_indexer.cu). Twins of src/model/attention.cpp and
// compressor.cpp (fp64 dot products, the reference's softmax).
#include "cuda/attn_keys.cuh"
#include "cuda/official.cuh"

namespace plumb::cuda::detail {

namespace {

// Logits: block (t, h, split) takes every nsplit-th group of 8 keys; warp w its own key of the group: the fp64
// dot product q . k over Dh (lanes strided), times the scale. Holes get -inf.
constexpr int kAttnSplit = 8;
__global__ void attend_logits_kernel(AttendArgs a) {
  pdl_begin();
  const int th = blockIdx.x, t = th / a.Hq, lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const KeyList keys(a, t);
  const float* qh = a.q + int64_t(th) * a.Dh;
  float* out = a.logits + int64_t(th) * a.ld_logits;
  for (int64_t j = int64_t(blockIdx.y) * nwarps + wid; j < keys.count; j += int64_t(gridDim.y) * nwarps) {
    const float* k = keys.row(j);
    if (!k) {
      if (lane == 0) out[j] = -INFINITY;
      continue;
    }
    const float lg = key_logit(qh, k, a.Dh, a.scale);
    if (lane == 0) out[j] = lg;
  }
}

// Output: block (t, h, dim slice of 64): ops::softmax over the keys and the sink (which takes probability, gives
// no value): float exponentials, fp64 sum (thread-strided partials, the sink in thread 0's, then the block's fixed
// order), p = float(e / sum); the probabilities and key rows go to shared memory (a hole: p = 0 on a dummy row,
// which adds exactly nothing); then P.V for the slice: thread (g, d) sums keys j = g (mod 4) in fp64, kU rows loaded
// before their products, the four partials added in g order. A query with more keys than one round stages
// (AttendArgs::stage_keys, a multiple of kU * kAttnGroups) takes rounds of them: each thread's keys and their order
// are the same, so are the bits.
constexpr int kAttnDims = 64, kAttnGroups = 4;  // blockDim = kAttnDims * kAttnGroups
constexpr int kAttnU = 4;                       // rows loaded before their products
constexpr int64_t kAttnRound = kAttnU * kAttnGroups;
// The most keys one round stages: a row pointer and a probability each in 200 KiB of shared memory, whole rounds.
constexpr int64_t kAttnMaxStage = 200 * 1024 / (sizeof(float*) + sizeof(float)) / kAttnRound * kAttnRound;
__global__ void attend_out_kernel(AttendArgs a) {
  pdl_begin();
  extern __shared__ unsigned char attn_smem[];
  const int64_t stage = a.stage_keys;
  const float** rows = reinterpret_cast<const float**>(attn_smem);  // [stage]
  float* ps = reinterpret_cast<float*>(rows + stage);                // [stage]
  __shared__ float wmax[32];
  __shared__ double wsum[32];
  __shared__ double part[kAttnGroups][kAttnDims];
  const int th = blockIdx.x, t = th / a.Hq, h = th % a.Hq, lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const KeyList keys(a, t);
  const float* lg = a.logits + int64_t(th) * a.ld_logits;
  const float sink = a.sink[h];
  float m = threadIdx.x == 0 ? sink : -INFINITY;
  for (int64_t j = threadIdx.x; j < keys.count; j += blockDim.x) m = fmaxf(m, lg[j]);
  m = warp_max(m);
  if (lane == 0) wmax[wid] = m;
  __syncthreads();
  m = -INFINITY;
  for (int i = 0; i < nwarps; ++i) m = fmaxf(m, wmax[i]);
  double s = threadIdx.x == 0 ? double(expf(sink - m)) : 0.0;
  for (int64_t j = threadIdx.x; j < keys.count; j += blockDim.x) s += double(expf(lg[j] - m));
  s = block_sum(s, wsum);
  const int d = threadIdx.x % kAttnDims, g = threadIdx.x / kAttnDims;
  const int64_t dim = int64_t(blockIdx.y) * kAttnDims + d;
  double acc = 0;
  for (int64_t r0 = 0; r0 < keys.count; r0 += stage) {  // (one round unless the query has more keys than stage)
    const int64_t r1 = min(keys.count, r0 + stage);
    if (r0 > 0) __syncthreads();  // (the previous round's reads)
    for (int64_t j = r0 + threadIdx.x; j < r1; j += blockDim.x) {
      const float* k = keys.row(j);
      rows[j - r0] = k ? k : a.q;  // the dummy row: any Dh readable floats
      ps[j - r0] = k ? float(double(expf(lg[j] - m)) / s) : 0.0f;
    }
    __syncthreads();
    if (dim < a.Dh) {
      const int64_t last = r1 - r0 - 1;
      for (int64_t j0 = g; j0 <= last; j0 += kAttnRound) {
        float v[kAttnU];
#pragma unroll
        for (int u = 0; u < kAttnU; ++u) v[u] = rows[min(j0 + u * kAttnGroups, last)][dim];
#pragma unroll
        for (int u = 0; u < kAttnU; ++u) {
          const int64_t j = j0 + u * kAttnGroups;
          if (j <= last) acc += double(ps[j]) * v[u];
        }
      }
    }
  }
  part[g][d] = acc;
  __syncthreads();
  if (g == 0 && dim < a.Dh) {
    double o = part[0][d];
    for (int i = 1; i < kAttnGroups; ++i) o += part[i][d];
    a.out[int64_t(th) * a.Dh + dim] = float(o);
  }
}

// numerics.official (model/attention.cpp attend()): block (t, h, dim slice of 64), a thread per dim. Keys in blocks of
// 64: the block's max (a thread per key, then a max tree: max is exact and order-free), each key's probability
// p_j = exp(l_j - m_new) by its thread, then thread 0 the rescale alpha = exp(m_old - m_new), the probabilities'
// float sum in key order and l = fma(l, alpha, psum); each thread then sums bf16(p_j) * v_j[d] over the block in fp64
// (the key rows looked up once per block, a thread per key, and loaded 8 at a time) and folds it in as
// float(float(acc) * alpha) + float(blk). The sink joins the denominator at the end; the output is
// bf16. A hole (a -1 slot, or a window slot of KeyList's official layout) has p = 0 and adds nothing; the slots are
// the CPU's, so are the blocks. (AttendArgs::official_serial: thread 0 computes the max and the probabilities too, the one-thread twin the
// tests hold the parallel steps to, bit for bit.)
constexpr int kOffBlock = official_math::kAttnBlock;
__global__ void attend_out_official_kernel(AttendArgs a) {
  pdl_begin();
  __shared__ float pb[kOffBlock], pf[kOffBlock], mx[kOffBlock / 32];
  __shared__ const float* rp[kOffBlock];  // the key block's rows (null: a hole), one lookup per key
  __shared__ float alpha_s, m_new_s;
  const int th = blockIdx.x, t = th / a.Hq, h = th % a.Hq;
  const KeyList keys(a, t);
  const float* lg = a.logits + int64_t(th) * a.ld_logits;
  const int64_t dim = int64_t(blockIdx.y) * kOffBlock + threadIdx.x;
  const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5);
  float m_run = -INFINITY, l_run = 0;  // thread 0's
  double acc = 0;
  for (int64_t b0 = 0; b0 < keys.count; b0 += kOffBlock) {
    const int64_t b1 = min(keys.count, b0 + kOffBlock);
    rp[threadIdx.x] = b0 + threadIdx.x < b1 ? keys.row(b0 + threadIdx.x) : nullptr;  // (read after the barriers below)
    if (a.official_serial) {
      if (threadIdx.x == 0) {
        float m_new = m_run;
        for (int64_t j = b0; j < b1; ++j) m_new = fmaxf(m_new, lg[j]);
        const float alpha = expf(m_run - m_new);
        float psum = 0;
        for (int64_t j = b0; j < b1; ++j) {
          const float p = expf(lg[j] - m_new);
          psum = __fadd_rn(psum, p);
          pb[j - b0] = bf16r(p);
        }
        l_run = fmaf(l_run, alpha, psum);
        m_run = m_new;
        alpha_s = alpha;
      }
    } else {
      const int64_t j = b0 + threadIdx.x;
      const float lj = j < b1 ? lg[j] : -INFINITY;
      const float m = warp_max(lj);
      if (lane == 0) mx[warp] = m;
      __syncthreads();
      if (threadIdx.x == 0) {
        float m_new = m_run;
        for (int w = 0; w < kOffBlock / 32; ++w) m_new = fmaxf(m_new, mx[w]);
        m_new_s = m_new;
      }
      __syncthreads();
      const float m_new = m_new_s;
      if (j < b1) {
        const float p = expf(lj - m_new);
        pf[threadIdx.x] = p;
        pb[threadIdx.x] = bf16r(p);
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        const float alpha = expf(m_run - m_new);
        float psum = 0;
        for (int64_t i = 0; i < b1 - b0; ++i) psum = __fadd_rn(psum, pf[i]);
        l_run = fmaf(l_run, alpha, psum);
        m_run = m_new;
        alpha_s = alpha;
      }
    }
    __syncthreads();
    if (dim < a.Dh) {
      // In key order, as before; the loads of 8 keys issued together (they were one dependent round trip each).
      double blk = 0;
      const int nb = int(b1 - b0);
      for (int i0 = 0; i0 < nb; i0 += 8) {
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const float* k = i0 + u < nb ? rp[i0 + u] : nullptr;
          v[u] = k ? k[dim] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 8; ++u)
          if (i0 + u < nb && rp[i0 + u]) blk += double(pb[i0 + u]) * v[u];
      }
      acc = double(__fadd_rn(__fmul_rn(float(acc), alpha_s), float(blk)));
    }
    __syncthreads();
  }
  __shared__ float l_s;
  if (threadIdx.x == 0) l_s = __fadd_rn(l_run, expf(a.sink[h] - m_run));
  __syncthreads();
  if (dim < a.Dh) a.out[int64_t(th) * a.Dh + dim] = bf16r(__fdiv_rn(float(acc), l_s));
}

__global__ void ring_store_kernel(const float* kv, int n, int64_t Dh, const int64_t* pos, int64_t W, float* ring) {
  pdl_begin();
  const int64_t first = max(int64_t(0), int64_t(n) - W);  // only the last W rows can be needed later
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t rows = int64_t(n) - first;
  if (i >= rows * Dh) return;
  const int64_t r = first + i / Dh, d = i % Dh;
  ring[((*pos + r) % W) * Dh + d] = kv[r * Dh + d];
}

__global__ void ring_store_rows_kernel(const float* kv, int n, int64_t Dh, const int64_t* pos, int64_t W, float* const* rings) {
  pdl_begin();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(n) * Dh) return;
  const int64_t r = i / Dh, d = i % Dh;
  rings[r][(pos[r] % W) * Dh + d] = kv[i];
}

__global__ void comp_defer_kernel(const float* x, int64_t D, const int64_t* pos, int m, float* ring, int64_t back, int64_t* wpos) {
  pdl_begin();
  const int64_t p = *pos;
  if (blockIdx.x == 0 && threadIdx.x == 0) *wpos = p - back;
  if (!ring) return;
  float* row = ring + (p % m) * D;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < D; i += int64_t(gridDim.x) * blockDim.x) row[i] = x[i];
}

// The window that block row j handles: w = pos/m + j when it completes in this chunk, else -1.
__device__ __forceinline__ int64_t completed_window(const CompressArgs& a, int64_t pos0, int j) {
  const int64_t w = pos0 / a.m + j;
  return w < (pos0 + a.n) / a.m ? w : -1;
}

// Where slot s of window w's series lives: channel 0 of its gate, kv and ape rows (channel ch at + ch), and whether
// the gate already holds the ape (carried). The series is the previous window's first half (CSA, w > 0: slots
// [0, m)) and then the window's own slots (CSA: second half). Position p = v*m + r of window v is this chunk's row
// p - pos0 when p >= pos0, else pending ring row p % m = r, the slot's index in its window (no modulo). The previous
// window's series, once completed in an earlier chunk, was carried with its ape added (prev_gate, prev_kv).
struct SlotSrc {
  const float *g, *v, *ape;
  int carried;
};
__device__ __forceinline__ SlotSrc slot_src(const CompressArgs& a, int64_t pos0, int64_t w, int s) {
  const int m = a.m;
  const int64_t width = a.overlap ? 2 * a.c : a.c;
  const bool in_prev = a.overlap && w > 0 && s < m;
  const int r = a.overlap && w > 0 && !in_prev ? s - m : s;
  const int64_t p0 = (in_prev ? w - 1 : w) * m;  // the window's first position
  const int64_t at = int64_t(r) * width + (a.overlap && !in_prev ? a.c : 0);  // in ring and ape rows
  const bool fresh = p0 + r >= pos0;
  if (in_prev && w * m - 1 < pos0) return {a.prev_gate + int64_t(r) * a.c, a.prev_kv + int64_t(r) * a.c, a.ape + at, 1};
  return {fresh ? a.rows_gate + (p0 - pos0) * width + at : a.pend_gate + at, fresh ? a.rows_kv + (p0 - pos0) * width + at : a.pend_kv + at,
          a.ape + at, 0};
}
// Slot (gate + ape, kv) of channel ch. The loads' addresses do not depend on any load, so a caller can issue many
// slots' loads before using any.
__device__ __forceinline__ void slot_load(const SlotSrc& p, int64_t ch, float& g, float& v) {
  const float ape = p.ape[ch], gr = p.g[ch];
  g = p.carried ? gr : __fadd_rn(gr, ape);
  v = p.v[ch];
}
__device__ __forceinline__ void series_slot(const CompressArgs& a, int64_t pos0, int64_t w, int s, int64_t ch, float& g, float& v) {
  slot_load(slot_src(a, pos0, w, s), ch, g, v);
}

// The softmax-weighted sum of a window's slots with ops::softmax's arithmetic: the gates' max, an fp64 sum of
// exp(g - max), then the fp32 weighted sum in slot order. each(fold) calls fold(g, v) on every slot in slot order.
template <class Each>
__device__ __forceinline__ float softmax_pool(Each each) {
  float mx = -INFINITY, acc = 0;
  each([&](float g, float) { mx = fmaxf(mx, g); });
  if (mx == -INFINITY) return acc;
  double sum = 0;
  each([&](float g, float) { sum += double(expf(g - mx)); });
  each([&](float g, float v) { acc = __fadd_rn(acc, __fmul_rn(float(double(expf(g - mx)) / sum), v)); });
  return acc;
}

// The slots of window w's series: 2m with the previous window's (CSA, w > 0), else m.
__device__ __forceinline__ int series_slots(const CompressArgs& a, int64_t w) { return a.overlap && w > 0 ? 2 * a.m : a.m; }

// A window's pooled channel ch, slot s of its series at src(s) (s < ns). Series of at most kPoolRegSlots slots (the
// overlapping CSA compressor's 2m = 8) are loaded into registers once, every load in flight together; longer ones
// (HCA's 128) are read on each of the three passes in batches of kPoolBatch, every load of a batch issued before
// any is used (past the last slot a batch reloads it, unused: a guarded load would wait behind its branch). Session
// 37 measured the HCA pool's slot-by-slot loads, each behind a 64-bit modulo's call: ~150 us at 8 tokens and ~400
// us at one token under ncu. The kernels look the slots' sources up in a table in shared memory (SlotTable):
// computed per slot and pass, they cost more than the loads (session 38: the step that completes an HCA window at
// batch 8 took ~60 us longer).
constexpr int kPoolRegSlots = 8, kPoolBatch = 16;
template <class Src>
__device__ __forceinline__ float pool_channel(const Src& src, int ns, int64_t ch) {
  if (ns <= kPoolRegSlots) {
    float g[kPoolRegSlots], v[kPoolRegSlots];
#pragma unroll
    for (int s = 0; s < kPoolRegSlots; ++s) slot_load(src(min(s, ns - 1)), ch, g[s], v[s]);
    return softmax_pool([&](auto fold) {
#pragma unroll
      for (int s = 0; s < kPoolRegSlots; ++s)
        if (s < ns) fold(g[s], v[s]);
    });
  }
  return softmax_pool([&](auto fold) {
    for (int s0 = 0; s0 < ns; s0 += kPoolBatch) {
      float g[kPoolBatch], v[kPoolBatch];
#pragma unroll
      for (int k = 0; k < kPoolBatch; ++k) slot_load(src(min(s0 + k, ns - 1)), ch, g[k], v[k]);
#pragma unroll
      for (int k = 0; k < kPoolBatch; ++k)
        if (s0 + k < ns) fold(g[k], v[k]);
    }
  });
}

// The sources of the slots of window w's series, in shared memory, written by the whole block (ends with a barrier:
// every thread must call it). A series longer than kTableSlots (a compress ratio above 256, or 128 overlapping) is
// not tabled: its slots' sources are computed where they are loaded.
constexpr int kTableSlots = 256;
// The sources of slots [0, ns) of window w's series into t (ns <= kTableSlots), by the whole block; no barrier.
__device__ __forceinline__ void fill_slots(SlotSrc* t, const CompressArgs& a, int64_t pos0, int64_t w, int ns) {
  for (int s = int(threadIdx.x); s < ns; s += int(blockDim.x)) t[s] = slot_src(a, pos0, w, s);
}
struct SlotTable {
  SlotSrc* t;
  const CompressArgs& a;
  int64_t pos0, w;
  int ns;
  __device__ SlotTable(SlotSrc* table, const CompressArgs& args, int64_t p, int64_t win) : t(table), a(args), pos0(p), w(win), ns(series_slots(args, win)) {
    if (ns <= kTableSlots) fill_slots(t, a, pos0, w, ns);
    __syncthreads();
  }
  __device__ bool tabled() const { return ns <= kTableSlots; }
  __device__ float pool(int64_t ch) const {
    if (tabled()) return pool_channel([&](int s) -> const SlotSrc& { return t[s]; }, ns, ch);
    return pool_channel([&](int s) { return slot_src(a, pos0, w, s); }, ns, ch);
  }
};

__global__ void pool_kernel(CompressArgs a) {
  pdl_begin();
  __shared__ SlotSrc table[kTableSlots];
  const int64_t pos0 = *a.pos, w = completed_window(a, pos0, blockIdx.y);
  if (w < 0) return;  // (the whole block)
  const SlotTable slots(table, a, pos0, w);
  const int64_t ch = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (ch < a.c) a.entries[w * a.c + ch] = slots.pool(ch);
}

// One block of kFinishThreads (256, as the norm kernel, so the entry's norm sums alike) per completed window: RMSNorm
// and RoPE of its entry e (entries row w, or compress_one_kernel's copy in shared memory), in place, with the
// arithmetic of fwd_rms_norm and fwd_rope (the shared device functions).
constexpr int kFinishThreads = 256;
__device__ __forceinline__ void finish_entry(const CompressArgs& a, int64_t w, float* e) {
  __shared__ double sh[32];
  // numerics.official: the pooled entry, the normed entry and its rotated dims stored as bf16 (Numerics::act,
  // rms_norm, rope), then the indexer rotation or the FP8 KV simulation of the nope dims.
  if (a.official) {
    for (int64_t i = threadIdx.x; i < a.c; i += blockDim.x) e[i] = bf16r(e[i]);
    __syncthreads();
  }
  rms_norm_row<2>(e, a.c, a.norm, a.eps, sh);  // (2 elements per thread at V4's 512 channels: less code, cold here)
  __syncthreads();
  if (a.official) {
    for (int64_t i = threadIdx.x; i < a.c; i += blockDim.x) e[i] = bf16r(e[i]);
    __syncthreads();
  }
  const int64_t off = a.c - 2 * a.rope_half;
  for (int k = threadIdx.x; k < a.rope_half; k += blockDim.x) {
    rope_pair(e + off + 2 * k, w * a.m, a.inv_freq[k], a.attention_factor, 0);
    if (a.official) e[off + 2 * k] = bf16r(e[off + 2 * k]), e[off + 2 * k + 1] = bf16r(e[off + 2 * k + 1]);
  }
  if (!a.official) return;
  __syncthreads();
  __shared__ float y[kHadamardMax];
  if (a.rotate) indexer_rotate_row(e, a.c, y);
  else if (a.kv_fp8) fp8_roundtrip_row(e, off, official_math::kKvBlock);
}
__global__ void compress_finish_kernel(CompressArgs a) {
  pdl_begin();
  const int64_t w = completed_window(a, *a.pos, blockIdx.x);
  if (w < 0) return;
  finish_entry(a, w, a.entries + w * a.c);
}

// CSA: the last completed window's first-half series (gate + ape) becomes the next chunk's previous window: slot
// r < m of window last + 1's series. Runs before stash, which may overwrite pending rows this reads.
__device__ __forceinline__ void carry_elem(const CompressArgs& a, int64_t pos0, int i) {
  const int64_t last = (pos0 + a.n) / a.m - 1;
  const int c = int(a.c);
  if (last < pos0 / a.m || i >= a.m * c) return;  // no window completed in this chunk
  series_slot(a, pos0, last + 1, i / c, i % c, a.prev_gate[i], a.prev_kv[i]);
}
__global__ void compress_carry_kernel(CompressArgs a) {
  pdl_begin();
  carry_elem(a, *a.pos, int(blockIdx.x * blockDim.x + threadIdx.x));
}

// The rows of the incomplete window (positions from the last window boundary `base`, and from pos0, to pos0 + n)
// into the pending ring: position q to ring row q % m = q - base.
__device__ __forceinline__ void stash_elem(const CompressArgs& a, int64_t pos0, int i, int rows_bound) {
  const int width = int(a.overlap ? 2 * a.c : a.c);
  if (i >= rows_bound * width) return;
  const int64_t end = pos0 + a.n, base = end / a.m * a.m, q = max(pos0, base) + i / width;
  if (q >= end) return;
  const int ch = i % width;
  a.pend_kv[(q - base) * width + ch] = a.rows_kv[(q - pos0) * width + ch];
  a.pend_gate[(q - base) * width + ch] = a.rows_gate[(q - pos0) * width + ch];
}
__global__ void compress_stash_kernel(CompressArgs a, int rows_bound) {
  pdl_begin();
  stash_elem(a, *a.pos, int(blockIdx.x * blockDim.x + threadIdx.x), rows_bound);
}

// Elements [0, ns * c) of the slots src[0, ns) (slot i / c, channel i % c) as (gate + ape, kv) into dg[i], dv[i],
// kGatherU of each thread's elements loaded before any is stored: 16, every element of CSA's 8 slots of 512
// channels over the block's 256 threads in one round of loads (4 took four dependent rounds on the window step's
// chain; a smaller series reloads its last element, unused).
constexpr int kGatherU = 16;
__device__ __forceinline__ void gather_slots(const SlotSrc* src, int ns, int c, float* dg, float* dv) {
  const int n = ns * c, bd = int(blockDim.x);
  for (int i0 = int(threadIdx.x); i0 < n; i0 += kGatherU * bd) {
    float g[kGatherU], v[kGatherU];
#pragma unroll
    for (int u = 0; u < kGatherU; ++u) {
      const int i = min(i0 + u * bd, n - 1), sl = i / c;
      slot_load(src[sl], i - sl * c, g[u], v[u]);
    }
#pragma unroll
    for (int u = 0; u < kGatherU; ++u)
      if (i0 + u * bd < n) dg[i0 + u * bd] = g[u], dv[i0 + u * bd] = v[u];
  }
}

// One token (decode): the pool, finish and carry of the window this token completes, or else its row into the
// pending ring, in one block of kFinishThreads (so the norm sums alike): the four launches' arithmetic in their
// order, one launch instead of up to four. (Their launches were most of the CSA layer's side stream, which the
// query path waits for before the indexer: `h200-session10/ncu-step-b1-plain.txt`.) A whole-window chunk
// (a.whole_window: n == m rows from a window boundary, cuda.comp_deferred's) always completes its window and leaves
// no row pending, so it runs the completing path alike.
// One block runs it once per layer and step, so its code is cold: under ncu (session 38) the completing step's
// launch took 35-41 us, two thirds of its warps' time waiting for instructions (no_inst), with ~3500 instructions
// per warp of unrolled slot loads and pooling. So the completing path stages the window's slots in shared memory
// (a table of the slots' rows, then one short loop of loads) and pools from there in plain loops.
constexpr int kStageC = 512;  // channels staged in shared memory (V4's head and indexer dims: 512, 128)
// kRows (cuda.batch_rows, CompressArgs::rows): a block per row, each stepping its own session (a compile-time form,
// so that the one-session launch keeps its arguments where they are instead of a local copy it could rewrite).
template <bool kRows>
__global__ void __launch_bounds__(kFinishThreads) compress_one_kernel(CompressArgs a) {
  pdl_begin();
  if constexpr (kRows) {  // block r steps row r's session (its own token, position and state)
    const int64_t r = blockIdx.x, width = a.overlap ? 2 * a.c : a.c;
    const CompCaches k = a.rows[r];
    a.pend_kv = k.pend_kv, a.pend_gate = k.pend_gate, a.prev_kv = k.prev_kv, a.prev_gate = k.prev_gate, a.entries = k.entries;
    a.pos += r, a.rows_kv += r * width, a.rows_gate += r * width, a.n = 1;
  }
  const int64_t pos0 = *a.pos, w = completed_window(a, pos0, 0);
  const int bd = int(blockDim.x), tid = int(threadIdx.x), c = int(a.c);
  if (w < 0) {  // this token's row into ring row pos0 % m
    const int width = a.overlap ? 2 * c : c;
    const int64_t dst = (pos0 - pos0 / a.m * a.m) * width;  // (the division completed_window made)
    constexpr int kU = 8;
    for (int i0 = tid; i0 < width; i0 += kU * bd) {
      float kv[kU], g[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int i = min(i0 + u * bd, width - 1);
        kv[u] = a.rows_kv[i], g[u] = a.rows_gate[i];
      }
#pragma unroll
      for (int u = 0; u < kU; ++u)
        if (i0 + u * bd < width) a.pend_kv[dst + i0 + u * bd] = kv[u], a.pend_gate[dst + i0 + u * bd] = g[u];
    }
    return;
  }
  __shared__ SlotSrc table[kTableSlots];
  __shared__ float sg[kPoolRegSlots * kStageC], sv[kPoolRegSlots * kStageC];
  // The entry is pooled, normed and rotated in shared memory (up to kStageC channels), then stored once: its norm
  // and RoPE read it back twice, each an L2 round trip on the window step's chain when it lived in `entries`.
  __shared__ __align__(16) float se[kStageC];
  float* const e = c <= kStageC ? se : a.entries + w * c;
  {
    const SlotTable slots(table, a, pos0, w);
    if (slots.ns <= kPoolRegSlots && c <= kStageC) {
      gather_slots(table, slots.ns, c, sg, sv);
      __syncthreads();
      for (int ch = tid; ch < c; ch += bd)
        e[ch] = softmax_pool([&](auto fold) {
#pragma unroll 1
          for (int s = 0; s < slots.ns; ++s) fold(sg[s * c + ch], sv[s * c + ch]);
        });
    } else {
      for (int ch = tid; ch < c; ch += bd) e[ch] = slots.pool(ch);
    }
  }
  __syncthreads();  // the pooled entry, and every read of the previous window's series (carry rewrites it)
  finish_entry(a, w, e);
  if (e == se) {
    __syncthreads();  // (the entry's last writes: RoPE's pairs, or the official rotation's)
    for (int ch = tid; ch < c; ch += bd) a.entries[w * c + ch] = se[ch];
  }
  if (!a.overlap) return;  // (No stash: the token ends its window, so no row of an incomplete one remains.)
  if (a.m <= kTableSlots) {  // window w's first-half series: slots [0, m) of window w + 1's
    __syncthreads();  // (the table's readers are done)
    fill_slots(table, a, pos0, w + 1, a.m);
    __syncthreads();
    gather_slots(table, a.m, c, a.prev_gate, a.prev_kv);
  } else {
    for (int i = tid; i < a.m * c; i += bd) carry_elem(a, pos0, i);
  }
}

}  // namespace

void fwd_attend(const AttendArgs& a, Stream s) {
  if (a.type_rows) throw_arg("attention: per-row types (AttendArgs::type_rows) are the split-K kernel's");
  if (a.wait.sync) throw_arg("attention: in-kernel branch waits (AttendArgs::wait) are the split-K launch's only");
  if (a.n <= 0) return;
  if (a.out_inv_freq) throw_arg("attention: the fused output rotation (AttendArgs::out_inv_freq) is split-K only");
  if (a.ring_rows) throw_arg("attention: rows of several sessions (AttendArgs::ring_rows) are split-K only");
  if (a.ld_logits < a.window + (a.type == 2 ? a.ne : a.type == 1 ? a.ksel : 0)) throw_arg("attention: logits scratch too narrow");
  // Checked before the first launch: a refused call must leave nothing in flight (nor half a captured graph).
  if (!a.official && (a.stage_keys < 0 || a.stage_keys % kAttnRound || a.stage_keys > kAttnMaxStage))
    throw_arg("attention: stage_keys " + std::to_string(a.stage_keys) + " is not a multiple of 16 in [0, " +
              std::to_string(kAttnMaxStage) + "]");
  const unsigned rows = unsigned(a.n * a.Hq);
  launch("fwd_attend_logits", attend_logits_kernel, dim3(rows, kAttnSplit), 256, 0, s, a);
  if (a.official) {
    launch("fwd_attend_out_official", attend_out_official_kernel, dim3(rows, unsigned(fwd_blocks(a.Dh, kOffBlock))), kOffBlock,
           0, s, a);
    return;
  }
  AttendArgs b = a;  // (0: the query's keys, whole rounds, at most kAttnMaxStage)
  if (b.stage_keys == 0) b.stage_keys = std::min(kAttnMaxStage, std::max(kAttnRound, (a.ld_logits + kAttnRound - 1) / kAttnRound * kAttnRound));
  const size_t smem = size_t(b.stage_keys) * (sizeof(float*) + sizeof(float));
  if (smem > 48 * 1024) {
    static bool raised = false;  // per process: the attribute is per kernel
    if (!raised) {
      PLUMB_CUDA_CHECK(cudaFuncSetAttribute(attend_out_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
      raised = true;
    }
  }
  launch("fwd_attend_out", attend_out_kernel, dim3(rows, unsigned(fwd_blocks(a.Dh, kAttnDims))), kAttnDims * kAttnGroups, smem,
         s, b);
}

void fwd_ring_store(const float* chunk_kv, int n, int64_t Dh, const int64_t* pos, int64_t window, float* ring, Stream s) {
  const int64_t rows = std::min<int64_t>(n, window);
  if (rows <= 0) return;
  launch("fwd_ring_store", ring_store_kernel, fwd_blocks(rows * Dh, 256), 256, 0, s, chunk_kv, n, Dh, pos, window,
         ring);
}

void fwd_ring_store_rows(const float* kv, int n, int64_t Dh, const int64_t* pos, int64_t window, float* const* rings, Stream s) {
  if (n <= 0) return;
  launch("fwd_ring_store_rows", ring_store_rows_kernel, fwd_blocks(int64_t(n) * Dh, 256), 256, 0, s, kv, n, Dh, pos, window, rings);
}

void fwd_comp_defer(const float* x, int64_t D, const int64_t* pos, int m, float* ring, int64_t back, int64_t* wpos, Stream s) {
  launch("fwd_comp_defer", comp_defer_kernel, ring ? fwd_blocks(D, 256) : 1, 256, 0, s, x, D, pos, m, ring, back, wpos);
}

void fwd_compress(const CompressArgs& a, Stream s) {
  if (a.n <= 0) return;
  if (a.official && a.rotate && a.c > kHadamardMax) throw_arg("compressor: indexer rows longer than 1024 values are not supported on the GPU");
  if (a.rows) {  // forward_batch's rows: the one-token step per block
    if (a.whole_window || !a.one_launch) throw_arg("compressor: a batch of sessions' rows takes the one-token launch only");
    launch("fwd_compress (one token per session)", compress_one_kernel<true>, unsigned(a.n), kFinishThreads, 0, s, a);
    return;
  }
  if (a.whole_window && a.n != a.m) throw_arg("compressor: a whole-window chunk of " + std::to_string(a.n) + " rows, window " + std::to_string(a.m));
  if (a.one_launch && (a.n == 1 || a.whole_window)) {  // (nw_max <= 1 at one token; exactly 1 for a whole window)
    launch(a.n == 1 ? "fwd_compress (one token)" : "fwd_compress (one window)", compress_one_kernel<false>, 1, kFinishThreads, 0, s, a);
    return;
  }
  if (a.nw_max > 0) {
    launch("fwd_compress_pool", pool_kernel, dim3(unsigned(fwd_blocks(a.c, 128)), unsigned(a.nw_max)), 128, 0, s, a);
    launch("fwd_compress_finish", compress_finish_kernel, unsigned(a.nw_max), kFinishThreads, 0, s, a);
    if (a.overlap) {
      launch("fwd_compress_carry", compress_carry_kernel, fwd_blocks(int64_t(a.m) * a.c, 256), 256, 0, s, a);
    }
  }
  // At most min(n, m - 1) rows stay pending.
  const int64_t rows = std::min<int64_t>(a.n, a.m - 1), width = a.overlap ? 2 * a.c : a.c;
  if (rows <= 0) return;
  launch("fwd_compress_stash", compress_stash_kernel, fwd_blocks(rows * width, 256), 256, 0, s, a, int(rows));
}

}  // namespace plumb::cuda::detail
