// hc_pre's kernels against their twins: the warp-parallel Sinkhorn (H*H <= 32) bit for bit against one device
// thread running model/hc_math.h, and both against hc_math on the host from the same mixes (within a few ulps: CUDA's
// expf is not libm's); batched tokens, the MoE combine, the norm after the mix and the fold into wo_b against the
// launches they replace; cuda.branch_flags' in-kernel wait.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>

#include <fmt/format.h>

#include "cuda/fwd_kernels.h"
#include "cuda_test_util.h"
#include "model/hc_math.h"

namespace {

using namespace plumb_cuda_test::kernels;  // (GpuTest, Rng, expect_close, expect_same_bytes too)

// fwd_hc.cu's scratch: the fp32 mixes [n, nmix] (as doubles) that the gates and the Sinkhorn read.
struct HcOut {
  std::vector<float> post, comb, col;
  std::vector<double> mixes;
  std::vector<float> X, fn;  // the inputs drawn
};

// apart: the gates left to fwd_hc_gates (HcArgs::gates_apart), as the forward runs them under cuda.streams (there
// on a stream of their own).
HcOut run_hc(int H, int iters, float mix_scale, uint32_t seed, bool serial, std::vector<float>* scale_out,
             std::vector<float>* base_out, bool apart = false) {
  const int n = 5, nmix = (2 + H) * H;
  const int64_t D = 256, hd = H * D;
  Rng rng(seed);
  const auto X = rng.floats(size_t(n * hd), -2.0f, 2.0f);
  const auto fn = rng.floats(size_t(nmix * hd), -mix_scale, mix_scale);
  *base_out = rng.floats(size_t(nmix), -1.0f, 1.0f);
  *scale_out = rng.floats(3, 0.5f, 2.0f);
  DeviceBuffer dX = to_device(X), dfn = to_device(fn), dbase = to_device(*base_out), dscale = to_device(*scale_out);
  DeviceBuffer post(size_t(n * H) * 4), comb(size_t(n * H * H) * 4), col(size_t(n * D) * 4);
  DeviceBuffer scratch(d::fwd_hc_scratch_doubles(n, H) * 8);
  d::HcArgs a;
  a.X = dX.as<float>(), a.fn = dfn.as<float>(), a.base = dbase.as<float>(), a.scale = dscale.as<float>();
  a.n = n, a.H = H, a.iters = iters, a.D = D, a.hc_eps = 1e-6f, a.rms_eps = 1e-6;
  a.post = post.as<float>(), a.comb = comb.as<float>(), a.collapsed = col.as<float>();
  a.serial_sinkhorn = serial ? 1 : 0;
  a.gates_apart = apart ? 1 : 0;
  d::fwd_hc_pre(a, scratch.as<double>(), nullptr);
  if (apart) d::fwd_hc_gates(a, scratch.as<double>(), nullptr);
  return {to_host<float>(post, size_t(n * H)), to_host<float>(comb, size_t(n * H * H)), to_host<float>(col, size_t(n * D)),
          to_host<double>(scratch, d::fwd_hc_scratch_doubles(n, H)), X, fn};
}

void check_hc(int H, int iters, float mix_scale, uint32_t seed) {
  const int n = 5, nmix = (2 + H) * H;
  std::vector<float> scale, base;
  const HcOut warp = run_hc(H, iters, mix_scale, seed, false, &scale, &base);
  const HcOut serial = run_hc(H, iters, mix_scale, seed, true, &scale, &base);
  // The gates apart (warp and one-thread Sinkhorn): the same bits as in the launch.
  for (bool ser : {false, true}) {
    const HcOut apart = run_hc(H, iters, mix_scale, seed, ser, &scale, &base, true);
    const HcOut& in = ser ? serial : warp;
    ASSERT_EQ(std::memcmp(apart.mixes.data(), in.mixes.data(), in.mixes.size() * 8), 0) << "H " << H << " apart: the mixes differ";
    ASSERT_EQ(std::memcmp(apart.col.data(), in.col.data(), in.col.size() * 4), 0) << "H " << H << " apart: the collapsed rows differ";
    ASSERT_EQ(std::memcmp(apart.post.data(), in.post.data(), in.post.size() * 4), 0) << "H " << H << " apart: post differs";
    ASSERT_EQ(std::memcmp(apart.comb.data(), in.comb.data(), in.comb.size() * 4), 0) << "H " << H << " apart: comb differs";
  }
  // (At hc_mult 4 the warp's run takes the kernel compiled for the forward's numerics alone and the serial twin the
  // general one: the mixes and the collapsed rows must be the same bits too.)
  ASSERT_EQ(std::memcmp(warp.mixes.data(), serial.mixes.data(), warp.mixes.size() * 8), 0) << "H " << H << ": the mixes differ";
  ASSERT_EQ(std::memcmp(warp.col.data(), serial.col.data(), warp.col.size() * 4), 0) << "H " << H << ": the collapsed rows differ";
  ASSERT_EQ(std::memcmp(warp.post.data(), serial.post.data(), warp.post.size() * 4), 0) << "H " << H << ": post differs";
  for (size_t i = 0; i < warp.comb.size(); ++i)
    ASSERT_EQ(std::memcmp(&warp.comb[i], &serial.comb[i], 4), 0)
        << "H " << H << " iters " << iters << " comb element " << i << ": warp " << warp.comb[i] << " one thread " << serial.comb[i];
  // The mixes themselves against the host in fp64 (x . fn[o] * rsqrt(mean(x^2) + eps)): the comparisons above and
  // below start from the GPU's own mixes, so a reduction that lost a chunk of them (hc_mult 7-8: mixes 64-79 in the
  // third) would pass them. Within fp32 rounding of the sum of |terms|.
  const int64_t hd = int64_t(warp.X.size()) / n;
  for (int t = 0; t < n; ++t) {
    const float* x = warp.X.data() + t * hd;
    double ss = 0;
    for (int64_t k = 0; k < hd; ++k) ss += double(x[k]) * x[k];
    const double r = 1.0 / std::sqrt(ss / double(hd) + 1e-6);
    for (int o = 0; o < nmix; ++o) {
      const float* f = warp.fn.data() + o * hd;
      double dot = 0, mag = 0;
      for (int64_t k = 0; k < hd; ++k) dot += double(f[k]) * x[k], mag += std::fabs(double(f[k]) * x[k]);
      ASSERT_NEAR(warp.mixes[size_t(t * nmix + o)], dot * r, 1e-5 * std::max(1.0, mag * r))
          << "H " << H << " token " << t << " mix " << o << " of " << nmix;
    }
  }
  for (int t = 0; t < n; ++t) {
    std::vector<float> mix(static_cast<size_t>(nmix));
    for (int o = 0; o < nmix; ++o) mix[size_t(o)] = float(warp.mixes[size_t(t * nmix + o)]);
    float pre[8], p[8], C[64];
    plumb::hc_math::weights(mix.data(), scale.data(), base.data(), H, 1e-6f, iters, pre, p, C);
    for (int j = 0; j < H; ++j)
      EXPECT_NEAR(p[j], warp.post[size_t(t * H + j)], 1e-6 * std::max(1.0f, std::fabs(p[j]))) << "H " << H << " token " << t << " post " << j;
    for (int i = 0; i < H * H; ++i)
      EXPECT_NEAR(C[i], warp.comb[size_t(t * H * H + i)], 1e-5 * std::max(1.0f, std::fabs(C[i])))
          << "H " << H << " token " << t << " comb[" << i / H << "][" << i % H << "]";
  }
}

TEST_F(GpuTest, HcPreWarpSinkhornMatchesSerial) {
  // H >= 6: both runs take the one-thread path (36+ > 32 lanes), so there the mixes' host check and HcMixModesMatch
  // carry the test; 7 and 8: 63 and 80 mixes (two and three chunks of the warps' reduction; at 8 the whole block in
  // phase 3).
  // (sanitizer subset: every hc_mult, 20 iterations of ordinary mixes; the one-iteration and saturated runs take the
  // same kernels)
  for (int H : {1, 2, 4, 5, 6, 7, 8})
    for (int iters : {1, 20}) {
      if (sanitizer_sizes() && iters == 1) continue;
      check_hc(H, iters, 0.05f, 100u + unsigned(H * 31 + iters));
      if (!sanitizer_sizes()) check_hc(H, iters, 2.0f, 200u + unsigned(H * 31 + iters));  // large mixes: saturated softmax rows
    }
}

// hc_pre's inputs for n tokens (random, drawn from rng in a fixed order), and runs of them: one token per launch or
// all in one, with options set on each launch's arguments. `fused`: the previous sublayer's hc_post (y) and the
// RMSNorm with its f16 copy in the launch. X is uploaded at each run (a test may edit it first).
struct HcRun {
  DeviceBuffer X, post, comb, col, col16, mix;
};
struct HcInputs {
  int n, H, nm;
  int64_t D, hd;
  bool fused;
  int head;
  std::vector<float> X;
  DeviceBuffer dfn, dbase, dscale, dy, dXp, dpp, dcp, dnw;
  HcInputs(Rng& rng, int n_, int H_, int64_t D_, bool fused_, int head_)
      : n(n_), H(H_), nm(head_ ? H_ : (2 + H_) * H_), D(D_), hd(H_ * D_), fused(fused_), head(head_) {
    const int nmix = (2 + H) * H;
    X = rng.floats(size_t(n * hd), -2.0f, 2.0f);
    const auto Xp = rng.floats(size_t(n * hd), -2.0f, 2.0f);
    const auto y = rng.floats(size_t(n * D), -1.0f, 1.0f), pp = rng.floats(size_t(n * H), 0.0f, 2.0f);
    const auto cp = rng.floats(size_t(n * H * H), 0.0f, 1.0f), nw = rng.floats(size_t(D), 0.5f, 1.5f);
    dfn = to_device(rng.floats(size_t(nmix * hd), -0.05f, 0.05f)), dbase = to_device(rng.floats(size_t(nmix), -1.0f, 1.0f));
    dscale = to_device(rng.floats(3, 0.5f, 2.0f)), dy = to_device(y), dXp = to_device(Xp), dpp = to_device(pp);
    dcp = to_device(cp), dnw = to_device(nw);
  }
  template <class Opts>
  HcRun run(bool batch, Opts opts) const {
    HcRun o{to_device(X), DeviceBuffer(size_t(n * H) * 4), DeviceBuffer(size_t(n * H * H) * 4), DeviceBuffer(size_t(n * D) * 4),
            DeviceBuffer(size_t(n * D) * 2), DeviceBuffer(d::fwd_hc_scratch_doubles(n, H) * 8)};
    // Outputs start as NaNs (all bits set): a launch that leaves a token unwritten cannot pass on what a previous
    // run's buffer (cudaMalloc often hands the same block back) still holds.
    for (DeviceBuffer* b : {&o.post, &o.comb, &o.col, &o.col16, &o.mix}) b->fill_byte(0xFF);
    for (int t0 = 0; t0 < n; t0 += batch ? n : 1) {
      d::HcArgs a;
      a.X = o.X.as<float>() + t0 * hd, a.fn = dfn.as<float>(), a.base = dbase.as<float>(), a.scale = dscale.as<float>();
      a.n = batch ? n : 1, a.H = H, a.iters = 20, a.D = D, a.hc_eps = 1e-6f, a.rms_eps = 1e-6, a.head = head;
      a.post = o.post.as<float>() + t0 * H, a.comb = o.comb.as<float>() + t0 * H * H, a.collapsed = o.col.as<float>() + t0 * D;
      if (fused) {
        a.y = dy.as<float>() + t0 * D, a.X_prev = dXp.as<float>() + t0 * hd, a.post_prev = dpp.as<float>() + t0 * H;
        a.comb_prev = dcp.as<float>() + t0 * H * H, a.X_out = o.X.as<float>() + t0 * hd;
        a.norm_w = dnw.as<float>(), a.norm_eps = 1e-6, a.collapsed16 = o.col16.as<uint16_t>() + t0 * D;
      }
      opts(a);
      d::fwd_hc_pre(a, o.mix.as<double>() + size_t(t0) * size_t(nm), nullptr);
    }
    return o;
  }
};

// A token's hc_pre does not depend on the batch: 137 and 30 tokens in one launch, with the launch's rule (30: 2-3
// tokens in each of the clusters the GPU keeps resident) and with 1, 2 and 4 tokens per cluster (the clusters' shares
// uneven), against each token alone, bit for bit: the new streams (fused hc_post), the mixes, post,
// comb, the collapsed row and its fused norm with the f16 copy. V4's shape with the fused hc_post and norm, the same without them, an odd D (the
// scalar path, empty slices), H = 6 and 8 (the one-thread Sinkhorn; 8: 80 mixes), the official and bf16 mixing modes and hc_head.
// One token's launch at V4-Flash's hidden size takes the kernel with fn staged in shared memory (so the test below
// compares it, single tokens, with the L2 path of 2 and 4 tokens per cluster); V4-Pro's slices do not fit.
TEST_F(GpuTest, HcPreStagesFnAtFlashSize) {
  EXPECT_TRUE(d::fwd_hc_pre_staged(4096)) << "the GPU does not schedule the staged hc_pre's clusters";
  EXPECT_TRUE(d::fwd_hc_pre_staged(4096, true)) << "the GPU does not schedule cuda.hc_norm_after_mix's staged hc_pre";
  EXPECT_FALSE(d::fwd_hc_pre_staged(7168));
}

TEST_F(GpuTest, HcPreBatchMatchesSingleTokens) {
  Rng rng(77);
  struct Shape {
    int H;
    int64_t D;
    bool fused;
    int mix_mode = 0, head = 0;
  };
  // (sanitizer subset: 5 tokens, every shape and split (M = 4: a cluster of 4 and one of 1; M = 2: 2 + 2 + 1); 30
  // tokens (322 s under racecheck for the first shape alone, session 67) and 137, the only launch of several waves,
  // are left out)
  for (const int n : {137, 30, 5})
  for (const Shape sh : {Shape{4, 4096, true}, Shape{4, 4096, false}, Shape{4, 102, false}, Shape{6, 64, true}, Shape{8, 64, true}, Shape{4, 4096, false, 2},
                         Shape{4, 4096, false, 1}, Shape{4, 4096, false, 0, 1}}) {
    if (sanitizer_sizes() != (n == 5)) continue;
    sanitizer_progress("n " + std::to_string(n) + ", H " + std::to_string(sh.H) + ", D " + std::to_string(sh.D) + ", fused " +
                       std::to_string(sh.fused) + ", mix_mode " + std::to_string(sh.mix_mode) + ", head " + std::to_string(sh.head));
    const HcInputs in(rng, n, sh.H, sh.D, sh.fused, sh.head);
    const int H = in.H, nm = in.nm;  // nm: the mixes hc_pre leaves per token
    const int64_t D = in.D, hd = in.hd;
    auto run = [&](bool batch, int per_cluster) {
      return in.run(batch, [&](d::HcArgs& a) { a.tokens_per_cluster = per_cluster, a.mix_mode = sh.mix_mode; });
    };
    const HcRun s = run(false, 1);
    for (int per_cluster : {0, 1, 2, 4}) {
      const HcRun b = run(true, per_cluster);
      auto same = [&](const DeviceBuffer& p, const DeviceBuffer& q, size_t bytes, size_t row, const char* what) {
        const auto u = to_host<uint8_t>(p, bytes), v = to_host<uint8_t>(q, bytes);
        size_t i = 0;
        while (i < bytes && u[i] == v[i]) ++i;
        EXPECT_EQ(i, bytes) << n << " tokens, H " << H << " D " << D << (sh.fused ? " fused" : "") << ", tokens per cluster " << per_cluster
                            << ": " << what << " differs first at token " << (i / row) << ", byte " << i % row << " of its row";
      };
      same(b.X, s.X, size_t(n * hd) * 4, size_t(hd) * 4, "the streams");
      same(b.mix, s.mix, size_t(n * nm) * 8, size_t(nm) * 8, "the mixes");
      if (!sh.head) {  // (hc_head leaves no gates)
        same(b.post, s.post, size_t(n * H) * 4, size_t(H) * 4, "post");
        same(b.comb, s.comb, size_t(n * H * H) * 4, size_t(H * H) * 4, "comb");
      }
      same(b.col, s.col, size_t(n * D) * 4, size_t(D) * 4, "the collapsed row");
      if (sh.fused) same(b.col16, s.col16, size_t(n * D) * 2, size_t(D) * 2, "its f16 copy");
    }
  }
}

// The MoE combine left to hc_pre's fused hc_post (HcArgs::y_slots: gpu_moe's defer) against hc_pre given the combined
// rows (y = scale * sum_k w_k ys_k + add, the combine launch's arithmetic, here on the host: fma in k order, then the
// product and the sum each rounded), bit for bit: the new streams, the mixes, post, comb, the collapsed row and its
// fused norm with the f16 copy. Vector and scalar (odd D) paths, K = 6 and 1, with and without weights and the add.
TEST_F(GpuTest, HcPreCombinesMoeSlotsLikeTheCombineLaunch) {
  Rng rng(91);
  struct Case {
    int H, K;
    int64_t D;
    bool w, add;
  };
  for (const Case cs : {Case{4, 6, 4096, true, true}, Case{4, 6, 4096, false, true}, Case{4, 1, 256, true, false}, Case{2, 3, 102, true, true}}) {
    const int n = 3, H = cs.H, K = cs.K, nmix = (2 + H) * H;
    const int64_t D = cs.D, hd = H * D;
    const float scale = 1.5f;
    const auto ys = rng.floats(size_t(n * K * D), -1.0f, 1.0f), w = rng.floats(size_t(n * K), 0.05f, 1.0f);
    const auto add = rng.floats(size_t(n * D), -1.0f, 1.0f);
    std::vector<float> y(size_t(n * D));
    for (int t = 0; t < n; ++t)
      for (int64_t d = 0; d < D; ++d) {
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) acc = std::fma(cs.w ? w[size_t(t * K + k)] : 1.0f, ys[size_t((t * K + k) * D + d)], acc);
        acc = acc * scale;
        if (cs.add) acc = acc + add[size_t(t * D + d)];
        y[size_t(t * D + d)] = acc;
      }
    const auto X0 = rng.floats(size_t(n * hd), -2.0f, 2.0f), Xp = rng.floats(size_t(n * hd), -2.0f, 2.0f);
    const auto pp = rng.floats(size_t(n * H), 0.0f, 2.0f), cp = rng.floats(size_t(n * H * H), 0.0f, 1.0f);
    DeviceBuffer dfn = to_device(rng.floats(size_t(nmix * hd), -0.05f, 0.05f)), dbase = to_device(rng.floats(size_t(nmix), -1.0f, 1.0f));
    DeviceBuffer dscale = to_device(rng.floats(3, 0.5f, 2.0f)), dnw = to_device(rng.floats(size_t(D), 0.5f, 1.5f));
    DeviceBuffer dy = to_device(y), dys = to_device(ys), dw = to_device(w), dadd = to_device(add), dXp = to_device(Xp), dpp = to_device(pp),
                 dcp = to_device(cp);
    struct Out {
      DeviceBuffer X, post, comb, col, col16, mix;
    };
    auto run = [&](bool slots) {
      Out o{to_device(X0), DeviceBuffer(size_t(n * H) * 4), DeviceBuffer(size_t(n * H * H) * 4), DeviceBuffer(size_t(n * D) * 4),
            DeviceBuffer(size_t(n * D) * 2), DeviceBuffer(d::fwd_hc_scratch_doubles(n, H) * 8)};
      d::HcArgs a;
      a.X = o.X.as<float>(), a.fn = dfn.as<float>(), a.base = dbase.as<float>(), a.scale = dscale.as<float>();
      a.n = n, a.H = H, a.iters = 20, a.D = D, a.hc_eps = 1e-6f, a.rms_eps = 1e-6;
      a.post = o.post.as<float>(), a.comb = o.comb.as<float>(), a.collapsed = o.col.as<float>();
      if (slots) {
        a.y_slots = dys.as<float>(), a.y_k = K, a.y_scale = scale;
        a.y_w = cs.w ? dw.as<float>() : nullptr, a.y_add = cs.add ? dadd.as<float>() : nullptr;
      } else {
        a.y = dy.as<float>();
      }
      a.X_prev = dXp.as<float>(), a.post_prev = dpp.as<float>(), a.comb_prev = dcp.as<float>(), a.X_out = o.X.as<float>();
      a.norm_w = dnw.as<float>(), a.norm_eps = 1e-6, a.collapsed16 = o.col16.as<uint16_t>();
      d::fwd_hc_pre(a, o.mix.as<double>(), nullptr);
      return o;
    };
    const Out b = run(true), s = run(false);
    const std::string tag = "H " + std::to_string(H) + " K " + std::to_string(K) + " D " + std::to_string(D) + (cs.w ? " weights" : "") +
                            (cs.add ? " add" : "") + ": ";
    expect_same_bytes(b.X, s.X, size_t(n * hd) * 4, tag + "the streams");
    expect_same_bytes(b.mix, s.mix, size_t(n * nmix) * 8, tag + "the mixes");
    expect_same_bytes(b.post, s.post, size_t(n * H) * 4, tag + "post");
    expect_same_bytes(b.comb, s.comb, size_t(n * H * H) * 4, tag + "comb");
    expect_same_bytes(b.col, s.col, size_t(n * D) * 4, tag + "the collapsed row");
    expect_same_bytes(b.col16, s.col16, size_t(n * D) * 2, tag + "its f16 copy");
  }
}

// cuda.hc_norm_after_mix (HcArgs::norm_after_mix): hc_pre's kernel with r applied after the dots against the exact
// one on the same inputs. The new streams (the fused hc_post, untouched) must be the same bits; the mixes, post, comb
// and the collapsed row (with its fused norm) within 1e-6 of max|ref|, and the mixes must differ somewhere
// (else the test compared the exact kernel with itself). V4-Flash's hidden size (fn staged) and V4-Pro's (fn from
// L2), with and without the fused hc_post and norm, hc_head; one token per launch and 5 in one launch (one per
// cluster); one token's streams 1 and 2 nearly -stream 0.
TEST_F(GpuTest, HcNormAfterMixMatchesExact) {
  Rng rng(123);
  struct Shape {
    int64_t D;
    bool fused;
    int head;
  };
  const int H = 4, n = 5;
  // (sanitizer subset: V4-Flash's and V4-Pro's hidden sizes with the fused hc_post and norm: fn staged and from L2)
  for (const Shape sh : {Shape{4096, true, 0}, Shape{4096, false, 0}, Shape{4096, true, 1}, Shape{7168, true, 0}, Shape{256, true, 0}})
    for (const bool batch : {false, true}) {
      if (sanitizer_sizes() && !(sh.fused && !sh.head && sh.D != 256)) continue;
      sanitizer_progress("D " + std::to_string(sh.D) + ", batch " + std::to_string(batch));
      HcInputs in(rng, n, H, sh.D, sh.fused, sh.head);
      const int64_t D = in.D, hd = in.hd;
      const int nm = in.nm;
      for (int64_t d = 0; d < D; ++d)  // token 2: streams 1 and 2 within 1e-3 of -stream 0
        for (int j : {1, 2}) in.X[size_t(2 * hd + j * D + d)] = -in.X[size_t(2 * hd + d)] * (1.0f + 1e-3f * float(j));
      auto run = [&](bool after) {
        return in.run(batch, [&](d::HcArgs& a) { a.tokens_per_cluster = 1, a.norm_after_mix = after ? 1 : 0; });
      };
      const HcRun e = run(false), o = run(true);
      const std::string tag =
          fmt::format("D {}{}{}{}: ", D, sh.fused ? " fused" : "", sh.head ? " hc_head" : "", batch ? ", 5 tokens in one launch" : "");
      expect_same_bytes(o.X, e.X, size_t(n * hd) * 4, tag + "the streams");
      // Each tensor within 1e-6 of max|want| (plumb_cuda_test::expect_close, which names the worst element); the mixes
      // (fp32 values the kernel leaves as doubles) must also differ somewhere.
      auto mix_f = [&](const HcRun& r) {
        const auto m = to_host<double>(r.mix, size_t(n * nm));
        return std::vector<float>(m.begin(), m.end());
      };
      const auto mo = mix_f(o), me = mix_f(e);
      expect_close(tag + "the mixes", mo, me, nm, 1e-6);
      EXPECT_NE(mo, me) << tag << "the mixes: the same bits as the exact kernel (the patch's kernel did not run)";
      if (!sh.head) {
        expect_close(tag + "post", to_host<float>(o.post, size_t(n * H)), to_host<float>(e.post, size_t(n * H)), H, 1e-6);
        expect_close(tag + "comb", to_host<float>(o.comb, size_t(n * H * H)), to_host<float>(e.comb, size_t(n * H * H)), H * H, 1e-6);
      }
      expect_close(tag + "the collapsed row", to_host<float>(o.col, size_t(n * D)), to_host<float>(e.col, size_t(n * D)), D, 1e-6);
    }
}

// cuda.hc_fold (GemvArgs::hc, HcArgs::part): wo_b's launch with the hc_pre partials' epilogue, then hc_pre on those
// partials, against wo_b's plain launch, then cuda.hc_norm_after_mix's hc_pre with the hc_post fused, on the same
// inputs. wo_b's output and the new streams must be the same bits (the same arithmetic); the mixes, post, comb and
// the collapsed row (with its fused norm) within 1e-6 of max|ref| (the mixes' fp64 sums in another order: at most an
// fp32 ulp). V4-Flash's wo_b [4096, 8192] and a small [256, 512]; the comb untransposed (the fault) as well.
TEST_F(GpuTest, HcFoldMatchesFusedHcPre) {
  Rng rng(321);
  for (const auto& [D, K, untransposed] : {std::tuple<int64_t, int64_t, int>{4096, 8192, 0}, {256, 512, 0}, {256, 512, 1}}) {
    const int H = 4, nm = (2 + H) * H;
    const HcInputs in(rng, 1, H, D, true, 0);
    plumb_test::TempDir dir;
    std::vector<plumb::OwnedTensor> ts;
    add_fp8(ts, rng, "w", D, K);
    const plumb::Checkpoint ck = write_checkpoint(dir, ts);
    const plumb::cuda::Fp8Matrix w = plumb::cuda::upload_fp8(plumb::Matrix::bind(ck, "w.weight", D, K));
    std::vector<uint16_t> xh(static_cast<size_t>(K));
    for (auto& b : xh) b = f16_bits(round_f16(rng.floats(1, -1.0f, 1.0f)[0]));
    const DeviceBuffer x16 = to_device(xh), y_ref(static_cast<size_t>(D) * 4), y_fold(static_cast<size_t>(D) * 4);
    DeviceBuffer part(size_t(D / 16) * size_t(d::kHcFoldSums) * 8);
    plumb::cuda::Workspace ws;
    plumb::cuda::fp8_linear(w, x16.get(), plumb::cuda::Act::F16, K, 1, y_ref.as<float>(), D, ws);
    const HcRun e = in.run(false, [&](d::HcArgs& a) {
      a.y = y_ref.as<float>(), a.untransposed = untransposed, a.norm_after_mix = 1, a.tokens_per_cluster = 1;
    });
    const HcRun o = in.run(false, [&](d::HcArgs& a) {
      d::HcPartArgs h;
      h.X_prev = a.X_prev, h.post = a.post_prev, h.comb = a.comb_prev, h.X_out = const_cast<float*>(a.X), h.fn = a.fn, h.part = part.as<double>();
      h.D = D, h.H = H, h.untransposed = untransposed;
      plumb::cuda::fp8_linear_hc_part(w, x16.as<uint16_t>(), y_fold.as<float>(), h, ws);
      a.y = nullptr, a.X_prev = nullptr, a.post_prev = nullptr, a.comb_prev = nullptr, a.X_out = nullptr;
      a.part = part.as<double>(), a.norm_after_mix = 1, a.tokens_per_cluster = 1;
    });
    const std::string tag = fmt::format("[{}, {}]{}: ", D, K, untransposed ? " comb untransposed" : "");
    expect_same_bytes(y_fold, y_ref, size_t(D) * 4, tag + "wo_b's output");
    expect_same_bytes(o.X, e.X, size_t(H * D) * 4, tag + "the new streams");
    const auto mo = to_host<double>(o.mix, size_t(nm)), me = to_host<double>(e.mix, size_t(nm));
    expect_close(tag + "the mixes", std::vector<float>(mo.begin(), mo.end()), std::vector<float>(me.begin(), me.end()), nm, 1e-6);
    expect_close(tag + "post", to_host<float>(o.post, size_t(H)), to_host<float>(e.post, size_t(H)), H, 1e-6);
    expect_close(tag + "comb", to_host<float>(o.comb, size_t(H * H)), to_host<float>(e.comb, size_t(H * H)), H * H, 1e-6);
    expect_close(tag + "the collapsed row", to_host<float>(o.col, size_t(D)), to_host<float>(e.col, size_t(D)), D, 1e-6);
    size_t differ = 0;
    for (int i = 0; i < nm; ++i) differ += mo[size_t(i)] != me[size_t(i)];
    std::printf("%s%zu of %d mixes not bit-identical to the unfolded kernel's\n", tag.c_str(), differ, nm);
    // Refused: hc_mult other than 4, rows other than the streams' width, a missing buffer.
    d::HcPartArgs h;
    h.X_prev = in.dXp.as<float>(), h.post = in.dpp.as<float>(), h.comb = in.dcp.as<float>(), h.X_out = o.X.as<float>();
    h.fn = in.dfn.as<float>(), h.part = part.as<double>(), h.D = D, h.H = H;
    for (int bad = 0; bad < 3; ++bad) {
      d::HcPartArgs b = h;
      if (bad == 0) b.H = 2;
      if (bad == 1) b.D = D / 2;
      if (bad == 2) b.part = nullptr;
      EXPECT_ANY_THROW(plumb::cuda::fp8_linear_hc_part(w, x16.as<uint16_t>(), y_fold.as<float>(), b, ws)) << tag << "case " << bad;
    }
  }
}
// cuda.branch_flags: hc_pre waits in-kernel for branches that signal late. On another stream a branch spins 20 ms,
// then copies the previous sublayer's gates (post, comb) over NaN-filled buffers and signals slot 1, then the shared
// expert's rows (the combine's add) and signals slot 2; both slots start at an older epoch (6; the forward's is 7),
// which must not satisfy the wait. The launch (one token at V4-Flash's size: the forward's kernel, fused hc_post and
// MoE combine) reads them after its wait: every output must be the bits of the same launch given them up front. Read
// before the signals, the NaNs would reach every stream, the mixes and the gates.
TEST_F(GpuTest, BranchFlagsWaitForALateBranch) {
  Rng rng(5);
  const int H = 4, K = 6, nmix = (2 + H) * H;
  const int64_t D = 4096, hd = H * D;
  DeviceBuffer fn = to_device(rng.floats(size_t(nmix * hd), -0.05f, 0.05f)), base = to_device(rng.floats(size_t(nmix), -1.0f, 1.0f));
  DeviceBuffer scale = to_device(rng.floats(3, 0.5f, 2.0f)), Xp = to_device(rng.floats(size_t(hd), -2.0f, 2.0f));
  DeviceBuffer ys = to_device(rng.floats(size_t(K * D), -1.0f, 1.0f)), w = to_device(rng.floats(size_t(K), 0.0f, 1.0f));
  DeviceBuffer pp = to_device(rng.floats(size_t(H), 0.0f, 2.0f)), cp = to_device(rng.floats(size_t(H * H), 0.0f, 1.0f));
  DeviceBuffer add = to_device(rng.floats(size_t(D), -1.0f, 1.0f));
  struct Out {
    std::vector<float> X, post, comb, col;
  };
  const auto run = [&](bool late) {
    DeviceBuffer X(size_t(hd) * 4), post(size_t(H) * 4), comb(size_t(H * H) * 4), col(size_t(D) * 4);
    DeviceBuffer mix(d::fwd_hc_scratch_doubles(1, H) * 8), pp_in(pp.bytes()), cp_in(cp.bytes()), add_in(add.bytes());
    const std::vector<unsigned> words = {7u, 6u, 6u};
    DeviceBuffer sync = to_device(words);
    d::Stream side = nullptr;
    if (late) {
      for (DeviceBuffer* b : {&pp_in, &cp_in, &add_in}) b->fill_byte(0xFF);  // NaN until the branch copies
      side = d::stream_create();
      d::device_delay(side, 20'000'000);
      d::copy_d2d(pp_in.get(), pp.get(), pp.bytes(), side);
      d::copy_d2d(cp_in.get(), cp.get(), cp.bytes(), side);
      d::branch_signal(side, sync.as<unsigned>(), 1);
      d::copy_d2d(add_in.get(), add.get(), add.bytes(), side);
      d::branch_signal(side, sync.as<unsigned>(), 2);
    } else {
      d::copy_d2d(pp_in.get(), pp.get(), pp.bytes());
      d::copy_d2d(cp_in.get(), cp.get(), cp.bytes());
      d::copy_d2d(add_in.get(), add.get(), add.bytes());
    }
    d::HcArgs a;
    a.X = X.as<float>(), a.fn = fn.as<float>(), a.base = base.as<float>(), a.scale = scale.as<float>();
    a.n = 1, a.H = H, a.iters = 20, a.D = D, a.hc_eps = 1e-6f, a.rms_eps = 1e-6;
    a.post = post.as<float>(), a.comb = comb.as<float>(), a.collapsed = col.as<float>();
    a.y_slots = ys.as<float>(), a.y_w = w.as<float>(), a.y_add = add_in.as<float>(), a.y_k = K, a.y_scale = 1.5f;
    a.X_prev = Xp.as<float>(), a.post_prev = pp_in.as<float>(), a.comb_prev = cp_in.as<float>(), a.X_out = X.as<float>();
    if (late) {
      EXPECT_TRUE(a.wait.add(sync.as<unsigned>(), 1) && a.wait.add(sync.as<unsigned>(), 2));
    }
    d::fwd_hc_pre(a, mix.as<double>(), nullptr);
    d::dsync();
    if (side) d::stream_destroy(side);
    return Out{to_host<float>(X, size_t(hd)), to_host<float>(post, size_t(H)), to_host<float>(comb, size_t(H * H)), to_host<float>(col, size_t(D))};
  };
  const Out ref = run(false), late = run(true);
  const auto same = [](const std::vector<float>& u, const std::vector<float>& v, const char* what) {
    size_t i = 0;
    while (i < u.size() && std::memcmp(&u[i], &v[i], 4) == 0) ++i;
    EXPECT_EQ(i, u.size()) << what << " differs first at element " << i << ": after the late branch " << v[i] << ", given up front "
                           << u[i];
  };
  same(ref.X, late.X, "the new streams");
  same(ref.post, late.post, "post");
  same(ref.comb, late.comb, "comb");
  same(ref.col, late.col, "the collapsed row");
  // A launch whose waiting blocks could fill the GPU is refused (its branches must join): 137 tokens of V4-Flash's
  // hc_pre take one cluster of 16 blocks per 1-4 tokens, far more than half of any GPU's SMs.
  d::HcArgs big;
  big.n = 137, big.H = H, big.iters = 20, big.D = D;
  DeviceBuffer sync = to_device(std::vector<unsigned>{7u, 7u});
  ASSERT_TRUE(big.wait.add(sync.as<unsigned>(), 1));
  EXPECT_FALSE(d::branch_wait_fits(d::fwd_hc_pre_blocks(big)));
  EXPECT_THROW(d::fwd_hc_pre(big, nullptr, nullptr), std::runtime_error);
  EXPECT_TRUE(d::branch_wait_fits(16));
}

}  // namespace
