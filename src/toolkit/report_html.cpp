// The self-contained HTML report (--html): header with the first divergence and diagnosis, a per-layer
// error-growth chart drawn as inline SVG (no script, no network), and the tap table.
#include <algorithm>
#include <cmath>
#include <map>

#include "toolkit/diff.h"
#include "toolkit/tap_names.h"

namespace plumb::toolkit {

namespace {

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

struct Series {
  std::string suffix, color;
  bool local;
  std::map<int, double> rel;  // layer -> rel L2 (may be 0 or inf)
};

constexpr double kFloor = -12;  // log10 of an exact match is drawn here

std::string chart(const DiffReport& r) {
  const char* colors[] = {"#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"};
  const std::vector<std::string> suffixes = {"out", "attn.out", "ffn.out", "ffn.routed", "hc_attn.collapsed", "hc_ffn.collapsed"};
  int max_layer = -1;
  for (const auto& row : r.rows) max_layer = std::max(max_layer, parse_tap(row.name).layer);
  if (max_layer < 0) return "<p class=note>No per-layer taps in this report: no chart.</p>";
  std::vector<Series> series;
  const bool have_local = std::any_of(r.rows.begin(), r.rows.end(), [](const TapRow& x) { return x.has_local; });
  for (size_t i = 0; i < suffixes.size(); ++i)
    for (int pass = 0; pass < (have_local ? 2 : 1); ++pass) {
      Series s{suffixes[i], colors[i % 7], pass == 1, {}};
      for (const auto& row : r.rows) {
        const TapName t = parse_tap(row.name);
        if (t.layer < 0 || t.suffix != s.suffix || row.is_index) continue;
        if (s.local && !row.has_local) continue;
        s.rel[t.layer] = s.local ? row.lf.rel_l2() : row.f.rel_l2();
      }
      if (!s.rel.empty()) series.push_back(std::move(s));
    }
  double lo = 0, hi = -20;
  for (const auto& s : series)
    for (const auto& [l, v] : s.rel)
      if (v > 0 && std::isfinite(v)) lo = std::min(lo, std::log10(v)), hi = std::max(hi, std::log10(v));
  if (hi < lo) hi = lo = -6;
  lo = std::max(kFloor, std::floor(lo) - 1), hi = std::max(std::ceil(hi), lo + 2);
  const double W = 960, H = 420, L = 70, R = 230, T = 20, B = 50;
  const double pw = W - L - R, ph = H - T - B;
  auto X = [&](double layer) { return L + (max_layer == 0 ? pw / 2 : pw * layer / max_layer); };
  auto Y = [&](double lg) { return T + ph * (hi - std::clamp(lg, lo, hi)) / (hi - lo); };
  std::string svg = fmt::format(
      "<svg xmlns='http://www.w3.org/2000/svg' width='{0}' height='{1}' viewBox='0 0 {0} {1}' role='img' "
      "aria-label='per-layer error growth'>\n<rect x='0' y='0' width='{0}' height='{1}' fill='#ffffff'/>\n",
      W, H);
  // Grid and axes.
  for (double g = lo; g <= hi + 1e-9; g += 1) {
    svg += fmt::format("<line x1='{}' y1='{:.1f}' x2='{}' y2='{:.1f}' stroke='#e5e5e5'/>", L, Y(g), L + pw, Y(g));
    svg += fmt::format("<text x='{}' y='{:.1f}' font-size='12' text-anchor='end' fill='#333'>1e{}</text>\n", L - 6, Y(g) + 4, int(g));
  }
  for (int l = 0; l <= max_layer; ++l) {
    svg += fmt::format("<line x1='{:.1f}' y1='{}' x2='{:.1f}' y2='{}' stroke='#f0f0f0'/>", X(l), T, X(l), T + ph);
    svg += fmt::format("<text x='{:.1f}' y='{}' font-size='12' text-anchor='middle' fill='#333'>L{}</text>\n", X(l), T + ph + 18, l);
  }
  svg += fmt::format("<rect x='{}' y='{}' width='{}' height='{}' fill='none' stroke='#888'/>\n", L, T, pw, ph);
  svg += fmt::format("<text x='{}' y='{}' font-size='13' text-anchor='middle' fill='#222'>layer</text>\n", L + pw / 2, H - 8);
  svg += fmt::format("<text x='16' y='{}' font-size='13' text-anchor='middle' fill='#222' transform='rotate(-90 16 {})'>"
                     "relative L2 error ||B-A|| / ||A|| (log10)</text>\n",
                     T + ph / 2, T + ph / 2);
  if (!r.first.none()) {
    const TapName t = parse_tap(r.first.tap);
    if (t.layer >= 0)
      svg += fmt::format("<line x1='{0:.1f}' y1='{1}' x2='{0:.1f}' y2='{2}' stroke='#d62728' stroke-dasharray='6 4'/>"
                         "<text x='{3:.1f}' y='{4}' font-size='11' fill='#d62728'>first divergence</text>\n",
                         X(t.layer), T, T + ph, X(t.layer) + 4, T + 12);
  }
  // Series.
  int li = 0;
  for (const auto& s : series) {
    std::string pts;
    for (const auto& [l, v] : s.rel) {
      const double lg = v > 0 ? std::log10(v) : kFloor;
      pts += fmt::format("{:.1f},{:.1f} ", X(l), Y(std::isfinite(lg) ? lg : hi));
    }
    svg += fmt::format("<polyline points='{}' fill='none' stroke='{}' stroke-width='2'{}/>\n", pts, s.color,
                       s.local ? " stroke-dasharray='5 4'" : "");
    for (const auto& [l, v] : s.rel) {
      const bool exact = v == 0;
      const double lg = exact ? kFloor : std::log10(v);
      // Exact matches: hollow circles on the bottom line; local points are smaller.
      svg += fmt::format("<circle cx='{:.1f}' cy='{:.1f}' r='{}' fill='{}' stroke='{}'><title>L{}.{}{}: {}</title></circle>",
                         X(l), Y(std::isfinite(lg) ? lg : hi), s.local ? 2.5 : 3.5, exact ? "#fff" : s.color, s.color, l,
                         s.suffix, s.local ? " (local)" : "", exact ? "exact (0)" : err_text(v));
    }
    const double ly = T + 8 + 18 * li++;
    svg += fmt::format("<line x1='{0}' y1='{1:.1f}' x2='{2}' y2='{1:.1f}' stroke='{3}' stroke-width='2'{4}/>"
                       "<text x='{5}' y='{6:.1f}' font-size='12' fill='#222'>{7}{8}</text>\n",
                       L + pw + 14, ly, L + pw + 40, s.color, s.local ? " stroke-dasharray='5 4'" : "", L + pw + 46, ly + 4,
                       esc(s.suffix == "out" ? "L.out (residual)" : s.suffix), s.local ? " (local)" : "");
  }
  svg += fmt::format("<text x='{}' y='{}' font-size='11' fill='#666'>hollow at 1e{}: exact match</text>\n", L + pw + 14,
                     T + 8 + 18 * li + 8, int(lo));
  return svg + "</svg>\n";
}

std::string status_cell(const TapRow& row, bool local) {
  const bool div = local ? row.local_diverges : row.diverges;
  if (!local && (row.only_a || row.only_b)) return "<td class=na>not compared</td>";
  if (!row.shape_note.empty()) return "<td class=bad>SHAPE</td>";
  if (!div) return "<td class=ok>ok</td>";
  if (row.is_index) return (local ? row.lix : row.ix).real ? "<td class=bad>FLIP</td>" : "<td class=warn>TIE</td>";
  const FloatStats& f = local ? row.lf : row.f;
  return f.nonfinite_mismatch ? "<td class=bad>NaN/Inf</td>" : "<td class=bad>DIVERGES</td>";
}

}  // namespace

std::string report_html(const DiffReport& r) {
  const bool L = std::any_of(r.rows.begin(), r.rows.end(), [](const TapRow& x) { return x.has_local; });
  std::string h;
  h += "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>plumb diff report</title>\n<style>\n"
       "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;color:#222;background:#fafafa}\n"
       "h1{font-size:20px;margin:0 0 8px} .meta{color:#555;font-size:13px;margin:2px 0}\n"
       ".verdict{background:#fff;border:1px solid #ddd;border-left:5px solid #d62728;padding:10px 14px;margin:14px 0}\n"
       ".verdict.none{border-left-color:#2ca02c} .verdict b{font-family:monospace}\n"
       "table{border-collapse:collapse;font-size:12px;background:#fff} th,td{border:1px solid #ddd;padding:3px 6px;white-space:nowrap;"
       "text-align:right;font-family:ui-monospace,monospace} th{background:#f0f0f0} td.name,th.name{text-align:left}\n"
       "td.ok{color:#2a7a2a} td.bad{color:#fff;background:#d62728} td.warn{background:#ffd27f} td.na{color:#999}\n"
       "tr.first td.name{font-weight:bold;background:#ffe9e9} .note{color:#666;font-size:12px}\n"
       "ul{margin:4px 0 0 18px;padding:0;font-size:12px;color:#444}\n</style></head><body>\n";
  h += fmt::format("<h1>plumb diff: A [{}] vs B [{}]</h1>\n", esc(r.a_patches.empty() ? "reference" : r.a_patches),
                   esc(r.b_patches.empty() ? "reference" : r.b_patches));
  h += fmt::format("<p class=meta>input: {} ({} steps) &middot; tolerance: |err| &le; {:g} &times; max(1, max|A|){} ({})</p>\n",
                   esc(r.source), r.step_names.size(), r.tol,
                   L ? fmt::format(", teacher-forced {:g}", r.tol_local) : "", esc(r.tol_source));
  h += fmt::format("<div class='verdict{}'><div>first divergence: <b>{}</b>{}</div><div>diagnosis: {}</div>",
                   r.first.none() ? " none" : "", esc(r.first.none() ? "none" : r.first.tap),
                   r.first.none() ? "" : " (step " + esc(r.first.step_name) + ")", esc(r.diagnosis.text));
  if (!r.diagnosis.evidence.empty()) {
    h += "<ul>";
    for (const auto& e : r.diagnosis.evidence) h += "<li>" + esc(e) + "</li>";
    h += "</ul>";
  }
  h += "</div>\n<h2 style='font-size:16px'>Error growth per layer</h2>\n" + chart(r);
  h += "<p class=note>Solid: free-running (A and B each continue from their own values). Dashed: teacher-forced "
       "(B's op run on A's inputs: the op's own error).</p>\n";
  h += "<h2 style='font-size:16px'>Taps in execution order</h2>\n<table>\n<tr><th class=name>tap</th><th>max|err|</th><th>err/scale</th>"
       "<th>step</th><th>at</th><th>A</th><th>B</th><th>rel L2</th><th>cosine</th><th>bf16 ulp</th><th>NaN+Inf A/B</th><th>status</th>";
  if (L) h += "<th>local err/scale</th><th>local rel L2</th><th>local</th>";
  h += "</tr>\n";
  for (const auto& row : r.rows) {
    h += fmt::format("<tr{}><td class=name>{}</td>", row.name == r.first.tap ? " class=first" : "", esc(row.name));
    if (row.is_index) {
      h += fmt::format("<td colspan=10 style='text-align:left'>sets agree {}/{} rows{}{}{}</td>", row.ix.agree, row.ix.rows,
                       row.ix.ties ? fmt::format(", {} near-tie", row.ix.ties) : "",
                       row.ix.real ? fmt::format(", {} real", row.ix.real) : "",
                       row.ix.first_bad.empty() ? "" : "; " + esc(row.ix.first_bad));
    } else if (row.only_a || row.only_b || !row.shape_note.empty()) {
      h += fmt::format("<td colspan=10 style='text-align:left'>{}</td>",
                       esc(!row.shape_note.empty() ? row.shape_note : row.only_a ? "only in A" : "only in B"));
    } else if (row.f.finite_pairs == 0) {
      h += fmt::format("<td colspan=10 style='text-align:left'>no element finite on both sides ({}/{} NaN+Inf in A/B)</td>",
                       row.f.nan_a + row.f.inf_a, row.f.nan_b + row.f.inf_b);
    } else {
      const FloatStats& f = row.f;
      h += fmt::format("<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.6f}</td>"
                       "<td>{}</td><td>{}/{}</td>",
                       err_text(f.max_abs), err_text(f.err_scaled()), f.at >= 0 ? esc(r.step_names[size_t(f.at_step)]) : "-",
                       esc(f.coord()) + (f.at_pos >= 0 ? fmt::format(" (position {})", f.at_pos) : ""),
                       f.at >= 0 ? fmt::format("{:.6g}", f.a_at) : "-",
                       f.at >= 0 ? fmt::format("{:.6g}", f.b_at) : "-", err_text(f.rel_l2()), f.cosine(), f.max_ulp,
                       f.nan_a + f.inf_a, f.nan_b + f.inf_b);
    }
    h += status_cell(row, false);
    if (L) {
      if (!row.has_local) h += "<td>-</td><td>-</td><td class=na>-</td>";
      else if (row.is_index) h += fmt::format("<td colspan=2>sets agree {}/{}</td>", row.lix.agree, row.lix.rows) + status_cell(row, true);
      else h += fmt::format("<td>{}</td><td>{}</td>", err_text(row.lf.err_scaled()), err_text(row.lf.rel_l2())) + status_cell(row, true);
    }
    h += "</tr>\n";
  }
  h += "</table>\n";
  for (const auto& n : r.notes) h += "<p class=note>note: " + esc(n) + "</p>\n";
  h += fmt::format("<p class=note>generated by plumb diff in {:.3f} s; self-contained (no scripts, no network).</p>\n", r.seconds);
  return h + "</body></html>\n";
}

}  // namespace plumb::toolkit
