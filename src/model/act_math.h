// The experts' activations other than SiLU that transformers applies for config.json's hidden_act (ModelConfig::act),
// in fp32 as torch computes them: one definition for the CPU reference (model/ops.h, expert_act) and the GPU's fp32
// twin SwiGLU (cuda/common.cuh). Includes no plumb header but host_device.h, so nvcc compiles it too, like
// model/hc_math.h.
#pragma once
#include <math.h>

#include "model/host_device.h"

namespace plumb::act_math {

PLUMB_HD inline float gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }  // GELU with erf
// GELU's tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) ("gelu_pytorch_tanh", "gelu_new")
PLUMB_HD inline float gelu_tanh(float x) { return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x))); }
PLUMB_HD inline float relu(float x) { return x < 0.0f ? 0.0f : x; }  // (NaN stays NaN, as torch's)

}  // namespace plumb::act_math
