// plumb's public API: an Engine holds a loaded model (weights mapped, never copied); a Session is one cache
// timeline (prefill chunks, decode steps, further turns). With plumb/text.h it is all a program that generates
// text needs (tests/api/embed_example.cpp); the CLI uses the public headers only.
#pragma once
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "plumb/error.h"

namespace plumb {

class Sampler;  // plumb/text.h

// Loading progress: stage "layers" reports the layers whose weights are bound and validated so far, then (backend
// cuda) stage "upload" the layers whose weights are on the GPU.
struct LoadProgress {
  const char* stage;
  int64_t done, total;
};

struct EngineOptions {
  std::string patches;  // comma-separated speed patches / numerics mode ("" = the fp32 reference); see `plumb patches`
  std::string backend = "cpu";
  std::function<void(const LoadProgress&)> on_progress;  // called from the loading thread; may be empty
  // A Session call with more tokens runs them as forward passes of at most this many (0: one pass): the passes'
  // activations, attention scores and logits grow with the tokens in a pass. Any chunking gives the same results
  // (within 1e-5; the sessions' caches carry across passes), but where the indexer's scores tie exactly at its top-k
  // boundary (ReLU zeros): the fp32 reference breaks such ties in PyTorch's order, as transformers does, an order
  // that depends on the entries of the pass, so another chunking can select another entry there (the official
  // numerics and the GPU take the lowest index first, whatever the pass).
  int prefill_chunk = 2048;
};

struct ModelInfo {
  int vocab_size = 0;
  int bos_token = -1, eos_token = -1;  // -1: none in config.json
  int64_t max_positions = 0;           // max_position_embeddings
  std::string summary;                 // one line: layers, attention types, experts, ...
  // Backend cuda: the GPU, the device memory loading took (the weights, their fast-path copies, the first
  // buffers) and what it left free of the total; empty and 0 on the CPU.
  std::string device;
  int64_t device_loaded_bytes = 0, device_free_bytes = 0, device_total_bytes = 0;
  int64_t host_weight_bytes = 0;  // cuda.host_experts: the routed experts' weights kept in pinned host memory
};

class Session;

// A point of one session's timeline (Session::checkpoint) to come back to with Session::restore: to score several
// continuations of one prefix, or to take back a chat turn. It holds what later calls overwrite (each layer's window
// rows and its compressors' pending rows, on the host; the compressed entries, which only grow, by their count), not
// the cache: the same size at any context (V4-Flash: up to ~22 MB on the CPU, ~23 MB on the GPU, ~66 MB under
// cuda.fast, whose one-token steps keep their compressor inputs until a window completes). Shared and immutable; it
// may outlive its session.
class SessionCheckpoint {
 public:
  virtual ~SessionCheckpoint() = default;
  virtual int64_t position() const = 0;  // the session's position() when it was taken
};

// The CPU threads of the reference backend's matrix products, attention heads and indexer entries, process-wide
// (0: every core, 1: serial). Each output row, head or entry is one thread's work, so the results are the same bits
// for any count.
void set_cpu_threads(int n);

// Where the library's one-line notes go, process-wide: which patch applies where as a model loads ("backend cuda:
// cuda.fp8_gemv runs 34 of 34 FP8 matrices"), a CUDA graph capture that failed. Each call of `sink` is one line
// without its newline, from whichever thread loads or runs the model (calls are serialized). An empty function
// (the default): each note is printed on stderr. `plumb run` / `chat` set one while their loading line is live, so
// the line is redrawn below each note instead of being run into.
void set_notice_sink(std::function<void(std::string_view)> sink);

// Threads: an Engine is immutable once loaded, and its sessions may run on different threads, one thread at a time
// per Session (a Session is not thread-safe). On the CPU backend the process-wide thread pool (set_cpu_threads) runs
// one parallel loop at a time: a session whose loop finds it busy runs that loop serially on its own thread, at the
// same time as the other (the same bits either way, each output row being one thread's work). On backend cuda the
// sessions of one engine share its GPU streams and scratch buffers (a session's own device memory is its caches), so
// their calls on the device take turns: one on another thread waits until the running one has returned. A Session keeps
// its Engine's model alive (it may outlive the Engine object).
class Engine {
 public:
  // dir: a model folder (config.json + model.safetensors or a sharded index). Throws plumb::Error naming the
  // file or tensor at fault.
  static std::shared_ptr<Engine> load(const std::string& dir, const EngineOptions& opt = {});
  Engine() = default;
  Engine(const Engine&) = delete;  // (a loaded model is shared through the shared_ptr, never copied)
  Engine& operator=(const Engine&) = delete;
  virtual ~Engine() = default;
  virtual const ModelInfo& info() const = 0;
  virtual std::unique_ptr<Session> new_session() const = 0;
  virtual const std::string& dir() const = 0;
};

class Session {
 public:
  Session() = default;
  Session(const Session&) = delete;  // (one cache timeline: move the unique_ptr)
  Session& operator=(const Session&) = delete;
  virtual ~Session() = default;
  // Feeds tokens at positions position() .. position()+n-1 and returns the logits of the LAST token (vocab floats).
  // The tokens are validated before anything is computed (ids in the vocabulary, and position()+n within the
  // model's context, max_position_embeddings, where it names one); on error the session is unchanged. An error from
  // the computation itself (a backend failure) may leave the caches part-written whatever position() says, unless
  // the call saved the session first (a multi-token call with a stop or progress function set: see
  // set_prefill_stop), which then puts it back: restore() a checkpoint taken before the call, or reset(). Should
  // putting it back fail too, every call but restore() and reset() refuses, naming both errors. The session's calls
  // from inside its own progress or stop function are refused (the call running is half done).
  virtual std::vector<float> forward(std::span<const int32_t> tokens) = 0;
  // Same, but the logits of every token: n * vocab floats, row-major.
  virtual std::vector<float> forward_all(std::span<const int32_t> tokens) = 0;
  // Feeds tokens like forward() and returns sampler.sample(last logits, history). On backend cuda the sampling
  // runs on the GPU (the logits never leave it), drawing from the sampler's RNG exactly as sample() would. The
  // default samples on the host. The library's sessions refuse a sampler made for another vocabulary before anything
  // is fed (this default, for a Session of your own, checks after its forward()). When the sampler refuses the row
  // (no finite logit: Sampler::sample) the tokens stay fed: position() counts them.
  virtual int32_t forward_sample(std::span<const int32_t> tokens, Sampler& sampler, std::span<const int32_t> history);
  // Same, drawing only among the tokens `allowed` lets through (structured output: generate()'s JSON modes). It is
  // called once per call with (vocab + 31) / 32 words, all zero, and sets bit id % 32 of word id / 32 for every
  // token id that may be drawn; the logits of the others become -inf before the penalties and the sampling, so the
  // token is sampler.sample(the masked logits, history) exactly. On backend cuda `allowed` runs on the calling thread
  // while the GPU computes the forward (its cost hides behind the pass; it must not call into the engine's sessions,
  // whose device work shares the pass's buffers) and only its bits go up. Should it throw, the call ends with that
  // exception, the tokens fed (position() counts them) and nothing drawn. The default runs forward(), then
  // `allowed`, and samples on the host.
  virtual int32_t forward_sample_masked(std::span<const int32_t> tokens, Sampler& sampler, std::span<const int32_t> history,
                                        const std::function<void(std::span<uint32_t> allowed)>& allowed);
  // Progress of a call that feeds several tokens (a prefill), so a long prompt can show how far it is: `fn(done,
  // total)` on the calling thread, `done` the call's tokens fed so far (fractional passes rounded down), `total` its
  // tokens. Backend cpu: after each layer of each pass but the last layer of the last; backend cuda (whose passes are
  // queued whole): after each pass but the last (EngineOptions::prefill_chunk). Not for one-token calls. Empty (the
  // default): no calls. The default implementation ignores it. Should `fn` throw, the call ends with that exception
  // and the session is put back as it was before the call (as a stop, below).
  virtual void set_prefill_progress(std::function<void(int64_t done, int64_t total)> fn) { (void)fn; }
  // Stopping a call that feeds several tokens (a long prompt, a front end's Ctrl-C): `should_stop()` is asked on the
  // calling thread before the call's first pass and wherever the progress above is reported (backend cpu: after
  // each layer; cuda: after each pass); true ends the call with plumb::Stopped and the session as it was before the
  // call (position() unchanged, its caches restored: the next call gives the logits it would have given). One-token
  // calls are not asked. While a stop or a progress function is set, a call with such points after its start (on the
  // CPU every multi-token call; on the GPU one of more than one pass) first saves what it may overwrite (each layer's
  // window rows and compressors' pending rows, as a checkpoint holds: not the whole cache). Returns the function set
  // before (empty: none), so a caller can set one for a while and put it back.
  // The default implementation ignores it and returns an empty function.
  virtual std::function<bool()> set_prefill_stop(std::function<bool()> should_stop) {
    (void)should_stop;
    return {};
  }
  // Where the session is now, to come back to (SessionCheckpoint). The library's sessions on either backend; the
  // default throws plumb::Error (a Session of your own has no caches this API knows).
  virtual std::shared_ptr<const SessionCheckpoint> checkpoint() const;
  // Back to a checkpoint of this session: position() is its position and the next calls give the logits they gave
  // after it (on the GPU, whose graphs stay captured, bit for bit too). Refused with plumb::Error, the session
  // unchanged, for another session's checkpoint or one the session has left behind since: by reset(), or by a
  // restore() to an earlier point (the positions after that were fed anew, so the entries the checkpoint counts are
  // gone). A checkpoint stays usable for any number of restores to it.
  virtual void restore(const SessionCheckpoint& cp);
  // A hint that the session will reach `positions` tokens: backends with device caches size them now, so that
  // generation does not pause to grow them (and re-capture its decode graph) on the way. Default: nothing.
  virtual void reserve(int64_t positions) { (void)positions; }
  virtual int64_t position() const = 0;  // tokens consumed so far
  virtual void reset() = 0;               // back to an empty cache
  // The model this session runs: its Engine's info() (what generate() reads for the vocabulary, EOS and context).
  virtual const ModelInfo& info() const = 0;
};

// One decode step of several sessions of one engine at once (a server's concurrent requests): tokens[b] is fed to
// *sessions[b] at its own position, one token each. Returns B rows of vocab floats (row-major): row b is the logits
// sessions[b]->forward({tokens[b]}) would have returned (backend cpu: the same bits; cuda: within the GPU path's
// tolerances, its batched kernels summing in another order). The weights are read once for all the rows, which is
// what makes serving several sequences cheaper than stepping each alone. Everything is checked before anything is
// computed (at least one session; no null and no session twice; all made by one engine's new_session(); none inside
// a call of its own; each token in the vocabulary and its position within the context): on such an error no session
// changes. An error from the computation itself may leave the sessions' caches part-written, as Session::forward says.
std::vector<float> forward_batch(std::span<Session* const> sessions, std::span<const int32_t> tokens);

// One row of forward_batch_sample: the token its session is fed, how the row's next token is chosen, and what came of it.
struct BatchRow {
  int32_t token = 0;           // fed to the row's session at its position
  Sampler* sampler = nullptr;  // null: the row's logits come back in `logits`, nothing drawn
  std::span<const int32_t> history;  // the penalties' tokens (Session::forward_sample's history)
  // empty: every token (else Session::forward_sample_masked's). The rows' functions are called on the host's CPU
  // threads, several at the same time (each on one thread): a function must not share mutable state with another row's,
  // nor call into the engine (its sessions' device work waits for this call to end).
  std::function<void(std::span<uint32_t> allowed)> allowed;
  // Results.
  int32_t sampled = -1;        // the token drawn (rows with a sampler, without an error)
  std::vector<float> logits;   // (rows without a sampler) vocab floats
  std::exception_ptr error;    // this row's own failure: its sampler refused the row (no finite logit) or `allowed`
                               // threw. The row's token stays fed (its session's position counts it).
};

// forward_batch whose rows choose their next token where the logits are: row b's `sampled` is what
// sessions[b]->forward_sample_masked({rows[b].token}, *rows[b].sampler, rows[b].history, rows[b].allowed) would return
// (drawing from the sampler's RNG exactly as sample() does); a row without a sampler gets its logits, as forward_batch
// returns them. On backend cuda the rows are sampled on the GPU and only the tokens (and the rows without a sampler)
// come back: at a 129K vocabulary 0.5 MB per row less to copy. The checks, and the errors that leave every session
// unchanged, are forward_batch's, plus each sampler's vocabulary; a failure of one row's sampling or mask is that row's
// `error`, the others' results stand.
void forward_batch_sample(std::span<Session* const> sessions, std::span<BatchRow> rows);

}  // namespace plumb
