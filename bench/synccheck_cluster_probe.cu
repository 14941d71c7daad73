// Does compute-sanitizer's synccheck report "Divergent thread(s) in warp" at block barriers that no thread can
// reach diverged? hc_pre's and the fused indexer's multi-token cluster launches draw that report at plain
// __syncthreads() whose SASS has every divergent region closed (BSYNC) before the BAR.SYNC, and only in blocks with
// blockIdx.y >= 2. This probe has no divergence at all: each variant is a fixed sequence of block barriers (and, in the
// cluster variants, cluster barriers and a distributed shared memory read) over a 2-D grid of several waves.
//   nvcc -O3 -arch=sm_90a -o /tmp/probe bench/synccheck_cluster_probe.cu   (a CUDA build also makes build/synccheck_cluster_probe)
//   compute-sanitizer --tool synccheck /tmp/probe VARIANT   (VARIANT: plain, cluster, cluster-early-warp)
// plain: no cluster; cluster: clusters of 16 (2 blocks per SM, as hc_pre); cluster-early-warp: as cluster, and warp 0
// leaves after the last cluster barrier's wait while the other warps store (hc_pre's warp 0 returns likewise).
#include <cooperative_groups.h>

#include <cstdio>
#include <cstring>

namespace cg = cooperative_groups;

template <bool kCluster, bool kEarlyWarp>
__global__ void __launch_bounds__(256, 2) probe(float* out, int rounds) {
  __shared__ float part[256];
  __shared__ float tot;
  const int tid = int(threadIdx.x);
  float v = float(blockIdx.x + blockIdx.y * 7 + tid);
  for (int r = 0; r < rounds; ++r) {
    part[tid] = v;
    __syncthreads();
    if (tid == 0) {
      float s = 0;
      for (int i = 0; i < 256; ++i) s += part[i];
      tot = s;
    }
    __syncthreads();
    if constexpr (kCluster) {
      cg::cluster_group cl = cg::this_cluster();
      cl.sync();
      v += *cl.map_shared_rank(&tot, (cl.block_rank() + 1) % cl.num_blocks()) * 1e-6f;
      cl.sync();
    } else {
      v += tot * 1e-6f;
      __syncthreads();
    }
  }
  if constexpr (kEarlyWarp) {
    if (tid < 32) return;
  }
  out[(int64_t(blockIdx.y) * gridDim.x + blockIdx.x) * 256 + tid] = v;
}

int main(int argc, char** argv) {
  const char* variant = argc > 1 ? argv[1] : "cluster";
  const dim3 grid(16, 128), block(256);
  float* out = nullptr;
  cudaMalloc(&out, size_t(grid.x) * grid.y * 256 * sizeof(float));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid, cfg.blockDim = block;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 16, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
  cudaError_t e;
  if (!strcmp(variant, "plain")) {
    e = cudaLaunchKernelEx(&cfg, probe<false, false>, out, 4);
  } else {
    cfg.attrs = attr, cfg.numAttrs = 1;
    auto k = !strcmp(variant, "cluster-early-warp") ? probe<true, true> : probe<true, false>;
    cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    e = cudaLaunchKernelEx(&cfg, k, out, 4);
  }
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  std::printf("%s: %s\n", variant, cudaGetErrorString(e));
  cudaFree(out);
  return e == cudaSuccess ? 0 : 1;
}
