// Does a cluster launch slow the weight-streaming kernels after it? Session 44's attn.cluster_merge ran the split-K
// attention as clusters of its splits (one launch instead of two) and the layer got ~15 us slower at batch 1: not only
// the attention, the output projections after it too (wo_a +7 us, wo_b +4 us in the kernel timeline). hc_pre is a
// cluster launch twice per layer, followed by a weight GEMV each time, so the question matters beyond that patch.
// This probe replays, in one CUDA graph under PDL (as the forward's decode step), 16 rounds of
//   latency-bound kernel (32 blocks x 512 threads, 200 KB of shared memory: one per SM, the attention's shape; it
//   spins ~8 us), then two streaming kernels (each reads its own 32 MB, like wo_a and wo_b, 528 blocks x 256),
// with the latency-bound kernel launched plain or in clusters of 8 (the same blocks), and times from global-timer
// stamps each kernel's first block entry and last block exit: median over the rounds, in us, of the streaming
// kernels' spans and of the gaps after each predecessor's end; and each step's whole span.
// Answer (session 44, one H200, two trials): no. Plain or in clusters of 8 or 4, the latency-bound kernel spans 8.19 us,
// the first streaming kernel ends 10.50 us after it, the second 9.73 us after the first, and the steps take 463-465 us;
// so the cluster launch as such does not explain why wo_a and wo_b ran slower after attn.cluster_merge's kernel
// (bench/results/h200-session44/: left open).
//   nvcc -O3 -std=c++17 -arch=sm_90a -o /tmp/csp bench/cluster_successor_probe.cu && /tmp/csp
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "probe_common.cuh"

constexpr int kRounds = 16, kKernels = 3 * kRounds;
constexpr int kLatThreads = 512, kLatBlocks = 32, kStreamBlocks = 528, kStreamThreads = 256;
constexpr size_t kLatSmem = 200 * 1024, kStreamBytes = size_t(32) << 20;

__device__ unsigned long long g_first[kKernels], g_last[kKernels];

__device__ __forceinline__ void enter(int k) {
  if (threadIdx.x == 0) atomicMin(&g_first[k], global_ns());
}
__device__ __forceinline__ void leave(int k) {
  __syncthreads();
  if (threadIdx.x == 0) atomicMax(&g_last[k], global_ns());
}

// The attention's shape: waits for its predecessor, lets its dependents launch, spins `ns`, stores a value.
__global__ void __launch_bounds__(kLatThreads, 1) lat_kernel(int k, uint64_t ns, float* out) {
  extern __shared__ float sm[];
  asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory");
  enter(k);
  const uint64_t t0 = global_ns();
  sm[threadIdx.x] = float(threadIdx.x);
  while (global_ns() - t0 < ns) {
  }
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = sm[(threadIdx.x + 1) % kLatThreads];
  leave(k);
}

// A weight GEMV's memory shape: each block reads its share of `w` (never written, so loads may start before the
// PDL wait, as the forward's GEMVs request their first weights) and stores one sum.
__global__ void __launch_bounds__(kStreamThreads) stream_kernel(int k, const uint4* w, size_t n16, float* out) {
  enter(k);
  uint4 first = w[size_t(blockIdx.x) * kStreamThreads + threadIdx.x];  // the first round, before the wait
  asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory");
  unsigned acc = first.x ^ first.y ^ first.z ^ first.w;
  for (size_t i = size_t(blockIdx.x) * kStreamThreads + threadIdx.x + size_t(gridDim.x) * kStreamThreads; i < n16;
       i += size_t(gridDim.x) * kStreamThreads) {
    const uint4 v = __ldcs(w + i);
    acc += v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) out[blockIdx.x] = float(acc);  // keeps the loads
  leave(k);
}

int main() {
  CK(cudaFuncSetAttribute(lat_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kLatSmem)));
  std::vector<uint4*> bufs(2 * kRounds);
  for (auto& b : bufs) {
    CK(cudaMalloc(&b, kStreamBytes));
    CK(cudaMemset(b, 1, kStreamBytes));
  }
  float* out;
  CK(cudaMalloc(&out, 1 << 20));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const uint64_t spin_ns = 8000;

  auto capture = [&](int cluster) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int r = 0; r < kRounds; ++r) {
      cudaLaunchAttribute at[2];
      at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      at[0].val.programmaticStreamSerializationAllowed = 1;
      at[1].id = cudaLaunchAttributeClusterDimension;
      at[1].val.clusterDim.x = unsigned(cluster), at[1].val.clusterDim.y = 1, at[1].val.clusterDim.z = 1;
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(kLatBlocks), cfg.blockDim = dim3(kLatThreads), cfg.dynamicSmemBytes = kLatSmem, cfg.stream = st;
      cfg.attrs = at, cfg.numAttrs = cluster > 0 ? 2 : 1;
      CK(cudaLaunchKernelEx(&cfg, lat_kernel, 3 * r, spin_ns, out));
      for (int j = 0; j < 2; ++j) {
        cudaLaunchConfig_t c2 = {};
        c2.gridDim = dim3(kStreamBlocks), c2.blockDim = dim3(kStreamThreads), c2.stream = st;
        c2.attrs = at, c2.numAttrs = 1;
        CK(cudaLaunchKernelEx(&c2, stream_kernel, 3 * r + 1 + j, static_cast<const uint4*>(bufs[2 * r + j]),
                              kStreamBytes / 16, out + 4096));
      }
    }
    CK(cudaStreamEndCapture(st, &g));
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphDestroy(g));
    return ge;
  };

  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  std::printf("cluster  step_us  lat_span  s1_gap_after_lat  s1_span  s2_gap_after_s1  s2_span  lat_gap_after_s2  (us, medians over rounds 2-16 of 9 replays)\n");
  for (int trial = 0; trial < 2; ++trial)
    for (const int cluster : {0, 8, 4}) {
      cudaGraphExec_t ge = capture(cluster);
      std::vector<double> step, lspan, g1, sp1, g2, sp2, g0;
      for (int rep = 0; rep < 10; ++rep) {
        std::vector<unsigned long long> f(kKernels, ~0ull), l(kKernels, 0);
        CK(cudaMemcpyToSymbol(g_first, f.data(), sizeof(unsigned long long) * kKernels));
        CK(cudaMemcpyToSymbol(g_last, l.data(), sizeof(unsigned long long) * kKernels));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaStreamSynchronize(st));
        if (rep == 0) continue;  // warm-up
        CK(cudaMemcpyFromSymbol(f.data(), g_first, sizeof(unsigned long long) * kKernels));
        CK(cudaMemcpyFromSymbol(l.data(), g_last, sizeof(unsigned long long) * kKernels));
        step.push_back((l[kKernels - 1] - f[0]) * 1e-3);
        for (int r = 1; r < kRounds; ++r) {
          const int k = 3 * r;
          lspan.push_back((double(l[k]) - double(f[k])) * 1e-3);
          g1.push_back((double(l[k + 1]) - double(l[k])) * 1e-3);
          sp1.push_back((double(l[k + 1]) - double(f[k + 1])) * 1e-3);
          g2.push_back((double(l[k + 2]) - double(l[k + 1])) * 1e-3);
          sp2.push_back((double(l[k + 2]) - double(f[k + 2])) * 1e-3);
          g0.push_back((double(l[k]) - double(l[k - 1])) * 1e-3);
        }
      }
      std::printf("%7d  %7.1f  %8.2f  %16.2f  %7.2f  %15.2f  %7.2f  %16.2f\n", cluster, med(step), med(lspan), med(g1), med(sp1),
                  med(g2), med(sp2), med(g0));
      CK(cudaGraphExecDestroy(ge));
    }
  std::printf("(s1 / s2: the two streaming kernels, 32 MB each; gap: from the predecessor's last block exit to this kernel's; "
              "span: own first entry to last exit; lat_gap_after_s2: the latency-bound kernel's end after the previous round's s2)\n");
  return 0;
}
