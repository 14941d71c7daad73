// The routed-scaling contract at compile time, and the expert-parallel share of the shared expert.
#include <gtest/gtest.h>

#include "model/experts.h"
#include "model_test_util.h"

namespace {

using plumb::Rsf;

// A runner accepts exactly the placement it declares: the mismatched pairings do not satisfy the constraint the
// MoE composition is written against, so they cannot be composed.
static_assert(plumb::RunnerAccepts<plumb::RunnerFoldedWeights, Rsf::Folded>);
static_assert(!plumb::RunnerAccepts<plumb::RunnerFoldedWeights, Rsf::Unfolded>);
static_assert(plumb::RunnerAccepts<plumb::RunnerScalesOutput, Rsf::Unfolded>);
static_assert(!plumb::RunnerAccepts<plumb::RunnerScalesOutput, Rsf::Folded>);

class ExpertParallel : public ::testing::Test {
 protected:
  static constexpr int E = 8, K = 2, D = 6, I = 4, V = 9, n = 5;
  void SetUp() override {
    plumb_test::Rng rng(7);
    moe_ = plumb_test::make_tiny_moe(E, K, D, I, V, rng.vec(E * D), 8, true, 1.0f);
    moe_->c.routed_scaling = 2.5;
    moe_->c.swiglu_limit = 0.9;
    x_ = rng.tensor({n, D}, -2.0f, 2.0f);
    tokens_ = {0, 1, 2, 3, 4};
  }
  std::unique_ptr<plumb_test::TinyMoe> moe_;
  plumb::Tensor x_;
  std::vector<int32_t> tokens_;
};

TEST_F(ExpertParallel, RanksSumToTheSingleProcessOutput) {
  const plumb::ModelOptions opt;
  const plumb::Numerics nm(opt);
  const plumb::Tap none;
  const auto single = plumb::moe_forward(moe_->w, moe_->c, plumb::MlpType::Learned, x_, tokens_, opt, nm, none);
  for (int ep : {1, 2, 4, 8}) {
    std::vector<plumb::Tensor> ranks;
    const auto ep_out = plumb::moe_forward_ep_simulated(moe_->w, moe_->c, plumb::MlpType::Learned, x_, tokens_, opt, ep, &ranks);
    ASSERT_EQ(int(ranks.size()), ep);
    for (int64_t i = 0; i < single.numel(); ++i)
      EXPECT_NEAR(ep_out[i], single[i], 1e-5 * std::max(1.0f, std::fabs(single[i]))) << "ep_size " << ep << " element " << i;
  }
}

TEST_F(ExpertParallel, SharedExpertCountedOnceNotEpTimes) {
  const plumb::ModelOptions opt;
  const plumb::Numerics nm(opt);
  const int ep = 4;
  const auto good = plumb::moe_forward_ep_simulated(moe_->w, moe_->c, plumb::MlpType::Learned, x_, tokens_, opt, ep);
  const auto bad = plumb::moe_forward_ep_simulated(moe_->w, moe_->c, plumb::MlpType::Learned, x_, tokens_, opt, ep, nullptr,
                                                   /*fault_shared_unscaled=*/true);
  // Without the 1/ep_size share the all-reduce adds the shared expert ep times: bad - good = (ep - 1) * shared.
  const auto shared = plumb::expert_ffn(*moe_->w.shared, moe_->c.swiglu_limit, x_, nm);
  double worst = 0;
  for (int64_t i = 0; i < good.numel(); ++i)
    worst = std::max(worst, std::fabs(double(bad[i] - good[i]) - (ep - 1) * double(shared[i])));
  EXPECT_LT(worst, 1e-5);
}

TEST_F(ExpertParallel, RefusesAnUnevenSplit) {
  const plumb::ModelOptions opt;
  EXPECT_THROW(plumb::moe_forward_ep_simulated(moe_->w, moe_->c, plumb::MlpType::Learned, x_, tokens_, opt, 3), plumb::Error);
}

}  // namespace
