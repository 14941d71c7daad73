// `plumb bench`: the decode kernels at DeepSeek-V4-Flash dimensions on synthetic weights in the official formats
// (random packed FP4 experts with E8M0 scales, random FP8 codes with E8M0 128x128 block scales, bf16 router),
// built on the device inside the process. It measures the device's copy bandwidth in the same run and reports each
// kernel's median time (CUDA events, warm-up, an L2 flush before every timed run: decode reads its weights cold),
// the bytes it must read (for the MoE kernels: the active experts only), the achieved GB/s and % of the measured
// bandwidth. A spot check compares sampled outputs at the real sizes against a CPU computation.
// The sections live in bench_moe.cpp, bench_fp8.cpp, bench_prefill.cpp, bench_latency.cpp; the report in
// bench_report.cpp; the harness they share in bench_harness.h.
#ifdef PLUMB_WITH_CUDA
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>

#include "cuda/bench_harness.h"
#include "formats/numeric.h"

namespace plumb::cuda {

namespace kbench {

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

Synth::Synth(const Bench& B) {
  moe.E = E, moe.D = D, moe.I = I;
  moe.w1 = alloc_fp4(E, I, D), moe.w3 = alloc_fp4(E, I, D), moe.w2 = alloc_fp4(E, D, I);
  for (Fp4Matrices* m : {&moe.w1, &moe.w3, &moe.w2}) {
    d::fill(m->codes.get(), m->codes.bytes(), d::kFillBytes, seed++, 0, 0);
    d::fill(m->scales.get(), m->scales.bytes(), d::kFillE8M0, seed++, 116, 122);
    m->scale_lo = 116, m->scale_hi = 122;  // filled on the device: the range the folded-scale prefill kernels check
  }
  rws.resize(size_t(B.copies_for(double(E * D * 2))));
  for (auto& rw : rws) {
    rw.E = E, rw.D = D;
    rw.gate = DeviceBuffer(size_t(E * D) * 2), rw.bias = DeviceBuffer(size_t(E) * 4);
    d::fill(rw.gate.get(), size_t(E * D), d::kFillBF16, seed++, -0.05f, 0.05f);
    d::fill(rw.bias.get(), size_t(E), d::kFillF32, seed++, -0.01f, 0.01f);
  }
  const size_t xe = size_t(128) * 32768;  // x up to [128, 32768] (the FP8 rows of `fp8xs` at 128 tokens: wo_a's input)
  x32 = DeviceBuffer(xe * 4), x16 = DeviceBuffer(xe * 2), xb16 = DeviceBuffer(xe * 2);
  d::fill(x32.get(), xe, d::kFillF32, seed++, -1.0f, 1.0f);
  d::fill(x16.get(), xe, d::kFillF16, seed++, -1.0f, 1.0f);
  d::fill(xb16.get(), xe, d::kFillBF16, seed++, -1.0f, 1.0f);
  scratch.reserve(moe_maxn, K, D, I);
  y = DeviceBuffer(size_t(128) * 32768 * 4);  // outputs up to [128, 32768] (the FP8 rows of `fp8xs` at 128 tokens: wq_b)
  ridx = DeviceBuffer(size_t(maxn) * K * 4), rwt = DeviceBuffer(size_t(maxn) * K * 4);
  rlog = DeviceBuffer(size_t(maxn) * E * 4), rsel = DeviceBuffer(size_t(maxn) * E * 4);
  rc.E = E, rc.K = K, rc.D = D, rc.routed_scaling = rsf;
  d::dsync();
}

namespace {

// --profile: one launch of each main kernel, for a profiler.
void profile_launches(Bench& B, Synth& W) {
  const Stream S = B.s;
  const int K = W.K, E = W.E;
  auto& moe = W.moe;
  auto& scratch = W.scratch;
  auto& ws = W.ws;
  const Routings R1 = make_routings(1, 1, K, E, 99u), R8 = make_routings(1, 8, K, E, 98u);
  DeviceBuffer i1 = to_device(R1.idx), i8 = to_device(R8.idx);
  for (auto* R : {&i1, &i8}) {
    const int n = R == &i1 ? 1 : 8;
    moe_gate_up(moe, R->as<int32_t>(), n, K, W.x16.get(), Act::F16, 10.0, nullptr, scratch.h.as<uint16_t>(), nullptr, ws, S);
    moe_down(moe, R->as<int32_t>(), n, K, scratch.h.as<uint16_t>(), nullptr, scratch.ys.as<float>(), ws, S);
  }
  Fp8Matrix w = alloc_fp8(4096, 8192);
  d::fill(w.codes.get(), w.codes.bytes(), d::kFillE4M3, 5, 0, 0);
  d::fill(w.scales.get(), w.scales.bytes(), d::kFillE8M0, 6, 112, 118);
  fp8_linear(w, W.x16.get(), Act::F16, 8192, 8, W.y.as<float>(), 4096, ws, S);
  W.route_with(0, 8, false, W.routing(8), S);
  d::dsync();
  fmt::print("profile launches done: moe gate+up n=1, down n=1, gate+up n=8, down n=8, fp8 [4096, 8192] n=8, router n=8\n");
}

}  // namespace

}  // namespace kbench

using namespace kbench;

int run_bench(const BenchOptions& opt) {
  std::string why;
  if (!available(&why)) {
    std::fprintf(stderr, "error: plumb bench: no usable GPU: %s\n", why.c_str());
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
  if (B.dev.check_only) fmt::print(stderr, "{}", kCheckOnlyWarning), fmt::print("{}", kCheckOnlyWarning);

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
  B.gemm_line =
      B.gemm.measured ? fmt::format("bf16 GEMM rate: {:.0f} TFLOP/s (cuBLASLt {}x{}x{}, bf16 in/out, fp32 accumulate, median of {})",
                                    B.gemm.tflops, B.gemm.m, B.gemm.n, B.gemm.k, B.gemm.iters)
                      : fmt::format("bf16 GEMM rate: not measured ({})", B.o.profile ? "--profile" : B.gemm.why.c_str());
  fmt::print("{}\n", B.gemm_line);
  B.flush = DeviceBuffer(std::max<size_t>(size_t(256) << 20, 4 * B.dev.l2_bytes));
  d::fill(B.flush.get(), B.flush.bytes(), d::kFillBytes, 2, 0, 0);
  if (B.want("phases")) bench_phases(B);

  // ---- synthetic V4-Flash weights, then the sections (in this order: the fills' seeds follow it) ----
  Synth W(B);
  if (B.o.profile) {
    profile_launches(B, W);
    return 0;
  }
  bench_router(B, W);
  bench_moe_decode(B, W);
  bench_moe_layer(B, W);
  const std::vector<PrefillRow> prefill =
      B.want("prefill") ? bench_prefill_moe(B, W.moe, W.K, W.ws, W.seed) : std::vector<PrefillRow>{};
  // (FP8 projections at prefill, cuda.prefill_gemm: in `prefill`, or alone as `fp8prefill`)
  const std::vector<PrefillRow> prefill8 =
      B.want("prefill") || B.want("fp8prefill") ? bench_prefill_fp8(B, W.ws, W.seed) : std::vector<PrefillRow>{};
  bench_fp8_projections(B, W);
  if (B.want("fp8") || B.want("fp8xs")) bench_shared_expert(B, W);
  bench_bf16_compressors(B, W);
  d::dsync();
  bench_hc(B, W);
  d::dsync();
  bench_attention(B, W);
  d::dsync();
  bench_indexer(B, W);
  d::dsync();
  return report(B, prefill, prefill8);
}

}  // namespace plumb::cuda
#endif  // PLUMB_WITH_CUDA
