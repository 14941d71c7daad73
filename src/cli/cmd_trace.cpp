// `plumb trace`: runs a model over an input with any patches and writes the selected taps and the logits of
// every step to OUT.safetensors, with the index OUT.json.
#include <filesystem>

#include "cli/commands.h"
#include "cli/input_options.h"
#include "toolkit/diff.h"
#include "toolkit/trace.h"

namespace plumb::cli {

namespace {

struct TraceCli {
  InputOptions in;
  std::string patches, taps, layers, steps, positions, out;
};

}  // namespace

void register_trace(CLI::App& app) {
  auto c = std::make_shared<TraceCli>();
  auto* cmd = app.add_subcommand("trace", "Run a model and write selected taps + logits per step (safetensors + JSON index)");
  add_input_options(cmd, c->in);
  cmd->add_option("--patches", c->patches, "comma-separated patches (empty: the fp32 reference)");
  cmd->add_option("--taps", c->taps, "comma-separated globs over tap names, e.g. 'L3.*,*.ffn.*' (default: all)");
  cmd->add_option("--layers", c->layers, "keep L<i>.* taps of these layers only, e.g. 0-3");
  cmd->add_option("--steps", c->steps, "keep these steps, by name or index, e.g. s0,s2");
  cmd->add_option("--positions", c->positions, "keep these token positions (rows), e.g. 0-5");
  cmd->add_option("-o,--out", c->out, "output .safetensors (the index goes next to it as .json)")->required();
  cmd->callback([c] {
    const auto in = c->in.resolve();
    const auto filter = toolkit::TapFilter::parse(c->taps, c->layers, c->steps, c->positions);
    const auto model = toolkit::load_model(in.model_dir, c->patches);
    const auto t = toolkit::run_trace(*model, in, c->patches, &filter);
    toolkit::write_trace(t, c->out);
    size_t tensors = 0;
    for (const auto& d : t.data) tensors += d.order.size();
    fmt::print("trace: {} steps of {}, patches [{}], {}: {} tensors ({} taps) -> {} ({:.1f} KiB) + {}\n", t.steps.size(),
               in.source, c->patches.empty() ? "reference" : c->patches, filter.describe(), tensors, t.tap_order().size(),
               c->out, double(std::filesystem::file_size(c->out)) / 1024.0, toolkit::index_path_for(c->out));
  });
}

}  // namespace plumb::cli
