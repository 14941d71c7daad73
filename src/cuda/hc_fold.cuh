// cuda.hc_fold's device code: a sublayer's last FP8 GEMV (wo_b) starts the next hc_pre on the rows it produces.
// Also the one hc_post arithmetic (hc_post_stream), which fwd_hc.cu's hc_post_cols runs too.
#pragma once

#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace plumb::cuda::detail {

// Output stream k of hc_post at W columns: post_k * y + sum_j C[j][k] * x_j, in the reference's order (post * y
// first, then the streams in j order: it reproduced the official golden bit for bit). C's strides (sj, sk) are (H, 1),
// or (1, H) for fault.comb_untransposed's comb[k][j].
template <int W, int MaxH>
__device__ __forceinline__ void hc_post_stream(const float (&yv)[W], const float (&xv)[MaxH][W], float p, const float* C, int H, int sj,
                                               int sk, int k, float (&acc)[W]) {
#pragma unroll
  for (int w = 0; w < W; ++w) acc[w] = __fmul_rn(p, yv[w]);
#pragma unroll
  for (int j = 0; j < MaxH; ++j) {
    if (j >= H) break;
    const float c = C[j * sj + k * sk];
#pragma unroll
    for (int w = 0; w < W; ++w) acc[w] = __fadd_rn(acc[w], __fmul_rn(c, xv[j][w]));
  }
}

// The fold (kernels.h's kHcFoldH, kHcFoldMix, kHcFoldSums): one 16-row tile per block, its 25 sums reduced by one
// warp, a lane each.
static_assert(kHcFoldSums <= 32, "a lane per partial sum");

// A folding block's shared memory: fn's values at the tile's columns [mix][stream][row] (staged by every thread at
// the start: fn is a weight), the streams before the sublayer at those columns, the post gates and comb (staged by
// warp 0 after its K loop, past the PDL wait), and the tile's 16 outputs y.
struct HcFoldSmem {
  float fn[kHcFoldMix][kHcFoldH][16];
  float x[kHcFoldH][16];
  float post[kHcFoldH], comb[kHcFoldH * kHcFoldH];
  float y[16];
};

// 16-byte copies of fn's 24 x 4 rows of 16 floats at the tile's columns (D % 16 == 0, fn 16-byte aligned: the host checks).
__device__ __forceinline__ void hc_fold_stage_fn(const HcPartArgs& h, int64_t tile, HcFoldSmem& sm, int tid, int nthreads) {
  constexpr int n = kHcFoldMix * kHcFoldH * 4;
  for (int i = tid; i < n; i += nthreads) {
    const int o = i / (kHcFoldH * 4), k = (i / 4) % kHcFoldH, q = i % 4;
    cp16(smem_u32(&sm.fn[o][k][4 * q]), h.fn + (int64_t(o) * kHcFoldH + k) * h.D + tile * 16 + 4 * q);
  }
  cp_commit();
}
// Lanes 0..20 of one warp: X_prev's 4 x 16 floats at the tile's columns, post (4) and comb (16).
__device__ __forceinline__ void hc_fold_stage_x(const HcPartArgs& h, int64_t tile, HcFoldSmem& sm, int lane) {
  if (lane < 16) cp16(smem_u32(&sm.x[lane / 4][4 * (lane % 4)]), h.X_prev + int64_t(lane / 4) * h.D + tile * 16 + 4 * (lane % 4));
  else if (lane == 16) cp16(smem_u32(sm.post), h.post);
  else if (lane < 21) cp16(smem_u32(&sm.comb[4 * (lane - 17)]), h.comb + 4 * (lane - 17));
  cp_commit();
}

// One warp, once the staged values and sm.y are in place: lane (row r = lane % 16, streams 2 (lane / 16) and the
// next) writes its two new streams at column tile * 16 + r, and the warp's 25 fp64 sums over the tile (the 24 dots of
// the new streams with fn, then their sum of squares; per lane in stream order, then warp_reduce_scatter's fixed
// tree) go to part[o * tiles + tile], lane o holding value o (value-major: hc_pre's totals then read consecutive
// tiles with consecutive lanes). hc_pre (HcArgs::part) sums the tiles' partials in a fixed order.
__device__ __forceinline__ void hc_fold_tile(const HcPartArgs& h, int64_t tile, const HcFoldSmem& sm, int lane) {
  constexpr int H = kHcFoldH, NM = kHcFoldMix;
  const int r = lane & 15, k0 = 2 * (lane >> 4);
  const int64_t d = tile * 16 + r;
  const int sj = h.untransposed ? 1 : H, sk = h.untransposed ? H : 1;
  const float yv[1] = {sm.y[r]};
  float xv[H][1];
#pragma unroll
  for (int j = 0; j < H; ++j) xv[j][0] = sm.x[j][r];
  double acc[32];
#pragma unroll
  for (int o = 0; o < 32; ++o) acc[o] = 0.0;
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    const int k = k0 + kk;
    float s[1];
    hc_post_stream<1, H>(yv, xv, sm.post[k], sm.comb, H, sj, sk, k, s);
    h.X_out[int64_t(k) * h.D + d] = s[0];
    const double sv = s[0];
#pragma unroll
    for (int o = 0; o < NM; ++o) acc[o] += sv * double(sm.fn[o][k][r]);
    acc[NM] += sv * sv;
  }
  warp_reduce_scatter<32>(acc, lane);
  if (lane <= NM) h.part[int64_t(lane) * (h.D / 16) + tile] = acc[0];
}

}  // namespace plumb::cuda::detail
