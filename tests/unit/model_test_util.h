// Helpers shared by the model unit tests (tests/unit/test_model_*.cpp): temporary checkpoints built with
// write_safetensors, deterministic pseudo-random data, naive double-precision formulas and tensor comparisons.
// Everything the tests compare against is computed here or in the test itself, never by the code under test.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/weights.h"

namespace plumb_test {

namespace fs = std::filesystem;

// A fresh directory under the system temp folder, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() /
            ("plumb_model_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

// Deterministic uniform values in [lo, hi).
class Rng {
 public:
  explicit Rng(uint32_t seed) : g_(seed) {}
  float uniform(float lo = -1.0f, float hi = 1.0f) { return std::uniform_real_distribution<float>(lo, hi)(g_); }
  std::vector<float> vec(size_t n, float lo = -1.0f, float hi = 1.0f) {
    std::vector<float> v(n);
    for (auto& x : v) x = uniform(lo, hi);
    return v;
  }
  plumb::Tensor tensor(plumb::Shape s, float lo = -1.0f, float hi = 1.0f) {
    const auto n = size_t(plumb::numel_of(s));
    return plumb::Tensor(std::move(s), vec(n, lo, hi));
  }
  uint32_t bits() { return g_(); }

 private:
  std::mt19937 g_;
};

inline plumb::OwnedTensor f32(const std::string& name, plumb::Shape shape, const std::vector<float>& v) {
  return plumb::owned_f32(name, plumb::Tensor(std::move(shape), v));
}

inline plumb::OwnedTensor raw(const std::string& name, plumb::DType dt, plumb::Shape shape, std::vector<uint8_t> bytes) {
  return plumb::OwnedTensor{name, dt, std::move(shape), std::move(bytes)};
}

// Writes `tensors` to DIR/NAME and opens it as a checkpoint (a single .safetensors file).
inline plumb::Checkpoint write_checkpoint(const TempDir& dir, const std::vector<plumb::OwnedTensor>& tensors,
                                          const std::string& name = "model.safetensors") {
  const std::string path = dir.file(name);
  plumb::write_safetensors(path, tensors);
  return plumb::Checkpoint::open(path);
}

// A model folder in `dir`: fixture `src`'s weights with biases added to every shared expert (transformers' mlp_bias:
// b1 and b3 [I] of the values given (0 by default), b2 = `b2` [D]) and its config.json with mlp_bias true.
inline void write_with_shared_biases(const std::string& src, const TempDir& dir, const std::vector<float>& b2, float b1 = 0.0f,
                                     float b3 = 0.0f) {
  const plumb::Checkpoint ck = plumb::Checkpoint::open(src);
  std::vector<plumb::OwnedTensor> ts;
  for (const auto& name : ck.names()) {
    const auto& v = ck.get(name);
    ts.push_back(raw(name, v.dtype, v.shape, std::vector<uint8_t>(v.data, v.data + v.nbytes)));
    if (name.ends_with("ffn.shared_experts.w1.weight")) {
      const std::string p = name.substr(0, name.size() - std::string("w1.weight").size());
      const int64_t I = v.shape[0];
      ts.push_back(f32(p + "w1.bias", {I}, std::vector<float>(size_t(I), b1)));
      ts.push_back(f32(p + "w3.bias", {I}, std::vector<float>(size_t(I), b3)));
      ts.push_back(f32(p + "w2.bias", {int64_t(b2.size())}, b2));
    }
  }
  plumb::write_safetensors(dir.file("model.safetensors"), ts);
  nlohmann::json j = nlohmann::json::parse(std::ifstream(fs::path(src) / "config.json"));
  j["mlp_bias"] = true;
  std::ofstream(dir.file("config.json")) << j.dump(2);
}

// ---- naive double-precision formulas ----

// y = W x for a row-major [rows, cols] W.
inline std::vector<double> matvec(const std::vector<float>& W, int64_t rows, int64_t cols, const double* x) {
  std::vector<double> y(size_t(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) y[size_t(r)] += double(W[size_t(r * cols + c)]) * x[c];
  return y;
}

inline double sigmoid_d(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double silu_d(double x) { return x * sigmoid_d(x); }
inline double softplus_d(double x) { return std::log1p(std::exp(x)); }

// One SwiGLU expert in double: W2 (silu(min(W1 x, L)) * clamp(W3 x, -L, L)), no clamp when L <= 0.
struct NaiveExpert {
  std::vector<float> w1, w2, w3;  // [I, D], [D, I], [I, D]
  int64_t D = 0, I = 0;

  std::vector<double> operator()(const double* x, double limit) const {
    auto g = matvec(w1, I, D, x), u = matvec(w3, I, D, x);
    std::vector<double> h(static_cast<size_t>(I));
    for (int64_t i = 0; i < I; ++i) {
      double gv = g[size_t(i)], uv = u[size_t(i)];
      if (limit > 0) {
        gv = std::min(gv, limit);
        uv = std::max(-limit, std::min(uv, limit));
      }
      h[size_t(i)] = silu_d(gv) * uv;
    }
    return matvec(w2, D, I, h.data());
  }
};

// ---- comparisons ----

// max |a - b| / max(1, max |ref|); NaN anywhere (or a size mismatch) gives +inf.
inline double rel_err(const float* got, const double* ref, size_t n) {
  double m = 0, e = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(got[i]) || std::isnan(ref[i])) return INFINITY;
    m = std::max(m, std::fabs(ref[i]));
    e = std::max(e, std::fabs(double(got[i]) - ref[i]));
  }
  return e / std::max(1.0, m);
}
inline double rel_err(const std::vector<float>& got, const std::vector<double>& ref) {
  if (got.size() != ref.size()) return INFINITY;
  return rel_err(got.data(), ref.data(), got.size());
}
inline double rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
  std::vector<double> r(ref.begin(), ref.end());
  return rel_err(got, r);
}

// Field-by-field comparison of two configs (ModelConfig has no operator==); names the first difference.
inline ::testing::AssertionResult same_rope(const plumb::RopeConfig& a, const plumb::RopeConfig& b, const char* which) {
  auto close = [](double x, double y) { return std::fabs(x - y) <= 1e-12 * std::max(1.0, std::fabs(y)); };
  if (!close(a.theta, b.theta)) return ::testing::AssertionFailure() << which << ".theta " << a.theta << " vs " << b.theta;
  if (a.yarn != b.yarn) return ::testing::AssertionFailure() << which << ".yarn " << a.yarn << " vs " << b.yarn;
  if (!a.yarn) return ::testing::AssertionSuccess();
  if (!close(a.factor, b.factor)) return ::testing::AssertionFailure() << which << ".factor " << a.factor << " vs " << b.factor;
  if (!close(a.original_max_pos, b.original_max_pos))
    return ::testing::AssertionFailure() << which << ".original_max_pos " << a.original_max_pos << " vs " << b.original_max_pos;
  if (!close(a.beta_fast, b.beta_fast) || !close(a.beta_slow, b.beta_slow))
    return ::testing::AssertionFailure() << which << ".beta_fast/slow differ";
  if (!close(a.attention_factor, b.attention_factor))
    return ::testing::AssertionFailure() << which << ".attention_factor " << a.attention_factor << " vs " << b.attention_factor;
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult same_config(const plumb::ModelConfig& a, const plumb::ModelConfig& b) {
#define PLUMB_TEST_FIELD(f) \
  if (a.f != b.f) return ::testing::AssertionFailure() << "field " #f " differs: " << a.f << " vs " << b.f;
  PLUMB_TEST_FIELD(vocab) PLUMB_TEST_FIELD(hidden) PLUMB_TEST_FIELD(n_layers) PLUMB_TEST_FIELD(n_heads)
  PLUMB_TEST_FIELD(head_dim) PLUMB_TEST_FIELD(rope_dim) PLUMB_TEST_FIELD(q_lora) PLUMB_TEST_FIELD(o_groups)
  PLUMB_TEST_FIELD(o_lora) PLUMB_TEST_FIELD(window) PLUMB_TEST_FIELD(n_experts) PLUMB_TEST_FIELD(top_k)
  PLUMB_TEST_FIELD(n_shared) PLUMB_TEST_FIELD(moe_inter) PLUMB_TEST_FIELD(routed_scaling)
  PLUMB_TEST_FIELD(norm_topk_prob) PLUMB_TEST_FIELD(swiglu_limit) PLUMB_TEST_FIELD(hc_mult)
  PLUMB_TEST_FIELD(hc_sinkhorn_iters) PLUMB_TEST_FIELD(hc_eps) PLUMB_TEST_FIELD(rms_eps) PLUMB_TEST_FIELD(index_heads)
  PLUMB_TEST_FIELD(index_head_dim) PLUMB_TEST_FIELD(index_topk) PLUMB_TEST_FIELD(bos_token) PLUMB_TEST_FIELD(eos_token)
  PLUMB_TEST_FIELD(mlp_bias) PLUMB_TEST_FIELD(tie_embeddings) PLUMB_TEST_FIELD(max_positions) PLUMB_TEST_FIELD(n_group)
  PLUMB_TEST_FIELD(topk_group)
#undef PLUMB_TEST_FIELD
  if (a.act != b.act) return ::testing::AssertionFailure() << "hidden_act differs: " << plumb::expert_act_name(a.act) << " vs "
                                                           << plumb::expert_act_name(b.act);
  if (a.score != b.score) return ::testing::AssertionFailure() << "scoring function differs";
  if (a.attn != b.attn) return ::testing::AssertionFailure() << "attention schedule (attn) differs";
  if (a.compress_rate != b.compress_rate) return ::testing::AssertionFailure() << "compress_rate differs";
  if (a.mlp != b.mlp) return ::testing::AssertionFailure() << "mlp schedule differs";
  if (auto r = same_rope(a.rope_main, b.rope_main, "rope_main"); !r) return r;
  if (auto r = same_rope(a.rope_compress, b.rope_compress, "rope_compress"); !r) return r;
  return ::testing::AssertionSuccess();
}


// ---- a tiny MoE block bound from a checkpoint written here ----

// Routed experts 0..E-1 and (optionally) a shared expert, all F32 [I, D] / [D, I] / [I, D]; the router gate is
// F32 [E, D]. The MoeWeights views stay valid as long as this object lives (it owns the checkpoint).
struct TinyMoe {
  TempDir dir;
  plumb::Checkpoint ck;
  plumb::ModelConfig c;
  plumb::MoeWeights w;
  std::vector<float> gate;  // [E, D]
  std::vector<NaiveExpert> experts;
  NaiveExpert shared;

  // Learned-routing logits and scores of one row, in double.
  std::vector<double> logits(const double* x) const { return matvec(gate, c.n_experts, c.hidden, x); }
};

inline std::unique_ptr<TinyMoe> make_tiny_moe(int E, int K, int D, int I, int V, std::vector<float> gate, uint32_t seed,
                                               bool with_shared = true, float expert_scale = 1.0f) {
  auto m = std::make_unique<TinyMoe>();
  m->c.hidden = D;
  m->c.n_experts = E;
  m->c.top_k = K;
  m->c.moe_inter = I;
  m->c.n_shared = with_shared ? 1 : 0;
  m->c.vocab = V;
  m->c.routed_scaling = 1.0;
  m->c.score = plumb::ScoreFunc::SqrtSoftplus;
  m->c.swiglu_limit = 0;
  m->gate = std::move(gate);
  Rng rng(seed);
  std::vector<plumb::OwnedTensor> ts;
  ts.push_back(f32("ffn.gate.weight", {E, D}, m->gate));
  auto make_expert = [&](const std::string& p) {
    NaiveExpert e;
    e.D = D;
    e.I = I;
    e.w1 = rng.vec(size_t(I * D), -expert_scale, expert_scale);
    e.w2 = rng.vec(size_t(D * I), -expert_scale, expert_scale);
    e.w3 = rng.vec(size_t(I * D), -expert_scale, expert_scale);
    ts.push_back(f32(p + ".w1.weight", {I, D}, e.w1));
    ts.push_back(f32(p + ".w2.weight", {D, I}, e.w2));
    ts.push_back(f32(p + ".w3.weight", {I, D}, e.w3));
    return e;
  };
  for (int e = 0; e < E; ++e) m->experts.push_back(make_expert("ffn.experts." + std::to_string(e)));
  if (with_shared) m->shared = make_expert("ffn.shared_experts");
  m->ck = write_checkpoint(m->dir, ts);
  m->w.gate = plumb::Matrix::bind(m->ck, "ffn.gate.weight", E, D);
  auto bind_expert = [&](const std::string& p) {
    return plumb::ExpertWeights{plumb::Matrix::bind(m->ck, p + ".w1.weight", I, D),
                                plumb::Matrix::bind(m->ck, p + ".w2.weight", D, I),
                                plumb::Matrix::bind(m->ck, p + ".w3.weight", I, D)};
  };
  for (int e = 0; e < E; ++e) m->w.experts.push_back(bind_expert("ffn.experts." + std::to_string(e)));
  if (with_shared) m->w.shared = std::make_unique<plumb::ExpertWeights>(bind_expert("ffn.shared_experts"));
  m->w.bias = plumb::Tensor({E}, 0.0f);
  m->w.tid2eid = plumb::IndexTensor({V, K}, 0);
  return m;
}

// The identity gate: with D == E the router logits are the input row itself.
inline std::vector<float> identity_gate(int E) {
  std::vector<float> g(size_t(E * E), 0.0f);
  for (int e = 0; e < E; ++e) g[size_t(e * E + e)] = 1.0f;
  return g;
}

}  // namespace plumb_test
