// The CUDA backend's whole forward pass against the references: every committed golden fixture through
// verify-golden on the GPU, GPU vs CPU logits on the bundled trained model (free running, long enough to fill
// the window and emit compressed entries), session schedules on the GPU, and the Engine API with backend cuda.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "cuda_test_util.h"
#include "cuda/gpu_common.h"
#include "indexer_skip_check.h"
#include "session_test_util.h"
#include "model/model.h"
#include "patches/registry.h"
#include "plumb/engine.h"
#include "plumb/text.h"
#include "plumb/tools.h"
#include "toolkit/diff.h"
#include "toolkit/trace.h"

namespace {

namespace fs = std::filesystem;
using plumb_cuda_test::GpuTest;
using plumb_cuda_test::test_prompt;

// Every fixture whose reference is an fp32 implementation (the official-code goldens run in their numerics mode in
// test_cuda_numerics.cpp).
std::vector<std::string> fp32_fixtures() {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(fs::path(PLUMB_TEST_DATA) / "golden")) {
    if (!fs::exists(e.path() / "golden.json")) continue;
    std::ifstream f(e.path() / "golden.json");
    std::string head(4096, '\0');
    f.read(head.data(), head.size());
    if (head.find("official inference") != std::string::npos) continue;
    out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// (fixture, patches): the fp32 twin alone, with the exact MoE patches, and with the tensor-core kernels (they run
// where the shapes fit: every matrix of kernel-dims, some of tiny-official / official-mixed; the fp32 twin
// elsewhere), the split-K attention on the fp32 twin, the prefill GEMMs (chunks of >= 32 tokens: kernel-dims'
// 40-token prefill, csa-long's, legacy-config's), the indexer's scores on the f16 and on the fp64 tensor cores, and
// the indexer skipped at short contexts (beside the split-K attention), the plain bf16 projections of 2-32
// tokens on the bf16 GEMV (kernel-dims' compressors), hc_pre's mixes normalized after the GEMM, and the split-K
// attention's products on the f16 tensor cores, each at its registered tolerance.
const std::vector<std::string> kGoldenPatchSets = {"", "moe.rsf_on_output,moe.weight_before_down",
                                                   "cuda.fp8_gemv,cuda.moe_mxfp4,cuda.head_bf16", "attn.splitk_decode",
                                                   "cuda.fp8_gemv,cuda.moe_mxfp4,cuda.prefill_gemm", "indexer.tc_scores",
                                                   "indexer.dmma_scores", "attn.splitk_decode,indexer.skip_short",
                                                   "cuda.fp8_gemv,cuda.moe_mxfp4,cuda.bf16_gemv", "cuda.hc_norm_after_mix",
                                                   "attn.splitk_decode,attn.splitk_f16"};
class GpuGolden : public GpuTest, public ::testing::WithParamInterface<std::tuple<std::string, std::string>> {};

TEST_P(GpuGolden, VerifyGoldenPasses) {
  plumb::tools::VerifyGoldenOptions o;
  o.dir = std::get<0>(GetParam());
  o.patches = std::get<1>(GetParam());
  o.backend = "cuda";
  o.quiet = true;
  EXPECT_EQ(plumb::tools::verify_golden(o), 0) << o.dir << " [" << o.patches << "]";
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, GpuGolden,
    ::testing::Combine(::testing::ValuesIn(fp32_fixtures()), ::testing::ValuesIn(kGoldenPatchSets)),
    [](const auto& info) {
      std::string n = fs::path(std::get<0>(info.param)).filename().string() + "_" +
                      std::to_string(info.index % kGoldenPatchSets.size());
      for (auto& ch : n)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return n;
    });

// The check before the weights go up (GpuForward's constructor: the bytes the model bound against the GPU's free
// memory); no GPU needed for the arithmetic and the message. V4-Flash's ~155 GB against an H200's ~139 GB free.
TEST(GpuWeightsFit, RefusesWeightsOverTheFreeMemoryNamingBoth) {
  EXPECT_EQ(plumb::cuda::weights_fit_problem(100, 100, 200, "GPU"), "");
  const std::string why = plumb::cuda::weights_fit_problem(155'000'000'000ull, 139'000'000'000ull, 150'000'000'000ull, "NVIDIA H200");
  for (const char* part : {"155.00 GB", "139.00 GB free", "150.00 GB", "NVIDIA H200", "does not fit one GPU", "cuda.host_experts"})
    EXPECT_NE(why.find(part), std::string::npos) << part << " in: " << why;
}

// cuda.host_experts' count (no GPU needed): the automatic one takes layers from the last back until the rest fits
// beside the reserve, skipping layers whose experts take another path, at least one; a requested count takes that
// many; what still does not fit is named with the sizes.
TEST(GpuWeightsFit, HostExpertsPlanTakesTheLastLayersTheFitNeeds) {
  using plumb::cuda::plan_host_experts;
  const uint64_t GB = 1'000'000'000ull, reserve = plumb::cuda::host_experts_reserve(150 * GB);
  EXPECT_EQ(reserve, 7 * GB);
  // V4-Flash-like: 43 layers of 3.2 GB of expert codes, 155 GB in all, 139 GB free of 150: 155 + 7 - 139 = 23 GB must
  // go, so 8 layers (25.6 GB).
  std::vector<uint64_t> eb(43, 3'200'000'000ull);
  auto p = plan_host_experts(155 * GB, eb, 139 * GB, 150 * GB, 0, "H200");
  EXPECT_TRUE(p.problem.empty()) << p.problem;
  EXPECT_EQ(p.layers, 8);
  EXPECT_EQ(p.host_bytes, 8 * 3'200'000'000ull);
  for (size_t i = 0; i < eb.size(); ++i) EXPECT_EQ(p.host[i] != 0, i >= 35) << "layer " << i;
  // A layer on another path is skipped (its bytes stay on the device); the next one back is taken instead.
  eb[40] = 0;
  p = plan_host_experts(155 * GB, eb, 139 * GB, 150 * GB, 0, "H200");
  EXPECT_EQ(p.layers, 8);
  EXPECT_FALSE(p.host[40]);
  EXPECT_TRUE(p.host[34] && !p.host[33]);
  // A model that fits: one layer, the last.
  p = plan_host_experts(10 * GB, std::vector<uint64_t>(4, GB), 100 * GB, 150 * GB, 0, "H200");
  EXPECT_EQ(p.layers, 1);
  EXPECT_TRUE(p.host[3] && !p.host[2]);
  // A requested count, more than there are: every layer.
  p = plan_host_experts(10 * GB, std::vector<uint64_t>(4, GB), 100 * GB, 150 * GB, 1000, "H200");
  EXPECT_EQ(p.layers, 4);
  EXPECT_EQ(p.host_bytes, 4 * GB);
  // Too large even with every layer's experts in host memory: named with the sizes.
  p = plan_host_experts(300 * GB, std::vector<uint64_t>(4, 10 * GB), 139 * GB, 150 * GB, 0, "H200");
  for (const char* part : {"4 layers", "40.00 GB", "every layer that can", "260.00 GB", "139.00 GB free", "H200"})
    EXPECT_NE(p.problem.find(part), std::string::npos) << part << " in: " << p.problem;
  // No layer on cuda.moe_mxfp4's path: nothing to place (the patch does not apply), and the plain fit check.
  p = plan_host_experts(10 * GB, std::vector<uint64_t>(4, 0), 100 * GB, 150 * GB, 0, "H200");
  EXPECT_EQ(p.layers, 0);
  EXPECT_TRUE(p.problem.empty()) << p.problem;
  p = plan_host_experts(155 * GB, std::vector<uint64_t>(4, 0), 139 * GB, 150 * GB, 0, "H200");
  EXPECT_EQ(p.layers, 0);
  EXPECT_NE(p.problem.find("does not fit one GPU"), std::string::npos) << p.problem;
}

// What a failure was for goes in front of its message (rethrow_for: the scratch buffers, the cache reserve), and a
// plumb::Error stays one, so that callers that go on after a bad input still catch it. No GPU needed.
TEST(GpuRethrowFor, NamesThePurposeAndKeepsTheType) {
  auto rethrown = [](auto thrown) -> std::pair<std::string, bool> {
    try {
      try {
        throw thrown;
      } catch (...) {
        plumb::cuda::rethrow_for("the forward's scratch buffer 'x' (8 bytes)");
      }
    } catch (const plumb::Error& e) {
      return {e.what(), true};
    } catch (const std::exception& e) {
      return {e.what(), false};
    }
  };
  const auto [oom, oom_is_error] = rethrown(std::runtime_error("the GPU is out of memory: 1.000 GB more asked for"));
  EXPECT_EQ(oom, "the forward's scratch buffer 'x' (8 bytes): the GPU is out of memory: 1.000 GB more asked for");
  EXPECT_FALSE(oom_is_error);
  const auto [bad, bad_is_error] = rethrown(plumb::Error("a bad input"));
  EXPECT_EQ(bad, "the forward's scratch buffer 'x' (8 bytes): a bad input");
  EXPECT_TRUE(bad_is_error);
}

// An allocation the GPU cannot hold after that check (a session's scratch or caches) names what it was for beside
// dmalloc's sizes, instead of a bare out-of-memory error. (A terabyte: more than any GPU has.)
TEST_F(GpuTest, OutOfMemoryNamesTheScratchBuffer) {
  plumb::cuda::Scratch sc;
  try {
    sc.get("probe", size_t(1) << 40);
    ADD_FAILURE() << "a 1 TB scratch buffer was allocated";
  } catch (const std::exception& e) {
    const std::string m = e.what();
    for (const char* part : {"the forward's scratch buffer 'probe' (1099511627776 bytes)", "the GPU is out of memory",
                             "1099.512 GB more asked for"})
      EXPECT_NE(m.find(part), std::string::npos) << part << " in: " << m;
  }
  EXPECT_NE(sc.get("probe", 64), nullptr);  // the session goes on: nothing sticky was left behind
}

// An allocation that fails during the upload itself (after the fit check passed) names the layer it was for and
// what was already up. The failure comes from a test budget on this process's allocations (other test processes
// sharing the GPU keep their memory): the first load counts each layer's bytes, the second stops part way through
// layer 2 (of 4). The budget is taken off however the test ends.
TEST_F(GpuTest, UploadOutOfMemoryNamesTheLayer) {
  namespace d = plumb::cuda::detail;
  struct NoBudgetAtExit {
    ~NoBudgetAtExit() { d::set_alloc_budget_for_testing(-1); }
  } no_budget_at_exit;
  const std::string dir = std::string(PLUMB_TEST_DATA) + "/golden/tiny";
  std::vector<int64_t> after;  // bytes allocated when each layer was up
  d::set_alloc_budget_for_testing(int64_t(1) << 60);
  { Model::load(dir, {}, {}, "cuda", [&](int64_t, int64_t) { after.push_back(d::allocated_under_budget()); }); }
  ASSERT_EQ(after.size(), 4u);
  ASSERT_LT(after[0], after[1]);
  d::set_alloc_budget_for_testing(after[0] + (after[1] - after[0]) / 2);
  std::string msg;
  try {
    Model::load(dir, {}, {}, "cuda");
  } catch (const std::exception& e) {
    msg = e.what();
  }
  d::set_alloc_budget_for_testing(-1);
  for (const char* part : {"backend cuda: uploading layer 2 of 4 (the GPU's free memory fell by ",
                           " GB since the upload began): the GPU is out of memory: ", "beyond a test's budget"})
    EXPECT_NE(msg.find(part), std::string::npos) << part << " in: '" << msg << "'";
  EXPECT_NE(Model::load(dir, {}, {}, "cuda"), nullptr);  // without the budget the same load goes through
}

// A planted fault must fail on the GPU too (the backend implements the faults so that selftest can run there).
TEST_F(GpuTest, FaultFailsVerifyGolden) {
  plumb::tools::VerifyGoldenOptions o;
  o.dir = std::string(PLUMB_TEST_DATA) + "/golden/tiny";
  o.backend = "cuda";
  o.patches = "fault.rsf_twice";
  o.quiet = true;
  EXPECT_EQ(plumb::tools::verify_golden(o), 1);
}

// verify-golden takes an official-code golden's own numerics when --patches names none; a patch the GPU refuses
// beside them (the split-K attention does not reproduce the official roundings) is refused with where the mode came
// from, and with a numerics mode named the golden runs in it.
TEST_F(GpuTest, VerifyGoldenNamesTheNumericsItTook) {
  plumb::tools::VerifyGoldenOptions o;
  o.dir = std::string(PLUMB_TEST_DATA) + "/golden/tiny-official-ref";
  o.backend = "cuda", o.patches = "attn.splitk_decode", o.quiet = true;
  try {
    plumb::tools::verify_golden(o);
    ADD_FAILURE() << "attn.splitk_decode ran beside numerics.official";
  } catch (const plumb::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("does not combine with attn.splitk_decode"), std::string::npos) << m;
    EXPECT_NE(m.find("numerics.official is this fixture's own numerics, taken because --patches names no numerics mode"),
              std::string::npos) << m;
  }
  o.patches = "";
  EXPECT_EQ(plumb::tools::verify_golden(o), 0);
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b, size_t* where) {
  double worst = 0, scale = 1;
  for (float v : b) scale = std::max(scale, double(std::fabs(v)));
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = std::fabs(double(a[i]) - b[i]) / scale;
    if (e > worst || std::isnan(e)) worst = std::isnan(e) ? INFINITY : e, *where = i;
  }
  return worst;
}

// Two models free running side by side over `toks`, step_tokens(pos) tokens per step: every step's logits of b within
// `tol` of a's (max_rel; asserted, the message naming `what` and the step, `ref` what a is), the worst error, and the
// steps whose logits differ in any bit. Callers wrap it in ASSERT_NO_FATAL_FAILURE.
struct FreeRun {
  double worst = 0;
  size_t differ = 0, steps = 0;
};
template <class StepTokens>
void free_run(const plumb::Model& ma, plumb::SessionState& sa, const plumb::Model& mb, plumb::SessionState& sb,
              const std::vector<int32_t>& toks, StepTokens step_tokens, double tol, const std::string& what, const char* ref,
              FreeRun& r) {
  for (size_t pos = 0; pos < toks.size(); ++r.steps) {
    const std::span<const int32_t> part(toks.data() + pos, std::min(size_t(step_tokens(pos)), toks.size() - pos));
    const auto a = ma.forward(sa, part), b = mb.forward(sb, part);
    ASSERT_EQ(a.data.size(), b.data.size());
    size_t where = 0;
    const double e = max_rel(b.data, a.data, &where);
    ASSERT_LE(e, tol) << what << ", step at position " << pos << " (" << part.size() << " tokens): logit " << where << " "
                      << b.data[where] << " against " << ref << " " << a.data[where];
    r.worst = std::max(r.worst, e);
    r.differ += std::memcmp(a.data.data(), b.data.data(), a.data.size() * 4) != 0;
    pos += part.size();
  }
}

// GPU vs CPU on the bundled trained model: 300 tokens (window filled many times over, compressed entries in the
// CSA/HCA layers, the indexer selecting 8 of up to 75 entries), prefill in chunks of 97 then 20 decode steps.
// Teacher forced (diff --local: every op fed the CPU's inputs), no op may exceed the fp32 tolerance: the two
// backends differ only where exactly equal top-k scores are ordered differently (the indexer's ReLU zeros), which
// free running then amplifies; the free-running gap is printed, and diff must explain it as such.
TEST_F(GpuTest, BundledModelMatchesCpuOpByOp) {
  const std::string dir = std::string(PLUMB_TEST_DATA) + "/../../models/tiny";
  const int vocab = plumb::Model::load(dir)->config().vocab;
  const auto toks = test_prompt(320, vocab);
  plumb_test::TempDir tmp;
  const std::string file = tmp.file("tokens.txt");
  {
    std::ofstream f(file);
    size_t pos = 0;
    while (pos < toks.size()) {
      const size_t step = pos < 300 ? std::min<size_t>(97, 300 - pos) : 1;
      for (size_t i = 0; i < step; ++i) f << toks[pos + i] << (i + 1 < step ? ' ' : '\n');
      pos += step;
    }
  }
  const auto in = plumb::toolkit::input_from_tokens(dir, file);
  const auto r = plumb::toolkit::diff_live(in, "", "cuda:", /*local=*/true);
  // Every op on its own inputs within the fp32 tolerance, except where an indexer top-k swapped exactly tied
  // entries: that tap (all its differing rows ties) and the same layer's attention output.
  std::set<std::string> tied_layers;
  for (const auto& row : r.rows)
    if (row.is_index && row.local_diverges) {
      EXPECT_EQ(row.lix.real, 0) << row.name << ": " << row.lix.real << " rows select differently without a tie ("
                                 << row.lix.first_bad << ")";
      tied_layers.insert(row.name.substr(0, row.name.find('.')));
    }
  for (const auto& row : r.rows) {
    if (!row.is_index && row.local_diverges) {
      EXPECT_TRUE(row.name.ends_with("attn.out") && tied_layers.count(row.name.substr(0, row.name.find('.'))))
          << row.name << " differs on its own inputs: " << row.lf.max_abs << " (not explained by a tie)";
    }
  }
  double worst_local = 0;
  for (const auto& row : r.rows)
    if (row.has_local && !row.is_index) worst_local = std::max(worst_local, row.lf.max_abs / std::max(1.0, row.lf.ref_max));
  std::printf("bundled model, 320 tokens, GPU vs CPU: worst teacher-forced tap error %.3g; free running first divergence %s (%s)\n",
              worst_local, r.first_free.none() ? "none" : r.first_free.tap.c_str(), r.diagnosis.text.c_str());
  // The free-running gap, if any, starts at a tie-flipped indexer top-k and diff names it as one.
  if (!r.first_free.none()) {
    EXPECT_TRUE(r.first_free.tap.ends_with("attn.indexer.topk") &&
                tied_layers.count(r.first_free.tap.substr(0, r.first_free.tap.find('.'))))
        << "free running first diverges at " << r.first_free.tap << ", not at a tied indexer top-k";
    EXPECT_EQ(r.diagnosis.kind, "selection_tie") << r.diagnosis.text;
  }
}

// Any chunking gives the same logits on the GPU (caches resident on the device across calls).
TEST_F(GpuTest, ChunkingDoesNotChangeLogits) {
  const std::string dir = std::string(PLUMB_TEST_DATA) + "/golden/csa-long";
  auto gpu = plumb::Model::load(dir, {}, {}, "cuda");
  const auto toks = test_prompt(150, gpu->config().vocab);
  auto one = gpu->new_state();
  const auto all = gpu->forward(one, toks);
  const int64_t V = gpu->config().vocab;
  for (size_t chunk : {1, 5, 64}) {
    auto st = gpu->new_state();
    std::vector<float> got;
    for (size_t p = 0; p < toks.size(); p += chunk) {
      const auto l = gpu->forward(st, std::span<const int32_t>(toks.data() + p, std::min(chunk, toks.size() - p)));
      got.insert(got.end(), l.data.begin(), l.data.end());
    }
    ASSERT_EQ(got.size(), size_t(int64_t(toks.size()) * V));
    size_t where = 0;
    EXPECT_LT(max_rel(got, all.data, &where), 1e-5) << "chunk " << chunk << " at logit " << where;
  }
}

// tie_word_embeddings: the GPU's head is the embedding's uploaded matrix (a view, not a second copy): the logits
// match the CPU reference of the same tied model, and differ from the untied model's (the fixture's own
// head.weight, which a tied load ignores). swa-hash: no indexer, whose exact score ties on tiny's 2 index heads
// let the two backends select differently (session 59's first form of this test, on tiny: 9.5e-2 at one logit).
// A model folder in tmp: the fixture src's weights with one config.json field set to `value`.
fs::path with_config_field(const plumb_test::TempDir& tmp, const fs::path& src, const std::string& field, const nlohmann::json& value) {
  const fs::path dir = tmp.file(field);
  fs::create_directories(dir);
  fs::copy_file(src / "model.safetensors", dir / "model.safetensors");
  nlohmann::json j = nlohmann::json::parse(std::ifstream(src / "config.json"));
  j[field] = value;
  std::ofstream(dir / "config.json") << j.dump(2);
  return dir;
}

TEST_F(GpuTest, TiedHeadIsTheEmbedding) {
  const fs::path src = fs::path(PLUMB_TEST_DATA) / "golden" / "swa-hash";
  plumb_test::TempDir tmp;
  const fs::path dir = with_config_field(tmp, src, "tie_word_embeddings", true);
  auto cpu = plumb::Model::load(dir.string());
  auto gpu = plumb::Model::load(dir.string(), {}, {}, "cuda");
  auto untied = plumb::Model::load(src.string(), {}, {}, "cuda");
  const auto toks = test_prompt(40, gpu->config().vocab);
  auto sc = cpu->new_state(), sg = gpu->new_state(), su = untied->new_state();
  const auto a = cpu->forward(sc, toks), b = gpu->forward(sg, toks), u = untied->forward(su, toks);
  size_t where = 0;
  EXPECT_LT(max_rel(b.data, a.data, &where), 1e-4) << "tied GPU vs CPU at logit " << where;
  EXPECT_GT(max_rel(u.data, b.data, &where), 1e-2) << "the tied model's logits equal the untied model's";
}

// `plumb diff --local` of the CPU reference (A) against the GPU with `patches` (B) on `dir`'s model, over a 40-token
// prompt then 3 decodes: 0 when every op is within the registry's tolerance for B (teacher forced: each op's own
// error), as the toolkit judges patches.
int diff_gpu_vs_cpu(const fs::path& dir, const std::string& patches) {
  plumb_test::TempDir tmp;
  const auto toks = test_prompt(43, plumb::Model::load(dir.string())->config().vocab);
  {
    std::ofstream f(tmp.file("steps.txt"));
    for (size_t i = 0; i < toks.size(); ++i) f << toks[i] << (i + 1 < 40 || i + 1 == toks.size() ? " " : "\n");
  }
  plumb::tools::DiffOptions o;
  o.in.model = dir.string(), o.in.tokens = tmp.file("steps.txt");
  o.b = "cuda:" + patches, o.local = true;
  return plumb::tools::diff(o);
}

// Logits of `a` and `b` on the GPU with `patches` for one 40-token prompt: the largest difference relative to
// max(1, max|b|).
double gpu_logits_gap(const fs::path& a, const fs::path& b, const std::string& patches) {
  auto ma = plumb::Model::load(a.string(), plumb::parse_patches(patches).options, {}, "cuda");
  auto mb = plumb::Model::load(b.string(), plumb::parse_patches(patches).options, {}, "cuda");
  const auto toks = test_prompt(40, ma->config().vocab);
  auto sa = ma->new_state(), sb = mb->new_state();
  size_t where = 0;
  return max_rel(ma->forward(sa, toks).data, mb->forward(sb, toks).data, &where);
}

// transformers' hidden_act other than SiLU runs on the GPU's fp32 twin kernels (swiglu_kernel's activation): each
// against the CPU reference on kernel-dims' FP8/FP4 checkpoint (dims the fast kernels take; 8 index heads, no exact
// score ties), without patches and under cuda.fast, whose fused MXFP4 / FP8 SwiGLU epilogues apply SiLU only (the
// experts then take the twin kernels, the rest of FAST applies);
// the logits differ from the SiLU model's (the activation did change). numerics.official takes SiLU whatever the
// config says, as the official code: the same logits as the SiLU model, bit for bit.
TEST_F(GpuTest, OtherHiddenActMatchesTheCpu) {
  const fs::path src = fs::path(PLUMB_TEST_DATA) / "golden" / "kernel-dims";
  for (const char* act : {"gelu", "gelu_pytorch_tanh", "relu"}) {
    plumb_test::TempDir tmp;
    const fs::path dir = with_config_field(tmp, src, "hidden_act", act);
    EXPECT_EQ(diff_gpu_vs_cpu(dir, ""), 0) << act;
    EXPECT_EQ(diff_gpu_vs_cpu(dir, "cuda.fast"), 0) << act << " under cuda.fast";
    EXPECT_GT(gpu_logits_gap(dir, src, ""), 1e-3) << act << ": the SiLU model's logits";
    EXPECT_EQ(gpu_logits_gap(dir, src, "numerics.official"), 0.0) << act << " under numerics.official";
  }
}

// mlp_bias (transformers' biases on the shared MLP: b1, b3 before the clamps, b2 after W2) likewise on the twin
// kernels, against the CPU reference, without patches and under cuda.fast (the shared expert then leaves the fused
// FP8 GEMV); the biases change the logits; numerics.official leaves them out, as the official code has none.
TEST_F(GpuTest, MlpBiasMatchesTheCpu) {
  const fs::path src = fs::path(PLUMB_TEST_DATA) / "golden" / "kernel-dims";
  plumb_test::TempDir tmp;
  const int64_t D = plumb::Model::load(src.string())->config().hidden;
  std::vector<float> b2(static_cast<size_t>(D));
  for (int64_t d = 0; d < D; ++d) b2[size_t(d)] = 0.25f * float(d % 7) - 0.75f;
  plumb_test::write_with_shared_biases(src.string(), tmp, b2, 0.5f, -0.375f);
  EXPECT_EQ(diff_gpu_vs_cpu(tmp.path(), ""), 0);
  EXPECT_EQ(diff_gpu_vs_cpu(tmp.path(), "cuda.fast"), 0) << "under cuda.fast";
  EXPECT_GT(gpu_logits_gap(tmp.path(), src, ""), 1e-3) << "the biases changed nothing";
  EXPECT_EQ(gpu_logits_gap(tmp.path(), src, "numerics.official"), 0.0) << "under numerics.official";
}

// cuda.graph replays captured steps: the logits must be bit-identical to eager launches on every step, across
// a prefill, hundreds of decode steps (compressor windows completing, the window ring wrapping, the entry buffers
// outgrowing their first capacity of 64 so the graph is captured again) and chunks of another size in between.
// graph_extra: patches of the graphed model only (cuda.pdl: the same bits as plain eager launches).
// multi: the size of the several-token steps at positions 200-230 (3; cuda.l2_prefetch's tests take 5, a size it runs at).
void expect_graph_matches_eager(const std::string& dir, const std::string& patches, const std::string& graph_extra = "", size_t multi = 3) {
  const auto model = [&](bool graph) {
    std::string names = patches;
    if (graph)
      for (const std::string& extra : {std::string("cuda.graph"), graph_extra})
        if (!extra.empty()) names += (names.empty() ? "" : ",") + extra;
    return plumb::Model::load(dir, plumb::parse_patches(names).options, {}, "cuda");
  };
  auto eager = model(false), graphed = model(true);
  const int vocab = eager->config().vocab;
  const auto toks = test_prompt(330, vocab);
  auto se = eager->new_state(), sg = graphed->new_state();
  size_t pos = 0;
  int steps = 0;
  while (pos < toks.size()) {
    const size_t n = pos == 0 ? 7 : (pos >= 200 && pos < 230) ? multi : 1;
    const std::span<const int32_t> chunk(toks.data() + pos, std::min(n, toks.size() - pos));
    const auto a = eager->forward(se, chunk);
    const auto b = graphed->forward(sg, chunk);
    ASSERT_EQ(a.data.size(), b.data.size());
    for (size_t i = 0; i < a.data.size(); ++i)
      ASSERT_EQ(std::memcmp(&a.data[i], &b.data[i], 4), 0)
          << dir << " [" << patches << "; graph +" << graph_extra << "] step " << steps << " (position " << pos << ", " << chunk.size() << " tokens): logit "
          << i << " eager " << a.data[i] << " graph " << b.data[i];
    pos += chunk.size(), ++steps;
  }
  ASSERT_TRUE(sg.dev);
  std::printf("%s [%s]: %d steps bit-identical; %lld graph launches, %lld captures\n", dir.c_str(), patches.c_str(), steps,
              (long long)sg.dev->graph_launches, (long long)sg.dev->graph_captures);
  EXPECT_FALSE(sg.dev->graphs_failed);
  EXPECT_GT(sg.dev->graph_launches, 250);
  EXPECT_GE(sg.dev->graph_captures, 3);  // n = 1, n = multi, n = 1 again after the entries grew
  EXPECT_EQ(se.dev->graph_launches, 0);
}

TEST_F(GpuTest, GraphStepsMatchEagerLaunches) {
  expect_graph_matches_eager(std::string(PLUMB_TEST_DATA) + "/golden/csa-long", "");
  expect_graph_matches_eager(std::string(PLUMB_TEST_DATA) + "/golden/kernel-dims", "cuda.fp8_gemv,cuda.moe_mxfp4,cuda.head_bf16");
  expect_graph_matches_eager(std::string(PLUMB_TEST_DATA) + "/golden/csa-long", "attn.splitk_decode");
}

// Model::reserve (generation reserves its prompt and --max-tokens): the compressed entries sized up front, so the
// graphed decode does not re-capture as they double (at 256 + 4 tokens on csa-long's rate-4 layers), and the same
// logits bit for bit as a session that grew them on the way. (Each in a model of its own: the graphs' scratch, which
// a model's sessions share, is sized by the largest capacity, so the grown session's growth would move it under the
// reserved one's graphs too.)
TEST_F(GpuTest, ReserveAvoidsRecapturesAndChangesNoBits) {
  const std::string dir = std::string(PLUMB_TEST_DATA) + "/golden/csa-long";
  auto m = plumb::Model::load(dir, plumb::parse_patches("cuda.graph").options, {}, "cuda");
  auto mr = plumb::Model::load(dir, plumb::parse_patches("cuda.graph").options, {}, "cuda");
  const auto toks = test_prompt(300, m->config().vocab);
  auto grown = m->new_state(), reserved = mr->new_state();
  mr->reserve(reserved, 400);
  int64_t captures_before_growth = -1;
  for (size_t pos = 0; pos < toks.size(); ++pos) {
    const std::span<const int32_t> one(toks.data() + pos, 1);
    const auto a = m->forward(grown, one, nullptr, plumb::LogitRows::Last);
    const auto b = mr->forward(reserved, one, nullptr, plumb::LogitRows::Last);
    ASSERT_EQ(std::memcmp(a.data.data(), b.data.data(), a.data.size() * 4), 0) << "position " << pos;
    if (pos == 250) captures_before_growth = grown.dev->graph_captures;
  }
  std::printf("captures: grown %lld (%lld at position 250), reserved %lld\n", (long long)grown.dev->graph_captures,
              (long long)captures_before_growth, (long long)reserved.dev->graph_captures);
  EXPECT_GT(grown.dev->graph_captures, captures_before_growth);           // the growth re-captured
  EXPECT_LT(reserved.dev->graph_captures, grown.dev->graph_captures);   // the reserved session did not
  EXPECT_THROW(mr->reserve(reserved, -5), plumb::Error);
}

// cuda.pdl: kernels scheduled while the previous one finishes, waiting in-kernel for its results. Any kernel that
// touched activations before its wait would race; the logits must be the bits of plain launches, step after step.
// 300 tokens in eager chunks of `chunk` tokens (never captured: the models have no cuda.graph) on two models of one
// fixture, with patches `base` and `base,extra`: the logits must be the same bits.
void expect_eager_chunks_match(const std::string& dir, const std::string& base, const std::string& extra, int chunk = 100) {
  auto a_model = plumb::Model::load(dir, plumb::parse_patches(base).options, {}, "cuda");
  auto b_model = plumb::Model::load(dir, plumb::parse_patches(base + "," + extra).options, {}, "cuda");
  const auto toks = test_prompt(300, a_model->config().vocab);
  auto sa = a_model->new_state(), sb = b_model->new_state();
  for (size_t pos = 0; pos < toks.size(); pos += size_t(chunk)) {
    const std::span<const int32_t> part(toks.data() + pos, std::min(size_t(chunk), toks.size() - pos));
    const auto a = a_model->forward(sa, part);
    const auto b = b_model->forward(sb, part);
    ASSERT_EQ(a.data.size(), b.data.size());
    EXPECT_EQ(std::memcmp(a.data.data(), b.data.data(), a.data.size() * 4), 0) << dir << " [+" << extra << "] eager chunk at " << pos;
  }
}

TEST_F(GpuTest, PdlStepsMatchPlainLaunches) {
  expect_graph_matches_eager(std::string(PLUMB_TEST_DATA) + "/golden/csa-long", "", "cuda.pdl");
  expect_graph_matches_eager(std::string(PLUMB_TEST_DATA) + "/golden/kernel-dims", "cuda.fp8_gemv,cuda.moe_mxfp4,cuda.head_bf16",
                             "cuda.pdl");
  expect_graph_matches_eager(std::string(PLUMB_TEST_DATA) + "/golden/csa-long", "attn.splitk_decode", "cuda.pdl");
  // Eager launches with PDL against plain ones, in chunks of 8 tokens (the most it applies to; gpu_model.cpp).
  expect_eager_chunks_match(std::string(PLUMB_TEST_DATA) + "/golden/kernel-dims", "cuda.fp8_gemv,cuda.moe_mxfp4", "cuda.pdl", 8);
}

// cuda.host_experts: the routed experts' codes in pinned host memory, read over PCIe by the same kernels, so the
// logits must be the bits of device memory: eager in chunks that take each expert kernel (the grouped prefill kernels
// at >= 192 tokens, the per-tile decode kernels at 1-8, the table-fed ones between) and graphed under FAST, in both
// numerics' layouts (W4A16, and the official W4A8). Every layer placed (host_expert_layers), and by default the
// fit's count (at least one layer: this model fits); without cuda.moe_mxfp4 it is refused.
TEST_F(GpuTest, HostExpertsMatchDeviceMemory) {
  const std::string dir = std::string(PLUMB_TEST_DATA) + "/golden/kernel-dims";
  for (const std::string& base : {std::string("cuda.fast"), std::string("cuda.fp8_gemv,cuda.moe_mxfp4"),
                                 std::string("numerics.official,cuda.fp8_gemv,cuda.moe_mxfp4")}) {
    for (int layers : {0, 1000}) {
      plumb::ModelOptions on = plumb::parse_patches(base + ",cuda.host_experts").options;
      on.host_expert_layers = layers;
      auto a_model = plumb::Model::load(dir, plumb::parse_patches(base).options, {}, "cuda");
      auto b_model = plumb::Model::load(dir, on, {}, "cuda");
      const int64_t nl = int64_t(b_model->weights().layers.size());
      const int64_t host = b_model->device_memory().host;
      // Every layer's experts, or the fit's count (one layer on an idle GPU: at least one; more where the GPU is
      // busy), as the buffers hold them (each layer's the same size here).
      int64_t per_layer = int64_t(plumb::cuda::expert_code_bytes(b_model->weights().layers[0].moe));
      if (layers) {
        EXPECT_EQ(host, nl * per_layer) << base << ", host_expert_layers " << layers;
      } else {
        EXPECT_TRUE(host > 0 && host % per_layer == 0) << base << ": " << host << " bytes in host memory";
      }
      EXPECT_EQ(a_model->device_memory().host, 0);
      const auto toks = test_prompt(330, a_model->config().vocab);
      auto sa = a_model->new_state(), sb = b_model->new_state();
      size_t pos = 0;
      int step = 0;
      const size_t sizes[] = {200, 1, 1, 8, 3, 1, 64, 1, 1, 2, 1};
      while (pos < toks.size()) {
        const size_t n = step < int(std::size(sizes)) ? sizes[step] : 1;
        const std::span<const int32_t> part(toks.data() + pos, std::min(n, toks.size() - pos));
        const auto a = a_model->forward(sa, part);
        const auto b = b_model->forward(sb, part);
        ASSERT_EQ(a.data.size(), b.data.size());
        ASSERT_EQ(std::memcmp(a.data.data(), b.data.data(), a.data.size() * 4), 0)
            << base << " [+cuda.host_experts, host_expert_layers " << layers << "] step " << step << " at position " << pos
            << " (" << part.size() << " tokens)";
        pos += part.size(), ++step;
      }
      // The same steps replayed as graphs (FAST) or launched eagerly as without the patch.
      EXPECT_EQ(sb.dev->graph_launches, sa.dev->graph_launches) << base;
      if (base == "cuda.fast") {
        EXPECT_GT(sb.dev->graph_launches, 40) << "FAST's one-token steps replay graphs";
      }
      EXPECT_FALSE(sb.dev->graphs_failed);
    }
  }
  EXPECT_THROW(plumb::Model::load(dir, plumb::parse_patches("cuda.host_experts").options, {}, "cuda"), plumb::Error);
  // A model whose experts take no FP4 kernel (tiny's dims): the patch does not apply, and the model loads as without it.
  std::unique_ptr<plumb::Model> tiny;
  EXPECT_NO_THROW(tiny = plumb::Model::load(std::string(PLUMB_TEST_DATA) + "/golden/tiny",
                                            plumb::parse_patches("cuda.moe_mxfp4,cuda.host_experts").options, {}, "cuda"));
  if (tiny) {
    EXPECT_EQ(tiny->device_memory().host, 0);
  }
}

// cuda.pdl_hc_attn: hc_pre's cluster launch and the split-K attention's two launches under PDL as well. Each waits in
// pdl_begin before touching an input: the logits must be the bits of plain launches, graphed and eager (1-8 tokens),
// with the fused hc_post / MoE combine in hc_pre, the split-K attention (split and merge) and side streams; without
// cuda.pdl it is refused.
TEST_F(GpuTest, PdlHcAttnStepsMatchPlainLaunches) {
  const std::string data = PLUMB_TEST_DATA;
  expect_graph_matches_eager(data + "/golden/csa-long", "attn.splitk_decode", "cuda.pdl,cuda.pdl_hc_attn");
  expect_graph_matches_eager(data + "/golden/kernel-dims", "cuda.fp8_gemv,cuda.moe_mxfp4,cuda.head_bf16,attn.splitk_decode,cuda.streams",
                             "cuda.pdl,cuda.pdl_hc_attn");
  for (int chunk : {1, 3, 8})
    expect_eager_chunks_match(data + "/golden/kernel-dims", "cuda.fp8_gemv,cuda.moe_mxfp4,attn.splitk_decode", "cuda.pdl,cuda.pdl_hc_attn",
                              chunk);
  EXPECT_THROW(plumb::Model::load(data + "/golden/tiny", plumb::parse_patches("cuda.pdl_hc_attn").options, {}, "cuda"), plumb::Error);
}

// cuda.linear_early: the one-token linear's first weights before its PDL wait, the row staged after it (the fp32
// twin's plain f32 rows on csa-long; the router gate and the compressors' bf16 rows on kernel-dims): the logits must
// be the bits of plain launches, graphed and eager; without cuda.pdl it is refused.
TEST_F(GpuTest, LinearEarlyStepsMatchPlainLaunches) {
  const std::string data = PLUMB_TEST_DATA;
  expect_graph_matches_eager(data + "/golden/csa-long", "", "cuda.pdl,cuda.linear_early");
  expect_graph_matches_eager(data + "/golden/kernel-dims", "cuda.fp8_gemv,cuda.moe_mxfp4,cuda.head_bf16,cuda.streams",
                             "cuda.pdl,cuda.linear_early,cuda.pdl_hc_attn");
  for (int chunk : {1, 5})
    expect_eager_chunks_match(data + "/golden/kernel-dims", "cuda.fp8_gemv,cuda.moe_mxfp4", "cuda.pdl,cuda.linear_early", chunk);
  EXPECT_THROW(plumb::Model::load(data + "/golden/tiny", plumb::parse_patches("cuda.linear_early").options, {}, "cuda"), plumb::Error);
}

// cuda.branch_flags: the branches of cuda.streams that hc_pre (the gates apart, the shared expert of the fused
// combine) and the split-K attention (the KV row, HCA's entries) read end with a signal, and those launches wait for
// it in-kernel instead of behind a join. Over the three attention types, the indexer skipped and run, and the
// deferred MoE combine: the logits must be the bits of the joins, graphed (with PDL) and eager (1 and 3 tokens per
// step), with signals launched; without cuda.streams it is refused.
TEST_F(GpuTest, BranchFlagsStepsMatchJoins) {
  const std::string data = PLUMB_TEST_DATA;
  const std::string fast = "cuda.fp8_gemv,cuda.moe_mxfp4,cuda.head_bf16,attn.splitk_decode,indexer.skip_short,cuda.streams";
  expect_graph_matches_eager(data + "/golden/kernel-dims", fast, "cuda.branch_flags,cuda.pdl,cuda.pdl_hc_attn");
  expect_graph_matches_eager(data + "/golden/csa-long", "attn.splitk_decode,indexer.skip_short,cuda.streams", "cuda.branch_flags");
  for (int chunk : {1, 3}) expect_eager_chunks_match(data + "/golden/kernel-dims", fast, "cuda.branch_flags", chunk);
  auto m = plumb::Model::load(data + "/golden/kernel-dims", plumb::parse_patches(fast + ",cuda.branch_flags").options, {}, "cuda");
  auto st = m->new_state();
  const auto toks = test_prompt(4, m->config().vocab);
  for (const int32_t t : toks) (void)m->forward(st, std::span<const int32_t>(&t, 1));
  ASSERT_TRUE(st.dev);
  // Per one-token step: the gates of the first 5 of 6 hc_pre and the shared experts of the first 2 of 3 layers (the
  // last ones join before hc_head), 3 KV rows, HCA's entries (CSA's await: its indexer keys follow on that stream).
  EXPECT_EQ(st.dev->scratch.branch_signals, int64_t(toks.size()) * 11);
  EXPECT_THROW(plumb::Model::load(data + "/golden/tiny", plumb::parse_patches("cuda.branch_flags").options, {}, "cuda"), plumb::Error);
}

// cuda.early_joins: the gates of the hc_pre before the attention joined with the attention's branches, CSA's indexer
// keys at the forward's end. Over the three attention types, the indexer skipped and run, the deferred MoE combine
// and the official numerics: the logits must be the bits of the joins in place, graphed (with PDL) and eager (1 and
// 3 tokens per step); without cuda.streams it is refused.
TEST_F(GpuTest, EarlyJoinsStepsMatchJoinsInPlace) {
  const std::string data = PLUMB_TEST_DATA;
  const std::string fast = "cuda.fp8_gemv,cuda.moe_mxfp4,cuda.head_bf16,attn.splitk_decode,indexer.skip_short,cuda.streams";
  expect_graph_matches_eager(data + "/golden/kernel-dims", fast, "cuda.early_joins,cuda.pdl,cuda.pdl_hc_attn");
  expect_graph_matches_eager(data + "/golden/csa-long", "attn.splitk_decode,cuda.streams", "cuda.early_joins,cuda.pdl");
  expect_graph_matches_eager(data + "/golden/official-mixed", "numerics.official,cuda.streams", "cuda.early_joins");
  for (int chunk : {1, 3}) expect_eager_chunks_match(data + "/golden/kernel-dims", fast, "cuda.early_joins", chunk);
  expect_eager_chunks_match(data + "/golden/csa-long", "cuda.streams", "cuda.early_joins", 1);
  EXPECT_THROW(plumb::Model::load(data + "/golden/tiny", plumb::parse_patches("cuda.early_joins").options, {}, "cuda"), plumb::Error);
}

// cuda.shared_first: the shared expert forked before the router at one token (the kernel-dims model's shared
// expert on its side stream, FP8 and fp32 twin): the logits must be the bits of the fork after the router, graphed
// (with PDL and the early joins) and eager at one token per step; without cuda.streams it is refused.
TEST_F(GpuTest, SharedFirstStepsMatchTheForkAfterTheRouter) {
  const std::string data = PLUMB_TEST_DATA;
  const std::string fast = "cuda.fp8_gemv,cuda.moe_mxfp4,cuda.head_bf16,attn.splitk_decode,indexer.skip_short,cuda.streams";
  expect_graph_matches_eager(data + "/golden/kernel-dims", fast, "cuda.shared_first,cuda.early_joins,cuda.pdl,cuda.pdl_hc_attn");
  expect_eager_chunks_match(data + "/golden/kernel-dims", fast, "cuda.shared_first", 1);
  expect_eager_chunks_match(data + "/golden/kernel-dims", "cuda.streams", "cuda.shared_first", 1);
  EXPECT_THROW(plumb::Model::load(data + "/golden/tiny", plumb::parse_patches("cuda.shared_first").options, {}, "cuda"), plumb::Error);
}

// cuda.topk_in_experts: at one token the routed experts' gate/up launch ranks the gate's logits itself (kernel-dims:
// a hash layer and two learned ones, 8 experts, top-2; with its shared expert beside them on cuda.streams, and
// without): the logits must be the bits of the router's launch, graphed (with PDL, so down reads the indices gate/up
// stored before its wait) and eager; the routing taps the same; without cuda.moe_mxfp4, or with the official
// numerics, it is refused.
TEST_F(GpuTest, TopkInExpertsStepsMatchTheRouterLaunch) {
  const std::string data = PLUMB_TEST_DATA;
  const std::string fast = "cuda.fp8_gemv,cuda.moe_mxfp4,cuda.head_bf16,attn.splitk_decode,indexer.skip_short,cuda.streams";
  expect_graph_matches_eager(data + "/golden/kernel-dims", fast, "cuda.topk_in_experts,cuda.shared_first,cuda.early_joins,cuda.pdl,cuda.pdl_hc_attn");
  expect_graph_matches_eager(data + "/golden/kernel-dims", "cuda.moe_mxfp4", "cuda.topk_in_experts,cuda.pdl");
  expect_eager_chunks_match(data + "/golden/kernel-dims", fast, "cuda.topk_in_experts", 1);
  expect_eager_chunks_match(data + "/golden/kernel-dims", fast + ",cuda.pdl", "cuda.topk_in_experts", 1);
  // The routing taps (stored by gate/up's block, read after it) against the router's, at one token: every layer's
  // logits, selection scores (learned), indices and weights.
  struct RouteSink : plumb::TapSink {
    std::map<std::string, std::vector<double>> got;
    bool wants(const std::string& name) const override { return name.find("ffn.gate.") != std::string::npos; }
    void put(const std::string& name, const plumb::Tensor& t) override { got[name].assign(t.data.begin(), t.data.end()); }
    void put_index(const std::string& name, const plumb::IndexTensor& t) override { got[name].assign(t.data.begin(), t.data.end()); }
  };
  auto a = plumb::Model::load(data + "/golden/kernel-dims", plumb::parse_patches(fast).options, {}, "cuda");
  auto b = plumb::Model::load(data + "/golden/kernel-dims", plumb::parse_patches(fast + ",cuda.topk_in_experts").options, {}, "cuda");
  const auto toks = test_prompt(6, a->config().vocab);
  auto sa = a->new_state(), sb = b->new_state();
  for (size_t pos = 0; pos < toks.size(); ++pos) {
    RouteSink ta, tb;
    const std::span<const int32_t> one(toks.data() + pos, 1);
    const auto la = a->forward(sa, one, &ta, plumb::LogitRows::All), lb = b->forward(sb, one, &tb, plumb::LogitRows::All);
    EXPECT_EQ(0, std::memcmp(la.data.data(), lb.data.data(), la.data.size() * 4)) << "logits with the routing taps, position " << pos;
    EXPECT_GE(ta.got.size(), size_t(3 * 3)) << "routing taps (logits, indices, weights) of 3 layers";
    EXPECT_EQ(ta.got.size(), tb.got.size());
    for (const auto& [name, v] : ta.got) {
      ASSERT_TRUE(tb.got.count(name)) << name;
      EXPECT_EQ(v, tb.got.at(name)) << name << " at position " << pos;
    }
  }
  EXPECT_THROW(plumb::Model::load(data + "/golden/tiny", plumb::parse_patches("cuda.topk_in_experts").options, {}, "cuda"), plumb::Error);
  EXPECT_THROW(plumb::Model::load(data + "/golden/official-mixed", plumb::parse_patches("numerics.official,cuda.moe_mxfp4,cuda.topk_in_experts").options,
                                  {}, "cuda"),
               plumb::Error);
}

// cuda.hc_norm_after_mix: hc_pre's and hc_head's dots on the raw streams, r applied after them (their kernel against
// the exact one: test_cuda_fwd_ops.cpp). The forward with it: graphed (PDL) and eager steps the same bits; free
// running over 300 tokens (steps of 1 and 7) its logits near the exact kernel's, and not all the same bits: on the
// fp32 twin within 1e-5 of max(1, max|logit|); with the tensor-core kernels within their own tolerance (1e-2), since
// their inputs are rounded to f16 and a change of ~1e-7 moves an input element by a whole f16 ulp (2^-11) where it
// crosses a rounding boundary, which free running then carries on (measured 3.3e-4 at kernel-dims' first step,
// 2.1e-3 at its 70th). Refused with the official numerics and with mhc.bf16_mix.
TEST_F(GpuTest, HcNormAfterMixForwardMatchesExact) {
  const std::string data = PLUMB_TEST_DATA;
  const std::string fast = "cuda.fp8_gemv,cuda.moe_mxfp4,cuda.head_bf16,attn.splitk_decode,indexer.skip_short,cuda.streams";
  expect_graph_matches_eager(data + "/golden/kernel-dims", fast + ",cuda.hc_norm_after_mix", "cuda.pdl,cuda.pdl_hc_attn,cuda.early_joins");
  struct Cfg {
    std::string patches;
    double tol;
  };
  for (const Cfg& cfg : {Cfg{"attn.splitk_decode,indexer.skip_short,cuda.streams", 1e-5}, Cfg{fast, 1e-2}})
    for (const std::string& dir : {data + "/golden/kernel-dims", data + "/golden/csa-long"})
      for (const int chunk : {1, 7}) {
        auto exact = plumb::Model::load(dir, plumb::parse_patches(cfg.patches).options, {}, "cuda");
        auto after = plumb::Model::load(dir, plumb::parse_patches(cfg.patches + ",cuda.hc_norm_after_mix").options, {}, "cuda");
        const auto toks = test_prompt(300, exact->config().vocab);
        auto se = exact->new_state(), sa = after->new_state();
        FreeRun r;
        ASSERT_NO_FATAL_FAILURE(free_run(*exact, se, *after, sa, toks, [&](size_t) { return chunk; }, cfg.tol,
                                         fmt::format("{} [{}] steps of {}", dir, cfg.patches, chunk), "the exact kernel's", r));
        std::printf("%s [%s], steps of %d: worst logit error %.3g, %zu steps not bit-identical\n", dir.c_str(), cfg.patches.c_str(), chunk,
                    r.worst, r.differ);
        EXPECT_GT(r.differ, 0u) << dir << ": every step bit-identical (the patch's kernel did not run)";
      }
  EXPECT_THROW(plumb::Model::load(data + "/golden/official-mixed", plumb::parse_patches("numerics.official,cuda.hc_norm_after_mix").options, {},
                                  "cuda"),
               plumb::Error);
  EXPECT_THROW(plumb::Model::load(data + "/golden/tiny", plumb::parse_patches("mhc.bf16_mix,cuda.hc_norm_after_mix").options, {}, "cuda"),
               plumb::Error);
}

// cuda.hc_fold: at one token wo_b's launch runs the FFN hc_pre's hc_post and its sums, and hc_pre totals them (their
// kernels against the unfolded ones: test_cuda_fwd_ops.cpp). The forward with it: graphed (PDL) and eager steps the
// same bits; free running over 300 tokens against the unfolded forward (cuda.hc_norm_after_mix's hc_pre), with and
// without cuda.streams (the gates apart or in hc_pre), within cuda.fp8_gemv's tolerance (the mixes' fp64 sums in
// another order move a mix by an fp32 ulp at most, which the next GEMVs' f16 inputs can turn into an f16 ulp); the
// fold runs in every layer of every one-token step (Scratch::hc_folds) and in none of 7-token steps (the same bits as
// the unfolded forward there), nor where wo_b does not run on the FP8 GEMV from f16 rows (tiny-official). Refused
// without cuda.hc_norm_after_mix.
TEST_F(GpuTest, HcFoldForwardMatchesUnfolded) {
  const std::string data = PLUMB_TEST_DATA;
  const std::string fast = "cuda.fp8_gemv,cuda.moe_mxfp4,cuda.head_bf16,attn.splitk_decode,indexer.skip_short,cuda.hc_norm_after_mix";
  expect_graph_matches_eager(data + "/golden/kernel-dims", fast + ",cuda.streams,cuda.hc_fold", "cuda.pdl,cuda.pdl_hc_attn,cuda.early_joins");
  for (const std::string& patches : {fast + ",cuda.streams", fast})
    for (const std::string& dir : {data + "/golden/kernel-dims", data + "/golden/tiny-official"})
      for (const int chunk : {1, 7}) {
        auto plain = plumb::Model::load(dir, plumb::parse_patches(patches).options, {}, "cuda");
        auto fold = plumb::Model::load(dir, plumb::parse_patches(patches + ",cuda.hc_fold").options, {}, "cuda");
        const auto toks = test_prompt(300, plain->config().vocab);
        auto sp = plain->new_state(), sf = fold->new_state();
        FreeRun r;
        ASSERT_NO_FATAL_FAILURE(free_run(*plain, sp, *fold, sf, toks, [&](size_t) { return chunk; }, 1e-2,
                                         fmt::format("{} [{}] steps of {}", dir, patches, chunk), "the unfolded forward's", r));
        const int64_t folds = sf.dev->scratch.hc_folds, layers = plain->config().n_layers;
        std::printf("%s [%s], steps of %d: %lld folds, worst logit error %.3g, %zu of %zu steps not bit-identical\n", dir.c_str(),
                    patches.c_str(), chunk, (long long)folds, r.worst, r.differ, r.steps);
        // (tiny-official's wo_a rank, 16, keeps its wo_a off the FP8 GEMV, so wo_b takes fp32 rows: no fold, as designed)
        const bool folding = dir.find("kernel-dims") != std::string::npos;
        if (chunk == 1 && folding) {
          EXPECT_EQ(folds, layers * int64_t(r.steps)) << dir << ": the fold did not run in every layer of every one-token step";
        } else {
          EXPECT_EQ(folds, 0) << dir;
          EXPECT_EQ(r.differ, 0u) << dir << ": steps of 7 tokens do not fold, so they must be the unfolded forward's bits";
        }
      }
  EXPECT_THROW(plumb::Model::load(data + "/golden/kernel-dims", plumb::parse_patches("cuda.fp8_gemv,cuda.hc_fold").options, {}, "cuda"),
               plumb::Error);
}

// attn.splitk_f16 in the forward (its kernel against the host: test_cuda_attention.cpp; every fp32 fixture within its
// tolerance: GpuGolden): graphed (PDL) and eager steps the same bits; refused without attn.splitk_decode (it would
// silently stay fp64) and with the official numerics.
TEST_F(GpuTest, SplitKF16Forward) {
  const std::string data = PLUMB_TEST_DATA;
  expect_graph_matches_eager(data + "/golden/csa-long", "attn.splitk_decode,attn.splitk_f16,cuda.streams", "cuda.pdl,cuda.pdl_hc_attn");
  for (const char* patches : {"attn.splitk_f16", "numerics.official,attn.splitk_decode,attn.splitk_f16"})
    EXPECT_THROW(plumb::Model::load(data + "/golden/kernel-dims", plumb::parse_patches(patches).options, {}, "cuda"), plumb::Error) << patches;
}

// cuda.comp_deferred: one-token steps keep their compressor rows and project each window's rows as one chunk at its
// last token (csa-long and kernel-dims: CSA windows of 4, HCA windows of 8). Against per-token projections over a
// schedule with several-token steps: a first chunk of 6 tokens (its window begun, so the next one-token steps project
// per token until a window starts), runs of one-token steps, and 3-token and 2-token steps starting mid-window (the
// rows kept before them projected first). The chunk's projection is the fp32 twin's whatever the patches (CSA's
// windows of 4 in the one-token kernel's order, HCA's in another order of fp64 sums): within 1e-5 of max(1,
// max|logit|) on the twin and with the fast kernels (measured bit-identical at these sizes); windows must have been
// projected (comp_windows_projected), or nothing was kept. Graph steps bit-identical to eager ones.
TEST_F(GpuTest, CompDeferredMatchesPerTokenProjections) {
  const std::string data = PLUMB_TEST_DATA;
  const std::string fast = "cuda.fp8_gemv,cuda.moe_mxfp4,cuda.head_bf16,cuda.bf16_gemv,attn.splitk_decode,indexer.skip_short,cuda.streams";
  expect_graph_matches_eager(data + "/golden/csa-long", "cuda.comp_deferred", "cuda.streams");
  expect_graph_matches_eager(data + "/golden/kernel-dims", fast + ",cuda.comp_deferred", "cuda.pdl,cuda.pdl_hc_attn,cuda.early_joins");
  struct Cfg {
    std::string patches;
    double tol;
  };
  for (const Cfg& cfg : {Cfg{"attn.splitk_decode,cuda.streams", 1e-5}, Cfg{fast, 1e-5}})
    for (const std::string& dir : {data + "/golden/kernel-dims", data + "/golden/csa-long"}) {
      auto per_token = plumb::Model::load(dir, plumb::parse_patches(cfg.patches).options, {}, "cuda");
      auto deferred = plumb::Model::load(dir, plumb::parse_patches(cfg.patches + ",cuda.comp_deferred").options, {}, "cuda");
      const auto toks = test_prompt(200, per_token->config().vocab);
      auto sp = per_token->new_state(), sd = deferred->new_state();
      FreeRun r;
      const auto step_tokens = [](size_t pos) -> size_t { return pos == 0 ? 6 : pos == 61 ? 3 : pos == 130 ? 2 : 1; };
      ASSERT_NO_FATAL_FAILURE(free_run(*per_token, sp, *deferred, sd, toks, step_tokens, cfg.tol, fmt::format("{} [{}]", dir, cfg.patches),
                                       "the per-token projections'", r));
      ASSERT_TRUE(sp.dev && sd.dev);
      std::printf("%s [%s]: worst logit error %.3g, %zu of %zu steps not bit-identical, %lld windows projected from kept rows\n", dir.c_str(),
                  cfg.patches.c_str(), r.worst, r.differ, r.steps, (long long)sd.dev->comp_windows_projected);
      EXPECT_EQ(sp.dev->comp_windows_projected, 0);
      EXPECT_GT(sd.dev->comp_windows_projected, 30) << dir << ": (nearly) nothing was kept";
    }
  EXPECT_THROW(plumb::Model::load(data + "/golden/official-mixed", plumb::parse_patches("numerics.official,cuda.comp_deferred").options, {},
                                  "cuda"),
               plumb::Error);
}

// cuda.streams: the KV row and the compressors beside the query path (each on a stream of its own), the shared expert
// beside the router and the routed experts. A branch that read a buffer before the other stream wrote it, or shared a
// scratch buffer with it, would change the logits (and from run to run): they must be the bits of serial launches,
// graphed (parallel graph branches) and eager, with the fast kernels, split-K attention, PDL and the official
// numerics (whose activation-quantization scratch each stream must have for itself).
TEST_F(GpuTest, StreamsStepsMatchSerialLaunches) {
  const std::string data = PLUMB_TEST_DATA;
  expect_graph_matches_eager(data + "/golden/csa-long", "", "cuda.streams");
  expect_graph_matches_eager(data + "/golden/kernel-dims", "cuda.fp8_gemv,cuda.moe_mxfp4,cuda.head_bf16", "cuda.streams");
  expect_graph_matches_eager(data + "/golden/csa-long", "attn.splitk_decode", "cuda.streams,cuda.pdl");
  expect_graph_matches_eager(data + "/golden/official-mixed", "numerics.official", "cuda.streams");
  // Eager launches with the branches against serial ones.
  for (const char* fixture : {"/golden/kernel-dims", "/golden/csa-long"})
    expect_eager_chunks_match(data + fixture, "cuda.fp8_gemv,cuda.moe_mxfp4", "cuda.streams");
}

// indexer.skip_short on the GPU: the differential test of indexer_skip_check.h (taps: eager launches) with the fp32
// twin's attention and the split-K one; then graph replays across the point where the indexer starts to run
// (csa-long: index_topk 4, so steps ending up to position 19 skip it; the skipping steps and the others are
// captured apart), bit for bit against eager launches of the same patches.
TEST_F(GpuTest, IndexerSkipShortMatchesTheIndexer) {
  plumb_test::check_indexer_skip_short("cuda");
  plumb_test::check_indexer_skip_short("cuda", "attn.splitk_decode");
  const std::string dir = std::string(PLUMB_TEST_DATA) + "/golden/csa-long";
  expect_graph_matches_eager(dir, "indexer.skip_short");
  expect_graph_matches_eager(dir, "attn.splitk_decode,indexer.skip_short", "cuda.streams");
}

// cuda.l2_prefetch (and cuda.hc_prefetch, hc_pre's fn alone): a stream of its own prefetching the coming weights into
// L2 writes nothing, so the logits must be the bits without it, graphed (a third branch of the graph) and eager, alone
// and beside cuda.streams' side stream, with the fp32 twin's plain weights and the fast kernels' FP8 codes.
TEST_F(GpuTest, L2PrefetchStepsMatchLaunchesWithout) {
  const std::string data = PLUMB_TEST_DATA;
  // (graphed: 5-token steps at positions 200-230, where cuda.l2_prefetch runs; cuda.hc_prefetch at every step size)
  expect_graph_matches_eager(data + "/golden/csa-long", "", "cuda.l2_prefetch", 5);
  expect_graph_matches_eager(data + "/golden/kernel-dims", "cuda.fp8_gemv,cuda.moe_mxfp4,cuda.head_bf16,cuda.streams", "cuda.l2_prefetch", 5);
  expect_graph_matches_eager(data + "/golden/csa-long", "", "cuda.hc_prefetch");
  expect_graph_matches_eager(data + "/golden/kernel-dims", "cuda.fp8_gemv,cuda.moe_mxfp4,cuda.head_bf16,cuda.streams", "cuda.hc_prefetch");
  // Eager chunks of 1-8 tokens (cuda.l2_prefetch runs at 4-8; cuda.hc_prefetch up to 32).
  const std::string base = "cuda.fp8_gemv,cuda.moe_mxfp4,cuda.streams";
  auto a_model = plumb::Model::load(data + "/golden/kernel-dims", plumb::parse_patches(base).options, {}, "cuda");
  auto b_model = plumb::Model::load(data + "/golden/kernel-dims", plumb::parse_patches(base + ",cuda.l2_prefetch").options, {}, "cuda");
  const auto toks = test_prompt(90, a_model->config().vocab);
  auto sa = a_model->new_state(), sb = b_model->new_state();
  for (size_t pos = 0, step = 0; pos < toks.size(); ++step) {
    const size_t len = std::min<size_t>(step == 0 ? 20 : 1 + step % 8, toks.size() - pos);
    const std::span<const int32_t> chunk(toks.data() + pos, len);
    const auto a = a_model->forward(sa, chunk), b = b_model->forward(sb, chunk);
    ASSERT_EQ(a.data.size(), b.data.size());
    EXPECT_EQ(std::memcmp(a.data.data(), b.data.data(), a.data.size() * 4), 0) << "eager step " << step << " (position " << pos << ")";
    pos += len;
  }
  // The prefetch ran (steps of 4-8 tokens: 5 of the 1-8 cycle's steps), and never without the patch.
  EXPECT_GE(sb.dev->prefetch_steps, 5);
  EXPECT_EQ(sa.dev->prefetch_steps, 0);
}

// cuda.l2_evict_first: the decode GEMVs' and the one-token linear's weight loads with an L2 evict-first policy (else
// evict-normal) change no value: the logits must be the bits without it, graphed and eager, with the fp32 twin's
// plain weights (the one-token linear), the fast kernels (FP8, MXFP4 and, with cuda.bf16_gemv, bf16 GEMVs; the
// shared-activation FP8 kernel from 9 tokens, MoE down on the FP4 streaming kernel above 256 slots: kernel-dims' 150-token
// chunks, top-2) and side streams.
TEST_F(GpuTest, L2EvictFirstStepsMatchLaunchesWithout) {
  const std::string data = PLUMB_TEST_DATA;
  expect_graph_matches_eager(data + "/golden/csa-long", "", "cuda.l2_evict_first");
  expect_graph_matches_eager(data + "/golden/kernel-dims", "cuda.fp8_gemv,cuda.moe_mxfp4,cuda.head_bf16,cuda.streams,cuda.bf16_gemv",
                             "cuda.l2_evict_first");
  for (int chunk : {1, 8, 16, 150})
    expect_eager_chunks_match(data + "/golden/kernel-dims", "cuda.fp8_gemv,cuda.moe_mxfp4,cuda.bf16_gemv,cuda.pdl",
                              "cuda.l2_evict_first", chunk);
}

// Without taps, each sublayer's hc_post runs inside the next hc_pre (or hc_head) launch, which first computes the new
// streams of its slice (after the FP4 routed experts at decode also their combine: gpu_moe's defer, the kernel-dims
// case), and the RMSNorm after hc_pre (attn_norm, ffn_norm, the final norm) runs at its end; with a
// tap sink attached (taps read the streams and the collapsed row in between) the separate kernels run. hc_post is
// one implementation (hc_post_cols); the fused norm sums its fp64 squares in another order than the norm kernel,
// which moves its fp32 scale by one ulp with probability ~1e-8 per row: the logits must be the same bits, on
// prefill chunks and decode steps, in the fp32, tensor-core and official numerics (hc_post only), with hc_mult 2
// and 4 and the comb fault.
// 40 tokens in a first chunk of `first`, then decode steps and 2-token chunks, eager, on two sessions of one model:
// forwards with `sink` attached (the tap-compatible paths) and without (the fused ones). The logits must be the same
// bits at every step. Returns the number of steps.
int expect_sink_paths_match(const std::string& dir, const std::string& patches, plumb::TapSink& sink, size_t first) {
  auto model = plumb::Model::load(dir, plumb::parse_patches(patches).options, {}, "cuda");
  const auto toks = test_prompt(40, model->config().vocab);
  auto sa = model->new_state(), sb = model->new_state();
  size_t pos = 0;
  int step = 0;
  for (; pos < toks.size(); ++step) {
    const size_t len = step == 0 ? first : step % 3 == 0 ? 2 : 1;
    const std::span<const int32_t> chunk(toks.data() + pos, std::min(len, toks.size() - pos));
    const auto a = model->forward(sa, chunk, &sink, plumb::LogitRows::All);
    const auto b = model->forward(sb, chunk, nullptr, plumb::LogitRows::All);
    EXPECT_EQ(a.data.size(), b.data.size());
    size_t i = 0;
    while (i < a.data.size() && i < b.data.size() && std::memcmp(&a.data[i], &b.data[i], 4) == 0) ++i;
    EXPECT_EQ(i, a.data.size()) << dir << " [" << patches << "] step " << step << " (position " << pos << "): logit " << i
                                << " with the sink " << (i < a.data.size() ? a.data[i] : 0.0f) << ", without "
                                << (i < b.data.size() ? b.data[i] : 0.0f);
    if (i != a.data.size()) return step + 1;
    pos += chunk.size();
  }
  return step;
}

TEST_F(GpuTest, FusedHcPostMatchesTheSeparateKernel) {
  struct Silent : plumb::TapSink {  // attached, wants nothing: the forward takes its tap-compatible (unfused) path
    bool wants(const std::string&) const override { return false; }
    void put(const std::string&, const plumb::Tensor&) override {}
    void put_index(const std::string&, const plumb::IndexTensor&) override {}
  } silent;
  const std::string data = PLUMB_TEST_DATA;
  const std::pair<const char*, const char*> cases[] = {{"/golden/csa-long", ""},
                                                       {"/golden/kernel-dims", "cuda.fp8_gemv,cuda.moe_mxfp4,cuda.streams"},
                                                       {"/golden/official-mixed", "numerics.official"},
                                                       {"/golden/hc2-k3", ""},
                                                       {"/golden/tiny", "fault.comb_untransposed"}};
  for (const auto& [fixture, patches] : cases) expect_sink_paths_match(data + fixture, patches, silent, 17);
}

// With the split-K attention the query heads' RMSNorm and RoPE run inside the attention's launch (AttendArgs::
// q_inv_freq, rms_norm_rope_row_warp) unless a tap reads q; with a sink that reads every layer's attn.q the separate
// launch runs (and the other tap-compatible paths, themselves bit-identical: FusedHcPostMatchesTheSeparateKernel).
// The logits must be the same bits, on prefill chunks and decode steps, on CSA layers whose indexer runs (its query's
// RoPE shares the separate launch: no fusion there) and on those that skip it, with the fp32 twin's kernels and the
// tensor-core ones.
TEST_F(GpuTest, QueryNormInAttentionMatchesTheSeparateLaunch) {
  struct QSink : plumb::TapSink {
    bool wants(const std::string& name) const override { return name.ends_with("attn.q"); }
    void put(const std::string&, const plumb::Tensor&) override { ++puts; }
    void put_index(const std::string&, const plumb::IndexTensor&) override {}
    int puts = 0;
  } qs;
  const std::string data = PLUMB_TEST_DATA;
  const std::pair<const char*, const char*> cases[] = {
      {"/golden/csa-long", "attn.splitk_decode"},
      {"/golden/csa-long", "attn.splitk_decode,indexer.skip_short"},
      {"/golden/kernel-dims", "cuda.fp8_gemv,cuda.moe_mxfp4,cuda.streams,attn.splitk_decode,indexer.skip_short"}};
  for (const auto& [fixture, patches] : cases) {
    qs.puts = 0;
    // A first chunk of 5: csa-long skips its indexer up to position 19.
    const int steps = expect_sink_paths_match(data + fixture, patches, qs, 5);
    const int layers = plumb::Model::load(data + fixture, {}, {}, "cpu")->config().n_layers;
    EXPECT_EQ(qs.puts, steps * layers) << fixture << ": every layer's q tapped at every step (the separate launch)";
  }
}

// Generation's forms of a forward on the GPU: no logits for a prefill pass before the last (the head is skipped),
// the last row only after it; the same bits as the full forward's rows (the fp32 twin head is per row), eager and
// replayed as graphs (each form captured separately).
TEST_F(GpuTest, LastRowAndNoLogitsMatchTheFullForward) {
  const std::string data = PLUMB_TEST_DATA;
  // kernel-dims with the FP4 experts and the shared expert on the side stream: the MoE combine is left to hc_head's
  // fused hc_post, on the last row only.
  const char* fp4 = "cuda.fp8_gemv,cuda.moe_mxfp4,cuda.streams";
  const std::pair<std::string, std::string> cases[] = {
      {"/golden/csa-long", ""}, {"/golden/csa-long", "cuda.graph"}, {"/golden/kernel-dims", fp4}, {"/golden/kernel-dims", std::string(fp4) + ",cuda.graph"}};
  for (const auto& [fixture, patches] : cases) {
    const std::string dir = data + fixture;
    auto gpu = plumb::Model::load(dir, plumb::parse_patches(patches).options, {}, "cuda");
    const int64_t V = gpu->config().vocab;
    const auto toks = test_prompt(90, int(V));
    auto full = gpu->new_state(), gen = gpu->new_state();
    size_t pos = 0;
    for (size_t n : {20, 1, 1, 5, 1, 1, 1}) {
      const std::span<const int32_t> chunk(toks.data() + pos, n);
      const auto a = gpu->forward(full, chunk);
      const auto none = gpu->forward(gen, chunk, nullptr, plumb::LogitRows::None);
      EXPECT_EQ(none.numel(), 0);
      // The None pass must leave the caches as the full pass did: the next token's last-row logits are the same.
      pos += n;
      const std::span<const int32_t> next(toks.data() + pos, 1);
      const auto b = gpu->forward(full, next);
      const auto last = gpu->forward(gen, next, nullptr, plumb::LogitRows::Last);
      ASSERT_EQ(last.dim(0), 1);
      ASSERT_EQ(std::memcmp(last.ptr(), b.ptr(), size_t(V) * 4), 0) << fixture << " [" << patches << "] position " << pos;
      ++pos;
    }
    if (gen.dev && patches.find("cuda.graph") != std::string::npos) {
      EXPECT_GT(gen.dev->graph_launches, 0);
    }
  }
}

// cuda.moe_mxfp4 at prefill: chunks of >= 192 tokens run the routed experts as grouped GEMMs (moe_prefill.cu),
// smaller ones on the decode kernels (above 256 slots by a group table). The grouped forward is bit-identical run
// to run and under cuda.graph (chunks <= 256 tokens are captured), and within f16 rounding of h of the decode
// kernels' forward (kernel-dims: every expert matrix fits both), in chunks of 48 and of 160 tokens (320 slots:
// the table).
TEST_F(GpuTest, GroupedPrefillMoeMatchesDecodePathAndIsDeterministic) {
  const std::string dir = std::string(PLUMB_TEST_DATA) + "/golden/kernel-dims";
  const auto model = [&](const std::string& patches) {
    return plumb::Model::load(dir, plumb::parse_patches(patches).options, {}, "cuda");
  };
  auto eager = model("cuda.fp8_gemv,cuda.moe_mxfp4"), graphed = model("cuda.fp8_gemv,cuda.moe_mxfp4,cuda.graph");
  const auto toks = test_prompt(480, eager->config().vocab);
  const auto run = [&](plumb::Model& m, size_t chunk) {
    auto st = m.new_state();
    std::vector<float> out;
    for (size_t p = 0; p < toks.size(); p += chunk) {
      const auto l = m.forward(st, std::span<const int32_t>(toks.data() + p, std::min(chunk, toks.size() - p)));
      out.insert(out.end(), l.data.begin(), l.data.end());
    }
    return out;
  };
  const auto grouped = run(*eager, 240), again = run(*eager, 240), graph = run(*graphed, 240), decode = run(*eager, 48),
             decode160 = run(*eager, 160);
  ASSERT_EQ(grouped.size(), decode.size());
  EXPECT_EQ(std::memcmp(grouped.data(), again.data(), grouped.size() * 4), 0) << "grouped prefill is not deterministic";
  EXPECT_EQ(std::memcmp(grouped.data(), graph.data(), grouped.size() * 4), 0) << "graph replay differs from eager launches";
  for (const auto* d : {&decode, &decode160}) {
    size_t where = 0;
    const double rel = max_rel(grouped, *d, &where);
    std::printf("grouped (chunks of 240) vs decode kernels (chunks of %d): max rel logit difference %.3e at %zu\n",
                d == &decode ? 48 : 160, rel, where);
    EXPECT_LT(rel, 2e-3) << "chunks of " << (d == &decode ? 48 : 160) << ": at logit " << where;
  }
}

// generate() on backend cuda samples on the GPU (Session::forward_sample): the same tokens as plumb::Sampler on
// the host from the same GPU logits, for greedy, the default filters and penalties, with and without cuda.graph.
TEST_F(GpuTest, GenerateSamplesOnTheGpuLikeTheHostSampler) {
  const std::string dir = std::string(PLUMB_TEST_DATA) + "/../../models/tiny";
  const auto tok = plumb::Tokenizer::load(dir);
  for (const char* patches : {"", "cuda.graph"}) {
    plumb::EngineOptions o;
    o.backend = "cuda", o.patches = patches;
    const auto engine = plumb::Engine::load(dir, o);
    const auto prompt = tok.encode("Once upon a time, a little fox");
    std::vector<plumb::SamplingParams> settings(3);
    settings[0].temperature = 0;  // greedy
    settings[1].seed = 7;         // the defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05
    settings[2].seed = 11, settings[2].repeat_penalty = 1.3f, settings[2].presence_penalty = 0.2f, settings[2].top_k = 0,
    settings[2].top_p = 0.9f;
    for (const auto& sp : settings) {
      plumb::GenerateOptions g;
      g.sampling = sp, g.max_tokens = 60;
      auto s = engine->new_session();
      const auto r = plumb::generate(*s, tok, prompt, g, {});
      // The host twin: the same model's logits downloaded, sampled by plumb::Sampler.
      auto h = engine->new_session();
      plumb::Sampler sampler(sp, engine->info().vocab_size);
      std::vector<int32_t> history(prompt.begin(), prompt.end()), got;
      auto logits = h->forward(prompt);
      while (got.size() < r.tokens.size()) {
        const int32_t id = sampler.sample(logits, history);
        got.push_back(id), history.push_back(id);
        if (got.size() < r.tokens.size()) logits = h->forward(std::span<const int32_t>(&id, 1));
      }
      EXPECT_EQ(r.tokens, got) << "patches [" << patches << "] temperature " << sp.temperature << " top_k " << sp.top_k;
    }
  }
}

// Session::forward_sample_masked on the GPU (the mask built on the host while the pass runs, applied on the device
// before the sampling) draws what plumb::Sampler draws from the host-masked row of the same GPU logits, in every
// launch mode (session_test_util.h: samplers of the three device paths, masks of 1 token to most of the vocabulary,
// a multi-pass prompt, a throwing mask).
TEST_F(GpuTest, ForwardSampleMaskedDrawsFromTheMaskedRow) {
  for (const char* patches : {"", "cuda.graph", "cuda.fast"})
    plumb_test::check_masked_sampling(*plumb_test::csa_long_engine("cuda", patches), std::string("cuda [") + patches + "]");
}

// JSON mode and structured outputs on the GPU: generate() without on_logits (the mask on the device beside the pass)
// gives the tokens of the host path (with on_logits: the logits downloaded, masked and sampled on the host), and the
// text is an instance.
TEST_F(GpuTest, JsonModesSampleOnTheGpuLikeTheHostPath) {
  const std::string dir = std::string(PLUMB_TEST_DATA) + "/../../models/tiny";
  const auto tok = plumb::Tokenizer::load(dir);
  const auto prompt = tok.encode(plumb::encode_chat({{"user", "Describe a cat as a JSON object.", ""}}, plumb::ChatOptions{}));
  const std::string schema = R"({"type": "object", "required": ["name", "legs"], "additionalProperties": false,
    "properties": {"name": {"type": "string"}, "legs": {"type": "integer"}, "color": {"enum": ["black", "white"]}}})";
  for (const char* patches : {"", "cuda.fast"}) {
    plumb::EngineOptions o;
    o.backend = "cuda", o.patches = patches;
    const auto engine = plumb::Engine::load(dir, o);
    for (auto format : {plumb::OutputFormat::JsonObject, plumb::OutputFormat::JsonSchema})
      for (float t : {0.0f, 0.8f}) {
        plumb::GenerateOptions g;
        g.sampling.temperature = t, g.sampling.seed = 5, g.max_tokens = 80;
        g.format = format, g.json_schema = format == plumb::OutputFormat::JsonSchema ? schema : "";
        const std::string what = fmt::format("[{}] {} temperature {}", patches,
                                             format == plumb::OutputFormat::JsonSchema ? "schema" : "json", t);
        auto s1 = engine->new_session(), s2 = engine->new_session();
        const auto device = plumb::generate(*s1, tok, prompt, g);
        g.on_logits = [](std::span<const float>, int32_t) {};
        const auto host = plumb::generate(*s2, tok, prompt, g);
        EXPECT_EQ(device.tokens, host.tokens) << what;
        EXPECT_EQ(device.text, host.text) << what;
        EXPECT_GT(device.tokens.size(), 3u) << what;
        if (device.stop == plumb::StopReason::Token) {
          EXPECT_TRUE(nlohmann::json::accept(device.text)) << what << ": " << device.text;
        }
        const double per = 1e3 / std::max<size_t>(1, device.tokens.size() - 1);
        std::printf("%s: %zu tokens, stop %s; decode %.3f ms per token (the host path %.3f): %s\n", what.c_str(),
                    device.tokens.size(), plumb::stop_reason_name(device.stop), device.decode_seconds * per,
                    host.decode_seconds * per, device.text.c_str());
      }
  }
}

// A row with no finite logit (the planted fault that drops the router's renormalization floor makes every logit NaN
// on the fixture whose scores underflow) is an error on the GPU as on the CPU, for greedy and the default sampling
// (the device's greedy and top-k paths), with the host sampler's message (the same words and counts as the CPU's),
// and the tokens count as fed. (The sorted path's refusal: CudaSample's all-NaN rows.)
TEST_F(GpuTest, NoFiniteLogitIsTheHostSamplersError) {
  const std::string dir = std::string(PLUMB_TEST_DATA) + "/golden/router-underflow";
  const auto tok = plumb::Tokenizer::load(std::string(PLUMB_TEST_DATA) + "/../../models/tiny");
  std::map<float, std::string> cpu_message;
  for (const char* backend : {"cpu", "cuda"})
    for (float t : {0.0f, 0.8f}) {
      plumb::EngineOptions o;
      o.backend = backend, o.patches = "fault.renorm_unfloored";
      const auto engine = plumb::Engine::load(dir, o);
      auto s = engine->new_session();
      plumb::GenerateOptions g;
      g.sampling.temperature = t, g.max_tokens = 4;
      try {
        plumb::generate(*s, tok, std::vector<int32_t>{0, 5, 7, 9}, g);
        ADD_FAILURE() << backend << ": tokens sampled from NaN logits";
      } catch (const plumb::Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("prefilling the prompt's 4 tokens (positions 0-3) and sampling token 1 from the last one's "
                         "logits: sampler: no finite logit to sample from ("), std::string::npos) << backend << ": " << m;
        EXPECT_NE(m.find(" logits NaN"), std::string::npos) << backend << ": " << m;
        if (std::string(backend) == "cpu") cpu_message[t] = m;
        else EXPECT_EQ(m, cpu_message[t]) << "temperature " << t;
      }
      EXPECT_EQ(s->position(), 4) << backend;
    }
}

// Session::set_prefill_stop on the GPU: a prefill (passes of 7 tokens) stopped before its first pass or after any
// pass but its last is put back: the window's key ring, the compressors' pending rows and CSA's previous series, and
// under cuda.fast cuda.comp_deferred's kept inputs (the session decodes 3 one-token steps first, so rows are kept),
// so the calls after give the logits of a session never stopped, bit for bit, eager or graph-replayed. csa-long: CSA
// and HCA windows of 4 and 8, a sliding window of 8; the stopped call starts mid-window.
TEST_F(GpuTest, AStoppedPrefillLeavesTheDeviceCachesAsTheyWere) {
  const auto ids = plumb_test::csa_long_ids;
  const auto head = ids(10, 1), body = ids(60, 2), tail = ids(9, 3);
  for (const char* patches : {"", "cuda.fast"}) {
    const auto engine = plumb_test::csa_long_engine("cuda", patches);
    auto started = [&] {
      auto s = engine->new_session();
      s->forward(head);
      for (int32_t t : {5, 6, 7}) s->forward(std::vector<int32_t>{t});
      return s;
    };
    auto ref = started();
    const auto want_body = ref->forward_all(body), want_tail = ref->forward_all(tail);
    std::vector<float> want_steps;
    for (int32_t t : {8, 9, 10, 11, 12}) {
      const auto l = ref->forward(std::vector<int32_t>{t});
      want_steps.insert(want_steps.end(), l.begin(), l.end());
    }
    int asks = 0;
    {
      auto s = started();
      s->set_prefill_stop([&] { return ++asks, false; });
      EXPECT_EQ(s->forward_all(body), want_body) << patches;
    }
    ASSERT_EQ(asks, 9) << patches;  // before the first of 9 passes, then after each but the last
    for (int k = 1; k <= asks; ++k) {
      auto s = started();
      int n = 0;
      s->set_prefill_stop([&] { return ++n == k; });
      EXPECT_THROW(s->forward_all(body), plumb::Stopped) << patches << " point " << k;
      ASSERT_EQ(s->position(), 13) << patches << " point " << k;
      const auto got_body = s->forward_all(body), got_tail = s->forward_all(tail);
      std::vector<float> got_steps;
      for (int32_t t : {8, 9, 10, 11, 12}) {
        const auto l = s->forward(std::vector<int32_t>{t});
        got_steps.insert(got_steps.end(), l.begin(), l.end());
      }
      ASSERT_EQ(got_body.size(), want_body.size());
      EXPECT_EQ(std::memcmp(got_body.data(), want_body.data(), 4 * got_body.size()), 0) << patches << ": the call again, point " << k;
      EXPECT_EQ(std::memcmp(got_tail.data(), want_tail.data(), 4 * got_tail.size()), 0) << patches << ": the next call, point " << k;
      EXPECT_EQ(std::memcmp(got_steps.data(), want_steps.data(), 4 * got_steps.size()), 0) << patches << ": decode after, point " << k;
    }
  }
}

// Session::checkpoint / restore on the GPU: going back to a checkpoint (taken mid-window, after one-token steps that
// cuda.comp_deferred keeps rows of) gives the logits the session gave after it, bit for bit, for prefill passes and
// decode steps (graph-replayed under cuda.fast), as often as asked.
TEST_F(GpuTest, CheckpointsComeBackBitForBit) {
  const auto ids = plumb_test::csa_long_ids;
  const auto head = ids(10, 1), body = ids(60, 2), tail = ids(9, 3);
  for (const char* patches : {"", "cuda.fast"}) {
    const auto engine = plumb_test::csa_long_engine("cuda", patches);
    auto s = engine->new_session();
    s->forward(head);
    auto steps = [&](int n) {
      std::vector<float> out;
      for (int i = 0; i < n; ++i) {
        const auto l = s->forward(std::vector<int32_t>{int32_t(5 + i)});
        out.insert(out.end(), l.begin(), l.end());
      }
      return out;
    };
    steps(3);
    const auto at13 = s->checkpoint();
    const auto l_body = s->forward_all(body), l_steps = steps(5);
    const auto at78 = s->checkpoint();
    const auto l_tail = s->forward_all(tail), l_after = steps(4);
    auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), 4 * a.size()) == 0;
    };
    for (int i = 0; i < 2; ++i) {
      s->restore(*at78);
      ASSERT_EQ(s->position(), 78) << patches;
      EXPECT_TRUE(same(s->forward_all(tail), l_tail)) << patches << ": the prefill after the checkpoint at 78, restore " << i;
      EXPECT_TRUE(same(steps(4), l_after)) << patches << ": the steps after it, restore " << i;
    }
    s->restore(*at13);
    EXPECT_TRUE(same(s->forward_all(body), l_body)) << patches << ": the prefill after the checkpoint at 13";
    EXPECT_TRUE(same(steps(5), l_steps)) << patches << ": the steps after it";
  }
}

// The GPU's sampling path (Session::forward_sample, what generate() runs there: the passes but the last guarded, the
// last pass and the sampling on the device) stopped during a prompt's prefill, and a progress function that throws
// between passes: the session goes back as it was, and what follows is what a session never stopped gives, bit for
// bit (the same tokens, the same logits).
TEST_F(GpuTest, AStoppedGenerateAndAThrowingProgressLeaveTheSessionAsItWas) {
  const auto ids = plumb_test::csa_long_ids;
  const auto tok = plumb::Tokenizer::load(std::string(PLUMB_TEST_DATA) + "/../../models/tiny");
  const auto head = ids(13, 1), body = ids(60, 2);
  for (const char* patches : {"", "cuda.fast"}) {
    const auto engine = plumb_test::csa_long_engine("cuda", patches);
    plumb::GenerateOptions g;
    g.sampling.seed = 3, g.max_tokens = 8, g.stop_at_eos = false;
    auto ref = engine->new_session();
    ref->forward(head);
    const auto want = plumb::generate(*ref, tok, body, g);
    const auto want_logits = ref->forward(body);
    auto s = engine->new_session();
    s->forward(head);
    int asked = 0;
    g.should_stop = [&] { return ++asked == 3; };  // after the second of 9 passes
    const auto stopped = plumb::generate(*s, tok, body, g);
    EXPECT_EQ(stopped.stop, plumb::StopReason::Cancelled) << patches;
    EXPECT_TRUE(stopped.tokens.empty()) << patches;
    EXPECT_EQ(s->position(), 13) << patches;
    g.should_stop = {};
    const auto again = plumb::generate(*s, tok, body, g);
    EXPECT_EQ(again.tokens, want.tokens) << patches;
    s->set_prefill_progress([](int64_t done, int64_t) {
      if (done >= 21) throw std::runtime_error("the front end went away");
    });
    const int64_t at = s->position();
    EXPECT_THROW(s->forward(body), std::runtime_error) << patches;
    EXPECT_EQ(s->position(), at) << patches;
    s->set_prefill_progress({});
    const auto got = s->forward(body);
    ASSERT_EQ(got.size(), want_logits.size());
    EXPECT_EQ(std::memcmp(got.data(), want_logits.data(), 4 * got.size()), 0) << patches;
  }
}

// The load reports its binding (stage "layers") and then the copy onto the GPU (stage "upload"), each layer once and
// in order, so the CLI's line can say where a long upload is.
TEST_F(GpuTest, EngineApiRunsOnCuda) {
  plumb::EngineOptions o;
  o.backend = "cuda";
  std::vector<std::string> seen;
  o.on_progress = [&](const plumb::LoadProgress& p) { seen.push_back(fmt::format("{} {}/{}", p.stage, p.done, p.total)); };
  const auto engine = plumb::Engine::load(std::string(PLUMB_TEST_DATA) + "/../../models/tiny", o);
  auto s = engine->new_session();
  const auto toks = test_prompt(12, engine->info().vocab_size);
  const auto l = s->forward(toks);
  EXPECT_EQ(int(l.size()), engine->info().vocab_size);
  EXPECT_EQ(s->position(), 12);
  for (float v : l) ASSERT_TRUE(std::isfinite(v));
  EXPECT_EQ(seen, (std::vector<std::string>{"layers 1/4", "layers 2/4", "layers 3/4", "layers 4/4", "upload 1/4", "upload 2/4",
                                            "upload 3/4", "upload 4/4"}));
  // The backend's notes on where its patches apply go through plumb::set_notice_sink (the CLI redraws its live
  // loading line below them), not straight to stderr.
  std::vector<std::string> notes;
  plumb::set_notice_sink([&](std::string_view line) { notes.emplace_back(line); });
  o.patches = "cuda.fast", o.on_progress = nullptr;
  plumb::Engine::load(std::string(PLUMB_TEST_DATA) + "/../../models/tiny", o);
  plumb::set_notice_sink({});
  EXPECT_NE(std::find(notes.begin(), notes.end(), "backend cuda: cuda.head_bf16 runs the LM head"), notes.end())
      << ::testing::PrintToString(notes);
}

}  // namespace
