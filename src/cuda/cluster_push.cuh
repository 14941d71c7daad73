// hc_pre's cluster reductions by push (sm_90 distributed shared memory): the mbarrier arming, the parity wait and the
// st.async push, shared by fwd_hc.cu and bench/synccheck_mbarrier_probe.cu (which reproduces their pattern).
#pragma once

#include <cstdint>

#include "cuda/common.cuh"

namespace plumb::cuda::detail {

// The cluster's reductions by push (sm_90 distributed shared memory). Each receiving block's mbarrier is initialized
// in the prologue expecting the bytes its inbox will get (one phase per launch), before a cluster barrier that every
// block passes before its first push; st.async stores a value into rank q's inbox and counts its bytes on rank q's
// mbarrier; the receiver's threads wait on their own mbarrier (acquire at cluster scope: the stores are then
// visible) and read the inbox in rank order. One one-way trip per reduction instead of a cluster barrier and a round
// trip of remote loads, and no barrier before exit: a block's inbox is written only while it waits for it.
__device__ __forceinline__ void hc_bar_init(uint64_t* bar, uint32_t bytes) {
  const uint32_t b = smem_u32(bar);
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(b) : "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(bytes) : "memory");
}
__device__ __forceinline__ void hc_bar_wait(uint64_t* bar) {
  const uint32_t b = smem_u32(bar);
  uint32_t done = 0;
  while (!done)
    asm volatile(
        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], 0;\n\tselp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(b)
        : "memory");
}
// v into rank q's copy of *dst (this block's shared-memory address of it), counted on rank q's copy of *bar.
__device__ __forceinline__ void hc_push(double* dst, uint64_t* bar, int q, double v) {
  uint32_t rd, rb;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rd) : "r"(smem_u32(dst)), "r"(q));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rb) : "r"(smem_u32(bar)), "r"(q));
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];" ::"r"(rd), "l"(__double_as_longlong(v)), "r"(rb)
               : "memory");
}

}  // namespace plumb::cuda::detail
