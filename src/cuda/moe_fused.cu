// MXFP4 routed experts at decode in one launch (cuda.moe_fused): gate/up + SwiGLU, then down, for up to
// kFusedMaxSlots (token, choice) slots, with the down weights streamed into shared memory while gate/up runs.
//
// Why: at batch 1 the two per-tile launches (gemv.cu) read gate/up's 53 MB at ~65 % of copy and down's 27 MB at
// ~55 %, and a launch that only reads down's bytes reaches 75 % (the launch's ramp and tail are a third of its
// time). Here every SM's block first starts bulk copies (TMA) of its share of the down weights into its shared
// memory (all of it at V4-Flash's sizes: 6 experts x 4.2 MB over 132 SMs is ~200 KB each), then streams its
// share of the gate/up tiles through registers; so down's bytes arrive during gate/up's stream and the launch
// reads the whole 80 MB at once. A down tile needs its expert's whole h: each gate/up tile adds one to its
// expert's device counter after storing its h rows, and a warp starts a down tile once that count is complete.
//
// Bits: each gate/up tile is computed by a pair of warps splitting K in halves and summed in the per-tile
// kernel's order (its 2-warp configuration), each down tile by one warp over all of K (its 1-warp
// configuration), with the same per-chunk code (gemv_fp4_tile.cuh): the outputs are the two launches' bits.
//
// Progress: blocks never wait before their gate/up share is done and stored, so a wait only ever depends on work
// that needs no waiting; blocks that are not yet resident (an SM busy with another stream's kernel) run once it
// frees. The last block to finish resets the counters (zero on entry, left zero).
#include <algorithm>
#include <mutex>

#include "cuda/common.cuh"
#include "cuda/gemv_fp4_tile.cuh"
#include "cuda/kernels.h"
#include "cuda/launch.cuh"

namespace plumb::cuda::detail {

namespace {

// ---- mbarrier and bulk copy (TMA, global to this block's shared memory) ----
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");  // the init, visible to the async proxy
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned phase) {
  unsigned done = 0;
  while (!done)
    asm volatile(
        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(phase)
        : "memory");
}
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void pair_sync(int pair) {  // the two warps of a gate/up pair (named barriers 1..8)
  asm volatile("bar.sync %0, 64;" ::"r"(1 + pair) : "memory");
}

template <int WARPS>
__global__ void __launch_bounds__(WARPS * 32, 1) moe_fused_kernel(const GemvArgs gu, const GemvArgs dn, unsigned* counters, int cap) {
  static_assert(WARPS % 2 == 0 && WARPS <= 16, "gate/up runs in pairs of warps, at most 8 named barriers");
  extern __shared__ __align__(128) uint8_t stage[];  // staged down tiles: cap x codes, then cap x scales
  __shared__ float red[WARPS / 2][8][32];            // a pair's second warp's partial sums
  __shared__ int ex_s[kFusedMaxSlots], cnt_s[kFusedMaxSlots], sl_s[kFusedMaxSlots][kFusedMaxSlots], ne_s;
  __shared__ __align__(8) uint64_t bar;
  const int warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
  pdl_begin();  // the routing and x come from the kernels before

  // The active experts in order of first appearance, each with its slots in slot order (the per-tile kernel's
  // columns); ids outside [0, problems) are left out, as there.
  if (threadIdx.x == 0) {
    int ne = 0;
    const int nslots = gu.n * gu.topk;
    for (int s = 0; s < nslots; ++s) {
      const int e = gu.idx[s];
      if (e < 0 || e >= gu.problems) continue;
      int j = 0;
      while (j < ne && ex_s[j] != e) ++j;
      if (j == ne) ex_s[ne] = e, cnt_s[ne] = 0, ++ne;
      sl_s[j][cnt_s[j]++] = s;
    }
    ne_s = ne;
  }
  __syncthreads();
  const int ne = ne_s, G = int(gridDim.x), b = int(blockIdx.x);

  // This block's down tiles: a contiguous range of the (expert, 16-row tile) list, its first `cap` staged.
  const int dt = int(dn.rows / 16);
  const int T = ne * dt, d0 = int(int64_t(T) * b / G), d1 = int(int64_t(T) * (b + 1) / G);
  const int nst = min(d1 - d0, cap);
  const int64_t tcode = 8 * dn.cols, tscale = 16 * dn.s_ld;  // bytes of one tile's codes (16 rows of cols / 2), scales
  uint8_t* scodes = stage;
  uint8_t* sscales = stage + int64_t(cap) * tcode;
  if (threadIdx.x == 0 && nst > 0) {
    mbar_init(&bar, 1);
    mbar_expect_tx(&bar, unsigned(nst * (tcode + tscale)));
    for (int k = 0; k < nst;) {  // one copy of codes and one of scales per run of tiles of one expert
      const int d = d0 + k, j = d / dt, tile = d % dt, run = min(nst - k, dt - tile);
      const int64_t e = ex_s[j];
      bulk_copy(scodes + k * tcode, dn.w[0] + e * dn.w_prob_stride + tile * tcode, unsigned(run * tcode), &bar);
      bulk_copy(sscales + k * tscale, static_cast<const uint8_t*>(dn.s[0]) + e * dn.s_prob_stride + tile * tscale,
                unsigned(run * tscale), &bar);
      k += run;
    }
  }
  __syncthreads();  // (the barrier's init before anyone waits on it)

  // ---- gate/up + SwiGLU: pair p of every block, block-major, takes tiles u = p, p + P, ... (P pairs in all) ----
  {
    const int gt = int(gu.rows / 16), U = ne * gt, pair = warp >> 1, half = warp & 1;
    const int P = G * (WARPS / 2);
    const int total = int(gu.cols / 128), cb = total * half / 2, nch = total * (half + 1) / 2 - cb;
    for (int u = pair * G + b; u < U; u += P) {
      const int j = u / gt, tile = u % gt, m = cnt_s[j];
      const int64_t e = ex_s[j];
      const int64_t row_a = int64_t(tile) * 16 + g, row_b = row_a + 8;
      const uint8_t* pa[2];
      const uint8_t* pb[2];
      const uint8_t* ps[2][2];
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        pa[q] = gu.w[q] + e * gu.w_prob_stride + int64_t(tile) * 8 * gu.cols + int64_t(cb) * 1024 + lane * 16;
        pb[q] = pa[q] + 512;
        const uint8_t* sb = static_cast<const uint8_t*>(gu.s[q]) + e * gu.s_prob_stride;
        ps[q][0] = sb + row_a * gu.s_ld + int64_t(cb) * 4;
        ps[q][1] = sb + row_b * gu.s_ld + int64_t(cb) * 4;
      }
      const __half* xp = g < m ? static_cast<const __half*>(gu.x) + int64_t(sl_s[j][g] / gu.topk) * gu.x_tok_stride +
                                     int64_t(cb) * 128 + t * 8
                               : nullptr;
      float acc[2][4] = {};
      if (m == 1) fp4_tile<2, 2, true>(WeightsGlobal{}, ActReadOnly{}, pa, pb, ps, xp, nch, acc);
      else fp4_tile<2, 2, false>(WeightsGlobal{}, ActReadOnly{}, pa, pb, ps, xp, nch, acc);
      if (half) {
#pragma unroll
        for (int i = 0; i < 8; ++i) red[pair][i][lane] = acc[i / 4][i % 4];
      }
      pair_sync(pair);
      if (!half) {
        float v[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = (0.0f + acc[i / 4][i % 4]) + red[pair][i][lane];  // the 2-warp block's sum
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
          const int jj = 2 * t + cc;
          if (jj >= m) continue;
          const int slot = sl_s[j][jj];
          __half* out = static_cast<__half*>(gu.out) + int64_t(slot) * gu.o_tok_stride;
#pragma unroll
          for (int rr = 0; rr < 2; ++rr)
            store_out<__half>(out + tile * 16 + g + 8 * rr,
                              epilogue<kSwiglu>(gu, v[rr * 2 + cc] * kFp4Unscale, v[4 + rr * 2 + cc] * kFp4Unscale, slot));
        }
        __threadfence();  // the h rows before the count that publishes them
        __syncwarp();
        if (lane == 0) atomicAdd(counters + j, 1u);
      }
      pair_sync(pair);  // red is free again
    }
  }

  // ---- down: warp w takes this block's tiles w, w + WARPS, ...; each waits for its expert's h ----
  {
    const int gt = int(gu.rows / 16), nch = int(dn.cols / 128);
    for (int k = warp; k < d1 - d0; k += WARPS) {
      const int d = d0 + k, j = d / dt, tile = d % dt, m = cnt_s[j];
      const int64_t e = ex_s[j];
      if (lane == 0)
        while (ld_acquire(counters + j) < unsigned(gt)) __nanosleep(64);
      __syncwarp();
      const bool staged = k < nst;
      const uint8_t* pa[1];
      const uint8_t* pb[1];
      const uint8_t* ps[1][2];
      if (staged) {
        mbar_wait(&bar, 0);
        pa[0] = scodes + k * tcode + lane * 16;
        ps[0][0] = sscales + k * tscale + g * dn.s_ld;
      } else {
        pa[0] = dn.w[0] + e * dn.w_prob_stride + tile * tcode + lane * 16;
        ps[0][0] = static_cast<const uint8_t*>(dn.s[0]) + e * dn.s_prob_stride + (int64_t(tile) * 16 + g) * dn.s_ld;
      }
      pb[0] = pa[0] + 512;
      ps[0][1] = ps[0][0] + 8 * dn.s_ld;
      const __half* xp = g < m ? static_cast<const __half*>(dn.x) + int64_t(sl_s[j][g]) * dn.x_tok_stride + t * 8 : nullptr;
      float acc[1][4] = {};
      if (staged) {
        if (m == 1) fp4_tile<4, 1, true>(WeightsShared{}, ActCoherent{}, pa, pb, ps, xp, nch, acc);
        else fp4_tile<4, 1, false>(WeightsShared{}, ActCoherent{}, pa, pb, ps, xp, nch, acc);
      } else {
        if (m == 1) fp4_tile<4, 1, true>(WeightsGlobal{}, ActCoherent{}, pa, pb, ps, xp, nch, acc);
        else fp4_tile<4, 1, false>(WeightsGlobal{}, ActCoherent{}, pa, pb, ps, xp, nch, acc);
      }
#pragma unroll
      for (int cc = 0; cc < 2; ++cc) {
        const int jj = 2 * t + cc;
        if (jj >= m) continue;
        const int slot = sl_s[j][jj];
        float* out = static_cast<float*>(dn.out) + int64_t(slot) * dn.o_tok_stride;
#pragma unroll
        for (int rr = 0; rr < 2; ++rr)
          out[tile * 16 + g + 8 * rr] = epilogue<kStore>(dn, (0.0f + acc[0][rr * 2 + cc]) * kFp4Unscale, 0.0f, slot);
      }
    }
  }

  // The last block out resets the counters for the next launch (every wait is over by then).
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(counters + kFusedMaxSlots, 1u) + 1 == unsigned(G)) {
      for (int j = 0; j <= kFusedMaxSlots; ++j) counters[j] = 0u;
      __threadfence();
    }
  }
}

template <int WARPS>
void launch_w(const GemvArgs& gu, const GemvArgs& dn, unsigned* counters, int cap, Stream s) {
  const int sms = sm_count();
  const int64_t tile_bytes = 8 * dn.cols + 16 * dn.s_ld;
  static int max_smem = [] {
    int dev = 0, v = 0;
    PLUMB_CUDA_CHECK(cudaGetDevice(&dev));
    PLUMB_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    cudaFuncAttributes fa{};
    PLUMB_CUDA_CHECK(cudaFuncGetAttributes(&fa, moe_fused_kernel<WARPS>));
    const int dyn = v - int(fa.sharedSizeBytes) - 1024;  // (1 KB kept for the runtime's reserved shared memory)
    PLUMB_CUDA_CHECK(cudaFuncSetAttribute(moe_fused_kernel<WARPS>, cudaFuncAttributeMaxDynamicSharedMemorySize, dyn));
    return dyn;
  }();
  // Tiles a block stages: its share at most (the slots' experts, at most one each), and what shared memory holds.
  const int64_t share = (int64_t(gu.n) * gu.topk * (dn.rows / 16) + sms - 1) / sms;
  const int fit = int(std::min<int64_t>(share, max_smem / tile_bytes));
  const int c = cap < 0 ? fit : std::min(cap, fit);
  launch_as(gu.pdl > 0, "moe_fused_kernel", moe_fused_kernel<WARPS>, dim3(unsigned(sms)), dim3(WARPS * 32),
            size_t(c) * size_t(tile_bytes), s, gu, dn, counters, c);
}

}  // namespace

bool moe_fused_fits(const GemvArgs& gu, const GemvArgs& dn) {
  return gu.fmt == kFp4 && dn.fmt == kFp4 && gu.mode == kMoe && dn.mode == kMoe && gu.nmat == 2 && dn.nmat == 1 &&
         gu.epi == kSwiglu && dn.epi == kStore && gu.out_half && !dn.out_half && gu.groups == nullptr &&
         dn.groups == nullptr && gu.n * gu.topk >= 1 && gu.n * gu.topk <= kFusedMaxSlots && gu.rows == dn.cols &&
         gu.rows % 16 == 0 && dn.rows % 16 == 0 && gu.cols % 256 == 0 && dn.cols % 128 == 0 && gu.kblocks == 1 &&
         dn.kblocks == 1 && !gu.round_bf16 && !dn.round_bf16;
}

void launch_moe_fused(const GemvArgs& gu, const GemvArgs& dn, unsigned* counters, int warps, int cap, Stream s) {
  if (!moe_fused_fits(gu, dn)) throw_arg("moe_fused: needs W4A16 gate/up (f16 h) and down, 1.." + std::to_string(kFusedMaxSlots) + " slots, no group table");
  if (!gu.idx || !gu.x || !dn.out || !gu.out || dn.x != gu.out || dn.idx != gu.idx) throw_arg("moe_fused: down must read gate/up's h for the same routing");
  if (warps == 12) return launch_w<12>(gu, dn, counters, cap, s);
  if (warps == 8) return launch_w<8>(gu, dn, counters, cap, s);
  return launch_w<16>(gu, dn, counters, cap, s);
}

}  // namespace plumb::cuda::detail
