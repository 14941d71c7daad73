// Is compute-sanitizer's synccheck report "Barrier error detected. Missing wait" on hc_pre's 4-token launch (session
// 66: at the arming of an mbarrier, in blocks of cluster rank 8 and 9, only in launches of several waves) about
// hc_pre, or about the pattern? hc_pre's cluster reductions: one thread per block initializes an mbarrier (count 1)
// and arms it with the bytes its inbox will receive (arrive.expect_tx), fence.mbarrier_init, a cluster barrier, then
// every block pushes its partials into every rank's inbox with st.async (complete_tx on that rank's mbarrier) and
// every thread waits on its own block's mbarrier with try_wait.parity. Arming from a thread that waits on the barrier
// did not change the report (bench/results/h100-session66/). Each variant below is that pattern with one thing
// changed, so the variants that synccheck reports and the ones it does not name the cause.
//   nvcc -O3 -arch=sm_90a -std=c++17 -Isrc -o /tmp/mbprobe bench/synccheck_mbarrier_probe.cu   (a CUDA build also makes build/synccheck_mbarrier_probe)
//   for v in push push-one-wave push-inval push-early-warp push-token local push-c8 push-c9 push-c12; do
//     compute-sanitizer --tool synccheck /tmp/mbprobe $v; done
// push: hc_pre's pattern, clusters of 16 (2 blocks per SM), a 16 x 128 grid (several waves on 132 SMs);
// push-one-wave: the same on a 16 x 8 grid (one wave, as the one-token launches synccheck finds clean);
// push-inval: each block invalidates its mbarrier (mbarrier.inval) after a block barrier once every thread waited;
// push-early-warp: a second barrier the same way, waited by warps 1.. only (warp 0 leaves first, as in hc_pre);
// push-token: thread 0 waits with the state token its arrival returned (try_wait with the token), the others by parity;
// local: no cluster and no transactions: every thread arrives on its block's mbarrier (count 256), then waits by parity;
// push-c8, push-c9, push-c12: push with clusters of 8 (the portable size), 9 and 12 blocks.
// Answer (session 67, H100, compute-sanitizer 2025.3: bench/results/h100-session67/): every push variant with clusters
// of 16 is reported, one wave too, always in a block of rank 8 or 9, and the tool then stops the launch with an
// illegal address the plain runs never hit; push-c8 is clean; push-c9 and push-c12 are reported at rank 8; local is
// clean. synccheck mis-tracks mbarriers at ranks >= 8 of a non-portable cluster; the pattern is clean where it works.
// Each prints the launch's status and a checksum of the values (the pushes' sums are checked against the host's).
// It arms, waits and pushes with hc_pre's own helpers (src/cuda/cluster_push.cuh); its own are only for what the
// variants change.
#include <cooperative_groups.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "cuda/cluster_push.cuh"

namespace cg = cooperative_groups;

namespace {

constexpr int kS = 16, kThreads = 256;

using plumb::cuda::detail::hc_bar_init;  // (hc_pre's own helpers: the pattern under test is theirs)
using plumb::cuda::detail::hc_bar_wait;
using plumb::cuda::detail::hc_push;
using plumb::cuda::detail::smem_u32;

// What the variants change: an mbarrier of another arrival count, an arming that keeps its state, a plain arrival,
// a wait on that state.
__device__ __forceinline__ void bar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ uint64_t bar_arm(uint64_t* bar, uint32_t bytes) {
  uint64_t state;
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 %0, [%1], %2;" : "=l"(state) : "r"(smem_u32(bar)), "r"(bytes) : "memory");
  return state;
}
__device__ __forceinline__ void bar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void bar_wait_token(uint64_t* bar, uint64_t state) {
  uint32_t done = 0;
  while (!done)
    asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
                 : "=r"(done)
                 : "r"(smem_u32(bar)), "l"(state)
                 : "memory");
}

enum Variant { kPush, kPushInval, kPushEarlyWarp, kPushToken, kLocal };

template <Variant V>
__global__ void __launch_bounds__(kThreads, 2) probe(double* out) {
  __shared__ double inbox[2][kS];
  __shared__ __align__(8) uint64_t bars[2];
  const int tid = int(threadIdx.x);
  const double mine = double(blockIdx.y * 131 + blockIdx.x);
  if constexpr (V == kLocal) {
    if (tid == 0) bar_init(&bars[0], kThreads);
    __syncthreads();
    inbox[0][tid % kS] = mine;  // (every thread of a residue class writes the same value)
    bar_arrive(&bars[0]);
    hc_bar_wait(&bars[0]);
    if (tid == 0) out[blockIdx.y * gridDim.x + blockIdx.x] = inbox[0][0];
    return;
  } else {
    const cg::cluster_group cl = cg::this_cluster();
    const int S = int(cl.num_blocks()), s0 = int(cl.block_rank());
    constexpr int nb = V == kPushEarlyWarp ? 2 : 1;
    uint64_t state = 0;
    if (tid == 0) {
      if constexpr (V == kPushToken) {
        bar_init(&bars[0], 1);
        state = bar_arm(&bars[0], uint32_t(S * 8));
      } else {
        for (int b = 0; b < nb; ++b) hc_bar_init(&bars[b], uint32_t(S * 8));
      }
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    cl.barrier_arrive();
    cl.barrier_wait();
    if (tid < S) hc_push(&inbox[0][s0], &bars[0], tid, mine);
    if (V == kPushToken && tid == 0) bar_wait_token(&bars[0], state);
    else hc_bar_wait(&bars[0]);
    double t = 0;
    for (int q = 0; q < S; ++q) t += inbox[0][q];
    if constexpr (V == kPushEarlyWarp) {
      if (tid >= 32 && tid < 32 + S) hc_push(&inbox[1][s0], &bars[1], tid - 32, mine + 1);
      if (tid < 32) {  // warp 0 leaves: it armed bars[1] (thread 0) but never waits on it
        if (tid == 0) out[blockIdx.y * gridDim.x + blockIdx.x] = t;
        return;
      }
      hc_bar_wait(&bars[1]);
      if (tid == 32) out[gridDim.x * gridDim.y + blockIdx.y * gridDim.x + blockIdx.x] = inbox[1][(s0 + 1) % S];
      return;
    }
    if constexpr (V == kPushInval) {
      __syncthreads();  // every thread past its wait
      if (tid == 0) asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(smem_u32(&bars[0])) : "memory");
    }
    if (tid == 0) out[blockIdx.y * gridDim.x + blockIdx.x] = t;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const char* v = argc > 1 ? argv[1] : "push";
  const bool one_wave = !strcmp(v, "push-one-wave");
  const int cs = !strcmp(v, "push-c8") ? 8 : !strcmp(v, "push-c9") ? 9 : !strcmp(v, "push-c12") ? 12 : kS;
  const dim3 grid(cs, one_wave ? 8 : 128), block(kThreads);
  const size_t n = size_t(grid.x) * grid.y;
  double* out = nullptr;
  cudaMalloc(&out, 2 * n * sizeof(double));
  cudaMemset(out, 0, 2 * n * sizeof(double));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid, cfg.blockDim = block;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(cs), attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr, cfg.numAttrs = 1;
  void (*k)(double*) = nullptr;
  if (!strcmp(v, "push") || one_wave || cs != kS) k = probe<kPush>;
  else if (!strcmp(v, "push-inval")) k = probe<kPushInval>;
  else if (!strcmp(v, "push-early-warp")) k = probe<kPushEarlyWarp>;
  else if (!strcmp(v, "push-token")) k = probe<kPushToken>;
  else if (!strcmp(v, "local")) k = probe<kLocal>, cfg.numAttrs = 0;
  if (!k) {
    std::fprintf(stderr, "unknown variant %s (push, push-one-wave, push-inval, push-early-warp, push-token, local, push-c8, push-c9, push-c12)\n", v);
    return 2;
  }
  cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaError_t e = cudaLaunchKernelEx(&cfg, k, out);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  // Each block's sum of its cluster's values (local: its own value): checked against the host's.
  std::vector<double> h(n);
  if (e == cudaSuccess) e = cudaMemcpy(h.data(), out, n * sizeof(double), cudaMemcpyDeviceToHost);
  size_t bad = 0;
  for (unsigned y = 0; e == cudaSuccess && y < grid.y; ++y)
    for (unsigned x = 0; x < grid.x; ++x) {
      double want = 0;
      if (!strcmp(v, "local")) want = double(y * 131 + x);
      else
        for (unsigned q = 0; q < grid.x; ++q) want += double(y * 131 + q);
      bad += h[y * grid.x + x] != want;
    }
  std::printf("%s: %s, %zu of %zu blocks wrong\n", v, cudaGetErrorString(e), bad, n);
  cudaFree(out);
  return e == cudaSuccess && bad == 0 ? 0 : 1;
}
