// The routed experts' grouped prefill GEMMs (moe_group's grouping, variants 0-6 of moe_prefill.cu, the folded-scale
// constants) against the CPU twin, the decode kernels and fp64 sums.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <set>

#include <fmt/format.h>

#include "cuda/fp4_layout.h"
#include "cuda/fwd_kernels.h"
#include "cuda/kernels.h"
#include "model/experts.h"
#include "cuda_test_util.h"
#include "kernel_twins.h"

using namespace plumb;
using namespace plumb_cuda_test;
using cuda::Act;

// ---- routed experts for prefill (grouped GEMMs) ----

namespace {

// Per-expert slot lists of a routing as moe_group must build them (slot order within an expert), and the tiles.
void expect_groups(const std::vector<int32_t>& idx, int n, int K, int64_t E, const cuda::DeviceBuffer& groups) {
  namespace d = cuda::detail;
  const int S = n * K;
  const d::GroupLayout L = d::group_layout(S, E);
  const auto g = cuda::to_host<int32_t>(groups, size_t(L.ints));
  std::vector<int32_t> offs{0}, list, tiles;
  for (int64_t e = 0; e < E; ++e) {
    const int o = int(list.size());
    for (int s = 0; s < S; ++s)
      if (idx[size_t(s)] == e) list.push_back(s);
    for (int p = o; p < int(list.size()); p += d::kGroupTokens) tiles.push_back(int32_t(e)), tiles.push_back(p);
    offs.push_back(int(list.size()));
  }
  ASSERT_EQ(g[0], int(tiles.size() / 2)) << "tile count";
  ASSERT_LE(int64_t(tiles.size() / 2), L.max_tiles);
  EXPECT_TRUE(std::equal(offs.begin(), offs.end(), g.begin() + L.offs)) << "expert offsets";
  EXPECT_TRUE(std::equal(list.begin(), list.end(), g.begin() + L.list)) << "slot lists";
  EXPECT_TRUE(std::equal(tiles.begin(), tiles.end(), g.begin() + L.tiles)) << "tile table";
}

// A skewed routing over experts 1..E-1 (expert 0 never chosen): slot 0 of every token is expert 2 (n tokens: whole
// and partial tiles), slot 1 is expert 3 for the first 64 tokens (exactly one tile), one slot of token n/3 is expert
// 1 (a single token), the rest uniform over experts 4..E-1 with repeats within a token (as hash routing allows).
std::vector<int32_t> skewed_routing(Rng& rng, int n, int K, int64_t E) {
  std::uniform_int_distribution<int> pick(4, int(E) - 1);
  std::vector<int32_t> idx(size_t(n) * size_t(K));
  for (int t = 0; t < n; ++t)
    for (int k = 0; k < K; ++k)
      idx[size_t(t * K + k)] = k == 0 ? 2 : (k == 1 && t < 64) ? 3 : (k == K - 1 && t == n / 3) ? 1 : pick(rng.gen());
  return idx;
}

}  // namespace

// Two fp32 vectors with the same bits (signed zeros and NaN payloads included), unlike ==.
static bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Small shapes, every output against the CPU twin (gate/up with SwiGLU, f16 h; down from that h, fp32), with and
// without the routing weight before W2, and the grouping itself exactly; every kernel variant (0-6, moe_prefill.cu),
// for three scale ranges: the usual one (118..124), one at the limit of the folded-scale variants (98..122: 24 apart,
// so codes reach 0.5 * 2^-23 = 2^-24, the least f16 subnormal, inside variants 2-4), and one past it (97..122),
// where variants 2-4 must be refused and the default must be variant 1, bit for bit. Expert 2's 150 slots make
// tiles of 64, 64 and 22 (variant 4: one block of 128 and one of 22; variants 5-6: 75 and 75). Variants 5 and 6
// (variant 4's arithmetic, pipelined per k-step; 6 with the swizzled staging) must give variant 4's bits.
TEST_F(CudaMoe, GroupedPrefillMatchesTwin) {
  for (const auto& [slo, shi] : std::vector<std::pair<int, int>>{{118, 124}, {98, 122}, {97, 122}}) {
  Rng rng(21);
  const int64_t E = 12, D = 1024, I = 512;
  auto f = make_moe(rng, E, D, I, false, slo, shi);
  const cuda::MoeExperts m = cuda::upload_experts(f->w);
  const bool foldable = shi - slo <= 24;
  ASSERT_EQ(m.w1.scale_lo, slo);
  ASSERT_EQ(m.w2.scale_hi, shi);
  const int n = 150, K = 4, S = n * K;
  const float limit = 7.0f;
  const std::vector<int32_t> idx = skewed_routing(rng, n, K, E);
  const Acts x = make_acts(Act::F32, rng.floats(size_t(n * D), -2.0f, 2.0f));
  const auto wts = rng.floats(size_t(S), 0.05f, 1.0f);
  cuda::DeviceBuffer di = cuda::to_device(idx), wd = cuda::to_device(wts), groups(cuda::moe_group_bytes(n, K, E));
  groups.fill_byte(0xFF);
  cuda::moe_group(di.as<int32_t>(), n, K, E, groups.get());
  cuda::synchronize();
  expect_groups(idx, n, K, E, groups);
  std::vector<float> h_v1, ys_v1;  // variant 1's outputs (pre = false), for the default's check
  std::vector<uint16_t> h_v4[2];   // variant 4's (pre = false, true), for variants 5-6
  std::vector<float> ys_v4[2];
  for (int variant = 0; variant < cuda::detail::kGroupedVariants; ++variant)
  for (bool pre : {false, true}) {
    cuda::DeviceBuffer h16(size_t(S * I) * 2), ys(size_t(S * D) * 4);
    h16.fill_byte(0xFF), ys.fill_byte(0xFF);
    cuda::Workspace ws;
    if (variant >= 2 && !foldable) {  // the scales are too far apart to fold: refused by name
      EXPECT_THROW(cuda::moe_gate_up_grouped(m, groups.get(), n, K, x.dev.get(), Act::F32, limit, nullptr, h16.as<uint16_t>(), ws,
                                             nullptr, variant),
                   std::runtime_error);
      EXPECT_THROW(cuda::moe_down_grouped(m, groups.get(), n, K, h16.as<uint16_t>(), ys.as<float>(), nullptr, variant),
                   std::runtime_error);
      continue;
    }
    cuda::moe_gate_up_grouped(m, groups.get(), n, K, x.dev.get(), Act::F32, limit, pre ? wd.as<float>() : nullptr,
                              h16.as<uint16_t>(), ws, nullptr, variant);
    cuda::moe_down_grouped(m, groups.get(), n, K, h16.as<uint16_t>(), ys.as<float>(), nullptr, variant);
    cuda::synchronize();
    const auto hg = f16_to_float(cuda::to_host<uint16_t>(h16, size_t(S * I)));
    const auto ysg = cuda::to_host<float>(ys, size_t(S * D));
    if (variant == 1 && !pre) h_v1 = hg, ys_v1 = ysg;
    if (variant == 4) h_v4[pre] = cuda::to_host<uint16_t>(h16, size_t(S * I)), ys_v4[pre] = ysg;
    if (variant >= 5) {
      EXPECT_TRUE(cuda::to_host<uint16_t>(h16, size_t(S * I)) == h_v4[pre]) << "variant " << variant << " h is not variant 4's bits";
      EXPECT_TRUE(same_bits(ysg, ys_v4[pre])) << "variant " << variant << " down is not variant 4's bits";
    }
    // The twin, expert by expert (all of an expert's slots in one ops::linear).
    std::vector<float> h_twin(size_t(S * I)), ys_twin(size_t(S * D));
    for (int64_t e = 0; e < E; ++e) {
      std::vector<int> sl;
      for (int s = 0; s < S; ++s)
        if (idx[size_t(s)] == e) sl.push_back(s);
      if (sl.empty()) continue;
      const int c = int(sl.size());
      std::vector<float> xs(size_t(c) * size_t(D)), hs(size_t(c) * size_t(I));
      for (int i = 0; i < c; ++i) {
        std::copy_n(x.f16.begin() + (sl[size_t(i)] / K) * D, D, xs.begin() + i * D);
        std::copy_n(hg.begin() + sl[size_t(i)] * I, I, hs.begin() + i * I);
      }
      const auto& ex = f->w.experts[size_t(e)];
      const auto h = swiglu_cpu(linear_cpu(xs, c, ex.w1), linear_cpu(xs, c, ex.w3), limit);
      const auto y = linear_cpu(hs, c, ex.w2);
      for (int i = 0; i < c; ++i) {
        const int s = sl[size_t(i)];
        for (int64_t r = 0; r < I; ++r) h_twin[size_t(s * I + r)] = h[size_t(i * I + r)] * (pre ? wts[size_t(s)] : 1.0f);
        std::copy_n(y.begin() + i * D, D, ys_twin.begin() + s * D);
      }
    }
    const std::string tag = "grouped moe (variant " + std::to_string(variant) + ", scales " + std::to_string(slo) + ".." +
                            std::to_string(shi) + ") n=150 K=4 E=12 skewed" + (pre ? " weight-before-down" : "");
    expect_close(tag + " gate/up h16 vs twin", hg, rounded_f16(h_twin), I, 2e-3);
    expect_close(tag + " down (h16 in) vs twin", ysg, ys_twin, D, 1e-4);
  }
  // The default: variant kGroupedFoldedDefault where the scales fold (checked above), else variant 1 bit for bit.
  if (!foldable) {
    cuda::DeviceBuffer h16(size_t(S * I) * 2), ys(size_t(S * D) * 4);
    cuda::Workspace ws;
    cuda::moe_gate_up_grouped(m, groups.get(), n, K, x.dev.get(), Act::F32, limit, nullptr, h16.as<uint16_t>(), ws);
    cuda::moe_down_grouped(m, groups.get(), n, K, h16.as<uint16_t>(), ys.as<float>());
    cuda::synchronize();
    EXPECT_EQ(f16_to_float(cuda::to_host<uint16_t>(h16, size_t(S * I))), h_v1) << "default must be variant 1 (scales do not fold)";
    EXPECT_EQ(cuda::to_host<float>(ys, size_t(S * D)), ys_v1) << "default must be variant 1 (scales do not fold)";
  }
  }
}

// Host-only (no GPU needed): the folded-scale constants (fold_scales) make every E2M1 code times its E8M0 scale an
// exact f16, for every scale byte of every admissible range, emulating the kernel's integer steps (fp4_frag's
// v * 2^-14 bit placement, the byte add, the f16 multiplier's exponent field); ranges wider than 24 are refused.
TEST(CudaMoeFold, FoldedWeightsAreExactF16) {
  namespace d = cuda::detail;
  const double mags[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  int checked = 0;
  for (int lo = 2; lo <= 254; ++lo)
    for (int hi = lo; hi <= std::min(254, lo + 30); ++hi) {
      uint32_t add = 0;
      float unscale = 0;
      const bool ok = d::fold_scales(lo, hi, add, unscale);
      ASSERT_EQ(ok, hi - lo <= 24) << lo << ".." << hi;
      if (!ok) continue;
      ASSERT_EQ(double(unscale), std::ldexp(1.0, hi - 128));
      for (int b : {lo, (lo + hi) / 2, hi}) {
        const int field = int((uint32_t(b) + (add & 0xFFu)) & 0xFFu);  // one byte of fold_word, before the << 2
        ASSERT_GE(field, 6);
        ASSERT_LE(field, 30);
        const double mul = std::ldexp(1.0, field - 15);  // the f16 multiplier (normal)
        for (double v : mags) {
          const double w = std::ldexp(v, -14) * mul;  // what mul.rn.f16x2 must produce
          EXPECT_EQ(double(round_f16(float(w))), w) << "code " << v << " byte " << b << " range " << lo << ".." << hi;
          EXPECT_EQ(w * double(unscale), v * std::ldexp(1.0, b - 127));  // the fold, taken back out
          ++checked;
        }
      }
    }
  EXPECT_GT(checked, 10000);
}

// The fold at its extremes, expert by expert: expert 0's scales all 2^-29 and expert 1's all 2^-5 (24 apart: the
// fold maps expert 0's codes to v * 2^-23, f16 subnormals down to 2^-24, and expert 1's to v * 2). Each expert's
// outputs are compared on their own scale (normalized by their own max), so a flushed subnormal or an overflow in
// either would show; against variant 1 (per-group fp32 scale), down on the same h. Expert 0's h is taken into the
// f16 range by the routing weight before w2 (2^40, applied in fp32 before the rounding).
TEST_F(CudaMoe, GroupedPrefillFoldExtremes) {
  Rng rng(23);
  const int64_t E = 2, D = 512, I = 256;
  auto f = make_moe(rng, E, D, I, false, 0, 0, {{98, 98}, {122, 122}});
  const cuda::MoeExperts m = cuda::upload_experts(f->w);
  const int n = 80, K = 2, S = n * K;
  std::vector<int32_t> idx(static_cast<size_t>(S));
  for (int s = 0; s < S; ++s) idx[size_t(s)] = s % 2;  // 80 slots each: a full tile and a partial one
  const Acts x = make_acts(Act::F32, rng.floats(size_t(n * D), -2.0f, 2.0f));
  std::vector<float> pw(static_cast<size_t>(S));
  for (int s = 0; s < S; ++s) pw[size_t(s)] = s % 2 ? 1.0f : std::ldexp(1.0f, 40);
  cuda::DeviceBuffer di = cuda::to_device(idx), pd = cuda::to_device(pw), groups(cuda::moe_group_bytes(n, K, E));
  cuda::moe_group(di.as<int32_t>(), n, K, E, groups.get());
  std::vector<float> h[7], y[7];
  cuda::DeviceBuffer hin(size_t(S * I) * 2);
  cuda::Workspace ws;
  cuda::moe_gate_up_grouped(m, groups.get(), n, K, x.dev.get(), Act::F32, kNoClamp, pd.as<float>(), hin.as<uint16_t>(), ws, nullptr, 1);
  for (int v : {1, 2, 3, 4, 5, 6}) {
    cuda::DeviceBuffer h16(size_t(S * I) * 2), ys(size_t(S * D) * 4);
    h16.fill_byte(0xFF), ys.fill_byte(0xFF);  // NaNs: a variant that writes nothing cannot pass on the last one's bits
    cuda::moe_gate_up_grouped(m, groups.get(), n, K, x.dev.get(), Act::F32, kNoClamp, pd.as<float>(), h16.as<uint16_t>(), ws, nullptr, v);
    cuda::moe_down_grouped(m, groups.get(), n, K, hin.as<uint16_t>(), ys.as<float>(), nullptr, v);
    cuda::synchronize();
    h[v] = f16_to_float(cuda::to_host<uint16_t>(h16, size_t(S * I)));
    y[v] = cuda::to_host<float>(ys, size_t(S * D));
  }
  for (int v : {5, 6}) {  // variant 4's bits (f16 subnormals included)
    EXPECT_TRUE(same_bits(h[v], h[4])) << "fold extremes: variant " << v << " h is not variant 4's bits";
    EXPECT_TRUE(same_bits(y[v], y[4])) << "fold extremes: variant " << v << " down is not variant 4's bits";
  }
  for (int v : {2, 3, 4, 5, 6})
    for (int e = 0; e < 2; ++e) {
      std::vector<float> hv, hr, yv, yr;
      for (int s = e; s < S; s += 2) {
        hv.insert(hv.end(), h[v].begin() + s * I, h[v].begin() + (s + 1) * I);
        hr.insert(hr.end(), h[1].begin() + s * I, h[1].begin() + (s + 1) * I);
        yv.insert(yv.end(), y[v].begin() + s * D, y[v].begin() + (s + 1) * D);
        yr.insert(yr.end(), y[1].begin() + s * D, y[1].begin() + (s + 1) * D);
      }
      const std::string tag = "fold extremes (variant " + std::to_string(v) + ", expert " + std::to_string(e) + ", scale 2^" +
                              std::to_string(e ? 122 - 127 : 98 - 127) + ")";
      expect_close(tag + " gate/up h16 vs variant 1", hv, hr, I, 2e-3);
      expect_close(tag + " down vs variant 1", yv, yr, D, 1e-5);
    }
}

// V4-Flash shapes (D 4096, I 2048), 320 tokens x top-6 over 8 experts, skewed (0, 1, 64, 320 and ~380 slots per
// expert): the grouping exactly; every output against the decode kernels on the same inputs (f16 h: one f16
// rounding apart at most; fp32 down: only the accumulation order of K differs); sampled outputs against fp64 dot
// products of the exact weights and f16 inputs.
TEST_F(CudaMoe, GroupedPrefillRealShapes) {
  Rng rng(22);
  const int64_t E = 8, D = 4096, I = 2048;
  auto f = make_moe(rng, E, D, I, false, 116, 122);
  const cuda::MoeExperts m = cuda::upload_experts(f->w);
  const int n = 320, K = 6, S = n * K;
  const std::vector<int32_t> idx = skewed_routing(rng, n, K, E);
  const Acts x = make_acts(Act::BF16, rng.floats(size_t(n * D), -2.0f, 2.0f));
  cuda::DeviceBuffer di = cuda::to_device(idx), groups(cuda::moe_group_bytes(n, K, E));
  cuda::DeviceBuffer h16(size_t(S * I) * 2), hdec(size_t(S * I) * 2), ys(size_t(S * D) * 4), ysdec(size_t(S * D) * 4);
  for (auto* b : {&groups, &h16, &hdec, &ys, &ysdec}) b->fill_byte(0xFF);
  cuda::Workspace ws;
  cuda::moe_group(di.as<int32_t>(), n, K, E, groups.get());
  cuda::moe_gate_up_grouped(m, groups.get(), n, K, x.dev.get(), Act::BF16, 10.0, nullptr, h16.as<uint16_t>(), ws);
  cuda::moe_down_grouped(m, groups.get(), n, K, h16.as<uint16_t>(), ys.as<float>());
  // The decode kernels on the same inputs (down from the grouped h, so that both see one h), 1024 slots per launch.
  const int chunk = 1024 / K;
  for (int t0 = 0; t0 < n; t0 += chunk) {
    const int nc = std::min(chunk, n - t0);
    const int32_t* ic = di.as<int32_t>() + t0 * K;
    cuda::moe_gate_up(m, ic, nc, K, x.dev.as<uint16_t>() + int64_t(t0) * D, Act::BF16, 10.0, nullptr,
                      hdec.as<uint16_t>() + int64_t(t0) * K * I, nullptr, ws);
    cuda::moe_down(m, ic, nc, K, h16.as<uint16_t>() + int64_t(t0) * K * I, nullptr, ysdec.as<float>() + int64_t(t0) * K * D, ws);
  }
  cuda::synchronize();
  expect_groups(idx, n, K, E, groups);
  const auto hg = f16_to_float(cuda::to_host<uint16_t>(h16, size_t(S * I)));
  const auto ysg = cuda::to_host<float>(ys, size_t(S * D));
  const auto hd = f16_to_float(cuda::to_host<uint16_t>(hdec, size_t(S * I)));
  const auto ysd = cuda::to_host<float>(ysdec, size_t(S * D));
  expect_close("grouped moe real shapes gate/up h16 vs decode kernel", hg, hd, I, 2e-3);
  expect_close("grouped moe real shapes down vs decode kernel", ysg, ysd, D, 1e-5);
  // Every kernel variant on the same inputs: against the decode kernels (h: one f16 rounding apart at most; down
  // from the same h: fp32 summation order only), the folded ones (2, 3) also against variant 1 (their summation
  // order differs: no per-group partial sums), and sampled outputs of each against the fp64 twin.
  std::vector<float> hv1, yv1;
  constexpr int NV = cuda::detail::kGroupedVariants;
  std::vector<std::vector<float>> hvs(NV), yvs(NV);
  for (int variant = 0; variant < NV; ++variant) {
    cuda::DeviceBuffer hv(size_t(S * I) * 2), yv(size_t(S * D) * 4);
    hv.fill_byte(0xFF), yv.fill_byte(0xFF);
    cuda::moe_gate_up_grouped(m, groups.get(), n, K, x.dev.get(), Act::BF16, 10.0, nullptr, hv.as<uint16_t>(), ws, nullptr, variant);
    cuda::moe_down_grouped(m, groups.get(), n, K, h16.as<uint16_t>(), yv.as<float>(), nullptr, variant);
    cuda::synchronize();
    hvs[size_t(variant)] = f16_to_float(cuda::to_host<uint16_t>(hv, size_t(S * I)));
    yvs[size_t(variant)] = cuda::to_host<float>(yv, size_t(S * D));
    const std::string v = "grouped moe real shapes (variant " + std::to_string(variant) + ")";
    expect_close(v + " gate/up h16 vs decode kernel", hvs[size_t(variant)], hd, I, 2e-3);
    expect_close(v + " down vs decode kernel", yvs[size_t(variant)], ysd, D, 1e-5);
    if (variant >= 2) {
      expect_close(v + " gate/up h16 vs variant 1", hvs[size_t(variant)], hvs[1], I, 2e-3);
      expect_close(v + " down vs variant 1", yvs[size_t(variant)], yvs[1], D, 1e-5);
    }
  }
  // Variants 5 and 6 (expert slots 320 and ~380: blocks of 106-107 and ~127 tokens, N = 112 and 128; 64: N = 64)
  // give variant 4's bits; the default is the folded kernel kGroupedFoldedDefault for these scales: the same bits.
  for (int v = 5; v < NV; ++v) {
    EXPECT_TRUE(same_bits(hvs[size_t(v)], hvs[4])) << "real shapes: variant " << v << " h is not variant 4's bits";
    EXPECT_TRUE(same_bits(yvs[size_t(v)], yvs[4])) << "real shapes: variant " << v << " down is not variant 4's bits";
  }
  EXPECT_EQ(hg, hvs[size_t(cuda::detail::kGroupedFoldedDefault)]) << "default gate/up is not kGroupedFoldedDefault";
  EXPECT_EQ(ysg, yvs[size_t(cuda::detail::kGroupedFoldedDefault)]) << "default down is not kGroupedFoldedDefault";
  std::vector<float> hs_ref, ys_ref;
  std::vector<std::vector<float>> hs(NV), ysv(NV);
  std::vector<float> row(size_t(std::max(D, I)));
  for (int s = 0; s < S; s += 7) {
    const auto& ex = f->w.experts[size_t(idx[size_t(s)])];
    const float* xs = x.f16.data() + (s / K) * D;
    for (int64_t r = s % 29; r < I; r += 29) {
      for (int v = 0; v < NV; ++v) hs[size_t(v)].push_back(hvs[size_t(v)][size_t(s * I + r)]);
      hs_ref.push_back(round_f16(swiglu_cpu({float(dot64(ex.w1, r, xs, row))}, {float(dot64(ex.w3, r, xs, row))}, 10.0f)[0]));
    }
    for (int64_t r = s % 37; r < D; r += 37) {  // down's input: the default's h (h16), as every variant's down read it
      for (int v = 0; v < NV; ++v) ysv[size_t(v)].push_back(yvs[size_t(v)][size_t(s * D + r)]);
      ys_ref.push_back(float(dot64(ex.w2, r, hg.data() + s * I, row)));
    }
  }
  for (int v = 0; v < NV; ++v) {
    const std::string t = "grouped moe real shapes (variant " + std::to_string(v) + ")";
    expect_close(t + " gate/up sampled vs fp64 twin", hs[size_t(v)], hs_ref, int64_t(hs_ref.size()), 2e-3);
    expect_close(t + " down sampled vs fp64 twin", ysv[size_t(v)], ys_ref, int64_t(ys_ref.size()), 1e-4);
  }
}
