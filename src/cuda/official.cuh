// Device primitives of the official numerics (model/numerics.cpp's official:: functions on the GPU): bf16 storage,
// E4M3 / E2M1 round trips with power-of-two block scales (model/official_math.h), the indexer's Hadamard rotation.
// The block-wide row functions are shared by fwd_official.cu's kernels and the compressor's fused finish.
#pragma once
#include <cuda_fp4.h>
#include <cuda_fp8.h>

#include "cuda/fwd_common.cuh"
#include "model/official_math.h"

namespace plumb::cuda::detail {

// RNE onto the E4M3 / E2M1 grids (inputs already clamped to the finite range), as fmt8::f32_to_e4m3 / f32_to_e2m1.
__device__ __forceinline__ float e4m3_rne(float v) { return fwd_e4m3(uint8_t(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3))); }
__device__ __forceinline__ float e2m1_rne(float v) { return fwd_e2m1(uint8_t(__nv_cvt_float_to_fp4(v, __NV_E2M1, cudaRoundNearest))); }

// official::fp8_quant_block for one block of x[0, n): writes the E4M3 values (q may be x: in place) and returns
// the scale. One thread, in element order (amax is order-free).
__device__ __forceinline__ float fp8_quant_one(const float* x, int64_t n, float* q) {
  using namespace official_math;
  float amax = kFp8AmaxFloor;
  for (int64_t i = 0; i < n; ++i) amax = fmaxf(amax, fabsf(x[i]));
  const float s = pow2_scale(amax, 1.0f / kFp8Max);
  for (int64_t i = 0; i < n; ++i) q[i] = e4m3_rne(fminf(fmaxf(__fdiv_rn(x[i], s), -kFp8Max), kFp8Max));
  return s;
}

// The amax of x[0, n) over a warp (lanes striding the elements; max is exact in any order), from `floor`.
__device__ __forceinline__ float warp_amax(const float* x, int64_t n, float floor, int lane) {
  float amax = floor;
  for (int64_t i = lane; i < n; i += 32) amax = fmaxf(amax, fabsf(x[i]));
  return warp_max(amax);
}

// official::fp8_roundtrip / fp4_roundtrip of one row v[0, n) by the calling block (blockDim a multiple of 32): a
// warp per scale block, its amax by warp_amax, then each element's quantization and rescale as the serial
// official:: code computes it (the same operations per element: the same bits).
template <bool FP4>
__device__ __forceinline__ void roundtrip_row(float* v, int64_t n, int block) {
  using namespace official_math;
  constexpr float kMax = FP4 ? kFp4Max : kFp8Max;
  const int lane = int(threadIdx.x & 31);
  for (int64_t b0 = int64_t(threadIdx.x >> 5) * block; b0 < n; b0 += int64_t(blockDim.x >> 5) * block) {
    const int64_t len = min(int64_t(block), n - b0);
    const float s = pow2_scale(warp_amax(v + b0, len, FP4 ? kFp4AmaxFloor : kFp8AmaxFloor, lane), 1.0f / kMax);
    for (int64_t i = b0 + lane; i < b0 + len; i += 32) {
      const float q = fminf(fmaxf(__fdiv_rn(v[i], s), -kMax), kMax);
      v[i] = bf16r(__fmul_rn(FP4 ? e2m1_rne(q) : e4m3_rne(q), s));
    }
  }
}
__device__ __forceinline__ void fp8_roundtrip_row(float* v, int64_t n, int block) { roundtrip_row<false>(v, n, block); }
__device__ __forceinline__ void fp4_roundtrip_row(float* v, int64_t n, int block) { roundtrip_row<true>(v, n, block); }

constexpr int kHadamardMax = 1024;  // the rotated row's length bound (index_head_dim)

// official::hadamard of v[0, n) by the calling block, through `y` (shared, kHadamardMax floats): zero-padded to the
// next power of two, the Sylvester butterflies stage by stage (each element's adds in the CPU's order), scaled by
// float(n^-1/2), bf16 out. Ends with a barrier.
__device__ __forceinline__ void hadamard_row(float* v, int64_t n, float* y) {
  int64_t p = 1;
  while (p < n) p *= 2;
  for (int64_t i = threadIdx.x; i < p; i += blockDim.x) y[i] = i < n ? v[i] : 0.0f;
  __syncthreads();
  for (int64_t h = 1; h < p; h *= 2) {
    for (int64_t k = threadIdx.x; k < p / 2; k += blockDim.x) {
      const int64_t j = (k / h) * 2 * h + k % h;
      const float a = y[j], b = y[j + h];
      y[j] = __fadd_rn(a, b), y[j + h] = __fsub_rn(a, b);
    }
    __syncthreads();
  }
  const float scale = float(1.0 / sqrt(double(n)));
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) v[i] = bf16r(__fmul_rn(y[i], scale));
  __syncthreads();
}

// Numerics::indexer_rotate of one row by the calling block.
__device__ __forceinline__ void indexer_rotate_row(float* v, int64_t n, float* y) {
  hadamard_row(v, n, y);
  fp4_roundtrip_row(v, n, official_math::kFp4Block);
  __syncthreads();
}

}  // namespace plumb::cuda::detail
