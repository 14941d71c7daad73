// Parses config.json for model_type deepseek_v4, accepting transformers' current keys and the legacy ones
// (compress_ratios, num_hash_layers, qk_rope_head_dim, flat rope_scaling/rope_parameters with yarn).
#include "model/config.h"

#include <cmath>
#include <fstream>
#include <optional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/json_int.h"

namespace plumb {

using nlohmann::json;

const char* attn_type_name(AttnType t) {
  switch (t) {
    case AttnType::Sliding: return "sliding_attention";
    case AttnType::CSA: return "compressed_sparse_attention";
    case AttnType::HCA: return "heavily_compressed_attention";
  }
  return "?";
}

const char* score_func_name(ScoreFunc f) {
  switch (f) {
    case ScoreFunc::SqrtSoftplus: return "sqrtsoftplus";
    case ScoreFunc::Sigmoid: return "sigmoid";
    case ScoreFunc::Softmax: return "softmax";
  }
  return "?";
}

const char* expert_act_name(ExpertAct a) {
  switch (a) {
    case ExpertAct::Silu: return "silu";
    case ExpertAct::Gelu: return "gelu";
    case ExpertAct::GeluTanh: return "gelu_pytorch_tanh";
    case ExpertAct::Relu: return "relu";
  }
  return "?";
}

int ModelConfig::n_hash_layers() const {
  int n = 0;
  for (auto m : mlp) n += m == MlpType::Hash;
  return n;
}

namespace {

constexpr int kMaxLayers = 1024;

// v when it is a JSON integer that fits an int: get<int> would wrap a larger one, and get<int64_t> an unsigned one
// above INT64_MAX (18446744073709551615 read as -1).
std::optional<int> int32_of(const json& v) {
  const std::optional<int64_t> x = json_int(v, INT32_MIN, INT32_MAX);
  return x ? std::optional<int>(int(*x)) : std::nullopt;
}

struct Reader {
  const json& j;
  const std::string& src;

  bool has(const char* k) const { return j.contains(k) && !j[k].is_null(); }
  int integer(const char* k, std::optional<int> def = std::nullopt) const {
    if (!has(k)) {
      PLUMB_CHECK(def.has_value(), "{}: missing required field '{}'", src, k);
      return *def;
    }
    PLUMB_CHECK(j[k].is_number_integer(), "{}: field '{}' must be an integer, got {}", src, k, j[k].dump());
    const std::optional<int> v = int32_of(j[k]);
    PLUMB_CHECK(v, "{}: field '{}' out of range: {}", src, k, j[k].dump());
    return *v;
  }
  bool boolean(const char* k, bool def) const {
    if (!has(k)) return def;
    PLUMB_CHECK(j[k].is_boolean(), "{}: field '{}' must be true or false, got {}", src, k, j[k].dump());
    return j[k].get<bool>();
  }
  std::string string(const char* k, const std::string& def) const {
    if (!has(k)) return def;
    PLUMB_CHECK(j[k].is_string(), "{}: field '{}' must be a string, got {}", src, k, j[k].dump());
    return j[k].get<std::string>();
  }
  // A token id, or the first of a list (eos_token_id may be a list); -1 when explicitly null.
  int token_id(const char* k, int def) const {
    if (!j.contains(k)) return def;
    const auto& v = j[k].is_array() && !j[k].empty() ? j[k][0] : j[k];
    if (v.is_null()) return -1;
    const std::optional<int> id = int32_of(v);
    PLUMB_CHECK(id && *id >= -1, "{}: field '{}' must be a token id, got {}", src, k, j[k].dump());
    return *id;
  }
  double number(const char* k, std::optional<double> def = std::nullopt) const {
    if (!has(k)) {
      PLUMB_CHECK(def.has_value(), "{}: missing required field '{}'", src, k);
      return *def;
    }
    PLUMB_CHECK(j[k].is_number(), "{}: field '{}' must be a number, got {}", src, k, j[k].dump());
    return j[k].get<double>();
  }
};

// transformers' yarn attention factor default (get_mscale): applied to cos and sin when not given.
double yarn_mscale(double scale, double mscale = 1.0) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

RopeConfig parse_rope(const json& d, double default_theta, double max_pos, bool force_unit_attention,
                      const std::string& where) {
  RopeConfig r;
  r.theta = d.contains("rope_theta") && d["rope_theta"].is_number() ? d["rope_theta"].get<double>() : default_theta;
  std::string type = "default";
  if (d.contains("rope_type") && d["rope_type"].is_string()) type = d["rope_type"].get<std::string>();
  else if (d.contains("type") && d["type"].is_string()) type = d["type"].get<std::string>();
  PLUMB_CHECK(r.theta > 0, "{}: rope_theta must be positive", where);
  if (type == "default") return r;
  PLUMB_CHECK(type == "yarn", "{}: rope_type '{}' is not supported (DeepSeek-V4 uses 'default' or 'yarn')", where, type);
  r.yarn = true;
  auto num = [&](const char* k) -> std::optional<double> {
    if (d.contains(k) && d[k].is_number()) return d[k].get<double>();
    return std::nullopt;
  };
  auto omp = num("original_max_position_embeddings");
  PLUMB_CHECK(omp && *omp > 0, "{}: yarn needs a positive original_max_position_embeddings", where);
  r.original_max_pos = *omp;
  r.factor = num("factor").value_or(max_pos / r.original_max_pos);
  PLUMB_CHECK(r.factor > 0, "{}: yarn factor must be positive", where);
  // transformers: `rope.get("beta_fast") or 32` (a 0 also falls back to the default).
  r.beta_fast = num("beta_fast").value_or(0) != 0 ? *num("beta_fast") : 32.0;
  r.beta_slow = num("beta_slow").value_or(0) != 0 ? *num("beta_slow") : 1.0;
  if (auto af = num("attention_factor")) {
    r.attention_factor = *af;
  } else if (force_unit_attention) {
    r.attention_factor = 1.0;  // transformers' DeepseekV4Config sets it for the flat (legacy) form
  } else {
    auto ms = num("mscale"), msa = num("mscale_all_dim");
    r.attention_factor = (ms && msa && *ms != 0 && *msa != 0) ? yarn_mscale(r.factor, *ms) / yarn_mscale(r.factor, *msa)
                                                              : yarn_mscale(r.factor);
  }
  return r;
}

}  // namespace

bool ModelConfig::set_v3_groups() {
  int g = 0, tg = 0;
  if (n_experts % 8 == 0 && n_experts >= 16) g = 8, tg = 4;
  else if (n_experts % 2 == 0) g = n_experts / 2, tg = (top_k + 1) / 2;
  if (g < 2 || tg >= g || top_k > tg * (n_experts / g)) return false;
  n_group = g, topk_group = tg;
  return true;
}

ModelConfig ModelConfig::from_json(const json& j, const std::string& src) {
  PLUMB_CHECK(j.is_object(), "{}: config must be a JSON object", src);
  Reader r{j, src};
  if (r.has("model_type")) {
    auto mt = j["model_type"].dump();
    PLUMB_CHECK(j["model_type"] == "deepseek_v4", "{}: model_type {} is not supported (expected \"deepseek_v4\")", src, mt);
  }
  ModelConfig c;
  // Missing fields take transformers' DeepseekV4Config defaults (the V4-Flash values), as from_pretrained does.
  c.vocab = r.integer("vocab_size", 129280);
  c.hidden = r.integer("hidden_size", 4096);
  c.n_layers = r.integer("num_hidden_layers", 43);
  c.n_heads = r.integer("num_attention_heads", 64);
  c.head_dim = r.integer("head_dim", 512);
  c.q_lora = r.integer("q_lora_rank", 1024);
  c.o_groups = r.integer("o_groups", 8);
  c.o_lora = r.integer("o_lora_rank", 1024);
  c.window = r.integer("sliding_window", 128);
  c.n_experts = r.integer("n_routed_experts", 256);
  c.top_k = r.integer("num_experts_per_tok", 6);
  c.n_shared = r.integer("n_shared_experts", 1);
  c.moe_inter = r.integer("moe_intermediate_size", 2048);
  c.routed_scaling = r.number("routed_scaling_factor", 1.5);
  c.norm_topk_prob = r.boolean("norm_topk_prob", true);
  c.swiglu_limit = r.number("swiglu_limit", 10.0);
  c.hc_mult = r.integer("hc_mult", 4);
  c.hc_sinkhorn_iters = r.integer("hc_sinkhorn_iters", 20);
  c.hc_eps = r.number("hc_eps", 1e-6);
  c.rms_eps = r.number("rms_norm_eps", 1e-6);
  c.index_heads = r.integer("index_n_heads", 64);
  c.index_head_dim = r.integer("index_head_dim", 128);
  c.index_topk = r.integer("index_topk", 512);
  c.bos_token = r.token_id("bos_token_id", 0);
  c.eos_token = r.token_id("eos_token_id", 1);

  // num_key_value_heads is not read: V4's attention is one shared K=V head whatever it says (transformers' V4
  // ignores it too).
  c.mlp_bias = r.boolean("mlp_bias", false);
  c.tie_embeddings = r.boolean("tie_word_embeddings", false);
  // hidden_act as transformers' ACT2FN reads it ("silu" and "swish" are the same SiLU; "gelu_new" and
  // "gelu_pytorch_tanh" the same tanh form); the official code has SiLU only (expert_activation, experts.h).
  if (r.has("hidden_act")) {
    const json& a = j["hidden_act"];
    if (a == "silu" || a == "swish") c.act = ExpertAct::Silu;
    else if (a == "gelu") c.act = ExpertAct::Gelu;
    else if (a == "gelu_pytorch_tanh" || a == "gelu_new") c.act = ExpertAct::GeluTanh;
    else if (a == "relu") c.act = ExpertAct::Relu;
    else
      fail("{}: hidden_act {} is not supported (silu, swish, gelu, gelu_pytorch_tanh, gelu_new, relu)", src, a.dump());
  }
  // n_group / topk_group (DeepSeek-V3's group-limited top-k, left in some converted configs) are not read: V4 routes
  // over all experts (config.h).

  // Scoring function.
  const std::string sf = r.string("scoring_func", "sqrtsoftplus");
  if (sf == "sqrtsoftplus") c.score = ScoreFunc::SqrtSoftplus;
  else if (sf == "sigmoid") c.score = ScoreFunc::Sigmoid;
  else if (sf == "softmax") c.score = ScoreFunc::Softmax;
  else fail("{}: scoring_func \"{}\" is not supported (sqrtsoftplus, sigmoid, softmax)", src, sf);

  // Compression rates: compress_rates dict, legacy compress_rate_csa/_hca, defaults 4/128.
  int csa_rate = 4, hca_rate = 128;
  if (r.has("compress_rates")) {
    const auto& cr = j["compress_rates"];
    PLUMB_CHECK(cr.is_object(), "{}: compress_rates must be an object", src);
    for (auto& [k, v] : cr.items()) {
      const std::optional<int> rate = int32_of(v);
      PLUMB_CHECK(rate && *rate > 0, "{}: compress_rates.{} must be a positive integer", src, k);
      if (k == "compressed_sparse_attention") csa_rate = *rate;
      else if (k == "heavily_compressed_attention") hca_rate = *rate;
      else fail("{}: compress_rates has unknown layer type '{}'", src, k);
    }
  }
  if (r.has("compress_rate_csa")) csa_rate = r.integer("compress_rate_csa");
  if (r.has("compress_rate_hca")) hca_rate = r.integer("compress_rate_hca");
  PLUMB_CHECK(csa_rate > 0 && hca_rate > 0, "{}: the compression rates must be positive, got CSA {} and HCA {}", src, csa_rate,
              hca_rate);

  // Attention schedule: layer_types, else legacy compress_ratios (n_layers or n_layers+1 entries, the
  // extra one being the MTP block), else transformers' default (2 x HCA, then HCA/CSA interleaved).
  const int n = c.n_layers;
  // (Bounded before the per-layer tables below are sized by it: a corrupt count must not allocate gigabytes.)
  PLUMB_CHECK(n > 0 && n <= kMaxLayers, "{}: num_hidden_layers must be from 1 to {} (DeepSeek-V4 has 43 or 61), got {}", src,
              kMaxLayers, n);
  c.attn.resize(static_cast<size_t>(n));
  c.compress_rate.assign(size_t(n), 0);
  if (r.has("layer_types")) {
    const auto& lt = j["layer_types"];
    PLUMB_CHECK(lt.is_array() && int(lt.size()) >= n, "{}: layer_types must list at least num_hidden_layers ({}) entries", src, n);
    for (int i = 0; i < n; ++i) {
      auto s = lt[size_t(i)].is_string() ? lt[size_t(i)].get<std::string>() : lt[size_t(i)].dump();
      if (s == "sliding_attention") c.attn[size_t(i)] = AttnType::Sliding;
      else if (s == "compressed_sparse_attention") c.attn[size_t(i)] = AttnType::CSA;
      else if (s == "heavily_compressed_attention") c.attn[size_t(i)] = AttnType::HCA;
      else fail("{}: layer_types[{}] = \"{}\" is not a DeepSeek-V4 layer type (sliding_attention, "
                "compressed_sparse_attention, heavily_compressed_attention)", src, i, s);
    }
  } else if (r.has("compress_ratios")) {
    const auto& cr = j["compress_ratios"];
    PLUMB_CHECK(cr.is_array() && (int(cr.size()) == n || int(cr.size()) == n + 1),
                "{}: compress_ratios must have num_hidden_layers ({}) or num_hidden_layers + 1 entries, has {}", src, n,
                cr.is_array() ? cr.size() : 0);
    for (int i = 0; i < n; ++i) {
      const std::optional<int> ratio = int32_of(cr[size_t(i)]);
      PLUMB_CHECK(ratio && *ratio >= 0, "{}: compress_ratios[{}] must be a non-negative integer", src, i);
      const int v = *ratio;
      // A ratio names its layer's rate (the official code's meaning); transformers maps 4 and 128 to the two types
      // whatever compress_rates says, so those two do too when they match neither rate.
      if (v == 0) c.attn[size_t(i)] = AttnType::Sliding;
      else if (v == csa_rate) c.attn[size_t(i)] = AttnType::CSA;
      else if (v == hca_rate) c.attn[size_t(i)] = AttnType::HCA;
      else if (v == 4) c.attn[size_t(i)] = AttnType::CSA;
      else if (v == 128) c.attn[size_t(i)] = AttnType::HCA;
      else fail("{}: compress_ratios[{}] = {} matches neither the CSA rate {} nor the HCA rate {}", src, i, v, csa_rate, hca_rate);
    }
  } else {
    for (int i = 0; i < n; ++i)
      c.attn[size_t(i)] = i < 2 ? AttnType::HCA : ((i - 2) % 2 ? AttnType::CSA : AttnType::HCA);
  }
  for (int i = 0; i < n; ++i)
    c.compress_rate[size_t(i)] = c.attn[size_t(i)] == AttnType::CSA ? csa_rate : c.attn[size_t(i)] == AttnType::HCA ? hca_rate : 0;

  // MoE schedule: mlp_layer_types, else num_hash_layers (default 3) hash layers first.
  c.mlp.resize(static_cast<size_t>(n));
  if (r.has("mlp_layer_types")) {
    const auto& mt = j["mlp_layer_types"];
    PLUMB_CHECK(mt.is_array() && int(mt.size()) >= n, "{}: mlp_layer_types must list at least {} entries", src, n);
    for (int i = 0; i < n; ++i) {
      auto s = mt[size_t(i)].is_string() ? mt[size_t(i)].get<std::string>() : mt[size_t(i)].dump();
      if (s == "hash_moe") c.mlp[size_t(i)] = MlpType::Hash;
      else if (s == "moe") c.mlp[size_t(i)] = MlpType::Learned;
      else fail("{}: mlp_layer_types[{}] = \"{}\" is not one of hash_moe, moe", src, i, s);
    }
  } else {
    int nh = r.integer("num_hash_layers", 3);
    PLUMB_CHECK(nh >= 0, "{}: num_hash_layers must be >= 0", src);
    for (int i = 0; i < n; ++i) c.mlp[size_t(i)] = i < nh ? MlpType::Hash : MlpType::Learned;
  }

  // Partial RoPE: partial_rotary_factor, else legacy qk_rope_head_dim, else 64/512.
  PLUMB_CHECK(c.head_dim > 0, "{}: head_dim must be positive, got {}", src, c.head_dim);
  double prf = 64.0 / 512.0;
  if (r.has("partial_rotary_factor")) prf = r.number("partial_rotary_factor");
  else if (r.has("qk_rope_head_dim")) prf = double(r.integer("qk_rope_head_dim")) / c.head_dim;
  PLUMB_CHECK(prf > 0 && prf <= 1, "{}: the rotary part of head_dim must be a fraction in (0, 1], got {}", src, prf);
  c.rope_dim = int(c.head_dim * prf);  // (transformers drops a qk_rope_head_dim given beside partial_rotary_factor)

  // RoPE tables: nested {"main", "compress"} or a flat dict (rope_parameters / legacy rope_scaling) whose
  // yarn keys apply to the compress table only.
  const double max_pos = r.number("max_position_embeddings", 1048576);
  PLUMB_CHECK(max_pos >= 1 && max_pos <= 0x1p62, "{}: max_position_embeddings must be from 1 to 2^62, got {}", src, max_pos);
  c.max_positions = int64_t(max_pos);
  const double rope_theta = r.number("rope_theta", 10000.0), compress_theta = r.number("compress_rope_theta", 160000.0);
  json rp = json::object();
  if (r.has("rope_parameters")) rp = j["rope_parameters"];
  else if (r.has("rope_scaling")) rp = j["rope_scaling"];
  PLUMB_CHECK(rp.is_object(), "{}: rope_parameters must be an object", src);
  auto check_prf = [&](const json& d, const char* label) {
    if (d.contains("partial_rotary_factor") && d["partial_rotary_factor"].is_number())
      PLUMB_CHECK(std::fabs(d["partial_rotary_factor"].get<double>()) <= 1 &&
                      int(c.head_dim * d["partial_rotary_factor"].get<double>()) == c.rope_dim,
                  "{}: rope_parameters.{}.partial_rotary_factor disagrees with the model's rope dims ({})", src, label, c.rope_dim);
  };
  for (const char* k : {"main", "compress"})
    PLUMB_CHECK(!rp.contains(k) || rp[k].is_object(), "{}: rope_parameters.{} must be an object, got {}", src, k, rp.contains(k) ? rp[k].dump() : "");
  if (rp.contains("main") && rp.contains("compress")) {
    check_prf(rp["main"], "main");
    check_prf(rp["compress"], "compress");
    c.rope_main = parse_rope(rp["main"], rope_theta, max_pos, false, src + ": rope_parameters.main");
    c.rope_compress = parse_rope(rp["compress"], compress_theta, max_pos, false, src + ": rope_parameters.compress");
  } else {
    json flat = rp;
    flat.erase("main");
    flat.erase("compress");
    flat["rope_theta"] = compress_theta;
    c.rope_main = RopeConfig{};
    c.rope_main.theta = rope_theta;
    c.rope_compress = parse_rope(flat, compress_theta, max_pos, true, src + ": rope_parameters");
  }

  // Consistency.
  auto pos = [&](int v, const char* what) { PLUMB_CHECK(v > 0, "{}: {} must be positive, got {}", src, what, v); };
  pos(c.vocab, "vocab_size"); pos(c.hidden, "hidden_size"); pos(c.n_heads, "num_attention_heads");
  pos(c.head_dim, "head_dim"); pos(c.q_lora, "q_lora_rank"); pos(c.o_groups, "o_groups"); pos(c.o_lora, "o_lora_rank");
  pos(c.window, "sliding_window"); pos(c.n_experts, "n_routed_experts"); pos(c.top_k, "num_experts_per_tok");
  pos(c.moe_inter, "moe_intermediate_size"); pos(c.hc_mult, "hc_mult"); pos(c.hc_sinkhorn_iters, "hc_sinkhorn_iters");
  PLUMB_CHECK(c.hc_mult <= 8, "{}: hc_mult {} is not supported (at most 8; DeepSeek-V4 uses 4)", src, c.hc_mult);
  PLUMB_CHECK(c.hc_sinkhorn_iters <= 1000, "{}: hc_sinkhorn_iters {} is not supported (at most 1000; DeepSeek-V4 uses 20)", src,
              c.hc_sinkhorn_iters);
  PLUMB_CHECK(c.n_shared >= 0, "{}: n_shared_experts must be >= 0, got {}", src, c.n_shared);
  PLUMB_CHECK(c.top_k <= c.n_experts, "{}: num_experts_per_tok {} exceeds n_routed_experts {}", src, c.top_k, c.n_experts);
  // The grouped output projection splits the heads' concatenated outputs into o_groups equal slices.
  PLUMB_CHECK((int64_t(c.n_heads) * c.head_dim) % c.o_groups == 0,
              "{}: num_attention_heads x head_dim ({} x {}) is not divisible by o_groups {}", src, c.n_heads, c.head_dim, c.o_groups);
  PLUMB_CHECK(c.rope_dim > 0 && c.rope_dim % 2 == 0 && c.rope_dim <= c.head_dim,
              "{}: rope dims {} must be even and within head_dim {}", src, c.rope_dim, c.head_dim);
  bool any_csa = false;
  for (auto a : c.attn) any_csa |= a == AttnType::CSA;
  if (any_csa) {
    pos(c.index_heads, "index_n_heads"); pos(c.index_head_dim, "index_head_dim"); pos(c.index_topk, "index_topk");
    PLUMB_CHECK(c.rope_dim <= c.index_head_dim, "{}: rope dims {} exceed index_head_dim {}", src, c.rope_dim, c.index_head_dim);
  }
  PLUMB_CHECK(c.rms_eps > 0 && c.hc_eps >= 0, "{}: rms_norm_eps must be positive and hc_eps non-negative", src);
  return c;
}

ModelConfig ModelConfig::load(const std::string& path) {
  std::ifstream f(path);
  PLUMB_CHECK(f.good(), "cannot open config {}", path);
  json j = json::parse(f, nullptr, false);
  PLUMB_CHECK(!j.is_discarded(), "{}: not valid JSON", path);
  return from_json(j, path);
}

std::string ModelConfig::summary() const {
  int nc = 0, nh = 0;
  for (auto a : attn) nc += a == AttnType::CSA, nh += a == AttnType::HCA;
  return fmt::format("{} layers ({} sliding, {} CSA, {} HCA), hidden {}, {} heads x {}, {} experts top-{} ({} hash layers), "
                     "hc_mult {}, vocab {}, scoring {}{}",
                     n_layers, n_layers - nc - nh, nc, nh, hidden, n_heads, head_dim, n_experts, top_k, n_hash_layers(),
                     hc_mult, vocab, score_func_name(score), act == ExpertAct::Silu ? "" : fmt::format(", hidden_act {}", expert_act_name(act)));
}

}  // namespace plumb
