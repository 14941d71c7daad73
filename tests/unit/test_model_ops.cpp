// Primitive ops (src/model/ops.h): RoPE (interleaved pairs, YaRN ramp), RMSNorm, softmax, stable softplus, top-k.
// Expected values come from closed forms evaluated here in double / long double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <set>
#include <vector>

#include "formats/numeric.h"
#include "io/safetensors.h"
#include "model/numerics.h"
#include "model/ops.h"
#include "model/weights.h"
#include "model_test_util.h"

namespace {

using plumb::RopeConfig;
using plumb::Tensor;
namespace ops = plumb::ops;

constexpr double kPi = 3.14159265358979323846;

// ---------------------------------------------------------------- RoPE

TEST(ModelOpsRope, RotatesInterleavedPairsByPosTimesThetaPower) {
  RopeConfig rc;
  rc.theta = 10000.0;
  const int dim = 8;
  ops::Rope rope(rc, dim);
  ASSERT_EQ(rope.dim(), dim);
  plumb_test::Rng rng(1);
  for (int64_t pos : {0, 1, 7, 37}) {
    // A 12-wide vector: the caller hands apply() the trailing `dim` values; the leading 4 must stay as they are.
    std::vector<float> x = rng.vec(12);
    const std::vector<float> x0 = x;
    rope.apply(x.data() + 4, pos);
    for (int j = 0; j < 4; ++j) EXPECT_EQ(x[size_t(j)], x0[size_t(j)]);
    for (int i = 0; i < dim / 2; ++i) {
      const double f = std::pow(10000.0, -2.0 * i / dim);
      const double phi = double(pos) * f;
      const double a = x0[size_t(4 + 2 * i)], b = x0[size_t(4 + 2 * i + 1)];
      EXPECT_NEAR(x[size_t(4 + 2 * i)], a * std::cos(phi) - b * std::sin(phi), 2e-6) << "pos " << pos << " pair " << i;
      EXPECT_NEAR(x[size_t(4 + 2 * i + 1)], a * std::sin(phi) + b * std::cos(phi), 2e-6) << "pos " << pos << " pair " << i;
    }
  }
}

TEST(ModelOpsRope, InverseUndoesForwardAndIsTheConjugateRotation) {
  RopeConfig rc;
  rc.theta = 160000.0;
  ops::Rope rope(rc, 16);
  plumb_test::Rng rng(2);
  const std::vector<float> x0 = rng.vec(16);
  for (int64_t pos : {1, 5, 123}) {
    std::vector<float> x = x0;
    rope.apply(x.data(), pos);
    rope.apply(x.data(), pos, /*inverse=*/true);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], x0[i], 2e-6) << "pos " << pos;
    // inverse alone rotates by -phi
    std::vector<float> y = x0;
    rope.apply(y.data(), pos, /*inverse=*/true);
    for (int i = 0; i < 8; ++i) {
      const double phi = double(pos) * std::pow(160000.0, -2.0 * i / 16);
      const double a = x0[size_t(2 * i)], b = x0[size_t(2 * i + 1)];
      EXPECT_NEAR(y[size_t(2 * i)], a * std::cos(phi) + b * std::sin(phi), 2e-5);
      EXPECT_NEAR(y[size_t(2 * i + 1)], -a * std::sin(phi) + b * std::cos(phi), 2e-5);
    }
  }
}

// Recovers the rotation frequency of every pair: rotate (1, 0) at position 1 and read the angle back.
std::vector<double> measured_freqs(const ops::Rope& rope) {
  const int dim = rope.dim();
  std::vector<float> x(size_t(dim), 0.0f);
  for (int i = 0; i < dim / 2; ++i) x[size_t(2 * i)] = 1.0f;
  rope.apply(x.data(), 1);
  std::vector<double> f(size_t(dim / 2));
  for (int i = 0; i < dim / 2; ++i) f[size_t(i)] = std::atan2(double(x[size_t(2 * i + 1)]), double(x[size_t(2 * i)]));
  return f;
}

TEST(ModelOpsRope, YarnRampForTheta160kDim64Orig65536Factor16) {
  const double theta = 160000, orig = 65536, factor = 16;
  const int dim = 64;
  // The spec formula: corr(r) = dim * ln(orig / (2 pi r)) / (2 ln theta); low = floor(corr(beta_fast = 32)),
  // high = ceil(corr(beta_slow = 1)).
  auto corr = [&](double r) { return dim * std::log(orig / (2 * kPi * r)) / (2 * std::log(theta)); };
  const int low = int(std::max(std::floor(corr(32)), 0.0));
  const int high = int(std::min(std::ceil(corr(1)), double(dim - 1)));
  EXPECT_NEAR(corr(32), 15.45, 0.01);
  EXPECT_NEAR(corr(1), 24.71, 0.01);
  ASSERT_EQ(low, 15);
  ASSERT_EQ(high, 25);

  RopeConfig rc;
  rc.theta = theta;
  rc.yarn = true;
  rc.factor = factor;
  rc.original_max_pos = orig;
  rc.beta_fast = 32;
  rc.beta_slow = 1;
  rc.attention_factor = 1.0;
  ops::Rope rope(rc, dim);
  const auto f = measured_freqs(rope);
  for (int i = 0; i < dim / 2; ++i) {
    const double fi = std::pow(theta, -2.0 * i / dim);
    const double ramp = std::clamp((i - double(low)) / double(high - low), 0.0, 1.0);
    const double want = fi / factor * ramp + fi * (1 - ramp);
    EXPECT_NEAR(f[size_t(i)], want, 3e-6 * want) << "pair " << i;
    if (i <= 15) {
      EXPECT_NEAR(f[size_t(i)], fi, 3e-6 * fi) << "pair " << i << " must keep f_i";
    }
    if (i >= 25) {
      EXPECT_NEAR(f[size_t(i)], fi / 16, 3e-6 * fi / 16) << "pair " << i << " must be f_i / 16";
    }
  }
  // Strictly inside the ramp the frequency is a blend, neither end.
  const double f20 = std::pow(theta, -40.0 / 64);
  EXPECT_LT(f[20], f20 * 0.99);
  EXPECT_GT(f[20], f20 / 16 * 1.01);

  // Without YaRN the same table is the plain theta power.
  rc.yarn = false;
  const auto g = measured_freqs(ops::Rope(rc, dim));
  for (int i = 0; i < dim / 2; ++i) {
    const double fi = std::pow(theta, -2.0 * i / dim);
    EXPECT_NEAR(g[size_t(i)], fi, 3e-6 * fi) << "pair " << i;
  }
}

TEST(ModelOpsRope, AttentionFactorScalesCosAndSin) {
  RopeConfig rc;
  rc.theta = 10000;
  rc.attention_factor = 2.0;
  ops::Rope rope(rc, 4);
  std::vector<float> x = {1.0f, 0.0f, 0.0f, 1.0f};
  rope.apply(x.data(), 3);
  const double f1 = std::pow(10000.0, -0.5);
  EXPECT_NEAR(x[0], 2 * std::cos(3.0), 1e-5);
  EXPECT_NEAR(x[1], 2 * std::sin(3.0), 1e-5);
  EXPECT_NEAR(x[2], -2 * std::sin(3 * f1), 1e-5);
  EXPECT_NEAR(x[3], 2 * std::cos(3 * f1), 1e-5);
}

// ---------------------------------------------------------------- RMSNorm

TEST(ModelOpsNorm, RmsNormWeightedAndPlain) {
  const double eps = 1e-6;
  // Two rows of width 2: [3, 4] and [-1, 0.5]; weight [1, 2].
  std::vector<float> x = {3.0f, 4.0f, -1.0f, 0.5f};
  const Tensor w({2}, std::vector<float>{1.0f, 2.0f});
  ops::rms_norm(x.data(), 2, w, eps);
  const double r0 = 1 / std::sqrt((9.0 + 16.0) / 2 + eps), r1 = 1 / std::sqrt((1.0 + 0.25) / 2 + eps);
  EXPECT_NEAR(x[0], 3 * r0, 1e-6);
  EXPECT_NEAR(x[1], 2 * 4 * r0, 1e-6);
  EXPECT_NEAR(x[2], -1 * r1, 1e-6);
  EXPECT_NEAR(x[3], 2 * 0.5 * r1, 1e-6);

  // Unweighted, groups of 3.
  std::vector<float> y = {1.0f, 2.0f, 2.0f, 0.0f, 0.0f, 0.0f};
  ops::rms_norm_plain(y.data(), 2, 3, eps);
  const double r = 1 / std::sqrt(9.0 / 3 + eps);
  EXPECT_NEAR(y[0], 1 * r, 1e-6);
  EXPECT_NEAR(y[1], 2 * r, 1e-6);
  EXPECT_NEAR(y[2], 2 * r, 1e-6);
  for (int i = 3; i < 6; ++i) EXPECT_EQ(y[size_t(i)], 0.0f);  // a zero group stays zero (eps keeps it finite)
}

// ---------------------------------------------------------------- softmax

TEST(ModelOpsSoftmax, ClosedFormAndMaskedSlots) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> a = {0.0f, -inf, float(std::log(3.0))};
  ops::softmax(a.data(), 3);
  EXPECT_NEAR(a[0], 0.25, 1e-7);
  EXPECT_EQ(a[1], 0.0f);
  EXPECT_NEAR(a[2], 0.75, 1e-7);

  // Large logits do not overflow.
  std::vector<float> b = {1000.0f, 1000.0f};
  ops::softmax(b.data(), 2);
  EXPECT_NEAR(b[0], 0.5, 1e-7);
  EXPECT_NEAR(b[1], 0.5, 1e-7);
}

TEST(ModelOpsSoftmax, AllMinusInfinityGivesZerosNotNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> a = {-inf, -inf, -inf, -inf};
  ops::softmax(a.data(), 4);
  for (float v : a) {
    EXPECT_FALSE(std::isnan(v));
    EXPECT_EQ(v, 0.0f);
  }
}

// ---------------------------------------------------------------- softplus

TEST(ModelOpsSoftplus, StableAgainstLongDoubleReference) {
  for (float x : {-200.0f, -110.0f, -30.0f, -16.7f, 0.0f, 20.0f, 20.5f, 100.0f}) {
    const long double lx = x;
    // PyTorch's softplus (threshold 20) returns x itself above the threshold; below it log1p(exp(x)).
    const long double ref = lx > 20 ? lx : std::log1p(std::exp(lx));
    const float want = float(ref);  // the correctly rounded fp32 value (0 when it underflows fp32)
    const float got = ops::softplus(x);
    ASSERT_TRUE(std::isfinite(got)) << "x = " << x;
    EXPECT_GE(got, 0.0f) << "x = " << x;
    if (want == 0.0f) {
      EXPECT_EQ(got, 0.0f) << "x = " << x << " (true value " << double(ref) << " underflows fp32)";
    } else {
      EXPECT_NEAR(double(got), double(ref), 4 * std::numeric_limits<float>::epsilon() * double(ref)) << "x = " << x;
    }
  }
  // The region where a naive fp32 log(1 + exp(x)) is already 0 must stay positive.
  EXPECT_GT(ops::softplus(-16.7f), 0.0f);
  EXPECT_GT(ops::softplus(-30.0f), 0.0f);
  EXPECT_EQ(std::log(1.0f + std::exp(-16.7f)), 0.0f);  // what the naive form gives (documents the pitfall)
}

// ---------------------------------------------------------------- top-k

TEST(ModelOpsTopk, LargestKSortedAndNaNCountsAsLargest) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> v = {0.1f, 0.7f, -2.0f, 0.7001f, nan, 0.3f, -inf};
  auto s = ops::topk_like_torch(v.data(), int64_t(v.size()), 3, /*sorted=*/true);
  EXPECT_EQ(s, (std::vector<int64_t>{4, 3, 1}));
  auto u = ops::topk_like_torch(v.data(), int64_t(v.size()), 3, /*sorted=*/false);
  EXPECT_EQ(std::set<int64_t>(u.begin(), u.end()), (std::set<int64_t>{4, 3, 1}));
  EXPECT_TRUE(ops::topk_like_torch(v.data(), int64_t(v.size()), 0, true).empty());
  auto all = ops::topk_like_torch(v.data(), int64_t(v.size()), int64_t(v.size()), true);
  EXPECT_EQ(all, (std::vector<int64_t>{4, 3, 1, 5, 0, 2, 6}));
}

TEST(ModelOpsTopk, BothSelectionPathsAgreeWithAFullSort) {
  plumb_test::Rng rng(3);
  for (int64_t n : {10, 64, 200, 1000}) {
    const auto v = rng.vec(size_t(n));
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return v[size_t(a)] > v[size_t(b)]; });
    for (int64_t k : {1, 3, 9}) {  // k * 64 <= n uses the partial sort, otherwise nth_element
      if (k > n) continue;
      const auto s = ops::topk_like_torch(v.data(), n, k, /*sorted=*/true);
      EXPECT_EQ(s, std::vector<int64_t>(order.begin(), order.begin() + k)) << "n " << n << " k " << k;
      const auto u = ops::topk_like_torch(v.data(), n, k, /*sorted=*/false);
      EXPECT_EQ(std::set<int64_t>(u.begin(), u.end()), std::set<int64_t>(order.begin(), order.begin() + k));
    }
  }
}

TEST(ModelOpsTopk, TiesPickDistinctIndicesAmongTheTied) {
  const std::vector<float> v = {1.0f, 2.0f, 2.0f, 2.0f, 0.0f};
  const auto s = ops::topk_like_torch(v.data(), 5, 2, true);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_NE(s[0], s[1]);
  for (auto i : s) EXPECT_EQ(v[size_t(i)], 2.0f);
}

// The reference linears sum several rows side by side (ops.cpp, row_dots); each row's fp64 sum must still be the
// plain one-row-at-a-time loop's, bit for bit: row counts around the block of 8 (remainders), sub-ranges (r0),
// 1-3 tokens with a row stride, the bf16 variant with and without bf16 output, and values spanning many binades.
TEST(ModelOpsLinear, RowBlocksGiveTheOneRowLoopsBits) {
  plumb_test::Rng rng(77);
  for (const int64_t R : {1, 7, 8, 9, 23}) {
    const int64_t K = 301;
    std::vector<float> w(size_t(R * K));
    for (auto& v : w) v = std::ldexp(rng.uniform(-1.0f, 1.0f), int(rng.bits() % 40) - 20);
    plumb_test::TempDir dir;
    const plumb::Checkpoint ck = plumb_test::write_checkpoint(dir, {plumb_test::f32("m.weight", {R, K}, w)});
    const plumb::Matrix m = plumb::Matrix::bind(ck, "m.weight", R, K);
    for (const int64_t n : {1, 3, 4, 9}) {  // from 4 tokens the interleaved block
      const int64_t xs = K + 5;
      std::vector<float> x(size_t(n * xs));
      for (auto& v : x) v = std::ldexp(rng.uniform(-1.0f, 1.0f), int(rng.bits() % 30) - 15);
      for (const int64_t r0 : {int64_t(0), R / 2}) {
        const int64_t nr = R - r0;
        for (int variant = 0; variant < 3; ++variant) {  // 0: fp32 weights; 1: bf16 weights; 2: bf16 weights and output
          std::vector<float> got(size_t(n * nr), -1.0f);
          if (variant == 0) plumb::ops::linear_rows(x.data(), n, xs, m, r0, nr, got.data(), nr);
          else plumb::ops::linear_rows_bf16w(x.data(), n, xs, m, r0, nr, got.data(), nr, variant == 2);
          for (int64_t t = 0; t < n; ++t)
            for (int64_t r = 0; r < nr; ++r) {
              double acc = 0;
              for (int64_t k = 0; k < K; ++k) {
                const float wv = w[size_t((r0 + r) * K + k)];
                const float xv = x[size_t(t * xs + k)];
                acc += variant == 0 ? double(xv) * double(wv) : double(variant == 2 ? plumb::fmt8::round_bf16(xv) : xv) * double(plumb::fmt8::round_bf16(wv));
              }
              const float want = variant == 2 ? plumb::fmt8::round_bf16(float(acc)) : float(acc);
              const float g = got[size_t(t * nr + r)];
              ASSERT_EQ(std::memcmp(&g, &want, 4), 0) << "rows " << R << " from " << r0 << ", token " << t << ", row " << r << ", variant "
                                                      << variant << ": " << g << " vs " << want;
            }
        }
      }
    }
  }
}

// Numerics::proj in numerics.official (the block-scaled GEMM emulation) sums 8 rows side by side too; each row must
// keep the one-row loop's bits: per weight block an fp64 sum of exact products rounded to fp32, one fma per block
// (FP4: (part * activation scale) * weight scale; FP8: part * (activation scale * weight scale)), bf16 out. FP8 and
// FP4 weights, row counts around the block, 1-3 tokens.
TEST(ModelOpsLinear, OfficialProjRowBlocksGiveTheOneRowLoopsBits) {
  plumb_test::Rng rng(78);
  plumb::ModelOptions opt;
  opt.official = true;
  const plumb::Numerics nm(opt);
  for (const bool fp4 : {false, true})
    for (const int64_t R : {1, 8, 9, 23}) {
      const int64_t K = 256, wb = fp4 ? 32 : 128;
      plumb_test::TempDir dir;
      std::vector<plumb::OwnedTensor> ts;
      if (fp4) {
        std::vector<uint8_t> codes(size_t(R * K / 2)), sc(size_t(R * (K / 32)));
        for (auto& c : codes) c = uint8_t(rng.bits() & 0xFF);
        for (auto& c : sc) c = uint8_t(120 + rng.bits() % 12);
        ts.push_back(plumb_test::raw("m.weight", plumb::DType::I8, {R, K / 2}, codes));
        ts.push_back(plumb_test::raw("m.scale", plumb::DType::F8_E8M0, {R, K / 32}, sc));
      } else {
        std::vector<uint8_t> codes(size_t(R * K)), sc(size_t(((R + 127) / 128) * (K / 128)));
        for (auto& c : codes) c = uint8_t(rng.bits() % 0x7E) | uint8_t(rng.bits() & 0x80);  // no NaN codes
        for (auto& c : sc) c = uint8_t(120 + rng.bits() % 12);
        ts.push_back(plumb_test::raw("m.weight", plumb::DType::F8_E4M3, {R, K}, codes));
        ts.push_back(plumb_test::raw("m.scale", plumb::DType::F8_E8M0, {(R + 127) / 128, K / 128}, sc));
      }
      const plumb::Checkpoint ck = plumb_test::write_checkpoint(dir, ts);
      const plumb::Matrix m = plumb::Matrix::bind(ck, "m.weight", R, K);
      for (const int64_t n : {int64_t(1), int64_t(3)}) {
        Tensor x({n, K});
        for (int64_t i = 0; i < x.numel(); ++i) x[i] = std::ldexp(rng.uniform(-1.0f, 1.0f), int(rng.bits() % 16) - 8);
        const Tensor got = nm.proj(x, m);
        ASSERT_EQ(got.numel(), n * R);
        std::vector<float> q(static_cast<size_t>(K)), sa(static_cast<size_t>(K / 128)), vals(static_cast<size_t>(K)), sw(static_cast<size_t>(K / wb));
        for (int64_t t = 0; t < n; ++t) {
          plumb::official::fp8_quant_block(x.ptr() + t * K, K, 128, q.data(), sa.data());
          for (int64_t r = 0; r < R; ++r) {
            m.row_raw(r, vals.data(), sw.data());
            float acc = 0;
            for (int64_t b = 0; b < K / wb; ++b) {
              double part = 0;
              for (int64_t k = b * wb; k < (b + 1) * wb; ++k) part += double(q[size_t(k)]) * double(vals[size_t(k)]);
              const float a_s = sa[size_t(b * wb / 128)];
              acc = fp4 ? std::fma(float(part) * a_s, sw[size_t(b)], acc) : std::fma(float(part), a_s * sw[size_t(b)], acc);
            }
            const float want = plumb::fmt8::round_bf16(acc), g = got[t * R + r];
            ASSERT_EQ(std::memcmp(&g, &want, 4), 0) << (fp4 ? "FP4" : "FP8") << " rows " << R << ", token " << t << ", row " << r << ": " << g
                                                    << " vs " << want;
          }
        }
      }
    }
}

}  // namespace
