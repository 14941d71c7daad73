// `plumb verify-golden DIR`: checks the engine against a golden fixture (see plumb/tools.h).
#include "cli/commands.h"
#include "plumb/tools.h"

namespace plumb::cli {

namespace {
int g_exit = 0;
}
int exit_code() { return g_exit; }
void set_exit_code(int code) { g_exit = code; }

void register_verify_golden(CLI::App& app) {
  auto opt = std::make_shared<tools::VerifyGoldenOptions>();
  auto* cmd = app.add_subcommand("verify-golden", "Run a golden fixture's steps and compare logits and every tap");
  cmd->add_option("dir", opt->dir, "fixture folder (config.json, model.safetensors, golden.json, golden.safetensors)")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--backend", opt->backend, "backend to verify")->default_val("cpu");
  cmd->add_option("--patches", opt->patches, "comma-separated speed patches or presets to enable (empty: the reference; `plumb patches` lists them)");
  cmd->add_flag("-q,--quiet", opt->quiet, "print only failing taps and the per-step summaries");
  cmd->add_option("--mode", opt->mode,
                  "free: run on the engine's own outputs; forced: teacher forcing (each sublayer fed the fixture's "
                  "inputs, local error per op); auto: free for exact configurations, forced for approximate patches")
      ->check(CLI::IsMember({"auto", "free", "forced"}))
      ->default_val("auto");
  cmd->callback([opt] { set_exit_code(tools::verify_golden(*opt)); });
}

}  // namespace plumb::cli
