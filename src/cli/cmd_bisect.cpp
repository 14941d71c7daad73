// `plumb bisect`: finds the smallest subsets of a patch list that still diverge (delta debugging) and reports
// each with its first diverging tap and diagnosis.
#include "cli/commands.h"
#include "cli/input_options.h"
#include "plumb/check.h"

namespace plumb::cli {

void register_bisect(CLI::App& app) {
  auto o = std::make_shared<tools::BisectOptions>();
  auto* cmd = app.add_subcommand("bisect", "Find the smallest subsets of a patch list that still diverge (ddmin)");
  add_input_options(cmd, o->in);
  cmd->add_option("--patches", o->patches, "comma-separated patches (or presets: their patches) that together diverge")->required();
  cmd->add_option("--criterion", o->criterion,
                  "local (default): an op's teacher-forced error beyond the registry's local tolerance; free: a "
                  "free-running tap beyond the fp32 tolerance; kld: mean KL divergence beyond --threshold-kld")
      ->check(CLI::IsMember({"local", "free", "kld"}));
  cmd->add_option("--threshold-kld", o->kld_threshold,
                  "diverge when the mean KL(P_reference || P_S) exceeds this (implies --criterion kld)")
      ->check(finite_number(false));
  cmd->add_option("--backend", o->backend, "where every configuration runs: cpu (the reference backend) or cuda (each "
                  "subset against the GPU's fp32 twin)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_flag("-q,--quiet", o->quiet, "do not print every test");
  cmd->callback([cmd, o] {
    // A threshold with another criterion named would silently be the KL test: refused instead.
    if (cmd->get_option("--threshold-kld")->count() && cmd->get_option("--criterion")->count() && o->criterion != "kld")
      fail("--threshold-kld is the kld criterion's: it cannot be combined with --criterion {}", o->criterion);
    set_exit_code(tools::bisect(*o));
  });
}

}  // namespace plumb::cli
