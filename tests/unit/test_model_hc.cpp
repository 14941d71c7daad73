// Manifold-constrained hyper-connections (src/model/hyper_connection.h): hc_pre (pre/post/comb with Sinkhorn,
// collapse), hc_post with C transposed (and the fault that drops the transpose), hc_head. Expected values are a
// naive double-precision transcription of spec section 4, written here.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model/hyper_connection.h"
#include "model/options.h"
#include "model_test_util.h"

namespace {

using plumb::HcPre;
using plumb::HyperConnWeights;
using plumb::ModelConfig;
using plumb::ModelOptions;
using plumb::Tensor;
using plumb_test::sigmoid_d;

ModelConfig hc_config(int H, int D) {
  ModelConfig c;
  c.hc_mult = H;
  c.hidden = D;
  c.hc_sinkhorn_iters = 20;
  c.hc_eps = 1e-6;
  c.rms_eps = 1e-6;
  return c;
}

struct NaivePre {
  std::vector<double> pre, post, comb, collapsed;
};

// Spec 4.1 for one token: x is the [H, D] stream block.
NaivePre naive_hc_pre(const HyperConnWeights& w, const ModelConfig& c, const float* x) {
  const int H = c.hc_mult, D = c.hidden, HD = H * D;
  double ss = 0;
  for (int i = 0; i < HD; ++i) ss += double(x[i]) * x[i];
  const double r = 1 / std::sqrt(ss / HD + c.rms_eps);
  std::vector<double> mix(size_t(c.hc_mix()));
  for (int o = 0; o < c.hc_mix(); ++o) {
    double acc = 0;
    for (int i = 0; i < HD; ++i) acc += double(x[i]) * w.fn[o * HD + i];
    mix[size_t(o)] = acc * r;
  }
  const double eps = c.hc_eps;
  NaivePre p;
  for (int j = 0; j < H; ++j) {
    p.pre.push_back(sigmoid_d(mix[size_t(j)] * w.scale[0] + w.base[j]) + eps);
    p.post.push_back(2 * sigmoid_d(mix[size_t(H + j)] * w.scale[1] + w.base[H + j]));
  }
  std::vector<double> C(size_t(H * H));
  for (int i = 0; i < H * H; ++i) C[size_t(i)] = mix[size_t(2 * H + i)] * w.scale[2] + w.base[2 * H + i];
  for (int j = 0; j < H; ++j) {  // row softmax, then + eps
    double m = -INFINITY, s = 0;
    for (int k = 0; k < H; ++k) m = std::max(m, C[size_t(j * H + k)]);
    for (int k = 0; k < H; ++k) s += std::exp(C[size_t(j * H + k)] - m);
    for (int k = 0; k < H; ++k) C[size_t(j * H + k)] = std::exp(C[size_t(j * H + k)] - m) / s + eps;
  }
  auto col = [&] {
    for (int k = 0; k < H; ++k) {
      double s = 0;
      for (int j = 0; j < H; ++j) s += C[size_t(j * H + k)];
      for (int j = 0; j < H; ++j) C[size_t(j * H + k)] /= s + eps;
    }
  };
  auto row = [&] {
    for (int j = 0; j < H; ++j) {
      double s = 0;
      for (int k = 0; k < H; ++k) s += C[size_t(j * H + k)];
      for (int k = 0; k < H; ++k) C[size_t(j * H + k)] /= s + eps;
    }
  };
  col();
  for (int it = 1; it < c.hc_sinkhorn_iters; ++it) row(), col();
  p.comb = C;
  for (int d = 0; d < D; ++d) {
    double acc = 0;
    for (int j = 0; j < H; ++j) acc += p.pre[size_t(j)] * x[j * D + d];
    p.collapsed.push_back(acc);
  }
  return p;
}

HyperConnWeights random_site(plumb_test::Rng& rng, int mix, int HD, std::vector<float> scale) {
  HyperConnWeights w;
  w.fn = rng.tensor({mix, HD});
  w.base = rng.tensor({mix});
  const int64_t ns = int64_t(scale.size());
  w.scale = Tensor({ns}, std::move(scale));
  return w;
}

TEST(ModelHyperConn, HcPreTwoStreamsMatchesTheSpecFormulas) {
  const int H = 2, D = 3, n = 2;
  const ModelConfig c = hc_config(H, D);
  plumb_test::Rng rng(11);
  const HyperConnWeights w = random_site(rng, c.hc_mix(), H * D, {0.9f, 0.7f, 0.5f});
  const Tensor X = rng.tensor({n, H, D}, -2.0f, 2.0f);

  const HcPre p = plumb::hc_pre(w, c, ModelOptions{}, X, plumb::Tap{}, "hc_attn");
  ASSERT_EQ(p.post.shape, (plumb::Shape{n, H}));
  ASSERT_EQ(p.comb.shape, (plumb::Shape{n, H, H}));
  ASSERT_EQ(p.collapsed.shape, (plumb::Shape{n, D}));
  for (int t = 0; t < n; ++t) {
    const NaivePre ref = naive_hc_pre(w, c, X.ptr() + t * H * D);
    for (int j = 0; j < H; ++j) {
      EXPECT_NEAR(p.post[t * H + j], ref.post[size_t(j)], 1e-6) << "post, token " << t;
      // post = 2 sigma(.) lies in (0, 2), no eps
      EXPECT_GT(p.post[t * H + j], 0.0f);
      EXPECT_LT(p.post[t * H + j], 2.0f);
    }
    for (int i = 0; i < H * H; ++i) EXPECT_NEAR(p.comb[t * H * H + i], ref.comb[size_t(i)], 1e-6) << "comb, token " << t;
    for (int d = 0; d < D; ++d) EXPECT_NEAR(p.collapsed[t * D + d], ref.collapsed[size_t(d)], 1e-5) << "collapsed, token " << t;

    // Doubly stochastic after Sinkhorn: every row and every column sums to 1 within 1e-5. (20 iterations are
    // only approximately doubly stochastic when the comb logits are very skewed; the comparison above with
    // the naive iteration is exact in every case, this one needs moderate logits, hence scale[2] = 0.5.)
    for (int a = 0; a < H; ++a) {
      double rs = 0, cs = 0;
      for (int b = 0; b < H; ++b) rs += p.comb[t * H * H + a * H + b], cs += p.comb[t * H * H + b * H + a];
      EXPECT_NEAR(rs, 1.0, 1e-5) << "row " << a << " token " << t;
      EXPECT_NEAR(cs, 1.0, 1e-5) << "column " << a << " token " << t;
    }
  }
}

TEST(ModelHyperConn, HcPreSaturatedGatesShowPreEpsAndPostTwo) {
  // fn = 0 makes every mix 0, so the gates are sigma(base): base -100 gives pre = 0 + eps exactly (fp32 sigmoid
  // underflows to 0), base +100 gives post = 2.
  const int H = 2, D = 2;
  const ModelConfig c = hc_config(H, D);
  HyperConnWeights w;
  w.fn = Tensor({c.hc_mix(), H * D}, 0.0f);
  w.base = Tensor({c.hc_mix()}, std::vector<float>{-100, 0, 100, -100, 0, 0, 0, 0});
  w.scale = Tensor({3}, std::vector<float>{1, 1, 1});
  const Tensor X({1, H, D}, std::vector<float>{1, 2, 3, 4});
  const HcPre p = plumb::hc_pre(w, c, ModelOptions{}, X, plumb::Tap{}, "hc_ffn");
  const float eps = float(c.hc_eps);
  // pre = [eps, 0.5 + eps]
  EXPECT_NEAR(p.collapsed[0], eps * 1 + (0.5 + eps) * 3, 1e-6);
  EXPECT_NEAR(p.collapsed[1], eps * 2 + (0.5 + eps) * 4, 1e-6);
  EXPECT_FLOAT_EQ(p.post[0], 2.0f);
  EXPECT_NEAR(p.post[1], 0.0f, 1e-30);
  // All comb logits equal: the Sinkhorn projection is uniform 1/H.
  for (int i = 0; i < H * H; ++i) EXPECT_NEAR(p.comb[i], 0.5, 1e-6);
}

TEST(ModelHyperConn, HcPostUsesCTransposedAndTheFaultDoesNot) {
  const int H = 3, D = 2, n = 1;
  HcPre p{Tensor({n, H}, std::vector<float>{0.5f, 1.25f, 1.75f}),
          // A non-symmetric C[j][k] (row j, column k).
          Tensor({n, H, H}, std::vector<float>{0.7f, 0.2f, 0.1f,  //
                                               0.0f, 0.5f, 0.5f,  //
                                               0.3f, 0.3f, 0.4f}),
          Tensor({n, D})};
  const Tensor y({n, D}, std::vector<float>{1.0f, -2.0f});
  const Tensor X({n, H, D}, std::vector<float>{1, 10, 2, 20, 3, 30});
  auto C = [&](int j, int k) { return double(p.comb[j * H + k]); };

  const Tensor out = plumb::hc_post(y, X, p, ModelOptions{});
  ASSERT_EQ(out.shape, (plumb::Shape{n, H, D}));
  ModelOptions fault;
  fault.fault_comb_untransposed = true;
  const Tensor bad = plumb::hc_post(y, X, p, fault);
  double max_diff = 0;
  for (int k = 0; k < H; ++k)
    for (int d = 0; d < D; ++d) {
      double want = p.post[k] * double(y[d]), want_bad = want;
      for (int j = 0; j < H; ++j) {
        want += C(j, k) * X[j * D + d];      // Xout[k] = post[k] y + sum_j C[j][k] X[j]
        want_bad += C(k, j) * X[j * D + d];  // the bug: C . X
      }
      EXPECT_NEAR(out[k * D + d], want, 1e-5) << "stream " << k << " dim " << d;
      EXPECT_NEAR(bad[k * D + d], want_bad, 1e-5) << "stream " << k << " dim " << d;
      max_diff = std::max(max_diff, std::fabs(double(out[k * D + d]) - bad[k * D + d]));
    }
  EXPECT_GT(max_diff, 1.0);  // the two placements are far apart on a non-symmetric C
  // Hand-checked entry: stream 0, dim 0 = 0.5 * 1 + (0.7 * 1 + 0.0 * 2 + 0.3 * 3) = 2.1
  EXPECT_NEAR(out[0], 2.1, 1e-6);
  // and with the fault: 0.5 * 1 + (0.7 * 1 + 0.2 * 2 + 0.1 * 3) = 1.9
  EXPECT_NEAR(bad[0], 1.9, 1e-6);
}

TEST(ModelHyperConn, HcHeadCollapsesWithSigmoidPlusEps) {
  const int H = 4, D = 3, n = 2;
  const ModelConfig c = hc_config(H, D);
  plumb_test::Rng rng(12);
  HyperConnWeights w = random_site(rng, H, H * D, {1.3f});
  const Tensor X = rng.tensor({n, H, D}, -1.5f, 1.5f);
  const Tensor y = plumb::hc_head(w, c, ModelOptions{}, X);
  ASSERT_EQ(y.shape, (plumb::Shape{n, D}));
  for (int t = 0; t < n; ++t) {
    const float* x = X.ptr() + t * H * D;
    double ss = 0;
    for (int i = 0; i < H * D; ++i) ss += double(x[i]) * x[i];
    const double r = 1 / std::sqrt(ss / (H * D) + c.rms_eps);
    for (int d = 0; d < D; ++d) {
      double want = 0;
      for (int j = 0; j < H; ++j) {
        double mix = 0;
        for (int i = 0; i < H * D; ++i) mix += double(x[i]) * w.fn[j * H * D + i];
        want += (sigmoid_d(mix * r * w.scale[0] + w.base[j]) + c.hc_eps) * x[j * D + d];
      }
      EXPECT_NEAR(y[t * D + d], want, 1e-5);
    }
  }
}

}  // namespace
