// `plumb bench`: the CUDA decode kernels at DeepSeek-V4-Flash dimensions on synthetic weights (src/cuda/bench.cpp).
// Without a usable GPU (or in a build without CUDA) it says why and exits non-zero.
#include "cli/commands.h"
#include "cuda/api.h"

namespace plumb::cli {

void register_bench(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "Time the CUDA decode kernels at V4-Flash sizes against the measured bandwidth");
  auto opt = std::make_shared<cuda::BenchOptions>();
  cmd->add_option("--iters", opt->iters, "timed runs per kernel (the median is reported)")->check(CLI::Range(1, 100000));
  cmd->add_option("--warmup", opt->warmup, "untimed runs first")->check(CLI::Range(0, 100000));
  cmd->add_option("--json", opt->json, "also write the results as JSON to this file");
  cmd->add_flag("!--no-flush", opt->flush_l2, "keep L2 warm between timed runs (default: flush, as decode reads weights cold)");
  cmd->add_flag("--profile", opt->profile, "launch each main kernel once without timing (to run under ncu)");
  cmd->callback([opt] { set_exit_code(cuda::run_bench(*opt)); });
}

}  // namespace plumb::cli
