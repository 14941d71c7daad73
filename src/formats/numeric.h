// Bit-exact scalar formats of DeepSeek-V4 checkpoints and activations: BF16, F16, FP8 E4M3 (fn), E8M0, FP4 E2M1.
// Every decoder is exact; every encoder rounds to nearest, ties to even, as the hardware cvt instructions do.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace plumb::fmt8 {

// Inline: the CPU reference's bf16 linears (the LM head's 0.5 G weights) convert every element.
inline float bf16_to_f32(uint16_t bits) {
  const uint32_t b = uint32_t(bits) << 16;
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}
// RNE; NaN stays NaN (quiet).
inline uint16_t f32_to_bf16(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  // Truncating a NaN could clear every payload bit that survives and turn it into an infinity;
  // setting the quiet bit keeps it a NaN (and the sign is preserved).
  if (std::isnan(x)) return uint16_t((b >> 16) | 0x0040u);
  // Adding 0x7FFF plus the lowest kept bit carries into the kept half exactly when the dropped half is
  // above the midpoint, or at it with an odd kept half: round to nearest, ties to even. A carry out of
  // the largest finite value lands on infinity, which is the correct rounding of an overflow.
  const uint32_t rounded = b + 0x7FFFu + ((b >> 16) & 1u);
  return uint16_t(rounded >> 16);
}
inline float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

float f16_to_f32(uint16_t bits);

// FP8 E4M3 "fn": bias 7, no infinities, 0x7F/0xFF are NaN, max finite 448.
float e4m3_to_f32(uint8_t bits);
// RNE; |x| beyond the finite range saturates to +-448 (the "satfinite" conversion); NaN -> 0x7F.
uint8_t f32_to_e4m3(float x);

// E8M0 (float8_e8m0fnu): value 2^(b-127); 0xFF is NaN; no sign, no zero.
float e8m0_to_f32(uint8_t bits);

// FP4 E2M1: code 0..15, sign in bit 3, values {0, .5, 1, 1.5, 2, 3, 4, 6}.
float e2m1_to_f32(uint8_t code);
// RNE onto the E2M1 grid, saturating at +-6; NaN -> 0.
uint8_t f32_to_e2m1(float x);

}  // namespace plumb::fmt8
