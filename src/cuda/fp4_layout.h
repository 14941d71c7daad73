// The bytes of the MXFP4 decode layout (repack_fp4_decode, Fp4Layout::F16) and their decode to f16 pairs: one
// definition for the host's repack and unpack, the kernels (gemv.cu, gemv_fp4s.cuh, moe_prefill.cu) and the host
// test that replays the decode on every word (plain C++ stands in for the two intrinsics on the host).
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define PLUMB_FP4_HD __host__ __device__ __forceinline__
#else
#define PLUMB_FP4_HD inline
#endif

namespace plumb::cuda::fp4 {

// A byte of the layout holds two E2M1 codes s.e1.e0.m. L: sign at bit 7, e1 e0 m at bits 3..1 (an f16 high byte
// of value * 2^-14 after one AND). H: the mirror image, sign at bit 0, e1 e0 m at bits 4..6, so that reversing the
// word's bits (one instruction) puts every H code where L codes are, in the reversed byte order (byte b -> 3 - b).
// The old H placement (e1 e0 m at 6..4) took two shifts and two masks per word instead of the reversal.
PLUMB_FP4_HD uint8_t pack_lh(uint8_t L, uint8_t H) {
  return uint8_t(((L >> 3) << 7) | ((L & 7) << 1) | ((H >> 3) & 1) | (((H >> 2) & 1) << 4) | (((H >> 1) & 1) << 5) | ((H & 1) << 6));
}
PLUMB_FP4_HD uint8_t unpack_l(uint8_t b) { return uint8_t(((b >> 7) << 3) | ((b >> 1) & 7)); }
PLUMB_FP4_HD uint8_t unpack_h(uint8_t b) {
  return uint8_t(((b & 1) << 3) | (((b >> 4) & 1) << 2) | (((b >> 5) & 1) << 1) | ((b >> 6) & 1));
}

// __byte_perm(x, 0, sel) and __brev(x), on the host as plain C++.
PLUMB_FP4_HD uint32_t byte_perm0(uint32_t x, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, 0u, sel);
#else
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t k = (sel >> (4 * i)) & 7;  // selectors 0..3 pick a byte of x, 4..7 the zero word
    r |= (k < 4 ? (x >> (8 * k)) & 0xFFu : 0u) << (8 * i);
  }
  return r;
#endif
}
PLUMB_FP4_HD uint32_t bit_reverse(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __brev(x);
#else
  uint32_t r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
#endif
}

// The word's L codes (bytes 0..3 = elements e0, e1, e4, e5) and H codes (reversed: bytes 0..3 = e7, e6, e3, e2),
// each byte an f16 high byte.
PLUMB_FP4_HD uint32_t lo_codes(uint32_t w) { return w & 0x8E8E8E8Eu; }
PLUMB_FP4_HD uint32_t hi_codes(uint32_t w) { return bit_reverse(w) & 0x8E8E8E8Eu; }
// Byte selectors placing two of those bytes as the high bytes of an f16x2 (low half first), zeros below.
constexpr uint32_t kSelLo01 = 0x1404u;  // lo bytes (0, 1): (e0, e1)
constexpr uint32_t kSelLo23 = 0x3424u;  // lo bytes (2, 3): (e4, e5)
constexpr uint32_t kSelHi32 = 0x2434u;  // hi bytes (3, 2): (e2, e3)
constexpr uint32_t kSelHi10 = 0x0414u;  // hi bytes (1, 0): (e6, e7)

// Eight E2M1 codes of one 32-bit word of the layout to four f16x2, exactly, as value * 2^-14: a code s.e1.e0.m placed
// as the f16 bits s.00000.e1.e0.m.0000000 (bit 15, bits 11..9) is 2^(E-15) * (1 + m/2) for E = 2*e1 + e0 >= 1 and
// the subnormal m * 2^-15 for E = 0, i.e. the E2M1 value times 2^-14. Two ANDs, one bit reversal and four byte
// permutes per word (no conversion instruction). p01 = (e0, e1), p23 = (e2, e3), p45 = (e4, e5), p67 = (e6, e7).
PLUMB_FP4_HD void to_f16x2(uint32_t w, uint32_t& p01, uint32_t& p23, uint32_t& p45, uint32_t& p67) {
  const uint32_t lo = lo_codes(w), hi = hi_codes(w);
  p01 = byte_perm0(lo, kSelLo01);
  p45 = byte_perm0(lo, kSelLo23);
  p23 = byte_perm0(hi, kSelHi32);
  p67 = byte_perm0(hi, kSelHi10);
}

}  // namespace plumb::cuda::fp4
