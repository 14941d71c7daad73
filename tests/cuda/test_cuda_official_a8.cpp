// The official numerics' E4M3 tensor-core kernels: cuda.moe_mxfp4's W4A8 routed experts (the A8 bit layout of the
// FP4 weights) and cuda.fp8_gemv's W8A8 projections, the activations' E4M3 quantization (codes), each against fp64
// sums of the same quantized values and against the official twin.
//
// Tolerances (normalized: max |gpu - ref| / max |ref| over the output tensor):
//   layout, quantization         bit for bit
//   GEMVs, fp32 outputs          1e-5  E2M1 / E4M3 x E4M3 products are exact; only the fp32 sums' order differs
//   bf16 outputs                 8e-3  one bf16 rounding (<= 2^-8 relative) of sums that differ from the fp64 ones by
//                                      ~1e-7 can go either way near a tie; at most 1 % of the outputs may differ
#include <cstring>
#include <map>
#include <numeric>

#include "cuda/fwd_kernels.h"
#include "cuda/gpu_common.h"
#include "cuda/kernels.h"
#include "cuda_test_util.h"
#include "kernel_twins.h"

using namespace plumb;
using namespace plumb_cuda_test;

namespace {

namespace d = cuda::detail;

// Host twin of act_quant_e4m3's values: the codes decoded, times their block scale.
std::vector<double> dequant(const std::vector<uint8_t>& q, const std::vector<float>& s, int64_t rows, int64_t K) {
  std::vector<double> v(q.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < K; ++k)
      v[size_t(r * K + k)] = double(fmt8::e4m3_to_f32(q[size_t(r * K + k)])) * s[size_t(r * (K / 128) + k / 128)];
  return v;
}

// Row-major dequantized values of an FP4 matrix (exact: code value times its power-of-two scale).
std::vector<float> dense(const Matrix& w) {
  std::vector<float> v(size_t(w.rows() * w.cols()));
  for (int64_t r = 0; r < w.rows(); ++r) w.row(r, v.data() + r * w.cols());
  return v;
}

// out[r] = fp64 sum_k w[r, k] * x[k], rounded to float.
std::vector<float> matvec(const std::vector<float>& w, int64_t rows, int64_t cols, const double* x) {
  std::vector<float> y(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    double acc = 0;
    for (int64_t k = 0; k < cols; ++k) acc += double(w[size_t(r * cols + k)]) * x[k];
    y[size_t(r)] = float(acc);
  }
  return y;
}

// Outputs that differ from the reference at all, as a fraction.
double differing(const std::vector<float>& a, const std::vector<float>& b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return double(n) / double(std::max<size_t>(a.size(), 1));
}

}  // namespace

// ---- layout (host only) ----

// The A8 layout is a permutation of the checkpoint's codes, and the kernel's decode (fp4x8_to_e4m3x4, replayed here
// with the same masks and shifts) turns every word into E4M3 bytes worth the codes' values times 2^-6, elements 0..3
// in the low word's bytes and 4..7 in the high word's, in order.
TEST(CudaLayout, Fp4A8LayoutRoundTripsAndDecodesToE4m3) {
  Rng rng(21);
  const int64_t rows = 32, cols = 256;
  const auto canon = rng.bytes(size_t(rows * cols / 2));
  const auto rp = cuda::repack_fp4_decode(canon.data(), rows, cols, cuda::Fp4Layout::A8);
  EXPECT_EQ(cuda::unpack_fp4_decode(rp.data(), rows, cols, cuda::Fp4Layout::A8), canon);
  EXPECT_NE(rp, cuda::repack_fp4_decode(canon.data(), rows, cols, cuda::Fp4Layout::F16));
  auto nib = [&](int64_t r, int64_t k) { return (canon[size_t(r * cols / 2 + k / 2)] >> (4 * (k & 1))) & 0xF; };
  for_each_fp4_word(rp, rows, cols, [&](int64_t r, int64_t c, int t, int j, uint32_t w) {
    const uint32_t lo = w & 0x9C9C9C9Cu, hi = ((w << 2) & 0x8C8C8C8Cu) | ((w >> 2) & 0x10101010u);
    for (int e = 0; e < 8; ++e) {
      const uint8_t byte = uint8_t((e < 4 ? lo : hi) >> (8 * (e % 4)));
      const int code = nib(r, (4 * c + j) * 32 + 8 * t + e);
      ASSERT_EQ(fmt8::e4m3_to_f32(byte), fmt8::e2m1_to_f32(uint8_t(code)) * std::ldexp(1.0f, -6))
          << "row " << r << " chunk " << c << " lane part " << t << " word " << j << " element " << e;
    }
  });
}

class CudaOfficialTc : public GpuTest {};

// act_quant_e4m3's codes are the codes of fwd_act_quant's values (the official twin's), and its scales the same, on
// rows with ordinary, tiny (the amax floor), large and saturating blocks, and a partial last block.
TEST_F(CudaOfficialTc, ActQuantCodesMatchTheTwin) {
  Rng rng(22);
  for (int64_t K : {int64_t(1024), int64_t(200)}) {
    const int64_t rows = 5, nab = (K + 127) / 128;
    auto x = rng.floats(size_t(rows * K), -3.0f, 3.0f);
    for (int64_t k = 0; k < std::min<int64_t>(K, 128); ++k) x[size_t(1 * K + k)] *= 1e-7f;  // below the amax floor
    for (int64_t k = 0; k < K; ++k) x[size_t(2 * K + k)] *= 1e5f;
    x[size_t(3 * K + 5)] = 0.0f, x[size_t(3 * K + 6)] = -0.0f;
    const cuda::DeviceBuffer xd = cuda::to_device(x);
    cuda::DeviceBuffer q(size_t(rows * K) * 4), sa(size_t(rows * nab) * 4), q8(size_t(rows * K)), sa8(size_t(rows * nab) * 4);
    d::fwd_act_quant(xd.as<float>(), rows, K, K, q.as<float>(), sa.as<float>(), nullptr);
    cuda::act_quant_e4m3(xd.as<float>(), rows, K, K, q8.as<uint8_t>(), sa8.as<float>());
    cuda::synchronize();
    const auto qv = cuda::to_host<float>(q, size_t(rows * K));
    const auto codes = cuda::to_host<uint8_t>(q8, size_t(rows * K));
    EXPECT_EQ(cuda::to_host<float>(sa, size_t(rows * nab)), cuda::to_host<float>(sa8, size_t(rows * nab))) << "K " << K;
    for (size_t i = 0; i < qv.size(); ++i) {
      const float v = fmt8::e4m3_to_f32(codes[i]);
      ASSERT_TRUE(std::memcmp(&v, &qv[i], 4) == 0 || (v == 0.0f && qv[i] == 0.0f))
          << "K " << K << " row " << i / size_t(K) << " col " << i % size_t(K) << ": code " << int(codes[i]) << " = " << v
          << ", twin value " << qv[i];
    }
  }
}

// gate/up (+ SwiGLU, the weight before down) and down on the W4A8 kernel, for routings with repeats across and within
// tokens and one expert with more than 8 slots (passes of 8), with and without the group table: fp32 outputs against
// fp64 sums of the quantized values, then the official API's bf16 outputs against the same sums rounded likewise.
TEST_F(CudaOfficialTc, GateUpDownMatchExactSums) {
  Rng rng(23);
  const int64_t E = 12, D = 1024, I = 512;
  auto f = make_moe(rng, E, D, I);
  const cuda::MoeExperts m = cuda::upload_experts(f->w, cuda::Fp4Layout::A8);
  const cuda::MoeExperts m16 = cuda::upload_experts(f->w);
  const float limit = 7.0f;
  std::map<int, std::array<std::vector<float>, 3>> wd;  // dequantized w1, w3, w2 of the experts used
  auto weights = [&](int e) -> const std::array<std::vector<float>, 3>& {
    auto it = wd.find(e);
    if (it == wd.end()) {
      const auto& ex = f->w.experts[size_t(e)];
      it = wd.emplace(e, std::array<std::vector<float>, 3>{dense(ex.w1), dense(ex.w3), dense(ex.w2)}).first;
    }
    return it->second;
  };
  struct Routing {
    const char* name;
    int n, K;
    std::vector<int32_t> idx;
    bool table;
  };
  std::vector<Routing> routings;
  {
    Routing r{"random distinct", 8, 4, random_distinct_routing(rng, 8, 4, E), false};
    routings.push_back(r);
    r.name = "random distinct, group table", r.table = true;
    routings.push_back(r);
  }
  routings.push_back({"one token", 1, 4, {3, 0, 11, 7}, false});
  routings.push_back({"repeats within a token", 3, 4, {2, 2, 5, 9, 9, 9, 1, 2, 4, 4, 4, 4}, false});
  routings.push_back({"every slot one expert (passes of 8)", 5, 4, std::vector<int32_t>(20, 6), false});
  // The raw launch (no bf16 rounding) of one half, as moe_gate_up_a8 / moe_down_a8 set it up.
  auto raw = [&](const cuda::Fp4Matrices& w, const cuda::Fp4Matrices* w3, const cuda::DeviceBuffer& idx, int n, int K,
                 const cuda::DeviceBuffer& x8, const cuda::DeviceBuffer& xs, int64_t cols, const float* pre, float* out, int64_t ldo) {
    d::GemvArgs a;
    a.fmt = d::kFp4A8, a.act = d::kE4M3, a.mode = d::kMoe;
    a.w[0] = w.codes.as<uint8_t>(), a.s[0] = w.scales.get();
    a.w_prob_stride = int64_t(w.code_bytes()), a.s_prob_stride = int64_t(w.scale_bytes());
    a.rows = w.rows, a.cols = w.cols, a.s_ld = w.cols / 32;
    a.idx = idx.as<int32_t>(), a.n = n, a.topk = K, a.problems = int(E);
    a.x = x8.get(), a.x_tok_stride = cols, a.x_scale = xs.as<float>(), a.xs_ld = cols / 128, a.out = out, a.o_tok_stride = ldo;
    if (w3) {
      a.nmat = 2, a.epi = d::kSwiglu, a.limit = limit, a.pre_weight = pre, a.x_by_token = 1;
      a.w[1] = w3->codes.as<uint8_t>(), a.s[1] = w3->scales.get();
    }
    d::launch_gemv(a, nullptr);
  };
  for (const auto& r : routings) {
    const int n = r.n, K = r.K, S = n * K;
    const auto x = rng.floats(size_t(n * D), -2.0f, 2.0f);
    const auto wts = rng.floats(size_t(S), 0.05f, 1.0f);
    cuda::DeviceBuffer xd = cuda::to_device(x), idx = cuda::to_device(r.idx), wdv = cuda::to_device(wts);
    cuda::DeviceBuffer x8(size_t(n * D)), xs(size_t(n * D / 128) * 4), h_raw(size_t(S * I) * 4), h(size_t(S * I) * 4),
        h8(size_t(S * I)), hs(size_t(S * I / 128) * 4), ys_raw(size_t(S * D) * 4), ys(size_t(S * D) * 4);
    cuda::DeviceBuffer groups;
    if (r.table) {
      groups = cuda::DeviceBuffer(cuda::moe_group_bytes(n, K, E));
      cuda::moe_group(idx.as<int32_t>(), n, K, E, groups.get());
    }
    for (auto* b : {&h_raw, &h, &ys_raw, &ys}) b->fill_byte(0xFF);
    cuda::act_quant_e4m3(xd.as<float>(), n, D, D, x8.as<uint8_t>(), xs.as<float>());
    raw(m.w1, &m.w3, idx, n, K, x8, xs, D, wdv.as<float>(), h_raw.as<float>(), I);
    cuda::moe_gate_up_a8(m, idx.as<int32_t>(), n, K, x8.as<uint8_t>(), xs.as<float>(), limit, wdv.as<float>(), h.as<float>(), nullptr,
                         r.table ? groups.get() : nullptr);
    cuda::act_quant_e4m3(h.as<float>(), S, I, I, h8.as<uint8_t>(), hs.as<float>());
    raw(m.w2, nullptr, idx, n, K, h8, hs, I, nullptr, ys_raw.as<float>(), D);
    cuda::moe_down_a8(m, idx.as<int32_t>(), n, K, h8.as<uint8_t>(), hs.as<float>(), ys.as<float>(), nullptr,
                      r.table ? groups.get() : nullptr);
    cuda::synchronize();
    const auto xq = dequant(cuda::to_host<uint8_t>(x8, size_t(n * D)), cuda::to_host<float>(xs, size_t(n * D / 128)), n, D);
    const auto hq = dequant(cuda::to_host<uint8_t>(h8, size_t(S * I)), cuda::to_host<float>(hs, size_t(S * I / 128)), S, I);
    std::vector<float> h_ref(size_t(S * I)), h_ref_r(size_t(S * I)), ys_ref(size_t(S * D)), ys_ref_r(size_t(S * D));
    for (int s = 0; s < S; ++s) {
      const auto& w = weights(r.idx[size_t(s)]);
      const auto g = matvec(w[0], I, D, xq.data() + (s / K) * D), u = matvec(w[1], I, D, xq.data() + (s / K) * D);
      for (int64_t i = 0; i < I; ++i) {
        h_ref[size_t(s * I + i)] = swiglu_f(g[size_t(i)], u[size_t(i)], limit) * wts[size_t(s)];
        h_ref_r[size_t(s * I + i)] =
            fmt8::round_bf16(swiglu_f(fmt8::round_bf16(g[size_t(i)]), fmt8::round_bf16(u[size_t(i)]), limit) * wts[size_t(s)]);
      }
      const auto y = matvec(w[2], D, I, hq.data() + s * I);
      for (int64_t i = 0; i < D; ++i) ys_ref[size_t(s * D + i)] = y[size_t(i)], ys_ref_r[size_t(s * D + i)] = fmt8::round_bf16(y[size_t(i)]);
    }
    const std::string tag = std::string("W4A8 [") + r.name + "] n=" + std::to_string(n);
    const auto hg = cuda::to_host<float>(h, size_t(S * I)), ysg = cuda::to_host<float>(ys, size_t(S * D));
    expect_close(tag + " gate/up fp32 vs exact sums", cuda::to_host<float>(h_raw, size_t(S * I)), h_ref, I, 1e-5);
    expect_close(tag + " down fp32 vs exact sums", cuda::to_host<float>(ys_raw, size_t(S * D)), ys_ref, D, 1e-5);
    expect_close(tag + " gate/up bf16 vs exact sums rounded", hg, h_ref_r, I, 8e-3);
    expect_close(tag + " down bf16 vs exact sums rounded", ysg, ys_ref_r, D, 8e-3);
    EXPECT_LE(differing(hg, h_ref_r), 0.01) << tag << " gate/up: outputs whose bf16 rounding went the other way";
    EXPECT_LE(differing(ysg, ys_ref_r), 0.01) << tag << " down: outputs whose bf16 rounding went the other way";
  }
  // Each kernel refuses the other layout's weights by name.
  cuda::DeviceBuffer idx = cuda::to_device(std::vector<int32_t>{0}), x8(static_cast<size_t>(D)), xs(size_t(D / 128) * 4),
      h(size_t(I) * 4);
  EXPECT_THROW(cuda::moe_gate_up_a8(m16, idx.as<int32_t>(), 1, 1, x8.as<uint8_t>(), xs.as<float>(), limit, nullptr, h.as<float>()), Error);
  cuda::Workspace ws;
  EXPECT_THROW(cuda::moe_gate_up(m, idx.as<int32_t>(), 1, 1, x8.get(), cuda::Act::F32, limit, nullptr, nullptr, h.as<float>(), ws), Error);
}

// fp8_linear_a8 (the official FP8 linear on the E4M3 tensor cores) on E8M0- and F32-scaled matrices, 1 to 11 tokens
// (one and two passes of 8), with and without blocks split across warps: fp32 outputs within 1e-5 of fp64 sums of the
// quantized values, bf16 outputs against the official twin kernel (fwd_linear_official: exact block sums, the fma
// chain in K order), which they must equal but for near-tie roundings.
TEST_F(CudaOfficialTc, Fp8LinearMatchesExactSumsAndTheTwin) {
  Rng rng(24);
  const int64_t rows = 256, cols = 1024;
  for (bool f32_scales : {false, true}) {
    TempDir dir;
    std::vector<OwnedTensor> ts;
    add_fp8(ts, rng, "w", rows, cols, f32_scales);
    const Checkpoint ck = write_checkpoint(dir, ts);
    const Matrix m = Matrix::bind(ck, "w.weight", rows, cols);
    const cuda::Fp8Matrix w = cuda::upload_fp8(m);
    std::vector<float> wd(size_t(rows * cols));
    for (int64_t r = 0; r < rows; ++r) m.row(r, wd.data() + r * cols);
    for (int n : {1, 3, 8, 11}) {
      const auto x = rng.floats(size_t(n * cols), -2.0f, 2.0f);
      cuda::DeviceBuffer xd = cuda::to_device(x), x8(size_t(n * cols)), xs(size_t(n * cols / 128) * 4), y(size_t(n * rows) * 4),
          yr(size_t(n * rows) * 4), yt(size_t(n * rows) * 4), q(size_t(n * cols) * 4), sa(size_t(n * cols / 128) * 4);
      cuda::act_quant_e4m3(xd.as<float>(), n, cols, cols, x8.as<uint8_t>(), xs.as<float>());
      cuda::Workspace ws;
      cuda::fp8_linear_a8(w, x8.as<uint8_t>(), xs.as<float>(), n, y.as<float>(), rows, ws);
      d::GemvArgs a;  // the same launch without the bf16 rounding
      a.fmt = d::kFp8A8, a.act = d::kE4M3, a.w[0] = w.codes.as<uint8_t>(), a.s[0] = w.scales.get();
      a.rows = rows, a.cols = cols, a.s_ld = w.scale_cols(), a.s_f32 = w.scale_f32 ? 1 : 0;
      a.x = x8.get(), a.x_tok_stride = cols, a.x_scale = xs.as<float>(), a.xs_ld = cols / 128;
      a.out = yr.get(), a.o_tok_stride = rows, a.n = n, a.warps = 4;
      d::launch_gemv(a, nullptr);
      d::fwd_act_quant(xd.as<float>(), n, cols, cols, q.as<float>(), sa.as<float>(), nullptr);
      d::OfficialLinearArgs t;
      t.w.w = w.codes.get(), t.w.s = w.scales.get(), t.w.rows = rows, t.w.cols = cols, t.w.s_cols = w.scale_cols();
      t.w.layout = 1, t.w.s_f32 = w.scale_f32 ? 1 : 0;
      t.nslots = n, t.x = xd.as<float>(), t.ldx = cols, t.nr = rows, t.y = yt.as<float>(), t.ldy = rows, t.q = q.as<float>(),
      t.sa = sa.as<float>();
      d::fwd_linear_official(t, nullptr);
      cuda::synchronize();
      const auto xq = dequant(cuda::to_host<uint8_t>(x8, size_t(n * cols)), cuda::to_host<float>(xs, size_t(n * cols / 128)), n, cols);
      std::vector<float> ref(size_t(n * rows));
      for (int tk = 0; tk < n; ++tk) {
        const auto yv = matvec(wd, rows, cols, xq.data() + tk * cols);
        std::copy(yv.begin(), yv.end(), ref.begin() + tk * rows);
      }
      const std::string tag = std::string("W8A8 [") + (f32_scales ? "F32" : "E8M0") + " scales] n=" + std::to_string(n);
      const auto yg = cuda::to_host<float>(y, size_t(n * rows)), ytw = cuda::to_host<float>(yt, size_t(n * rows));
      expect_close(tag + " fp32 vs exact sums", cuda::to_host<float>(yr, size_t(n * rows)), ref, rows, 1e-5);
      expect_close(tag + " bf16 vs the official twin", yg, ytw, rows, 8e-3);
      EXPECT_LE(differing(yg, ytw), 0.01) << tag << ": outputs whose bf16 rounding went the other way";
    }
  }
}

// The official numerics' wo_a: the bf16 copy of an FP8 matrix (bf16_copy_if_exact, as DeepSeek's convert.py makes
// it) through bf16_linear_grouped_official, against the twin (fwd_linear_official's bf16 path per group: fp64 sums of
// bf16 operands, bf16 out) on 1 to 11 tokens: equal but for near-tie roundings; a matrix with a scale outside the
// exact range gets no copy (the twin keeps it).
TEST_F(CudaOfficialTc, Bf16GroupedMatchesTheTwin) {
  Rng rng(25);
  const int G = 4;
  const int64_t R = 128, C = 256;
  TempDir dir;
  std::vector<OwnedTensor> ts;
  add_fp8(ts, rng, "w", G * R, C);
  add_fp8(ts, rng, "far", 128, 128, false, 3, 5);  // scales 2^-124 .. 2^-122: code x scale below bf16's normals
  const Checkpoint ck = write_checkpoint(dir, ts);
  const Matrix m = Matrix::bind(ck, "w.weight", G * R, C);
  EXPECT_EQ(cuda::bf16_copy_if_exact(Matrix::bind(ck, "far.weight", 128, 128)).get(), nullptr);
  const cuda::DeviceBuffer w16 = cuda::bf16_copy_if_exact(m);
  ASSERT_NE(w16.get(), nullptr);
  const cuda::Fp8Matrix f = cuda::upload_fp8(m);
  for (int n : {1, 3, 8, 11}) {
    auto x = rng.floats(size_t(n * G * C), -2.0f, 2.0f);
    for (auto& v : x) v = fmt8::round_bf16(v);  // activations as the official numerics store them
    cuda::DeviceBuffer xd = cuda::to_device(x), y(size_t(n * G * R) * 4), yt(size_t(n * G * R) * 4), xb(size_t(n * G * C) * 2);
    cuda::Fp8GemmBuffers b;
    b.x = xb.as<uint16_t>(), b.x_elems = size_t(n * G * C);
    cuda::bf16_linear_grouped_official(w16.as<uint16_t>(), G, R, C, xd.as<float>(), n, y.as<float>(), b);
    for (int g = 0; g < G; ++g) {
      d::OfficialLinearArgs t;
      t.w.w = f.codes.get(), t.w.s = f.scales.get(), t.w.rows = G * R, t.w.cols = C, t.w.s_cols = f.scale_cols(), t.w.layout = 1;
      t.bf16 = 1, t.nslots = n, t.x = xd.as<float>() + g * C, t.ldx = G * C, t.r0 = g * R, t.nr = R, t.y = yt.as<float>() + g * R,
      t.ldy = G * R;
      d::fwd_linear_official(t, nullptr);
    }
    cuda::synchronize();
    const auto yg = cuda::to_host<float>(y, size_t(n * G * R)), ytw = cuda::to_host<float>(yt, size_t(n * G * R));
    const std::string tag = "bf16 wo_a, " + std::to_string(G) + " groups, n=" + std::to_string(n);
    expect_close(tag + " vs the official twin", yg, ytw, G * R, 8e-3);
    EXPECT_LE(differing(yg, ytw), 0.01) << tag << ": outputs whose bf16 rounding went the other way";
  }
}

// The official attention's output kernel (numerics.official): each key block's max and probabilities computed a
// thread per key against its one-thread twin (AttendArgs::official_serial), bit for bit, on an HCA layer's keys
// (window + compressed entries over several blocks of 64) at 1 and 3 tokens.
TEST_F(CudaOfficialTc, OfficialAttentionMatchesItsSerialTwin) {
  const int Hq = 8;
  const int64_t Dh = 128, W = 32, rate = 4, ne = 300, maxk = W + ne;
  uint64_t seed = 41;
  for (int n : {1, 3}) {
    cuda::DeviceBuffer q(size_t(n * Hq * Dh) * 4), kv(size_t(n * Dh) * 4), ring(size_t(W * Dh) * 4), ent(size_t(ne * Dh) * 4),
        sink(size_t(Hq) * 4), pos = cuda::to_device(std::vector<int64_t>{ne * rate - n}), logits(size_t(n * Hq * maxk) * 4),
        o1(size_t(n * Hq * Dh) * 4), o2(size_t(n * Hq * Dh) * 4);
    for (cuda::DeviceBuffer* b : {&q, &kv, &ring, &ent, &sink}) d::fill(b->get(), b->bytes() / 4, d::kFillF32, seed++, -1.0f, 1.0f);
    d::AttendArgs a;
    a.q = q.as<float>(), a.chunk_kv = kv.as<float>(), a.ring = ring.as<float>(), a.entries = ent.as<float>();
    a.sink = sink.as<float>(), a.pos = pos.as<int64_t>(), a.out = o1.as<float>();
    a.n = n, a.Hq = Hq, a.type = 2, a.Dh = Dh, a.window = W, a.ne = ne, a.rate = rate, a.scale = 1.0f / std::sqrt(float(Dh));
    a.logits = logits.as<float>(), a.ld_logits = maxk, a.official = 1;
    d::fwd_attend(a, nullptr);
    a.out = o2.as<float>(), a.official_serial = 1;
    d::fwd_attend(a, nullptr);
    cuda::synchronize();
    const auto v1 = cuda::to_host<float>(o1, size_t(n * Hq * Dh)), v2 = cuda::to_host<float>(o2, size_t(n * Hq * Dh));
    size_t first = 0;
    while (first < v1.size() && std::memcmp(&v1[first], &v2[first], 4) == 0) ++first;
    EXPECT_EQ(first, v1.size()) << "n " << n << ": first differing output " << first << " (parallel "
                                << (first < v1.size() ? v1[first] : 0.0f) << ", serial " << (first < v1.size() ? v2[first] : 0.0f) << ")";
    double mx = 0;
    for (float v : v1) mx = std::max(mx, double(std::fabs(v)));
    EXPECT_GT(mx, 0.0) << "the outputs are all zero: the test exercises nothing";
  }
}
