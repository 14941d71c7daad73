// Can a latency-bound launch on a few SMs pull the next GEMV's weights into L2 while it runs? At batch 1 a V4-Flash
// layer's chain of latency-bound kernels (hc_pre on 8-16 SMs, the attention, the router) leaves HBM idle for ~50 us
// per layer, then the GEMVs stream ~230 MB. This probe times a "chain" kernel (B blocks spinning T us, as hc_pre
// would) followed by a "GEMV" (every SM reading S MB once, evict-first loads as the decode GEMVs make), with and
// without the chain kernel's blocks first issuing bulk L2 prefetches (cp.async.bulk.prefetch.L2, one instruction per
// chunk from one thread per block) of the bytes the reader will read. L2 is overwritten before each trial.
//   nvcc -O3 -std=c++17 -arch=sm_90a -I src -o /tmp/l2_bulk_prefetch bench/l2_bulk_prefetch_probe.cu && /tmp/l2_bulk_prefetch
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/common.cuh"
#include "probe_common.cuh"

// B blocks: thread 0 of each prefetches its share of [p, p + bytes) in chunks (0 bytes: none), then the block spins
// for ns nanoseconds.
__global__ void chain_kernel(const char* p, int64_t bytes, int64_t chunk, int64_t ns) {
  if (threadIdx.x == 0 && bytes > 0) {
    const int64_t share = (bytes / gridDim.x + chunk - 1) / chunk * chunk, b0 = int64_t(blockIdx.x) * share;
    const int64_t end = bytes < b0 + share ? bytes : b0 + share;
    for (int64_t o = b0; o < end; o += chunk) {
      const uint32_t sz = uint32_t(chunk < end - o ? chunk : end - o);
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + o), "r"(sz) : "memory");
    }
  }
  const uint64_t t0 = global_ns();
  while (int64_t(global_ns() - t0) < ns) {
  }
}

// Every SM reads [p, p + bytes) once with evict-first 16-byte loads (the decode GEMVs' policy).
__global__ void __launch_bounds__(256) read_kernel(const int4* p, int64_t n16, int* sink) {
  const uint64_t pol = plumb::cuda::detail::weight_policy(true);  // the decode GEMVs' evict-first policy
  int acc = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n16; i += stride * 4) {
    int4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int64_t j = i + u * stride;
      if (j < n16)
        asm volatile("ld.global.nc.L2::cache_hint.v4.s32 {%0,%1,%2,%3}, [%4], %5;"
                     : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                     : "l"(p + j), "l"(pol));
      else
        v[u] = make_int4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x12345678) *sink = acc;
}

__global__ void scrub_kernel(int4* p, int64_t n16) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n16; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = make_int4(int(i), 1, 2, 3);
}

int main() {
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  const int64_t wbytes = int64_t(512) << 20, sbytes = int64_t(256) << 20;
  char* w = nullptr;
  int4* scrub = nullptr;
  int* sink = nullptr;
  CK(cudaMalloc(&w, size_t(wbytes)));
  CK(cudaMalloc(&scrub, size_t(sbytes)));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(w, 1, size_t(wbytes)));
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  cudaEvent_t e0, e1, e2;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventCreate(&e2));
  std::printf("%s, %d SMs, L2 %d MB\n", prop.name, sms, prop.l2CacheSize >> 20);
  // us for chain + read (and the read alone after the chain), median of reps.
  auto trial = [&](int blocks, int64_t ns, int64_t bytes, int64_t chunk, bool pf, int64_t off, float* read_us) {
    const int reps = 15;
    std::vector<float> tot, rd;
    for (int r = 0; r < reps; ++r) {
      scrub_kernel<<<sms * 4, 256, 0, st>>>(scrub, sbytes / 16);
      CK(cudaEventRecord(e0, st));
      chain_kernel<<<blocks, 128, 0, st>>>(w + off, pf ? bytes : 0, chunk, ns);
      CK(cudaEventRecord(e1, st));
      read_kernel<<<sms * 4, 256, 0, st>>>(reinterpret_cast<const int4*>(w + off), bytes / 16, sink);
      CK(cudaEventRecord(e2, st));
      CK(cudaEventSynchronize(e2));
      float a = 0, b = 0;
      CK(cudaEventElapsedTime(&a, e0, e2));
      CK(cudaEventElapsedTime(&b, e1, e2));
      tot.push_back(a * 1000), rd.push_back(b * 1000);
    }
    std::sort(tot.begin(), tot.end()), std::sort(rd.begin(), rd.end());
    *read_us = rd[reps / 2];
    return tot[reps / 2];
  };
  std::printf("%-7s %-8s %-6s %-9s | %-22s | %-22s | %s\n", "blocks", "chain us", "MB", "chunk KB", "no prefetch: total/read",
              "prefetch: total/read", "read saved us (GB/s of prefetch implied)");
  for (int64_t mb : {8, 16, 32, 48})
    for (int blocks : {1, 8, 16, 32})
      for (int64_t chunk_kb : {64, 1024})
        for (int64_t us : {0, 5, 10, 15}) {
          const int64_t bytes = mb << 20, chunk = chunk_kb << 10, off = (mb * 3 % 256) << 20;
          float r0 = 0, r1 = 0;
          const float t0 = trial(blocks, us * 1000, bytes, chunk, false, off, &r0);
          const float t1 = trial(blocks, us * 1000, bytes, chunk, true, off, &r1);
          std::printf("%-7d %-8lld %-6lld %-9lld | %8.1f / %8.1f     | %8.1f / %8.1f     | %6.1f\n", blocks, (long long)us, (long long)mb,
                      (long long)chunk_kb, t0, r0, t1, r1, r0 - r1);
        }
  // References: the read from HBM (L2 scrubbed) and from L2 (read twice).
  for (int64_t mb : {8, 16, 32, 48}) {
    const int64_t bytes = mb << 20;
    float cold = 0, warm = 0;
    trial(1, 0, bytes, 1 << 20, false, 0, &cold);
    std::vector<float> v;
    for (int r = 0; r < 15; ++r) {
      read_kernel<<<sms * 4, 256, 0, st>>>(reinterpret_cast<const int4*>(w), bytes / 16, sink);
      CK(cudaEventRecord(e1, st));
      read_kernel<<<sms * 4, 256, 0, st>>>(reinterpret_cast<const int4*>(w), bytes / 16, sink);
      CK(cudaEventRecord(e2, st));
      CK(cudaEventSynchronize(e2));
      float b = 0;
      CK(cudaEventElapsedTime(&b, e1, e2));
      v.push_back(b * 1000);
    }
    std::sort(v.begin(), v.end());
    warm = v[7];
    std::printf("read %lld MB: cold %.1f us (%.0f GB/s), read again right after %.1f us (%.0f GB/s)\n", (long long)mb, cold,
                double(bytes) / cold / 1e3, warm, double(bytes) / warm / 1e3);
  }
  return 0;
}
