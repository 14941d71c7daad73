// Diagnostic for the router kernel (src/cuda/router.cu): where the time of one launch goes. Builds the kernel with
// %globaltimer probes (PLUMB_ROUTER_STAMP) in every block and times single launches with CUDA events, after an L2
// flush (cold weights, as decode) and hot. Not part of the build; on the GPU machine:
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Isrc bench/router_trace.cu -o /tmp/router_trace
//   /tmp/router_trace
#include <algorithm>
#include <cstdio>
#include <vector>

__device__ unsigned long long g_trace[4096][8];
// (global_ns: common.cuh's global timer, which router.cu includes before the stamps expand)
#define PLUMB_ROUTER_STAMP(slot)                                                                           \
  do {                                                                                                     \
    if (threadIdx.x == 0)                                                                                  \
      g_trace[blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)][slot] = global_ns();        \
  } while (0)
#include "cuda/router.cu"

namespace plumb::cuda::detail {
void check_launch(const char* what) {  // runtime.cu's, without linking the library
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw_cuda(e, what, __FILE__, __LINE__);
}
}  // namespace plumb::cuda::detail

using namespace plumb::cuda::detail;

#define CK(x)                                                                       \
  do {                                                                              \
    cudaError_t e = (x);                                                            \
    if (e != cudaSuccess) {                                                         \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); \
      return 1;                                                                     \
    }                                                                               \
  } while (0)

__global__ void fill_bf16(uint16_t* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned h = unsigned(i) * 2654435761u ^ seed;
    h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
    const float v = (float(h & 0xFFFFu) / 65536.0f - 0.5f) * 0.1f;
    p[i] = uint16_t(__float_as_uint(v) >> 16);
  }
}
__global__ void read_all(const uint4* p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) acc ^= p[i].x;
  if (acc == 0x12345678u) *sink = acc;
}

int main() {
  const int E = 256, K = 6, D = 4096;
  const int copies = 64;  // 128 MB of gate copies: cold weights per launch
  uint16_t *gate, *x, *x16;
  float *bias, *wt, *lg, *sel;
  int32_t* idx;
  double* partial;
  unsigned *counter, *sink;
  uint4* flush;
  const size_t flush_n = (size_t(256) << 20) / 16;
  CK(cudaMalloc(&gate, size_t(copies) * E * D * 2));
  CK(cudaMalloc(&x, 64 * D * 2));
  CK(cudaMalloc(&x16, 64 * D * 2));
  CK(cudaMalloc(&bias, E * 4));
  CK(cudaMalloc(&wt, 64 * K * 4));
  CK(cudaMalloc(&idx, 64 * K * 4));
  CK(cudaMalloc(&lg, 64 * E * 4));
  CK(cudaMalloc(&sel, 64 * E * 4));
  CK(cudaMalloc(&partial, 8 * 64 * E * 8));
  CK(cudaMalloc(&counter, 64 * 4));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMalloc(&flush, flush_n * 16));
  CK(cudaMemset(counter, 0, 64 * 4));
  CK(cudaMemset(bias, 0, E * 4));
  CK(cudaMemset(flush, 1, flush_n * 16));
  fill_bf16<<<1024, 256>>>(gate, size_t(copies) * E * D, 1);
  fill_bf16<<<64, 256>>>(x, 64 * D, 2);
  CK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::printf("router single launches, E %d, K %d, D %d, x bf16, writes x16/logits/select (as the bench)\n", E, K, D);
  for (int n : {1, 8, 32}) {
    RouterArgs a;
    a.bias = bias, a.x = x, a.act = kBF16, a.n = n, a.E = E, a.K = K, a.D = D, a.score = 0, a.fold = 1.5f;
    a.idx = idx, a.weight = wt, a.logits = lg, a.select = sel, a.x16 = x16, a.partial = partial, a.counter = counter;
    for (int flushed : {1, 0}) {
      std::vector<float> ms;
      for (int i = 0; i < 60; ++i) {
        a.gate = gate + size_t(i % copies) * E * D;
        if (flushed) read_all<<<1024, 256>>>(flush, flush_n, sink);
        CK(cudaEventRecord(e0));
        launch_router(a, nullptr);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float t;
        CK(cudaEventElapsedTime(&t, e0, e1));
        if (i >= 10) ms.push_back(t * 1e3f);
      }
      std::sort(ms.begin(), ms.end());
      std::printf("  n=%2d %s: median %.2f us, min %.2f us\n", n, flushed ? "cold (L2 flushed)" : "hot          ", ms[ms.size() / 2],
                  ms.front());
    }
    // One traced cold launch: per-block stamps (ns, relative to the earliest block start).
    static unsigned long long tr[4096][8];
    CK(cudaMemset(partial, 0, 8));
    read_all<<<1024, 256>>>(flush, flush_n, sink);
    std::vector<unsigned long long> zero(4096 * 8, 0);
    CK(cudaMemcpyToSymbol(g_trace, zero.data(), zero.size() * 8));
    a.gate = gate;
    launch_router(a, nullptr);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpyFromSymbol(tr, g_trace, sizeof tr));
    const int blocks = (E / 16) * router_ksplit(D) * router_counters(n);
    unsigned long long t0 = ~0ull, s0max = 0, s1max = 0, s2max = 0, s3max = 0;
    for (int b = 0; b < blocks; ++b) {
      t0 = std::min(t0, tr[b][0]);
      s0max = std::max(s0max, tr[b][0]), s1max = std::max(s1max, tr[b][1]);
      s2max = std::max(s2max, tr[b][2]), s3max = std::max(s3max, tr[b][3]);
    }
    std::printf("  trace n=%d (ns from the first block start): last block start %llu, x staged (max) %llu, partials computed (max) %llu, "
                "counter passed (max) %llu\n", n, s0max - t0, s1max - t0, s2max - t0, s3max - t0);
    for (int b = 0; b < blocks; ++b)
      if (tr[b][4])
        std::printf("    finalizing block %d: start %llu, staged %llu, computed %llu, counter %llu, logits summed %llu, written %llu\n", b,
                    tr[b][0] - t0, tr[b][1] - t0, tr[b][2] - t0, tr[b][3] - t0, tr[b][4] - t0, tr[b][5] ? tr[b][5] - t0 : 0);
  }
  // The floor of the pattern: a tiny router (E 32, D 128) has the same launch, counter and finalization.
  {
    RouterArgs a;
    a.gate = gate, a.bias = bias, a.x = x, a.act = kBF16, a.n = 1, a.E = 32, a.K = 4, a.D = 128, a.score = 0;
    a.idx = idx, a.weight = wt, a.partial = partial, a.counter = counter;
    std::vector<float> ms;
    for (int i = 0; i < 60; ++i) {
      CK(cudaEventRecord(e0));
      launch_router(a, nullptr);
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float t;
      CK(cudaEventElapsedTime(&t, e0, e1));
      if (i >= 10) ms.push_back(t * 1e3f);
    }
    std::sort(ms.begin(), ms.end());
    std::printf("  tiny router (E 32, D 128, n 1), hot: median %.2f us (launch + counter + finalize floor)\n", ms[ms.size() / 2]);
  }
  CK(cudaGetLastError());
  return 0;
}
