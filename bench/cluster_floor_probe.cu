// How long does a latency-bound launch shaped like hc_pre take before it does any work? hc_pre at one token is a
// cluster of 16 blocks x 256 threads (2 per SM, 40 KB of shared memory each) with three cluster barriers and ~12 us
// per launch in graph replay (`plumb bench --only hc`). This probe times launch shapes with no work, in graph replay
// of 32 dependent launches (the forward's chain), to split that time into the launch's floor, the cluster barriers
// and the work, and to time the alternative to a barrier + remote-read round: all-to-all stores signalled on
// mbarriers (`exchange`, session 33; not yet run).
//   nvcc -O3 -std=c++17 -arch=sm_90a -I src -o /tmp/cluster_floor bench/cluster_floor_probe.cu && /tmp/cluster_floor
// (a CUDA build, -DPLUMB_CUDA=ON, also builds it as build/cluster_floor_probe)
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/common.cuh"
#include "probe_common.cuh"

namespace cg = cooperative_groups;

// kSyncs cluster barriers (or block barriers without a cluster); kStore: every thread stores to global memory before
// each barrier (a release barrier then waits for the store); kRemote: a distributed shared memory read after each.
template <bool kCluster, int kSyncs, bool kStore, bool kRemote>
__global__ void __launch_bounds__(256, 2) shape(float* out) {
  extern __shared__ float sm[];
  const int tid = int(threadIdx.x);
  float v = float(tid);
  sm[tid] = v;
  for (int i = 0; i < kSyncs; ++i) {
    if constexpr (kStore) out[int64_t(blockIdx.x) * blockDim.x + tid] = v;
    if constexpr (kCluster) {
      cg::cluster_group cl = cg::this_cluster();
      cl.sync();
      if constexpr (kRemote) v += *cl.map_shared_rank(&sm[tid], (cl.block_rank() + 1) % cl.num_blocks());
    } else {
      __syncthreads();
      v += sm[(tid + 1) & 255];
    }
  }
  if (tid == 0) out[blockIdx.x] = v;
  if constexpr (kCluster && kRemote) cg::this_cluster().sync();  // (the last remote read done before any block exits)
}

// kRounds all-to-all exchanges of one double per block without cluster barriers (the alternative to hc_pre's
// barrier + remote-read rounds): warp 0's lane q stores this block's value into block q's slot for this rank with
// st.async, which counts its bytes on block q's mbarrier; each block waits on its own mbarrier for the S values, sums
// them in rank order (the same bits everywhere) and shares the total through a block barrier. Two mbarriers and two
// slot arrays alternate by round, so a block one round ahead cannot disturb a round another block is still reading.
// One cluster barrier at the start (the mbarriers initialized before any remote store), none at the end (each block
// has received every store meant for it before it exits).
using plumb::cuda::detail::smem_u32;  // (src/cuda/common.cuh)

template <int kRounds>
__global__ void __launch_bounds__(256, 2) exchange(float* out) {
  __shared__ alignas(8) unsigned long long bar[2];
  __shared__ double slot[2][16];
  __shared__ double total;
  cg::cluster_group cl = cg::this_cluster();
  const int tid = int(threadIdx.x), S = int(cl.num_blocks()), rank = int(cl.block_rank());
  if (tid == 0) {
    for (int b = 0; b < 2; ++b) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&bar[b])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cl.sync();
  double v = double(rank + 1);
  for (int r = 0; r < kRounds; ++r) {
    const int b = r & 1;
    const uint32_t parity = uint32_t(r >> 1) & 1u;
    if (tid == 0)
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(&bar[b])), "r"(S * 8) : "memory");
    if (tid < S) {
      uint32_t dst, dbar;
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(dst) : "r"(smem_u32(&slot[b][rank])), "r"(tid));
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(dbar) : "r"(smem_u32(&bar[b])), "r"(tid));
      asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];" ::"r"(dst),
                   "l"(__double_as_longlong(v)), "r"(dbar)
                   : "memory");
    }
    if (tid < 32) {
      uint32_t done = 0;
      while (!done)
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(smem_u32(&bar[b])), "r"(parity)
                     : "memory");
      if (tid == 0) {
        double t = 0;
        for (int q = 0; q < S; ++q) t += slot[b][q];
        total = t;
      }
    }
    __syncthreads();
    v = total * 0.5;
    __syncthreads();  // (total read by every thread before the next round's write)
  }
  if (tid == 0) out[blockIdx.x] = float(v);
}

// One block of 1024 threads, kSyncs block barriers with a shared-memory exchange (the single-block alternative).
template <int kSyncs>
__global__ void __launch_bounds__(1024, 1) single(float* out) {
  __shared__ float sm[1024];
  const int tid = int(threadIdx.x);
  float v = float(tid);
  for (int i = 0; i < kSyncs; ++i) {
    sm[tid] = v;
    __syncthreads();
    v += sm[(tid + 1) & 1023];
    __syncthreads();
  }
  if (tid == 0) out[0] = v;
}

template <class K>
float time_chain(K kern, int blocks, int threads, int cluster, size_t smem, float* out) {
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  if (smem > 48 * 1024) CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  if (cluster > 8) CK(cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(blocks)), cfg.blockDim = dim3(unsigned(threads)), cfg.dynamicSmemBytes = smem, cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(cluster), attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr, cfg.numAttrs = cluster > 1 ? 1 : 0;
  constexpr int kChain = 32, kReps = 50;
  cudaGraph_t g;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < kChain; ++i) CK(cudaLaunchKernelEx(&cfg, kern, out));
  CK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t ge;
  CK(cudaGraphInstantiate(&ge, g, 0));
  for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, s));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> per;
  for (int r = 0; r < 5; ++r) {
    CK(cudaEventRecord(a, s));
    for (int i = 0; i < kReps; ++i) CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    per.push_back(ms * 1000.0f / float(kChain * kReps));
  }
  std::sort(per.begin(), per.end());
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  CK(cudaStreamDestroy(s));
  return per[per.size() / 2];
}

int main() {
  float* out = nullptr;
  CK(cudaMalloc(&out, 1 << 20));
  const size_t sm40 = 40 * 1024;
  struct Row {
    const char* name;
    float us;
  };
  std::vector<Row> rows;
  rows.push_back({"plain grid, 16 x 256, no barrier", time_chain(shape<false, 0, false, false>, 16, 256, 1, sm40, out)});
  rows.push_back({"plain grid, 16 x 256, 3 block barriers", time_chain(shape<false, 3, false, false>, 16, 256, 1, sm40, out)});
  rows.push_back({"cluster 16 x 256 (2 per SM), no barrier", time_chain(shape<true, 0, false, false>, 16, 256, 16, sm40, out)});
  rows.push_back({"cluster 16, 1 cluster barrier", time_chain(shape<true, 1, false, false>, 16, 256, 16, sm40, out)});
  rows.push_back({"cluster 16, 3 cluster barriers", time_chain(shape<true, 3, false, false>, 16, 256, 16, sm40, out)});
  rows.push_back({"cluster 16, 3 barriers + remote reads", time_chain(shape<true, 3, false, true>, 16, 256, 16, sm40, out)});
  rows.push_back({"cluster 16, 3 exchanges by st.async + mbarrier", time_chain(exchange<3>, 16, 256, 16, sm40, out)});
  rows.push_back({"cluster 16, 1 exchange by st.async + mbarrier", time_chain(exchange<1>, 16, 256, 16, sm40, out)});
  rows.push_back({"cluster 16, 3 barriers after global stores", time_chain(shape<true, 3, true, false>, 16, 256, 16, sm40, out)});
  rows.push_back({"cluster 16, 6 cluster barriers", time_chain(shape<true, 6, false, false>, 16, 256, 16, sm40, out)});
  rows.push_back({"cluster 8 x 256, 3 cluster barriers", time_chain(shape<true, 3, false, false>, 8, 256, 8, sm40, out)});
  rows.push_back({"cluster 4 x 256, 3 cluster barriers", time_chain(shape<true, 3, false, false>, 4, 256, 4, sm40, out)});
  rows.push_back({"cluster 16 (1 per SM, 120 KB), 3 barriers", time_chain(shape<true, 3, false, false>, 16, 256, 16, 120 * 1024, out)});
  rows.push_back({"single block 1024, 3 barrier pairs", time_chain(single<3>, 1, 1024, 1, 0, out)});
  rows.push_back({"single block 1024, no barrier", time_chain(single<0>, 1, 1024, 1, 0, out)});
  std::printf("us per launch, graph replay of 32 dependent launches (median of 5 x 50 replays)\n");
  for (const Row& r : rows) std::printf("  %-48s %7.2f\n", r.name, r.us);
  CK(cudaFree(out));
  return 0;
}
