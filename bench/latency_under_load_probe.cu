// How much slower is a latency-bound kernel's memory access while a weight stream saturates HBM? At batch 1 a
// V4-Flash layer alternates latency-bound kernels (hc_pre, the router's top-k, the attention: chains of dependent
// loads of a few KB) with weight streams; overlapping the two is what a persistent layer kernel would do. Session 40's
// kernel timelines (bench/ktrace) showed the router's one-warp top-k taking 12-20 us instead of 4.3 beside the shared
// expert's GEMV, even with an SM of its own. This probe measures the latency of one thread's dependent loads (a
// pointer chase over a buffer that stays in L2, and over one in HBM) alone and while a streaming kernel on S SMs reads
// a 2 GB buffer (evict-first 16-byte loads, as the decode GEMVs), with the stream's achieved bandwidth.
//   nvcc -O3 -std=c++17 -arch=sm_90a -I src -o /tmp/lul bench/latency_under_load_probe.cu && /tmp/lul
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "cuda/common.cuh"
#include "probe_common.cuh"

// One thread follows next[] from slot `start` for `hops` dependent loads (ld.global.cg: L2, never L1), after `warm`
// hops not timed; writes ns per hop.
__global__ void chase_kernel(const uint32_t* next, uint32_t start, int warm, int hops, double* ns_per_hop, uint32_t* sink) {
  uint32_t i = start;
  for (int k = 0; k < warm; ++k) i = __ldcg(next + i);
  const uint64_t t0 = global_ns();
  for (int k = 0; k < hops; ++k) i = __ldcg(next + i);
  const uint64_t t1 = global_ns();
  *ns_per_hop = double(t1 - t0) / hops;
  *sink = i;
}

// Blocks (one per SM at most: 1024 threads) read [p, p + n16) round after round with evict-first loads, 8 in flight
// per thread, until *stop is set; each block counts the bytes it read.
__global__ void __launch_bounds__(1024) stream_kernel(const int4* p, int64_t n16, const volatile int* stop, unsigned long long* bytes,
                                                      int* sink) {
  const uint64_t pol = plumb::cuda::detail::weight_policy(true);  // the decode GEMVs' evict-first policy
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int acc = 0;
  unsigned long long got = 0;
  for (int64_t base = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;; base += 8 * stride) {
    if (base + 7 * stride >= n16) base = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    int4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u)
      asm volatile("ld.global.L1::no_allocate.L2::cache_hint.v4.s32 {%0,%1,%2,%3}, [%4], %5;"
                   : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                   : "l"(p + base + u * stride), "l"(pol));
#pragma unroll
    for (int u = 0; u < 8; ++u) acc ^= v[u].x ^ v[u].w;
    got += 8 * 16;
    if (*stop) break;
  }
  atomicAdd(bytes, got);
  if (acc == 0x12345678) *sink = acc;
}

__global__ void set_flag(int* f, int v) { *f = v; }

// A random cycle over n slots (Sattolo), spread over the buffer so each hop is a new line.
std::vector<uint32_t> cycle(size_t n, size_t stride_elems, std::mt19937& rng) {
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  for (size_t i = n - 1; i > 0; --i) std::swap(order[i], order[std::uniform_int_distribution<size_t>(0, i - 1)(rng)]);
  std::vector<uint32_t> next(n * stride_elems, 0);
  for (size_t k = 0; k < n; ++k) next[order[k] * stride_elems] = uint32_t(order[(k + 1) % n] * stride_elems);
  return next;
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::mt19937 rng(7);
  // L2 chase: 4096 lines of 128 B (512 KB); HBM chase: 2^20 lines 512 B apart (512 MB span, 128 MB of distinct lines:
  // beyond the 60 MB L2, so nearly every hop misses it).
  const auto l2 = cycle(4096, 32, rng), hbm = cycle(size_t(1) << 20, 128, rng);
  uint32_t *d_l2, *d_hbm, *sink;
  double* d_ns;
  CK(cudaMalloc(&d_l2, l2.size() * 4));
  CK(cudaMalloc(&d_hbm, hbm.size() * 4));
  CK(cudaMemcpy(d_l2, l2.data(), l2.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_hbm, hbm.data(), hbm.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMalloc(&d_ns, 8));
  CK(cudaMalloc(&sink, 64));
  const int64_t stream_bytes = int64_t(2) << 30;
  int4* buf;
  CK(cudaMalloc(&buf, stream_bytes));
  CK(cudaMemset(buf, 1, stream_bytes));
  int* stop;
  unsigned long long* got;
  CK(cudaMalloc(&stop, 4));
  CK(cudaMalloc(&got, 8));
  cudaStream_t s_stream, s_chase;
  CK(cudaStreamCreateWithFlags(&s_stream, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&s_chase, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));

  std::printf("chase: one thread's dependent 4-byte loads (ld.global.cg), an L2-resident 512 KB cycle and a 2^20-line cycle over 512 MB\n");
  std::printf("stream: S blocks of 1024 threads (one per SM), evict-first 16-byte loads, 8 in flight per thread, 2 GB buffer\n");
  std::printf("%10s %12s %14s %14s\n", "stream SMs", "stream GB/s", "L2 hop ns", "HBM hop ns");
  for (int S : {0, 4, 8, 16, 32, 66, 100, 128}) {
    if (S > sms) continue;
    double ns[2] = {0, 0};
    double gbs = 0;
    for (int which = 0; which < 2; ++which) {
      const uint32_t* chain = which == 0 ? d_l2 : d_hbm;
      const int hops = which == 0 ? 20000 : 4000;
      std::vector<double> trials;
      for (int t = 0; t < 5; ++t) {
        CK(cudaMemset(stop, 0, 4));
        CK(cudaMemset(got, 0, 8));
        CK(cudaDeviceSynchronize());
        if (S > 0) {
          CK(cudaEventRecord(e0, s_stream));
          stream_kernel<<<S, 1024, 0, s_stream>>>(buf, stream_bytes / 16, stop, got, reinterpret_cast<int*>(sink));
          CK(cudaGetLastError());
          CK(cudaEventRecord(e1, s_stream));
        }
        // Let the stream reach its rate, then chase beside it, then stop the stream.
        // Each trial walks a part of the cycle no earlier trial walked (the HBM cycle's lines are then not in L2: a
        // hop reads one 32-byte sector, so a cycle walked again would be L2-resident).
        const uint32_t start = which == 0 ? 0u : uint32_t((size_t(S + 1) * 7919 + size_t(t) * 9973) % (size_t(1) << 20) * 128);
        chase_kernel<<<1, 32, 0, s_chase>>>(chain, start, 200, 50, d_ns, sink);  // (a short warm-up chase: ~50 us)
        chase_kernel<<<1, 32, 0, s_chase>>>(chain, start, 300, hops, d_ns, sink);  // (past the warm-up's hops)
        CK(cudaGetLastError());
        set_flag<<<1, 1, 0, s_chase>>>(stop, 1);
        CK(cudaDeviceSynchronize());
        double v = 0;
        CK(cudaMemcpy(&v, d_ns, 8, cudaMemcpyDeviceToHost));
        trials.push_back(v);
        if (S > 0 && which == 0) {
          float ms = 0;
          unsigned long long b = 0;
          CK(cudaEventElapsedTime(&ms, e0, e1));
          CK(cudaMemcpy(&b, got, 8, cudaMemcpyDeviceToHost));
          gbs = std::max(gbs, double(b) / (ms * 1e6));
        }
      }
      std::sort(trials.begin(), trials.end());
      ns[which] = trials[trials.size() / 2];
    }
    std::printf("%10d %12.0f %14.1f %14.1f\n", S, gbs, ns[0], ns[1]);
  }
  std::printf("(stream GB/s: bytes read over the stream kernel's whole run, which includes its last round after the stop)\n");
  return 0;
}
