// `plumb bisect`: finds the smallest subsets of a patch list that still diverge (delta debugging) and reports
// each with its first diverging tap and diagnosis.
#include "cli/commands.h"
#include "cli/input_options.h"
#include "toolkit/bisect.h"

namespace plumb::cli {

namespace {

struct BisectCli {
  InputOptions in;
  std::string patches, criterion = "local";
  double kld = -1;
  bool quiet = false;
};

}  // namespace

void register_bisect(CLI::App& app) {
  auto c = std::make_shared<BisectCli>();
  auto* cmd = app.add_subcommand("bisect", "Find the smallest subsets of a patch list that still diverge (ddmin)");
  add_input_options(cmd, c->in);
  cmd->add_option("--patches", c->patches, "comma-separated patches that together diverge")->required();
  cmd->add_option("--criterion", c->criterion,
                  "local (default): an op's teacher-forced error beyond the registry's local tolerance; free: a "
                  "free-running tap beyond the fp32 tolerance; kld: mean KL divergence beyond --threshold-kld");
  cmd->add_option("--threshold-kld", c->kld, "diverge when the mean KL(P_reference || P_S) exceeds this (implies --criterion kld)");
  cmd->add_flag("-q,--quiet", c->quiet, "do not print every test");
  cmd->callback([c] {
    toolkit::BisectOptions o;
    o.input = c->in.resolve();
    o.patches = toolkit::split_patch_list(c->patches);
    o.criterion = c->kld >= 0 ? "kld" : c->criterion;
    o.kld_threshold = c->kld;
    PLUMB_CHECK(o.criterion != "kld" || c->kld >= 0, "--criterion kld needs --threshold-kld X");
    o.verbose = !c->quiet;
    fmt::print("plumb bisect: {} patches on {}, criterion: {}\n", o.patches.size(), o.input.source,
               o.criterion == "kld"    ? fmt::format("mean KLD against the reference > {:g}", o.kld_threshold)
               : o.criterion == "free" ? std::string("free-running taps beyond the registry's fp32 tolerance")
                                       : std::string("teacher-forced (local) op errors beyond the registry's local tolerance"));
    const auto r = toolkit::bisect(o);
    for (const auto& n : r.notes) fmt::print("note: {}\n", n);
    if (!r.full_diverges) {
      fmt::print("bisect: the patches do not diverge together ({} tests, {:.2f} s): nothing to bisect\n", r.tests, r.seconds);
      set_exit_code(1);
      return;
    }
    std::string names;
    for (const auto& cu : r.culprits) {
      std::string set;
      for (const auto& p : cu.patches) set += (set.empty() ? "" : ",") + p;
      names += (names.empty() ? "" : "; ") + set;
      fmt::print("culprit: {} (first divergence {}{}; diagnosis: {}){}\n", set, cu.first.none() ? "none" : cu.first.tap,
                 cu.first.none() ? "" : " at step " + cu.first.step_name, cu.diagnosis,
                 cu.alone_ok.empty() ? "" : fmt::format(" [an interaction: {} alone do(es) not diverge]", [&] {
                   std::string s;
                   for (const auto& p : cu.alone_ok) s += (s.empty() ? "" : ",") + p;
                   return s;
                 }()));
    }
    fmt::print("bisect: {} culprit{}: {} ({} tests, {:.2f} s)\n", r.culprits.size(), r.culprits.size() == 1 ? "" : "s",
               names, r.tests, r.seconds);
  });
}

}  // namespace plumb::cli
