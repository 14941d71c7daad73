// cuda.prefill_gemm (src/cuda/fp8_gemm.{cpp,cu}): the FP8 prefill GEMMs at V4-Flash shapes against an fp64 host
// product of the same bf16-rounded inputs (their twin), against the unrounded activations (the fp32 reference's
// inputs) and against the decode GEMV path they replace; the bf16 dequantization bit for bit; the forward pass with
// the patch against the forward without it; the refusals. cuda.bf16_gemv (the plain bf16 projections of a few tokens
// on the GEMV's bf16 path, gemv.cu) against the same references and the GEMM, and its forward likewise.
//
// Tolerances (normalized: max |err| / max |ref| over the output, or the sampled rows of it):
//   vs fp64 of the bf16-rounded inputs  1e-5  the same products; only the fp32 accumulation (cuBLASLt's, the MMA's)
//                                             differs (also the bf16 GEMV against the GEMM)
//   vs fp64 of the unrounded inputs     5e-3  the activations' bf16 rounding (2^-9 relative)
//   vs the GEMV (f16 activations)       5e-3  the bf16 rounding against the GEMV's f16 rounding
//   shared expert y vs its twin         2e-3  the twin rounds h to bf16 from fp64 gate/up, the GPU from fp32: an h
//                                             value next to a bf16 rounding boundary can go either way
//   shared expert y vs the GEMV path    1e-2  two bf16 roundings (x, h) against two f16 ones (measured 4.7e-3)
//   forward, op by op, teacher forced   1e-2  the patch's registered local tolerance; selections may differ only
//                                             as near ties (the bf16 roundings move scores across a top-k boundary)
// Every comparison prints where its largest error is.
#include <cstring>
#include <fstream>
#include <set>

#include <fmt/format.h>

#include "cuda/gpu_common.h"
#include "cuda_test_util.h"
#include "model/model.h"
#include "patches/registry.h"
#include "toolkit/diff.h"
#include "toolkit/trace.h"

using namespace plumb;
using namespace plumb_cuda_test;
using cuda::Act;

namespace {

class CudaFp8Gemm : public GpuTest {};

float round_bf16(float v) { return fmt8::bf16_to_f32(fmt8::f32_to_bf16(v)); }

std::vector<float> rounded_bf16(std::vector<float> v) {
  for (auto& x : v) x = round_bf16(x);
  return v;
}

// An FP8 matrix in the checkpoint format (E8M0 scales in [slo, shi]), bound as the reference backend reads it.
struct HostFp8 {
  TempDir dir;
  Checkpoint ck;
  Matrix w;
  HostFp8(Rng& rng, int64_t rows, int64_t cols, int slo = 116, int shi = 120) {
    std::vector<OwnedTensor> ts;
    add_fp8(ts, rng, "w", rows, cols, false, slo, shi);
    ck = write_checkpoint(dir, ts);
    w = Matrix::bind(ck, "w.weight", rows, cols);
  }
};

// y[t, r] for the sampled rows r (every `step`-th, and the last) of W x_t in fp64; x rows `ldx` apart. Rows the
// sample skips are NaN in the result and ignored by compare_rows.
std::vector<double> ref_rows(const Matrix& w, const std::vector<float>& x, int n, int64_t ldx, int64_t x_off, int64_t r0, int64_t nr,
                             int64_t step) {
  std::vector<double> y(size_t(n) * size_t(nr), NAN);
  std::vector<float> row(size_t(w.cols()));
  for (int64_t r = 0; r < nr; ++r) {
    if (r % step && r != nr - 1) continue;
    w.row(r0 + r, row.data());
    for (int t = 0; t < n; ++t) {
      double acc = 0;
      const float* xt = x.data() + t * ldx + x_off;
      for (int64_t k = 0; k < w.cols(); ++k) acc += double(row[size_t(k)]) * xt[k];
      y[size_t(t) * size_t(nr) + size_t(r)] = acc;
    }
  }
  return y;
}

// gpu (rows ldy apart, columns [c0, c0 + nr)) against the sampled reference; prints and checks like expect_close.
void compare_rows(const std::string& what, const std::vector<float>& gpu, int64_t ldy, int64_t c0, const std::vector<double>& ref, int n,
                  int64_t nr, double tol) {
  std::vector<float> g, r;
  for (int t = 0; t < n; ++t)
    for (int64_t c = 0; c < nr; ++c) {
      const double v = ref[size_t(t) * size_t(nr) + size_t(c)];
      if (std::isnan(v)) continue;
      g.push_back(gpu[size_t(t * ldy + c0 + c)]), r.push_back(float(v));
    }
  const Cmp cmp = compare(g.data(), r.data(), int64_t(g.size()));
  // Report the position in the output (token, row), not in the sampled list.
  int64_t at = -1, seen = 0;
  for (int t = 0; t < n && at < 0; ++t)
    for (int64_t c = 0; c < nr; ++c) {
      if (std::isnan(ref[size_t(t) * size_t(nr) + size_t(c)])) continue;
      if (seen++ == cmp.at) {
        at = t * nr + c;
        break;
      }
    }
  Cmp shown = cmp;
  shown.at = at;
  const std::string d = describe(what, shown, nr);
  std::printf("  %s [tol %.1e, %zu sampled outputs]\n", d.c_str(), tol, g.size());
  EXPECT_EQ(cmp.nonfinite, 0) << d;
  EXPECT_LE(cmp.norm, tol) << d;
}

struct Buffers {
  cuda::DeviceBuffer w, x, gu, h;
  cuda::Fp8GemmBuffers b;
  Buffers(size_t w_elems, size_t x_elems, size_t gu_elems = 0, size_t h_elems = 0)
      : w(w_elems * 2), x(x_elems * 2), gu(std::max<size_t>(gu_elems, 1) * 4), h(std::max<size_t>(h_elems, 1) * 2) {
    b.w = w.as<uint16_t>(), b.x = x.as<uint16_t>(), b.gu = gu.as<float>(), b.h = h.as<uint16_t>();
    b.w_elems = w_elems, b.x_elems = x_elems, b.gu_elems = gu_elems, b.h_elems = h_elems;
  }
};

}  // namespace

// The bf16 weight is exactly code x scale, bit for bit, over every E4M3 code and the admitted scale range; matrices
// whose scales leave it (or are F32) are not admitted.
TEST_F(CudaFp8Gemm, DequantizationIsExact) {
  Rng rng(21);
  for (auto [slo, shi] : {std::pair{10, 20}, std::pair{110, 125}, std::pair{235, 245}}) {
    HostFp8 m(rng, 256, 384, slo, shi);
    const cuda::Fp8Matrix dw = cuda::upload_fp8(m.w);
    ASSERT_TRUE(cuda::fp8_gemm_exact(dw)) << "scales " << slo << ".." << shi;
    cuda::DeviceBuffer out(size_t(256 * 384) * 2);
    out.fill_byte(0xFF);
    cuda::fp8_dequant_bf16(dw, out.as<uint16_t>());
    cuda::synchronize();
    const auto got = cuda::to_host<uint16_t>(out, size_t(256 * 384));
    std::vector<float> row(384);
    int64_t bad = 0, first = -1;
    for (int64_t r = 0; r < 256; ++r) {
      m.w.row(r, row.data());  // the reference backend's exact dequantization
      for (int64_t c = 0; c < 384; ++c) {
        const float want = row[size_t(c)];
        ASSERT_EQ(round_bf16(want), want) << "the reference value at [" << r << ", " << c << "] is not a bf16 value";
        if (fmt8::bf16_to_f32(got[size_t(r * 384 + c)]) != want && ++bad == 1) first = r * 384 + c;
      }
    }
    EXPECT_EQ(bad, 0) << "scales " << slo << ".." << shi << ": first mismatch at [" << first / 384 << ", " << first % 384 << "]";
  }
  for (auto [slo, shi] : {std::pair{0, 5}, std::pair{9, 9}, std::pair{246, 246}}) {
    HostFp8 m(rng, 128, 128, slo, shi);
    EXPECT_FALSE(cuda::fp8_gemm_exact(cuda::upload_fp8(m.w))) << "scales " << slo << ".." << shi;
  }
  TempDir dir;
  std::vector<OwnedTensor> ts;
  add_fp8(ts, rng, "w", 128, 256, /*f32_scales=*/true);
  const Checkpoint ck = write_checkpoint(dir, ts);
  const cuda::Fp8Matrix f32s = cuda::upload_fp8(Matrix::bind(ck, "w.weight", 128, 256));
  ASSERT_TRUE(f32s.scale_f32);
  EXPECT_FALSE(cuda::fp8_gemm_exact(f32s));
  cuda::DeviceBuffer out(size_t(128 * 256) * 2);
  EXPECT_THROW(cuda::fp8_dequant_bf16(f32s, out.as<uint16_t>()), Error);
}

// The dense projections at V4-Flash shapes (wq_a, wkv, wq_b, wo_b, shared-expert-sized), token counts that are not
// tile multiples, strided input and output rows, each activation type.
TEST_F(CudaFp8Gemm, LinearMatchesFp64AndGemvAtRealShapes) {
  struct Case {
    const char* name;
    int64_t rows, cols;
    int n;
    Act at;
    int64_t ldx_pad, ldy_pad, step;  // extra elements per x / y row; reference row sampling
  };
  const Case cases[] = {{"wq_a", 1024, 4096, 77, Act::F32, 0, 0, 3},      {"wkv", 512, 4096, 64, Act::F32, 128, 64, 1},
                        {"wq_b", 32768, 1024, 40, Act::F32, 0, 0, 61},    {"wo_b", 4096, 8192, 33, Act::F32, 0, 512, 17},
                        {"w2 (shared)", 4096, 2048, 96, Act::BF16, 0, 0, 11}, {"wq_a", 1024, 4096, 129, Act::F16, 256, 0, 7}};
  Rng rng(22);
  cuda::Workspace ws;
  for (const auto& c : cases) {
    HostFp8 m(rng, c.rows, c.cols);
    const cuda::Fp8Matrix dw = cuda::upload_fp8(m.w);
    ASSERT_TRUE(cuda::fp8_gemm_exact(dw));
    const int64_t ldx = c.cols + c.ldx_pad, ldy = c.rows + c.ldy_pad;
    const Acts x = make_acts(c.at, rng.floats(size_t(c.n) * size_t(ldx), -2.0f, 2.0f));
    Buffers buf(size_t(c.rows * c.cols), size_t(c.n) * size_t(c.cols));
    cuda::DeviceBuffer y(size_t(c.n) * size_t(ldy) * 4), yv(size_t(c.n) * size_t(ldy) * 4);
    y.fill_byte(0xFF), yv.fill_byte(0xFF);
    cuda::fp8_linear_gemm(dw, x.dev.get(), c.at, ldx, c.n, y.as<float>(), ldy, buf.b);
    cuda::fp8_linear(dw, x.dev.get(), c.at, ldx, c.n, yv.as<float>(), ldy, ws);
    cuda::synchronize();
    const auto yg = cuda::to_host<float>(y, size_t(c.n) * size_t(ldy));
    const auto ygemv = cuda::to_host<float>(yv, size_t(c.n) * size_t(ldy));
    const std::string tag = std::string("gemm ") + c.name + " [" + std::to_string(c.rows) + ", " + std::to_string(c.cols) +
                            "] n=" + std::to_string(c.n) + " x " + act_name(c.at) + " ldx " + std::to_string(ldx) + " ldy " +
                            std::to_string(ldy);
    const auto xb = rounded_bf16(x.value);
    compare_rows(tag + " vs fp64 twin (bf16 x)", yg, ldy, 0, ref_rows(m.w, xb, c.n, ldx, 0, 0, c.rows, c.step), c.n, c.rows, 1e-5);
    compare_rows(tag + " vs fp64 (unrounded x)", yg, ldy, 0, ref_rows(m.w, x.value, c.n, ldx, 0, 0, c.rows, c.step), c.n, c.rows,
                 5e-3);
    // Against the GEMV: every output (the padding between rows is left alone by both).
    std::vector<float> a, b;
    for (int t = 0; t < c.n; ++t)
      for (int64_t r = 0; r < c.rows; ++r) a.push_back(yg[size_t(t * ldy + r)]), b.push_back(ygemv[size_t(t * ldy + r)]);
    expect_close(tag + " vs the GEMV (f16 x)", a, b, c.rows, 5e-3);
    if (c.ldy_pad) {  // the GEMM wrote only its columns
      uint32_t bits;
      std::memcpy(&bits, &yg[size_t(c.rows)], 4);
      EXPECT_EQ(bits, 0xFFFFFFFFu) << tag << ": the GEMM wrote past its columns";
    }
  }
}

// A plain bf16 weight (the compressors' wkv / wgate at V4-Flash's shapes) through bf16_linear_gemm (cuBLASLt,
// cuda.prefill_gemm) and bf16_linear_gemv_multi (the GEMV's bf16 path, cuda.bf16_gemv; tokens in passes of 8): against
// an fp64 host product of the bf16-rounded activations (the same products), of the unrounded ones, and against the
// fp32 twin's fp64 GEMV (fwd_linear) that they replace; token counts from 2, strided rows.
TEST_F(CudaFp8Gemm, Bf16LinearMatchesFp64AndTwin) {
  struct Case {
    int64_t rows, cols;
    int n;
    int64_t ldx_pad, ldy_pad;
  };
  const Case cases[] = {{1024, 4096, 2, 0, 0}, {1024, 4096, 48, 64, 0}, {512, 4096, 33, 0, 32}, {256, 4096, 8, 0, 0},
                        {256, 4096, 3, 0, 16}};
  Rng rng(27);
  for (const auto& c : cases)
  for (const bool gemv : {false, true}) {
    std::vector<uint16_t> wb(size_t(c.rows * c.cols));
    std::vector<float> wf(wb.size());
    for (size_t i = 0; i < wb.size(); ++i) wb[i] = fmt8::f32_to_bf16(rng.uniform(-0.05f, 0.05f)), wf[i] = fmt8::bf16_to_f32(wb[i]);
    const int64_t ldx = c.cols + c.ldx_pad, ldy = c.rows + c.ldy_pad;
    const auto x = rng.floats(size_t(c.n) * size_t(ldx), -2.0f, 2.0f);
    cuda::DeviceBuffer dw = cuda::to_device(wb), dx = cuda::to_device(x);
    Buffers buf(1, size_t(c.n) * size_t(c.cols));  // (no weight scratch: the weight is used as stored)
    cuda::DeviceBuffer y(size_t(c.n) * size_t(ldy) * 4), yt(size_t(c.n) * size_t(ldy) * 4);
    y.fill_byte(0xFF), yt.fill_byte(0xFF);
    if (gemv) {
      const cuda::Bf16Proj p{dw.as<uint16_t>(), c.rows, y.as<float>(), ldy};
      cuda::bf16_linear_gemv_multi(&p, 1, c.cols, dx.get(), Act::F32, ldx, c.n, buf.b);
    } else {
      cuda::bf16_linear_gemm(dw.as<uint16_t>(), c.rows, c.cols, dx.get(), Act::F32, ldx, c.n, y.as<float>(), ldy, buf.b);
    }
    cuda::detail::DMat d;
    d.w = dw.get(), d.rows = c.rows, d.cols = c.cols, d.layout = 0, d.dtype = 1;
    cuda::detail::fwd_linear(d, dx.as<float>(), c.n, ldx, 0, c.rows, yt.as<float>(), ldy, nullptr);
    cuda::synchronize();
    const auto yg = cuda::to_host<float>(y, size_t(c.n) * size_t(ldy));
    const auto ytw = cuda::to_host<float>(yt, size_t(c.n) * size_t(ldy));
    std::vector<float> g, twin, r16, r32;
    for (int t = 0; t < c.n; ++t)
      for (int64_t r = 0; r < c.rows; ++r) {
        double a16 = 0, a32 = 0;
        for (int64_t k = 0; k < c.cols; ++k) {
          const double w = wf[size_t(r * c.cols + k)], xv = x[size_t(t * ldx + k)];
          a16 += w * round_bf16(float(xv)), a32 += w * xv;
        }
        g.push_back(yg[size_t(t * ldy + r)]), twin.push_back(ytw[size_t(t * ldy + r)]), r16.push_back(float(a16)), r32.push_back(float(a32));
      }
    const std::string tag = std::string(gemv ? "bf16 gemv [" : "bf16 gemm [") + std::to_string(c.rows) + ", " + std::to_string(c.cols) +
                            "] n=" + std::to_string(c.n) + " ldx " + std::to_string(ldx) + " ldy " + std::to_string(ldy);
    expect_close(tag + " vs fp64 (bf16 x)", g, r16, c.rows, 1e-5);
    expect_close(tag + " vs fp64 (unrounded x)", g, r32, c.rows, 5e-3);
    expect_close(tag + " vs the fp32 twin (fwd_linear)", g, twin, c.rows, 5e-3);
    if (c.ldy_pad)  // only its columns written
      for (int t = 0; t < c.n; ++t) {
        uint32_t bits;
        std::memcpy(&bits, &yg[size_t(t * ldy + c.rows)], 4);
        EXPECT_EQ(bits, 0xFFFFFFFFu) << tag << ": wrote past its columns in token row " << t;
      }
  }
}

// The bf16 GEMV takes up to 32 tokens in one pass (groups of 8, each weight fragment loaded once for all of them):
// every token's outputs must be the bits of a launch of its own 8-token slice (one group), for a table of the CSA
// compressors' four projections and token counts that leave a partial group or a second pass.
TEST_F(CudaFp8Gemm, Bf16GemvTokenGroupsGiveEachSliceItsBits) {
  const int64_t cols = 4096, rows[4] = {1024, 1024, 256, 256};
  Rng rng(33);
  std::vector<cuda::DeviceBuffer> w;
  for (int64_t r : rows) {
    std::vector<uint16_t> wb(size_t(r * cols));
    for (auto& v : wb) v = fmt8::f32_to_bf16(rng.uniform(-0.05f, 0.05f));
    w.push_back(cuda::to_device(wb));
  }
  for (const int n : {12, 17, 32, 40}) {
    const auto x = rng.floats(size_t(n) * size_t(cols), -2.0f, 2.0f);
    cuda::DeviceBuffer dx = cuda::to_device(x);
    Buffers buf(1, size_t(n) * size_t(cols));
    std::vector<cuda::DeviceBuffer> yall, ysl;
    for (int64_t r : rows) {
      yall.emplace_back(size_t(n) * size_t(r) * 4), ysl.emplace_back(size_t(n) * size_t(r) * 4);
      yall.back().fill_byte(0xFF), ysl.back().fill_byte(0xEE);
    }
    auto projs = [&](std::vector<cuda::DeviceBuffer>& y, int t0) {
      std::vector<cuda::Bf16Proj> p;
      for (size_t i = 0; i < 4; ++i) p.push_back(cuda::Bf16Proj{w[i].as<uint16_t>(), rows[i], y[i].as<float>() + int64_t(t0) * rows[i], rows[i]});
      return p;
    };
    const auto pall = projs(yall, 0);
    cuda::bf16_linear_gemv_multi(pall.data(), 4, cols, dx.get(), Act::F32, cols, n, buf.b);
    for (int t0 = 0; t0 < n; t0 += 8) {
      const auto ps = projs(ysl, t0);
      cuda::bf16_linear_gemv_multi(ps.data(), 4, cols, dx.as<float>() + int64_t(t0) * cols, Act::F32, cols, std::min(8, n - t0), buf.b);
    }
    cuda::synchronize();
    for (size_t i = 0; i < 4; ++i) {
      const size_t sz = size_t(n) * size_t(rows[i]);
      const auto a = cuda::to_host<uint32_t>(yall[i], sz), b = cuda::to_host<uint32_t>(ysl[i], sz);
      int64_t bad = 0, first = -1;
      for (size_t k = 0; k < sz; ++k)
        if (a[k] != b[k] && bad++ == 0) first = int64_t(k);
      EXPECT_EQ(bad, 0) << "bf16 gemv table, projection " << i << ", n=" << n << ": " << bad
                        << " outputs differ from their 8-token slice's, first at token " << first / rows[i] << ", row " << first % rows[i];
    }
  }
}

// The compressors' four projections at 8 tokens (V4-Flash's CSA: wkv and wgate [1024, 4096], the indexer's [256,
// 4096]) from one bf16 conversion of x: every output the bits of its own bf16_linear_gemm call; and on the GEMV (one
// table launch for the four, at 8 and at 19 tokens) the bits of its own one-matrix launch, within 1e-5 of the GEMM.
TEST_F(CudaFp8Gemm, Bf16LinearMultiMatchesOneCallEach) {
  const int64_t cols = 4096, rows[4] = {1024, 1024, 256, 256};
  const int n = 8;
  Rng rng(31);
  const auto x = rng.floats(size_t(n) * size_t(cols), -2.0f, 2.0f);
  cuda::DeviceBuffer dx = cuda::to_device(x);
  Buffers buf(1, size_t(n) * size_t(cols));
  std::vector<cuda::DeviceBuffer> w, y, y1;
  std::vector<cuda::Bf16Proj> p;
  for (int64_t r : rows) {
    std::vector<uint16_t> wb(size_t(r * cols));
    for (auto& v : wb) v = fmt8::f32_to_bf16(rng.uniform(-0.05f, 0.05f));
    w.push_back(cuda::to_device(wb));
    y.emplace_back(size_t(n) * size_t(r) * 4), y1.emplace_back(size_t(n) * size_t(r) * 4);
    p.push_back(cuda::Bf16Proj{w.back().as<uint16_t>(), r, y.back().as<float>(), r});
  }
  cuda::bf16_linear_gemm_multi(p.data(), int(p.size()), cols, dx.get(), Act::F32, cols, n, buf.b);
  for (size_t i = 0; i < p.size(); ++i)
    cuda::bf16_linear_gemm(p[i].w, rows[i], cols, dx.get(), Act::F32, cols, n, y1[i].as<float>(), rows[i], buf.b);
  cuda::synchronize();
  for (size_t i = 0; i < p.size(); ++i) {
    const auto a = cuda::to_host<float>(y[i], size_t(n) * size_t(rows[i]));
    const auto b = cuda::to_host<float>(y1[i], size_t(n) * size_t(rows[i]));
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "projection " << i << ": not the bits of its own call";
  }
  for (const int ng : {8, 19}) {
    const auto xg = rng.floats(size_t(ng) * size_t(cols), -2.0f, 2.0f);
    cuda::DeviceBuffer dxg = cuda::to_device(xg);
    Buffers bg(1, size_t(ng) * size_t(cols));
    std::vector<cuda::DeviceBuffer> yv, y1v, ygm;
    std::vector<cuda::Bf16Proj> pg;
    for (size_t i = 0; i < p.size(); ++i) {
      yv.emplace_back(size_t(ng) * size_t(rows[i]) * 4), y1v.emplace_back(size_t(ng) * size_t(rows[i]) * 4);
      ygm.emplace_back(size_t(ng) * size_t(rows[i]) * 4);
      pg.push_back(cuda::Bf16Proj{p[i].w, rows[i], yv.back().as<float>(), rows[i]});
    }
    cuda::bf16_linear_gemv_multi(pg.data(), int(pg.size()), cols, dxg.get(), Act::F32, cols, ng, bg.b);
    for (size_t i = 0; i < pg.size(); ++i) {
      cuda::Bf16Proj one = pg[i];
      one.y = y1v[i].as<float>();
      cuda::bf16_linear_gemv_multi(&one, 1, cols, dxg.get(), Act::F32, cols, ng, bg.b);
      cuda::bf16_linear_gemm(pg[i].w, rows[i], cols, dxg.get(), Act::F32, cols, ng, ygm[i].as<float>(), rows[i], bg.b);
    }
    cuda::synchronize();
    for (size_t i = 0; i < pg.size(); ++i) {
      const size_t sz = size_t(ng) * size_t(rows[i]);
      const auto a = cuda::to_host<float>(yv[i], sz), b = cuda::to_host<float>(y1v[i], sz), g = cuda::to_host<float>(ygm[i], sz);
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "gemv table, projection " << i << " at " << ng << " tokens";
      // (fmt, not string +: GCC 12 warns -Warray-bounds about the inlined concatenation in some unity groups)
      expect_close(fmt::format("gemv table vs gemm, projection {}, {} tokens", i, ng), a, g, rows[i], 1e-5);
    }
  }
}

// The grouped wo_a (8 groups of [1024, 4096] at V4-Flash's shape) as one strided-batched GEMM.
TEST_F(CudaFp8Gemm, GroupedMatchesFp64AndGemv) {
  Rng rng(23);
  const int groups = 8;
  const int64_t gr = 1024, cols = 4096, rows = groups * gr, in_w = groups * cols;
  HostFp8 m(rng, rows, cols);
  const cuda::Fp8Matrix dw = cuda::upload_fp8(m.w);
  cuda::Workspace ws;
  for (auto [n, at] : {std::pair{72, Act::F32}, std::pair{33, Act::F16}}) {
    const Acts x = make_acts(at, rng.floats(size_t(n) * size_t(in_w), -2.0f, 2.0f));
    Buffers buf(size_t(rows * cols), size_t(n) * size_t(in_w));
    cuda::DeviceBuffer y(size_t(n * rows) * 4), yv(size_t(n * rows) * 4);
    y.fill_byte(0xFF), yv.fill_byte(0xFF);
    cuda::fp8_linear_grouped_gemm(dw, groups, x.dev.get(), at, n, y.as<float>(), buf.b);
    cuda::fp8_linear_grouped(dw, groups, x.dev.get(), at, n, yv.as<float>(), ws);
    cuda::synchronize();
    const auto yg = cuda::to_host<float>(y, size_t(n * rows));
    const std::string tag = "gemm wo_a (8 x [1024, 4096]) n=" + std::to_string(n) + " x " + act_name(at);
    const auto xb = rounded_bf16(x.value);
    for (int g = 0; g < groups; g += 3) {  // groups 0, 3, 6: each its own rows, input slice and output columns
      const std::string gt = tag + " group " + std::to_string(g);
      compare_rows(gt + " vs fp64 twin (bf16 x)", yg, rows, g * gr, ref_rows(m.w, xb, n, in_w, g * cols, g * gr, gr, 5), n, gr, 1e-5);
      compare_rows(gt + " vs fp64 (unrounded x)", yg, rows, g * gr, ref_rows(m.w, x.value, n, in_w, g * cols, g * gr, gr, 5), n, gr,
                   5e-3);
    }
    expect_close(tag + " vs the GEMV (f16 x)", yg, cuda::to_host<float>(yv, size_t(n * rows)), rows, 5e-3);
  }
}

// The shared expert at V4-Flash's shape (I 2048, D 4096) with the SwiGLU clamp engaged.
TEST_F(CudaFp8Gemm, SharedExpertMatchesTwinAndGemv) {
  Rng rng(24);
  const int64_t D = 4096, I = 2048;
  const float limit = 10.0f;
  const auto fx = make_fp8_expert(rng, D, I, 117, 119, 116, 118);
  const ExpertWeights& e = fx->e;
  const auto de = cuda::upload_expert_fp8(e);
  cuda::Workspace ws;
  const int n = 48;
  const Acts x = make_acts(Act::F32, rng.floats(size_t(n * D), -3.0f, 3.0f));
  Buffers buf(size_t(2 * I * D), size_t(n * D), size_t(n * 2 * I), size_t(n * I));
  cuda::DeviceBuffer y(size_t(n * D) * 4), yv(size_t(n * D) * 4), h16(size_t(n * I) * 2);
  y.fill_byte(0xFF), yv.fill_byte(0xFF);
  cuda::fp8_expert_ffn_gemm(de, x.dev.get(), Act::F32, n, limit, y.as<float>(), buf.b);
  cuda::fp8_expert_ffn(de, x.dev.get(), Act::F32, n, limit, h16.as<uint16_t>(), yv.as<float>(), ws);
  cuda::synchronize();
  const auto yg = cuda::to_host<float>(y, size_t(n * D));
  // The twin: gate/up in fp64 from bf16 x, SwiGLU as the kernel's formula (fp32), h rounded to bf16, W2 h in fp64.
  const auto xb = rounded_bf16(x.value);
  const auto g = ref_rows(e.w1, xb, n, D, 0, 0, I, 1), u = ref_rows(e.w3, xb, n, D, 0, 0, I, 1);
  std::vector<float> h(size_t(n * I));
  int clamped = 0;
  for (size_t i = 0; i < h.size(); ++i) {
    float gv = float(g[i]), uv = float(u[i]);
    clamped += std::fabs(uv) > limit || gv > limit;
    gv = std::min(gv, limit), uv = std::clamp(uv, -limit, limit);
    h[i] = round_bf16(gv / (1.0f + std::exp(-gv)) * uv);
  }
  std::printf("  shared expert n=%d: %d of %lld gate/up values beyond the clamp\n", n, clamped, (long long)(n * I));
  EXPECT_GT(clamped, 0) << "the test should engage the clamp";
  compare_rows("gemm shared expert y vs twin (bf16 x, bf16 h)", yg, D, 0, ref_rows(e.w2, h, n, I, 0, 0, D, 1), n, D, 2e-3);
  expect_close("gemm shared expert y vs the GEMV path (f16 x, f16 h)", yg, cuda::to_host<float>(yv, size_t(n * D)), D, 1e-2);
}

namespace {

struct ForwardRun {
  std::vector<float> logits;
  int64_t calls = 0;  // a patch's launches, as `count` read them from the session's scratch
};

// The forward over toks in chunks of `chunk` tokens on a fresh session: every chunk's logits, and what count(scratch)
// reads at the end.
template <class Count>
ForwardRun run_chunks(Model& m, const std::vector<int32_t>& toks, size_t chunk, Count count) {
  auto st = m.new_state();
  ForwardRun r;
  for (size_t p = 0; p < toks.size(); p += chunk) {
    const auto l = m.forward(st, std::span<const int32_t>(toks.data() + p, std::min(chunk, toks.size() - p)));
    r.logits.insert(r.logits.end(), l.data.begin(), l.data.end());
  }
  r.calls = count(st.dev->scratch);
  return r;
}

// The forward on `dir` with `base` against `base,patch`, op by op, teacher forced (plumb diff --local: each op of the
// patched run fed the base run's inputs), over these steps of toks: every tap within the patch's local tolerance;
// index taps may differ only by near ties (the bf16 roundings can move a score across a top-k boundary), which
// excuse the ops that consume that selection on its rows.
void expect_local_within_patch_tolerance(const std::string& dir, const std::vector<int32_t>& toks, std::initializer_list<size_t> steps,
                                         const std::string& base, const std::string& patch) {
  TempDir tmp;
  const std::string file = tmp.file("tokens.txt");
  {
    std::ofstream f(file);
    size_t pos = 0;
    for (size_t step : steps) {
      for (size_t i = 0; i < step; ++i) f << toks[pos + i] << (i + 1 < step ? ' ' : '\n');
      pos += step;
    }
  }
  const auto in = toolkit::input_from_tokens(dir, file);
  const auto r = toolkit::diff_live(in, "cuda:" + base, "cuda:" + base + "," + patch, /*local=*/true);
  // A near tie moves the ops that consume the selection by O(1) on its rows: the layer's attention output (indexer),
  // or its routing weights, routed sum and output (router). Every other tap must stay within the tolerance.
  std::set<std::string> excused;
  int64_t tie_rows = 0;
  for (const auto& row : r.rows) {
    if (!row.is_index) continue;
    EXPECT_EQ(row.lix.real, 0) << row.name << ": " << row.lix.real << " rows select differently beyond a near tie (" << row.lix.first_bad
                               << ")";
    if (!row.local_diverges) continue;
    tie_rows += row.lix.ties;
    const std::string L = row.name.substr(0, row.name.find('.') + 1);
    if (row.name.ends_with("attn.indexer.topk")) excused.insert(L + "attn.out");
    if (row.name.ends_with("ffn.gate.indices")) excused.insert({L + "ffn.gate.weights", L + "ffn.routed", L + "ffn.out"});
  }
  double worst = 0;
  std::string worst_tap;
  for (const auto& row : r.rows) {
    if (row.is_index || !row.has_local || excused.count(row.name)) continue;
    const double e = row.lf.max_abs / std::max(1.0, row.lf.ref_max);
    if (e > worst) worst = e, worst_tap = row.name;
    EXPECT_FALSE(row.local_diverges) << row.name << " differs on its own inputs: " << row.lf.max_abs << " (max |ref| " << row.lf.ref_max
                                     << "; no near tie explains it)";
  }
  std::string ex;
  for (const auto& e : excused) ex += (ex.empty() ? "" : ", ") + e;
  // The diff's own local tolerance combines both configurations' (2e-2 here); each tap is held to the patch's.
  const double tol = find_patch(patch)->tol.local;
  std::printf("  teacher forced, op by op: worst tap %s %.3e [tol %.1e]; %lld index rows differ by near ties (excused: %s)\n",
              worst_tap.c_str(), worst, tol, (long long)tie_rows, ex.empty() ? "none" : ex.c_str());
  EXPECT_LE(worst, tol) << worst_tap;
}

}  // namespace

// The forward on kernel-dims (every FP8 matrix fits the fast path) with chunks of 160 tokens: with the patch the
// projections run as GEMMs (counted), deterministically, bit-identical under cuda.graph (chunks <= 256 are
// captured). Against the GEMV forward op by op, teacher forced (plumb diff --local: each op of the patched run fed
// the GEMV run's inputs): every tap within the patch's local tolerance; index taps may differ only by near ties
// (the bf16 roundings can move a score across a top-k boundary; free running, such a flip changes that token's
// logits by O(1), which is why the free-running logits are only reported). With the threshold at 1 token every
// chunk, decode-sized ones included, takes the GEMM.
TEST_F(GpuTest, PrefillGemmForwardMatchesGemvForward) {
  const std::string dir = std::string(PLUMB_TEST_DATA) + "/golden/kernel-dims";
  const auto load = [&](const std::string& patches, int min_tokens) {
    ModelOptions o = parse_patches(patches).options;
    o.prefill_gemm_min_tokens = min_tokens;
    return Model::load(dir, o, {}, "cuda");
  };
  const std::string base = "cuda.fp8_gemv,cuda.moe_mxfp4";
  auto gemv = load(base, 0), gemm = load(base + ",cuda.prefill_gemm", 0), graphed = load(base + ",cuda.prefill_gemm,cuda.graph", 0),
       always = load(base + ",cuda.prefill_gemm", 1);
  const auto toks = test_prompt(480, gemv->config().vocab);
  const auto run = [&](Model& m, size_t chunk) { return run_chunks(m, toks, chunk, [](const auto& s) { return s.gemm_calls; }); };
  const ForwardRun a = run(*gemv, 160), g = run(*gemm, 160), again = run(*gemm, 160), gr = run(*graphed, 160);
  const ForwardRun small_gemv = run(*gemv, 7), small = run(*always, 7);
  EXPECT_EQ(a.calls, 0);
  EXPECT_GT(g.calls, 0) << "the patch did not run a GEMM";
  EXPECT_GT(small.calls, 0);
  std::printf("GEMM projections per run: %lld (chunks of 160), %lld (chunks of 7, threshold 1)\n", (long long)g.calls,
              (long long)small.calls);
  ASSERT_EQ(g.logits.size(), a.logits.size());
  EXPECT_EQ(std::memcmp(g.logits.data(), again.logits.data(), g.logits.size() * 4), 0) << "the GEMM forward is not deterministic";
  EXPECT_EQ(std::memcmp(g.logits.data(), gr.logits.data(), g.logits.size() * 4), 0) << "graph replay differs from eager launches";
  // Free running: per token, the largest logit difference (normalized by max(1, max|logit|) of the token).
  const int64_t V = gemv->config().vocab;
  for (auto [what, x, y] : {std::tuple{"chunks of 160", &g, &a}, std::tuple{"chunks of 7, threshold 1", &small, &small_gemv}}) {
    int64_t over = 0, first = -1;
    double worst = 0;
    for (int64_t t = 0; t < int64_t(x->logits.size()) / V; ++t) {
      double e = 0, m = 1;
      for (int64_t v = 0; v < V; ++v) {
        m = std::max(m, double(std::fabs(y->logits[size_t(t * V + v)])));
        e = std::max(e, double(std::fabs(x->logits[size_t(t * V + v)] - y->logits[size_t(t * V + v)])));
      }
      ASSERT_TRUE(std::isfinite(e)) << what << ": non-finite logits at token " << t;
      worst = std::max(worst, e / m);
      if (e / m > 1e-2 && over++ == 0) first = t;
    }
    std::printf("  free running, %s: worst token %.3e; %lld of %lld tokens beyond 1e-2 (first: %lld)\n", what, worst, (long long)over,
                (long long)(x->logits.size() / size_t(V)), (long long)first);
  }
  // Teacher forced, op by op: steps of 160, 160, 40 (GEMMs), 7 and 1 (the GEMV) tokens.
  expect_local_within_patch_tolerance(dir, toks, {160, 160, 40, 7, 1, 1}, base, "cuda.prefill_gemm");
}

// cuda.bf16_gemv on kernel-dims (its compressors' six plain bf16 matrices, [128 | 64 | 32, 256]): steps of 2 to 32
// tokens run the compressor projections on the bf16 GEMV (counted), deterministically and bit-identical under
// cuda.graph; against the forward without it (the fp32 twin's fp64 GEMV), op by op, teacher forced, within the
// patch's local tolerance, over steps of 1 to 40 tokens (the GEMV's range, one and two groups of 8 tokens per pass,
// and either side of it).
TEST_F(GpuTest, Bf16GemvForwardMatchesTwinForward) {
  const std::string dir = std::string(PLUMB_TEST_DATA) + "/golden/kernel-dims";
  const std::string base = "cuda.fp8_gemv,cuda.moe_mxfp4";
  const auto load = [&](const std::string& patches) { return Model::load(dir, parse_patches(patches).options, {}, "cuda"); };
  auto plain = load(base), gemv = load(base + ",cuda.bf16_gemv"), graphed = load(base + ",cuda.bf16_gemv,cuda.graph");
  const auto toks = test_prompt(160, plain->config().vocab);
  const auto run = [&](Model& m) { return run_chunks(m, toks, 7, [](const auto& s) { return s.gemv16_calls; }); };
  const ForwardRun plain_run = run(*plain), gemv_run = run(*gemv);
  const int64_t none = plain_run.calls, some = gemv_run.calls;
  const auto &a = plain_run.logits, &g = gemv_run.logits;
  const auto again = run(*gemv).logits, gr = run(*graphed).logits;
  EXPECT_EQ(none, 0);
  EXPECT_GT(some, 0) << "the patch did not run the bf16 GEMV";
  std::printf("bf16 GEMV launches in chunks of 7: %lld\n", (long long)some);
  ASSERT_EQ(g.size(), a.size());
  EXPECT_EQ(std::memcmp(g.data(), again.data(), g.size() * 4), 0) << "the bf16 GEMV forward is not deterministic";
  EXPECT_EQ(std::memcmp(g.data(), gr.data(), g.size() * 4), 0) << "graph replay differs from eager launches";
  expect_local_within_patch_tolerance(dir, toks, {40, 7, 3, 8, 1, 16, 2, 17, 32, 33}, base, "cuda.bf16_gemv");
}

// The official numerics' tensor-core kernels on kernel-dims (FP4 experts [128, 256] / [256, 128], FP8 projections
// of 128-multiple shapes): cuda.moe_mxfp4's W4A8 experts, cuda.fp8_gemv's W8A8 projections (E4M3 activations as
// DeepSeek's fp4_gemm / fp8_gemm) and bf16 wo_a, and cuda.bf16_gemv's router gate and compressors run (counted), deterministic and bit-identical under cuda.graph; each against the
// official twin (fp64 sums per block) op by op, teacher forced, within its local tolerance, over prefill chunks and
// decode steps (1, 3 and 40 tokens: one and several passes of 8 tokens).
TEST_F(GpuTest, OfficialTensorCoreForwardMatchesTwinForward) {
  const std::string dir = std::string(PLUMB_TEST_DATA) + "/golden/kernel-dims";
  const std::string base = "numerics.official", fast_patches = base + ",cuda.moe_mxfp4,cuda.fp8_gemv,cuda.bf16_gemv";
  const auto load = [&](const std::string& patches) { return Model::load(dir, parse_patches(patches).options, {}, "cuda"); };
  auto twin = load(base), fast = load(fast_patches), graphed = load(fast_patches + ",cuda.graph");
  const auto toks = test_prompt(90, twin->config().vocab);
  const auto run = [&](Model& m) { return run_chunks(m, toks, 9, [](const auto& s) { return s.official_tc_calls; }); };
  const ForwardRun twin_run = run(*twin), fast_run = run(*fast);
  const int64_t none = twin_run.calls, some = fast_run.calls;
  const auto &a = twin_run.logits, &f = fast_run.logits;
  const auto again = run(*fast).logits, gr = run(*graphed).logits;
  EXPECT_EQ(none, 0);
  EXPECT_GT(some, 0) << "the patches did not run the E4M3 tensor-core kernels";
  std::printf("official tensor-core launches (W4A8 expert chunks, W8A8 projections, bf16 wo_a) in chunks of 9: %lld\n", (long long)some);
  ASSERT_EQ(f.size(), a.size());
  EXPECT_EQ(std::memcmp(f.data(), again.data(), f.size() * 4), 0) << "the official tensor-core forward is not deterministic";
  EXPECT_EQ(std::memcmp(f.data(), gr.data(), f.size() * 4), 0) << "graph replay differs from eager launches";
  for (const char* patch : {"cuda.moe_mxfp4", "cuda.fp8_gemv", "cuda.bf16_gemv"})
    expect_local_within_patch_tolerance(dir, toks, {40, 9, 1, 3, 1, 1}, base, patch);
}

// Refused by name: cuda.prefill_gemm with the official numerics (its GEMMs do not reproduce their roundings) and
// without cuda.fp8_gemv
// (whose FP8 matrices it takes over).
TEST_F(GpuTest, PrefillGemmRefusals) {
  for (const char* mode : {"numerics.official", "numerics.official_initial"})
    for (const std::string patch : {"cuda.prefill_gemm"}) {
      try {
        Model::load(std::string(PLUMB_TEST_DATA) + "/golden/tiny-official-ref", parse_patches(std::string(mode) + "," + patch).options, {},
                    "cuda");
        ADD_FAILURE() << mode << " with " << patch << " was accepted";
      } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find(mode), std::string::npos) << m;
        EXPECT_NE(m.find(patch), std::string::npos) << m;
      }
    }
  try {
    Model::load(std::string(PLUMB_TEST_DATA) + "/golden/kernel-dims", parse_patches("cuda.prefill_gemm").options, {}, "cuda");
    ADD_FAILURE() << "cuda.prefill_gemm without cuda.fp8_gemv was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs cuda.fp8_gemv"), std::string::npos) << e.what();
  }
}
