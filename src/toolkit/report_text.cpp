// The terminal report of plumb diff: one row per tap in execution order, then the machine-readable lines.
#include <cmath>
#include <cstdio>

#include "toolkit/diff.h"

namespace plumb::toolkit {

namespace {

std::string val(double v) { return fmt::format("{:.6g}", v); }

std::string status(const TapRow& r, bool local) {
  const bool div = local ? r.local_diverges : r.diverges;
  const FloatStats& f = local ? r.lf : r.f;
  const IndexStats& ix = local ? r.lix : r.ix;
  if (!local && r.only_a) return "only in A";
  if (!local && r.only_b) return "only in B";
  if (!r.shape_note.empty()) return "SHAPE";
  if (!div) return "ok";
  if (r.is_index) return ix.real ? "FLIP" : "TIE";
  if (f.nonfinite_mismatch) return f.nan_b > f.nan_a ? "NaN" : "NONFINITE";
  return "DIVERGES";
}

std::string index_cell(const IndexStats& s) {
  std::string o = fmt::format("sets agree {}/{} rows", s.agree, s.rows);
  if (s.ties) o += fmt::format(", {} near-tie", s.ties);
  if (s.real) o += fmt::format(", {} real", s.real);
  return o;
}

}  // namespace

void print_report(const DiffReport& r) {
  fmt::print("plumb diff: A [{}] vs B [{}]\n", r.a_patches.empty() ? "reference" : r.a_patches,
             r.b_patches.empty() ? "reference" : r.b_patches);
  fmt::print("input     {} ({} steps)\n", r.source, r.step_names.size());
  fmt::print("tolerance |err| <= {:g} x max(1, max|A|) per tap{} ({})\n", r.tol,
             r.show_local ? fmt::format(", {:g} teacher-forced", r.tol_local) : "", r.tol_source);
  fmt::print("columns   max|err| and where (step, coordinate, A, B); err/scale = max|err| / max(1, max|A|); rel L2 = "
             "||B-A||/||A||; ulp = max bf16 ULP distance; nonfin = NaN+Inf in A/B\n\n");
  const bool L = r.show_local;
  fmt::print("{:<24} {:>10} {:>10} {:>5} {:<14} {:>12} {:>12} {:>10} {:>10} {:>6} {:>7}  {:<9}", "tap", "max|err|",
             "err/scale", "step", "at", "A", "B", "rel L2", "cosine", "ulp", "nonfin", "status");
  if (L) fmt::print(" | {:>10} {:>10}  {:<9}", "local e/s", "local rL2", "local");
  fmt::print("\n");
  for (const auto& row : r.rows) {
    std::string line = fmt::format("{:<24} ", row.name);
    if (row.only_a || row.only_b) {
      line += fmt::format("{:<107}  {:<9}", "(not compared)", status(row, false));
    } else if (!row.shape_note.empty()) {
      line += fmt::format("{:<107}  {:<9}", row.shape_note, status(row, false));
    } else if (row.is_index) {
      std::string cell = index_cell(row.ix);
      if (!row.ix.first_bad.empty())
        cell += fmt::format("; first: step {} {}", r.step_names[size_t(std::max(0, row.ix.first_bad_step))], row.ix.first_bad);
      line += fmt::format("{:<107}  {:<9}", cell, status(row, false));
    } else if (row.f.finite_pairs == 0) {  // (B all NaN where A is finite, or no rows): no error to measure
      line += fmt::format("{:<107}  {:<9}", fmt::format("no element finite on both sides ({}/{} NaN+Inf in A/B)",
                                                          row.f.nan_a + row.f.inf_a, row.f.nan_b + row.f.inf_b),
                          status(row, false));
    } else {
      const FloatStats& f = row.f;
      const std::string step = f.at >= 0 ? r.step_names[size_t(f.at_step)] : "-";
      line += fmt::format("{:>10} {:>10} {:>5} {:<14} {:>12} {:>12} {:>10} {:>10.6f} {:>6} {:>7}  {:<9}", err_text(f.max_abs),
                          err_text(f.err_scaled()), step, f.coord(), f.at >= 0 ? val(f.a_at) : "-", f.at >= 0 ? val(f.b_at) : "-",
                          err_text(f.rel_l2()), f.cosine(), f.max_ulp, fmt::format("{}/{}", f.nan_a + f.inf_a, f.nan_b + f.inf_b),
                          status(row, false));
    }
    if (L) {
      if (!row.has_local) line += fmt::format(" | {:>10} {:>10}  {:<9}", "-", "-", "-");
      else if (row.is_index) line += fmt::format(" | {:<21}  {:<9}", index_cell(row.lix), status(row, true));
      else line += fmt::format(" | {:>10} {:>10}  {:<9}", err_text(row.lf.err_scaled()), err_text(row.lf.rel_l2()), status(row, true));
    }
    fmt::print("{}\n", line);
  }
  fmt::print("\n");
  for (const auto& n : r.notes) fmt::print("note: {}\n", n);
  if (L) {
    fmt::print("first free-running divergence (includes inherited drift): {}\n",
               r.first_free.none() ? "none" : r.first_free.tap + " (step " + r.first_free.step_name + ")");
  }
  if (!r.first.none()) {
    const TapRow* row = r.row(r.first.tap);
    if (row && !row->is_index) {
      const FloatStats& f = L ? row->lf : row->f;
      fmt::print("where: {} first exceeds tolerance {:g} at step {}; its largest error is at step {} {}{}: A {} vs B {} "
                 "(err/scale {}){}\n",
                 r.first.tap, L ? r.tol_local : r.tol, r.first.step_name,
                 f.at >= 0 ? r.step_names[size_t(f.at_step)] : "-", f.coord(),
                 f.at_pos >= 0 ? fmt::format(" (position {})", f.at_pos) : "", val(f.a_at), val(f.b_at),
                 err_text(f.err_scaled()),
                 f.nonfinite_mismatch ? fmt::format(", {} NaN/Inf mismatches", f.nonfinite_mismatch) : "");
    } else if (row) {
      const IndexStats& ix = L ? row->lix : row->ix;
      fmt::print("where: {} first differs at step {}: {}\n", r.first.tap, r.first.step_name, ix.first_bad);
    }
  }
  if (!r.diagnosis.evidence.empty()) {
    fmt::print("evidence:\n");
    for (const auto& e : r.diagnosis.evidence) fmt::print("  {}\n", e);
  }
  size_t one_sided = 0;
  for (const auto& row : r.rows) one_sided += row.only_a || row.only_b;
  fmt::print("compared {} taps{} over {} steps{} in {:.3f} s\n", r.rows.size() - one_sided,
             one_sided ? fmt::format(" ({} more in one run only)", one_sided) : "", r.step_names.size(),
             r.positions_filtered ? fmt::format(" ({} with rows at the positions compared)", r.steps_with_rows) : "",
             r.seconds);
  fmt::print("first divergence: {}\n", r.first.none() ? "none" : r.first.tap);
  fmt::print("diagnosis: {}\n", r.diagnosis.text);
  std::fflush(stdout);
}

}  // namespace plumb::toolkit
