// The small kernels around the FP8 prefill GEMMs (fp8_gemm.cpp, patch cuda.prefill_gemm): an FP8 block-scaled
// weight dequantized into bf16, activations converted to bf16, and the shared expert's SwiGLU between its two GEMMs.
// All memory-bound; the GEMMs themselves are cuBLASLt's (blas.cpp).
#include "cuda/launch.cuh"

namespace plumb::cuda::detail {

namespace {

__device__ __forceinline__ uint32_t bf16x2(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// 16 codes of one row per thread (cols % 128 == 0, so the 16 share one 128-column scale block). E4M3 -> f16 is
// exact (cvt), f16 -> f32 exact, times the E8M0 power of two exact, and the host admits only scales for which every
// product is a bf16 normal (fp8_gemm_exact), so the bf16 rounding is exact too: out is exactly the weight the GEMV
// path multiplies by (code value x block scale).
__global__ void dequant_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales, int64_t cols, int64_t s_ld,
                               int64_t chunks, uint16_t* __restrict__ out) {
  pdl_begin();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= chunks) return;
  const int64_t per_row = cols / 16, r = i / per_row, c = (i % per_row) * 16;
  const float s = e8m0_to_f32(scales[(r / 128) * s_ld + c / 128]);
  const uint4 w = reinterpret_cast<const uint4*>(codes)[i];
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  uint32_t o[8];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    uint32_t lo, hi;
    e4m3x4_to_f16x2(words[q], lo, hi);
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo)), b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
    o[2 * q] = bf16x2(a.x * s, a.y * s);
    o[2 * q + 1] = bf16x2(b.x * s, b.y * s);
  }
  uint4* dst = reinterpret_cast<uint4*>(out) + 2 * i;
  dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
  dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

// 8 activations per thread, 16-byte loads (the host checks the alignment), round to nearest even.
template <int ACT>
__global__ void to_bf16_vec_kernel(const void* __restrict__ x, int64_t cols, int64_t ldx, int64_t chunks, uint16_t* __restrict__ out) {
  pdl_begin();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= chunks) return;
  const int64_t per_row = cols / 8, r = i / per_row, c = (i % per_row) * 8;
  float v[8];
  if constexpr (ACT == kF32) {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(x) + r * ldx + c);
    const float4 a = p[0], b = p[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
    const uint4 a = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(x) + r * ldx + c);
    const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if constexpr (ACT == kF16) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[q]));
        v[2 * q] = f.x, v[2 * q + 1] = f.y;
      } else {
        v[2 * q] = bf16_bits_to_f32(w[q] & 0xFFFFu), v[2 * q + 1] = bf16_bits_to_f32(w[q] >> 16);
      }
    }
  }
  *reinterpret_cast<uint4*>(out + r * cols + c) = make_uint4(bf16x2(v[0], v[1]), bf16x2(v[2], v[3]), bf16x2(v[4], v[5]), bf16x2(v[6], v[7]));
}

// One activation per thread: any alignment.
__global__ void to_bf16_kernel(const void* __restrict__ x, int act, int64_t cols, int64_t ldx, int64_t total, uint16_t* __restrict__ out) {
  pdl_begin();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int64_t r = i / cols, c = i % cols, at = r * ldx + c;
  const float v = act == kF32 ? static_cast<const float*>(x)[at]
                  : act == kF16 ? __half2float(static_cast<const __half*>(x)[at])
                                : bf16_bits_to_f32(static_cast<const uint16_t*>(x)[at]);
  out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

// h[t, c] = bf16(silu(min(g, L)) * clamp(u, -L, L)) with g = gu[t, c], u = gu[t, I + c]: the GEMV epilogue's formula
// (swiglu_clamped), on the fp32 GEMM outputs.
__global__ void swiglu_bf16_kernel(const float* __restrict__ gu, int64_t I, int64_t total, float limit, uint16_t* __restrict__ h) {
  pdl_begin();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int64_t t = i / I, c = i % I;
  h[i] = __bfloat16_as_ushort(__float2bfloat16_rn(swiglu_clamped(gu[t * 2 * I + c], gu[t * 2 * I + I + c], limit)));
}

inline int blocks(int64_t n, int threads) { return int((n + threads - 1) / threads); }
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

void launch_fp8_dequant_bf16(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, int64_t s_ld, uint16_t* out,
                             Stream s) {
  if (rows <= 0 || cols % 128 || !aligned16(codes) || !aligned16(out))
    throw_arg("fp8 dequant: columns must be a multiple of 128 and the buffers 16-byte aligned, got [" + std::to_string(rows) + ", " +
              std::to_string(cols) + "]");
  const int64_t chunks = rows * cols / 16;
  launch("fp8_dequant_bf16", dequant_kernel, blocks(chunks, 256), 256, 0, s, codes, scales, cols, s_ld, chunks, out);
}

void launch_to_bf16(const void* x, int act, int n, int64_t cols, int64_t ldx, uint16_t* out, Stream s) {
  if (n <= 0 || cols <= 0) return;
  const int64_t es = act == kF32 ? 4 : 2;
  if (cols % 8 == 0 && aligned16(x) && aligned16(out) && (ldx * es) % 16 == 0) {
    const int64_t chunks = int64_t(n) * cols / 8;
    if (act == kF32) return launch("to_bf16", to_bf16_vec_kernel<kF32>, blocks(chunks, 256), 256, 0, s, x, cols, ldx, chunks, out);
    if (act == kF16) return launch("to_bf16", to_bf16_vec_kernel<kF16>, blocks(chunks, 256), 256, 0, s, x, cols, ldx, chunks, out);
    return launch("to_bf16", to_bf16_vec_kernel<kBF16>, blocks(chunks, 256), 256, 0, s, x, cols, ldx, chunks, out);
  }
  const int64_t total = int64_t(n) * cols;
  launch("to_bf16", to_bf16_kernel, blocks(total, 256), 256, 0, s, x, act, cols, ldx, total, out);
}

void launch_swiglu_bf16(const float* gu, int n, int64_t I, float limit, uint16_t* h, Stream s) {
  const int64_t total = int64_t(n) * I;
  if (total <= 0) return;
  launch("swiglu_bf16", swiglu_bf16_kernel, blocks(total, 256), 256, 0, s, gu, I, total, limit, h);
}

}  // namespace plumb::cuda::detail
