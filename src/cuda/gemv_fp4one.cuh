// MXFP4 routed-expert decode for one token (included by gemv.cu, inside its namespace; GemvArgs::fp4_kernel 3, the
// default at n == 1): the per-tile kernel's work split and arithmetic, so the same bits, with a warp's next chunks
// loaded before this chunk's math.
//
// Why: at one token a launch is a single wave of ~12 warps per SM (6 experts x 128 or 256 tiles), and the per-tile
// kernel's warp waits for its loads, then computes, then issues the next loads: the memory idles while the warps
// compute, and no other warps are waiting to fill it. Here each warp keeps two register stages of weights (the next
// stage's loads are issued before the current stage's math), which the registers allow because the token's
// activations sit in shared memory (staged once per block, after the first stage's loads are on their way) instead
// of in registers. (A software-pipelined per-tile variant with the activations in registers needed ~190 registers,
// which left ~10 warps per SM: two waves at one token.)
//
// Bits: each warp accumulates its K range chunk by chunk in the per-tile kernel's order with the same fp4_group, the
// warps of a block meet in the same order, and the epilogue is the same; at one token every slot of an expert reads
// the same x row (gate/up) or its own h row (down: a pass per slot), and a column's MMA result does not depend on the
// other columns, so each output equals the per-tile kernel's.
#pragma once

namespace fp4one {

constexpr int kMaxWarps1 = 2;  // gate/up 2 (each half of K), down 1, as the per-tile defaults

// x row `xrow`'s columns [c0, c0 + cols) (f16) into xs, by the calling warp.
__device__ __forceinline__ void stage_x(const __half* x, int64_t c0, int64_t cols, __half* xs, int lane) {
  for (int64_t i = int64_t(lane) * 8; i < cols; i += 32 * 8)
    *reinterpret_cast<uint4*>(xs + i) = __ldg(reinterpret_cast<const uint4*>(x + c0 + i));
}

template <int NMAT, int EPI, class OT>
// At most 170 registers (6 blocks of 2 warps per SM): a launch at one token (12 warps per SM) stays one wave.
__global__ void __launch_bounds__(kMaxWarps1 * 32, 6) fp4_one_kernel(const GemvArgs a) {
  constexpr int U = NMAT == 2 ? 2 : 4;  // chunks per stage (the per-tile kernel's chunks in flight)
  constexpr int NV = NMAT * 4;
  extern __shared__ __align__(16) unsigned char one_smem[];  // per warp: its K range of the current x row, f16
  __shared__ float red[kMaxWarps1][NV][32];
  __shared__ int cols_s[kMaxSlots];
  __shared__ int m_sh[2];
  const int warps = int(blockDim.x >> 5);
  const int warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
  const int tile = int(blockIdx.x);
  if (a.pdl > 0) pdl_begin();
  int prob, m;
  if (!moe_block(a, warp, lane, cols_s, m_sh, prob, m)) return;

  const int total = int(a.cols / 128);
  const int cb = int(int64_t(total) * warp / warps), ce = int(int64_t(total) * (warp + 1) / warps);
  const int64_t row_a = int64_t(tile) * 16 + g, row_b = row_a + 8;
  const uint8_t* pa[NMAT];
  const uint8_t* pb[NMAT];
  const uint32_t* ps[NMAT][2];
#pragma unroll
  for (int q = 0; q < NMAT; ++q) {
    pa[q] = a.w[q] + int64_t(prob) * a.w_prob_stride + int64_t(tile) * 8 * a.cols + int64_t(cb) * 1024 + lane * 16;
    pb[q] = pa[q] + 512;
    const uint8_t* sbase = static_cast<const uint8_t*>(a.s[q]) + int64_t(prob) * a.s_prob_stride;
    ps[q][0] = reinterpret_cast<const uint32_t*>(sbase + row_a * a.s_ld + int64_t(cb) * 4);
    ps[q][1] = reinterpret_cast<const uint32_t*>(sbase + row_b * a.s_ld + int64_t(cb) * 4);
  }
  __half* xs = reinterpret_cast<__half*>(one_smem) + int64_t(warp) * (int64_t(total + warps - 1) / warps) * 128;
  const int nch = ce - cb;

  // Two register stages of U chunks: A/B codes of rows g and g + 8, their scale words.
  uint4 A[2][U][NMAT], B[2][U][NMAT];
  uint32_t SA[2][U][NMAT], SB[2][U][NMAT];
  auto load = [&](auto bufc, int c) {  // chunks c .. c + U - 1 (relative to cb) that exist
    constexpr int bf = decltype(bufc)::value;
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (c + u < nch)
#pragma unroll
        for (int q = 0; q < NMAT; ++q) {
          A[bf][u][q] = ldg_stream<1>(pa[q] + (c + u) * 1024);
          B[bf][u][q] = ldg_stream<1>(pb[q] + (c + u) * 1024);
          SA[bf][u][q] = __ldg(ps[q][0] + c + u);
          SB[bf][u][q] = __ldg(ps[q][1] + c + u);
        }
  };
  float acc[NMAT][4];
  auto math = [&](auto bufc, int c) {
    constexpr int bf = decltype(bufc)::value;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (c + u >= nch) break;
      uint4 X[4];
#pragma unroll
      for (int j = 0; j < 4; ++j)
        X[j] = g == 0 ? *reinterpret_cast<const uint4*>(xs + (c + u) * 128 + j * 32 + t * 8) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int q = 0; q < NMAT; ++q) {
        float s0[4], s1[4];
        s0[0] = e8m0_byte<0>(SA[bf][u][q]), s0[1] = e8m0_byte<1>(SA[bf][u][q]), s0[2] = e8m0_byte<2>(SA[bf][u][q]), s0[3] = e8m0_byte<3>(SA[bf][u][q]);
        s1[0] = e8m0_byte<0>(SB[bf][u][q]), s1[1] = e8m0_byte<1>(SB[bf][u][q]), s1[2] = e8m0_byte<2>(SB[bf][u][q]), s1[3] = e8m0_byte<3>(SB[bf][u][q]);
#pragma unroll
        for (int j = 0; j < 4; ++j) fp4_group<true>(word(A[bf][u][q], j), word(B[bf][u][q], j), X[j], s0[j], s1[j], acc[q]);
      }
    }
  };

  // gate/up (x by token, one token): every slot reads the same row, so one pass serves them all; down (h by slot):
  // a pass per slot.
  const int passes = a.x_by_token ? 1 : m;
  for (int p = 0; p < passes; ++p) {
#pragma unroll
    for (int q = 0; q < NMAT; ++q) acc[q][0] = acc[q][1] = acc[q][2] = acc[q][3] = 0.0f;
    load(std::integral_constant<int, 0>{}, 0);  // the weights first: the row's staging below overlaps them
    const int slot = cols_s[p];
    const int64_t xrow = a.x_by_token ? slot / a.topk : slot;
    stage_x(static_cast<const __half*>(a.x) + xrow * a.x_tok_stride, int64_t(cb) * 128, int64_t(nch) * 128, xs, lane);
    __syncwarp();
    for (int c = 0; c < nch; c += 2 * U) {
      if (c + U < nch) load(std::integral_constant<int, 1>{}, c + U);
      math(std::integral_constant<int, 0>{}, c);
      if (c + 2 * U < nch) load(std::integral_constant<int, 0>{}, c + 2 * U);
      if (c + U < nch) math(std::integral_constant<int, 1>{}, c + U);
    }
    // The block's K split in the per-tile kernel's order, then each slot's epilogue (column 0 only).
#pragma unroll
    for (int q = 0; q < NMAT; ++q)
#pragma unroll
      for (int k = 0; k < 4; ++k) red[warp][q * 4 + k][lane] = acc[q][k];
    __syncthreads();
    if (warp == 0 && t == 0) {
      float v[NV];
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        v[i] = 0.0f;
        for (int w = 0; w < warps; ++w) v[i] += red[w][i][lane];
      }
      const int s_end = a.x_by_token ? m : p + 1;
      for (int si = a.x_by_token ? 0 : p; si < s_end; ++si) {
        const int os = cols_s[si];
        OT* out = static_cast<OT*>(a.out) + int64_t(os) * a.o_tok_stride;
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          const int64_t row = int64_t(tile) * 16 + g + 8 * rr;
          const float up = EPI == kSwiglu ? v[4 + rr * 2] * kFp4Unscale : 0.0f;
          store_out<OT>(out + row, epilogue<EPI>(a, v[rr * 2] * kFp4Unscale, up, os));
        }
      }
    }
    __syncthreads();
  }
}

// Shared memory of a launch: each warp's K range of one row, f16.
inline size_t one_smem_bytes(const GemvArgs& a) {
  const int64_t total = a.cols / 128;
  return size_t((total + a.warps - 1) / a.warps) * 128 * 2 * size_t(a.warps);
}

// Whether the one-token kernel takes this launch: FP4 MoE gate/up (2 matrices, SwiGLU) or down (1, store), one token,
// at most kMaxWarps1 warps, no group table (its slot lists; one token has at most topk slots anyway).
inline bool one_ok(const GemvArgs& a) {
  return a.fmt == kFp4 && a.mode == kMoe && a.n == 1 && !a.groups && a.warps >= 1 && a.warps <= kMaxWarps1 && a.kblocks == 1 &&
         ((a.nmat == 2 && a.epi == kSwiglu) || (a.nmat == 1 && a.epi == kStore && !a.out_half)) && a.cols / 128 >= a.warps;
}

template <int NMAT, int EPI, class OT>
void launch_one(const GemvArgs& a, Stream s) {
  const dim3 grid(unsigned(a.rows / 16), unsigned(a.n * a.topk));
  launch_as(a.pdl > 0, "fp4_one_kernel", fp4_one_kernel<NMAT, EPI, OT>, grid, dim3(unsigned(a.warps * 32)), one_smem_bytes(a), s, a);
}

}  // namespace fp4one
