// plumb diff: compares two configurations tap by tap (from trace files, or run live on one input), finds the
// first diverging tap and diagnoses it; with teacher forcing (local mode) each op's own error is separated
// from the drift it inherits.
#pragma once
#include <string>
#include <vector>

#include "toolkit/diagnosis.h"
#include "toolkit/metrics.h"
#include "toolkit/tap_filter.h"
#include "toolkit/trace.h"

namespace plumb::toolkit {

struct TapRow {
  std::string name;
  bool is_index = false;
  bool only_a = false, only_b = false;  // present in one trace only (not compared)
  std::string shape_note;               // set when the shapes differ (counts as a divergence)
  FloatStats f;                         // free-running comparison, aggregated over steps
  IndexStats ix;
  bool diverges = false;
  int first_step = -1;                  // first step index where it diverges
  // Teacher-forced (local) comparison: A against B fed A's values at every substitutable tap.
  bool has_local = false;
  FloatStats lf;
  IndexStats lix;
  bool local_diverges = false;
  int local_first_step = -1;
};

struct DiffReport {
  std::string a_patches, b_patches, source, model_dir;
  double tol = 0;           // |err| <= tol * max(1, max|A|) per tap, free-running
  double tol_local = 0;     // the same for teacher-forced (local) comparisons
  std::string tol_source;   // where the tolerances came from (registry entries or --tol)
  bool show_local = false;  // --local: print the local columns, first divergence from teacher forcing
  std::vector<TapRow> rows;  // execution order
  std::vector<std::string> step_names;
  // --positions: the token positions whose rows were compared (A's kept rows) and how many steps had any.
  bool positions_filtered = false;
  std::vector<int64_t> compared_positions;
  int steps_with_rows = 0;
  Divergence first;         // the reported one (local when show_local, else free-running)
  Divergence first_free, first_local;
  Diagnosis diagnosis;
  std::vector<std::string> notes;
  double seconds = 0;

  const TapRow* row(const std::string& name) const;
};

// Compares traces of the same input (same steps and tokens; an Error otherwise). `local` may be null; `cfg`
// (may be null) tells hash-routed layers apart (their selection is a table lookup: never a near tie).
struct PairTolerance {
  double free = 0, local = 0;
  std::string how;
};
DiffReport compare_traces(const Trace& a, const Trace& b, const Trace* local, const PairTolerance& tol,
                          const ModelConfig* cfg);

// The tolerances of comparing configuration B against A (registry: tolerance_fp32 free-running, tolerance_local
// teacher-forced): B's when A is the reference, or when A holds only numerics modes that B also has (a
// numerics mode is the reference its patches are measured against); otherwise A's plus B's (each may be that
// far from the reference). Labels that are not patch lists (a golden fixture's "(golden: ...)") count as the
// reference.
PairTolerance pair_tolerance(const std::string& a_patches, const std::string& b_patches);

struct DiffOptions {
  // Trace mode: two trace files (or golden fixture folders).
  std::string trace_a, trace_b;
  // Live mode: an input and two patch lists ("" = the reference).
  std::string fixture, model, tokens, text, tokenizer;
  int64_t chunk = 0;
  std::string a, b;
  bool local = false;   // teacher-forced columns; the first divergence comes from them
  double tol = -1;      // > 0 overrides the registry tolerance
  TapFilter filter;     // rows shown (the diagnosis always sees every tap)
  bool has_filter = false;
  // Token positions compared (empty: all). Every position still runs (the earlier ones feed the later); the table,
  // the first divergence and the diagnosis see only these rows. A recorded trace must hold them.
  IntRanges positions;
};

// Resolves the input of a live run from fixture / model + tokens / text options (shared by diff, kld, bisect).
RunInput resolve_input(const std::string& fixture, const std::string& model, const std::string& tokens,
                       const std::string& text, const std::string& tokenizer, int64_t chunk);

DiffReport run_diff(const DiffOptions& opt);
// Live diff of two patch lists on a prepared input (selftest, bisect and tests use this); `positions` as in
// DiffOptions.
DiffReport diff_live(const RunInput& in, const std::string& a, const std::string& b, bool local, double tol = -1,
                     const IntRanges& positions = {});

// Renderers. print_report ends with exactly one "first divergence: <tap>" line and one "diagnosis: <text>" line.
void print_report(const DiffReport& r);
std::string report_json(const DiffReport& r);
std::string report_html(const DiffReport& r);

}  // namespace plumb::toolkit
