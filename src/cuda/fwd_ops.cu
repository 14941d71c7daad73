// Dense forward ops on the GPU: embedding, linear (any checkpoint layout, dequantized on the fly), RMSNorm, RoPE,
// elementwise helpers. GPU twins of src/model/ops.cpp (fp64 accumulation like the reference).
#include <algorithm>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>

#include "cuda/fwd_common.cuh"

namespace plumb::cuda::detail {

namespace {

// A thread per (token, d), the tokens strided over gridDim.y: one block per token walked its row with a load per
// step, a latency chain (11 us per decode step under ncu).
// epoch (cuda.branch_flags, BranchWait): advanced once, by the forward's first kernel.
__global__ void embed_kernel(DMat e, const int32_t* tokens, int n, int H, float* X, unsigned* epoch) {
  pdl_begin();
  if (epoch && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *epoch += 1u;
  const int64_t D = e.cols, d = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (d >= D) return;
  for (int t = int(blockIdx.y); t < n; t += int(gridDim.y)) {
    const float v = fwd_w(e, tokens[t], d);
    for (int j = 0; j < H; ++j) X[(int64_t(t) * H + j) * D + d] = v;
  }
}

// One warp per output row, up to kTok tokens per block row (blockIdx.y picks the token group).
constexpr int kTok = 8, kRowsPerBlock = 8;


// The same with 16-byte loads: each lane takes 16 bytes of the row at a time (8 bf16/f16, 4 f32, 16 E4M3 codes or
// 32 packed E2M1 codes: always inside one scale block), dequantized exactly as fwd_w does, fp64 accumulation.
// Needs row starts 16-byte aligned (rows * bytes per row % 16 == 0); the host picks it when they are.
__device__ __forceinline__ int elems_per_16(const DMat& m) {
  return m.layout == 2 ? 32 : m.layout == 1 ? 16 : m.dtype == 0 ? 4 : 8;
}

// XT: the activations' type (float, or double where the one-token kernel staged them converted: the same value, one
// float-to-double conversion per product instead of two). DT >= 0: plain rows (layout 0) of that dtype, known at
// compile time (no per-element dispatch); -1: read from w.
template <int NT, class XT = float, int DT = -1>
__device__ __forceinline__ void fma16(const DMat& w, int64_t r, int64_t c0, const uint4& v, const XT* x, int n, int64_t ldx,
                                      double (&acc)[NT]) {
  const uint8_t* b = reinterpret_cast<const uint8_t*>(&v);
  const int layout = DT >= 0 ? 0 : w.layout, dtype = DT >= 0 ? DT : w.dtype;
  auto use = [&](int k, float wv) {
#pragma unroll
    for (int t = 0; t < NT; ++t)
      if (t < n) acc[t] += double(x[t * ldx + c0 + k]) * double(wv);
  };
  if (layout == 0) {
    if (dtype == 0) {
      const float* f = reinterpret_cast<const float*>(b);
#pragma unroll
      for (int k = 0; k < 4; ++k) use(k, f[k]);
    } else {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(b);
#pragma unroll
      for (int k = 0; k < 8; ++k) use(k, dtype == 1 ? __uint_as_float(uint32_t(h[k]) << 16) : __half2float(__ushort_as_half(h[k])));
    }
  } else if (layout == 1) {
    const int64_t si = (r >> 7) * w.s_cols + (c0 >> 7);
    const float sc = w.s_f32 ? static_cast<const float*>(w.s)[si] : fwd_e8m0(static_cast<const uint8_t*>(w.s)[si]);
#pragma unroll
    for (int k = 0; k < 16; ++k) use(k, fwd_e4m3(b[k]) * sc);
  } else {
    const float sc = fwd_e8m0(static_cast<const uint8_t*>(w.s)[r * w.s_cols + (c0 >> 5)]);
#pragma unroll
    for (int k = 0; k < 32; ++k) use(k, fwd_e2m1((b[k >> 1] >> (4 * (k & 1))) & 0xF) * sc);
  }
}

// kLoads 16-byte loads in flight per lane before their products (a warp per row waited on one load at a time);
// the accumulation order is unchanged. Chunks [c_begin, c_end) of the row (16 bytes each), lane-strided.
template <int NT, class XT = float>
__device__ __forceinline__ void row_dot16(const DMat& w, int64_t row, int64_t c_begin, int64_t c_end, const XT* x, int nt,
                                          int64_t ldx, double (&acc)[NT]) {
  constexpr int kLoads = 4;
  const int lane = threadIdx.x & 31, per = elems_per_16(w);
  const uint8_t* base = static_cast<const uint8_t*>(w.w) + row * dmat_row_bytes(w);
  for (int64_t c0 = c_begin + lane; c0 < c_end; c0 += kLoads * 32) {
    uint4 v[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u)
      if (c0 + u * 32 < c_end) v[u] = ldg_stream<0>(base + (c0 + u * 32) * 16);
#pragma unroll
    for (int u = 0; u < kLoads; ++u)
      if (c0 + u * 32 < c_end) fma16<NT, XT>(w, row, (c0 + u * 32) * per, v[u], x, nt, ldx, acc);
  }
}

// Rows split over kOneSplit warps (a quarter of K each), kOneRows rows per block of kRowsPerBlock warps.
constexpr int kOneSplit = 4, kOneRows = kRowsPerBlock / kOneSplit;

// Up to kTok tokens per block row. SPLIT: a block takes kOneRows rows, each over kOneSplit warps (a quarter of K
// each), the splits' sums added in split order; else a warp per row, kRowsPerBlock rows. VEC: 16-byte loads
// (row_dot16 over the warp's chunks: rows 16-byte aligned); else one element per lane at a time (any layout and
// alignment). Products exact in fp64, sums in fp64: the order changes only the last bits of the fp64 sum.
template <bool VEC, bool SPLIT>
__global__ void linear_kernel(DMat w, const float* x, int n, int64_t ldx, int64_t r0, int64_t nr, float* y, int64_t ldy) {
  pdl_begin();
  constexpr int S = SPLIT ? kOneSplit : 1;
  __shared__ double part[kRowsPerBlock][kTok];
  const int lane = threadIdx.x & 31, warp = int(threadIdx.x >> 5), rl = warp / S, sp = warp % S;
  const int64_t r = int64_t(blockIdx.x) * (kRowsPerBlock / S) + rl;
  const int t0 = blockIdx.y * kTok, nt = min(kTok, n - t0);
  double acc[kTok] = {};
  if (r < nr) {
    if constexpr (VEC) {
      const int64_t C = dmat_row_bytes(w) / 16;
      row_dot16<kTok>(w, r0 + r, C * sp / S, C * (sp + 1) / S, x + int64_t(t0) * ldx, nt, ldx, acc);
    } else {
      for (int64_t c = w.cols * sp / S + lane; c < w.cols * (sp + 1) / S; c += 32) {
        const double wv = fwd_w(w, r0 + r, c);
#pragma unroll
        for (int t = 0; t < kTok; ++t)
          if (t < nt) acc[t] += double(x[(t0 + t) * ldx + c]) * wv;
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kTok; ++t) {
    const double v = warp_sum(acc[t]);
    if (lane == 0) part[warp][t] = v;
  }
  __syncthreads();
  if (r < nr && sp == 0 && lane < nt) {
    double s = part[warp][lane];
#pragma unroll
    for (int q = 1; q < S; ++q) s += part[warp + q][lane];
    y[(t0 + lane) * ldy + r] = float(s);
  }
}

// Two or more tokens, plain rows whose columns are a multiple of 32, on the fp64 tensor cores (mma m8n8k4 f64).
// A block takes 8 rows and kDmmaTok tokens; its kDmmaWarps warps split K (a contiguous range of 32-column steps
// each) and their fp64 tiles are added in warp order. In a step, lane (g = lane / 4, q = lane % 4) holds columns
// [32 s + 8 q, +8) of row g and of token g of each 8-token tile: MMA j takes element j of every lane, i.e. k-slot q
// of MMA j is column 32 s + 8 q + j for the weights and the tokens alike (any shared assignment of columns to k-slots
// gives the same dot product). Products exact in fp64 as in linear_kernel (a bf16/f16/f32 weight times an f32
// activation has at most 48 significant bits), sums in fp64, two accumulator sets (even and odd j, added at the
// end) to halve the dependent MMA chain: only the order of the fp64 sum differs from linear_kernel.
// (H200: linear_kernel, a warp per row and one fp64 FMA per product with both operands converted, took 57 us for
// the router gate [256, 4096] at 32 tokens and ~150 us at 128.)
constexpr int kDmmaWarps = 8, kDmmaTok = 32;
// The two elements of a 32-bit word of a plain bf16 (DT 1) or f16 (DT 2) row, low half first, exactly as floats.
template <int DT>
__device__ __forceinline__ void half_pair(uint32_t q, float& lo, float& hi) {
  if constexpr (DT == 1) {
    lo = __uint_as_float(q << 16), hi = __uint_as_float(q & 0xFFFF0000u);
  } else {
    lo = __half2float(__ushort_as_half(uint16_t(q & 0xFFFFu))), hi = __half2float(__ushort_as_half(uint16_t(q >> 16)));
  }
}
// 8 consecutive elements of a plain DT row: their 16 bytes (32 for f32), loaded a step ahead of their use, then
// as doubles, exactly.
template <int DT>
struct Raw8 {
  uint4 u[DT == 0 ? 2 : 1];
};
template <int DT>
__device__ __forceinline__ Raw8<DT> load_raw8(const uint8_t* p) {
  Raw8<DT> r;
  r.u[0] = *reinterpret_cast<const uint4*>(p);
  if constexpr (DT == 0) r.u[1] = *reinterpret_cast<const uint4*>(p + 16);
  return r;
}
template <int DT>
__device__ __forceinline__ void raw8_as_double(const Raw8<DT>& r, double (&v)[8]) {
  if constexpr (DT == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      v[4 * h] = __uint_as_float(r.u[h].x), v[4 * h + 1] = __uint_as_float(r.u[h].y);
      v[4 * h + 2] = __uint_as_float(r.u[h].z), v[4 * h + 3] = __uint_as_float(r.u[h].w);
    }
  } else {
    const uint32_t q[4] = {r.u[0].x, r.u[0].y, r.u[0].z, r.u[0].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float lo, hi;
      half_pair<DT>(q[j], lo, hi);
      v[2 * j] = lo, v[2 * j + 1] = hi;
    }
  }
}
template <int DT>
__global__ void __launch_bounds__(32 * kDmmaWarps) linear_dmma_kernel(DMat w, const float* x, int n, int64_t ldx, int64_t r0, int64_t nr,
                                                                      float* y, int64_t ldy) {
  pdl_begin();
  constexpr int NT = kDmmaTok / 8;
  __shared__ double red[kDmmaWarps][NT][64];
  const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5), g = lane >> 2, q = lane & 3;
  const int64_t rt = int64_t(blockIdx.x) * 8;
  const int t0 = int(blockIdx.y) * kDmmaTok, ntiles = min(NT, (n - t0 + 7) / 8);
  const int steps = int(w.cols / 32), s0 = steps * warp / kDmmaWarps, s1 = steps * (warp + 1) / kDmmaWarps;
  // Rows past nr (the last block's) read row nr - 1 and are not written.
  const uint8_t* wrow = static_cast<const uint8_t*>(w.w) + (r0 + min(rt + g, nr - 1)) * dmat_row_bytes(w) + q * 8 * (DT == 0 ? 4 : 2);
  const float* xq[NT];
#pragma unroll
  for (int i = 0; i < NT; ++i) xq[i] = x + int64_t(min(t0 + 8 * i + g, n - 1)) * ldx + q * 8;  // tokens past n: not written
  double acc[NT][2][2] = {};
  constexpr int kStepBytes = 32 * (DT == 0 ? 4 : 2);
  Raw8<DT> ra;
  Raw8<0> rb[NT];
  auto load = [&](int s) {
    ra = load_raw8<DT>(wrow + int64_t(s) * kStepBytes);
#pragma unroll
    for (int i = 0; i < NT; ++i)
      if (i < ntiles) rb[i] = load_raw8<0>(reinterpret_cast<const uint8_t*>(xq[i] + s * 32));
  };
  if (s0 < s1) load(s0);
  for (int s = s0; s < s1; ++s) {
    double a[8], b[NT][8];
    raw8_as_double<DT>(ra, a);
#pragma unroll
    for (int i = 0; i < NT; ++i)
      if (i < ntiles) raw8_as_double<0>(rb[i], b[i]);
    if (s + 1 < s1) load(s + 1);  // the next step's bytes in flight during this step's MMAs
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      if (i >= ntiles) break;
#pragma unroll
      for (int j = 0; j < 8; ++j) dmma_m8n8k4(acc[i][j & 1], a[j], b[i][j]);
    }
  }
#pragma unroll
  for (int i = 0; i < NT; ++i) red[warp][i][2 * lane] = acc[i][0][0] + acc[i][1][0], red[warp][i][2 * lane + 1] = acc[i][0][1] + acc[i][1][1];
  __syncthreads();
  // Thread e: tile e / 64, lane l = (e % 64) / 2, column c = e % 2 of the C fragment: row l / 4, token 2 (l % 4) + c.
  for (int e = int(threadIdx.x); e < NT * 64; e += int(blockDim.x)) {
    const int i = e / 64, l = (e % 64) / 2, c = e % 2;
    const int64_t r = rt + l / 4;
    const int t = t0 + 8 * i + 2 * (l % 4) + c;
    if (r >= nr || t >= n) continue;
    double v = red[0][i][e % 64];
#pragma unroll
    for (int k = 1; k < kDmmaWarps; ++k) v += red[k][i][e % 64];
    y[int64_t(t) * ldy + r] = float(v);
  }
}

// One token (decode). A persistent grid (blocks per SM from the occupancy, at most the work): each block stages the
// input row once, as doubles (exact: each product then converts only its weight, where the session-7 kernel
// converted both and staged the row again for every pair of rows), then takes pairs of rows (kOneRows) in turn,
// pair p = blockIdx.x + i * gridDim.x over the segments' rows in order. Each row is split over kOneSplit warps (a
// quarter of K each), each warp's lanes take 16-byte chunks lane-strided in rounds of kOneLoads, the next round's
// loads (of this row or of the next pair's) issued before this round's products; the splits' sums are added in
// split order: every row summed in the session-7 kernel's order. DT: the weights' dtype (0 f32, 1 bf16,
// 2 f16) when every segment has plain rows of it (the pair-major staged row, no per-element dispatch); -1 (mixed
// dtypes or layouts, or an input row not 16-byte aligned): element order, the format read from w.
constexpr int kOneLoads = 4;
constexpr int64_t kOneMaxCols = 12288;  // the staged row: 96 KiB of doubles
// The staged row, as doubles. Element order for the generic kernel (DT < 0); for a plain dtype (per elements per
// 16-byte chunk, C = cols / per chunks) pair-major: the pair of elements (c * per + 2j, c * per + 2j + 1) of chunk c
// at xs2[j * C + c], so a warp's lanes (consecutive chunks) read consecutive 16 bytes, free of bank conflicts
// (element order put lanes 32 or 64 bytes apart: the 7-way conflict ncu reported). Staged a chunk per thread and
// step (PER / 4 16-byte loads, PER / 2 16-byte stores, each store of a warp to consecutive addresses: writing
// pair by pair in element order was a 12.5-way conflict that took about half the kernel's time), 32-bit indices:
// the row has at most kOneMaxCols elements.
__device__ __forceinline__ void stage_row(const float* x, int cols, double* xs) {
  constexpr int kU = 8;
  const int step = blockDim.x;
  for (int b = threadIdx.x; b < cols; b += kU * step) {
    float v[kU];
    load_strided(x, b, step, cols, v);
#pragma unroll
    for (int u = 0; u < kU; ++u)
      if (b + u * step < cols) xs[b + u * step] = double(v[u]);
  }
  __syncthreads();
}
// NT rows (ldx apart) pair-major as double2 (see stage_row), row t at xs2 + t * cols / 2; every row's loads of a
// step issued before any store, one barrier (staged one row after another, linear16_multi_kernel began with four
// dependent rounds of loads, each behind a barrier).
template <int PER, int NT = 1>
__device__ __forceinline__ void stage_row_pairs(const float* x, int64_t ldx, int cols, double2* xs2) {
  constexpr int kU = NT == 1 ? 2 : 1, kQ = PER / 4;  // chunks per thread, row and step; 16-byte loads per chunk
  const int step = blockDim.x, C = cols / PER;
  for (int b = threadIdx.x; b < C; b += kU * step) {
    float4 v[NT][kU][kQ];
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int u = 0; u < kU; ++u)
#pragma unroll
        for (int q = 0; q < kQ; ++q) v[t][u][q] = reinterpret_cast<const float4*>(x + t * ldx)[min(b + u * step, C - 1) * kQ + q];
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int c = b + u * step;
        if (c >= C) continue;
        double2* row = xs2 + t * (cols / 2);
#pragma unroll
        for (int q = 0; q < kQ; ++q) {
          row[(2 * q) * C + c] = make_double2(double(v[t][u][q].x), double(v[t][u][q].y));
          row[(2 * q + 1) * C + c] = make_double2(double(v[t][u][q].z), double(v[t][u][q].w));
        }
      }
  }
  __syncthreads();
}
// Elements 2j and 2j + 1 of a 16-byte chunk of a plain DT row (4 f32, 8 bf16 or 8 f16: j < kChunkPairs) as doubles,
// exactly.
template <int DT>
constexpr int kChunkPairs = DT == 0 ? 2 : 4;
template <int DT>
__device__ __forceinline__ void chunk_pair(const uint4& v, int j, double& lo, double& hi) {
  const uint32_t q[4] = {v.x, v.y, v.z, v.w};
  float l, h;
  if constexpr (DT == 0) {
    l = __uint_as_float(q[2 * j]), h = __uint_as_float(q[2 * j + 1]);
  } else {
    half_pair<DT>(q[j], l, h);
  }
  lo = double(l), hi = double(h);
}
// The products of chunk c with the pair-major staged row, in element order, in fp64 (exact: a bf16, f16 or f32
// weight times an f32 activation has at most 48 significant bits).
template <int DT>
__device__ __forceinline__ void chunk_dot(const uint4& v, const double2* xs2, int C, int c, double& acc) {
#pragma unroll
  for (int j = 0; j < kChunkPairs<DT>; ++j) {
    const double2 xv = xs2[j * C + c];
    double lo, hi;
    chunk_pair<DT>(v, j, lo, hi);
    acc += xv.x * lo;
    acc += xv.y * hi;
  }
}
// Pair p's row for the warps of `slot`: its segment and row of w, where its 16-byte chunks start and where its
// output goes (w and y null past the segment's rows). The segments are scanned with constant indices (their fields
// stay in the uniform datapath).
struct OneRow {
  const uint4* w = nullptr;
  float* y = nullptr;
  int seg = 0;
  int64_t row = 0;  // in w: the segment's r0 + its row
  int64_t ldy = 0;  // the segment's output stride between tokens
};
__device__ __forceinline__ OneRow one_row(const LinearSegs& g, int64_t p, int slot) {
  OneRow o;
#pragma unroll
  for (int k = 0; k < LinearSegs::kMax; ++k) {
    if (k < g.count && p >= g.seg[k].block0) {
      const int64_t r = (p - g.seg[k].block0) * kOneRows + slot;
      const bool in = r < g.seg[k].nr;
      o.seg = k, o.row = g.seg[k].r0 + r;
      o.w = in ? reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(g.seg[k].w.w) + o.row * dmat_row_bytes(g.seg[k].w))
               : nullptr;
      o.y = in ? g.seg[k].y + r : nullptr;
      o.ldy = g.seg[k].ldy;
    }
  }
  return o;
}
// Adds this warp's sum for its row to the block's partials and, in the row's first split, writes the row: the splits
// in order. One barrier per pair; part[it & 1] is written again two pairs later, after the next barrier.
__device__ __forceinline__ void one_finish(double acc, double (&part)[2][kRowsPerBlock], int64_t it, float* y) {
  const int wid = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const double sum = warp_sum(acc);
  if (lane == 0) part[it & 1][wid] = sum;
  __syncthreads();
  if (wid % kOneSplit == 0 && lane == 0 && y) {
    double o = part[it & 1][wid];
    for (int k = 1; k < kOneSplit; ++k) o += part[it & 1][wid + k];
    *y = float(o);
  }
}
// A warp's share of a plain row of `chunks` 16-byte chunks: split `split` of kOneSplit, its lanes lane-strided,
// N chunks per lane and round (chunk cb + lane + 32 k is the lane's k-th, whatever N: rounds only group the loads,
// so the sums' order is the same for every N).
template <int N>
struct SplitChunks {
  int cb, ce, rounds;
  __device__ SplitChunks(int chunks, int split) {
    const int per_split = (chunks + kOneSplit - 1) / kOneSplit;
    cb = min(chunks, split * per_split), ce = min(chunks, (split + 1) * per_split);
    rounds = (ce - cb + N * 32 - 1) / (N * 32);
  }
  __device__ int chunk(int lane, int j, int u) const { return cb + lane + (j * N + u) * 32; }
  // Round j's chunks of row w (nothing where w is null or past the split).
  __device__ void load(const uint4* w, int lane, int j, uint64_t pol, uint4 (&v)[N]) const {
    if (!w) return;
#pragma unroll
    for (int u = 0; u < N; ++u) {
      const int c = chunk(lane, j, u);
      if (c < ce) v[u] = ldg_stream<0>(w + c, pol);
    }
  }
};

template <int DT>
__global__ void __launch_bounds__(32 * kRowsPerBlock, 4) linear16_one_kernel(LinearSegs g, const float* x, int64_t pairs) {
  // (g.early, plain rows only: the wait comes after the first round of weight loads below; weights are never
  // written during a forward, x is the previous kernel's output and is staged after the wait)
  if (DT < 0 || !g.early) pdl_begin();
  extern __shared__ double xs[];
  __shared__ double part[2][kRowsPerBlock];
  const int cols = int(g.seg[0].w.cols);
  const int wid = threadIdx.x >> 5, lane = threadIdx.x & 31, split = wid % kOneSplit, slot = wid / kOneSplit;
  const int64_t iters = pairs > blockIdx.x ? (pairs - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
  if constexpr (DT < 0) {
    stage_row(x, cols, xs);
    for (int64_t it = 0; it < iters; ++it) {
      const OneRow row = one_row(g, blockIdx.x + it * gridDim.x, slot);
      const DMat& w = g.seg[row.seg].w;
      const int64_t ck = dmat_row_bytes(w) / 16, ps = (ck + kOneSplit - 1) / kOneSplit;  // this segment's row size
      double acc[1] = {};
      if (row.y) row_dot16<1, double>(w, row.row, min(ck, split * ps), min(ck, (split + 1) * ps), xs, 1, 0, acc);
      one_finish(acc[0], part, it, row.y);
    }
  } else {
    constexpr int per = DT == 0 ? 4 : 8;  // elements per chunk
    double2* xs2 = reinterpret_cast<double2*>(xs);
    const uint64_t wpol = weight_policy(g.evict_first);  // cuda.l2_evict_first
    // This warp's chunks of every row (every segment has this row size: same columns and dtype), in rounds of
    // kOneLoads per lane; the next round (of this row, or round 0 of the next pair's) is loaded before this one's
    // products.
    const int chunks = cols / per;
    const SplitChunks<kOneLoads> sc(chunks, split);
    uint4 v[kOneLoads];
    OneRow row = iters > 0 ? one_row(g, blockIdx.x, slot) : OneRow{};
    sc.load(row.w, lane, 0, wpol, v);
    if (g.early) pdl_begin();  // cuda.linear_early
    stage_row_pairs<per>(x, cols, cols, xs2);  // (after the first loads: plain loads, after any wait)
    for (int64_t it = 0; it < iters; ++it) {
      const OneRow next = it + 1 < iters ? one_row(g, blockIdx.x + (it + 1) * gridDim.x, slot) : OneRow{};
      double acc = 0;
      for (int j = 0; j < sc.rounds; ++j) {
        uint4 nv[kOneLoads];
        if (j + 1 < sc.rounds) sc.load(row.w, lane, j + 1, wpol, nv);
        else sc.load(next.w, lane, 0, wpol, nv);
        if (row.w) {
#pragma unroll
          for (int u = 0; u < kOneLoads; ++u) {
            const int c = sc.chunk(lane, j, u);
            if (c < sc.ce) chunk_dot<DT>(v[u], xs2, chunks, c, acc);
          }
        }
#pragma unroll
        for (int u = 0; u < kOneLoads; ++u) v[u] = nv[u];
      }
      one_finish(acc, part, it, row.y);
      row = next;
    }
  }
}

// NT tokens (2 to kOneMaxTokens, plain rows of one dtype) over the same weights, one read of them: each token's
// products and sums in linear16_one_kernel's order (the same splits, each lane's chunks in the same order and each
// chunk's elements in order, the same warp sum, the splits added in order), so each token's outputs are the bits of
// a one-token launch for it. Laid out for the products, not the loads: session 46's form (linear16_one_kernel with a
// token loop) took 50-54 us for a CSA layer's 4-row window (21 MB), its fp64 conversions (both operands, per token:
// ncu, 19 % of its instructions and a third of its stall samples) and 64-register spills the bound; session 47's
// first form of this kernel 37.6 us (ncu), each accumulator's 8 products of a chunk back to back (stalls on the
// dependent fp64 FMAs), its FMAs 16 % of its instructions beside addressing, conversions and per-chunk branches
// (rows past the end, chunks past the split, tokens past nt); this form 28.1 us. Here the tokens' rows are staged as doubles (no conversion at use), each warp takes both rows
// of a pair (each staged value read once for two rows, each weight converted once for every token), the products
// run element by element over all the warp's 2 x NT accumulators (independent FMAs back to back), rows past the end
// compute on zeros and are not written, and only a split's last round checks its chunks. A block of kMultiWarps
// warps takes kMultiPairs pairs at once (128 registers a thread, one block per SM with up to 200 KB of staged rows).
constexpr int kMultiPairs = 4, kMultiWarps = kMultiPairs * kOneSplit, kMultiLoads = 2;
template <int DT, int NT>
__global__ void __launch_bounds__(32 * kMultiWarps, 1) linear16_multi_kernel(LinearSegs g, const float* x, int64_t pairs) {
  if (!g.early) pdl_begin();
  extern __shared__ double xs[];
  __shared__ double part[2][kMultiPairs][kOneRows][kOneSplit][NT];
  __shared__ float* outs[2][kMultiPairs][kOneRows];
  __shared__ int64_t out_ld[2][kMultiPairs][kOneRows];
  constexpr int per = DT == 0 ? 4 : 8;
  const int cols = int(g.seg[0].w.cols), chunks = cols / per, xstride = cols / 2;
  const int wid = threadIdx.x >> 5, lane = threadIdx.x & 31, split = wid % kOneSplit, ps = wid / kOneSplit;
  const int64_t quads = (pairs + kMultiPairs - 1) / kMultiPairs;
  const int64_t iters = quads > blockIdx.x ? (quads - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
  double2* xs2 = reinterpret_cast<double2*>(xs);
  const uint64_t wpol = weight_policy(g.evict_first);
  const SplitChunks<kMultiLoads> sc(chunks, split);
  auto rows_of = [&](int64_t it, OneRow (&r)[kOneRows]) {
    const int64_t p = (blockIdx.x + it * gridDim.x) * kMultiPairs + ps;
#pragma unroll
    for (int k = 0; k < kOneRows; ++k) r[k] = it < iters && p < pairs ? one_row(g, p, k) : OneRow{};
  };
  // Round j's chunks of both rows; zeros for a row past the end (computed on, never written).
  auto load = [&](const OneRow (&r)[kOneRows], int j, uint4 (&v)[kOneRows][kMultiLoads]) {
#pragma unroll
    for (int k = 0; k < kOneRows; ++k) {
#pragma unroll
      for (int u = 0; u < kMultiLoads; ++u) v[k][u] = make_uint4(0, 0, 0, 0);
      sc.load(r[k].w, lane, j, wpol, v[k]);
    }
  };
  // Chunk c's products: element by element, for each the 2 x NT accumulators (each accumulator's elements in order).
  auto products = [&](const uint4 (&v)[kOneRows], int c, double (&acc)[kOneRows][NT]) {
#pragma unroll
    for (int j = 0; j < kChunkPairs<DT>; ++j) {
      double2 xv[NT];
#pragma unroll
      for (int t = 0; t < NT; ++t) xv[t] = xs2[t * xstride + j * chunks + c];
      double lo[kOneRows], hi[kOneRows];
#pragma unroll
      for (int k = 0; k < kOneRows; ++k) chunk_pair<DT>(v[k], j, lo[k], hi[k]);
#pragma unroll
      for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int k = 0; k < kOneRows; ++k) acc[k][t] += xv[t].x * lo[k];
#pragma unroll
      for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int k = 0; k < kOneRows; ++k) acc[k][t] += xv[t].y * hi[k];
    }
  };
  OneRow row[kOneRows];
  rows_of(0, row);
  uint4 v[kOneRows][kMultiLoads];
  load(row, 0, v);
  if (g.early) pdl_begin();  // cuda.linear_early
  stage_row_pairs<per, NT>(x, g.ldx, cols, xs2);
  for (int64_t it = 0; it < iters; ++it) {
    OneRow next[kOneRows];
    rows_of(it + 1, next);
    double acc[kOneRows][NT] = {};
    for (int j = 0; j < sc.rounds; ++j) {
      uint4 nv[kOneRows][kMultiLoads];
      if (j + 1 < sc.rounds) load(row, j + 1, nv);
      else load(next, 0, nv);
      const bool full = sc.chunk(31, j, kMultiLoads - 1) < sc.ce;  // (uniform: every lane's chunks of the round exist)
#pragma unroll
      for (int u = 0; u < kMultiLoads; ++u) {
        const int c = sc.chunk(lane, j, u);
        if (full || c < sc.ce) products({v[0][u], v[1][u]}, c, acc);
      }
#pragma unroll
      for (int k = 0; k < kOneRows; ++k)
#pragma unroll
        for (int u = 0; u < kMultiLoads; ++u) v[k][u] = nv[k][u];
    }
    // The splits' sums, added in split order by the pair's first split warp (one_finish's arithmetic).
    const int b = int(it & 1);
#pragma unroll
    for (int k = 0; k < kOneRows; ++k)
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const double sum = warp_sum(acc[k][t]);  // (every lane: warp_sum shuffles the whole warp)
        if (lane == 0) part[b][ps][k][split][t] = sum;
      }
    if (split == 0 && lane == 0)
#pragma unroll
      for (int k = 0; k < kOneRows; ++k) outs[b][ps][k] = row[k].y, out_ld[b][ps][k] = row[k].ldy;
    __syncthreads();  // (part[b] and outs[b] are written again two iterations later, after the next barrier)
    if (split == 0 && lane < kOneRows * NT) {
      const int k = lane / NT, t = lane % NT;
      if (float* y = outs[b][ps][k]) {
        double o = part[b][ps][k][0][t];
        for (int q = 1; q < kOneSplit; ++q) o += part[b][ps][k][q][t];
        y[t * out_ld[b][ps][k]] = float(o);
      }
    }
#pragma unroll
    for (int k = 0; k < kOneRows; ++k) row[k] = next[k];
  }
}

__global__ void prefetch_l2_kernel(const PrefetchRanges r) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int i = 0; i < r.count; ++i) {
    const char* base = static_cast<const char*>(r.p[i]);
    const int64_t lines = (r.bytes[i] + 127) / 128;
    for (int64_t l = first; l < lines; l += stride) asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(base + l * 128));
  }
}

__global__ void linear_indexed_kernel(const DMat* mats, const int32_t* idx, int x_div, const float* x, int64_t ldx, int64_t rows,
                                      float* y, int64_t ldy) {
  pdl_begin();
  const int lane = threadIdx.x & 31, slot = blockIdx.y;
  const int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (r >= rows) return;
  const DMat w = mats[idx ? idx[slot] : 0];
  const float* xs = x + int64_t(slot / x_div) * ldx;
  double acc = 0;
  for (int64_t c = lane; c < w.cols; c += 32) acc += double(xs[c]) * double(fwd_w(w, r, c));
  acc = warp_sum(acc);
  if (lane == 0) y[int64_t(slot) * ldy + r] = float(acc);
}

// w is a weight (written once at load), so a row of at most kU * blockDim values (one pass: q_norm's 1024 at decode)
// loads its share of it before the PDL wait and keeps its values in registers: after the wait one round of loads,
// the block's sum and the stores, where rms_norm_row loads the row again with the weights after the sum. The same
// arithmetic in the same order (rms_norm_row's, one pass).
__global__ void rms_norm_kernel(float* x, int64_t dim, int64_t ld, const float* w, double eps, uint16_t* out16, int round_bf16) {
  __shared__ double sh[32];
  constexpr int kU = 8;  // rms_norm_row's default
  const int64_t step = blockDim.x, b = threadIdx.x;
  if (dim <= kU * step) {
    float g[kU], xv[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) g[u] = w ? w[min(b + u * step, dim - 1)] : 1.0f;
    pdl_begin();
    float* v = x + int64_t(blockIdx.x) * ld;
    load_strided(v, b, step, dim, xv);
    double ss = 0;
#pragma unroll
    for (int u = 0; u < kU; ++u)
      if (b + u * step < dim) ss += double(xv[u]) * xv[u];
    const float inv = rms_inv(block_sum(ss, sh), dim, eps);
    rms_store(v, b, step, dim, xv, g, w != nullptr, inv, round_bf16 != 0,
              out16 ? reinterpret_cast<__half*>(out16) + int64_t(blockIdx.x) * dim : nullptr);
    return;
  }
  pdl_begin();
  rms_norm_row(x + int64_t(blockIdx.x) * ld, dim, w, eps, sh,
               out16 ? reinterpret_cast<__half*>(out16) + int64_t(blockIdx.x) * dim : nullptr, round_bf16 != 0);
}

// rms_norm_kernel's row, then RoPE on its dims [off, off + 2 * half) at position (*dpos) + row / per_pos: the
// same bits as the two kernels one after the other. Blocks from `rows` on: RoPE alone on b's rows (rope_kernel's
// threads, kBlockThreads per block).
__global__ void rms_norm_rope_kernel(float* x, int64_t rows, int64_t dim, int64_t ld, const float* w, double eps, int64_t off, int half,
                                     const float* inv_freq, float af, const int64_t* dpos, int64_t per_pos, RopeRows b) {
  pdl_begin();
  if (int64_t(blockIdx.x) >= rows) {
    const int64_t i = (int64_t(blockIdx.x) - rows) * blockDim.x + threadIdx.x;
    if (i < b.rows * b.half) rope_one(b.x, i, b.ld, b.off, b.half, inv_freq, af, dpos, 0, b.per_pos, 1, 0);
    return;
  }
  __shared__ double sh[32];
  float* row = x + int64_t(blockIdx.x) * ld;
  rms_norm_row(row, dim, w, eps, sh);
  __syncthreads();  // the normalized row, written by every thread, read by the pairs' owners
  const int64_t pos = row_pos(dpos, int64_t(blockIdx.x), per_pos);
  for (int k = threadIdx.x; k < half; k += blockDim.x) rope_pair(row + off + 2 * k, pos, inv_freq[k], af, 0);
}

// rms_norm_rope_kernel for many rows (the query heads of a batch: 64 rows per token): a warp per row
// (rms_norm_rope_row_warp, fwd_common.cuh), kWarpRows rows per block: the same bits as rms_norm_rope_kernel, without
// its block barriers and with 8 rows in flight per block.
constexpr int kBlockThreads = 256, kWarpRows = 8, kWarpMaxJ = 4;  // rows of at most kBlockThreads * kWarpMaxJ
static_assert(kBlockThreads == kNormThreads && kWarpMaxJ == kNormMaxJ, "rms_norm_rope_row_warp stands for this kernel's blocks");
constexpr int64_t kWarpNormMinRows = 512;
__global__ void __launch_bounds__(32 * kWarpRows) rms_norm_rope_warp_kernel(float* x, int64_t rows, int64_t dim, int64_t ld,
                                                                            const float* w, double eps, int64_t off, int half,
                                                                            const float* inv_freq, float af, const int64_t* dpos,
                                                                            int64_t per_pos) {
  pdl_begin();
  const int64_t r = int64_t(blockIdx.x) * kWarpRows + (threadIdx.x >> 5);
  if (r >= rows) return;
  float* row = x + r * ld;
  rms_norm_rope_row_warp(row, row, dim, w, eps, off, half, inv_freq, af, row_pos(dpos, r, per_pos));
}

__global__ void rope_kernel(float* x, int64_t rows, int64_t ld, int64_t off, int half, const float* inv_freq, float af,
                            const int64_t* dpos, int64_t pos0, int64_t per_pos, int64_t pos_step, int inverse, int round_bf16) {
  pdl_begin();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < rows * half) rope_one(x, i, ld, off, half, inv_freq, af, dpos, pos0, per_pos, pos_step, inverse, round_bf16 != 0);
}

// rope_kernel on rows of ld values whose rotated dims start at off (a pair per thread: every pair of the row, the
// ones at off and above rotated), then the whole row also as f16: the same bits as fwd_rope then fwd_to_f16.
__global__ void rope_f16_kernel(float* x, int64_t rows, int64_t ld, int64_t off, const float* inv_freq, float af, const int64_t* dpos,
                                int64_t per_pos, int inverse, __half* out16) {
  pdl_begin();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, pairs = ld / 2;
  if (i >= rows * pairs) return;
  const int64_t r = i / pairs, j = 2 * (i % pairs);
  float* p = x + r * ld + j;
  if (j >= off) rope_pair(p, row_pos(dpos, r, per_pos), inv_freq[(j - off) / 2], af, inverse);
  *reinterpret_cast<__half2*>(out16 + r * ld + j) = __floats2half2_rn(p[0], p[1]);
}

__global__ void scale_kernel(const float* x, float a, float* y, int64_t n, int round_in, int round_out) {
  pdl_begin();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float v = a * (round_in ? bf16r(x[i]) : x[i]);
  y[i] = round_out ? bf16r(v) : v;
}
__global__ void to_bf16_kernel(const float* x, int64_t n, uint16_t* y) {
  pdl_begin();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
}
__global__ void add_kernel(float* y, const float* x, int64_t n, int round_bf16) {
  pdl_begin();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float v = __fadd_rn(y[i], x[i]);
  y[i] = round_bf16 ? bf16r(v) : v;
}

}  // namespace

void fwd_embed(const DMat& e, const int32_t* tokens, int n, int H, float* X, Stream s, unsigned* epoch) {
  if (n <= 0) return;
  launch("fwd_embed", embed_kernel, dim3(unsigned((e.cols + 255) / 256), unsigned(std::min(n, 65535))), 256, 0, s, e, tokens, n, H,
         X, epoch);
}

namespace {
// The one-token launch (linear16_one_kernel) for the segments of g, their pair ranges (block0) set here: the
// dtype-specialized kernel where every segment has plain rows of one dtype, a grid of at most the blocks that fit
// at once (queried once per kernel and row length).
void launch_linear_one(LinearSegs g, const float* x, Stream s) {
  if (g.ntok < 1 || g.ntok > kOneMaxTokens) throw_arg("fwd_linear_one_multi: 1 to 4 tokens per launch");
  if (weights_skipped()) return;  // bench --skeleton (kernels.h)
  g.evict_first = evict_first_enabled() ? 1 : 0;  // cuda.l2_evict_first
  g.early = linear_early_enabled() ? 1 : 0;        // cuda.linear_early
  int64_t pairs = 0;
  bool same = true;
  for (int i = 0; i < g.count; ++i) {
    g.seg[i].block0 = pairs;
    pairs += (g.seg[i].nr + kOneRows - 1) / kOneRows;
    same = same && fwd_linear_multi_fits(g.seg[i].w, g.seg[0].w);  // (its callers checked the fit and the columns)
  }
  same = same && reinterpret_cast<uintptr_t>(x) % 16 == 0;  // (the pair-major staging loads x four floats at a time)
  if (pairs <= 0) return;
  using Kern = void (*)(LinearSegs, const float*, int64_t);
  const int dt = same ? g.seg[0].w.dtype : -1;
  const bool multi = g.ntok > 1;
  if (multi && (dt < 0 || g.ldx % 4 != 0)) throw_arg("fwd_linear_one_multi: several tokens need plain rows of one dtype and 16-byte rows of x");
  const Kern one = dt == 0 ? linear16_one_kernel<0> : dt == 1 ? linear16_one_kernel<1> : dt == 2 ? linear16_one_kernel<2>
                                                                                                 : linear16_one_kernel<-1>;
  auto multi_kern = [&](int nt) -> Kern {
    constexpr Kern k[3][3] = {{linear16_multi_kernel<0, 2>, linear16_multi_kernel<0, 3>, linear16_multi_kernel<0, 4>},
                              {linear16_multi_kernel<1, 2>, linear16_multi_kernel<1, 3>, linear16_multi_kernel<1, 4>},
                              {linear16_multi_kernel<2, 2>, linear16_multi_kernel<2, 3>, linear16_multi_kernel<2, 4>}};
    return k[dt][nt - 2];
  };
  // Staged rows as doubles: one token at most kOneMaxCols (96 KiB); several, as many tokens per launch as fit in
  // kMultiSmem (every token of V4-Flash's 4096 columns in one launch; V4-Pro's 7168: 3, then 1 on the one-token
  // kernel), each launch over all the weights.
  constexpr size_t kMultiSmem = 200 << 10;  // (with the static shared memory, within the 227 KiB a block may take)
  const size_t row_bytes = size_t(g.seg[0].w.cols) * sizeof(double), one_cap = size_t(kOneMaxCols) * sizeof(double);
  if (row_bytes > (multi ? kMultiSmem : one_cap)) throw_arg("fwd_linear_one_multi: the input row exceeds shared memory");
  const int group = int(std::min<size_t>(size_t(g.ntok), kMultiSmem / row_bytes));
  static std::mutex mu;
  static std::map<std::pair<Kern, size_t>, int> per_sm;  // blocks per SM by kernel and staged size
  const int ntok = g.ntok;
  for (int t0 = 0; t0 < ntok; t0 += group) {
    LinearSegs gt = g;
    gt.ntok = std::min(group, ntok - t0);
    for (int i = 0; i < g.count; ++i) gt.seg[i].y += t0 * g.seg[i].ldy;
    const bool m = gt.ntok > 1;
    const Kern kern = m ? multi_kern(gt.ntok) : one;
    const size_t smem = size_t(gt.ntok) * row_bytes;
    const unsigned threads = 32 * (m ? kMultiWarps : kRowsPerBlock);
    int per = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      int& slot = per_sm[{kern, smem}];
      if (slot == 0) {
        PLUMB_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(m ? kMultiSmem : one_cap)));
        PLUMB_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&slot, kern, int(threads), smem));
        slot = std::max(slot, 1);
      }
      per = slot;
    }
    const int64_t work = m ? (pairs + kMultiPairs - 1) / kMultiPairs : pairs;  // the blocks' units: quads of pairs, or pairs
    const int64_t blocks = std::min<int64_t>(work, int64_t(per) * sm_count());
    launch(m ? "fwd_linear (several tokens)" : "fwd_linear (one token)", kern, unsigned(blocks), threads, smem, s, gt,
           x + t0 * g.ldx, pairs);
  }
}
}  // namespace

void fwd_linear(const DMat& w, const float* x, int n, int64_t ldx, int64_t r0, int64_t nr, float* y, int64_t ldy, Stream s) {
  if (n <= 0 || nr <= 0 || weights_skipped()) return;  // (weights_skipped: bench --skeleton, kernels.h)
  // One token: linear16_one_kernel where it fits. More, with plain rows of a multiple of 32 columns and 16-byte
  // aligned rows of x: linear_dmma_kernel (fp64 tensor cores). Otherwise linear_kernel: rows split over warps where
  // a warp per row would give few blocks (measured when the router gate ran here, before linear_dmma_kernel: its 256
  // rows at 8 tokens gave 32 blocks; H200, per step: moe.router 102.6 -> 46.0 us, the indexer's weights_proj inside
  // attn.indexer 72.6 -> 45.3; at 32 and 128 tokens the warp-per-row blocks were faster, 103 / 334 against 111 / 361).
  const int64_t groups = (n + kTok - 1) / kTok, whole = (nr + kRowsPerBlock - 1) / kRowsPerBlock;
  const bool split = whole * groups < 64;
  const dim3 grid(unsigned(split ? (nr + kOneRows - 1) / kOneRows : whole), unsigned(groups));
  auto go = [&](auto kern) { launch("fwd_linear", kern, grid, 32 * kRowsPerBlock, 0, s, w, x, n, ldx, r0, nr, y, ldy); };
  const int64_t row_bytes = dmat_row_bytes(w);
  const bool vec = row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(w.w) % 16 == 0;
  if (n == 1 && fwd_linear_one_fits(w)) {  // y[r]: with one token ldy does not matter
    LinearSegs g;
    g.add(w, y);
    g.seg[0].r0 = r0, g.seg[0].nr = nr;
    launch_linear_one(g, x, s);
  } else if (w.layout == 0 && w.cols % 32 == 0 && vec && reinterpret_cast<uintptr_t>(x) % 16 == 0 && ldx % 4 == 0) {
    const dim3 g2(unsigned((nr + 7) / 8), unsigned((n + kDmmaTok - 1) / kDmmaTok));
    auto kern = w.dtype == 0 ? linear_dmma_kernel<0> : w.dtype == 1 ? linear_dmma_kernel<1> : linear_dmma_kernel<2>;
    launch("fwd_linear (fp64 tensor cores)", kern, g2, 32 * kDmmaWarps, 0, s, w, x, n, ldx, r0, nr, y, ldy);
  } else if (vec) {
    go(split ? linear_kernel<true, true> : linear_kernel<true, false>);
  } else {
    go(split ? linear_kernel<false, true> : linear_kernel<false, false>);
  }
}

bool fwd_linear_one_fits(const DMat& w) {
  return dmat_row_bytes(w) % 16 == 0 && reinterpret_cast<uintptr_t>(w.w) % 16 == 0 && w.cols <= kOneMaxCols;
}

bool fwd_linear_multi_fits(const DMat& w, const DMat& first) {
  return fwd_linear_one_fits(w) && w.cols == first.cols && w.layout == 0 && first.layout == 0 && w.dtype == first.dtype;
}

void fwd_linear_one_multi(LinearSegs g, const float* x, Stream s) {
  if (g.count < 1 || g.count > LinearSegs::kMax) throw_arg("fwd_linear_one_multi: 1 to 6 matrices");
  for (int i = 0; i < g.count; ++i)
    if (!fwd_linear_one_fits(g.seg[i].w) || g.seg[i].w.cols != g.seg[0].w.cols)
      throw_arg("fwd_linear_one_multi: the matrices must share their column count and fit the one-token kernel");
  launch_linear_one(g, x, s);
}

void fwd_prefetch_l2(const PrefetchRanges& r, Stream s) {
  if (r.count <= 0) return;
  // 16 blocks: the prefetch instructions only queue requests, and the kernels beside it keep the other SMs.
  launch_as(false, "fwd_prefetch_l2", prefetch_l2_kernel, dim3(16), dim3(256), 0, s, r);
}

void fwd_linear_indexed(const DMat* mats, const int32_t* idx, int nslots, int x_div, const float* x, int64_t ldx, int64_t rows,
                        int64_t cols, float* y, int64_t ldy, Stream s) {
  if (nslots <= 0 || rows <= 0) return;
  if (x_div < 1) throw_arg("fwd_linear_indexed: x_div must be positive");
  // A slot per grid row, so launches of at most 65535 slots (grid.y's limit; a step of n tokens x top-k experts can
  // pass it), each a multiple of x_div so that slot / x_div stays the input row within the chunk.
  const int chunk = (65535 / x_div) * x_div;
  for (int s0 = 0; s0 < nslots; s0 += chunk) {
    const dim3 grid(unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock), unsigned(std::min(chunk, nslots - s0)));
    launch("fwd_linear_indexed", linear_indexed_kernel, grid, 32 * kRowsPerBlock, 0, s, mats, idx ? idx + s0 : nullptr, x_div,
           x + int64_t(s0 / x_div) * ldx, ldx, rows, y + int64_t(s0) * ldy, ldy);
  }
}

void fwd_rms_norm(float* x, int64_t rows, int64_t dim, int64_t ld, const float* w, double eps, Stream s, uint16_t* out16,
                  int round_bf16) {
  if (rows <= 0) return;
  launch("fwd_rms_norm", rms_norm_kernel, unsigned(rows), kBlockThreads, 0, s, x, dim, ld, w, eps, out16, round_bf16);
}

// (row_pos: per_pos 0 is no layout; a negative one reads a position per group from dpos)
static void check_per_pos(const int64_t* dpos, int64_t per_pos, const char* what) {
  if (per_pos == 0 || (per_pos < 0 && !dpos)) throw_arg(std::string(what) + ": rows per position must be nonzero (negative: dpos holds each group's)");
}

void fwd_rms_norm_rope(float* x, int64_t rows, int64_t dim, const float* w, double eps, int64_t off, int half, const float* inv_freq,
                       float attention_factor, const int64_t* dpos, int64_t per_pos, Stream s, const RopeRows* also) {
  check_per_pos(dpos, per_pos, "fwd_rms_norm_rope");
  if (also && also->rows > 0) check_per_pos(dpos, also->per_pos, "fwd_rms_norm_rope (its second rows)");
  const RopeRows b = also && also->rows > 0 && also->half > 0 ? *also : RopeRows{};
  if (rows >= kWarpNormMinRows && dim <= int64_t(kBlockThreads) * kWarpMaxJ) {  // the same bits, a warp per row
    launch("fwd_rms_norm_rope (a warp per row)", rms_norm_rope_warp_kernel, unsigned((rows + kWarpRows - 1) / kWarpRows),
           32 * kWarpRows, 0, s, x, rows, dim, dim, w, eps, off, half, inv_freq, attention_factor, dpos, per_pos);
    if (b.rows) fwd_rope(b.x, b.rows, b.ld, b.off, b.half, inv_freq, attention_factor, dpos, 0, b.per_pos, 1, 0, s);
    return;
  }
  const int64_t norm_rows = std::max<int64_t>(rows, 0), blocks = norm_rows + fwd_blocks(b.rows * b.half, kBlockThreads);
  if (blocks <= 0) return;
  launch("fwd_rms_norm_rope", rms_norm_rope_kernel, unsigned(blocks), kBlockThreads, 0, s, x, norm_rows, dim, dim, w, eps, off, half,
         inv_freq, attention_factor, dpos, per_pos, b);
}

void fwd_rope(float* x, int64_t rows, int64_t ld, int64_t off, int half, const float* inv_freq, float attention_factor,
              const int64_t* dpos, int64_t pos0, int64_t per_pos, int64_t pos_step, int inverse, Stream s, int round_bf16) {
  const int64_t total = rows * half;
  if (total <= 0) return;
  check_per_pos(dpos, per_pos, "fwd_rope");
  launch("fwd_rope", rope_kernel, fwd_blocks(total, 256), 256, 0, s, x, rows, ld, off, half, inv_freq, attention_factor, dpos,
         pos0, per_pos, pos_step, inverse, round_bf16);
}

void fwd_rope_f16(float* x, int64_t rows, int64_t ld, int64_t off, const float* inv_freq, float attention_factor, const int64_t* dpos,
                  int64_t per_pos, int inverse, uint16_t* out16, Stream s) {
  if (ld % 2 || off % 2) throw_arg("fwd_rope_f16: rows and the rotated dims must start at even offsets");
  const int64_t total = rows * (ld / 2);
  if (total <= 0) return;
  check_per_pos(dpos, per_pos, "fwd_rope_f16");
  launch("fwd_rope_f16", rope_f16_kernel, fwd_blocks(total, 256), 256, 0, s, x, rows, ld, off, inv_freq, attention_factor, dpos,
         per_pos, inverse, reinterpret_cast<__half*>(out16));
}

void fwd_scale(const float* x, float a, float* y, int64_t n, Stream s, int round_in, int round_out) {
  if (n <= 0) return;
  launch("fwd_scale", scale_kernel, fwd_blocks(n, 256), 256, 0, s, x, a, y, n, round_in, round_out);
}

void fwd_to_bf16(const float* x, int64_t n, uint16_t* y, Stream s) {
  if (n <= 0) return;
  launch("fwd_to_bf16", to_bf16_kernel, fwd_blocks(n, 256), 256, 0, s, x, n, y);
}

void fwd_add(float* y, const float* x, int64_t n, Stream s, int round_bf16) {
  if (n <= 0) return;
  launch("fwd_add", add_kernel, fwd_blocks(n, 256), 256, 0, s, y, x, n, round_bf16);
}

}  // namespace plumb::cuda::detail
