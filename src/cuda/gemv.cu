// Decode GEMV/GEMM on the tensor cores for weights kept in their checkpoint formats: MXFP4 routed experts
// (E2M1 + E8M0 per 32) and FP8 block-scaled projections (E4M3 + 128x128 E8M0/F32). Weights are dequantized to
// f16 in registers (exact), activations arrive as f16, products accumulate in fp32 by mma.m16n8k16, and the
// block scales are applied to the fp32 partial sums (one scale per 16-wide MMA pair for FP4, per 128-chunk for FP8).
// Plain bf16 weights (the compressors' projections, cuda.bf16_gemv) take bf16 activations and the bf16 MMA, no
// scales, accumulating in the MMA's fp32 accumulators. The official numerics' paths (kFp4A8, kFp8A8) take E4M3
// activations with a scale per 128-chunk (act_quant_e4m3) and the E4M3 MMA (mma.m16n8k32): FP4 codes become E4M3
// by bit placement (the A8 layout), FP8 codes go in as stored; bf16 outputs (GemvArgs::round_bf16).
//
// Work split. A warp owns a 16-row tile of one (or two: gate and up) matrices and a contiguous range of 128-wide
// K chunks; the warps of a block split K and reduce through shared memory; the block's grid row is a problem (an
// expert, a group) and its grid depth an optional split of K across blocks (dense only, reduced in a fixed order
// by the last block to finish). Up to 8 tokens ride in the MMA's N dimension; more go in passes, except that FP8
// (W8A16) and BF16 dense launches take NP groups of 8 tokens per pass (up to 32): each weight fragment is loaded
// (and converted) once and feeds NP MMAs, where passes of 8 streamed the whole matrix again for every 8 tokens. A
// group's accumulator sees the same MMAs on the same operands in the same order as its own pass did: the same bits.
//
// MoE FP4 decode has two kernels: this file's per-tile kernel (below) and the streaming kernel (gemv_fp4s.cuh:
// persistent warps, cp.async rings in shared memory); launch_gemv picks one (GemvArgs::fp4_kernel). FP8 dense
// launches above 8 tokens may take the shared-activation kernel instead (gemv_xs.cuh, GemvArgs::shared_x: a block's
// warps each a tile of their own, the activations staged once per block in shared memory; the same bits as this
// kernel with one warp per block).
//
// MoE decode (per-tile kernel): the grid's row is a (token, choice) slot; a block whose slot is not the first to
// name its expert exits at once, the first one gathers every slot that chose the expert, so each active expert's
// weights stream from memory once per launch, for all the tokens that chose it.
//
// Fragment mapping (PTX mma.m16n8k16 f16): lane (g = lane/4, t = lane%4) holds A rows g and g+8 at k-slots
// {2t, 2t+1, 2t+8, 2t+9} and B column g at the same k-slots. Any assignment of real K indices to k-slots that
// A and B share gives the same dot product, so each lane takes K elements that are contiguous in memory:
//   FP8: chunk c, lane t: elements [128c + 32t, +32) of its rows (two 16-byte loads), 8 MMAs per chunk;
//   BF16: the same elements (four 16-byte loads), MMA i taking elements 4i .. 4i + 3 of them (words 2i, 2i + 1);
//   FP4: chunk c, lane t: 8 elements of each of the 4 groups of the chunk (one 16-byte load in the decode layout,
//        see repack_fp4_decode: tile-major, so a warp's loads of one chunk and row half are 512 contiguous
//        bytes), 2 MMAs per group (elements 0..3 of each lane, then 4..7), so that every MMA stays inside one
//        scale group. The codes become f16 by bit placement (value * 2^-14, exact: fp4::to_f16x2).
#include <algorithm>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/hc_fold.cuh"
#include "cuda/kernels.h"
#include "cuda/launch.cuh"
#include "cuda/route_warp.cuh"

namespace plumb::cuda::detail {

namespace {

constexpr int kMaxWarps = 8;
constexpr int kMaxSlots = 1024;

__device__ __forceinline__ uint4 load_x8(const __half* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
// Activations that a launch may request after its PDL wait with their addresses known before it (pdl_early, FP8
// dense under PDL): a plain load, which stays after the wait (pdl_begin's memory clobber); __ldg's load is marked
// invariant and was hoisted above the wait (wrong results under test).
template <bool PLAIN>
__device__ __forceinline__ uint4 load_act8(const __half* p) {
  if constexpr (PLAIN) return *reinterpret_cast<const uint4*>(p);
  else return load_x8(p);
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;  // i is a compile-time constant after unrolling
}

template <int J>
__device__ __forceinline__ float scale_of(uint32_t w) {
  return e8m0_byte<J>(w);
}
// Group j's (a compile-time constant after unrolling) scale of a word of 4 E8M0 bytes.
__device__ __forceinline__ float scale_by_group(uint32_t w, int j) {
  return j == 0 ? scale_of<0>(w) : j == 1 ? scale_of<1>(w) : j == 2 ? scale_of<2>(w) : scale_of<3>(w);
}

// The output of one (row, slot): kSwiglu: silu(min(gate, L)) * clamp(up, -L, L) (no clamp for L +inf), times the
// slot's routing weight when a.pre_weight is set; kStore: gate * out_scale. Shared by both GEMV kernels.
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

// FP8 (W8A16) weights of chunks c .. c + UU - 1 for NMAT matrices: at lane (g, t), rows g (pa) and g + 8 (pb)'s 32
// bytes [32t, 32t + 32) of the chunk (two 16-byte loads each), and the chunk's block scale (E8M0 byte or F32 at
// ps[q]). Shared by both FP8 GEMV kernels (gemv_kernel, gemv_xs.cuh).
template <int UU, int NMAT>
__device__ __forceinline__ void load_fp8_chunks(const uint8_t* const (&pa)[NMAT], const uint8_t* const (&pb)[NMAT],
                                                const uint8_t* const (&ps)[NMAT], bool s_f32, int c, uint64_t wpol,
                                                uint4 (&A)[UU][NMAT][2], uint4 (&B)[UU][NMAT][2], float (&S)[UU][NMAT]) {
#pragma unroll
  for (int u = 0; u < UU; ++u)
#pragma unroll
    for (int q = 0; q < NMAT; ++q) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        A[u][q][h] = ldg_stream<1>(pa[q] + (c + u) * 128 + h * 16, wpol);
        B[u][q][h] = ldg_stream<1>(pb[q] + (c + u) * 128 + h * 16, wpol);
      }
      S[u][q] = s_f32 ? __ldg(reinterpret_cast<const float*>(ps[q]) + (c + u)) : e8m0_to_f32(__ldg(ps[q] + (c + u)));
    }
}

// Blocks along K (Z of them, this one z): lane `lane`'s N sums v go to slot z of `base` ([Z][N][32] floats), then
// the last of the Z to arrive (a counter it resets for the next launch) sums the Z slots in order from 0 into v.
// Returns whether this block was the last. Shared by both FP8 / FP4 GEMV kernels (gemv_kernel, gemv_xs.cuh).
template <int N>
__device__ __forceinline__ bool splitk_last(float (&v)[N], float* base, unsigned* counter, int Z, int z, int lane) {
#pragma unroll
  for (int i = 0; i < N; ++i) base[size_t(z) * (N * 32) + i * 32 + lane] = v[i];
  __threadfence();
  __syncwarp();
  unsigned prev = 0;
  if (lane == 0) prev = atomicAdd(counter, 1u);
  prev = __shfl_sync(0xFFFFFFFFu, prev, 0);
  const bool last = prev + 1 == unsigned(Z);
  if (last) {
    if (lane == 0) *counter = 0u;  // ready for the next launch
    __threadfence();
#pragma unroll
    for (int i = 0; i < N; ++i) {
      v[i] = 0.0f;
      for (int zz = 0; zz < Z; ++zz) v[i] += __ldcg(base + size_t(zz) * (N * 32) + i * 32 + lane);
    }
  }
  return last;
}

// MINB: the blocks per SM the register budget is cut for (0: see below; 1: up to 255 registers, every load of a step
// in flight; 2: <= 128; 3: <= 85 registers, more resident warps). `plumb bench` sweeps them. (A software-pipelined
// FP4 variant, the next chunk's loads issued before this chunk's math, needed ~190 registers and lost 3-8 points on
// the H200.)
// U8: a single FP8 matrix's chunks in flight (GemvArgs::fp8_unroll). NP: groups of 8 tokens per pass (FP8 / BF16
// dense only).
// MINB 0 (MXFP4 per-tile launches of <= 4 warps with minblocks 1, see gemv_for): the full budget capped at 168
// registers (bounds of 4 warps x 3 blocks), which keeps 12 warps per SM: a batch-1 grid of 1536 one-warp blocks
// (down's default until session 29) fits one wave on 132 SMs. Uncapped, that down took 172 registers after session
// 28's decode change (11 warps per SM, two waves: 12.3 -> 15.2 us). The automatic choice now takes it for the W4A8
// gate/up at <= 8 slots.
constexpr int bound_threads(int minb) { return minb == 0 ? 128 : kMaxWarps * 32; }
constexpr int bound_blocks(int minb) { return minb == 0 ? 3 : minb; }
template <int FMT, int NMAT, int EPI, int MODE, class OT, int MINB, int U8 = 2, int NP = 1, bool ROUTE = false>
__global__ void __launch_bounds__(bound_threads(MINB), bound_blocks(MINB)) gemv_kernel(const GemvArgs a) {
  static_assert(NP == 1 || ((FMT == kFp8 || FMT == kBf16) && MODE == kDense), "gemv: token groups per pass are FP8 / BF16 dense only");
  // Chunks whose loads are issued before the first is used (MXFP4 at MINB 3, <= 85 registers: half as many, which
  // fit without spilling the loop; session 28: down at 8 tokens 72.0 -> 60.9 us with 4 -> 2).
  constexpr bool F4 = FMT == kFp4 || FMT == kFp4A8;  // MXFP4 weights (either bit layout)
  constexpr int U4 = MINB == 3 ? (NMAT == 2 ? 1 : 2) : (NMAT == 2 ? 2 : 4);  // MXFP4
  constexpr int U = F4 ? U4 : FMT == kBf16 ? (NP > 1 ? 1 : 2) : (NMAT == 2 ? 1 : U8);
  constexpr int NV = NMAT * 4;  // accumulators per lane and token group
  __shared__ float red[kMaxWarps][NV * NP][32];
  __shared__ int cols_s[MODE == kMoe ? kMaxSlots : 1];
  __shared__ int m_s;
  // cuda.hc_fold (kHcPart): fn's values at the tile's columns, the streams, gates and outputs (hc_fold.cuh).
  __shared__ std::conditional_t<EPI == kHcPart, HcFoldSmem, char> hcs;

  const int warps = int(blockDim.x >> 5);
  const int warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
  const int tile = int(blockIdx.x);
  const uint64_t wpol = weight_policy(a.l2_evict_first);  // cuda.l2_evict_first
  static_assert(EPI != kHcPart || (FMT == kFp8 && NMAT == 1 && MODE == kDense && NP == 1), "gemv: kHcPart is one FP8 matrix, dense");
  if constexpr (EPI == kHcPart) hc_fold_stage_fn(a.hc, tile, hcs, int(threadIdx.x), int(blockDim.x));  // (fn: a weight)
  // Programmatic dependent launch (a.pdl > 0, the launch sets the attribute, see launch.cuh): wait for the previous
  // kernel of the stream before touching memory it writes, and let the next one launch (it waits likewise). MoE
  // reads the routing first; dense blocks first request their first weight chunks (weights are never written during
  // a forward): FP8 into registers (pdl_early, body), the others into L2, so the stream from HBM starts while the
  // previous kernel finishes.
  // pdl_early, MoE (W4A16, PDL, no group table, pdl_early 1): the routing was written two or more launches back and
  // is complete once the previous kernel's blocks have passed their own wait (which is before they let this launch
  // start), so a block reads it from L2 (no stale L1 line) and requests its first chunks' weights before waiting
  // (body, below). FP8 dense under PDL (pdl_early -1 or 1): each warp issues its first step's weight loads (into
  // registers) before it waits for the previous kernel (body; a warp without chunks waits after the loop). The other
  // dense formats, and FP8 with pdl_early 0, prefetch their first chunks into L2 instead. (kEarlyKind: the
  // instantiations that may run an early path load their activations plainly: load_act8.)
  constexpr bool kEarlyMoe = FMT == kFp4 && MODE == kMoe && NMAT == 1, kEarlyDense = FMT == kFp8 && MODE == kDense;
  constexpr bool kEarlyKind = kEarlyMoe || kEarlyDense;
  const bool early = kEarlyMoe && a.pdl_early > 0 && !a.groups && a.pdl > 0;
  const bool early_dense = kEarlyDense && a.pdl > 0 && a.pdl_early != 0;
  // cuda.topk_in_experts (GemvArgs::route, gate/up; an instantiation of its own, ROUTE, so that the others keep
  // their code and registers): warp 0 ranks the gate's logits (below) and waits inside, after requesting the bias.
  static_assert(!ROUTE || (FMT == kFp4 && MODE == kMoe && MINB == 3 && NMAT == 2 && NP == 1), "gemv: ROUTE is gate/up's at <= 8 slots");
  const bool routed_here = ROUTE && a.route_variant > 0;
  // Block (0, 0) of such a launch stores the routing and lets the next kernel launch only after that (below): its
  // other warps wait without letting it (a block lets it at its first thread's trigger).
  const bool route_writer = routed_here && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0;
  if (MODE == kMoe && a.pdl > 0 && !early && !(routed_here && warp == 0)) route_writer ? pdl_wait() : pdl_begin();

  int prob, m;
  if constexpr (MODE == kMoe) {
    if (a.groups) {  // block y: tile y of launch_moe_group's table (an expert and up to kGroupTokens of its slots)
      __shared__ int e_s;
      if (warp == 0) {
        const int y = int(blockIdx.y);
        int cnt = 0, e = -1, p0 = 0;
        if (y < a.groups[0]) {
          e = a.groups[a.g_tiles + 2 * y], p0 = a.groups[a.g_tiles + 2 * y + 1];
          cnt = min(kGroupTokens, a.groups[a.g_offs + e + 1] - p0);
        }
        for (int i = lane; i < cnt; i += 32) cols_s[i] = a.groups[a.g_list + p0 + i];
        if (lane == 0) m_s = cnt, e_s = e;
      }
      __syncthreads();
      if (m_s <= 0 || e_s < 0 || e_s >= a.problems) return;  // past the table's tiles
      prob = e_s;
      m = m_s;
    } else if (routed_here) {
      if constexpr (ROUTE) {
        // One token: slot y is choice y; the block serves its expert's slots (those the scan below would find), and
        // exits unless y is the first of them. Block (0, 0) stores the routing (idx and the weights for down and the
        // combine, the selection scores for the taps), fences, and only then lets the next kernel launch: down reads
        // idx before its own wait (pdl_early), as after the router's launch. (That read relies on the fence: the
        // stores are performed at the device's scope before the trigger, so before down's first instruction; PDL
        // itself promises visibility only after the wait.) Warp 0's shared floats (the ranking's) are red's, which
        // the block uses only at its end.
        static_assert(sizeof(red) / 4 >= route_warp_smem_floats(32 * 8), "gemv: red holds the routing's shared floats");
        __shared__ int e_s;
        const int slot = int(blockIdx.y);
        if (warp == 0) {
          const RouteChoice ch = route_token_warp_v(a.route_variant, a.route, 0, lane, &red[0][0][0], route_writer, [&] {
            if (a.pdl > 0) route_writer ? pdl_wait() : pdl_begin();
          });
          if (route_writer) __threadfence(), pdl_trigger();
          const int e = __shfl_sync(0xFFFFFFFFu, ch.idx, slot);
          const bool match = lane < a.topk && ch.idx == e;
          const unsigned mask = __ballot_sync(0xFFFFFFFFu, match);
          if (match) cols_s[__popc(mask & ((1u << lane) - 1u))] = lane;
          if (lane == 0) m_s = __popc(mask), e_s = e;
        }
        __syncthreads();
        if (cols_s[0] != slot || e_s < 0 || e_s >= a.problems) return;  // another block serves this expert
        prob = e_s;
        m = m_s;
      }
    } else {
      const int slot = int(blockIdx.y), nslots = a.n * a.topk;
      const int e = early ? __ldcg(a.idx + slot) : a.idx[slot];
      if (warp == 0) {
        int cnt = 0;
        for (int base = 0; base < nslots; base += 32) {
          const int s = base + lane;
          const bool match = s < nslots && (early ? __ldcg(a.idx + s) : a.idx[s]) == e;
          const unsigned mask = __ballot_sync(0xFFFFFFFFu, match);
          if (match) cols_s[cnt + __popc(mask & ((1u << lane) - 1u))] = s;
          cnt += __popc(mask);
        }
        if (lane == 0) m_s = cnt;
      }
      __syncthreads();
      if (cols_s[0] != slot || e < 0 || e >= a.problems) return;  // another block serves this expert
      prob = e;
      m = m_s;
    }
  } else {
    prob = int(blockIdx.y);
    m = a.n;
  }
  // This block's matrices, output and output strides (a BF16 table launch: matrix blockIdx.y of the table).
  const uint8_t* wsel[NMAT];
#pragma unroll
  for (int q = 0; q < NMAT; ++q) wsel[q] = a.w[q] + int64_t(prob) * a.w_prob_stride;
  void* out = a.out;
  int64_t o_tok = a.o_tok_stride, o_prob = a.o_prob_stride;
  if constexpr (FMT == kBf16 && MODE == kDense) {
    if (a.ntab) {
      if (int64_t(tile) * 16 >= a.tab_rows[prob]) return;  // past this matrix's rows (the whole block: no barrier yet)
      wsel[0] = static_cast<const uint8_t*>(a.tab_w[prob]);
      out = a.tab_out[prob], o_tok = a.tab_ld[prob], o_prob = 0;
    }
  }

  // This warp's K chunks and per-lane base pointers at its first chunk.
  const int total = int(a.cols / 128);
  const int wtot = int(gridDim.z) * warps, wi = int(blockIdx.z) * warps + warp;
  const int cb = int(int64_t(total) * wi / wtot), ce = int(int64_t(total) * (wi + 1) / wtot), nch = ce - cb;
  const int64_t row_a = int64_t(tile) * 16 + g, row_b = row_a + 8;
  // Bytes from one 128-column chunk to the next: FP8 / BF16 row-major rows; FP4 tile-major decode layout (a 16-row
  // tile is contiguous, [chunk][row half][lane][16 B], see repack_fp4_decode).
  constexpr int CB = F4 ? 1024 : FMT == kBf16 ? 256 : 128;
  const uint8_t* pa[NMAT];
  const uint8_t* pb[NMAT];
  const uint8_t* ps[NMAT][2];
#pragma unroll
  for (int q = 0; q < NMAT; ++q) {
    if constexpr (F4) {
      pa[q] = wsel[q] + int64_t(tile) * 8 * a.cols + int64_t(cb) * CB + lane * 16;
      pb[q] = pa[q] + 512;
    } else {
      constexpr int EB = FMT == kBf16 ? 2 : 1;  // bytes per weight
      const uint8_t* base = wsel[q] + int64_t(cb) * CB + t * 32 * EB;
      pa[q] = base + row_a * a.cols * EB;
      pb[q] = base + row_b * a.cols * EB;
    }
    const uint8_t* sbase = static_cast<const uint8_t*>(a.s[q]) + int64_t(prob) * a.s_prob_stride;
    if constexpr (FMT == kBf16) {
      ps[q][0] = ps[q][1] = nullptr;
    } else if constexpr (F4) {
      ps[q][0] = sbase + row_a * a.s_ld + int64_t(cb) * 4;
      ps[q][1] = sbase + row_b * a.s_ld + int64_t(cb) * 4;
    } else {
      ps[q][0] = ps[q][1] = sbase + ((int64_t(tile) * 16 / 128) * a.s_ld + cb) * (a.s_f32 ? 4 : 1);
    }
  }
  if constexpr (MODE == kDense) {
    if (a.pdl > 0 && !early_dense) {
      if (FMT == kFp8 && t == 0)  // lanes t = 0 of a row cover its 128-byte chunk
#pragma unroll
        for (int q = 0; q < NMAT; ++q)
          for (int c = 0; c < min(nch, U); ++c) prefetch_l2(pa[q] + c * CB), prefetch_l2(pb[q] + c * CB);
      pdl_begin();
    }
  }

  for (int p0 = 0; p0 < m; p0 += 8 * NP) {
    const int mp = min(8 * NP, m - p0);  // token columns of this pass: group jg holds columns 8 jg .. 8 jg + 7
    // The activation row of pass column j (a token, or a MoE slot's row).
    auto xrow_of = [&](int j) -> int64_t {
      if constexpr (MODE == kMoe) {
        const int slot = cols_s[p0 + j];
        return a.x_by_token ? slot / a.topk : slot;
      } else {
        return int64_t(p0 + j);
      }
    };
    // Lane (g, t)'s activations: group jg's column g (xps[jg]; xp = xps[0] for the formats without groups).
    const __half* xps[NP];
    [[maybe_unused]] const uint8_t* xp8 = nullptr;
#pragma unroll
    for (int jg = 0; jg < NP; ++jg) {
      xps[jg] = nullptr;
      if (8 * jg + g < mp) {
        const int64_t xoff = xrow_of(8 * jg + g) * a.x_tok_stride + (MODE == kDense ? int64_t(prob) * a.x_prob_stride : 0) +
                             int64_t(cb) * 128 + (F4 ? t * 8 : t * 32);
        if constexpr (FMT == kFp4A8 || FMT == kFp8A8) xp8 = static_cast<const uint8_t*>(a.x) + xoff;
        else xps[jg] = static_cast<const __half*>(a.x) + xoff;
      }
    }
    const __half* xp = xps[0];
    // E4M3 activations: the scales of this lane's output columns 2t and 2t + 1, from this warp's first chunk.
    constexpr bool A8 = FMT == kFp4A8 || FMT == kFp8A8;
    [[maybe_unused]] const float* xsp[2] = {nullptr, nullptr};
    if constexpr (A8) {
#pragma unroll
      for (int cc = 0; cc < 2; ++cc)
        if (2 * t + cc < mp) xsp[cc] = a.x_scale + xrow_of(2 * t + cc) * a.xs_ld + cb;
    }
    float accg[NP][NMAT][4];
#pragma unroll
    for (int jg = 0; jg < NP; ++jg)
#pragma unroll
      for (int q = 0; q < NMAT; ++q) accg[jg][q][0] = accg[jg][q][1] = accg[jg][q][2] = accg[jg][q][3] = 0.0f;
    auto& acc = accg[0];  // the formats without token groups

    auto body = [&](auto uconst, int c, auto mp1) {
      constexpr int UU = decltype(uconst)::value;
      [[maybe_unused]] constexpr bool MP1 = decltype(mp1)::value;
      if constexpr (F4) {
        // The weights' codes and scale words; the activations: f16 (kFp4) or E4M3 codes with the scales of this
        // lane's output columns 2t, 2t + 1 (kFp4A8).
        uint4 A[UU][NMAT], B[UU][NMAT];
        uint32_t SA[UU][NMAT], SB[UU][NMAT];
        [[maybe_unused]] uint4 X[UU][4];
        [[maybe_unused]] uint2 X8[UU][4];
        [[maybe_unused]] float XS[UU][2];
#pragma unroll
        for (int u = 0; u < UU; ++u)
#pragma unroll
          for (int q = 0; q < NMAT; ++q) {
            A[u][q] = ldg_stream<1>(pa[q] + (c + u) * CB, wpol);
            B[u][q] = ldg_stream<1>(pb[q] + (c + u) * CB, wpol);
            SA[u][q] = __ldg(reinterpret_cast<const uint32_t*>(ps[q][0]) + (c + u));
            SB[u][q] = __ldg(reinterpret_cast<const uint32_t*>(ps[q][1]) + (c + u));
          }
        if (early && p0 == 0 && c == 0) pdl_begin();  // pdl_early: the activations are the previous kernel's output
#pragma unroll
        for (int u = 0; u < UU; ++u) {
          if constexpr (FMT == kFp4) {
#pragma unroll
            for (int j = 0; j < 4; ++j) X[u][j] = xp ? load_act8<kEarlyKind>(xp + (c + u) * 128 + j * 32) : make_uint4(0, 0, 0, 0);
          } else {
#pragma unroll
            for (int j = 0; j < 4; ++j)
              X8[u][j] = xp8 ? __ldg(reinterpret_cast<const uint2*>(xp8 + (c + u) * 128 + j * 32)) : make_uint2(0, 0);
#pragma unroll
            for (int cc = 0; cc < 2; ++cc) XS[u][cc] = xsp[cc] ? __ldg(xsp[cc] + c + u) : 0.0f;
          }
        }
        if constexpr (FMT == kFp4) {
#pragma unroll
          for (int u = 0; u < UU; ++u)
#pragma unroll
            for (int q = 0; q < NMAT; ++q) {
              float s0[4], s1[4];
              s0[0] = scale_of<0>(SA[u][q]), s0[1] = scale_of<1>(SA[u][q]), s0[2] = scale_of<2>(SA[u][q]), s0[3] = scale_of<3>(SA[u][q]);
              s1[0] = scale_of<0>(SB[u][q]), s1[1] = scale_of<1>(SB[u][q]), s1[2] = scale_of<2>(SB[u][q]), s1[3] = scale_of<3>(SB[u][q]);
#pragma unroll
              for (int j = 0; j < 4; ++j) fp4_group<MP1>(word(A[u][q], j), word(B[u][q], j), X[u][j], s0[j], s1[j], acc[q]);
            }
        } else {
          // Per chunk: each group's E4M3 MMA into a fresh partial, times the rows' E8M0 scales into the chunk's sum,
          // which the columns' activation scales (one per 128-chunk) multiply into acc.
#pragma unroll
          for (int u = 0; u < UU; ++u)
#pragma unroll
            for (int q = 0; q < NMAT; ++q) {
              float dc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
              for (int j = 0; j < 4; ++j) {
                uint32_t a0, a1, a2, a3;
                fp4x8_to_e4m3x4(word(A[u][q], j), a0, a2);
                fp4x8_to_e4m3x4(word(B[u][q], j), a1, a3);
                float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                mma_e4m3(d, a0, a1, a2, a3, X8[u][j].x, X8[u][j].y);
                const float sa = scale_by_group(SA[u][q], j), sb = scale_by_group(SB[u][q], j);
                dc[0] = fmaf(d[0], sa, dc[0]);
                if (!MP1) dc[1] = fmaf(d[1], sa, dc[1]);
                dc[2] = fmaf(d[2], sb, dc[2]);
                if (!MP1) dc[3] = fmaf(d[3], sb, dc[3]);
              }
              acc[q][0] = fmaf(dc[0], XS[u][0], acc[q][0]);
              if (!MP1) acc[q][1] = fmaf(dc[1], XS[u][1], acc[q][1]);
              acc[q][2] = fmaf(dc[2], XS[u][0], acc[q][2]);
              if (!MP1) acc[q][3] = fmaf(dc[3], XS[u][1], acc[q][3]);
            }
        }
      } else if constexpr (FMT == kFp8A8) {
        // The codes go to the E4M3 MMA as stored: 4 per 128-chunk (the lane's 32 elements, 8 per MMA) into a fresh
        // partial, then acc += partial * (activation scale * block scale), the official fp8_gemm's update.
        uint4 A[UU][2], B[UU][2], X[UU][2];
        float S[UU], XS[UU][2];
#pragma unroll
        for (int u = 0; u < UU; ++u) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            A[u][h] = ldg_stream<1>(pa[0] + (c + u) * 128 + h * 16, wpol);
            B[u][h] = ldg_stream<1>(pb[0] + (c + u) * 128 + h * 16, wpol);
            X[u][h] = xp8 ? __ldg(reinterpret_cast<const uint4*>(xp8 + (c + u) * 128 + h * 16)) : make_uint4(0, 0, 0, 0);
          }
          S[u] = a.s_f32 ? __ldg(reinterpret_cast<const float*>(ps[0][0]) + (c + u)) : e8m0_to_f32(__ldg(ps[0][0] + (c + u)));
#pragma unroll
          for (int cc = 0; cc < 2; ++cc) XS[u][cc] = xsp[cc] ? __ldg(xsp[cc] + c + u) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < UU; ++u) {
          float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
          for (int i = 0; i < 4; ++i)
            mma_e4m3(d, word(A[u][i / 2], 2 * (i % 2)), word(B[u][i / 2], 2 * (i % 2)), word(A[u][i / 2], 2 * (i % 2) + 1),
                     word(B[u][i / 2], 2 * (i % 2) + 1), word(X[u][i / 2], 2 * (i % 2)), word(X[u][i / 2], 2 * (i % 2) + 1));
#pragma unroll
          for (int k = 0; k < 4; ++k) acc[0][k] = fmaf(d[k], __fmul_rn(XS[u][k & 1], S[u]), acc[0][k]);
        }
      } else if constexpr (FMT == kBf16) {
        uint4 A[UU][4], B[UU][4], X[UU][NP][4];
#pragma unroll
        for (int u = 0; u < UU; ++u) {
#pragma unroll
          for (int h = 0; h < 4; ++h) {
            A[u][h] = ldg_stream<1>(pa[0] + (c + u) * CB + h * 16, wpol);
            B[u][h] = ldg_stream<1>(pb[0] + (c + u) * CB + h * 16, wpol);
          }
#pragma unroll
          for (int jg = 0; jg < NP; ++jg)
#pragma unroll
            for (int j = 0; j < 4; ++j) X[u][jg][j] = xps[jg] ? load_x8(xps[jg] + (c + u) * 128 + j * 8) : make_uint4(0, 0, 0, 0);
        }
        // (Token groups: each weight fragment feeds every group's MMA, each group's accumulator in its own pass's order.)
#pragma unroll
        for (int u = 0; u < UU; ++u)
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const int w = (2 * i) % 4;
#pragma unroll
            for (int jg = 0; jg < NP; ++jg)
              mma_bf16(accg[jg][0], word(A[u][i / 2], w), word(B[u][i / 2], w), word(A[u][i / 2], w + 1), word(B[u][i / 2], w + 1),
                       word(X[u][jg][i / 2], w), word(X[u][jg][i / 2], w + 1));
          }
      } else {
        uint4 A[UU][NMAT][2], B[UU][NMAT][2], X[UU][NP][4];
        float S[UU][NMAT];
        const uint8_t* ps0[NMAT];
#pragma unroll
        for (int q = 0; q < NMAT; ++q) ps0[q] = ps[q][0];
        load_fp8_chunks<UU, NMAT>(pa, pb, ps0, a.s_f32, c, wpol, A, B, S);
        if (early_dense && p0 == 0 && c == 0) pdl_begin();  // the activations are the previous kernel's output
#pragma unroll
        for (int u = 0; u < UU; ++u) {
#pragma unroll
          for (int jg = 0; jg < NP; ++jg)
#pragma unroll
            for (int j = 0; j < 4; ++j)
              X[u][jg][j] = xps[jg] ? load_act8<kEarlyKind>(xps[jg] + (c + u) * 128 + j * 8) : make_uint4(0, 0, 0, 0);
        }
        // Each converted weight fragment feeds the MMA of every token group; group jg's partial d[jg] then enters
        // its accumulator as a pass of its own would (the same MMAs in the same order).
#pragma unroll
        for (int u = 0; u < UU; ++u)
#pragma unroll
          for (int q = 0; q < NMAT; ++q) {
            float d[NP][4];
#pragma unroll
            for (int jg = 0; jg < NP; ++jg) d[jg][0] = d[jg][1] = d[jg][2] = d[jg][3] = 0.0f;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
              uint32_t a0, a1, a2, a3;
              e4m3x4_to_f16x2(word(A[u][q][i / 4], i % 4), a0, a2);
              e4m3x4_to_f16x2(word(B[u][q][i / 4], i % 4), a1, a3);
#pragma unroll
              for (int jg = 0; jg < NP; ++jg)
                mma_f16(d[jg], a0, a1, a2, a3, word(X[u][jg][i / 2], (2 * i) % 4), word(X[u][jg][i / 2], (2 * i) % 4 + 1));
            }
#pragma unroll
            for (int jg = 0; jg < NP; ++jg)
#pragma unroll
              for (int k = 0; k < 4; ++k) accg[jg][q][k] = fmaf(d[jg][k], S[u][q], accg[jg][q][k]);
          }
      }
    };
    auto run = [&](auto mp1) {
      int c = 0;
      for (; c + U <= nch; c += U) body(std::integral_constant<int, U>{}, c, mp1);
      for (; c < nch; ++c) body(std::integral_constant<int, 1>{}, c, mp1);
    };
    if constexpr (F4) {
      if (mp == 1) run(std::true_type{});  // one token (decode at batch 1): see fp4_group
      else run(std::false_type{});
    } else {
      run(std::false_type{});
    }
    if ((early || early_dense) && nch == 0 && p0 == 0) pdl_begin();  // (a warp with no chunks waits here)
    if constexpr (EPI == kHcPart) {  // (past the wait: the streams and gates come from earlier launches)
      if (warp == 0) hc_fold_stage_x(a.hc, tile, hcs, lane);
      cp_wait<0>();  // every thread's copies, before the barrier below
    }

    // Reduce the block's K split (fixed order), then optionally across blocks.
#pragma unroll
    for (int jg = 0; jg < NP; ++jg)
#pragma unroll
      for (int q = 0; q < NMAT; ++q)
#pragma unroll
        for (int k = 0; k < 4; ++k) red[warp][jg * NV + q * 4 + k][lane] = accg[jg][q][k];
    __syncthreads();
    if (warp == 0) {
      float v[NV * NP];
#pragma unroll
      for (int i = 0; i < NV * NP; ++i) {
        v[i] = 0.0f;
        for (int w = 0; w < warps; ++w) v[i] += red[w][i][lane];
      }
      bool last = true;
      if (NP == 1 && a.kblocks > 1) {  // (launch_t runs token groups without a split of K across blocks)
        const size_t key = size_t(prob) * gridDim.x + tile;
        last = splitk_last(v, a.partial + key * size_t(a.kblocks) * (NV * NP * 32), a.counters + key, a.kblocks,
                           int(blockIdx.z), lane);
      }
      if (last) {
        // FP4 codes entered the MMA as value * 2^-14 (f16) or * 2^-6 (E4M3).
        const float wmul = FMT == kFp4 ? kFp4Unscale : FMT == kFp4A8 ? kFp4A8Unscale : 1.0f;
#pragma unroll
        for (int jg = 0; jg < NP; ++jg)
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
          const int j = 8 * jg + 2 * t + cc;  // the pass's token column
          if (j >= mp) continue;
          int64_t orow;
          int slot = 0;
          if constexpr (MODE == kMoe) {
            slot = cols_s[p0 + j];
            orow = int64_t(slot) * a.o_tok_stride;
          } else {
            orow = int64_t(p0 + j) * o_tok + int64_t(prob) * o_prob;
          }
          const float* vg = v + jg * NV;
#pragma unroll
          for (int rr = 0; rr < 2; ++rr) {
            const int64_t row = int64_t(tile) * 16 + g + 8 * rr;
            const float up = EPI == kSwiglu ? vg[4 + rr * 2 + cc] * wmul : 0.0f;
            const float o = epilogue<EPI>(a, vg[rr * 2 + cc] * wmul, up, slot);
            store_out<OT>(static_cast<OT*>(out) + orow + row, o);
            if constexpr (EPI == kHcPart) hcs.y[g + 8 * rr] = o;  // (one token: column 0)
          }
        }
        if constexpr (EPI == kHcPart) {
          __syncwarp();
          hc_fold_tile(a.hc, tile, hcs, lane);
        }
      }
    }
    __syncthreads();
  }
}

__global__ void combine_kernel(const float* __restrict__ ys, const float* __restrict__ w, int K, int64_t D, float out_scale,
                               const float* __restrict__ add, float* __restrict__ y) {
  pdl_begin();
  const int tok = int(blockIdx.y);
  const int64_t d = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (d >= D) return;
  // (moe_combine_cols rounds the scale and the add as separate operations: y is then the same bits as this combine
  // without `add` followed by fwd_add, and as hc_pre's fused hc_post that combines itself.)
  float s[4];
  moe_combine_cols<4>(ys, w, add, K, out_scale, D, tok, d, s);
  *reinterpret_cast<float4*>(y + int64_t(tok) * D + d) = make_float4(s[0], s[1], s[2], s[3]);
}

__global__ void to_f16_kernel(const void* __restrict__ x, int act, int64_t cols, int64_t ldx, int64_t total,
                              __half* __restrict__ out) {
  pdl_begin();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, k = i % cols;
    float v;
    if (act == kF32) v = static_cast<const float*>(x)[r * ldx + k];
    else if (act == kBF16) v = __bfloat162float(static_cast<const __nv_bfloat16*>(x)[r * ldx + k]);
    else v = __half2float(static_cast<const __half*>(x)[r * ldx + k]);
    out[i] = __float2half_rn(v);
  }
}

#include "cuda/gemv_fp4s.cuh"
#include "cuda/gemv_xs.cuh"

// The instantiation for a register budget (minblocks) and, for one FP8 matrix, chunks in flight (U8); MXFP4 with the
// full budget and <= 4 warps per block takes the 168-register cap (MINB 0, above).
template <int FMT, int NMAT, int EPI, int MODE, class OT, int U8>
auto gemv_for(int minblocks, int warps) {
  constexpr bool F4 = FMT == kFp4 || FMT == kFp4A8;
  if constexpr (EPI == kHcPart) {  // (one token: the full budget; the other budgets not instantiated)
    return gemv_kernel<FMT, NMAT, EPI, MODE, OT, 1, U8>;
  } else {
    if constexpr (F4)
      if (minblocks <= 1 && warps <= 4) return gemv_kernel<FMT, NMAT, EPI, MODE, OT, 0, U8>;
    return minblocks >= 3   ? gemv_kernel<FMT, NMAT, EPI, MODE, OT, 3, U8>
           : minblocks == 2 ? gemv_kernel<FMT, NMAT, EPI, MODE, OT, 2, U8>
                            : gemv_kernel<FMT, NMAT, EPI, MODE, OT, 1, U8>;
  }
}

template <int FMT, int NMAT, int EPI, int MODE, class OT>
void launch_t(const GemvArgs& a, Stream s) {
  const dim3 grid(unsigned(a.rows / 16), unsigned(MODE == kMoe ? (a.groups ? a.g_max_tiles : a.n * a.topk) : a.problems),
                  unsigned(a.kblocks));
  const dim3 block(unsigned(a.warps * 32));
  auto kern = gemv_for<FMT, NMAT, EPI, MODE, OT, 2>(a.minblocks, a.warps);
  if constexpr (FMT == kFp4 && NMAT == 2 && MODE == kMoe) {
    if (a.route_variant) {  // cuda.topk_in_experts (launch_gemv checked the rest)
      if (a.minblocks != 3) throw_arg("gemv: gate/up ranks the routing itself only in its <= 8-slot form (minblocks 3)");
      kern = gemv_kernel<FMT, NMAT, EPI, MODE, OT, 3, 2, 1, true>;
    }
  }
  if constexpr ((FMT == kFp8 || FMT == kFp8A8) && NMAT == 1)
    if (a.fp8_unroll == 4) kern = gemv_for<FMT, NMAT, EPI, MODE, OT, 4>(a.minblocks, a.warps);
  if constexpr ((FMT == kFp8 || FMT == kBf16) && MODE == kDense && EPI != kHcPart) {
    // Token groups per pass (GemvArgs::token_groups; 0: enough for up to 32 tokens), with the full register budget,
    // 1 or 2 chunks in flight (FP8; BF16 takes 1), and no split of K across blocks (n > 8 has none).
    const int np = a.token_groups > 0 ? a.token_groups : a.n > 16 ? 4 : a.n > 8 ? 2 : 1;
    if (np != 1 && np != 2 && np != 4) throw_arg("gemv: token groups per pass must be 1, 2 or 4");
    if (np > 1 && (a.kblocks != 1 || a.minblocks != 1))
      throw_arg("gemv: token groups per pass take the full register budget (minblocks 1) and no split of K across blocks");
    constexpr int U2 = NMAT == 1 && FMT == kFp8 ? 2 : 1;  // (two FP8 matrices, or BF16, take one chunk per step)
    const bool u1 = a.fp8_unroll == 1;
    if (np == 2) kern = u1 ? gemv_kernel<FMT, NMAT, EPI, MODE, OT, 1, 1, 2> : gemv_kernel<FMT, NMAT, EPI, MODE, OT, 1, U2, 2>;
    if (np == 4) kern = u1 ? gemv_kernel<FMT, NMAT, EPI, MODE, OT, 1, 1, 4> : gemv_kernel<FMT, NMAT, EPI, MODE, OT, 1, U2, 4>;
  }
  launch_as(a.pdl > 0, "gemv_kernel", kern, grid, block, 0, s, a);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

int gemv_dense_warps(int64_t tiles, int64_t chunks) {
  int warps = 1;
  while (warps < 8 && tiles * warps < 2048) warps *= 2;
  return int(std::min<int64_t>(warps, chunks));
}

int gemv_xs_token_groups(int n) { return n > 32 ? 8 : n > 16 ? 4 : 2; }

size_t gemv_xs_smem(const GemvArgs& a) { return xs::smem_bytes(a, xs::token_groups_of(a)); }

GemvWorkspace gemv_workspace(const GemvArgs& a) {
  if (a.kblocks <= 1) return {};
  // Per (problem, tile) key: kblocks partial sums of nmat * 4 accumulators x 32 lanes per token group; the
  // shared-activation kernel keeps each pass's keys apart.
  size_t keys = size_t(a.problems) * size_t(a.rows / 16), groups = 1;
  if (a.shared_x) {
    groups = size_t(xs::token_groups_of(a));
    keys *= (size_t(std::max(a.n, 1)) + 8 * groups - 1) / (8 * groups);
  }
  return {keys * size_t(a.kblocks) * size_t(a.nmat) * 4 * 32 * groups, keys};
}

void launch_gemv(const GemvArgs& a0, Stream s) {
  GemvArgs a = a0;
  if (a.pdl < 0 && pdl_enabled()) a.pdl = 1;  // cuda.pdl: every GEMV of the forward
  if (evict_first_enabled()) a.l2_evict_first = 1;  // cuda.l2_evict_first
  if (a.rows <= 0 || a.rows % 16 || a.cols <= 0 || a.cols % 128)
    throw_arg("gemv: matrix rows must be a multiple of 16 and columns of 128, got [" + std::to_string(a.rows) + ", " +
              std::to_string(a.cols) + "]");
  if (a.warps < 1 || a.warps > kMaxWarps) throw_arg("gemv: warps per block must be 1..8");
  if (a.n <= 0 || weights_skipped()) return;  // (weights_skipped: bench --skeleton, kernels.h)
  const bool bf16 = a.fmt == kBf16;
  if (bf16 && (a.act != kBF16 || a.mode != kDense || a.nmat != 1 || a.epi != kStore || a.out_half))
    throw_arg("gemv: bf16 weights take bf16 activations, one dense matrix and an fp32 output");
  const bool a8 = a.fmt == kFp4A8 || a.fmt == kFp8A8;
  if (a.fmt == kFp4A8 && (a.act != kE4M3 || !a.x_scale || a.mode != kMoe || a.out_half || a.kblocks != 1))
    throw_arg("gemv: FP4 A8 weights take E4M3 activations with their scales, MoE mode, an fp32 output");
  if (a.fmt == kFp8A8 && (a.act != kE4M3 || !a.x_scale || a.mode != kDense || a.problems != 1 || a.nmat != 1 || a.epi != kStore ||
                          a.out_half || a.ntab))
    throw_arg("gemv: FP8 A8 takes E4M3 activations with their scales, one dense matrix, an fp32 output");
  if (!bf16 && !a8 && a.act != kF16) throw_arg("gemv: activations must be f16 (convert with launch_to_f16)");
  if (a.ntab) {
    if (!bf16 || a.ntab > kGemvTab || a.problems != a.ntab || a.kblocks != 1)
      throw_arg("gemv: a table launch takes 1.." + std::to_string(kGemvTab) + " bf16 matrices, one grid row each, no split-K");
    int64_t most = 0;
    for (int p = 0; p < a.ntab; ++p) {
      if (!a.tab_w[p] || !a.tab_out[p] || a.tab_rows[p] <= 0 || a.tab_rows[p] % 16 || a.tab_ld[p] < a.tab_rows[p])
        throw_arg("gemv: table matrix " + std::to_string(p) + ": null pointer, rows not a positive multiple of 16, or output stride below them");
      if (!aligned16(a.tab_w[p])) throw_arg("gemv: table matrix " + std::to_string(p) + ": weights not 16-byte aligned");
      most = std::max(most, a.tab_rows[p]);
    }
    if (most != a.rows) throw_arg("gemv: a table launch's rows must be its largest matrix's");
  } else if (!a.x || !a.out || !a.w[0] || (!bf16 && !a.s[0]) || (a.nmat == 2 && (!a.w[1] || !a.s[1]))) {
    throw_arg("gemv: null pointer argument");
  }
  if (!a.x) throw_arg("gemv: null activations");
  if (bf16 && !a.ntab && !aligned16(a.w[0])) throw_arg("gemv: bf16 weights must be 16-byte aligned");
  const int xb = a8 ? 1 : 2;  // bytes per activation
  if (!aligned16(a.x) || (a.x_tok_stride * xb) % 16 || (a.x_prob_stride * xb) % 16)
    throw_arg("gemv: activations must be 16-byte aligned, rows included");
  if (a.route_variant) {  // cuda.topk_in_experts: the per-tile W4A16 kernel at <= 8 slots (its MINB 3 instantiations)
    const RouteArgs& r = a.route;
    if (a.fmt != kFp4 || a.mode != kMoe || a.nmat != 2 || a.epi != kSwiglu || a.n != 1 || a.topk > 8 || a.groups ||
        a.fp4_kernel != 0 || a.kblocks != 1 || a.route_variant < 1 || a.route_variant > 5 || a.route_variant != route_warp_variant(r) ||
        r.n != 1 || r.E != a.problems || r.K != a.topk || !r.logits || !r.idx || !r.weight || (!r.hash && (!r.select || !r.bias)) ||
        (r.hash && (!r.tid2eid || !r.tokens)))
      throw_arg("gemv: gate/up ranks the gate's logits itself only for one token, <= 8 choices, <= 256 experts, the per-tile "
                "W4A16 kernel, with the router's buffers");
  } else if (a.mode == kMoe && (a.n * a.topk > kMaxSlots || !a.idx)) {
    throw_arg("gemv: moe needs idx and n * topk <= 1024");
  }
  if (a.shared_x) {
    if (a.fmt != kFp8 || a.mode != kDense || a.ntab)
      throw_arg("gemv: shared activations (shared_x) are for dense FP8 (W8A16) launches only");
    if (a.nmat == 1 && a.epi == kStore) return a.out_half ? launch_xs<1, kStore, __half>(a, s) : launch_xs<1, kStore, float>(a, s);
    if (a.nmat == 2 && a.epi == kSwiglu && a.out_half) return launch_xs<2, kSwiglu, __half>(a, s);
    throw_arg("gemv: shared activations run one matrix (store) or gate and up (SwiGLU, f16 output)");
  }
  if (a.kblocks > 1 && (a.mode != kDense || a.n > 8 || !a.partial || !a.counters))
    throw_arg("gemv: split-K across blocks needs dense mode, n <= 8 and a workspace");
  if (a.kblocks < 1) throw_arg("gemv: kblocks must be >= 1");
  // FP4 MoE, fp4_kernel 0 (auto): the per-tile kernel for gate/up at every batch (2 warps per block: each warp half
  // of K; 4 at <= 8 slots, below) and for down up to kDownTileSlots slots (1 warp per block: the whole K of a tile,
  // no block reduction; 2 at <= 8 slots, below); down with more slots the streaming kernel where the shape allows.
  // Register budgets: at <= 8 slots gate/up <= 85 (W4A16, 4 warps; W4A8 the full budget), down <= 85 (session 29);
  // above, gate/up <= 128 (16 warps per SM instead of 12), down <= 85 (session 28, below); programmatic dependent launch at
  // <= 8 slots and for down's per-tile launches. Earlier sessions' H200 sweeps (before session 28's changes),
  // `plumb bench --only moe` (% of copy, CUDA graph / single launch): gate/up batch 1 62.9 / 55.4 (streaming's best 52.6 / 47.0; 1 warp 49.2 / 44.6), batch 8
  // 85.7 / 82.7 (the full register budget 79.2 / 76.3); down (session 11, one run) batch 1 57.1 / 45.8 with 1 warp
  // (2 warps 51.1 / 41.8, streaming 47.0 / 38.8), batch 8 76.7 / 70.4 with 1 warp and 128 registers (streaming 72.2
  // / 67.2, 2 warps 68.4 / 64.0), batch 32 73.7 / 72.2 (streaming 73.1 / 70.6, 2 warps 63.1 / 61.7). Session 26, two
  // runs at batch 32 (192 slots): per-tile (1 warp, 128 registers, PDL) 75.1-75.2 % against 68.3-69.4 % for the
  // streaming launch as the default ran it, so down takes the per-tile kernel up to 256 slots (the streaming
  // kernel's own grouping's limit; above, with the group table, it stays on streaming).
  // With a group table (GemvArgs::groups, above 256 slots) the same choice: gate/up's per-tile blocks one per table
  // tile, down's streaming kernel reading its grouping from the table (either gives the bits it gives without one).
  // Down with more slots where the streaming kernel refuses the shape: the per-tile kernel as above (1 warp).
  // Session 28: down above 8 slots with registers capped at 85 (minblocks 3, 2 chunks in flight per warp instead
  // of 4: 24 one-warp blocks per SM), `plumb bench --only moe`, graph replay: 8 tokens 62.3 -> 58.9 us (75.2 ->
  // 79.6 % of copy), 32 tokens 188.0 with pdl_early against 196-197 for minblocks 2 without it (the default then).
  constexpr int kDownTileSlots = 256;
  const bool fp4_gate_up = a.fmt == kFp4 && a.mode == kMoe && a.nmat == 2 && a.epi == kSwiglu;
  const bool fp4_down = a.fmt == kFp4 && a.mode == kMoe && a.nmat == 1 && a.epi == kStore && !a.out_half;
  const int slots = a.n * a.topk;
  // The per-tile kernel's automatic configuration (fp4_kernel 0), for either bit layout: the block split and
  // register budget above, and PDL at <= 8 slots and for down's per-tile launches.
  // pdl_early (moe_down's launches allow it) wherever down runs the per-tile kernel. Session 27, minblocks 2, graph
  // replay, down at 1 / 8 / 32 tokens 12.35 -> 10.79 / 64.74 -> 64.18 / 204.8 -> 215.7 us (at 32 tokens the next
  // launch's early blocks competed with the previous launch's later waves; it was kept to <= 64 slots); with
  // minblocks 3 (session 28) 32 tokens gain too (above).
  // Down at <= 8 slots: 2 warps per block (each half of K) at minblocks 3 with pdl_early, chosen by session 29's
  // in-place rows (`plumb bench --only moe`, "moe routed total, down as ...": down between gate/up and the combine,
  // graph replay): batch 1 29.37-29.52 against 30.59 us for 1 warp at the full budget (alone 9.52 against 10.38 us,
  // 66.5 against 61.0 % of copy; the early rows had covered 1 warp only); at 8 tokens 1 warp stays ahead (170.3
  // against 173.4 us).
  // Gate/up (W4A16) at <= 8 slots: 4 warps per block at minblocks 3 (1 chunk of both matrices in flight per warp,
  // 3072 warps of <= 85 registers: one wave at 24 per SM) instead of 2 warps at the full budget: session 28, graph
  // replay at batch 1, 18.18-18.28 against 18.44-18.56 us (two rounds); the W4A8 kernel was slower so (20.2-20.8 ->
  // 21.1 us) and keeps 2 warps.
  auto per_tile_auto = [&](GemvArgs& b, bool down) {
    if (down) {
      b.warps = slots <= 8 ? 2 : 1, b.minblocks = 3;
    } else {
      const bool wide = slots <= 8 && b.fmt == kFp4;
      b.warps = wide ? 4 : 2, b.minblocks = wide ? 3 : slots <= 8 ? 1 : 2;
    }
    if (b.pdl < 0) b.pdl = slots <= 8 || (down && slots <= kDownTileSlots) ? 1 : 0;
    if (slots > kDownTileSlots || b.pdl_early < 0) b.pdl_early = 0;
  };
  if (a.fmt == kFp8A8) return launch_t<kFp8A8, 1, kStore, kDense, float>(a, s);
  if (a.fmt == kFp4A8) {  // the per-tile kernel (no streaming twin)
    const bool gate_up = a.nmat == 2 && a.epi == kSwiglu, down = a.nmat == 1 && a.epi == kStore;
    if (!gate_up && !down) throw_arg("gemv: FP4 A8 runs gate/up (2 matrices, SwiGLU) or down (1 matrix, store)");
    GemvArgs b = a;
    if (b.fp4_kernel == 0) per_tile_auto(b, down);
    if (down) return launch_t<kFp4A8, 1, kStore, kMoe, float>(b, s);
    return launch_t<kFp4A8, 2, kSwiglu, kMoe, float>(b, s);
  }
  if (a.fp4_kernel == 0 && (fp4_gate_up || (fp4_down && (slots <= kDownTileSlots || !fp4s::stream_ok(a))))) {
    GemvArgs b = a;
    per_tile_auto(b, fp4_down);
    if (b.nmat == 1) return launch_t<kFp4, 1, kStore, kMoe, float>(b, s);
    return b.out_half ? launch_t<kFp4, 2, kSwiglu, kMoe, __half>(b, s) : launch_t<kFp4, 2, kSwiglu, kMoe, float>(b, s);
  }
  if (fp4s::stream_ok(a)) {
    if (fp4_gate_up)
      return a.out_half ? fp4s::launch_stream<2, kSwiglu, __half>(a, s) : fp4s::launch_stream<2, kSwiglu, float>(a, s);
    if (fp4_down) return fp4s::launch_stream<1, kStore, float>(a, s);
  }
  if (fp4_gate_up)
    return a.out_half ? launch_t<kFp4, 2, kSwiglu, kMoe, __half>(a, s) : launch_t<kFp4, 2, kSwiglu, kMoe, float>(a, s);
  if (fp4_down) return launch_t<kFp4, 1, kStore, kMoe, float>(a, s);
  if (bf16) return launch_t<kBf16, 1, kStore, kDense, float>(a, s);
  if (a.fmt == kFp8 && a.nmat == 1 && a.epi == kStore && a.mode == kDense)
    return a.out_half ? launch_t<kFp8, 1, kStore, kDense, __half>(a, s) : launch_t<kFp8, 1, kStore, kDense, float>(a, s);
  if (a.epi == kHcPart) {  // cuda.hc_fold
    const HcPartArgs& h = a.hc;
    if (a.fmt != kFp8 || a.nmat != 1 || a.mode != kDense || a.n != 1 || a.problems != 1 || a.kblocks != 1 || a.minblocks != 1 ||
        a.out_half || a.o_tok_stride != a.rows || a.out_scale != 1.0f || a.round_bf16)
      throw_arg("gemv: the hc_pre partials' epilogue takes one FP8 matrix, one token, fp32 rows, the full register budget and no "
                "split of K across blocks");
    if (h.H != kHcFoldH || h.D != a.rows || h.D % 16 || !h.X_prev || !h.post || !h.comb || !h.X_out || !h.fn || !h.part)
      throw_arg("gemv: the hc_pre partials' epilogue needs hc_mult 4, D == the matrix's rows (a multiple of 16) and every buffer");
    for (const void* p : {static_cast<const void*>(h.X_prev), static_cast<const void*>(h.post), static_cast<const void*>(h.comb),
                          static_cast<const void*>(h.fn)})
      if (!aligned16(p)) throw_arg("gemv: the hc_pre partials' inputs must be 16-byte aligned");
    return launch_t<kFp8, 1, kHcPart, kDense, float>(a, s);
  }
  if (a.fmt == kFp8 && a.nmat == 2 && a.epi == kSwiglu && a.mode == kDense && a.out_half)
    return launch_t<kFp8, 2, kSwiglu, kDense, __half>(a, s);
  throw_arg("gemv: this combination of format, matrices, epilogue and mode is not instantiated");
}

void launch_combine(const float* ys, const float* weight, int n, int K, int64_t D, float out_scale, const float* add, float* y,
                    Stream s) {
  if (n <= 0) return;
  if (D % 4) throw_arg("combine: D must be a multiple of 4");
  const dim3 grid(unsigned((D / 4 + 255) / 256), unsigned(n));
  launch("combine_kernel", combine_kernel, grid, 256, 0, s, ys, weight, K, D, out_scale, add, y);
}

void launch_to_f16(const void* x, int act, int n, int64_t cols, int64_t ldx, uint16_t* out, Stream s) {
  const int64_t total = int64_t(n) * cols;
  if (total <= 0) return;
  const unsigned blocks = unsigned(std::min<int64_t>((total + 255) / 256, 1024));
  launch("to_f16_kernel", to_f16_kernel, blocks, 256, 0, s, x, act, cols, ldx, total, reinterpret_cast<__half*>(out));
}

}  // namespace plumb::cuda::detail
