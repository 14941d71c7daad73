// `plumb diff`: compares two configurations tap by tap (two trace files, or two patch lists run live on one
// input), prints the table, the first divergence and a diagnosis; --json / --html write the same report.
#include <cstdio>
#include <fstream>

#include "cli/commands.h"
#include "toolkit/diff.h"

namespace plumb::cli {

namespace {

struct DiffCli {
  toolkit::DiffOptions opt;
  std::string taps, layers, json, html;
};

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  PLUMB_CHECK(f.good(), "cannot write {}", path);
  f << text;
  PLUMB_CHECK(f.good(), "error while writing {}", path);
}

}  // namespace

void register_diff(CLI::App& app) {
  auto c = std::make_shared<DiffCli>();
  auto* cmd = app.add_subcommand("diff",
                                 "Compare two configurations tap by tap: first diverging tap and a diagnosis "
                                 "(exit 0: no divergence, 1: divergence)");
  cmd->add_option("--trace-a", c->opt.trace_a, "trace A (.safetensors from `plumb trace`, or a golden fixture folder)");
  cmd->add_option("--trace-b", c->opt.trace_b, "trace B");
  cmd->add_option("--fixture", c->opt.fixture, "live: run the steps of this golden fixture (its folder is the model)");
  cmd->add_option("-m,--model", c->opt.model, "live: model folder (config.json + model.safetensors)");
  cmd->add_option("--tokens", c->opt.tokens, "live: token file (ids; one step per line)");
  cmd->add_option("--text", c->opt.text, "live: text file, tokenized with --tokenizer");
  cmd->add_option("--tokenizer", c->opt.tokenizer, "tokenizer.json for --text");
  cmd->add_option("--chunk", c->opt.chunk, "split --text into prefill chunks of this many tokens (0: one chunk)");
  cmd->add_option("--a", c->opt.a, "patches of configuration A (empty: the fp32 reference)");
  cmd->add_option("--b", c->opt.b, "patches of configuration B (empty: the fp32 reference)");
  cmd->add_flag("--local", c->opt.local,
                "teacher forcing: also run B on A's values at every sublayer boundary and report each op's own error "
                "(the first divergence then comes from these local errors)");
  cmd->add_option("--tol", c->opt.tol, "override the registry tolerance (|err| <= tol x max(1, max|A|))");
  cmd->add_option("--taps", c->taps, "show only taps matching these comma-separated globs (e.g. 'L0.*,*.ffn.out')");
  cmd->add_option("--layers", c->layers, "show only these layers (e.g. 0-3)");
  cmd->add_option("--json", c->json, "write the report as JSON to this file");
  cmd->add_option("--html", c->html, "write a self-contained HTML report (error-growth chart + tap table) to this file");
  cmd->callback([c] {
    if (!c->taps.empty() || !c->layers.empty()) {
      c->opt.filter = toolkit::TapFilter::parse(c->taps, c->layers, "", "");
      c->opt.has_filter = true;
    }
    const auto r = toolkit::run_diff(c->opt);
    if (!c->json.empty()) write_file(c->json, toolkit::report_json(r));
    if (!c->html.empty()) write_file(c->html, toolkit::report_html(r));
    toolkit::print_report(r);
    set_exit_code(r.first.none() ? 0 : 1);
  });
}

}  // namespace plumb::cli
