// Shared device helpers for the CUDA translation units: error checks, format conversions, the f16 tensor-core op.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace plumb::cuda::detail {

[[noreturn]] inline void throw_cuda(cudaError_t e, const char* what, const char* file, int line) {
  char buf[512];
  std::snprintf(buf, sizeof buf, "CUDA error %s (%s) in %s at %s:%d", cudaGetErrorName(e), cudaGetErrorString(e), what, file,
                line);
  throw std::runtime_error(buf);
}
#define PLUMB_CUDA_CHECK(call)                                                          \
  do {                                                                                  \
    cudaError_t e_ = (call);                                                            \
    if (e_ != cudaSuccess) ::plumb::cuda::detail::throw_cuda(e_, #call, __FILE__, __LINE__); \
  } while (0)

[[noreturn]] inline void throw_arg(const std::string& msg) { throw std::runtime_error("plumb cuda: " + msg); }

// ---- conversions ----

// Two E4M3 codes (low byte -> low half) to f16x2. Exact: every E4M3 value (subnormals included) is an f16 normal.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint16_t v) {
  uint32_t d;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(d) : "h"(v));
  return d;
}
__device__ __forceinline__ void e4m3x4_to_f16x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
  lo = e4m3x2_to_f16x2(uint16_t(w & 0xFFFFu));
  hi = e4m3x2_to_f16x2(uint16_t(w >> 16));
}

// E8M0 scale bytes to fp32 (2^(b-127)): byte j of a word, two integer ops. The zero byte (2^-127) becomes 0 and
// 0xFF (NaN) becomes +inf: uploads refuse NaN scales, and a 2^-127 scale's products are below 6 * 2^-127 * |x|.
template <int J>
__device__ __forceinline__ float e8m0_byte(uint32_t w) {
  if constexpr (J == 3) return __uint_as_float((w >> 1) & 0x7F800000u);
  else return __uint_as_float((w << (23 - 8 * J)) & 0x7F800000u);
}
__device__ __forceinline__ float e8m0_to_f32(uint32_t b) { return __uint_as_float((b & 0xFFu) << 23); }

__device__ __forceinline__ uint32_t f32x2_to_f16x2(float a, float b) {
  const __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ __forceinline__ float bf16_bits_to_f32(uint32_t b16) { return __uint_as_float(b16 << 16); }

// D = A(16x16, f16, row) * B(16x8, f16, col) + D, fp32 accumulate.
__device__ __forceinline__ void mma_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 16-byte weight loads: read once, so keep them out of L1 (hint 1 also asks L2 to fetch 256-byte blocks).
template <int HINT>
__device__ __forceinline__ uint4 ldg_stream(const void* p) {
  uint4 v;
  if constexpr (HINT == 1) {
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  } else {
    asm("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  }
  return v;
}

}  // namespace plumb::cuda::detail
