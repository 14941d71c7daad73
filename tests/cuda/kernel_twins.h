// CPU twins the kernel tests share (test_cuda_fp8_gemv.cpp, test_cuda_moe_*.cpp, test_cuda_router.cpp,
// test_cuda_official_a8.cpp): the reference's linear over the host's cores, SwiGLU with its clamps, fp16 roundings,
// fp64 row dots of the exact weights; and the MoE tests' fixture.
#pragma once
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "core/parallel.h"
#include "cuda_test_util.h"
#include "model/ops.h"

namespace plumb_cuda_test {

// ops::linear (the reference's arithmetic) with W's rows over the host's cores.
inline std::vector<float> linear_cpu(const std::vector<float>& x, int n, const plumb::Matrix& w) {
  const int64_t R = w.rows(), K = w.cols();
  if (x.size() != size_t(n) * size_t(K)) throw std::invalid_argument("linear_cpu: x is not [n, cols] for " + w.name());
  std::vector<float> y(size_t(n) * size_t(R));
  parallel_rows(R, [&](int64_t r0, int64_t r1) { plumb::ops::linear_rows(x.data(), n, K, w, r0, r1 - r0, y.data() + r0, R); });
  return y;
}

inline float silu_f(float v) { return v / (1.0f + std::exp(-v)); }

constexpr float kNoClamp = INFINITY;  // the experts' SwiGLU limit for no clamp (kSwigluNoClamp)

// The SwiGLU of the experts with V4's clamps (limit +inf: none): gate min(g, limit), up min(max(u, -limit), limit).
inline float swiglu_f(float g, float u, float limit) {
  if (limit != INFINITY) g = std::min(g, limit), u = std::min(std::max(u, -limit), limit);
  return silu_f(g) * u;
}

inline std::vector<float> swiglu_cpu(const std::vector<float>& g, const std::vector<float>& u, float limit) {
  std::vector<float> h(g.size());
  for (size_t i = 0; i < g.size(); ++i) h[i] = swiglu_f(g[i], u[i], limit);
  return h;
}

inline std::vector<float> rounded_f16(std::vector<float> v) {
  for (auto& x : v) x = round_f16(x);
  return v;
}

inline std::vector<float> f16_to_float(const std::vector<uint16_t>& b) {
  std::vector<float> v(b.size());
  for (size_t i = 0; i < b.size(); ++i) v[i] = plumb::fmt8::f16_to_f32(b[i]);
  return v;
}

// Row r of w (its exact dequantized values) dotted with x in fp64; `row` is scratch of >= w.cols() floats.
inline double dot64(const plumb::Matrix& w, int64_t r, const float* x, std::vector<float>& row) {
  w.row(r, row.data());
  double acc = 0;
  for (int64_t k = 0; k < w.cols(); ++k) acc += double(row[size_t(k)]) * x[k];
  return acc;
}

// The routed experts' tests (decode, prefill, the routed MoE end to end).
class CudaMoe : public GpuTest {};

}  // namespace plumb_cuda_test
