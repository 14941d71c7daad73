// Bit-exactness of the scalar formats, checked against formulas written here from the bit fields.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "formats/numeric.h"

namespace {

using namespace plumb::fmt8;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

float from_bits(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

// Reference decoders: sign, biased exponent and mantissa fields combined with ldexp in double.
double ref_e4m3(uint8_t c) {
  const int s = c >> 7, e = (c >> 3) & 0xF, m = c & 0x7;
  if (e == 0xF && m == 0x7) return std::nan("");
  const double mag = e == 0 ? std::ldexp(m / 8.0, 1 - 7) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

double ref_float(uint32_t bits, int exp_bits, int mant_bits) {
  const int bias = (1 << (exp_bits - 1)) - 1;
  const uint32_t s = bits >> (exp_bits + mant_bits);
  const int e = int((bits >> mant_bits) & ((1u << exp_bits) - 1));
  const uint32_t m = bits & ((1u << mant_bits) - 1);
  const double frac = std::ldexp(double(m), -mant_bits);
  double mag;
  if (e == (1 << exp_bits) - 1)
    mag = m ? std::nan("") : HUGE_VAL;
  else if (e == 0)
    mag = std::ldexp(frac, 1 - bias);
  else
    mag = std::ldexp(1.0 + frac, e - bias);
  return s ? -mag : mag;
}

// Exact equality that also tells +0 from -0 and accepts NaN only against NaN.
void expect_same(double want, float got, uint32_t code) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << "code 0x" << std::hex << code;
    return;
  }
  EXPECT_EQ(want, double(got)) << "code 0x" << std::hex << code;
  EXPECT_EQ(std::signbit(want), std::signbit(got)) << "code 0x" << std::hex << code;
}

bool e4m3_is_nan(int c) { return (c & 0x7F) == 0x7F; }

TEST(E4M3, DecodesEveryCodeLikeTheBitFieldFormula) {
  for (int c = 0; c < 256; ++c) expect_same(ref_e4m3(uint8_t(c)), e4m3_to_f32(uint8_t(c)), uint32_t(c));
}

TEST(E4M3, OnlyTheTwoAllOnesCodesAreNaN) {
  for (int c = 0; c < 256; ++c) EXPECT_EQ(std::isnan(e4m3_to_f32(uint8_t(c))), e4m3_is_nan(c)) << c;
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0xFE), -448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
}

TEST(E4M3, EncodeOfDecodeIsIdentityForEveryFiniteCode) {
  for (int c = 0; c < 256; ++c) {
    if (e4m3_is_nan(c)) continue;
    EXPECT_EQ(f32_to_e4m3(e4m3_to_f32(uint8_t(c))), c) << c;  // includes 0x00 and 0x80
  }
}

TEST(E4M3, MidpointsTieToEvenAndNeighboursRoundToNearest) {
  // Consecutive positive codes are consecutive values, and the even code is the one with mantissa LSB 0.
  for (int c = 0; c + 1 <= 0x7E; ++c) {
    const float lo = float(ref_e4m3(uint8_t(c))), hi = float(ref_e4m3(uint8_t(c + 1)));
    const float mid = float((double(lo) + double(hi)) / 2);  // one extra mantissa bit: exact in f32
    const int even = (c % 2 == 0) ? c : c + 1;
    EXPECT_EQ(f32_to_e4m3(mid), even) << "midpoint above code " << c;
    EXPECT_EQ(f32_to_e4m3(-mid), even | 0x80) << "negative midpoint above code " << c;
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, 0.0f)), c) << c;
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, kInf)), c + 1) << c;
  }
}

TEST(E4M3, SubnormalEdges) {
  const float step = std::ldexp(1.0f, -9);  // smallest subnormal
  EXPECT_EQ(f32_to_e4m3(step / 2), 0x00);   // tie between 0 and 1 step: even is 0
  EXPECT_EQ(f32_to_e4m3(-step / 2), 0x80);  // signed zero
  EXPECT_EQ(f32_to_e4m3(std::nextafter(step / 2, 1.0f)), 0x01);
  EXPECT_EQ(f32_to_e4m3(step / 4), 0x00);
  EXPECT_EQ(f32_to_e4m3(-1e-30f), 0x80);
  EXPECT_EQ(f32_to_e4m3(from_bits(0x00000001)), 0x00);  // f32 subnormal input
  EXPECT_EQ(f32_to_e4m3(1.5f * step), 0x02);            // tie between codes 1 and 2: even is 2
  EXPECT_EQ(f32_to_e4m3(2.5f * step), 0x02);            // tie between codes 2 and 3
  // 7.5 steps lies halfway between the largest subnormal (0x07) and the smallest normal 2^-6 (0x08).
  EXPECT_EQ(f32_to_e4m3(7.5f * step), 0x08);
  EXPECT_EQ(f32_to_e4m3(std::nextafter(7.5f * step, 0.0f)), 0x07);
  EXPECT_EQ(f32_to_e4m3(-7.75f * step), 0x88);
}

TEST(E4M3, SaturatesAndMapsNaN) {
  EXPECT_EQ(f32_to_e4m3(448.0f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(449.0f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(464.0f), 0x7E);  // tie between 448 and the would-be 480: even is 0x7E
  // Past that midpoint plain RNE would pick the exponent-15 mantissa-7 code, which is NaN.
  EXPECT_EQ(f32_to_e4m3(std::nextafter(464.0f, kInf)), 0x7E);
  EXPECT_EQ(f32_to_e4m3(-470.0f), 0xFE);
  EXPECT_EQ(f32_to_e4m3(1e6f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(kInf), 0x7E);
  EXPECT_EQ(f32_to_e4m3(-500.0f), 0xFE);
  EXPECT_EQ(f32_to_e4m3(-kInf), 0xFE);
  EXPECT_EQ(f32_to_e4m3(kNaN), 0x7F);
  EXPECT_EQ(f32_to_e4m3(-kNaN), 0x7F);
  EXPECT_EQ(f32_to_e4m3(432.0f), 0x7E);  // tie between 416 (0x7D) and 448 (0x7E): even is 0x7E
}

TEST(E8M0, DecodesEveryCodeAsAPowerOfTwo) {
  for (int b = 0; b < 255; ++b) EXPECT_EQ(double(e8m0_to_f32(uint8_t(b))), std::ldexp(1.0, b - 127)) << b;
  EXPECT_TRUE(std::isnan(e8m0_to_f32(0xFF)));
  EXPECT_EQ(e8m0_to_f32(0x7F), 1.0f);
  EXPECT_GT(e8m0_to_f32(0x00), 0.0f);  // 2^-127 is an f32 subnormal, not flushed to zero
}

TEST(E2M1, DecodesEveryCodeFromTheTable) {
  const float table[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int c = 0; c < 16; ++c) {
    const float want = (c & 8) ? -table[c & 7] : table[c & 7];
    EXPECT_EQ(e2m1_to_f32(uint8_t(c)), want) << c;
    EXPECT_EQ(std::signbit(e2m1_to_f32(uint8_t(c))), bool(c & 8)) << c;
    EXPECT_EQ(f32_to_e2m1(e2m1_to_f32(uint8_t(c))), c) << c;
  }
}

TEST(E2M1, EncoderTiesToEvenAndSaturates) {
  EXPECT_EQ(f32_to_e2m1(0.25f), 0x0);  // 0 | 0.5
  EXPECT_EQ(f32_to_e2m1(0.75f), 0x2);  // 0.5 | 1
  EXPECT_EQ(f32_to_e2m1(1.25f), 0x2);  // 1 | 1.5
  EXPECT_EQ(f32_to_e2m1(1.75f), 0x4);  // 1.5 | 2
  EXPECT_EQ(f32_to_e2m1(2.5f), 0x4);   // 2 | 3
  EXPECT_EQ(f32_to_e2m1(3.5f), 0x6);   // 3 | 4
  EXPECT_EQ(f32_to_e2m1(5.0f), 0x6);   // 4 | 6
  EXPECT_EQ(f32_to_e2m1(-2.5f), 0xC);
  EXPECT_EQ(f32_to_e2m1(std::nextafter(2.5f, 3.0f)), 0x5);
  EXPECT_EQ(f32_to_e2m1(std::nextafter(5.0f, 6.0f)), 0x7);
  EXPECT_EQ(f32_to_e2m1(0.26f), 0x1);
  EXPECT_EQ(f32_to_e2m1(7.0f), 0x7);
  EXPECT_EQ(f32_to_e2m1(1e30f), 0x7);
  EXPECT_EQ(f32_to_e2m1(-kInf), 0xF);
  EXPECT_EQ(f32_to_e2m1(kNaN), 0x0);
}

TEST(BF16, DecodesEveryCodeAndRoundTrips) {
  for (uint32_t c = 0; c < 0x10000; ++c) {
    const float x = bf16_to_f32(uint16_t(c));
    expect_same(ref_float(c, 8, 7), x, c);
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(x)))) << c;
    } else {
      EXPECT_EQ(f32_to_bf16(x), c) << c;
    }
  }
}

TEST(BF16, RoundsToNearestTiesToEven) {
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f), 0x3F80);         // midpoint of 0x3F80 and 0x3F81: even
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);     // midpoint of 0x3F81 and 0x3F82: even
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F808001)), 0x3F81);  // just above a midpoint
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F817FFF)), 0x3F81);  // just below a midpoint
  EXPECT_EQ(f32_to_bf16(-(1.0f + 0x1p-8f)), 0xBF80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds past the top to inf
  EXPECT_EQ(f32_to_bf16(-kInf), 0xFF80);
  EXPECT_EQ(round_bf16(3.0f), 3.0f);
}

TEST(BF16, NaNStaysNaN) {
  // A signalling NaN whose payload sits entirely in the dropped half would truncate to infinity.
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(from_bits(0x7F800001)))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(from_bits(0xFF800001)))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(from_bits(0x7FFFFFFF)))));  // no carry into the sign
  EXPECT_EQ(f32_to_bf16(from_bits(0x7F800001)) & 0x0040, 0x0040);            // quiet bit set
}

TEST(F16, DecodesEveryCode) {
  for (uint32_t c = 0; c < 0x10000; ++c) expect_same(ref_float(c, 5, 10), f16_to_f32(uint16_t(c)), c);
}

TEST(F16, SpecialValues) {
  EXPECT_EQ(f16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x03FF), std::ldexp(1023.0f, -24));
  EXPECT_EQ(f16_to_f32(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_EQ(f16_to_f32(0x7BFF), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x7C00), kInf);
  EXPECT_EQ(f16_to_f32(0xFC00), -kInf);
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7E00)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7C01)));
  EXPECT_TRUE(std::signbit(f16_to_f32(0x8000)));
}

}  // namespace
