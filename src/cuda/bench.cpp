// `plumb bench`: the decode kernels at DeepSeek-V4-Flash dimensions on synthetic weights in the official formats
// (random packed FP4 experts with E8M0 scales, random FP8 codes with E8M0 128x128 block scales, bf16 router),
// built on the device inside the process. It measures the device's copy bandwidth in the same run and reports each
// kernel's median time (CUDA events, warm-up, an L2 flush before every timed run: decode reads its weights cold),
// the bytes it must read (for the MoE kernels: the active experts only), the achieved GB/s and % of the measured
// bandwidth. A spot check compares sampled outputs at the real sizes against a CPU computation.
#ifdef PLUMB_WITH_CUDA
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "core/strings.h"
#include "cuda/api.h"
#include "cuda/blas.h"
#include "cuda/fwd_kernels.h"
#include "cuda/kernels.h"
#include "formats/numeric.h"

namespace plumb::cuda {

namespace {

namespace d = detail;

struct Events {
  void *a = d::event_create(), *b = d::event_create();
  ~Events() { d::event_destroy(a), d::event_destroy(b); }
};

struct Row {
  std::string kernel, shape, note;
  int batch = 0, experts = 0;
  double bytes = 0, us = 0, us_min = 0, us_graph = 0;
};

struct Timing {
  double single = 0, single_min = 0, graph = 0;
};

struct Bench {
  BenchOptions o;
  DeviceInfo dev;
  double copy_gbps = 0, read_gbps = 0;
  GemmRate gemm;  // the measured bf16 tensor-core rate (cuBLASLt)
  DeviceBuffer flush, sink;
  std::vector<Row> rows, tuning;
  nlohmann::json checks = nlohmann::json::array();

  // --only: a section runs when the list is empty or names it.
  bool want(std::string_view section) const {
    if (o.only.empty()) return true;
    for (const auto& s : split_list(o.only, ','))
      if (s == section) return true;
    return false;
  }

  // single: median (and min) of `iters` runs of f(i), each alone after an L2 flush (launch latency included).
  // graph: kGraph calls captured in one CUDA graph (as a decode step will run), replayed after an L2 flush; the
  // time per call, median of 5 replays. f(i) rotates its inputs with i (routings, weight copies), so that the
  // graph's calls read cold weights.
  static constexpr int kGraph = 16;
  Stream s = nullptr;
  template <class F>
  Timing time(F&& f) {
    Events ev;
    int k = 0;
    for (int i = 0; i < o.warmup; ++i) f(k++);
    std::vector<double> ms;
    for (int i = 0; i < o.iters; ++i) {
      if (o.flush_l2) d::read_stream(flush.get(), flush.bytes(), sink.as<unsigned>(), s);
      d::event_record(ev.a, s);
      f(k++);
      d::event_record(ev.b, s);
      ms.push_back(d::event_elapsed_ms(ev.a, ev.b));
    }
    std::sort(ms.begin(), ms.end());
    Timing t{ms[ms.size() / 2] * 1e3, ms.front() * 1e3, 0};
    d::capture_begin(s);
    for (int i = 0; i < kGraph; ++i) f(k++);
    void* g = d::capture_end_instantiate(s);
    d::graph_launch(g, s);  // upload
    std::vector<double> gt;
    for (int r = 0; r < 5; ++r) {
      if (o.flush_l2) d::read_stream(flush.get(), flush.bytes(), sink.as<unsigned>(), s);
      d::event_record(ev.a, s);
      d::graph_launch(g, s);
      d::event_record(ev.b, s);
      gt.push_back(d::event_elapsed_ms(ev.a, ev.b) * 1e3 / kGraph);
    }
    d::graph_destroy(g);
    std::sort(gt.begin(), gt.end());
    t.graph = gt[gt.size() / 2];
    return t;
  }

  void add(std::vector<Row>& dst, Row r, const Timing& t) {
    r.us = t.single, r.us_min = t.single_min, r.us_graph = t.graph;
    dst.push_back(std::move(r));
  }
};

std::string mb(double b) { return fmt::format("{:.2f}", b / 1e6); }

// Random routings: for each of `count` runs, `n` tokens each choose K distinct experts of E.
struct Routings {
  std::vector<int32_t> idx;  // [count][n*K]
  std::vector<float> w;
  std::vector<int> distinct;
  int n = 0, K = 0, count = 0;
};
Routings make_routings(int count, int n, int K, int E, uint32_t seed) {
  Routings r;
  r.n = n, r.K = K, r.count = count;
  std::mt19937 g(seed);
  std::vector<int> perm(static_cast<size_t>(E));
  for (int c = 0; c < count; ++c) {
    std::set<int> used;
    for (int t = 0; t < n; ++t) {
      std::iota(perm.begin(), perm.end(), 0);
      for (int k = 0; k < K; ++k) {
        std::swap(perm[size_t(k)], perm[size_t(k) + g() % size_t(E - k)]);
        r.idx.push_back(perm[size_t(k)]);
        used.insert(perm[size_t(k)]);
        r.w.push_back(1.5f / float(K));
      }
    }
    r.distinct.push_back(int(used.size()));
  }
  return r;
}

// CPU value of one FP4 output row for one token (from the device copy of the weights), fp16-rounded input.
double fp4_row_dot(const uint8_t* canon_row, const uint8_t* scales, const std::vector<float>& x16, int64_t K) {
  double acc = 0;
  for (int64_t k = 0; k < K; ++k) {
    const uint8_t code = (canon_row[size_t(k >> 1)] >> (4 * (k & 1))) & 0xF;
    acc += double(fmt8::e2m1_to_f32(code)) * fmt8::e8m0_to_f32(scales[k / 32]) * x16[size_t(k)];
  }
  return acc;
}

float round_f16(float v) {  // RNE to fp16 via the exact decoder and a search-free conversion
  if (!std::isfinite(v)) return v;
  const float a = std::fabs(v);
  if (a >= 65520.0f) return std::copysign(INFINITY, v);
  int e;
  std::frexp(a, &e);                      // a = m * 2^e, m in [0.5, 1)
  const int q = std::max(e - 11, -24);    // quantum: 11 significant bits, subnormals below 2^-14
  return std::copysign(std::ldexp(std::nearbyint(std::ldexp(a, -q)), q), v);
}

// A prefill MoE line: compute-bound, so its rate is reported against the measured bf16 tensor-core rate.
struct PrefillRow {
  std::string kernel;
  int tokens = 0;
  double flops = 0, us = 0, us_graph = 0;
};

// What a layer's chain of dependent steps costs beyond its bytes (the persistent layer kernel's question, docs/cuda.md):
// four buffers of wq_b's size (33.5 MB) streamed one after another, as four launches or one persistent launch with
// grid barriers, without and with a 10 us latency-bound step before each of the last three (about an indexer's or an
// attention's step at batch 1), the persistent launch also staging the next buffer during those steps (into L2, all
// of it or half; or 200 KB per block into shared memory), the launches also under PDL (each read staging 200 KB per
// block into shared memory before its wait, or nothing); and one read of all the bytes. Two copies of the buffers
// alternate so that the graph's calls read cold bytes.
void bench_phases(Bench& B) {
  constexpr int P = 4;
  constexpr size_t kBytes = size_t(32768) * 1024;
  constexpr unsigned kGapNs = 10000;
  DeviceBuffer bufs(2 * P * kBytes), bar(64);
  d::fill(bufs.get(), bufs.bytes(), d::kFillBytes, 77, 0, 0);
  bar.fill_byte(0);
  auto at = [&](int i, int p) { return bufs.as<uint8_t>() + (size_t(i % 2) * P + size_t(p)) * kBytes; };
  const double total = double(P) * double(kBytes);
  const std::string name = fmt::format("phases: {} x {:.1f} MB", P, double(kBytes) / 1e6);
  for (const unsigned gap : {0u, kGapNs}) {
    const std::string note = gap ? fmt::format("{} steps of {} us included", P - 1, gap / 1000) : "";
    Timing t = B.time([&](int i) {
      for (int p = 0; p < P; ++p) {
        if (p > 0 && gap) d::spin(gap, B.s);
        d::read_stream(at(i, p), kBytes, B.sink.as<unsigned>(), B.s);
      }
    });
    B.add(B.rows, {name, "a launch per step", note, 1, 0, total}, t);
    // The same launches under PDL: each read launched while the step before it runs, its blocks first copying
    // 200 KB each (26 MB) of their share into shared memory, or nothing, before they wait.
    for (const size_t stage : {size_t(0), size_t(200) * 1024}) {
      t = B.time([&](int i) {
        for (int p = 0; p < P; ++p) {
          if (p > 0 && gap) d::spin_pdl(gap, B.s);
          d::staged_read(at(i, p), kBytes, stage, B.sink.as<unsigned>(), B.s);
        }
      });
      B.add(B.rows, {name, stage ? "a launch per step, PDL, 26 MB to smem before the wait" : "a launch per step, PDL", note, 1, 0, total}, t);
    }
    for (const int pf : {0, 1, 2, 3}) {
      if (pf && !gap) continue;
      d::PhaseArgs a;
      a.phases = P, a.gap_ns = gap, a.prefetch = pf, a.bar = bar.as<unsigned>(), a.sink = B.sink.as<unsigned>();
      try {
        t = B.time([&](int i) {
          d::PhaseArgs b = a;
          for (int p = 0; p < P; ++p) b.buf[p] = at(i, p), b.bytes[p] = kBytes;
          d::phase_stream(b, B.s);
        });
      } catch (const std::exception& ex) {
        fmt::print("skipped the persistent phase launch: {}\n", ex.what());
        d::dsync();
        continue;
      }
      static const char* const kVariant[4] = {"one launch, grid barriers", "one launch, next buffer to L2 in the steps",
                                              "one launch, half of it to L2 in the steps", "one launch, 26 MB of it to smem in the steps"};
      B.add(B.rows, {name, kVariant[pf], note, 1, 0, total}, t);
    }
  }
  const Timing t = B.time([&](int i) { d::read_stream(at(i, 0), P * kBytes, B.sink.as<unsigned>(), B.s); });
  B.add(B.rows, {name, "one read of all the bytes", "", 1, 0, total}, t);
}

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

}  // namespace

int run_bench(const BenchOptions& opt) {
  std::string why;
  if (!available(&why)) {
    std::fprintf(stderr, "plumb bench: no usable GPU: %s\n", why.c_str());
    return 3;
  }
  Bench B;
  B.o = opt;
  B.dev = device_info();
  B.s = d::stream_create();
  struct StreamGuard {
    Stream s;
    ~StreamGuard() { d::stream_destroy(s); }
  } guard{B.s};
  const Stream S = B.s;
  fmt::print("device: {} (sm_{}{}, {} SMs, L2 {} MB, {:.1f} GB), driver {}, runtime {}\n", B.dev.name, B.dev.cc_major,
             B.dev.cc_minor, B.dev.sm_count, B.dev.l2_bytes >> 20, double(B.dev.mem_bytes) / 1e9, B.dev.driver, B.dev.runtime);

  // ---- measured bandwidth (1 GiB, far beyond L2) ----
  {
    const size_t bytes = size_t(1) << 30;
    DeviceBuffer src(bytes), dst(bytes);
    B.sink = DeviceBuffer(64);
    d::fill(src.get(), bytes, d::kFillBytes, 1, 0, 0);
    d::dsync();
    Events ev;
    std::vector<double> c, r;
    for (int i = 0; i < 3 + 15; ++i) {
      d::event_record(ev.a, S);
      d::copy_d2d(dst.get(), src.get(), bytes, S);
      d::event_record(ev.b, S);
      if (i >= 3) c.push_back(d::event_elapsed_ms(ev.a, ev.b));
      d::event_record(ev.a, S);
      d::read_stream(src.get(), bytes, B.sink.as<unsigned>(), S);
      d::event_record(ev.b, S);
      if (i >= 3) r.push_back(d::event_elapsed_ms(ev.a, ev.b));
    }
    std::sort(c.begin(), c.end()), std::sort(r.begin(), r.end());
    B.copy_gbps = 2.0 * double(bytes) / (c[c.size() / 2] * 1e-3) / 1e9;
    B.read_gbps = double(bytes) / (r[r.size() / 2] * 1e-3) / 1e9;
    fmt::print("measured bandwidth: D2D copy {:.0f} GB/s (read + write, 1 GiB, median of 15), read-only stream {:.0f} GB/s\n",
               B.copy_gbps, B.read_gbps);
  }
  // ---- measured bf16 tensor-core rate (cuBLASLt, 8192^3, random data) ----
  if (!B.o.profile) B.gemm = measure_bf16_gemm(8192, 8192, 8192, 3, 15, S);
  const std::string gemm_line =
      B.gemm.measured ? fmt::format("bf16 GEMM rate: {:.0f} TFLOP/s (cuBLASLt {}x{}x{}, bf16 in/out, fp32 accumulate, median of {})",
                                    B.gemm.tflops, B.gemm.m, B.gemm.n, B.gemm.k, B.gemm.iters)
                      : fmt::format("bf16 GEMM rate: not measured ({})", B.o.profile ? "--profile" : B.gemm.why.c_str());
  fmt::print("{}\n", gemm_line);
  B.flush = DeviceBuffer(std::max<size_t>(size_t(256) << 20, 4 * B.dev.l2_bytes));
  d::fill(B.flush.get(), B.flush.bytes(), d::kFillBytes, 2, 0, 0);
  // Copies of a small matrix so that the graph's calls stream cold weights: >= 3x L2 in all.
  auto copies_for = [&](double bytes) { return std::max(1, int(std::ceil(3.0 * double(B.dev.l2_bytes) / bytes))); };
  if (B.want("phases")) bench_phases(B);

  // ---- synthetic V4-Flash weights ----
  const int E = 256, K = 6;
  const int64_t D = 4096, I = 2048;
  const double rsf = 1.5;
  MoeExperts moe;
  moe.E = E, moe.D = D, moe.I = I;
  moe.w1 = alloc_fp4(E, I, D), moe.w3 = alloc_fp4(E, I, D), moe.w2 = alloc_fp4(E, D, I);
  uint64_t seed = 10;
  for (Fp4Matrices* m : {&moe.w1, &moe.w3, &moe.w2}) {
    d::fill(m->codes.get(), m->codes.bytes(), d::kFillBytes, seed++, 0, 0);
    d::fill(m->scales.get(), m->scales.bytes(), d::kFillE8M0, seed++, 116, 122);
    m->scale_lo = 116, m->scale_hi = 122;  // filled on the device: the range the folded-scale prefill kernels check
  }
  const int ngate = copies_for(double(E * D * 2));
  std::vector<RouterWeights> rws(static_cast<size_t>(ngate));
  for (auto& rw : rws) {
    rw.E = E, rw.D = D;
    rw.gate = DeviceBuffer(size_t(E * D) * 2), rw.bias = DeviceBuffer(size_t(E) * 4);
    d::fill(rw.gate.get(), size_t(E * D), d::kFillBF16, seed++, -0.05f, 0.05f);
    d::fill(rw.bias.get(), size_t(E), d::kFillF32, seed++, -0.01f, 0.01f);
  }
  const int maxn = 8, moe_maxn = 32;  // the routed experts' rows go to 32 tokens
  const size_t xe = size_t(128) * 32768;  // x up to [128, 32768] (the FP8 rows of `fp8xs` at 128 tokens: wo_a's input)
  DeviceBuffer x32(xe * 4), x16(xe * 2), xb16(xe * 2);
  d::fill(x32.get(), xe, d::kFillF32, seed++, -1.0f, 1.0f);
  d::fill(x16.get(), xe, d::kFillF16, seed++, -1.0f, 1.0f);
  d::fill(xb16.get(), xe, d::kFillBF16, seed++, -1.0f, 1.0f);
  Workspace ws;
  MoeScratch scratch;
  scratch.reserve(moe_maxn, K, D, I);
  DeviceBuffer y(size_t(128) * 32768 * 4);  // outputs up to [128, 32768] (the FP8 rows of `fp8xs` at 128 tokens: wq_b)
  DeviceBuffer ridx(size_t(maxn) * K * 4), rwt(size_t(maxn) * K * 4), rlog(size_t(maxn) * E * 4), rsel(size_t(maxn) * E * 4);
  RouterConfig rc;
  rc.E = E, rc.K = K, rc.D = D, rc.routed_scaling = rsf;
  d::dsync();

  if (B.o.profile) {  // one launch of each main kernel, for a profiler
    const Routings R1 = make_routings(1, 1, K, E, 99u), R8 = make_routings(1, 8, K, E, 98u);
    DeviceBuffer i1 = to_device(R1.idx), i8 = to_device(R8.idx);
    for (auto* R : {&i1, &i8}) {
      const int n = R == &i1 ? 1 : 8;
      moe_gate_up(moe, R->as<int32_t>(), n, K, x16.get(), Act::F16, 10.0, nullptr, scratch.h.as<uint16_t>(), nullptr, ws, S);
      moe_down(moe, R->as<int32_t>(), n, K, scratch.h.as<uint16_t>(), nullptr, scratch.ys.as<float>(), ws, S);
    }
    Fp8Matrix w = alloc_fp8(4096, 8192);
    d::fill(w.codes.get(), w.codes.bytes(), d::kFillE4M3, 5, 0, 0);
    d::fill(w.scales.get(), w.scales.bytes(), d::kFillE8M0, 6, 112, 118);
    fp8_linear(w, x16.get(), Act::F16, 8192, 8, y.as<float>(), 4096, ws, S);
    DeviceRouting<Rsf::Folded> r{ridx.as<int32_t>(), rwt.as<float>(), rlog.as<float>(), rsel.as<float>(), 8, K};
    route(rws[0], rc, x32.get(), Act::F32, 8, nullptr, r, ws, S, scratch.x16.as<uint16_t>());
    d::dsync();
    fmt::print("profile launches done: moe gate+up n=1, down n=1, gate+up n=8, down n=8, fp8 [4096, 8192] n=8, router n=8\n");
    return 0;
  }

  const double fp4_w13 = 2.0 * double(I * D / 2 + I * D / 32), fp4_w2 = double(D * I / 2 + D * I / 32);
  const int runs = B.o.warmup + B.o.iters + Bench::kGraph;

  // ---- router ----
  for (int n : {1, 8}) {
    if (!B.want("router")) break;
    DeviceRouting<Rsf::Folded> r{ridx.as<int32_t>(), rwt.as<float>(), rlog.as<float>(), rsel.as<float>(), n, K};
    const Timing t = B.time([&](int i) {
      route(rws[size_t(i % ngate)], rc, xb16.get(), Act::BF16, n, nullptr, r, ws, S, scratch.x16.as<uint16_t>());
    });
    const double bytes = double(E * D * 2 + E * 4 + n * D * 2 + n * D * 2 + n * E * 8 + n * K * 8);
    B.add(B.rows, {"router (sqrtsoftplus, top-6, fold 1.5)", "gate [256, 4096] bf16, x bf16", "also writes x f16", n, 0, bytes}, t);
  }

  // ---- routed experts (MXFP4) ----
  // (32 tokens: 192 slots, the streaming kernel's range, where the default still picks the per-tile gate/up)
  for (int n : {1, 8, 32}) {
    if (!B.want("moe")) break;
    const Routings R = make_routings(runs, n, K, E, 1234u + unsigned(n));
    DeviceBuffer idx_all = to_device(R.idx), w_all = to_device(R.w);
    auto idx_at = [&](int i) { return idx_all.as<int32_t>() + size_t(i % runs) * size_t(n * K); };
    auto w_at = [&](int i) { return w_all.as<float>() + size_t(i % runs) * size_t(n * K); };
    double uavg = 0;
    for (int u : R.distinct) uavg += u;
    uavg /= double(R.distinct.size());
    const int ue = int(std::lround(uavg));
    const double xin = double(n) * double(D) * 2, hbytes = double(n * K) * double(I) * 2, ysb = double(n * K) * double(D) * 4;
    const std::string note = fmt::format("{:.1f} active experts (mean)", uavg);
    auto h16 = scratch.h.as<uint16_t>();
    auto ys = scratch.ys.as<float>();
    Timing t = B.time([&](int i) { moe_gate_up(moe, idx_at(i), n, K, x16.get(), Act::F16, 10.0, nullptr, h16, nullptr, ws, S); });
    B.add(B.rows, {"moe gate+up (w1,w3 FP4) + SwiGLU", "E256 [2048, 4096] x2, x f16", note, n, ue, uavg * fp4_w13 + xin + hbytes}, t);
    t = B.time([&](int i) { moe_gate_up(moe, idx_at(i), n, K, xb16.get(), Act::BF16, 10.0, nullptr, h16, nullptr, ws, S); });
    B.add(B.rows, {"moe gate+up, x bf16 (+ f16 conversion launch)", "E256 [2048, 4096] x2", note, n, ue, uavg * fp4_w13 + 3 * xin + hbytes}, t);
    t = B.time([&](int i) { moe_down(moe, idx_at(i), n, K, h16, nullptr, ys, ws, S); });
    B.add(B.rows, {"moe down (w2 FP4)", "E256 [4096, 2048], h f16", note, n, ue, uavg * fp4_w2 + hbytes + ysb}, t);
    t = B.time([&](int i) { moe_combine(ys, w_at(i), n, K, D, 1.0f, nullptr, y.as<float>(), S); });
    B.add(B.rows, {"moe combine (weights, sum over k)", "[n*6, 4096] f32", "", n, 0, ysb + double(n) * double(D) * 4}, t);
    auto routed = [&](int i) {
      moe_gate_up(moe, idx_at(i), n, K, x16.get(), Act::F16, 10.0, nullptr, h16, nullptr, ws, S);
      moe_down(moe, idx_at(i), n, K, h16, nullptr, ys, ws, S);
      moe_combine(ys, w_at(i), n, K, D, 1.0f, nullptr, y.as<float>(), S);
    };
    const double routed_bytes = uavg * (fp4_w13 + fp4_w2) + xin + 2 * hbytes + 2 * ysb + double(n) * double(D) * 4;
    t = B.time(routed);
    B.add(B.rows, {"moe routed total (gate+up, down, combine)", "3 launches", note, n, ue, routed_bytes}, t);
    if (n <= 8) {  // as the forward runs them under cuda.pdl (steps of <= 8 tokens): every launch with PDL
      const d::PdlScope pdl(true);
      t = B.time(routed);
      B.add(B.rows, {"moe routed total (gate+up, down, combine)", "3 launches, cuda.pdl", note, n, ue, routed_bytes}, t);
    }

    // What a plain read of the experts' weight bytes reaches in the same harness (read_stream over the expert
    // weights, a different region per call where they fit): the ceiling for kernels of this size, launch, ramp and
    // tail included. (H200: 19.2 us for the 80 MB of batch 1, 100 % of copy: the MXFP4 kernels' gap to it is their
    // own, not the launch's.)
    // Also each kernel's own bytes alone (gate+up, down): the ceiling of a launch of that size, against which the
    // kernels' target (75 % of copy) is set. (Only where those bytes fit in w1's allocation: not at 32 tokens.)
    const std::pair<double, const char*> refs[3] = {{uavg * (fp4_w13 + fp4_w2), "reference: gate+up + down's bytes"},
                                                    {uavg * fp4_w13, "reference: gate+up's bytes"},
                                                    {uavg * fp4_w2, "reference: down's bytes"}};
    for (const auto& [bytes, what] : refs) {
      if (size_t(bytes) > moe.w1.codes.bytes()) continue;
      const size_t rb = size_t(bytes) / 256 * 256;
      const size_t slots = std::max<size_t>(1, moe.w1.codes.bytes() / rb);
      t = B.time([&](int i) { d::read_stream(moe.w1.codes.as<uint8_t>() + size_t(i) % slots * rb, rb, B.sink.as<unsigned>(), S); });
      B.add(B.rows, {"read-only stream of the same weight bytes", what, "", n, 0, double(rb)}, t);
    }

    // The official numerics' W4A8 kernels (cuda.moe_mxfp4 under numerics.official: x and h quantized to E4M3 per 128,
    // FP8 tensor cores, bf16 outputs) on the same weights read as the A8 layout (random codes are random in either):
    // gate+up from x's codes, down from h's, and the whole routed path with both quantizations and the combine.
    {
      moe.w1.layout = moe.w3.layout = moe.w2.layout = Fp4Layout::A8;
      const int64_t S8 = int64_t(n) * K;
      DeviceBuffer x8(size_t(n * D)), xsc(size_t(n * D / 128) * 4), h32(size_t(S8 * I) * 4), h8(size_t(S8 * I)),
          hsc(size_t(S8 * I / 128) * 4);
      act_quant_e4m3(x32.as<float>(), n, D, D, x8.as<uint8_t>(), xsc.as<float>(), S);
      moe_gate_up_a8(moe, idx_at(0), n, K, x8.as<uint8_t>(), xsc.as<float>(), 10.0, nullptr, h32.as<float>(), S);
      act_quant_e4m3(h32.as<float>(), S8, I, I, h8.as<uint8_t>(), hsc.as<float>(), S);
      const double x8b = double(n * D) * (1.0 + 4.0 / 128), h8b = double(S8 * I) * (1.0 + 4.0 / 128), h32b = double(S8 * I) * 4;
      t = B.time([&](int i) { moe_gate_up_a8(moe, idx_at(i), n, K, x8.as<uint8_t>(), xsc.as<float>(), 10.0, nullptr, h32.as<float>(), S); });
      B.add(B.rows, {"moe gate+up W4A8 (official numerics)", "E256 [2048, 4096] x2, x E4M3", note, n, ue, uavg * fp4_w13 + x8b + h32b}, t);
      t = B.time([&](int i) { moe_down_a8(moe, idx_at(i), n, K, h8.as<uint8_t>(), hsc.as<float>(), ys, S); });
      B.add(B.rows, {"moe down W4A8 (official numerics)", "E256 [4096, 2048], h E4M3", note, n, ue, uavg * fp4_w2 + h8b + ysb}, t);
      t = B.time([&](int i) {
        act_quant_e4m3(x32.as<float>(), n, D, D, x8.as<uint8_t>(), xsc.as<float>(), S);
        moe_gate_up_a8(moe, idx_at(i), n, K, x8.as<uint8_t>(), xsc.as<float>(), 10.0, nullptr, h32.as<float>(), S);
        act_quant_e4m3(h32.as<float>(), S8, I, I, h8.as<uint8_t>(), hsc.as<float>(), S);
        moe_down_a8(moe, idx_at(i), n, K, h8.as<uint8_t>(), hsc.as<float>(), ys, S);
        moe_combine(ys, nullptr, n, K, D, 1.0f, nullptr, y.as<float>(), S);
      });
      B.add(B.rows,
            {"moe routed total W4A8 (official numerics)", "5 launches: 2 quantizations", note, n, ue,
             uavg * (fp4_w13 + fp4_w2) + double(n * D) * 4 + x8b + 2 * h32b + h8b + 2 * ysb + double(n * D) * 4},
            t);
      moe.w1.layout = moe.w3.layout = moe.w2.layout = Fp4Layout::F16;
    }

    // Tuning sweep of the two FP4 kernels: the per-tile kernel (warps per block) and the streaming kernel (warps
    // per CTA, stages in flight, warps splitting one tile's K, programmatic dependent launch).
    struct Fp4Cfg {
      int kernel, warps, depth, ks, pdl, minb, early = 0;
    };
    std::vector<Fp4Cfg> fcfgs;
    // Per-tile: warps per block, register budget (minblocks), PDL.
    for (int warps : {1, 2, 3, 4})
      for (int minb : {1, 2, 3})
        for (int pdl : {0, 1})
          fcfgs.push_back({1, warps, 0, 0, pdl, minb});
    // Down's routing read and first weights requested before its PDL wait (pdl_early, as moe_down launches it).
    for (int warps : {1, 2, 4})
      for (int minb : {1, 2, 3}) fcfgs.push_back({1, warps, 0, 0, 1, minb, 1});
    // Streaming: warps per CTA, stages in flight, warps splitting one tile's K, PDL.
    for (int pdl : {0, 1})
      for (int warps : {2, 4, 8})
        for (int depth : {2, 3})
          for (int ks : {1, 2, 4})
            if (ks <= warps && (ks == 1 || depth == 2)) fcfgs.push_back({2, warps, depth, ks, pdl, 1});
    // The launch arguments of gate/up + SwiGLU (which 0: x by token, f16 h) or down (which 1: h by slot, fp32 ys),
    // the configuration fields at their defaults (fp4_kernel 0: the automatic choice, as moe_gate_up / moe_down).
    auto fp4_base = [&](int which) {
      d::GemvArgs a;
      a.fmt = d::kFp4, a.mode = d::kMoe, a.n = n, a.topk = K, a.problems = E, a.act = d::kF16;
      const Fp4Matrices& w = which == 0 ? moe.w1 : moe.w2;
      a.w[0] = w.codes.as<uint8_t>(), a.s[0] = w.scales.get();
      a.w_prob_stride = int64_t(w.code_bytes()), a.s_prob_stride = int64_t(w.scale_bytes());
      a.rows = w.rows, a.cols = w.cols, a.s_ld = w.cols / 32;
      if (which == 0) {
        a.nmat = 2, a.epi = d::kSwiglu, a.limit = 10.0f, a.w[1] = moe.w3.codes.as<uint8_t>(), a.s[1] = moe.w3.scales.get();
        a.x = x16.get(), a.x_tok_stride = D, a.x_by_token = 1, a.out = h16, a.out_half = 1, a.o_tok_stride = I;
      } else {
        a.x = h16, a.x_tok_stride = I, a.out = ys, a.o_tok_stride = D;
      }
      return a;
    };
    for (int which = 0; which < 2; ++which)
      for (const Fp4Cfg& fc : fcfgs) {
          if (fc.early && which == 0) continue;  // (gate/up's routing is its predecessor's output)
          d::GemvArgs a = fp4_base(which);
          a.warps = fc.kernel == 1 ? fc.warps : 4;
          a.minblocks = fc.minb;
          a.fp4_kernel = fc.kernel, a.fp4_warps = fc.kernel == 2 ? fc.warps : 0, a.fp4_depth = fc.depth;
          a.fp4_ksplit = fc.ks, a.pdl = fc.pdl, a.pdl_early = fc.early;
          try {
            t = B.time([&](int i) {
              d::GemvArgs b = a;
              b.idx = idx_at(i);
              d::launch_gemv(b, S);
            });
          } catch (const std::exception& ex) {  // a configuration that does not fit (shared memory)
            fmt::print("skipped FP4 config: {}\n", ex.what());
            d::dsync();
            continue;
          }
          const std::string var = fc.kernel == 1 ? fmt::format("per-tile w{} minb {}{}{}", fc.warps, fc.minb, fc.pdl ? " pdl" : "",
                                                               fc.early ? " early" : "")
                                                  : fmt::format("stream w{} d{} ks{}{}", fc.warps, fc.depth, fc.ks,
                                                                fc.pdl ? " pdl" : "");
          B.add(B.tuning,
                {which == 0 ? "moe gate+up (w1,w3 FP4) + SwiGLU" : "moe down (w2 FP4)", var, note, n, ue,
                 which == 0 ? uavg * fp4_w13 + xin + hbytes : uavg * fp4_w2 + hbytes + ysb},
                t);
          // At <= 8 tokens the per-tile configurations under PDL again in their place in the forward: gate/up
          // (this configuration or the automatic one), down (likewise), the combine, as moe_gate_up / moe_down
          // launch them. A kernel replayed after itself overlaps its own tail under PDL in ways it cannot after
          // its real neighbour (session 29: a down kernel 1 us faster alone was 6-12 us slower here).
          if (n <= 8 && fc.kernel == 1 && fc.pdl && (which == 0 || fc.early)) {
            const d::GemvArgs gu = which == 0 ? a : fp4_base(0);  // (the automatic gate/up after a down configuration)
            t = B.time([&](int i) {
              d::GemvArgs g2 = gu, d2 = a;
              g2.idx = d2.idx = idx_at(i);
              d::launch_gemv(g2, S);
              if (which == 0) moe_down(moe, idx_at(i), n, K, h16, nullptr, ys, ws, S);
              else d::launch_gemv(d2, S);
              moe_combine(ys, w_at(i), n, K, D, 1.0f, nullptr, y.as<float>(), S);
            });
            B.add(B.tuning,
                  {which == 0 ? "moe routed total, gate+up as" : "moe routed total, down as", var, note, n, ue, routed_bytes}, t);
          }
      }

    // Spot check at the real size: sampled gate/up outputs for every token, against the CPU.
    {
      DeviceBuffer h32(size_t(n * K) * size_t(I) * 4);
      moe_gate_up(moe, idx_at(0), n, K, x32.get(), Act::F32, 0.0, nullptr, nullptr, h32.as<float>(), ws, S);
      d::dsync();
      const auto hg = to_host<float>(h32, size_t(n * K) * size_t(I));
      const auto xs = to_host<float>(x32, size_t(n) * size_t(D));
      double max_err = 0, max_ref = 0;
      for (int slot = 0; slot < n * K; slot += std::max(1, n * K / 4)) {
        const int e = R.idx[size_t(slot)], tok = slot / K;
        std::vector<float> xr(static_cast<size_t>(D));
        for (int64_t k = 0; k < D; ++k) xr[size_t(k)] = round_f16(xs[size_t(tok * D + k)]);
        for (int64_t r = 0; r < I; r += 97) {
          // The decode layout keeps a 16-row tile together: download the row's tile and unpack it.
          const int64_t t0 = r / 16 * 16;
          std::vector<uint8_t> rp(size_t(8 * D)), sc1(size_t(D / 32)), sc3(size_t(D / 32)), rp3(size_t(8 * D));
          moe.w1.codes.download(rp.data(), rp.size(), size_t(e) * moe.w1.code_bytes() + size_t(t0 * D / 2));
          moe.w3.codes.download(rp3.data(), rp3.size(), size_t(e) * moe.w3.code_bytes() + size_t(t0 * D / 2));
          moe.w1.scales.download(sc1.data(), sc1.size(), size_t(e) * moe.w1.scale_bytes() + size_t(r * D / 32));
          moe.w3.scales.download(sc3.data(), sc3.size(), size_t(e) * moe.w3.scale_bytes() + size_t(r * D / 32));
          const auto c1 = unpack_fp4_decode(rp.data(), 16, D), c3 = unpack_fp4_decode(rp3.data(), 16, D);
          const double g = fp4_row_dot(c1.data() + (r - t0) * D / 2, sc1.data(), xr, D);
          const double u = fp4_row_dot(c3.data() + (r - t0) * D / 2, sc3.data(), xr, D);
          const double ref = g / (1.0 + std::exp(-g)) * u;
          max_ref = std::max(max_ref, std::fabs(ref));
          max_err = std::max(max_err, std::fabs(ref - double(hg[size_t(slot) * size_t(I) + size_t(r)])));
        }
      }
      const double rel = max_err / std::max(max_ref, 1e-30);
      fmt::print("spot check moe gate+up n={}: max |gpu - cpu| = {:.3e} (max |ref| {:.3e}, normalized {:.2e})\n", n, max_err,
                 max_ref, rel);
      B.checks.push_back({{"kernel", "moe gate+up"}, {"batch", n}, {"max_abs_err", max_err}, {"max_ref", max_ref}, {"normalized", rel}});
    }
  }

  // The MoE layer with the router choosing (router + gate/up + down + combine): 4 launches.
  for (int n : {1, 8}) {
    if (!B.want("moe")) break;
    DeviceRouting<Rsf::Folded> r{ridx.as<int32_t>(), rwt.as<float>(), rlog.as<float>(), rsel.as<float>(), n, K};
    ModelConfig mc;
    mc.n_experts = E, mc.top_k = K, mc.hidden = int(D), mc.moe_inter = int(I), mc.routed_scaling = rsf, mc.swiglu_limit = 10.0;
    const Timing t = B.time([&](int i) {  // a different router copy each time: different experts, cold weights
      route(rws[size_t(i % ngate)], rc, xb16.get(), Act::BF16, n, nullptr, r, ws, S, scratch.x16.as<uint16_t>());
      moe_routed(GpuRunnerFolded{}, mc, moe, r, scratch.x16.as<uint16_t>(), scratch, ws, nullptr, y.as<float>(), S);
    });
    d::dsync();
    const auto idx = to_host<int32_t>(ridx, size_t(n * K));
    const int ue = int(std::set<int32_t>(idx.begin(), idx.end()).size());
    const double bytes = double(E * D * 2) + ue * (fp4_w13 + fp4_w2) + double(n * K) * double(I + D) * 8;
    B.add(B.rows, {"moe layer: router + routed experts", "4 launches, x bf16", fmt::format("{} active experts (last run)", ue), n, ue, bytes}, t);
  }

  // ---- routed experts at prefill (grouped GEMMs) ----
  const std::vector<PrefillRow> prefill = B.want("prefill") ? bench_prefill_moe(B, moe, K, ws, seed) : std::vector<PrefillRow>{};
  // ---- FP8 projections at prefill (cuda.prefill_gemm): in `prefill`, or alone as `fp8prefill` ----
  const std::vector<PrefillRow> prefill8 =
      B.want("prefill") || B.want("fp8prefill") ? bench_prefill_fp8(B, ws, seed) : std::vector<PrefillRow>{};

  // ---- FP8 block-scaled projections and shared expert ----
  struct Proj {
    const char* name;
    int64_t rows, cols;
    int groups;
  };
  const Proj projs[] = {{"attn wq_a", 1024, 4096, 1},  {"attn wkv", 512, 4096, 1},   {"attn wq_b", 32768, 1024, 1},
                        {"attn wo_a (8 groups)", 8192, 4096, 8}, {"attn wo_b", 4096, 8192, 1}, {"indexer wq_b", 8192, 1024, 1}};
  for (const auto& p : projs) {
    if (!B.want("fp8") && !B.want("fp8xs")) break;
    const int nc = copies_for(double(p.rows * p.cols));
    std::vector<Fp8Matrix> ws8;
    for (int c = 0; c < nc; ++c) {
      ws8.push_back(alloc_fp8(p.rows, p.cols));
      d::fill(ws8.back().codes.get(), ws8.back().codes.bytes(), d::kFillE4M3, seed++, 0, 0);
      d::fill(ws8.back().scales.get(), ws8.back().scales.bytes(), d::kFillE8M0, seed++, 112, 118);
    }
    const Fp8Matrix& w = ws8[0];
    const int64_t gr = p.rows / p.groups, in_w = p.cols * p.groups;
    // A direct launch of either kernel on this projection (the sweeps' configurations), with its workspace.
    auto direct = [&](int n, int warps, int kb, int unroll) {
      d::GemvArgs a;
      a.fmt = d::kFp8, a.act = d::kF16, a.rows = gr, a.cols = p.cols, a.problems = p.groups;
      a.w_prob_stride = gr * p.cols, a.s_prob_stride = (gr / 128) * w.scale_cols();
      a.s_ld = w.scale_cols(), a.x = x16.get(), a.x_tok_stride = in_w, a.x_prob_stride = p.groups > 1 ? p.cols : 0;
      a.out = y.get(), a.o_tok_stride = p.rows, a.o_prob_stride = gr, a.n = n, a.warps = warps, a.kblocks = kb;
      a.fp8_unroll = unroll;
      return a;
    };
    auto time_direct = [&](const d::GemvArgs& a0) {
      d::GemvArgs a = a0;
      if (a.kblocks > 1) {
        const d::GemvWorkspace need = d::gemv_workspace(a);
        a.partial = ws.partial(need.floats), a.counters = ws.counters(need.counters);
      }
      return B.time([&](int i) {
        d::GemvArgs b = a;
        b.w[0] = ws8[size_t(i % nc)].codes.as<uint8_t>(), b.s[0] = ws8[size_t(i % nc)].scales.get();
        d::launch_gemv(b, S);
      });
    };
    for (int n : {1, 8, 16, 32, 64, 128}) {
      if (n > 32 && !B.want("fp8xs")) break;
      const double bytes = double(p.rows * p.cols) + double(w.scale_bytes()) + double(n * in_w * 2) + double(n * p.rows * 4);
      if (n <= 32) {  // the default path's row and the register-path kernel's sweep
        Timing t;
        if (p.groups > 1)
          t = B.time([&](int i) { fp8_linear_grouped(ws8[size_t(i % nc)], p.groups, x16.get(), Act::F16, n, y.as<float>(), ws, S); });
        else
          t = B.time([&](int i) { fp8_linear(ws8[size_t(i % nc)], x16.get(), Act::F16, p.cols, n, y.as<float>(), p.rows, ws, S); });
        B.add(B.rows, {fmt::format("FP8 {}", p.name), fmt::format("[{}, {}] E4M3, x f16", p.rows, p.cols), "", n, 0, bytes}, t);
        // Sweep: warps per block x blocks along K x register budget x chunks in flight per warp (above 8 tokens, one
        // pass of token groups: the full register budget, no split of K, 1 or 2 chunks in flight).
        for (int warps : {1, 2, 4, 8})
          for (int kb : {1, 2, 4, 8})
            for (int minb : {1, 3})
            if (B.want("fp8") || n > 8)
            for (int unroll : {1, 2, 4}) {
            if (p.cols / 128 < int64_t(warps) * kb || (unroll == 4 && kb > 1)) continue;
            if (n <= 8 ? unroll == 1 : (kb > 1 || minb > 1 || unroll == 4)) continue;
            d::GemvArgs a = direct(n, warps, kb, unroll);
            a.minblocks = minb;
            const Timing tt = time_direct(a);
            B.add(B.tuning, {fmt::format("FP8 {}", p.name), fmt::format("warps {}, kblocks {}, minb {}, unroll {}", warps, kb, minb, unroll), "", n, 0, bytes}, tt);
          }
        // Under PDL (as cuda.pdl launches them at <= 8 tokens), each launch's first weights requested before its
        // wait into registers (pdl_early, the default) or into L2.
        if (n <= 8 && B.want("fp8") && p.groups == 1)
          for (int early : {0, 1}) {
            const int64_t chunks = p.cols / 128;
            d::GemvArgs a = direct(n, d::gemv_dense_warps(gr / 16, chunks), 1, 2);
            a.pdl = 1, a.pdl_early = early;
            B.add(B.tuning, {fmt::format("FP8 {}", p.name), fmt::format("pdl, first weights into {}", early ? "registers" : "L2"), "", n, 0, bytes},
                  time_direct(a));
          }
      }
      // The shared-activation kernel above 8 tokens (gemv_xs.cuh, `--only fp8xs`): tiles per block x blocks along K x
      // chunks in flight, one pass of token groups (passes of 64 above).
      if (n > 8 && B.want("fp8xs")) {
        for (int warps : {2, 4, 8})
          for (int kb : {1, 2, 4, 8, 16, 32})
            for (int unroll : {1, 2}) {
              const int64_t blocks = (gr / 16 + warps - 1) / warps * p.groups * kb;
              if (p.cols / 128 < kb || blocks < 32 || blocks > 4096) continue;
              d::GemvArgs a = direct(n, warps, kb, unroll);
              a.shared_x = 1;  // (token groups 0: gemv_xs_token_groups)
              if (d::gemv_xs_smem(a) > d::kGemvXsMaxSmem) continue;
              B.add(B.tuning, {fmt::format("FP8 {}", p.name), fmt::format("xs warps {}, kblocks {}, unroll {}", warps, kb, unroll), "", n, 0, bytes},
                    time_direct(a));
            }
      }
    }
    if (std::string(p.name) == "attn wq_a") {  // spot check at the real size
      const int n = 8;
      fp8_linear(w, x32.get(), Act::F32, p.cols, n, y.as<float>(), p.rows, ws, S);
      d::dsync();
      const auto yg = to_host<float>(y, size_t(n * p.rows));
      const auto xs = to_host<float>(x32, size_t(n * p.cols));
      std::vector<uint8_t> codes(size_t(p.rows * p.cols)), sc(w.scales.bytes());
      w.codes.download(codes.data(), codes.size());
      w.scales.download(sc.data(), sc.size());
      double max_err = 0, max_ref = 0;
      for (int t2 = 0; t2 < n; ++t2)
        for (int64_t r = 0; r < p.rows; r += 13) {
          double acc = 0;
          for (int64_t k = 0; k < p.cols; ++k)
            acc += double(fmt8::e4m3_to_f32(codes[size_t(r * p.cols + k)])) * fmt8::e8m0_to_f32(sc[size_t((r / 128) * (p.cols / 128) + k / 128)]) *
                   round_f16(xs[size_t(t2 * p.cols + k)]);
          max_ref = std::max(max_ref, std::fabs(acc));
          max_err = std::max(max_err, std::fabs(acc - double(yg[size_t(t2 * p.rows + r)])));
        }
      const double rel = max_err / std::max(max_ref, 1e-30);
      fmt::print("spot check FP8 wq_a n=8: max |gpu - cpu| = {:.3e} (max |ref| {:.3e}, normalized {:.2e})\n", max_err, max_ref, rel);
      B.checks.push_back({{"kernel", "fp8 wq_a"}, {"batch", n}, {"max_abs_err", max_err}, {"max_ref", max_ref}, {"normalized", rel}});
    }
  }
  if (B.want("fp8") || B.want("fp8xs")) {
    const int nc = copies_for(3.0 * double(I * D));
    std::vector<Fp8Expert> ses(static_cast<size_t>(nc));
    for (auto& se : ses) {
      se.w1 = alloc_fp8(I, D), se.w3 = alloc_fp8(I, D), se.w2 = alloc_fp8(D, I);
      for (Fp8Matrix* m : {&se.w1, &se.w3, &se.w2}) {
        d::fill(m->codes.get(), m->codes.bytes(), d::kFillE4M3, seed++, 0, 0);
        d::fill(m->scales.get(), m->scales.bytes(), d::kFillE8M0, seed++, 112, 118);
      }
    }
    for (int n : {1, 8, 16, 32}) {
      const Timing t = B.time([&](int i) {
        fp8_expert_ffn(ses[size_t(i % nc)], x16.get(), Act::F16, n, 10.0, scratch.h.as<uint16_t>(), y.as<float>(), ws, S);
      });
      const double bytes = 3.0 * double(I * D) + 3.0 * double(ses[0].w1.scale_bytes()) + double(n * D * 2) +
                           2.0 * double(n * I * 2) + double(n * D * 4);
      B.add(B.rows, {"FP8 shared expert (gate+up+SwiGLU, down)", "[2048, 4096] x2 + [4096, 2048]", "2 launches", n, 0, bytes}, t);
    }
  }
  // ---- the compressors' bf16 projections at a few tokens: cuBLASLt GEMMs (cuda.prefill_gemm) vs the GEMV's bf16
  // table launch (cuda.bf16_gemv) ----
  // A CSA layer's four (wkv and wgate [1024, 4096], the indexer compressor's [256, 4096]) from one bf16 conversion
  // of x, both paths; bytes: the weights, x (fp32 in, bf16 out and in again), y.
  if (B.want("bf16")) {
    const int64_t cols = D, prow[4] = {1024, 1024, 256, 256};
    double wbytes = 0;
    for (int64_t r : prow) wbytes += double(r * cols * 2);
    const int nc = copies_for(wbytes);
    std::vector<DeviceBuffer> wsets;
    for (int c = 0; c < nc; ++c)
      for (int64_t r : prow) {
        wsets.emplace_back(size_t(r * cols) * 2);
        d::fill(wsets.back().get(), size_t(r * cols), d::kFillBF16, seed++, -0.05f, 0.05f);
      }
    const int most = 32;
    DeviceBuffer bx(size_t(most * cols) * 2), yb(size_t(most) * 2560 * 4);
    Fp8GemmBuffers fb;
    fb.x = bx.as<uint16_t>(), fb.x_elems = size_t(most * cols);
    auto projs = [&](int i) {
      std::array<Bf16Proj, 4> p;
      int64_t off = 0;
      for (int j = 0; j < 4; ++j) {
        p[size_t(j)] = Bf16Proj{wsets[size_t((i % nc) * 4 + j)].as<uint16_t>(), prow[j], yb.as<float>() + off, prow[j]};
        off += int64_t(most) * prow[j];
      }
      return p;
    };
    for (int n : {2, 4, 8, 16, 32}) {
      const double bytes = wbytes + double(n * cols) * (4 + 2 + 2) + double(n) * 2560 * 4;
      const std::string shape = "CSA: [1024, 4096] x2 + [256, 4096] x2";
      if (have_cublaslt()) {
        const Timing t = B.time([&](int i) {
          const auto p = projs(i);
          bf16_linear_gemm_multi(p.data(), 4, cols, x32.get(), Act::F32, cols, n, fb, S);
        });
        B.add(B.rows, {"bf16 compressor projections, cuBLASLt", shape, "cuda.prefill_gemm: 1 + 4 launches", n, 0, bytes}, t);
      }
      const Timing t = B.time([&](int i) {
        const auto p = projs(i);
        bf16_linear_gemv_multi(p.data(), 4, cols, x32.get(), Act::F32, cols, n, fb, S);
      });
      B.add(B.rows, {"bf16 compressor projections, GEMV", shape, "cuda.bf16_gemv: 1 + 1 launches", n, 0, bytes}, t);
    }
  }
  d::dsync();

  // ---- hc_pre at V4-Flash's size (hc_mult 4, hidden 4096, 20 Sinkhorn iterations): a latency-bound launch of the
  // decode chain (two per layer) ----
  // As the forward runs it (the previous sublayer's hc_post and the RMSNorm fused), and without each fused part; the
  // one-iteration row is a diagnostic of the Sinkhorn's share of the launch (its comb differs), not a configuration;
  // then the launch numerics.official makes (its mix mode, bf16 activations, the norm a launch of its own); the last
  // two the forward's under cuda.streams (the gates and Sinkhorn apart: that launch is not timed), exact and with
  // cuda.hc_norm_after_mix. Bytes: fn (24 x 16384 fp32) and the rows read and written.
  if (B.want("hc")) {
    const int H = 4, nm = (2 + H) * H, hn = 128;  // tokens at most
    const int64_t Dh = D;  // hidden
    DeviceBuffer X(size_t(hn) * H * size_t(Dh) * 4), Xp(size_t(hn) * H * size_t(Dh) * 4), fn(size_t(nm) * H * size_t(Dh) * 4),
        base(size_t(nm) * 4), scl(3 * 4), post(size_t(hn) * H * 4), comb(size_t(hn) * H * H * 4), postp(size_t(hn) * H * 4),
        combp(size_t(hn) * H * H * 4), col(size_t(hn) * size_t(Dh) * 4), col16(size_t(hn) * size_t(Dh) * 2),
        yv(size_t(hn) * size_t(Dh) * 4), nw(size_t(Dh) * 4), mix(d::fwd_hc_scratch_doubles(hn, H) * 8);
    for (DeviceBuffer* b : {&X, &Xp, &yv}) d::fill(b->get(), b->bytes() / 4, d::kFillF32, seed++, -1.0f, 1.0f, S);
    d::fill(fn.get(), fn.bytes() / 4, d::kFillF32, seed++, -0.01f, 0.01f, S);
    for (DeviceBuffer* b : {&base, &scl, &postp, &combp, &nw}) d::fill(b->get(), b->bytes() / 4, d::kFillF32, seed++, 0.1f, 1.0f, S);
    struct HcVar {
      const char* name;
      bool post, norm;
      int iters;
      bool official = false;  // numerics.official's launch: x . fn times r afterwards, bf16 activations, no fused norm
      bool apart = false;     // the gates left to fwd_hc_gates (cuda.streams runs them beside the sublayer; not timed)
      bool after = false;     // cuda.hc_norm_after_mix
    };
    const HcVar vars[] = {{"hc_pre + fused hc_post + norm (the forward's)", true, true, 20},
                          {"hc_pre + norm (X loaded)", false, true, 20},
                          {"hc_pre alone", false, false, 20},
                          {"hc_pre + fused hc_post + norm, 1 Sinkhorn iteration (diagnostic)", true, true, 1},
                          {"hc_pre + fused hc_post, numerics.official", true, false, 20, true},
                          {"hc_pre + fused hc_post + norm, gates apart", true, true, 20, false, true},
                          {"hc_pre + fused hc_post + norm, gates apart, cuda.hc_norm_after_mix", true, true, 20, false, true, true}};
    // 1 and 8 tokens: every variant at the launch's rule; 8-128 (batched decode): the forward's variant with the
    // rule and with each tokens-per-cluster choice.
    for (int n : {1, 8, 16, 32, 64, 128})
      for (int per_cluster : {0, 1, 2, 4})
        for (const HcVar& v : vars) {
          const bool every = n <= 8 && per_cluster == 0, sweep = n >= 8 && &v == &vars[0] && (n > 8 || per_cluster != 0);
          if (!every && !sweep) continue;
          d::HcArgs a;
          a.tokens_per_cluster = per_cluster;
          a.X = X.as<float>(), a.fn = fn.as<float>(), a.base = base.as<float>(), a.scale = scl.as<float>();
          a.n = n, a.H = H, a.iters = v.iters, a.D = Dh, a.hc_eps = 1e-6f, a.rms_eps = 1e-6;
          a.post = post.as<float>(), a.comb = comb.as<float>(), a.collapsed = col.as<float>();
          if (v.post)
            a.y = yv.as<float>(), a.X_prev = Xp.as<float>(), a.post_prev = postp.as<float>(), a.comb_prev = combp.as<float>(),
            a.X_out = X.as<float>();
          if (v.norm) a.norm_w = nw.as<float>(), a.norm_eps = 1e-6, a.collapsed16 = col16.as<uint16_t>();
          if (v.official) a.mix_mode = 2, a.act_bf16 = 1;
          a.gates_apart = v.apart, a.norm_after_mix = v.after;
          const double bytes = double(fn.bytes()) + double(n) * double(Dh) * 4 * (H + (v.post ? H + 1 + H : 0) + 1);
          const std::string how = per_cluster ? fmt::format("{} Sinkhorn iterations, {} tokens per cluster", v.iters, per_cluster)
                                              : fmt::format("{} Sinkhorn iterations", v.iters);
          B.add(B.rows, {v.name, "hc_mult 4, hidden 4096", how, n, 0, bytes},
                B.time([&](int) { d::fwd_hc_pre(a, mix.as<double>(), S); }));
        }
  }
  d::dsync();

  // ---- sparse attention at a long context: the unsplit twin vs attn.splitk_decode (fp64, and attn.splitk_f16) ----
  // An HCA layer at 1M tokens (8192 compressed entries + the 128-key window, 64 heads x 512): the bytes are the keys
  // (read once by an ideal kernel), the queries and the outputs.
  if (B.want("attention")) {
    const int Hq = 64;
    const int64_t Dh = 512, W = 128, rate = 128, ne = 8192, maxk = W + ne;
    DeviceBuffer q(size_t(maxn) * Hq * Dh * 4), kv(size_t(maxn) * Dh * 4), ring(size_t(W * Dh) * 4), ent(size_t(ne * Dh) * 4);
    DeviceBuffer sink(size_t(Hq) * 4), pos = to_device(std::vector<int64_t>{ne * rate - maxn});
    for (DeviceBuffer* b : {&q, &kv, &ring, &ent, &sink}) d::fill(b->get(), b->bytes() / 4, d::kFillF32, seed++, -1.0f, 1.0f);
    DeviceBuffer logits(size_t(maxn) * Hq * maxk * 4), out(size_t(maxn) * Hq * Dh * 4);
    for (int n : {1, 8}) {
      d::AttendArgs a;
      a.q = q.as<float>(), a.chunk_kv = kv.as<float>(), a.ring = ring.as<float>(), a.entries = ent.as<float>();
      a.sink = sink.as<float>(), a.pos = pos.as<int64_t>(), a.out = out.as<float>();
      a.n = n, a.Hq = Hq, a.type = 2, a.Dh = Dh, a.window = W, a.ne = ne, a.rate = rate, a.scale = 1.0f / std::sqrt(float(Dh));
      const double bytes = double(maxk * Dh * 4) + 2.0 * double(n * Hq * Dh * 4);
      const std::string shape = fmt::format("HCA {} keys, {} heads x {}", maxk, Hq, Dh);
      d::AttendArgs tw = a;
      tw.logits = logits.as<float>(), tw.ld_logits = maxk;
      B.add(B.rows, {"attention (unsplit twin)", shape, "logits, then softmax + P.V", n, 0, bytes},
            B.time([&](int) { d::fwd_attend(tw, S); }));
      const d::SplitPlan plan = d::fwd_attend_splitk_plan(n, Hq, Dh, maxk, B.dev.sm_count);
      DeviceBuffer part(std::max<size_t>(plan.scratch_bytes, 8));
      B.add(B.rows, {"attention (attn.splitk_decode)", shape, fmt::format("{} splits of {} keys", plan.splits, plan.keys_per_split(maxk)), n, 0, bytes},
            B.time([&](int) { d::fwd_attend_splitk(a, plan, part.get(), S); }));
      d::AttendArgs ah = a;
      ah.f16 = 1;
      B.add(B.rows, {"attention (attn.splitk_f16)", shape, fmt::format("{} splits of {} keys, f16 products", plan.splits, plan.keys_per_split(maxk)), n, 0, bytes},
            B.time([&](int) { d::fwd_attend_splitk(ah, plan, part.get(), S); }));
    }
  }
  d::dsync();

  // ---- the lightning indexer at a long context: the exact scores vs indexer.dmma_scores and indexer.tc_scores ----
  // A CSA layer at 256K tokens (65536 compressed entries, 64 heads x 128 dims, top-512), scores and top-k per call:
  // the bytes are the keys (read once by an ideal kernel), the queries and the scores.
  if (B.want("indexer")) {
    const int nh = 64, topk = 512;
    const int64_t dh = 128, rate = 4, ne = 65536;
    DeviceBuffer iq(size_t(8) * nh * dh * 4), keys(size_t(ne * dh) * 4), hw(size_t(8) * nh * 4);
    for (DeviceBuffer* b : {&iq, &keys, &hw}) d::fill(b->get(), b->bytes() / 4, d::kFillF32, seed++, -1.0f, 1.0f);
    for (int n : {1, 8}) {
      DeviceBuffer pos = to_device(std::vector<int64_t>{ne * rate - n}), scores(size_t(n) * size_t(ne) * 4),
                   sel(size_t(n) * topk * 8);
      d::IndexArgs a;
      a.q = iq.as<float>(), a.keys = keys.as<float>(), a.hw = hw.as<float>(), a.pos = pos.as<int64_t>();
      a.n = n, a.nh = nh, a.topk = topk, a.k_cap = topk, a.dh = dh, a.ne_cap = ne, a.rate = rate;
      a.qscale = 1.0f / std::sqrt(float(dh)), a.wscale = 1.0f / std::sqrt(float(nh));
      a.scores = scores.as<float>(), a.sel = sel.as<int64_t>();
      a.topk_scratch_bytes = d::fwd_index_topk_scratch_bytes(n, ne, topk, d::fwd_index_topk_path(n, ne, topk));
      DeviceBuffer scratch(std::max<size_t>(a.topk_scratch_bytes, 8));
      a.topk_scratch = scratch.get();
      const double bytes = double(ne * dh * 4) + double(n * nh * dh * 4) + double(n * ne * 4);
      const std::string shape = fmt::format("{} entries, {} heads x {}, top-{}", ne, nh, dh, topk);
      const struct {
        const char* name;
        int path;
        const char* note;
      } paths[] = {{"indexer (exact scores)", d::fwd_indexer_path(a), "fp64 dots in dim order, then the top-k"},
                   {"indexer (indexer.dmma_scores)", d::kIndexerDmma, "the dots on the fp64 tensor cores (exact)"},
                   {"indexer (indexer.tc_scores)", d::kIndexerTc, "f16 tensor cores (tolerance 1e-2)"}};
      for (const auto& pth : paths)
        B.add(B.rows, {pth.name, shape, pth.note, n, 0, bytes}, B.time([&](int) { d::fwd_indexer(a, S, pth.path); }));
    }
  }
  d::dsync();

  // The best swept configuration of each kernel and batch joins the main table.
  {
    std::vector<Row> best;
    for (const auto& r : B.tuning) {
      auto it = std::find_if(best.begin(), best.end(), [&](const Row& b) { return b.kernel == r.kernel && b.batch == r.batch; });
      if (it == best.end()) best.push_back(r);
      else if (r.us_graph < it->us_graph) *it = r;
    }
    for (auto& r : best) {
      r.kernel += " [best]";
      B.rows.push_back(r);
    }
  }

  // ---- report ----
  auto pct = [&](const Row& r, double us) { return 100.0 * r.bytes / (us * 1e-6) / 1e9 / B.copy_gbps; };
  auto print_rows = [&](const std::vector<Row>& rs) {
    fmt::print("{:<46} {:<31} {:>2} {:>8} {:>9} {:>9} {:>8} {:>8} {:>8}  {}\n", "kernel", "shape / variant", "n", "MB read",
               "us single", "us graph", "GB/s gr", "% copy 1", "% copy g", "note");
    for (const auto& r : rs)
      fmt::print("{:<46} {:<31} {:>2} {:>8} {:>9.2f} {:>9.2f} {:>8.0f} {:>7.1f}% {:>7.1f}%  {}\n", r.kernel, r.shape, r.batch, mb(r.bytes),
                 r.us, r.us_graph, r.bytes / (r.us_graph * 1e-6) / 1e9, pct(r, r.us), pct(r, r.us_graph), r.note);
  };
  fmt::print("\ntuning sweeps ([best] rows of the main table pick from these)\n");
  print_rows(B.tuning);
  fmt::print("\nbandwidth reference: D2D copy {:.0f} GB/s, read-only stream {:.0f} GB/s; {}.\n'single': one launch after an L2 flush "
             "(launch latency included); 'graph': {} calls captured in a CUDA graph, replayed after an L2 flush, per call.\n",
             B.copy_gbps, B.read_gbps, gemm_line, Bench::kGraph);
  print_rows(B.rows);
  // The targets' summaries, for the sections that ran.
  if (B.want("moe")) {
    fmt::print("\ntarget (issue 6): MXFP4 routed-expert decode kernel >= 75% of the measured copy bandwidth at batch 1 and 8\n");
    for (const auto& r : B.rows)
      if (r.kernel.rfind("moe gate+up (", 0) == 0 || r.kernel.rfind("moe down", 0) == 0 || r.kernel.rfind("moe routed", 0) == 0)
        fmt::print("  {:<46} {:<24} n={}: single {:5.1f}%  graph {:5.1f}%  {}\n", r.kernel, r.shape, r.batch, pct(r, r.us),
                   pct(r, r.us_graph), pct(r, r.us_graph) >= 75 ? "meets (graph)" : "below");
  }
  if (B.want("indexer"))
    fmt::print("\nthe indexer rows are bound by their fp64 / f16 products, not by the bytes: their % of copy is not a target\n");

  auto tflops = [](const PrefillRow& r) { return r.flops / (r.us * 1e-6) / 1e12; };
  auto pct_bf16 = [&](const PrefillRow& r) { return B.gemm.measured ? 100.0 * tflops(r) / B.gemm.tflops : NAN; };
  if (!prefill.empty()) {
    fmt::print("\nprefill MoE (MXFP4 W4A16 grouped GEMMs; V4-Flash E256 top-6, uniform random routing; median of {} single "
               "launches; % of the bf16 rate measured above)\n{:<50} {:>6} {:>10} {:>10} {:>9} {:>8}\n",
               B.o.iters, "kernel", "tokens", "us single", "us graph", "TFLOP/s", "% bf16");
    for (const auto& r : prefill)
      fmt::print("{:<50} {:>6} {:>10.1f} {:>10.1f} {:>9.1f} {:>7.1f}%\n", r.kernel, r.tokens, r.us, r.us_graph, tflops(r), pct_bf16(r));
    fmt::print("target (issue): MoE GEMMs >= 40% of the bf16 rate at 8K tokens\n");
  }
  if (!prefill8.empty()) {
    fmt::print("\nprefill FP8 projections (cuda.prefill_gemm: E4M3 + E8M0 128x128 blocks dequantized to bf16, x f32 -> bf16, "
               "cuBLASLt bf16 GEMM, fp32 out; V4-Flash shapes; median of {} single launches, L2 flushed; % of the bf16 rate "
               "measured above)\n{:<62} {:>6} {:>10} {:>10} {:>9} {:>8}\n",
               B.o.iters, "op", "tokens", "us single", "us graph", "TFLOP/s", "% bf16");
    for (const auto& r : prefill8)
      fmt::print("{:<62} {:>6} {:>10.1f} {:>10.1f} {:>9.1f} {:>7.1f}%\n", r.kernel, r.tokens, r.us, r.us_graph, tflops(r), pct_bf16(r));
    fmt::print("target: each FP8 prefill projection >= 40% of the bf16 rate at 8K tokens\n");
    for (const auto& r : prefill8)
      if (r.tokens == 8192 && r.kernel.find(": GEMM (") != std::string::npos)
        fmt::print("  {:<62} {:5.1f}%  {}\n", r.kernel, pct_bf16(r), pct_bf16(r) >= 40 ? "meets" : "below");
  }

  if (!B.o.json.empty()) {
    nlohmann::json j;
    j["device"] = {{"name", B.dev.name},   {"sm_count", B.dev.sm_count}, {"l2_bytes", B.dev.l2_bytes},
                   {"mem_bytes", B.dev.mem_bytes}, {"driver", B.dev.driver}, {"runtime", B.dev.runtime}};
    j["bandwidth"] = {{"copy_GBps", B.copy_gbps}, {"read_GBps", B.read_gbps}};
    j["peak_bf16_tflops"] = B.gemm.measured ? nlohmann::json(B.gemm.tflops) : nlohmann::json(nullptr);
    j["bf16_gemm"] = {{"measured", B.gemm.measured}, {"tflops", B.gemm.tflops}, {"ms_median", B.gemm.ms_median},
                      {"ms_min", B.gemm.ms_min}, {"m", B.gemm.m}, {"n", B.gemm.n}, {"k", B.gemm.k}, {"iters", B.gemm.iters},
                      {"why_not", B.gemm.why}};
    j["settings"] = {{"iters", B.o.iters}, {"warmup", B.o.warmup}, {"flush_l2", B.o.flush_l2}, {"graph_calls", Bench::kGraph}};
    auto dump = [&](const std::vector<Row>& rs) {
      nlohmann::json a = nlohmann::json::array();
      for (const auto& r : rs)
        a.push_back({{"kernel", r.kernel},     {"shape", r.shape},         {"batch", r.batch},
                     {"active_experts", r.experts}, {"bytes", r.bytes},    {"us_single_median", r.us},
                     {"us_single_min", r.us_min},   {"us_graph", r.us_graph}, {"pct_copy_single", pct(r, r.us)},
                     {"pct_copy_graph", pct(r, r.us_graph)}, {"note", r.note}});
      return a;
    };
    nlohmann::json pj = nlohmann::json::array();
    for (const auto& r : prefill)
      pj.push_back({{"kernel", r.kernel}, {"tokens", r.tokens}, {"flops", r.flops}, {"us_single_median", r.us}, {"us_graph", r.us_graph},
                    {"tflops", tflops(r)}, {"pct_bf16", B.gemm.measured ? nlohmann::json(pct_bf16(r)) : nlohmann::json(nullptr)}});
    j["prefill_moe"] = pj;
    nlohmann::json p8 = nlohmann::json::array();
    for (const auto& r : prefill8)
      p8.push_back({{"op", r.kernel}, {"tokens", r.tokens}, {"flops", r.flops}, {"us_single_median", r.us}, {"us_graph", r.us_graph},
                    {"tflops", tflops(r)}, {"pct_bf16", B.gemm.measured ? nlohmann::json(pct_bf16(r)) : nlohmann::json(nullptr)}});
    j["prefill_fp8"] = p8;
    j["kernels"] = dump(B.rows);
    j["tuning"] = dump(B.tuning);
    j["checks"] = B.checks;
    std::ofstream f(B.o.json);
    f << j.dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "plumb bench: cannot write %s\n", B.o.json.c_str());
      return 2;
    }
    fmt::print("wrote {}\n", B.o.json);
  }
  if (!B.o.csv.empty()) {
    std::ofstream f(B.o.csv);
    auto num = [](double v) { return std::isfinite(v) ? fmt::format("{:.6g}", v) : std::string(); };
    f << csv_row({"table", "kernel", "shape", "batch", "active_experts", "bytes", "us_single_median", "us_single_min",
                  "us_graph", "pct_copy_single", "pct_copy_graph", "copy_gbps", "note", "flops", "tflops", "pct_bf16"});
    for (const auto* rs : {&B.rows, &B.tuning})
      for (const auto& r : *rs)
        f << csv_row({rs == &B.rows ? "kernels" : "tuning", r.kernel, r.shape, std::to_string(r.batch), num(r.experts),
                      num(double(r.bytes)), num(r.us), num(r.us_min), num(r.us_graph), num(pct(r, r.us)),
                      num(pct(r, r.us_graph)), num(B.copy_gbps), r.note, "", "", ""});
    for (const auto& r : prefill)
      f << csv_row({"prefill", r.kernel, "E256 top-6, D 4096, I 2048", std::to_string(r.tokens), "", "", num(r.us), "", num(r.us_graph),
                    "", "", num(B.copy_gbps), "", num(r.flops), num(tflops(r)), num(pct_bf16(r))});
    for (const auto& r : prefill8)
      f << csv_row({"prefill_fp8", r.kernel, "V4-Flash", std::to_string(r.tokens), "", "", num(r.us), "", num(r.us_graph), "", "",
                    num(B.copy_gbps), "", num(r.flops), num(tflops(r)), num(pct_bf16(r))});
    if (!f) {
      std::fprintf(stderr, "plumb bench: cannot write %s\n", B.o.csv.c_str());
      return 2;
    }
    fmt::print("wrote {}\n", B.o.csv);
  }
  return 0;
}

}  // namespace plumb::cuda
#endif  // PLUMB_WITH_CUDA
