// The engine thread (engine_thread.h): its queue of calls, the gathering of sessions' one-token steps into
// forward_batch_sample calls, and QueuedSession.
#include "server/engine_thread.h"

#include "plumb/error.h"
#include "plumb/text.h"

#include <algorithm>
#include <chrono>
#include <string_view>

namespace plumb::server {

namespace {
// How long a batch waits for the sessions of the batch before it that have not sent their next step yet (they stream
// their text meanwhile, and a step() caller samples its row, ~1 ms at a 129K vocabulary): long enough to catch them,
// short against a step.
constexpr auto kGather = std::chrono::microseconds(2000);
}  // namespace

EngineThread::EngineThread() : thread_([this] { loop(); }) {}

EngineThread::~EngineThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    quit_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void EngineThread::run(std::function<void()> f) {
  std::packaged_task<void()> task(std::move(f));
  auto done = task.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(task));
  }
  cv_.notify_one();
  done.get();
}

EngineThread::Result EngineThread::queue(Step s) {
  std::future<Result> f = s.done.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    steps_.push_back(std::move(s));
  }
  cv_.notify_one();
  return f.get();
}

std::vector<float> EngineThread::step(Session& session, int32_t token) {
  return queue(Step{&session, token, nullptr, {}, nullptr, {}}).logits;
}

int32_t EngineThread::step_sample(Session& session, int32_t token, Sampler& sampler, std::span<const int32_t> history,
                                  const std::function<void(std::span<uint32_t>)>& allowed) {
  return queue(Step{&session, token, &sampler, history, allowed ? &allowed : nullptr, {}}).token;
}

EngineThread::Counts EngineThread::counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

// Calls and batches take turns while both wait, so neither starves the other.
void EngineThread::loop() {
  bool batch_last = false;
  for (;;) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return quit_ || !jobs_.empty() || !steps_.empty(); });
    if (!jobs_.empty() && (steps_.empty() || batch_last)) {
      std::packaged_task<void()> job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job();
      batch_last = false;
      continue;
    }
    if (!steps_.empty()) {
      const auto until = std::chrono::steady_clock::now() + kGather;
      while (steps_.size() < expected_ && jobs_.empty() && !quit_ && cv_.wait_until(lock, until) == std::cv_status::no_timeout) {
      }
      std::vector<Step> batch = std::move(steps_);
      steps_.clear();
      expected_ = batch.size();
      lock.unlock();
      run_steps(batch);
      batch_last = true;
      continue;
    }
    return;  // (quit, and nothing left)
  }
}

// One forward_batch_sample for every waiting step, a row each: step()'s without a sampler (its logits back),
// step_sample()'s with its sampler and mask (its token back); one step alone is a plain forward or forward_sample. A
// refusal (a token, a position or a sampler one session cannot take: forward_batch_sample checks every row before it
// feeds any) runs each step alone, so that only its own caller gets the error; so does a row's own failure (its
// `error`: the others stand); a failure of the computation itself goes to every caller, each session left as an error
// of its own forward would leave it.
void EngineThread::run_steps(std::vector<Step>& steps) {
  auto alone = [](Step& s) {
    try {
      const std::span<const int32_t> token(&s.token, 1);
      Result r;
      if (!s.sampler) r.logits = s.session->forward(token);
      else if (!s.allowed) r.token = s.session->forward_sample(token, *s.sampler, s.history);
      else r.token = s.session->forward_sample_masked(token, *s.sampler, s.history, *s.allowed);
      s.done.set_value(std::move(r));
    } catch (...) {
      s.done.set_exception(std::current_exception());
    }
  };
  if (steps.size() == 1) return alone(steps[0]);
  std::vector<Session*> sessions;
  std::vector<BatchRow> rows(steps.size());
  std::vector<int64_t> before;
  int64_t sampled = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    sessions.push_back(s.session), before.push_back(s.session->position());
    rows[i].token = s.token, rows[i].sampler = s.sampler, rows[i].history = s.history;
    if (s.allowed) rows[i].allowed = *s.allowed;
    sampled += s.sampler ? 1 : 0;
  }
  std::exception_ptr failed;
  bool refused = false;
  try {
    forward_batch_sample(sessions, rows);
  } catch (const Error& e) {
    failed = std::current_exception();
    bool fed = false;
    for (size_t i = 0; i < steps.size(); ++i) fed = fed || steps[i].session->position() != before[i];
    refused = !fed && std::string_view(e.what()).starts_with("forward_batch: ");
  } catch (...) {
    failed = std::current_exception();
  }
  if (failed) {
    for (Step& s : steps)
      if (refused) alone(s);
      else s.done.set_exception(failed);
    return;
  }
  {  // (counted before any caller hears back: one that returns sees its batch counted)
    std::lock_guard<std::mutex> lock(mu_);
    ++counts_.batches;
    counts_.rows += int64_t(steps.size());
    counts_.sampled += sampled;
    counts_.largest = std::max(counts_.largest, int64_t(steps.size()));
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    if (rows[i].error) steps[i].done.set_exception(rows[i].error);
    else steps[i].done.set_value(Result{std::move(rows[i].logits), rows[i].sampled});
  }
}

QueuedSession::QueuedSession(EngineThread& thread, const Engine& engine) : thread_(thread) {
  thread_.run([&] { real_ = engine.new_session(); });
}

QueuedSession::~QueuedSession() {
  try {
    thread_.run([&] { real_.reset(); });  // (its device memory freed where it was made)
  } catch (...) {
  }
}

// A prompt's call on the engine thread: `last` (the call proper) on the whole of it, or, past kPrefillPiece tokens,
// forward() on each piece but the last and `last` on that, a call each (chunked prefill: the running generations'
// steps go on between them). The call stays one call: a stop or an error in any piece puts the session back where it
// was before the first; a failure once every token is fed (the draw: a sampler's refusal, a mask's exception) leaves
// them fed, as one call does.
void QueuedSession::in_pieces(std::span<const int32_t> tokens, const std::function<void(std::span<const int32_t>)>& last) {
  if (tokens.size() <= kPrefillPiece) {
    thread_.run([&] { last(tokens); });
    return;
  }
  std::shared_ptr<const SessionCheckpoint> before;
  thread_.run([&] { before = real_->checkpoint(); });
  try {
    for (size_t at = 0; at < tokens.size(); at += kPrefillPiece) {
      const auto piece = tokens.subspan(at, std::min(kPrefillPiece, tokens.size() - at));
      if (at + piece.size() < tokens.size()) thread_.run([&] { real_->forward(piece); });
      else thread_.run([&] { last(piece); });
    }
  } catch (...) {
    if (real_->position() == before->position() + int64_t(tokens.size())) throw;
    try {
      thread_.run([&] { real_->restore(*before); });
    } catch (...) {  // (the session's own error says it could not be put back: its next call is refused)
    }
    throw;
  }
}

// A sampler for another vocabulary refused before the first piece is fed, as the library's sessions refuse it (the
// real session would only see it at the last piece, with the others fed and then put back).
void QueuedSession::check_vocab(const Sampler& sampler, const char* call) const {
  if (sampler.vocab() != real_->info().vocab_size)
    throw Error(std::string(call) + ": the sampler was made for a vocabulary of " + std::to_string(sampler.vocab()) +
                ", the model's is " + std::to_string(real_->info().vocab_size));
}

std::vector<float> QueuedSession::forward(std::span<const int32_t> tokens) {
  if (tokens.size() == 1) return thread_.step(*real_, tokens[0]);
  std::vector<float> out;
  in_pieces(tokens, [&](std::span<const int32_t> piece) { out = real_->forward(piece); });
  return out;
}

// A prompt's first token drawn by the real session (on the GPU where the logits are: only the token comes back), on
// the engine thread while the caller waits, as step_sample draws.
int32_t QueuedSession::forward_sample(std::span<const int32_t> tokens, Sampler& sampler,
                                      std::span<const int32_t> history) {
  if (tokens.size() == 1) return thread_.step_sample(*real_, tokens[0], sampler, history, {});
  check_vocab(sampler, "forward_sample");
  int32_t id = -1;
  in_pieces(tokens, [&](std::span<const int32_t> piece) { id = real_->forward_sample(piece, sampler, history); });
  return id;
}

int32_t QueuedSession::forward_sample_masked(std::span<const int32_t> tokens, Sampler& sampler,
                                             std::span<const int32_t> history,
                                             const std::function<void(std::span<uint32_t>)>& allowed) {
  if (tokens.size() == 1) return thread_.step_sample(*real_, tokens[0], sampler, history, allowed);
  check_vocab(sampler, "forward_sample_masked");
  int32_t id = -1;
  in_pieces(tokens, [&](std::span<const int32_t> piece) { id = real_->forward_sample_masked(piece, sampler, history, allowed); });
  return id;
}

std::vector<float> QueuedSession::forward_all(std::span<const int32_t> tokens) {
  std::vector<float> out;
  thread_.run([&] { out = real_->forward_all(tokens); });
  return out;
}

void QueuedSession::set_prefill_progress(std::function<void(int64_t, int64_t)> fn) {
  thread_.run([&] { real_->set_prefill_progress(std::move(fn)); });
}

std::function<bool()> QueuedSession::set_prefill_stop(std::function<bool()> should_stop) {
  std::function<bool()> before;
  thread_.run([&] { before = real_->set_prefill_stop(std::move(should_stop)); });
  return before;
}

std::shared_ptr<const SessionCheckpoint> QueuedSession::checkpoint() const {
  std::shared_ptr<const SessionCheckpoint> cp;
  thread_.run([&] { cp = real_->checkpoint(); });
  return cp;
}

void QueuedSession::restore(const SessionCheckpoint& cp) {
  thread_.run([&] { real_->restore(cp); });
}

void QueuedSession::reserve(int64_t positions) {
  thread_.run([&] { real_->reserve(positions); });
}

void QueuedSession::reset() {
  thread_.run([&] { real_->reset(); });
}

}  // namespace plumb::server
