// The diagnosis: from the first diverging tap to a one-line explanation, checked against A's taps (scale fits,
// row sums, recomputed hypotheses) rather than guessed from the tap name alone.
#include "toolkit/diagnosis.h"

#include <cmath>
#include <filesystem>
#include <set>

#include "toolkit/diagnosis_util.h"
#include "toolkit/tap_names.h"

namespace plumb::toolkit {

using namespace detail;

std::unique_ptr<ModelView> try_load_model_view(const std::string& dir, std::string* why) {
  namespace fs = std::filesystem;
  try {
    PLUMB_CHECK(!dir.empty() && fs::exists(fs::path(dir) / "config.json"), "no config.json in '{}'", dir);
    auto v = std::make_unique<ModelView>();
    v->cfg = ModelConfig::load((fs::path(dir) / "config.json").string());
    v->ck = Checkpoint::open(dir);
    v->w = ModelWeights::bind(v->ck, v->cfg);
    return v;
  } catch (const std::exception& e) {
    if (why) *why = e.what();
    return nullptr;
  }
}

std::string rsf_relation(double c, double rsf, int* power) {
  if (std::abs(rsf - 1.0) < 1e-6) return "";
  const std::pair<int, const char*> table[] = {{1, "applied twice"},
                                               {2, "applied twice (B = rsf^2 x A: twice in B, or missing in A)"},
                                               {-1, "missing"},
                                               {-2, "missing (B = A / rsf^2: missing in B, or applied twice in A)"}};
  for (const auto& [p, name] : table)
    if (near(c, std::pow(rsf, p))) {
      if (power) *power = p;
      return name;
    }
  return "";
}

std::string layer_phrase(const std::vector<int>& layers, const std::vector<int>& candidates, const ModelConfig* cfg) {
  std::vector<int> hash, learned;
  if (cfg)
    for (int l : candidates) (size_t(l) < cfg->mlp.size() && cfg->mlp[size_t(l)] == MlpType::Hash ? hash : learned).push_back(l);
  const char* s = layers.size() == 1 ? "" : "s";
  if (layers.empty()) return "on no layer";
  if (layers == candidates && candidates.size() > 1)
    return candidates.size() == 2 ? fmt::format("on both layers ({})", layers_str(layers))
                                  : fmt::format("on all {} layers ({})", layers.size(), layers_str(layers));
  if (cfg && !hash.empty() && layers == hash) return fmt::format("on hash-routed layer{} {} only", s, layers_str(layers));
  if (cfg && !learned.empty() && !hash.empty() && layers == learned)
    return fmt::format("on learned-routing layer{} {} only (not on hash-routed layer{} {})", s, layers_str(layers),
                       hash.size() == 1 ? "" : "s", layers_str(hash));
  return fmt::format("on layer{} {}", s, layers_str(layers));
}

namespace {

struct Origin {
  std::string tap;
  int step = -1;
  int64_t count = 0;
  bool nan = false;
};

// First tap (step-major, execution order) where B holds NaN/Inf at positions where A is finite.
Origin nonfinite_origin(const Trace& a, const Trace& b) {
  Origin o;
  for (size_t si = 0; si < a.data.size() && si < b.data.size(); ++si)
    for (const auto& tap : a.data[si].order) {
      const Tensor* x = a.data[si].f(tap);
      const Tensor* y = b.data[si].f(tap);
      if (!x || !y || x->shape != y->shape) continue;
      for (int64_t i = 0; i < x->numel(); ++i)
        if (std::isfinite((*x)[i]) && !std::isfinite((*y)[i])) ++o.count, o.nan |= std::isnan((*y)[i]);
      if (o.count) return o.tap = tap, o.step = int(si), o;
    }
  return o;
}

std::vector<int> moe_layers(const Trace& a) {
  std::set<int> s;
  for (const auto& n : a.tap_order())
    if (is_moe_tap(n)) s.insert(parse_tap(n).layer);
  return {s.begin(), s.end()};
}

// Where the reference's selected router logits put a row: fp32 exp underflows to exactly 0 below about -103.3
// (so even a stable softplus is 0), log(1 + exp(x)) is exactly 0 below -16.6, exp overflows above 88.7.
std::string low_logit_note(double max_logit) {
  if (max_logit <= -1e299) return "";
  if (max_logit < -103.3)
    return fmt::format("; the reference's selected router logits there are <= {:.1f}, where even a stable fp32 softplus "
                       "is exactly 0",
                       max_logit);
  if (max_logit < -16.6)
    return fmt::format("; the reference's selected router logits there are <= {:.1f}, where a naive log(1 + exp(x)) is "
                       "exactly 0 in fp32 (x < -16.6)",
                       max_logit);
  return fmt::format("; the reference's selected router logits there reach {:.1f}", max_logit);
}

Diagnosis moe_diagnosis(const DiagnosisInput& in, const Trace& src, bool forced, int first_layer) {
  Diagnosis d;
  const auto layers = moe_layers(in.a);
  const double rsf = in.cfg ? in.cfg->routed_scaling : 1.0;
  std::vector<MoeLayer> an;
  for (int l : layers) an.push_back(analyze_moe_layer(in.a, src, forced, l, in.tol, in.cfg, forced || l == first_layer));
  const MoeLayer* m0 = nullptr;
  for (const auto& m : an)
    if (m.layer == first_layer) m0 = &m;
  if (!m0 || m0->verdict == MoeVerdict::Absent || m0->verdict == MoeVerdict::Ok) return d;  // not an MoE story
  const MoeVerdict v = m0->verdict;
  // Verdicts that hold for a free-running layer after the first divergence (they do not depend on its input).
  const bool input_free = v == MoeVerdict::NanWeights || v == MoeVerdict::ZeroWeights || v == MoeVerdict::SharedScaled ||
                          ((v == MoeVerdict::Missing || v == MoeVerdict::Twice) && !m0->w_ok);
  std::vector<int> same;
  MoeLayer sum;  // row counts and logit bounds over the layers with this verdict
  for (const auto& m : an) {
    if (m.verdict != v) continue;
    same.push_back(m.layer);
    sum.zero_rows += m.zero_rows, sum.nan_rows += m.nan_rows;
    sum.nan_zero_rows += m.nan_zero_rows, sum.nan_overflow_rows += m.nan_overflow_rows;
    sum.zero_rows_max_logit = std::max(sum.zero_rows_max_logit, m.zero_rows_max_logit);
    sum.nan_zero_rows_max_logit = std::max(sum.nan_zero_rows_max_logit, m.nan_zero_rows_max_logit);
    sum.nan_overflow_max_logit = std::max(sum.nan_overflow_max_logit, m.nan_overflow_max_logit);
  }
  d.layers = same;
  std::string where = layer_phrase(same, layers, in.cfg);
  if (!forced && !input_free && same.size() == 1)
    where = fmt::format("at layer {} (the first diverging layer; later layers need teacher forcing to separate)", first_layer);
  for (const auto& m : an)
    d.evidence.push_back(fmt::format(
        "L{}{}: {}; gate.logits err {}, gate weight row sums B/A {} ({} vs {}), ffn.routed = {} x A (resid {}), "
        "ffn.shared = {} x A, ffn.out vs routed+shared {} / vs rsf x (routed+shared) {}{}",
        m.layer, m.hash ? " (hash)" : "", verdict_name(m.verdict), fmt_g(m.logits_err), fmt_g(m.w_ratio), fmt_g(m.w_sum_b),
        fmt_g(m.w_sum_a), fmt_g(m.routed.c), fmt_g(m.routed.resid), fmt_g(m.shared.c), fmt_g(m.out_vs_sum),
        fmt_g(m.out_vs_scaled),
        m.zero_rows + m.nan_rows ? fmt::format(", {} all-zero / {} NaN weight rows ({} of them 0/0, {} overflow)", m.zero_rows,
                                               m.nan_rows, m.nan_zero_rows, m.nan_overflow_rows)
                                 : ""));
  switch (v) {
    case MoeVerdict::NanWeights: {
      // Name every mechanism seen: 0/0 of an unfloored renormalization, inf/inf of overflowed scores.
      std::vector<std::string> parts;
      if (sum.nan_zero_rows)
        parts.push_back(fmt::format("renormalization divided 0 by 0 (unfloored): NaN routed weights on {} tokens {}, "
                                    "where every selected router score is 0{}; floor the sum (sum + 1e-20)",
                                    sum.nan_zero_rows, where, low_logit_note(sum.nan_zero_rows_max_logit)));
      if (sum.nan_overflow_rows)
        parts.push_back(fmt::format("router scores overflowed to inf (naive softplus? log(1 + exp(x)) is inf above 88.7 "
                                    "in fp32): NaN routed weights (inf/inf) on {} tokens {}; the reference's selected "
                                    "router logits there reach {:.1f}",
                                    sum.nan_overflow_rows, where, sum.nan_overflow_max_logit));
      if (const int64_t other = sum.nan_rows - sum.nan_zero_rows - sum.nan_overflow_rows; other > 0)
        parts.push_back(fmt::format("NaN routed weights on {} tokens {} from finite router logits", other, where));
      if (sum.zero_rows)
        parts.push_back(fmt::format("routed weights all zero on {} tokens: router scores underflowed (naive softplus?){}",
                                    sum.zero_rows, low_logit_note(sum.zero_rows_max_logit)));
      d.kind = sum.nan_zero_rows ? "renorm_nan" : sum.nan_overflow_rows ? "scores_overflow" : "nonfinite";
      for (const auto& p : parts) d.text += (d.text.empty() ? "" : "; also ") + p;
      break;
    }
    case MoeVerdict::ZeroWeights:
      d.kind = "scores_underflow";
      d.text = fmt::format("routed weights all zero on {} tokens {}: router scores underflowed (naive softplus?){}",
                           sum.zero_rows, where, low_logit_note(sum.zero_rows_max_logit));
      break;
    case MoeVerdict::Missing:
    case MoeVerdict::Twice: {
      const bool via_w = !m0->w_ok;
      const double c = via_w ? m0->w_ratio : m0->routed.c;
      const std::string rel = rsf_relation(c, rsf);
      d.kind = v == MoeVerdict::Missing ? "rsf_missing" : "rsf_twice";
      if (via_w)
        d.text = fmt::format("routed_scaling_factor {} {}: the gate weights sum to {} instead of {} ({} x, rsf = {}){}",
                             rel, where, fmt_g(m0->w_sum_b), fmt_g(m0->w_sum_a), fmt_g(c), fmt_g(rsf),
                             m0->routed.valid ? fmt::format(" and ffn.routed = {} x reference", fmt_g(m0->routed.c)) : "");
      else
        d.text = fmt::format("routed_scaling_factor {} {}: ffn.routed = {} x reference (rsf = {}) while the gate weights "
                             "agree{}",
                             rel, where, fmt_g(c), fmt_g(rsf), v == MoeVerdict::Twice ? " (they already include it)" : "");
      break;
    }
    case MoeVerdict::SharedScaled:
      d.kind = "shared_scaled";
      d.text = fmt::format("routed_scaling_factor applied to routed + shared: the shared expert is scaled {} (ffn.out = "
                           "rsf x (routed + shared), rel err {}, while ffn.shared itself {} and the gate weights are {} x)",
                           where, fmt_g(m0->out_vs_scaled), m0->shared_ok ? "agrees" : "differs", fmt_g(m0->w_ratio));
      break;
    case MoeVerdict::RouterLogits: {
      Tensor la, lb;
      cat_pair(in.a, src, fmt::format("L{}.ffn.gate.logits", first_layer), la, lb);
      const ScaleFit f = fit_scale(la, lb);
      d.kind = "router_logits";
      d.text = fmt::format("router logits differ at layer {} (err {} of scale, B = {} x A, resid {}): the router GEMM or "
                           "its input precision",
                           first_layer, fmt_g(m0->logits_err), fmt_g(f.c), fmt_g(f.resid));
      break;
    }
    case MoeVerdict::Flip: return d;  // explained by the index analysis
    case MoeVerdict::Weights:
      d.kind = "gate_weights";
      d.text = fmt::format("gate weights differ at layer {} while logits and selection agree (row sums B/A {}): the "
                           "score function or the renormalization",
                           first_layer, fmt_g(m0->w_ratio));
      break;
    case MoeVerdict::Scale:
      d.kind = "scale";
      d.text = fmt::format("ffn.routed = {} x reference at layer {} (a pure scale, not a power of rsf = {})",
                           fmt_g(m0->routed.c), first_layer, fmt_g(rsf));
      break;
    case MoeVerdict::Expert: {
      const SwigluCheck s = check_swiglu(in, src, first_layer);
      if (s.evaluated && s.matches_unclamped) {
        d.kind = "expert_swiglu";
        d.text = fmt::format("SwiGLU clamps missing (swiglu_limit {} not applied) {}: {} equals the unclamped SwiGLU of "
                             "the reference's input (rel err {}, vs {} from the reference) while routing agrees",
                             fmt_g(in.cfg ? in.cfg->swiglu_limit : 0), where, s.tap, fmt_g(s.err_unclamped),
                             fmt_g(s.err_b_vs_a));
      } else {
        d.kind = "expert";
        d.text = fmt::format("expert outputs differ {} while routing agrees (not a scale: ffn.routed = {} x A, resid {}){}",
                             where, fmt_g(m0->routed.c), fmt_g(m0->routed.resid),
                             s.evaluated ? fmt::format("; not the SwiGLU clamps (the unclamped recompute is off by {})",
                                                       fmt_g(s.err_unclamped))
                                         : "; SwiGLU clamps missing? (" + s.why_not + ")");
      }
      break;
    }
    case MoeVerdict::Combine:
      d.kind = "moe_combine";
      d.text = fmt::format("MoE combine wrong {}: ffn.out differs from routed + shared (rel err {}) while both agree",
                           where, fmt_g(m0->out_vs_sum));
      break;
    default: return d;
  }
  return d;
}

Diagnosis hc_diagnosis(const DiagnosisInput& in, const Trace& src, bool forced, const TapName& t) {
  Diagnosis d;
  // hc_attn.* of layer i reads L<i-1>.out: the mixing to blame is layer i-1's hc_post after its MoE.
  int layer = t.layer;
  std::string suffix = t.suffix;
  if (suffix.rfind("hc_attn.", 0) == 0) layer -= 1, suffix = "out";
  HcCheck c = check_hc_post(in, src, layer, suffix);
  if (!(c.evaluated && c.matches_untransposed) && suffix != "out") {
    const HcCheck o = check_hc_post(in, src, layer, "out");
    if (o.evaluated && o.matches_untransposed) c = o;
  }
  if (c.evaluated)
    d.evidence.push_back(fmt::format("{}: B vs A rel err {}; B vs post*y + C.R recomputed from A's taps {}; A vs "
                                     "post*y + C^T.R recomputed {}",
                                     c.tap, fmt_g(c.err_b_vs_a), fmt_g(c.err_untransposed), fmt_g(c.err_recompute_a)));
  if (c.evaluated && c.matches_untransposed) {
    // Which layers: with teacher forcing every layer's L<i>.out is B's hc_post on A's inputs.
    std::vector<int> hit{layer}, all{layer};
    if (forced) {
      hit.clear(), all.clear();
      for (const auto& name : in.a.tap_order()) {
        const TapName u = parse_tap(name);
        if (u.layer < 0 || u.suffix != "out") continue;
        all.push_back(u.layer);
        const HcCheck h = check_hc_post(in, src, u.layer, "out");
        if (h.evaluated && h.matches_untransposed && h.err_b_vs_a > 0) hit.push_back(u.layer);
      }
    }
    d.kind = "comb_untransposed";
    d.layers = hit;
    d.text = fmt::format("comb applied untransposed (C.R instead of C^T.R) in hc_post {}: B's {} equals post*y + C.R "
                         "recomputed from A's taps (rel err {}, against {} from A)",
                         forced ? layer_phrase(hit, all, nullptr) : fmt::format("at layer {}", layer), c.tap,
                         fmt_g(c.err_untransposed), fmt_g(c.err_b_vs_a));
    return d;
  }
  d.kind = "hc_post";
  d.layers = {layer};
  d.text = fmt::format("hc_post stream mixing wrong at layer {}: {} depends on it while the layer's hc/attn/ffn taps "
                       "before it agree{}",
                       layer, fmt::format("L{}.{}", t.layer, t.suffix),
                       c.evaluated ? fmt::format(" (not a transposed comb: that recompute is off by {})", fmt_g(c.err_untransposed))
                                   : " (comb transposed? " + c.why_not + ")");
  return d;
}

// Selection scores with whole groups of experts at -inf (check_grouped_topk), on every layer that shows it.
Diagnosis grouped_topk_diagnosis(const DiagnosisInput& in, const Trace& src) {
  Diagnosis d;
  const int n_layers = in.cfg ? in.cfg->n_layers : 0;
  std::vector<int> layers, learned;
  GroupedCheck first;
  for (int l = 0; l < n_layers; ++l) {
    if (in.cfg->mlp[size_t(l)] != MlpType::Learned) continue;
    learned.push_back(l);
    const GroupedCheck g = check_grouped_topk(in.a, src, l);
    if (!g.matches) continue;
    if (layers.empty()) first = g;
    layers.push_back(l);
  }
  if (layers.empty()) return d;
  d.kind = "grouped_topk";
  d.layers = layers;
  const std::string kept = first.kept_min == first.kept_max ? fmt::format("{}", first.kept_min)
                                                            : fmt::format("{}-{}", first.kept_min, first.kept_max);
  d.text = fmt::format("expert selection limited to the best groups of experts {}: at layer {}, on {} of {} tokens, the "
                       "selection scores are the reference's but for whole groups of {} experts set to -inf ({} of {} "
                       "groups kept): DeepSeek-V3's grouped top-k (n_group / topk_group) on a V4 router, which selects "
                       "over all {} experts",
                       layer_phrase(layers, learned, in.cfg), layers.front(), first.masked_rows, first.rows, first.per, kept,
                       first.groups, first.per * first.groups);
  return d;
}

Diagnosis index_diagnosis(const DiagnosisInput& in, const Trace& src, const TapName& t, const std::string& tap) {
  Diagnosis d;
  const bool router = t.suffix == "ffn.gate.indices";
  std::string scores;
  for (const auto& s : selection_score_taps(tap))
    if (scores.empty() && !in.a.data.empty() && in.a.data[0].f(s)) scores = s;
  const bool hash = router && in.cfg && size_t(t.layer) < in.cfg->mlp.size() && in.cfg->mlp[size_t(t.layer)] == MlpType::Hash;
  IndexStats s;
  for (size_t si = 0; si < in.a.data.size() && si < src.data.size(); ++si) {
    const IndexTensor* x = in.a.data[si].i(tap);
    const IndexTensor* y = src.data[si].i(tap);
    if (!x || !y || x->dim(0) != y->dim(0)) continue;
    const Tensor* sa = scores.empty() ? nullptr : in.a.data[si].f(scores);
    const Tensor* sb = scores.empty() ? nullptr : src.data[si].f(scores);
    IndexStats one = compare_index(*x, *y, sa, sb, hash, in.tol, &in.a.data[si].positions);
    if (!one.first_bad.empty()) one.first_bad_step = int(si);
    s.merge(one);
  }
  d.layers = {t.layer};
  const std::string what = router ? "experts" : "compressed entries";
  if (s.real == 0 && s.ties > 0) {
    d.kind = "selection_tie";
    // Scores that did not move at all are exact ties broken in another order, which two runs may do by design.
    const std::string exact = "exact ties broken in another order (the CPU reference breaks them as PyTorch's CPU topk "
                              "does, the GPU and numerics.official lowest index first)";
    const std::string how =
        s.exact_ties == s.ties ? "whose scores are the same in both runs: " + exact
        : s.exact_ties == 0    ? fmt::format("whose scores moved by at most {} (within tolerance)", fmt_g(s.max_tie_move))
                               : fmt::format("whose scores moved by at most {} (within tolerance), or on {} of those tokens "
                                             "are the same in both runs: {}", fmt_g(s.max_tie_move), s.exact_ties, exact);
    d.text = fmt::format("selection flip near a tie (benign): {} of {} tokens at {} swapped {} {}; the divergence after "
                         "it follows from the flip",
                         s.ties, s.rows, tap, what, how);
  } else {
    std::string why = hash ? "hash routing is a table lookup (tid2eid[token]): any change is a bug"
                      : s.unscored ? "no selection-score tap to tell a near tie from a real change"
                                   : "the selection scores moved beyond tolerance or the top-k itself differs";
    Tensor sa, sb;
    if (!hash && cat_pair(in.a, src, scores, sa, sb) && within(sa, sb, 0.0))
      why = "the selection scores are identical: the top-k itself differs";
    d.kind = "selection_flip";
    d.text = fmt::format("real selection change at {}: {} of {} tokens select different {} ({}{}); {}", tap, s.real,
                         s.rows, what, s.first_bad, s.ties ? fmt::format(", plus {} near ties", s.ties) : "", why);
  }
  return d;
}

Diagnosis generic_diagnosis(const DiagnosisInput& in, const Trace& src, bool forced, const std::string& tap) {
  Diagnosis d;
  Tensor a, b;
  if (!cat_pair(in.a, src, tap, a, b)) {
    d.kind = "op_error";
    d.text = fmt::format("{} differs ({})", tap, tap_op(tap));
    return d;
  }
  const FloatStats s = compare_f32(a, b);
  const ScaleFit f = fit_scale(a, b);
  const double rsf = in.cfg ? in.cfg->routed_scaling : 1.0;
  if (f.valid && f.resid < 1e-3 && std::abs(f.c - 1) > std::max(1e-3, in.tol)) {
    const std::string rel = rsf_relation(f.c, rsf);
    d.kind = "scale";
    d.text = fmt::format("{} is a pure scale of the reference: B = {} x A (resid {}){}", tap, fmt_g(f.c), fmt_g(f.resid),
                         rel.empty() ? "" : fmt::format("; c is a power of routed_scaling_factor: {}?", rel));
    return d;
  }
  d.kind = "op_error";
  d.text = fmt::format("{} ({}) has a {} error: rel L2 {}, max |err| {} at {} (A {} vs B {}), cosine {}", tap, tap_op(tap),
                       forced ? "local (teacher-forced)" : "free-running", fmt_g(s.rel_l2()), fmt_g(s.max_abs), s.coord(),
                       fmt_g(s.a_at), fmt_g(s.b_at), fmt::format("{:.6f}", s.cosine()));
  return d;
}

}  // namespace

Diagnosis diagnose(const DiagnosisInput& in) {
  Diagnosis d;
  if (in.first.none()) {
    d.kind = "none";
    d.text = "no divergence: every tap is within tolerance";
    return d;
  }
  const bool forced = in.local != nullptr;
  const Trace& src = forced ? *in.local : in.b;
  const std::string& tap = in.first.tap;
  const TapName t = parse_tap(tap);

  // NaN / Inf: name the op that produced the first one from finite inputs.
  const Origin o = nonfinite_origin(in.a, src);
  if (!o.tap.empty()) {
    const std::string kind = o.nan ? "NaN" : "Inf";
    if (o.tap == tap && parse_tap(o.tap).suffix == "ffn.gate.weights") {
      Diagnosis m = moe_diagnosis(in, src, forced, t.layer);
      if (!m.kind.empty()) return m;
    }
    if (o.tap == tap && parse_tap(o.tap).suffix == "ffn.gate.scores") {
      Diagnosis g = grouped_topk_diagnosis(in, src);
      if (!g.kind.empty()) return g;
    }
    if (o.tap == tap) {
      d.kind = "nonfinite";
      d.layers = {t.layer};
      d.text = fmt::format("{} first appears at {} (step {}, {} values) from finite inputs: produced by {}", kind, o.tap,
                           src.steps[size_t(o.step)].name, o.count, tap_op(o.tap));
      return d;
    }
    d.evidence.push_back(fmt::format("first {} at {} (step {}), produced by {}", kind, o.tap, src.steps[size_t(o.step)].name,
                                     tap_op(o.tap)));
  }

  Diagnosis r;
  if (t.suffix == "ffn.gate.indices" || t.suffix == "attn.indexer.topk") r = index_diagnosis(in, src, t, tap);
  else if (is_moe_tap(tap)) r = moe_diagnosis(in, src, forced, t.layer);
  else if (depends_on_hc_post(tap)) r = hc_diagnosis(in, src, forced, t);
  if (r.kind.empty()) r = generic_diagnosis(in, src, forced, tap);
  r.evidence.insert(r.evidence.begin(), d.evidence.begin(), d.evidence.end());
  return r;
}

}  // namespace plumb::toolkit
