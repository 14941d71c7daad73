// Model weights as zero-copy views of the mapped checkpoint; quantized matrices dequantize row by row on use.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/safetensors.h"
#include "model/config.h"

namespace plumb {

// A [rows, cols] matrix in one of the checkpoint layouts:
//   plain  F32 / BF16 / F16;
//   FP8    F8_E4M3 values with a `.scale` of [ceil(rows/128), ceil(cols/128)] (E8M0 or F32): W = v * s[r/128][c/128];
//   FP4    I8 (or U8) [rows, cols/2], two E2M1 codes per byte, even column in the low nibble, with an E8M0
//          `.scale` of [rows, cols/32]: W = v * s[r][c/32].
class Matrix {
 public:
  enum class Layout { Plain, FP8Block, FP4Group };
  Matrix() = default;
  // Resolves `name` (+ ".scale") in the checkpoint and validates it against the expected logical shape.
  static Matrix bind(const Checkpoint& ck, const std::string& name, int64_t rows, int64_t cols);

  void row(int64_t r, float* out) const;  // dequantized row r (cols floats)
  // Row r as stored: element values before scaling (E4M3 / E2M1 / plain) and the scale of each column block
  // (block() columns each; Plain: one block of all columns with scale 1). For GEMM emulations.
  void row_raw(int64_t r, float* vals, float* block_scales) const;
  int64_t block() const { return layout_ == Layout::FP8Block ? 128 : layout_ == Layout::FP4Group ? 32 : cols_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  Layout layout() const { return layout_; }
  const std::string& name() const { return name_; }
  // The checkpoint tensors behind it (for backends that upload them as stored): values, and the scale tensor
  // (FP8Block / FP4Group; null for Plain) with scale_cols() columns.
  const TensorView& values() const { return *w_; }
  const TensorView* scales() const { return s_; }
  int64_t scale_cols() const { return scale_cols_; }

 private:
  float block_scale(int64_t r, int64_t b) const;  // FP8Block: the scale of row r's column block b
  std::string name_;
  int64_t rows_ = 0, cols_ = 0;
  Layout layout_ = Layout::Plain;
  const TensorView* w_ = nullptr;
  const TensorView* s_ = nullptr;
  int64_t scale_cols_ = 0;
};

struct HyperConnWeights {  // one mHC site: fn [mix, hc*D], base [mix], scale [3] (hc head: [hc, hc*D], [hc], [1])
  Tensor fn, base, scale;
};

struct CompressorWeights {  // wkv/wgate [coff*c, D], ape [m, coff*c], norm [c]
  Matrix wkv, wgate;
  Tensor ape, norm;
  int rate = 0, dim = 0;
  bool overlap = false;  // CSA: two series, windows of 2m slots
};

struct IndexerWeights {
  Matrix wq_b;          // [heads*dim, q_lora]
  Matrix weights_proj;  // [heads, D]
  CompressorWeights comp;
};

struct AttentionWeights {
  Matrix wq_a, wq_b, wkv, wo_a, wo_b;
  Tensor q_norm, kv_norm, sink;
  std::unique_ptr<CompressorWeights> comp;  // CSA / HCA
  std::unique_ptr<IndexerWeights> indexer;  // CSA
};

struct ExpertWeights {
  Matrix w1, w2, w3;  // gate [I, D], down [D, I], up [I, D]
  Tensor b1{}, b2{}, b3{};  // their biases [I], [D], [I]: the shared MLP under mlp_bias only, else empty
};

struct MoeWeights {
  Matrix gate;          // [E, D]
  Tensor bias;          // [E] learned layers (selection only)
  IndexTensor tid2eid;  // [V, K] hash layers
  std::vector<ExpertWeights> experts;
  std::unique_ptr<ExpertWeights> shared;
};

struct LayerWeights {
  Tensor attn_norm, ffn_norm;
  HyperConnWeights hc_attn, hc_ffn;
  AttentionWeights attn;
  MoeWeights moe;
};

struct ModelWeights {
  Matrix embed, head;
  Tensor norm;
  HyperConnWeights hc_head;
  std::vector<LayerWeights> layers;

  // Binds every tensor the config needs; a missing or mis-shaped tensor is an Error that names it.
  // `on_layer(done, total)`, if set, is called after each layer is bound.
  static ModelWeights bind(const Checkpoint& ck, const ModelConfig& cfg,
                           const std::function<void(int64_t, int64_t)>& on_layer = {});
};

}  // namespace plumb
