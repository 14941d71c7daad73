// The toolkit's commands behind the public entry points of plumb/tools.h (trace, diff, kld, bisect, selftest,
// the patch list): input resolution, running, printing the reports, exit status. The CLI only parses options.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string_view>

#include "core/strings.h"
#include "patches/registry.h"
#include "plumb/tools.h"
#include "toolkit/bisect.h"
#include "toolkit/diff.h"
#include "toolkit/kld.h"
#include "toolkit/selftest.h"
#include "toolkit/tap_filter.h"
#include "toolkit/trace.h"

namespace plumb::tools {

namespace {

toolkit::RunInput resolve(const InputSpec& in) {
  return toolkit::resolve_input(in.fixture, in.model, in.tokens, in.text, in.tokenizer, in.chunk);
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  PLUMB_CHECK(f.good(), "cannot write {}", path);
  f << text;
  PLUMB_CHECK(f.good(), "error while writing {}", path);
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

// The input options as a command line takes them (the diff that kld prints for its maximum).
std::string input_args(const InputSpec& in) {
  using toolkit::shell_quote;
  std::string s = !in.fixture.empty() ? "--fixture " + shell_quote(in.fixture) : std::string();
  if (!in.model.empty()) append_item(s, "-m " + shell_quote(in.model), ' ');
  if (!in.tokens.empty()) append_item(s, "--tokens " + shell_quote(in.tokens), ' ');
  if (!in.text.empty()) append_item(s, "--text " + shell_quote(in.text), ' ');
  if (!in.tokenizer.empty()) append_item(s, "--tokenizer " + shell_quote(in.tokenizer), ' ');
  if (in.chunk > 0) append_item(s, fmt::format("--chunk {}", in.chunk), ' ');
  return s;
}

// Each --layers, --steps and --positions item must reach the model's layers or the input's steps and positions:
// checked before the run, which may be long (the --taps globs are checked against the taps the run produced).
void check_filter_reaches(const toolkit::TapFilter& f, const toolkit::RunInput& in, int64_t n_layers) {
  if (in.steps.empty()) return;
  for (const auto& [a, b] : f.layers.ranges)
    PLUMB_CHECK(a < n_layers, "--layers: layer {} is beyond the model's {} layers (0-{})", a, n_layers, n_layers - 1);
  for (const auto& want : f.steps) {
    bool found = false;
    for (size_t i = 0; i < in.steps.size() && !found; ++i) found = toolkit::TapFilter::step_item_names(want, in.steps[i].name, i);
    PLUMB_CHECK(found, "--steps: {} names no step of {} (its {} steps: {} to {}, or indices 0 to {})", want, in.source,
                in.steps.size(), in.steps.front().name, in.steps.back().name, in.steps.size() - 1);
  }
  toolkit::check_positions_reach(f.positions, in);
  // The steps and positions together must keep a row: a trace of [0, ...] tensors compares equal to anything.
  int64_t rows = 0;
  for (size_t i = 0; i < in.steps.size(); ++i)
    if (f.keeps_step(in.steps[i].name, i))
      for (int64_t p = in.steps[i].start_pos; p < in.steps[i].start_pos + int64_t(in.steps[i].tokens.size()); ++p)
        rows += f.keeps_position(p);
  PLUMB_CHECK(rows > 0, "--steps {} and --positions {} keep no row of {}: no kept step holds one of those positions",
              f.steps.empty() ? std::string("(all)") : join(f.steps), f.positions.describe(),
              in.source);
}

}  // namespace

int trace(const TraceOptions& o) {
  const auto in = resolve(o.in);
  const auto filter = toolkit::TapFilter::parse(o.taps, o.layers, o.steps, o.positions);
  const auto model = toolkit::load_model(in.model_dir, o.patches);
  check_filter_reaches(filter, in, model->config().n_layers);
  const auto t = toolkit::run_trace(*model, in, o.patches, &filter);
  filter.check_matches(t.offered);
  toolkit::write_trace(t, o.out);
  size_t tensors = 0;
  for (const auto& d : t.data) tensors += d.order.size();
  fmt::print("trace: {} steps of {}, patches [{}], {}: {} tensors ({} taps) -> {} ({:.1f} KiB) + {}\n", t.steps.size(),
             in.source, o.patches.empty() ? "reference" : o.patches, filter.describe(), tensors, t.tap_order().size(), o.out,
             double(std::filesystem::file_size(o.out)) / 1024.0, toolkit::index_path_for(o.out));
  return 0;
}

int diff(const DiffOptions& o) {
  toolkit::DiffOptions d;
  d.trace_a = o.trace_a, d.trace_b = o.trace_b;
  d.fixture = o.in.fixture, d.model = o.in.model, d.tokens = o.in.tokens, d.text = o.in.text;
  d.tokenizer = o.in.tokenizer, d.chunk = o.in.chunk;
  d.a = o.a, d.b = o.b, d.local = o.local, d.tol = o.tol;
  d.positions = toolkit::IntRanges::parse(o.positions, "--positions");
  if (!o.taps.empty() || !o.layers.empty()) {
    d.filter = toolkit::TapFilter::parse(o.taps, o.layers, "", "");
    d.has_filter = true;
  }
  const auto r = toolkit::run_diff(d);
  toolkit::print_report(r);  // first: a file that cannot be written (a full disk) does not take the report with it
  std::fflush(stdout);
  if (!o.json.empty()) write_file(o.json, toolkit::report_json(r));
  if (!o.html.empty()) write_file(o.html, toolkit::report_html(r));
  return r.first.none() ? 0 : 1;
}

int kld(const KldOptions& o) {
  PLUMB_CHECK(o.save_ref.empty() || o.ref.empty(), "--save-ref and --ref are two separate steps: give one");
  if (!o.save_ref.empty()) {
    toolkit::save_kld_ref(resolve(o.in), o.a, o.save_ref, o.topk);
    return 0;
  }
  toolkit::KldReport r;
  if (!o.ref.empty()) {
    PLUMB_CHECK(o.a.empty(), "--a has no effect with --ref (A is the saved configuration)");
    if (o.in.given()) {
      const auto in = resolve(o.in);
      r = toolkit::kld_against_ref(o.ref, in.model_dir, o.b, &in);
    } else {
      r = toolkit::kld_against_ref(o.ref, o.in.model.empty() ? o.in.fixture : o.in.model, o.b, nullptr);
    }
  } else {
    r = toolkit::kld_live(resolve(o.in), o.a, o.b);
  }
  if (o.in.given()) r.input_args = input_args(o.in);
  toolkit::print_kld(r);
  if (!o.json.empty()) write_file(o.json, toolkit::kld_json(r));
  return 0;
}

int bisect(const BisectOptions& opt) {
  toolkit::BisectOptions o;
  o.input = resolve(opt.in);
  for (const char* b : {"cpu:", "cuda:"})
    PLUMB_CHECK(opt.patches.rfind(b, 0) != 0, "--patches {}: bisect takes patch names; the backend is --backend {}",
                opt.patches, std::string_view(b).substr(0, std::string_view(b).size() - 1));
  o.patches = toolkit::split_patch_list(opt.patches);
  o.criterion = opt.kld_threshold >= 0 ? "kld" : opt.criterion;
  o.kld_threshold = opt.kld_threshold;
  PLUMB_CHECK(o.criterion != "kld" || opt.kld_threshold >= 0, "--criterion kld needs --threshold-kld X");
  o.verbose = !opt.quiet;
  o.backend = opt.backend;
  toolkit::check_options(o);
  fmt::print("plumb bisect: {} patches on {}{}, criterion: {}\n", o.patches.size(), o.input.source,
             o.backend == "cuda" ? " (backend cuda)" : "",
             o.criterion == "kld"    ? fmt::format("mean KLD against the reference > {:g}", o.kld_threshold)
             : o.criterion == "free" ? std::string("free-running taps beyond the registry's fp32 tolerance")
                                     : std::string("teacher-forced (local) op errors beyond the registry's local tolerance"));
  const auto r = toolkit::bisect(o);
  for (const auto& n : r.notes) fmt::print("note: {}\n", n);
  if (!r.full_diverges) {
    fmt::print("bisect: the patches do not diverge together ({} tests, {:.2f} s): nothing to bisect\n", r.tests, r.seconds);
    return 1;
  }
  std::string names;
  for (const auto& cu : r.culprits) {
    const std::string set = join(cu.patches);
    names += (names.empty() ? "" : "; ") + set;
    fmt::print("culprit: {} (first divergence {}{}; diagnosis: {}){}\n", set, cu.first.none() ? "none" : cu.first.tap,
               cu.first.none() ? "" : " at step " + cu.first.step_name, cu.diagnosis,
               cu.alone_ok.empty() ? "" : fmt::format(" [an interaction: {} alone do(es) not diverge]", join(cu.alone_ok)));
  }
  fmt::print("bisect: {} culprit{}: {} ({} tests, {:.2f} s)\n", r.culprits.size(), r.culprits.size() == 1 ? "" : "s", names,
             r.tests, r.seconds);
  return 0;
}

int selftest(const std::vector<std::string>& fixtures, const std::string& backend) {
  const auto r = toolkit::run_selftest(
      fixtures,
      [](const toolkit::SelftestCase& c) {
        fmt::print("{}\n", toolkit::format_case(c));
        std::fflush(stdout);
      },
      backend);
  fmt::print("{} passed, {} failed{}\n", r.passed, r.failed, r.skipped ? fmt::format(", {} skipped", r.skipped) : "");
  return r.failed ? 1 : 0;
}

void print_patches() {
  fmt::print("{:<24} {:>8} {:>8} {:>8}  {}\n", "name", "fp32", "local", "bf16", "replaces / description / risk");
  for (const auto& p : patch_registry()) {
    if (p.fault) continue;
    fmt::print("{:<24} {:>8.0e} {:>8.0e} {:>8.0e}  replaces {}{}\n{:<52}{}\n{:<52}risk: {}\n", p.name, p.tol.fp32, p.tol.local,
               p.tol.bf16, p.replaces,
               p.numerics_mode       ? " (a numerics mode: verified against its own goldens)"
               : !p.backend.empty() ? fmt::format(" (backend {} only)", p.backend)
                                    : "",
               "", p.description, "", p.risk);
  }
  fmt::print("\npresets (accepted wherever a patch name is; a patch also named beside its preset counts once):\n");
  for (const auto& pr : patch_presets()) {
    std::string members;
    for (const auto& m : pr.patches) append_item(members, m);
    fmt::print("{:<24} {}\n{:<24} = {}\n", pr.name, pr.description, "", members);
  }
  fmt::print("\nbuilt-in faults (deliberate bugs for testing the toolkit; enabled only when named):\n");
  for (const auto& p : patch_registry())
    if (p.fault) fmt::print("{:<30}  {}: {}\n", p.name, p.replaces, p.description);
  fmt::print("\ntolerances: |err| <= tol x max(1, max|ref|) per tensor; fp32: free-running on the CPU reference, local: teacher\n"
             "forced (verify-golden --mode forced: each op fed the golden's inputs), bf16: on a bf16 backend. With several patches\n"
             "the loosest applies.\n"
             "verify-golden runs each fixture in its own numerics (numerics.official, or numerics.official_initial for a golden\n"
             "of the official code's release-day revision, where DeepSeek's official code made it; numerics.reference\n"
             "otherwise) unless --patches names a numerics mode; {} names that choice.\n",
             kFixtureNumerics);
}

}  // namespace plumb::tools
