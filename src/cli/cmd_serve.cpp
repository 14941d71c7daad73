// `plumb serve [-m DIR]`: an OpenAI-compatible HTTP server over one loaded model (server/server.h): listens, loads,
// serves until SIGINT or SIGTERM (the generation running ends as cancelled; during the load they exit at once).
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include <fmt/format.h>
#include <pthread.h>

#include "cli/commands.h"
#include "cli/progress.h"
#include "plumb/check.h"
#include "server/server.h"

namespace plumb::cli {

namespace {

struct ServeArgs {
  ModelArgs model;
  GenArgs gen;
  server::ServerOptions server;
  std::string model_id;
};

int serve(ServeArgs& o) {
  check_generate_options(o.gen.gen);  // (before the load: a typo does not wait for it)
  PLUMB_CHECK(o.server.port >= 0 && o.server.port <= 65535, "--port must be in [0, 65535], got {}", o.server.port);
  PLUMB_CHECK(o.server.max_queue >= 0, "--max-queue must be at least 0, got {}", o.server.max_queue);
  PLUMB_CHECK(o.server.parallel >= 1 && o.server.parallel <= 256, "--parallel must be in [1, 256], got {}", o.server.parallel);
  model_dir(o.model);  // (a wrong folder is said before the server listens)

  // SIGINT / SIGTERM are taken by one watcher thread (sigwait): blocked here, before any thread starts, so that every
  // thread the server and the load start inherits the mask. SIGUSR1 wakes the watcher when the server ends by itself.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGUSR1);
  sigset_t old;
  pthread_sigmask(SIG_BLOCK, &sigs, &old);
  struct Restore {
    sigset_t& old;
    ~Restore() { pthread_sigmask(SIG_SETMASK, &old, nullptr); }
  } restore{old};

  // Listening first: a port in use fails now, not after a load of minutes; meanwhile /health answers 503 "loading".
  server::Server srv(o.server);
  const int port = srv.bind();
  std::thread http([&] { srv.run(); });
  std::atomic<bool> loaded{false};
  std::thread watcher([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    if (sig == SIGUSR1) return srv.stop();
    if (!loaded) {  // (a load cannot be stopped part way; nothing to put back: leave as the signal would have)
      fmt::print(stderr, "plumb serve: {} during the load, exiting\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
      std::_Exit(128 + sig);
    }
    fmt::print(stderr, "plumb serve: {}, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    srv.stop();
  });
  auto finish = [&] {
    srv.stop();
    if (http.joinable()) http.join();
    pthread_kill(watcher.native_handle(), SIGUSR1);  // (a no-op for a watcher that already returned)
    watcher.join();
  };
  fmt::print(stderr, "plumb serve: listening on http://{}:{}, loading the model\n", o.server.host, port);
  std::string model_id;
  try {
    const LoadedModel m = load_model(o.model);
    uint64_t seed = 0;
    const GenerateOptions g = generate_options(o.gen, m, seed);
    const ModelInfo& info = m.engine->info();
    server::Defaults d;
    d.sampling = g.sampling;
    d.fixed_seed = o.gen.seed && *o.gen.seed >= 0;
    d.max_tokens = g.max_tokens;
    d.stop_tokens = g.stop_tokens;
    d.stop_strings = g.stop_strings;
    d.model_id = o.model_id.empty() ? std::filesystem::path(m.dir).filename().string() : o.model_id;
    if (d.model_id.empty()) d.model_id = std::filesystem::absolute(m.dir).parent_path().filename().string();  // ("dir/")
    d.config_bos = info.bos_token;
    d.context = info.max_positions;
    d.vocab = info.vocab_size;
    d.eos_token = m.eos;
    d.tokenizer_eos = m.tok->eos_id();
    model_id = d.model_id;
    srv.set_model(m.engine, *m.tok, std::move(d));
    loaded = true;
  } catch (...) {
    finish();
    throw;
  }
  fmt::print(stderr, "plumb serve: {} on http://{}:{} (POST /v1/completions, /v1/chat/completions; GET /v1/models, /health); "
             "{}, {} more may wait{}; Ctrl-C stops\n", model_id, o.server.host, port,
             o.server.parallel > 1 ? fmt::format("up to {} generations at once, their decode steps batched", o.server.parallel)
                                   : std::string("one generation at a time"),
             o.server.max_queue, o.server.prefix_cache ? ", prefix cache on" : "");
  http.join();  // (until a signal's stop(), or the listening socket failing)
  finish();
  const auto s = srv.stats();
  fmt::print(stderr, "plumb serve: {} answered, {} generated tokens, {} prompt tokens from the cache, {} cancelled{}\n",
             count_text(s.requests, "request"), s.generated_tokens, s.cached_tokens, s.cancelled,
             s.batched_steps > 0 ? fmt::format("; {} batched decode steps of {:.1f} sessions on average (at most {}), {} of their {} rows "
                                               "sampled in the step", s.batched_steps, double(s.batched_rows) / double(s.batched_steps),
                                               s.largest_batch, s.sampled_rows, s.batched_rows)
                                 : std::string());
  return 0;
}

}  // namespace

void register_serve(CLI::App& app) {
  auto o = std::make_shared<ServeArgs>();
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server: /v1/completions and /v1/chat/completions, "
                                          "streamed or whole (default model: the bundled models/tiny)");
  add_model_options(cmd, o->model);
  cmd->add_option("--host", o->server.host, "address to listen on (0.0.0.0: every interface)")->capture_default_str();
  cmd->add_option("--port", o->server.port, "port to listen on (0: any free port, printed)")->capture_default_str();
  cmd->add_option("--api-key", o->server.api_key, "require \"Authorization: Bearer KEY\" on /v1/ requests");
  cmd->add_option("--model-id", o->model_id, "the model name /v1/models lists and responses carry (default: the folder's name)");
  cmd->add_option("--max-queue", o->server.max_queue, "requests that may wait behind the ones generating; more get HTTP 503")
      ->capture_default_str();
  cmd->add_option("--parallel", o->server.parallel,
                  "generations at once, each with its own session and prefix cache; above 1 their decode steps run as one "
                  "batched step (the weights read once for all) and each row is sampled on the host")
      ->capture_default_str();
  cmd->add_flag("--no-prefix-cache", [o](int64_t) { o->server.prefix_cache = false; },
                "every request on an empty cache, its prompt prefilled in one call (as plumb run: a seed gives run's "
                "tokens); by default a prompt that extends the session's tokens, or shares the previous prompt but its "
                "last token, is fed from there");
  o->gen.gen.max_tokens = server::Defaults{}.max_tokens;  // (a server's replies run longer than run's default)
  add_sampling_options(cmd, o->gen);
  cmd->footer("The sampling options are the defaults of requests that do not set temperature, top_p, top_k, min_p, the "
              "penalties, seed or max_tokens; --stop and --stop-token apply to every request. Without --seed each "
              "request without \"seed\" draws its own.");
  cmd->callback([o] { set_exit_code(serve(*o)); });
}

}  // namespace plumb::cli
