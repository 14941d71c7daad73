// The routed-scaling contract (issue 3) and the expert SwiGLU (src/model/experts.h). Every router (hash, learned)
// x runner placement (factor folded in the top-k weights, or applied by the runner on its output) must give
//   MoE(x) = rsf * sum_k w_k E_k(x) + Shared(x)
// computed here in double from the expert weights; every rsf fault must give exactly the wrong factor it names,
// on the layers it names. The compile-time half of the contract is checked with static_asserts at the end.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/error.h"
#include "model/experts.h"
#include "model/router.h"
#include "patches/registry.h"
#include "model_test_util.h"
#include "tools/golden_fixture.h"

namespace {

using plumb::MlpType;
using plumb::ModelOptions;
using plumb::RoutedWeights;
using plumb::Rsf;
using plumb::Tensor;

constexpr double kRsf = 1.5;
constexpr double kLimit = 0.8;  // swiglu_limit small enough that both clamps fire on this data

// The routed part R(x) = sum_k w_k E_k(x) (weights renormalized to one, no factor) and the shared part S(x),
// from the spec formulas in double.
struct Closed {
  std::vector<double> routed, shared;
};

class ModelMoe : public ::testing::Test {
 protected:
  static constexpr int E = 4, K = 2, D = 4, I = 3, V = 5, n = 3;

  void SetUp() override {
    plumb_test::Rng rng(21);
    moe_ = plumb_test::make_tiny_moe(E, K, D, I, V, rng.vec(E * D), 22, true, 1.2f);
    moe_->c.routed_scaling = kRsf;
    moe_->c.swiglu_limit = kLimit;
    moe_->w.bias = Tensor({E}, std::vector<float>{0.05f, -0.1f, 0.2f, 0.0f});
    // Token 4 lists expert 2 twice (each listing counts).
    moe_->w.tid2eid = plumb::IndexTensor({V, K}, std::vector<int64_t>{0, 1, 1, 2, 3, 0, 2, 3, 2, 2});
    x_ = rng.tensor({n, D}, -2.0f, 2.0f);
    tokens_ = {0, 3, 4};
  }

  Closed closed(MlpType type, double limit) const {
    Closed out{std::vector<double>(size_t(n * D), 0.0), std::vector<double>(size_t(n * D), 0.0)};
    for (int t = 0; t < n; ++t) {
      std::vector<double> x(x_.row(t), x_.row(t) + D);
      const auto l = moe_->logits(x.data());
      std::vector<double> s(E);
      for (int e = 0; e < E; ++e) s[size_t(e)] = std::sqrt(std::log1p(std::exp(l[size_t(e)])));
      std::vector<int64_t> idx;
      if (type == MlpType::Hash) {
        for (int k = 0; k < K; ++k) idx.push_back(moe_->w.tid2eid[tokens_[size_t(t)] * K + k]);
      } else {
        std::vector<int64_t> order(E);
        std::iota(order.begin(), order.end(), 0);
        auto sel = [&](int64_t e) { return s[size_t(e)] + moe_->w.bias[e]; };
        std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return sel(a) > sel(b); });
        EXPECT_GT(sel(order[K - 1]) - sel(order[K]), 1e-3) << "test data has a near-tie at the selection boundary";
        idx.assign(order.begin(), order.begin() + K);
      }
      double sum = 0;
      for (auto e : idx) sum += s[size_t(e)];
      for (auto e : idx) {
        const auto y = moe_->experts[size_t(e)](x.data(), limit);
        for (int d = 0; d < D; ++d) out.routed[size_t(t * D + d)] += s[size_t(e)] / sum * y[size_t(d)];
      }
      const auto sh = moe_->shared(x.data(), limit);
      for (int d = 0; d < D; ++d) out.shared[size_t(t * D + d)] = sh[size_t(d)];
    }
    return out;
  }

  // Runs the MoE block; returns ffn.out and records the taps.
  Tensor run(MlpType type, const ModelOptions& opt, plumb::TapRecorder& rec) const {
    return plumb::moe_forward(moe_->w, moe_->c, type, x_, std::span<const int32_t>(tokens_), opt,
                              plumb::Numerics(opt), plumb::Tap{&rec, ""});
  }

  static std::vector<double> combine(const Closed& c, double routed_factor, double shared_factor) {
    std::vector<double> v(c.routed.size());
    for (size_t i = 0; i < v.size(); ++i) v[i] = routed_factor * c.routed[i] + shared_factor * c.shared[i];
    return v;
  }

  std::unique_ptr<plumb_test::TinyMoe> moe_;
  Tensor x_;
  std::vector<int32_t> tokens_;
};

TEST_F(ModelMoe, TestDataExercisesBothClampsAndTheFactor) {
  // Guards the meaning of the tests below: the clamps change the result, and rsf != 1 is visible.
  const Closed a = closed(MlpType::Learned, kLimit), b = closed(MlpType::Learned, 0);
  double d = 0, mag = 0;
  for (size_t i = 0; i < a.routed.size(); ++i) {
    d = std::max(d, std::fabs(a.routed[i] - b.routed[i]) + std::fabs(a.shared[i] - b.shared[i]));
    mag = std::max(mag, std::fabs(a.routed[i]));
  }
  EXPECT_GT(d, 1e-2);
  EXPECT_GT(mag * (kRsf - 1), 1e-2);
}

// Every router x runner combination the options allow gives the closed form, with the shared expert unscaled.
TEST_F(ModelMoe, EveryRouterTimesRunnerPlacementAppliesTheFactorExactlyOnce) {
  struct Placement {
    const char* name;
    ModelOptions opt;
  };
  std::vector<Placement> placements(3);
  placements[0].name = "default (factor folded in top-k, moe.rsf_in_topk)";
  placements[1].name = "moe.rsf_on_output (runner scales its output)";
  placements[1].opt.rsf_on_output = true;
  placements[2].name = "moe.rsf_on_output + moe.weight_before_down";
  placements[2].opt.rsf_on_output = true;
  placements[2].opt.weight_before_down = true;
  for (MlpType type : {MlpType::Hash, MlpType::Learned}) {
    const Closed c = closed(type, kLimit);
    const auto want = combine(c, kRsf, 1.0);
    for (const auto& p : placements) {
      SCOPED_TRACE(std::string(type == MlpType::Hash ? "hash" : "learned") + " router, " + p.name);
      plumb::TapRecorder rec;
      const Tensor out = run(type, p.opt, rec);
      ASSERT_EQ(out.shape, (plumb::Shape{n, D}));
      EXPECT_LT(plumb_test::rel_err(out.data, want), 1e-5);
      ASSERT_TRUE(rec.f32.count("ffn.routed") && rec.f32.count("ffn.shared") && rec.f32.count("ffn.out"));
      EXPECT_LT(plumb_test::rel_err(rec.f32["ffn.routed"].data, combine(c, kRsf, 0.0)), 1e-5) << "routed = rsf * R";
      EXPECT_LT(plumb_test::rel_err(rec.f32["ffn.shared"].data, c.shared), 1e-5) << "shared expert unscaled";
      EXPECT_EQ(rec.f32["ffn.out"].data, out.data);
      // The tapped gate weights include the factor in both placements: each row sums to rsf.
      ASSERT_TRUE(rec.f32.count("ffn.gate.weights"));
      const Tensor& gw = rec.f32["ffn.gate.weights"];
      for (int t = 0; t < n; ++t) EXPECT_NEAR(gw[t * K] + gw[t * K + 1], kRsf, 1e-5);
    }
  }
}

// Each rsf fault gives exactly the factor its name says, on the layers it says.
TEST_F(ModelMoe, EachRsfFaultAppliesExactlyTheWrongFactorItNames) {
  struct Fault {
    const char* name;
    bool ModelOptions::*flag;
    double routed_hash, routed_learned, shared;
  };
  const double r = kRsf;
  const Fault faults[] = {
      {"fault.rsf_twice", &ModelOptions::fault_rsf_twice, r * r, r * r, 1},
      {"fault.rsf_missing", &ModelOptions::fault_rsf_missing, 1, 1, 1},
      {"fault.rsf_missing_hash_layers", &ModelOptions::fault_rsf_missing_hash_layers, 1, r, 1},
      {"fault.shared_scaled", &ModelOptions::fault_shared_scaled, r, r, r},
  };
  for (MlpType type : {MlpType::Hash, MlpType::Learned}) {
    const Closed c = closed(type, kLimit);
    for (const auto& f : faults)
      for (bool on_output : {false, true}) {  // the fault wins whichever placement was asked for
        SCOPED_TRACE(std::string(f.name) + (type == MlpType::Hash ? ", hash layer" : ", learned layer") +
                     (on_output ? ", rsf_on_output" : ", rsf_in_topk"));
        ModelOptions opt;
        opt.rsf_on_output = on_output;
        opt.*f.flag = true;
        plumb::TapRecorder rec;
        const Tensor out = run(type, opt, rec);
        const double fr = type == MlpType::Hash ? f.routed_hash : f.routed_learned;
        EXPECT_LT(plumb_test::rel_err(out.data, combine(c, fr, f.shared)), 1e-5);
        // ... and is wrong by a visible margin wherever its factor is not the right one.
        if (fr != r || f.shared != 1.0) {
          EXPECT_GT(plumb_test::rel_err(out.data, combine(c, r, 1.0)), 1e-3);
        }
        if (f.shared == 1.0) {
          EXPECT_LT(plumb_test::rel_err(rec.f32["ffn.routed"].data, combine(c, fr, 0.0)), 1e-5);
        }
      }
  }
}

TEST_F(ModelMoe, SwigluUnclampedFaultDropsBothClampsOnRoutedAndShared) {
  ModelOptions opt;
  opt.fault_swiglu_unclamped = true;
  for (MlpType type : {MlpType::Hash, MlpType::Learned}) {
    plumb::TapRecorder rec;
    const Tensor out = run(type, opt, rec);
    EXPECT_LT(plumb_test::rel_err(out.data, combine(closed(type, 0), kRsf, 1.0)), 1e-5);
    EXPECT_GT(plumb_test::rel_err(out.data, combine(closed(type, kLimit), kRsf, 1.0)), 1e-3);
  }
}

TEST_F(ModelMoe, RunnersDeclareTheirPlacementAndScale) {
  EXPECT_EQ(plumb::RunnerFoldedWeights::output_scale(moe_->c), 1.0f);
  EXPECT_EQ(plumb::RunnerScalesOutput::output_scale(moe_->c), float(kRsf));
}

// The run-time half of the contract: the registry names map onto exactly the options exercised above, the two
// placements cannot be combined, and a fault is only ever on when named.
TEST(ModelMoeRegistry, PlacementsAndFaultsAreChosenByName) {
  EXPECT_FALSE(plumb::parse_patches("moe.rsf_in_topk").options.rsf_on_output);
  EXPECT_TRUE(plumb::parse_patches("moe.rsf_on_output").options.rsf_on_output);
  try {
    plumb::parse_patches("moe.rsf_in_topk,moe.rsf_on_output");
    ADD_FAILURE() << "both placements accepted";
  } catch (const plumb::Error& e) {
    EXPECT_NE(std::string(e.what()).find("moe.rsf_in_topk"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("moe.rsf_on_output"), std::string::npos) << e.what();
  }
  const std::pair<const char*, bool ModelOptions::*> faults[] = {
      {"fault.rsf_twice", &ModelOptions::fault_rsf_twice},
      {"fault.rsf_missing", &ModelOptions::fault_rsf_missing},
      {"fault.rsf_missing_hash_layers", &ModelOptions::fault_rsf_missing_hash_layers},
      {"fault.shared_scaled", &ModelOptions::fault_shared_scaled},
      {"fault.swiglu_unclamped", &ModelOptions::fault_swiglu_unclamped},
      {"fault.comb_untransposed", &ModelOptions::fault_comb_untransposed},
      {"fault.softplus_naive", &ModelOptions::fault_softplus_naive},
      {"fault.renorm_unfloored", &ModelOptions::fault_renorm_unfloored},
  };
  for (const auto& [name, flag] : faults) {
    const auto ps = plumb::parse_patches(name);
    EXPECT_TRUE(ps.options.*flag) << name;
    EXPECT_TRUE(ps.has_fault()) << name;
    int on = 0;
    for (const auto& [other, f] : faults) on += ps.options.*f;
    EXPECT_EQ(on, 1) << name << " turns on exactly its own fault";
  }
  // No patch list that does not name a fault turns one on.
  const auto all = plumb::parse_patches("moe.rsf_on_output,moe.weight_before_down,mhc.bf16_mix,router.bf16");
  EXPECT_FALSE(all.has_fault());
  for (const auto& [name, flag] : faults) EXPECT_FALSE(all.options.*flag) << name;
  EXPECT_THROW(plumb::parse_patches("fault.*"), plumb::Error);
  EXPECT_THROW(plumb::parse_patches("fault.rsf"), plumb::Error);
}

// ---------------------------------------------------------------- expert SwiGLU

class ModelExpert : public ::testing::Test {
 protected:
  // D = 2, I = 2: W1 = identity (gate = x), W3 = diag(2, 1) (up = [2 x0, x1]), W2 = identity.
  void SetUp() override {
    ck_ = plumb_test::write_checkpoint(dir_, {plumb_test::f32("w1.weight", {2, 2}, {1, 0, 0, 1}),
                                              plumb_test::f32("w2.weight", {2, 2}, {1, 0, 0, 1}),
                                              plumb_test::f32("w3.weight", {2, 2}, {2, 0, 0, 1})});
    e_ = plumb::ExpertWeights{plumb::Matrix::bind(ck_, "w1.weight", 2, 2), plumb::Matrix::bind(ck_, "w2.weight", 2, 2),
                              plumb::Matrix::bind(ck_, "w3.weight", 2, 2)};
  }
  plumb_test::TempDir dir_;
  plumb::Checkpoint ck_;
  plumb::ExpertWeights e_;
  const plumb::Numerics nm_{ModelOptions{}};  // the fp32 reference numerics
};

TEST_F(ModelExpert, GateClampedAboveOnlyUpBothSidesBeforeTheActivation) {
  // x = [3, -3]: gate = [3, -3], up = [6, -3]. With L = 2: gate -> [2, -3] (no lower clamp), up -> [2, -2].
  const Tensor x({1, 2}, std::vector<float>{3.0f, -3.0f});
  const Tensor y = plumb::expert_ffn(e_, 2.0, x, nm_);
  using plumb_test::silu_d;
  EXPECT_NEAR(y[0], silu_d(2.0) * 2.0, 1e-6);
  EXPECT_NEAR(y[1], silu_d(-3.0) * -2.0, 1e-6);
  // The alternatives the clamp must not be: clamping after SiLU, or clamping the gate from below too.
  EXPECT_GT(std::fabs(y[0] - std::min(silu_d(3.0), 2.0) * 2.0), 1e-3);
  EXPECT_GT(std::fabs(y[1] - silu_d(-2.0) * -2.0), 1e-3);

  // kSwigluNoClamp: no clamp at all.
  const Tensor z = plumb::expert_ffn(e_, plumb::kSwigluNoClamp, x, nm_);
  EXPECT_NEAR(z[0], silu_d(3.0) * 6.0, 1e-5);
  EXPECT_NEAR(z[1], silu_d(-3.0) * -3.0, 1e-5);
  // Limits of 0 and below clamp as torch's clamp does (transformers' experts): gate min(g, L), up min(max(u, -L), L),
  // so 0 zeroes every output and -1 makes up -1: gate [-1, -3], up [-1, -1].
  const Tensor zero = plumb::expert_ffn(e_, 0.0, x, nm_), neg = plumb::expert_ffn(e_, -1.0, x, nm_);
  EXPECT_EQ(zero[0], 0.0f);
  EXPECT_EQ(zero[1], 0.0f);
  EXPECT_NEAR(neg[0], silu_d(-1.0) * -1.0, 1e-6);
  EXPECT_NEAR(neg[1], silu_d(-3.0) * -1.0, 1e-6);
}

// transformers' other expert activations (config.json's hidden_act) in place of SiLU, the clamps unchanged, against
// their formulas in double: GELU with erf, GELU's tanh form, ReLU. x = [3, -3], L = 2: gate [2, -3], up [2, -2].
TEST_F(ModelExpert, HiddenActReplacesSiluBeforeTheProduct) {
  const Tensor x({1, 2}, std::vector<float>{3.0f, -3.0f});
  auto gelu = [](double v) { return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))); };
  auto gelu_tanh = [](double v) { return 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v))); };
  auto relu = [](double v) { return v > 0 ? v : 0.0; };
  const struct {
    plumb::ExpertAct act;
    double (*f)(double);
  } cases[] = {{plumb::ExpertAct::Gelu, +gelu}, {plumb::ExpertAct::GeluTanh, +gelu_tanh}, {plumb::ExpertAct::Relu, +relu}};
  for (const auto& c : cases) {
    const Tensor y = plumb::expert_ffn(e_, 2.0, x, nm_, nullptr, c.act);
    EXPECT_NEAR(y[0], c.f(2.0) * 2.0, 2e-6) << plumb::expert_act_name(c.act);
    EXPECT_NEAR(y[1], c.f(-3.0) * -2.0, 2e-6) << plumb::expert_act_name(c.act);
  }
  // The default is SiLU, and GELU's two forms differ (by ~1e-4 at -3: the test tells them apart).
  EXPECT_EQ(plumb::expert_ffn(e_, 2.0, x, nm_)[1], plumb::expert_ffn(e_, 2.0, x, nm_, nullptr, plumb::ExpertAct::Silu)[1]);
  EXPECT_GT(std::fabs(gelu(-3.0) - gelu_tanh(-3.0)) * 2.0, 1e-4);
}

// mlp_bias (transformers' shared MLP): W1 x + b1 and W3 x + b3 before the clamps, + b2 after W2; the official
// numerics leave them out (the official code has none). x = [3, -3], b1 = [-0.5, 1], b3 = [1, -4], b2 = [0.25, -1],
// L = 2: gate [2.5, -2] -> [2, -2], up [7, -7] -> [2, -2].
TEST_F(ModelExpert, MlpBiasesGoBeforeTheClampsAndAfterW2) {
  plumb::ExpertWeights e = e_;
  e.b1 = Tensor({2}, std::vector<float>{-0.5f, 1.0f});
  e.b3 = Tensor({2}, std::vector<float>{1.0f, -4.0f});
  e.b2 = Tensor({2}, std::vector<float>{0.25f, -1.0f});
  const Tensor x({1, 2}, std::vector<float>{3.0f, -3.0f});
  const Tensor y = plumb::expert_ffn(e, 2.0, x, nm_);
  using plumb_test::silu_d;
  EXPECT_NEAR(y[0], silu_d(2.0) * 2.0 + 0.25, 1e-6);
  EXPECT_NEAR(y[1], silu_d(-2.0) * -2.0 - 1.0, 1e-6);
  // Biases after the clamps instead would give gate [1.5, -2], up [3, -6]: other values.
  EXPECT_GT(std::fabs(y[0] - (silu_d(1.5) * 3.0 + 0.25)), 1e-3);
  const plumb::Numerics official{plumb::parse_patches("numerics.official").options};
  const Tensor yo = plumb::expert_ffn(e, 2.0, x, official), yn = plumb::expert_ffn(e_, 2.0, x, official);
  EXPECT_EQ(yo.data, yn.data) << "the official numerics applied the biases";
}

// hidden_act per numerics mode: transformers applies it, the official code has SiLU only.
TEST(ModelExpertLimit, HiddenActPerNumerics) {
  plumb::ModelConfig c;
  c.act = plumb::ExpertAct::Gelu;
  EXPECT_EQ(plumb::expert_activation(c, false), plumb::ExpertAct::Gelu);
  EXPECT_EQ(plumb::expert_activation(c, true), plumb::ExpertAct::Silu);
}

// What a config's swiglu_limit means per numerics mode: transformers (the default) clamps at it whatever it is, the
// official code only when it is positive.
TEST(ModelExpertLimit, SwigluLimitPerNumerics) {
  plumb::ModelConfig c;
  for (double v : {10.0, 0.0, -2.0}) {
    c.swiglu_limit = v;
    EXPECT_EQ(plumb::swiglu_clamp_limit(c, false), v) << v;
    EXPECT_EQ(plumb::swiglu_clamp_limit(c, true), v > 0 ? v : plumb::kSwigluNoClamp) << v;
  }
}

// With a W2 bias (b2 = [1, -2]) scaling before W2 and after it differ: W2 (s h) + b2 against s (W2 h + b2). W2 is
// the identity, so the expected rows are s h + b2, h computed by hand.
TEST_F(ModelExpert, PreScaleMultipliesTheActivationBeforeW2) {
  plumb::ExpertWeights e{e_.w1, e_.w2, e_.w3, Tensor({2}, std::vector<float>{0, 0}),
                         Tensor({2}, std::vector<float>{1.0f, -2.0f}), Tensor({2}, std::vector<float>{0, 0})};
  const Tensor x({2, 2}, std::vector<float>{3.0f, -3.0f, 0.5f, 1.0f});
  const float scale[2] = {0.25f, 3.0f};
  const Tensor y = plumb::expert_ffn(e, 2.0, x, nm_, scale);
  using plumb_test::silu_d;
  // Token 0: gate [3, -3] -> [2, -3] (clamped above), up [6, -3] -> [2, -2]. Token 1: gate [0.5, 1], up [1, 1].
  const double h[2][2] = {{silu_d(2.0) * 2.0, silu_d(-3.0) * -2.0}, {silu_d(0.5), silu_d(1.0)}};
  const double b2[2] = {1.0, -2.0};
  for (int t = 0; t < 2; ++t)
    for (int d = 0; d < 2; ++d) {
      EXPECT_NEAR(y[t * 2 + d], scale[t] * h[t][d] + b2[d], 1e-6) << t << "," << d;
      EXPECT_GT(std::fabs(y[t * 2 + d] - scale[t] * (h[t][d] + b2[d])), 1e-2) << "scaled after W2 at " << t << "," << d;
    }
}

// ---------------------------------------------------------------- compile-time contract

// RoutedWeights of the two placements are unrelated types: neither converts to the other, so a function that
// takes `const RoutedWeights<Runner::consumes>&` (experts.cpp's run_routed) cannot be handed the other placement.
static_assert(!std::is_convertible_v<RoutedWeights<Rsf::Folded>, RoutedWeights<Rsf::Unfolded>>);
static_assert(!std::is_convertible_v<RoutedWeights<Rsf::Unfolded>, RoutedWeights<Rsf::Folded>>);
static_assert(!std::is_convertible_v<const RoutedWeights<Rsf::Unfolded>&, const RoutedWeights<Rsf::Folded>&>);
static_assert(!std::is_constructible_v<RoutedWeights<Rsf::Folded>, RoutedWeights<Rsf::Unfolded>&&>);
static_assert(!std::is_constructible_v<RoutedWeights<Rsf::Unfolded>, const RoutedWeights<Rsf::Folded>&>);

// The runners declare the placement they consume.
static_assert(plumb::RunnerFoldedWeights::consumes == Rsf::Folded);
static_assert(plumb::RunnerScalesOutput::consumes == Rsf::Unfolded);

// route<P> produces the placement it is asked for.
static_assert(std::is_same_v<decltype(plumb::route<Rsf::Folded>(std::declval<const plumb::MoeWeights&>(),
                                                                 std::declval<const plumb::ModelConfig&>(), MlpType::Hash,
                                                                 std::declval<const plumb::RouterInputs&>())),
                             RoutedWeights<Rsf::Folded>>);
static_assert(std::is_same_v<decltype(plumb::route<Rsf::Unfolded>(std::declval<const plumb::MoeWeights&>(),
                                                                   std::declval<const plumb::ModelConfig&>(), MlpType::Hash,
                                                                   std::declval<const plumb::RouterInputs&>())),
                             RoutedWeights<Rsf::Unfolded>>);

// The pairing rule as experts.cpp spells it (a runner's parameter is RoutedWeights<Runner::consumes>), detected
// with a requires-expression for every runner x placement. experts.cpp's own run_routed/combine live in an
// anonymous namespace and cannot be named from a test; this probe has the same parameter type, so it proves
// that the types alone reject a mismatched composition.
template <class Runner>
void runner_probe(const RoutedWeights<Runner::consumes>&) {}
template <class Runner, Rsf P>
constexpr bool composes = requires(const RoutedWeights<P>& r) { runner_probe<Runner>(r); };
static_assert(composes<plumb::RunnerFoldedWeights, Rsf::Folded>);
static_assert(composes<plumb::RunnerScalesOutput, Rsf::Unfolded>);
static_assert(!composes<plumb::RunnerFoldedWeights, Rsf::Unfolded>, "unscaled weights into a folded runner: factor missing");
static_assert(!composes<plumb::RunnerScalesOutput, Rsf::Folded>, "folded weights into a scaling runner: factor twice");

}  // namespace

// A toolkit configuration is "[cpu:|cuda:]PATCHES": the backend prefix is split off, the patches parsed as usual.
TEST(ModelMoeRegistry, RunConfigurationsNameTheirBackend) {
  EXPECT_EQ(plumb::parse_config("").backend, "cpu");
  EXPECT_EQ(plumb::parse_config("moe.rsf_on_output").backend, "cpu");
  const auto g = plumb::parse_config("cuda:moe.rsf_on_output,cuda.moe_mxfp4");
  EXPECT_EQ(g.backend, "cuda");
  EXPECT_TRUE(g.patches.options.rsf_on_output);
  EXPECT_TRUE(g.patches.options.cuda_moe_mxfp4);
  EXPECT_EQ(plumb::parse_config("cuda:").patches.active.size(), 0u);
  EXPECT_EQ(plumb::parse_config("cpu:router.bf16").backend, "cpu");
  EXPECT_THROW(plumb::parse_config("tpu:"), plumb::Error);
  EXPECT_THROW(plumb::parse_config("cuda:nope"), plumb::Error);
  // The GPU kernels are patches of the cuda backend only.
  for (const char* name : {"cuda.fp8_gemv", "cuda.moe_mxfp4", "cuda.head_bf16", "cuda.graph", "cuda.pdl", "cuda.prefill_gemm",
                           "cuda.streams", "cuda.l2_prefetch", "cuda.hc_prefetch", "cuda.l2_evict_first", "cuda.pdl_hc_attn", "cuda.linear_early", "cuda.branch_flags", "cuda.early_joins", "cuda.shared_first", "attn.splitk_decode", "indexer.tc_scores",
                           "indexer.dmma_scores", "cuda.hc_norm_after_mix", "cuda.hc_fold", "attn.splitk_f16", "cuda.batch_rows"}) {
    const auto* p = plumb::find_patch(name);
    ASSERT_NE(p, nullptr) << name;
    EXPECT_EQ(p->backend, "cuda") << name;
  }
}
