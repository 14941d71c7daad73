// `plumb chat [-m DIR]`: a multi-turn conversation on one Session. The cache is kept between turns, so each
// turn prefills only its own tokens (the reply's closing EOS, the user turn, the assistant opening), never the
// history. Commands: /undo, /retry, /reset, /stats, /save FILE, /load FILE, /quit, /help. Works on a terminal and on
// piped stdin.
// Each turn starts from a session checkpoint (Session::checkpoint): /undo and /retry go back to it, and so does a
// turn that fails after its tokens were fed. The last --undo-depth turns' checkpoints are kept, so /undo can take
// back one turn after another (each checkpoint stays valid: going back to a later one never rewinds below an
// earlier one).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <optional>

#include <fmt/format.h>

#include "cli/chat_transcript.h"
#include "cli/commands.h"
#include "cli/input_options.h"
#include "cli/progress.h"
#include "plumb/check.h"

namespace plumb::cli {

namespace {
// Ctrl-C while a reply streams stops that reply (GenerateOptions::should_stop), not the chat; while the message
// prefills it stops the prefill and the message is not sent (the session is put back); at the prompt it ends the
// program as usual. The handler is installed for the turn's generation only.
volatile std::sig_atomic_t g_interrupted = 0;
extern "C" void on_interrupt(int) { g_interrupted = 1; }

class InterruptStopsReply {
 public:
  // SA_RESETHAND: a second Ctrl-C (before the first is answered: the prefill asks after each layer on the CPU, after
  // each pass of --prefill-chunk tokens on the GPU) ends the program as usual;
  // SA_RESTART: the reply's writes are not cut by the signal. A process started with Ctrl-C ignored keeps that.
  InterruptStopsReply() {
    g_interrupted = 0;
    sigaction(SIGINT, nullptr, &old_);
    if (old_.sa_handler == SIG_IGN) return;
    struct sigaction sa {};
    sa.sa_handler = on_interrupt;
    sa.sa_flags = SA_RESETHAND | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
  }
  ~InterruptStopsReply() { sigaction(SIGINT, &old_, nullptr); }
  InterruptStopsReply(const InterruptStopsReply&) = delete;
  InterruptStopsReply& operator=(const InterruptStopsReply&) = delete;
  static bool interrupted() { return g_interrupted != 0; }

 private:
  struct sigaction old_ {};
};

struct ChatCliOptions {
  ModelArgs model;
  GenArgs gen;
  ChatModeArgs mode;
  JsonArgs json;
  std::string load;  // --load FILE: a conversation /save wrote, to go on with
  int undo_depth = 8;  // --undo-depth N: the turns /undo can take back, one session checkpoint kept for each
};

struct TurnStats {
  int64_t prefill = 0, generated = 0;
  double prefill_s = 0, decode_s = 0;
  StopReason stop = StopReason::Token;
  bool loaded = false;  // the "turn" was /load's prefill of a transcript
};

class ChatLoop {
 public:
  ChatLoop(const ChatCliOptions& o, const JsonFormat& json, LoadedModel m) : o_(o), m_(std::move(m)), tok_(*m_.tok) {
    session_ = m_.engine->new_session();
    require_chat_tokens(tok_);
    gopt_ = generate_options(o_.gen, m_, seed_);
    json.apply(gopt_);
    eos_ = tok_.token_id(chat_turn_end());
    reset();
  }

  int run() {
    const bool tty = isatty(0);
    if (!o_.model.quiet)
      fmt::print(stderr, "plumb chat: {} ({} mode, {}). Commands: /undo /retry /reset /stats /save FILE /load FILE /quit /help\n",
                 m_.dir, o_.mode.think ? "thinking" : "chat",
                 gopt_.sampling.temperature > 0 ? fmt::format("seed {}", seed_) : std::string("greedy"));
    if (!o_.load.empty() && !load(o_.load, "--load")) return 2;  // (its error line said why)
    std::string line;
    for (;;) {
      if (tty) {
        std::fputs("> ", stdout);
        std::fflush(stdout);
      }
      if (!std::getline(std::cin, line)) break;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      const size_t first = line.find_first_not_of(" \t");
      if (first == std::string::npos) continue;
      // A command may follow blanks (" /quit" leaves, as a user typing it means); a message never starts with "/"
      // unless written "//".
      if (line[first] == '/' && line.compare(first, 2, "//") != 0) {
        if (!command(line.substr(first))) break;
        continue;
      }
      if (line[first] == '/') line.erase(first, 1);  // "//..." is a message that starts with "/"
      turn(line);
    }
    if (tty) std::fputc('\n', stdout);
    return 0;
  }

 private:
  void reset() {
    session_->reset();
    undo_.clear();
    trimmed_ = loaded_ = false;
    transcript_.clear();
    if (!o_.mode.system.empty()) transcript_.push_back({"system", o_.mode.system, ""});
    carry_.clear();
    held_.clear();
    started_ = false;
    failed_ = false;
    turns_ = 0;
    last_ = {};
    total_prefill_ = total_generated_ = 0;
  }

  // The chat format as the turns feed it (earlier reasoning kept in the cache, not dropped), for turns and /load alike.
  ChatOptions chat_options() const { return {o_.mode.think, false, true, o_.mode.effort, {}}; }

  // The loop's state before a turn, with the session's checkpoint then: what /undo and /retry go back to.
  struct TurnStart {
    std::shared_ptr<const SessionCheckpoint> cp;
    std::string user;
    int retries = 0;  // /retry's of the turn that starts here (the next one's seed offset), set as the turn ends
    std::vector<int32_t> carry;
    size_t held = 0;  // held_'s size (it only grows between turn starts)
    bool started = false;
    int turns = 0;
    size_t transcript = 0;
    TurnStats last;
    int64_t total_prefill = 0, total_generated = 0;
  };
  TurnStart turn_start(const std::string& user) const {
    return {session_->checkpoint(), user, 0, carry_, held_.size(), started_, turns_, transcript_.size(), last_,
            total_prefill_, total_generated_};
  }
  // Back to before a turn (the session restored first: if that fails, nothing else changes).
  void go_back(const TurnStart& t) {
    session_->restore(*t.cp);
    carry_ = t.carry, started_ = t.started, turns_ = t.turns, last_ = t.last;
    held_.resize(t.held);
    transcript_.resize(t.transcript);
    total_prefill_ = t.total_prefill, total_generated_ = t.total_generated;
  }

  // retry_no > 0: the turn again (after /retry's go_back), drawing with that retry's seed. Returns whether the turn
  // failed after its tokens were fed (its draws were made: a retry of it should not repeat them).
  bool turn(const std::string& user, int retry_no = 0) {
    const bool retry = retry_no > 0;
    const bool replaces = taken_back();  // (after a /retry that did not finish: its turn's entry, see below)
    if (failed_) {  // the cache holds a failed turn's tokens, which the transcript does not: no turn can follow them
      std::fprintf(stderr, "error: the last reply failed after its tokens were fed: /save FILE keeps the transcript, "
                   "/reset or /load starts a new conversation\n");
      return false;
    }
    const ChatOptions co = chat_options();
    std::string text = started_ ? std::string() : chat_prefix(o_.mode.system, co);
    text += chat_user_turn(user, o_.mode.think);
    // The previous reply's unfed tokens (its last token and the closing EOS) lead this turn's prefill.
    std::vector<int32_t> prompt = carry_;
    const auto ids = tok_.encode(text);
    prompt.insert(prompt.end(), ids.begin(), ids.end());
    GenerateOptions g = gopt_;
    g.history_before = held_;  // (the penalties see the conversation, as if it were all this turn's prompt)
    // Reproducible per turn, not the same draws every turn, nor on each /retry of one (counted where a turn ends).
    g.sampling.seed = seed_ + uint64_t(turns_) + kRetrySeedStep * uint64_t(retry_no);
    const char* what = retry ? "the retry" : "the turn";
    std::optional<TurnStart> start;
    bool newline = true;
    GenerateResult r;
    const int64_t before = session_->position();
    try {
      start = turn_start(user);
      const InterruptStopsReply ctrl_c;
      g.should_stop = &InterruptStopsReply::interrupted;
      PrefillLine prefill(*session_, o_.model.quiet);  // (a long message's passes, on a terminal)
      r = generate(*session_, tok_, prompt, g, [&](std::string_view s) {
        prefill.done();
        std::fwrite(s.data(), 1, s.size(), stdout);
        std::fflush(stdout);
        newline = s.back() == '\n';
      });
    } catch (const Error& e) {
      if (!newline) std::fputc('\n', stdout);  // (a reply cut by the error: the error on a line of its own)
      std::fflush(stdout);
      std::fprintf(stderr, "error: %s\n", e.what());
      // An error before the session was touched (a turn past the context) leaves the conversation as it was. One
      // after (a backend failure, logits without a finite value) may have written the caches, even inside a pass
      // that did not count its tokens: the turn's checkpoint puts them back (should that fail, the chat cannot go on).
      bool fed = false;
      if (start) {
        fed = session_->position() != before;
        try {
          go_back(*start);
          if (fed || retry)
            std::fprintf(stderr, "(%s was taken back: the conversation is as it was before it%s)\n", what,
                         retry ? "; the last turn stays taken back: /retry draws it again" : "");
        } catch (const Error& e2) {
          failed_ = true;
          std::fprintf(stderr, "error: %s\n(the conversation cannot go on: /save FILE keeps the transcript, /reset or "
                       "/load starts a new one)\n", e2.what());
        }
      } else if (session_->position() > 0) {
        std::fprintf(stderr, "(use /reset to start a new conversation)\n");
      }
      return fed;
    }
    if (!newline) std::fputc('\n', stdout);
    std::fflush(stdout);
    if (r.stop == StopReason::Cancelled && r.tokens.empty()) {  // stopped while prefilling: the session is as before
      if (retry)
        std::fprintf(stderr, "(retry stopped: Ctrl-C during its prefill; the last turn stays taken back: /retry draws it again)\n");
      else
        std::fprintf(stderr, "(message not sent: Ctrl-C stopped its prefill; the conversation is as it was)\n");
      return false;
    }
    if (r.stop == StopReason::Cancelled) std::fprintf(stderr, "(reply stopped: Ctrl-C; the conversation goes on)\n");
    started_ = true;
    ++turns_;
    held_.insert(held_.end(), prompt.begin(), prompt.end());  // (every sampled token but the unfed last one)
    held_.insert(held_.end(), r.tokens.begin(), r.tokens.end() - (r.unfed >= 0 ? 1 : 0));
    carry_.clear();
    if (r.unfed >= 0) carry_.push_back(r.unfed);
    if (r.unfed != eos_) carry_.push_back(eos_);  // a reply cut short is still closed as the format requires
    transcript_.push_back({"user", user, ""});
    transcript_.push_back(parse_reply(r.text, o_.mode.think));
    last_ = {int64_t(prompt.size()), int64_t(r.tokens.size()), r.prefill_seconds, r.decode_seconds, r.stop};
    start->retries = retry_no;
    // (After a /retry that did not finish, the taken-back turn's start is this turn's: the one entry stands for both.)
    if (replaces) undo_.pop_back();
    undo_.push_back(std::move(*start));
    if (int(undo_.size()) > o_.undo_depth) undo_.erase(undo_.begin()), trimmed_ = true;  // (the oldest checkpoint goes)
    total_prefill_ += last_.prefill;
    total_generated_ += last_.generated;
    if (r.stop == StopReason::Context)
      std::fprintf(stderr, "(the context is full: /undo takes the last turn back, /reset starts a new conversation)\n");
    return false;
  }

  // Returns false to quit.
  bool command(const std::string& line) {
    const size_t sp = line.find_first_of(" \t");
    const std::string cmd = line.substr(0, sp);
    const size_t a = sp == std::string::npos ? std::string::npos : line.find_first_not_of(" \t", sp);
    std::string arg = a == std::string::npos ? "" : line.substr(a);
    while (!arg.empty() && (arg.back() == ' ' || arg.back() == '\t')) arg.pop_back();
    if (cmd == "/quit" || cmd == "/exit") return false;
    if (cmd == "/reset") {
      reset();
      fmt::print("(conversation reset)\n");
    } else if (cmd == "/undo" || cmd == "/retry") {
      undo_or_retry(cmd == "/retry");
    } else if (cmd == "/stats") {
      stats();
    } else if (cmd == "/save") {
      save(arg);
    } else if (cmd == "/load") {
      load(arg);
    } else if (cmd == "/help") {
      fmt::print("Ctrl-C       while a reply streams: stop that reply; while a message prefills: take it back\n"
                 "             (at the prompt: leave)\n"
                 "/undo        take back the last turn (your message and its reply); again: the one before it\n"
                 "             (the last {}, --undo-depth)\n"
                 "/retry       draw the last reply again (the next seed; greedy gives the same reply)\n"
                 "/reset       start a new conversation (clears the cache)\n"
                 "/stats       tokens prefilled and generated (last turn and totals), speeds\n"
                 "/save FILE   write the transcript as JSON messages\n"
                 "/load FILE   go on with a conversation /save wrote (its messages replace this one's)\n"
                 "/quit        leave (also /exit, or end of input)\n"
                 "//TEXT       send the message /TEXT (a message that starts with a slash)\n",
                 count_text(o_.undo_depth, "turn"));
    } else {
      std::fflush(stdout);
      fmt::print(stderr, "error: unknown command {} (/help lists them; a message that starts with / is written //...)\n", cmd);
    }
    std::fflush(stdout);
    return true;
  }

  // /undo: back to the last turn's start (again: to the one before it, while checkpoints are kept). /retry: back to
  // the last turn's start, then the turn again with its next retry's seed; a retry that does not finish (Ctrl-C in
  // its prefill, an error) leaves the turn taken back, and /retry can draw it again (/undo then takes back the turn
  // before it).
  void undo_or_retry(bool retry) {
    const char* cmd = retry ? "/retry" : "/undo";
    if (failed_) {
      fmt::print(stderr, "error: {}: the last reply failed and could not be taken back (/save FILE keeps the transcript; "
                 "/reset or /load starts over)\n", cmd);
      return;
    }
    // Why no (earlier) turn is kept: none yet, or the ones before were let go (--undo-depth) or came with a /load.
    auto why_none = [&] {
      if (turns_ == 0) return std::string("none yet");
      std::string w = trimmed_ ? fmt::format("--undo-depth keeps the last {}", count_text(o_.undo_depth, "turn")) : "";
      if (loaded_) w += std::string(w.empty() ? "" : "; ") + "none before a /load";
      return w.empty() ? std::string("none kept") : w;
    };
    bool earlier = false;  // the last turn was taken back already (an unfinished /retry): /undo goes to the one before
    if (!retry && taken_back()) {  // (its entry goes: the session is at its start already)
      if (undo_.size() < 2) {
        fmt::print(stderr, "error: /undo: no earlier turn to take back ({}); the last one is taken back already: /retry "
                   "draws its reply again\n", why_none());
        return;
      }
      undo_.pop_back();
      earlier = true;
    }
    if (undo_.empty()) {
      fmt::print(stderr, "error: {}: no turn to {} ({}; /reset starts over)\n", cmd, retry ? "draw again" : "take back", why_none());
      return;
    }
    const TurnStart t = undo_.back();
    try {
      go_back(t);
    } catch (const Error& e) {
      fmt::print(stderr, "error: {}: {}\n", cmd, e.what());
      return;
    }
    undo_.pop_back();
    if (!retry) {
      fmt::print("(took back {}; the conversation is as it was before it)\n",
                 earlier ? "the turn before the one taken back already" : "the last turn");
      return;
    }
    std::fflush(stdout);
    fmt::print(stderr, "(drawing the reply again)\n");
    const size_t kept = undo_.size();
    const bool drawn = turn(t.user, t.retries + 1);
    if (undo_.size() == kept) {  // it did not finish: the turn stays taken back (taken_back()) and can be retried
      TurnStart back = t;
      if (drawn) back.retries = t.retries + 1;  // (its draws were made: the next /retry takes the next seed)
      undo_.push_back(std::move(back));
    }
  }

  // /load FILE (and --load): a conversation /save wrote becomes this chat's. Its messages are rendered in the chat
  // format as the turns feed them (earlier reasoning kept) and prefilled on a new session, which replaces this one
  // only once the whole transcript is in: a bad file, a Ctrl-C during the prefill or an error leave the conversation
  // as it was. Returns whether it loaded.
  bool load(const std::string& path, const char* what = "/load") {
    std::vector<ChatMessage> msgs;
    if (const std::string why = read_transcript(path, o_.mode.think, msgs); !why.empty()) {
      fmt::print(stderr, "error: {}: {}\n", what, why);
      return false;
    }
    const std::vector<int32_t> ids = tok_.encode(encode_chat(msgs, chat_options()));
    const int64_t ctx = m_.engine->info().max_positions;
    if (ctx > 0 && int64_t(ids.size()) >= ctx) {  // (the next turn needs room too)
      fmt::print(stderr, "error: {}: {} is {} in the chat format; the model's context is {} tokens\n", what, path,
                 count_text(int64_t(ids.size()), "token"), ctx);
      return false;
    }
    std::unique_ptr<Session> fresh = m_.engine->new_session();
    const auto t0 = std::chrono::steady_clock::now();
    try {
      const InterruptStopsReply ctrl_c;
      fresh->set_prefill_stop(&InterruptStopsReply::interrupted);
      PrefillLine prefill(*fresh, o_.model.quiet);
      fresh->forward(ids);
    } catch (const Stopped&) {
      fmt::print(stderr, "(not loaded: Ctrl-C stopped its prefill; the conversation is as it was)\n");
      return false;
    } catch (const Error& e) {
      fmt::print(stderr, "error: {}: prefilling {}: {}\n", what, path, e.what());
      return false;
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    session_ = std::move(fresh);
    undo_.clear();
    trimmed_ = false, loaded_ = true;
    failed_ = false;
    transcript_ = std::move(msgs);
    carry_.clear();  // (the rendering closes the last reply with its EOS)
    held_ = ids;
    started_ = true;
    turns_ = int(std::count_if(transcript_.begin(), transcript_.end(), [](const ChatMessage& m) { return m.role == "assistant"; }));
    last_ = {int64_t(ids.size()), 0, secs, 0, StopReason::Token, true};
    total_prefill_ = int64_t(ids.size()), total_generated_ = 0;
    fmt::print("loaded {} from {} ({} prefilled)\n", count_text(int64_t(transcript_.size()), "message"), path,
               count_text(int64_t(ids.size()), "token"));
    std::fflush(stdout);
    return true;
  }
  void stats() {
    const ModelInfo& info = m_.engine->info();
    if (turns_ == 0) {
      fmt::print("no turn yet; session: {} tokens cached (context {})\n", session_->position(), info.max_positions);
      return;
    }
    if (last_.loaded)
      fmt::print("last turn: /load of a transcript, prefill tokens: {}, prefill {:.1f} tok/s\n", last_.prefill,
                 double(last_.prefill) / std::max(last_.prefill_s, 1e-9));
    else
      fmt::print("last turn: prefill tokens: {}, generated tokens: {} ({}), {}\n", last_.prefill, last_.generated,
                 stop_reason_name(last_.stop), rates_text(last_.prefill, last_.prefill_s, last_.generated, last_.decode_s));
    fmt::print("session: {}, {} cached (context {}), prefill tokens total: {}, generated tokens total: {}, {}\n",
               count_text(turns_, "turn"), count_text(session_->position(), "token"), info.max_positions, total_prefill_,
               total_generated_, gopt_.sampling.temperature > 0 ? fmt::format("seed {}", seed_) : std::string("greedy"));
  }

  void save(const std::string& path) {
    // An error line like any other, but the conversation goes on (the transcript is still there to save elsewhere).
    if (const std::string why = write_transcript(path, {m_.dir, o_.mode.think, seed_, transcript_}); !why.empty()) {
      fmt::print(stderr, "error: /save: {}\n", why);
      return;
    }
    fmt::print("saved {} messages to {}\n", transcript_.size(), path);
  }

  const ChatCliOptions& o_;
  LoadedModel m_;
  const Tokenizer& tok_;
  std::unique_ptr<Session> session_;
  GenerateOptions gopt_;
  uint64_t seed_ = 0;
  int32_t eos_ = -1;
  std::vector<ChatMessage> transcript_;
  std::vector<int32_t> carry_;
  std::vector<int32_t> held_;  // the tokens the session holds, in order: what the penalties see before a turn's prompt
  bool started_ = false;
  bool failed_ = false;  // a turn failed after feeding the session and its checkpoint could not be restored (turn())
  std::vector<TurnStart> undo_;  // the last turns' starts, oldest first (/undo, /retry), at most --undo-depth
  bool trimmed_ = false;         // undo_ let its oldest entries go (--undo-depth)
  bool loaded_ = false;          // the conversation began with a /load (no entries for its turns)
  // A /retry did not finish: the last turn is taken back already (the session is at undo_'s last start; after a turn
  // that finished it is past it, every turn feeding tokens), and /retry may draw it again.
  bool taken_back() const { return !undo_.empty() && session_->position() == undo_.back().cp->position(); }
  static constexpr uint64_t kRetrySeedStep = 1000003;  // each /retry's seed: + this (a turn's: the session seed + its number)
  int turns_ = 0;
  TurnStats last_;
  int64_t total_prefill_ = 0, total_generated_ = 0;
};

}  // namespace

void register_chat(CLI::App& app) {
  auto o = std::make_shared<ChatCliOptions>();
  auto* cmd = app.add_subcommand("chat", "Interactive multi-turn chat; the cache is kept between turns (default model: "
                                         "the bundled models/tiny)");
  add_model_options(cmd, o->model);
  add_chat_mode_options(cmd, o->mode, "system prompt", "thinking mode: each reply opens with <think>");
  add_sampling_options(cmd, o->gen);
  add_json_options(cmd, o->json, "each reply is");
  cmd->add_option("--load", o->load, "go on with a conversation /save wrote (as /load FILE)")->check(CLI::ExistingFile);
  cmd->add_option("--undo-depth", o->undo_depth,
                  "turns /undo can take back, one after another; each keeps a session checkpoint in host memory "
                  "(V4-Flash: ~22 MB, ~66 MB with the GPU's cuda.fast)")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000));
  cmd->callback([o] {
    check_generate_options(o->gen.gen);  // before the load: a bad option should not wait for it
    const JsonFormat json = json_format(o->json, o->mode.think);
    ChatLoop loop(*o, json, load_model(o->model));
    set_exit_code(loop.run());
  });
}

}  // namespace plumb::cli
