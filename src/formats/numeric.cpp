// Bit-exact decoders and round-to-nearest-even encoders for the scalar formats declared in numeric.h.
#include "formats/numeric.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace plumb::fmt8 {
namespace {

float bits_f32(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

// Round a non-negative value below 2^24 to an integer, ties to even. Written out rather than calling
// nearbyint so the result never depends on the caller's floating-point rounding mode.
uint32_t round_half_even(float q) {
  const float lo = std::floor(q);
  const float frac = q - lo;  // exact for q < 2^24
  uint32_t n = uint32_t(lo);
  if (frac > 0.5f || (frac == 0.5f && (n & 1u))) ++n;
  return n;
}

// The non-negative E2M1 magnitudes, indexed by the low three bits of the code.
constexpr float kE2M1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

}  // namespace

float f16_to_f32(uint16_t bits) {
  const uint32_t sign = uint32_t(bits & 0x8000u) << 16;
  const uint32_t exp = (bits >> 10) & 0x1Fu;
  const uint32_t mant = bits & 0x3FFu;
  if (exp == 0x1F) return bits_f32(sign | 0x7F800000u | (mant << 13));  // inf, or NaN with its payload
  // Subnormals (exp 0) are mant * 2^-24; normals are (1024 + mant) * 2^(exp - 25). Both are exact in f32.
  const float mag = exp == 0 ? std::ldexp(float(mant), -24) : std::ldexp(float(1024u + mant), int(exp) - 25);
  return sign ? -mag : mag;
}

float e4m3_to_f32(uint8_t bits) {
  const uint32_t exp = (bits >> 3) & 0xFu;
  const uint32_t mant = bits & 0x7u;
  if (exp == 0xF && mant == 0x7) return std::numeric_limits<float>::quiet_NaN();
  // Subnormals are mant * 2^-9; normals are (8 + mant) * 2^(exp - 10).
  const float mag = exp == 0 ? std::ldexp(float(mant), -9) : std::ldexp(float(8u + mant), int(exp) - 10);
  return (bits & 0x80u) ? -mag : mag;
}

uint8_t f32_to_e4m3(float x) {
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float a = std::fabs(x);
  if (a >= 448.0f) return sign | 0x7E;  // satfinite: everything past the largest finite value clamps to it
  if (a < 0x1p-6f) {
    // Subnormal range: the code is simply the number of 2^-9 steps. Rounding 7.5 or more steps up gives 8,
    // which is exactly the code of the smallest normal (exponent field 1, mantissa 0), so the carry into
    // the normal range needs no special case; below half a step rounds to (signed) zero.
    return sign | uint8_t(round_half_even(a * 0x1p9f));
  }
  int e;
  const float f = std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1); unbiased exponent is e - 1
  // Mantissa in eighths; rounding up to 8 carries into the exponent field through the addition below.
  // a < 448 keeps the result at or below 0x7E, so it never produces the NaN code.
  const uint32_t m = round_half_even(f * 16.0f - 8.0f);
  return sign | uint8_t((uint32_t(e + 6) << 3) + m);
}

float e8m0_to_f32(uint8_t bits) {
  if (bits == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, int(bits) - 127);  // 2^-127 is an f32 subnormal, still exact
}

float e2m1_to_f32(uint8_t code) {
  const float mag = kE2M1[code & 0x7u];
  return (code & 0x8u) ? -mag : mag;
}

uint8_t f32_to_e2m1(float x) {
  if (std::isnan(x)) return 0;
  const uint8_t sign = std::signbit(x) ? 0x8 : 0x0;
  const float a = std::fabs(x);
  // Walk the grid; at an exact midpoint take the even code, whose mantissa bit is zero.
  for (uint8_t i = 0; i < 7; ++i) {
    const float mid = 0.5f * (kE2M1[i] + kE2M1[i + 1]);
    if (a < mid) return sign | i;
    if (a == mid) return sign | uint8_t((i & 1u) ? i + 1 : i);
  }
  return sign | 0x7;  // at or beyond the midpoint of 4 and 6: 6, which also saturates everything larger
}

}  // namespace plumb::fmt8
