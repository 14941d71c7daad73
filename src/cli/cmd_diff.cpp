// `plumb diff`: compares two configurations tap by tap (two trace files, or two configurations run live on one
// input), prints the table, the first divergence and a diagnosis; --json / --html write the same report.
#include "cli/commands.h"
#include "cli/input_options.h"

namespace plumb::cli {

void register_diff(CLI::App& app) {
  auto o = std::make_shared<tools::DiffOptions>();
  auto* cmd = app.add_subcommand("diff",
                                 "Compare two configurations tap by tap: first diverging tap and a diagnosis "
                                 "(exit 0: no divergence, 1: divergence)");
  auto* ta = cmd->add_option("--trace-a", o->trace_a, "trace A (.safetensors from `plumb trace`, or a golden fixture folder)");
  auto* tb = cmd->add_option("--trace-b", o->trace_b, "trace B");
  // Two traces may also be named as diff(1) takes its files.
  auto traces = std::make_shared<std::vector<std::string>>();
  cmd->add_option("TRACES", *traces, "TRACE_A TRACE_B: the same as --trace-a TRACE_A --trace-b TRACE_B")
      ->expected(2)
      ->excludes(ta)
      ->excludes(tb);
  add_input_options(cmd, o->in);
  cmd->add_option("--a", o->a, "configuration A: [cpu:|cuda:]PATCHES (empty: the fp32 reference on the CPU)");
  cmd->add_option("--b", o->b, "configuration B: [cpu:|cuda:]PATCHES (empty: the fp32 reference on the CPU)");
  cmd->add_flag("--local", o->local,
                "teacher forcing: also run B on A's values at every sublayer boundary and report each op's own error "
                "(the first divergence then comes from these local errors)");
  cmd->add_option("--tol", o->tol, "override the registry tolerance (|err| <= tol x max(1, max|A|))")
      ->check(finite_number(true));
  cmd->add_option("--taps", o->taps, "show only taps matching these comma-separated globs (e.g. 'L0.*,*.ffn.out')");
  cmd->add_option("--layers", o->layers, "show only these layers (e.g. 0-3)");
  cmd->add_option("--positions", o->positions,
                  "compare only these token positions' rows, e.g. 33 or 0-5 (the first divergence and the diagnosis too; "
                  "every position still runs), such as the position `plumb kld` names for its maximum");
  cmd->add_option("--json", o->json, "write the report as JSON to this file")->check(output_file());
  cmd->add_option("--html", o->html, "write a self-contained HTML report (error-growth chart + tap table) to this file")->check(output_file());
  cmd->callback([o, traces] {
    if (!traces->empty()) o->trace_a = (*traces)[0], o->trace_b = (*traces)[1];
    set_exit_code(tools::diff(*o));
  });
}

}  // namespace plumb::cli
