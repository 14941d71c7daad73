// `plumb kld`: KL divergence, top-1 agreement and probability shifts between two configurations per token, live
// or against A's saved top-k log-probabilities (--save-ref once, --ref later).
#include "cli/commands.h"
#include "cli/input_options.h"

namespace plumb::cli {

void register_kld(CLI::App& app) {
  auto o = std::make_shared<tools::KldOptions>();
  auto* cmd = app.add_subcommand("kld", "Per-token KL(P_A || P_B), top-1 agreement and Δp between two configurations");
  add_input_options(cmd, o->in);
  cmd->add_option("--a", o->a, "the reference side A: [cpu:|cuda:]PATCHES (empty: the fp32 reference on the CPU)");
  auto* b = cmd->add_option("--b", o->b, "the candidate B: [cpu:|cuda:]PATCHES (empty: the fp32 reference on the CPU)");
  auto* save = cmd->add_option("--save-ref", o->save_ref, "run A only and save its top-k log-probabilities (safetensors) to this file")->check(output_file());
  cmd->add_option("--topk", o->topk, "how many log-probabilities per token --save-ref keeps")->default_val(64)->needs(save);
  cmd->add_option("--ref", o->ref, "compare B against a file written by --save-ref (the file holds the input)");
  auto* json = cmd->add_option("--json", o->json, "also write the statistics (and per-token KLD) as JSON to this file")->check(output_file());
  // --save-ref runs A alone and computes no statistics: B and a JSON report would be ignored.
  save->excludes(b)->excludes(json);
  cmd->callback([o] { set_exit_code(tools::kld(*o)); });
}

}  // namespace plumb::cli
