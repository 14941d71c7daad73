// The precision toolkit: metrics against hand-computed values, diagnoses on synthetic tensors, and diff / bisect /
// kld / selftest on the bundled fixtures (every fault found at the right tap with the right diagnosis).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/error.h"
#include "io/safetensors.h"
#include "plumb/text.h"
#include "toolkit/bisect.h"
#include "toolkit/diff.h"
#include "toolkit/kld.h"
#include "toolkit/progress.h"
#include "toolkit/selftest.h"
#include "toolkit/tap_filter.h"
#include "toolkit/tap_names.h"

namespace {

using namespace plumb;
using namespace plumb::toolkit;
namespace fs = std::filesystem;

const std::string kGolden = std::string(PLUMB_TEST_DATA) + "/golden/";
const std::string kTiny = kGolden + "tiny";

Tensor vec(std::vector<float> v) {
  const int64_t n = int64_t(v.size());
  return Tensor({n}, std::move(v));
}

// Runs f, which must throw plumb::Error with `want` in its message.
template <typename F>
void expect_error(F f, const std::string& want) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one saying: " << want;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

// --- metrics ---------------------------------------------------------------------------------------------------

// The progress line on a fake clock: nothing before the interval; a step's tokens counted done by the layers before
// the one a tap names; the rate and the estimate from them; other tap names ignored; a new step counts the ones before.
TEST(ToolkitProgress, CountsStepsAndLayerShares) {
  using namespace std::chrono_literals;
  plumb::toolkit::RunProgress::Clock::time_point t{};
  std::vector<std::string> lines;
  plumb::toolkit::RunProgress p("A: reference", {100, 50}, 4, 5s, [&](const std::string& l) { lines.push_back(l); },
                                [&] { return t; });
  p.step(0);
  t += 4s;
  p.tap("L0.hc_attn.mix");  // within the interval: no line
  EXPECT_TRUE(lines.empty());
  t += 2s;
  p.tap("logits");  // not a layer's tap
  EXPECT_TRUE(lines.empty());
  p.tap("L1.attn.q");  // 6 s: step 1 of 2 is a quarter done (layer 2 of 4 begun)
  t += 6s;
  p.step(1);  // 12 s: the first step done
  t += 5s;
  p.tap("L3.ffn.out");  // 17 s: 100 + 50 * 3 / 4
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "[A: reference] 25 of 150 tokens (step 1 of 2: 100 tokens, in layer 2 of 4), 4.2 tokens/s, about 30 s left");
  EXPECT_EQ(lines[1], "[A: reference] 100 of 150 tokens (step 2 of 2: 50 tokens), 8.3 tokens/s, about 6 s left");
  EXPECT_EQ(lines[2], "[A: reference] 138 of 150 tokens (step 2 of 2: 50 tokens, in layer 4 of 4), 8.1 tokens/s, about 2 s left");
}

TEST(ToolkitMetrics, HandComputedValues) {
  const FloatStats s = compare_f32(vec({1, 2, 3}), vec({1, 2, 4}));
  EXPECT_EQ(s.max_abs, 1.0);
  EXPECT_EQ(s.at, 2);
  EXPECT_EQ(s.coord(), "[2]");
  EXPECT_EQ(s.a_at, 3.0);
  EXPECT_EQ(s.b_at, 4.0);
  EXPECT_DOUBLE_EQ(s.rel_l2(), 1.0 / std::sqrt(14.0));
  EXPECT_DOUBLE_EQ(s.cosine(), 17.0 / std::sqrt(14.0 * 21.0));
  EXPECT_DOUBLE_EQ(s.err_scaled(), 1.0 / 3.0);  // max|err| / max(1, max|A|)
  // bf16(3) = 0x4040 and bf16(4) = 0x4080: 64 bf16 steps apart.
  EXPECT_EQ(s.max_ulp, 64);
  EXPECT_EQ(s.nonfinite_mismatch, 0);
}

TEST(ToolkitMetrics, Bf16Ulps) {
  EXPECT_EQ(bf16_ulp_distance(1.0f, 1.0f), 0);
  EXPECT_EQ(bf16_ulp_distance(1.0f, 1.0f + 1.0f / 128), 1);  // bf16 keeps 7 fraction bits
  EXPECT_EQ(bf16_ulp_distance(1.0f, 1.0f + 1.0f / 1024), 0);  // rounds to the same bf16 value
  EXPECT_EQ(bf16_ulp_distance(-0.0f, 0.0f), 0);
  EXPECT_EQ(bf16_ulp_distance(-1.0f, 1.0f), 2 * 0x3F80);  // across zero: both magnitudes
}

TEST(ToolkitMetrics, NonFiniteCounts) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const FloatStats s = compare_f32(vec({1, nan, inf, 2, -inf}), vec({1, nan, inf, nan, inf}));
  EXPECT_EQ(s.nan_a, 1);
  EXPECT_EQ(s.nan_b, 2);
  EXPECT_EQ(s.inf_a, 2);
  EXPECT_EQ(s.inf_b, 2);
  EXPECT_EQ(s.nonfinite_mismatch, 2);  // 2 vs NaN, -inf vs +inf; NaN/NaN and inf/inf agree
  EXPECT_EQ(s.max_abs, 0.0);
  EXPECT_EQ(s.finite_pairs, 1);  // only the first element is finite on both sides
  // B all NaN: nothing finite on both sides, so the error figures (0, cosine 1) measure nothing; the reports say so.
  const FloatStats all_nan = compare_f32(vec({1, 2}), vec({nan, nan}));
  EXPECT_EQ(all_nan.finite_pairs, 0);
  EXPECT_EQ(all_nan.nonfinite_mismatch, 2);
}

TEST(ToolkitMetrics, ScaleFitFindsPowersOfRsf) {
  const Tensor a = vec({0.5f, -1.25f, 2.0f, 3.5f, -0.75f});
  for (const double c : {1.5, 2.25, 1 / 1.5, 1 / 2.25}) {
    Tensor b = a;
    for (auto& v : b.data) v = float(v * c);
    const ScaleFit f = fit_scale(a, b);
    ASSERT_TRUE(f.valid);
    EXPECT_NEAR(f.c, c, 1e-6);
    EXPECT_LT(f.resid, 1e-6);
  }
  int power = 0;
  EXPECT_EQ(rsf_relation(1.5, 1.5, &power), "applied twice");
  EXPECT_EQ(power, 1);
  EXPECT_NE(rsf_relation(2.25, 1.5, &power).find("applied twice"), std::string::npos);
  EXPECT_EQ(power, 2);
  EXPECT_EQ(rsf_relation(1 / 1.5, 1.5, &power), "missing");
  EXPECT_NE(rsf_relation(1 / 2.25, 1.5, &power).find("missing"), std::string::npos);
  EXPECT_EQ(power, -2);
  EXPECT_EQ(rsf_relation(1.2, 1.5), "");        // not within 2% of any power
  EXPECT_EQ(rsf_relation(1.52, 1.5), "applied twice");
  EXPECT_EQ(rsf_relation(1.0, 1.0), "");        // no factor to speak of
  // A scale plus noise is not a pure scale.
  const ScaleFit noisy = fit_scale(a, vec({0.75f, -1.8f, 3.1f, 5.0f, 0.0f}));
  EXPECT_GT(noisy.resid, 1e-2);
}

TEST(ToolkitMetrics, IndexTiesVersusRealFlips) {
  const IndexTensor a({2, 2}, std::vector<int64_t>{0, 1, 2, 3});
  const IndexTensor b({2, 2}, std::vector<int64_t>{0, 2, 2, 3});  // row 0: expert 1 swapped for 2
  // Scores: experts 1 and 2 of row 0 nearly tied, moved by 1e-6 (within 1e-4): a near tie.
  const Tensor sa({2, 4}, std::vector<float>{3, 1.0f, 0.999999f, 0, 0, 0, 2, 2});
  Tensor sb = sa;
  sb[1] = 0.999999f, sb[2] = 1.0f;
  IndexStats s = compare_index(a, b, &sa, &sb, false, 1e-4);
  EXPECT_EQ(s.rows, 2);
  EXPECT_EQ(s.agree, 1);
  EXPECT_EQ(s.ties, 1);
  EXPECT_EQ(s.exact_ties, 0);
  EXPECT_EQ(s.real, 0);
  // Identical scores but a different selection: the top-k itself is wrong.
  s = compare_index(a, b, &sa, &sa, false, 1e-4);
  EXPECT_EQ(s.real, 1);
  // Exactly equal scores ordered differently (PyTorch CPU vs CUDA top-k): both selections are the top-k, a tie.
  Tensor se = sa;
  se[2] = 1.0f;
  s = compare_index(a, b, &se, &se, false, 1e-4);
  EXPECT_EQ(s.ties, 1);
  EXPECT_EQ(s.exact_ties, 1);
  EXPECT_EQ(s.real, 0);
  // A hash layer never has ties.
  s = compare_index(a, b, &sa, &sb, true, 1e-4);
  EXPECT_EQ(s.real, 1);
  // Scores moved far beyond tolerance: real.
  sb[2] = 5.0f;
  s = compare_index(a, b, &sa, &sb, false, 1e-4);
  EXPECT_EQ(s.real, 1);
  // Masked entries (-inf, the indexer's invisible ones) do not set the tolerance's scale: a move of 0.45 stays real.
  const float ninf = -std::numeric_limits<float>::infinity();
  const Tensor ma({2, 4}, std::vector<float>{3, 1.0f, 0.55f, ninf, 0, 0, 2, 2});
  Tensor mb = ma;
  mb[1] = 0.55f, mb[2] = 1.0f;
  EXPECT_EQ(compare_index(a, b, &ma, &mb, false, 1e-4).real, 1);
  // A swapped-in entry that is masked on one side is no tie either.
  mb = ma;
  mb[1] = ninf;
  EXPECT_EQ(compare_index(a, b, &ma, &mb, false, 1e-4).real, 1);
  // The first differing row is named by its token position where the caller knows the rows' positions.
  EXPECT_EQ(s.first_bad, "row 0: A {0,1} B {0,2}");
  const std::vector<int64_t> pos{964, 965};
  EXPECT_EQ(compare_index(a, b, &sa, &sb, false, 1e-4, &pos).first_bad, "position 964: A {0,1} B {0,2}");
}

// --- filter and names --------------------------------------------------------------------------------------------

TEST(ToolkitFilter, GlobsLayersStepsPositions) {
  EXPECT_TRUE(glob_match("L3.*", "L3.ffn.out"));
  EXPECT_FALSE(glob_match("L3.*", "L13.ffn.out"));
  EXPECT_TRUE(glob_match("*.ffn.*", "L0.ffn.gate.weights"));
  EXPECT_TRUE(glob_match("L?.out", "L7.out"));
  EXPECT_FALSE(glob_match("L?.out", "L17.out"));
  // A '*' in the text is an ordinary character: the pattern's '*' still matches any run (tests/fuzz found it taken
  // as a literal match, so "*" failed to match "*x").
  EXPECT_TRUE(glob_match("*", "*x"));
  EXPECT_TRUE(glob_match("a*", "a*b"));
  EXPECT_FALSE(glob_match("a*c", "a*b"));
  const TapFilter f = TapFilter::parse("*.ffn.*,hc_head.out", "0-1,3", "s0,2", "0-5,9");
  EXPECT_TRUE(f.keeps_tap("L1.ffn.routed"));
  EXPECT_FALSE(f.keeps_tap("L2.ffn.routed"));  // layer 2 is not kept
  EXPECT_FALSE(f.keeps_tap("L0.attn.out"));    // no glob matches
  EXPECT_TRUE(f.keeps_tap("hc_head.out"));
  EXPECT_TRUE(f.keeps_tap("logits"));          // always kept
  EXPECT_TRUE(f.keeps_step("s0", 0));
  EXPECT_TRUE(f.keeps_step("s2", 2));
  EXPECT_FALSE(f.keeps_step("s1", 1));
  EXPECT_TRUE(f.keeps_position(5));
  EXPECT_FALSE(f.keeps_position(6));
  EXPECT_TRUE(f.keeps_position(9));
  EXPECT_THROW(TapFilter::parse("", "3-1", "", ""), Error);
  EXPECT_THROW(TapFilter::parse("", "", "", "x"), Error);
  for (const char* signed_item : {"0--0", "-0", "+1", "1-+2"})  // no sign: "0--0" was the range 0-0
    EXPECT_THROW(TapFilter::parse("", signed_item, "", ""), Error) << signed_item;
}

TEST(ToolkitFilter, RangesOfValues) {
  EXPECT_EQ(IntRanges::of({7, 0, 2, 1, 2, 9, 8}).describe(), "0-2,7-9");
  EXPECT_EQ(IntRanges::of({}).describe(), "all");
  EXPECT_EQ(IntRanges::parse("3,3,1-4", "--positions").describe(), "3,3,1-4");  // as written
  EXPECT_TRUE(IntRanges::of({5}).contains(5));
}

TEST(ToolkitFilter, CheckMatchesNamesWhatAFilterMissed) {
  const std::vector<std::string> names = {"L0.attn.out", "L0.ffn.routed", "L1.attn.out", "hc_head.out", "logits"};
  TapFilter::parse("*.ffn.*,logits", "0-1", "", "").check_matches(names);  // each item reaches a name
  TapFilter::parse("hc_head.out", "1", "", "").check_matches(names);       // model-level taps ignore --layers
  auto message = [&](const TapFilter& f) {
    try {
      f.check_matches(names);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_EQ(message(TapFilter::parse("L0.atn.*", "", "", "")).rfind("--taps: 'L0.atn.*' matches no tap of this run (", 0), 0u);
  // The glob names layer 0's taps, but --layers keeps only layer 1: that combination keeps nothing of the glob.
  EXPECT_EQ(message(TapFilter::parse("L0.*", "1", "", "")).rfind("--taps: 'L0.*' matches no tap of this run in the layers --layers keeps", 0), 0u);
  EXPECT_EQ(message(TapFilter::parse("", "2-5", "", "")), "--layers: no tap of layers 2-5 in this run");
  EXPECT_EQ(message(TapFilter::parse("", "7", "", "")), "--layers: no tap of layer 7 in this run");
}

TEST(ToolkitFilter, TapNames) {
  EXPECT_EQ(parse_tap("L12.ffn.gate.weights").layer, 12);
  EXPECT_EQ(parse_tap("L12.ffn.gate.weights").suffix, "ffn.gate.weights");
  EXPECT_EQ(parse_tap("hc_head.out").layer, -1);
  std::vector<std::string> v = {"logits", "L1.attn.out", "L0.out", "hc_head.out", "L0.ffn.routed", "L0.hc_attn.post"};
  sort_execution_order(v);
  EXPECT_EQ(v, (std::vector<std::string>{"L0.hc_attn.post", "L0.ffn.routed", "L0.out", "L1.attn.out", "hc_head.out", "logits"}));
  EXPECT_TRUE(depends_on_hc_post("L0.out"));
  EXPECT_TRUE(depends_on_hc_post("L2.hc_ffn.comb"));
  EXPECT_TRUE(depends_on_hc_post("L1.hc_attn.post"));
  EXPECT_FALSE(depends_on_hc_post("L0.hc_attn.post"));  // layer 0 reads the embedding
  EXPECT_FALSE(depends_on_hc_post("L0.ffn.out"));
}

TEST(ToolkitFilter, LayerPhrase) {
  ModelConfig cfg;
  cfg.mlp = {MlpType::Hash, MlpType::Hash, MlpType::Learned, MlpType::Learned};
  const std::vector<int> all{0, 1, 2, 3};
  EXPECT_EQ(layer_phrase({0, 1}, all, &cfg), "on hash-routed layers 0,1 only");
  EXPECT_EQ(layer_phrase({0, 1, 2, 3}, all, &cfg), "on all 4 layers (0,1,2,3)");
  EXPECT_NE(layer_phrase({2, 3}, all, &cfg).find("learned-routing layers 2,3 only"), std::string::npos);
  EXPECT_EQ(layer_phrase({2}, all, &cfg), "on layer 2");
}

// --- diagnosis on synthetic traces ---------------------------------------------------------------------------

// A one-step trace with the given float taps in order.
Trace synthetic(const std::vector<std::pair<std::string, Tensor>>& taps) {
  Trace t;
  t.steps.push_back(GoldenStep{"s0", "prefill", 0, {1, 2}});
  StepTaps d;
  for (const auto& [name, v] : taps) d.f32[name] = v, d.order.push_back(name);
  d.positions = {0, 1};
  t.data.push_back(std::move(d));
  return t;
}

TEST(ToolkitDiagnosis, NanOrigin) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor x({2, 2}, std::vector<float>{1, 2, 3, 4});
  const Tensor y({2, 2}, std::vector<float>{1, nan, 3, 4});
  const Trace a = synthetic({{"L0.attn.out", x}, {"L0.ffn.shared", x}, {"L0.out", x}});
  const Trace b = synthetic({{"L0.attn.out", x}, {"L0.ffn.shared", y}, {"L0.out", y}});
  const DiffReport r = compare_traces(a, b, nullptr, PairTolerance{1e-4, 1e-4, "test"}, nullptr);
  ASSERT_FALSE(r.first.none());
  EXPECT_EQ(r.first.tap, "L0.ffn.shared");
  const Diagnosis d = diagnose(DiagnosisInput{a, b, nullptr, r.first, 1e-4, nullptr, nullptr, {}});
  EXPECT_EQ(d.kind, "nonfinite");
  EXPECT_NE(d.text.find("NaN first appears at L0.ffn.shared"), std::string::npos) << d.text;
  EXPECT_NE(d.text.find("shared expert"), std::string::npos) << d.text;
}

// A selection flip on exactly tied scores is named as ties broken in another order (the CPU reference and the GPU
// break them differently by design); one on scores rounding moved is named with how far they moved.
TEST(ToolkitDiagnosis, SelectionTiesExactOrMoved) {
  const Tensor scores({2, 4}, std::vector<float>{3, 0, 0, -1, 0, 0, 2, 2});
  auto with_topk = [&](const Tensor& s, std::vector<int64_t> sel) {
    Trace t = synthetic({{"L1.attn.indexer.scores", s}});
    t.data[0].idx["L1.attn.indexer.topk"] = IndexTensor({2, 2}, std::move(sel));
    t.data[0].order.push_back("L1.attn.indexer.topk");
    return t;
  };
  // Row 0: entries 1 and 2 both score exactly 0; A takes 1, B takes 2.
  const Trace a = with_topk(scores, {0, 1, 2, 3}), b = with_topk(scores, {0, 2, 2, 3});
  DiffReport r = compare_traces(a, b, nullptr, PairTolerance{1e-4, 1e-4, "test"}, nullptr);
  ASSERT_EQ(r.first.tap, "L1.attn.indexer.topk");
  Diagnosis d = diagnose(DiagnosisInput{a, b, nullptr, r.first, 1e-4, nullptr, nullptr, {}});
  EXPECT_EQ(d.kind, "selection_tie");
  EXPECT_NE(d.text.find("1 of 2 tokens"), std::string::npos) << d.text;
  EXPECT_NE(d.text.find("the same in both runs: exact ties broken in another order"), std::string::npos) << d.text;
  // B's score of entry 2 moved up by 1e-6 (rounding): a near tie that moved.
  Tensor moved = scores;
  moved[2] = 1e-6f;
  const Trace c = with_topk(moved, {0, 2, 2, 3});
  r = compare_traces(a, c, nullptr, PairTolerance{1e-4, 1e-4, "test"}, nullptr);
  d = diagnose(DiagnosisInput{a, c, nullptr, r.first, 1e-4, nullptr, nullptr, {}});
  EXPECT_EQ(d.kind, "selection_tie");
  EXPECT_NE(d.text.find("whose scores moved by at most 1e-06"), std::string::npos) << d.text;
}

TEST(ToolkitDiagnosis, PureScaleOutsideTheMoe) {
  const Tensor x({2, 2}, std::vector<float>{1, -2, 3, 4});
  Tensor y = x;
  for (auto& v : y.data) v *= 2.25f;
  ModelConfig cfg;
  cfg.routed_scaling = 1.5;
  const Trace a = synthetic({{"L0.attn.out", x}}), b = synthetic({{"L0.attn.out", y}});
  const DiffReport r = compare_traces(a, b, nullptr, PairTolerance{1e-4, 1e-4, "test"}, &cfg);
  const Diagnosis d = diagnose(DiagnosisInput{a, b, nullptr, r.first, 1e-4, &cfg, nullptr, {}});
  EXPECT_EQ(d.kind, "scale");
  EXPECT_NE(d.text.find("B = 2.25 x A"), std::string::npos) << d.text;
  EXPECT_NE(d.text.find("applied twice"), std::string::npos) << d.text;
}

TEST(ToolkitDiagnosis, AllZeroRoutedWeights) {
  // Layer 0, one hash layer: B's gate weights of token 1 are all zero while A's logits there are very negative.
  ModelConfig cfg;
  cfg.routed_scaling = 1.5;
  cfg.mlp = {MlpType::Hash};
  const Tensor logits({2, 2}, std::vector<float>{0.5f, 1.0f, -30.0f, -31.0f});
  const Tensor wa({2, 2}, std::vector<float>{0.7f, 0.8f, 0.75f, 0.75f}), wb({2, 2}, std::vector<float>{0.7f, 0.8f, 0, 0});
  const Tensor ra({2, 2}, std::vector<float>{1, 2, 3, 4}), rb({2, 2}, std::vector<float>{1, 2, 0, 0});
  Trace a = synthetic({{"L0.ffn.gate.logits", logits}, {"L0.ffn.gate.weights", wa}, {"L0.ffn.routed", ra}});
  Trace b = synthetic({{"L0.ffn.gate.logits", logits}, {"L0.ffn.gate.weights", wb}, {"L0.ffn.routed", rb}});
  for (Trace* t : {&a, &b}) {
    t->data[0].idx["L0.ffn.gate.indices"] = IndexTensor({2, 2}, std::vector<int64_t>{0, 1, 0, 1});
    t->data[0].order.insert(t->data[0].order.begin() + 1, "L0.ffn.gate.indices");
  }
  const DiffReport r = compare_traces(a, b, nullptr, PairTolerance{1e-4, 1e-4, "test"}, &cfg);
  EXPECT_EQ(r.first.tap, "L0.ffn.gate.weights");
  const Diagnosis d = diagnose(DiagnosisInput{a, b, nullptr, r.first, 1e-4, &cfg, nullptr, {}});
  EXPECT_EQ(d.kind, "scores_underflow");
  EXPECT_NE(d.text.find("routed weights all zero on 1 tokens"), std::string::npos) << d.text;
  EXPECT_NE(d.text.find("naive softplus"), std::string::npos) << d.text;
}

// --text inputs are tokenized as `plumb run` tokenizes a prompt: on the bundled model (its tokenizer.json's
// post-processor adds nothing, its tokenizer_config.json says add_bos_token) BOS first, with the tokenizer taken
// from the model folder by default, and split into chunks with their positions.
TEST(ToolkitInput, TextIsTokenizedAsPlumbRunTokenizesAPrompt) {
  const std::string model = std::string(PLUMB_TEST_DATA) + "/../../models/tiny";
  const fs::path file = fs::temp_directory_path() / "plumb_toolkit_text.txt";
  const std::string text = "Once upon a time, there was a little fox.";
  std::ofstream(file, std::ios::binary) << text;
  const auto tok = plumb::Tokenizer::load(model);
  std::vector<int32_t> want = {0};
  const auto body = tok.encode(text);
  want.insert(want.end(), body.begin(), body.end());
  for (const std::string& t : {std::string(), model, model + "/tokenizer.json"}) {
    const RunInput in = input_from_text(model, file.string(), t, 0);
    ASSERT_EQ(in.steps.size(), 1u) << t;
    EXPECT_EQ(in.steps[0].tokens, want) << "--tokenizer '" << t << "'";
  }
  const RunInput chunks = input_from_text(model, file.string(), "", 4);
  std::vector<int32_t> joined;
  for (const auto& s : chunks.steps) {
    EXPECT_EQ(s.start_pos, int64_t(joined.size())) << s.name;
    EXPECT_LE(s.tokens.size(), 4u) << s.name;
    joined.insert(joined.end(), s.tokens.begin(), s.tokens.end());
  }
  EXPECT_EQ(joined, want);
  try {
    input_from_text(model, file.string(), "/nonexistent/tokenizer.json", 0);
    ADD_FAILURE() << "a missing tokenizer was accepted";
  } catch (const plumb::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/tokenizer.json"), std::string::npos) << e.what();
  }
  fs::remove(file);
}

// --- live diff, faults, bisect, kld on the bundled fixtures -------------------------------------------------

TEST(ToolkitDiff, ReferenceAgainstItselfHasNoDivergence) {
  const RunInput in = input_from_fixture(kTiny);
  const DiffReport r = diff_live(in, "", "", true);
  EXPECT_TRUE(r.first.none());
  EXPECT_TRUE(r.first_local.none());
  EXPECT_EQ(r.diagnosis.kind, "none");
  ASSERT_GT(r.rows.size(), 50u);
  for (const auto& row : r.rows) {
    EXPECT_FALSE(row.diverges) << row.name;
    if (!row.is_index) {
      EXPECT_EQ(row.f.max_abs, 0.0) << row.name;
    }
  }
  EXPECT_EQ(r.rows.back().name, "logits");
  // The report formats carry the same verdict.
  EXPECT_NE(report_json(r).find("\"first_divergence\": null"), std::string::npos);
  const std::string html = report_html(r);
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
}

TEST(ToolkitDiff, EveryFaultOnTinyHasTheRightDivergenceAndDiagnosis) {
  const SelftestResult r = run_selftest({kTiny});
  for (const auto& c : r.cases) EXPECT_NE(c.status, "FAIL") << format_case(c);
  EXPECT_EQ(r.failed, 0);
  EXPECT_GE(r.passed, 7);  // the control and the six faults tiny can show
  auto find = [&](const std::string& f) {
    for (const auto& c : r.cases)
      if (c.fault == f) return c;
    return SelftestCase{};
  };
  EXPECT_EQ(find("fault.rsf_twice").first, "L0.ffn.routed");
  EXPECT_NE(find("fault.rsf_twice").diagnosis.find("applied twice"), std::string::npos);
  EXPECT_NE(find("fault.rsf_missing_hash_layers").diagnosis.find("missing on hash-routed layers 0,1 only"), std::string::npos);
  EXPECT_EQ(find("fault.comb_untransposed").first, "L0.out");
  EXPECT_NE(find("fault.comb_untransposed").diagnosis.find("C.R instead of C^T.R"), std::string::npos);
}

TEST(ToolkitDiff, RouterFaultsOnTheNegativeRouterFixture) {
  const std::string dir = kGolden + "negative-router";
  if (!fs::exists(dir + "/golden.json")) GTEST_SKIP() << "fixture negative-router not present";
  const SelftestResult r = run_selftest({dir});
  for (const auto& c : r.cases) EXPECT_NE(c.status, "FAIL") << format_case(c);
  int router = 0;
  for (const auto& c : r.cases)
    if ((c.fault == "fault.softplus_naive" || c.fault == "fault.renorm_unfloored") && c.status == "ok") ++router;
  EXPECT_EQ(router, 2);
}

TEST(ToolkitDiff, TraceFilesRoundTripAndCompare) {
  const RunInput in = input_from_fixture(kTiny);
  const auto ref = load_model(kTiny, ""), bad = load_model(kTiny, "fault.rsf_twice");
  const TapFilter f = TapFilter::parse("L0.*", "", "s0,s2", "0-3,32");
  const Trace ta = run_trace(*ref, in, "", &f), tb = run_trace(*bad, in, "fault.rsf_twice", &f);
  ASSERT_EQ(ta.steps.size(), 2u);
  EXPECT_EQ(ta.data[0].positions, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(ta.data[1].positions, (std::vector<int64_t>{32}));
  EXPECT_EQ(ta.data[0].f("L0.attn.out")->dim(0), 4);
  EXPECT_EQ(ta.data[0].f("L1.attn.out"), nullptr);
  // What the model offered, filtered or not: the filter's check runs against it (a --taps typo, a --layers past them).
  EXPECT_TRUE(std::binary_search(ta.offered.begin(), ta.offered.end(), "L1.attn.out"));
  EXPECT_TRUE(std::binary_search(ta.offered.begin(), ta.offered.end(), "logits"));
  const fs::path dir = fs::temp_directory_path() / fmt::format("plumb_toolkit_{}", ::getpid());
  fs::create_directories(dir);
  write_trace(ta, (dir / "a.safetensors").string());
  write_trace(tb, (dir / "b.safetensors").string());
  const Trace ra = read_trace((dir / "a.safetensors").string()), rb = read_trace((dir / "b.json").string());
  EXPECT_EQ(ra.tap_order(), ta.tap_order());
  EXPECT_EQ(ra.data[0].f("L0.ffn.routed")->data, ta.data[0].f("L0.ffn.routed")->data);
  EXPECT_EQ(ra.data[0].i("L0.ffn.gate.indices")->data, ta.data[0].i("L0.ffn.gate.indices")->data);
  const DiffReport r = compare_traces(ra, rb, nullptr, pair_tolerance(ra.patches, rb.patches), nullptr);
  EXPECT_EQ(r.first.tap, "L0.ffn.routed");
  fs::remove_all(dir);
}

// --positions: every position runs, only the named rows are compared, so the first divergence moves to the step
// that holds them and names its position; a range past the input, or outside what a recorded trace kept, is refused.
TEST(ToolkitDiff, PositionsNarrowTheComparison) {
  const RunInput in = input_from_fixture(kTiny);  // steps s0 (positions 0-18), s1 (19-31), s2..s7 (32..37)
  const DiffReport all = diff_live(in, "", "fault.rsf_twice", false);
  ASSERT_EQ(all.first.tap, "L0.ffn.routed");
  EXPECT_EQ(all.first.step_name, "s0");
  const TapRow* routed_all = all.row("L0.ffn.routed");
  ASSERT_NE(routed_all, nullptr);
  const DiffReport one = diff_live(in, "", "fault.rsf_twice", false, -1, IntRanges::parse("33", "--positions"));
  EXPECT_EQ(one.first.tap, "L0.ffn.routed");
  EXPECT_EQ(one.first.step_name, "s3");
  EXPECT_EQ(one.first_local.step_name, "s3");  // teacher forcing ran on A's whole trace, compared at s3 only
  EXPECT_NE(one.diagnosis.text.find("applied twice"), std::string::npos) << one.diagnosis.text;
  EXPECT_EQ(one.compared_positions, std::vector<int64_t>{33});
  EXPECT_EQ(one.steps_with_rows, 1);
  for (const auto& row : one.rows) {
    if (row.is_index || row.only_a || row.only_b || row.f.at < 0) continue;
    EXPECT_EQ(row.f.at_pos, 33) << row.name;
    EXPECT_EQ(row.f.at_shape[0], 1) << row.name;  // the one kept row of step s3
    if (row.has_local && row.lf.at >= 0) {
      EXPECT_EQ(row.lf.at_pos, 33) << row.name;  // the teacher-forced run's rows too
    }
  }
  // A range across steps: s1's last rows and s2; the largest error is among them and names its position.
  const DiffReport span = diff_live(in, "", "fault.rsf_twice", false, -1, IntRanges::parse("30-32", "--positions"));
  EXPECT_EQ(span.first.step_name, "s1");
  const TapRow* routed = span.row("L0.ffn.routed");
  ASSERT_NE(routed, nullptr);
  EXPECT_GE(routed->f.at_pos, 30);
  EXPECT_LE(routed->f.at_pos, 32);
  EXPECT_LT(routed->f.numel, routed_all->f.numel);
  // Without --positions the largest error's position is its row's: start_pos + row.
  const FloatStats& fa = routed_all->f;
  ASSERT_GE(fa.at, 0);
  const int64_t row_width = fa.at_shape.size() > 1 ? fa.at_shape[1] * (fa.at_shape.size() > 2 ? fa.at_shape[2] : 1) : 1;
  EXPECT_EQ(fa.at_pos, in.steps[size_t(fa.at_step)].start_pos + fa.at / row_width);
  expect_error([&] { diff_live(in, "", "fault.rsf_twice", false, -1, IntRanges::parse("38", "--positions")); },
               "--positions: position 38 is beyond the 38 positions");
  // Recorded traces: the rows they kept are what --positions can ask for.
  const auto ref = load_model(kTiny, ""), bad = load_model(kTiny, "fault.rsf_twice");
  const TapFilter f = TapFilter::parse("", "", "", "0-3,33"), f2 = TapFilter::parse("", "", "", "0-3");
  const fs::path dir = fs::temp_directory_path() / fmt::format("plumb_toolkit_pos_{}", ::getpid());
  fs::create_directories(dir);
  write_trace(run_trace(*ref, in, "", &f), (dir / "a.safetensors").string());
  write_trace(run_trace(*bad, in, "fault.rsf_twice", &f), (dir / "b.safetensors").string());
  DiffOptions o;
  o.trace_a = (dir / "a.safetensors").string(), o.trace_b = (dir / "b.safetensors").string();
  o.positions = IntRanges::parse("33", "--positions");
  const DiffReport tr = run_diff(o);
  EXPECT_EQ(tr.first.tap, "L0.ffn.routed");
  EXPECT_EQ(tr.first.step_name, "s3");
  EXPECT_EQ(tr.row("L0.ffn.routed")->f.at_pos, 33);
  // Trace B must hold the rows too.
  write_trace(run_trace(*bad, in, "fault.rsf_twice", &f2), (dir / "b2.safetensors").string());
  o.trace_b = (dir / "b2.safetensors").string();
  expect_error([&] { run_diff(o); }, "b2.safetensors holds no row of position 33 (it holds 4 rows, of positions 0-3)");
  o.trace_b = (dir / "b.safetensors").string();
  o.positions = IntRanges::parse("10-20", "--positions");
  expect_error([&] { run_diff(o); }, "holds no row of positions 10-20 (it holds 5 rows, of positions 0-3,33)");
  fs::remove_all(dir);
}

TEST(ToolkitBisect, FindsThePlantedFault) {
  BisectOptions o;
  o.input = input_from_fixture(kTiny);
  o.patches = split_patch_list("moe.rsf_in_topk,moe.rsf_on_output,moe.weight_before_down,mhc.bf16_mix,router.bf16,"
                               "numerics.official,fault.rsf_twice");
  o.verbose = false;
  const BisectResult r = bisect(o);
  ASSERT_TRUE(r.full_diverges);
  ASSERT_EQ(r.culprits.size(), 1u);
  EXPECT_EQ(r.culprits[0].patches, std::vector<std::string>{"fault.rsf_twice"});
  EXPECT_EQ(r.culprits[0].first.tap, "L0.ffn.routed");
  EXPECT_NE(r.culprits[0].diagnosis.find("applied twice"), std::string::npos);
}

TEST(ToolkitKld, ReferenceAgainstItselfIsExactlyZero) {
  const RunInput in = input_from_fixture(kTiny);
  const KldReport r = kld_live(in, "", "");
  ASSERT_EQ(r.kld.size(), 38u);
  ASSERT_EQ(r.same_top.size(), 38u);
  ASSERT_EQ(r.dp_top.size(), 38u);
  for (double k : r.kld) EXPECT_EQ(k, 0.0);
  for (char s : r.same_top) EXPECT_TRUE(s);
  for (double d : r.dp_top) EXPECT_EQ(d, 0.0);
  EXPECT_EQ(mean_unc(r.kld).mean, 0.0);
  // Saved top-k file against the same configuration: also exactly zero.
  const std::string path = (fs::temp_directory_path() / fmt::format("plumb_kld_{}.safetensors", ::getpid())).string();
  save_kld_ref(in, "", path, 16);
  const KldReport s = kld_against_ref(path, "", "", &in);
  fs::remove(path);
  ASSERT_EQ(s.kld.size(), 38u);
  ASSERT_EQ(s.same_top.size(), 38u);
  for (double k : s.kld) EXPECT_EQ(k, 0.0);
  for (char t : s.same_top) EXPECT_TRUE(t);
}

// How print_kld shows a KL value: small ones in scientific notation, so that 1e-9 and 1e-6 differ on screen.
TEST(ToolkitKld, SmallValuesKeepSignificantDigits) {
  EXPECT_EQ(plumb::toolkit::format_kl(0.0), "0.000000");
  EXPECT_EQ(plumb::toolkit::format_kl(-0.0), "0.000000");
  EXPECT_EQ(plumb::toolkit::format_kl(1e-9), "1.000e-09");
  EXPECT_EQ(plumb::toolkit::format_kl(1.8974e-7), "1.897e-07");
  EXPECT_EQ(plumb::toolkit::format_kl(-1.21e-14), "-1.210e-14");  // a rounding below 0, shown as it is
  EXPECT_EQ(plumb::toolkit::format_kl(0.002737), "0.002737");
  EXPECT_EQ(plumb::toolkit::format_kl(0.174771), "0.174771");
  // The maximum's position (the first of equal ones; NaN never, infinity first of all).
  KldReport r;
  EXPECT_EQ(max_position(r), -1);
  r.kld = {0.1, 2.0, NAN, 2.0};
  EXPECT_EQ(max_position(r), 1);
  r.kld.push_back(INFINITY);
  EXPECT_EQ(max_position(r), 4);
}

// A corrupt or foreign --ref file is refused by name before anything indexes with it (read_kld_ref): an id outside
// the vocabulary used to index B's log-probabilities, a 1-D topk.ids read a dimension it does not have, a vocab that
// is not a number threw std::invalid_argument and a step of another JSON type nlohmann's type_error; a step's n or
// start_pos that is not an integer within the tokens is refused as a malformed step.
// B's NaN rows give infinite KL values: the percentiles between two of them are infinite, not NaN (0 x (inf - inf)),
// and an infinite mean has no uncertainty.
TEST(ToolkitKld, InfiniteValuesKeepTheirPercentiles) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(percentile({0.0, inf, inf, inf}, 0.5), inf);
  EXPECT_EQ(percentile({0.0, 1.0, inf}, 0.75), inf);
  EXPECT_EQ(percentile({0.0, 1.0, 2.0}, 0.25), 0.5);
  std::vector<double> v(12, inf);
  const MeanUnc m = mean_unc(v);
  EXPECT_EQ(m.mean, inf);
  EXPECT_FALSE(m.has_unc);
  EXPECT_EQ(m.n, 12u);
  EXPECT_EQ(shell_quote("models/tiny"), "models/tiny");
  EXPECT_EQ(shell_quote(""), "''");
  EXPECT_EQ(shell_quote("my file's.txt"), "'my file'\\''s.txt'");
}

TEST(ToolkitKld, CorruptReferenceFilesAreRefused) {
  const std::string path = (fs::temp_directory_path() / fmt::format("plumb_kldbad_{}.safetensors", ::getpid())).string();
  const std::string steps = R"([{"name":"s0","kind":"prefill","start_pos":0,"n":2}])";
  struct Case {
    const char* what;
    IndexTensor ids;
    std::string vocab, steps;
    const char* expect;
  };
  const Case cases[] = {
      {"id outside the vocabulary", IndexTensor({2, 2}, {0, 1, 2, 300}), "256", steps, "outside the vocabulary"},
      {"1-D ids", IndexTensor({4}, {0, 1, 2, 3}), "256", steps, "topk.ids"},
      {"vocab not a number", IndexTensor({2, 2}, {0, 1, 2, 3}), "lots", steps, "'vocab'"},
      {"step not an object", IndexTensor({2, 2}, {0, 1, 2, 3}), "256", "[3]", "malformed step"},
      {"steps short of the tokens", IndexTensor({2, 2}, {0, 1, 2, 3}), "256",
       R"([{"name":"s0","kind":"prefill","start_pos":0,"n":1}])", "cover 1 of its 2"},
      // Integers through json_int: a float, one above INT64_MAX (get<int64_t> read it as -1) and one past the tokens.
      {"n a float", IndexTensor({2, 2}, {0, 1, 2, 3}), "256", R"([{"name":"s0","start_pos":0,"n":2.0}])", "malformed step"},
      {"n above INT64_MAX", IndexTensor({2, 2}, {0, 1, 2, 3}), "256", R"([{"name":"s0","start_pos":0,"n":18446744073709551615}])",
       "malformed step"},
      {"start_pos past the tokens", IndexTensor({2, 2}, {0, 1, 2, 3}), "256", R"([{"name":"s0","start_pos":1e300,"n":2}])",
       "malformed step"},
  };
  for (const Case& c : cases) {
    plumb::write_safetensors(path,
                             {plumb::owned_i64("tokens", IndexTensor({2}, {5, 6})), plumb::owned_i64("topk.ids", c.ids),
                              plumb::owned_f32("topk.logprobs", Tensor({2, 2}, -1.0f)), plumb::owned_f32("next.logprob", Tensor({2}, -1.0f))},
                             {{"format", "plumb-kld-ref/1"}, {"patches", ""}, {"model", "m"}, {"source", "s"},
                              {"vocab", c.vocab}, {"topk", "2"}, {"steps", c.steps}});
    try {
      (void)plumb::toolkit::read_kld_ref(path);
      ADD_FAILURE() << c.what << ": accepted";
    } catch (const plumb::Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.expect), std::string::npos) << c.what << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << c.what << ": the message names the file";
    }
  }
  fs::remove(path);
}

TEST(ToolkitKld, FaultDivergesAndStatisticsFollowLlamaCpp) {
  const RunInput in = input_from_fixture(kTiny);
  const KldReport r = kld_live(in, "", "fault.rsf_twice");
  const MeanUnc m = mean_unc(r.kld);
  ASSERT_TRUE(m.has_unc);
  // The mean and the uncertainty formula sqrt((S2/N - mean^2) / (N - 1)), both summed here.
  double s1 = 0, s2 = 0;
  for (double k : r.kld) s1 += k, s2 += k * k;
  const double n = double(r.kld.size()), mean = s1 / n;
  EXPECT_GT(mean, 1e-3);
  EXPECT_DOUBLE_EQ(m.mean, mean);
  EXPECT_NEAR(m.unc, std::sqrt((s2 / n - mean * mean) / (n - 1)), 1e-15);
  EXPECT_EQ(percentile({1, 2, 3, 4}, 0.5), 2.5);  // linear interpolation
  EXPECT_EQ(percentile({1, 2, 3, 4}, 1.0), 4.0);
  EXPECT_FALSE(mean_unc({1, 2, 3}).has_unc);       // N <= 10: no uncertainty, as llama.cpp
}

}  // namespace
