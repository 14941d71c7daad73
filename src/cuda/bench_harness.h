// What the files of `plumb bench` (the kernel bench, src/cuda/bench*.cpp; CUDA builds only) share: the timing
// harness (each kernel alone after an L2 flush, and as calls captured in a CUDA graph), the result rows, the
// synthetic V4-Flash weights and activations the sections run on, and the sections themselves. Not a public
// interface (plumb/bench.h is).
#pragma once
#ifdef PLUMB_WITH_CUDA
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/strings.h"
#include "cuda/api.h"
#include "cuda/blas.h"
#include "cuda/kernels.h"

namespace plumb::cuda::kbench {

namespace d = ::plumb::cuda::detail;

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
  GemmRate gemm;          // the measured bf16 tensor-core rate (cuBLASLt)
  std::string gemm_line;  // how it was measured, or why not (printed at the start and above the table)
  DeviceBuffer flush, sink;
  std::vector<Row> rows, tuning;
  nlohmann::json checks = nlohmann::json::array();

  // Copies of a small matrix so that a graph's calls stream cold weights: >= 3x L2 in all.
  int copies_for(double bytes) const { return std::max(1, int(std::ceil(3.0 * double(dev.l2_bytes) / bytes))); }

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

inline std::string mb(double b) { return fmt::format("{:.2f}", b / 1e6); }  // bytes as MB, 2 decimals

// Random routings: for each of `count` runs, `n` tokens each choose K distinct experts of E.
struct Routings {
  std::vector<int32_t> idx;  // [count][n*K]
  std::vector<float> w;
  std::vector<int> distinct;
  int n = 0, K = 0, count = 0;
};
Routings make_routings(int count, int n, int K, int E, uint32_t seed);

// CPU value of one FP4 output row for one token (from the device copy of the weights), fp16-rounded input.
double fp4_row_dot(const uint8_t* canon_row, const uint8_t* scales, const std::vector<float>& x16, int64_t K);
float round_f16(float v);  // RNE to fp16, as a float

// A prefill line: compute-bound, so its rate is reported against the measured bf16 tensor-core rate.
struct PrefillRow {
  std::string kernel;
  int tokens = 0;
  double flops = 0, us = 0, us_graph = 0;
};

// The synthetic V4-Flash weights and activations the decode sections share, filled on the device in the official
// formats: 256 MXFP4 experts (codes random, E8M0 scales 2^-11..2^-5), enough bf16 router copies to stream cold
// weights, activations up to [128, 32768] (x fp32 / f16 / bf16; outputs fp32), the router's outputs for 8 tokens.
// `seed` counts the fills: the sections take theirs in a fixed order, so every run fills the same bytes.
struct Synth {
  static constexpr int E = 256, K = 6;
  static constexpr int64_t D = 4096, I = 2048;
  static constexpr double rsf = 1.5;
  static constexpr int maxn = 8, moe_maxn = 32;  // the router's rows go to 8 tokens, the routed experts' to 32
  MoeExperts moe;
  std::vector<RouterWeights> rws;
  DeviceBuffer x32, x16, xb16, y, ridx, rwt, rlog, rsel;
  Workspace ws;
  MoeScratch scratch;
  RouterConfig rc;
  uint64_t seed = 10;

  explicit Synth(const Bench& B);
  // The router's outputs for n <= maxn tokens (ridx, rwt, rlog, rsel).
  DeviceRouting<Rsf::Folded> routing(int n) {
    return {ridx.as<int32_t>(), rwt.as<float>(), rlog.as<float>(), rsel.as<float>(), n, K};
  }
  // Routes n tokens of x (xb16 as the forward's bf16 rows, or x32) into r with router copy i of rws (a different copy
  // per call: cold weights); also writes x as f16 into scratch.x16, as the forward's router does.
  void route_with(int i, int n, bool bf16, const DeviceRouting<Rsf::Folded>& r, Stream s) {
    route(rws[size_t(i) % rws.size()], rc, bf16 ? xb16.get() : x32.get(), bf16 ? Act::BF16 : Act::F32, n, nullptr, r, ws, s,
          scratch.x16.as<uint16_t>());
  }
  // One expert's bytes (codes and E8M0 scales): w1 + w3, and w2.
  static double fp4_w13() { return 2.0 * double(I * D / 2 + I * D / 32); }
  static double fp4_w2() { return double(D * I / 2 + D * I / 32); }
};

// The sections, each timing its kernels into B.rows (and sweeps into B.tuning) when --only names it (or is empty).
void bench_phases(Bench& B);                       // bench_latency.cpp: "phases"
void bench_hc(Bench& B, Synth& W);                 // "hc"
void bench_attention(Bench& B, Synth& W);          // "attention"
void bench_indexer(Bench& B, Synth& W);            // "indexer"
void bench_router(Bench& B, Synth& W);             // bench_moe.cpp: "router"
void bench_moe_decode(Bench& B, Synth& W);         // "moe"
void bench_moe_layer(Bench& B, Synth& W);          // "moe"
std::vector<PrefillRow> bench_prefill_moe(Bench& B, const MoeExperts& moe, int K, Workspace& ws, uint64_t& seed);  // bench_prefill.cpp
std::vector<PrefillRow> bench_prefill_fp8(Bench& B, Workspace& ws, uint64_t& seed);
void bench_fp8_projections(Bench& B, Synth& W);    // bench_fp8.cpp: "fp8", "fp8xs"
void bench_shared_expert(Bench& B, Synth& W);      // "fp8", "fp8xs"
void bench_bf16_compressors(Bench& B, Synth& W);   // "bf16"
// bench_report.cpp: the [best] rows, the tables, the targets' lines, JSON and CSV; 0, or 2 when a file cannot be
// written.
int report(Bench& B, const std::vector<PrefillRow>& prefill, const std::vector<PrefillRow>& prefill8);

}  // namespace plumb::cuda::kbench
#endif  // PLUMB_WITH_CUDA
