// The router's kernels against the reference router (every score, hash routing, both rsf placements, ties, other
// shapes), and the routed MoE end to end under the routed-scaling contract.
//
// Tolerances (normalized: max |gpu - ref| / max |ref| over the output tensor):
//   router logits           1e-6  fp64 accumulation, as the reference
//   router weights          1e-5  expf / log1pf are within 2 ulp of glibc's
//   routed MoE (end to end) 5e-3  fp16 activations and hidden state against the fp32 reference
// Every comparison prints where its largest error is (index, both values).
#include <algorithm>
#include <cstring>
#include <numeric>

#include "cuda/fwd_kernels.h"
#include "cuda/kernels.h"
#include "model/experts.h"
#include "model/router.h"
#include "cuda_test_util.h"
#include "kernel_twins.h"

using namespace plumb;
using namespace plumb_cuda_test;
using cuda::Act;

// ---- router ----

class CudaRouter : public GpuTest {};

namespace {

struct RouterCase {
  const char* name;
  ScoreFunc score;
  MlpType type;
  bool renorm;
};

struct RouterShape {
  int64_t E = 256, D = 4096, K = 6;
  Act act = Act::F32;
  bool ties = false;  // bias on 4 levels and token 3's x zero: many equal selection scores
};

template <Rsf P>
void check_router(const RouterCase& rc, int n, Rng& rng, const RouterShape& shape = {}) {
  const int64_t E = shape.E, D = shape.D, K = shape.K, V = 1000;
  TempDir dir;
  std::vector<OwnedTensor> ts;
  ts.push_back(bf16_tensor("gate.weight", {E, D}, rng.floats(size_t(E * D), -0.05f, 0.05f)));
  const Checkpoint ck = write_checkpoint(dir, ts);
  MoeWeights w;
  w.gate = Matrix::bind(ck, "gate.weight", E, D);
  if (rc.type == MlpType::Learned) {
    w.bias = Tensor({E}, rng.floats(size_t(E), -0.05f, 0.05f));
    if (shape.ties)
      for (int64_t e = 0; e < E; ++e) w.bias[e] = 0.01f * float(rng.integer(0, 3));
  } else {
    w.tid2eid = IndexTensor({V, K});
    for (int64_t i = 0; i < V * K; ++i) w.tid2eid[i] = rng.integer(0, int(E - 1));
  }
  ModelConfig c;
  c.n_experts = int(E), c.top_k = int(K), c.hidden = int(D), c.routed_scaling = 1.5, c.score = rc.score;
  // Rows: ordinary tokens, one whose logits are all far below zero (every sqrt-softplus score underflows to 0:
  // the floor keeps the weights finite), one with logits far above 88 (a naive softplus overflows).
  std::vector<float> xv = rng.floats(size_t(n * D), -1.0f, 1.0f);
  if (n >= 3) {
    std::vector<float> g(static_cast<size_t>(D));
    // x proportional to -sum of the gate rows: every logit is negative and large.
    std::vector<double> s(static_cast<size_t>(D), 0.0);
    for (int64_t e = 0; e < E; ++e) {
      w.gate.row(e, g.data());
      for (int64_t k = 0; k < D; ++k) s[size_t(k)] += g[size_t(k)];
    }
    for (int64_t k = 0; k < D; ++k) xv[size_t(D + k)] = float(-s[size_t(k)] * 60.0), xv[size_t(2 * D + k)] = float(s[size_t(k)] * 60.0);
  }
  if (shape.ties && n >= 4) std::fill(xv.begin() + 3 * D, xv.begin() + 4 * D, 0.0f);
  std::vector<int32_t> toks(static_cast<size_t>(n));
  for (auto& t : toks) t = rng.integer(0, int(V - 1));
  const Acts x = make_acts(shape.act, xv);
  cuda::RouterWeights dw = cuda::upload_router(w, E, D);
  cuda::RouterConfig cfg = cuda::router_config(c, rc.type);
  cfg.renorm = rc.renorm;
  cuda::DeviceBuffer di(size_t(n * K) * 4), dwt(size_t(n * K) * 4), dl(size_t(n * E) * 4), ds(size_t(n * E) * 4),
      dx16(size_t(n * D) * 2);
  for (auto* b : {&di, &dwt, &dl, &ds, &dx16}) b->fill_byte(0xFF);
  cuda::DeviceBuffer dt = cuda::to_device(toks);
  cuda::Workspace ws;
  const cuda::DeviceRouting<P> out{di.as<int32_t>(), dwt.as<float>(), dl.as<float>(), ds.as<float>(), n, int(K)};
  cuda::route<P>(dw, cfg, x.dev.get(), shape.act, n, dt.as<int32_t>(), out, ws, nullptr, dx16.as<uint16_t>());
  cuda::synchronize();
  RouterOptions ro;
  ro.cuda_ties = true;
  ro.renorm = rc.renorm;
  const auto ref = route<P>(w, c, rc.type, RouterInputs{Tensor({n, D}, x.value), toks}, ro);
  const auto gi = cuda::to_host<int32_t>(di, size_t(n * K));
  const auto gw = cuda::to_host<float>(dwt, size_t(n * K));
  const auto gl = cuda::to_host<float>(dl, size_t(n * E));
  const std::string tag = std::string("router [") + rc.name + (P == Rsf::Folded ? ", folded" : ", unfolded") + "] n=" + std::to_string(n) +
                          " E=" + std::to_string(E) + " D=" + std::to_string(D) + " K=" + std::to_string(K) +
                          (shape.act == Act::BF16 ? " x bf16" : shape.act == Act::F16 ? " x f16" : "");
  // The f16 copy of x (every element written, f16(x) exactly).
  expect_close(tag + " x16", f16_to_float(cuda::to_host<uint16_t>(dx16, size_t(n * D))), x.f16, D, 0.0);
  {  // Deterministic: a second launch gives the same bits.
    cuda::DeviceBuffer di2(size_t(n * K) * 4), dwt2(size_t(n * K) * 4), dl2(size_t(n * E) * 4), ds2(size_t(n * E) * 4);
    const cuda::DeviceRouting<P> out2{di2.as<int32_t>(), dwt2.as<float>(), dl2.as<float>(), ds2.as<float>(), n, int(K)};
    cuda::route<P>(dw, cfg, x.dev.get(), shape.act, n, dt.as<int32_t>(), out2, ws);
    cuda::synchronize();
    EXPECT_TRUE(cuda::to_host<int32_t>(di2, size_t(n * K)) == gi) << tag << ": indices differ between two launches";
    const auto gl2 = cuda::to_host<float>(dl2, size_t(n * E)), gw2 = cuda::to_host<float>(dwt2, size_t(n * K));
    EXPECT_EQ(0, std::memcmp(gl2.data(), gl.data(), gl.size() * 4)) << tag << ": logits differ between two launches";
    EXPECT_EQ(0, std::memcmp(gw2.data(), gw.data(), gw.size() * 4)) << tag << ": weights differ between two launches";
  }
  expect_close(tag + " logits", gl, ref.logits.data, E, 1e-6);
  if (rc.type == MlpType::Learned) expect_close(tag + " selection scores", cuda::to_host<float>(ds, size_t(n * E)), ref.select.data, E, 1e-5);
  int flips = 0;
  for (int t = 0; t < n; ++t)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t want = ref.idx[t * K + k], got = gi[size_t(t * K + k)];
      if (want == got) continue;
      // Allowed only for a near tie of the reference's own selection scores (an ulp-level score difference).
      const double a = ref.select.numel() ? ref.select[t * E + want] : 0, b = ref.select.numel() && got >= 0 && got < E ? ref.select[t * E + got] : 1e9;
      const bool tie = std::fabs(a - b) <= 1e-6 * std::max(1.0, std::fabs(a));
      ++flips;
      EXPECT_TRUE(tie) << tag << ": token " << t << " choice " << k << ": gpu expert " << got << ", reference " << want
                       << " (selection scores " << b << " vs " << a << ")";
    }
  std::vector<float> rw(ref.weight.data.begin(), ref.weight.data.end());
  if (flips == 0) expect_close(tag + " weights", gw, rw, K, 1e-5);
  for (float v : gw) EXPECT_TRUE(std::isfinite(v)) << tag << ": non-finite routing weight";
  if (n >= 3 && rc.score == ScoreFunc::SqrtSoftplus && rc.renorm) {
    std::printf("  %s: underflow row weights %g %g ..., overflow row weights %g %g ...\n", tag.c_str(), gw[size_t(K)],
                gw[size_t(K + 1)], gw[size_t(2 * K)], gw[size_t(2 * K + 1)]);
  }
}

}  // namespace

TEST_F(CudaRouter, MatchesReference) {
  Rng rng(7);
  const RouterCase cases[] = {{"learned sqrtsoftplus", ScoreFunc::SqrtSoftplus, MlpType::Learned, true},
                              {"hash sqrtsoftplus", ScoreFunc::SqrtSoftplus, MlpType::Hash, true},
                              {"learned sigmoid", ScoreFunc::Sigmoid, MlpType::Learned, true},
                              {"learned softmax, no renorm", ScoreFunc::Softmax, MlpType::Learned, false}};
  for (const auto& rc : cases)
    for (int n : {1, 3, 8}) {
      check_router<Rsf::Folded>(rc, n, rng);
      if (rc.score == ScoreFunc::SqrtSoftplus) check_router<Rsf::Unfolded>(rc, n, rng);
    }
}

// Other token counts (every kernel instantiation, several chunks of 8 tokens), activation types and shapes
// (other splits of D, fewer experts, more choices, ties in the selection scores).
TEST_F(CudaRouter, MatchesReferenceOtherShapes) {
  Rng rng(11);
  const RouterCase learned{"learned sqrtsoftplus", ScoreFunc::SqrtSoftplus, MlpType::Learned, true};
  const RouterCase hash{"hash sqrtsoftplus", ScoreFunc::SqrtSoftplus, MlpType::Hash, true};
  for (int n : {2, 5, 12, 17, 40}) check_router<Rsf::Folded>(learned, n, rng);
  check_router<Rsf::Folded>(hash, 19, rng);
  for (Act act : {Act::BF16, Act::F16})
    for (int n : {1, 8}) check_router<Rsf::Folded>(learned, n, rng, {256, 4096, 6, act});
  check_router<Rsf::Folded>(learned, 4, rng, {64, 1024, 8, Act::F32});
  check_router<Rsf::Folded>(learned, 9, rng, {512, 2048, 16, Act::BF16});
  check_router<Rsf::Unfolded>(learned, 3, rng, {32, 128, 4, Act::F32});
  check_router<Rsf::Folded>(learned, 6, rng, {256, 7168, 8, Act::BF16});
  check_router<Rsf::Folded>(learned, 8, rng, {256, 4096, 6, Act::F32, true});
}

// ---- the routed MoE end to end, under the routed-scaling contract ----

static_assert(RunnerAccepts<cuda::GpuRunnerFolded, Rsf::Folded> && !RunnerAccepts<cuda::GpuRunnerFolded, Rsf::Unfolded>);
static_assert(RunnerAccepts<cuda::GpuRunnerScalesOutput, Rsf::Unfolded> && !RunnerAccepts<cuda::GpuRunnerScalesOutput, Rsf::Folded>);

TEST_F(CudaMoe, RoutedMoeMatchesReferenceMoe) {
  Rng rng(8);
  const int64_t E = 32, D = 512, I = 256;
  const int K = 4, n = 5;
  auto f = make_moe(rng, E, D, I, true);
  f->w.bias = Tensor({E}, rng.floats(size_t(E), -0.02f, 0.02f));
  ModelConfig c;
  c.n_experts = int(E), c.top_k = K, c.hidden = int(D), c.moe_inter = int(I), c.routed_scaling = 1.5, c.swiglu_limit = 10.0;
  c.score = ScoreFunc::SqrtSoftplus;
  const Acts x = make_acts(Act::F32, rng.floats(size_t(n * D), -2.0f, 2.0f));
  const std::vector<int32_t> toks(static_cast<size_t>(n), 0);
  const Tensor ref = moe_forward_ep_simulated(f->w, c, MlpType::Learned, Tensor({n, D}, x.value), toks, ModelOptions{}, 1);

  const cuda::MoeExperts m = cuda::upload_experts(f->w);
  const cuda::RouterWeights rw = cuda::upload_router(f->w, E, D);
  const cuda::RouterConfig rc = cuda::router_config(c, MlpType::Learned);
  cuda::Workspace ws;
  cuda::MoeScratch scratch;
  cuda::DeviceBuffer di(size_t(n * K) * 4), dw(size_t(n * K) * 4), y(size_t(n * D) * 4), y2(size_t(n * D) * 4);
  y.fill_byte(0xFF), y2.fill_byte(0xFF);
  scratch.reserve(n, K, D, I);
  const cuda::DeviceRouting<Rsf::Folded> folded{di.as<int32_t>(), dw.as<float>(), nullptr, nullptr, n, K};
  cuda::route(rw, rc, x.dev.get(), Act::F32, n, nullptr, folded, ws, nullptr, scratch.x16.as<uint16_t>());
  cuda::moe_routed(cuda::GpuRunnerFolded{}, c, m, folded, scratch.x16.as<uint16_t>(), scratch, ws, nullptr, y.as<float>());
  const cuda::DeviceRouting<Rsf::Unfolded> unfolded{di.as<int32_t>(), dw.as<float>(), nullptr, nullptr, n, K};
  cuda::route(rw, rc, x.dev.get(), Act::F32, n, nullptr, unfolded, ws, nullptr, scratch.x16.as<uint16_t>());
  cuda::moe_routed(cuda::GpuRunnerScalesOutput{}, c, m, unfolded, scratch.x16.as<uint16_t>(), scratch, ws, nullptr,
                   y2.as<float>());
  cuda::synchronize();
  // The router's f16 copy of x is the rounding the twins assume.
  const auto x16g = f16_to_float(cuda::to_host<uint16_t>(scratch.x16, size_t(n * D)));
  expect_close("router x16 output vs f16(x)", x16g, x.f16, D, 0.0);
  expect_close("routed moe (folded runner) vs fp32 reference moe", cuda::to_host<float>(y, size_t(n * D)), ref.data, D, 5e-3);
  expect_close("routed moe (scales-output runner) vs fp32 reference moe", cuda::to_host<float>(y2, size_t(n * D)), ref.data, D, 5e-3);
}
