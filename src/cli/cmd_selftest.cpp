// `plumb selftest`: runs diff (reference vs each built-in fault) on the bundled fixtures and checks the first
// divergence and the diagnosis; one line per fault, a summary line, exit status 1 on any failure.
#include "cli/commands.h"
#include "plumb/tools.h"

namespace plumb::cli {

void register_selftest(CLI::App& app) {
  auto fixtures = std::make_shared<std::vector<std::string>>();
  auto backend = std::make_shared<std::string>("cpu");
  auto* cmd = app.add_subcommand("selftest",
                                 "Check that diff finds and diagnoses every built-in fault (default fixtures: "
                                 "tests/data/golden/tiny and negative-router, relative to the working directory)");
  cmd->add_option("--fixture", *fixtures, "run every fault on this fixture instead (repeatable)");
  cmd->add_option("--backend", *backend, "run reference and faults on this backend (cpu, cuda)")->default_val("cpu");
  cmd->callback([fixtures, backend] { set_exit_code(tools::selftest(*fixtures, *backend)); });
}

}  // namespace plumb::cli
