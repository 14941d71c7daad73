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
// before their products, the four partials added in g order.
constexpr int kAttnDims = 64, kAttnGroups = 4;  // blockDim = kAttnDims * kAttnGroups
__global__ void attend_out_kernel(AttendArgs a) {
  pdl_begin();
  extern __shared__ unsigned char attn_smem[];
  const float** rows = reinterpret_cast<const float**>(attn_smem);  // [ld_logits]
  float* ps = reinterpret_cast<float*>(rows + a.ld_logits);          // [ld_logits]
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
  for (int64_t j = threadIdx.x; j < keys.count; j += blockDim.x) {
    const float* k = keys.row(j);
    rows[j] = k ? k : a.q;  // the dummy row: any Dh readable floats
    ps[j] = k ? float(double(expf(lg[j] - m)) / s) : 0.0f;
  }
  __syncthreads();
  const int d = threadIdx.x % kAttnDims, g = threadIdx.x / kAttnDims;
  const int64_t dim = int64_t(blockIdx.y) * kAttnDims + d;
  double acc = 0;
  if (dim < a.Dh) {
    constexpr int kU = 4;
    const int64_t last = keys.count - 1;
    for (int64_t j0 = g; j0 < keys.count; j0 += kU * kAttnGroups) {
      float v[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) v[u] = rows[min(j0 + u * kAttnGroups, last)][dim];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int64_t j = j0 + u * kAttnGroups;
        if (j < keys.count) acc += double(ps[j]) * v[u];
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

// Row q of the compressor's timeline (see CompressArgs): this chunk's projection, or a pending row of the ring.
struct CompRows {
  const CompressArgs& a;
  int64_t pos0, width;
  __device__ const float* kv(int64_t q) const { return q >= pos0 ? a.rows_kv + (q - pos0) * width : a.pend_kv + (q % a.m) * width; }
  __device__ const float* gate(int64_t q) const {
    return q >= pos0 ? a.rows_gate + (q - pos0) * width : a.pend_gate + (q % a.m) * width;
  }
};

// The window that block row j handles: w = pos/m + j when it completes in this chunk, else -1.
__device__ __forceinline__ int64_t completed_window(const CompressArgs& a, int64_t pos0, int j) {
  const int64_t w = pos0 / a.m + j;
  return w < (pos0 + a.n) / a.m ? w : -1;
}

// The softmax-weighted sum of slots [0, ns), at(s, g, v) giving slot s's gate and value: the gates' max, an fp64 sum
// of exp(g - max), then the fp32 weighted sum in slot order (ops::softmax's arithmetic). N > 0: ns <= N and the loops
// unrolled over N, so that `at` may index registers; N = 0: plain loops (at is then called once per slot and pass).
template <int N, class At>
__device__ __forceinline__ float softmax_pool(int ns, At at) {
  constexpr int U = N > 0 ? N : 1;
  const int bound = N > 0 ? N : ns;
  float mx = -INFINITY, g, v, acc = 0;
#pragma unroll U
  for (int s = 0; s < bound; ++s)
    if (s < ns) at(s, g, v), mx = fmaxf(mx, g);
  if (mx != -INFINITY) {
    double sum = 0;
#pragma unroll U
    for (int s = 0; s < bound; ++s)
      if (s < ns) at(s, g, v), sum += double(expf(g - mx));
#pragma unroll U
    for (int s = 0; s < bound; ++s)
      if (s < ns) {
        at(s, g, v);
        const float wt = float(double(expf(g - mx)) / sum);
        acc = __fadd_rn(acc, __fmul_rn(wt, v));
      }
  }
  return acc;
}

// softmax_pool's arithmetic (the same operations in the same order) for long windows read from memory: each pass
// loads its slots in batches of kPoolBatch, every load of a batch issued before any is used (ld: branch-free
// addresses, no calls; past the last slot the batch reloads it, unused, since a guarded load waits behind its
// branch), then folds them in slot order. softmax_pool<0> through CompRows on an HCA window (128 slots, 3 passes)
// waited on ~400 dependent memory round trips per channel (each behind a 64-bit modulo's call): the pool took
// ~150 us at batch 8 under ncu and the step that completes an HCA window ~190 us longer in graph replay (session
// 37, `plumb bench --layers` steps_us); at one token, two channels per thread, ~400 us.
constexpr int kPoolBatch = 16;
template <class Ld>
__device__ __forceinline__ float softmax_pool_batched(int ns, Ld ld) {
  float mx = -INFINITY, acc = 0;
  for (int s0 = 0; s0 < ns; s0 += kPoolBatch) {
    float g[kPoolBatch], v[kPoolBatch];
#pragma unroll
    for (int k = 0; k < kPoolBatch; ++k) ld(min(s0 + k, ns - 1), g[k], v[k]);  // unguarded: all in flight
#pragma unroll
    for (int k = 0; k < kPoolBatch; ++k)
      if (s0 + k < ns) mx = fmaxf(mx, g[k]);
  }
  if (mx == -INFINITY) return acc;
  double sum = 0;
  for (int s0 = 0; s0 < ns; s0 += kPoolBatch) {
    float g[kPoolBatch], v[kPoolBatch];
#pragma unroll
    for (int k = 0; k < kPoolBatch; ++k) ld(min(s0 + k, ns - 1), g[k], v[k]);  // unguarded: all in flight
#pragma unroll
    for (int k = 0; k < kPoolBatch; ++k)
      if (s0 + k < ns) sum += double(expf(g[k] - mx));
  }
  for (int s0 = 0; s0 < ns; s0 += kPoolBatch) {
    float g[kPoolBatch], v[kPoolBatch];
#pragma unroll
    for (int k = 0; k < kPoolBatch; ++k) ld(min(s0 + k, ns - 1), g[k], v[k]);  // unguarded: all in flight
#pragma unroll
    for (int k = 0; k < kPoolBatch; ++k)
      if (s0 + k < ns) {
        const float wt = float(double(expf(g[k] - mx)) / sum);
        acc = __fadd_rn(acc, __fmul_rn(wt, v[k]));
      }
  }
  return acc;
}

// One thread per (window, channel). Series of window w: optionally the previous window's first half, then its own
// (CSA: second half), pooled by softmax_pool. Windows of at most kPoolRegSlots slots (the overlapping CSA
// compressor's 2m = 8) are loaded into registers first, every slot once with all loads in flight together; longer
// ones (HCA) are read from memory on each of the three passes.
constexpr int kPoolRegSlots = 8;
__device__ __forceinline__ void pool_channel(const CompressArgs& a, int64_t pos0, int64_t w, int64_t ch) {
  const int64_t width = a.overlap ? 2 * a.c : a.c, off = a.overlap ? a.c : 0;
  const CompRows rows{a, pos0, width};
  const int m = a.m;
  const bool prev = a.overlap && w > 0;
  const bool prev_stored = (w - 1) * m + m - 1 < pos0;  // window w-1 completed in an earlier chunk
  auto slot = [&](int s, float& g, float& v) {
    if (prev && s < m) {
      if (prev_stored) {
        g = a.prev_gate[int64_t(s) * a.c + ch];
        v = a.prev_kv[int64_t(s) * a.c + ch];
      } else {
        const int64_t q = (w - 1) * m + s;
        g = __fadd_rn(rows.gate(q)[ch], a.ape[int64_t(s) * width + ch]);
        v = rows.kv(q)[ch];
      }
      return;
    }
    const int r = prev ? s - m : s;
    const int64_t q = w * m + r;
    g = __fadd_rn(rows.gate(q)[off + ch], a.ape[int64_t(r) * width + off + ch]);
    v = rows.kv(q)[off + ch];
  };
  const int ns = prev ? 2 * m : m;
  if (ns <= kPoolRegSlots) {
    float gs[kPoolRegSlots], vs[kPoolRegSlots];
#pragma unroll
    for (int s = 0; s < kPoolRegSlots; ++s)
      if (s < ns) slot(s, gs[s], vs[s]);
    a.entries[w * a.c + ch] = softmax_pool<kPoolRegSlots>(ns, [&](int s, float& g, float& v) { g = gs[s], v = vs[s]; });
  } else if (!prev) {  // a long window without the previous one's series (HCA): batched, branch-free loads
    // Slot s is position w * m + s: this chunk's row w * m + s - pos0 from slot `fresh` on, else pending row s (the
    // ring's (w * m + s) % m; CompRows's 64-bit modulo is a call, which no load may pass, so it is not used here).
    const float* ape = a.ape + off + ch;
    const int64_t fresh = pos0 - w * m;
    const float* new_kv = a.rows_kv + (w * m - pos0) * width + off + ch;  // + s * width: row s - fresh
    const float* new_gate = a.rows_gate + (w * m - pos0) * width + off + ch;
    a.entries[w * a.c + ch] = softmax_pool_batched(ns, [&](int s, float& g, float& v) {
      const int64_t at = int64_t(s) * width;
      const bool is_new = s >= fresh;  // (the pointers are selected, then read: a valid address either way)
      const float* gp = is_new ? new_gate + at : a.pend_gate + at + off + ch;
      const float* kp = is_new ? new_kv + at : a.pend_kv + at + off + ch;
      g = __fadd_rn(*gp, ape[at]);
      v = *kp;
    });
  } else {
    a.entries[w * a.c + ch] = softmax_pool<0>(ns, slot);
  }
}
__global__ void pool_kernel(CompressArgs a) {
  pdl_begin();
  const int64_t pos0 = *a.pos, w = completed_window(a, pos0, blockIdx.y);
  const int64_t ch = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (w < 0 || ch >= a.c) return;
  pool_channel(a, pos0, w, ch);
}

// One block of kFinishThreads (256, as the norm kernel, so the entry's norm sums alike) per completed window: RMSNorm
// and RoPE of its entry, in place, with the arithmetic of fwd_rms_norm and fwd_rope (the shared device functions).
constexpr int kFinishThreads = 256;
__device__ __forceinline__ void finish_entry(const CompressArgs& a, int64_t w) {
  __shared__ double sh[32];
  float* e = a.entries + w * a.c;
  // numerics.official: the pooled entry, the normed entry and its rotated dims stored as bf16 (Numerics::act,
  // rms_norm, rope), then the indexer rotation or the FP8 KV simulation of the nope dims.
  if (a.official) {
    for (int64_t i = threadIdx.x; i < a.c; i += blockDim.x) e[i] = bf16r(e[i]);
    __syncthreads();
  }
  rms_norm_row(e, a.c, a.norm, a.eps, sh);
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
  finish_entry(a, w);
}

// CSA: the last completed window's first-half series (gate + ape) becomes the next chunk's previous window. Runs
// before stash, which may overwrite pending rows this reads.
__device__ __forceinline__ void carry_elem(const CompressArgs& a, int64_t pos0, int64_t i) {
  const int64_t last = (pos0 + a.n) / a.m - 1;
  if (last < pos0 / a.m || i >= int64_t(a.m) * a.c) return;  // no window completed in this chunk
  const int64_t r = i / a.c, ch = i % a.c, width = 2 * a.c;
  const CompRows rows{a, pos0, width};
  const int64_t q = last * a.m + r;
  a.prev_gate[i] = __fadd_rn(rows.gate(q)[ch], a.ape[r * width + ch]);
  a.prev_kv[i] = rows.kv(q)[ch];
}
__global__ void compress_carry_kernel(CompressArgs a) {
  pdl_begin();
  carry_elem(a, *a.pos, int64_t(blockIdx.x) * blockDim.x + threadIdx.x);
}

// The rows of the incomplete window (positions from the last window boundary, and from pos, to pos + n) into the
// pending ring.
__device__ __forceinline__ void stash_elem(const CompressArgs& a, int64_t pos0, int64_t i, int64_t rows_bound) {
  const int64_t width = a.overlap ? 2 * a.c : a.c;
  const int64_t end = pos0 + a.n, begin = max(pos0, end / a.m * a.m);
  if (i >= rows_bound * width) return;
  const int64_t q = begin + i / width, ch = i % width;
  if (q >= end) return;
  a.pend_kv[(q % a.m) * width + ch] = a.rows_kv[(q - pos0) * width + ch];
  a.pend_gate[(q % a.m) * width + ch] = a.rows_gate[(q - pos0) * width + ch];
}
__global__ void compress_stash_kernel(CompressArgs a, int64_t rows_bound) {
  pdl_begin();
  stash_elem(a, *a.pos, int64_t(blockIdx.x) * blockDim.x + threadIdx.x, rows_bound);
}

// One token (decode): the pool, finish and carry of the window this token completes, or else its row into the
// pending ring, in one block of kFinishThreads (so the norm sums alike): the four launches' device code in their
// order, one launch instead of up to four. (Their launches were most of the CSA layer's side stream, which the
// query path waits for before the indexer: `h200-session10/ncu-step-b1-plain.txt`.)
__global__ void __launch_bounds__(kFinishThreads) compress_one_kernel(CompressArgs a) {
  pdl_begin();
  const int64_t pos0 = *a.pos, w = completed_window(a, pos0, 0);
  if (w < 0) {
    const int64_t width = a.overlap ? 2 * a.c : a.c;
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x) stash_elem(a, pos0, i, 1);
    return;
  }
  for (int64_t ch = threadIdx.x; ch < a.c; ch += blockDim.x) pool_channel(a, pos0, w, ch);
  __syncthreads();  // the pooled entry, and every read of the previous window's series (carry rewrites it)
  finish_entry(a, w);
  if (a.overlap)
    for (int64_t i = threadIdx.x; i < int64_t(a.m) * a.c; i += blockDim.x) carry_elem(a, pos0, i);
  // (No stash: the token ends its window, so no row of an incomplete one remains.)
}

}  // namespace

void fwd_attend(const AttendArgs& a, Stream s) {
  if (a.n <= 0) return;
  if (a.out_inv_freq) throw_arg("attention: the fused output rotation (AttendArgs::out_inv_freq) is split-K only");
  if (a.ld_logits < a.window + (a.type == 2 ? a.ne : a.type == 1 ? a.ksel : 0)) throw_arg("attention: logits scratch too narrow");
  const unsigned rows = unsigned(a.n * a.Hq);
  launch("fwd_attend_logits", attend_logits_kernel, dim3(rows, kAttnSplit), 256, 0, s, a);
  if (a.official) {
    launch("fwd_attend_out_official", attend_out_official_kernel, dim3(rows, unsigned(fwd_blocks(a.Dh, kOffBlock))), kOffBlock,
           0, s, a);
    return;
  }
  const size_t smem = size_t(a.ld_logits) * (sizeof(float*) + sizeof(float));
  if (smem > 48 * 1024) {
    if (smem > 200 * 1024) throw_arg("attention: too many keys per query for one block's shared memory");
    static bool raised = false;  // per process: the attribute is per kernel
    if (!raised) {
      PLUMB_CUDA_CHECK(cudaFuncSetAttribute(attend_out_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
      raised = true;
    }
  }
  launch("fwd_attend_out", attend_out_kernel, dim3(rows, unsigned(fwd_blocks(a.Dh, kAttnDims))), kAttnDims * kAttnGroups, smem,
         s, a);
}

void fwd_ring_store(const float* chunk_kv, int n, int64_t Dh, const int64_t* pos, int64_t window, float* ring, Stream s) {
  const int64_t rows = std::min<int64_t>(n, window);
  if (rows <= 0) return;
  launch("fwd_ring_store", ring_store_kernel, fwd_blocks(rows * Dh, 256), 256, 0, s, chunk_kv, n, Dh, pos, window,
         ring);
}

void fwd_compress(const CompressArgs& a, Stream s) {
  if (a.n <= 0) return;
  if (a.official && a.rotate && a.c > kHadamardMax) throw_arg("compressor: indexer rows longer than 1024 values are not supported on the GPU");
  if (a.n == 1 && a.one_launch) {  // (nw_max <= 1 at one token)
    launch("fwd_compress (one token)", compress_one_kernel, 1, kFinishThreads, 0, s, a);
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
  launch("fwd_compress_stash", compress_stash_kernel, fwd_blocks(rows * width, 256), 256, 0, s, a, rows);
}

}  // namespace plumb::cuda::detail
