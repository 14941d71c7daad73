// Shared device helpers for the CUDA translation units: error checks, format conversions, the f16 tensor-core op.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "cuda/fp4_layout.h"
#include "model/act_math.h"

namespace plumb::cuda::detail {

[[noreturn]] inline void throw_cuda(cudaError_t e, const char* what, const char* file, int line) {
  char buf[512];
  std::snprintf(buf, sizeof buf, "CUDA error %s (%s) in %s at %s:%d", cudaGetErrorName(e), cudaGetErrorString(e), what, file,
                line);
  throw std::runtime_error(buf);
}
#define PLUMB_CUDA_CHECK(call)                                                          \
  do {                                                                                  \
    cudaError_t e_ = (call);                                                            \
    if (e_ != cudaSuccess) ::plumb::cuda::detail::throw_cuda(e_, #call, __FILE__, __LINE__); \
  } while (0)

[[noreturn]] inline void throw_arg(const std::string& msg) { throw std::runtime_error("plumb cuda: " + msg); }

// ---- conversions ----

// Two E4M3 codes (low byte -> low half) to f16x2. Exact: every E4M3 value (subnormals included) is an f16 normal.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint16_t v) {
  uint32_t d;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(d) : "h"(v));
  return d;
}
__device__ __forceinline__ void e4m3x4_to_f16x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
  lo = e4m3x2_to_f16x2(uint16_t(w & 0xFFFFu));
  hi = e4m3x2_to_f16x2(uint16_t(w >> 16));
}

// E8M0 scale bytes to fp32 (2^(b-127)): byte j of a word, two integer ops. The zero byte (2^-127) becomes 0 and
// 0xFF (NaN) becomes +inf: uploads refuse NaN scales, and a 2^-127 scale's products are below 6 * 2^-127 * |x|.
template <int J>
__device__ __forceinline__ float e8m0_byte(uint32_t w) {
  if constexpr (J == 3) return __uint_as_float((w >> 1) & 0x7F800000u);
  else return __uint_as_float((w << (23 - 8 * J)) & 0x7F800000u);
}
__device__ __forceinline__ float e8m0_to_f32(uint32_t b) { return __uint_as_float((b & 0xFFu) << 23); }

__device__ __forceinline__ uint32_t f32x2_to_f16x2(float a, float b) {
  const __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ __forceinline__ float bf16_bits_to_f32(uint32_t b16) { return __uint_as_float(b16 << 16); }
// Round to bf16 and back (round to nearest even): the official numerics' storage of activations.
__device__ __forceinline__ float bf16r(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// D = A(16x16, f16, row) * B(16x8, f16, col) + D, fp32 accumulate.
__device__ __forceinline__ void mma_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// D = A(16x16, bf16, row) * B(16x8, bf16, col) + D, fp32 accumulate (the fragments as mma_f16's).
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// ---- the fp64 tensor cores ----

// D = A * B + D, 16x8x8 (sm_90). Lane (g = lane / 4, r = lane % 4) holds A (g, r), (g + 8, r), (g, r + 4),
// (g + 8, r + 4) in a[0][0], a[0][1], a[1][0], a[1][1]; B (r, g), (r + 4, g) in b[0], b[1]; D (g, 2r), (g, 2r + 1),
// (g + 8, 2r), (g + 8, 2r + 1). (The split-K attention's products and the indexer's dmma scores.)
__device__ __forceinline__ void dmma_m16n8k8(double (&d)[4], const double (&a)[2][2], const double (&b)[2]) {
  asm("mma.sync.aligned.m16n8k8.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
      : "d"(a[0][0]), "d"(a[0][1]), "d"(a[1][0]), "d"(a[1][1]), "d"(b[0]), "d"(b[1]));
}
// C = A * B + C, 8x8x4 (sm_80): lane (g = lane / 4, q = lane % 4) holds A (g, q) and B (q, g), C (g, 2q), (g, 2q + 1).
// (fwd_linear's fp64 tensor-core kernel.)
__device__ __forceinline__ void dmma_m8n8k4(double (&c)[2], double a, double b) {
  asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1};" : "+d"(c[0]), "+d"(c[1]) : "d"(a), "d"(b));
}

// ---- the MoE combine ----

// y[0, W) = scale * sum_k w[t, k] * ys[t * K + k, d ..] (+ add[t, d ..]) for W (1 or 4, then 16-byte aligned)
// consecutive columns d of token t: fmaf in k order, then the scale and the add each rounded alone (no contraction,
// so it is also the combine without `add` followed by an add). The one arithmetic of launch_combine's kernel and of
// hc_pre's fused hc_post when the MoE combine is left to it (HcArgs::y_slots): the two give the same bits.
template <int W>
__device__ __forceinline__ void moe_combine_cols(const float* ys, const float* w, const float* add, int K, float scale, int64_t D,
                                                 int64_t t, int64_t d, float (&y)[W]) {
  static_assert(W == 1 || W == 4, "one column or a 16-byte group of four");
  auto load = [](const float* p, float (&v)[W]) {
    if constexpr (W == 4) {
      const float4 q = *reinterpret_cast<const float4*>(p);
      v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    } else {
      v[0] = *p;
    }
  };
#pragma unroll
  for (int i = 0; i < W; ++i) y[i] = 0.0f;
  float av[W] = {};
  if (add) load(add + t * D + d, av);
  // Up to kTogether slots (V4: 6 routed experts per token) every load is issued before the first product: a loop
  // with a runtime trip count waits for each slot's row before loading the next (the fused hc_post's phase took ~1.3
  // us longer after the MoE than after the attention in session 41's stamps). The same products in the same order.
  constexpr int kTogether = 8;
  if (K <= kTogether) {
    float wk[kTogether], v[kTogether][W];
#pragma unroll
    for (int k = 0; k < kTogether; ++k)
      if (k < K) wk[k] = w ? w[t * K + k] : 1.0f, load(ys + (t * K + k) * D + d, v[k]);
#pragma unroll
    for (int k = 0; k < kTogether; ++k)
      if (k < K) {
#pragma unroll
        for (int i = 0; i < W; ++i) y[i] = fmaf(wk[k], v[k][i], y[i]);
      }
  } else {
    for (int k = 0; k < K; ++k) {
      const float wk = w ? w[t * K + k] : 1.0f;
      float v[W];
      load(ys + (t * K + k) * D + d, v);
#pragma unroll
      for (int i = 0; i < W; ++i) y[i] = fmaf(wk, v[i], y[i]);
    }
  }
#pragma unroll
  for (int i = 0; i < W; ++i) y[i] = __fmul_rn(y[i], scale);
  if (add) {
#pragma unroll
    for (int i = 0; i < W; ++i) y[i] = __fadd_rn(y[i], av[i]);
  }
}

// 16-byte weight loads: read once, so keep them out of L1 (hint 1 also asks L2 to fetch 256-byte blocks).
template <int HINT>
__device__ __forceinline__ uint4 ldg_stream(const void* p) {
  uint4 v;
  if constexpr (HINT == 1) {
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  } else {
    asm("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  }
  return v;
}

// cuda.l2_evict_first: the L2 policy of a decode kernel's weight loads, created once per thread. Evict-first lets the
// weights (read once per step, ~230 MB per V4-Flash layer) pass through L2 without evicting what the latency-bound
// kernels between them reuse (their code, the residual streams, activations, caches); evict-normal is a plain load's.
__device__ __forceinline__ uint64_t weight_policy(bool evict_first) {
  uint64_t p;
  if (evict_first) asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  else asm("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(p));
  return p;
}
// ldg_stream with that policy (sm_90's ld takes `.L2::evict_first` itself only on 256-bit loads: hence the policy
// operand).
template <int HINT>
__device__ __forceinline__ uint4 ldg_stream(const void* p, uint64_t policy) {
  uint4 v;
  if constexpr (HINT == 1) {
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p), "l"(policy));
  } else {
    asm("ld.global.nc.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p), "l"(policy));
  }
  return v;
}

// ---- MXFP4 on the f16 tensor cores (the decode kernels, gemv.cu and gemv_fp4s.cuh, and the prefill kernels,
// moe_prefill.cu): codes in the decode layout (repack_fp4_decode), E8M0 scales per 32 ----

// FP4 values enter the MMA as value * 2^-14 (fp4::to_f16x2, fp4_layout.h); the fp32 results are scaled back once.
constexpr float kFp4Unscale = 16384.0f;

// The A fragments of one 32-column scale group of a 16-row tile, from words wa (row g) and wb (row g + 8) of the
// lane's fragments: f[0..3] for the group's first MMA (elements 0..3 of every lane), f[4..7] for the second
// (fp4::to_f16x2 gives a word's pairs (e0, e1), (e2, e3), (e4, e5), (e6, e7)).
__device__ __forceinline__ void fp4_frag(uint32_t wa, uint32_t wb, uint32_t (&f)[8]) {
  fp4::to_f16x2(wa, f[0], f[2], f[4], f[6]);
  fp4::to_f16x2(wb, f[1], f[3], f[5], f[7]);
}

// One scale group times the lane's 8 activations of the group for token column g (X): two MMAs into a fresh fp32
// partial sum, which the rows' scales (sa: row g, sb: row g + 8) multiply into acc (the B pairs (X.x, X.y) and
// (X.z, X.w) are adjacent registers: no moves). MP1: only token column 0 is live (lanes t = 0, d[0] and d[2]): the
// odd columns' FMAs are skipped.
template <bool MP1>
__device__ __forceinline__ void fp4_mma_group(const uint32_t (&f)[8], const uint4& X, float sa, float sb, float (&acc)[4]) {
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  mma_f16(d, f[0], f[1], f[2], f[3], X.x, X.y);
  mma_f16(d, f[4], f[5], f[6], f[7], X.z, X.w);
  acc[0] = fmaf(d[0], sa, acc[0]);
  if (!MP1) acc[1] = fmaf(d[1], sa, acc[1]);
  acc[2] = fmaf(d[2], sb, acc[2]);
  if (!MP1) acc[3] = fmaf(d[3], sb, acc[3]);
}

// Decode and multiply one group (the decode kernels: each group's words are used for one token tile).
template <bool MP1>
__device__ __forceinline__ void fp4_group(uint32_t wa, uint32_t wb, const uint4& X, float sa, float sb, float (&acc)[4]) {
  uint32_t f[8];
  fp4_frag(wa, wb, f);
  fp4_mma_group<MP1>(f, X, sa, sb, acc);
}

// ---- MXFP4 x E4M3 activations on the FP8 tensor cores (the official numerics: DeepSeek's fp4_gemm quantizes the
// activations to E4M3 per 128 and casts the FP4 weights to FP8 exactly): codes in the A8 layout
// (repack_fp4_decode with Fp4Layout::A8) ----

// FP4 values enter the FP8 MMA as value * 2^-6 (fp4x8_to_e4m3x4 below); the fp32 results are scaled back once.
constexpr float kFp4A8Unscale = 64.0f;

// Eight E2M1 codes of one 32-bit word of the A8 layout to two words of four E4M3 bytes, exactly, as value * 2^-6: a
// code s.e1.e0.m placed as the E4M3 bits s.00.e1.e0.m.00 is 2^(E-7) * (1 + m/2) for E = 2*e1 + e0 >= 1 and the
// subnormal m * 2^-7 for E = 0. Byte b of the word holds L = element b at bit 7 (sign) and bits 4..2 (already in
// place: one AND), and H = element 4 + b with its sign at bit 5, e1 at bit 6, e0 at bit 1 and m at bit 0 (two
// shifts, an AND and a three-input logic op). lo = elements 0..3, hi = elements 4..7, byte order = element order.
__device__ __forceinline__ void fp4x8_to_e4m3x4(uint32_t w, uint32_t& lo, uint32_t& hi) {
  lo = w & 0x9C9C9C9Cu;
  hi = ((w << 2) & 0x8C8C8C8Cu) | ((w >> 2) & 0x10101010u);
}

// D = A(16x32, E4M3, row) * B(32x8, E4M3, col) + D, fp32 accumulate. Lane (g, t): a0 / a2 row g at k-slots 4t..4t+3
// / 16+4t..16+4t+3, a1 / a3 the same for row g + 8; b0 / b1 column g at those k-slots.
__device__ __forceinline__ void mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// ---- expert epilogue ----

// One round (lane mask 16 >> ROUND) of a warp's reduce-scatter over C values per lane (C a power of two <= 32):
// while more than one value is held, the lower lane of each pair keeps the lower half and the upper lane the
// upper half, each adding its partner's copy; then plain butterfly rounds. After the 5 rounds lane l holds the
// warp's sum of value l >> (5 - log2 C). A fixed tree: deterministic (a + b == b + a exactly). Shared by the
// router's and hc_pre's fp64 partial sums.
template <int C, int ROUND = 0>
__device__ __forceinline__ void warp_reduce_scatter(double (&v)[C], int lane) {
  if constexpr (ROUND < 5) {
    constexpr int m = 16 >> ROUND, c = C >> ROUND;
    if constexpr (c > 1) {
      constexpr int h = c / 2;
      const bool upper = (lane & m) != 0;
#pragma unroll
      for (int i = 0; i < h; ++i) {
        const double send = upper ? v[i] : v[i + h];
        const double keep = upper ? v[i + h] : v[i];
        v[i] = keep + __shfl_xor_sync(0xFFFFFFFFu, send, m);
      }
    } else {
      v[0] += __shfl_xor_sync(0xFFFFFFFFu, v[0], m);
    }
    warp_reduce_scatter<C, ROUND + 1>(v, lane);
  }
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

// The experts' activation by ExpertAct's value (model/config.h: 0 SiLU, 1 GELU with erf, 2 GELU's tanh form, 3 ReLU),
// the CPU's formulas (model/act_math.h). Only the fp32 twin kernels (swiglu_kernel) take others than SiLU: the fused
// tensor-core epilogues pass the default 0, for which this is silu() and the switch compiles away.
__device__ __forceinline__ float expert_act(int act, float x) {
  switch (act) {
    case 1: return act_math::gelu(x);
    case 2: return act_math::gelu_tanh(x);
    case 3: return act_math::relu(x);
    default: return silu(x);
  }
}

// act(min(gate, L)) * min(max(up, -L), L) (gate: upper bound only; up: both sides, torch's order), no clamp for
// L = +inf (kSwigluNoClamp; every other L clamps, 0 and below too: transformers' semantics, swiglu_clamp_limit).
__device__ __forceinline__ float swiglu_clamped(float gate, float up, float limit, int act = 0) {
  if (limit != INFINITY) {
    gate = fminf(gate, limit);
    up = fminf(fmaxf(up, -limit), limit);
  }
  return expert_act(act, gate) * up;
}

template <class OT>
__device__ __forceinline__ void store_out(OT* p, float v);
template <>
__device__ __forceinline__ void store_out<float>(float* p, float v) { *p = v; }
template <>
__device__ __forceinline__ void store_out<__half>(__half* p, float v) { *p = __float2half_rn(v); }

// ---- bandwidth probes (bench) ----

// The XOR of this thread's 16-byte words of p[0, n16): words i0, i0 + stride, ..., four independent loads in flight
// (no L1 allocation). read_stream's kernel and the phase bench's streaming steps.
__device__ __forceinline__ uint32_t xor_stream(const uint4* __restrict__ p, size_t n16, size_t i0, size_t stride) {
  uint32_t acc = 0;
  size_t i = i0;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                   : "l"(p + i + u * stride));
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n16; i += stride) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  return acc;
}

// The GPU's global timer in ns (it advances in steps of ~0.26 us on the H200): launch.cuh's waits, the probes' stamps.
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// ---- cp.async (16 bytes, global to shared) ----

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void cp16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
// cp16 with an L2 cache policy (weight_policy: cuda.l2_evict_first).
__device__ __forceinline__ void cp16(uint32_t dst, const void* src, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "l"(policy) : "memory");
}
// valid false: writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void cp16_zfill(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
// 4 bytes (cached in L1 too: .cg takes only 16).
__device__ __forceinline__ void cp4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

}  // namespace plumb::cuda::detail
