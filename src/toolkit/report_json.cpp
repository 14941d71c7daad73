// The machine-readable diff report (--json): the terminal report's content, one object.
#include <cmath>
#include <nlohmann/json.hpp>

#include "toolkit/diff.h"

namespace plumb::toolkit {

namespace {

using json = nlohmann::ordered_json;

// JSON has no inf/nan: they become strings so a reader can still tell them apart from 0.
json number(double v) {
  if (std::isfinite(v)) return v;
  return std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf";
}

json float_stats(const FloatStats& f, const std::vector<std::string>& steps) {
  json j;
  j["max_abs"] = number(f.max_abs);
  j["err_scaled"] = number(f.err_scaled());
  if (f.at >= 0)
    j["at"] = {{"step", steps[size_t(f.at_step)]}, {"coord", f.coord()}, {"position", f.at_pos >= 0 ? json(f.at_pos) : json(nullptr)},
               {"a", number(f.a_at)}, {"b", number(f.b_at)}};
  j["finite_pairs"] = f.finite_pairs;  // 0: the error figures below measure nothing
  j["rel_l2"] = f.finite_pairs ? number(f.rel_l2()) : json(nullptr);
  j["cosine"] = f.finite_pairs ? number(f.cosine()) : json(nullptr);
  j["max_ulp_bf16"] = f.max_ulp;
  j["nan_a"] = f.nan_a, j["nan_b"] = f.nan_b, j["inf_a"] = f.inf_a, j["inf_b"] = f.inf_b;
  j["nonfinite_mismatch"] = f.nonfinite_mismatch;
  j["numel"] = f.numel;
  return j;
}

json index_stats(const IndexStats& s, const std::vector<std::string>& steps) {
  return {{"rows", s.rows}, {"agree", s.agree}, {"near_ties", s.ties}, {"real_flips", s.real},
          {"max_tie_score_move", number(s.max_tie_move)}, {"first_bad", s.first_bad},
          {"first_bad_step", s.first_bad_step >= 0 ? json(steps[size_t(s.first_bad_step)]) : json(nullptr)}};
}

json divergence(const Divergence& d) {
  if (d.none()) return nullptr;
  return {{"tap", d.tap}, {"step", d.step_name}};
}

}  // namespace

std::string report_json(const DiffReport& r) {
  json j;
  j["format"] = "plumb-diff/1";
  j["a"] = r.a_patches, j["b"] = r.b_patches, j["input"] = r.source, j["model"] = r.model_dir;
  j["tolerance"] = r.tol, j["tolerance_local"] = r.tol_local, j["tolerance_source"] = r.tol_source, j["local"] = r.show_local;
  j["steps"] = r.step_names;
  // --positions: the token positions compared ("30-37"); null when every position was.
  j["positions"] = r.positions_filtered ? json(IntRanges::of(r.compared_positions).describe()) : json(nullptr);
  json taps = json::array();
  for (const auto& row : r.rows) {
    json t;
    t["name"] = row.name;
    t["kind"] = row.is_index ? "index" : "float";
    t["compared"] = !(row.only_a || row.only_b);
    if (!row.shape_note.empty()) t["shape_mismatch"] = row.shape_note;
    t["diverges"] = row.diverges;
    t["first_step"] = row.first_step >= 0 ? json(r.step_names[size_t(row.first_step)]) : json(nullptr);
    t["free"] = row.is_index ? index_stats(row.ix, r.step_names) : float_stats(row.f, r.step_names);
    if (row.has_local) {
      t["local_diverges"] = row.local_diverges;
      t["local"] = row.is_index ? index_stats(row.lix, r.step_names) : float_stats(row.lf, r.step_names);
    }
    taps.push_back(std::move(t));
  }
  j["taps"] = std::move(taps);
  j["first_divergence"] = divergence(r.first);
  j["first_divergence_free"] = divergence(r.first_free);
  j["first_divergence_local"] = divergence(r.first_local);
  j["diagnosis"] = {{"kind", r.diagnosis.kind}, {"text", r.diagnosis.text}, {"evidence", r.diagnosis.evidence},
                    {"layers", r.diagnosis.layers}};
  j["notes"] = r.notes;
  j["seconds"] = r.seconds;
  return j.dump(1) + "\n";
}

}  // namespace plumb::toolkit
