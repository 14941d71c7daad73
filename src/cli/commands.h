// Subcommand registration: each `plumb <cmd>` lives in its own cli/cmd_<name>.cpp and registers itself here.
#pragma once
#include <CLI/CLI.hpp>

namespace plumb::cli {

void register_verify_golden(CLI::App& app);
void register_tokenize(CLI::App& app);

}  // namespace plumb::cli
