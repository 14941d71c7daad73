// plumb verify-golden: replays a golden fixture's steps on one session and checks logits and every tap.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <set>

#include "core/parallel.h"
#include "core/strings.h"
#include "cuda/api.h"
#include "model/model.h"
#include "patches/registry.h"
#include "plumb/tools.h"
#include "tools/golden_fixture.h"

namespace plumb::tools {

namespace {

constexpr double kTieEps = 1e-5;  // reference: selection-boundary scores closer than this are ties, not failures

struct IndexAgreement {
  int64_t rows = 0, agree = 0, ties = 0;
  std::set<int64_t> flipped;  // rows whose sets differ only at a near-tied boundary
  std::string first_bad;
  bool ok() const { return agree + ties == rows; }
};

std::set<int64_t> valid_set(const IndexTensor& t, int64_t r) {
  std::set<int64_t> s;
  for (int64_t k = 0; k < t.dim(1); ++k)
    if (t[r * t.dim(1) + k] >= 0) s.insert(t[r * t.dim(1) + k]);
  return s;
}

// Row-wise set comparison. `scores` are our own [n, candidates] selection scores (may be null): a row whose
// differing entries all score within `tie_eps` x max(1, max|row|) of our selection boundary is a near tie,
// where the reference's own rounding decides (reported as such, not failed).
IndexAgreement compare_index(const IndexTensor& got, const IndexTensor& ref, const Tensor* scores, double tie_eps) {
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
      const int64_t nc = scores->dim(1);
      float boundary = INFINITY, mag = 1;
      for (int64_t i = 0; i < nc; ++i)
        if (std::isfinite(s[i])) mag = std::max(mag, std::fabs(s[i]));
      for (auto i : g) boundary = std::min(boundary, s[i]);
      const double eps = tie_eps * mag;
      for (auto i : g)
        if (!e.count(i) && std::fabs(s[i] - boundary) >= eps) tie = false;
      for (auto i : e)
        if (!g.count(i) && (i >= nc || std::fabs(s[i] - boundary) >= eps)) tie = false;
    }
    if (tie) {
      ++a.ties;
      a.flipped.insert(r);
    } else if (a.first_bad.empty()) {
      auto str = [](const std::set<int64_t>& s) {
        std::string o;
        for (auto i : s) append_item(o, std::to_string(i));
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

// "L3.attn.indexer.topk" -> "L3."; "" for model-level taps.
std::string layer_prefix(const std::string& tap) {
  const auto dot = tap.find('.');
  return tap.size() > 1 && tap[0] == 'L' && dot != std::string::npos ? tap.substr(0, dot + 1) : "";
}

// Taps whose rows a near-tie selection flip legitimately changes (within the same sublayer; with teacher
// forcing nothing downstream inherits it).
std::vector<std::string> dependents_of(const std::string& index_tap) {
  const std::string L = layer_prefix(index_tap);
  if (index_tap.ends_with("attn.indexer.topk")) return {L + "attn.out"};
  if (index_tap.ends_with("ffn.gate.indices")) return {L + "ffn.gate.weights", L + "ffn.routed", L + "ffn.out"};
  return {};
}

// The fixture's own numerics mode: the official code's revision its reference string names, or numerics.reference
// (the fp32 reference) for any other golden.
std::string fixture_numerics(const GoldenFixture& fx) {
  if (fx.reference.find("official inference") == std::string::npos) return "numerics.reference";
  return fx.reference.find("initial revision") != std::string::npos ? "numerics.official_initial" : "numerics.official";
}

// --patches as verify-golden runs them: numerics.fixture (kFixtureNumerics) replaced by the fixture's own numerics
// mode, which is also put first when the list names no numerics mode: a golden is checked in the numerics of the code
// that computed it unless told otherwise (numerics.reference runs the fp32 reference on an official-code golden).
// `mode` is the fixture's (fixture_numerics); `implied` is set when it was added, not named.
std::string with_fixture_numerics(const std::string& patches, const std::string& mode, bool& implied) {
  std::string out;
  for (const auto& name : split_list(patches)) out += (out.empty() ? "" : ",") + (name == kFixtureNumerics ? mode : name);
  implied = false;
  for (const auto& n : expand_patch_list(out))  // presets expanded: a numerics mode inside one counts
    if (const Patch* p = find_patch(n); p && p->numerics_mode) return out;
  implied = true;
  return out.empty() ? mode : mode + "," + out;
}

std::string selection_scores_of(const std::string& index_tap) {
  if (index_tap.ends_with("attn.indexer.topk")) return index_tap.substr(0, index_tap.size() - 4) + "scores";
  if (index_tap.ends_with("ffn.gate.indices")) return index_tap.substr(0, index_tap.size() - 7) + "scores";
  return "";
}

}  // namespace

void check_verify_options(const VerifyGoldenOptions& opt) {
  PLUMB_CHECK(opt.backend == "cpu" || opt.backend == "cuda", "unknown backend '{}' (available: {})", opt.backend, kBackends);
  PLUMB_CHECK(opt.mode == "auto" || opt.mode == "free" || opt.mode == "forced", "unknown mode '{}' (auto, free, forced)", opt.mode);
  std::string why;
  PLUMB_CHECK(opt.backend != "cuda" || cuda::available(&why), "backend cuda: {}", why);
  // Known names (combinations are checked with each fixture's own numerics mode, which joins the list there).
  check_patch_list_items(opt.patches);
  std::string names;
  int fixture_numerics = 0;
  for (const auto& name : split_list(opt.patches))
    if (name != kFixtureNumerics) append_item(names, name);
    else ++fixture_numerics;
  PLUMB_CHECK(fixture_numerics <= 1, "patch '{}' is listed twice", kFixtureNumerics);
  check_patches_run_on(expand_patch_list(names), opt.backend, "it needs --backend");  // (else every fixture fails)
}

int verify_golden(const VerifyGoldenOptions& opt) {
  check_verify_options(opt);
  const auto fx = GoldenFixture::load(opt.dir);
  const std::string own = fixture_numerics(fx);
  const bool official_golden = own != "numerics.reference";
  bool implied_numerics = false;
  const std::string patches = with_fixture_numerics(opt.patches, own, implied_numerics);
  PatchSet ps;
  std::unique_ptr<Model> model;
  try {
    ps = parse_patches(patches);
    model = Model::load(opt.dir, ps.options, {}, opt.backend);
  } catch (const Error& e) {  // a combination refused beside the mode verify-golden added says where that mode came from
    if (!implied_numerics || !official_golden || std::string(e.what()).find(own) == std::string::npos) throw;
    fail("{} ({} is this fixture's own numerics, taken because --patches names no numerics mode; name one, e.g. "
         "numerics.reference for the fp32 reference)", e.what(), own);
  }
  const bool approximate = ps.tolerance_fp32() > 1e-4;  // an approximate patch: its errors compound when free running
  // The GPU resolves exactly equal top-k scores to the lower index (PyTorch's CUDA order), the fixtures come from
  // PyTorch's CPU order: a tie decided the other way changes everything downstream unless each sublayer is fed
  // the fixture's inputs.
  const bool gpu = opt.backend != "cpu";
  const bool forced = opt.mode == "forced" || (opt.mode == "auto" && (approximate || ps.numerics_official() || gpu));
  // |err| <= tol * max(1, max|ref|): the loosest active patch's, its local (per-op) one when teacher forcing
  const double tol = forced ? ps.tolerance_local() : ps.tolerance_fp32();
  // Selection boundaries within the patch's own noise decide nothing about correctness.
  const double tie_eps = std::max(kTieEps, ps.tolerance_fp32() > 1e-4 ? tol : kTieEps);
  fmt::print("fixture  {}\nreference {}\nmodel    {}\nbackend  {} ({}), patches [{}], tolerance {:g} x max(1, max|ref|)\n",
             opt.dir, fx.reference, model->config().summary(), opt.backend,
             gpu                      ? "every op on the GPU, fp32, top-k ties to the lower index"
             : ps.numerics_official() ? "the CPU in the official code's roundings"
                                      : "fp32 reference",
             ps.names(), tol);
  fmt::print("mode     {}\n", forced ? "teacher forcing: each sublayer is fed the fixture's inputs, each tap shows its op's "
                                       "local error (--mode free runs on the engine's own outputs)"
                                     : "free running: the engine runs on its own outputs");
  if (implied_numerics)
    fmt::print("numerics {}, the fixture's own ({}; name a numerics mode in --patches to choose another)\n",
               own, official_golden ? "DeepSeek's official code computed it" : "an fp32 reference computed it");
  if (official_golden != ps.numerics_official())
    fmt::print("note     this fixture was computed by {}, the engine runs {} numerics: expect the gap between the two "
               "numerics, not an engine error (compare them with plumb kld)\n",
               official_golden ? "DeepSeek's official code" : "an fp32 reference", ps.numerics_official() ? "official" : "fp32 reference");

  auto state = model->new_state();
  std::string first_fail;
  int64_t checked = 0, failed = 0, tokens = 0, flips = 0;
  double seconds = 0;
  for (const auto& step : fx.steps) {
    PLUMB_CHECK(step.start_pos == state.pos, "{}: step {} starts at position {}, but the session is at {} (steps must be contiguous)",
                opt.dir, step.name, step.start_pos, state.pos);
    // Record everything: the compare loop picks what the fixture has. Teacher forcing also hands the
    // fixture's values back at sublayer boundaries.
    GoldenForcer forcer(fx, step.name);
    TapRecorder plain;
    TapRecorder& rec = forced ? forcer : plain;
    const auto t0 = std::chrono::steady_clock::now();
    Tensor logits;
    try {
      logits = model->forward(state, step.tokens, &rec);
    } catch (const Error& e) {  // (a token id outside the vocabulary in golden.json, ...): which fixture and step
      fail("{}: step {}: {}", opt.dir, step.name, e.what());
    }
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    tokens += int64_t(step.tokens.size());
    rec.f32["logits"] = logits;
    rec.order.push_back("logits");

    // The step's heading and table header; with --quiet only above a failing tap (the step's summary line stays).
    bool headed = false;
    auto heading = [&] {
      if (headed) return;
      headed = true;
      fmt::print("\nstep {} ({}, {} token{}, start_pos {})\n", step.name, step.kind, step.tokens.size(),
                 step.tokens.size() == 1 ? "" : "s", step.start_pos);
      fmt::print("  {:<28} {:>11} {:>11}  {}\n", "tap", "max|err|", "err/max|ref|", "status");
    };
    if (!opt.quiet) heading();
    std::set<std::string> seen;
    std::map<std::string, std::set<int64_t>> excluded;  // tap -> rows changed by a near-tie flip upstream
    int64_t step_fail = 0;
    auto report = [&](const std::string& tap, bool ok, const std::string& line) {
      ++checked;
      if (!ok) {
        ++failed, ++step_fail;
        if (first_fail.empty()) first_fail = step.name + "." + tap;
      }
      if (!ok || !opt.quiet) heading(), fmt::print("  {:<28} {}\n", tap, line);
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
        // The indexer's top-k is a set per row with -1 for none (FORMAT.md): transformers cuts a row to the entries
        // visible (min(index_topk, entries) wide), the official code pads it to index_topk with -1, so its width may
        // differ while the rows' sets agree.
        const bool width_free = tap.ends_with("attn.indexer.topk") && refi.shape.size() == 2 &&
                                it->second.shape.size() == 2 && refi.shape[0] == it->second.shape[0];
        if (refi.shape != it->second.shape && !width_free) {
          report(tap, false, fmt::format("FAIL: shape {} vs reference {}", shape_str(it->second.shape), shape_str(refi.shape)));
          continue;
        }
        const auto sc = rec.f32.find(selection_scores_of(tap));
        const auto a = compare_index(it->second, refi, sc == rec.f32.end() ? nullptr : &sc->second, tie_eps);
        if (forced)  // only teacher forcing confines a flip to its own sublayer
          for (const auto& dep : dependents_of(tap)) excluded[dep].insert(a.flipped.begin(), a.flipped.end());
        else if (!a.flipped.empty() && ps.tolerance_fp32() > 1e-4)
          heading(), fmt::print("  (near-tie flips change everything downstream when free running: use --mode forced)\n");
        flips += a.ties;
        report(tap, a.ok(), fmt::format("{:>11} {:>11}  sets agree {}/{} rows{}{}", "", "", a.agree, a.rows,
                                        a.ties ? fmt::format(", {} near-tie flips", a.ties) : "",
                                        a.ok() ? "" : "  FAIL " + a.first_bad));
        continue;
      }
      auto it = rec.f32.find(tap);
      if (it == rec.f32.end()) {
        report(tap, false, "FAIL: the engine produced indices where the fixture has floats");
        continue;
      }
      Tensor reft = to_f32(*ref);
      Tensor got = it->second;
      if (reft.shape != got.shape) {
        report(tap, false, fmt::format("FAIL: shape {} vs reference {}", shape_str(got.shape), shape_str(reft.shape)));
        continue;
      }
      std::string note;
      if (auto ex = excluded.find(tap); ex != excluded.end() && !ex->second.empty()) {
        const int64_t rw = reft.numel() / reft.dim(0);
        for (auto r : ex->second) std::copy(reft.ptr() + r * rw, reft.ptr() + (r + 1) * rw, got.ptr() + r * rw);
        note = fmt::format("  ({} row{} after near-tie flips not compared)", ex->second.size(), ex->second.size() == 1 ? "" : "s");
      }
      const auto d = diff_f32(got, reft);
      const bool ok = d.nonfinite == 0 && d.rel() <= tol;
      // Where the largest error is, also within tolerance (which row, i.e. token, and which element).
      std::string where = d.at >= 0 && d.max_abs > 0 ? fmt::format("  at {} got {:.9g} expected {:.9g}", coord(reft.shape, d.at),
                                                                   got[d.at], reft[d.at])
                                                     : "";
      if (d.nonfinite) where += fmt::format("  {} non-finite mismatches", d.nonfinite);
      report(tap, ok, fmt::format("{:>11.3e} {:>11.3e}  {}{}{}", d.max_abs, d.rel(), ok ? "ok" : "FAIL", where, note));
    }
    // Taps the fixture declares but the engine never produced.
    for (const auto& tap : fx.taps)
      if (!seen.count(tap) && fx.find(step.name, tap)) report(tap, false, "FAIL: not produced by the engine");
    if (!fx.find(step.name, "logits")) heading(), fmt::print("  (fixture has no {}.logits)\n", step.name);
    fmt::print("  step {}: {}\n", step.name, step_fail ? fmt::format("{} FAILED", step_fail) : std::string("all ok"));
  }
  fmt::print("\nran {} steps, {} tokens in {:.3f} s ({:.1f} tokens/s{})\n", fx.steps.size(), tokens, seconds,
             tokens / std::max(seconds, 1e-9), gpu ? "" : fmt::format(", up to {} CPU threads", threads()));
  const std::string flip_note = flips ? fmt::format(", {} near-tie selection flips", flips) : "";
  if (failed) {
    // The toolkit's diagnosis of the same run (diff names the first diverging op and what it looks like).
    const std::string cfg = (gpu ? opt.backend + ":" : "") + ps.names();
    fmt::print("diagnose: plumb trace --fixture {} --patches '{}' -o run.safetensors && plumb diff --trace-a {} --trace-b "
               "run.safetensors\n",
               opt.dir, cfg, opt.dir);
    fmt::print("verify-golden: FAIL: {} of {} tensors out of tolerance; first failing tap: {}\n", failed, checked, first_fail);
    return 1;
  }
  fmt::print("verify-golden: PASS: {} tensors within tolerance over {} steps{} ({})\n", checked, fx.steps.size(), flip_note, opt.dir);
  return 0;
}

}  // namespace plumb::tools
