// Delta debugging over patches (Zeller's ddmin) with a cached divergence test; invalid combinations (two
// placements of one factor) count as "does not diverge", and a full list that is itself invalid is split into
// maximal valid configurations first.
#include "toolkit/bisect.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <set>

#include "core/strings.h"
#include "patches/registry.h"
#include "toolkit/kld.h"

namespace plumb::toolkit {

namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

bool valid_set(const std::vector<std::string>& s, std::string* why = nullptr) {
  try {
    parse_patches(join(s));
    // parse_patches' placement check looks at the final options, so "moe.rsf_on_output,moe.rsf_in_topk" passes
    // while the reverse order does not: a set is valid only if it is valid in both orders.
    parse_patches(join(std::vector<std::string>(s.rbegin(), s.rend())));
    return true;
  } catch (const Error& e) {
    if (why) *why = e.what();
    return false;
  }
}

// A patch list as a configuration of the backend bisect runs on ("cuda:S" on the GPU).
std::string on_backend(const BisectOptions& o, const std::string& patches) {
  return (o.backend == "cuda" ? "cuda:" : "") + patches;
}

// The numerics modes of a set: the reference its other patches are measured against.
std::vector<std::string> numerics_of(const std::vector<std::string>& s) {
  std::vector<std::string> out;
  for (const auto& p : s)
    if (const Patch* q = find_patch(p); q && q->numerics_mode) out.push_back(p);
  return out;
}

class Tester {
 public:
  explicit Tester(const BisectOptions& o) : o_(o) {}

  struct Outcome {
    bool valid = true, diverges = false;
    bool load_refused = false;  // invalid because the backend refused it at load (detail: its reason)
    std::string detail;
  };

  Outcome test(const std::vector<std::string>& s) {
    const std::string key = join(s);
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
    Outcome r = run(s);
    ++runs;
    if (o_.verbose)
      fmt::print("test {:>3}: [{}] {}\n", runs, key.empty() ? "reference" : key,
                 !r.valid ? "invalid (" + r.detail + ")" : r.diverges ? "DIVERGES (" + r.detail + ")" : "ok" + (r.detail.empty() ? "" : " (" + r.detail + ")"));
    return cache_[key] = r;
  }

  int runs = 0;

 private:
  std::string config(const std::string& patches) const { return on_backend(o_, patches); }

  const Trace& baseline(const std::string& patches) {
    auto it = base_.find(patches);
    if (it != base_.end()) return it->second;
    const auto m = load_model(o_.input.model_dir, config(patches));
    return base_[patches] = run_trace(*m, o_.input, config(patches));
  }

  Outcome run(const std::vector<std::string>& s) {
    Outcome r;
    std::string why;
    if (!valid_set(s, &why)) return r.valid = false, r.detail = why, r;
    const std::string all = join(s);
    // The backend may refuse a subset at load that the registry takes (cuda.hc_fold without the patches it folds
    // into): such a subset is invalid too. The baseline loads first, so a backend that cannot run at all (no GPU)
    // stops bisect with its own error instead.
    auto load = [&](std::unique_ptr<Model>& m) {
      try {
        m = load_model(o_.input.model_dir, config(all));
        return true;
      } catch (const Error& e) {
        r.valid = false, r.load_refused = true, r.detail = e.what();
        return false;
      }
    };
    std::unique_ptr<Model> m;
    if (o_.criterion == "kld") {
      const Trace& a = baseline("");
      if (!load(m)) return r;
      const KldReport k = kld_of_traces(a, logits_trace(*m, o_.input, config(all)));
      const double mean = mean_unc(k.kld).mean;
      r.diverges = !(mean <= o_.kld_threshold);  // NaN/inf diverge
      r.detail = fmt::format("mean KLD {:.6g} {} {:g}", mean, r.diverges ? ">" : "<=", o_.kld_threshold);
      return r;
    }
    const std::string base = join(numerics_of(s));
    if (base == all) return r.detail = "numerics modes only: the baseline itself", r;
    const Trace& a = baseline(base);
    if (!load(m)) return r;
    const bool local = o_.criterion == "local";
    const Trace b = run_trace(*m, o_.input, config(all), nullptr, local ? &a : nullptr);
    PairTolerance tol = pair_tolerance(config(base), config(all));
    if (local) tol.free = tol.local;  // b is teacher-forced: compare it with the local tolerance
    const ModelConfig& cfg = m->config();
    const DiffReport d = compare_traces(a, b, nullptr, tol, &cfg);
    r.diverges = !d.first_free.none();
    if (r.diverges) r.detail = fmt::format("{} at step {}", d.first_free.tap, d.first_free.step_name);
    return r;
  }

  const BisectOptions& o_;
  std::map<std::string, Outcome> cache_;
  std::map<std::string, Trace> base_;
};

// ddmin: the returned set diverges and no single patch can be removed without losing the divergence.
std::vector<std::string> ddmin(Tester& t, std::vector<std::string> c) {
  size_t n = 2;
  while (c.size() >= 2) {
    std::vector<std::vector<std::string>> chunks(n);
    for (size_t i = 0; i < c.size(); ++i) chunks[i * n / c.size()].push_back(c[i]);
    bool reduced = false;
    for (const auto& d : chunks)
      if (!d.empty() && t.test(d).diverges) {
        c = d, n = 2, reduced = true;
        break;
      }
    if (!reduced)
      for (const auto& d : chunks) {
        std::vector<std::string> rest;
        for (const auto& p : c)
          if (std::find(d.begin(), d.end(), p) == d.end()) rest.push_back(p);
        if (!rest.empty() && rest.size() < c.size() && t.test(rest).diverges) {
          c = rest, n = std::max<size_t>(n - 1, 2), reduced = true;
          break;
        }
      }
    if (!reduced) {
      if (n >= c.size()) break;
      n = std::min(2 * n, c.size());
    }
  }
  return c;
}

// Maximal valid configurations of a list whose patches cannot all be on together: greedy in the given order,
// then once more starting from each patch the first pass had to leave out.
std::vector<std::vector<std::string>> valid_configs(const std::vector<std::string>& all, std::vector<std::string>& notes) {
  auto greedy = [&](const std::vector<std::string>& order, std::vector<std::string>* left) {
    std::vector<std::string> cur;
    for (const auto& p : order) {
      cur.push_back(p);
      if (!valid_set(cur)) {
        cur.pop_back();
        if (left) left->push_back(p);
      }
    }
    return cur;
  };
  std::vector<std::string> left;
  std::vector<std::vector<std::string>> out{greedy(all, &left)};
  for (const auto& p : left) {
    std::vector<std::string> order{p};
    for (const auto& q : all)
      if (q != p) order.push_back(q);
    auto cfg = greedy(order, nullptr);
    // Keep the original order within a configuration.
    std::vector<std::string> sorted;
    for (const auto& q : all)
      if (std::find(cfg.begin(), cfg.end(), q) != cfg.end()) sorted.push_back(q);
    if (std::find(out.begin(), out.end(), sorted) == out.end()) out.push_back(sorted);
  }
  if (out.size() > 1) {
    std::string why;
    valid_set(all, &why);
    notes.push_back(fmt::format("the patches cannot all be on at once ({}); bisecting {} valid configurations: {}", why,
                                out.size(), [&] {
                                  std::string s;
                                  for (const auto& c : out) {
                                    if (!s.empty()) s += " | ";
                                    s += '[';  // piece by piece: GCC 12's -Wrestrict misfires on "[" + std::string&&
                                    s += join(c);
                                    s += ']';
                                  }
                                  return s;
                                }()));
  }
  return out;
}

}  // namespace

std::vector<std::string> split_patch_list(const std::string& list) {
  return expand_patch_list(list);  // a preset is bisected over its patches; unknown or twice-written names are Errors
}

void check_options(const BisectOptions& opt) {
  PLUMB_CHECK(opt.criterion == "local" || opt.criterion == "free" || opt.criterion == "kld",
              "unknown bisect criterion '{}' (local, free, kld)", opt.criterion);
  PLUMB_CHECK(!opt.patches.empty(), "bisect needs a non-empty --patches list");
  PLUMB_CHECK(opt.backend == "cpu" || opt.backend == "cuda", "unknown backend '{}' (cpu, cuda)", opt.backend);
  // A patch of another backend would fail each test that holds it: named before the first.
  check_patches_run_on(opt.patches, opt.backend, "bisect it with --backend");
}

BisectResult bisect(const BisectOptions& opt) {
  check_options(opt);
  const auto t0 = std::chrono::steady_clock::now();
  BisectResult res;
  Tester t(opt);
  std::set<std::vector<std::string>> found;
  for (auto cfg : valid_configs(opt.patches, res.notes)) {
    // The whole list refused by the backend (cuda.hc_fold without its partners) is the user's to mend, not a list
    // that "does not diverge"; its subsets the backend refuses are only invalid.
    if (const auto whole = t.test(cfg); whole.load_refused) fail("{}", whole.detail);
    // Peel off one minimal set at a time, until what is left no longer diverges.
    while (!cfg.empty() && t.test(cfg).diverges) {
      res.full_diverges = true;
      const auto m = ddmin(t, cfg);
      std::vector<std::string> rest;
      for (const auto& p : cfg)
        if (std::find(m.begin(), m.end(), p) == m.end()) rest.push_back(p);
      cfg = rest;
      if (found.insert(m).second) res.culprits.push_back(Culprit{m, {}, {}, {}});
    }
  }
  // Each culprit's first divergence and diagnosis, from a full live diff against its baseline (on the backend the
  // search ran on).
  for (auto& c : res.culprits) {
    const std::string all = join(c.patches);
    const std::string base = opt.criterion == "kld" ? "" : join(numerics_of(c.patches));
    const DiffReport d = diff_live(opt.input, on_backend(opt, base), on_backend(opt, all), opt.criterion == "local");
    c.first = d.first;
    c.diagnosis = d.diagnosis.text;
    if (c.patches.size() > 1)
      for (const auto& p : c.patches)
        if (!t.test({p}).diverges) c.alone_ok.push_back(p);
  }
  res.tests = t.runs;
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace plumb::toolkit
