// The decode GEMV's per-warp pieces for MXFP4 weights in the F16 decode layout, shared by the per-tile kernel
// (gemv.cu) and the fused routed-expert kernel (moe_fused.cu), so that both compute a tile with the same
// instructions in the same order (the fused kernel's results are the per-tile kernel's bits).
#pragma once

#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace plumb::cuda::detail {

// The output of one (row, slot): kSwiglu: silu(min(gate, L)) * clamp(up, -L, L) (no clamp for L <= 0), times the
// slot's routing weight when a.pre_weight is set; kStore: gate * out_scale. Shared by the GEMV kernels.
// a.round_bf16 (the official numerics): gate and up rounded to bf16 as the official linear stores them, the result
// too (fwd_swiglu then the activation rounding; the linear's bf16 output).
template <int EPI>
__device__ __forceinline__ float epilogue(const GemvArgs& a, float r, float up, int slot) {
  if constexpr (EPI == kSwiglu) {
    if (a.round_bf16) r = bf16r(r), up = bf16r(up);
    r = swiglu_clamped(r, up, a.limit);
    if (a.pre_weight) r *= a.pre_weight[slot];
  } else {
    r *= a.out_scale;
  }
  return a.round_bf16 ? bf16r(r) : r;
}

// Where a warp's operands come from. Weights (codes: 16 bytes a lane a chunk; scales: a 32-bit word of 4 E8M0 bytes)
// from global memory, streamed past L1, or from shared memory (the fused kernel's staged tiles); activations (8 f16)
// read-only for the launch (__ldg) or written earlier in the same launch (L2, coherent: the fused kernel's h).
struct WeightsGlobal {
  __device__ __forceinline__ uint4 codes(const uint8_t* p) const { return ldg_stream<1>(p); }
  __device__ __forceinline__ uint32_t scales(const uint8_t* p) const { return __ldg(reinterpret_cast<const uint32_t*>(p)); }
};
struct WeightsShared {
  __device__ __forceinline__ uint4 codes(const uint8_t* p) const {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(smem_u32(p)));
    return v;
  }
  __device__ __forceinline__ uint32_t scales(const uint8_t* p) const {
    uint32_t v;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(smem_u32(p)));
    return v;
  }
};
struct ActReadOnly {
  __device__ __forceinline__ uint4 operator()(const __half* p) const { return __ldg(reinterpret_cast<const uint4*>(p)); }
};
struct ActCoherent {
  __device__ __forceinline__ uint4 operator()(const __half* p) const { return __ldcg(reinterpret_cast<const uint4*>(p)); }
};

// UU consecutive 128-column chunks (from chunk c) of a warp's 16-row tile of NMAT MXFP4 matrices (F16 decode layout:
// pa / pb the lane's codes of rows g / g + 8 at the warp's first chunk, 1024 bytes a chunk; ps[q][0 / 1] those rows'
// scale words) times the activations at xp (null: zero columns), accumulated into acc: the loads of all UU chunks
// are issued before the first is used.
template <int UU, int NMAT, bool MP1, class W, class X>
__device__ __forceinline__ void fp4_chunks(const W& wl, const X& xl, const uint8_t* const (&pa)[NMAT], const uint8_t* const (&pb)[NMAT],
                                           const uint8_t* const (&ps)[NMAT][2], const __half* xp, int c, float (&acc)[NMAT][4]) {
  constexpr int CB = 1024;
  uint4 A[UU][NMAT], B[UU][NMAT], X8[UU][4];
  uint32_t SA[UU][NMAT], SB[UU][NMAT];
#pragma unroll
  for (int u = 0; u < UU; ++u) {
#pragma unroll
    for (int q = 0; q < NMAT; ++q) {
      A[u][q] = wl.codes(pa[q] + (c + u) * CB);
      B[u][q] = wl.codes(pb[q] + (c + u) * CB);
      SA[u][q] = wl.scales(ps[q][0] + (c + u) * 4);
      SB[u][q] = wl.scales(ps[q][1] + (c + u) * 4);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) X8[u][j] = xp ? xl(xp + (c + u) * 128 + j * 32) : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int u = 0; u < UU; ++u)
#pragma unroll
    for (int q = 0; q < NMAT; ++q) {
      float s0[4], s1[4];
      s0[0] = e8m0_byte<0>(SA[u][q]), s0[1] = e8m0_byte<1>(SA[u][q]), s0[2] = e8m0_byte<2>(SA[u][q]), s0[3] = e8m0_byte<3>(SA[u][q]);
      s1[0] = e8m0_byte<0>(SB[u][q]), s1[1] = e8m0_byte<1>(SB[u][q]), s1[2] = e8m0_byte<2>(SB[u][q]), s1[3] = e8m0_byte<3>(SB[u][q]);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t wa = j == 0 ? A[u][q].x : j == 1 ? A[u][q].y : j == 2 ? A[u][q].z : A[u][q].w;
        const uint32_t wb = j == 0 ? B[u][q].x : j == 1 ? B[u][q].y : j == 2 ? B[u][q].z : B[u][q].w;
        fp4_group<MP1>(wa, wb, X8[u][j], s0[j], s1[j], acc[q]);
      }
    }
}

// A warp's chunks [0, nch) in steps of U (then single chunks), as the per-tile kernel runs them.
template <int U, int NMAT, bool MP1, class W, class X>
__device__ __forceinline__ void fp4_tile(const W& wl, const X& xl, const uint8_t* const (&pa)[NMAT], const uint8_t* const (&pb)[NMAT],
                                         const uint8_t* const (&ps)[NMAT][2], const __half* xp, int nch, float (&acc)[NMAT][4]) {
  int c = 0;
  for (; c + U <= nch; c += U) fp4_chunks<U, NMAT, MP1>(wl, xl, pa, pb, ps, xp, c, acc);
  for (; c < nch; ++c) fp4_chunks<1, NMAT, MP1>(wl, xl, pa, pb, ps, xp, c, acc);
}

}  // namespace plumb::cuda::detail
