// The FP8 block-scaled projections' decode kernels (the register-path GEMV, the shared-activation kernel, the grouped
// wo_a, the shared expert) against their CPU twins and the fp32 reference.
//
// Tolerances (normalized: max |gpu - ref| / max |ref| over the output tensor):
//   twin, fp32 outputs      1e-4  the same math; only fp32 accumulation order and tensor-core adds differ
//   twin, fp16 outputs      2e-3  one fp16 rounding of the output (2^-11 relative) near a tie can go either way
//   fp32 reference          5e-3  the activations' fp16 rounding (2^-12 relative per element on average)
// Every comparison prints where its largest error is (index, both values).
#include <algorithm>
#include <cstring>
#include <numeric>

#include <fmt/format.h>

#include "cuda/fwd_kernels.h"
#include "cuda/kernels.h"
#include "model/experts.h"
#include "cuda_test_util.h"
#include "kernel_twins.h"

using namespace plumb;
using namespace plumb_cuda_test;
using cuda::Act;

// ---- FP8 block-scaled projections ----

struct Fp8Case {
  int64_t rows, cols;
  bool f32_scales;
};

class CudaFp8 : public GpuTest {};

// The FP8 matrices of the token-group tests: a dense [1040, 1024] (65 tiles: blocks past the rows' end) with E8M0
// scales and with F32 scales, wo_a's grouped 8 x [256, 512], and a shared expert (D 1024, I 512).
struct Fp8TokenMats {
  static constexpr int64_t rows = 1040, cols = 1024, D = 1024, I = 512, gr = 256, gcols = 512;
  static constexpr int groups = 8;
  TempDir dir;
  Checkpoint ck;
  cuda::Fp8Matrix dw, dwf, dg;
  cuda::Fp8Expert de;
  explicit Fp8TokenMats(Rng& rng) {
    std::vector<OwnedTensor> ts;
    add_fp8(ts, rng, "w", rows, cols);
    add_fp8(ts, rng, "wf", rows, cols, true);
    add_fp8(ts, rng, "wo_a", groups * gr, gcols);
    add_fp8(ts, rng, "se.w1", I, D, false, 116, 118);
    add_fp8(ts, rng, "se.w2", D, I, false, 116, 118);
    add_fp8(ts, rng, "se.w3", I, D, false, 116, 118);
    ck = write_checkpoint(dir, ts);
    dw = cuda::upload_fp8(Matrix::bind(ck, "w.weight", rows, cols));
    dwf = cuda::upload_fp8(Matrix::bind(ck, "wf.weight", rows, cols));
    dg = cuda::upload_fp8(Matrix::bind(ck, "wo_a.weight", groups * gr, gcols));
    de = cuda::upload_expert_fp8(ExpertWeights{Matrix::bind(ck, "se.w1.weight", I, D), Matrix::bind(ck, "se.w2.weight", D, I),
                                               Matrix::bind(ck, "se.w3.weight", I, D)});
  }
};

TEST_F(CudaFp8, LinearMatchesTwinAndReference) {
  const Fp8Case cases[] = {{1024, 4096, false}, {512, 4096, true}, {1040, 1024, false}, {4096, 8192, false}};
  Rng rng(2);
  cuda::Workspace ws;
  for (const auto& fc : cases) {
    TempDir dir;
    std::vector<OwnedTensor> ts;
    add_fp8(ts, rng, "w", fc.rows, fc.cols, fc.f32_scales);
    const Checkpoint ck = write_checkpoint(dir, ts);
    const Matrix w = Matrix::bind(ck, "w.weight", fc.rows, fc.cols);
    const cuda::Fp8Matrix dw = cuda::upload_fp8(w);
    EXPECT_EQ(dw.scale_f32, fc.f32_scales);
    for (int n : {1, 3, 8, 11})
      for (Act at : {Act::F32, Act::BF16, Act::F16}) {
        if (fc.rows == 4096 && (n == 3 || at == Act::F16)) continue;  // the big case: fewer combinations
        const Acts x = make_acts(at, rng.floats(size_t(n * fc.cols), -2.0f, 2.0f));
        cuda::DeviceBuffer y(size_t(n * fc.rows) * 4);
        y.fill_byte(0xFF);
        cuda::fp8_linear(dw, x.dev.get(), at, fc.cols, n, y.as<float>(), fc.rows, ws);
        cuda::synchronize();
        const auto yg = cuda::to_host<float>(y, size_t(n * fc.rows));
        const std::string tag = "fp8 [" + std::to_string(fc.rows) + ", " + std::to_string(fc.cols) + "]" +
                                (fc.f32_scales ? " f32-scales" : " e8m0") + " n=" + std::to_string(n) + " x " + act_name(at);
        expect_close(tag + " vs twin", yg, linear_cpu(x.f16, n, w), fc.rows, 1e-4);
        expect_close(tag + " vs fp32 reference", yg, linear_cpu(x.value, n, w), fc.rows, 5e-3);
      }
    // The GEMV's block shapes beyond the ones this matrix gets by default: 1 to 8 warps per block (the default rule
    // gives V4's wq_b, 2048 tiles, 1 warp; a matrix this small gets 8).
    if (fc.rows == 1040) {
      namespace d = cuda::detail;
      const int n = 8;
      Rng xr(7);  // its own draws: the other cases keep theirs
      const Acts x = make_acts(Act::F16, xr.floats(size_t(n * fc.cols), -2.0f, 2.0f));
      const std::vector<float> twin = linear_cpu(x.f16, n, w);
      for (int warps : {1, 2, 4, 8}) {
        d::GemvArgs a;
        a.fmt = d::kFp8, a.act = d::kF16, a.rows = fc.rows, a.cols = fc.cols, a.s_ld = dw.scale_cols();
        a.w[0] = dw.codes.as<uint8_t>(), a.s[0] = dw.scales.get();
        a.x = x.dev.get(), a.x_tok_stride = fc.cols, a.n = n, a.warps = warps, a.minblocks = 1;
        cuda::DeviceBuffer y(size_t(n * fc.rows) * 4);
        y.fill_byte(0xFF);
        a.out = y.get(), a.o_tok_stride = fc.rows;
        if (warps == 1) {  // bench --skeleton's scope: no launch, the output untouched
          {
            d::SkipWeightsScope skip(true);
            d::launch_gemv(a, nullptr);
          }
          cuda::synchronize();
          const auto untouched = cuda::to_host<uint32_t>(y, size_t(n * fc.rows));
          EXPECT_EQ(std::count(untouched.begin(), untouched.end(), 0xFFFFFFFFu), std::ptrdiff_t(untouched.size()))
              << "launch_gemv wrote its output under SkipWeightsScope";
          EXPECT_FALSE(d::weights_skipped());
        }
        d::launch_gemv(a, nullptr);
        cuda::synchronize();
        expect_close("fp8 [1040, 1024] n=8 x f16, " + std::to_string(warps) + " warps per block vs twin",
                     cuda::to_host<float>(y, size_t(n * fc.rows)), twin, fc.rows, 1e-4);
      }
    }
  }
}

// The FP8 GEMV takes up to 32 tokens in one pass (groups of 8 in the MMA's N dimension, each weight fragment
// converted once for all of them) where it used to stream the matrix once per 8 tokens. With the same split of K
// over a block's warps, a token's outputs must be the bits it gets in a launch of its own 8-token slice (a pass of
// one group): launched directly over warps per block, 1 or 2 chunks in flight and 2 or 4 groups forced; and through
// each FP8 entry point (dense, the grouped wo_a, the shared expert's gate/up + down) at shapes where the block rules
// above and below 8 tokens (backend.cpp dense_split) pick the same warps per block. (Where they differ, e.g. V4's
// wo_b: 8 warps up to 8 tokens, 4 above, the sums over the warps' K ranges round in another order.) Token counts
// leave a partial group or a second pass.
TEST_F(CudaFp8, TokenGroupsPerPassGiveEachSliceItsBits) {
  namespace d = cuda::detail;
  Rng rng(12);
  const Fp8TokenMats fm(rng);
  const int64_t rows = fm.rows, cols = fm.cols, D = fm.D, I = fm.I, gr = fm.gr, gcols = fm.gcols;
  const int groups = fm.groups;
  const cuda::Fp8Matrix& dw = fm.dw;
  const cuda::Fp8Matrix& dg = fm.dg;
  const cuda::Fp8Expert& de = fm.de;
  cuda::Workspace ws;
  // Runs `op(first token, tokens, out)` over the batch at once and over its 8-token slices; every output must match.
  auto same_as_slices = [&](const std::string& what, int n, int64_t out_w, auto op) {
    cuda::DeviceBuffer all(size_t(n * out_w) * 4), sl(size_t(n * out_w) * 4);
    all.fill_byte(0xFF), sl.fill_byte(0xEE);
    op(0, n, all.as<float>());
    for (int t0 = 0; t0 < n; t0 += 8) op(t0, std::min(8, n - t0), sl.as<float>() + int64_t(t0) * out_w);
    cuda::synchronize();
    const auto a = cuda::to_host<uint32_t>(all, size_t(n * out_w)), b = cuda::to_host<uint32_t>(sl, size_t(n * out_w));
    int64_t bad = 0, first = -1;
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i] != b[i] && bad++ == 0) first = int64_t(i);
    EXPECT_EQ(bad, 0) << what << " n=" << n << ": " << bad << " outputs differ from their 8-token slice's, first at token "
                      << first / out_w << ", output " << first % out_w;
  };
  for (int n : {12, 17, 32, 40}) {
    const Acts x = make_acts(Act::F16, rng.floats(size_t(n * cols), -2.0f, 2.0f));
    const auto* x16 = static_cast<const uint16_t*>(x.dev.get());
    same_as_slices("fp8 [1040, 1024]", n, rows, [&](int t0, int m, float* y) {
      cuda::fp8_linear(dw, x16 + int64_t(t0) * cols, Act::F16, cols, m, y, rows, ws);
    });
    for (int warps : {1, 4})
      for (int unroll : {1, 2})
        for (int ng : {2, 4}) {
          same_as_slices("fp8 [1040, 1024], " + std::to_string(warps) + " warps, " + std::to_string(unroll) + " chunks in flight, " + std::to_string(ng) + " groups", n, rows,
                         [&](int t0, int m, float* y) {
                           d::GemvArgs a;
                           a.fmt = d::kFp8, a.act = d::kF16, a.rows = rows, a.cols = cols, a.s_ld = dw.scale_cols();
                           a.w[0] = dw.codes.as<uint8_t>(), a.s[0] = dw.scales.get();
                           a.x = x16 + int64_t(t0) * cols, a.x_tok_stride = cols, a.n = m, a.warps = warps, a.minblocks = 1;
                           a.fp8_unroll = unroll, a.token_groups = m > 8 ? ng : 1;
                           a.out = y, a.o_tok_stride = rows;
                           d::launch_gemv(a, nullptr);
                         });
        }
    const Acts xg = make_acts(Act::BF16, rng.floats(size_t(n * groups * gcols), -2.0f, 2.0f));
    same_as_slices("fp8 grouped (8 x [256, 512])", n, groups * gr, [&](int t0, int m, float* y) {
      cuda::fp8_linear_grouped(dg, groups, static_cast<const uint16_t*>(xg.dev.get()) + int64_t(t0) * groups * gcols, Act::BF16, m, y, ws);
    });
    const Acts xe = make_acts(Act::F32, rng.floats(size_t(n * D), -3.0f, 3.0f));
    cuda::DeviceBuffer h(size_t(n * I) * 2);
    same_as_slices("fp8 shared expert [512 x 1024]", n, D, [&](int t0, int m, float* y) {
      cuda::fp8_expert_ffn(de, static_cast<const float*>(xe.dev.get()) + int64_t(t0) * D, Act::F32, m, 10.0,
                           h.as<uint16_t>() + int64_t(t0) * I, y, ws);
    });
  }
}

// The shared-activation kernel (gemv_xs.cuh: a block's warps each a 16-row tile of their own, the block's K range
// of the activations staged once in shared memory) repeats the register-path kernel's arithmetic with one warp per
// block: for every token, the bits of that kernel launched with one warp per block and the same blocks along K on
// the token's 8-token slice. Launched directly over tiles per block (1, 3: a block past the rows' end, 8), blocks
// along K (uneven ranges included), chunks in flight (1, 2; gate/up run 1) and token groups (2, 4, 8: passes where n exceeds a
// pass), for a dense matrix with E8M0 and with F32 scales, the grouped wo_a and gate/up with SwiGLU (f16 out); and
// through the backend's rule (fp8_linear on a matrix it sends there) against the twin at 12, 32 and 64 tokens.
TEST_F(CudaFp8, SharedActivationsGiveOneWarpBlocksBits) {
  namespace d = cuda::detail;
  Rng rng(13);
  const Fp8TokenMats fm(rng);
  const int groups = fm.groups;
  const cuda::Fp8Matrix& dw = fm.dw;
  const cuda::Fp8Matrix& dwf = fm.dwf;
  const cuda::Fp8Matrix& dg = fm.dg;
  const cuda::Fp8Expert& de = fm.de;
  cuda::Workspace ws;
  // One matrix's launch arguments (grouped: `groups` problems of gr rows over x columns [p * pc, (p + 1) * pc)).
  struct Mat {
    std::string name;
    const cuda::Fp8Matrix* w;
    const cuda::Fp8Matrix* w3;  // gate/up: the up matrix
    int probs;
  };
  const Mat mats[] = {{"fp8 [1040, 1024]", &dw, nullptr, 1},
                      {"fp8 [1040, 1024] f32 scales", &dwf, nullptr, 1},
                      {"fp8 grouped (8 x [256, 512])", &dg, nullptr, groups},
                      {"fp8 gate/up SwiGLU (2 x [512, 1024])", &de.w1, &de.w3, 1}};
  for (int n : {9, 12, 17, 32, 40, 64, 70}) {
    // (sanitizer subset: 9, 17 and 70 tokens: the smallest count, one pass of 17, and several passes with a remainder)
    if (sanitizer_sizes() && n != 9 && n != 17 && n != 70) continue;
    sanitizer_progress(std::to_string(n) + " tokens");
    for (const Mat& m : mats) {
      const int64_t mr = m.w->rows / m.probs, pc = m.w->cols, in_w = pc * m.probs, out_w = m.w->rows;
      const bool gu = m.w3 != nullptr;
      const Acts x = make_acts(Act::F16, rng.floats(size_t(int64_t(n) * in_w), -2.0f, 2.0f));
      auto args = [&](int t0, int cnt, void* out) {
        d::GemvArgs a;
        a.fmt = d::kFp8, a.act = d::kF16, a.rows = mr, a.cols = pc, a.problems = m.probs, a.s_ld = m.w->scale_cols();
        a.s_f32 = m.w->scale_f32 ? 1 : 0;
        a.w[0] = m.w->codes.as<uint8_t>(), a.s[0] = m.w->scales.get();
        if (gu) a.w[1] = m.w3->codes.as<uint8_t>(), a.s[1] = m.w3->scales.get(), a.nmat = 2, a.epi = d::kSwiglu, a.limit = 10.0f, a.out_half = 1;
        a.w_prob_stride = mr * pc, a.s_prob_stride = (mr / 128) * m.w->scale_cols() * (m.w->scale_f32 ? 4 : 1);
        a.x = static_cast<const uint16_t*>(x.dev.get()) + int64_t(t0) * in_w, a.x_tok_stride = in_w, a.x_prob_stride = m.probs > 1 ? pc : 0;
        a.out = out, a.o_tok_stride = out_w, a.o_prob_stride = mr, a.n = cnt, a.minblocks = 1;
        return a;
      };
      const size_t ob = gu ? 2 : 4, total = size_t(n) * size_t(out_w);
      auto workspace = [&](d::GemvArgs& a) {
        if (a.kblocks <= 1) return;
        const d::GemvWorkspace need = d::gemv_workspace(a);
        a.partial = ws.partial(need.floats), a.counters = ws.counters(need.counters);
      };
      for (int kb : {1, 3, 8}) {
        if (kb > pc / 128) continue;
        // The reference: the register-path kernel, one warp per block, kb blocks along K, 8-token slices.
        cuda::DeviceBuffer ref(total * ob);
        ref.fill_byte(0xEE);
        for (int t0 = 0; t0 < n; t0 += 8) {
          const int cnt = std::min(8, n - t0);
          d::GemvArgs a = args(t0, cnt, static_cast<char*>(ref.get()) + size_t(t0) * size_t(out_w) * ob);
          a.warps = 1, a.kblocks = kb, a.fp8_unroll = 2;
          workspace(a);
          d::launch_gemv(a, nullptr);
        }
        cuda::synchronize();
        const auto rb = cuda::to_host<uint8_t>(ref, total * ob);
        for (int warps : {1, 3, 8})
          for (int unroll : {1, 2})
            for (int np : {2, 4, 8}) {
              cuda::DeviceBuffer got(total * ob);
              got.fill_byte(0xFF);
              d::GemvArgs a = args(0, n, got.get());
              a.shared_x = 1, a.warps = warps, a.kblocks = kb, a.fp8_unroll = unroll, a.token_groups = np;
              workspace(a);
              d::launch_gemv(a, nullptr);
              cuda::synchronize();
              const auto gb = cuda::to_host<uint8_t>(got, total * ob);
              int64_t bad = 0, first = -1;
              for (size_t i = 0; i < total; ++i)
                if (std::memcmp(gb.data() + i * ob, rb.data() + i * ob, ob) != 0 && bad++ == 0) first = int64_t(i);
              EXPECT_EQ(bad, 0) << m.name << " n=" << n << ", " << warps << " tiles per block, " << kb << " blocks along K, "
                                << unroll << " chunks in flight, " << np << " groups: " << bad
                                << " outputs differ from the one-warp kernel's, first at token " << first / out_w << ", output "
                                << first % out_w;
            }
      }
    }
  }
  // Through the backend's rule (dense_split) on a matrix it gives the shared-activation kernel (128 tiles of 32
  // chunks: 4 warps per block, 4 blocks along K): against the twin at the patch's tolerance.
  const int64_t br = 2048, bc = 4096;
  TempDir dir2;
  std::vector<OwnedTensor> ts2;
  add_fp8(ts2, rng, "big", br, bc);
  const Checkpoint ck2 = write_checkpoint(dir2, ts2);
  const Matrix big = Matrix::bind(ck2, "big.weight", br, bc);
  const cuda::Fp8Matrix db = cuda::upload_fp8(big);
  for (int n : {12, 32, 64}) {
    const Acts x = make_acts(Act::F16, rng.floats(size_t(n * bc), -2.0f, 2.0f));
    cuda::DeviceBuffer y(size_t(n * br) * 4);
    y.fill_byte(0xFF);
    cuda::fp8_linear(db, x.dev.get(), Act::F16, bc, n, y.as<float>(), br, ws);
    cuda::synchronize();
    expect_close("fp8 [2048, 4096] n=" + std::to_string(n) + " (backend rule) vs twin", cuda::to_host<float>(y, size_t(n * br)),
                 linear_cpu(x.f16, n, big), br, 1e-4);
  }
}

TEST_F(CudaFp8, GroupedProjectionMatchesReference) {
  Rng rng(3);
  const int groups = 8;
  const int64_t gr = 256, cols = 512, rows = groups * gr;
  TempDir dir;
  std::vector<OwnedTensor> ts;
  add_fp8(ts, rng, "wo_a", rows, cols);
  const Checkpoint ck = write_checkpoint(dir, ts);
  const Matrix w = Matrix::bind(ck, "wo_a.weight", rows, cols);
  const auto dw = cuda::upload_fp8(w);
  cuda::Workspace ws;
  for (int n : {1, 8}) {
    const Acts x = make_acts(Act::BF16, rng.floats(size_t(n * groups * cols), -2.0f, 2.0f));
    cuda::DeviceBuffer y(size_t(n * rows) * 4);
    y.fill_byte(0xFF);
    cuda::fp8_linear_grouped(dw, groups, x.dev.get(), Act::BF16, n, y.as<float>(), ws);
    cuda::synchronize();
    std::vector<float> ref(size_t(n * rows));
    for (int g = 0; g < groups; ++g)
      ops::linear_rows(x.f16.data() + g * cols, n, groups * cols, w, g * gr, gr, ref.data() + g * gr, rows);
    const std::vector<float> got = cuda::to_host<float>(y, ref.size());
    expect_close("fp8 grouped (8 x [256, 512]) n=" + std::to_string(n) + " vs twin", got, ref, rows, 1e-4);
    // The f16 output (wo_a feeding an FP8 wo_b): the bits of the fp32 output rounded to nearest even.
    cuda::DeviceBuffer y16(size_t(n * rows) * 2);
    y16.fill_byte(0xFF);
    cuda::fp8_linear_grouped(dw, groups, x.dev.get(), Act::BF16, n, nullptr, ws, nullptr, y16.as<uint16_t>());
    cuda::synchronize();
    const std::vector<uint16_t> h = cuda::to_host<uint16_t>(y16, ref.size());
    int64_t bad = 0, first = -1;
    for (size_t i = 0; i < h.size(); ++i)
      if (h[i] != f16_bits(round_f16(got[i])) && bad++ == 0) first = int64_t(i);
    EXPECT_EQ(bad, 0) << "fp8 grouped n=" << n << ": " << bad << " f16 outputs differ from the fp32 output rounded, first at "
                      << first;
  }
}

TEST_F(CudaFp8, SharedExpertMatchesTwinAndReference) {
  Rng rng(4);
  const int64_t D = 1024, I = 512;
  const float limit = 10.0f;
  const auto fx = make_fp8_expert(rng, D, I, 116, 118, 116, 118);
  const ExpertWeights& e = fx->e;
  const auto de = cuda::upload_expert_fp8(e);
  cuda::Workspace ws;
  const Numerics ref_numerics{ModelOptions{}};
  for (int n : {1, 8})
    for (Act at : {Act::F32, Act::BF16}) {
      const Acts x = make_acts(at, rng.floats(size_t(n * D), -3.0f, 3.0f));
      cuda::DeviceBuffer h(size_t(n * I) * 2), y(size_t(n * D) * 4);
      h.fill_byte(0xFF), y.fill_byte(0xFF);
      cuda::fp8_expert_ffn(de, x.dev.get(), at, n, limit, h.as<uint16_t>(), y.as<float>(), ws);
      cuda::synchronize();
      const auto hg = f16_to_float(cuda::to_host<uint16_t>(h, size_t(n * I)));
      const auto yg = cuda::to_host<float>(y, size_t(n * D));
      const auto h_twin = rounded_f16(swiglu_cpu(linear_cpu(x.f16, n, e.w1), linear_cpu(x.f16, n, e.w3), limit));
      const std::string tag = std::string("fp8 shared expert n=") + std::to_string(n) + " x " + act_name(at);
      int clamped = 0;
      for (float v : linear_cpu(x.f16, n, e.w3)) clamped += std::fabs(v) > limit;
      std::printf("  %s: %d of %lld up values beyond the clamp\n", tag.c_str(), clamped, (long long)(n * I));
      expect_close(tag + " h vs twin", hg, h_twin, I, 2e-3);
      expect_close(tag + " y vs twin", yg, linear_cpu(h_twin, n, e.w2), D, 1e-3);
      const Tensor yref = expert_ffn(e, limit, Tensor({n, D}, x.value), ref_numerics);
      expect_close(tag + " y vs fp32 reference", yg, yref.data, D, 5e-3);
    }
}
