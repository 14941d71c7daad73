// The CPU's Numerics policy (model/numerics.h) on the device: the same primitives, called at the same rounding
// points by the GPU sublayers. fp32 identities / the fp32 twin's kernels unless numerics.official, where each is
// its device twin in src/cuda/fwd_official.cu.
#pragma once
#include "cuda/gpu_common.h"

namespace plumb::cuda {

class GpuNumerics {
 public:
  explicit GpuNumerics(const ModelOptions& o) : official_(o.official), initial_(o.official_initial) {}
  bool official() const { return official_; }
  bool official_initial() const { return initial_; }

  // Activation storage: bf16 (official) or none, over x[0, n).
  void act(float* x, int64_t n) const;
  // Numerics::proj: y[t * ldy + r] = W x_t; official: FP8 activation quantization + block-scaled GEMM, bf16 out
  // (plain weights: the bf16 GEMM); an FP8 matrix with its tensor-core form (cuda.fp8_gemv) on the E4M3 tensor
  // cores (official_fp8_linear).
  // x16: x as f16 rows (ld ldx), used by the FP8 tensor-core GEMV instead of converting x again.
  void proj(const GMat& w, const float* x, int n, int64_t ldx, float* y, int64_t ldy, Scratch& sc, const uint16_t* x16 = nullptr) const;
  // The same for expert slots: slot i < nslots multiplies input row i / x_div by matrix mats[idx[i]] (idx null:
  // mats[0]); y [nslots, rows] (mats: a device array).
  void proj_slots(const detail::DMat* mats, const int32_t* idx, int nslots, int x_div, const float* x, int64_t ldx, int64_t rows,
                  int64_t cols, float* y, int64_t ldy, Scratch& sc) const;
  // Numerics::proj_rows_bf16 / proj_bf16: rows [r0, r0 + nr) of W; official: bf16 operands, bf16 out.
  void proj_bf16(const GMat& w, const float* x, int n, int64_t ldx, int64_t r0, int64_t nr, float* y, int64_t ldy) const;
  // Weighted RMSNorm (fp32 twin), stored as an activation. x16 (optional, ignored by the official numerics): the
  // result also as f16 [rows, dim] for the tensor-core GEMVs (proj's x16). Returns whether x16 was written.
  bool rms_norm(float* x, int64_t rows, int64_t dim, const float* w, double eps, uint16_t* x16 = nullptr) const;
  // Per-head unweighted RMS: official in bf16 (Numerics::head_rms).
  void head_rms(float* x, int64_t groups, int64_t dim, double eps) const;
  // RoPE on the trailing rope.dim values of each row (GpuRope::apply's arguments), stored as an activation.
  void rope(const GpuRope& r, float* x, int64_t rows, int64_t ld, int64_t off, const int64_t* dpos, int64_t per_pos,
            bool inverse) const;
  // head_rms (w null) or rms_norm (weighted), then rope (forward) on rows of dim values: one launch unless official.
  // also (optional): a second set of rows given rope (forward) alone, at its off with the rope's half (r.dim / 2;
  // also->half is ignored), in the same launch unless official (fwd_rms_norm_rope's RopeRows).
  void norm_rope(const GpuRope& r, float* x, int64_t rows, int64_t dim, const float* w, double eps, const int64_t* dpos,
                 int64_t per_pos, const detail::RopeRows* also = nullptr) const;
  // FP8 KV simulation of the first n values of each row (official, current revision).
  void kv_fp8_sim(float* x, int64_t rows, int64_t ld, int64_t n) const;
  // The indexer's Hadamard + FP4 simulation of each row of n values (official).
  void indexer_rotate(float* x, int64_t rows, int64_t n) const;

 private:
  bool official_, initial_;
};

// The official numerics' FP8 linear on the E4M3 tensor cores (cuda.fp8_gemv): x quantized as act_quant does
// (official_quant: act_quant_e4m3 into scratch; codes [n, K], scales [n, K/128], valid until the scratch's next
// quantization), then fp8_linear_a8 (bf16 out). Counted in Scratch::official_tc_calls. Projections of one x can share
// its codes (the second overload).
struct OfficialCodes {
  uint8_t* q = nullptr;
  float* s = nullptr;
};
OfficialCodes official_quant(const float* x, int n, int64_t K, int64_t ldx, Scratch& sc);
void official_fp8_linear(const Fp8Matrix& w, const float* x, int n, int64_t ldx, float* y, int64_t ldy, Scratch& sc);
void official_fp8_linear(const Fp8Matrix& w, const OfficialCodes& x, int n, float* y, int64_t ldy, Scratch& sc);

// ops::linear_bf16_weight on the device: y = x . bf16(W)^T in fp64, x and y rounded to bf16 iff bf16_io (the router
// of numerics.official and router.bf16).
void linear_bf16_weight(const GMat& w, const float* x, int n, int64_t ldx, float* y, int64_t ldy, bool bf16_io);

}  // namespace plumb::cuda
