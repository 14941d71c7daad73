// The routed experts' MXFP4 decode kernels (gate/up + SwiGLU, down, the combine; the per-tile and streaming kernels,
// PDL, moe_group's table, the top-k ranked in gate/up) against their CPU twins and each other.
//
// Tolerances (normalized: max |gpu - ref| / max |ref| over the output tensor):
//   twin, fp32 outputs      1e-4  the same math; only fp32 accumulation order and tensor-core adds differ
//   twin, fp16 outputs      2e-3  one fp16 rounding of the output (2^-11 relative) near a tie can go either way
// Every comparison prints where its largest error is (index, both values).
#include <algorithm>
#include <cstring>
#include <numeric>
#include <set>

#include <fmt/format.h>

#include "cuda/fp4_layout.h"
#include "cuda/fwd_kernels.h"
#include "cuda/kernels.h"
#include "model/experts.h"
#include "model/router.h"
#include "cuda_test_util.h"
#include "kernel_twins.h"

using namespace plumb;
using namespace plumb_cuda_test;
using cuda::Act;

// ---- routed experts (MXFP4) ----

// gate/up (+ SwiGLU) and down per slot, the combine, for routings with repeats across and within tokens.
TEST_F(CudaMoe, GateUpDownCombineMatchTwin) {
  Rng rng(5);
  const int64_t E = 12, D = 1024, I = 512;
  auto f = make_moe(rng, E, D, I);
  const cuda::MoeExperts m = cuda::upload_experts(f->w);
  const float limit = 7.0f;
  struct Routing {
    const char* name;
    int n, K;
    std::vector<int32_t> idx;
  };
  std::vector<Routing> routings;
  {
    Routing r{"random distinct", 8, 4, random_distinct_routing(rng, 8, 4, E)};
    routings.push_back(r);
  }
  routings.push_back({"one token", 1, 4, {3, 0, 11, 7}});
  routings.push_back({"repeats within a token (hash table)", 3, 4, {2, 2, 5, 9, 9, 9, 1, 2, 4, 4, 4, 4}});
  routings.push_back({"every slot one expert (passes of 8)", 5, 4, std::vector<int32_t>(20, 6)});
  for (const auto& r : routings)
    for (Act at : {Act::F32, Act::BF16, Act::F16})
      for (bool pre : {false, true}) {
        if (pre && at != Act::BF16) continue;
        const int n = r.n, K = r.K, S = n * K;
        const Acts x = make_acts(at, rng.floats(size_t(n * D), -2.0f, 2.0f));
        const auto wts = rng.floats(size_t(S), 0.05f, 1.0f);
        cuda::DeviceBuffer idx = cuda::to_device(r.idx), wd = cuda::to_device(wts);
        cuda::DeviceBuffer h32(size_t(S * I) * 4), h16(size_t(S * I) * 2), ys(size_t(S * D) * 4), ys16(size_t(S * D) * 4),
            y(size_t(n * D) * 4);
        for (auto* b : {&h32, &h16, &ys, &ys16, &y}) b->fill_byte(0xFF);
        const float* pw = pre ? wd.as<float>() : nullptr;
        cuda::Workspace ws;
        cuda::moe_gate_up(m, idx.as<int32_t>(), n, K, x.dev.get(), at, limit, pw, nullptr, h32.as<float>(), ws);
        cuda::moe_gate_up(m, idx.as<int32_t>(), n, K, x.dev.get(), at, limit, pw, h16.as<uint16_t>(), nullptr, ws);
        cuda::moe_down(m, idx.as<int32_t>(), n, K, nullptr, h32.as<float>(), ys.as<float>(), ws);
        cuda::moe_down(m, idx.as<int32_t>(), n, K, h16.as<uint16_t>(), nullptr, ys16.as<float>(), ws);
        cuda::DeviceBuffer add = cuda::to_device(rng.floats(size_t(n * D), -1.0f, 1.0f));
        cuda::moe_combine(ys.as<float>(), wd.as<float>(), n, K, D, 1.5f, add.as<float>(), y.as<float>());
        cuda::synchronize();
        const auto hg = cuda::to_host<float>(h32, size_t(S * I));
        const auto hg16 = f16_to_float(cuda::to_host<uint16_t>(h16, size_t(S * I)));
        const auto ysg = cuda::to_host<float>(ys, size_t(S * D));
        const auto ysg16 = cuda::to_host<float>(ys16, size_t(S * D));
        const auto yg = cuda::to_host<float>(y, size_t(n * D));
        const auto addh = cuda::to_host<float>(add, size_t(n * D));
        // CPU twins, slot by slot.
        std::vector<float> h_twin(size_t(S * I)), ys_twin(size_t(S * D)), ys16_twin(size_t(S * D)), h_ref(size_t(S * I));
        for (int s = 0; s < S; ++s) {
          const auto& ex = f->w.experts[size_t(r.idx[size_t(s)])];
          const std::vector<float> xs(x.f16.begin() + (s / K) * D, x.f16.begin() + (s / K + 1) * D);
          auto h = swiglu_cpu(linear_cpu(xs, 1, ex.w1), linear_cpu(xs, 1, ex.w3), limit);
          if (pre)
            for (auto& v : h) v *= wts[size_t(s)];
          std::copy(h.begin(), h.end(), h_twin.begin() + s * I);
          const std::vector<float> hgs(hg.begin() + s * I, hg.begin() + (s + 1) * I), hg16s(hg16.begin() + s * I, hg16.begin() + (s + 1) * I);
          const auto yd = linear_cpu(rounded_f16(hgs), 1, ex.w2), yd16 = linear_cpu(hg16s, 1, ex.w2);
          std::copy(yd.begin(), yd.end(), ys_twin.begin() + s * D);
          std::copy(yd16.begin(), yd16.end(), ys16_twin.begin() + s * D);
          const std::vector<float> xv(x.value.begin() + (s / K) * D, x.value.begin() + (s / K + 1) * D);
          auto hr = swiglu_cpu(linear_cpu(xv, 1, ex.w1), linear_cpu(xv, 1, ex.w3), limit);
          if (pre)
            for (auto& v : hr) v *= wts[size_t(s)];
          std::copy(hr.begin(), hr.end(), h_ref.begin() + s * I);
        }
        std::vector<float> y_twin(size_t(n * D));
        for (int t = 0; t < n; ++t)
          for (int64_t dd = 0; dd < D; ++dd) {
            float acc = 0;
            for (int k = 0; k < K; ++k) acc = std::fma(wts[size_t(t * K + k)], ysg[size_t((t * K + k) * D + dd)], acc);
            y_twin[size_t(t * D + dd)] = acc * 1.5f + addh[size_t(t * D + dd)];
          }
        const std::string tag = std::string("moe [") + r.name + "] n=" + std::to_string(n) + " x " + act_name(at) +
                                (pre ? " weight-before-down" : "");
        expect_close(tag + " gate/up h32 vs twin", hg, h_twin, I, 1e-4);
        expect_close(tag + " gate/up h16 vs twin", hg16, rounded_f16(h_twin), I, 2e-3);
        expect_close(tag + " gate/up h32 vs fp32 reference", hg, h_ref, I, 5e-3);
        expect_close(tag + " down (h32 in) vs twin", ysg, ys_twin, D, 1e-4);
        expect_close(tag + " down (h16 in) vs twin", ysg16, ys16_twin, D, 1e-4);
        expect_close(tag + " combine vs twin", yg, y_twin, D, 1e-6);
      }
}

// One FP4 MoE launch through launch_gemv with the configuration fields of cfg: gate/up + SwiGLU (which 0: x rows
// by token, pre-weighted by pw) or down (which 1: h rows by slot); the fp32 output of every slot (0xFF-filled first).
struct Fp4MoeCase {
  const cuda::MoeExperts& m;
  const cuda::DeviceBuffer &idx, &pw;
  const Acts &x, &h;
  int n, K;
  std::vector<float> run(int which, const cuda::detail::GemvArgs& cfg) const {
    namespace d = cuda::detail;
    const int S = n * K;
    const int64_t D = m.w1.cols, I = m.w1.rows;
    const cuda::Fp4Matrices& w = which == 0 ? m.w1 : m.w2;
    cuda::DeviceBuffer out(size_t(S) * size_t(w.rows) * 4);
    out.fill_byte(0xFF);
    d::GemvArgs a = cfg;
    a.fmt = d::kFp4, a.mode = d::kMoe, a.act = d::kF16, a.idx = idx.as<int32_t>(), a.n = n, a.topk = K, a.problems = int(m.E);
    a.w[0] = w.codes.as<uint8_t>(), a.s[0] = w.scales.get();
    a.w_prob_stride = int64_t(w.code_bytes()), a.s_prob_stride = int64_t(w.scale_bytes());
    a.rows = w.rows, a.cols = w.cols, a.s_ld = w.cols / 32;
    if (which == 0) {
      a.nmat = 2, a.epi = d::kSwiglu, a.limit = 7.0f, a.pre_weight = pw.as<float>();
      a.w[1] = m.w3.codes.as<uint8_t>(), a.s[1] = m.w3.scales.get();
      a.x = x.dev.get(), a.x_tok_stride = D, a.x_by_token = 1, a.o_tok_stride = I;
    } else {
      a.x = h.dev.get(), a.x_tok_stride = I, a.o_tok_stride = D;
    }
    a.out = out.get();
    d::launch_gemv(a, nullptr);
    cuda::synchronize();
    return cuda::to_host<float>(out, size_t(S) * size_t(w.rows));
  }
};

// The FP4 MoE kernels through launch_gemv: the streaming kernel (fp4_kernel 2) in each of its configurations (warps per CTA,
// stages in flight, CTAs per SM, programmatic dependent launch, warps splitting K) against the per-tile kernel on the
// same inputs. fp32 outputs: only the accumulation order differs. The routing repeats experts within and across
// tokens and gives one expert more than 8 tokens (passes of 8).
TEST_F(CudaMoe, StreamingConfigsMatchPerTile) {
  namespace d = cuda::detail;
  Rng rng(11);
  const int64_t E = 6, D = 2048, I = 1024;
  auto f = make_moe(rng, E, D, I);
  const cuda::MoeExperts m = cuda::upload_experts(f->w);
  const int n = 7, K = 4, S = n * K;
  std::vector<int32_t> idx(static_cast<size_t>(S));
  // Expert 2 takes every third slot (10: passes of 8 and 2), experts 5 and 0 one slot each (the one-token path),
  // the rest go to experts 1, 3, 4 at random.
  std::uniform_int_distribution<int> pick(0, 2);
  const int rest[3] = {1, 3, 4};
  for (int s = 0; s < S; ++s) idx[size_t(s)] = s % 3 == 0 ? 2 : s == 1 ? 5 : s == 2 ? 0 : rest[pick(rng.gen())];
  const Acts x = make_acts(Act::F16, rng.floats(size_t(n * D), -2.0f, 2.0f));
  const Acts h = make_acts(Act::F16, rng.floats(size_t(S * I), -2.0f, 2.0f));
  cuda::DeviceBuffer di = cuda::to_device(idx), pw = cuda::to_device(rng.floats(size_t(S), 0.1f, 1.0f));
  const Fp4MoeCase mc{m, di, pw, x, h, n, K};
  auto run = [&](int which, const d::GemvArgs& cfg) { return mc.run(which, cfg); };
  d::GemvArgs tile;
  tile.fp4_kernel = 1, tile.warps = 4;
  const std::vector<float> ref_gu = run(0, tile), ref_dn = run(1, tile);
  struct Cfg {
    int warps, depth, ctas, pdl, ks;
  };
  for (const Cfg& c : {Cfg{0, 0, 0, -1, 0}, Cfg{1, 2, 0, 0, 0}, Cfg{2, 3, 0, 1, 2}, Cfg{4, 4, 1, 0, 4}, Cfg{8, 2, 0, 1, 2},
                       Cfg{3, 6, 0, 0, 0}, Cfg{4, 2, 0, 0, 2}, Cfg{8, 3, 0, 0, 8}, Cfg{8, 2, 2, 0, 4}, Cfg{2, 2, 0, 0, 1}}) {
    d::GemvArgs a;
    a.fp4_kernel = 2, a.fp4_warps = c.warps, a.fp4_depth = c.depth, a.fp4_ctas = c.ctas, a.pdl = c.pdl;
    a.fp4_ksplit = c.ks;
    const std::string tag = "fp4 streaming (warps " + std::to_string(c.warps) + ", depth " + std::to_string(c.depth) +
                            ", ctas " + std::to_string(c.ctas) + ", pdl " + std::to_string(c.pdl) + ", ks " +
                            std::to_string(c.ks) + ")";
    expect_close(tag + " gate/up vs per-tile", run(0, a), ref_gu, I, 1e-5);
    expect_close(tag + " down vs per-tile", run(1, a), ref_dn, D, 1e-5);
  }
  // The per-tile kernel's own variants: warps per block, register budget (minblocks), PDL (the library defaults:
  // gate/up 4 warps at minblocks 3 at <= 8 slots, 2 at minblocks 2 above; down 2 warps at <= 8 slots, 1 above, both
  // at minblocks 3; PDL at <= 8 slots and for down). At minblocks 1, up to 4 warps take the 168-register instantiation
  // (gemv.cu, MINB 0), 8 warps the uncapped one.
  struct TileCfg {
    int warps, minb, pdl;
  };
  for (const TileCfg& c : {TileCfg{2, 1, 1}, TileCfg{2, 2, 0}, TileCfg{2, 2, 1}, TileCfg{4, 3, 0}, TileCfg{8, 3, 1}, TileCfg{3, 1, 0},
                           TileCfg{1, 1, 1}, TileCfg{1, 2, 1}, TileCfg{4, 1, 1}, TileCfg{8, 1, 0}}) {
    d::GemvArgs a;
    a.fp4_kernel = 1, a.warps = c.warps, a.minblocks = c.minb, a.pdl = c.pdl;
    const std::string tag = "fp4 per-tile (warps " + std::to_string(c.warps) + ", minblocks " + std::to_string(c.minb) +
                            ", pdl " + std::to_string(c.pdl) + ")";
    expect_close(tag + " gate/up vs per-tile", run(0, a), ref_gu, I, 1e-5);
    expect_close(tag + " down vs per-tile", run(1, a), ref_dn, D, 1e-5);
  }
}

// pdl_early (down's routing read, and its first weights requested, before the PDL wait) against the same launch
// without it, bit for bit, with 1 and 2 warps and each register budget: two shapes (chunks per warp a multiple of the 4 in flight, 2048 x
// 1024, and not, 1152 x 640); the routing repeats an expert (several tokens per pass) and gives others one slot
// (the one-token path). (Eager launches: the forward's graph tests under cuda.pdl run it after gate/up.)
TEST_F(CudaMoe, EarlyRoutingReadMatchesBitForBit) {
  namespace d = cuda::detail;
  Rng rng(17);
  for (const auto& [D, I] : {std::pair<int64_t, int64_t>{2048, 1024}, std::pair<int64_t, int64_t>{1152, 640}}) {
    const int64_t E = 5;
    auto f = make_moe(rng, E, D, I);
    const cuda::MoeExperts m = cuda::upload_experts(f->w);
    const int n = 5, K = 3, S = n * K;
    std::vector<int32_t> idx(static_cast<size_t>(S));
    for (int s = 0; s < S; ++s) idx[size_t(s)] = s % 2 == 0 ? 1 : s == 3 ? 4 : s % 3 == 0 ? 0 : 2 + s % 2;
    const Acts x = make_acts(Act::F16, rng.floats(size_t(n * D), -2.0f, 2.0f));
    const Acts h = make_acts(Act::F16, rng.floats(size_t(S * I), -2.0f, 2.0f));
    cuda::DeviceBuffer di = cuda::to_device(idx), pw = cuda::to_device(rng.floats(size_t(S), 0.1f, 1.0f));
    const Fp4MoeCase mc{m, di, pw, x, h, n, K};
    for (int warps : {1, 2})
      for (int minb : {1, 2, 3}) {  // (3: down's default budget, with 2 warps at <= 8 slots and 1 above)
        d::GemvArgs a;
        a.fp4_kernel = 1, a.warps = warps, a.minblocks = minb, a.pdl = 1;
        const std::vector<float> ref = mc.run(1, a);
        a.pdl_early = 1;
        const std::vector<float> got = mc.run(1, a);
        size_t first = 0;
        while (first < ref.size() && std::memcmp(&ref[first], &got[first], 4) == 0) ++first;
        EXPECT_EQ(first, ref.size()) << "down " << D << " x " << I << ", warps " << warps << ", minblocks " << minb
                                     << ": first differing output " << first;
      }
  }
}

// The decode kernels with moe_group's table (a block per table tile) against the per-slot scan, bit for bit: 360
// slots (the per-tile kernel either way), one expert with 100 slots (two tiles of the table: 64 + 36), one with a
// single slot, an out-of-range id (no output either way), experts with none.
// The decode kernels with moe_group's table against their own grouping: gate/up (per-tile, a block per table tile
// or per slot) and down (the streaming kernel, the grouping read from the table or built in its prologue) give the
// same bits at 240 slots (one expert with 100 slots: 13 passes; an expert id -1); at 360 slots, beyond the
// streaming kernel's own grouping, down with the table (streaming) against the per-tile kernel's scan: another sum
// order, within 1e-5 of the largest output.
TEST_F(CudaMoe, GroupTableMatchesScan) {
  Rng rng(13);
  const int64_t E = 16, D = 2048, I = 1024;
  auto f = make_moe(rng, E, D, I);
  const cuda::MoeExperts m = cuda::upload_experts(f->w);
  for (const int n : {40, 60}) {
    const int K = 6, S = n * K;
    SCOPED_TRACE("slots " + std::to_string(S));
    std::vector<int32_t> idx(static_cast<size_t>(S));
    std::uniform_int_distribution<int> pick(8, 15);
    for (int s = 0; s < S; ++s) idx[size_t(s)] = s < 200 && s % 2 == 0 ? 3 : s == 201 ? 7 : s == 203 ? -1 : pick(rng.gen());
    const Acts x = make_acts(Act::F16, rng.floats(size_t(n * D), -2.0f, 2.0f));
    cuda::DeviceBuffer di = cuda::to_device(idx), groups(cuda::moe_group_bytes(n, K, E));
    cuda::Workspace ws;
    auto run = [&](bool table, std::vector<uint16_t>& h, std::vector<float>& ys) {
      cuda::DeviceBuffer dh(size_t(S) * size_t(I) * 2), dy(size_t(S) * size_t(D) * 4);
      dh.fill_byte(0xFF), dy.fill_byte(0xFF);
      const void* g = nullptr;
      if (table) cuda::moe_group(di.as<int32_t>(), n, K, E, groups.get()), g = groups.get();
      cuda::moe_gate_up(m, di.as<int32_t>(), n, K, x.dev.get(), Act::F16, 7.0, nullptr, dh.as<uint16_t>(), nullptr, ws, nullptr, g);
      cuda::moe_down(m, di.as<int32_t>(), n, K, dh.as<uint16_t>(), nullptr, dy.as<float>(), ws, nullptr, g);
      cuda::synchronize();
      h = cuda::to_host<uint16_t>(dh, size_t(S) * size_t(I));
      ys = cuda::to_host<float>(dy, size_t(S) * size_t(D));
    };
    std::vector<uint16_t> h0, h1;
    std::vector<float> y0, y1;
    run(false, h0, y0);
    run(true, h1, y1);
    auto first_diff = [](const void* a, const void* b, size_t n, size_t sz) {
      for (size_t i = 0; i < n; ++i)
        if (std::memcmp(static_cast<const char*>(a) + i * sz, static_cast<const char*>(b) + i * sz, sz) != 0) return int64_t(i);
      return int64_t(-1);
    };
    const int64_t dh = first_diff(h0.data(), h1.data(), h0.size(), 2), dy = first_diff(y0.data(), y1.data(), y0.size(), 4);
    EXPECT_EQ(dh, -1) << "gate/up with the table differs from the scan first at slot " << dh / I << ", column " << dh % I;
    if (S <= 256) {
      EXPECT_EQ(dy, -1) << "down with the table differs from the scan first at slot " << dy / D << ", column " << dy % D;
    } else {
      double worst = 0, big = 0;
      size_t at = 0;
      for (size_t i = 0; i < y0.size(); ++i) {
        if (i / size_t(D) == 203) continue;  // the slot with expert id -1 (checked below)
        big = std::max(big, double(std::fabs(y0[i])));
        const double d = std::fabs(double(y0[i]) - double(y1[i]));
        if (!(d <= worst)) worst = d, at = i;
      }
      EXPECT_LE(worst, 1e-5 * big) << "down with the table (streaming) against the scan (per-tile) at slot " << at / size_t(D)
                                   << ", column " << at % size_t(D) << ": " << y1[at] << " against " << y0[at];
    }
    // The out-of-range slot is written by neither.
    uint32_t bits;
    std::memcpy(&bits, &y1[size_t(203) * size_t(D)], 4);
    EXPECT_EQ(bits, 0xFFFFFFFFu) << "a slot with expert id -1 was written";
  }
}

// cuda.topk_in_experts: one token's gate/up launch that ranks the gate's logits itself, then down on the indices it
// stored, against the router's launch then gate/up and down. Every routing it takes (experts per lane 1, 2, 4, 8 and
// V4's code; the three scores, hash tables with repeats, groups, the faults' renormalizations, a fold) on ordinary
// logits and on rows with exact ties, NaN and infinities; with PDL (down reads the indices before its wait) and
// without. The routing, h and the outputs must be the same bits; arguments it does not take are refused.
TEST_F(CudaMoe, RankedInExpertsMatchesRouterLaunch) {
  namespace d = cuda::detail;
  Rng rng(31);
  const int64_t D = 256, I = 128;
  struct Case {
    int E, K, score, hash, groups, topk_groups, variant;  // variant: 0 plain, 1 no renorm, 2 unfloored, 3 naive softplus
    float fold;
  };
  const Case cases[] = {{256, 6, 0, 0, 1, 1, 0, 2.5f},  {256, 8, 1, 0, 8, 4, 0, 1.0f}, {64, 6, 2, 0, 1, 1, 1, 1.0f},
                        {40, 4, 0, 0, 1, 1, 2, 1.5f},   {8, 2, 0, 1, 1, 1, 0, 1.5f},   {200, 6, 0, 1, 1, 1, 0, 1.0f},
                        {100, 5, 0, 0, 1, 1, 3, 1.0f}, {16, 8, 2, 0, 4, 2, 0, 1.0f}};
  std::set<int> variants;
  for (const Case& c : cases) {
    auto f = make_moe(rng, c.E, D, I);
    const cuda::MoeExperts m = cuda::upload_experts(f->w);
    for (int row = 0; row < 3; ++row)
      for (const bool pdl : {false, true}) {
        std::vector<float> lg = rng.floats(size_t(c.E), -3.0f, 3.0f);
        if (row == 1)
          for (auto& v : lg) v = 0.5f * float(rng.integer(0, 3));  // exact ties
        if (row == 2) lg[size_t(c.E / 3)] = NAN, lg[size_t(c.E / 2)] = INFINITY, lg[size_t(c.E - 1)] = -INFINITY, lg[1] = -0.0f;
        std::vector<float> bias(size_t(c.E));
        for (auto& v : bias) v = row == 1 ? 0.01f * float(rng.integer(0, 3)) : rng.uniform(-0.05f, 0.05f);
        std::vector<int32_t> tid2eid(size_t(50 * c.K));
        for (auto& v : tid2eid) v = rng.integer(0, 2) == 0 ? 1 : rng.integer(0, c.E - 1);  // repeats within a token
        const std::vector<int32_t> tok = {rng.integer(0, 49)};
        const Acts x = make_acts(Act::F16, rng.floats(size_t(D), -2.0f, 2.0f));
        cuda::DeviceBuffer dl = cuda::to_device(lg), db = cuda::to_device(bias), dm = cuda::to_device(tid2eid), dt = cuda::to_device(tok);
        struct Out {
          std::vector<int32_t> idx;
          std::vector<float> weight, select, ys;
          std::vector<uint16_t> h;
        };
        d::RouteArgs a;
        a.n = 1, a.E = c.E, a.K = c.K, a.score = c.score, a.hash = c.hash, a.n_group = c.groups, a.topk_group = c.topk_groups;
        a.renorm = c.variant != 1, a.unfloored = c.variant == 2, a.softplus_naive = c.variant == 3, a.fold = c.fold;
        a.logits = dl.as<float>(), a.tokens = dt.as<int32_t>();
        a.bias = c.hash ? nullptr : db.as<float>();
        a.tid2eid = c.hash ? dm.as<int32_t>() : nullptr;
        auto run = [&](bool ranked) {
          cuda::DeviceBuffer di(size_t(c.K) * 4), dw(size_t(c.K) * 4), ds(size_t(c.E) * 4), dh(size_t(c.K * I) * 2), dy(size_t(c.K * D) * 4);
          for (auto* b : {&di, &dw, &ds, &dh, &dy}) b->fill_byte(0xAB);
          d::RouteArgs r = a;
          r.idx = di.as<int32_t>(), r.weight = dw.as<float>(), r.select = c.hash ? nullptr : ds.as<float>();
          cuda::Workspace ws;
          {
            const d::PdlScope on(pdl);
            if (ranked) {
              EXPECT_TRUE(cuda::moe_ranks_in_experts(r, m));
              cuda::moe_gate_up_ranked(m, r, x.dev.get(), Act::F16, 7.0, dh.as<uint16_t>(), ws);
              cuda::moe_down(m, r.idx, 1, c.K, dh.as<uint16_t>(), nullptr, dy.as<float>(), ws);
            } else {
              d::fwd_route(r, nullptr);
              cuda::moe_gate_up(m, r.idx, 1, c.K, x.dev.get(), Act::F16, 7.0, nullptr, dh.as<uint16_t>(), nullptr, ws);
              cuda::moe_down(m, r.idx, 1, c.K, dh.as<uint16_t>(), nullptr, dy.as<float>(), ws);
            }
          }
          cuda::synchronize();
          variants.insert(d::route_warp_variant(r));
          return Out{cuda::to_host<int32_t>(di, size_t(c.K)), cuda::to_host<float>(dw, size_t(c.K)), cuda::to_host<float>(ds, size_t(c.E)),
                     cuda::to_host<float>(dy, size_t(c.K * D)), cuda::to_host<uint16_t>(dh, size_t(c.K * I))};
        };
        const Out want = run(false), got = run(true);
        const std::string tag = fmt::format("E {} K {} score {} hash {} groups {}/{} variant {} row {}{}", c.E, c.K, c.score, c.hash, c.groups,
                                            c.topk_groups, c.variant, row, pdl ? " (PDL)" : "");
        ASSERT_EQ(got.idx, want.idx) << tag << ": indices";
        ASSERT_EQ(0, std::memcmp(got.weight.data(), want.weight.data(), got.weight.size() * 4)) << tag << ": weights";
        if (!c.hash) {
          ASSERT_EQ(0, std::memcmp(got.select.data(), want.select.data(), got.select.size() * 4)) << tag << ": selection scores";
        }
        for (int s = 0; s < c.K * I; ++s) ASSERT_EQ(got.h[size_t(s)], want.h[size_t(s)]) << tag << ": h at slot " << s / I << ", column " << s % I;
        for (int s = 0; s < c.K * D; ++s)
          ASSERT_EQ(0, std::memcmp(&got.ys[size_t(s)], &want.ys[size_t(s)], 4)) << tag << ": ys at slot " << s / D << ", column " << s % D;
      }
    // Not taken: more than one token, another expert count than the experts'.
    d::RouteArgs bad;
    bad.n = 2, bad.E = c.E, bad.K = c.K;
    EXPECT_FALSE(cuda::moe_ranks_in_experts(bad, m));
    bad.n = 1, bad.E = c.E + 1;
    EXPECT_FALSE(cuda::moe_ranks_in_experts(bad, m));
  }
  EXPECT_EQ(variants, (std::set<int>{1, 2, 3, 4, 5})) << "not every variant of the warp code ran";
}

// The real V4-Flash expert shapes (D 4096, I 2048), 8 tokens x top-6 over 8 experts; sampled rows on the CPU.
TEST_F(CudaMoe, RealShapesSampledRows) {
  Rng rng(6);
  const int64_t E = 8, D = 4096, I = 2048;
  auto f = make_moe(rng, E, D, I, false, 116, 122);
  const cuda::MoeExperts m = cuda::upload_experts(f->w);
  const int n = 8, K = 6, S = n * K;
  const std::vector<int32_t> idx = random_distinct_routing(rng, n, K, E);
  const Acts x = make_acts(Act::BF16, rng.floats(size_t(n * D), -2.0f, 2.0f));
  cuda::DeviceBuffer di = cuda::to_device(idx), h(size_t(S * I) * 4), ys(size_t(S * D) * 4);
  h.fill_byte(0xFF), ys.fill_byte(0xFF);
  cuda::Workspace ws;
  cuda::moe_gate_up(m, di.as<int32_t>(), n, K, x.dev.get(), Act::BF16, 10.0, nullptr, nullptr, h.as<float>(), ws);
  cuda::moe_down(m, di.as<int32_t>(), n, K, nullptr, h.as<float>(), ys.as<float>(), ws);
  cuda::synchronize();
  const auto hg = cuda::to_host<float>(h, size_t(S * I));
  const auto ysg = cuda::to_host<float>(ys, size_t(S * D));
  std::vector<float> hs, hs_ref, ysv, ys_ref;
  std::vector<float> row(size_t(std::max(D, I)));
  for (int s = 0; s < S; s += 5) {
    const auto& ex = f->w.experts[size_t(idx[size_t(s)])];
    const float* xs = x.f16.data() + (s / K) * D;
    for (int64_t r = 0; r < I; r += 31) {
      hs.push_back(hg[size_t(s * I + r)]);
      hs_ref.push_back(swiglu_cpu({float(dot64(ex.w1, r, xs, row))}, {float(dot64(ex.w3, r, xs, row))}, 10.0f)[0]);
    }
    const auto h16 = rounded_f16(std::vector<float>(hg.begin() + s * I, hg.begin() + (s + 1) * I));
    for (int64_t r = 0; r < D; r += 37) {
      ysv.push_back(ysg[size_t(s * D + r)]);
      ys_ref.push_back(float(dot64(ex.w2, r, h16.data(), row)));
    }
  }
  expect_close("moe real shapes gate/up sampled vs twin", hs, hs_ref, int64_t(hs.size()), 1e-4);
  expect_close("moe real shapes down sampled vs twin", ysv, ys_ref, int64_t(ysv.size()), 1e-4);
}

TEST_F(CudaMoe, UploadRefusesNanScales) {
  Rng rng(9);
  const int64_t rows = 16, cols = 128;
  const auto codes = rng.bytes(size_t(rows * cols / 2));
  auto scales = rng.e8m0(size_t(rows * cols / 32), 118, 124);
  EXPECT_NO_THROW(cuda::upload_fp4({codes.data()}, {scales.data()}, rows, cols));
  scales[5] = 0xFF;
  EXPECT_THROW(cuda::upload_fp4({codes.data()}, {scales.data()}, rows, cols), Error);
}
