// plumb: command-line entry point; each subcommand registers itself from its own cli/cmd_*.cpp.
#include <algorithm>
#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "plumb/engine.h"

int main(int argc, char** argv) {
  CLI::App app{"plumb: a DeepSeek-V4 inference engine whose every speed patch is proven against the reference math"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "plumb 0.1.0");
  // Before or after the subcommand (fallthrough): `plumb --threads 2 run ...` or `plumb run --threads 2 ...`.
  app.add_option("--threads",
                 "CPU threads for the reference backend's matrix products, attention heads and indexer entries (0: every "
                 "core); the results are the same bits for any count")
      ->check(CLI::Range(0, 1024))
      ->each([](const std::string& v) { plumb::set_cpu_threads(std::stoi(v)); });
  app.fallthrough();
  plumb::cli::register_verify_golden(app);
  plumb::cli::register_tokenize(app);
  plumb::cli::register_patches(app);
  plumb::cli::register_diff(app);
  plumb::cli::register_kld(app);
  plumb::cli::register_bisect(app);
  plumb::cli::register_trace(app);
  plumb::cli::register_bench(app);
  plumb::cli::register_selftest(app);
  plumb::cli::register_run(app);
  plumb::cli::register_chat(app);
  plumb::cli::register_serve(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help and --version
    // A usage error is one "error:" line and status 2, as plumb's own option checks give (CLI11 would print two
    // lines and exit with its own codes, 101-115), naming the help of the subcommand that was being parsed.
    std::string msg = e.what(), where = "plumb";
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    // --threads is plumb's own option (before or after the command): its help is plumb --help.
    if (msg.rfind("--threads", 0) != 0)
      for (const CLI::App* sub : app.get_subcommands()) where += " " + sub->get_name();
    // No command parsed: a word that is none is named (CLI11 says only that one is required).
    if (app.get_subcommands().empty())
      for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--threads") ++i;  // (its value)
        else if (!a.empty() && a[0] != '-') {
          msg = "unknown command '" + a + "'";
          break;
        }
      }
    std::fprintf(stderr, "error: %s (%s --help lists the options)\n", msg.c_str(), where.c_str());
    return 2;
  } catch (const std::exception& e) {
    // Every command's errors end here (plumb::Error names the file, tensor, token or option at fault): one "error:"
    // line after what was already streamed to stdout, and status 2. Status 1 is kept for a check that ran and
    // did not pass (verify-golden, selftest, a diff that diverges, a bisect with nothing to bisect), as diff(1)
    // does; 3 for bench without a usable GPU.
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return plumb::cli::exit_code();
}
