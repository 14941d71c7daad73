// `plumb kld`: KL divergence, top-1 agreement and probability shifts between two configurations per token, live
// or against A's saved top-k log-probabilities (--save-ref once, --ref later).
#include <fstream>

#include "cli/commands.h"
#include "cli/input_options.h"
#include "toolkit/diff.h"
#include "toolkit/kld.h"

namespace plumb::cli {

namespace {

struct KldCli {
  InputOptions in;
  std::string a, b, save_ref, ref, json;
  int64_t topk = 64;
};

}  // namespace

void register_kld(CLI::App& app) {
  auto c = std::make_shared<KldCli>();
  auto* cmd = app.add_subcommand("kld", "Per-token KL(P_A || P_B), top-1 agreement and Δp between two configurations");
  add_input_options(cmd, c->in);
  cmd->add_option("--a", c->a, "patches of the reference side A (empty: the fp32 reference)");
  cmd->add_option("--b", c->b, "patches of the candidate B (empty: the fp32 reference)");
  cmd->add_option("--save-ref", c->save_ref, "run A only and save its top-k log-probabilities (safetensors) to this file");
  cmd->add_option("--topk", c->topk, "how many log-probabilities per token --save-ref keeps")->default_val(64);
  cmd->add_option("--ref", c->ref, "compare B against a file written by --save-ref (the file holds the input)");
  cmd->add_option("--json", c->json, "also write the statistics (and per-token KLD) as JSON to this file");
  cmd->callback([c] {
    PLUMB_CHECK(c->save_ref.empty() || c->ref.empty(), "--save-ref and --ref are two separate steps: give one");
    toolkit::KldReport r;
    if (!c->save_ref.empty()) {
      const auto in = c->in.resolve();
      toolkit::save_kld_ref(in, c->a, c->save_ref, c->topk);
      return;
    }
    if (!c->ref.empty()) {
      PLUMB_CHECK(c->a.empty(), "--a has no effect with --ref (A is the saved configuration)");
      const bool has_input = c->in.given();
      std::string model = c->in.model.empty() ? c->in.fixture : c->in.model;
      if (has_input) {
        const auto in = c->in.resolve();
        r = toolkit::kld_against_ref(c->ref, in.model_dir, c->b, &in);
      } else {
        r = toolkit::kld_against_ref(c->ref, model, c->b, nullptr);
      }
    } else {
      const auto in = c->in.resolve();
      r = toolkit::kld_live(in, c->a, c->b);
    }
    toolkit::print_kld(r);
    if (!c->json.empty()) {
      std::ofstream f(c->json);
      PLUMB_CHECK(f.good(), "cannot write {}", c->json);
      f << toolkit::kld_json(r);
    }
  });
}

}  // namespace plumb::cli
