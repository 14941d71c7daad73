// The selftest's expectations. They are stated in terms of the fixture's config (which layers are hash-routed,
// whether the router logits ever underflow a naive softplus), so they hold on fixtures the toolkit was not
// developed against.
#include "toolkit/selftest.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "core/strings.h"
#include "patches/registry.h"
#include "toolkit/diff.h"
#include "toolkit/tap_names.h"

namespace plumb::toolkit {

namespace {

namespace fs = std::filesystem;

const char* kTiny = "tests/data/golden/tiny";
const char* kNegative = "tests/data/golden/negative-router";
const char* kUnderflow = "tests/data/golden/router-underflow";  // logits below -103: even a stable softplus is 0

struct Expect {
  std::string kind;                  // diagnosis kind ("a|b": either); "none" = no divergence expected
  std::string text;                  // a phrase the diagnosis must contain
  std::function<bool(const TapName&)> first;  // the first divergence must satisfy this
  std::string first_desc;
  std::vector<int> layers;           // when non-empty: the diagnosis must name exactly these layers
};

// What the reference run's router does on this fixture: tokens whose selected router logits all lie below -16.6
// (where log(1 + exp(x)) is exactly 0 in fp32), tokens with a selected logit above 88.7 (where it is inf), and
// tokens whose gate weights are all 0 in the reference itself (every selected score underflowed even a stable
// softplus; the floored renormalization kept them at 0). Only with these can the router faults show.
struct RouterExtremes {
  bool naive_zero = false, naive_inf = false, ref_zero = false;
};

RouterExtremes router_extremes(const Trace& ref) {
  RouterExtremes x;
  for (const auto& d : ref.data)
    for (const auto& [name, idx] : d.idx) {
      const TapName t = parse_tap(name);
      if (t.suffix != "ffn.gate.indices") continue;
      const Tensor* lg = d.f(fmt::format("L{}.ffn.gate.logits", t.layer));
      const Tensor* w = d.f(fmt::format("L{}.ffn.gate.weights", t.layer));
      if (!lg) continue;
      const int64_t K = idx.dim(1), E = lg->dim(1);
      for (int64_t r = 0; r < idx.dim(0); ++r) {
        bool low = true;
        double sum = 0;
        for (int64_t k = 0; k < K; ++k) {
          const float v = (*lg)[r * E + idx[r * K + k]];
          low &= v < -16.6f;
          x.naive_inf |= v > 88.7f;
          if (w) sum += (*w)[r * K + k];
        }
        x.naive_zero |= low;
        x.ref_zero |= w && sum == 0;
      }
    }
  return x;
}

// `prefix`: the backend both sides run on ("" for the CPU reference, "cuda:"), so a fault is found against its
// own backend's reference.
SelftestCase run_case(const RunInput& in, const std::string& fault, const std::string& b, const Expect& e, const std::string& prefix) {
  SelftestCase c{fault, in.model_dir, prefix + b, "ok", "", "", ""};
  const DiffReport r = diff_live(in, prefix, prefix + b, false);
  c.first = r.first.none() ? "none" : r.first.tap;
  c.diagnosis = r.diagnosis.text;
  std::vector<std::string> bad;
  if (e.kind == "none") {
    if (!r.first.none()) bad.push_back("expected no divergence");
  } else {
    if (r.first.none()) bad.push_back("expected a divergence, found none");
    else if (e.first && !e.first(parse_tap(r.first.tap))) bad.push_back("first divergence is not " + e.first_desc);
    if (("|" + e.kind + "|").find("|" + r.diagnosis.kind + "|") == std::string::npos)
      bad.push_back(fmt::format("diagnosis kind '{}', expected '{}'", r.diagnosis.kind, e.kind));
    if (!e.text.empty() && r.diagnosis.text.find(e.text) == std::string::npos)
      bad.push_back(fmt::format("diagnosis does not say \"{}\"", e.text));
    if (!e.layers.empty() && r.diagnosis.layers != e.layers) {
      std::string want, got;
      for (int l : e.layers) append_item(want, std::to_string(l));
      for (int l : r.diagnosis.layers) append_item(got, std::to_string(l));
      bad.push_back(fmt::format("diagnosis names layers {}, expected {}", got.empty() ? "none" : got, want));
    }
  }
  if (!bad.empty()) {
    c.status = "FAIL";
    for (const auto& x : bad) c.why += (c.why.empty() ? "" : "; ") + x;
  }
  return c;
}

// Whether every expert output of the reference run is exactly 0 (swiglu_limit 0 as transformers reads it): scaling
// them, as the routed-scaling faults do, then changes no expert output, and only the gate weights could show it.
bool experts_all_zero(const Trace& ref) {
  bool any = false;
  for (const auto& d : ref.data)
    for (const auto& [name, t] : d.f32) {
      const std::string suffix = parse_tap(name).suffix;
      if (suffix != "ffn.routed" && suffix != "ffn.shared") continue;
      any = true;
      for (float v : t.data)
        if (v != 0.0f) return false;
    }
  return any;
}

// Runs the faults of `which` on one fixture. `router_only` / `skip_router`: the default split between tiny and
// negative-router.
void run_fixture(const std::string& dir, const std::vector<std::string>& which, SelftestResult& res,
                 const std::function<void(const SelftestCase&)>& report, const std::string& prefix) {
  const RunInput in = input_from_fixture(dir);
  const auto ref_model = load_model(dir, prefix);
  const Trace ref = run_trace(*ref_model, in, prefix);
  auto run_case = [&prefix](const RunInput& i, const std::string& f, const std::string& b, const Expect& e) {
    return toolkit::run_case(i, f, b, e, prefix);
  };
  const ModelConfig& cfg = ref_model->config();
  std::vector<int> all, hash;
  for (int l = 0; l < cfg.n_layers; ++l) {
    all.push_back(l);
    if (cfg.mlp[size_t(l)] == MlpType::Hash) hash.push_back(l);
  }
  const bool rsf = std::abs(cfg.routed_scaling - 1.0) > 1e-6;
  const RouterExtremes rx = router_extremes(ref);
  const bool softplus = cfg.score == ScoreFunc::SqrtSoftplus;
  const bool zero_experts = experts_all_zero(ref);
  auto ffn_of = [](int layer) {
    return [layer](const TapName& t) { return t.layer == layer && t.suffix.rfind("ffn.", 0) == 0; };
  };
  auto add = [&](SelftestCase c) {
    if (c.status == "ok") ++res.passed;
    else if (c.status == "FAIL") ++res.failed;
    else ++res.skipped;
    if (report) report(c);
    res.cases.push_back(std::move(c));
  };
  auto skip = [&](const std::string& fault, const std::string& why) { add({fault, dir, fault, "skipped", "", "", why}); };

  for (const auto& f : which) {
    if (f == "reference") {
      add(run_case(in, f, "", Expect{"none", "", {}, "", {}}));
    } else if (f == "fault.rsf_twice" || f == "fault.rsf_missing" || f == "fault.shared_scaled") {
      if (!rsf) {
        skip(f, "routed_scaling_factor is 1 in " + dir);
        continue;
      }
      if (f == "fault.shared_scaled" && !ref_model->weights().layers.front().moe.shared) {  // (the weights decide)
        skip(f, "no shared expert in " + dir);
        continue;
      }
      if (f != "fault.rsf_missing" && zero_experts) {
        skip(f, "every expert output of " + dir + " is 0 (swiglu_limit " + fmt::format("{}", cfg.swiglu_limit) +
                    "): scaling them changes nothing");
        continue;
      }
      const Expect e = f == "fault.rsf_twice"     ? Expect{"rsf_twice", "applied twice", ffn_of(0), "an L0.ffn.* tap", all}
                       : f == "fault.rsf_missing" ? Expect{"rsf_missing", "missing", ffn_of(0), "an L0.ffn.* tap", all}
                                                  : Expect{"shared_scaled", "shared expert", ffn_of(0), "an L0.ffn.* tap", all};
      add(run_case(in, f, f, e));
    } else if (f == "fault.rsf_missing_hash_layers") {
      if (!rsf) skip(f, "routed_scaling_factor is 1 in " + dir);
      else if (hash.empty()) add(run_case(in, f, f, Expect{"none", "", {}, "", {}}));  // no hash layer: no effect
      else {
        const bool every = hash.size() == all.size();
        add(run_case(in, f, f,
                     Expect{"rsf_missing", every ? "missing" : "hash-routed layer", ffn_of(hash.front()),
                            fmt::format("an L{}.ffn.* tap (the first hash-routed layer)", hash.front()), hash}));
      }
    } else if (f == "fault.comb_untransposed") {
      if (cfg.hc_mult < 2) skip(f, "hc_mult < 2 in " + dir);
      else
        add(run_case(in, f, f,
                     Expect{"comb_untransposed", "untransposed", [](const TapName& t) {
                              return depends_on_hc_post(t.layer >= 0 ? fmt::format("L{}.{}", t.layer, t.suffix) : t.suffix);
                            },
                            "a tap that depends on hc_post (hc_ffn.*, L<i>.out, next layer's hc_attn.*)", {}}));
    } else if (f == "fault.swiglu_unclamped") {
      // (no skip: selftest runs the reference numerics, where every swiglu_limit clamps, transformers' reading)
      add(run_case(in, f, f,
                   Expect{"expert_swiglu", "SwiGLU clamps missing",
                          [](const TapName& t) { return t.suffix == "ffn.routed" || t.suffix == "ffn.shared" || t.suffix == "ffn.out"; },
                          "an expert output tap (ffn.routed / ffn.shared / ffn.out)", {}}));
    } else if (f == "fault.softplus_naive") {
      auto gate = [](const TapName& t) { return t.suffix == "ffn.gate.weights"; };
      if (!softplus) skip(f, "the router of " + dir + " does not use sqrtsoftplus");
      else if (!rx.naive_zero && !rx.naive_inf)
        skip(f, "no token of " + dir + " has all its selected router logits below -16.6 or one above 88.7 (use the "
                "negative-router fixture)");
      else
        add(run_case(in, f, f, Expect{"scores_underflow|scores_overflow", "naive softplus", gate, "a ffn.gate.weights tap", {}}));
    } else if (f == "fault.renorm_unfloored") {
      auto gate = [](const TapName& t) { return t.suffix == "ffn.gate.weights"; };
      const Expect e{"renorm_nan", "divided 0 by 0", gate, "a ffn.gate.weights tap", {}};
      // An unfloored renormalization only shows once every selected score is exactly 0: in the reference itself
      // (logits below about -103), or with a naive softplus (logits below -16.6).
      if (rx.ref_zero) add(run_case(in, f, f, e));
      else if (softplus && rx.naive_zero) add(run_case(in, f, "fault.softplus_naive,fault.renorm_unfloored", e));
      else
        skip(f, "no token of " + dir + " has all its selected router scores at 0, even with a naive softplus (use the "
                "negative-router or router-underflow fixture)");
    } else if (f == "fault.v3_grouped_topk") {
      // Shows on the learned layers, first at the first one's selection scores (whole groups at -inf).
      std::vector<int> learned;
      for (int l : all)
        if (cfg.mlp[size_t(l)] == MlpType::Learned) learned.push_back(l);
      ModelConfig grouped = cfg;
      if (learned.empty()) skip(f, "no learned-routing layer in " + dir);
      else if (!grouped.set_v3_groups())
        skip(f, fmt::format("{} experts with top-{} cannot be grouped in {}", cfg.n_experts, cfg.top_k, dir));
      else
        add(run_case(in, f, f,
                     Expect{"grouped_topk", "grouped top-k",
                            [l = learned.front()](const TapName& t) { return t.layer == l && t.suffix.rfind("ffn.gate.", 0) == 0; },
                            fmt::format("an L{}.ffn.gate.* tap (the first learned-routing layer)", learned.front()), learned}));
    } else {
      skip(f, "no expectation written for this fault: add one to src/toolkit/selftest.cpp");
    }
  }
}

}  // namespace

std::string format_case(const SelftestCase& c) {
  fs::path p = fs::path(c.fixture).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "dir/" names its last component too
  const std::string name = p.filename().string();
  const std::string label = c.fault == "reference" ? "reference vs itself" : c.fault;
  const std::string with = c.b != c.fault && !c.b.empty() && c.fault != "reference" ? " (B = " + c.b + ")" : "";
  if (c.status == "skipped") return fmt::format("selftest: {} [{}] ... skipped: {}", label, name, c.why);
  return fmt::format("selftest: {} [{}]{} ... {} (first divergence {}; diagnosis: {}){}", label, name, with, c.status,
                     c.first, c.diagnosis, c.why.empty() ? "" : "\n  expected: " + c.why);
}

SelftestResult run_selftest(const std::vector<std::string>& fixtures, const std::function<void(const SelftestCase&)>& report,
                            const std::string& backend) {
  PLUMB_CHECK(backend == "cpu" || backend == "cuda", "selftest: unknown backend '{}' (cpu, cuda)", backend);
  const std::string prefix = backend == "cpu" ? "" : backend + ":";
  SelftestResult res;
  std::vector<std::string> faults;
  for (const auto& p : patch_registry())
    if (p.fault) faults.push_back(p.name);
  const std::vector<std::string> router = {"fault.softplus_naive", "fault.renorm_unfloored"};
  if (!fixtures.empty()) {
    std::vector<std::string> which{"reference"};
    which.insert(which.end(), faults.begin(), faults.end());
    for (const auto& f : fixtures) {
      PLUMB_CHECK(fs::exists(fs::path(f) / "golden.json"), "selftest: {} is not a golden fixture folder (no golden.json)", f);
      run_fixture(f, which, res, report, prefix);
    }
    return res;
  }
  PLUMB_CHECK(fs::exists(fs::path(kTiny) / "golden.json"),
              "selftest: fixture {} not found under the working directory {} (run from the repository root or pass "
              "--fixture DIR)",
              kTiny, fs::current_path().string());
  std::vector<std::string> on_tiny{"reference"};
  for (const auto& f : faults)
    if (std::find(router.begin(), router.end(), f) == router.end()) on_tiny.push_back(f);
  run_fixture(kTiny, on_tiny, res, report, prefix);
  bool any = false;
  for (const char* dir : {kNegative, kUnderflow})
    if (fs::exists(fs::path(dir) / "golden.json")) run_fixture(dir, router, res, report, prefix), any = true;
  if (!any)
    for (const auto& f : router) {
      SelftestCase c{f, kNegative, f, "skipped", "", "", "fixture negative-router not present"};
      ++res.skipped;
      if (report) report(c);
      res.cases.push_back(c);
    }
  return res;
}

}  // namespace plumb::toolkit
