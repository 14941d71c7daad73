// Numerics primitives: fp32 reference identities, or emulations of the official kernels (kernel.py semantics as
// documented in shared/oracle/README.md: exact block partial sums rounded once to fp32, fma accumulation).
#include "model/numerics.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/parallel.h"
#include "formats/numeric.h"
#include "model/official_math.h"

namespace plumb {

namespace official {

float pow2_scale(float amax, float inv_max) { return official_math::pow2_scale(amax, inv_max); }

void fp8_quant_block(const float* x, int64_t n, int64_t block, float* q, float* scales) {
  for (int64_t b0 = 0, bi = 0; b0 < n; b0 += block, ++bi) {
    const int64_t b1 = std::min(n, b0 + block);  // a ragged last block acts as zero-padded
    using namespace official_math;
    float amax = kFp8AmaxFloor;
    for (int64_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float s = pow2_scale(amax, 1.0f / kFp8Max);
    scales[bi] = s;
    for (int64_t i = b0; i < b1; ++i) q[i] = fmt8::e4m3_to_f32(fmt8::f32_to_e4m3(std::clamp(x[i] / s, -kFp8Max, kFp8Max)));
  }
}

void fp8_roundtrip(float* x, int64_t n, int64_t block) {
  std::vector<float> q(static_cast<size_t>(n)), s(static_cast<size_t>((n + block - 1) / block));
  fp8_quant_block(x, n, block, q.data(), s.data());
  for (int64_t i = 0; i < n; ++i) x[i] = fmt8::round_bf16(q[size_t(i)] * s[size_t(i / block)]);
}

void fp4_roundtrip(float* x, int64_t n, int64_t block) {
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    const int64_t b1 = std::min(n, b0 + block);
    using namespace official_math;
    float amax = kFp4AmaxFloor;
    for (int64_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float s = pow2_scale(amax, 1.0f / kFp4Max);
    for (int64_t i = b0; i < b1; ++i)
      x[i] = fmt8::round_bf16(fmt8::e2m1_to_f32(fmt8::f32_to_e2m1(std::clamp(x[i] / s, -kFp4Max, kFp4Max))) * s);
  }
}

void hadamard(float* x, int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  std::vector<float> y(static_cast<size_t>(p), 0.0f);  // a non-power-of-two length is zero-padded, then truncated
  std::copy(x, x + n, y.begin());
  for (int64_t h = 1; h < p; h *= 2)
    for (int64_t i = 0; i < p; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        const float a = y[size_t(j)], b = y[size_t(j + h)];
        y[size_t(j)] = a + b;
        y[size_t(j + h)] = a - b;
      }
  const float scale = float(1.0 / std::sqrt(double(n)));
  for (int64_t i = 0; i < n; ++i) x[i] = fmt8::round_bf16(y[size_t(i)] * scale);
}

}  // namespace official

float Numerics::act(float v) const { return official_ ? fmt8::round_bf16(v) : v; }

void Numerics::act(float* v, int64_t n) const {
  if (official_)
    for (int64_t i = 0; i < n; ++i) v[i] = fmt8::round_bf16(v[i]);
}

Tensor Numerics::proj(const Tensor& x, const Matrix& w) const {
  if (!official_) return ops::linear(x, w);
  if (w.layout() == Matrix::Layout::Plain) return proj_bf16(x, w);
  const int64_t K = w.cols(), N = w.rows(), n = x.numel() / K, wb = w.block();
  PLUMB_CHECK(x.shape.back() == K, "linear {}: input width {} != weight columns {}", w.name(), x.shape.back(), K);
  // Activations: FP8 E4M3 per 128-wide block with power-of-two scales (act_quant).
  const int64_t nab = (K + 127) / 128;
  std::vector<float> q(static_cast<size_t>(n * K)), sa(static_cast<size_t>(n * nab));
  for (int64_t t = 0; t < n; ++t) official::fp8_quant_block(x.row(t), K, official_math::kActBlock, q.data() + t * K, sa.data() + t * nab);
  Tensor y({n, N});
  const bool fp4 = w.layout() == Matrix::Layout::FP4Group;
  // Output rows split over threads (core/parallel.h; each row's sums are one thread's, so the bits do not depend on
  // it), and summed kRows at a time side by side (independent chains; each row's sums in its own order, as below).
  constexpr int kRows = 8;
  const int64_t nsb = (K + wb - 1) / wb;
  parallel_for(N, double(N) * double(K) * double(n + 1), [&](int64_t ra, int64_t rb) {
    std::vector<float> vals(static_cast<size_t>(kRows * K)), sw(static_cast<size_t>(kRows * nsb));
    auto rows = [&]<int NB>(int64_t r) {
      for (int j = 0; j < NB; ++j) w.row_raw(r + j, vals.data() + j * K, sw.data() + j * nsb);
      for (int64_t t = 0; t < n; ++t) {
        const float* qt = q.data() + t * K;
        float acc[NB] = {};
        // Exact products summed per weight block (128 for FP8, 32 for FP4), rounded once to fp32, then scaled
        // and accumulated with one fma per block, in K order.
        for (int64_t b0 = 0, bi = 0; b0 < K; b0 += wb, ++bi) {
          double part[NB] = {};
          for (int64_t k = b0; k < std::min(K, b0 + wb); ++k) {
            const double qk = qt[k];
            for (int j = 0; j < NB; ++j) part[j] += qk * double(vals[size_t(j * K + k)]);
          }
          const float a_s = sa[size_t(t * nab + b0 / 128)];
          for (int j = 0; j < NB; ++j) {
            const float s_w = sw[size_t(j * nsb + bi)];
            acc[j] = fp4 ? std::fma(float(part[j]) * a_s, s_w, acc[j]) : std::fma(float(part[j]), a_s * s_w, acc[j]);
          }
        }
        for (int j = 0; j < NB; ++j) y[t * N + r + j] = fmt8::round_bf16(acc[j]);
      }
    };
    int64_t r = ra;
    for (; r + kRows <= rb; r += kRows) rows.template operator()<kRows>(r);
    for (; r < rb; ++r) rows.template operator()<1>(r);
  });
  return y;
}

void Numerics::proj_rows_bf16(const float* x, int64_t n, int64_t x_stride, const Matrix& w, int64_t r0, int64_t nr, float* y,
                              int64_t y_stride) const {
  if (official_) return ops::linear_rows_bf16w(x, n, x_stride, w, r0, nr, y, y_stride, /*bf16_io=*/true);
  ops::linear_rows(x, n, x_stride, w, r0, nr, y, y_stride);
}

Tensor Numerics::proj_bf16(const Tensor& x, const Matrix& w) const {
  const int64_t K = w.cols(), n = x.numel() / K;
  PLUMB_CHECK(x.shape.back() == K, "linear {}: input width {} != weight columns {}", w.name(), x.shape.back(), K);
  Tensor y({n, w.rows()});
  proj_rows_bf16(x.ptr(), n, K, w, 0, w.rows(), y.ptr(), w.rows());
  return y;
}

void Numerics::rms_norm(float* x, int64_t rows, const Tensor& w, double eps) const {
  ops::rms_norm(x, rows, w, eps);
  act(x, rows * w.numel());
}

void Numerics::head_rms(float* x, int64_t groups, int64_t dim, double eps) const {
  if (!official_) return ops::rms_norm_plain(x, groups, dim, eps);
  using fmt8::round_bf16;
  for (int64_t g = 0; g < groups; ++g) {
    float* v = x + g * dim;
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += round_bf16(v[i] * v[i]);  // q.square() is a bf16 tensor
    const float mean = round_bf16(float(ss / double(dim)));
    const float r = round_bf16(1.0f / std::sqrt(round_bf16(mean + float(eps))));
    for (int64_t i = 0; i < dim; ++i) v[i] = round_bf16(v[i] * r);
  }
}

void Numerics::rope(const ops::Rope& r, float* tail, int64_t pos, bool inverse) const {
  r.apply(tail, pos, inverse);
  act(tail, r.dim());
}

void Numerics::kv_fp8_sim(float* v, int64_t n) const {
  if (official_ && !initial_) official::fp8_roundtrip(v, n, official_math::kKvBlock);
}

void Numerics::indexer_rotate(float* v, int64_t n) const {
  if (!official_) return;
  official::hadamard(v, n);
  official::fp4_roundtrip(v, n, official_math::kFp4Block);
}

}  // namespace plumb
