// plumb diff: tap-by-tap comparison of two traces, the first divergence, and the live two-configuration run.
#include "toolkit/diff.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <set>

#include "model/config.h"
#include "patches/registry.h"
#include "toolkit/tap_names.h"

namespace plumb::toolkit {

namespace {

bool is_hash_layer(const ModelConfig* cfg, int layer) {
  return cfg && layer >= 0 && size_t(layer) < cfg->mlp.size() && cfg->mlp[size_t(layer)] == MlpType::Hash;
}

// The selection scores behind an index tap, present on both sides (null when none).
std::pair<const Tensor*, const Tensor*> scores_of(const StepTaps& A, const StepTaps& B, const std::string& name) {
  for (const auto& s : selection_score_taps(name))
    if (A.f(s) && B.f(s)) return {A.f(s), B.f(s)};
  return {nullptr, nullptr};
}

// Compares one tap of one step; returns whether it diverges there.
bool compare_step(const StepTaps& A, const StepTaps& B, const std::string& name, double tol, const ModelConfig* cfg,
                  int step, TapRow& row, FloatStats& fs, IndexStats& is) {
  if (const IndexTensor* x = A.i(name)) {
    const IndexTensor* y = B.i(name);
    if (!y) {
      row.shape_note = B.f(name) ? "B has floats where A has indices" : row.shape_note;
      return B.f(name) != nullptr;
    }
    if (x->dim(0) != y->dim(0)) {
      row.shape_note = fmt::format("shape {} vs {}", shape_str(x->shape), shape_str(y->shape));
      return true;
    }
    const TapName t = parse_tap(name);
    const auto [sa, sb] = scores_of(A, B, name);
    IndexStats s = compare_index(*x, *y, sa, sb, t.suffix == "ffn.gate.indices" && is_hash_layer(cfg, t.layer), tol,
                                 &A.positions);
    if (!s.first_bad.empty()) s.first_bad_step = step;
    is.merge(s);
    return s.diverges();
  }
  const Tensor* x = A.f(name);
  const Tensor* y = B.f(name);
  if (!x || !y) return false;
  if (x->shape != y->shape) {
    row.shape_note = fmt::format("shape {} vs {}", shape_str(x->shape), shape_str(y->shape));
    return true;
  }
  FloatStats s = compare_f32(*x, *y);
  s.at_step = step;
  // Every tap's rows are the step's kept positions (a trace filtered by --positions keeps some of them).
  if (s.at >= 0 && x->dim(0) > 0 && x->dim(0) == int64_t(A.positions.size()))
    s.at_pos = A.positions[size_t(s.at / (x->numel() / x->dim(0)))];
  fs.merge(s);
  return s.nonfinite_mismatch > 0 || s.err_scaled() > tol;
}

Divergence first_of(const DiffReport& r, bool local) {
  Divergence d;
  for (const auto& row : r.rows) {
    const int s = local ? row.local_first_step : row.first_step;
    if (s >= 0 && (d.step < 0 || s < d.step)) d.tap = row.name, d.step = s;
  }
  if (d.step >= 0) d.step_name = r.step_names[size_t(d.step)];
  return d;
}

bool is_reference_label(const std::string& p) { return p.empty() || p.front() == '('; }

// A recorded trace may have been recorded with --positions itself: every range asked for must meet a row it kept.
void check_traces_hold(const Trace& t, const std::string& path, const IntRanges& positions) {
  std::vector<int64_t> held;
  for (const auto& d : t.data) held.insert(held.end(), d.positions.begin(), d.positions.end());
  for (const auto& [lo, hi] : positions.ranges) {
    bool any = false;
    for (int64_t p : held) any |= p >= lo && p <= hi;
    PLUMB_CHECK(any, "--positions: trace {} holds no row of position{} {}{} (it holds {} row{}{})", path,
                lo == hi ? "" : "s", lo, lo == hi ? "" : fmt::format("-{}", hi), held.size(), held.size() == 1 ? "" : "s",
                held.empty() ? "" : ", of positions " + IntRanges::of(held).describe());
  }
}

}  // namespace

const TapRow* DiffReport::row(const std::string& name) const {
  for (const auto& r : rows)
    if (r.name == name) return &r;
  return nullptr;
}

PairTolerance pair_tolerance(const std::string& a, const std::string& b) {
  const PatchSet pa = parse_config(is_reference_label(a) ? "" : a).patches, pb = parse_config(is_reference_label(b) ? "" : b).patches;
  const std::string bn = pb.active.empty() ? "reference" : pb.names();
  bool a_is_baseline = true;  // only numerics modes, each also active in B
  for (const Patch* p : pa.active)
    a_is_baseline &= p->numerics_mode && std::find(pb.active.begin(), pb.active.end(), p) != pb.active.end();
  PairTolerance t;
  if (a_is_baseline) {
    t.free = pb.tolerance_fp32(), t.local = pb.tolerance_local();
    t.how = pa.active.empty() ? fmt::format("registry tolerance of B [{}]", bn)
                              : fmt::format("registry tolerance of B [{}] over its numerics mode A [{}]", bn, pa.names());
  } else {
    t.free = pa.tolerance_fp32() + pb.tolerance_fp32(), t.local = pa.tolerance_local() + pb.tolerance_local();
    t.how = fmt::format("registry tolerances of A [{}] + B [{}] (each may be that far from the reference)", pa.names(), bn);
  }
  return t;
}

DiffReport compare_traces(const Trace& a, const Trace& b, const Trace* local, const PairTolerance& tol,
                          const ModelConfig* cfg) {
  PLUMB_CHECK(a.steps.size() == b.steps.size(), "the traces cover different steps: {} in A ({}) vs {} in B ({})",
              a.steps.size(), a.source, b.steps.size(), b.source);
  for (size_t si = 0; si < a.steps.size(); ++si) {
    PLUMB_CHECK(a.steps[si].name == b.steps[si].name && a.steps[si].tokens == b.steps[si].tokens &&
                    a.steps[si].start_pos == b.steps[si].start_pos,
                "the traces are of different inputs: step {} of A ({}) and step {} of B ({}) differ in name, start or tokens",
                a.steps[si].name, a.source, b.steps[si].name, b.source);
    PLUMB_CHECK(a.data[si].positions == b.data[si].positions,
                "step {}: the traces keep different token positions (trace both with the same --positions)", a.steps[si].name);
  }
  DiffReport r;
  r.a_patches = a.patches, r.b_patches = b.patches, r.source = a.source, r.model_dir = a.model_dir;
  r.tol = tol.free, r.tol_local = tol.local, r.tol_source = tol.how;
  for (const auto& s : a.steps) r.step_names.push_back(s.name);
  for (const auto& d : a.data) {
    r.compared_positions.insert(r.compared_positions.end(), d.positions.begin(), d.positions.end());
    r.steps_with_rows += !d.positions.empty();
  }
  // A's execution order; taps only B has go right after their predecessor in B's order.
  std::vector<std::string> order = a.tap_order();
  const std::vector<std::string> ob = b.tap_order();
  for (size_t i = 0; i < ob.size(); ++i)
    if (std::find(order.begin(), order.end(), ob[i]) == order.end()) {
      auto at = i == 0 ? order.begin() : std::find(order.begin(), order.end(), ob[i - 1]);
      order.insert(at == order.end() ? order.end() : i == 0 ? at : at + 1, ob[i]);
    }
  for (const auto& name : order) {
    TapRow row;
    row.name = name;
    bool in_a = false, in_b = false;
    for (size_t si = 0; si < a.steps.size(); ++si) {
      const StepTaps &A = a.data[si], &B = b.data[si];
      in_a |= A.has(name), in_b |= B.has(name);
      row.is_index |= A.i(name) != nullptr;
      if (!A.has(name) || !B.has(name)) continue;
      if (compare_step(A, B, name, tol.free, cfg, int(si), row, row.f, row.ix) && row.first_step < 0) row.first_step = int(si);
      if (local && si < local->data.size() && local->data[si].has(name)) {
        row.has_local = true;
        if (compare_step(A, local->data[si], name, tol.local, cfg, int(si), row, row.lf, row.lix) &&
            row.local_first_step < 0)
          row.local_first_step = int(si);
      }
    }
    row.only_a = in_a && !in_b, row.only_b = in_b && !in_a;
    row.diverges = row.first_step >= 0;
    row.local_diverges = row.local_first_step >= 0;
    r.rows.push_back(std::move(row));
  }
  r.first_free = first_of(r, false);
  if (local) r.first_local = first_of(r, true);
  r.first = r.first_free;
  return r;
}

RunInput resolve_input(const std::string& fixture, const std::string& model, const std::string& tokens,
                       const std::string& text, const std::string& tokenizer, int64_t chunk) {
  const int given = !fixture.empty() + !tokens.empty() + !text.empty();
  PLUMB_CHECK(given == 1, "give exactly one input: --fixture DIR, or -m MODEL_DIR with --tokens FILE or --text FILE");
  // Options of the text input only: elsewhere they would be ignored.
  PLUMB_CHECK(text.empty() ? chunk == 0 : true, "--chunk splits a --text input into prefill chunks; {} has its own steps",
              !fixture.empty() ? "--fixture" : "--tokens");
  PLUMB_CHECK(text.empty() ? tokenizer.empty() : true, "--tokenizer tokenizes a --text input; {} holds token ids",
              !fixture.empty() ? "--fixture" : "--tokens");
  if (!fixture.empty()) {
    RunInput in = input_from_fixture(fixture);
    if (!model.empty()) in.model_dir = model;  // the fixture's steps on another model folder
    return in;
  }
  PLUMB_CHECK(!model.empty(), "--tokens / --text need -m MODEL_DIR (a folder with config.json and model.safetensors)");
  std::error_code ec;
  PLUMB_CHECK(std::filesystem::is_directory(model, ec), "-m {} is not a folder (the model folder: config.json and model.safetensors)",
              model);
  RunInput in = !tokens.empty() ? input_from_tokens(model, tokens) : input_from_text(model, text, tokenizer, chunk);
  // Past the model's context the comparison still holds (both configurations see the same positions), but the
  // model itself is outside what it was made for: a perplexity there says little about the model. Said, not refused.
  int64_t n = 0;
  for (const auto& s : in.steps) n += int64_t(s.tokens.size());
  const int64_t ctx = ModelConfig::load((std::filesystem::path(model) / "config.json").string()).max_positions;
  if (ctx > 0 && n > ctx)
    fmt::print(stderr, "note: {} is {} tokens, beyond the model's context of {} (max_position_embeddings): positions "
               "from {} on are outside what the model was made for\n", in.source, n, ctx, ctx);
  return in;
}

DiffReport diff_live(const RunInput& in, const std::string& a, const std::string& b, bool local, double tol_override,
                     const IntRanges& positions) {
  const auto t0 = std::chrono::steady_clock::now();
  const PatchSet pa = parse_config(a).patches;
  parse_config(b);  // validate both configurations before running anything
  check_positions_reach(positions, in);
  const auto ma = load_model(in.model_dir, a);
  const auto mb = load_model(in.model_dir, b);
  // A runs whole: teacher forcing feeds B A's values at every row. What is compared (ta) is A's kept rows.
  const Trace ta_all = run_trace(*ma, in, a, nullptr, nullptr, "A");
  Trace tb = run_trace(*mb, in, b, nullptr, nullptr, "B"), ta_kept;
  keep_positions(tb, positions);
  if (!positions.empty()) ta_kept = ta_all, keep_positions(ta_kept, positions);
  const Trace& ta = positions.empty() ? ta_all : ta_kept;
  PairTolerance tol = pair_tolerance(a, b);
  if (tol_override > 0) tol = {tol_override, tol_override, "--tol"};
  const ModelConfig& cfg = ma->config();
  DiffReport r = compare_traces(ta, tb, nullptr, tol, &cfg);
  // Teacher forcing is what separates an op's own error from inherited drift: run it whenever there is a
  // divergence to explain, and always when the local columns are asked for.
  Trace tl;
  const bool have_local = local || !r.first_free.none();
  if (have_local) {
    tl = run_trace(*mb, in, b, nullptr, &ta_all, "B teacher forced");
    keep_positions(tl, positions);
    r = compare_traces(ta, tb, &tl, tol, &cfg);
  }
  r.show_local = local;
  r.first = local ? r.first_local : r.first_free;
  std::unique_ptr<ModelView> view;
  if (!r.first_free.none() || !r.first.none()) {
    std::string why;
    view = try_load_model_view(in.model_dir, &why);
    if (!view) r.notes.push_back("hypothesis recomputation off: " + why);
  }
  // The explanation is sharpest at the first op whose own (teacher-forced) error exceeds tolerance, even when
  // the reported divergence is the free-running one. When no op does, the divergence is inherited drift (a
  // near-tie flip, small errors amplified): explain the free-running divergence from the free-running taps.
  const bool use_local = have_local && !r.first_local.none();
  DiagnosisInput di{ta, tb, use_local ? &tl : nullptr, use_local ? r.first_local : r.first_free,
                    use_local ? tol.local : tol.free, &cfg, view.get(), pa.options};
  r.diagnosis = diagnose(di);
  if (have_local && r.first_local.none() && !r.first_free.none())
    r.diagnosis.evidence.insert(r.diagnosis.evidence.begin(),
                                "teacher forcing: no op exceeds tolerance on its own inputs, so the free-running "
                                "divergence is accumulated drift");
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

DiffReport run_diff(const DiffOptions& opt) {
  const bool traces = !opt.trace_a.empty() || !opt.trace_b.empty();
  DiffReport r;
  if (traces) {
    PLUMB_CHECK(!opt.trace_a.empty() && !opt.trace_b.empty(), "trace mode needs both traces (plumb diff A B, or --trace-a "
                "and --trace-b)");
    PLUMB_CHECK(opt.fixture.empty() && opt.tokens.empty() && opt.text.empty() && !opt.local && opt.a.empty() &&
                    opt.b.empty() && opt.model.empty() && opt.tokenizer.empty() && opt.chunk == 0,
                "two recorded traces are compared as they are: --fixture, -m, --tokens, --text, --tokenizer, --chunk, --a, "
                "--b and --local belong to a live run");
    const auto t0 = std::chrono::steady_clock::now();
    Trace ta = read_trace(opt.trace_a), tb = read_trace(opt.trace_b);
    check_traces_hold(ta, opt.trace_a, opt.positions);
    check_traces_hold(tb, opt.trace_b, opt.positions);
    keep_positions(ta, opt.positions);
    keep_positions(tb, opt.positions);
    std::string why;
    PairTolerance tol = pair_tolerance(ta.patches, tb.patches);
    if (opt.tol > 0) tol = {opt.tol, opt.tol, "--tol"};
    auto view = try_load_model_view(ta.model_dir, &why);
    const ModelConfig* cfg = view ? &view->cfg : nullptr;
    r = compare_traces(ta, tb, nullptr, tol, cfg);
    if (!view) r.notes.push_back("model folder of trace A not readable (" + why + "): no hash-layer split, no recomputation");
    r.notes.push_back("traces only: no teacher forcing (run diff live for local errors)");
    r.diagnosis = diagnose(DiagnosisInput{ta, tb, nullptr, r.first, tol.free, cfg, view.get(),
                                          ta.patches.empty() || ta.patches.front() == '(' ? ModelOptions{}
                                                                                          : parse_config(ta.patches).patches.options});
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } else {
    PLUMB_CHECK(!opt.fixture.empty() || !opt.tokens.empty() || !opt.text.empty(),
                "give two traces to compare (plumb diff A B) or one input to run --a and --b on: --fixture DIR, or -m "
                "MODEL_DIR with --tokens FILE or --text FILE");
    const RunInput in = resolve_input(opt.fixture, opt.model, opt.tokens, opt.text, opt.tokenizer, opt.chunk);
    r = diff_live(in, opt.a, opt.b, opt.local, opt.tol, opt.positions);
  }
  if (!opt.positions.empty()) {
    // The positions compared, as the input has them (a range may reach past the input's end, or a trace hold part of it).
    r.positions_filtered = true;
    r.notes.push_back(fmt::format("positions {} only ({} row{} in {} of {} steps): the table, the first divergence and the "
                                  "diagnosis cover these rows{}; a coordinate's first index counts the step's kept rows",
                                  r.compared_positions.empty() ? "none" : IntRanges::of(r.compared_positions).describe(),
                                  r.compared_positions.size(),
                                  r.compared_positions.size() == 1 ? "" : "s", r.steps_with_rows, r.step_names.size(),
                                  traces ? "" : " (every position ran: the earlier ones feed them)"));
  }
  if (opt.has_filter) {
    std::vector<std::string> names;
    for (const auto& row : r.rows) names.push_back(row.name);
    opt.filter.check_matches(names);
    std::vector<TapRow> kept;
    for (auto& row : r.rows)
      if (opt.filter.keeps_tap(row.name)) kept.push_back(std::move(row));
    r.rows = std::move(kept);
    r.notes.push_back("table filtered: " + opt.filter.describe() + " (first divergence and diagnosis use every tap)");
  }
  return r;
}

}  // namespace plumb::toolkit
