// Subcommand registration: each `plumb <cmd>` lives in its own cli/cmd_<name>.cpp and registers itself here.
#pragma once
#include <CLI/CLI.hpp>

namespace plumb::cli {

// Subcommands run as CLI11 callbacks during parse; they report their exit status here.
int exit_code();
void set_exit_code(int code);

void register_verify_golden(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_patches(CLI::App& app);
void register_diff(CLI::App& app);
void register_kld(CLI::App& app);
void register_bisect(CLI::App& app);
void register_trace(CLI::App& app);
void register_bench(CLI::App& app);
void register_selftest(CLI::App& app);
void register_run(CLI::App& app);
void register_chat(CLI::App& app);
void register_serve(CLI::App& app);

}  // namespace plumb::cli
