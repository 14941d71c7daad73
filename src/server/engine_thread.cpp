// The engine thread (engine_thread.h): its queue of calls, the gathering of sessions' one-token steps into
// forward_batch calls, and QueuedSession.
#include "server/engine_thread.h"

#include <algorithm>
#include <chrono>
#include <string_view>

namespace plumb::server {

namespace {
// How long a batch waits for the sessions of the batch before it that have not sent their next step yet (they sample
// their rows and stream their text meanwhile, ~1 ms at a 129K vocabulary): long enough to catch them, short against a
// step.
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

std::vector<float> EngineThread::step(Session& session, int32_t token) {
  std::future<std::vector<float>> f;
  {
    std::lock_guard<std::mutex> lock(mu_);
    steps_.push_back(Step{&session, token, {}});
    f = steps_.back().done.get_future();
  }
  cv_.notify_one();
  return f.get();
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

// One forward_batch for every waiting step (one alone is a plain forward). A refusal (a token or a position one
// session cannot take: forward_batch checks every session before it feeds any) runs each step alone, so that only its
// own caller gets the error; a failure of the computation itself goes to every caller, each session left as an error
// of its own forward would leave it.
void EngineThread::run_steps(std::vector<Step>& steps) {
  auto alone = [](Step& s) {
    try {
      s.done.set_value(s.session->forward(std::span<const int32_t>(&s.token, 1)));
    } catch (...) {
      s.done.set_exception(std::current_exception());
    }
  };
  if (steps.size() == 1) return alone(steps[0]);
  std::vector<Session*> sessions;
  std::vector<int32_t> tokens;
  std::vector<int64_t> before;
  for (const Step& s : steps) sessions.push_back(s.session), tokens.push_back(s.token), before.push_back(s.session->position());
  try {
    const std::vector<float> all = forward_batch(sessions, tokens);
    const size_t vocab = all.size() / steps.size();
    for (size_t i = 0; i < steps.size(); ++i)
      steps[i].done.set_value(std::vector<float>(all.begin() + std::ptrdiff_t(i * vocab), all.begin() + std::ptrdiff_t((i + 1) * vocab)));
    std::lock_guard<std::mutex> lock(mu_);
    ++counts_.batches;
    counts_.rows += int64_t(steps.size());
    counts_.largest = std::max(counts_.largest, int64_t(steps.size()));
  } catch (const Error& e) {
    bool fed = false;
    for (size_t i = 0; i < steps.size(); ++i) fed = fed || steps[i].session->position() != before[i];
    const bool refused = !fed && std::string_view(e.what()).starts_with("forward_batch: ");
    for (Step& s : steps)
      if (refused) alone(s);
      else s.done.set_exception(std::current_exception());
  } catch (...) {
    for (Step& s : steps) s.done.set_exception(std::current_exception());
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

std::vector<float> QueuedSession::forward(std::span<const int32_t> tokens) {
  if (tokens.size() == 1) return thread_.step(*real_, tokens[0]);
  std::vector<float> out;
  if (tokens.size() <= kPrefillPiece) {
    thread_.run([&] { out = real_->forward(tokens); });
    return out;
  }
  // A long prompt in pieces, one call each, so that the other generations' steps run between them (chunked prefill).
  // The call stays one call: a stop or an error in any piece puts the session back where it was before the first.
  std::shared_ptr<const SessionCheckpoint> before;
  thread_.run([&] { before = real_->checkpoint(); });
  try {
    for (size_t at = 0; at < tokens.size(); at += kPrefillPiece) {
      const auto piece = tokens.subspan(at, std::min(kPrefillPiece, tokens.size() - at));
      thread_.run([&] { out = real_->forward(piece); });
    }
  } catch (...) {
    try {
      thread_.run([&] { real_->restore(*before); });
    } catch (...) {  // (the session's own error says it could not be put back: its next call is refused)
    }
    throw;
  }
  return out;
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
