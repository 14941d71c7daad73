// Bit-exact scalar formats of DeepSeek-V4 checkpoints and activations: BF16, F16, FP8 E4M3 (fn), E8M0, FP4 E2M1.
// Every decoder is exact; every encoder rounds to nearest, ties to even, as the hardware cvt instructions do.
#pragma once
#include <cstddef>
#include <cstdint>

namespace plumb::fmt8 {

float bf16_to_f32(uint16_t bits);
uint16_t f32_to_bf16(float x);  // RNE; NaN stays NaN (quiet)
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
