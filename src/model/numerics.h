// Numerics policy: the reference (fp32, transformers' math) or DeepSeek's official inference numerics (bf16
// activations, FP8/FP4 block-scaled GEMMs with FP8 activation quantization, FP8 KV and FP4 indexer simulation).
// Sublayers call these primitives at the points where the official code rounds; in reference mode they are
// fp32 identities, so one implementation serves both modes.
#pragma once
#include "core/tensor.h"
#include "model/ops.h"
#include "model/options.h"
#include "model/weights.h"

namespace plumb {

class Numerics {
 public:
  explicit Numerics(const ModelOptions& o) : official_(o.official), initial_(o.official_initial) {}
  bool official() const { return official_; }
  // The release-day official code: its in-place FP8 "simulation" cast through bf16 (an identity for power-of-two
  // scales) and its shared expert had no SwiGLU clamp.
  bool official_initial() const { return initial_; }

  // Activation storage: bf16 rounding (official) or none.
  float act(float v) const;
  void act(float* v, int64_t n) const;
  void act(Tensor& t) const { act(t.ptr(), t.numel()); }

  // A projection whose weight the official code holds in FP8/FP4 (or bf16 when the checkpoint is not
  // quantized): official = per-128 FP8 activation quantization + block-scaled GEMM emulation, bf16 out.
  Tensor proj(const Tensor& x, const Matrix& w) const;
  // A projection the official code runs in bf16 (indexer weights_proj, grouped wo_a): bf16 operands, bf16 out.
  Tensor proj_bf16(const Tensor& x, const Matrix& w) const;
  // Rows [r0, r0+nr) of w, bf16 einsum in official mode (the grouped output projection).
  void proj_rows_bf16(const float* x, int64_t n, int64_t x_stride, const Matrix& w, int64_t r0, int64_t nr, float* y,
                      int64_t y_stride) const;

  // Weighted RMSNorm computed in fp32, stored as an activation.
  void rms_norm(float* x, int64_t rows, const Tensor& w, double eps) const;
  // Per-head unweighted RMS of the query: the official code does it on bf16 tensors (square, mean, rsqrt in bf16).
  void head_rms(float* x, int64_t groups, int64_t dim, double eps) const;
  // RoPE on the trailing dims, result stored as an activation.
  void rope(const ops::Rope& r, float* tail, int64_t pos, bool inverse = false) const;

  // FP8 KV simulation of the nope dims (official: E4M3 round trip in blocks of 64, pow2 scales).
  void kv_fp8_sim(float* v, int64_t n) const;
  // The indexer's Hadamard rotation (scaled by n^-1/2) + FP4 simulation in blocks of 32 (official only).
  void indexer_rotate(float* v, int64_t n) const;

 private:
  bool official_, initial_;
};

// Exposed for tests: the official kernels' primitives.
namespace official {
float pow2_scale(float amax, float inv_max);  // 2^ceil(log2(amax * inv_max)), computed in fp32 as the kernels do
void fp8_quant_block(const float* x, int64_t n, int64_t block, float* q, float* scales);  // q: E4M3 values
void fp8_roundtrip(float* x, int64_t n, int64_t block);  // in place: bf16(e4m3(x/s) * s)
void fp4_roundtrip(float* x, int64_t n, int64_t block);  // in place: bf16(e2m1(x/s) * s)
void hadamard(float* x, int64_t n);                     // Sylvester order, scaled n^-1/2, bf16 out
}  // namespace official

}  // namespace plumb
