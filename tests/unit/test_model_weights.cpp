// Weight binding (src/model/weights.h): missing and mis-shaped tensors are errors naming the tensor; FP8 E4M3
// block dequantization (E8M0 or F32 scales, ragged last blocks) and packed FP4 E2M1 experts against naive
// decoders written here from the bit layouts of spec section 11.2.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/model.h"
#include "model/weights.h"
#include "patches/registry.h"
#include "model_test_util.h"
#include "tools/golden_fixture.h"

namespace {

using plumb::Checkpoint;
using plumb::DType;
using plumb::Matrix;
using plumb::OwnedTensor;
using ::testing::HasSubstr;

// e4m3fn: sign bit 7, exponent bits 6..3 (bias 7), mantissa bits 2..0; exponent 0 = subnormal; 0x7F/0xFF NaN.
double naive_e4m3(uint8_t b) {
  if ((b & 0x7F) == 0x7F) return NAN;
  const int e = (b >> 3) & 0xF, m = b & 7;
  const double mag = e == 0 ? (m / 8.0) * std::pow(2.0, -6) : (1 + m / 8.0) * std::pow(2.0, e - 7);
  return (b & 0x80) ? -mag : mag;
}
// e8m0: 2^(b - 127), 0xFF NaN.
double naive_e8m0(uint8_t b) { return b == 0xFF ? NAN : std::pow(2.0, int(b) - 127); }
// e2m1 codes 0..15 (the spec's table).
const double kFp4[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// got == want, treating NaN as equal to NaN.
::testing::AssertionResult same_value(float got, double want) {
  if (std::isnan(want) ? std::isnan(got) : double(got) == double(float(want))) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << got << " vs " << want;
}

TEST(ModelWeightsFp8, BlockDequantWithE8M0ScalesAndRaggedLastBlocks) {
  const int R = 200, C = 300, SR = 2, SC = 3;  // ceil(200/128) x ceil(300/128): last blocks are 72 x 44
  plumb_test::Rng rng(51);
  std::vector<uint8_t> w(size_t(R * C)), s(size_t(SR * SC));
  for (auto& b : w) b = uint8_t(rng.bits());
  for (int i = 0; i < 256; ++i) w[size_t(i)] = uint8_t(i);  // every code at least once (incl. both NaNs)
  const uint8_t scales[SR * SC] = {127, 120, 133, 100, 140, 0};  // 2^0, 2^-7, 2^6, 2^-27, 2^13, 2^-127
  std::memcpy(s.data(), scales, s.size());
  plumb_test::TempDir dir;
  const Checkpoint ck = plumb_test::write_checkpoint(dir, {plumb_test::raw("m.weight", DType::F8_E4M3, {R, C}, w),
                                                           plumb_test::raw("m.scale", DType::F8_E8M0, {SR, SC}, s)});
  const Matrix m = Matrix::bind(ck, "m.weight", R, C);
  EXPECT_EQ(m.layout(), Matrix::Layout::FP8Block);
  std::vector<float> row(static_cast<size_t>(C));
  int64_t checked = 0;
  for (int r = 0; r < R; ++r) {
    m.row(r, row.data());
    for (int c = 0; c < C; ++c) {
      const double want = naive_e4m3(w[size_t(r * C + c)]) * naive_e8m0(s[size_t((r / 128) * SC + c / 128)]);
      ASSERT_TRUE(same_value(row[size_t(c)], want)) << "row " << r << " col " << c;
      ++checked;
    }
  }
  EXPECT_EQ(checked, R * C);
}

TEST(ModelWeightsFp8, BlockDequantWithF32Scales) {
  const int R = 130, C = 129;
  plumb_test::Rng rng(52);
  std::vector<uint8_t> w(size_t(R * C));
  for (auto& b : w) b = uint8_t(rng.bits() & 0x7E);  // positive, never NaN
  const std::vector<float> s = {0.37f, 1.5f, 2.0f, -0.25f};
  plumb_test::TempDir dir;
  const Checkpoint ck = plumb_test::write_checkpoint(
      dir, {plumb_test::raw("m.weight", DType::F8_E4M3, {R, C}, w), plumb_test::raw("m.scale", DType::F32, {2, 2}, f32_bytes(s))});
  const Matrix m = Matrix::bind(ck, "m.weight", R, C);
  std::vector<float> row(static_cast<size_t>(C));
  for (int r : {0, 127, 128, 129}) {
    m.row(r, row.data());
    for (int c = 0; c < C; ++c)
      ASSERT_TRUE(same_value(row[size_t(c)], naive_e4m3(w[size_t(r * C + c)]) * s[size_t((r / 128) * 2 + c / 128)]))
          << "row " << r << " col " << c;
  }
}

TEST(ModelWeightsFp4, PackedE2M1LowNibbleIsTheEvenColumn) {
  const int R = 5, C = 64;
  plumb_test::Rng rng(53);
  std::vector<uint8_t> w(size_t(R * C / 2)), s(size_t(R * C / 32));
  for (auto& b : w) b = uint8_t(rng.bits());
  for (auto& b : s) b = uint8_t(118 + rng.bits() % 20);
  w[0] = 0x71;  // row 0: column 0 = code 1 (0.5), column 1 = code 7 (6)
  for (DType dt : {DType::I8, DType::U8}) {
    plumb_test::TempDir dir;
    const Checkpoint ck = plumb_test::write_checkpoint(
        dir, {plumb_test::raw("e.weight", dt, {R, C / 2}, w), plumb_test::raw("e.scale", DType::F8_E8M0, {R, C / 32}, s)});
    const Matrix m = Matrix::bind(ck, "e.weight", R, C);
    EXPECT_EQ(m.layout(), Matrix::Layout::FP4Group);
    std::vector<float> row(static_cast<size_t>(C));
    for (int r = 0; r < R; ++r) {
      m.row(r, row.data());
      for (int c = 0; c < C; ++c) {
        const uint8_t byte = w[size_t(r * (C / 2) + c / 2)];
        const int code = c % 2 == 0 ? (byte & 0x0F) : (byte >> 4);
        const double want = kFp4[code] * naive_e8m0(s[size_t(r * (C / 32) + c / 32)]);
        ASSERT_TRUE(same_value(row[size_t(c)], want)) << "row " << r << " col " << c;
      }
    }
    m.row(0, row.data());
    const double s0 = naive_e8m0(s[0]);
    EXPECT_EQ(row[0], float(0.5 * s0));
    EXPECT_EQ(row[1], float(6 * s0));
  }
}

// ---------------------------------------------------------------- errors naming the tensor

template <class F>
void expect_error_naming(F&& f, const std::vector<std::string>& parts, const char* what) {
  try {
    f();
    ADD_FAILURE() << what << ": accepted";
  } catch (const plumb::Error& e) {
    for (const auto& p : parts) EXPECT_THAT(e.what(), HasSubstr(p)) << what;
  }
}

TEST(ModelWeightsBind, MissingAndMisShapedMatricesAreNamed) {
  plumb_test::TempDir dir;
  const Checkpoint ck = plumb_test::write_checkpoint(
      dir, {plumb_test::f32("a.weight", {3, 4}, std::vector<float>(12, 1.0f)),
            plumb_test::raw("q.weight", DType::F8_E4M3, {3, 4}, std::vector<uint8_t>(12, 0x38)),
            plumb_test::raw("q.scale", DType::F8_E8M0, {2, 1}, {127, 127}),
            plumb_test::raw("n.weight", DType::F8_E4M3, {3, 4}, std::vector<uint8_t>(12, 0x38)),
            plumb_test::raw("p.weight", DType::I8, {3, 16}, std::vector<uint8_t>(48, 0)),
            plumb_test::raw("p.scale", DType::F8_E8M0, {3, 2}, std::vector<uint8_t>(6, 127)),
            plumb_test::raw("i.weight", DType::I32, {3, 4}, std::vector<uint8_t>(48, 0))});
  expect_error_naming([&] { Matrix::bind(ck, "b.weight", 3, 4); }, {"missing tensor b.weight"}, "missing");
  expect_error_naming([&] { Matrix::bind(ck, "a.weight", 4, 3); }, {"a.weight", "[3, 4]", "[4, 3]"}, "mis-shaped plain");
  expect_error_naming([&] { Matrix::bind(ck, "q.weight", 3, 4); }, {"q.scale"}, "mis-shaped FP8 scale");
  expect_error_naming([&] { Matrix::bind(ck, "n.weight", 3, 4); }, {"n.scale"}, "FP8 without a scale");
  expect_error_naming([&] { Matrix::bind(ck, "p.weight", 3, 64); }, {"p.weight", "[3, 16]"}, "packed FP4 of the wrong width");
  expect_error_naming([&] { Matrix::bind(ck, "p.weight", 3, 48); }, {"p.weight"}, "FP4 width not a multiple of 32");
  expect_error_naming([&] { Matrix::bind(ck, "p.weight", 3, 32); }, {"p.scale"}, "FP4 scale of the wrong shape");
  expect_error_naming([&] { Matrix::bind(ck, "i.weight", 3, 4); }, {"i.weight", "I32"}, "not a weight dtype");
  EXPECT_NO_THROW(Matrix::bind(ck, "a.weight", 3, 4));
}

// The committed tiny fixture checkpoint, copied tensor by tensor with one edit.
class ModelWeightsFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = std::string(PLUMB_TEST_DATA) + "/golden/tiny";
    cfg_ = plumb::ModelConfig::load(dir + "/config.json");
    src_ = Checkpoint::open(dir);
  }

  // All tensors, with `edit` applied to each (return false to drop it), written and reopened.
  template <class Edit>
  Checkpoint copy(Edit&& edit) {
    std::vector<OwnedTensor> ts;
    for (const auto& name : src_.names()) {
      const auto& v = src_.get(name);
      OwnedTensor t{name, v.dtype, v.shape, std::vector<uint8_t>(v.data, v.data + v.nbytes)};
      if (edit(t)) ts.push_back(std::move(t));
    }
    return plumb_test::write_checkpoint(dir_, ts, "copy" + std::to_string(n_++) + ".safetensors");
  }

  plumb::ModelConfig cfg_;
  Checkpoint src_;
  plumb_test::TempDir dir_;
  int n_ = 0;
};

TEST_F(ModelWeightsFixture, TheUneditedCopyBinds) {
  EXPECT_NO_THROW(plumb::ModelWeights::bind(copy([](OwnedTensor&) { return true; }), cfg_));
}

// Checkpoint::found_bytes is what the CUDA backend checks against the GPU's free memory before uploading: the
// tensors the model bound, each once, and not a tensor it has no use for (an MTP module's, here a stand-in).
TEST_F(ModelWeightsFixture, FoundBytesAreWhatTheModelBound) {
  const Checkpoint plain = copy([](OwnedTensor&) { return true; });
  plumb::ModelWeights::bind(plain, cfg_);
  const uint64_t used = plain.found_bytes();
  uint64_t all = 0;
  for (const auto& name : src_.names()) all += src_.get(name).nbytes;
  EXPECT_GT(used, 0u);
  EXPECT_LE(used, all);
  std::vector<OwnedTensor> ts;  // the same tensors and one the model never binds, 1 MB
  for (const auto& name : src_.names()) {
    const auto& v = src_.get(name);
    ts.push_back(OwnedTensor{name, v.dtype, v.shape, std::vector<uint8_t>(v.data, v.data + v.nbytes)});
  }
  ts.push_back(OwnedTensor{"mtp.0.extra.weight", plumb::DType::BF16, {512, 1024}, std::vector<uint8_t>(1 << 20, 0)});
  const Checkpoint with_extra = plumb_test::write_checkpoint(dir_, ts, "extra.safetensors");
  plumb::ModelWeights::bind(with_extra, cfg_);
  EXPECT_EQ(with_extra.found_bytes(), used);
  plumb::ModelWeights::bind(with_extra, cfg_);  // binding again counts nothing twice
  EXPECT_EQ(with_extra.found_bytes(), used);
}

TEST_F(ModelWeightsFixture, AModelPrefixIsAccepted) {
  EXPECT_NO_THROW(plumb::ModelWeights::bind(copy([](OwnedTensor& t) {
                                              t.name = "model." + t.name;
                                              return true;
                                            }),
                                            cfg_));
}

TEST_F(ModelWeightsFixture, AMissingTensorIsNamed) {
  for (const std::string gone : {"layers.2.attn.indexer.compressor.ape", "layers.3.ffn.experts.5.w2.weight", "hc_head_fn",
                                 "layers.0.ffn.gate.tid2eid", "layers.2.ffn.gate.bias", "layers.1.attn.attn_sink"}) {
    const Checkpoint ck = copy([&](OwnedTensor& t) { return t.name != gone; });
    expect_error_naming([&] { plumb::ModelWeights::bind(ck, cfg_); }, {"missing tensor " + gone}, gone.c_str());
  }
}

TEST_F(ModelWeightsFixture, AMisShapedTensorIsNamed) {
  // Drop the last row of each victim (keeps the file valid, breaks the expected shape).
  for (const std::string bad : {"layers.3.ffn.gate.bias", "layers.1.attn.wq_b.weight", "layers.2.hc_ffn_fn",
                                "layers.0.ffn.gate.tid2eid", "norm.weight"}) {
    const Checkpoint ck = copy([&](OwnedTensor& t) {
      if (t.name == bad) {
        const size_t row_bytes = t.bytes.size() / size_t(t.shape[0]);
        t.shape[0] -= 1;
        t.bytes.erase(t.bytes.end() - std::ptrdiff_t(row_bytes), t.bytes.end());
      }
      return true;
    });
    expect_error_naming([&] { plumb::ModelWeights::bind(ck, cfg_); }, {bad}, bad.c_str());
  }
}

TEST_F(ModelWeightsFixture, Tid2eidOutOfRangeAndInt32Tables) {
  // An expert id >= n_routed_experts is refused naming the table.
  Checkpoint ck = copy([&](OwnedTensor& t) {
    if (t.name == "layers.1.ffn.gate.tid2eid") {
      const int64_t bad = 99;
      std::memcpy(t.bytes.data() + 8 * 5, &bad, 8);
    }
    return true;
  });
  expect_error_naming([&] { plumb::ModelWeights::bind(ck, cfg_); }, {"layers.1.ffn.gate.tid2eid", "99"}, "tid2eid range");
  // The same tables as I32 bind to the same ids.
  ck = copy([&](OwnedTensor& t) {
    if (t.name.ends_with("tid2eid")) {
      std::vector<uint8_t> b(t.bytes.size() / 2);
      for (size_t i = 0; i < b.size() / 4; ++i) {
        int64_t v;
        std::memcpy(&v, t.bytes.data() + 8 * i, 8);
        const int32_t w = int32_t(v);
        std::memcpy(b.data() + 4 * i, &w, 4);
      }
      t.dtype = DType::I32;
      t.bytes = std::move(b);
    }
    return true;
  });
  const auto a = plumb::ModelWeights::bind(ck, cfg_);
  const auto b = plumb::ModelWeights::bind(src_, cfg_);
  EXPECT_EQ(a.layers[0].moe.tid2eid.data, b.layers[0].moe.tid2eid.data);
  EXPECT_EQ(a.layers[1].moe.tid2eid.data, b.layers[1].moe.tid2eid.data);
}

// mlp_bias (transformers' shared MLP with biases): the tiny model with every layer's shared-expert biases added, b1 =
// b3 = 0 and b2 a pattern, under a config with mlp_bias true: the biases bind and the first layer's shared output
// is the bias-free model's plus b2, bit for bit (layer 0's FFN input is the same in both); numerics.official (no
// biases in the official code) gives the bias-free model's logits exactly.
TEST_F(ModelWeightsFixture, MlpBiasesBindAndShiftTheSharedOutput) {
  const int64_t D = cfg_.hidden;
  std::vector<float> b2(static_cast<size_t>(D));
  for (int64_t d = 0; d < D; ++d) b2[size_t(d)] = 0.125f * float(d % 7) - 0.375f;
  const std::string src = std::string(PLUMB_TEST_DATA) + "/golden/tiny";
  plumb_test::write_with_shared_biases(src, dir_, b2);

  const auto biased = plumb::Model::load(dir_.path().string()), plain = plumb::Model::load(src);
  const std::vector<int32_t> toks = {1, 5, 9, 2, 7};
  auto run = [&](const plumb::Model& m, plumb::TapRecorder& rec) {
    auto st = m.new_state();
    return m.forward(st, toks, &rec);
  };
  plumb::TapRecorder rb({"L0.ffn.shared"}), rp({"L0.ffn.shared"});
  const auto lb = run(*biased, rb), lp = run(*plain, rp);
  ASSERT_TRUE(rb.f32.count("L0.ffn.shared") && rp.f32.count("L0.ffn.shared"));
  const auto &sb = rb.f32["L0.ffn.shared"], &sp = rp.f32["L0.ffn.shared"];
  ASSERT_EQ(sb.shape, sp.shape);
  for (int64_t i = 0; i < sb.numel(); ++i) ASSERT_EQ(sb[i], sp[i] + b2[size_t(i % D)]) << "element " << i;
  EXPECT_NE(lb.data, lp.data) << "the biases changed nothing downstream";
  const auto off = plumb::parse_patches("numerics.official").options;
  const auto bo = plumb::Model::load(dir_.path().string(), off), po = plumb::Model::load(src, off);
  plumb::TapRecorder r1({"none"}), r2({"none"});
  EXPECT_EQ(run(*bo, r1).data, run(*po, r2).data) << "numerics.official applied the biases";
}

}  // namespace
