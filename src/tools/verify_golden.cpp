// plumb verify-golden: replays a golden fixture's steps on one session and checks logits and every tap.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>

#include "model/model.h"
#include "patches/registry.h"
#include "plumb/tools.h"
#include "tools/golden_fixture.h"

namespace plumb::tools {

namespace {

constexpr double kTieEps = 1e-5;     // selection-boundary scores closer than this are ties, not failures

struct IndexAgreement {
  int64_t rows = 0, agree = 0, ties = 0;
  std::string first_bad;
  bool ok() const { return agree + ties == rows; }
};

std::set<int64_t> valid_set(const IndexTensor& t, int64_t r) {
  std::set<int64_t> s;
  for (int64_t k = 0; k < t.dim(1); ++k)
    if (t[r * t.dim(1) + k] >= 0) s.insert(t[r * t.dim(1) + k]);
  return s;
}

// Row-wise set comparison. `scores` (our own [n, entries] selection scores, may be null) lets a disagreement
// whose entries all score within kTieEps of the selection boundary count as a tie.
IndexAgreement compare_index(const IndexTensor& got, const IndexTensor& ref, const Tensor* scores) {
  IndexAgreement a;
  a.rows = ref.dim(0);
  for (int64_t r = 0; r < a.rows; ++r) {
    const auto g = valid_set(got, r), e = valid_set(ref, r);
    if (g == e) {
      ++a.agree;
      continue;
    }
    bool tie = scores && g.size() == e.size() && !g.empty();
    if (tie) {
      const float* s = scores->row(r);
      float boundary = INFINITY;
      for (auto i : g) boundary = std::min(boundary, s[i]);
      for (auto i : g)
        if (!e.count(i) && std::fabs(s[i] - boundary) >= kTieEps) tie = false;
      for (auto i : e)
        if (!g.count(i) && (i >= scores->dim(1) || std::fabs(s[i] - boundary) >= kTieEps)) tie = false;
    }
    if (tie) {
      ++a.ties;
    } else if (a.first_bad.empty()) {
      auto str = [](const std::set<int64_t>& s) {
        std::string o;
        for (auto i : s) o += (o.empty() ? "" : ",") + std::to_string(i);
        return "{" + o + "}";
      };
      a.first_bad = fmt::format("row {}: got {} expected {}", r, str(g), str(e));
    }
  }
  return a;
}

std::string coord(const Shape& s, int64_t flat) {
  std::vector<int64_t> c(s.size());
  for (size_t i = s.size(); i-- > 0;) c[i] = flat % s[i], flat /= s[i];
  return shape_str(c);
}

}  // namespace

int verify_golden(const VerifyGoldenOptions& opt) {
  PLUMB_CHECK(opt.backend == "cpu", "unknown backend '{}' (available: cpu)", opt.backend);
  const PatchSet ps = parse_patches(opt.patches);
  const double tol = ps.tolerance_fp32();  // |err| <= tol * max(1, max|ref|); the loosest active patch's
  const auto fx = GoldenFixture::load(opt.dir);
  const auto model = Model::load(opt.dir, ps.options);
  fmt::print("fixture  {}\nreference {}\nmodel    {}\nbackend  {} (fp32 reference), patches [{}], tolerance {:g} x max(1, max|ref|)\n",
             opt.dir, fx.reference, model->config().summary(), opt.backend, ps.names(), tol);

  auto state = model->new_state();
  std::string first_fail;
  int64_t checked = 0, failed = 0, tokens = 0;
  double seconds = 0;
  for (const auto& step : fx.steps) {
    PLUMB_CHECK(step.start_pos == state.pos, "{}: step {} starts at position {}, but the session is at {} (steps must be contiguous)",
                opt.dir, step.name, step.start_pos, state.pos);
    TapRecorder rec;  // record everything: the compare loop picks what the fixture has
    const auto t0 = std::chrono::steady_clock::now();
    const Tensor logits = model->forward(state, step.tokens, &rec);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    tokens += int64_t(step.tokens.size());
    rec.f32["logits"] = logits;
    rec.order.push_back("logits");

    fmt::print("\nstep {} ({}, {} token{}, start_pos {})\n", step.name, step.kind, step.tokens.size(),
               step.tokens.size() == 1 ? "" : "s", step.start_pos);
    fmt::print("  {:<28} {:>11} {:>11}  {}\n", "tap", "max|err|", "err/max|ref|", "status");
    std::set<std::string> seen;
    int64_t step_fail = 0;
    auto report = [&](const std::string& tap, bool ok, const std::string& line) {
      ++checked;
      if (!ok) {
        ++failed, ++step_fail;
        if (first_fail.empty()) first_fail = step.name + "." + tap;
      }
      if (!ok || !opt.quiet) fmt::print("  {:<28} {}\n", tap, line);
    };
    for (const auto& tap : rec.order) {
      if (!seen.insert(tap).second) continue;
      const TensorView* ref = fx.find(step.name, tap);
      if (!ref) continue;
      const bool is_index = ref->dtype == DType::I64 || ref->dtype == DType::I32;
      if (is_index) {
        auto it = rec.idx.find(tap);
        if (it == rec.idx.end()) {
          report(tap, false, "FAIL: the engine produced a float tensor where the fixture has indices");
          continue;
        }
        const IndexTensor refi = to_i64(*ref);
        if (refi.shape != it->second.shape) {
          report(tap, false, fmt::format("FAIL: shape {} vs reference {}", shape_str(it->second.shape), shape_str(refi.shape)));
          continue;
        }
        const std::string score_tap = tap.ends_with("attn.indexer.topk") ? tap.substr(0, tap.size() - 4) + "scores" : "";
        const auto sc = rec.f32.find(score_tap);
        const auto a = compare_index(it->second, refi, sc == rec.f32.end() ? nullptr : &sc->second);
        report(tap, a.ok(), fmt::format("{:>11} {:>11}  sets agree {}/{} rows{}{}", "", "", a.agree, a.rows,
                                        a.ties ? fmt::format(", {} boundary ties", a.ties) : "",
                                        a.ok() ? "" : "  FAIL " + a.first_bad));
        continue;
      }
      auto it = rec.f32.find(tap);
      if (it == rec.f32.end()) {
        report(tap, false, "FAIL: the engine produced indices where the fixture has floats");
        continue;
      }
      const Tensor reft = to_f32(*ref);
      if (reft.shape != it->second.shape) {
        report(tap, false, fmt::format("FAIL: shape {} vs reference {}", shape_str(it->second.shape), shape_str(reft.shape)));
        continue;
      }
      const auto d = diff_f32(it->second, reft);
      const bool ok = d.nonfinite == 0 && d.rel() <= tol;
      std::string where = ok ? "" : fmt::format("  at {} got {:.6g} expected {:.6g}", coord(reft.shape, d.at),
                                               d.at >= 0 ? it->second[d.at] : 0.0, d.at >= 0 ? reft[d.at] : 0.0);
      if (d.nonfinite) where += fmt::format("  {} non-finite mismatches", d.nonfinite);
      report(tap, ok, fmt::format("{:>11.3e} {:>11.3e}  {}{}", d.max_abs, d.rel(), ok ? "ok" : "FAIL", where));
    }
    // Taps the fixture declares but the engine never produced.
    for (const auto& tap : fx.taps)
      if (!seen.count(tap) && fx.find(step.name, tap)) report(tap, false, "FAIL: not produced by the engine");
    if (!fx.find(step.name, "logits")) fmt::print("  (fixture has no {}.logits)\n", step.name);
    fmt::print("  step {}: {}\n", step.name, step_fail ? fmt::format("{} FAILED", step_fail) : std::string("all ok"));
  }
  fmt::print("\nran {} steps, {} tokens in {:.3f} s ({:.1f} tokens/s, 1 thread)\n", fx.steps.size(), tokens, seconds,
             tokens / std::max(seconds, 1e-9));
  if (failed) {
    fmt::print("verify-golden: FAIL: {} of {} tensors out of tolerance; first failing tap: {}\n", failed, checked, first_fail);
    return 1;
  }
  fmt::print("verify-golden: PASS: {} tensors within tolerance over {} steps ({})\n", checked, fx.steps.size(), opt.dir);
  return 0;
}

}  // namespace plumb::tools
