// The DeepSeek-V4 model: config + bound weights + RoPE tables; runs a chunk of tokens on a session state.
#pragma once
#include <memory>
#include <span>

#include "io/safetensors.h"
#include "model/config.h"
#include "model/experts.h"
#include "model/options.h"
#include "model/ops.h"
#include "model/state.h"
#include "model/taps.h"
#include "model/weights.h"

namespace plumb {

class Model {
 public:
  // dir: a folder with config.json and model.safetensors (or a sharded index).
  static std::unique_ptr<Model> load(const std::string& dir, const ModelOptions& opt = {},
                                     const std::function<void(int64_t, int64_t)>& on_layer = {});

  SessionState new_state() const;
  // Consumes tokens at positions state.pos .. state.pos+n-1 (prefill chunk or one decode token) and returns
  // their logits [n, vocab]. Token ids are checked against the vocabulary before anything is computed.
  Tensor forward(SessionState& state, std::span<const int32_t> tokens, TapSink* taps = nullptr) const;

  const ModelConfig& config() const { return cfg_; }
  const std::string& dir() const { return dir_; }
  const ModelOptions& options() const { return opt_; }

 private:
  std::string dir_;
  ModelConfig cfg_;
  Checkpoint ck_;
  ModelWeights w_;
  ops::Rope rope_main_, rope_compress_;
  ModelOptions opt_;
};

}  // namespace plumb
