// `plumb serve`'s engine thread, and the sessions whose calls run on it: every call on the engine's sessions runs on
// this one thread (backend cuda keeps per-thread state, the cuBLASLt workspaces and plans, and its sessions want one
// thread at a time). With several generations at once (ServerOptions::parallel), their one-token steps that wait
// together run as one plumb::forward_batch_sample: the weights are read once for all of them, and each row is sampled
// where its logits are (on the GPU only the tokens come back). Public API only.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "plumb/engine.h"

namespace plumb::server {

class EngineThread {
 public:
  EngineThread();
  ~EngineThread();
  EngineThread(const EngineThread&) = delete;
  EngineThread& operator=(const EngineThread&) = delete;

  // Queues f, waits for it; f's exception comes back to the caller.
  void run(std::function<void()> f);
  // session.forward({token}) on the engine thread: the logits (vocab floats). Steps of different sessions that wait
  // together, of either kind, go as one plumb::forward_batch_sample (should that refuse a session's token, position
  // or sampler, each runs alone, so the error reaches only its own caller); a row's own failure (its sampler's
  // refusal, its mask's exception) reaches only its caller too. Batches and the other calls take turns (a
  // QueuedSession feeds a long prompt in pieces, so the running generations' steps go on between them).
  std::vector<float> step(Session& session, int32_t token);
  // session.forward_sample_masked({token}, sampler, history, allowed) on the engine thread (forward_sample where
  // `allowed` is empty): the token drawn. The sampler draws and `allowed` runs on the engine thread while the caller
  // waits here, so neither may touch what another thread uses meanwhile, nor call this thread (it would wait for
  // itself). generate() in a request's thread keeps to that: its sampler, history and mask are the generation's own,
  // and that thread does nothing else until this returns (the promise orders their uses before and after); the
  // tokenizer tables the masks share are immutable (gen::TokenizerCache).
  int32_t step_sample(Session& session, int32_t token, Sampler& sampler, std::span<const int32_t> history,
                      const std::function<void(std::span<uint32_t>)>& allowed);

  struct Counts {
    int64_t batches = 0;  // forward_batch_sample calls of more than one session
    int64_t rows = 0;     // the sessions stepped in them
    int64_t sampled = 0;  // of those rows, the ones drawn in the batch (step_sample's: their token came back)
    int64_t largest = 0;  // the most sessions in one
  };
  Counts counts() const;

 private:
  struct Result {
    std::vector<float> logits;  // step()'s
    int32_t token = -1;         // step_sample()'s
  };
  struct Step {
    Session* session;
    int32_t token;
    Sampler* sampler = nullptr;  // null: step()
    std::span<const int32_t> history;
    const std::function<void(std::span<uint32_t>)>* allowed = nullptr;  // (the caller's, alive while it waits)
    std::promise<Result> done;
  };
  Result queue(Step s);
  void loop();
  void run_steps(std::vector<Step>& steps);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> jobs_;
  std::vector<Step> steps_;
  size_t expected_ = 0;  // the sessions of the last batch: the next one waits a little for those still sampling
  bool quit_ = false;
  Counts counts_;
  std::thread thread_;  // (last: started once the members above exist)
};

// A Session made, called and destroyed on the engine thread, for a generation running on another thread (a request's
// handler): each call waits for the engine thread; its one-token forwards go through EngineThread::step, and its
// one-token forward_sample / forward_sample_masked through EngineThread::step_sample (drawn on the engine thread, in
// the batch), so that generations running at once share their decode steps. forward() of more than kPrefillPiece
// tokens runs as pieces of that many, a call each (chunked prefill: a batch of the others' steps between two pieces),
// under a checkpoint taken first, so that a stop (set_prefill_stop) or an error in any piece puts the session back as
// before the call, as one call would. A sampling call of several tokens (a prompt) goes the same way, its last piece
// the real session's forward_sample / forward_sample_masked on the engine thread: the first token is drawn where the
// logits are (on the GPU only it comes back), the sampler and the mask used there while the caller waits, as in
// step_sample.
class QueuedSession : public Session {
 public:
  // A piece's tokens: at V4-Flash's size about a tenth of a second of prefill on one H200 (43 layers), the longest the
  // others' steps wait for it.
  static constexpr size_t kPrefillPiece = 512;
  QueuedSession(EngineThread& thread, const Engine& engine);
  ~QueuedSession() override;
  std::vector<float> forward(std::span<const int32_t> tokens) override;
  std::vector<float> forward_all(std::span<const int32_t> tokens) override;
  int32_t forward_sample(std::span<const int32_t> tokens, Sampler& sampler, std::span<const int32_t> history) override;
  int32_t forward_sample_masked(std::span<const int32_t> tokens, Sampler& sampler, std::span<const int32_t> history,
                                const std::function<void(std::span<uint32_t> allowed)>& allowed) override;
  void set_prefill_progress(std::function<void(int64_t, int64_t)> fn) override;
  std::function<bool()> set_prefill_stop(std::function<bool()> should_stop) override;
  std::shared_ptr<const SessionCheckpoint> checkpoint() const override;
  void restore(const SessionCheckpoint& cp) override;
  void reserve(int64_t positions) override;
  int64_t position() const override { return real_->position(); }  // (its calls all come from the thread that asks)
  void reset() override;
  const ModelInfo& info() const override { return real_->info(); }

 private:
  void in_pieces(std::span<const int32_t> tokens, const std::function<void(std::span<const int32_t>)>& last);
  void check_vocab(const Sampler& sampler, const char* call) const;
  EngineThread& thread_;
  std::unique_ptr<Session> real_;
};

}  // namespace plumb::server
