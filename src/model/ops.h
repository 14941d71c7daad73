// Reference (fp32, plain loops) implementations of the primitive ops the model composes.
#pragma once
#include <cmath>

#include "core/tensor.h"
#include "model/act_math.h"
#include "model/config.h"
#include "model/weights.h"

namespace plumb::ops {

// y[n, rows] = x[n, cols] . W^T  (W dequantized row by row; fp32 accumulation in double for a stable reference)
Tensor linear(const Tensor& x, const Matrix& w);
// y = x . bf16(W)^T with fp32 accumulation: a bf16 parameter in an fp32 GEMM (DeepSeek's Gate). With `bf16_io`
// x and y are bf16 too: what a bf16 GEMM with fp32 accumulation returns (router.bf16, official bf16 linears).
Tensor linear_bf16_weight(const Tensor& x, const Matrix& w, bool bf16_io = false);
void linear_rows_bf16w(const float* x, int64_t n, int64_t x_stride, const Matrix& w, int64_t r0, int64_t nr, float* y,
                       int64_t y_stride, bool bf16_io);
// Same for a sub-range [r0, r0 + nr) of W's rows (the grouped output projection uses one group's rows).
void linear_rows(const float* x, int64_t n, int64_t x_stride, const Matrix& w, int64_t r0, int64_t nr, float* y, int64_t y_stride);

// Weighted RMSNorm over the last dim of width w.size(): y = w * (x * rsqrt(mean(x^2) + eps)).
void rms_norm(float* x, int64_t rows, const Tensor& w, double eps);
// Unweighted RMSNorm over groups of `dim` consecutive values.
void rms_norm_plain(float* x, int64_t groups, int64_t dim, double eps);

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
// The experts' activation (ModelConfig::act; the others than SiLU in model/act_math.h, shared with the GPU).
inline float expert_act(ExpertAct a, float x) {
  switch (a) {
    case ExpertAct::Gelu: return act_math::gelu(x);
    case ExpertAct::GeluTanh: return act_math::gelu_tanh(x);
    case ExpertAct::Relu: return act_math::relu(x);
    case ExpertAct::Silu: break;
  }
  return silu(x);
}
// softplus as PyTorch computes it (threshold 20) but without the overflow/underflow of log(1+exp(x)).
inline float softplus(float x) { return x > 20.0f ? x : std::max(x, 0.0f) + std::log1p(std::exp(-std::fabs(x))); }

// Indices of the k largest of v[0..n), selected exactly as PyTorch's CPU topk does (std::nth_element, or a
// partial sort when k * 64 <= n, on (double value, index) pairs; NaN counts as largest). Matching its choice
// among exactly equal values is what makes tie-heavy cases (ReLU zeros in the indexer) reproducible.
std::vector<int64_t> topk_like_torch(const float* v, int64_t n, int64_t k, bool sorted);
// The k largest, equal values in ascending index order: how PyTorch's CUDA topk resolved the ties seen in the
// official goldens (computed on an H200).
std::vector<int64_t> topk_lowest_index_first(const float* v, int64_t n, int64_t k);

// In-place softmax over n values.
void softmax(float* x, int64_t n);

// Interleaved RoPE table for one layer type: pair i of the trailing `dim` dims rotates by pos * inv_freq[i].
class Rope {
 public:
  Rope() = default;
  Rope(const RopeConfig& rc, int dim);
  // Rotates the LAST dim() values of x (pairs (2i, 2i+1)) at position pos; inverse uses the conjugate (-sin).
  void apply(float* x_tail, int64_t pos, bool inverse = false) const;
  int dim() const { return dim_; }
  const std::vector<float>& inv_freq() const { return inv_freq_; }
  float attention_factor() const { return attention_factor_; }

 private:
  int dim_ = 0;
  std::vector<float> inv_freq_;
  float attention_factor_ = 1.0f;
};

}  // namespace plumb::ops
