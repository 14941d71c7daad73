// The DeepSeek-V4 model: config + bound weights + RoPE tables; runs a chunk of tokens on a session state.
#pragma once
#include <exception>
#include <functional>
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
#include "plumb/engine.h"  // BatchRow

namespace plumb {

class Model;
class Sampler;  // plumb/text.h

// Which rows of a forward chunk get logits: every token (verification, scoring), only the last (generation: the
// next token), or none (a prefill pass before the last: the LM head, the largest matrix, is skipped).
enum class LogitRows { All, Last, None };

// The tokens a batch's rows feed (forward_batch_sample), in row order.
inline std::vector<int32_t> batch_tokens(std::span<const BatchRow> rows) {
  std::vector<int32_t> tokens;
  for (const BatchRow& r : rows) tokens.push_back(r.token);
  return tokens;
}

// The masks of a batch's rows (forward_batch_sample, both backends): row b's `allowed`, where it has a sampler and a
// mask, fills words [b * words, (b + 1) * words) of the result (zeroed); errors (resized to the rows) holds the
// exception of a mask that threw. A mask at V4's vocabulary takes 0.1-1.3 ms on the host, so a batch's masks one after
// another could outlast its forward pass: the rows are spread over the CPU threads (parallel_for; each row's function
// runs on one thread, several rows' at the same time).
std::vector<uint32_t> batch_masks(std::span<const BatchRow> rows, size_t words, std::vector<std::exception_ptr>& errors);

// A device sampler found no finite logit in `row` (after the penalties; the row as it sampled it): throws the host
// sampler's own error for that row (Sampler::distribution's, which says what it held), or, should the host find a
// finite logit there, an error naming `where` (forward_sample's position, forward_batch_sample's session).
[[noreturn]] void throw_no_finite_row(const Sampler& sampler, std::span<const float> row, std::span<const int32_t> history,
                                      const std::string& where);

// Session::forward_sample_masked's `allowed`: sets the bits of the tokens that may be drawn ((vocab + 31) / 32 words,
// zeroed; bit id % 32 of word id / 32).
using TokenFilter = std::function<void(std::span<uint32_t> allowed)>;

// A backend other than the CPU reference runs the whole forward pass itself (src/cuda/gpu_model.cpp): same
// inputs, outputs and taps as Model::forward, its caches in SessionState::dev.
class DeviceForward {
 public:
  virtual ~DeviceForward() = default;
  virtual std::shared_ptr<DeviceSessionState> new_state() const = 0;
  virtual Tensor forward(SessionState& st, std::span<const int32_t> tokens, TapSink* taps, LogitRows rows) const = 0;
  // Model::forward_batch's pass (states checked, distinct and made by this backend; positions not yet advanced):
  // logits [B, vocab].
  virtual Tensor forward_batch(std::span<SessionState* const> states, std::span<const int32_t> tokens) const = 0;
  // Model::forward_batch_sample's pass (checked likewise; every sampler's vocabulary the model's; tokens: the rows'):
  // the rows with a sampler drawn on the device, the others' logits downloaded; a row's own failure in its `error`.
  virtual void forward_batch_sample(std::span<SessionState* const> states, std::span<const int32_t> tokens,
                                    std::span<BatchRow> rows) const = 0;
  // Feeds tokens and samples the next one from the last token's logits on the device (see Session::forward_sample).
  // Returns -1 when that row has no finite logit to sample from (after the penalties), with the row in `no_finite_row`
  // for the caller's error (Sampler::distribution's). `allowed` (may be null): the row's mask, asked for once the
  // forward is queued (Session::forward_sample_masked); an exception from it leaves after the forward has run.
  virtual int32_t forward_sample(SessionState& st, std::span<const int32_t> tokens, Sampler& sampler,
                                 std::span<const int32_t> history, const TokenFilter* allowed,
                                 std::vector<float>& no_finite_row) const = 0;
  // Sizes the session's growing caches for positions [0, positions) (see Model::reserve).
  virtual void reserve(SessionState& st, int64_t positions) const = 0;
  // StateMark::dev: a copy of what a forward overwrites in the session's device caches, and its restore (after the
  // forwards queued since the mark have run).
  virtual std::shared_ptr<void> mark(const SessionState& st, int64_t& bytes) const = 0;
  virtual void rollback(SessionState& st, const void* mark) const = 0;
  // What loading took of the device's memory (ModelInfo's device fields; empty if the backend has nothing to say).
  struct Memory {
    std::string device;
    int64_t loaded = 0, free = 0, total = 0;
    int64_t host = 0;  // cuda.host_experts: the weights kept in pinned host memory
  };
  virtual Memory memory() const { return {}; }
};
// The CUDA backend for a loaded model (uploads its weights; `on_layer(done, total)`, if set, after each layer's are on
// the device); throws Error when this build or machine has no usable GPU, or an option is not implemented there.
// Defined in src/cuda (stub.cpp without CUDA).
std::unique_ptr<DeviceForward> make_cuda_forward(const Model& m, const std::function<void(int64_t, int64_t)>& on_layer = {});

// Backends: "cpu" (the reference, always) and "cuda" (with -DPLUMB_CUDA=ON and a Hopper GPU).
inline const char* kBackends = "cpu, cuda";

class Model {
 public:
  // dir: a folder with config.json and model.safetensors (or a sharded index). backend: "cpu" or "cuda".
  // on_layer(done, total): after each layer is bound; on_upload(done, total): after each layer's weights are on the
  // GPU (backend cuda).
  static std::unique_ptr<Model> load(const std::string& dir, const ModelOptions& opt = {},
                                     const std::function<void(int64_t, int64_t)>& on_layer = {},
                                     const std::string& backend = "cpu",
                                     const std::function<void(int64_t, int64_t)>& on_upload = {});

  SessionState new_state() const;
  // Consumes tokens at positions state.pos .. state.pos+n-1 (prefill chunk or one decode token) and returns
  // their logits [n, vocab] (rows Last: [1, vocab], the last token's; None: an empty tensor). Token ids are checked
  // against the vocabulary before anything is computed. With taps every row is computed (hc_head.out is a tap).
  // `on_layer(k)`, if set, after each of the first k layers on the CPU backend (a long pass's progress; the GPU's pass
  // is queued whole and does not call it).
  Tensor forward(SessionState& state, std::span<const int32_t> tokens, TapSink* taps = nullptr,
                 LogitRows rows = LogitRows::All, const std::function<void(int)>& on_layer = {}) const;
  // One decode step of several sessions at once: tokens[b] fed to *states[b] at its own position (every state
  // distinct and made by this model's backend, one token each). Returns the logits [B, vocab]: row b is what
  // forward(*states[b], {tokens[b]}) returns, on the CPU bit for bit (every op but the attention works row by row, and
  // the attention runs per session on its caches), on the GPU within the patches' tolerances (the GEMVs' batched
  // kernels sum in another order). The weights are read once for all the rows (what reads a session's caches runs
  // per session).
  // Nothing is computed when a state or a token is refused; no taps.
  Tensor forward_batch(std::span<SessionState* const> states, std::span<const int32_t> tokens) const;
  // The same step, each row with a sampler drawing its next token where the logits are (plumb::forward_batch_sample):
  // on the device where the backend has one, else on the host from forward_batch's rows. A row's sampling or mask
  // failure is its own `error`; the checks before the pass are forward_batch's and each sampler's vocabulary.
  void forward_batch_sample(std::span<SessionState* const> states, std::span<BatchRow> rows) const;
  // Throws plumb::Error for an empty chunk or a token id outside the vocabulary (forward checks this first).
  void check_tokens(const SessionState& state, std::span<const int32_t> tokens) const;
  // Backends with a device (cuda): forward, then sampler's choice from the last token's logits, sampled there;
  // among the tokens `allowed` lets through, if given (Session::forward_sample_masked: the tokens count as fed when it
  // throws).
  int32_t forward_sample(SessionState& state, std::span<const int32_t> tokens, Sampler& sampler,
                         std::span<const int32_t> history, const TokenFilter* allowed = nullptr) const;
  // Sizes the session's growing caches (backend cuda: the compressed entries, which otherwise double as the
  // positions pass 256, 512, ... tokens, each growth re-capturing the decode graph with one eager step) for
  // positions [0, positions) up front. Optional, a hint: the caches still grow past it, and a backend may reserve
  // less (cuda: at most 65536 positions); no-op on the CPU backend, whose caches cost nothing to grow. positions is
  // clamped to the model's context.
  void reserve(SessionState& state, int64_t positions) const;
  // What rollback() needs to put `state` back as it is now, after any forwards (StateMark). A forward stopped
  // halfway (an exception from its on_layer) may leave part of its layers written: rollback restores them all.
  StateMark mark(const SessionState& state) const;
  void rollback(SessionState& state, const StateMark& mark) const;

  const ModelConfig& config() const { return cfg_; }
  const std::string& dir() const { return dir_; }
  const ModelOptions& options() const { return opt_; }
  const ModelWeights& weights() const { return w_; }
  const Checkpoint& checkpoint() const { return ck_; }  // found_bytes(): what the weights bound of it
  const ops::Rope& rope_main() const { return rope_main_; }
  const ops::Rope& rope_compress() const { return rope_compress_; }
  const std::string& backend() const { return backend_; }
  DeviceForward::Memory device_memory() const { return device_ ? device_->memory() : DeviceForward::Memory{}; }

 private:
  // Consecutive rows of a chunk that belong to one session (cpu_forward: a forward's one run, or a batch's runs).
  struct RowRun {
    SessionState* st = nullptr;
    int64_t row0 = 0, n = 0;
  };
  Tensor cpu_forward(std::span<const RowRun> runs, std::span<const int32_t> tokens, TapSink* taps, LogitRows rows,
                     const std::function<void(int)>& on_layer) const;
  // forward_batch's checks (nothing fed when one fails): a run of one row per state.
  std::vector<RowRun> check_batch(std::span<SessionState* const> states, std::span<const int32_t> tokens) const;

  std::string dir_;
  ModelConfig cfg_;
  Checkpoint ck_;
  ModelWeights w_;
  ops::Rope rope_main_, rope_compress_;
  ModelOptions opt_;
  std::string backend_ = "cpu";
  std::unique_ptr<DeviceForward> device_;  // set for backends other than "cpu"
};

}  // namespace plumb
