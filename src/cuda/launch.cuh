// Kernel launches with programmatic dependent launch (PDL, the cuda.pdl patch). A kernel launched through launch()
// while PDL is on may be scheduled while the previous kernel of the stream is still finishing, so its launch latency
// and first loads overlap that kernel's tail (a decode step is ~45 short kernels per layer). The contract, for
// every kernel launched here: pdl_begin() comes before its first access to memory that another kernel writes or
// reads (weights, written once at load, may be prefetched before it). pdl_begin waits for the previous kernel to
// complete and its writes to be visible, then lets the next kernel be scheduled: at most one kernel runs ahead.
// Without the attribute (PDL off) both instructions are no-ops and launches serialize as usual.
// pdl_begin's memory clobber keeps ordinary loads after it, but not __ldg (ld.global.nc): those are marked invariant,
// and a load of another kernel's output whose address is known before the wait was hoisted above it when the wait
// sat in the same block of straight-line code (session 27, gemv.cu's pdl_early: wrong results). Such loads after a
// wait placed mid-kernel are plain loads (gemv.cu's load_act8); the kernels that wait first and load later in their
// loops use __ldg as compiled today, which the PDL tests check bit for bit.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace plumb::cuda::detail {

__device__ __forceinline__ void pdl_begin() { asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory"); }
// pdl_begin's two steps apart, for a block that stores something the next kernel reads before its own wait: wait,
// store, __threadfence (the stores performed at the device's scope), then let the next kernel launch. The next
// kernel launches only once every block has let it (or exited), so those stores precede its first instruction.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// A spin of at least `ns` on the GPU's global timer (common.cuh's global_ns).
__device__ __forceinline__ void wait_ns(uint64_t ns) {
  const uint64_t t0 = global_ns();
  while (global_ns() - t0 < ns) {
  }
}

// cuda.branch_flags (BranchWait, kernels.h): thread 0 waits until every slot of `w` holds the forward's epoch, then
// fences, so the branches' writes are visible to the block after the barrier that follows. Traps with a message after
// kBranchWaitLimitNs: a branch that never signals is a bug to see, not a hang. The flagged buffers are read after it
// with coherent loads (plain ld.global, cp.async.cg), never ld.global.nc: their producer may finish while this
// kernel is resident.
constexpr uint64_t kBranchWaitLimitNs = 10'000'000'000ull;
static __device__ __noinline__ void branch_flags_wait(const BranchWait w, const char* who) {
  const unsigned epoch = *reinterpret_cast<const volatile unsigned*>(w.sync);
  const uint64_t t0 = global_ns();
  for (int i = 0; i < BranchWait::kMax; ++i) {
    if (w.slot[i] == 0) continue;
    for (;;) {
      unsigned v;
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(w.sync + w.slot[i]) : "memory");
      if (v == epoch) break;
      if (global_ns() - t0 > kBranchWaitLimitNs) {
        printf("plumb: %s (block %d) waited 10 s for branch slot %d (holds %u, epoch %u): its branch never signalled\n", who,
               int(blockIdx.x + blockIdx.y * gridDim.x), w.slot[i], v, epoch);
        __trap();
      }
    }
  }
  __threadfence();
}

// pdl_begin with cuda.branch_flags' waits before its two steps: (when w.sync is set) thread 0 waits for the
// branches' flags and the block meets at a barrier (so every thread of the block must call it), then the PDL wait, then
// the trigger. The flags are waited for first so that a branch that ended while the previous kernel still ran costs
// nothing after that kernel's end (the flags' L2 round trips overlap it). That early wait reads the forward's epoch
// before the PDL wait: it is current because the reader runs at least two launches after the forward's first kernel
// on its stream (the kernel before it passed its own PDL wait before letting this one launch), true of both readers
// (hc_pre with pending branches is never the forward's first, the attention follows the query projections). The
// dependents launch only once every block has seen the flags, so no later kernel of the chain holds SMs while this
// one waits: the branches' kernels always find room.
__device__ __forceinline__ void pdl_begin_after(const BranchWait& w, const char* who) {
  if (w.sync) {
    if (threadIdx.x == 0) branch_flags_wait(w, who);
    __syncthreads();
  }
  asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory");
}

// L2 prefetch of weights (read-only for the whole forward), for use before pdl_begin.
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// A launch with the PDL attribute iff `pdl` (kernels whose own arguments decide, such as the GEMVs' GemvArgs::pdl).
template <class... P, class... A>
void launch_as(bool pdl, const char* what, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, Stream s, A&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem;
  cfg.stream = stream_of(s);  // a StreamScope's stream (cuda.streams), else the calling thread's stream
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr, cfg.numAttrs = pdl ? 1 : 0;
  PLUMB_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...));
  check_launch(what);
}

// A launch with the PDL attribute while cuda.pdl is on for this thread (PdlScope).
template <class... P, class... A>
void launch(const char* what, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, Stream s, A&&... args) {
  launch_as(pdl_enabled(), what, kernel, grid, block, smem, s, std::forward<A>(args)...);
}

// A cluster launch: grid (cluster, rows), clusters of `cluster` blocks along x; the PDL attribute only where the
// caller asks (hc_pre under cuda.pdl_hc_attn; the kernel then calls pdl_begin before touching memory another kernel
// writes or reads; elsewhere the cluster kernels' pdl_begin is a no-op).
template <class... P, class... A>
void launch_cluster(bool pdl, const char* what, void (*kernel)(P...), unsigned cluster, unsigned rows, unsigned threads, size_t smem,
                    Stream s, A&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(cluster, rows, 1), cfg.blockDim = dim3(threads, 1, 1), cfg.dynamicSmemBytes = smem;
  cfg.stream = stream_of(s);
  cudaLaunchAttribute at[2];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = cluster, at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
  at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at, cfg.numAttrs = pdl ? 2 : 1;
  PLUMB_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...));
  check_launch(what);
}

// How many clusters of `cluster` blocks (`threads` threads, `smem` bytes of dynamic shared memory each) of a kernel
// the GPU keeps resident at once (0: it schedules none, or refuses the query). Sizes above 8 need the non-portable
// attribute, which this sets.
template <class Kern>
int max_active_clusters(Kern kern, int cluster, int threads, size_t smem) {
  int num = 0;
  if (cluster <= 8 || cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(unsigned(cluster), 1, 1), cfg.blockDim = dim3(unsigned(threads), 1, 1), cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = unsigned(cluster), at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
    cfg.attrs = at, cfg.numAttrs = 1;
    if (cudaOccupancyMaxActiveClusters(&num, kern, &cfg) != cudaSuccess) num = 0;
  }
  (void)cudaGetLastError();  // a refusal above is an answer, not an error
  return num;
}

// Blocks per cluster for a cluster kernel: max_c (a non-portable size above 8) where the GPU co-schedules a cluster
// of max_c blocks of `threads` threads and `smem` bytes of dynamic shared memory, else the portable 8. Callers query
// once per kernel and keep the answer, so every launch of it splits its work the same way.
template <class Kern>
int cluster_size_or_8(Kern kern, int max_c, int threads, size_t smem) {
  return max_active_clusters(kern, max_c, threads, smem) > 0 ? max_c : 8;
}

}  // namespace plumb::cuda::detail
