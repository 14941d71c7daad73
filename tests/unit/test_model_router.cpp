// MoE routers (src/model/router.h): hand-computed sqrtsoftplus / sigmoid / softmax scores, bias for selection only,
// renormalization with its floor, the Folded placement (= rsf x Unfolded), very negative logits, the naive-softplus
// and unfloored-renormalization faults, ties and duplicate expert ids in tid2eid.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <span>
#include <vector>

#include "model/router.h"
#include "model_test_util.h"

namespace {

using plumb::MlpType;
using plumb::RoutedWeights;
using plumb::RouterInputs;
using plumb::RouterOptions;
using plumb::Rsf;
using plumb::ScoreFunc;
using plumb::Tensor;

double sqrtsoftplus(double l) { return std::sqrt(std::log1p(std::exp(l))); }

// The (expert -> weight) map of one row; duplicate ids accumulate in a separate count.
std::map<int64_t, double> row_weights(const RoutedWeights<Rsf::Unfolded>& r, int64_t t) {
  std::map<int64_t, double> m;
  const int64_t K = r.idx.dim(1);
  for (int64_t k = 0; k < K; ++k) m[r.idx[t * K + k]] += r.weight[t * K + k];
  return m;
}

class ModelRouter : public ::testing::Test {
 protected:
  // E = 4 experts, identity gate so that the logits are the input rows; vocab 3 for hash tables.
  void SetUp() override { moe_ = plumb_test::make_tiny_moe(4, 2, 4, 2, 3, plumb_test::identity_gate(4), 5, false); }

  RoutedWeights<Rsf::Unfolded> route(const std::vector<float>& logits, MlpType type = MlpType::Learned,
                                     std::vector<int32_t> tokens = {}, RouterOptions opt = {}) {
    const int64_t n = int64_t(logits.size()) / 4;
    x_ = Tensor({n, 4}, logits);
    if (tokens.empty()) tokens.assign(size_t(n), 0);
    tokens_ = std::move(tokens);
    return plumb::route_unfolded(moe_->w, moe_->c, type, RouterInputs{x_, std::span<const int32_t>(tokens_)}, opt);
  }

  std::unique_ptr<plumb_test::TinyMoe> moe_;
  Tensor x_;
  std::vector<int32_t> tokens_;
};

TEST_F(ModelRouter, SqrtSoftplusScoresRenormalizedOverTheTopK) {
  const std::vector<float> l = {1.0f, -0.5f, 2.0f, 0.3f};
  const auto r = route(l);
  ASSERT_EQ(r.idx.shape, (plumb::Shape{1, 2}));
  ASSERT_EQ(r.weight.shape, (plumb::Shape{1, 2}));
  ASSERT_EQ(r.logits.shape, (plumb::Shape{1, 4}));
  for (int e = 0; e < 4; ++e) EXPECT_FLOAT_EQ(r.logits[e], l[size_t(e)]);
  const auto w = row_weights(r, 0);
  ASSERT_EQ(w.size(), 2u);
  ASSERT_TRUE(w.count(2) && w.count(0)) << "top-2 of the scores are experts 2 and 0";
  const double s0 = sqrtsoftplus(1.0), s2 = sqrtsoftplus(2.0);
  EXPECT_NEAR(w.at(2), s2 / (s0 + s2), 1e-6);
  EXPECT_NEAR(w.at(0), s0 / (s0 + s2), 1e-6);
  EXPECT_NEAR(w.at(0) + w.at(2), 1.0, 1e-6);
}

TEST_F(ModelRouter, CorrectionBiasSelectsButDoesNotWeigh) {
  // Without bias experts 2 and 0 win; a bias of +5 on expert 1 and -5 on expert 0 makes it {1, 2}.
  moe_->w.bias = Tensor({4}, std::vector<float>{-5.0f, 5.0f, 0.0f, 0.0f});
  const auto r = route({1.0f, -0.5f, 2.0f, 0.3f});
  const auto w = row_weights(r, 0);
  ASSERT_TRUE(w.count(1) && w.count(2));
  const double s1 = sqrtsoftplus(-0.5), s2 = sqrtsoftplus(2.0);  // unbiased scores
  EXPECT_NEAR(w.at(1), s1 / (s1 + s2), 1e-6);
  EXPECT_NEAR(w.at(2), s2 / (s1 + s2), 1e-6);
}

TEST_F(ModelRouter, FoldedIsExactlyRsfTimesUnfolded) {
  moe_->c.routed_scaling = 2.5;
  x_ = Tensor({2, 4}, std::vector<float>{1.0f, -0.5f, 2.0f, 0.3f, -1.0f, 0.25f, 0.0f, 3.0f});
  tokens_ = {0, 0};
  const RouterInputs in{x_, std::span<const int32_t>(tokens_)};
  const auto u = plumb::route<Rsf::Unfolded>(moe_->w, moe_->c, MlpType::Learned, in);
  const auto f = plumb::route<Rsf::Folded>(moe_->w, moe_->c, MlpType::Learned, in);
  static_assert(std::is_same_v<decltype(f), const RoutedWeights<Rsf::Folded>>);
  EXPECT_EQ(u.idx.data, f.idx.data);
  for (int64_t i = 0; i < u.weight.numel(); ++i) EXPECT_EQ(f.weight[i], u.weight[i] * 2.5f) << i;
  double sum0 = 0;
  for (int k = 0; k < 2; ++k) sum0 += f.weight[k];
  EXPECT_NEAR(sum0, 2.5, 1e-6);  // folded weights sum to the factor
}

TEST_F(ModelRouter, VeryNegativeLogitsStayFinite) {
  // Learned and hash rows whose logits are all -200: every fp32 score underflows to exactly 0 (the true
  // sqrt(softplus(-200)) = e^-100 is below the smallest fp32 subnormal). The floor turns 0/0 into 0/1e-20, so
  // the code's promise (router.h) is "finite", and the weights are 0, not NaN.
  const std::vector<float> l(4, -200.0f);
  moe_->w.tid2eid = plumb::IndexTensor({3, 2}, std::vector<int64_t>{0, 1, 2, 3, 1, 1});
  for (MlpType type : {MlpType::Learned, MlpType::Hash}) {
    const auto r = route(l, type, {1});
    for (int64_t k = 0; k < 2; ++k) {
      EXPECT_TRUE(std::isfinite(r.weight[k])) << "type " << int(type);
      EXPECT_EQ(r.weight[k], 0.0f) << "type " << int(type);  // 0 / (0 + 1e-20)
    }
    if (type == MlpType::Hash) {
      EXPECT_EQ(r.idx.data, (std::vector<int64_t>{2, 3}));
    }
  }
  // -30 is deep in the region where a naive fp32 softplus is 0, but the stable one keeps the row normalized.
  const auto r = route(std::vector<float>(4, -30.0f));
  EXPECT_NEAR(r.weight[0] + r.weight[1], 1.0, 1e-6);
  EXPECT_NEAR(r.weight[0], 0.5, 1e-6);
}

TEST_F(ModelRouter, UnflooredRenormalizationIsNaNOnUnderflowedRows) {
  RouterOptions opt;
  opt.unfloored = true;  // fault.renorm_unfloored
  moe_->w.tid2eid = plumb::IndexTensor({3, 2}, std::vector<int64_t>{0, 1, 2, 3, 1, 1});
  for (MlpType type : {MlpType::Learned, MlpType::Hash}) {
    const auto r = route(std::vector<float>(4, -200.0f), type, {0}, opt);
    EXPECT_TRUE(std::isnan(r.weight[0]) && std::isnan(r.weight[1])) << "0/0 must be NaN, type " << int(type);
  }
  // On ordinary rows the unfloored division is the same renormalization.
  const auto a = route({1.0f, -0.5f, 2.0f, 0.3f}, MlpType::Learned, {0}, opt);
  const auto b = route({1.0f, -0.5f, 2.0f, 0.3f});
  for (int k = 0; k < 2; ++k) EXPECT_FLOAT_EQ(a.weight[k], b.weight[k]);
}

TEST_F(ModelRouter, NaiveSoftplusUnderflowsAtMinus20WhereTheStableOneDoesNot) {
  // Scores directly.
  EXPECT_EQ(plumb::router_score(ScoreFunc::SqrtSoftplus, -20.0f, /*naive=*/true), 0.0f);
  const float stable = plumb::router_score(ScoreFunc::SqrtSoftplus, -20.0f, false);
  EXPECT_GT(stable, 0.0f);
  EXPECT_NEAR(stable, std::exp(-10.0), 1e-6 * std::exp(-10.0));  // sqrt(log1p(e^-20)) ~ e^-10
  EXPECT_NEAR(plumb::router_score(ScoreFunc::SqrtSoftplus, 100.0f, false), 10.0, 1e-5);
  EXPECT_NEAR(plumb::router_score(ScoreFunc::Sigmoid, 0.5f, false), 1 / (1 + std::exp(-0.5)), 1e-7);

  // Whole rows: the naive fault leaves all-zero weights, the stable scores renormalize to 1/2 each.
  RouterOptions naive;
  naive.softplus_naive = true;
  const auto bad = route(std::vector<float>(4, -20.0f), MlpType::Learned, {0}, naive);
  EXPECT_EQ(bad.weight[0], 0.0f);
  EXPECT_EQ(bad.weight[1], 0.0f);
  const auto good = route(std::vector<float>(4, -20.0f));
  EXPECT_NEAR(good.weight[0], 0.5, 1e-6);
  EXPECT_NEAR(good.weight[1], 0.5, 1e-6);
}

TEST_F(ModelRouter, TiesGiveDistinctExpertsAndEqualWeights) {
  const auto r = route(std::vector<float>(4, 0.5f));
  EXPECT_NE(r.idx[0], r.idx[1]);
  for (int k = 0; k < 2; ++k) {
    EXPECT_GE(r.idx[k], 0);
    EXPECT_LT(r.idx[k], 4);
    EXPECT_NEAR(r.weight[k], 0.5, 1e-7);
  }
  // A tie at the selection boundary: expert 3 clearly first, 0/1/2 tied for the second place.
  const auto t = route({0.5f, 0.5f, 0.5f, 2.0f});
  const auto w = row_weights(t, 0);
  ASSERT_EQ(w.size(), 2u);
  ASSERT_TRUE(w.count(3));
  const double s = sqrtsoftplus(0.5), s3 = sqrtsoftplus(2.0);
  EXPECT_NEAR(w.at(3), s3 / (s + s3), 1e-6);
}

TEST_F(ModelRouter, HashRoutingUsesTid2eidAndCountsDuplicateIds) {
  // K = 3 over E = 4 experts; token 1's row lists expert 1 twice.
  moe_ = plumb_test::make_tiny_moe(4, 3, 4, 2, 3, plumb_test::identity_gate(4), 6, false);
  moe_->w.tid2eid = plumb::IndexTensor({3, 3}, std::vector<int64_t>{0, 1, 2, 1, 1, 2, 3, 3, 3});
  const auto r = route({0.3f, -1.0f, 2.0f, 0.7f, 0.3f, -1.0f, 2.0f, 0.7f}, MlpType::Hash, {1, 2});
  EXPECT_EQ(std::vector<int64_t>(r.idx.data.begin(), r.idx.data.begin() + 3), (std::vector<int64_t>{1, 1, 2}));
  const double s1 = sqrtsoftplus(-1.0), s2 = sqrtsoftplus(2.0);
  // Each listing counts: expert 1 appears twice in the denominator and gets two weights.
  EXPECT_NEAR(r.weight[0], s1 / (2 * s1 + s2), 1e-6);
  EXPECT_NEAR(r.weight[1], s1 / (2 * s1 + s2), 1e-6);
  EXPECT_NEAR(r.weight[2], s2 / (2 * s1 + s2), 1e-6);
  // Token 2: one expert three times, weights 1/3 each (the scores of other experts never enter).
  for (int k = 3; k < 6; ++k) {
    EXPECT_EQ(r.idx[k], 3);
    EXPECT_NEAR(r.weight[k], 1.0 / 3, 1e-6);
  }
}

TEST_F(ModelRouter, HashRoutingIgnoresTheScoresWhenSelecting) {
  moe_->w.tid2eid = plumb::IndexTensor({3, 2}, std::vector<int64_t>{0, 1, 2, 3, 1, 0});
  // Expert 3 has by far the largest logit, but token 2 routes to {1, 0}.
  const auto r = route({0.1f, 0.2f, 0.3f, 9.0f}, MlpType::Hash, {2});
  EXPECT_EQ(r.idx.data, (std::vector<int64_t>{1, 0}));
  const double s0 = sqrtsoftplus(0.1), s1 = sqrtsoftplus(0.2);
  EXPECT_NEAR(r.weight[0], s1 / (s0 + s1), 1e-6);
  EXPECT_NEAR(r.weight[1], s0 / (s0 + s1), 1e-6);
}

TEST_F(ModelRouter, SigmoidScoring) {
  moe_->c.score = ScoreFunc::Sigmoid;
  const auto r = route({1.0f, -0.5f, 2.0f, 0.3f});
  const auto w = row_weights(r, 0);
  ASSERT_TRUE(w.count(2) && w.count(0));
  const double s0 = plumb_test::sigmoid_d(1.0), s2 = plumb_test::sigmoid_d(2.0);
  EXPECT_NEAR(w.at(0), s0 / (s0 + s2), 1e-6);
  EXPECT_NEAR(w.at(2), s2 / (s0 + s2), 1e-6);
}

TEST_F(ModelRouter, SoftmaxScoringRenormalizedAndNot) {
  moe_->c.score = ScoreFunc::Softmax;
  const std::vector<float> l = {1.0f, -0.5f, 2.0f, 0.3f};
  double z = 0;
  for (float v : l) z += std::exp(double(v));
  const double p0 = std::exp(1.0) / z, p2 = std::exp(2.0) / z;
  const auto r = route(l);
  auto w = row_weights(r, 0);
  ASSERT_TRUE(w.count(2) && w.count(0));
  EXPECT_NEAR(w.at(0), p0 / (p0 + p2), 1e-6);
  EXPECT_NEAR(w.at(2), p2 / (p0 + p2), 1e-6);
  // renorm = false: the weights are the softmax probabilities themselves.
  RouterOptions opt;
  opt.renorm = false;
  w = row_weights(route(l, MlpType::Learned, {0}, opt), 0);
  EXPECT_NEAR(w.at(0), p0, 1e-6);
  EXPECT_NEAR(w.at(2), p2, 1e-6);
}

}  // namespace
