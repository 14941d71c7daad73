// `plumb serve`'s HTTP server: OpenAI-compatible /v1/completions and /v1/chat/completions (whole responses or
// server-sent event streams), /v1/models and /health, over one Engine. Built on the public API only.
//
// Up to ServerOptions::parallel generations run at once, each in a slot of its own (a session and its prefix cache);
// with several, their decode steps run together, one plumb::forward_batch_sample for the sessions whose steps wait at
// the same time, each row sampled where its logits are (EngineThread). The other requests wait in arrival order, up
// to ServerOptions::max_queue, past which a request gets 503. With the prefix cache a slot keeps its session between
// requests: a prompt that extends what the session holds (the next turn of a chat whose replies came from this
// server), or that shares all of the previous prompt but its last token (a retry; a thinking-mode chat's next turn,
// whose history drops the reasoning), is fed from there on, and the usage says how many prompt tokens came from the
// cache (prompt_tokens_details.cached_tokens).
// A request takes the free slot holding the longest prefix of its prompt, else the least recently used.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "plumb/engine.h"
#include "plumb/text.h"
#include "server/openai.h"

namespace plumb::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;       // 0: any free port (bind() returns it)
  std::string api_key;   // not empty: /v1/ requests need "Authorization: Bearer <key>"
  int max_queue = 16;    // requests waiting behind the ones generating; more are refused with 503
  // Generations at once (>= 1). 1: one at a time on the engine thread, the session sampling on the device. More: each
  // on its request's thread with a session of its own, their one-token steps batched, each row sampled in the batch
  // where its logits are (on the device: only the tokens come back), but a row whose logits the request needs
  // (logprobs), which comes to its request's thread and is sampled there.
  int parallel = 1;
  // Keep the session between requests and feed only what a new prompt adds (false: every request on an empty
  // cache, the prompt prefilled in one call as `plumb run` does, so a seed gives `plumb run`'s tokens).
  bool prefix_cache = true;
  size_t max_body_bytes = size_t(64) << 20;
  std::function<void(std::string_view)> log;  // one line per request; empty: stderr
};

// bind(), run() (on a thread of its own) and set_model() in any order after bind(): a server can listen before its
// model has loaded (`plumb serve` binds first, so a port in use fails before a long load), answering /health with 503
// "loading" and completions with 503 until set_model().
class Server {
 public:
  explicit Server(ServerOptions opt);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;
  // Binds host:port; returns the port (the one chosen, for port 0). Throws plumb::Error naming the address.
  int bind();
  // Serves until stop(); bind() first.
  void run();
  // The one model to serve, once (thread-safe against the handlers).
  void set_model(std::shared_ptr<Engine> engine, Tokenizer tok, Defaults defaults);
  // From any thread (a signal's watcher), before or during run(): the generation running ends as cancelled (a whole
  // response gets 503, a stream a last error event), requests still waiting get 503, run() returns.
  void stop();

  struct Stats {
    int64_t requests = 0;          // completions answered (whole or streamed, cancelled included)
    int64_t generated_tokens = 0;  // sampled tokens of those (every choice's)
    int64_t cached_tokens = 0;     // prompt tokens the prefix cache held
    int64_t cancelled = 0;         // requests whose generation a client gone or stop() ended
    int64_t batched_steps = 0;     // (parallel > 1) decode steps that ran several sessions in one forward_batch_sample
    int64_t batched_rows = 0;      // the sessions stepped in those
    int64_t sampled_rows = 0;      // of those, the rows sampled in the step (the others' logits came back: logprobs)
    int64_t largest_batch = 0;     // the most sessions in one
  };
  Stats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace plumb::server
