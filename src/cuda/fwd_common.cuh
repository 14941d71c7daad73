// Device helpers of the forward kernels: checkpoint-format weight decoding (bit-exact with src/formats) and block
// reductions in fp64.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/fwd_kernels.h"
#include "cuda/launch.cuh"

namespace plumb::cuda::detail {

// E4M3 (OCP FP8): bias 7, subnormals 2^-9 * m, S.1111.111 is NaN, no infinities.
__device__ __forceinline__ float fwd_e4m3(uint8_t b) {
  const int e = (b >> 3) & 0xF, m = b & 7;
  float v;
  if (e == 0xF && m == 7) v = __int_as_float(0x7FC00000);
  else if (e == 0) v = float(m) * 0.001953125f;  // 2^-9
  else v = __int_as_float(((e + 120) << 23) | (m << 20));  // 2^(e-7) * (1 + m/8)
  return (b & 0x80) ? -v : v;
}
// E8M0: 2^(b-127); 0xFF is NaN; b = 0 is the fp32 subnormal 2^-127.
__device__ __forceinline__ float fwd_e8m0(uint8_t b) {
  if (b == 0xFF) return __int_as_float(0x7FC00000);
  if (b == 0) return __int_as_float(0x00400000);
  return __int_as_float(int(b) << 23);
}
// E2M1: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives.
__device__ __forceinline__ float fwd_e2m1(uint8_t code) {
  const int mag = code & 7;
  const float v = mag < 2 ? 0.5f * float(mag) : float(1 << ((mag >> 1) - 1)) * (1.0f + 0.5f * float(mag & 1));
  return (code & 8) ? -v : v;
}

// Bytes of one stored row of a DMat (packed FP4: two codes per byte; FP8: one; plain: 4 or 2).
__host__ __device__ __forceinline__ int64_t dmat_row_bytes(const DMat& m) {
  return m.layout == 2 ? m.cols / 2 : m.layout == 1 ? m.cols : m.cols * (m.dtype == 0 ? 4 : 2);
}

// Weight element (r, c) of a DMat, dequantized exactly as Matrix::row does.
__device__ __forceinline__ float fwd_w(const DMat& m, int64_t r, int64_t c) {
  switch (m.layout) {
    case 0: {
      const int64_t i = r * m.cols + c;
      if (m.dtype == 0) return static_cast<const float*>(m.w)[i];
      const uint16_t b = static_cast<const uint16_t*>(m.w)[i];
      return m.dtype == 1 ? __uint_as_float(uint32_t(b) << 16) : __half2float(__ushort_as_half(b));
    }
    case 1: {
      const int64_t si = (r >> 7) * m.s_cols + (c >> 7);
      const float sc = m.s_f32 ? static_cast<const float*>(m.s)[si] : fwd_e8m0(static_cast<const uint8_t*>(m.s)[si]);
      return fwd_e4m3(static_cast<const uint8_t*>(m.w)[r * m.cols + c]) * sc;
    }
    default: {
      const uint8_t byte = static_cast<const uint8_t*>(m.w)[r * (m.cols >> 1) + (c >> 1)];
      const uint8_t code = (byte >> (4 * (c & 1))) & 0xF;
      return fwd_e2m1(code) * fwd_e8m0(static_cast<const uint8_t*>(m.s)[r * m.s_cols + (c >> 5)]);
    }
  }
}

__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result. `sh` holds 32 doubles.
__device__ __forceinline__ double block_sum(double v, double* sh) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) sh[wid] = v;
  __syncthreads();
  double t = 0;
  for (int i = 0; i < nw; ++i) t += sh[i];  // fixed order: deterministic
  return t;
}

// kU elements at b, b + step, ... of v[0, n): indices clamped to n - 1 so that every load is issued before any is
// used (a block-strided loop at decode is latency-bound); the caller skips the clamped ones.
template <int kU>
__device__ __forceinline__ void load_strided(const float* v, int64_t b, int64_t step, int64_t n, float (&x)[kU]) {
#pragma unroll
  for (int u = 0; u < kU; ++u) x[u] = v[min(b + u * step, n - 1)];
}

// RMSNorm of one row in place, by the whole block (the reference's fp64 sum of squares, fp32 scale): shared by
// the norm kernel and the compressor's fused finish, so both round identically. `sh` holds 32 doubles. h16
// (optional): the normalized row also as f16 (round to nearest even), the tensor-core GEMVs' input.
// RMSNorm's fp32 scale from the fp64 sum of squares of dim values, and a weighted element: one definition for the
// norm kernels (rms_norm_row) and hc_pre's fused norm (fwd_hc.cu), so they round alike.
__device__ __forceinline__ float rms_inv(double ss, int64_t dim, double eps) { return float(1.0 / sqrt(ss / double(dim) + eps)); }
__device__ __forceinline__ float rms_scaled(float x, float inv, float g) { return g * (x * inv); }

// A thread's kU normalized elements b, b + step, ... of the row stored (weights g unless unweighted; bf16_out: each
// rounded to bf16 as it is stored; h16: also as f16). rms_norm_row's stores and rms_norm_kernel's one-pass path.
template <int kU>
__device__ __forceinline__ void rms_store(float* v, int64_t b, int64_t step, int64_t dim, const float (&x)[kU], const float (&g)[kU],
                                          bool weighted, float inv, bool bf16_out, __half* h16) {
#pragma unroll
  for (int u = 0; u < kU; ++u)
    if (b + u * step < dim) {
      float r = weighted ? rms_scaled(x[u], inv, g[u]) : x[u] * inv;
      if (bf16_out) r = bf16r(r);
      v[b + u * step] = r;
      if (h16) h16[b + u * step] = __float2half_rn(r);
    }
}

// bf16_out (the official numerics' rms_norm then act): each result rounded to bf16 as it is stored. kU: a thread's
// elements loaded together (any kU sums in the same order: the same bits).
template <int kU = 8>
__device__ __forceinline__ void rms_norm_row(float* v, int64_t dim, const float* w, double eps, double* sh, __half* h16 = nullptr,
                                             bool bf16_out = false) {
  // kU of a thread's elements are loaded before any is used (clamped indices, no early exit): one block per row is
  // latency-bound at decode, and a plain strided loop waited for each load in turn. Same order of accumulation.
  const int64_t step = blockDim.x;
  double ss = 0;
  for (int64_t b = threadIdx.x; b < dim; b += kU * step) {
    float x[kU];
    load_strided(v, b, step, dim, x);
#pragma unroll
    for (int u = 0; u < kU; ++u)
      if (b + u * step < dim) ss += double(x[u]) * x[u];
  }
  ss = block_sum(ss, sh);
  const float inv = rms_inv(ss, dim, eps);
  for (int64_t b = threadIdx.x; b < dim; b += kU * step) {
    float x[kU], g[kU];
    // Only this thread's own elements (not load_strided's clamped indices): v is written in place by these very
    // loops, and a clamped read of v[dim - 1] raced with its owner's store (compute-sanitizer racecheck, session 64;
    // the value was never used, so the results are the same bits). Still every load before any use.
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t i = b + u * step;
      const bool in = i < dim;
      x[u] = in ? v[i] : 0.0f, g[u] = w && in ? w[i] : 1.0f;
    }
    rms_store(v, b, step, dim, x, g, w != nullptr, inv, bf16_out, h16);
  }
}

// One interleaved RoPE pair (p[0], p[1]) at position `pos`, frequency inv_freq (ops::Rope's fp32 arithmetic).
__device__ __forceinline__ void rope_pair(float* p, int64_t pos, float inv_freq, float af, int inverse) {
  const float ang = float(pos) * inv_freq;
  const float c = cosf(ang) * af, s = (inverse ? -sinf(ang) : sinf(ang)) * af;
  const float a = p[0], b = p[1];
  p[0] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
  p[1] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

// Pair i of rope_kernel's rows (row i / half, pair i % half; position (*dpos) + pos0 + (row / per_pos) * pos_step);
// round_bf16 (the official numerics' rope then act): the pair's results rounded to bf16.
// The position of row r (fwd_kernels.h: per_pos > 0, a session's rows from *dpos, null for 0; per_pos < 0,
// forward_batch's groups of -per_pos rows, each at its own dpos[group]).
__device__ __forceinline__ int64_t row_pos(const int64_t* dpos, int64_t r, int64_t per_pos) {
  return per_pos > 0 ? (dpos ? *dpos : 0) + r / per_pos : dpos[r / -per_pos];
}

__device__ __forceinline__ void rope_one(float* x, int64_t i, int64_t ld, int64_t off, int half, const float* inv_freq, float af,
                                         const int64_t* dpos, int64_t pos0, int64_t per_pos, int64_t pos_step, int inverse,
                                         bool round_bf16 = false) {
  const int64_t r = i / half;
  const int k = int(i % half);
  const int64_t pos = per_pos > 0 ? (dpos ? *dpos : 0) + pos0 + (r / per_pos) * pos_step : row_pos(dpos, r, per_pos) + pos0;
  float* p = x + r * ld + off + 2 * k;
  rope_pair(p, pos, inv_freq[k], af, inverse);
  if (round_bf16) p[0] = bf16r(p[0]), p[1] = bf16r(p[1]);
}

// rms_norm_rope_kernel's row (fwd_ops.cu: a block of kNormThreads threads, w null or the norm's weight) computed by
// one warp: lane l stands for the block's threads l, 32 + l, ..., 224 + l, their elements, sums of squares and warp
// sums kept apart, the 8 warp sums then added in warp order as block_sum does, so the bits are that kernel's. Reads
// `in` (dim <= kNormThreads * kNormMaxJ), writes the normalized row to `out` (may be `in`), then rotates out's dims
// [off, off + 2 * half) at position pos. Used by rms_norm_rope_warp_kernel and by the split-K attention, which
// normalizes and rotates its query heads itself.
constexpr int kNormThreads = 256, kNormMaxJ = 4;
__device__ __forceinline__ void rms_norm_rope_row_warp(const float* in, float* out, int64_t dim, const float* w, double eps, int64_t off,
                                                       int half, const float* inv_freq, float af, int64_t pos) {
  constexpr int kT = kNormThreads / 32;  // the block kernel's warps
  const int lane = int(threadIdx.x & 31);
  float v[kT][kNormMaxJ];
  double ss[kT];
#pragma unroll
  for (int s = 0; s < kT; ++s) {
    ss[s] = 0;
#pragma unroll
    for (int j = 0; j < kNormMaxJ; ++j) {
      const int64_t i = 32 * s + lane + int64_t(kNormThreads) * j;
      if (i < dim) v[s][j] = in[i], ss[s] += double(v[s][j]) * v[s][j];
    }
  }
  double tot = 0;
#pragma unroll
  for (int s = 0; s < kT; ++s) tot += warp_sum(ss[s]);
  const float inv = rms_inv(tot, dim, eps);
#pragma unroll
  for (int s = 0; s < kT; ++s)
#pragma unroll
    for (int j = 0; j < kNormMaxJ; ++j) {
      const int64_t i = 32 * s + lane + int64_t(kNormThreads) * j;
      if (i < dim) out[i] = w ? rms_scaled(v[s][j], inv, w[i]) : v[s][j] * inv;
    }
  __syncwarp();  // the normalized row, written by every lane, read by the pairs' owners
  for (int k = lane; k < half; k += 32) rope_pair(out + off + 2 * k, pos, inv_freq[k], af, 0);
}

// Top-k order: a ranks before b when larger, NaN largest, equal values by lower index (PyTorch's CUDA order).
template <class I>
__device__ __forceinline__ bool beats(float va, I ia, float vb, I ib) {
  const bool na = isnan(va), nb = isnan(vb);
  if (na != nb) return na;
  if (!na && va != vb) return va > vb;
  return ia < ib;
}

inline int fwd_blocks(int64_t n, int threads) { return int((n + threads - 1) / threads); }

}  // namespace plumb::cuda::detail
