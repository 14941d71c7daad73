// `plumb bench`'s prefill sections: the routed experts' grouped GEMMs and the FP8 projections through cuBLASLt at 1K
// and 8K tokens, with their crossovers against the decode kernels.
#ifdef PLUMB_WITH_CUDA
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <set>

#include "cuda/bench_harness.h"
#include "cuda/fwd_kernels.h"
#include "formats/numeric.h"

namespace plumb::cuda::kbench {

// The routed experts at prefill: the grouped GEMMs (moe_group + moe_gate_up_grouped + moe_down_grouped) at 1K and
// 8K tokens of uniform random top-6 routing, each kernel alone, and the crossover sweep against the decode kernels
// (passes of 1024 slots, each reading every active expert) over the token counts where it lies. Also checks at
// these sizes: the grouping against the routing (exact) and the grouped h against the decode kernel's (f16).
std::vector<PrefillRow> bench_prefill_moe(Bench& B, const MoeExperts& moe, int K, Workspace& ws, uint64_t& seed) {
  const int E = int(moe.E);
  const int64_t D = moe.D, I = moe.I;
  const Stream S = B.s;
  const int maxn = 8192;
  DeviceBuffer x16(size_t(maxn) * size_t(D) * 2), h16(size_t(maxn) * K * size_t(I) * 2),
      ys(size_t(maxn) * K * size_t(D) * 4), y(size_t(maxn) * size_t(D) * 4), groups(moe_group_bytes(maxn, K, E));
  d::fill(x16.get(), size_t(maxn) * size_t(D), d::kFillF16, seed++, -1.0f, 1.0f);
  std::vector<PrefillRow> rows;
  const double f_gu = 2.0 * 2.0 * double(I) * double(D), f_dn = 2.0 * double(D) * double(I);  // per slot
  auto add = [&](std::string k, int n, double flops, const Timing& t) { rows.push_back({std::move(k), n, flops, t.single, t.graph}); };
  auto grouped = [&](const int32_t* idx, int n) {
    moe_group(idx, n, K, E, groups.get(), S);
    moe_gate_up_grouped(moe, groups.get(), n, K, x16.get(), Act::F16, 10.0, nullptr, h16.as<uint16_t>(), ws, S);
    moe_down_grouped(moe, groups.get(), n, K, h16.as<uint16_t>(), ys.as<float>(), S);
  };
  // The decode kernels in passes of 1024 slots, each pass with a group table (moe_group) or each block scanning.
  auto decode_with = [&](const int32_t* idx, int n, bool table) {
    const int chunk = 1024 / K;
    for (int t0 = 0; t0 < n; t0 += chunk) {
      const int nc = std::min(chunk, n - t0);
      const void* g = nullptr;
      if (table) moe_group(idx + t0 * K, nc, K, E, groups.get(), S), g = groups.get();
      moe_gate_up(moe, idx + t0 * K, nc, K, x16.as<uint16_t>() + int64_t(t0) * D, Act::F16, 10.0, nullptr,
                  h16.as<uint16_t>() + int64_t(t0) * K * I, nullptr, ws, S, g);
      moe_down(moe, idx + t0 * K, nc, K, h16.as<uint16_t>() + int64_t(t0) * K * I, nullptr, ys.as<float>() + int64_t(t0) * K * D, ws,
               S, g);
    }
  };
  auto decode = [&](const int32_t* idx, int n) { decode_with(idx, n, false); };
  for (int n : {1024, 8192}) {
    const Routings R = make_routings(1, n, K, E, 4321u + unsigned(n));
    DeviceBuffer idx = to_device(R.idx);
    const int32_t* ip = idx.as<int32_t>();
    const double sl = double(n) * K;
    add("moe prefill: group (routing -> tiles)", n, 0, B.time([&](int) { moe_group(ip, n, K, E, groups.get(), S); }));
    add("moe prefill: gate+up grouped (w1,w3 FP4)", n, sl * f_gu, B.time([&](int) {
          moe_gate_up_grouped(moe, groups.get(), n, K, x16.get(), Act::F16, 10.0, nullptr, h16.as<uint16_t>(), ws, S);
        }));
    add("moe prefill: down grouped (w2 FP4)", n, sl * f_dn,
        B.time([&](int) { moe_down_grouped(moe, groups.get(), n, K, h16.as<uint16_t>(), ys.as<float>(), S); }));
    // The kernel variants (moe_prefill.cu; the default is kGroupedFoldedDefault when the scales fold, as here).
    static const char* const vname[d::kGroupedVariants] = {
        "0 registers", "1 staged", "2 folded mma.sync", "3 folded wgmma", "4 folded wgmma, 128 tokens",
        "5 folded wgmma, k-step groups", "6 folded wgmma, k-step groups, swizzled"};
    for (int v = 0; v < d::kGroupedVariants; ++v) {
      add(fmt::format("  gate+up, variant {}", vname[v]), n, sl * f_gu, B.time([&](int) {
            moe_gate_up_grouped(moe, groups.get(), n, K, x16.get(), Act::F16, 10.0, nullptr, h16.as<uint16_t>(), ws, S, v);
          }));
      add(fmt::format("  down, variant {}", vname[v]), n, sl * f_dn,
          B.time([&](int) { moe_down_grouped(moe, groups.get(), n, K, h16.as<uint16_t>(), ys.as<float>(), S, v); }));
    }
    add("moe prefill: routed total (+ combine)", n, sl * (f_gu + f_dn), B.time([&](int) {
          grouped(ip, n);
          moe_combine(ys.as<float>(), nullptr, n, K, D, 1.0f, nullptr, y.as<float>(), S);
        }));
    // Checks: the grouping, exactly; at 1K the grouped h against the decode kernel's.
    grouped(ip, n);
    d::dsync();
    const d::GroupLayout L = d::group_layout(int64_t(n) * K, E);
    const auto g = to_host<int32_t>(groups, size_t(L.ints));
    bool ok = true;
    int pos = 0, tile = 0;
    for (int e = 0; e < E && ok; ++e) {
      ok = g[size_t(L.offs + e)] == pos;
      const int first = pos;
      for (int s = 0; s < n * K && ok; ++s)
        if (R.idx[size_t(s)] == e) ok = g[size_t(L.list + pos++)] == s;
      for (int p = first; p < pos && ok; p += d::kGroupTokens, ++tile)
        ok = g[size_t(L.tiles + 2 * tile)] == e && g[size_t(L.tiles + 2 * tile + 1)] == p;
    }
    ok = ok && g[0] == tile;
    fmt::print("check moe group n={}: {} ({} tiles of <= {} slots)\n", n, ok ? "exact" : "MISMATCH", g[0], d::kGroupTokens);
    B.checks.push_back({{"kernel", "moe group"}, {"batch", n}, {"exact", ok}});
    // h16 as it is now against h16 after `other` ran (max |diff|, max |ref| of the other's), h16 restored after.
    auto h16_against = [&](auto&& other) {
      DeviceBuffer hsave(size_t(n) * K * size_t(I) * 2);
      d::copy_d2d(hsave.get(), h16.get(), hsave.bytes(), S);
      other();
      d::dsync();
      const auto a = to_host<uint16_t>(hsave, size_t(n) * K * size_t(I)), b = to_host<uint16_t>(h16, size_t(n) * K * size_t(I));
      double max_err = 0, max_ref = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        const double va = fmt8::f16_to_f32(a[i]), vb = fmt8::f16_to_f32(b[i]);
        max_ref = std::max(max_ref, std::fabs(vb));
        max_err = std::isfinite(va) ? std::max(max_err, std::fabs(va - vb)) : INFINITY;
      }
      d::copy_d2d(h16.get(), hsave.get(), hsave.bytes(), S);
      return std::pair{max_err, max_ref};
    };
    {  // the default (folded-scale) gate+up against variant 1 (the decode numerics) on all of this routing
      const auto [max_err, max_ref] = h16_against([&] {
        moe_gate_up_grouped(moe, groups.get(), n, K, x16.get(), Act::F16, 10.0, nullptr, h16.as<uint16_t>(), ws, S, 1);
      });
      fmt::print("check moe gate+up grouped default vs variant 1 n={}: max |diff| = {:.3e} (max |ref| {:.3e}, normalized {:.2e})\n",
                 n, max_err, max_ref, max_err / std::max(max_ref, 1e-30));
      B.checks.push_back({{"kernel", "moe gate+up grouped default vs variant 1"}, {"batch", n}, {"max_abs_err", max_err},
                          {"max_ref", max_ref}, {"normalized", max_err / std::max(max_ref, 1e-30)}});
    }
    if (n == 1024) {
      const auto [max_err, max_ref] = h16_against([&] { decode(ip, n); });
      const double rel = max_err / std::max(max_ref, 1e-30);
      fmt::print("check moe gate+up grouped vs decode kernel n={}: max |diff| = {:.3e} (max |ref| {:.3e}, normalized {:.2e})\n", n,
                 max_err, max_ref, rel);
      B.checks.push_back({{"kernel", "moe gate+up grouped vs decode"}, {"batch", n}, {"max_abs_err", max_err}, {"max_ref", max_ref},
                          {"normalized", rel}});
    }
  }
  // Crossover: gate+up and down for n tokens, decode kernels vs group + grouped kernels.
  for (int n : {16, 32, 64, 128, 256, 512}) {
    const Routings R = make_routings(1, n, K, E, 777u + unsigned(n));
    DeviceBuffer idx = to_device(R.idx);
    const double fl = double(n) * K * (f_gu + f_dn);
    add("crossover: decode kernels (passes of 1024 slots)", n, fl, B.time([&](int) { decode(idx.as<int32_t>(), n); }));
    add("crossover: decode kernels with a group table", n, fl, B.time([&](int) { decode_with(idx.as<int32_t>(), n, true); }));
    add("crossover: grouped (group + gate+up + down)", n, fl, B.time([&](int) { grouped(idx.as<int32_t>(), n); }));
  }
  return rows;
}

// The FP8 projections at prefill (cuda.prefill_gemm): each V4-Flash projection at 1K and 8K tokens through
// fp8_linear_gemm / fp8_linear_grouped_gemm / fp8_expert_ffn_gemm (dequantization, activation conversion and the
// cuBLASLt GEMM: the whole op as the forward runs it), the cuBLASLt GEMM alone on the pre-dequantized weight, and the
// decode GEMV path (passes of up to 32 tokens, f16 input) at 1K; then the crossover sweep GEMV vs GEMM at small token
// counts. Also checks at 1K: the GEMM's output against the GEMV's (bf16 vs f16 activations).
std::vector<PrefillRow> bench_prefill_fp8(Bench& B, Workspace& ws, uint64_t& seed) {
  const Stream S = B.s;
  struct Proj {
    const char* name;
    int64_t rows, cols;
    int groups;  // > 1: grouped (wo_a); 0: the shared expert (rows = I, cols = D)
  };
  const Proj projs[] = {{"wq_a", 1024, 4096, 1},          {"wkv", 512, 4096, 1},        {"wq_b", 32768, 1024, 1},
                        {"wo_a (8 groups)", 8192, 4096, 8}, {"wo_b", 4096, 8192, 1},      {"indexer wq_b", 8192, 1024, 1},
                        {"shared expert (w1,w3,w2)", 2048, 4096, 0}};
  const int maxn = 8192;
  const int64_t max_in = 8 * 4096, max_out = 32768;  // wo_a's input, wq_b's output
  DeviceBuffer x32(size_t(maxn) * size_t(max_in) * 4), x16(size_t(maxn) * size_t(max_in) * 2), y(size_t(maxn) * size_t(max_out) * 4),
      yv(size_t(1024) * size_t(max_out) * 4);
  d::fill(x32.get(), x32.bytes() / 4, d::kFillF32, seed++, -1.0f, 1.0f, S);
  d::fill(x16.get(), x16.bytes() / 2, d::kFillF16, seed++, -1.0f, 1.0f, S);
  DeviceBuffer bw(size_t(32768) * 1024 * 2), bx(size_t(maxn) * size_t(max_in) * 2), bgu(size_t(maxn) * 4096 * 4), bh(size_t(maxn) * 2048 * 2);
  Fp8GemmBuffers b;
  b.w = bw.as<uint16_t>(), b.x = bx.as<uint16_t>(), b.gu = bgu.as<float>(), b.h = bh.as<uint16_t>();
  b.w_elems = bw.bytes() / 2, b.x_elems = bx.bytes() / 2, b.gu_elems = bgu.bytes() / 4, b.h_elems = bh.bytes() / 2;
  DeviceBuffer hgemv(size_t(1024) * 2048 * 2);
  std::vector<PrefillRow> rows;
  auto add = [&](std::string k, int n, double flops, const Timing& t) { rows.push_back({std::move(k), n, flops, t.single, t.graph}); };
  auto fill8 = [&](Fp8Matrix& m) {
    d::fill(m.codes.get(), m.codes.bytes(), d::kFillE4M3, seed++, 0, 0, S);
    d::fill(m.scales.get(), m.scales.bytes(), d::kFillE8M0, seed++, 112, 118, S);
  };
  for (const auto& p : projs) {
    const bool shared = p.groups == 0;
    Fp8Matrix w = alloc_fp8(p.rows, p.cols);
    Fp8Expert se;
    if (shared) {
      se.w1 = alloc_fp8(p.rows, p.cols), se.w3 = alloc_fp8(p.rows, p.cols), se.w2 = alloc_fp8(p.cols, p.rows);
      for (Fp8Matrix* m : {&se.w1, &se.w3, &se.w2}) fill8(*m);
    } else {
      fill8(w);
    }
    const int64_t in_w = p.groups > 1 ? p.cols * p.groups : p.cols;
    const double fpt = shared ? 2.0 * 3.0 * double(p.rows * p.cols) : 2.0 * double(p.rows * p.cols);  // flops per token
    auto gemm = [&](int n) {
      if (shared) fp8_expert_ffn_gemm(se, x32.get(), Act::F32, n, 10.0, y.as<float>(), b, S);
      else if (p.groups > 1) fp8_linear_grouped_gemm(w, p.groups, x32.get(), Act::F32, n, y.as<float>(), b, S);
      else fp8_linear_gemm(w, x32.get(), Act::F32, p.cols, n, y.as<float>(), p.rows, b, S);
    };
    auto gemv = [&](int n, float* out) {
      if (shared) fp8_expert_ffn(se, x16.get(), Act::F16, n, 10.0, hgemv.as<uint16_t>(), out, ws, S);
      else if (p.groups > 1) fp8_linear_grouped(w, p.groups, x16.get(), Act::F16, n, out, ws, S);
      else fp8_linear(w, x16.get(), Act::F16, p.cols, n, out, p.rows, ws, S);
    };
    const std::string name = fmt::format("FP8 {} [{}, {}]", p.name, shared ? 3 * p.rows : p.rows, p.cols);
    for (int n : {1024, 8192}) {
      add(name + ": GEMM (dequant + bf16 x + cuBLASLt)", n, fpt * n, B.time([&](int) { gemm(n); }));
      if (!shared) {  // the cuBLASLt call alone, on the weight dequantized once
        gemm(n);
        GemmDesc g;
        g.m = n, g.n = int(p.rows / std::max(p.groups, 1)), g.k = int(p.cols);
        if (p.groups > 1)
          g.lda = in_w, g.ldb = p.cols, g.ldd = p.rows, g.batch = p.groups, g.a_stride = p.cols, g.b_stride = g.n * p.cols, g.d_stride = g.n;
        add("  cuBLASLt GEMM alone", n, fpt * n, B.time([&](int) { gemm_bf16(g, b.x, b.w, y.get(), S); }));
      }
      if (n == 1024) {
        add(name + ": GEMV (passes of 32 or 64 tokens)", n, fpt * n, B.time([&](int) { gemv(n, yv.as<float>()); }));
        // Check: GEMM vs GEMV outputs (bf16 vs f16 activations) on the same f16 input values.
        const int64_t out_w = shared ? p.cols : p.rows;
        if (shared) fp8_expert_ffn_gemm(se, x16.get(), Act::F16, n, 10.0, y.as<float>(), b, S);
        else if (p.groups > 1) fp8_linear_grouped_gemm(w, p.groups, x16.get(), Act::F16, n, y.as<float>(), b, S);
        else fp8_linear_gemm(w, x16.get(), Act::F16, p.cols, n, y.as<float>(), p.rows, b, S);
        gemv(n, yv.as<float>());
        d::dsync();
        const auto a = to_host<float>(y, size_t(n) * size_t(out_w)), r = to_host<float>(yv, size_t(n) * size_t(out_w));
        double max_err = 0, max_ref = 0;
        size_t at = 0;
        for (size_t i = 0; i < a.size(); ++i) {
          max_ref = std::max(max_ref, double(std::fabs(r[i])));
          const double e = std::isfinite(a[i]) ? std::fabs(double(a[i]) - r[i]) : INFINITY;
          if (e > max_err) max_err = e, at = i;
        }
        const double rel = max_err / std::max(max_ref, 1e-30);
        fmt::print("check {} GEMM vs GEMV n={}: max |diff| = {:.3e} at [{}, {}] (max |GEMV| {:.3e}, normalized {:.2e})\n", name, n, max_err,
                   at / size_t(out_w), at % size_t(out_w), max_ref, rel);
        B.checks.push_back({{"kernel", name + " GEMM vs GEMV"}, {"batch", n}, {"max_abs_err", max_err}, {"max_ref", max_ref}, {"normalized", rel}});
      }
    }
    if (shared || p.rows == 1024) continue;  // crossover on wkv, wq_b, wo_a, wo_b, the indexer's wq_b
    for (int n : {8, 16, 24, 32, 48, 64, 96, 128}) {
      add(fmt::format("  crossover {}: GEMV", p.name), n, fpt * n, B.time([&](int) { gemv(n, yv.as<float>()); }));
      add(fmt::format("  crossover {}: GEMM", p.name), n, fpt * n, B.time([&](int) { gemm(n); }));
    }
  }
  return rows;
}
}  // namespace plumb::cuda::kbench
#endif  // PLUMB_WITH_CUDA
