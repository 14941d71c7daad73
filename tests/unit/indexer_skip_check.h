// The differential test of indexer.skip_short, shared by the CPU suite (test_model_indexer_skip.cpp) and the CUDA
// suite (test_cuda_forward.cpp): the tiny fixture's model with index_topk raised to 6, so that its CSA layer (L2,
// 4 tokens per entry) may skip the indexer for chunks ending at or before position 27 (27 / 4 = 6 entries) and
// must run it from 28 on. A schedule crosses that boundary with a prefill, decode steps and a chunk after it; the
// patched model must match the reference's logits, take every visible entry in entry order while it skips, and
// take exactly the reference's top-k (order included) from the first chunk past the boundary.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "model/model.h"
#include "model_test_util.h"
#include "patches/registry.h"

namespace plumb_test {

// Records L2's indexer selection (the top-k tap) of one call.
class SelectionSink : public plumb::TapSink {
 public:
  bool wants(const std::string& name) const override { return name == "L2.attn.indexer.topk"; }
  void put(const std::string&, const plumb::Tensor&) override {}
  void put_index(const std::string&, const plumb::IndexTensor& t) override { sel = t; }
  plumb::IndexTensor sel;
};

// base: the patches both models run with (the backend's fast kernels, say); the second adds indexer.skip_short.
inline void check_indexer_skip_short(const std::string& backend, const std::string& base = "") {
  TempDir dir;
  const std::string tiny = std::string(PLUMB_TEST_DATA) + "/golden/tiny";
  std::filesystem::copy_file(tiny + "/model.safetensors", dir.file("model.safetensors"));
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(tiny + "/config.json"));
  ASSERT_EQ(cfg["layer_types"][2], "compressed_sparse_attention") << "the test expects tiny's CSA layer at L2";
  ASSERT_EQ(cfg["compress_rates"]["compressed_sparse_attention"], 4);
  constexpr int64_t kTopk = 6, kRate = 4, kLastSkipped = kTopk * kRate + kRate - 1;  // 27: a chunk may end there
  cfg["index_topk"] = kTopk;
  std::ofstream(dir.file("config.json")) << cfg.dump(2);

  const std::string with = base.empty() ? "indexer.skip_short" : base + ",indexer.skip_short";
  auto ref = plumb::Model::load(dir.path().string(), plumb::parse_patches(base).options, {}, backend);
  auto skip = plumb::Model::load(dir.path().string(), plumb::parse_patches(with).options, {}, backend);
  const int vocab = ref->config().vocab;
  // 12 tokens, 1-token steps to position 27 (the last chunk that may skip), one step at 28, then 12 tokens.
  std::vector<int> sizes = {12};
  for (int64_t p = 12; p <= kLastSkipped; ++p) sizes.push_back(1);
  sizes.push_back(1);
  sizes.push_back(12);
  auto sr = ref->new_state(), ss = skip->new_state();
  int64_t pos = 0;
  bool reordered = false;  // some skipped row where the reference's top-k order is not the entry order
  for (size_t call = 0; call < sizes.size(); ++call) {
    const int n = sizes[call];
    std::vector<int32_t> toks(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) toks[size_t(i)] = int32_t((pos + i) * 37 % vocab);
    SelectionSink tr, ts;
    const plumb::Tensor a = ref->forward(sr, toks, &tr);
    const plumb::Tensor b = skip->forward(ss, toks, &ts);
    const int64_t end = pos + n;
    const bool skipped = end <= kLastSkipped;
    // The logits: the same keys, only their order differs, and the attention's sums are fp64.
    ASSERT_EQ(a.shape, b.shape);
    double worst = 0, scale = 1;
    for (size_t i = 0; i < a.data.size(); ++i) {
      scale = std::max(scale, double(std::fabs(a.data[i])));
      worst = std::max(worst, std::fabs(double(a.data[i]) - b.data[i]));
    }
    EXPECT_LE(worst, 1e-6 * scale) << backend << " call " << call << " (positions " << pos << ".." << end - 1 << ")";
    // The selection: entry order while skipped, the reference's own top-k after.
    ASSERT_EQ(ts.sel.shape, tr.sel.shape) << "call " << call;
    const int64_t k = tr.sel.shape.at(1);
    for (int64_t t = 0; t < n; ++t) {
      const int64_t visible = std::min((pos + t + 1) / kRate, k);
      std::set<int64_t> want, got;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = tr.sel[t * k + j], f = ts.sel[t * k + j];
        if (e >= 0) want.insert(e);
        if (skipped) {
          EXPECT_EQ(f, j < visible ? j : -1) << backend << " call " << call << " row " << t << " slot " << j << ": entry order";
          reordered = reordered || (e >= 0 && e != j);
        } else {
          EXPECT_EQ(f, e) << backend << " call " << call << " row " << t << " slot " << j << ": the indexer's top-k";
        }
        if (f >= 0) got.insert(f);
      }
      EXPECT_EQ(got, want) << backend << " call " << call << " row " << t << ": the same key set";
    }
    pos = end;
  }
  EXPECT_TRUE(reordered) << "no skipped row had a top-k order other than entry order: the test would not see the patch";
}

}  // namespace plumb_test
