// ModelConfig: the DeepSeek-V4 hyper-parameters read from a Hugging Face config.json (current and legacy spellings).
#pragma once
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace plumb {

enum class AttnType { Sliding, CSA, HCA };  // CSA: overlapping m=4 windows + indexer; HCA: plain windows, all visible
enum class MlpType { Hash, Learned };
enum class ScoreFunc { SqrtSoftplus, Sigmoid, Softmax };
// The experts' activation as transformers applies it (config.json's hidden_act through its ACT2FN): SiLU ("silu",
// "swish"), GELU ("gelu": erf), GELU's tanh form ("gelu_pytorch_tanh", "gelu_new"), ReLU. DeepSeek-V4 and the
// official code use SiLU only: expert_activation (experts.h) picks per numerics mode.
enum class ExpertAct { Silu, Gelu, GeluTanh, Relu };

const char* attn_type_name(AttnType t);  // the transformers layer_types spelling
const char* score_func_name(ScoreFunc f);
const char* expert_act_name(ExpertAct a);  // hidden_act's first spelling

// One RoPE table ("main" for sliding layers, "compress" for CSA/HCA layers and their compressors/indexer).
struct RopeConfig {
  double theta = 10000.0;
  bool yarn = false;
  double factor = 1.0;
  double original_max_pos = 0;
  double beta_fast = 32, beta_slow = 1;
  double attention_factor = 1.0;  // multiplies cos and sin (transformers' attention_scaling)
};

struct ModelConfig {
  int vocab = 0, hidden = 0, n_layers = 0;
  int n_heads = 0, head_dim = 0, rope_dim = 0;  // rope on the LAST rope_dim dims of each head
  int q_lora = 0, o_groups = 0, o_lora = 0;
  int window = 0;  // sliding window, keys [p - window + 1, p]
  // n_shared: config.json's n_shared_experts, informational: transformers' V4 always has one shared expert (of
  // moe_intermediate_size) and ignores the field; the official code asserts 1. The weights decide (ModelWeights::bind).
  int n_experts = 0, top_k = 0, n_shared = 0, moe_inter = 0;
  double routed_scaling = 1.0;
  // Grouped top-k (DeepSeek-V3's group-limited selection). V4 routes over all experts: transformers' V4 and the
  // official code ignore config.json's n_group / topk_group (dsv4-spec 6.2, pitfall P-R4), so from_json leaves these
  // at 1 / 1; the grouped code paths are reached only by configs built in code.
  int n_group = 1, topk_group = 1;
  ScoreFunc score = ScoreFunc::SqrtSoftplus;
  bool norm_topk_prob = true;  // parsed, not consulted: V4 renormalizes regardless (transformers and the official code)
  bool tie_embeddings = false;  // tie_word_embeddings: the LM head is the embedding matrix
  double swiglu_limit = 0;  // as config.json gives it; what it means per numerics mode: swiglu_clamp_limit (experts.h)
  ExpertAct act = ExpertAct::Silu;  // hidden_act; what it means per numerics mode: expert_activation (experts.h)
  // mlp_bias: transformers' shared MLP with biases on its three projections (ffn.shared_experts.w{1,2,3}.bias; no V4
  // checkpoint has them). The official code has none: expert_ffn leaves them out under numerics.official.
  bool mlp_bias = false;
  int hc_mult = 0, hc_sinkhorn_iters = 0;
  double hc_eps = 1e-6, rms_eps = 1e-6;
  int index_heads = 0, index_head_dim = 0, index_topk = 0;
  std::vector<AttnType> attn;
  std::vector<int> compress_rate;  // per layer; 0 for sliding layers
  std::vector<MlpType> mlp;
  RopeConfig rope_main, rope_compress;
  int bos_token = -1, eos_token = -1;
  int64_t max_positions = 0;  // max_position_embeddings

  int hc_mix() const { return (2 + hc_mult) * hc_mult; }
  const RopeConfig& rope_for(int layer) const {
    return attn[size_t(layer)] == AttnType::Sliding ? rope_main : rope_compress;
  }
  int n_hash_layers() const;
  // fault.v3_grouped_topk (pitfall P-R4 of dsv4-spec.md: V4 routed as DeepSeek-V3): sets n_group / topk_group to
  // V3's 8 groups keeping 4 where the experts split into 8 groups of at least 2, else to groups of 2 keeping the
  // fewest that hold top-k; false (unchanged) when no grouping would limit the selection.
  bool set_v3_groups();

  // Throws Error naming `source` and the field at fault for anything missing, unknown or inconsistent.
  static ModelConfig from_json(const nlohmann::json& j, const std::string& source);
  static ModelConfig load(const std::string& config_json_path);
  std::string summary() const;
};

}  // namespace plumb
