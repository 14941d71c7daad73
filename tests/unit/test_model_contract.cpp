// The routed-scaling contract at compile time, and the expert-parallel share of the shared expert.
#include <gtest/gtest.h>

#include <cmath>

#include "model/experts.h"
#include "model/ops.h"
#include "model/router.h"
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
    // The all-reduce done here, from each rank's own partial output: their sum is the single-process output.
    for (int64_t i = 0; i < single.numel(); ++i) {
      double sum = 0;
      for (const auto& r : ranks) {
        ASSERT_EQ(r.numel(), single.numel());
        sum += r[i];
      }
      EXPECT_NEAR(sum, single[i], 1e-5 * std::max(1.0f, std::fabs(single[i]))) << "ep_size " << ep << " element " << i;
      EXPECT_NEAR(ep_out[i], single[i], 1e-5 * std::max(1.0f, std::fabs(single[i]))) << "ep_size " << ep << " element " << i;
    }
    if (ep > 1) {  // the work is split: no single rank holds the whole output
      double max_gap = 0;
      for (int64_t i = 0; i < single.numel(); ++i) max_gap = std::max(max_gap, double(std::fabs(ranks[0][i] - single[i])));
      EXPECT_GT(max_gap, 1e-3) << "ep_size " << ep << ": rank 0 alone already holds the whole output";
    }
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

namespace {

// DeepSeek-V3 grouped selection, by hand: 4 groups of 2; group scores are the sums of each group's two best.
TEST(GroupedTopK, KeepsTheBestGroupsOnly) {
  float sel[8] = {0.1f, 0.9f, 0.5f, 0.4f, 0.3f, 0.2f, 0.8f, 0.05f};
  // group sums: g0 1.0, g1 0.9, g2 0.5, g3 0.85 -> keep g0 and g1
  plumb::mask_groups(sel, 8, 4, 2);
  for (int e = 0; e < 4; ++e) EXPECT_TRUE(std::isfinite(sel[e])) << e;
  for (int e = 4; e < 8; ++e) EXPECT_EQ(sel[e], -INFINITY) << e;
  // Ungrouped, expert 6 (0.8) would be second; grouped, the top-2 are experts 1 and 2.
  const auto top = plumb::ops::topk_lowest_index_first(sel, 8, 2);
  EXPECT_EQ(top, (std::vector<int64_t>{1, 2}));
}

}  // namespace
