// The phase bench's kernels (`plumb bench --only phases`): a persistent launch that streams buffers as dependent
// phases with grid barriers and latency-bound steps between them, optionally staging the next buffer into L2 or
// shared memory during those steps; a one-thread wait as the separate-launch twin of such a step; and the same under
// programmatic dependent launch, the read staging its share in shared memory before its wait. They measure what the
// persistent layer kernel planned in docs/cuda.md (or PDL staging) could gain over one launch per step, on bytes alone.
#include "cuda/common.cuh"
#include "cuda/kernels.h"
#include "cuda/launch.cuh"

namespace plumb::cuda::detail {

namespace {

constexpr int kPhaseThreads = 1024;

// Every block arrives (after its threads' memory operations, fenced), then waits for all gridDim.x arrivals of this
// barrier: `target` counts them up over the launch.
__device__ __forceinline__ void grid_barrier(unsigned* bar, unsigned& target) {
  __syncthreads();
  target += gridDim.x;
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(bar, 1u);
    unsigned v = 0;
    do {
      asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(bar) : "memory");
    } while (v < target);
  }
  __syncthreads();
}

// prefetch 1: every thread's 128-byte lines of the next buffer into L2 during the step; 2: only its first half;
// 3: each block copies the first kStageBytes of its contiguous share of the next buffer into shared memory
// (cp.async) during the step and reads that part from there (the rest of its share, and with 0-2 the whole buffer
// grid-strided, from global memory).
constexpr int kStageBytes = 200 * 1024;

// A block's contiguous share [b0, b1) of n16 words and its head [b0, b0 + staged) staged in shared memory.
struct Share {
  size_t b0, b1, staged;
};
__device__ __forceinline__ Share block_share(size_t n16, size_t stage16) {
  const size_t per = (n16 + gridDim.x - 1) / gridDim.x, b0 = min(n16, size_t(blockIdx.x) * per), b1 = min(n16, b0 + per);
  return Share{b0, b1, min(b1 - b0, stage16)};
}
// The staged head's copies (cp.async, one group).
__device__ __forceinline__ void stage_head(uint4* stage, const uint4* buf, const Share& s) {
  for (size_t j = threadIdx.x; j < s.staged; j += blockDim.x) cp16(smem_u32(stage + j), buf + s.b0 + j);
  cp_commit();
}
// The XOR of the block's share: the head from shared memory once its copies have landed, the rest from global memory.
__device__ __forceinline__ uint32_t xor_share(const uint4* stage, const uint4* buf, const Share& s) {
  cp_wait<0>();
  __syncthreads();
  uint32_t acc = 0;
  for (size_t j = threadIdx.x; j < s.staged; j += blockDim.x) {
    const uint4 v = stage[j];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  return acc ^ xor_stream(buf + s.b0 + s.staged, s.b1 - s.b0 - s.staged, threadIdx.x, blockDim.x);
}

__global__ void __launch_bounds__(kPhaseThreads, 1) phase_kernel(const PhaseArgs a) {
  extern __shared__ __align__(16) uint4 stage[];
  const size_t stride = size_t(gridDim.x) * blockDim.x, i0 = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned target = 0;
  uint32_t acc = 0;
  for (int p = 0; p < a.phases; ++p) {
    const auto* buf = static_cast<const uint4*>(a.buf[p]);
    const size_t n16 = a.bytes[p] / 16;
    const bool staging = a.prefetch == 3 && p > 0 && a.gap_ns;  // this block's share, its head in shared memory
    const Share sh = block_share(n16, staging ? size_t(kStageBytes / 16) : 0);
    if (p > 0) {
      grid_barrier(a.bar, target);  // step p - 1 done everywhere
      if (a.gap_ns) {
        if (a.prefetch == 1 || a.prefetch == 2)  // this thread's 128-byte lines of the next buffer (or its first half)
          for (size_t j = i0 * 8; j < (a.prefetch == 2 ? n16 / 2 : n16); j += stride * 8) prefetch_l2(buf + j);
        if (staging) stage_head(stage, buf, sh);
        if (blockIdx.x == 0 && threadIdx.x == 0) wait_ns(a.gap_ns);
        grid_barrier(a.bar, target);  // the latency-bound step's result
      }
    }
    if (staging) {
      acc ^= xor_share(stage, buf, sh);
      __syncthreads();  // the stage is refilled in the next step
    } else {
      acc ^= xor_stream(buf, n16, i0, stride);
    }
  }
  if (acc == 0x12345678u) *a.sink = acc;  // practically never: keeps the loads alive
  // The last block out leaves the counters zero for the next launch (every block has passed every barrier).
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(a.bar + 1, 1u) == gridDim.x - 1) a.bar[0] = 0, a.bar[1] = 0, __threadfence();
  }
}

__global__ void spin_kernel(unsigned ns) { wait_ns(ns); }

// The launch-per-step twins under programmatic dependent launch: the step waits for the previous read, lets the next
// read launch, then spins; the read (one block of 1024 threads per SM) copies the first `stage` bytes of its block's
// contiguous share into shared memory before its wait (weights: nothing the previous kernels write), then reads them
// from there and the rest of its share from global memory.
__global__ void spin_pdl_kernel(unsigned ns) {
  pdl_begin();
  wait_ns(ns);
}
__global__ void __launch_bounds__(kPhaseThreads, 1) staged_read_kernel(const uint4* __restrict__ buf, size_t n16, size_t stage16,
                                                                        unsigned* sink) {
  extern __shared__ __align__(16) uint4 stage[];
  const Share sh = block_share(n16, stage16);
  stage_head(stage, buf, sh);
  pdl_begin();
  const uint32_t acc = xor_share(stage, buf, sh);
  if (acc == 0x12345678u) *sink = acc;  // practically never: keeps the loads alive
}

// Lets `kern` use the stage's shared memory (once per process: the attribute is per kernel).
template <class K>
void allow_stage(K kern, bool& done) {
  if (done) return;
  PLUMB_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, kStageBytes));
  done = true;
}

}  // namespace

void phase_stream(const PhaseArgs& a, Stream s) {
  if (a.phases < 1 || a.phases > kMaxPhases || !a.bar || !a.sink) throw_arg("phase_stream: 1..8 phases, a barrier and a sink");
  if (a.prefetch < 0 || a.prefetch > 3) throw_arg("phase_stream: prefetch is 0 (none), 1 or 2 (L2) or 3 (shared memory)");
  for (int p = 0; p < a.phases; ++p)
    if (!a.buf[p] || a.bytes[p] % 16) throw_arg("phase_stream: every buffer non-null, a multiple of 16 bytes");
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(sm_count())), cfg.blockDim = dim3(kPhaseThreads), cfg.stream = stream_of(s);
  cfg.dynamicSmemBytes = a.prefetch == 3 ? kStageBytes : 0;
  static bool raised = false;
  if (a.prefetch == 3) allow_stage(phase_kernel, raised);
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeCooperative, at[0].val.cooperative = 1;  // every block resident: the barriers
  cfg.attrs = at, cfg.numAttrs = 1;
  PLUMB_CUDA_CHECK(cudaLaunchKernelEx(&cfg, phase_kernel, a));
  check_launch("phase_kernel");
}

void spin(unsigned ns, Stream s) {
  spin_kernel<<<1, 1, 0, stream_of(s)>>>(ns);
  check_launch("spin_kernel");
}

void spin_pdl(unsigned ns, Stream s) { launch_as(true, "spin_pdl_kernel", spin_pdl_kernel, dim3(1), dim3(1), 0, s, ns); }

void staged_read(const void* p, size_t bytes, size_t stage_bytes, unsigned* sink, Stream s) {
  if (bytes % 16 || stage_bytes % 16 || stage_bytes > size_t(kStageBytes)) throw_arg("staged_read: multiples of 16, at most 200 KB staged");
  static bool raised = false;
  allow_stage(staged_read_kernel, raised);
  launch_as(true, "staged_read_kernel", staged_read_kernel, dim3(unsigned(sm_count())), dim3(kPhaseThreads), size_t(kStageBytes), s,
            static_cast<const uint4*>(p), bytes / 16, stage_bytes / 16, sink);
}

}  // namespace plumb::cuda::detail
