// `plumb verify-golden DIR...`: checks the engine against golden fixtures (see plumb/tools.h), one or many.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "plumb/check.h"
#include "plumb/tools.h"

namespace plumb::cli {

namespace {
int g_exit = 0;

namespace fs = std::filesystem;

bool is_fixture(const fs::path& d) { return fs::is_regular_file(d / "golden.json"); }

// The fixtures the folders name: a folder with golden.json is one; a folder without it is a root whose direct
// subfolders with golden.json are taken in name order (make_golden.py --variants' output, tests/data/golden).
std::vector<std::string> expand_fixtures(const std::vector<std::string>& dirs) {
  std::vector<std::string> out;
  for (const auto& d : dirs) {
    if (is_fixture(d)) {
      out.push_back(d);
      continue;
    }
    std::vector<std::string> inside;
    for (const auto& e : fs::directory_iterator(d))
      if (e.is_directory() && is_fixture(e.path())) inside.push_back(e.path().string());
    PLUMB_CHECK(!inside.empty(), "{}: no golden.json there or in its subfolders (not a fixture folder)", d);
    std::sort(inside.begin(), inside.end());
    out.insert(out.end(), inside.begin(), inside.end());
  }
  return out;
}

// Several fixtures: each verified in turn (a fixture that cannot be loaded is reported and the others still run),
// then one summary line per fixture that did not pass and the totals. Exit 0 when every fixture passes, 2 when one
// could not run (an error, as for every command), else 1 when one failed its check. The options are checked first
// (an unknown patch, a backend this build or machine lacks): one error, not one per fixture.
int verify_many(tools::VerifyGoldenOptions opt, const std::vector<std::string>& fixtures) {
  tools::check_verify_options(opt);
  std::vector<std::string> failed, errors;
  for (size_t i = 0; i < fixtures.size(); ++i) {
    opt.dir = fixtures[i];
    fmt::print("\n=== [{}/{}] {}\n", i + 1, fixtures.size(), opt.dir);
    std::fflush(stdout);
    try {
      if (tools::verify_golden(opt) != 0) failed.push_back(opt.dir);
    } catch (const Error& e) {
      std::fflush(stdout);  // (the fixture's lines before its error)
      fmt::print(stderr, "error: {}\n", e.what());
      errors.push_back(fmt::format("{}: {}", opt.dir, e.what()));
    }
  }
  const size_t pass = fixtures.size() - failed.size() - errors.size();
  fmt::print("\nverify-golden: {} fixtures, {} pass, {} fail, {} could not run{}\n", fixtures.size(), pass, failed.size(),
             errors.size(), opt.patches.empty() ? "" : fmt::format(" (patches [{}])", opt.patches));
  for (const auto& f : failed) fmt::print("  FAIL   {}\n", f);
  for (const auto& e : errors) fmt::print("  ERROR  {}\n", e);
  return !errors.empty() ? 2 : !failed.empty() ? 1 : 0;
}

}  // namespace

int exit_code() { return g_exit; }
void set_exit_code(int code) { g_exit = code; }

void register_verify_golden(CLI::App& app) {
  auto opt = std::make_shared<tools::VerifyGoldenOptions>();
  auto dirs = std::make_shared<std::vector<std::string>>();
  auto* cmd = app.add_subcommand("verify-golden", "Run golden fixtures' steps and compare logits and every tap");
  cmd->add_option("DIR", *dirs,
                  "fixture folders (config.json, model.safetensors, golden.json, golden.safetensors); a folder without "
                  "golden.json stands for its subfolders that have one. With several, a summary follows; exit 0 when all "
                  "pass, 2 when one could not run, else 1 when one failed")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--backend", opt->backend, "backend to verify")->default_val("cpu");
  cmd->add_option("--patches", opt->patches,
                  "comma-separated speed patches or presets to enable (`plumb patches` lists them). Without a numerics "
                  "mode among them each fixture runs in its own (numerics.official or numerics.official_initial where "
                  "DeepSeek's official code made the golden (its current or its release-day revision), numerics.reference "
                  "otherwise; numerics.fixture says so explicitly); "
                  "numerics.reference runs the fp32 reference on an official-code golden");
  cmd->add_flag("-q,--quiet", opt->quiet, "print only failing taps and the per-step summaries");
  cmd->add_option("--mode", opt->mode,
                  "free: run on the engine's own outputs; forced: teacher forcing (each sublayer fed the fixture's "
                  "inputs, local error per op); auto: free for exact configurations, forced for approximate patches")
      ->check(CLI::IsMember({"auto", "free", "forced"}))
      ->default_val("auto");
  cmd->callback([opt, dirs] {
    const auto fixtures = expand_fixtures(*dirs);
    if (dirs->size() == 1 && fixtures.size() == 1 && fixtures[0] == (*dirs)[0]) {  // one fixture: its errors end the run
      opt->dir = fixtures[0];
      set_exit_code(tools::verify_golden(*opt));
    } else {
      set_exit_code(verify_many(*opt, fixtures));
    }
  });
}

}  // namespace plumb::cli
