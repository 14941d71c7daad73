// The public Engine/Session API over the internal Model (the CPU reference backend or the CUDA forward pass).
#include "plumb/engine.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "core/notice.h"
#include "core/parallel.h"
#include "generate/token_bits.h"
#include "model/model.h"
#include "patches/registry.h"
#include "plumb/text.h"

namespace plumb {

int32_t Session::forward_sample(std::span<const int32_t> tokens, Sampler& sampler, std::span<const int32_t> history) {
  std::vector<float> logits = forward(tokens);
  PLUMB_CHECK(int64_t(logits.size()) == sampler.vocab(), "forward_sample: a sampler for a vocabulary of {} given {} logits",
              sampler.vocab(), logits.size());
  return sampler.sample(logits, history);
}

int32_t Session::forward_sample_masked(std::span<const int32_t> tokens, Sampler& sampler, std::span<const int32_t> history,
                                       const std::function<void(std::span<uint32_t>)>& allowed) {
  if (!allowed) return forward_sample(tokens, sampler, history);
  std::vector<float> logits = forward(tokens);
  PLUMB_CHECK(int64_t(logits.size()) == sampler.vocab(), "forward_sample_masked: a sampler for a vocabulary of {} given {} "
              "logits", sampler.vocab(), logits.size());
  return gen::sample_masked(sampler, logits, history, allowed);
}

std::shared_ptr<const SessionCheckpoint> Session::checkpoint() const {
  fail("checkpoint: this Session takes no checkpoints (only the library's sessions do: Engine::new_session)");
}
void Session::restore(const SessionCheckpoint&) {
  fail("restore: this Session takes no checkpoints (only the library's sessions do: Engine::new_session)");
}

namespace {

std::atomic<uint64_t> g_session_ids{0};

// An exception's message: `e`'s, or (null) the one being handled.
std::string message(std::exception_ptr e) {
  try {
    if (e) std::rethrow_exception(e);
    throw;
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an exception that is no std::exception";
  }
}

class ModelSession : public Session {
 public:
  ModelSession(std::shared_ptr<const Model> m, std::shared_ptr<const ModelInfo> info, int chunk)
      : m_(std::move(m)), info_(std::move(info)), st_(m_->new_state()), chunk_(chunk) {}
  std::vector<float> forward(std::span<const int32_t> tokens) override {
    const CallScope call(*this, "forward");
    check(tokens);
    return guarded(tokens.size(), [&] {
      const auto ps = feed_all_but_last(tokens);
      return std::move(m_->forward(st_, ps.back(), nullptr, LogitRows::Last, layer_report(ps, ps.size() - 1, tokens.size())).data);
    });
  }
  std::vector<float> forward_all(std::span<const int32_t> tokens) override {
    const CallScope call(*this, "forward_all");
    check(tokens);
    return guarded(tokens.size(), [&] {
      std::vector<float> out;
      const auto ps = pieces(tokens);
      for (size_t i = 0; i < ps.size(); ++i) {
        const Tensor l = m_->forward(st_, ps[i], nullptr, LogitRows::All, layer_report(ps, i, tokens.size()));
        out.insert(out.end(), l.data.begin(), l.data.end());
        if (i + 1 < ps.size()) report(ps, i, tokens.size());
      }
      return out;
    });
  }
  int32_t forward_sample(std::span<const int32_t> tokens, Sampler& sampler, std::span<const int32_t> history) override {
    return sample_call("forward_sample", tokens, sampler, history, nullptr);
  }
  int32_t forward_sample_masked(std::span<const int32_t> tokens, Sampler& sampler, std::span<const int32_t> history,
                                const TokenFilter& allowed) override {
    return sample_call("forward_sample_masked", tokens, sampler, history, &allowed);
  }
  void set_prefill_progress(std::function<void(int64_t, int64_t)> fn) override {
    not_in_call("set_prefill_progress");
    progress_ = std::move(fn);
  }
  std::function<bool()> set_prefill_stop(std::function<bool()> fn) override {
    not_in_call("set_prefill_stop");
    return std::exchange(stop_, std::move(fn));
  }
  void reserve(int64_t positions) override {
    not_in_call("reserve");
    m_->reserve(st_, positions);
  }
  int64_t position() const override { return st_.pos; }
  void reset() override {
    not_in_call("reset");
    st_ = m_->new_state();
    broken_.clear();
    rewound(0);
  }
  std::shared_ptr<const SessionCheckpoint> checkpoint() const override {
    not_in_call("checkpoint");
    usable();
    auto cp = std::make_shared<Checkpoint>();
    cp->session = id_, cp->serial = ++serial_, cp->mark = m_->mark(st_);
    return cp;
  }
  void restore(const SessionCheckpoint& base) override {
    not_in_call("restore");
    const auto* cp = dynamic_cast<const Checkpoint*>(&base);
    PLUMB_CHECK(cp && cp->session == id_, "restore: the checkpoint (at position {}) is another session's", base.position());
    for (const auto& [serial, pos] : rewinds_)
      PLUMB_CHECK(serial < cp->serial || pos >= cp->mark.pos, "restore: the checkpoint at position {} was left behind when "
                  "the session went back to position {} (a reset(), a restore or a stopped call): the positions after that "
                  "were fed anew", cp->mark.pos, pos);
    try {
      m_->rollback(st_, cp->mark);
    } catch (...) {  // (part way: the session is neither here nor there until a restore() or reset() succeeds)
      broken_ = fmt::format("restoring the checkpoint at position {}: {}", cp->mark.pos, message(nullptr));
      throw;
    }
    broken_.clear();
    rewound(cp->mark.pos);
  }
  const ModelInfo& info() const override { return *info_; }

  // plumb::forward_batch: every session checked (as forward() checks its own call) before the one pass; a session
  // given twice, Model::forward_batch refuses.
  static std::vector<float> forward_batch(std::span<Session* const> sessions, std::span<const int32_t> tokens) {
    std::vector<float> out;
    in_batch(sessions, tokens, [&](const Model& m, std::span<SessionState* const> states) { out = std::move(m.forward_batch(states, tokens).data); });
    return out;
  }
  static void forward_batch_sample(std::span<Session* const> sessions, std::span<BatchRow> rows) {
    in_batch(sessions, batch_tokens(rows), [&](const Model& m, std::span<SessionState* const> states) { m.forward_batch_sample(states, rows); });
  }

 private:
  // The sessions of a batch checked, each marked in a call while `pass` runs on their states.
  template <class F>
  static void in_batch(std::span<Session* const> sessions, std::span<const int32_t> tokens, F&& pass) {
    const size_t b = sessions.size();
    PLUMB_CHECK(b > 0 && tokens.size() == b, "forward_batch: {} sessions and {} tokens (one token per session, at least one)",
                b, tokens.size());
    std::vector<ModelSession*> ms(b);
    std::vector<SessionState*> states(b);
    for (size_t i = 0; i < b; ++i) {
      ms[i] = dynamic_cast<ModelSession*>(sessions[i]);
      PLUMB_CHECK(ms[i], "forward_batch: session {} of {} is {}", i, b,
                  sessions[i] ? "not one of the library's (Engine::new_session)" : "null");
      PLUMB_CHECK(ms[i]->m_ == ms[0]->m_, "forward_batch: sessions 0 and {} belong to different engines", i);
      ms[i]->not_in_call("forward_batch");
      ms[i]->usable();
      try {
        ms[i]->check(tokens.subspan(i, 1));
      } catch (const Error& e) {
        fail("forward_batch: session {} of {}: {}", i, b, e.what());
      }
      states[i] = &ms[i]->st_;
    }
    for (ModelSession* m : ms) m->in_call_ = true;
    struct Leave {
      std::vector<ModelSession*>& ms;
      ~Leave() {
        for (ModelSession* m : ms) m->in_call_ = false;
      }
    } leave{ms};
    pass(*ms[0]->m_, std::span<SessionState* const>(states));
  }

  std::shared_ptr<const Model> m_;
  std::shared_ptr<const ModelInfo> info_;  // shared with the engine (a session may outlive it)
  SessionState st_;
  int chunk_;
  std::function<void(int64_t, int64_t)> progress_;
  std::function<bool()> stop_;
  bool in_call_ = false;  // a forward is running: its callbacks may not call the session (their pass is half done)
  std::string broken_;    // why the session could not be put back after an error ("": it is usable)

  // The session's own calls while one runs (from its progress or stop function) would act on a pass half done, or
  // destroy the function running: refused by name.
  void not_in_call(const char* what) const {
    PLUMB_CHECK(!in_call_, "Session::{} called from inside a call's progress or stop function (the call is half done)", what);
  }
  struct CallScope {
    ModelSession& s;
    CallScope(ModelSession& session, const char* what) : s(session) {
      s.not_in_call(what);
      s.usable();
      s.in_call_ = true;
    }
    ~CallScope() { s.in_call_ = false; }
    CallScope(const CallScope&) = delete;
    CallScope& operator=(const CallScope&) = delete;
  };
  void usable() const {
    PLUMB_CHECK(broken_.empty(), "the session could not be put back after an error ({}): reset() it, or restore() a "
                "checkpoint", broken_);
  }

  // Checkpoints: each names its session and where it sits among the timeline's events (serial); each time the
  // session goes back (reset, restore, a stopped call), the position it went back to is kept, and a checkpoint made
  // before a rewind below its position is refused (the entries it counts were fed anew).
  struct Checkpoint : SessionCheckpoint {
    uint64_t session = 0;
    int64_t serial = 0;
    StateMark mark;
    int64_t position() const override { return mark.pos; }
  };
  const uint64_t id_ = ++g_session_ids;
  mutable int64_t serial_ = 0;
  // (serial, position gone back to), positions increasing: a rewind makes the earlier ones at or past its position
  // redundant (a checkpoint they would refuse, it refuses too), so a reset() empties the list but for itself.
  std::vector<std::pair<int64_t, int64_t>> rewinds_;
  void rewound(int64_t pos) {
    while (!rewinds_.empty() && rewinds_.back().second >= pos) rewinds_.pop_back();
    rewinds_.push_back({++serial_, pos});
  }

  // Runs a call's passes so that a stop, or any exception from them (the progress function's, a backend's), leaves
  // the session as it was before the call: with a stop or progress function set, a multi-token call with points
  // inside it (backend cpu: after each layer; cuda: between passes) marks the session first (Model::mark) and rolls
  // it back. (On the GPU a call of one pass has no such point: no mark, whose device copy would cost a sync.)
  // `all_fed` (optional): true where an exception comes after every token was fed, which then keeps them.
  template <class F>
  auto guarded(size_t n, F&& passes, const std::function<bool()>& all_fed = {}) -> decltype(passes()) {
    if (n < 2 || !watched()) return passes();
    ask_stop(0, int64_t(n));  // (nothing fed yet: nothing to put back)
    if (m_->backend() == "cuda" && (chunk_ <= 0 || n <= size_t(chunk_))) return passes();
    const StateMark mark = m_->mark(st_);
    try {
      return passes();
    } catch (...) {
      if (all_fed && all_fed()) throw;
      const std::exception_ptr first = std::current_exception();
      try {
        m_->rollback(st_, mark);
        rewound(mark.pos);
      } catch (...) {
        broken_ = fmt::format("{}; then, putting the session back: {}", message(first), message(nullptr));
      }
      throw;
    }
  }
  bool watched() const { return progress_ || stop_; }  // a progress or stop function: calls have points to ask at
  void ask_stop(int64_t done, int64_t total) const {
    if (stop_ && stop_())
      throw Stopped(fmt::format("stopped after {} of the call's {} tokens (Session::set_prefill_stop): the session is as it "
                                "was before the call", done, total));
  }
  // At a reporting point (`done` of the call's `total` tokens): the progress, then the stop.
  void at_point(int64_t done, int64_t total) {
    if (progress_) progress_(done, total);
    ask_stop(done, total);
  }

  // The call's tokens before pass i: the passes are consecutive spans of the call's tokens.
  static int64_t fed_before(const std::vector<std::span<const int32_t>>& ps, size_t i) { return ps[i].data() - ps[0].data(); }
  // After pass i of `ps` (not the last): the tokens of the call fed so far.
  void report(const std::vector<std::span<const int32_t>>& ps, size_t i, size_t total) {
    if (total >= 2 && watched()) at_point(fed_before(ps, i) + int64_t(ps[i].size()), int64_t(total));
  }
  // Inside pass i (the CPU backend calls it after each layer): the passes before plus this one's share by layers, so
  // a single long pass reports too. Its last layer is not reported (the pass's end is, or the call's return).
  std::function<void(int)> layer_report(const std::vector<std::span<const int32_t>>& ps, size_t i, size_t total) {
    if (!watched() || total < 2) return {};  // (a decode step is no prefill)
    const int64_t before = fed_before(ps, i), n = int64_t(ps[i].size()), layers = m_->config().n_layers;
    return [this, before, n, layers, total](int k) {
      if (k < layers) at_point(before + n * k / layers, int64_t(total));
    };
  }

  // forward_sample(_masked): the sampler's vocabulary checked before anything is fed; on the host, Session's defaults
  // (forward() guards the feed); on the GPU the last pass and the sampling there, guarded as the other calls but for
  // the sampler's refusal of the last row (no finite logit) and an exception from `allowed`, which come once every
  // token is fed (Model::forward_sample counts them): the tokens stay fed, as on the host.
  int32_t sample_call(const char* name, std::span<const int32_t> tokens, Sampler& sampler, std::span<const int32_t> history,
                      const TokenFilter* allowed) {
    PLUMB_CHECK(sampler.vocab() == m_->config().vocab, "{}: the sampler was made for a vocabulary of {}, the model's is {}",
                name, sampler.vocab(), m_->config().vocab);
    if (m_->backend() != "cuda")
      return allowed ? Session::forward_sample_masked(tokens, sampler, history, *allowed)
                     : Session::forward_sample(tokens, sampler, history);
    const CallScope call(*this, name);
    check(tokens);
    const int64_t fed = st_.pos + int64_t(tokens.size());
    return guarded(
        tokens.size(), [&] { return m_->forward_sample(st_, feed_all_but_last(tokens).back(), sampler, history, allowed); },
        [&] { return st_.pos == fed; });
  }

  // Token ids and the context are checked before any pass runs, so an error leaves the session unchanged. (The
  // toolkit runs the model past its context on purpose, through Model; a Session does not.)
  void check(std::span<const int32_t> tokens) const {
    m_->check_tokens(st_, tokens);
    const int64_t ctx = m_->config().max_positions, end = st_.pos + int64_t(tokens.size());
    PLUMB_CHECK(ctx <= 0 || end <= ctx, "{} tokens at position {} would reach position {}, past the model's context of {} "
                "tokens (max_position_embeddings)", tokens.size(), st_.pos, end, ctx);
  }
  std::vector<std::span<const int32_t>> pieces(std::span<const int32_t> tokens) const {
    std::vector<std::span<const int32_t>> out;
    const size_t step = chunk_ > 0 ? size_t(chunk_) : tokens.size();
    for (size_t p = 0; p < tokens.size(); p += step) out.push_back(tokens.subspan(p, std::min(step, tokens.size() - p)));
    return out;
  }
  // Runs every pass but the last without logits (the LM head is skipped) and returns the passes (the last to run).
  // The tokens are checked (check()) before.
  std::vector<std::span<const int32_t>> feed_all_but_last(std::span<const int32_t> tokens) {
    const auto ps = pieces(tokens);
    for (size_t i = 0; i + 1 < ps.size(); ++i) {
      m_->forward(st_, ps[i], nullptr, LogitRows::None, layer_report(ps, i, tokens.size()));
      report(ps, i, tokens.size());
    }
    return ps;
  }
};

class ModelEngine : public Engine {
 public:
  ModelEngine(std::shared_ptr<const Model> m, int chunk) : m_(std::move(m)), chunk_(chunk) {
    const auto& c = m_->config();
    ModelInfo info;
    info.vocab_size = c.vocab;
    info.bos_token = c.bos_token;
    info.eos_token = c.eos_token;
    info.max_positions = c.max_positions;
    info.summary = c.summary();
    const DeviceForward::Memory dm = m_->device_memory();
    info.device = dm.device;
    info.device_loaded_bytes = dm.loaded, info.device_free_bytes = dm.free, info.device_total_bytes = dm.total;
    info.host_weight_bytes = dm.host;
    info_ = std::make_shared<const ModelInfo>(std::move(info));
  }
  const ModelInfo& info() const override { return *info_; }
  std::unique_ptr<Session> new_session() const override { return std::make_unique<ModelSession>(m_, info_, chunk_); }
  const std::string& dir() const override { return m_->dir(); }

 private:
  std::shared_ptr<const Model> m_;
  std::shared_ptr<const ModelInfo> info_;
  int chunk_;
};

}  // namespace

std::vector<float> forward_batch(std::span<Session* const> sessions, std::span<const int32_t> tokens) {
  return ModelSession::forward_batch(sessions, tokens);
}

void forward_batch_sample(std::span<Session* const> sessions, std::span<BatchRow> rows) {
  PLUMB_CHECK(!rows.empty() && rows.size() == sessions.size(), "forward_batch: {} sessions and {} rows (one row per session, at "
              "least one)", sessions.size(), rows.size());
  ModelSession::forward_batch_sample(sessions, rows);
}

void set_cpu_threads(int n) { set_threads(n); }
void set_notice_sink(std::function<void(std::string_view)> sink) { set_notice_sink_impl(std::move(sink)); }

std::shared_ptr<Engine> Engine::load(const std::string& dir, const EngineOptions& opt) {
  PLUMB_CHECK(opt.backend == "cpu" || opt.backend == "cuda", "unknown backend '{}' (available: {})", opt.backend, kBackends);
  PLUMB_CHECK(opt.prefill_chunk >= 0, "the prefill chunk (--prefill-chunk) must be >= 0 tokens (0: one pass), got {}",
              opt.prefill_chunk);
  const PatchSet ps = parse_patches(opt.patches);
  // One stage's (done, total) reports as LoadProgress (none without a callback).
  auto report = [&opt](const char* stage) -> std::function<void(int64_t, int64_t)> {
    if (!opt.on_progress) return {};
    return [&opt, stage](int64_t done, int64_t total) { opt.on_progress(LoadProgress{stage, done, total}); };
  };
  auto engine = std::make_shared<ModelEngine>(
      std::shared_ptr<const Model>(Model::load(dir, ps.options, report("layers"), opt.backend, report("upload"))),
      opt.prefill_chunk);
  // A fault (a deliberate bug, there for the toolkit to find) in a model that generates text is said once, after a
  // load that succeeded (a failed one is its error line alone): its outputs are wrong on purpose.
  for (const Patch* p : ps.active)
    if (p->fault)
      notice(fmt::format("warning: {} is a built-in fault, a deliberate bug for testing the precision toolkit: this model's "
                         "outputs are wrong on purpose", p->name));
  return engine;
}

}  // namespace plumb
