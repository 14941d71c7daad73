// `plumb bench --layers`' report: the decode, A/B and prefill tables on stdout (Markdown), and the same results as
// JSON (every step's time, the per-op breakdown, --timeline's regions) and CSV.
#ifdef PLUMB_WITH_CUDA
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "core/strings.h"
#include "cuda/bench_layers_internal.h"

namespace plumb::cuda::bench_layers {

namespace {
std::string shown(const std::string& patches) { return patches.empty() ? std::string("none") : patches; }
// Per-op region -> us per step (keys sorted, as the JSON has always had them).
nlohmann::json breakdown_json(const std::vector<std::pair<std::string, double>>& b) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : b) j[k] = v;
  return j;
}
}  // namespace

void print_tables(const LayerBenchOptions& o, const LayerBenchResult& r) {
  const auto& dm = o.dims;
  const int L = o.layers;
  out(fmt::format("\nlayer stack: {} x [{}], copy bandwidth {} GB/s, load {:.1f} s\n", L, fmt::join(r.type_names, ", "),
                  fmt_num(r.copy_gbps, 0), r.load_s));
  out(fmt::format("| batch | us/step | us outside layers | us/layer | tokens/s | MB/layer | experts (expected / seen) | GB/s | % copy | "
      "implied {}-layer tokens/s |\n|---|---|---|---|---|---|---|---|---|---|\n", dm.model_layers));
  for (const auto& d : r.decode)
    out(fmt::format("| {} | {} | {} | {} | {} | {} | {} / {} | {} | {} | {} |\n", d.batch, fmt_num(d.us_step), fmt_num(d.us_non_layer),
                    fmt_num(d.us_layer), fmt_num(d.tok_s, 2), fmt_num(d.layer_bytes / 1e6), fmt_num(d.experts_expected),
                    fmt_num(d.experts_measured), fmt_num(d.gbps), fmt_num(d.pct), fmt_num(d.implied, 2)));
  out("us/layer = (step - the part outside the layers: the embed, head and sample regions' device time) / layers (an upper bound: host work in the step counts as layer time), averaged over the stack's layer types; MB/layer = the weights a "
      "layer must read at that batch (attention, compressor, indexer (with indexer.skip_short, while every measured step skips it: without its wq_b), router, shared expert, and the routed experts "
      "E(1-(1-k/E)^B) expected under uniform routing); implied = B / (" + std::to_string(dm.model_layers) +
      " x us/layer + us outside layers), " + dm.model + "'s layer count.\n");
  for (const auto& d : r.decode)
    if (!d.note.empty() || !d.error.empty())
      out(fmt::format("  batch {}: {}{}\n", d.batch, d.note, d.error.empty() ? "" : " error: " + d.error));
  if (r.ab) {
    out(fmt::format("A/B: A = [{}], B = [{}], pairs of decode steps in one process (the difference includes the part outside "
                    "the layers; per layer = difference / {})\n| batch | pairs | A us/step | B us/step | B - A | 95 % interval | "
                    "B - A per layer |\n|---|---|---|---|---|---|---|\n",
                    shown(r.patches), shown(r.ab_patches), L));
    for (const auto& d : r.decode)
      out(fmt::format("| {} | {} | {} | {} | {} | {} .. {} | {} |\n", d.batch, d.ab.pairs, fmt_num(d.ab.a), fmt_num(d.ab.b),
                      fmt_num(d.ab.diff), fmt_num(d.ab.lo), fmt_num(d.ab.hi), fmt_num(d.ab.diff / L)));
  }
  if (!r.sequences.empty()) {
    out("| sequences | us per step, together (logits to the host) | tokens/s | together, sampled on the device | tokens/s | "
        "us per step, one after another | tokens/s | speedup (sampled on the device) |\n"
        "|---|---|---|---|---|---|---|---|\n");
    for (const auto& q : r.sequences)
      out(fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} |\n", q.sessions, fmt_num(q.us_step), fmt_num(q.tok_s, 2),
                      fmt_num(q.us_sampled), fmt_num(q.tok_s_sampled, 2), fmt_num(q.us_alone), fmt_num(q.tok_s_alone, 2),
                      fmt_num(q.us_alone / q.us_sampled, 2)));
  }
  out("| prefill tokens | calls | seconds | tokens/s |\n|---|---|---|---|\n");
  for (const auto& p : r.prefill)
    out(fmt::format("| {} | {} | {} | {} |\n", p.tokens, p.chunks, p.skipped.empty() ? fmt_num(p.seconds, 2) : "skipped",
                    fmt_num(p.tok_s)));
}

bool write_json(const LayerBenchOptions& o, const LayerBenchResult& r) {
  if (o.json.empty()) return true;
  const int L = o.layers;
  ojson j;
  j["device"] = r.device;
  j["backend"] = o.backend;
  j["model"] = o.dims.model;
  j["model_layers"] = o.dims.model_layers;
  j["layers"] = L;
  j["layer_types"] = r.type_names;
  j["routing"] = "learned (sqrtsoftplus + bias) on every layer";
  j["patches"] = r.patches;
  j["ab_patches"] = r.ab ? ojson(r.ab_patches) : ojson(nullptr);
  j["copy_gbps"] = jnum(r.copy_gbps);
  j["checkpoint_bytes"] = r.checkpoint.bytes;
  j["checkpoint_reused"] = r.checkpoint.reused;
  j["checkpoint_dir"] = r.checkpoint_dir;
  j["checkpoint_removed"] = r.checkpoint_removed;
  j["generate_seconds"] = r.checkpoint.generate_s;
  j["load_seconds"] = r.load_s;
  j["context"] = o.context;
  if (o.context_alt) j["context_alt"] = o.context_alt;
  j["cold_l2"] = o.cold_l2 && o.backend == "cuda";
  j["prefill_chunk"] = o.prefill_chunk;
  j["batch_meaning"] = "B consecutive new tokens of one sequence per forward step";
  j["layer_decode"] = ojson::array();
  for (const auto& d : r.decode) {
    ojson timeline = ojson::array();  // --timeline: [name, start, end] per region
    for (const auto& s : d.timeline) timeline.push_back({s.name, s.start_us, s.end_us});
    j["layer_decode"].push_back({{"batch", d.batch},
                                 {"us_per_step", jnum(d.us_step)},
                                 {"us_per_step_min", jnum(d.us_step_min)},
                                 {"us_per_step_mean", jnum(d.us_step_mean)},
                                 {"steps_us", d.steps_us},
                                 {"us_non_layer", jnum(d.us_non_layer)},
                                 {"us_per_layer", jnum(d.us_layer)},
                                 {"breakdown_us", breakdown_json(d.breakdown)},
                                 {"timeline_us", timeline},
                                 {"skeleton_us_per_step", jnum(d.us_step_skeleton)},  // --skeleton
                                 {"skeleton_us_per_layer", jnum(d.us_layer_skeleton)},
                                 {"tokens_per_s", jnum(d.tok_s)},
                                 {"layer_bytes", jnum(d.layer_bytes)},
                                 {"gbps", jnum(d.gbps)},
                                 {"pct_copy", jnum(d.pct)},
                                 {"implied_model_tokens_per_s", jnum(d.implied)},  // x model_layers
                                 {"experts_expected", jnum(d.experts_expected)},
                                 {"experts_seen", jnum(d.experts_measured)},
                                 {"steps", d.steps},
                                 {"positions", {d.pos_first, d.pos_last}},
                                 {"context_prefill_seconds", jnum(d.context_s)},
                                 {"checkpoint", {{"mb", jnum(d.checkpoint_mb)}, {"mark_ms", jnum(d.mark_ms)},
                                                 {"rollback_ms", jnum(d.rollback_ms)}}},
                                 {"non_layer_measured", d.split_measured},
                                 {"ab", r.ab ? ojson{{"pairs", d.ab.pairs},
                                                     {"a_us_per_step", jnum(d.ab.a)},
                                                     {"b_us_per_step", jnum(d.ab.b)},
                                                     {"diff_us_per_step", jnum(d.ab.diff)},
                                                     {"diff_lo_us", jnum(d.ab.lo)},
                                                     {"diff_hi_us", jnum(d.ab.hi)},
                                                     {"diff_us_per_layer", jnum(d.ab.diff / L)},
                                                     {"error", d.ab_error}}
                                             : ojson(nullptr)},
                                 {"note", d.note},
                                 {"error", d.error}});
  }
  j["prefill"] = ojson::array();
  for (const auto& p : r.prefill)
    j["prefill"].push_back({{"tokens", p.tokens},
                            {"tokens_per_s", jnum(p.tok_s)},
                            {"seconds", jnum(p.seconds)},
                            {"calls", p.chunks},
                            {"call_seconds", p.chunk_s},
                            {"skipped", p.skipped},
                            {"error", p.error}});
  j["sequences"] = ojson::array();
  for (const auto& q : r.sequences)
    j["sequences"].push_back({{"sessions", q.sessions},
                              {"us_per_step", jnum(q.us_step)},
                              {"tokens_per_s", jnum(q.tok_s)},
                              {"us_per_step_one_after_another", jnum(q.us_alone)},
                              {"tokens_per_s_one_after_another", jnum(q.tok_s_alone)},
                              {"us_per_step_sampled_on_device", jnum(q.us_sampled)},
                              {"tokens_per_s_sampled_on_device", jnum(q.tok_s_sampled)},
                              {"rounds", q.steps},
                              {"rounds_replayed", q.replayed},
                              {"scratch_mb", jnum(q.scratch_mb)},
                              {"cache_mb_per_session", jnum(q.cache_mb)},
                              {"breakdown_us", breakdown_json(q.breakdown)},
                              {"note", q.note},
                              {"error", q.error}});
  j["sanity"] = r.sanity;
  j["total_seconds"] = r.total_s;
  std::ofstream f(o.json);
  f << j.dump(2) << "\n";
  if (!f) {
    std::fprintf(stderr, "error: plumb bench --layers: cannot write %s\n", o.json.c_str());
    return false;
  }
  out(fmt::format("wrote {}\n", o.json));
  return true;
}

bool write_csv(const LayerBenchOptions& o, const LayerBenchResult& r) {
  if (o.csv.empty()) return true;
  const std::string layers = std::to_string(o.layers);
  std::ofstream f(o.csv);
  auto num = [](double v) { return std::isfinite(v) ? fmt::format("{:.6g}", v) : std::string(); };
  f << csv_row({"kind", "batch_or_tokens", "us_per_step", "us_outside_layers", "us_per_layer", "tokens_per_s", "layer_bytes",
                "gbps", "pct_copy", "implied_model_tokens_per_s", "seconds", "layers", "patches", "note"});
  for (const auto& d : r.decode)
    f << csv_row({"decode", std::to_string(d.batch), num(d.us_step), num(d.us_non_layer), num(d.us_layer), num(d.tok_s),
                  num(d.layer_bytes), num(d.gbps), num(d.pct), num(d.implied), "", layers, r.patches,
                  d.error.empty() ? d.note : d.error});
  for (const auto& p : r.prefill)
    f << csv_row({"prefill", std::to_string(p.tokens), "", "", "", num(p.tok_s), "", "", "", "", num(p.seconds), layers, r.patches,
                  !p.skipped.empty() ? p.skipped : p.error});
  for (const auto& q : r.sequences)
    f << csv_row({"sequences", std::to_string(q.sessions), num(q.us_step), "", "", num(q.tok_s), "", "", "", "", "", layers, r.patches,
                  q.error.empty() ? fmt::format("sampled on the device: {} us per step, {} tokens/s; one after another: {} us per step, {} tokens/s",
                                                num(q.us_sampled), num(q.tok_s_sampled), num(q.us_alone), num(q.tok_s_alone))
                                  : q.error});
  if (!f) {
    std::fprintf(stderr, "error: plumb bench --layers: cannot write %s\n", o.csv.c_str());
    return false;
  }
  out(fmt::format("wrote {}\n", o.csv));
  return true;
}

}  // namespace plumb::cuda::bench_layers
#endif  // PLUMB_WITH_CUDA
