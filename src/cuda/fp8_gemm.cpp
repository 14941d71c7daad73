// FP8 block-scaled projections at prefill (patch cuda.prefill_gemm; api.h): the weight dequantized into bf16
// scratch, the activations rounded to bf16, a cuBLASLt bf16 GEMM with fp32 accumulation and output. The decode
// GEMVs read every weight once per 8 tokens; at thousands of tokens this reads it once per GEMM. Also the plain
// bf16 projections (the compressors') through the same GEMM, or at a few tokens through the decode GEMV's bf16 path
// (cuda.bf16_gemv), each from one bf16 conversion of x.
#ifdef PLUMB_WITH_CUDA
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "cuda/api.h"
#include "cuda/blas.h"
#include "cuda/kernels.h"

namespace plumb::cuda {

namespace d = detail;

namespace {

// E8M0 bytes 10 .. 245 (2^-117 .. 2^118): the smallest E4M3 magnitude (2^-9) times 2^-117 is bf16's smallest normal
// 2^-126, the largest (448 = 1.75 * 2^8) times 2^118 stays below bf16's maximum; in between every E4M3 value
// (at most 4 significant bits) times a power of two is a bf16 normal. Byte 0 (which the GEMV reads as 0) and the
// extremes fall outside: such matrices stay on the GEMV.
constexpr int kMinScaleByte = 10, kMaxScaleByte = 245;

void check_weight(const Fp8Matrix& w, const char* what) {
  PLUMB_CHECK(!w.scale_f32, "{}: the FP8 matrix [{}, {}] has F32 block scales; the bf16 GEMM needs power-of-two (E8M0) scales", what,
              w.rows, w.cols);
  PLUMB_CHECK(w.cols % 128 == 0 && w.rows % 16 == 0, "{}: FP8 matrix [{}, {}]: rows must be a multiple of 16, columns of 128", what,
              w.rows, w.cols);
}

void check_room(const char* what, const char* buf, const void* p, size_t have, size_t need) {
  PLUMB_CHECK(p && have >= need, "{}: scratch '{}' holds {} elements, {} needed", what, buf, p ? have : 0, need);
}

// Several bf16 projections of one x: each weight and output stride against the shared column count.
void check_projs(const char* what, const Bf16Proj* p, int count, int64_t cols, int64_t ldx) {
  for (int i = 0; i < count; ++i) {
    const Bf16Proj& m = p[i];
    PLUMB_CHECK(m.w && m.rows > 0 && cols > 0 && m.rows <= INT32_MAX && cols <= INT32_MAX, "{}: bad weight [{}, {}]", what, m.rows, cols);
    PLUMB_CHECK(ldx >= cols && m.ldy >= m.rows, "{}: ldx {} / ldy {} below the matrix [{}, {}]", what, ldx, m.ldy, m.rows, cols);
  }
}

}  // namespace

bool fp8_gemm_exact(const Fp8Matrix& w) {
  if (w.scale_f32) return false;
  std::vector<uint8_t> s(w.scale_bytes());
  w.scales.download(s.data(), s.size());
  for (uint8_t b : s)
    if (b < kMinScaleByte || b > kMaxScaleByte) return false;
  return true;
}

void fp8_dequant_bf16(const Fp8Matrix& w, uint16_t* out, Stream s) {
  check_weight(w, "fp8_dequant_bf16");
  d::launch_fp8_dequant_bf16(w.codes.as<uint8_t>(), w.scales.as<uint8_t>(), w.rows, w.cols, w.scale_cols(), out, s);
}

void fp8_linear_gemm(const Fp8Matrix& w, const void* x, Act xt, int64_t ldx, int n, float* y, int64_t ldy, const Fp8GemmBuffers& b,
                     Stream s) {
  const char* what = "fp8_linear_gemm";
  check_weight(w, what);
  if (n <= 0) return;
  PLUMB_CHECK(ldx >= w.cols && ldy >= w.rows, "{}: ldx {} / ldy {} below the matrix [{}, {}]", what, ldx, ldy, w.rows, w.cols);
  check_room(what, "w", b.w, b.w_elems, size_t(w.rows * w.cols));
  check_room(what, "x", b.x, b.x_elems, size_t(n) * size_t(w.cols));
  fp8_dequant_bf16(w, b.w, s);
  d::launch_to_bf16(x, int(xt), n, w.cols, ldx, b.x, s);
  GemmDesc g;
  g.workspace = b.lt;
  g.m = n, g.n = int(w.rows), g.k = int(w.cols), g.ldd = ldy;
  gemm_bf16(g, b.x, b.w, y, s);
}

void bf16_linear_gemm_multi(const Bf16Proj* p, int count, int64_t cols, const void* x, Act xt, int64_t ldx, int n,
                            const Fp8GemmBuffers& b, Stream s) {
  const char* what = "bf16_linear_gemm";
  if (n <= 0 || count <= 0) return;
  check_projs(what, p, count, cols, ldx);
  check_room(what, "x", b.x, b.x_elems, size_t(n) * size_t(cols));
  d::launch_to_bf16(x, int(xt), n, cols, ldx, b.x, s);
  for (int i = 0; i < count; ++i) {
    GemmDesc g;
    g.workspace = b.lt;
    g.m = n, g.n = int(p[i].rows), g.k = int(cols), g.ldd = p[i].ldy;
    gemm_bf16(g, b.x, p[i].w, p[i].y, s);
  }
}

void bf16_linear_gemv_multi(const Bf16Proj* p, int count, int64_t cols, const void* x, Act xt, int64_t ldx, int n,
                            const Fp8GemmBuffers& b, Stream s) {
  const char* what = "bf16_linear_gemv";
  if (n <= 0 || count <= 0) return;
  PLUMB_CHECK(count <= d::kGemvTab, "{}: {} projections, at most {} per launch", what, count, d::kGemvTab);
  check_projs(what, p, count, cols, ldx);
  PLUMB_CHECK(cols % 128 == 0, "{}: {} columns, not a multiple of 128", what, cols);
  check_room(what, "x", b.x, b.x_elems, size_t(n) * size_t(cols));
  d::launch_to_bf16(x, int(xt), n, cols, ldx, b.x, s);
  d::GemvArgs a;
  a.fmt = d::kBf16, a.act = d::kBF16, a.mode = d::kDense, a.nmat = 1, a.epi = d::kStore;
  a.x = b.x, a.x_tok_stride = cols, a.n = n, a.cols = cols;
  a.ntab = a.problems = count;
  int64_t tiles = 0;
  for (int i = 0; i < count; ++i) {
    PLUMB_CHECK(p[i].rows % 16 == 0, "{}: weight {} has {} rows, not a multiple of 16", what, i, p[i].rows);
    a.tab_w[i] = p[i].w, a.tab_rows[i] = p[i].rows, a.tab_out[i] = p[i].y, a.tab_ld[i] = p[i].ldy;
    a.rows = std::max(a.rows, p[i].rows);
    tiles += p[i].rows / 16;
  }
  a.warps = d::gemv_dense_warps(tiles, cols / 128);
  a.minblocks = 1;
  d::launch_gemv(a, s);
}

void bf16_linear_grouped_official(const uint16_t* w, int groups, int64_t rows_per_group, int64_t cols, const float* x, int n, float* y,
                                  const Fp8GemmBuffers& b, Stream s) {
  const char* what = "bf16_linear_grouped_official";
  if (n <= 0) return;
  PLUMB_CHECK(groups >= 1 && rows_per_group % 16 == 0 && cols % 128 == 0, "{}: {} groups of [{}, {}] (rows % 16, columns % 128)", what,
              groups, rows_per_group, cols);
  const int64_t in_w = int64_t(groups) * cols;
  check_room(what, "x", b.x, b.x_elems, size_t(n) * size_t(in_w));
  d::launch_to_bf16(x, int(Act::F32), n, in_w, in_w, b.x, s);
  d::GemvArgs a;
  a.fmt = d::kBf16, a.act = d::kBF16, a.mode = d::kDense, a.nmat = 1, a.epi = d::kStore, a.round_bf16 = 1;
  a.w[0] = reinterpret_cast<const uint8_t*>(w), a.w_prob_stride = rows_per_group * cols * 2;
  a.rows = rows_per_group, a.cols = cols, a.problems = groups;
  a.x = b.x, a.x_tok_stride = in_w, a.x_prob_stride = cols;
  a.out = y, a.o_tok_stride = int64_t(groups) * rows_per_group, a.o_prob_stride = rows_per_group, a.n = n;
  a.warps = d::gemv_dense_warps(rows_per_group / 16 * groups, cols / 128);
  a.minblocks = 1;
  d::launch_gemv(a, s);
}

void bf16_linear_gemm(const uint16_t* w, int64_t rows, int64_t cols, const void* x, Act xt, int64_t ldx, int n, float* y, int64_t ldy,
                      const Fp8GemmBuffers& b, Stream s) {
  const Bf16Proj p{w, rows, y, ldy};
  bf16_linear_gemm_multi(&p, 1, cols, x, xt, ldx, n, b, s);
}

void fp8_linear_grouped_gemm(const Fp8Matrix& w, int groups, const void* x, Act xt, int n, float* y, const Fp8GemmBuffers& b,
                             Stream s) {
  const char* what = "fp8_linear_grouped_gemm";
  check_weight(w, what);
  PLUMB_CHECK(groups >= 1 && w.rows % (int64_t(groups) * 128) == 0,
              "{}: {} rows do not split into {} groups of whole 128-row blocks", what, w.rows, groups);
  if (n <= 0) return;
  const int64_t gr = w.rows / groups, in_w = int64_t(groups) * w.cols;
  check_room(what, "w", b.w, b.w_elems, size_t(w.rows * w.cols));
  check_room(what, "x", b.x, b.x_elems, size_t(n) * size_t(in_w));
  fp8_dequant_bf16(w, b.w, s);
  d::launch_to_bf16(x, int(xt), n, in_w, in_w, b.x, s);
  // Group g: x[t, g*cols ...] (rows in_w apart) times W rows [g*gr, (g+1)*gr) into y[t, g*gr ...] (rows w.rows apart).
  GemmDesc g;
  g.workspace = b.lt;
  g.m = n, g.n = int(gr), g.k = int(w.cols);
  g.lda = in_w, g.ldb = w.cols, g.ldd = w.rows;
  g.batch = groups, g.a_stride = w.cols, g.b_stride = gr * w.cols, g.d_stride = gr;
  gemm_bf16(g, b.x, b.w, y, s);
}

void fp8_expert_ffn_gemm(const Fp8Expert& e, const void* x, Act xt, int n, double limit, float* y, const Fp8GemmBuffers& b, Stream s) {
  const char* what = "fp8_expert_ffn_gemm";
  const int64_t I = e.w1.rows, D = e.w1.cols;
  PLUMB_CHECK(e.w3.rows == I && e.w3.cols == D && e.w2.rows == D && e.w2.cols == I,
              "{}: inconsistent expert shapes w1 [{}, {}], w3 [{}, {}], w2 [{}, {}]", what, I, D, e.w3.rows, e.w3.cols, e.w2.rows,
              e.w2.cols);
  for (const Fp8Matrix* m : {&e.w1, &e.w3, &e.w2}) check_weight(*m, what);
  if (n <= 0) return;
  check_room(what, "w", b.w, b.w_elems, size_t(2 * I * D));
  check_room(what, "x", b.x, b.x_elems, size_t(n) * size_t(D));
  check_room(what, "gu", b.gu, b.gu_elems, size_t(n) * size_t(2 * I));
  check_room(what, "h", b.h, b.h_elems, size_t(n) * size_t(I));
  // [W1; W3] as one [2I, D] matrix: one GEMM gives gate and up side by side in each row of gu.
  fp8_dequant_bf16(e.w1, b.w, s);
  fp8_dequant_bf16(e.w3, b.w + I * D, s);
  d::launch_to_bf16(x, int(xt), n, D, D, b.x, s);
  GemmDesc g;
  g.workspace = b.lt;
  g.m = n, g.n = int(2 * I), g.k = int(D);
  gemm_bf16(g, b.x, b.w, b.gu, s);
  d::launch_swiglu_bf16(b.gu, n, I, float(limit), b.h, s);
  // The first GEMM has read b.w by now (one stream): W2 reuses it.
  fp8_dequant_bf16(e.w2, b.w, s);
  GemmDesc g2;
  g2.workspace = b.lt;
  g2.m = n, g2.n = int(D), g2.k = int(I);
  gemm_bf16(g2, b.h, b.w, y, s);
}

}  // namespace plumb::cuda
#endif  // PLUMB_WITH_CUDA
