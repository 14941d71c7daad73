// KL divergence between two configurations' next-token distributions, live or against a saved top-k file.
#include "toolkit/kld.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "io/json_int.h"
#include "io/safetensors.h"

namespace plumb::toolkit {

namespace {

// log-softmax of one row in fp64.
void log_softmax(const float* x, int64_t n, std::vector<double>& out) {
  out.resize(size_t(n));
  double m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, double(x[i]));
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(double(x[i]) - m);
  const double lse = m + std::log(s);
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = double(x[i]) - lse;
}

bool finite_row(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return false;
  return true;
}

// First index of the maximum (ties to the lowest id, the same rule on both sides).
int64_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

// Every logits row of a run, in order, with the token each row is followed by (-1 for the last).
struct Rows {
  std::vector<const float*> row;
  std::vector<int32_t> next;
  int64_t vocab = 0;
};

Rows rows_of(const Trace& t) {
  Rows r;
  std::vector<int32_t> all;
  for (const auto& s : t.steps) all.insert(all.end(), s.tokens.begin(), s.tokens.end());
  for (const auto& d : t.data) {
    const Tensor& l = *d.f("logits");
    r.vocab = l.dim(1);
    for (int64_t i = 0; i < l.dim(0); ++i) r.row.push_back(l.row(i));
  }
  for (size_t i = 0; i < r.row.size(); ++i) r.next.push_back(i + 1 < all.size() ? all[i + 1] : -1);
  return r;
}

std::string pct(double v) { return fmt::format("{:.3f}", 100 * v); }

}  // namespace

MeanUnc mean_unc(const std::vector<double>& v) {
  MeanUnc m;
  m.n = v.size();
  if (v.empty()) return m;
  double s = 0, s2 = 0;
  for (double x : v) s += x, s2 += x * x;
  const double n = double(v.size());
  m.mean = s / n;
  if (v.size() > 10 && std::isfinite(m.mean)) {  // (an infinite mean has no spread to speak of)
    m.has_unc = true;
    m.unc = std::sqrt(std::max(0.0, s2 / n - m.mean * m.mean) / (n - 1));
  }
  return m;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const double pos = p * double(v.size() - 1);
  const size_t lo = size_t(std::floor(pos)), hi = std::min(v.size() - 1, lo + 1);
  // (Equal ends are that value: two infinite KLDs, B's NaN rows, would interpolate to inf - inf = NaN.)
  if (pos == double(lo) || v[hi] == v[lo]) return v[lo];
  return v[lo] + (pos - double(lo)) * (v[hi] - v[lo]);
}

Trace logits_trace(const Model& model, const RunInput& in, const std::string& patches, const char* role) {
  const TapFilter none = TapFilter::parse("-", "", "", "");  // a glob no tap name matches: logits only
  return run_trace(model, in, patches, &none, nullptr, role);
}

Trace logits_trace(const RunInput& in, const std::string& patches, const char* role) {
  return logits_trace(*load_model(in.model_dir, patches), in, patches, role);
}

KldReport kld_live(const RunInput& in, const std::string& a, const std::string& b) {
  const auto t0 = std::chrono::steady_clock::now();
  const Trace ta = logits_trace(in, a, "A");  // (A runs first: the order of an expression's arguments is unspecified)
  KldReport r = kld_of_traces(ta, logits_trace(in, b, "B"));
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

KldReport kld_of_traces(const Trace& ta, const Trace& tb) {
  KldReport r;
  r.a = r.a_config = ta.patches, r.b = tb.patches, r.source = ta.source, r.model_dir = ta.model_dir;
  const Rows ra = rows_of(ta), rb = rows_of(tb);
  PLUMB_CHECK(ra.row.size() == rb.row.size() && ra.vocab == rb.vocab, "kld: the runs have {} and {} logits rows",
              ra.row.size(), rb.row.size());
  r.vocab = ra.vocab;
  std::vector<double> la, lb;
  for (size_t t = 0; t < ra.row.size(); ++t) {
    const float *xa = ra.row[t], *xb = rb.row[t];
    const int64_t top = argmax(xa, r.vocab);
    log_softmax(xa, r.vocab, la);
    if (!finite_row(xb, r.vocab)) {
      ++r.nonfinite_rows;
      r.next_skipped += ra.next[t] >= 0 && ra.next[t] < r.vocab;
      r.kld.push_back(INFINITY), r.same_top.push_back(0), r.dp_top.push_back(NAN);
      continue;
    }
    log_softmax(xb, r.vocab, lb);
    double kl = 0;
    for (int64_t i = 0; i < r.vocab; ++i) {
      const double p = std::exp(la[size_t(i)]);
      if (p > 0) kl += p * (la[size_t(i)] - lb[size_t(i)]);
    }
    r.kld.push_back(kl);
    r.same_top.push_back(argmax(xb, r.vocab) == top);
    r.dp_top.push_back(std::exp(lb[size_t(top)]) - std::exp(la[size_t(top)]));
    if (const int32_t nx = ra.next[t]; nx >= 0 && nx < r.vocab) {
      r.nll_a.push_back(-la[size_t(nx)]), r.nll_b.push_back(-lb[size_t(nx)]);
      r.dp_next.push_back(std::exp(lb[size_t(nx)]) - std::exp(la[size_t(nx)]));
    }
  }
  return r;
}

void save_kld_ref(const RunInput& in, const std::string& a, const std::string& path, int64_t topk) {
  PLUMB_CHECK(topk > 0, "--topk must be positive (got {})", topk);
  const Trace ta = logits_trace(in, a, "A");
  const Rows ra = rows_of(ta);
  const int64_t n = int64_t(ra.row.size()), V = ra.vocab, k = std::min(topk, V);
  IndexTensor ids({n, k}), tokens({n});
  Tensor lps({n, k}), next_lp({n});
  std::vector<double> la;
  std::vector<int64_t> ord(static_cast<size_t>(V));
  int64_t pos = 0;
  for (const auto& s : ta.steps)
    for (int32_t tok : s.tokens) tokens[pos++] = tok;
  for (int64_t t = 0; t < n; ++t) {
    log_softmax(ra.row[size_t(t)], V, la);
    for (int64_t i = 0; i < V; ++i) ord[size_t(i)] = i;
    // Descending log-probability, ties to the lowest id: entry 0 is the argmax rule of the compare step.
    std::partial_sort(ord.begin(), ord.begin() + k, ord.end(), [&](int64_t x, int64_t y) {
      return la[size_t(x)] > la[size_t(y)] || (la[size_t(x)] == la[size_t(y)] && x < y);
    });
    for (int64_t j = 0; j < k; ++j) ids[t * k + j] = ord[size_t(j)], lps[t * k + j] = float(la[size_t(ord[size_t(j)])]);
    const int32_t nx = ra.next[size_t(t)];
    next_lp[t] = nx >= 0 && nx < V ? float(la[size_t(nx)]) : NAN;
  }
  nlohmann::json steps = nlohmann::json::array();
  for (const auto& s : ta.steps)
    steps.push_back({{"name", s.name}, {"kind", s.kind}, {"start_pos", s.start_pos}, {"n", s.tokens.size()}});
  write_safetensors(path,
                    {owned_i64("tokens", tokens), owned_i64("topk.ids", ids), owned_f32("topk.logprobs", lps),
                     owned_f32("next.logprob", next_lp)},
                    {{"format", "plumb-kld-ref/1"}, {"patches", a},
                     // (absolute: --ref is run from other folders too)
                     {"model", std::filesystem::absolute(in.model_dir).lexically_normal().string()}, {"source", in.source},
                     {"vocab", std::to_string(V)}, {"topk", std::to_string(k)}, {"steps", steps.dump()}});
  fmt::print("kld: saved the top-{} log-probabilities of [{}] for {} tokens (vocab {}) of {} to {}\n", k,
             a.empty() ? "reference" : a, n, V, in.source, path);
}

KldRef read_kld_ref(const std::string& path) {
  const auto f = SafetensorsFile::open(path);
  const auto& md = f->metadata();
  auto meta = [&](const char* key) {
    auto it = md.find(key);
    PLUMB_CHECK(it != md.end(), "{}: not a plumb kld reference (no '{}' in its metadata)", path, key);
    return it->second;
  };
  PLUMB_CHECK(meta("format") == "plumb-kld-ref/1", "{}: format '{}' is not plumb-kld-ref/1", path, meta("format"));
  auto count = [&](const char* key) {
    const std::string v = meta(key);
    int64_t x = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    PLUMB_CHECK(ec == std::errc() && end == v.data() + v.size() && x > 0 && x <= INT32_MAX,
                "{}: metadata '{}' = '{}' is not a positive count", path, key, v);
    return x;
  };
  KldRef r;
  r.patches = meta("patches"), r.model = meta("model"), r.source = meta("source");
  r.vocab = count("vocab"), r.topk = count("topk");
  PLUMB_CHECK(r.topk <= r.vocab, "{}: top-{} of a vocabulary of {}", path, r.topk, r.vocab);
  auto need = [&](const char* name, size_t dims) {
    const TensorView* v = f->find(name);
    PLUMB_CHECK(v, "{}: missing tensor {}", path, name);
    PLUMB_CHECK(v->shape.size() == dims, "{}: tensor {} has shape {}, expected {} dimensions", path, name,
                shape_str(v->shape), dims);
    return v;
  };
  const IndexTensor tokens = to_i64(*need("tokens", 1));
  r.ids = to_i64(*need("topk.ids", 2));
  r.logprobs = to_f32(*need("topk.logprobs", 2));
  r.next_logprob = to_f32(*need("next.logprob", 1));
  const int64_t n = tokens.numel();
  const Shape rows_k = {n, r.topk};
  PLUMB_CHECK(n > 0 && r.ids.shape == rows_k && r.logprobs.shape == rows_k && r.next_logprob.numel() == n,
              "{}: tensors of {} tokens and top-{} disagree: topk.ids {}, topk.logprobs {}, next.logprob {}", path, n, r.topk,
              shape_str(r.ids.shape), shape_str(r.logprobs.shape), shape_str(r.next_logprob.shape));
  for (int64_t i = 0; i < r.ids.numel(); ++i)
    PLUMB_CHECK(r.ids[i] >= 0 && r.ids[i] < r.vocab, "{}: topk.ids holds {}, outside the vocabulary of {}", path, r.ids[i],
                r.vocab);
  for (int64_t i = 0; i < n; ++i)
    PLUMB_CHECK(tokens[i] >= 0 && tokens[i] <= INT32_MAX, "{}: token {} is not a token id", path, tokens[i]);
  const auto steps = nlohmann::json::parse(meta("steps"), nullptr, false);
  PLUMB_CHECK(steps.is_array(), "{}: malformed 'steps' metadata", path);
  int64_t pos = 0;
  for (const auto& s : steps) {
    const std::optional<int64_t> kn = s.is_object() && s.contains("n") ? json_int(s["n"], 1, n) : std::nullopt;
    const std::optional<int64_t> sp = s.is_object() && s.contains("start_pos") ? json_int(s["start_pos"], 0, n) : std::optional<int64_t>(0);
    PLUMB_CHECK(s.is_object() && s.contains("name") && s["name"].is_string() && kn && sp && (!s.contains("kind") || s["kind"].is_string()),
                "{}: malformed step in the 'steps' metadata (n and start_pos: integers within the {} tokens): {}", path, n, s.dump());
    GoldenStep g;
    g.name = s["name"].get<std::string>(), g.kind = s.value("kind", "prefill"), g.start_pos = *sp;
    const int64_t k = *kn;
    PLUMB_CHECK(g.start_pos == pos && k > 0 && k <= n - pos, "{}: step {} does not fit the token list", path, g.name);
    PLUMB_CHECK(g.kind == "prefill" || (g.kind == "decode" && k == 1), "{}: step {} has kind '{}' for {} tokens", path, g.name,
                g.kind, k);
    for (int64_t i = 0; i < k; ++i) g.tokens.push_back(int32_t(tokens[pos + i]));
    pos += k;
    r.steps.push_back(std::move(g));
  }
  PLUMB_CHECK(pos == n, "{}: the steps cover {} of its {} tokens", path, pos, n);
  return r;
}

KldReport kld_against_ref(const std::string& path, const std::string& model_dir, const std::string& b, const RunInput* in) {
  const auto t0 = std::chrono::steady_clock::now();
  const KldRef ref = read_kld_ref(path);
  RunInput ri;
  ri.model_dir = model_dir.empty() ? ref.model : model_dir;
  ri.source = ref.source;
  ri.steps = ref.steps;
  if (in) {
    std::vector<int32_t> x, y;
    for (const auto& s : in->steps) x.insert(x.end(), s.tokens.begin(), s.tokens.end());
    for (const auto& s : ri.steps) y.insert(y.end(), s.tokens.begin(), s.tokens.end());
    PLUMB_CHECK(x == y, "{} was saved for other tokens than {} (the saved file holds its input: drop the input options)",
                path, in->source);
  }
  const IndexTensor& ids = ref.ids;
  const Tensor &lps = ref.logprobs, &next_lp = ref.next_logprob;
  KldReport r;
  r.a = (ref.patches.empty() ? std::string("reference") : ref.patches) + ", saved", r.b = b, r.source = ri.source;
  r.a_config = ref.patches;
  r.model_dir = ri.model_dir, r.ref_file = path;
  r.vocab = ref.vocab;
  const int64_t k = ref.topk;
  r.topk = k;
  // Another model's vocabulary is named before the run, which would otherwise stop at the first saved token id
  // outside it.
  if (const auto cfg = std::filesystem::path(ri.model_dir) / "config.json"; std::filesystem::exists(cfg)) {
    const int64_t v = ModelConfig::load(cfg.string()).vocab;
    PLUMB_CHECK(v == r.vocab, "{}: saved for a vocabulary of {} ({}), but {} has {}: another model than the one the file "
                "was saved with", path, r.vocab, ref.model, ri.model_dir, v);
  }
  const Trace tb = logits_trace(ri, b, "B");
  const Rows rb = rows_of(tb);
  PLUMB_CHECK(int64_t(rb.row.size()) == ids.dim(0), "{}: {} saved rows, {} computed", path, ids.dim(0), rb.row.size());
  std::vector<double> lb;
  for (int64_t t = 0; t < ids.dim(0); ++t) {
    const float* xb = rb.row[size_t(t)];
    if (!finite_row(xb, r.vocab)) {
      ++r.nonfinite_rows;
      r.next_skipped += std::isfinite(next_lp[t]) && rb.next[size_t(t)] >= 0;
      r.kld.push_back(INFINITY), r.same_top.push_back(0), r.dp_top.push_back(NAN);
      continue;
    }
    log_softmax(xb, r.vocab, lb);
    // B's log-probabilities get the same fp32 rounding as the saved ones, so a configuration compared with its
    // own saved file gives exactly 0.
    for (auto& v : lb) v = double(float(v));
    double kl = 0, pa_sum = 0, pb_sum = 0;
    for (int64_t j = 0; j < k; ++j) {
      const double la = lps[t * k + j], l2 = lb[size_t(ids[t * k + j])], p = std::exp(la);
      kl += p * (la - l2);
      pa_sum += p, pb_sum += std::exp(l2);
    }
    if (k < r.vocab) {
      // A's mass outside its top-k as one bin: the KL of the coarsened distributions, a lower bound of the full KL.
      const double ta = std::max(0.0, 1 - pa_sum), tbm = std::max(1e-300, 1 - pb_sum);
      if (ta > 0) kl += ta * std::log(ta / tbm);
    }
    r.kld.push_back(kl);
    r.same_top.push_back(argmax(xb, r.vocab) == ids[t * k]);
    r.dp_top.push_back(std::exp(lb[size_t(ids[t * k])]) - std::exp(double(lps[t * k])));
    if (std::isfinite(next_lp[t]) && rb.next[size_t(t)] >= 0) {
      const double la = next_lp[t], l2 = lb[size_t(rb.next[size_t(t)])];
      r.nll_a.push_back(-la), r.nll_b.push_back(-l2), r.dp_next.push_back(std::exp(l2) - std::exp(la));
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

int64_t max_position(const KldReport& r) {
  int64_t at = -1;
  for (size_t i = 0; i < r.kld.size(); ++i)
    if (!std::isnan(r.kld[i]) && (at < 0 || r.kld[i] > r.kld[size_t(at)])) at = int64_t(i);
  return at;
}

std::string shell_quote(const std::string& s) {
  const bool plain = !s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./:=,+-@") ==
                                       std::string::npos;
  if (plain) return s;
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return o + "'";
}

std::string format_kl(double v) {
  if (v == 0) return "0.000000";  // (-0.0 too)
  return std::fabs(v) < 1e-3 ? fmt::format("{:.3e}", v) : fmt::format("{:.6f}", v);
}

KldSummary summarize(const KldReport& r) {
  KldSummary m;
  m.kld = mean_unc(r.kld);
  for (size_t i = 0; i < std::size(m.percentiles); ++i) m.percentiles[i] = percentile(r.kld, KldSummary::kFractions[i]);
  m.max_position = max_position(r);
  const size_t n = r.kld.size();
  std::vector<double> same(r.same_top.begin(), r.same_top.end());
  m.same_top = n ? mean_unc(same).mean : 0;
  m.same_top_unc = n > 1 ? std::sqrt(m.same_top * (1 - m.same_top) / double(n - 1)) : NAN;
  std::vector<double> dp, sq;
  for (double v : r.dp_top)
    if (std::isfinite(v)) dp.push_back(v), sq.push_back(v * v);
  m.dp_top = mean_unc(dp);
  const MeanUnc ms = mean_unc(sq);
  m.rms_dp_top = std::sqrt(ms.mean);
  m.rms_dp_top_unc = ms.has_unc ? (m.rms_dp_top > 0 ? ms.unc / (2 * m.rms_dp_top) : 0.0) : NAN;
  m.next_tokens = r.nll_a.size();
  if (m.next_tokens) {
    std::vector<double> d;
    for (size_t i = 0; i < r.nll_a.size(); ++i) d.push_back(r.nll_b[i] - r.nll_a[i]);
    m.ppl_a = std::exp(mean_unc(r.nll_a).mean), m.ppl_b = std::exp(mean_unc(r.nll_b).mean);
    m.ln_ppl_ratio = mean_unc(d);
    m.dp_next = mean_unc(r.dp_next);
  }
  // What comes next when the two disagree beyond rounding: the diff that names the first op diverging at the worst
  // token, teacher forced, as a command to run (the input's options as given; a --ref file's input is its own).
  if (m.max_position >= 0 && m.percentiles[0] > kExamineKld) {
    const std::string rest =
        fmt::format("--a {} --b {} --positions {} --local", shell_quote(r.a_config), shell_quote(r.b), m.max_position);
    m.examine = !r.input_args.empty()
                    ? fmt::format("plumb diff {} {}", r.input_args, rest)
                    : fmt::format("plumb diff with the input {} was saved for ({}) and {}", r.ref_file, r.source, rest);
  }
  return m;
}

void print_kld(const KldReport& r) {
  const KldSummary m = summarize(r);
  fmt::print("plumb kld: P_A [{}] vs P_B [{}]\n", r.a.empty() ? "reference" : r.a, r.b.empty() ? "reference" : r.b);
  fmt::print("input     {}, {} tokens, vocab {}\n", r.source, r.kld.size(), r.vocab);
  fmt::print("method    {}\n", r.topk ? fmt::format("against {}: A's top-{} log-probs + the rest of A's mass as one bin "
                                                       "(a lower bound of the full KL), fp32-rounded on both sides", r.ref_file, r.topk)
                                        : std::string("full vocabulary, fp64 log-softmax of both configurations' logits"));
  if (r.nonfinite_rows) fmt::print("warning   {} rows of B's logits hold NaN/Inf (KLD inf)\n", r.nonfinite_rows);
  auto no_unc = [](const MeanUnc& u) { return std::string(u.n <= 10 ? "n/a (N <= 10)" : "n/a (not finite)"); };
  auto unc = [&](const MeanUnc& u, double scale, int prec) {
    return u.has_unc ? fmt::format("{:.{}f} ± {:.{}f}", u.mean * scale, prec, u.unc * scale, prec)
                     : fmt::format("{:.{}f} ± {}", u.mean * scale, prec, no_unc(u));
  };
  fmt::print("====== KL divergence statistics (KL(P_A || P_B), nats per token) ======\n");
  fmt::print("Mean    KLD: {} ± {}\n", format_kl(m.kld.mean), m.kld.has_unc ? format_kl(m.kld.unc) : no_unc(m.kld));
  const char* names[] = {"Maximum", "99.9%  ", "99.0%  ", "95.0%  ", "90.0%  ", "Median ", "10.0%  ", "Minimum"};
  static_assert(std::size(names) == std::size(KldSummary::kFractions));
  for (size_t i = 0; i < std::size(names); ++i)
    // The maximum says where it is (the row of every step's tokens in order: the position from the session's
    // start), the place to point `plumb diff --positions` at (the command is printed at the end).
    fmt::print("{} KLD: {}{}\n", names[i], format_kl(m.percentiles[i]),
               i == 0 && m.max_position >= 0 ? fmt::format(" (position {})", m.max_position) : "");
  fmt::print("====== Token probability statistics ======\n");
  fmt::print("Same top p: {} ± {} %\n", pct(m.same_top), std::isnan(m.same_top_unc) ? "n/a" : pct(m.same_top_unc));
  fmt::print("Mean Δp of A's top token: {} %\n", unc(m.dp_top, 100, 3));
  fmt::print("RMS  Δp of A's top token: {:.3f}{} %\n", 100 * m.rms_dp_top,
             std::isnan(m.rms_dp_top_unc) ? " ± n/a" : fmt::format(" ± {:.3f}", 100 * m.rms_dp_top_unc));
  if (m.next_tokens) {
    fmt::print("====== Next-token statistics ({} tokens followed by a token of the input{}) ======\n", m.next_tokens,
               r.next_skipped ? fmt::format("; {} more left out: B's row holds NaN/Inf", r.next_skipped) : "");
    fmt::print("PPL(A): {:.4f}   PPL(B): {:.4f}\n", m.ppl_a, m.ppl_b);
    fmt::print("Mean ln(PPL(B)/PPL(A)): {}\n", unc(m.ln_ppl_ratio, 1, 6));
    fmt::print("Mean Δp of the next token: {} %\n", unc(m.dp_next, 100, 3));
  }
  if (!m.examine.empty()) fmt::print("examine   {}\n", m.examine);
  fmt::print("computed in {:.3f} s\n", r.seconds);
  std::fflush(stdout);
}

std::string kld_json(const KldReport& r) {
  nlohmann::ordered_json j;
  auto num = [](double v) { return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(std::isnan(v) ? "nan" : "inf"); };
  auto mean = [&](const MeanUnc& u) {
    return nlohmann::ordered_json{{"mean", num(u.mean)}, {"unc", u.has_unc ? num(u.unc) : nullptr}};
  };
  const KldSummary m = summarize(r);
  j["format"] = "plumb-kld/1";
  j["a"] = r.a, j["b"] = r.b, j["input"] = r.source, j["model"] = r.model_dir, j["tokens"] = r.kld.size();
  j["vocab"] = r.vocab, j["topk"] = r.topk, j["ref_file"] = r.ref_file;
  j["kld"] = mean(m.kld);
  const char* keys[] = {"max", "p99.9", "p99", "p95", "p90", "median", "p10", "min"};
  static_assert(std::size(keys) == std::size(KldSummary::kFractions));
  for (size_t i = 0; i < std::size(keys); ++i) {
    j["kld"][keys[i]] = num(m.percentiles[i]);
    if (i == 0) j["kld"]["max_position"] = m.max_position;
  }
  j["same_top"] = {{"p", m.same_top}, {"unc", std::isnan(m.same_top_unc) ? nullptr : num(m.same_top_unc)}};
  j["dp_top"] = mean(m.dp_top);
  j["rms_dp_top"] = {{"value", num(m.rms_dp_top)}, {"unc", std::isnan(m.rms_dp_top_unc) ? nullptr : num(m.rms_dp_top_unc)}};
  if (m.next_tokens)
    j["next_token"] = {{"tokens", m.next_tokens}, {"left_out", r.next_skipped}, {"ppl_a", num(m.ppl_a)},
                       {"ppl_b", num(m.ppl_b)}, {"ln_ppl_ratio", mean(m.ln_ppl_ratio)}, {"dp", mean(m.dp_next)}};
  else
    j["next_token"] = nullptr;
  j["nonfinite_rows"] = r.nonfinite_rows;
  j["examine"] = m.examine.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(m.examine);
  j["per_token_kld"] = nlohmann::ordered_json::array();
  for (double v : r.kld) j["per_token_kld"].push_back(num(v));
  return j.dump(1) + "\n";
}

}  // namespace plumb::toolkit
