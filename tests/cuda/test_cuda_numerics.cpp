// The GPU's numerics modes against the CPU's: each device primitive of numerics.official (cuda/fwd_official.cu,
// the hc mixing modes) against its model/numerics.h twin on the same inputs, bit for bit where the arithmetic is the
// same (the reported error is then 0); and verify-golden on the GPU for every official-code fixture in its mode, and
// for mhc.bf16_mix and router.bf16 on every fp32 fixture, at the registry's tolerances, teacher forced.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "cuda/fwd_kernels.h"
#include "cuda/gpu_common.h"
#include "cuda_test_util.h"
#include "official_layout_check.h"
#include "model/hyper_connection.h"
#include "model/model.h"
#include "model/numerics.h"
#include "patches/registry.h"
#include "plumb/tools.h"

using namespace plumb;
using namespace plumb_cuda_test;

namespace {

namespace d = plumb::cuda::detail;
namespace fs = std::filesystem;
using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;

ModelOptions official_options() {
  ModelOptions o;
  o.official = true;
  return o;
}

// Values over many binades, with exact bf16 ties and E4M3 / E2M1 midpoints among them.
std::vector<float> wide_values(Rng& rng, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const float m = rng.uniform(-1.0f, 1.0f);
    v[i] = std::ldexp(m, rng.integer(-12, 8));
    if (i % 7 == 0) v[i] = std::ldexp(float(rng.integer(-300, 300)) / 256.0f + 1.0f / 512.0f, rng.integer(-6, 6));  // bf16 ties
    if (i % 11 == 0) v[i] = float(rng.integer(-24, 24)) * 0.25f;  // grid points and midpoints
  }
  return v;
}

// Bitwise comparison (values equal, +0 == -0), reporting the first difference and the largest error.
void expect_bitwise(const std::string& what, const std::vector<float>& gpu, const std::vector<float>& ref, int64_t cols) {
  ASSERT_EQ(gpu.size(), ref.size()) << what;
  const Cmp c = compare(gpu.data(), ref.data(), int64_t(gpu.size()));
  std::printf("  %s\n", describe(what, c, cols).c_str());
  for (size_t i = 0; i < gpu.size(); ++i)
    ASSERT_TRUE(gpu[i] == ref[i] || (std::isnan(gpu[i]) && std::isnan(ref[i])))
        << what << ": element [" << i / size_t(cols) << ", " << i % size_t(cols) << "] gpu " << gpu[i] << " cpu " << ref[i];
}

class CudaNumerics : public GpuTest {};

TEST_F(CudaNumerics, ActIsBf16Rounding) {
  Rng rng(1);
  const int64_t rows = 37, ld = 70, off = 3, width = 61;
  const auto x = wide_values(rng, size_t(rows * ld));
  DeviceBuffer dx = to_device(x);
  d::fwd_act(dx.as<float>(), rows, ld, off, width, nullptr);
  auto ref = x;
  for (int64_t r = 0; r < rows; ++r) Numerics(official_options()).act(ref.data() + r * ld + off, width);
  expect_bitwise("act (bf16, strided rows)", to_host<float>(dx, x.size()), ref, ld);
}

TEST_F(CudaNumerics, ActQuantMatchesFp8QuantBlock) {
  Rng rng(2);
  for (int64_t K : {128, 300, 1024}) {
    const int64_t rows = 9, nab = (K + 127) / 128;
    auto x = wide_values(rng, size_t(rows * K));
    for (int64_t i = 0; i < 16; ++i) x[size_t(i)] = 1e-6f;  // a block below the amax floor: the floor's scale
    DeviceBuffer dx = to_device(x), q(size_t(rows * K) * 4), sa(size_t(rows * nab) * 4);
    d::fwd_act_quant(dx.as<float>(), rows, K, K, q.as<float>(), sa.as<float>(), nullptr);
    std::vector<float> rq(size_t(rows * K)), rs(size_t(rows * nab));
    for (int64_t r = 0; r < rows; ++r) official::fp8_quant_block(x.data() + r * K, K, 128, rq.data() + r * K, rs.data() + r * nab);
    expect_bitwise("act_quant q K=" + std::to_string(K), to_host<float>(q, rq.size()), rq, K);
    expect_bitwise("act_quant scales K=" + std::to_string(K), to_host<float>(sa, rs.size()), rs, nab);
  }
}

// Numerics::proj (block-scaled GEMM emulation or the bf16 GEMM) and proj_bf16 on FP8 (E8M0 / F32 scales), FP4,
// BF16 and F32 weights, dense and per expert slot.
TEST_F(CudaNumerics, LinearMatchesProj) {
  Rng rng(3);
  const int64_t rows = 80, cols = 384;
  TempDir dir;
  std::vector<OwnedTensor> ts;
  add_fp8(ts, rng, "fp8e", rows, cols);
  add_fp8(ts, rng, "fp8f", rows, cols, /*f32_scales=*/true);
  add_fp4(ts, rng, "fp4", rows, cols);
  ts.push_back(bf16_tensor("bf16.weight", {rows, cols}, rng.floats(size_t(rows * cols), -0.1f, 0.1f)));
  ts.push_back(owned_f32("f32.weight", Tensor({rows, cols}, rng.floats(size_t(rows * cols), -0.1f, 0.1f))));
  const Checkpoint ck = write_checkpoint(dir, ts);
  const Numerics nm(official_options());
  std::vector<Matrix> mats;
  std::vector<cuda::GMat> gm;
  for (const char* name : {"fp8e", "fp8f", "fp4", "bf16", "f32"}) {
    mats.push_back(Matrix::bind(ck, std::string(name) + ".weight", rows, cols));
    gm.push_back(cuda::upload_matrix(mats.back()));
  }
  for (int n : {1, 5, 11}) {
    // bf16 activations, as the official code stores them, and raw fp32 ones (the quantization sees either).
    Tensor x({n, cols}, wide_values(rng, size_t(n * cols)));
    if (n == 5) Numerics(official_options()).act(x);
    DeviceBuffer dx = to_device(x.data);
    for (size_t m = 0; m < mats.size(); ++m) {
      const std::string tag = mats[m].name() + " n=" + std::to_string(n);
      const int64_t nab = (cols + 127) / 128;
      DeviceBuffer y(size_t(n * rows) * 4), q(size_t(n * cols) * 4), sa(size_t(n * nab) * 4);
      d::fwd_act_quant(dx.as<float>(), n, cols, cols, q.as<float>(), sa.as<float>(), nullptr);
      d::OfficialLinearArgs a;
      a.w = gm[m].d, a.nslots = n, a.x = dx.as<float>(), a.ldx = cols, a.q = q.as<float>(), a.sa = sa.as<float>();
      a.nr = rows, a.y = y.as<float>(), a.ldy = rows;
      d::fwd_linear_official(a, nullptr);
      const Tensor ref = nm.proj(x, mats[m]);
      if (mats[m].layout() == Matrix::Layout::Plain)  // fp64 sums in another order: at most one bf16 ulp apart
        expect_close("proj " + tag, to_host<float>(y, ref.data.size()), ref.data, rows, 1.0 / 128);
      else  // exact block sums: bit for bit
        expect_bitwise("proj " + tag, to_host<float>(y, ref.data.size()), ref.data, rows);
      // proj_bf16 on rows [16, 64) of the same weights (the grouped wo_a's call).
      a.bf16 = 1, a.r0 = 16, a.nr = 48;
      d::fwd_linear_official(a, nullptr);
      Tensor rb({n, 48});
      nm.proj_rows_bf16(x.ptr(), n, cols, mats[m], 16, 48, rb.ptr(), 48);
      const auto yb = to_host<float>(y, size_t(n * rows));
      std::vector<float> got(size_t(n * 48));
      for (int t = 0; t < n; ++t) std::copy(yb.begin() + t * rows, yb.begin() + t * rows + 48, got.begin() + t * 48);
      expect_close("proj_rows_bf16 " + tag, got, rb.data, 48, 1.0 / 128);
    }
    // Expert slots: slot i = token i / 2, matrix idx[i] (the routed experts' call).
    std::vector<d::DMat> descs;
    for (const auto& g : gm) descs.push_back(g.d);
    DeviceBuffer dd = to_device(descs);
    std::vector<int32_t> idx(size_t(2 * n));
    for (auto& v : idx) v = rng.integer(0, 2);  // the quantized layouts: bitwise
    DeviceBuffer di = to_device(idx), ys(size_t(2 * n * rows) * 4), q(size_t(n * cols) * 4), sa(size_t(n * 3) * 4);
    d::fwd_act_quant(dx.as<float>(), n, cols, cols, q.as<float>(), sa.as<float>(), nullptr);
    d::OfficialLinearArgs a;
    a.w.cols = cols, a.mats = dd.as<d::DMat>(), a.idx = di.as<int32_t>(), a.nslots = 2 * n, a.x_div = 2;
    a.x = dx.as<float>(), a.ldx = cols, a.q = q.as<float>(), a.sa = sa.as<float>(), a.nr = rows, a.y = ys.as<float>(), a.ldy = rows;
    d::fwd_linear_official(a, nullptr);
    std::vector<float> ref(size_t(2 * n * rows));
    for (int i = 0; i < 2 * n; ++i) {
      Tensor xi({1, cols}, std::vector<float>(x.row(i / 2), x.row(i / 2) + cols));
      const Tensor yi = nm.proj(xi, mats[size_t(idx[size_t(i)])]);
      std::copy(yi.data.begin(), yi.data.end(), ref.begin() + i * rows);
    }
    expect_bitwise("proj per expert slot n=" + std::to_string(n), to_host<float>(ys, ref.size()), ref, rows);
  }
}

TEST_F(CudaNumerics, HeadRmsMatches) {
  Rng rng(4);
  for (int64_t dim : {64, 512}) {
    const int64_t groups = 24;
    auto x = rng.floats(size_t(groups * dim), -3.0f, 3.0f);
    Numerics(official_options()).act(x.data(), int64_t(x.size()));
    DeviceBuffer dx = to_device(x);
    d::fwd_head_rms_bf16(dx.as<float>(), groups, dim, 1e-6, nullptr);
    Numerics(official_options()).head_rms(x.data(), groups, dim, 1e-6);
    expect_bitwise("head_rms dim=" + std::to_string(dim), to_host<float>(dx, x.size()), x, dim);
  }
}

// The official query heads' norm_rope in one launch (fwd_head_rms_bf16 with a HeadRope: the head RMS, RoPE on the
// last dims and their bf16 rounding, the indexer query's rows rotated and rounded too) against the three kernels it
// replaces, each held to the CPU above and in HcMixModesMatch's neighbours: bit for bit. Positions from a device
// value, several heads per position, 9 groups (a partial block), also rows of another width and stride.
TEST_F(CudaNumerics, HeadRmsRopeMatchesSeparateLaunches) {
  Rng rng(41);
  for (int64_t dim : {64, 512}) {
    const int64_t heads = 3, tokens = 3, groups = heads * tokens, rd = 32, half = rd / 2;
    const int64_t arows = tokens * 2, ald = 96, aoff = ald - rd;
    auto x = rng.floats(size_t(groups * dim), -3.0f, 3.0f);
    auto y = rng.floats(size_t(arows * ald), -3.0f, 3.0f);
    Numerics(official_options()).act(x.data(), int64_t(x.size()));
    std::vector<float> inv(static_cast<size_t>(half));
    for (int64_t k = 0; k < half; ++k) inv[size_t(k)] = std::pow(10000.0f, -float(2 * k) / float(rd));
    DeviceBuffer dinv = to_device(inv), dpos = to_device(std::vector<int64_t>{1234});
    DeviceBuffer fx = to_device(x), fy = to_device(y), sx = to_device(x), sy = to_device(y);
    d::HeadRope h;
    h.off = dim - rd, h.half = int(half), h.inv_freq = dinv.as<float>(), h.attention_factor = 1.25f;
    h.dpos = dpos.as<int64_t>(), h.per_pos = heads;
    h.also.x = fy.as<float>(), h.also.rows = arows, h.also.ld = ald, h.also.off = aoff, h.also.half = int(half), h.also.per_pos = 2;
    d::fwd_head_rms_bf16(fx.as<float>(), groups, dim, 1e-6, nullptr, &h);
    d::fwd_head_rms_bf16(sx.as<float>(), groups, dim, 1e-6, nullptr);
    d::fwd_rope(sx.as<float>(), groups, dim, dim - rd, int(half), dinv.as<float>(), 1.25f, dpos.as<int64_t>(), 0, heads, 1, 0, nullptr);
    d::fwd_act(sx.as<float>(), groups, dim, dim - rd, rd, nullptr);
    d::fwd_rope(sy.as<float>(), arows, ald, aoff, int(half), dinv.as<float>(), 1.25f, dpos.as<int64_t>(), 0, 2, 1, 0, nullptr);
    d::fwd_act(sy.as<float>(), arows, ald, aoff, rd, nullptr);
    const auto ref_x = to_host<float>(sx, x.size()), ref_y = to_host<float>(sy, y.size());
    expect_bitwise("head_rms + rope dim=" + std::to_string(dim), to_host<float>(fx, x.size()), ref_x, dim);
    expect_bitwise("also rows rope dim=" + std::to_string(dim), to_host<float>(fy, y.size()), ref_y, ald);
    EXPECT_NE(std::memcmp(ref_y.data(), y.data(), y.size() * 4), 0) << "the also rows were not rotated";
  }
}

// The official numerics' bf16 rounding inside a kernel's launch (round_bf16 and friends) against the kernel then
// fwd_act, bit for bit: rms_norm (weighted and plain), rope (forward and inverse, rows with a stride), swiglu (with
// the clamp and a per-slot weight), add, and scale rounding its input and / or its output.
TEST_F(CudaNumerics, RoundedNormAndRopeMatchActAfter) {
  Rng rng0(43);
  {
    const int nslots = 3;
    const int64_t I = 200, ld = 256, n = nslots * I;
    const auto g = rng0.floats(size_t(nslots * ld), -12.0f, 12.0f), u = rng0.floats(size_t(nslots * ld), -12.0f, 12.0f);
    DeviceBuffer dg = to_device(g), du = to_device(u), pre = to_device(rng0.floats(size_t(nslots), 0.1f, 1.0f));
    DeviceBuffer a(size_t(n) * 4), b(size_t(n) * 4);
    d::fwd_swiglu(dg.as<float>(), du.as<float>(), ld, nslots, I, 7.0f, pre.as<float>(), a.as<float>(), nullptr, 1);
    d::fwd_swiglu(dg.as<float>(), du.as<float>(), ld, nslots, I, 7.0f, pre.as<float>(), b.as<float>(), nullptr);
    d::fwd_act(b.as<float>(), 1, n, 0, n, nullptr);
    expect_bitwise("swiglu bf16", to_host<float>(a, size_t(n)), to_host<float>(b, size_t(n)), I);
    const auto x = rng0.floats(size_t(n), -5.0f, 5.0f), y = rng0.floats(size_t(n), -5.0f, 5.0f);
    DeviceBuffer dx = to_device(x), ya = to_device(y), yb = to_device(y);
    d::fwd_add(ya.as<float>(), dx.as<float>(), n, nullptr, 1);
    d::fwd_add(yb.as<float>(), dx.as<float>(), n, nullptr);
    d::fwd_act(yb.as<float>(), 1, n, 0, n, nullptr);
    expect_bitwise("add bf16", to_host<float>(ya, size_t(n)), to_host<float>(yb, size_t(n)), I);
    for (int round_in : {0, 1}) {
      DeviceBuffer sa = to_device(x), sb = to_device(x);
      d::fwd_scale(sa.as<float>(), 0.0883883f, sa.as<float>(), n, nullptr, round_in, 1);
      if (round_in) d::fwd_act(sb.as<float>(), 1, n, 0, n, nullptr);
      d::fwd_scale(sb.as<float>(), 0.0883883f, sb.as<float>(), n, nullptr);
      d::fwd_act(sb.as<float>(), 1, n, 0, n, nullptr);
      expect_bitwise("scale bf16, round_in " + std::to_string(round_in), to_host<float>(sa, size_t(n)), to_host<float>(sb, size_t(n)), I);
    }
  }
  Rng rng(42);
  for (int64_t dim : {64, 448, 1024}) {
    const int64_t rows = 5;
    auto x = rng.floats(size_t(rows * dim), -3.0f, 3.0f);
    DeviceBuffer w = to_device(rng.floats(size_t(dim), 0.5f, 1.5f));
    for (const float* wp : std::initializer_list<const float*>{w.as<float>(), nullptr}) {
      DeviceBuffer a = to_device(x), b = to_device(x);
      d::fwd_rms_norm(a.as<float>(), rows, dim, dim, wp, 1e-6, nullptr, nullptr, 1);
      d::fwd_rms_norm(b.as<float>(), rows, dim, dim, wp, 1e-6, nullptr);
      d::fwd_act(b.as<float>(), rows, dim, 0, dim, nullptr);
      expect_bitwise("rms_norm bf16 dim=" + std::to_string(dim) + (wp ? "" : " (plain)"), to_host<float>(a, x.size()),
                     to_host<float>(b, x.size()), dim);
    }
    const int64_t rd = 64, half = rd / 2, ld = dim + 16, off = ld - rd;
    auto y = rng.floats(size_t(rows * ld), -3.0f, 3.0f);
    std::vector<float> inv(static_cast<size_t>(half));
    for (int64_t k = 0; k < half; ++k) inv[size_t(k)] = std::pow(10000.0f, -float(2 * k) / float(rd));
    DeviceBuffer dinv = to_device(inv), dpos = to_device(std::vector<int64_t>{777});
    for (int inverse : {0, 1}) {
      DeviceBuffer a = to_device(y), b = to_device(y);
      d::fwd_rope(a.as<float>(), rows, ld, off, int(half), dinv.as<float>(), 1.1f, dpos.as<int64_t>(), 0, 2, 1, inverse, nullptr, 1);
      d::fwd_rope(b.as<float>(), rows, ld, off, int(half), dinv.as<float>(), 1.1f, dpos.as<int64_t>(), 0, 2, 1, inverse, nullptr);
      d::fwd_act(b.as<float>(), rows, ld, off, rd, nullptr);
      expect_bitwise("rope bf16 inverse=" + std::to_string(inverse), to_host<float>(a, y.size()), to_host<float>(b, y.size()), ld);
    }
  }
}

TEST_F(CudaNumerics, KvFp8SimMatches) {
  Rng rng(5);
  for (int64_t n : {448, 100}) {  // V4's nope dims; a ragged last block
    const int64_t rows = 13, ld = n + 64;
    auto x = wide_values(rng, size_t(rows * ld));
    DeviceBuffer dx = to_device(x);
    d::fwd_fp8_roundtrip(dx.as<float>(), rows, ld, n, 64, nullptr);
    for (int64_t r = 0; r < rows; ++r) official::fp8_roundtrip(x.data() + r * ld, n, 64);
    expect_bitwise("kv_fp8_sim n=" + std::to_string(n), to_host<float>(dx, x.size()), x, ld);
  }
}

TEST_F(CudaNumerics, IndexerRotateMatches) {
  Rng rng(6);
  for (int64_t n : {128, 64, 96}) {  // 96: zero-padded to 128, truncated
    const int64_t rows = 10;
    auto x = rng.floats(size_t(rows * n), -4.0f, 4.0f);
    x[3] = 0.0f;
    DeviceBuffer dx = to_device(x);
    d::fwd_indexer_rotate(dx.as<float>(), rows, n, nullptr);
    for (int64_t r = 0; r < rows; ++r) Numerics(official_options()).indexer_rotate(x.data() + r * n, n);
    expect_bitwise("indexer_rotate n=" + std::to_string(n), to_host<float>(dx, x.size()), x, n);
  }
}

// hc_pre / hc_head's mixing modes (0 the reference; official: the norm after the GEMM, bf16 collapse; mhc.bf16_mix:
// bf16 operands) against the CPU's hc_pre / hc_head, at V4's shape and at others (odd D: the scalar path; D smaller
// than the cluster's slices: empty blocks; H 1, 2, 5, 6, 7, 8: 8 is the config's largest, 80 mixes). post and comb go through expf (CUDA's is not libm's): a
// few ulps. hc_post against the CPU's bit for bit (vector and scalar paths).
TEST_F(CudaNumerics, HcMixModesMatch) {
  Rng rng(7);
  const int n = 6, iters = 20;
  struct Shape {
    int H;
    int64_t D;
  };
  for (const Shape sh : {Shape{4, 256}, Shape{4, 4096}, Shape{2, 102}, Shape{6, 64}, Shape{1, 8}, Shape{5, 36}, Shape{7, 100},
                          Shape{8, 4096}, Shape{8, 101}})  // (101: the scalar path at hc_mult 8)
    for (int mode : {0, 1, 2}) {
      const int H = sh.H;
      const int64_t D = sh.D, hd = H * D, nmix = (2 + H) * H;
      ModelConfig c;
      c.hc_mult = H, c.hidden = int(D), c.hc_sinkhorn_iters = iters, c.hc_eps = 1e-6, c.rms_eps = 1e-6;
      HyperConnWeights w{Tensor({nmix, hd}, rng.floats(size_t(nmix * hd), -0.05f, 0.05f)), Tensor({nmix}, rng.floats(size_t(nmix), -1.0f, 1.0f)),
                         Tensor({3}, rng.floats(3, 0.5f, 2.0f))};
      HyperConnWeights wh{Tensor({H, hd}, rng.floats(size_t(H * hd), -0.05f, 0.05f)), Tensor({H}, rng.floats(size_t(H), -1.0f, 1.0f)),
                          Tensor({1}, rng.floats(1, 0.5f, 2.0f))};
      Tensor X({n, H, D}, rng.floats(size_t(n * hd), -2.0f, 2.0f));
      Numerics(official_options()).act(X);
      ModelOptions o;
      if (mode == 2) o.official = true;
      if (mode == 1) o.mhc_bf16_mix = true;
      const std::string tag = std::string(mode == 2 ? "official" : mode == 1 ? "mhc.bf16_mix" : "reference") + " H=" + std::to_string(H) +
                              " D=" + std::to_string(D);
      const HcPre ref = hc_pre(w, c, o, X, Tap{}, "hc");
      const Tensor ref_head = hc_head(wh, c, o, X);
      DeviceBuffer dX = to_device(X.data), dfn = to_device(w.fn.data), dbase = to_device(w.base.data), dscale = to_device(w.scale.data);
      DeviceBuffer hfn = to_device(wh.fn.data), hbase = to_device(wh.base.data), hscale = to_device(wh.scale.data);
      DeviceBuffer post(size_t(n * H) * 4), comb(size_t(n * H * H) * 4), col(size_t(n * D) * 4), hcol(size_t(n * D) * 4);
      DeviceBuffer scratch(d::fwd_hc_scratch_doubles(n, H) * 8);
      d::HcArgs a;
      a.X = dX.as<float>(), a.fn = dfn.as<float>(), a.base = dbase.as<float>(), a.scale = dscale.as<float>();
      a.n = n, a.H = H, a.iters = iters, a.D = D, a.hc_eps = 1e-6f, a.rms_eps = 1e-6;
      a.post = post.as<float>(), a.comb = comb.as<float>(), a.collapsed = col.as<float>();
      a.mix_mode = mode, a.act_bf16 = mode == 2;
      d::fwd_hc_pre(a, scratch.as<double>(), nullptr);
      d::HcArgs b = a;
      b.fn = hfn.as<float>(), b.base = hbase.as<float>(), b.scale = hscale.as<float>(), b.head = 1, b.collapsed = hcol.as<float>();
      b.post = nullptr, b.comb = nullptr;
      d::fwd_hc_pre(b, scratch.as<double>(), nullptr);
      expect_close(tag + " hc post", to_host<float>(post, size_t(n * H)), ref.post.data, H, 1e-5);
      expect_close(tag + " hc comb", to_host<float>(comb, size_t(n * H * H)), ref.comb.data, H * H, 1e-5);
      expect_close(tag + " hc collapsed", to_host<float>(col, size_t(n * D)), ref.collapsed.data, D, mode == 2 ? 1.0 / 128 : 1e-5);
      expect_close(tag + " hc head", to_host<float>(hcol, size_t(n * D)), ref_head.data, D, mode == 2 ? 1.0 / 128 : 1e-5);
      // hc_post: bf16 storage in official mode, the CPU's order.
      Tensor y({n, D}, rng.floats(size_t(n * D), -1.0f, 1.0f));
      DeviceBuffer dy = to_device(y.data), dref_post = to_device(ref.post.data), dref_comb = to_device(ref.comb.data);
      DeviceBuffer out(size_t(n * hd) * 4);
      d::fwd_hc_post(dy.as<float>(), dX.as<float>(), dref_post.as<float>(), dref_comb.as<float>(), n, H, D, 0, out.as<float>(), nullptr,
                     mode == 2);
      expect_bitwise(tag + " hc_post", to_host<float>(out, size_t(n * hd)), hc_post(y, X, ref, o).data, D);
    }
}

// ---- whole forward on the fixtures ----

std::string head_of(const fs::path& fx) {
  std::ifstream f(fx / "golden.json");
  std::string head(4096, '\0');
  f.read(head.data(), head.size());
  return head;
}

// (fixture, patches): every official-code fixture in its mode, alone and with cuda.moe_mxfp4, cuda.fp8_gemv and
// cuda.bf16_gemv (their official-numerics kernels); mhc.bf16_mix and router.bf16 on every fp32 fixture.
std::vector<std::tuple<std::string, std::string>> mode_cases() {
  std::vector<std::tuple<std::string, std::string>> out;
  for (const auto& e : fs::directory_iterator(fs::path(PLUMB_TEST_DATA) / "golden")) {
    if (!fs::exists(e.path() / "golden.json")) continue;
    const std::string head = head_of(e.path());
    if (head.find("official inference") != std::string::npos) {
      const std::string mode = head.find("initial revision") != std::string::npos ? "numerics.official_initial" : "numerics.official";
      out.push_back({e.path().string(), mode});
      out.push_back({e.path().string(), mode + ",cuda.moe_mxfp4,cuda.fp8_gemv,cuda.bf16_gemv"});  // where the shapes fit
    } else {
      out.push_back({e.path().string(), "mhc.bf16_mix"});
      out.push_back({e.path().string(), "router.bf16"});
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

class GpuNumericsGolden : public GpuTest, public ::testing::WithParamInterface<std::tuple<std::string, std::string>> {};

TEST_P(GpuNumericsGolden, VerifyGolden) {
  tools::VerifyGoldenOptions o;
  o.dir = std::get<0>(GetParam());
  o.patches = std::get<1>(GetParam());
  o.backend = "cuda";
  o.quiet = false;  // every tap's error: where the largest is
  // A patch's documented risk on the fixture that exists to expose it (e.g. router.bf16 on router-underflow; the
  // list is tests/CMakeLists.txt's PLUMB_EXPOSED, shared with the CPU suite): verify-golden must fail.
  const std::string pair = o.patches + ":" + fs::path(o.dir).filename().string();
  const bool exposed = ("," + std::string(PLUMB_EXPOSED) + ",").find("," + pair + ",") != std::string::npos;
  EXPECT_EQ(tools::verify_golden(o), exposed ? 1 : 0) << o.dir << " [" << o.patches << "]";
}

INSTANTIATE_TEST_SUITE_P(Modes, GpuNumericsGolden, ::testing::ValuesIn(mode_cases()), [](const auto& info) {
  std::string n = fs::path(std::get<0>(info.param)).filename().string() + "_" + std::get<1>(info.param);
  for (auto& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
});

// The official numerics under cuda.graph: bit-identical logits to eager launches, decode steps across compressor
// windows (csa-long-ref: CSA layers with the indexer's rotated keys and FP8 KV entries).
TEST_F(GpuTest, OfficialGraphStepsMatchEagerLaunches) {
  const std::string dir = std::string(PLUMB_TEST_DATA) + "/golden/csa-long-ref";
  auto eager = Model::load(dir, parse_patches("numerics.official").options, {}, "cuda");
  auto graphed = Model::load(dir, parse_patches("numerics.official,cuda.graph").options, {}, "cuda");
  const int vocab = eager->config().vocab;
  auto se = eager->new_state(), sg = graphed->new_state();
  for (int step = 0; step < 80; ++step) {
    const int n = step == 0 ? 5 : 1;
    std::vector<int32_t> toks(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) toks[size_t(i)] = int32_t((step * 131 + i * 17 + 3) % vocab);
    const auto a = eager->forward(se, toks);
    const auto b = graphed->forward(sg, toks);
    ASSERT_EQ(a.data.size(), b.data.size());
    for (size_t i = 0; i < a.data.size(); ++i)
      ASSERT_EQ(std::memcmp(&a.data[i], &b.data[i], 4), 0) << "step " << step << " logit " << i << ": eager " << a.data[i] << " graph " << b.data[i];
  }
  EXPECT_FALSE(sg.dev->graphs_failed);
  EXPECT_GT(sg.dev->graph_launches, 50);
}

// The official index list's window holes on the GPU (KeyList's official layout): the CPU suite's check
// (official_layout_check.h) with every op on the GPU. (The rows that differ need not be the CPU's: CUDA's expf is
// not libm's. Measured: 1 and 2 rows, the CPU 1 and 3.)
TEST_F(GpuTest, OfficialWindowHolesMatchTheOfficialCode) {
  plumb_test::expect_official_attention_agrees("wide-window-ref", "cuda");
  plumb_test::expect_official_attention_agrees("wide-prefill-ref", "cuda");
}

// The official numerics do not combine with the tensor-core kernels that do not emulate its GEMMs (cuda.moe_mxfp4
// and cuda.fp8_gemv have W4A8 / W8A8 kernels of their own for it): refused at load, naming both options.
TEST(CudaBackend, OfficialWithTensorCoreKernelsIsRefusedByName) {
  std::string why;
  if (!cuda::available(&why)) GTEST_SKIP() << why;
  for (const char* fast : {"attn.splitk_decode", "indexer.tc_scores", "indexer.dmma_scores"})
    for (const char* mode : {"numerics.official", "numerics.official_initial"}) {
      try {
        Model::load(std::string(PLUMB_TEST_DATA) + "/golden/tiny-official-ref",
                    parse_patches(std::string(mode) + "," + fast).options, {}, "cuda");
        ADD_FAILURE() << mode << " with " << fast << " was accepted";
      } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find(mode), std::string::npos) << m;
        EXPECT_NE(m.find(fast), std::string::npos) << m;
      }
    }
}

}  // namespace
