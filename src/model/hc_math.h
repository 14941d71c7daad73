// The mHC weights from the mixes, shared by the CPU reference (hyper_connection.cpp) and the CUDA kernels
// (cuda/fwd_hc.cu): one implementation of the sigmoid gates and the Sinkhorn-Knopp normalization. Includes no
// plumb header but host_device.h, so nvcc compiles it too (the functions are __host__ __device__ there).
#pragma once
#include <cmath>

#include "model/host_device.h"

namespace plumb::hc_math {

PLUMB_HD inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// ops::softmax's arithmetic: float exponentials, fp64 sum, p = float(e / sum); all -inf gives zeros. (The GPU
// router's softmax scoring uses it too.)
PLUMB_HD inline void softmax(float* x, int n) {
  float m = -INFINITY;
  for (int i = 0; i < n; ++i) m = fmaxf(m, x[i]);
  if (m == -INFINITY) {
    for (int i = 0; i < n; ++i) x[i] = 0;
    return;
  }
  double s = 0;
  for (int i = 0; i < n; ++i) s += (x[i] = expf(x[i] - m));
  for (int i = 0; i < n; ++i) x[i] = float(double(x[i]) / s);
}

// mix: the (2 + H) * H mixes of one token (pre, post, comb logits), or only the first H (comb == nullptr: the hc
// head). pre[j] = sigmoid(mix_j * scale0 + base_j) + eps; post[j] = 2 sigmoid(mix_{H+j} * scale1 + base_{H+j});
// comb = Sinkhorn(mix_{2H..} * scale2 + base_{2H..}): row softmax + eps, a column normalization, then
// (iters - 1) x (row, column) normalizations, each dividing by (sum + eps). comb is [H, H] row-major.
// H is a template parameter so the loops unroll and C stays in registers (on the GPU one thread runs the ~20
// Sinkhorn iterations; with a runtime H the matrix lived in local memory); weights() dispatches on it.
// The gates alone: pre, and post unless null.
PLUMB_HD inline void gates(const float* mix, const float* scale, const float* base, int H, float eps, float* pre, float* post) {
  for (int j = 0; j < H; ++j) pre[j] = sigmoid(fmaf(mix[j], scale[0], base[j])) + eps;
  if (!post) return;
  for (int j = 0; j < H; ++j) post[j] = 2.0f * sigmoid(fmaf(mix[H + j], scale[1], base[H + j]));
}

template <int H>
PLUMB_HD inline void weights_h(const float* mix, const float* scale, const float* base, float eps, int iters, float* pre, float* post,
                               float* comb) {
  gates(mix, scale, base, H, eps, pre, comb ? post : nullptr);
  if (!comb) return;
  float C[H * H];
  for (int i = 0; i < H * H; ++i) C[i] = fmaf(mix[2 * H + i], scale[2], base[2 * H + i]);
  for (int j = 0; j < H; ++j) {
    softmax(C + j * H, H);
    for (int k = 0; k < H; ++k) C[j * H + k] += eps;
  }
  auto col_norm = [&] {
    for (int k = 0; k < H; ++k) {
      float s = 0;
      for (int j = 0; j < H; ++j) s += C[j * H + k];
      for (int j = 0; j < H; ++j) C[j * H + k] /= s + eps;
    }
  };
  auto row_norm = [&] {
    for (int j = 0; j < H; ++j) {
      float s = 0;
      for (int k = 0; k < H; ++k) s += C[j * H + k];
      for (int k = 0; k < H; ++k) C[j * H + k] /= s + eps;
    }
  };
  col_norm();
  for (int it = 1; it < iters; ++it) {
    row_norm();
    col_norm();
  }
  for (int i = 0; i < H * H; ++i) comb[i] = C[i];
}

// H = hc_mult, 1 to 8 (the config loader refuses others; the GPU's kernels are instantiated for the same range).
PLUMB_HD inline void weights(const float* mix, const float* scale, const float* base, int H, float eps, int iters, float* pre,
                             float* post, float* comb) {
  switch (H) {
    case 1: return weights_h<1>(mix, scale, base, eps, iters, pre, post, comb);
    case 2: return weights_h<2>(mix, scale, base, eps, iters, pre, post, comb);
    case 3: return weights_h<3>(mix, scale, base, eps, iters, pre, post, comb);
    case 4: return weights_h<4>(mix, scale, base, eps, iters, pre, post, comb);
    case 5: return weights_h<5>(mix, scale, base, eps, iters, pre, post, comb);
    case 6: return weights_h<6>(mix, scale, base, eps, iters, pre, post, comb);
    case 7: return weights_h<7>(mix, scale, base, eps, iters, pre, post, comb);
    default: return weights_h<8>(mix, scale, base, eps, iters, pre, post, comb);
  }
}

}  // namespace plumb::hc_math
