// Host side of the GPU numerics policy (gpu_numerics.h): which kernel each Numerics primitive runs.
#ifdef PLUMB_WITH_CUDA
#include "cuda/gpu_numerics.h"

#include "model/official_math.h"

namespace plumb::cuda {

using namespace detail;

namespace {

// The official GEMM on n input rows: their FP8 quantization (scratch), then the kernel.
void official_gemm(OfficialLinearArgs a, int64_t x_rows, Scratch& sc) {
  const int64_t K = a.w.cols, nab = (K + official_math::kActBlock - 1) / official_math::kActBlock;
  float* q = sc.f("official.q", x_rows * K);
  float* sa = sc.f("official.sa", x_rows * nab);
  fwd_act_quant(a.x, x_rows, K, a.ldx, q, sa, nullptr);
  a.q = q, a.sa = sa;
  fwd_linear_official(a, nullptr);
}

}  // namespace

OfficialCodes official_quant(const float* x, int n, int64_t K, int64_t ldx, Scratch& sc) {
  OfficialCodes c{static_cast<uint8_t*>(sc.get("official.q8", size_t(n) * size_t(K))), sc.f("official.sa8", int64_t(n) * (K / 128))};
  act_quant_e4m3(x, n, K, ldx, c.q, c.s);
  return c;
}

void official_fp8_linear(const Fp8Matrix& w, const OfficialCodes& x, int n, float* y, int64_t ldy, Scratch& sc) {
  ++sc.official_tc_calls;
  fp8_linear_a8(w, x.q, x.s, n, y, ldy, sc.work());
}

void official_fp8_linear(const Fp8Matrix& w, const float* x, int n, int64_t ldx, float* y, int64_t ldy, Scratch& sc) {
  official_fp8_linear(w, official_quant(x, n, w.cols, ldx, sc), n, y, ldy, sc);
}

void GpuNumerics::act(float* x, int64_t n) const {
  if (official_) fwd_act(x, 1, n, 0, n, nullptr);
}

void GpuNumerics::proj(const GMat& w, const float* x, int n, int64_t ldx, float* y, int64_t ldy, Scratch& sc,
                       const uint16_t* x16) const {
  if (!official_) return linear(w, x, n, ldx, y, ldy, sc, x16);
  if (w.fp8) return official_fp8_linear(*w.fp8, x, n, ldx, y, ldy, sc);
  OfficialLinearArgs a;
  a.w = w.d, a.nslots = n, a.x = x, a.ldx = ldx, a.nr = w.d.rows, a.y = y, a.ldy = ldy;
  official_gemm(a, n, sc);
}

void GpuNumerics::proj_slots(const DMat* mats, const int32_t* idx, int nslots, int x_div, const float* x, int64_t ldx, int64_t rows,
                             int64_t cols, float* y, int64_t ldy, Scratch& sc) const {
  if (!official_) return fwd_linear_indexed(mats, idx, nslots, x_div, x, ldx, rows, cols, y, ldy, nullptr);
  OfficialLinearArgs a;
  a.w.cols = cols;  // the width for the quantization; each slot's matrix comes from mats
  a.mats = mats, a.idx = idx, a.nslots = nslots, a.x_div = x_div, a.x = x, a.ldx = ldx, a.nr = rows, a.y = y, a.ldy = ldy;
  official_gemm(a, (nslots + x_div - 1) / x_div, sc);
}

void GpuNumerics::proj_bf16(const GMat& w, const float* x, int n, int64_t ldx, int64_t r0, int64_t nr, float* y, int64_t ldy) const {
  if (!official_) return fwd_linear(w.d, x, n, ldx, r0, nr, y, ldy, nullptr);
  OfficialLinearArgs a;
  a.w = w.d, a.bf16 = 1, a.nslots = n, a.x = x, a.ldx = ldx, a.r0 = r0, a.nr = nr, a.y = y, a.ldy = ldy;
  fwd_linear_official(a, nullptr);
}

bool GpuNumerics::rms_norm(float* x, int64_t rows, int64_t dim, const float* w, double eps, uint16_t* x16) const {
  if (official_) x16 = nullptr;  // its activation rounding (act) comes after the norm: in the same launch
  fwd_rms_norm(x, rows, dim, dim, w, eps, nullptr, x16, official_ ? 1 : 0);
  return x16 != nullptr;
}

void GpuNumerics::head_rms(float* x, int64_t groups, int64_t dim, double eps) const {
  if (official_) return fwd_head_rms_bf16(x, groups, dim, eps, nullptr);
  fwd_rms_norm(x, groups, dim, dim, nullptr, eps, nullptr);
}

void GpuNumerics::rope(const GpuRope& r, float* x, int64_t rows, int64_t ld, int64_t off, const int64_t* dpos, int64_t per_pos,
                       bool inverse) const {
  r.apply(x, rows, ld, off, dpos, per_pos, inverse, official_);  // (official: act on the rotated dims, in the same launch)
}

void GpuNumerics::norm_rope(const GpuRope& r, float* x, int64_t rows, int64_t dim, const float* w, double eps, const int64_t* dpos,
                            int64_t per_pos, const RopeRows* also) const {
  if (official_ && !w) {  // head_rms, rope and its bf16 rounding, the also rows' likewise: one launch
    HeadRope h;
    h.off = dim - r.dim, h.half = r.dim / 2, h.inv_freq = f32(r.inv_freq), h.attention_factor = r.attention_factor;
    h.dpos = dpos, h.per_pos = per_pos;
    if (also) h.also = *also, h.also.half = r.dim / 2;
    fwd_head_rms_bf16(x, rows, dim, eps, nullptr, &h);
    return;
  }
  if (official_) {
    rms_norm(x, rows, dim, w, eps);
    rope(r, x, rows, dim, dim - r.dim, dpos, per_pos, false);
    if (also) rope(r, also->x, also->rows, also->ld, also->off, dpos, also->per_pos, false);
    return;
  }
  RopeRows b;
  if (also) b = *also, b.half = r.dim / 2;
  fwd_rms_norm_rope(x, rows, dim, w, eps, dim - r.dim, r.dim / 2, f32(r.inv_freq), r.attention_factor, dpos, per_pos, nullptr,
                    also ? &b : nullptr);
}

void GpuNumerics::kv_fp8_sim(float* x, int64_t rows, int64_t ld, int64_t n) const {
  if (official_ && !initial_) fwd_fp8_roundtrip(x, rows, ld, n, official_math::kKvBlock, nullptr);
}

void GpuNumerics::indexer_rotate(float* x, int64_t rows, int64_t n) const {
  if (official_) fwd_indexer_rotate(x, rows, n, nullptr);
}

void linear_bf16_weight(const GMat& w, const float* x, int n, int64_t ldx, float* y, int64_t ldy, bool bf16_io) {
  OfficialLinearArgs a;
  a.w = w.d, a.bf16 = 1, a.round_io = bf16_io ? 1 : 0, a.nslots = n, a.x = x, a.ldx = ldx, a.nr = w.d.rows, a.y = y, a.ldy = ldy;
  fwd_linear_official(a, nullptr);
}

}  // namespace plumb::cuda
#endif  // PLUMB_WITH_CUDA
