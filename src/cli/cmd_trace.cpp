// `plumb trace`: runs a model over an input with any configuration and writes the selected taps and the logits of
// every step to OUT.safetensors, with the index OUT.json.
#include "cli/commands.h"
#include "cli/input_options.h"

namespace plumb::cli {

void register_trace(CLI::App& app) {
  auto o = std::make_shared<tools::TraceOptions>();
  auto* cmd = app.add_subcommand("trace", "Run a model and write selected taps + logits per step (safetensors + JSON index)");
  add_input_options(cmd, o->in);
  cmd->add_option("--patches", o->patches, "configuration: [cpu:|cuda:]PATCHES (empty: the fp32 reference on the CPU)");
  cmd->add_option("--taps", o->taps, "comma-separated globs over tap names, e.g. 'L3.*,*.ffn.*' (default: all)");
  cmd->add_option("--layers", o->layers, "keep L<i>.* taps of these layers only, e.g. 0-3");
  cmd->add_option("--steps", o->steps, "keep these steps, by name or index, e.g. s0,s2");
  cmd->add_option("--positions", o->positions, "keep these token positions (rows), e.g. 0-5");
  cmd->add_option("-o,--out", o->out, "output .safetensors (the index goes next to it as .json)")->required()->check(output_file());
  cmd->callback([o] { set_exit_code(tools::trace(*o)); });
}

}  // namespace plumb::cli
