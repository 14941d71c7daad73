// KV compressor (HCA plain windows, CSA overlapping windows) and the lightning indexer's causal top-k
// (src/model/compressor.h, indexer.h). Entries are checked against a naive double transcription of spec 5.5;
// the indexer against spec 5.6 (fp32 reference numerics: no Hadamard / FP4 simulation).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "model/compressor.h"
#include "model/indexer.h"
#include "model/options.h"
#include "model_test_util.h"

namespace {

using plumb::CompressorState;
using plumb::CompressorWeights;
using plumb::Tensor;
using plumb_test::matvec;

constexpr double kEps = 1e-6;
constexpr double kTheta = 10000.0;

// Rotates the trailing rd values of v (interleaved pairs) by pos * theta^(-2i/rd), in double.
void naive_rope(double* tail, int rd, double pos) {
  for (int i = 0; i < rd / 2; ++i) {
    const double phi = pos * std::pow(kTheta, -2.0 * i / rd);
    const double a = tail[2 * i], b = tail[2 * i + 1];
    tail[2 * i] = a * std::cos(phi) - b * std::sin(phi);
    tail[2 * i + 1] = a * std::sin(phi) + b * std::cos(phi);
  }
}

class ModelCompressor : public ::testing::Test {
 protected:
  static constexpr int D = 3, C = 8, RD = 4, M = 4;

  void build(bool overlap) {
    overlap_ = overlap;
    const int width = overlap ? 2 * C : C;
    plumb_test::Rng rng(overlap ? 31 : 32);
    wkv_ = rng.vec(size_t(width * D));
    wgate_ = rng.vec(size_t(width * D), -2.0f, 2.0f);
    ck_ = plumb_test::write_checkpoint(
        dir_, {plumb_test::f32("c.wkv.weight", {width, D}, wkv_), plumb_test::f32("c.wgate.weight", {width, D}, wgate_)});
    w_.wkv = plumb::Matrix::bind(ck_, "c.wkv.weight", width, D);
    w_.wgate = plumb::Matrix::bind(ck_, "c.wgate.weight", width, D);
    w_.ape = rng.tensor({M, width});
    w_.norm = rng.tensor({C}, 0.5f, 1.5f);
    w_.rate = M;
    w_.dim = C;
    w_.overlap = overlap;
    x_ = rng.tensor({13, D}, -1.5f, 1.5f);
  }

  // Entry w from rows x_[0 .. (w+1)M), spec 5.5.
  std::vector<double> naive_entry(int w) const {
    const int width = overlap_ ? 2 * C : C;
    auto K = [&](int j) { return matvec(wkv_, width, D, std::vector<double>(x_.row(j), x_.row(j) + D).data()); };
    auto Z = [&](int j) {
      auto z = matvec(wgate_, width, D, std::vector<double>(x_.row(j), x_.row(j) + D).data());
      for (int i = 0; i < width; ++i) z[size_t(i)] += w_.ape[(j % M) * width + i];
      return z;
    };
    std::vector<double> e(C);
    for (int ch = 0; ch < C; ++ch) {
      std::vector<double> z, k;
      if (overlap_ && w > 0)  // window w-1's first-half series
        for (int j = (w - 1) * M; j < w * M; ++j) z.push_back(Z(j)[size_t(ch)]), k.push_back(K(j)[size_t(ch)]);
      const int off = overlap_ ? C : 0;  // window w: second half (CSA) or the only half (HCA)
      for (int j = w * M; j < (w + 1) * M; ++j) z.push_back(Z(j)[size_t(off + ch)]), k.push_back(K(j)[size_t(off + ch)]);
      const double mx = *std::max_element(z.begin(), z.end());
      double s = 0, acc = 0;
      for (size_t i = 0; i < z.size(); ++i) s += std::exp(z[i] - mx);
      for (size_t i = 0; i < z.size(); ++i) acc += std::exp(z[i] - mx) / s * k[i];
      e[size_t(ch)] = acc;
    }
    double ss = 0;
    for (double v : e) ss += v * v;
    const double r = 1 / std::sqrt(ss / C + kEps);
    for (int ch = 0; ch < C; ++ch) e[size_t(ch)] *= r * w_.norm[ch];
    naive_rope(e.data() + (C - RD), RD, double(w * M));
    return e;
  }

  // Feeds x_'s first `rows` rows in chunks of `chunk` (0 = all at once).
  CompressorState feed(int rows, int chunk) const {
    CompressorState st;
    const plumb::ops::Rope rope(rope_cfg(), RD);
    const plumb::Numerics nm{plumb::ModelOptions{}};
    int done = 0;
    while (done < rows) {
      const int n = chunk == 0 ? rows : std::min(chunk, rows - done);
      Tensor part({n, D}, std::vector<float>(x_.row(done), x_.row(done) + n * D));
      plumb::compressor_step(w_, rope, kEps, part, st, nm, /*rotate=*/false);
      done += n;
    }
    return st;
  }

  static plumb::RopeConfig rope_cfg() {
    plumb::RopeConfig rc;
    rc.theta = kTheta;
    return rc;
  }

  void check_entries(const CompressorState& st, int expect_entries) const {
    ASSERT_EQ(st.n_entries, expect_entries);
    ASSERT_EQ(st.entries.size(), size_t(expect_entries * C));
    for (int w = 0; w < expect_entries; ++w) {
      const auto ref = naive_entry(w);
      EXPECT_LT(plumb_test::rel_err(st.entries.data() + w * C, ref.data(), C), 1e-5) << "entry " << w;
    }
  }

  plumb_test::TempDir dir_;
  plumb::Checkpoint ck_;
  CompressorWeights w_;
  std::vector<float> wkv_, wgate_;
  Tensor x_;
  bool overlap_ = false;
};

TEST_F(ModelCompressor, HcaEntriesArePerChannelSoftmaxPoolsNormedAndRotatedAtWindowStart) {
  build(/*overlap=*/false);
  const auto st = feed(9, 0);  // two full windows of 4 and one pending row
  check_entries(st, 2);
  EXPECT_EQ(st.pending, 1);
}

TEST_F(ModelCompressor, CsaFirstWindowHasNoPreviousSlotsAndLaterWindowsMixThePreviousFirstHalf) {
  build(/*overlap=*/true);
  const auto st = feed(13, 0);  // three full windows
  check_entries(st, 3);
  EXPECT_EQ(st.pending, 1);
  EXPECT_TRUE(st.has_prev);
}

TEST_F(ModelCompressor, ChunkingDoesNotChangeTheEntries) {
  for (bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "CSA" : "HCA");
    build(overlap);
    const auto all = feed(13, 0);
    for (int chunk : {1, 3, 5}) {
      const auto part = feed(13, chunk);
      ASSERT_EQ(part.n_entries, all.n_entries) << "chunk " << chunk;
      EXPECT_EQ(part.pending, all.pending);
      EXPECT_LT(plumb_test::rel_err(part.entries, all.entries), 1e-6) << "chunk " << chunk;
    }
    check_entries(all, 3);
  }
}

TEST_F(ModelCompressor, EmitsExactlyWhenAWindowCompletes) {
  build(/*overlap=*/true);
  CompressorState st;
  const plumb::ops::Rope rope(rope_cfg(), RD);
  const plumb::Numerics nm{plumb::ModelOptions{}};
  for (int p = 0; p < 13; ++p) {
    Tensor row({1, D}, std::vector<float>(x_.row(p), x_.row(p) + D));
    const int64_t emitted = plumb::compressor_step(w_, rope, kEps, row, st, nm, false);
    EXPECT_EQ(emitted, (p + 1) % M == 0 ? 1 : 0) << "position " << p;
    EXPECT_EQ(st.n_entries, (p + 1) / M);
  }
}

// ---------------------------------------------------------------- indexer

class ModelIndexer : public ::testing::Test {
 protected:
  static constexpr int D = 3, QL = 5, NH = 2, DH = 8, RD = 4, M = 4, NE = 5;

  void SetUp() override {
    plumb_test::Rng rng(41);
    wq_ = rng.vec(size_t(NH * DH * QL));
    wp_ = rng.vec(size_t(NH * D));
    ck_ = plumb_test::write_checkpoint(
        dir_, {plumb_test::f32("i.wq_b.weight", {NH * DH, QL}, wq_), plumb_test::f32("i.weights_proj.weight", {NH, D}, wp_)});
    w_.wq_b = plumb::Matrix::bind(ck_, "i.wq_b.weight", NH * DH, QL);
    w_.weights_proj = plumb::Matrix::bind(ck_, "i.weights_proj.weight", NH, D);
    w_.comp.rate = M;
    w_.comp.dim = DH;
    w_.comp.overlap = true;
    c_.index_heads = NH;
    c_.index_head_dim = DH;
    c_.index_topk = 3;
    keys_.entries = rng.vec(size_t(NE * DH));
    keys_.n_entries = NE;
    x_ = rng.tensor({24, D});
    qr_ = rng.tensor({24, QL});
  }

  double naive_score(int t, int64_t p, int e) const {
    std::vector<double> qr(qr_.row(t), qr_.row(t) + QL), x(x_.row(t), x_.row(t) + D);
    auto q = matvec(wq_, NH * DH, QL, qr.data());
    const auto hw = matvec(wp_, NH, D, x.data());
    double s = 0;
    for (int h = 0; h < NH; ++h) {
      naive_rope(q.data() + h * DH + (DH - RD), RD, double(p));
      double dot = 0;
      for (int i = 0; i < DH; ++i) dot += q[size_t(h * DH + i)] * keys_.entries[size_t(e * DH + i)];
      s += std::max(dot, 0.0) / std::sqrt(double(DH)) * hw[size_t(h)] / std::sqrt(double(NH));
    }
    return s;
  }

  plumb::IndexerResult select(int64_t pos0, int n) const {
    const plumb::ops::Rope rope([] {
      plumb::RopeConfig rc;
      rc.theta = kTheta;
      return rc;
    }(), RD);
    Tensor x({n, D}, std::vector<float>(x_.row(0), x_.row(0) + n * D));
    Tensor qr({n, QL}, std::vector<float>(qr_.row(0), qr_.row(0) + n * QL));
    return plumb::indexer_select(w_, c_, rope, x, qr, pos0, keys_, plumb::Numerics{plumb::ModelOptions{}});
  }

  // Checks one call: visibility mask, scores, top-k width and picks.
  void check(int64_t pos0, int n) {
    const auto r = select(pos0, n);
    const int64_t k = std::min<int64_t>(c_.index_topk, NE);
    ASSERT_EQ(r.scores.shape, (plumb::Shape{n, NE}));
    ASSERT_EQ(r.topk.shape, (plumb::Shape{n, k}));
    for (int t = 0; t < n; ++t) {
      const int64_t p = pos0 + t, visible = (p + 1) / M;  // entry w visible iff w < floor((p+1)/m)
      SCOPED_TRACE("query position " + std::to_string(p));
      std::vector<double> ref(NE);
      for (int e = 0; e < NE; ++e) {
        const float s = r.scores[t * NE + e];
        if (e >= visible) {
          EXPECT_TRUE(std::isinf(s) && s < 0) << "entry " << e << " must be masked";
          continue;
        }
        ref[size_t(e)] = naive_score(t, p, e);
        EXPECT_NEAR(s, ref[size_t(e)], 1e-5 * std::max(1.0, std::fabs(ref[size_t(e)]))) << "entry " << e;
      }
      const int64_t n_valid = std::min<int64_t>(k, std::min<int64_t>(visible, NE));
      std::vector<int64_t> picked;
      int64_t n_invalid = 0;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = r.topk[t * k + j];
        if (e == -1) {
          ++n_invalid;
          continue;
        }
        EXPECT_GE(e, 0);
        EXPECT_LT(e, visible) << "an invisible entry was picked";
        picked.push_back(e);
      }
      EXPECT_EQ(int64_t(picked.size()), n_valid);
      EXPECT_EQ(n_invalid, k - n_valid);
      std::sort(picked.begin(), picked.end());
      EXPECT_TRUE(std::adjacent_find(picked.begin(), picked.end()) == picked.end()) << "duplicate pick";
      // The picks are the best visible entries: no unpicked visible entry scores higher than a picked one.
      for (int64_t e = 0; e < std::min<int64_t>(visible, NE); ++e) {
        if (std::binary_search(picked.begin(), picked.end(), e)) continue;
        for (auto pe : picked) EXPECT_LE(ref[size_t(e)], ref[size_t(pe)] + 1e-6) << "entry " << e << " beats pick " << pe;
      }
    }
  }

  plumb_test::TempDir dir_;
  plumb::Checkpoint ck_;
  plumb::IndexerWeights w_;
  plumb::ModelConfig c_;
  CompressorState keys_;
  std::vector<float> wq_, wp_;
  Tensor x_, qr_;
};

TEST_F(ModelIndexer, CausalVisibilityAndTopKAcrossAPrefill) {
  check(0, 24);  // visible grows 0, 0, 0, 1, 1, 1, 1, 2, ... up to all 5 entries
}

TEST_F(ModelIndexer, DecodePositionsUseAbsolutePositions) {
  check(10, 1);  // floor(11 / 4) = 2 visible
  check(11, 1);  // floor(12 / 4) = 3 visible
  check(2, 1);   // none visible: every pick is -1
}

TEST_F(ModelIndexer, TopKWidthIsMinOfIndexTopkAndEntries) {
  c_.index_topk = 8;  // more than the 5 entries
  check(0, 24);
  c_.index_topk = 1;
  check(0, 24);
  keys_.n_entries = 0;
  keys_.entries.clear();
  const auto r = select(0, 4);
  EXPECT_EQ(r.topk.shape, (plumb::Shape{4, 0}));
  EXPECT_EQ(r.scores.shape, (plumb::Shape{4, 0}));
}

}  // namespace
