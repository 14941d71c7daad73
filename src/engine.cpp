// The public Engine/Session API over the internal Model (the CPU reference backend or the CUDA forward pass).
#include "plumb/engine.h"

#include "model/model.h"
#include "patches/registry.h"
#include "plumb/text.h"

namespace plumb {

int32_t Session::forward_sample(std::span<const int32_t> tokens, Sampler& sampler, std::span<const int32_t> history) {
  return sampler.sample(forward(tokens), history);
}

namespace {

class ModelSession : public Session {
 public:
  explicit ModelSession(std::shared_ptr<const Model> m) : m_(std::move(m)), st_(m_->new_state()) {}
  std::vector<float> forward(std::span<const int32_t> tokens) override {
    const Tensor logits = m_->forward(st_, tokens);
    const int64_t V = logits.dim(1);
    return {logits.ptr() + (logits.dim(0) - 1) * V, logits.ptr() + logits.dim(0) * V};
  }
  std::vector<float> forward_all(std::span<const int32_t> tokens) override { return m_->forward(st_, tokens).data; }
  int32_t forward_sample(std::span<const int32_t> tokens, Sampler& sampler, std::span<const int32_t> history) override {
    if (m_->backend() == "cuda") return m_->forward_sample(st_, tokens, sampler, history);
    return Session::forward_sample(tokens, sampler, history);
  }
  int64_t position() const override { return st_.pos; }
  void reset() override { st_ = m_->new_state(); }

 private:
  std::shared_ptr<const Model> m_;
  SessionState st_;
};

class ModelEngine : public Engine {
 public:
  ModelEngine(std::shared_ptr<const Model> m) : m_(std::move(m)) {
    const auto& c = m_->config();
    info_.vocab_size = c.vocab;
    info_.bos_token = c.bos_token;
    info_.eos_token = c.eos_token;
    info_.max_positions = c.max_positions;
    info_.summary = c.summary();
  }
  const ModelInfo& info() const override { return info_; }
  std::unique_ptr<Session> new_session() const override { return std::make_unique<ModelSession>(m_); }
  const std::string& dir() const override { return m_->dir(); }

 private:
  std::shared_ptr<const Model> m_;
  ModelInfo info_;
};

}  // namespace

std::shared_ptr<Engine> Engine::load(const std::string& dir, const EngineOptions& opt) {
  PLUMB_CHECK(opt.backend == "cpu" || opt.backend == "cuda", "unknown backend '{}' (available: {})", opt.backend, kBackends);
  const PatchSet ps = parse_patches(opt.patches);
  std::function<void(int64_t, int64_t)> on_layer;
  if (opt.on_progress) on_layer = [&opt](int64_t done, int64_t total) { opt.on_progress(LoadProgress{"layers", done, total}); };
  return std::make_shared<ModelEngine>(std::shared_ptr<const Model>(Model::load(dir, ps.options, on_layer, opt.backend)));
}

}  // namespace plumb
