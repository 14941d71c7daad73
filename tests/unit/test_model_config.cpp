// ModelConfig::from_json (src/model/config.cpp): legacy spellings give the same config as the current ones, and
// inconsistent configs are refused with a message that names the field at fault.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/config.h"
#include "model/model.h"
#include "plumb/tools.h"
#include "model_test_util.h"

namespace {

using json = nlohmann::json;
using plumb::AttnType;
using plumb::MlpType;
using plumb::ModelConfig;
using ::testing::HasSubstr;

// The current (transformers >= PR #45643) spellings.
json current_config() {
  return json::parse(R"({
    "model_type": "deepseek_v4",
    "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32,
    "q_lora_rank": 32, "o_groups": 2, "o_lora_rank": 16, "sliding_window": 8,
    "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1, "moe_intermediate_size": 32,
    "routed_scaling_factor": 1.5, "scoring_func": "sqrtsoftplus", "norm_topk_prob": true, "swiglu_limit": 10.0,
    "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6,
    "index_n_heads": 2, "index_head_dim": 16, "index_topk": 3,
    "bos_token_id": 0, "eos_token_id": 1, "hidden_act": "silu",
    "max_position_embeddings": 1048576, "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
    "layer_types": ["sliding_attention", "heavily_compressed_attention", "compressed_sparse_attention",
                    "heavily_compressed_attention"],
    "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
    "mlp_layer_types": ["hash_moe", "hash_moe", "moe", "moe"],
    "partial_rotary_factor": 0.125,
    "rope_parameters": {
      "main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.125},
      "compress": {"rope_type": "yarn", "rope_theta": 160000.0, "partial_rotary_factor": 0.125, "factor": 16.0,
                   "original_max_position_embeddings": 65536, "beta_fast": 32, "beta_slow": 1,
                   "attention_factor": 1.0}
    }
  })");
}

// Each legacy spelling, applied to a current config.
struct Legacy {
  const char* name;
  std::function<void(json&)> apply;
};

std::vector<Legacy> legacy_spellings() {
  return {
      {"compress_ratios with num_hidden_layers entries",
       [](json& j) {
         j.erase("layer_types");
         j.erase("compress_rates");
         j["compress_ratios"] = {0, 128, 4, 128};
       }},
      {"compress_ratios with num_hidden_layers + 1 entries (MTP)",
       [](json& j) {
         j.erase("layer_types");
         j.erase("compress_rates");
         j["compress_ratios"] = {0, 128, 4, 128, 0};
       }},
      {"num_hash_layers",
       [](json& j) {
         j.erase("mlp_layer_types");
         j["num_hash_layers"] = 2;
       }},
      {"qk_rope_head_dim",
       [](json& j) {
         j.erase("partial_rotary_factor");
         j["rope_parameters"]["main"].erase("partial_rotary_factor");
         j["rope_parameters"]["compress"].erase("partial_rotary_factor");
         j["qk_rope_head_dim"] = 4;
       }},
      {"flat rope_scaling with type: yarn",
       [](json& j) {
         j.erase("rope_parameters");
         j["rope_scaling"] = {{"type", "yarn"},
                              {"factor", 16},
                              {"original_max_position_embeddings", 65536},
                              {"beta_fast", 32},
                              {"beta_slow", 1}};
       }},
      {"flat rope_parameters with rope_type: yarn",
       [](json& j) {
         j["rope_parameters"] = {{"rope_type", "yarn"},
                                 {"rope_theta", 10000.0},
                                 {"factor", 16},
                                 {"original_max_position_embeddings", 65536},
                                 {"beta_fast", 32},
                                 {"beta_slow", 1}};
       }},
  };
}

// The nested yarn form's cos/sin factor as transformers' _compute_yarn_parameters derives it (computed here from the
// formula, not from plumb): the given attention_factor; else get_mscale(factor, mscale) / get_mscale(factor,
// mscale_all_dim) when both are given (make_golden's v-yarn-mscale); else get_mscale(factor); and a missing factor is
// max_position_embeddings / original_max_position_embeddings (transformers since its PR 40320: the ratio only when
// factor is absent). get_mscale(s, m) = 0.1 m ln s + 1, 1 for s <= 1.
TEST(ModelConfigParse, YarnAttentionFactorFollowsTransformersRule) {
  auto mscale = [](double s, double m) { return s <= 1 ? 1.0 : 0.1 * m * std::log(s) + 1.0; };
  auto parse = [](const std::function<void(json&)>& edit) {
    json j = current_config();
    j["rope_parameters"]["compress"].erase("attention_factor");
    edit(j["rope_parameters"]["compress"]);
    return ModelConfig::from_json(j, "cfg").rope_compress;
  };
  const auto with_ratio = parse([](json& r) { r["mscale"] = 1.0, r["mscale_all_dim"] = 0.7; });
  EXPECT_DOUBLE_EQ(with_ratio.attention_factor, mscale(16, 1.0) / mscale(16, 0.7));
  const auto one_only = parse([](json& r) { r["mscale"] = 0.5; });  // (both or neither: get_mscale(factor) alone)
  EXPECT_DOUBLE_EQ(one_only.attention_factor, mscale(16, 1.0));
  const auto given = parse([](json& r) { r["mscale"] = 1.0, r["mscale_all_dim"] = 0.7, r["attention_factor"] = 1.25; });
  EXPECT_DOUBLE_EQ(given.attention_factor, 1.25);
  json j = current_config();
  j["max_position_embeddings"] = 262144;  // 4 x original_max_position_embeddings 65536
  j["rope_parameters"]["compress"].erase("attention_factor");
  j["rope_parameters"]["compress"].erase("factor");
  const auto derived = ModelConfig::from_json(j, "cfg").rope_compress;
  EXPECT_DOUBLE_EQ(derived.factor, 4.0);
  EXPECT_DOUBLE_EQ(derived.attention_factor, mscale(4, 1.0));
  j["rope_parameters"]["compress"]["factor"] = 16.0;  // a given factor is used as given, whatever the ratio
  EXPECT_DOUBLE_EQ(ModelConfig::from_json(j, "cfg").rope_compress.factor, 16.0);
}

TEST(ModelConfigParse, CurrentSpellingsGiveTheExpectedValues) {
  const ModelConfig c = ModelConfig::from_json(current_config(), "cfg");
  EXPECT_EQ(c.attn, (std::vector<AttnType>{AttnType::Sliding, AttnType::HCA, AttnType::CSA, AttnType::HCA}));
  EXPECT_EQ(c.compress_rate, (std::vector<int>{0, 128, 4, 128}));
  EXPECT_EQ(c.mlp, (std::vector<MlpType>{MlpType::Hash, MlpType::Hash, MlpType::Learned, MlpType::Learned}));
  EXPECT_EQ(c.n_hash_layers(), 2);
  EXPECT_EQ(c.rope_dim, 4);
  EXPECT_EQ(c.hc_mix(), 24);
  EXPECT_DOUBLE_EQ(c.routed_scaling, 1.5);
  EXPECT_EQ(c.score, plumb::ScoreFunc::SqrtSoftplus);
  EXPECT_FALSE(c.rope_main.yarn);
  EXPECT_DOUBLE_EQ(c.rope_main.theta, 10000.0);
  EXPECT_TRUE(c.rope_compress.yarn);
  EXPECT_DOUBLE_EQ(c.rope_compress.theta, 160000.0);
  EXPECT_DOUBLE_EQ(c.rope_compress.factor, 16.0);
  EXPECT_DOUBLE_EQ(c.rope_compress.original_max_pos, 65536.0);
  EXPECT_DOUBLE_EQ(c.rope_compress.attention_factor, 1.0);
  // rope_for: the main table on sliding layers, the compress table on CSA/HCA layers.
  EXPECT_DOUBLE_EQ(c.rope_for(0).theta, 10000.0);
  for (int l : {1, 2, 3}) EXPECT_DOUBLE_EQ(c.rope_for(l).theta, 160000.0);
}

TEST(ModelConfigParse, EachLegacySpellingGivesTheSameConfig) {
  const ModelConfig want = ModelConfig::from_json(current_config(), "cfg");
  for (const auto& l : legacy_spellings()) {
    json j = current_config();
    l.apply(j);
    ModelConfig got;
    ASSERT_NO_THROW(got = ModelConfig::from_json(j, "cfg")) << l.name;
    EXPECT_TRUE(plumb_test::same_config(got, want)) << l.name;
  }
}

TEST(ModelConfigParse, AllLegacySpellingsTogetherGiveTheSameConfig) {
  const ModelConfig want = ModelConfig::from_json(current_config(), "cfg");
  json j = current_config();
  for (const auto& l : legacy_spellings())
    if (std::string(l.name).find("MTP") == std::string::npos && std::string(l.name).find("flat rope_parameters") == std::string::npos)
      l.apply(j);
  EXPECT_TRUE(plumb_test::same_config(ModelConfig::from_json(j, "cfg"), want)) << j.dump();
}

TEST(ModelConfigParse, TheCommittedFixtureConfigLoads) {
  const ModelConfig c = ModelConfig::load(std::string(PLUMB_TEST_DATA) + "/golden/tiny/config.json");
  EXPECT_EQ(c.n_layers, 4);
  EXPECT_EQ(c.compress_rate, (std::vector<int>{0, 8, 4, 8}));
  EXPECT_EQ(c.rope_dim, 4);
}

// ---------------------------------------------------------------- refusals

// from_json must throw plumb::Error whose message contains every one of `parts`.
void expect_refused(const json& j, const std::vector<std::string>& parts, const char* what) {
  try {
    ModelConfig::from_json(j, "some/config.json");
    ADD_FAILURE() << what << ": accepted";
  } catch (const plumb::Error& e) {
    for (const auto& p : parts) EXPECT_THAT(e.what(), HasSubstr(p)) << what;
    EXPECT_THAT(e.what(), HasSubstr("some/config.json")) << what << ": the message names the file";
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": threw something other than plumb::Error: " << e.what();
  }
}

TEST(ModelConfigParse, UnknownLayerTypeIsRefusedNamingIt) {
  json j = current_config();
  j["layer_types"][1] = "full_attention";
  expect_refused(j, {"layer_types[1]", "full_attention"}, "unknown layer type");
  j = current_config();
  j["mlp_layer_types"][3] = "dense";
  expect_refused(j, {"mlp_layer_types[3]", "dense"}, "unknown mlp layer type");
  j = current_config();
  j["compress_rates"]["sliding_attention"] = 2;
  expect_refused(j, {"compress_rates", "sliding_attention"}, "unknown compress_rates key");
}

TEST(ModelConfigParse, MismatchedCompressRatiosAreRefused) {
  for (std::vector<int> cr : {std::vector<int>{0, 128, 4}, std::vector<int>{0, 128, 4, 128, 0, 0}}) {
    json j = current_config();
    j.erase("layer_types");
    j["compress_ratios"] = cr;
    expect_refused(j, {"compress_ratios", "num_hidden_layers"}, "compress_ratios length");
  }
  json j = current_config();
  j.erase("layer_types");
  j["compress_ratios"] = {0, 64, 4, 128};  // 64 is neither the CSA rate (4) nor the HCA rate (128)
  expect_refused(j, {"compress_ratios[1]", "64"}, "compress_ratios value");
  // 4 and 128 name the two types whatever the rates are (transformers' mapping), the rates then from compress_rates.
  j["compress_ratios"] = {0, 128, 4, 128};
  j["compress_rates"] = {{"compressed_sparse_attention", 4}, {"heavily_compressed_attention", 16}};
  const ModelConfig c = ModelConfig::from_json(j, "cfg");
  EXPECT_EQ(c.attn[1], AttnType::HCA);
  EXPECT_EQ(c.compress_rate[1], 16);
  EXPECT_EQ(c.attn[2], AttnType::CSA);
  j = current_config();
  j["layer_types"] = {"sliding_attention", "compressed_sparse_attention"};  // fewer than num_hidden_layers
  expect_refused(j, {"layer_types"}, "short layer_types");
}

// Fields transformers' DeepseekV4 does not read are not read here either: num_key_value_heads (one shared K=V head
// regardless), n_group / topk_group (V4 routes over all experts: DeepSeek-V3's grouped selection on V4 is pitfall
// P-R4), n_shared_experts (one shared expert whenever its tensors are there), a qk_rope_head_dim beside
// partial_rotary_factor (the factor wins). mlp_bias and hidden_act are read as transformers reads them (the shared
// MLP's biases; SiLU, GELU, GELU's tanh form, ReLU; another activation is refused).
TEST(ModelConfigParse, FieldsTransformersIgnoresAreIgnored) {
  const ModelConfig base = ModelConfig::from_json(current_config(), "cfg");
  json j = current_config();
  j["num_key_value_heads"] = 2;
  j["n_group"] = 4;
  j["topk_group"] = 2;
  j["n_shared_experts"] = 2;
  j["qk_rope_head_dim"] = 8;  // partial_rotary_factor 0.125 x head_dim 32 = 4 rotary dims
  const ModelConfig c = ModelConfig::from_json(j, "cfg");
  EXPECT_EQ(c.n_group, 1);
  EXPECT_EQ(c.topk_group, 1);
  EXPECT_EQ(c.rope_dim, base.rope_dim);
  EXPECT_EQ(c.rope_dim, 4);
  EXPECT_EQ(c.n_shared, 2);  // recorded, informational (the weights decide)
  j = current_config();
  j["n_group"] = 3;  // no longer checked against the 8 experts
  EXPECT_EQ(ModelConfig::from_json(j, "cfg").n_group, 1);
  j = current_config();
  j["mlp_bias"] = true;  // read (the shared MLP's biases then must be in the checkpoint)
  EXPECT_TRUE(ModelConfig::from_json(j, "cfg").mlp_bias);
  j["mlp_bias"] = false;
  // hidden_act as transformers' ACT2FN reads it: two spellings of SiLU, two of GELU's tanh form.
  const std::pair<const char*, plumb::ExpertAct> acts[] = {
      {"silu", plumb::ExpertAct::Silu},          {"swish", plumb::ExpertAct::Silu},    {"gelu", plumb::ExpertAct::Gelu},
      {"gelu_pytorch_tanh", plumb::ExpertAct::GeluTanh}, {"gelu_new", plumb::ExpertAct::GeluTanh}, {"relu", plumb::ExpertAct::Relu}};
  for (const auto& [name, act] : acts) {
    j["hidden_act"] = name;
    EXPECT_EQ(ModelConfig::from_json(j, "cfg").act, act) << name;
  }
  j["hidden_act"] = "mish";
  expect_refused(j, {"hidden_act", "mish"}, "an activation plumb does not have");
  j["hidden_act"] = "silu";
  EXPECT_FALSE(ModelConfig::from_json(j, "cfg").tie_embeddings);
  j["tie_word_embeddings"] = true;
  EXPECT_TRUE(ModelConfig::from_json(j, "cfg").tie_embeddings);
}

TEST(ModelConfigParse, UnknownScoringFunctionIsRefused) {
  json j = current_config();
  j["scoring_func"] = "relu";
  expect_refused(j, {"scoring_func", "relu"}, "scoring_func");
  for (const char* ok : {"sigmoid", "softmax", "sqrtsoftplus"}) {
    j["scoring_func"] = ok;
    EXPECT_EQ(plumb::score_func_name(ModelConfig::from_json(j, "cfg").score), std::string(ok));
  }
}

TEST(ModelConfigParse, MissingFieldsTakeTransformersDefaults) {
  // transformers' DeepseekV4Config fills absent keys with the V4-Flash defaults; so must plumb, or it would
  // compute a different model than the reference from the same config.json.
  json j = current_config();
  j.erase("routed_scaling_factor");
  j.erase("swiglu_limit");
  j.erase("norm_topk_prob");
  j.erase("hc_sinkhorn_iters");
  const auto c = ModelConfig::from_json(j, "cfg");
  EXPECT_DOUBLE_EQ(c.routed_scaling, 1.5);
  EXPECT_DOUBLE_EQ(c.swiglu_limit, 10.0);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.hc_sinkhorn_iters, 20);
  // A default that contradicts the rest of the file is still refused, naming the field.
  j = current_config();
  j.erase("num_hidden_layers");  // default 43, but layer_types lists 4 layers
  expect_refused(j, {"layer_types"}, "layer_types shorter than the default num_hidden_layers");
}

TEST(ModelConfigParse, WrongJsonTypesAreNamed) {
  json j = current_config();
  j["norm_topk_prob"] = 1;
  expect_refused(j, {"norm_topk_prob"}, "non-boolean norm_topk_prob");
  j = current_config();
  j["scoring_func"] = 3;
  expect_refused(j, {"scoring_func"}, "non-string scoring_func");
  j = current_config();
  j["rope_parameters"] = {{"main", 1}, {"compress", 2}};
  expect_refused(j, {"rope_parameters.main"}, "non-object rope table");
}

TEST(ModelConfigParse, OtherInconsistenciesAreRefused) {
  json j = current_config();
  j["model_type"] = "deepseek_v3";
  expect_refused(j, {"model_type", "deepseek_v3"}, "model_type");
  j = current_config();
  j["hidden_size"] = "64";
  expect_refused(j, {"hidden_size"}, "non-integer field");
  j = current_config();
  j["num_experts_per_tok"] = 9;
  expect_refused(j, {"num_experts_per_tok"}, "top-k above the expert count");
  j = current_config();
  j["num_attention_heads"] = 3;  // 3 x 32 output dims split into o_groups 2 slices of 48: as transformers takes it
  EXPECT_EQ(ModelConfig::from_json(j, "cfg").n_heads, 3);
  j["o_groups"] = 5;
  expect_refused(j, {"o_groups"}, "heads x head_dim not divisible by o_groups");
  j = current_config();
  j.erase("partial_rotary_factor");
  j["qk_rope_head_dim"] = 8;
  j["rope_parameters"]["main"]["partial_rotary_factor"] = 0.125;
  expect_refused(j, {"partial_rotary_factor"}, "rope dims disagree");
  j = current_config();
  j["rope_parameters"]["compress"]["rope_type"] = "longrope";
  expect_refused(j, {"longrope"}, "unsupported rope type");
  j = current_config();
  j["rope_parameters"]["compress"].erase("original_max_position_embeddings");
  expect_refused(j, {"original_max_position_embeddings"}, "yarn without its original length");
}

// Values that would make the parser allocate gigabytes, convert an out-of-range double to an integer (undefined
// behaviour) or wrap an integer are refused by name (the first found by tests/fuzz/fuzz_config: 331,333,328 layers).
TEST(ModelConfigParse, OutOfRangeValuesAreRefusedBeforeUse) {
  const std::vector<std::pair<std::function<void(json&)>, const char*>> cases = {
      {[](json& j) { j["num_hidden_layers"] = 331333328; }, "num_hidden_layers"},
      {[](json& j) { j["head_dim"] = 0; j.erase("partial_rotary_factor"); j["qk_rope_head_dim"] = 8; }, "head_dim"},
      {[](json& j) { j["partial_rotary_factor"] = 1e300; }, "rotary"},
      {[](json& j) { j["rope_parameters"]["main"]["partial_rotary_factor"] = 1e300; }, "partial_rotary_factor"},
      {[](json& j) { j["max_position_embeddings"] = 1e300; }, "max_position_embeddings"},
      {[](json& j) { j["compress_rates"]["compressed_sparse_attention"] = 4294967300LL; }, "compress_rates"},
      {[](json& j) {
         j.erase("layer_types");
         j["compress_ratios"] = {0, 4294967424LL, 4, 128};
       }, "compress_ratios[1]"},
      {[](json& j) { j.erase("compress_rates"); j["compress_rate_csa"] = 0; }, "compression rates"},
      {[](json& j) { j["eos_token_id"] = 1099511627776LL; }, "eos_token_id"},
      {[](json& j) { j["eos_token_id"] = 18446744073709551615ULL; }, "eos_token_id"},  // (read as -1 by get<int64_t>)
      {[](json& j) { j["num_hidden_layers"] = 18446744073709551615ULL; }, "num_hidden_layers"},
      {[](json& j) { j["hc_sinkhorn_iters"] = 2000000000; }, "hc_sinkhorn_iters"},
  };
  for (const auto& [edit, field] : cases) {
    json j = current_config();
    edit(j);
    expect_refused(j, {field}, field);
  }
}

TEST(ModelConfigParse, LoadRefusesMissingAndMalformedFiles) {
  plumb_test::TempDir dir;
  EXPECT_THROW(ModelConfig::load(dir.file("absent.json")), plumb::Error);
  std::ofstream(dir.file("bad.json")) << "{ \"vocab_size\": 3,";
  try {
    ModelConfig::load(dir.file("bad.json"));
    ADD_FAILURE() << "malformed JSON accepted";
  } catch (const plumb::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("bad.json"));
  }
}

// yarn-sigmoid's model with its config edited, loaded in the reference numerics and in numerics.official.
struct BothNumerics {
  json config;
  std::unique_ptr<plumb::Model> ref, off;
};
BothNumerics yarn_sigmoid_with(const char* tmp_name, const std::function<void(json&)>& edit) {
  namespace fs = std::filesystem;
  const fs::path src = fs::path(PLUMB_TEST_DATA) / "golden" / "yarn-sigmoid";
  const fs::path dir = fs::temp_directory_path() / tmp_name;
  fs::create_directories(dir);
  fs::copy_file(src / "model.safetensors", dir / "model.safetensors", fs::copy_options::overwrite_existing);
  BothNumerics b;
  b.config = json::parse(std::ifstream(src / "config.json"));
  edit(b.config);
  std::ofstream(dir / "config.json") << b.config.dump(2);
  plumb::ModelOptions official;
  official.official = true;
  b.ref = plumb::Model::load(dir.string());
  b.off = plumb::Model::load(dir.string(), official);
  fs::remove_all(dir);
  return b;
}

// The nested yarn form without attention_factor: transformers multiplies cos and sin by 0.1 ln(factor) + 1 (its
// get_mscale default), the official code by nothing (dsv4-spec.md 5.3: no YaRN magnitude scaling), so the reference
// numerics and numerics.official build different ropes from the same config. (yarn-sigmoid's model, its config's
// attention_factor 1.0 removed.)
TEST(ModelConfigRope, NestedYarnWithoutAttentionFactorPerNumerics) {
  const auto b = yarn_sigmoid_with("plumb_yarn_no_af", [](json& j) {
    ASSERT_TRUE(j["rope_parameters"]["compress"].contains("attention_factor"));
    j["rope_parameters"]["compress"].erase("attention_factor");
  });
  const double factor = b.config["rope_parameters"]["compress"]["factor"].get<double>();
  const auto &ref = b.ref, &off = b.off;
  EXPECT_FLOAT_EQ(ref->rope_compress().attention_factor(), float(0.1 * std::log(factor) + 1.0));
  EXPECT_FLOAT_EQ(off->rope_compress().attention_factor(), 1.0f);
  EXPECT_FLOAT_EQ(ref->rope_main().attention_factor(), 1.0f);  // "default" rope: no factor either way
  EXPECT_FLOAT_EQ(off->rope_main().attention_factor(), 1.0f);
}

// A YaRN main rope (transformers applies it to the sliding-window layers): the official code builds those layers'
// table with original_seq_len 0, plain RoPE at the main theta (dsv4-spec.md 5.3, P-A1), so numerics.official does
// too, while the reference numerics take the YaRN frequencies and their attention factor. The expected plain
// frequencies are the RoPE definition, 1 / theta^(2i / dim) in fp32. (yarn-sigmoid's model, its main rope made YaRN
// as make_golden's v-yarn-both does; session 62's oracle run of v-yarn-both failed at L0.attn.out before.)
TEST(ModelConfigRope, YarnMainRopeIsPlainUnderOfficialNumerics) {
  const double factor = 4.0;
  const auto b = yarn_sigmoid_with("plumb_yarn_main", [&](json& j) {
    json& main = j["rope_parameters"]["main"];
    ASSERT_EQ(main["rope_type"], "default");
    main["rope_type"] = "yarn", main["factor"] = factor, main["original_max_position_embeddings"] = 16;
    main["beta_fast"] = 8.0, main["beta_slow"] = 2.0;
  });
  const double theta = b.config["rope_parameters"]["main"]["rope_theta"].get<double>();
  const auto &ref = b.ref, &off = b.off;
  const auto& plain = off->rope_main().inv_freq();
  const int dim = off->rope_main().dim();
  ASSERT_EQ(plain.size(), size_t(dim / 2));
  int yarn_changed = 0;
  for (int i = 0; i < dim / 2; ++i) {
    EXPECT_EQ(plain[size_t(i)], 1.0f / std::pow(float(theta), float(2 * i) / float(dim))) << "dim pair " << i;
    yarn_changed += ref->rope_main().inv_freq()[size_t(i)] != plain[size_t(i)];
  }
  EXPECT_GT(yarn_changed, 0) << "the reference numerics should take the main rope's YaRN";
  EXPECT_FLOAT_EQ(ref->rope_main().attention_factor(), float(0.1 * std::log(factor) + 1.0));
  EXPECT_FLOAT_EQ(off->rope_main().attention_factor(), 1.0f);
  // The compressed layers' YaRN is the official code's one YaRN: the same frequencies in both numerics.
  EXPECT_EQ(ref->rope_compress().inv_freq(), off->rope_compress().inv_freq());
}

// Config fields transformers' V4 ignores change nothing on a real model: the tiny fixture with n_shared_experts 0 or 2
// (its shared expert's tensors are there: one shared expert), n_group / topk_group (V3's grouped selection would pick
// other experts on its learned layers), num_key_value_heads 4 still passes verify-golden; with tie_word_embeddings
// the head is the embedding.
TEST(ModelConfigFields, IgnoredFieldsKeepTheFixturePassing) {
  namespace fs = std::filesystem;
  const fs::path src = fs::path(PLUMB_TEST_DATA) / "golden" / "tiny";
  const fs::path dir = fs::temp_directory_path() / "plumb_cfg_fields";
  fs::create_directories(dir);
  for (const char* f : {"model.safetensors", "golden.json", "golden.safetensors"})
    fs::copy_file(src / f, dir / f, fs::copy_options::overwrite_existing);
  const json base = json::parse(std::ifstream(src / "config.json"));
  const auto with = [&](const std::function<void(json&)>& edit) {
    json j = base;
    edit(j);
    std::ofstream(dir / "config.json") << j.dump(2);
  };
  const std::vector<std::pair<const char*, std::function<void(json&)>>> cases = {
      {"n_shared_experts 0", [](json& j) { j["n_shared_experts"] = 0; }},
      {"n_shared_experts 2", [](json& j) { j["n_shared_experts"] = 2; }},
      {"n_group 4 / topk_group 1", [](json& j) { j["n_group"] = 4, j["topk_group"] = 1; }},
      {"num_key_value_heads 4", [](json& j) { j["num_key_value_heads"] = 4; }},
  };
  for (const auto& [name, edit] : cases) {
    with(edit);
    plumb::tools::VerifyGoldenOptions o;
    o.dir = dir.string(), o.quiet = true;
    EXPECT_EQ(plumb::tools::verify_golden(o), 0) << name;
  }
  // mlp_bias true: the shared MLP's biases must be in the checkpoint, and the first missing one is named.
  with([](json& j) { j["mlp_bias"] = true; });
  try {
    plumb::Model::load(dir.string());
    ADD_FAILURE() << "mlp_bias true loaded a checkpoint without the shared MLP's biases";
  } catch (const plumb::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("layers.0.ffn.shared_experts.w1.bias")) << e.what();
  }
  with([](json& j) { j["tie_word_embeddings"] = true; });
  const auto m = plumb::Model::load(dir.string());
  const auto& w = m->weights();
  const int64_t D = w.embed.cols();
  std::vector<float> e(static_cast<size_t>(D)), h(static_cast<size_t>(D));
  for (int64_t r : {int64_t(0), w.embed.rows() / 2, w.embed.rows() - 1}) {
    w.embed.row(r, e.data()), w.head.row(r, h.data());
    EXPECT_EQ(e, h) << "head row " << r << " is not the embedding's";
  }
  fs::remove_all(dir);
}

}  // namespace

namespace {

// The released checkpoints' root config.json (dsv4-spec.md 1.1, its legacy spellings: compress_ratios with the MTP
// block's entry last, num_hash_layers, a flat rope_scaling, qk_rope_head_dim, quantization_config, ...), V4-Flash or
// V4-Pro.
json hub_config(bool pro) {
  json j = json::parse(R"({
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
    "vocab_size": 129280, "num_key_value_heads": 1, "head_dim": 512, "qk_rope_head_dim": 64, "o_lora_rank": 1024,
    "num_experts_per_tok": 6, "n_shared_experts": 1, "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc",
    "norm_topk_prob": true, "num_hash_layers": 3, "swiglu_limit": 10.0, "hc_mult": 4, "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6, "rms_norm_eps": 1e-6, "sliding_window": 128, "index_n_heads": 64, "index_head_dim": 128,
    "rope_theta": 10000, "compress_rope_theta": 160000,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536, "beta_fast": 32,
                     "beta_slow": 1},
    "max_position_embeddings": 1048576, "num_nextn_predict_layers": 1, "hidden_act": "silu",
    "tie_word_embeddings": false, "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16",
    "attention_bias": false, "expert_dtype": "fp4",
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0", "activation_scheme": "dynamic",
                            "weight_block_size": [128, 128]}
  })");
  const int layers = pro ? 61 : 43;
  j["hidden_size"] = pro ? 7168 : 4096;
  j["num_hidden_layers"] = layers;
  j["num_attention_heads"] = pro ? 128 : 64;
  j["q_lora_rank"] = pro ? 1536 : 1024;
  j["o_groups"] = pro ? 16 : 8;
  j["n_routed_experts"] = pro ? 384 : 256;
  j["moe_intermediate_size"] = pro ? 3072 : 2048;
  j["routed_scaling_factor"] = pro ? 2.5 : 1.5;
  j["index_topk"] = pro ? 1024 : 512;
  // Flash: [0, 0, 4, 128, ..., 4, 0]; Pro: [128, 128, 4, 128, ..., 4, 0] (the last entry is the MTP block's).
  std::vector<int> ratios = {pro ? 128 : 0, pro ? 128 : 0};
  for (int l = 2; l < layers; ++l) ratios.push_back(l % 2 == 0 ? 4 : 128);
  ratios.push_back(0);
  j["compress_ratios"] = ratios;
  return j;
}

}  // namespace

// The released V4-Flash and V4-Pro configs give the schedule of dsv4-spec.md 1.2: Flash layers 0-1 sliding, the even
// layers from 2 CSA (21), the odd ones HCA (20); Pro layers 0-1 HCA, 30 CSA, 31 HCA; the MTP block's ratio ignored;
// layers 0-2 hash-routed; rope on the last 64 dims, YaRN (factor 16 over 65536, no attention factor: the flat form)
// on the compressed layers only.
TEST(ModelConfigParse, ReleasedFlashAndProConfigsGiveTheirSchedules) {
  for (const bool pro : {false, true}) {
    const std::string what = pro ? "V4-Pro" : "V4-Flash";
    const ModelConfig c = ModelConfig::from_json(hub_config(pro), what);
    ASSERT_EQ(c.n_layers, pro ? 61 : 43) << what;
    EXPECT_EQ(c.hidden, pro ? 7168 : 4096) << what;
    EXPECT_EQ(c.n_heads, pro ? 128 : 64) << what;
    EXPECT_EQ(c.head_dim, 512) << what;
    EXPECT_EQ(c.rope_dim, 64) << what;
    EXPECT_EQ(c.q_lora, pro ? 1536 : 1024) << what;
    EXPECT_EQ(c.o_groups, pro ? 16 : 8) << what;
    EXPECT_EQ(c.o_lora, 1024) << what;
    EXPECT_EQ(c.n_experts, pro ? 384 : 256) << what;
    EXPECT_EQ(c.top_k, 6) << what;
    EXPECT_EQ(c.moe_inter, pro ? 3072 : 2048) << what;
    EXPECT_DOUBLE_EQ(c.routed_scaling, pro ? 2.5 : 1.5) << what;
    EXPECT_EQ(c.index_topk, pro ? 1024 : 512) << what;
    EXPECT_EQ(c.index_heads, 64) << what;
    EXPECT_EQ(c.index_head_dim, 128) << what;
    EXPECT_EQ(c.window, 128) << what;
    EXPECT_EQ(c.n_group, 1) << what;  // noaux_tc without groups: ungrouped top-k
    EXPECT_EQ(c.act, plumb::ExpertAct::Silu) << what;
    int sliding = 0, csa = 0, hca = 0;
    for (int l = 0; l < c.n_layers; ++l) {
      const AttnType want = l < 2 ? (pro ? AttnType::HCA : AttnType::Sliding) : l % 2 == 0 ? AttnType::CSA : AttnType::HCA;
      EXPECT_EQ(c.attn[size_t(l)], want) << what << " layer " << l;
      EXPECT_EQ(c.compress_rate[size_t(l)], want == AttnType::CSA ? 4 : want == AttnType::HCA ? 128 : 0) << what << " layer " << l;
      EXPECT_EQ(c.mlp[size_t(l)], l < 3 ? MlpType::Hash : MlpType::Learned) << what << " layer " << l;
      sliding += c.attn[size_t(l)] == AttnType::Sliding, csa += c.attn[size_t(l)] == AttnType::CSA, hca += c.attn[size_t(l)] == AttnType::HCA;
    }
    EXPECT_EQ(sliding, pro ? 0 : 2) << what;
    EXPECT_EQ(csa, pro ? 30 : 21) << what;
    EXPECT_EQ(hca, pro ? 31 : 20) << what;
    EXPECT_FALSE(c.rope_main.yarn) << what;
    EXPECT_DOUBLE_EQ(c.rope_main.theta, 10000.0) << what;
    EXPECT_TRUE(c.rope_compress.yarn) << what;
    EXPECT_DOUBLE_EQ(c.rope_compress.theta, 160000.0) << what;
    EXPECT_DOUBLE_EQ(c.rope_compress.factor, 16.0) << what;
    EXPECT_DOUBLE_EQ(c.rope_compress.original_max_pos, 65536.0) << what;
    EXPECT_DOUBLE_EQ(c.rope_compress.attention_factor, 1.0) << what;
    EXPECT_EQ(c.max_positions, int64_t(1) << 20) << what;
  }
}
