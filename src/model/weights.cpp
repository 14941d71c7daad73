// Binds the official (hub) tensor names to model weights, validating every dtype and shape up front.
#include "model/weights.h"

#include <algorithm>
#include <cstring>

#include "formats/numeric.h"

namespace plumb {

namespace {

// The formats' decoding as tables, built once from formats/numeric.h's functions (so the same values, NaNs
// included): a quantized row then decodes by lookups instead of an ldexp per element and per scale, which made
// the reference's FP8 linears ~25x slower than its f32 ones at 4096 columns.
struct DecodeTables {
  float e4m3[256], e8m0[256], e2m1[16];
  DecodeTables() {
    for (int i = 0; i < 256; ++i) e4m3[i] = fmt8::e4m3_to_f32(uint8_t(i)), e8m0[i] = fmt8::e8m0_to_f32(uint8_t(i));
    for (int i = 0; i < 16; ++i) e2m1[i] = fmt8::e2m1_to_f32(uint8_t(i));
  }
};
const DecodeTables& tables() {
  static const DecodeTables t;
  return t;
}

// Column c of a packed FP4 row (two E2M1 codes per byte, the even column in the low nibble), unscaled.
float fp4_at(const DecodeTables& T, const uint8_t* rowp, int64_t c) { return T.e2m1[(rowp[c >> 1] >> (4 * (c & 1))) & 0xF]; }

// Official checkpoints have no prefix; some exports add "model.".
const TensorView* lookup(const Checkpoint& ck, const std::string& name) {
  if (auto* v = ck.find(name)) return v;
  return ck.find("model." + name);
}

const TensorView& require(const Checkpoint& ck, const std::string& name) {
  auto* v = lookup(ck, name);
  PLUMB_CHECK(v, "missing tensor {} in {}", name, ck.path());
  return *v;
}

Tensor small(const Checkpoint& ck, const std::string& name, const Shape& shape) {
  const auto& v = require(ck, name);
  PLUMB_CHECK(v.shape == shape, "tensor {} in {} has shape {}, expected {}", name, v.file, shape_str(v.shape), shape_str(shape));
  return to_f32(v);
}

// The first name that exists wins (transformers' exports name the KV norm attn.norm, official ones attn.kv_norm).
Tensor small_any(const Checkpoint& ck, const std::vector<std::string>& names, const Shape& shape) {
  for (const auto& n : names)
    if (lookup(ck, n)) return small(ck, n, shape);
  fail("missing tensor {} (or {}) in {}", names[0], names.size() > 1 ? names[1] : names[0], ck.path());
}

HyperConnWeights hyper_conn(const Checkpoint& ck, const std::string& p, int mix, int64_t hcd, int nscale) {
  return {small(ck, p + "_fn", {mix, hcd}), small(ck, p + "_base", {mix}), small(ck, p + "_scale", {nscale})};
}

CompressorWeights compressor(const Checkpoint& ck, const std::string& p, const ModelConfig& c, int rate, int dim, bool overlap) {
  CompressorWeights w;
  w.rate = rate;
  w.dim = dim;
  w.overlap = overlap;
  const int64_t width = overlap ? 2 * dim : dim;
  w.wkv = Matrix::bind(ck, p + ".wkv.weight", width, c.hidden);
  w.wgate = Matrix::bind(ck, p + ".wgate.weight", width, c.hidden);
  w.ape = small(ck, p + ".ape", {rate, width});
  w.norm = small(ck, p + ".norm.weight", {dim});
  return w;
}

// An expert of `inter` hidden units (moe_intermediate_size for the routed ones).
ExpertWeights expert(const Checkpoint& ck, const std::string& p, const ModelConfig& c, int64_t inter) {
  return {Matrix::bind(ck, p + ".w1.weight", inter, c.hidden), Matrix::bind(ck, p + ".w2.weight", c.hidden, inter),
          Matrix::bind(ck, p + ".w3.weight", inter, c.hidden)};
}

// The shared expert: present when its tensors are (transformers' V4 always builds one of moe_intermediate_size,
// whatever n_shared_experts says); its width is w1's row count (DeepSeek-V3's convention would be n_shared x
// moe_intermediate_size). Without its tensors, a config asking for one is refused by the missing tensor's name.
std::unique_ptr<ExpertWeights> shared_expert(const Checkpoint& ck, const std::string& p, const ModelConfig& c) {
  const TensorView* w1 = ck.find(p + ".w1.weight");
  if (!w1 && c.n_shared == 0) return nullptr;
  const int64_t inter = w1 && w1->shape.size() == 2 ? w1->shape[0] : c.moe_inter;
  PLUMB_CHECK(inter > 0, "tensor {}.w1.weight in {} has no rows", p, w1 ? w1->file : std::string());
  auto e = std::make_unique<ExpertWeights>(expert(ck, p, c, inter));
  if (c.mlp_bias) {  // transformers' nn.Linear biases of the shared MLP
    e->b1 = small(ck, p + ".w1.bias", {inter});
    e->b2 = small(ck, p + ".w2.bias", {c.hidden});
    e->b3 = small(ck, p + ".w3.bias", {inter});
  }
  return e;
}

}  // namespace

Matrix Matrix::bind(const Checkpoint& ck, const std::string& name, int64_t rows, int64_t cols) {
  Matrix m;
  m.name_ = name;
  m.rows_ = rows;
  m.cols_ = cols;
  m.w_ = &require(ck, name);
  const auto& w = *m.w_;
  PLUMB_CHECK(w.shape.size() == 2, "tensor {} in {} must be 2-D, has shape {}", name, w.file, shape_str(w.shape));
  const std::string scale_name = name.substr(0, name.size() - (name.ends_with(".weight") ? 7 : 0)) + ".scale";
  switch (w.dtype) {
    case DType::F32: case DType::BF16: case DType::F16:
      m.layout_ = Layout::Plain;
      PLUMB_CHECK(w.shape == Shape({rows, cols}), "tensor {} in {} has shape {}, expected {}", name, w.file, shape_str(w.shape),
                  shape_str({rows, cols}));
      return m;
    case DType::F8_E4M3: {
      m.layout_ = Layout::FP8Block;
      PLUMB_CHECK(w.shape == Shape({rows, cols}), "tensor {} in {} has shape {}, expected {}", name, w.file, shape_str(w.shape),
                  shape_str({rows, cols}));
      m.s_ = &require(ck, scale_name);
      const Shape want{(rows + 127) / 128, (cols + 127) / 128};
      PLUMB_CHECK(m.s_->shape == want, "scale {} in {} has shape {}, expected {} (128x128 blocks of {})", scale_name, m.s_->file,
                  shape_str(m.s_->shape), shape_str(want), name);
      PLUMB_CHECK(m.s_->dtype == DType::F8_E8M0 || m.s_->dtype == DType::F32, "scale {} has dtype {}, expected F8_E8M0 or F32",
                  scale_name, dtype_name(m.s_->dtype));
      m.scale_cols_ = want[1];
      return m;
    }
    case DType::I8: case DType::U8: {
      m.layout_ = Layout::FP4Group;
      PLUMB_CHECK(cols % 32 == 0 && w.shape == Shape({rows, cols / 2}),
                  "packed FP4 tensor {} in {} has shape {}, expected {} (two E2M1 codes per byte of a [{}, {}] matrix)", name,
                  w.file, shape_str(w.shape), shape_str({rows, cols / 2}), rows, cols);
      m.s_ = &require(ck, scale_name);
      const Shape want{rows, cols / 32};
      PLUMB_CHECK(m.s_->shape == want && m.s_->dtype == DType::F8_E8M0, "scale {} in {} is {} {}, expected F8_E8M0 {} (one per 32 inputs)",
                  scale_name, m.s_->file, dtype_name(m.s_->dtype), shape_str(m.s_->shape), shape_str(want));
      m.scale_cols_ = want[1];
      return m;
    }
    default:
      fail("tensor {} in {} has dtype {}, which is not a weight format (F32, BF16, F16, F8_E4M3 + scale, packed FP4 I8 + scale)",
           name, w.file, dtype_name(w.dtype));
  }
}

float Matrix::block_scale(int64_t r, int64_t b) const {
  const int64_t si = (r / 128) * scale_cols_ + b;
  if (s_->dtype == DType::F8_E8M0) return tables().e8m0[s_->data[si]];
  float s;
  std::memcpy(&s, s_->data + size_t(si) * 4, 4);
  return s;
}

void Matrix::row(int64_t r, float* out) const {
  const uint8_t* base = w_->data;
  switch (layout_) {
    case Layout::Plain:
      if (w_->dtype == DType::F32) {
        std::memcpy(out, base + size_t(r * cols_) * 4, size_t(cols_) * 4);
      } else if (w_->dtype == DType::BF16) {  // a loop of its own: the LM head decodes 0.5 G of these per token
        const uint8_t* rowp = base + size_t(r * cols_) * 2;
        for (int64_t c = 0; c < cols_; ++c) {
          uint16_t b;
          std::memcpy(&b, rowp + c * 2, 2);
          out[c] = fmt8::bf16_to_f32(b);
        }
      } else {
        for (int64_t c = 0; c < cols_; ++c) {
          uint16_t b;
          std::memcpy(&b, base + size_t(r * cols_ + c) * 2, 2);
          out[c] = fmt8::f16_to_f32(b);
        }
      }
      return;
    case Layout::FP8Block: {
      const DecodeTables& T = tables();
      const uint8_t* rowp = base + size_t(r * cols_);
      for (int64_t c0 = 0, b = 0; c0 < cols_; c0 += 128, ++b) {  // one scale per 128 columns
        const float s = block_scale(r, b);
        for (int64_t c = c0; c < std::min(cols_, c0 + 128); ++c) out[c] = T.e4m3[rowp[c]] * s;
      }
      return;
    }
    case Layout::FP4Group: {
      const DecodeTables& T = tables();
      const uint8_t* rowp = base + size_t(r * (cols_ / 2));
      const uint8_t* srow = s_->data + size_t(r * scale_cols_);
      for (int64_t c0 = 0; c0 < cols_; c0 += 32) {  // one scale per 32 columns
        const float s = T.e8m0[srow[c0 / 32]];
        for (int64_t c = c0; c < std::min(cols_, c0 + 32); ++c)
          out[c] = fp4_at(T, rowp, c) * s;
      }
      return;
    }
  }
}

void Matrix::row_raw(int64_t r, float* vals, float* block_scales) const {
  switch (layout_) {
    case Layout::Plain:
      row(r, vals);
      block_scales[0] = 1.0f;
      return;
    case Layout::FP8Block: {
      const DecodeTables& T = tables();
      for (int64_t c = 0; c < cols_; ++c) vals[c] = T.e4m3[w_->data[size_t(r * cols_ + c)]];
      for (int64_t b = 0; b < scale_cols_; ++b) block_scales[b] = block_scale(r, b);
      return;
    }
    case Layout::FP4Group: {
      const DecodeTables& T = tables();
      const uint8_t* rowp = w_->data + size_t(r * (cols_ / 2));
      for (int64_t c = 0; c < cols_; ++c) vals[c] = fp4_at(T, rowp, c);
      for (int64_t b = 0; b < scale_cols_; ++b) block_scales[b] = T.e8m0[s_->data[size_t(r * scale_cols_ + b)]];
      return;
    }
  }
}

ModelWeights ModelWeights::bind(const Checkpoint& ck, const ModelConfig& c, const std::function<void(int64_t, int64_t)>& on_layer) {
  ModelWeights m;
  const int64_t D = c.hidden, hcd = int64_t(c.hc_mult) * D;
  m.embed = Matrix::bind(ck, "embed.weight", c.vocab, D);
  // tie_word_embeddings: the head is the embedding (transformers ties lm_head to it, whatever head.weight holds).
  m.head = c.tie_embeddings ? m.embed : Matrix::bind(ck, "head.weight", c.vocab, D);
  m.norm = small(ck, "norm.weight", {D});
  m.hc_head = hyper_conn(ck, "hc_head", c.hc_mult, hcd, 1);
  m.layers.resize(size_t(c.n_layers));
  for (int i = 0; i < c.n_layers; ++i) {
    auto& L = m.layers[size_t(i)];
    const std::string p = fmt::format("layers.{}.", i);
    L.attn_norm = small(ck, p + "attn_norm.weight", {D});
    L.ffn_norm = small(ck, p + "ffn_norm.weight", {D});
    L.hc_attn = hyper_conn(ck, p + "hc_attn", c.hc_mix(), hcd, 3);
    L.hc_ffn = hyper_conn(ck, p + "hc_ffn", c.hc_mix(), hcd, 3);

    auto& A = L.attn;
    const std::string a = p + "attn.";
    A.wq_a = Matrix::bind(ck, a + "wq_a.weight", c.q_lora, D);
    A.q_norm = small(ck, a + "q_norm.weight", {c.q_lora});
    A.wq_b = Matrix::bind(ck, a + "wq_b.weight", int64_t(c.n_heads) * c.head_dim, c.q_lora);
    A.wkv = Matrix::bind(ck, a + "wkv.weight", c.head_dim, D);
    A.kv_norm = small_any(ck, {a + "kv_norm.weight", a + "norm.weight"}, {c.head_dim});
    A.wo_a = Matrix::bind(ck, a + "wo_a.weight", int64_t(c.o_groups) * c.o_lora, int64_t(c.n_heads) * c.head_dim / c.o_groups);
    A.wo_b = Matrix::bind(ck, a + "wo_b.weight", D, int64_t(c.o_groups) * c.o_lora);
    A.sink = small(ck, a + "attn_sink", {c.n_heads});
    const auto type = c.attn[size_t(i)];
    if (type != AttnType::Sliding)
      A.comp = std::make_unique<CompressorWeights>(
          compressor(ck, a + "compressor", c, c.compress_rate[size_t(i)], c.head_dim, type == AttnType::CSA));
    if (type == AttnType::CSA) {
      A.indexer = std::make_unique<IndexerWeights>();
      A.indexer->wq_b = Matrix::bind(ck, a + "indexer.wq_b.weight", int64_t(c.index_heads) * c.index_head_dim, c.q_lora);
      A.indexer->weights_proj = Matrix::bind(ck, a + "indexer.weights_proj.weight", c.index_heads, D);
      A.indexer->comp = compressor(ck, a + "indexer.compressor", c, c.compress_rate[size_t(i)], c.index_head_dim, true);
    }

    auto& M = L.moe;
    const std::string f = p + "ffn.";
    M.gate = Matrix::bind(ck, f + "gate.weight", c.n_experts, D);
    if (c.mlp[size_t(i)] == MlpType::Hash) {
      const auto& t = require(ck, f + "gate.tid2eid");
      PLUMB_CHECK(t.shape == Shape({c.vocab, c.top_k}), "tensor {} in {} has shape {}, expected {}", f + "gate.tid2eid", t.file,
                  shape_str(t.shape), shape_str({c.vocab, c.top_k}));
      PLUMB_CHECK(t.dtype == DType::I32 || t.dtype == DType::I64, "tensor {} in {} has dtype {}, expected I32 or I64",
                  f + "gate.tid2eid", t.file, dtype_name(t.dtype));
      M.tid2eid = to_i64(t);
      for (int64_t k = 0; k < M.tid2eid.numel(); ++k)
        PLUMB_CHECK(M.tid2eid[k] >= 0 && M.tid2eid[k] < c.n_experts, "tensor {}: token {} maps to expert {}, outside [0, {})",
                    f + "gate.tid2eid", k / c.top_k, M.tid2eid[k], c.n_experts);
    } else {
      M.bias = small(ck, f + "gate.bias", {c.n_experts});
    }
    M.experts.reserve(size_t(c.n_experts));
    for (int e = 0; e < c.n_experts; ++e) M.experts.push_back(expert(ck, f + fmt::format("experts.{}", e), c, c.moe_inter));
    M.shared = shared_expert(ck, f + "shared_experts", c);
    if (on_layer) on_layer(i + 1, c.n_layers);
  }
  return m;
}

}  // namespace plumb
