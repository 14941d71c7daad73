// Differential tests of the CUDA decode kernels against their CPU twins (the reference backend's ops on the same
// checkpoint views, with the kernels' stated roundings) and against the fp32 reference itself.
//
// Tolerances (normalized: max |gpu - ref| / max |ref| over the output tensor):
//   twin, fp32 outputs      1e-4  the same math; only fp32 accumulation order and tensor-core adds differ
//   twin, fp16 outputs      2e-3  one fp16 rounding of the output (2^-11 relative) near a tie can go either way
//   fp32 reference          5e-3  the activations' fp16 rounding (2^-12 relative per element on average)
//   router logits           1e-6  fp64 accumulation, as the reference
//   router weights          1e-5  expf / log1pf are within 2 ulp of glibc's
//   routed MoE (end to end) 5e-3  fp16 activations and hidden state against the fp32 reference
// Every comparison prints where its largest error is (index, both values).
#include <algorithm>
#include <cstring>
#include <numeric>
#include <set>

#include <fmt/format.h>

#include "core/parallel.h"
#include "cuda/fp4_layout.h"
#include "cuda/fwd_kernels.h"
#include "cuda/kernels.h"
#include "cuda_test_util.h"
#include "model/experts.h"
#include "model/ops.h"
#include "model/router.h"

using namespace plumb;
using namespace plumb_cuda_test;
using cuda::Act;

namespace {

// ops::linear (the reference's arithmetic) with W's rows over the host's cores.
std::vector<float> linear_cpu(const std::vector<float>& x, int n, const Matrix& w) {
  const int64_t R = w.rows(), K = w.cols();
  if (x.size() != size_t(n) * size_t(K)) throw std::invalid_argument("linear_cpu: x is not [n, cols] for " + w.name());
  std::vector<float> y(size_t(n) * size_t(R));
  parallel_rows(R, [&](int64_t r0, int64_t r1) { ops::linear_rows(x.data(), n, K, w, r0, r1 - r0, y.data() + r0, R); });
  return y;
}

float silu_f(float v) { return v / (1.0f + std::exp(-v)); }

std::vector<float> swiglu_cpu(const std::vector<float>& g, const std::vector<float>& u, float limit) {
  std::vector<float> h(g.size());
  for (size_t i = 0; i < g.size(); ++i) {
    float gv = g[i], uv = u[i];
    if (limit > 0) gv = std::min(gv, limit), uv = std::clamp(uv, -limit, limit);
    h[i] = silu_f(gv) * uv;
  }
  return h;
}

std::vector<float> rounded_f16(std::vector<float> v) {
  for (auto& x : v) x = round_f16(x);
  return v;
}

std::vector<float> f16_to_float(const std::vector<uint16_t>& b) {
  std::vector<float> v(b.size());
  for (size_t i = 0; i < b.size(); ++i) v[i] = fmt8::f16_to_f32(b[i]);
  return v;
}

// Row r of w (its exact dequantized values) dotted with x in fp64; `row` is scratch of >= w.cols() floats.
double dot64(const Matrix& w, int64_t r, const float* x, std::vector<float>& row) {
  w.row(r, row.data());
  double acc = 0;
  for (int64_t k = 0; k < w.cols(); ++k) acc += double(row[size_t(k)]) * x[k];
  return acc;
}

}  // namespace

// ---- layout (host only: runs without a GPU) ----

TEST(CudaLayout, Fp4DecodeLayoutRoundTripsAndPlacesFragments) {
  Rng rng(1);
  const int64_t rows = 32, cols = 256;
  const auto canon = rng.bytes(size_t(rows * cols / 2));
  const auto rp = cuda::repack_fp4_decode(canon.data(), rows, cols);
  EXPECT_EQ(cuda::unpack_fp4_decode(rp.data(), rows, cols), canon);
  // Spot the documented placement (tile-major: [tile][chunk][row half][lane 4g + t][16 B]): row r, chunk 1, lane
  // part 3, group word 2, byte 1 holds L = e1 and H = e3 of the elements [32 * (4 + 2) + 24, +8): bit 7 s(L),
  // bits 3..1 e1 e0 m of L; bit 0 s(H), bits 4, 5, 6 e1, e0, m of H (mirrored: fp4_layout.h). Written out here
  // independently of fp4::pack_lh.
  auto nib = [&](int64_t r, int64_t k) { return (canon[size_t(r * cols / 2 + k / 2)] >> (4 * (k & 1))) & 0xF; };
  const int64_t e0 = 32 * 6 + 24;
  for (int64_t r : {2, 27}) {
    const int L = nib(r, e0 + 1), H = nib(r, e0 + 3);
    const int want = ((L >> 3) << 7) | ((L & 7) << 1) | (H >> 3) | (((H >> 2) & 1) << 4) | (((H >> 1) & 1) << 5) | ((H & 1) << 6);
    const int64_t at = (r / 16) * 16 * cols / 2 + 1 * 1024 + ((r % 16) / 8) * 512 + (4 * (r % 8) + 3) * 16 + 4 * 2 + 1;
    EXPECT_EQ(int(rp[size_t(at)]), want) << "row " << r;
  }
  // The kernels' decode (fp4_layout.h, fp4::to_f16x2, the host build of the same function: its byte permute and bit
  // reversal in plain C++): every word of the layout gives the f16 bits of its 8 codes' values times 2^-14, in the
  // pairs the MMAs take (e0 e1), (e2 e3), (e4 e5), (e6 e7).
  for_each_fp4_word(rp, rows, cols, [&](int64_t r, int64_t c, int t, int j, uint32_t w) {
    uint32_t pairs[4];
    cuda::fp4::to_f16x2(w, pairs[0], pairs[1], pairs[2], pairs[3]);
    for (int e = 0; e < 8; ++e) {
      const uint16_t bits = uint16_t(pairs[e / 2] >> (16 * (e % 2)));
      const int code = nib(r, (4 * c + j) * 32 + 8 * t + e);
      ASSERT_EQ(fmt8::f16_to_f32(bits), fmt8::e2m1_to_f32(uint8_t(code)) * std::ldexp(1.0f, -14))
          << "row " << r << " chunk " << c << " lane part " << t << " word " << j << " element " << e;
    }
  });
  EXPECT_THROW(cuda::repack_fp4_decode(canon.data(), 16, 96), Error);
  EXPECT_THROW(cuda::repack_fp4_decode(canon.data(), 3, 256), Error);
}

// A matrix the thread pool splits into ranges of rows: the same bytes as one thread (each row writes only its own
// fragments), in both layouts, and the layout still round-trips.
TEST(CudaLayout, Fp4RepackIsTheSameOnAnyThreadCount) {
  Rng rng(5);
  const int64_t rows = 512, cols = 2048;
  const auto canon = rng.bytes(size_t(rows * cols / 2));
  const int before = plumb::threads();
  for (const auto layout : {cuda::Fp4Layout::F16, cuda::Fp4Layout::A8}) {
    plumb::set_threads(1);
    const auto one = cuda::repack_fp4_decode(canon.data(), rows, cols, layout);
    plumb::set_threads(4);
    const auto four = cuda::repack_fp4_decode(canon.data(), rows, cols, layout);
    plumb::set_threads(before);
    EXPECT_EQ(one, four) << (layout == cuda::Fp4Layout::A8 ? "A8" : "F16");
    EXPECT_EQ(cuda::unpack_fp4_decode(four.data(), rows, cols, layout), canon);
  }
}

TEST(CudaAvailability, ReportsWhy) {
  std::string why;
  const bool ok = cuda::available(&why);
  std::printf("  cuda::available() = %s%s%s\n", ok ? "true" : "false", ok ? "" : ": ", why.c_str());
  if (!ok) {
    EXPECT_FALSE(why.empty());
  }
}

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

// HostStage (the decode step's and the sampler's uploads): each upload lands in stream order, from the stage's own
// copy of the bytes (the caller's buffer is free once upload returns), through slot reuse and growth.
TEST_F(GpuTest, HostStageUploadsLandInStreamOrder) {
  constexpr size_t kInts = 16384;
  cuda::DeviceBuffer dst(kInts * 4);
  dst.fill_byte(0);
  cuda::HostStage stage;
  auto seq = [](size_t n, int32_t mul, int32_t add) {
    std::vector<int32_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = int32_t(i) * mul + add;
    return v;
  };
  std::vector<int32_t> want(kInts, 0);
  auto put = [&](size_t at, std::vector<int32_t> v) {  // (by value: scribbled over once uploaded)
    stage.upload(dst.as<int32_t>() + at, v.data(), v.size() * 4);
    std::copy(v.begin(), v.end(), want.begin() + std::ptrdiff_t(at));
    std::fill(v.begin(), v.end(), -1);
  };
  put(0, seq(1000, 1, 0));         // slot 0
  put(4000, seq(3000, 7, 1));      // slot 1
  put(0, seq(12000, 3, 5));        // slot 0 again, grown past 4 KiB; overwrites the first upload
  put(13000, seq(500, -2, 9));     // slot 1 again
  put(100, seq(20, 11, 0));        // several uploads queued without a wait between them
  plumb::cuda::synchronize();
  const auto got = cuda::to_host<int32_t>(dst, kInts);
  for (size_t i = 0; i < kInts; ++i) ASSERT_EQ(got[i], want[i]) << "int " << i;
}

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
  TempDir dir;
  std::vector<OwnedTensor> ts;
  add_fp8(ts, rng, "se.w1", I, D, false, 116, 118);
  add_fp8(ts, rng, "se.w2", D, I, false, 116, 118);
  add_fp8(ts, rng, "se.w3", I, D, false, 116, 118);
  const Checkpoint ck = write_checkpoint(dir, ts);
  ExpertWeights e{Matrix::bind(ck, "se.w1.weight", I, D), Matrix::bind(ck, "se.w2.weight", D, I), Matrix::bind(ck, "se.w3.weight", I, D)};
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

// ---- routed experts (MXFP4) ----

class CudaMoe : public GpuTest {};

// gate/up (+ SwiGLU) and down per slot, the combine, for routings with repeats across and within tokens.
TEST_F(CudaMoe, GateUpDownCombineMatchTwin) {
  Rng rng(5);
  const int64_t E = 12, D = 1024, I = 512;
  auto f = make_moe(rng, E, D, I);
  const cuda::MoeExperts m = cuda::upload_experts(f->w);
  const float limit = 7.0f;
  struct Routing {
    const char* name;
    int n, K;
    std::vector<int32_t> idx;
  };
  std::vector<Routing> routings;
  {
    Routing r{"random distinct", 8, 4, random_distinct_routing(rng, 8, 4, E)};
    routings.push_back(r);
  }
  routings.push_back({"one token", 1, 4, {3, 0, 11, 7}});
  routings.push_back({"repeats within a token (hash table)", 3, 4, {2, 2, 5, 9, 9, 9, 1, 2, 4, 4, 4, 4}});
  routings.push_back({"every slot one expert (passes of 8)", 5, 4, std::vector<int32_t>(20, 6)});
  for (const auto& r : routings)
    for (Act at : {Act::F32, Act::BF16, Act::F16})
      for (bool pre : {false, true}) {
        if (pre && at != Act::BF16) continue;
        const int n = r.n, K = r.K, S = n * K;
        const Acts x = make_acts(at, rng.floats(size_t(n * D), -2.0f, 2.0f));
        const auto wts = rng.floats(size_t(S), 0.05f, 1.0f);
        cuda::DeviceBuffer idx = cuda::to_device(r.idx), wd = cuda::to_device(wts);
        cuda::DeviceBuffer h32(size_t(S * I) * 4), h16(size_t(S * I) * 2), ys(size_t(S * D) * 4), ys16(size_t(S * D) * 4),
            y(size_t(n * D) * 4);
        for (auto* b : {&h32, &h16, &ys, &ys16, &y}) b->fill_byte(0xFF);
        const float* pw = pre ? wd.as<float>() : nullptr;
        cuda::Workspace ws;
        cuda::moe_gate_up(m, idx.as<int32_t>(), n, K, x.dev.get(), at, limit, pw, nullptr, h32.as<float>(), ws);
        cuda::moe_gate_up(m, idx.as<int32_t>(), n, K, x.dev.get(), at, limit, pw, h16.as<uint16_t>(), nullptr, ws);
        cuda::moe_down(m, idx.as<int32_t>(), n, K, nullptr, h32.as<float>(), ys.as<float>(), ws);
        cuda::moe_down(m, idx.as<int32_t>(), n, K, h16.as<uint16_t>(), nullptr, ys16.as<float>(), ws);
        cuda::DeviceBuffer add = cuda::to_device(rng.floats(size_t(n * D), -1.0f, 1.0f));
        cuda::moe_combine(ys.as<float>(), wd.as<float>(), n, K, D, 1.5f, add.as<float>(), y.as<float>());
        cuda::synchronize();
        const auto hg = cuda::to_host<float>(h32, size_t(S * I));
        const auto hg16 = f16_to_float(cuda::to_host<uint16_t>(h16, size_t(S * I)));
        const auto ysg = cuda::to_host<float>(ys, size_t(S * D));
        const auto ysg16 = cuda::to_host<float>(ys16, size_t(S * D));
        const auto yg = cuda::to_host<float>(y, size_t(n * D));
        const auto addh = cuda::to_host<float>(add, size_t(n * D));
        // CPU twins, slot by slot.
        std::vector<float> h_twin(size_t(S * I)), ys_twin(size_t(S * D)), ys16_twin(size_t(S * D)), h_ref(size_t(S * I));
        for (int s = 0; s < S; ++s) {
          const auto& ex = f->w.experts[size_t(r.idx[size_t(s)])];
          const std::vector<float> xs(x.f16.begin() + (s / K) * D, x.f16.begin() + (s / K + 1) * D);
          auto h = swiglu_cpu(linear_cpu(xs, 1, ex.w1), linear_cpu(xs, 1, ex.w3), limit);
          if (pre)
            for (auto& v : h) v *= wts[size_t(s)];
          std::copy(h.begin(), h.end(), h_twin.begin() + s * I);
          const std::vector<float> hgs(hg.begin() + s * I, hg.begin() + (s + 1) * I), hg16s(hg16.begin() + s * I, hg16.begin() + (s + 1) * I);
          const auto yd = linear_cpu(rounded_f16(hgs), 1, ex.w2), yd16 = linear_cpu(hg16s, 1, ex.w2);
          std::copy(yd.begin(), yd.end(), ys_twin.begin() + s * D);
          std::copy(yd16.begin(), yd16.end(), ys16_twin.begin() + s * D);
          const std::vector<float> xv(x.value.begin() + (s / K) * D, x.value.begin() + (s / K + 1) * D);
          auto hr = swiglu_cpu(linear_cpu(xv, 1, ex.w1), linear_cpu(xv, 1, ex.w3), limit);
          if (pre)
            for (auto& v : hr) v *= wts[size_t(s)];
          std::copy(hr.begin(), hr.end(), h_ref.begin() + s * I);
        }
        std::vector<float> y_twin(size_t(n * D));
        for (int t = 0; t < n; ++t)
          for (int64_t dd = 0; dd < D; ++dd) {
            float acc = 0;
            for (int k = 0; k < K; ++k) acc = std::fma(wts[size_t(t * K + k)], ysg[size_t((t * K + k) * D + dd)], acc);
            y_twin[size_t(t * D + dd)] = acc * 1.5f + addh[size_t(t * D + dd)];
          }
        const std::string tag = std::string("moe [") + r.name + "] n=" + std::to_string(n) + " x " + act_name(at) +
                                (pre ? " weight-before-down" : "");
        expect_close(tag + " gate/up h32 vs twin", hg, h_twin, I, 1e-4);
        expect_close(tag + " gate/up h16 vs twin", hg16, rounded_f16(h_twin), I, 2e-3);
        expect_close(tag + " gate/up h32 vs fp32 reference", hg, h_ref, I, 5e-3);
        expect_close(tag + " down (h32 in) vs twin", ysg, ys_twin, D, 1e-4);
        expect_close(tag + " down (h16 in) vs twin", ysg16, ys16_twin, D, 1e-4);
        expect_close(tag + " combine vs twin", yg, y_twin, D, 1e-6);
      }
}

// One FP4 MoE launch through launch_gemv with the configuration fields of cfg: gate/up + SwiGLU (which 0: x rows
// by token, pre-weighted by pw) or down (which 1: h rows by slot); the fp32 output of every slot (0xFF-filled first).
struct Fp4MoeCase {
  const cuda::MoeExperts& m;
  const cuda::DeviceBuffer &idx, &pw;
  const Acts &x, &h;
  int n, K;
  std::vector<float> run(int which, const cuda::detail::GemvArgs& cfg) const {
    namespace d = cuda::detail;
    const int S = n * K;
    const int64_t D = m.w1.cols, I = m.w1.rows;
    const cuda::Fp4Matrices& w = which == 0 ? m.w1 : m.w2;
    cuda::DeviceBuffer out(size_t(S) * size_t(w.rows) * 4);
    out.fill_byte(0xFF);
    d::GemvArgs a = cfg;
    a.fmt = d::kFp4, a.mode = d::kMoe, a.act = d::kF16, a.idx = idx.as<int32_t>(), a.n = n, a.topk = K, a.problems = int(m.E);
    a.w[0] = w.codes.as<uint8_t>(), a.s[0] = w.scales.get();
    a.w_prob_stride = int64_t(w.code_bytes()), a.s_prob_stride = int64_t(w.scale_bytes());
    a.rows = w.rows, a.cols = w.cols, a.s_ld = w.cols / 32;
    if (which == 0) {
      a.nmat = 2, a.epi = d::kSwiglu, a.limit = 7.0f, a.pre_weight = pw.as<float>();
      a.w[1] = m.w3.codes.as<uint8_t>(), a.s[1] = m.w3.scales.get();
      a.x = x.dev.get(), a.x_tok_stride = D, a.x_by_token = 1, a.o_tok_stride = I;
    } else {
      a.x = h.dev.get(), a.x_tok_stride = I, a.o_tok_stride = D;
    }
    a.out = out.get();
    d::launch_gemv(a, nullptr);
    cuda::synchronize();
    return cuda::to_host<float>(out, size_t(S) * size_t(w.rows));
  }
};

// The FP4 MoE kernels through launch_gemv: the streaming kernel (fp4_kernel 2) in each of its configurations (warps per CTA,
// stages in flight, CTAs per SM, programmatic dependent launch, warps splitting K) against the per-tile kernel on the
// same inputs. fp32 outputs: only the accumulation order differs. The routing repeats experts within and across
// tokens and gives one expert more than 8 tokens (passes of 8).
TEST_F(CudaMoe, StreamingConfigsMatchPerTile) {
  namespace d = cuda::detail;
  Rng rng(11);
  const int64_t E = 6, D = 2048, I = 1024;
  auto f = make_moe(rng, E, D, I);
  const cuda::MoeExperts m = cuda::upload_experts(f->w);
  const int n = 7, K = 4, S = n * K;
  std::vector<int32_t> idx(static_cast<size_t>(S));
  // Expert 2 takes every third slot (10: passes of 8 and 2), experts 5 and 0 one slot each (the one-token path),
  // the rest go to experts 1, 3, 4 at random.
  std::uniform_int_distribution<int> pick(0, 2);
  const int rest[3] = {1, 3, 4};
  for (int s = 0; s < S; ++s) idx[size_t(s)] = s % 3 == 0 ? 2 : s == 1 ? 5 : s == 2 ? 0 : rest[pick(rng.gen())];
  const Acts x = make_acts(Act::F16, rng.floats(size_t(n * D), -2.0f, 2.0f));
  const Acts h = make_acts(Act::F16, rng.floats(size_t(S * I), -2.0f, 2.0f));
  cuda::DeviceBuffer di = cuda::to_device(idx), pw = cuda::to_device(rng.floats(size_t(S), 0.1f, 1.0f));
  const Fp4MoeCase mc{m, di, pw, x, h, n, K};
  auto run = [&](int which, const d::GemvArgs& cfg) { return mc.run(which, cfg); };
  d::GemvArgs tile;
  tile.fp4_kernel = 1, tile.warps = 4;
  const std::vector<float> ref_gu = run(0, tile), ref_dn = run(1, tile);
  struct Cfg {
    int warps, depth, ctas, pdl, ks;
  };
  for (const Cfg& c : {Cfg{0, 0, 0, -1, 0}, Cfg{1, 2, 0, 0, 0}, Cfg{2, 3, 0, 1, 2}, Cfg{4, 4, 1, 0, 4}, Cfg{8, 2, 0, 1, 2},
                       Cfg{3, 6, 0, 0, 0}, Cfg{4, 2, 0, 0, 2}, Cfg{8, 3, 0, 0, 8}, Cfg{8, 2, 2, 0, 4}, Cfg{2, 2, 0, 0, 1}}) {
    d::GemvArgs a;
    a.fp4_kernel = 2, a.fp4_warps = c.warps, a.fp4_depth = c.depth, a.fp4_ctas = c.ctas, a.pdl = c.pdl;
    a.fp4_ksplit = c.ks;
    const std::string tag = "fp4 streaming (warps " + std::to_string(c.warps) + ", depth " + std::to_string(c.depth) +
                            ", ctas " + std::to_string(c.ctas) + ", pdl " + std::to_string(c.pdl) + ", ks " +
                            std::to_string(c.ks) + ")";
    expect_close(tag + " gate/up vs per-tile", run(0, a), ref_gu, I, 1e-5);
    expect_close(tag + " down vs per-tile", run(1, a), ref_dn, D, 1e-5);
  }
  // The per-tile kernel's own variants: warps per block, register budget (minblocks), PDL (the library defaults:
  // gate/up 4 warps at minblocks 3 at <= 8 slots, 2 at minblocks 2 above; down 2 warps at <= 8 slots, 1 above, both
  // at minblocks 3; PDL at <= 8 slots and for down). At minblocks 1, up to 4 warps take the 168-register instantiation
  // (gemv.cu, MINB 0), 8 warps the uncapped one.
  struct TileCfg {
    int warps, minb, pdl;
  };
  for (const TileCfg& c : {TileCfg{2, 1, 1}, TileCfg{2, 2, 0}, TileCfg{2, 2, 1}, TileCfg{4, 3, 0}, TileCfg{8, 3, 1}, TileCfg{3, 1, 0},
                           TileCfg{1, 1, 1}, TileCfg{1, 2, 1}, TileCfg{4, 1, 1}, TileCfg{8, 1, 0}}) {
    d::GemvArgs a;
    a.fp4_kernel = 1, a.warps = c.warps, a.minblocks = c.minb, a.pdl = c.pdl;
    const std::string tag = "fp4 per-tile (warps " + std::to_string(c.warps) + ", minblocks " + std::to_string(c.minb) +
                            ", pdl " + std::to_string(c.pdl) + ")";
    expect_close(tag + " gate/up vs per-tile", run(0, a), ref_gu, I, 1e-5);
    expect_close(tag + " down vs per-tile", run(1, a), ref_dn, D, 1e-5);
  }
}

// pdl_early (down's routing read, and its first weights requested, before the PDL wait) against the same launch
// without it, bit for bit, with 1 and 2 warps and each register budget: two shapes (chunks per warp a multiple of the 4 in flight, 2048 x
// 1024, and not, 1152 x 640); the routing repeats an expert (several tokens per pass) and gives others one slot
// (the one-token path). (Eager launches: the forward's graph tests under cuda.pdl run it after gate/up.)
TEST_F(CudaMoe, EarlyRoutingReadMatchesBitForBit) {
  namespace d = cuda::detail;
  Rng rng(17);
  for (const auto& [D, I] : {std::pair<int64_t, int64_t>{2048, 1024}, std::pair<int64_t, int64_t>{1152, 640}}) {
    const int64_t E = 5;
    auto f = make_moe(rng, E, D, I);
    const cuda::MoeExperts m = cuda::upload_experts(f->w);
    const int n = 5, K = 3, S = n * K;
    std::vector<int32_t> idx(static_cast<size_t>(S));
    for (int s = 0; s < S; ++s) idx[size_t(s)] = s % 2 == 0 ? 1 : s == 3 ? 4 : s % 3 == 0 ? 0 : 2 + s % 2;
    const Acts x = make_acts(Act::F16, rng.floats(size_t(n * D), -2.0f, 2.0f));
    const Acts h = make_acts(Act::F16, rng.floats(size_t(S * I), -2.0f, 2.0f));
    cuda::DeviceBuffer di = cuda::to_device(idx), pw = cuda::to_device(rng.floats(size_t(S), 0.1f, 1.0f));
    const Fp4MoeCase mc{m, di, pw, x, h, n, K};
    for (int warps : {1, 2})
      for (int minb : {1, 2, 3}) {  // (3: down's default budget, with 2 warps at <= 8 slots and 1 above)
        d::GemvArgs a;
        a.fp4_kernel = 1, a.warps = warps, a.minblocks = minb, a.pdl = 1;
        const std::vector<float> ref = mc.run(1, a);
        a.pdl_early = 1;
        const std::vector<float> got = mc.run(1, a);
        size_t first = 0;
        while (first < ref.size() && std::memcmp(&ref[first], &got[first], 4) == 0) ++first;
        EXPECT_EQ(first, ref.size()) << "down " << D << " x " << I << ", warps " << warps << ", minblocks " << minb
                                     << ": first differing output " << first;
      }
  }
}

// The decode kernels with moe_group's table (a block per table tile) against the per-slot scan, bit for bit: 360
// slots (the per-tile kernel either way), one expert with 100 slots (two tiles of the table: 64 + 36), one with a
// single slot, an out-of-range id (no output either way), experts with none.
// The decode kernels with moe_group's table against their own grouping: gate/up (per-tile, a block per table tile
// or per slot) and down (the streaming kernel, the grouping read from the table or built in its prologue) give the
// same bits at 240 slots (one expert with 100 slots: 13 passes; an expert id -1); at 360 slots, beyond the
// streaming kernel's own grouping, down with the table (streaming) against the per-tile kernel's scan: another sum
// order, within 1e-5 of the largest output.
TEST_F(CudaMoe, GroupTableMatchesScan) {
  Rng rng(13);
  const int64_t E = 16, D = 2048, I = 1024;
  auto f = make_moe(rng, E, D, I);
  const cuda::MoeExperts m = cuda::upload_experts(f->w);
  for (const int n : {40, 60}) {
    const int K = 6, S = n * K;
    SCOPED_TRACE("slots " + std::to_string(S));
    std::vector<int32_t> idx(static_cast<size_t>(S));
    std::uniform_int_distribution<int> pick(8, 15);
    for (int s = 0; s < S; ++s) idx[size_t(s)] = s < 200 && s % 2 == 0 ? 3 : s == 201 ? 7 : s == 203 ? -1 : pick(rng.gen());
    const Acts x = make_acts(Act::F16, rng.floats(size_t(n * D), -2.0f, 2.0f));
    cuda::DeviceBuffer di = cuda::to_device(idx), groups(cuda::moe_group_bytes(n, K, E));
    cuda::Workspace ws;
    auto run = [&](bool table, std::vector<uint16_t>& h, std::vector<float>& ys) {
      cuda::DeviceBuffer dh(size_t(S) * size_t(I) * 2), dy(size_t(S) * size_t(D) * 4);
      dh.fill_byte(0xFF), dy.fill_byte(0xFF);
      const void* g = nullptr;
      if (table) cuda::moe_group(di.as<int32_t>(), n, K, E, groups.get()), g = groups.get();
      cuda::moe_gate_up(m, di.as<int32_t>(), n, K, x.dev.get(), Act::F16, 7.0, nullptr, dh.as<uint16_t>(), nullptr, ws, nullptr, g);
      cuda::moe_down(m, di.as<int32_t>(), n, K, dh.as<uint16_t>(), nullptr, dy.as<float>(), ws, nullptr, g);
      cuda::synchronize();
      h = cuda::to_host<uint16_t>(dh, size_t(S) * size_t(I));
      ys = cuda::to_host<float>(dy, size_t(S) * size_t(D));
    };
    std::vector<uint16_t> h0, h1;
    std::vector<float> y0, y1;
    run(false, h0, y0);
    run(true, h1, y1);
    auto first_diff = [](const void* a, const void* b, size_t n, size_t sz) {
      for (size_t i = 0; i < n; ++i)
        if (std::memcmp(static_cast<const char*>(a) + i * sz, static_cast<const char*>(b) + i * sz, sz) != 0) return int64_t(i);
      return int64_t(-1);
    };
    const int64_t dh = first_diff(h0.data(), h1.data(), h0.size(), 2), dy = first_diff(y0.data(), y1.data(), y0.size(), 4);
    EXPECT_EQ(dh, -1) << "gate/up with the table differs from the scan first at slot " << dh / I << ", column " << dh % I;
    if (S <= 256) {
      EXPECT_EQ(dy, -1) << "down with the table differs from the scan first at slot " << dy / D << ", column " << dy % D;
    } else {
      double worst = 0, big = 0;
      size_t at = 0;
      for (size_t i = 0; i < y0.size(); ++i) {
        if (i / size_t(D) == 203) continue;  // the slot with expert id -1 (checked below)
        big = std::max(big, double(std::fabs(y0[i])));
        const double d = std::fabs(double(y0[i]) - double(y1[i]));
        if (!(d <= worst)) worst = d, at = i;
      }
      EXPECT_LE(worst, 1e-5 * big) << "down with the table (streaming) against the scan (per-tile) at slot " << at / size_t(D)
                                   << ", column " << at % size_t(D) << ": " << y1[at] << " against " << y0[at];
    }
    // The out-of-range slot is written by neither.
    uint32_t bits;
    std::memcpy(&bits, &y1[size_t(203) * size_t(D)], 4);
    EXPECT_EQ(bits, 0xFFFFFFFFu) << "a slot with expert id -1 was written";
  }
}

// cuda.topk_in_experts: one token's gate/up launch that ranks the gate's logits itself, then down on the indices it
// stored, against the router's launch then gate/up and down. Every routing it takes (experts per lane 1, 2, 4, 8 and
// V4's code; the three scores, hash tables with repeats, groups, the faults' renormalizations, a fold) on ordinary
// logits and on rows with exact ties, NaN and infinities; with PDL (down reads the indices before its wait) and
// without. The routing, h and the outputs must be the same bits; arguments it does not take are refused.
TEST_F(CudaMoe, RankedInExpertsMatchesRouterLaunch) {
  namespace d = cuda::detail;
  Rng rng(31);
  const int64_t D = 256, I = 128;
  struct Case {
    int E, K, score, hash, groups, topk_groups, variant;  // variant: 0 plain, 1 no renorm, 2 unfloored, 3 naive softplus
    float fold;
  };
  const Case cases[] = {{256, 6, 0, 0, 1, 1, 0, 2.5f},  {256, 8, 1, 0, 8, 4, 0, 1.0f}, {64, 6, 2, 0, 1, 1, 1, 1.0f},
                        {40, 4, 0, 0, 1, 1, 2, 1.5f},   {8, 2, 0, 1, 1, 1, 0, 1.5f},   {200, 6, 0, 1, 1, 1, 0, 1.0f},
                        {100, 5, 0, 0, 1, 1, 3, 1.0f}, {16, 8, 2, 0, 4, 2, 0, 1.0f}};
  std::set<int> variants;
  for (const Case& c : cases) {
    auto f = make_moe(rng, c.E, D, I);
    const cuda::MoeExperts m = cuda::upload_experts(f->w);
    for (int row = 0; row < 3; ++row)
      for (const bool pdl : {false, true}) {
        std::vector<float> lg = rng.floats(size_t(c.E), -3.0f, 3.0f);
        if (row == 1)
          for (auto& v : lg) v = 0.5f * float(rng.integer(0, 3));  // exact ties
        if (row == 2) lg[size_t(c.E / 3)] = NAN, lg[size_t(c.E / 2)] = INFINITY, lg[size_t(c.E - 1)] = -INFINITY, lg[1] = -0.0f;
        std::vector<float> bias(size_t(c.E));
        for (auto& v : bias) v = row == 1 ? 0.01f * float(rng.integer(0, 3)) : rng.uniform(-0.05f, 0.05f);
        std::vector<int32_t> tid2eid(size_t(50 * c.K));
        for (auto& v : tid2eid) v = rng.integer(0, 2) == 0 ? 1 : rng.integer(0, c.E - 1);  // repeats within a token
        const std::vector<int32_t> tok = {rng.integer(0, 49)};
        const Acts x = make_acts(Act::F16, rng.floats(size_t(D), -2.0f, 2.0f));
        cuda::DeviceBuffer dl = cuda::to_device(lg), db = cuda::to_device(bias), dm = cuda::to_device(tid2eid), dt = cuda::to_device(tok);
        struct Out {
          std::vector<int32_t> idx;
          std::vector<float> weight, select, ys;
          std::vector<uint16_t> h;
        };
        d::RouteArgs a;
        a.n = 1, a.E = c.E, a.K = c.K, a.score = c.score, a.hash = c.hash, a.n_group = c.groups, a.topk_group = c.topk_groups;
        a.renorm = c.variant != 1, a.unfloored = c.variant == 2, a.softplus_naive = c.variant == 3, a.fold = c.fold;
        a.logits = dl.as<float>(), a.tokens = dt.as<int32_t>();
        a.bias = c.hash ? nullptr : db.as<float>();
        a.tid2eid = c.hash ? dm.as<int32_t>() : nullptr;
        auto run = [&](bool ranked) {
          cuda::DeviceBuffer di(size_t(c.K) * 4), dw(size_t(c.K) * 4), ds(size_t(c.E) * 4), dh(size_t(c.K * I) * 2), dy(size_t(c.K * D) * 4);
          for (auto* b : {&di, &dw, &ds, &dh, &dy}) b->fill_byte(0xAB);
          d::RouteArgs r = a;
          r.idx = di.as<int32_t>(), r.weight = dw.as<float>(), r.select = c.hash ? nullptr : ds.as<float>();
          cuda::Workspace ws;
          {
            const d::PdlScope on(pdl);
            if (ranked) {
              EXPECT_TRUE(cuda::moe_ranks_in_experts(r, m));
              cuda::moe_gate_up_ranked(m, r, x.dev.get(), Act::F16, 7.0, dh.as<uint16_t>(), ws);
              cuda::moe_down(m, r.idx, 1, c.K, dh.as<uint16_t>(), nullptr, dy.as<float>(), ws);
            } else {
              d::fwd_route(r, nullptr);
              cuda::moe_gate_up(m, r.idx, 1, c.K, x.dev.get(), Act::F16, 7.0, nullptr, dh.as<uint16_t>(), nullptr, ws);
              cuda::moe_down(m, r.idx, 1, c.K, dh.as<uint16_t>(), nullptr, dy.as<float>(), ws);
            }
          }
          cuda::synchronize();
          variants.insert(d::route_warp_variant(r));
          return Out{cuda::to_host<int32_t>(di, size_t(c.K)), cuda::to_host<float>(dw, size_t(c.K)), cuda::to_host<float>(ds, size_t(c.E)),
                     cuda::to_host<float>(dy, size_t(c.K * D)), cuda::to_host<uint16_t>(dh, size_t(c.K * I))};
        };
        const Out want = run(false), got = run(true);
        const std::string tag = fmt::format("E {} K {} score {} hash {} groups {}/{} variant {} row {}{}", c.E, c.K, c.score, c.hash, c.groups,
                                            c.topk_groups, c.variant, row, pdl ? " (PDL)" : "");
        ASSERT_EQ(got.idx, want.idx) << tag << ": indices";
        ASSERT_EQ(0, std::memcmp(got.weight.data(), want.weight.data(), got.weight.size() * 4)) << tag << ": weights";
        if (!c.hash) {
          ASSERT_EQ(0, std::memcmp(got.select.data(), want.select.data(), got.select.size() * 4)) << tag << ": selection scores";
        }
        for (int s = 0; s < c.K * I; ++s) ASSERT_EQ(got.h[size_t(s)], want.h[size_t(s)]) << tag << ": h at slot " << s / I << ", column " << s % I;
        for (int s = 0; s < c.K * D; ++s)
          ASSERT_EQ(0, std::memcmp(&got.ys[size_t(s)], &want.ys[size_t(s)], 4)) << tag << ": ys at slot " << s / D << ", column " << s % D;
      }
    // Not taken: more than one token, another expert count than the experts'.
    d::RouteArgs bad;
    bad.n = 2, bad.E = c.E, bad.K = c.K;
    EXPECT_FALSE(cuda::moe_ranks_in_experts(bad, m));
    bad.n = 1, bad.E = c.E + 1;
    EXPECT_FALSE(cuda::moe_ranks_in_experts(bad, m));
  }
  EXPECT_EQ(variants, (std::set<int>{1, 2, 3, 4, 5})) << "not every variant of the warp code ran";
}

// The real V4-Flash expert shapes (D 4096, I 2048), 8 tokens x top-6 over 8 experts; sampled rows on the CPU.
TEST_F(CudaMoe, RealShapesSampledRows) {
  Rng rng(6);
  const int64_t E = 8, D = 4096, I = 2048;
  auto f = make_moe(rng, E, D, I, false, 116, 122);
  const cuda::MoeExperts m = cuda::upload_experts(f->w);
  const int n = 8, K = 6, S = n * K;
  const std::vector<int32_t> idx = random_distinct_routing(rng, n, K, E);
  const Acts x = make_acts(Act::BF16, rng.floats(size_t(n * D), -2.0f, 2.0f));
  cuda::DeviceBuffer di = cuda::to_device(idx), h(size_t(S * I) * 4), ys(size_t(S * D) * 4);
  h.fill_byte(0xFF), ys.fill_byte(0xFF);
  cuda::Workspace ws;
  cuda::moe_gate_up(m, di.as<int32_t>(), n, K, x.dev.get(), Act::BF16, 10.0, nullptr, nullptr, h.as<float>(), ws);
  cuda::moe_down(m, di.as<int32_t>(), n, K, nullptr, h.as<float>(), ys.as<float>(), ws);
  cuda::synchronize();
  const auto hg = cuda::to_host<float>(h, size_t(S * I));
  const auto ysg = cuda::to_host<float>(ys, size_t(S * D));
  std::vector<float> hs, hs_ref, ysv, ys_ref;
  std::vector<float> row(size_t(std::max(D, I)));
  for (int s = 0; s < S; s += 5) {
    const auto& ex = f->w.experts[size_t(idx[size_t(s)])];
    const float* xs = x.f16.data() + (s / K) * D;
    for (int64_t r = 0; r < I; r += 31) {
      hs.push_back(hg[size_t(s * I + r)]);
      hs_ref.push_back(swiglu_cpu({float(dot64(ex.w1, r, xs, row))}, {float(dot64(ex.w3, r, xs, row))}, 10.0f)[0]);
    }
    const auto h16 = rounded_f16(std::vector<float>(hg.begin() + s * I, hg.begin() + (s + 1) * I));
    for (int64_t r = 0; r < D; r += 37) {
      ysv.push_back(ysg[size_t(s * D + r)]);
      ys_ref.push_back(float(dot64(ex.w2, r, h16.data(), row)));
    }
  }
  expect_close("moe real shapes gate/up sampled vs twin", hs, hs_ref, int64_t(hs.size()), 1e-4);
  expect_close("moe real shapes down sampled vs twin", ysv, ys_ref, int64_t(ysv.size()), 1e-4);
}

// ---- routed experts for prefill (grouped GEMMs) ----

namespace {

// Per-expert slot lists of a routing as moe_group must build them (slot order within an expert), and the tiles.
void expect_groups(const std::vector<int32_t>& idx, int n, int K, int64_t E, const cuda::DeviceBuffer& groups) {
  namespace d = cuda::detail;
  const int S = n * K;
  const d::GroupLayout L = d::group_layout(S, E);
  const auto g = cuda::to_host<int32_t>(groups, size_t(L.ints));
  std::vector<int32_t> offs{0}, list, tiles;
  for (int64_t e = 0; e < E; ++e) {
    const int o = int(list.size());
    for (int s = 0; s < S; ++s)
      if (idx[size_t(s)] == e) list.push_back(s);
    for (int p = o; p < int(list.size()); p += d::kGroupTokens) tiles.push_back(int32_t(e)), tiles.push_back(p);
    offs.push_back(int(list.size()));
  }
  ASSERT_EQ(g[0], int(tiles.size() / 2)) << "tile count";
  ASSERT_LE(int64_t(tiles.size() / 2), L.max_tiles);
  EXPECT_TRUE(std::equal(offs.begin(), offs.end(), g.begin() + L.offs)) << "expert offsets";
  EXPECT_TRUE(std::equal(list.begin(), list.end(), g.begin() + L.list)) << "slot lists";
  EXPECT_TRUE(std::equal(tiles.begin(), tiles.end(), g.begin() + L.tiles)) << "tile table";
}

// A skewed routing over experts 1..E-1 (expert 0 never chosen): slot 0 of every token is expert 2 (n tokens: whole
// and partial tiles), slot 1 is expert 3 for the first 64 tokens (exactly one tile), one slot of token n/3 is expert
// 1 (a single token), the rest uniform over experts 4..E-1 with repeats within a token (as hash routing allows).
std::vector<int32_t> skewed_routing(Rng& rng, int n, int K, int64_t E) {
  std::uniform_int_distribution<int> pick(4, int(E) - 1);
  std::vector<int32_t> idx(size_t(n) * size_t(K));
  for (int t = 0; t < n; ++t)
    for (int k = 0; k < K; ++k)
      idx[size_t(t * K + k)] = k == 0 ? 2 : (k == 1 && t < 64) ? 3 : (k == K - 1 && t == n / 3) ? 1 : pick(rng.gen());
  return idx;
}

}  // namespace

// Two fp32 vectors with the same bits (signed zeros and NaN payloads included), unlike ==.
static bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Small shapes, every output against the CPU twin (gate/up with SwiGLU, f16 h; down from that h, fp32), with and
// without the routing weight before W2, and the grouping itself exactly; every kernel variant (0-6, moe_prefill.cu),
// for three scale ranges: the usual one (118..124), one at the limit of the folded-scale variants (98..122: 24 apart,
// so codes reach 0.5 * 2^-23 = 2^-24, the least f16 subnormal, inside variants 2-4), and one past it (97..122),
// where variants 2-4 must be refused and the default must be variant 1, bit for bit. Expert 2's 150 slots make
// tiles of 64, 64 and 22 (variant 4: one block of 128 and one of 22; variants 5-6: 75 and 75). Variants 5 and 6
// (variant 4's arithmetic, pipelined per k-step; 6 with the swizzled staging) must give variant 4's bits.
TEST_F(CudaMoe, GroupedPrefillMatchesTwin) {
  for (const auto& [slo, shi] : std::vector<std::pair<int, int>>{{118, 124}, {98, 122}, {97, 122}}) {
  Rng rng(21);
  const int64_t E = 12, D = 1024, I = 512;
  auto f = make_moe(rng, E, D, I, false, slo, shi);
  const cuda::MoeExperts m = cuda::upload_experts(f->w);
  const bool foldable = shi - slo <= 24;
  ASSERT_EQ(m.w1.scale_lo, slo);
  ASSERT_EQ(m.w2.scale_hi, shi);
  const int n = 150, K = 4, S = n * K;
  const float limit = 7.0f;
  const std::vector<int32_t> idx = skewed_routing(rng, n, K, E);
  const Acts x = make_acts(Act::F32, rng.floats(size_t(n * D), -2.0f, 2.0f));
  const auto wts = rng.floats(size_t(S), 0.05f, 1.0f);
  cuda::DeviceBuffer di = cuda::to_device(idx), wd = cuda::to_device(wts), groups(cuda::moe_group_bytes(n, K, E));
  groups.fill_byte(0xFF);
  cuda::moe_group(di.as<int32_t>(), n, K, E, groups.get());
  cuda::synchronize();
  expect_groups(idx, n, K, E, groups);
  std::vector<float> h_v1, ys_v1;  // variant 1's outputs (pre = false), for the default's check
  std::vector<uint16_t> h_v4[2];   // variant 4's (pre = false, true), for variants 5-6
  std::vector<float> ys_v4[2];
  for (int variant = 0; variant < cuda::detail::kGroupedVariants; ++variant)
  for (bool pre : {false, true}) {
    cuda::DeviceBuffer h16(size_t(S * I) * 2), ys(size_t(S * D) * 4);
    h16.fill_byte(0xFF), ys.fill_byte(0xFF);
    cuda::Workspace ws;
    if (variant >= 2 && !foldable) {  // the scales are too far apart to fold: refused by name
      EXPECT_THROW(cuda::moe_gate_up_grouped(m, groups.get(), n, K, x.dev.get(), Act::F32, limit, nullptr, h16.as<uint16_t>(), ws,
                                             nullptr, variant),
                   std::runtime_error);
      EXPECT_THROW(cuda::moe_down_grouped(m, groups.get(), n, K, h16.as<uint16_t>(), ys.as<float>(), nullptr, variant),
                   std::runtime_error);
      continue;
    }
    cuda::moe_gate_up_grouped(m, groups.get(), n, K, x.dev.get(), Act::F32, limit, pre ? wd.as<float>() : nullptr,
                              h16.as<uint16_t>(), ws, nullptr, variant);
    cuda::moe_down_grouped(m, groups.get(), n, K, h16.as<uint16_t>(), ys.as<float>(), nullptr, variant);
    cuda::synchronize();
    const auto hg = f16_to_float(cuda::to_host<uint16_t>(h16, size_t(S * I)));
    const auto ysg = cuda::to_host<float>(ys, size_t(S * D));
    if (variant == 1 && !pre) h_v1 = hg, ys_v1 = ysg;
    if (variant == 4) h_v4[pre] = cuda::to_host<uint16_t>(h16, size_t(S * I)), ys_v4[pre] = ysg;
    if (variant >= 5) {
      EXPECT_TRUE(cuda::to_host<uint16_t>(h16, size_t(S * I)) == h_v4[pre]) << "variant " << variant << " h is not variant 4's bits";
      EXPECT_TRUE(same_bits(ysg, ys_v4[pre])) << "variant " << variant << " down is not variant 4's bits";
    }
    // The twin, expert by expert (all of an expert's slots in one ops::linear).
    std::vector<float> h_twin(size_t(S * I)), ys_twin(size_t(S * D));
    for (int64_t e = 0; e < E; ++e) {
      std::vector<int> sl;
      for (int s = 0; s < S; ++s)
        if (idx[size_t(s)] == e) sl.push_back(s);
      if (sl.empty()) continue;
      const int c = int(sl.size());
      std::vector<float> xs(size_t(c) * size_t(D)), hs(size_t(c) * size_t(I));
      for (int i = 0; i < c; ++i) {
        std::copy_n(x.f16.begin() + (sl[size_t(i)] / K) * D, D, xs.begin() + i * D);
        std::copy_n(hg.begin() + sl[size_t(i)] * I, I, hs.begin() + i * I);
      }
      const auto& ex = f->w.experts[size_t(e)];
      const auto h = swiglu_cpu(linear_cpu(xs, c, ex.w1), linear_cpu(xs, c, ex.w3), limit);
      const auto y = linear_cpu(hs, c, ex.w2);
      for (int i = 0; i < c; ++i) {
        const int s = sl[size_t(i)];
        for (int64_t r = 0; r < I; ++r) h_twin[size_t(s * I + r)] = h[size_t(i * I + r)] * (pre ? wts[size_t(s)] : 1.0f);
        std::copy_n(y.begin() + i * D, D, ys_twin.begin() + s * D);
      }
    }
    const std::string tag = "grouped moe (variant " + std::to_string(variant) + ", scales " + std::to_string(slo) + ".." +
                            std::to_string(shi) + ") n=150 K=4 E=12 skewed" + (pre ? " weight-before-down" : "");
    expect_close(tag + " gate/up h16 vs twin", hg, rounded_f16(h_twin), I, 2e-3);
    expect_close(tag + " down (h16 in) vs twin", ysg, ys_twin, D, 1e-4);
  }
  // The default: variant kGroupedFoldedDefault where the scales fold (checked above), else variant 1 bit for bit.
  if (!foldable) {
    cuda::DeviceBuffer h16(size_t(S * I) * 2), ys(size_t(S * D) * 4);
    cuda::Workspace ws;
    cuda::moe_gate_up_grouped(m, groups.get(), n, K, x.dev.get(), Act::F32, limit, nullptr, h16.as<uint16_t>(), ws);
    cuda::moe_down_grouped(m, groups.get(), n, K, h16.as<uint16_t>(), ys.as<float>());
    cuda::synchronize();
    EXPECT_EQ(f16_to_float(cuda::to_host<uint16_t>(h16, size_t(S * I))), h_v1) << "default must be variant 1 (scales do not fold)";
    EXPECT_EQ(cuda::to_host<float>(ys, size_t(S * D)), ys_v1) << "default must be variant 1 (scales do not fold)";
  }
  }
}

// Host-only (no GPU needed): the folded-scale constants (fold_scales) make every E2M1 code times its E8M0 scale an
// exact f16, for every scale byte of every admissible range, emulating the kernel's integer steps (fp4_frag's
// v * 2^-14 bit placement, the byte add, the f16 multiplier's exponent field); ranges wider than 24 are refused.
TEST(CudaMoeFold, FoldedWeightsAreExactF16) {
  namespace d = cuda::detail;
  const double mags[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  int checked = 0;
  for (int lo = 2; lo <= 254; ++lo)
    for (int hi = lo; hi <= std::min(254, lo + 30); ++hi) {
      uint32_t add = 0;
      float unscale = 0;
      const bool ok = d::fold_scales(lo, hi, add, unscale);
      ASSERT_EQ(ok, hi - lo <= 24) << lo << ".." << hi;
      if (!ok) continue;
      ASSERT_EQ(double(unscale), std::ldexp(1.0, hi - 128));
      for (int b : {lo, (lo + hi) / 2, hi}) {
        const int field = int((uint32_t(b) + (add & 0xFFu)) & 0xFFu);  // one byte of fold_word, before the << 2
        ASSERT_GE(field, 6);
        ASSERT_LE(field, 30);
        const double mul = std::ldexp(1.0, field - 15);  // the f16 multiplier (normal)
        for (double v : mags) {
          const double w = std::ldexp(v, -14) * mul;  // what mul.rn.f16x2 must produce
          EXPECT_EQ(double(round_f16(float(w))), w) << "code " << v << " byte " << b << " range " << lo << ".." << hi;
          EXPECT_EQ(w * double(unscale), v * std::ldexp(1.0, b - 127));  // the fold, taken back out
          ++checked;
        }
      }
    }
  EXPECT_GT(checked, 10000);
}

// The fold at its extremes, expert by expert: expert 0's scales all 2^-29 and expert 1's all 2^-5 (24 apart: the
// fold maps expert 0's codes to v * 2^-23, f16 subnormals down to 2^-24, and expert 1's to v * 2). Each expert's
// outputs are compared on their own scale (normalized by their own max), so a flushed subnormal or an overflow in
// either would show; against variant 1 (per-group fp32 scale), down on the same h. Expert 0's h is taken into the
// f16 range by the routing weight before w2 (2^40, applied in fp32 before the rounding).
TEST_F(CudaMoe, GroupedPrefillFoldExtremes) {
  Rng rng(23);
  const int64_t E = 2, D = 512, I = 256;
  auto f = make_moe(rng, E, D, I, false, 0, 0, {{98, 98}, {122, 122}});
  const cuda::MoeExperts m = cuda::upload_experts(f->w);
  const int n = 80, K = 2, S = n * K;
  std::vector<int32_t> idx(static_cast<size_t>(S));
  for (int s = 0; s < S; ++s) idx[size_t(s)] = s % 2;  // 80 slots each: a full tile and a partial one
  const Acts x = make_acts(Act::F32, rng.floats(size_t(n * D), -2.0f, 2.0f));
  std::vector<float> pw(static_cast<size_t>(S));
  for (int s = 0; s < S; ++s) pw[size_t(s)] = s % 2 ? 1.0f : std::ldexp(1.0f, 40);
  cuda::DeviceBuffer di = cuda::to_device(idx), pd = cuda::to_device(pw), groups(cuda::moe_group_bytes(n, K, E));
  cuda::moe_group(di.as<int32_t>(), n, K, E, groups.get());
  std::vector<float> h[7], y[7];
  cuda::DeviceBuffer hin(size_t(S * I) * 2);
  cuda::Workspace ws;
  cuda::moe_gate_up_grouped(m, groups.get(), n, K, x.dev.get(), Act::F32, 0.0, pd.as<float>(), hin.as<uint16_t>(), ws, nullptr, 1);
  for (int v : {1, 2, 3, 4, 5, 6}) {
    cuda::DeviceBuffer h16(size_t(S * I) * 2), ys(size_t(S * D) * 4);
    cuda::moe_gate_up_grouped(m, groups.get(), n, K, x.dev.get(), Act::F32, 0.0, pd.as<float>(), h16.as<uint16_t>(), ws, nullptr, v);
    cuda::moe_down_grouped(m, groups.get(), n, K, hin.as<uint16_t>(), ys.as<float>(), nullptr, v);
    cuda::synchronize();
    h[v] = f16_to_float(cuda::to_host<uint16_t>(h16, size_t(S * I)));
    y[v] = cuda::to_host<float>(ys, size_t(S * D));
  }
  for (int v : {5, 6}) {  // variant 4's bits (f16 subnormals included)
    EXPECT_TRUE(same_bits(h[v], h[4])) << "fold extremes: variant " << v << " h is not variant 4's bits";
    EXPECT_TRUE(same_bits(y[v], y[4])) << "fold extremes: variant " << v << " down is not variant 4's bits";
  }
  for (int v : {2, 3, 4, 5, 6})
    for (int e = 0; e < 2; ++e) {
      std::vector<float> hv, hr, yv, yr;
      for (int s = e; s < S; s += 2) {
        hv.insert(hv.end(), h[v].begin() + s * I, h[v].begin() + (s + 1) * I);
        hr.insert(hr.end(), h[1].begin() + s * I, h[1].begin() + (s + 1) * I);
        yv.insert(yv.end(), y[v].begin() + s * D, y[v].begin() + (s + 1) * D);
        yr.insert(yr.end(), y[1].begin() + s * D, y[1].begin() + (s + 1) * D);
      }
      const std::string tag = "fold extremes (variant " + std::to_string(v) + ", expert " + std::to_string(e) + ", scale 2^" +
                              std::to_string(e ? 122 - 127 : 98 - 127) + ")";
      expect_close(tag + " gate/up h16 vs variant 1", hv, hr, I, 2e-3);
      expect_close(tag + " down vs variant 1", yv, yr, D, 1e-5);
    }
}

// V4-Flash shapes (D 4096, I 2048), 320 tokens x top-6 over 8 experts, skewed (0, 1, 64, 320 and ~380 slots per
// expert): the grouping exactly; every output against the decode kernels on the same inputs (f16 h: one f16
// rounding apart at most; fp32 down: only the accumulation order of K differs); sampled outputs against fp64 dot
// products of the exact weights and f16 inputs.
TEST_F(CudaMoe, GroupedPrefillRealShapes) {
  Rng rng(22);
  const int64_t E = 8, D = 4096, I = 2048;
  auto f = make_moe(rng, E, D, I, false, 116, 122);
  const cuda::MoeExperts m = cuda::upload_experts(f->w);
  const int n = 320, K = 6, S = n * K;
  const std::vector<int32_t> idx = skewed_routing(rng, n, K, E);
  const Acts x = make_acts(Act::BF16, rng.floats(size_t(n * D), -2.0f, 2.0f));
  cuda::DeviceBuffer di = cuda::to_device(idx), groups(cuda::moe_group_bytes(n, K, E));
  cuda::DeviceBuffer h16(size_t(S * I) * 2), hdec(size_t(S * I) * 2), ys(size_t(S * D) * 4), ysdec(size_t(S * D) * 4);
  for (auto* b : {&groups, &h16, &hdec, &ys, &ysdec}) b->fill_byte(0xFF);
  cuda::Workspace ws;
  cuda::moe_group(di.as<int32_t>(), n, K, E, groups.get());
  cuda::moe_gate_up_grouped(m, groups.get(), n, K, x.dev.get(), Act::BF16, 10.0, nullptr, h16.as<uint16_t>(), ws);
  cuda::moe_down_grouped(m, groups.get(), n, K, h16.as<uint16_t>(), ys.as<float>());
  // The decode kernels on the same inputs (down from the grouped h, so that both see one h), 1024 slots per launch.
  const int chunk = 1024 / K;
  for (int t0 = 0; t0 < n; t0 += chunk) {
    const int nc = std::min(chunk, n - t0);
    const int32_t* ic = di.as<int32_t>() + t0 * K;
    cuda::moe_gate_up(m, ic, nc, K, x.dev.as<uint16_t>() + int64_t(t0) * D, Act::BF16, 10.0, nullptr,
                      hdec.as<uint16_t>() + int64_t(t0) * K * I, nullptr, ws);
    cuda::moe_down(m, ic, nc, K, h16.as<uint16_t>() + int64_t(t0) * K * I, nullptr, ysdec.as<float>() + int64_t(t0) * K * D, ws);
  }
  cuda::synchronize();
  expect_groups(idx, n, K, E, groups);
  const auto hg = f16_to_float(cuda::to_host<uint16_t>(h16, size_t(S * I)));
  const auto ysg = cuda::to_host<float>(ys, size_t(S * D));
  const auto hd = f16_to_float(cuda::to_host<uint16_t>(hdec, size_t(S * I)));
  const auto ysd = cuda::to_host<float>(ysdec, size_t(S * D));
  expect_close("grouped moe real shapes gate/up h16 vs decode kernel", hg, hd, I, 2e-3);
  expect_close("grouped moe real shapes down vs decode kernel", ysg, ysd, D, 1e-5);
  // Every kernel variant on the same inputs: against the decode kernels (h: one f16 rounding apart at most; down
  // from the same h: fp32 summation order only), the folded ones (2, 3) also against variant 1 (their summation
  // order differs: no per-group partial sums), and sampled outputs of each against the fp64 twin.
  std::vector<float> hv1, yv1;
  constexpr int NV = cuda::detail::kGroupedVariants;
  std::vector<std::vector<float>> hvs(NV), yvs(NV);
  for (int variant = 0; variant < NV; ++variant) {
    cuda::DeviceBuffer hv(size_t(S * I) * 2), yv(size_t(S * D) * 4);
    hv.fill_byte(0xFF), yv.fill_byte(0xFF);
    cuda::moe_gate_up_grouped(m, groups.get(), n, K, x.dev.get(), Act::BF16, 10.0, nullptr, hv.as<uint16_t>(), ws, nullptr, variant);
    cuda::moe_down_grouped(m, groups.get(), n, K, h16.as<uint16_t>(), yv.as<float>(), nullptr, variant);
    cuda::synchronize();
    hvs[size_t(variant)] = f16_to_float(cuda::to_host<uint16_t>(hv, size_t(S * I)));
    yvs[size_t(variant)] = cuda::to_host<float>(yv, size_t(S * D));
    const std::string v = "grouped moe real shapes (variant " + std::to_string(variant) + ")";
    expect_close(v + " gate/up h16 vs decode kernel", hvs[size_t(variant)], hd, I, 2e-3);
    expect_close(v + " down vs decode kernel", yvs[size_t(variant)], ysd, D, 1e-5);
    if (variant >= 2) {
      expect_close(v + " gate/up h16 vs variant 1", hvs[size_t(variant)], hvs[1], I, 2e-3);
      expect_close(v + " down vs variant 1", yvs[size_t(variant)], yvs[1], D, 1e-5);
    }
  }
  // Variants 5 and 6 (expert slots 320 and ~380: blocks of 106-107 and ~127 tokens, N = 112 and 128; 64: N = 64)
  // give variant 4's bits; the default is the folded kernel kGroupedFoldedDefault for these scales: the same bits.
  for (int v = 5; v < NV; ++v) {
    EXPECT_TRUE(same_bits(hvs[size_t(v)], hvs[4])) << "real shapes: variant " << v << " h is not variant 4's bits";
    EXPECT_TRUE(same_bits(yvs[size_t(v)], yvs[4])) << "real shapes: variant " << v << " down is not variant 4's bits";
  }
  EXPECT_EQ(hg, hvs[size_t(cuda::detail::kGroupedFoldedDefault)]) << "default gate/up is not kGroupedFoldedDefault";
  EXPECT_EQ(ysg, yvs[size_t(cuda::detail::kGroupedFoldedDefault)]) << "default down is not kGroupedFoldedDefault";
  std::vector<float> hs_ref, ys_ref;
  std::vector<std::vector<float>> hs(NV), ysv(NV);
  std::vector<float> row(size_t(std::max(D, I)));
  for (int s = 0; s < S; s += 7) {
    const auto& ex = f->w.experts[size_t(idx[size_t(s)])];
    const float* xs = x.f16.data() + (s / K) * D;
    for (int64_t r = s % 29; r < I; r += 29) {
      for (int v = 0; v < NV; ++v) hs[size_t(v)].push_back(hvs[size_t(v)][size_t(s * I + r)]);
      hs_ref.push_back(round_f16(swiglu_cpu({float(dot64(ex.w1, r, xs, row))}, {float(dot64(ex.w3, r, xs, row))}, 10.0f)[0]));
    }
    for (int64_t r = s % 37; r < D; r += 37) {  // down's input: the default's h (h16), as every variant's down read it
      for (int v = 0; v < NV; ++v) ysv[size_t(v)].push_back(yvs[size_t(v)][size_t(s * D + r)]);
      ys_ref.push_back(float(dot64(ex.w2, r, hg.data() + s * I, row)));
    }
  }
  for (int v = 0; v < NV; ++v) {
    const std::string t = "grouped moe real shapes (variant " + std::to_string(v) + ")";
    expect_close(t + " gate/up sampled vs fp64 twin", hs[size_t(v)], hs_ref, int64_t(hs_ref.size()), 2e-3);
    expect_close(t + " down sampled vs fp64 twin", ysv[size_t(v)], ys_ref, int64_t(ys_ref.size()), 1e-4);
  }
}

TEST_F(CudaMoe, UploadRefusesNanScales) {
  Rng rng(9);
  const int64_t rows = 16, cols = 128;
  const auto codes = rng.bytes(size_t(rows * cols / 2));
  auto scales = rng.e8m0(size_t(rows * cols / 32), 118, 124);
  EXPECT_NO_THROW(cuda::upload_fp4({codes.data()}, {scales.data()}, rows, cols));
  scales[5] = 0xFF;
  EXPECT_THROW(cuda::upload_fp4({codes.data()}, {scales.data()}, rows, cols), Error);
}

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

// The phase bench's persistent launch (`plumb bench --only phases`): every staging mode, with and without the
// latency-bound steps, runs to completion twice in a row on small buffers and leaves its barrier words zero (a
// second launch would otherwise pass its barriers early, or hang), and the read data never matches the sink's magic;
// its PDL twins (a staged read, a step, a read staging nothing) run without error.
class CudaBenchProbes : public GpuTest {};
TEST_F(CudaBenchProbes, PhaseStreamRunsEveryModeAndLeavesItsBarrierZero) {
  namespace d = cuda::detail;
  const size_t bytes = size_t(3) << 20;
  cuda::DeviceBuffer bufs(3 * bytes), bar(64), sink(64);
  d::fill(bufs.get(), bufs.bytes(), d::kFillBytes, 5, 0, 0);
  bar.fill_byte(0), sink.fill_byte(0);
  for (const unsigned gap : {0u, 2000u})
    for (int pf = 0; pf < 4; ++pf)
      for (int rep = 0; rep < 2; ++rep) {
        d::PhaseArgs a;
        a.phases = 3, a.gap_ns = gap, a.prefetch = pf, a.bar = bar.as<unsigned>(), a.sink = sink.as<unsigned>();
        for (int p = 0; p < 3; ++p) a.buf[p] = bufs.as<uint8_t>() + size_t(p) * bytes, a.bytes[p] = bytes - 16 * size_t(p);
        d::phase_stream(a);
        cuda::synchronize();
        const auto words = cuda::to_host<unsigned>(bar, 2);
        EXPECT_EQ(words[0], 0u) << "gap " << gap << " ns, prefetch " << pf << ", launch " << rep;
        EXPECT_EQ(words[1], 0u) << "gap " << gap << " ns, prefetch " << pf << ", launch " << rep;
      }
  d::staged_read(bufs.get(), bytes, 200 * 1024, sink.as<unsigned>());
  d::spin_pdl(2000);
  d::staged_read(bufs.get(), bytes, 0, sink.as<unsigned>());
  cuda::synchronize();
  EXPECT_EQ(cuda::to_host<unsigned>(sink, 1)[0], 0u);
  EXPECT_THROW(d::staged_read(bufs.get(), bytes, 256 * 1024, sink.as<unsigned>()), std::exception);  // over the stage
  d::PhaseArgs bad;
  EXPECT_THROW(d::phase_stream(bad), std::exception);  // no phases, no barrier
}
