// Loading a model for `plumb run` / `plumb chat`: the bundled default folder, a progress line (bytes, rate, ETA)
// while the weights are mapped and paged in, the memory report, and the model / sampling options both share.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "plumb/engine.h"
#include "plumb/text.h"

namespace plumb::cli {

inline constexpr const char* kDefaultModel = "models/tiny";  // relative to the current directory

struct ModelArgs {
  std::string dir;  // "" = kDefaultModel
  std::string patches;
  std::string backend = "cpu";
  int prefill_chunk = EngineOptions{}.prefill_chunk;
  bool no_preload = false;
  bool quiet = false;
};
void add_model_options(CLI::App* cmd, ModelArgs& a);

struct GenArgs {
  GenerateOptions gen;
  std::optional<int64_t> seed;  // -1 (or none): a random seed
  std::vector<int32_t> stop_token_ids;
};
void add_sampling_options(CLI::App* cmd, GenArgs& a);

// The chat-mode options run and chat share: system prompt, thinking or not, reasoning effort.
struct ChatModeArgs {
  std::string system, effort;
  bool system_given = false;  // --system, even as "" (an empty system prompt is still a chat)
  bool think = false, no_think = false;
};
void add_chat_mode_options(CLI::App* cmd, ChatModeArgs& a, const char* system_help, const char* think_help);

// --json / --json-schema FILE, run's and chat's: the reply held to one JSON object, or to an instance of a JSON Schema.
struct JsonArgs {
  bool json = false;        // --json: JSON mode (OutputFormat::JsonObject)
  std::string schema_file;  // --json-schema FILE: structured output (OutputFormat::JsonSchema)
  bool schema_given = false;  // (--json-schema "": given, and refused as no file)
};
void add_json_options(CLI::App* cmd, JsonArgs& a, const char* reply);
// What they ask for, checked before the model loads: refused beside thinking mode (the reasoning would be held to
// JSON too); the schema file read and compiled, so an unsupported keyword is an error at once.
struct JsonFormat {
  OutputFormat format = OutputFormat::Text;
  std::string schema;
  void apply(GenerateOptions& g) const { g.format = format, g.json_schema = schema; }
};
JsonFormat json_format(const JsonArgs& a, bool think);

struct LoadedModel {
  std::string dir;
  std::shared_ptr<Engine> engine;
  std::optional<Tokenizer> tok;
  int32_t eos = -1;  // config.json's eos_token_id, else tokenizer_config's
};
// The model folder -m names (or the bundled default), checked to be a folder: throws plumb::Error naming it.
std::string model_dir(const ModelArgs& a);
// Tokenizer first (a missing or malformed tokenizer.json fails before any weight is touched), then the
// engine, with a progress line and a memory report on stderr (unless quiet).
LoadedModel load_model(const ModelArgs& a);

// The options as given, with the seed resolved (a random one when --seed is absent) and EOS added to the
// stop tokens.
GenerateOptions generate_options(const GenArgs& a, const LoadedModel& m, uint64_t& seed);

std::string human_bytes(double bytes);
// "prefill 884.7 tok/s, decode 324.0 tok/s" of a generation: the first sampled token comes from the prefill's pass,
// so decode is (generated - 1) tokens over the time after it (no rate for a single token).
std::string rates_text(int64_t prompt_tokens, double prefill_seconds, int64_t generated, double decode_seconds);
// A live "prefill: 4096 / 10000 tokens" line on stderr (a terminal only, and not with -q) while a prompt prefills on
// `session` (Session::set_prefill_progress: by layers on the CPU, by passes of --prefill-chunk on the GPU), whose
// prefill progress it is while it lives (cleared after). Call done() before the first reply text is written (the line
// is cleared and stays so; also on destruction).
class PrefillLine {
 public:
  PrefillLine(Session& session, bool quiet);
  ~PrefillLine();
  PrefillLine(const PrefillLine&) = delete;
  PrefillLine& operator=(const PrefillLine&) = delete;
  void done();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// "1 token", "2 tokens"
std::string count_text(int64_t n, const char* noun);
// "RSS 12.3 MB = 8.1 MB anonymous + 4.2 MB file-backed" from /proc/self/status ("" where unavailable).
std::string memory_report();

}  // namespace plumb::cli
