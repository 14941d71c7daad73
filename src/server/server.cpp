// `plumb serve`'s HTTP server (server.h): routes, the generations' slots with their queue and prefix caches, and the
// event streams. Request checks and bodies are openai.cpp's.
#include "server/server.h"

#include "server/engine_thread.h"

#include <fmt/format.h>
#include <httplib.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <deque>
#include <future>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

namespace plumb::server {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string random_id(const char* prefix) {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mu);
  return fmt::format("{}{:016x}{:08x}", prefix, rng(), uint32_t(rng()));
}

void send_error(httplib::Response& res, const RequestError& e) {
  res.status = e.status;
  res.set_content(to_text(error_body(e.what(), e.type, e.param)), "application/json");
}

// A reply's tool calls as the message's tool_calls, each given an id the client answers with.
json call_ids(std::vector<ToolCall>& calls) {
  for (ToolCall& c : calls) c.id = random_id("call_");
  return tool_calls_json(calls);
}

// One server-sent event: "data: <json>\n\n".
std::string event(const json& j) { return "data: " + to_text(j) + "\n\n"; }

}  // namespace

struct Server::Impl {
  ServerOptions opt;
  httplib::Server http;
  // The model, set once by set_model(); read by the handlers only after `ready` (acquire) says it is there.
  std::shared_ptr<Engine> engine;
  std::optional<Tokenizer> tok;
  Defaults defaults;
  std::atomic<bool> ready{false};
  std::atomic<bool> entered{false};  // run() called (stop() before it must not be lost: see stop())
  std::atomic<bool> left{false};     // run() returned

  EngineThread engine_thread;        // every call on the sessions below runs there
  std::atomic<int> in_flight{0};     // requests generating or waiting to
  std::atomic<bool> stopping{false};
  // A generation's place: its session and prefix cache. One (parallel 1): the session is the engine's own, and the
  // whole generation runs on the engine thread. Several: each a QueuedSession, the generation on the request's own
  // thread, its steps batched with the others' (EngineThread::step, step_sample).
  struct Slot {
    std::unique_ptr<Session> session;
    std::vector<int32_t> fed;  // the tokens the session holds, in order
    // The last prompt but its last token (prefix cache): always the first cp->position() tokens of `fed` (taken
    // there, and the session since then only grew from it, came back to it, or dropped it with a reset).
    std::shared_ptr<const SessionCheckpoint> cp;
    bool busy = false;
    uint64_t used = 0;  // when it was last taken (the least recently used goes to a prompt no slot holds)
  };
  std::vector<Slot> slots;
  std::mutex slots_mu;  // busy, used, and the queue of requests waiting for a slot (parallel > 1)
  std::condition_variable slots_cv;
  std::deque<uint64_t> waiting;  // tickets in arrival order
  uint64_t tickets = 0, uses = 0;

  mutable std::mutex stats_mu;
  Stats stats;

  explicit Impl(ServerOptions o) : opt(std::move(o)), slots(size_t(std::max(opt.parallel, 1))) {}
  bool parallel() const { return slots.size() > 1; }
  std::unique_ptr<Session> new_session() {
    if (parallel()) return std::make_unique<QueuedSession>(engine_thread, *engine);
    return engine->new_session();
  }

  void log(const std::string& line) {
    if (opt.log) opt.log(line);
    else fmt::print(stderr, "{}\n", line);
  }

  // What the slot's session can return to for `prompt` (the prefix cache): all it holds, when that is a prefix of the
  // prompt shorter than it (generate() needs a token to feed); else its checkpoint, when that is such a prefix; else
  // nothing (length 0).
  enum class Reuse { None, Fed, Checkpoint };
  std::pair<Reuse, size_t> reusable(const Slot& sl, const std::vector<int32_t>& prompt) const {
    auto is_prefix = [&](size_t n) { return n < prompt.size() && std::equal(sl.fed.begin(), sl.fed.begin() + std::ptrdiff_t(n), prompt.begin()); };
    if (!opt.prefix_cache) return {Reuse::None, 0};
    if (!sl.fed.empty() && is_prefix(sl.fed.size())) return {Reuse::Fed, sl.fed.size()};
    if (sl.cp && is_prefix(size_t(sl.cp->position()))) return {Reuse::Checkpoint, size_t(sl.cp->position())};
    return {Reuse::None, 0};
  }

  // Puts the session at the longest prefix of `prompt` it can return to (reusable); returns its length.
  int64_t reuse(Slot& sl, const std::vector<int32_t>& prompt) {
    auto& [session, fed, cp, busy, used] = sl;
    if (!session) session = new_session();
    const auto [kind, n] = reusable(sl, prompt);
    if (kind == Reuse::Fed) return int64_t(n);
    if (kind == Reuse::Checkpoint) {
      try {
        session->restore(*cp);
        fed.resize(n);
        return int64_t(n);
      } catch (const Error&) {  // (left behind: start over below)
      }
    }
    return start_over(sl);
  }

  int64_t start_over(Slot& sl) {
    auto& [session, fed, cp, busy, used] = sl;
    if (!session) session = new_session();
    session->reset();
    fed.clear();
    cp.reset();
    return 0;
  }

  // Feeds `head` (the prompt's tokens from fed.size() on, but its last) and appends to `scored` each one's log
  // probability given the tokens before it but the first's (an echoed prompt's logprobs; nullptr: none): each
  // position's logits predict the next token, so the rows of head[0..m-1] score prompt[fed.size()+1 .. +m]. In
  // passes of kScorePass tokens (their logits come to the host: n x vocab floats), fed growing with each, so that
  // a stop part way leaves fed what the session holds.
  static constexpr size_t kScorePass = 256;
  void feed_head(Slot& sl, std::span<const int32_t> head, const std::vector<int32_t>& prompt, int top,
                 std::vector<TokenLogprob>* scored) {
    auto& [session, fed, cp, busy, used] = sl;
    if (!scored) {
      session->forward(head);
      fed.insert(fed.end(), head.begin(), head.end());
      return;
    }
    const size_t vocab = size_t(engine->info().vocab_size);
    while (!head.empty()) {
      const auto pass = head.first(std::min(head.size(), kScorePass));
      const std::vector<float> logits = session->forward_all(pass);
      for (size_t i = 0; i < pass.size(); ++i)
        scored->push_back(token_logprob(std::span(logits).subspan(i * vocab, vocab), prompt[fed.size() + i + 1], top));
      fed.insert(fed.end(), pass.begin(), pass.end());
      head = head.subspan(pass.size());
    }
  }

  struct Outcome {
    GenerateResult r;
    int64_t cached = 0;
    double seconds = 0;
  };

  // Runs one generation on the session (on the engine thread), sampling with the request's seed + `seed_offset`;
  // `score_prompt`: an echoed prompt with logprobs gets its tokens scored first. Any failure drops the session's
  // state: what it holds is then unknown, and the next request starts on an empty cache.
  Outcome generate_locked(Slot& sl, const Request& q, const std::function<void(std::string_view)>& on_text,
                          const std::function<bool()>& should_stop, std::vector<TokenLogprob>* logprobs,
                          uint64_t seed_offset, bool score_prompt) {
    auto& [session, fed, cp, busy, used] = sl;
    const auto t0 = std::chrono::steady_clock::now();
    Outcome out;
    GenerateOptions gen = q.gen;
    gen.sampling.seed += seed_offset;
    gen.should_stop = should_stop;
    if (logprobs && q.top_logprobs >= 0)
      gen.on_logits = [&](std::span<const float> logits, int32_t id) { logprobs->push_back(token_logprob(logits, id, q.top_logprobs)); };
    // An echoed prompt with logprobs is scored token by token: fed from an empty cache, whose logits it needs.
    const bool score = score_prompt && q.echo && q.top_logprobs >= 0 && logprobs;
    auto ended = [&](StopReason why) {
      out.r.stop = why;
      out.r.prompt_tokens = int64_t(q.prompt.size());
      out.seconds = seconds_since(t0);
      return out;
    };
    if (q.gen.max_tokens == 0 && !score) return ended(StopReason::Length);  // (echo alone: nothing to compute)
    try {
      out.cached = score ? start_over(sl) : reuse(sl, q.prompt);
      std::span<const int32_t> rest(q.prompt);
      rest = rest.subspan(size_t(out.cached));
      if (score) {
        TokenLogprob first;
        first.id = q.prompt[0];
        first.unscored = true;
        logprobs->push_back(first);
      }
      if ((opt.prefix_cache || score) && rest.size() > 1) {
        // All but the last prompt token, then a checkpoint there: a next prompt that shares this one but its end (a
        // retry, another choice, a thinking chat's next turn) comes back to it.
        const auto prev = session->set_prefill_stop(should_stop);
        try {
          feed_head(sl, rest.first(rest.size() - 1), q.prompt, q.top_logprobs, score ? logprobs : nullptr);
        } catch (const Stopped&) {
          session->set_prefill_stop(prev);
          return ended(StopReason::Cancelled);
        }
        session->set_prefill_stop(prev);
        if (opt.prefix_cache) cp = session->checkpoint();
        rest = rest.last(1);
      }
      if (q.gen.max_tokens == 0) return ended(StopReason::Length);  // (the prompt scored: the last token's logits did it)
      gen.history_before = fed;  // (the penalties see the cached prefix as if it had been fed with the rest)
      out.r = generate(*session, *tok, rest, gen, on_text);
      out.r.prompt_tokens = int64_t(q.prompt.size());
      if (!(out.r.stop == StopReason::Cancelled && out.r.tokens.empty())) {  // (a prefill stopped: nothing fed)
        fed.insert(fed.end(), rest.begin(), rest.end());
        fed.insert(fed.end(), out.r.tokens.begin(), out.r.tokens.end() - (out.r.unfed >= 0 ? 1 : 0));
      }
    } catch (...) {
      session.reset();
      fed.clear();
      cp.reset();
      throw;
    }
    out.seconds = seconds_since(t0);
    return out;
  }

  static RequestError shutting_down() { return RequestError(503, "server_busy", "", "the server is shutting down"); }

  // One choice of a request: its generation, its text (whole responses), its logprobs.
  struct Choice {
    Outcome o;
    std::string text;
    std::vector<TokenLogprob> lp;
  };
  static bool cancelled(const std::vector<Choice>& cs) {
    return std::any_of(cs.begin(), cs.end(), [](const Choice& c) { return c.o.r.stop == StopReason::Cancelled; });
  }

  // Every choice of a request (`qs`: a Request per prompt, n choices each, choice index = prompt * n + j) on the engine
  // thread, after the requests queued before it, into `out`; refused once stop() was asked. An echoed prompt is scored
  // by its first choice, whose scores the others copy (they start from the checkpoint it left). A cancelled choice
  // cancels those after it.
  void run_request(const std::vector<Request>& qs, std::vector<Choice>& out,
                   const std::function<void(size_t, std::string_view)>& on_text, const std::function<bool()>& should_stop,
                   bool with_logprobs) {
    const size_t n = size_t(qs.front().n);
    out.assign(qs.size() * n, {});
    auto choices = [&](Slot& sl) {
      if (stopping) throw shutting_down();
      for (size_t c = 0; c < out.size(); ++c) {
        const Request& q = qs[c / n];
        const size_t j = c % n;
        if (c > 0 && out[c - 1].o.r.stop == StopReason::Cancelled) {
          out[c].o.r.stop = StopReason::Cancelled;
          out[c].o.r.prompt_tokens = int64_t(q.prompt.size());
          continue;
        }
        const bool lp = with_logprobs && q.top_logprobs >= 0;
        if (lp && q.echo && j > 0) {
          const auto& first = out[c - j].lp;
          out[c].lp.assign(first.begin(), first.begin() + std::ptrdiff_t(std::min(first.size(), q.prompt.size())));
        }
        out[c].o = generate_locked(sl, q, [&](std::string_view s) { on_text(c, s); }, should_stop, lp ? &out[c].lp : nullptr,
                                   uint64_t(j), j == 0);
      }
    };
    if (!parallel()) return engine_thread.run([&] { choices(slots[0]); });
    const size_t k = take_slot(qs.front().prompt);
    struct Give {
      Impl& i;
      size_t k;
      ~Give() { i.give_slot(k); }
    } give{*this, k};
    choices(slots[k]);
  }

  // parallel > 1: a free slot for this request, in arrival order (refused once stop() was asked): the one that can
  // return to the longest prefix of `prompt` (reusable), else the least recently used.
  size_t take_slot(const std::vector<int32_t>& prompt) {
    std::unique_lock<std::mutex> lock(slots_mu);
    const uint64_t me = ++tickets;
    waiting.push_back(me);
    auto free_slot = [&] {
      return std::any_of(slots.begin(), slots.end(), [](const Slot& s) { return !s.busy; });
    };
    slots_cv.wait(lock, [&] { return stopping || (waiting.front() == me && free_slot()); });
    if (stopping) {
      waiting.erase(std::find(waiting.begin(), waiting.end(), me));
      slots_cv.notify_all();
      throw shutting_down();
    }
    waiting.pop_front();
    size_t best = slots.size();
    size_t best_len = 0;
    for (size_t k = 0; k < slots.size(); ++k) {
      const Slot& s = slots[k];
      if (s.busy) continue;
      const size_t len = reusable(s, prompt).second;
      if (best == slots.size() || len > best_len || (len == best_len && s.used < slots[best].used)) best = k, best_len = len;
    }
    slots[best].busy = true, slots[best].used = ++uses;
    slots_cv.notify_all();  // (the next in line may take another free slot)
    return best;
  }
  void give_slot(size_t k) {
    {
      std::lock_guard<std::mutex> lock(slots_mu);
      slots[k].busy = false;
    }
    slots_cv.notify_all();
  }

  // The prompt tokens of a request that came from the cache: each prompt's first choice's (its other choices reuse
  // what the first fed, a count the usage does not repeat: cached_tokens never exceeds prompt_tokens).
  static int64_t cached_of(const std::vector<Request>& qs, const std::vector<Choice>& cs) {
    int64_t cached = 0;
    for (size_t c = 0; c < cs.size(); c += size_t(qs.front().n)) cached += cs[c].o.cached;
    return cached;
  }

  // The usage of a request: its prompts once each (their n choices share them), every choice's tokens.
  static json usage_of(const std::vector<Request>& qs, const std::vector<Choice>& cs) {
    int64_t prompt = 0, completion = 0;
    for (const Request& q : qs) prompt += int64_t(q.prompt.size());
    for (const Choice& c : cs) completion += int64_t(c.o.r.tokens.size());
    return usage_json(prompt, completion, cached_of(qs, cs));
  }

  void count(const std::vector<Request>& qs, const std::vector<Choice>& cs) {
    std::lock_guard<std::mutex> lock(stats_mu);
    ++stats.requests;
    for (const Choice& c : cs) stats.generated_tokens += int64_t(c.o.r.tokens.size());
    stats.cached_tokens += cached_of(qs, cs);
    stats.cancelled += cancelled(cs);
  }

  void log_done(const char* path, const std::vector<Request>& qs, const std::vector<Choice>& cs, bool stream) {
    int64_t prompt = 0, n = 0, decoded = 0;  // (decoded: the tokens after each choice's first, which decode_seconds timed)
    double seconds = 0, decode = 0;
    std::string why;  // (the choices' stop reasons, each once)
    for (const Request& q : qs) prompt += int64_t(q.prompt.size());
    for (const Choice& c : cs) {
      const int64_t k = int64_t(c.o.r.tokens.size());
      n += k, seconds += c.o.seconds;
      if (k > 1) decoded += k - 1, decode += c.o.r.decode_seconds;
      const std::string reason = stop_reason_name(c.o.r.stop);
      if (why.find(reason) == std::string::npos) why += (why.empty() ? "" : ", ") + reason;
    }
    const int64_t cached = cached_of(qs, cs);
    log(fmt::format("{} 200{}: {}{} prompt tokens ({} cached), {} generated ({}), {:.2f} s{}", path, stream ? " stream" : "",
                    cs.size() > 1 ? fmt::format("{} choices, ", cs.size()) : std::string(), prompt, cached, n, why, seconds,
                    decoded > 0 && decode > 0 ? fmt::format(", decode {:.1f} tok/s", double(decoded) / decode) : std::string()));
  }

  ResponseIds ids_for(bool chat) const {
    return {random_id(chat ? "chatcmpl-" : "cmpl-"), int64_t(std::time(nullptr)), defaults.model_id};
  }

  void handle(const httplib::Request& req, httplib::Response& res, bool chat) {
    const char* path = chat ? "/v1/chat/completions" : "/v1/completions";
    std::vector<Request> qs;
    try {
      if (!ready.load(std::memory_order_acquire)) throw RequestError(503, "server_busy", "", "the model is loading");
      const json body = parse_body(req.body);
      if (chat) qs.push_back(parse_chat(body, *tok, defaults));
      else qs = parse_completion(body, *tok, defaults);
      if (!qs.empty() && !qs.front().note.empty()) log(fmt::format("{}: {}", path, qs.front().note));
      if (stopping) throw shutting_down();
      // (the ones generating count too: max_queue wait behind them)
      if (in_flight.fetch_add(1) >= opt.max_queue + int(slots.size())) {
        in_flight.fetch_sub(1);
        res.set_header("Retry-After", "1");
        throw RequestError(503, "server_busy", "", fmt::format("the server is busy: {} requests are waiting (--max-queue)",
                                                               opt.max_queue));
      }
    } catch (const RequestError& e) {
      log(fmt::format("{} {}{}: {}", path, e.status, e.param.empty() ? "" : " " + e.param, e.what()));
      send_error(res, e);
      return;
    }
    if (qs.front().stream) stream(std::move(qs), res, path);
    else whole(qs, res, path);
  }

  void whole(const std::vector<Request>& qs, httplib::Response& res, const char* path) {
    struct Release {
      std::atomic<int>& n;
      ~Release() { n.fetch_sub(1); }
    } release{in_flight};
    std::vector<Choice> cs;
    try {
      run_request(qs, cs, [&](size_t c, std::string_view s) { cs[c].text += s; }, [&] { return stopping.load(); }, true);
    } catch (const RequestError& e) {
      send_error(res, e);
      return;
    } catch (const std::exception& e) {
      log(fmt::format("{} 500: {}", path, e.what()));
      send_error(res, RequestError(500, "server_error", "", e.what()));
      return;
    }
    count(qs, cs);
    log_done(path, qs, cs, false);
    if (cancelled(cs)) {  // (only stop() cancels a whole response: its client cannot be seen)
      send_error(res, RequestError(503, "server_busy", "", "the generation was cancelled: the server is stopping"));
      return;
    }
    const bool chat = qs.front().chat;
    json choices = json::array();
    for (size_t c = 0; c < cs.size(); ++c) {
      const Request& q = qs[c / size_t(qs.front().n)];
      Choice& ch = cs[c];
      // (chat: a stop token ends the reply without being part of its content, so its entry is left out as its text
      // is; completions list every sampled token, as completion_tokens counts them and vLLM lists them: a harness
      // that scores an echoed prompt by dropping the last entry, the one generated token, must find it there)
      if (chat && ch.o.r.stop == StopReason::Token && !ch.o.r.tokens.empty() && !ch.lp.empty()) ch.lp.pop_back();
      json logprobs;
      if (q.top_logprobs >= 0) logprobs = chat ? chat_logprobs(ch.lp, *tok) : completion_logprobs(ch.lp, *tok, q.top_logprobs > 0);
      const char* finish = finish_reason(ch.o.r.stop);
      if (chat) {
        std::string reasoning, content;
        ChatReplySplit split(q.thinking, q.tools);
        split.push(ch.text, reasoning, content);
        json calls;
        if (auto tc = split.finish(reasoning, content)) calls = call_ids(*tc), finish = "tool_calls";
        choices.push_back(chat_choice(int(c), reasoning, content, q.thinking, finish, logprobs, calls));
      } else {
        choices.push_back(completion_choice(int(c), q.echo_text + ch.text, finish, logprobs));
      }
    }
    const json usage = usage_of(qs, cs);
    const ResponseIds ids = ids_for(chat);
    res.set_content(to_text(chat ? chat_response(ids, std::move(choices), usage) : completion_response(ids, std::move(choices), usage)),
                    "application/json");
  }

  // The choices stream one after another, each its chunks (with its index) and its last chunk with its finish_reason.
  void stream(std::vector<Request> qs, httplib::Response& res, const char* path) {
    res.set_header("Cache-Control", "no-cache");
    auto done = std::make_shared<std::atomic<bool>>(false);
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, qs = std::move(qs), path, done](size_t, httplib::DataSink& sink) {
          struct Release {
            std::atomic<int>& n;
            std::atomic<bool>& done;
            ~Release() { n.fetch_sub(1), done = true; }
          } release{in_flight, *done};
          bool gone = false;
          auto send = [&](const std::string& s) {
            if (!gone && !sink.write(s.data(), s.size())) gone = true;
          };
          const bool chat = qs.front().chat;
          const size_t n = size_t(qs.front().n);
          const ResponseIds ids = ids_for(chat);
          std::vector<ChatReplySplit> splits;
          for (size_t c = 0; c < qs.size() * n; ++c) splits.emplace_back(qs[c / n].thinking, qs[c / n].tools);
          std::vector<const char*> finishes(qs.size() * n, nullptr);  // ("tool_calls" where a choice made calls)
          size_t current = 0;  // the choice streaming now, opened or not
          bool opened = false;
          // (a choice opens with the chat role / the echoed prompt, and closes with its finish_reason)
          auto open = [&](size_t c) {
            const Request& q = qs[c / n];
            if (chat) send(event(chat_chunk(ids, {{"role", "assistant"}, {"content", ""}}, nullptr, int(c))));
            if (q.echo && !q.echo_text.empty()) send(event(completion_chunk(ids, q.echo_text, nullptr, int(c))));
          };
          auto piece = [&](size_t c, std::string_view s, bool last) {
            if (!chat) {
              if (!s.empty()) send(event(completion_chunk(ids, std::string(s), nullptr, int(c))));
              return;
            }
            std::string reasoning, content;
            splits[c].push(s, reasoning, content);
            json calls;
            if (last)
              if (auto tc = splits[c].finish(reasoning, content)) {
                calls = call_ids(*tc);
                for (size_t k = 0; k < calls.size(); ++k) calls[k]["index"] = k;
                finishes[c] = "tool_calls";
              }
            if (!reasoning.empty()) send(event(chat_chunk(ids, {{"reasoning_content", reasoning}}, nullptr, int(c))));
            if (!content.empty()) send(event(chat_chunk(ids, {{"content", content}}, nullptr, int(c))));
            if (!calls.is_null()) send(event(chat_chunk(ids, {{"tool_calls", calls}}, nullptr, int(c))));
          };
          std::vector<Choice> cs;
          auto close = [&](size_t c) {
            piece(c, {}, true);
            const char* finish = finishes[c] ? finishes[c] : finish_reason(cs[c].o.r.stop);
            send(event(chat ? chat_chunk(ids, json::object(), finish, int(c)) : completion_chunk(ids, "", finish, int(c))));
          };
          // Choice c's text: the choices before it are closed first (each opened if it said nothing).
          auto finish_before = [&](size_t end) {
            for (; current < end; ++current, opened = false) {
              if (!opened) open(current);
              close(current);
            }
          };
          auto on_text = [&](size_t c, std::string_view s) {
            finish_before(c);
            if (!opened) open(c), opened = true;
            piece(c, s, false);
          };
          open(0), opened = true;  // (at once: a client sees the stream start before a long prefill)
          try {
            // (the sink is written from the engine thread while this one waits for it; with several slots, from this one)
            run_request(qs, cs, on_text, [&] { return stopping.load() || gone || !sink.is_writable(); }, false);
          } catch (const std::exception& e) {
            const auto* re = dynamic_cast<const RequestError*>(&e);
            log(fmt::format("{} {} stream: {}", path, re ? re->status : 500, e.what()));
            send(event(error_body(e.what(), re ? re->type : "server_error", "")));
            sink.done();
            return true;
          }
          count(qs, cs);
          log_done(path, qs, cs, true);
          if (cancelled(cs)) {  // (its client gone, or stop(): no finish_reason for it in OpenAI's set)
            send(event(error_body("the generation was cancelled: the server is stopping", "server_busy", "")));
            sink.done();
            return true;
          }
          finish_before(cs.size());
          if (qs.front().include_usage) send(event(usage_chunk(ids, chat, usage_of(qs, cs))));
          send("data: [DONE]\n\n");
          sink.done();
          return true;
        },
        [this, done](bool) {
          if (!done->exchange(true)) in_flight.fetch_sub(1);  // (the provider never ran: the client left first)
        });
  }

  void routes() {
    http.set_payload_max_length(opt.max_body_bytes);
    // Threads for the requests waiting on the generation, and a few more so /health and /v1/models answer meanwhile.
    // (an idle keep-alive connection holds a thread: kept short, so those spare threads stay free)
    const size_t threads = size_t(opt.max_queue) + slots.size() + 8;
    http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    http.set_keep_alive_timeout(2);
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (opt.api_key.empty() || req.path.rfind("/v1/", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
      if (req.get_header_value("Authorization") == "Bearer " + opt.api_key) return httplib::Server::HandlerResponse::Unhandled;
      log(fmt::format("{} 401: no or wrong API key", req.path));
      send_error(res, RequestError(401, "authentication_error", "", "this server needs an API key: \"Authorization: Bearer <key>\""));
      return httplib::Server::HandlerResponse::Handled;
    });
    // 503 while the model loads (as vLLM's and llama.cpp's servers answer), so a client or a load balancer can wait.
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      const bool up = ready.load(std::memory_order_acquire);
      res.status = up ? 200 : 503;
      res.set_content(up ? R"({"status":"ok"})" : R"({"status":"loading"})", "application/json");
    });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      if (!ready.load(std::memory_order_acquire)) return send_error(res, RequestError(503, "server_busy", "", "the model is loading"));
      const json m = {{"id", defaults.model_id}, {"object", "model"}, {"created", 0}, {"owned_by", "plumb"},
                      {"max_model_len", defaults.context}};
      res.set_content(to_text(json{{"object", "list"}, {"data", json::array({m})}}), "application/json");
    });
    http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) { handle(req, res, false); });
    http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) { handle(req, res, true); });
    http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;  // (an error a handler already explained)
      const std::string msg = res.status == 404 ? fmt::format("no such endpoint: {} {} (POST /v1/completions, POST "
                                                              "/v1/chat/completions, GET /v1/models, GET /health)", req.method, req.path)
                              : res.status == 413 ? fmt::format("the body is larger than the server takes ({})", res.status)
                                                  : fmt::format("HTTP {}", res.status);
      res.set_content(to_text(error_body(msg, "invalid_request_error", "")), "application/json");
    });
    http.set_exception_handler([this](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      log(fmt::format("{} 500: {}", req.path, what));
      send_error(res, RequestError(500, "server_error", "", what));
    });
  }
};

Server::Server(ServerOptions opt) : impl_(std::make_unique<Impl>(std::move(opt))) { impl_->routes(); }

void Server::set_model(std::shared_ptr<Engine> engine, Tokenizer tok, Defaults defaults) {
  if (impl_->ready) throw Error("plumb serve: set_model called twice (the server serves one model)");
  impl_->engine = std::move(engine);
  impl_->tok.emplace(std::move(tok));
  impl_->defaults = std::move(defaults);
  impl_->ready.store(true, std::memory_order_release);
}

Server::~Server() {
  stop();
  // The sessions go where they were made (their GPU graphs and buffers with them), before the engine thread ends (a
  // QueuedSession's destructor takes its session there itself).
  if (impl_->parallel()) impl_->slots.clear();
  else impl_->engine_thread.run([this] { impl_->slots.clear(); });
  // (the engine, if this held the last reference, goes after: Impl's members)
}

int Server::bind() {
  const auto& o = impl_->opt;
  errno = 0;
  const int port = o.port == 0 ? impl_->http.bind_to_any_port(o.host) : (impl_->http.bind_to_port(o.host, o.port) ? o.port : -1);
  if (port < 0)
    throw Error(fmt::format("cannot listen on {}:{}{}", o.host, o.port,
                            errno ? fmt::format(": {}", std::strerror(errno)) : std::string(" (in use, or not an address of this machine)")));
  return port;
}

void Server::run() {
  impl_->entered = true;
  if (!impl_->stopping) impl_->http.listen_after_bind();
  impl_->left = true;
}

void Server::stop() {
  auto& i = *impl_;
  i.stopping = true;
  {
    std::lock_guard<std::mutex> lock(i.slots_mu);  // (requests waiting for a slot see it)
  }
  i.slots_cv.notify_all();
  // httplib's stop() does nothing until its loop runs: once run() has been entered (and has not seen `stopping`),
  // wait for the loop, or for run() to return. (entered and stopping are both sequentially consistent: a run() that
  // starts after this reads stopping and returns at once.)
  if (i.entered)
    while (!i.http.is_running() && !i.left) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  i.http.stop();
}

Server::Stats Server::stats() const {
  const EngineThread::Counts b = impl_->engine_thread.counts();
  std::lock_guard<std::mutex> lock(impl_->stats_mu);
  Stats s = impl_->stats;
  s.batched_steps = b.batches, s.batched_rows = b.rows, s.sampled_rows = b.sampled, s.largest_batch = b.largest;
  return s;
}

}  // namespace plumb::server
