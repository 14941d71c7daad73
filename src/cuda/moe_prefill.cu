// Prefill MoE on MXFP4 experts (W4A16): the routing grouped per expert on the device, then grouped GEMMs (gate+up
// with SwiGLU, down) in which a block reads its expert's weight rows once for up to 64 tokens (variants 4-6: 128).
//
// Two numerics (GroupedArgs::variant):
// * Variants 0 and 1: the decode kernels' (gemv.cu): f16 activations, the E2M1 codes turned into f16 by bit
//   placement (exact, fp4_frag), two mma.m16n8k16 per 32-column scale group into a fresh fp32 partial sum that the
//   group's E8M0 scale multiplies into the fp32 accumulator (fp4_mma_group), K in increasing order; the same SwiGLU
//   epilogue. Only the grouping of tokens into MMA columns differs, and columns do not interact in an MMA, so each
//   output is the same sum in the same order as one warp of the decode kernel would form over all of K.
// * Variants 2-6 ("folded"): the scale is folded into the decoded weight, so the MMAs accumulate straight into the
//   accumulators (no per-group partial, no FFMA): each f16 code v * 2^-14 is multiplied (mul.rn.f16x2) by the f16
//   power of two 2^(b - hi - 13) for scale byte b, where hi is the largest scale byte of the matrix set
//   (Fp4Matrices::scale_hi, measured at upload); the product v * 2^(b - hi + 1) is exact in f16 (normal or
//   subnormal) as long as b - hi >= -24 (fold_scales in kernels.h, checked for every range by
//   CudaMoeFold.FoldedWeightsAreExactF16 and at both ends on the GPU by CudaMoe.GroupedPrefillFoldExtremes), and the
//   fp32 outputs are multiplied by 2^(hi - 128) (exact). Every product w * x is the same exact value as in variants
//   0-1; only the fp32 summation differs: each k-step goes into the running sum instead of a fresh per-group
//   partial, and the tensor cores' fp32 addition into a large running sum keeps fewer low bits. Measured (H200,
//   tests/cuda CudaMoe.GroupedPrefill*, bench/results/h200-moe-prefill-folded): h (f16) one ulp from variant 1
//   and the decode kernels at most (normalized 6.3e-4); down 2.8e-6 of max |y| from variant 1 and 2.9e-6 from the
//   fp64 twin (variant 1: 3.1e-7); variants 2, 3 and 4 gave the same worst elements everywhere; 5 and 6 give
//   variant 4's bits (tests: GroupedPrefillMatchesTwin, FoldExtremes, RealShapes). Matrix sets whose scale bytes
//   span more than 24 octaves are refused by variants 2-6 (by name); the default then is variant 1.
//
// Block tile (all variants): 8 warps, a block owns 128 (gate+up: of w1 and of w3, for the fused SwiGLU) or 256
// (down) weight rows of its tile's expert and all the tile's tokens (64; variants 4-6: 128); a warp owns 32 of those
// rows (gate+up: the same 16 rows of w1 and w3; down: 2 x 16 rows of w2) and decodes its weights once per
// 128-column chunk for all the tokens (64 fp32 accumulators per lane; variant 4: 128). The tokens' activations are
// gathered by slot into shared memory, a cp.async ring of 128-column chunks. Grid: (row blocks, tile bound),
// blocks past the device-side tile count exit at once, so nothing returns to the host.
//   0 "registers": a warp's weight fragments go from global memory straight into its registers (one 16-byte load
//     per lane is a fragment), one chunk ahead; column tiles past the tile's tokens are skipped by a run-time test;
//     activations read as B fragments (one 16-byte load per lane and group).
//   1 "staged": the weight fragments and scales ride in the activations' cp.async ring (each warp copies its own,
//     4 stages deep), and the column-tile loop is specialized for 2, 4, 6 or 8 column tiles: straight-line code
//     whose 2 x NTV MMA chains the compiler interleaves. 255 registers with a few spilled words (ptxas: 72 / 152
//     bytes of spill stores for down / gate+up).
//   2 "folded mma.sync": variant 1 with the folded scale (no spills: 176-180 registers).
//   3 "folded wgmma": the two warpgroups of the block each multiply 64-row A tiles held in registers (the decoded,
//     folded weights: wgmma's register operand has mma.m16n8k16's A layout per warp) by the tile's tokens, read by
//     the tensor cores from shared memory (B through a matrix descriptor, no swizzle), m64nNk16 with N = 16, 32, 48
//     or 64; asynchronous, one commit group (4 wgmma) per 32-column group in flight while the next group is
//     decoded (tile_wgmma). 5 stages, 167 registers, no spills.
//   4 "folded wgmma, 128 tokens": variant 3 over two consecutive tiles of one expert (the block of an expert's even
//     tile takes the odd one after it, whose block exits), N = 16 .. 128: half the weight decoding and staging per
//     token. 4 stages of 41 KB, 235-236 registers, no spills.
//   5 "k-step groups": variant 4 with one commit group per k-step (2 wgmma) and 4 one-k-step fragment buffers
//     (the same 32 registers), up to 3 groups in flight while the next k-step is decoded; an expert's slots split
//     evenly over its blocks (192: 96 + 96, not 128 + 64). 235-236 registers. Alone: +1.6 % on gate+up at 8K.
//   6 "k-step groups, swizzled" (the default where the scales fold, kGroupedFoldedDefault): variant 5 with the
//     activations in wgmma's 128-byte swizzled layout, so that a warp's 4-byte cp.async reads one token row's 128
//     contiguous bytes (one cache line; variants 3-5: 8 token rows, 8 lines) into 32 distinct banks (the XOR of
//     the 16-byte piece with the row), and only the 8 NTV rows the MMAs read are staged. The decode layout's k
//     order still needs 4-byte pieces (a 16-byte piece of a row spans four core matrices). 230 registers, no
//     spills; the stages 1024-byte aligned by hand.
// H200 (bench/results/h200-moe-prefill-swizzled/bench.txt, bf16 cuBLASLt rate 798 TFLOP/s in the same run;
// V4-Flash E256 top-6, uniform routing), TFLOP/s gate+up / down and % of bf16 (the default then was still 4):
//   8K tokens: variant 4 306 / 343 (38.3 / 43.0 %), 5 311 / 344 (38.9 / 43.1 %), 6 347 / 361 (43.5 / 45.2 %).
//   1K tokens: variant 4 167 / 171 (20.9 / 21.4 %), 5 157 / 168, 6 169 / 175 (21.2 / 21.9 %); variant 2 177 / 176.
// Before (bench/results/h200-moe-prefill-folded/bench.txt, 800 TFLOP/s bf16):
//   8K tokens: variant 1 224 / 245 (27.9 / 30.6 %), 2 280 / 301 (34.9 / 37.6 %), 3 300 / 302 (37.4 / 37.8 %),
//              4 308 / 344 (38.5 / 43.0 %); routed total (grouping, both GEMMs, combine) 306 (38.3 %).
//   1K tokens: variant 1 155 / 157, 2 176 / 176 (21.9 / 22.0 %), 3 165 / 171, 4 164 / 164 (20.5 / 20.5 %): at 1K (24
//              slots per expert) variant 2 is 7 % faster than the default; a size-based default is left to do.
//   Earlier (bench/results/h200-moe-prefill-run3): 8K: variant 0 188 / 189, variant 1 226 / 240; 1K: 115 / 116 and
//   157 / 159 (run2 holds the dropped variants). Two variants measured there and dropped: the staging alone with the
//   run-time test per column tile (173 / 179 at 8K) and per batch of 4 column tiles (217 / 226, no spills).
#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace plumb::cuda::detail {

namespace {

constexpr int kWarps = 8;
constexpr int kBN = kGroupTokens;  // tokens per tile
constexpr int kNT = kBN / 8;       // MMA column tiles
constexpr int kKC = 128;           // columns per stage: one chunk of the decode layout
constexpr int kGroupedDefaultVariant = kGroupedFoldedDefault;  // GroupedArgs::variant < 0, when the scales fold (else 1)
// Halfs per staged token row (variants 0-2): 320 bytes, = 64 mod 128, so an LDS.128 phase (8 lanes: 2 token rows x
// 64 contiguous bytes) touches 32 distinct banks. Variant 3 stages the activations as wgmma core matrices instead
// (8 tokens x 16 bytes, 128 contiguous bytes each; see tile_wgmma): 16 KB a stage, no padding.
constexpr int kPitch = kKC + 32;
constexpr int kStageHalfs = kBN * kPitch;
// Tokens a block multiplies: variant 4 takes two consecutive tiles of one expert (up to 128 tokens).
template <int V>
__host__ __device__ constexpr int block_tokens() { return V >= 4 ? 2 * kBN : kBN; }
// Variant 6 stages the activations in the 128-byte swizzled layout (tile_wgmma), whose 1024-byte pattern must start
// 1024-byte aligned: the dynamic shared memory is rounded up by hand (one more KB is asked for).
template <int V>
__host__ __device__ constexpr int smem_align() { return V == 6 ? 1024 : 0; }
template <int V>
__host__ __device__ constexpr int x_bytes() { return V >= 3 ? block_tokens<V>() * kKC * 2 : kStageHalfs * 2; }
// Stages of the cp.async ring: variant 3 keeps one more, as its asynchronous MMAs may still read the chunk before
// the one being computed (it prefetches kStages - 2 chunks ahead, the others kStages - 1).
// (Variants 4-6: 4 stages of 41 KB, so 2 chunks ahead.)
template <int V>
__host__ __device__ constexpr int stages() { return V == 3 ? 5 : 4; }
// Variants 1-3's stage: the activations, then per warp its weight fragments [q 2][row half 2][lane 32][16 B] and its
// scales [lane 32][4 B] (lane 4g + 2q + h holds the scale word of row g + 8h of tile q).
constexpr int kWBytes = kWarps * 2 * 2 * 512, kSBytes = kWarps * 32 * 4;
template <int V>
__host__ __device__ constexpr size_t stage_bytes() { return V != 0 ? size_t(x_bytes<V>() + kWBytes + kSBytes) : size_t(x_bytes<V>()); }

// Counts per expert (shared-memory atomics: the counts, not their order, matter), exclusive scans of the counts
// and of the tiles per expert, the tile table. One block; E <= 1024.
__global__ void __launch_bounds__(1024) group_count_kernel(const int32_t* __restrict__ idx, int slots, int E,
                                                           int32_t* __restrict__ groups, GroupLayout L) {
  __shared__ int cnt[1024], sc[1024], tsc[1024];
  const int tid = int(threadIdx.x);
  cnt[tid] = 0;
  __syncthreads();
  for (int s = tid; s < slots; s += 1024) {
    const int e = idx[s];
    if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  const int c = cnt[tid], tc = (c + kBN - 1) / kBN;
  sc[tid] = c, tsc[tid] = tc;
  __syncthreads();
  for (int off = 1; off < 1024; off <<= 1) {  // inclusive scans
    const int a = tid >= off ? sc[tid - off] : 0, b = tid >= off ? tsc[tid - off] : 0;
    __syncthreads();
    sc[tid] += a, tsc[tid] += b;
    __syncthreads();
  }
  int32_t* offs = groups + L.offs;
  int32_t* tiles = groups + L.tiles;
  if (tid < E) {
    const int o = sc[tid] - c, t0 = tsc[tid] - tc;
    offs[tid] = o;
    if (tid == E - 1) offs[E] = sc[tid];
    for (int j = 0; j < tc; ++j) tiles[2 * (t0 + j)] = tid, tiles[2 * (t0 + j) + 1] = o + j * kBN;
  }
  if (tid == 1023) groups[0] = tsc[1023];
}

// Each expert's slots in increasing order: one warp per expert scans the routing (ballots, 128 slots per step).
__global__ void group_list_kernel(const int32_t* __restrict__ idx, int slots, int E, int32_t* __restrict__ groups,
                                  GroupLayout L) {
  const int lane = int(threadIdx.x & 31);
  const int e = int(blockIdx.x) * int(blockDim.x >> 5) + int(threadIdx.x >> 5);
  if (e >= E) return;
  int32_t* list = groups + L.list;
  int pos = groups[L.offs + e];
  const unsigned lt = (1u << lane) - 1u;
  for (int base = 0; base < slots; base += 128) {
    int v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int s = base + u * 32 + lane;
      v[u] = s < slots ? __ldg(idx + s) : -1;
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const bool m = v[u] == e;
      const unsigned mask = __ballot_sync(0xFFFFFFFFu, m);
      if (m) list[pos + __popc(mask & lt)] = base + u * 32 + lane;
      pos += __popc(mask);
    }
  }
}

// (cp4 itself: common.cuh.) valid false: writes 4 zero bytes and reads nothing.
__device__ __forceinline__ void cp4_zfill(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0) : "memory");
}

// The 16-row A tile of warp `warp` for tile q (q = matrix + NMAT * half): variants 0-2 give a warp 16 * MT
// consecutive rows; variant 3's warpgroups (warps 4G .. 4G + 3) multiply 64-row tiles, warp w of the group its rows
// 16w .. 16w + 15, so down's two tiles per warp are 64 rows apart (gate+up: the same rows either way).
template <int NMAT, int V>
__device__ __forceinline__ int tile_row(int warp, int q) {
  constexpr int MT = 2 / NMAT, ROWS = kWarps * 16 * MT;
  if constexpr (V >= 3 && NMAT == 1) return int(blockIdx.x) * ROWS + (warp >> 2) * 128 + q * 64 + (warp & 3) * 16;
  else return int(blockIdx.x) * ROWS + warp * 16 * MT + (q / NMAT) * 16;
}

// The per-block state of a tile: its expert's weight rows for this warp, the activation rows it gathers.
template <int NMAT, int V>
struct Tile {
  static constexpr int MT = 2 / NMAT;   // 16-row tiles per matrix and warp
  static constexpr int NQ = NMAT * MT;  // A tiles per warp (2: both kernels)
  static constexpr int ROWS = kWarps * 16 * MT;
  static constexpr int NX = V >= 4 ? 2 : V == 3 ? 1 : 4;  // activation rows a thread gathers (variant 6: see xoff)
  const uint8_t* pw[NQ];        // this lane's fragment of chunk 0, row half 0, of A tile q
  const uint32_t* ps[NQ][2];    // the scale words of rows g and g + 8 of A tile q
  const __half* src[NX];        // variants 0-2: token rows tid/16 + 16i, piece tid % 16; 3-4: rows tid/4 + 64i, lane % 4
  bool valid[NX];
  uint32_t dst[NX];
  int rq[NQ];                   // first row of A tile q

  __device__ Tile(const GroupedArgs& a, int e, const __half* xs, const int* slot_s) {
    const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31, g = lane >> 2;
#pragma unroll
    for (int q = 0; q < NQ; ++q) {
      const int mat = q % NMAT, rt = tile_row<NMAT, V>(warp, q);
      rq[q] = rt;
      pw[q] = a.w[mat] + int64_t(e) * a.w_prob_stride + int64_t(rt) * (a.cols / 2) + lane * 16;
      const uint8_t* sb = static_cast<const uint8_t*>(a.s[mat]) + int64_t(e) * a.s_prob_stride;
      ps[q][0] = reinterpret_cast<const uint32_t*>(sb + int64_t(rt + g) * (a.cols / 32));
      ps[q][1] = reinterpret_cast<const uint32_t*>(sb + int64_t(rt + g + 8) * (a.cols / 32));
    }
    const __half* x = static_cast<const __half*>(a.x);
    // Rows past the tile's tokens are zero-filled (computed in vain, never stored).
    if constexpr (V >= 3) {
      // Token row r = tid / 4 (+ 64i) (warp w: tokens 8w .. 8w + 7, the w-th core-matrix row block), column
      // quarter t = lane % 4 of every 32-column group; tile_wgmma places its 4-byte pairs.
#pragma unroll
      for (int i = 0; i < NX; ++i) {
        const int r = (tid >> 2) + 64 * i, sl = slot_s[r], t = lane & 3;
        valid[i] = sl >= 0;
        src[i] = x + (valid[i] ? int64_t(sl / a.x_div) * a.x_ld : 0) + t * 8;
        dst[i] = smem_u32(xs) + uint32_t((warp + 8 * i) * 2048 + (r & 7) * 16 + t * 4);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = tid / 16 + 16 * i, sl = slot_s[r];
        valid[i] = sl >= 0;
        src[i] = x + (valid[i] ? int64_t(sl / a.x_div) * a.x_ld : 0) + (tid % 16) * 8;
        dst[i] = smem_u32(xs + r * kPitch + (tid % 16) * 8);
      }
    }
  }
};

// All variants' K loops share the tile setup (Tile), the activation staging and the epilogue (store_tile). us[mat]
// takes the fp32 outputs back to the true scale: kFp4Unscale (the codes' 2^-14) or the fold's factor.
template <int NMAT, int V, int NTV>
__device__ __forceinline__ void store_tile(const GroupedArgs& a, const Tile<NMAT, V>& T, const float (&acc)[2][NTV][4], int cnt,
                                           const int* slot_s, const float (&us)[2]) {
  const int lane = int(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
  // Lane (g, t) holds rows g and g + 8 of each 16-row tile for token columns 2t and 2t + 1 of each column tile
  // (mma.m16n8k16's C fragment, and wgmma's per warp).
#pragma unroll
  for (int n = 0; n < NTV; ++n)
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) {
      const int col = n * 8 + 2 * t + cc;
      if (col >= cnt) continue;
      const int slot = slot_s[col];
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        if constexpr (NMAT == 2) {
          const int row = T.rq[0] + g + 8 * rr;
          float h = swiglu_clamped(acc[0][n][rr * 2 + cc] * us[0], acc[1][n][rr * 2 + cc] * us[1], a.limit);
          if (a.pre_weight) h *= a.pre_weight[slot];
          store_out<__half>(static_cast<__half*>(a.out) + int64_t(slot) * a.o_ld + row, h);
        } else {
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            const int row = T.rq[q] + g + 8 * rr;
            store_out<float>(static_cast<float*>(a.out) + int64_t(slot) * a.o_ld + row, acc[q][n][rr * 2 + cc] * us[0]);
          }
        }
      }
    }
}

// One group j of a chunk: decode the warp's two A tiles once, multiply them into the NTV column tiles, in batches
// of NB; with NB < NTV a batch runs only if it holds one of the first `ntv` column tiles (a run-time test, which
// also bounds how many MMA chains the compiler interleaves: 2 x NB, so the registers stay in budget).
template <int NTV, int NB>
__device__ __forceinline__ void group_mma(const uint32_t (&W)[2][2][4], const uint32_t (&S)[2][2], int j, const __half* xb,
                                          int ntv, float (&acc)[2][NTV][4]) {
  uint32_t f[2][8];
  float sa[2], sb[2];
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    fp4_frag(W[q][0][j], W[q][1][j], f[q]);
    sa[q] = e8m0_to_f32(S[q][0] >> (8 * j)), sb[q] = e8m0_to_f32(S[q][1] >> (8 * j));
  }
#pragma unroll
  for (int n0 = 0; n0 < NTV; n0 += NB) {
    if (NB < NTV && n0 >= ntv) continue;
#pragma unroll
    for (int n = n0; n < n0 + NB; ++n) {
      const uint4 X = *reinterpret_cast<const uint4*>(xb + n * 8 * kPitch + j * 32);
#pragma unroll
      for (int q = 0; q < 2; ++q) fp4_mma_group<false>(f[q], X, sa[q], sb[q], acc[q][n]);
    }
  }
}

// ---- the folded scale (variants 2 and 3) ----

// A chunk's scale words (4 E8M0 bytes: groups 0..3) to biased f16 exponents, times 4: byte j of the result is the
// exponent field of group j's multiplier (fold_scales) shifted into place for the high byte of an f16.
__device__ __forceinline__ uint32_t fold_word(uint32_t s, uint32_t add) { return (s + add) << 2; }
// Group j's multiplier as f16x2 (both halves): bytes (0, m.j, 0, m.j).
__device__ __forceinline__ uint32_t fold_mul(uint32_t m, int j) {
  return __byte_perm(m, 0u, 0x0404u | (uint32_t(j) << 4) | (uint32_t(j) << 12));
}
__device__ __forceinline__ uint32_t hmul2_bits(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));  // no .ftz: f16 subnormals are kept
  return r;
}
// Group j's A fragments of one 16-row tile with the scale folded in: rows g (even f) and g + 8 (odd f). Exact:
// every product is an f16 value (fold_scales).
__device__ __forceinline__ void fp4_frag_folded(uint32_t wa, uint32_t wb, uint32_t ma, uint32_t mb, int j, uint32_t (&f)[8]) {
  fp4_frag(wa, wb, f);
  const uint32_t xa = fold_mul(ma, j), xb = fold_mul(mb, j);
#pragma unroll
  for (int i = 0; i < 4; ++i) f[2 * i] = hmul2_bits(f[2 * i], xa), f[2 * i + 1] = hmul2_bits(f[2 * i + 1], xb);
}

// Variant 2's group: the folded A fragments straight into the accumulators (no per-group partial sum, no FFMA).
template <int NTV>
__device__ __forceinline__ void group_mma_folded(const uint32_t (&W)[2][2][4], const uint32_t (&M)[2][2], int j, const __half* xb,
                                                 float (&acc)[2][NTV][4]) {
  uint32_t f[2][8];
#pragma unroll
  for (int q = 0; q < 2; ++q) fp4_frag_folded(W[q][0][j], W[q][1][j], M[q][0], M[q][1], j, f[q]);
#pragma unroll
  for (int n = 0; n < NTV; ++n) {
    const uint4 X = *reinterpret_cast<const uint4*>(xb + n * 8 * kPitch + j * 32);
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      mma_f16(acc[q][n], f[q][0], f[q][1], f[q][2], f[q][3], X.x, X.y);
      mma_f16(acc[q][n], f[q][4], f[q][5], f[q][6], f[q][7], X.z, X.w);
    }
  }
}

// Variant 0: weights from global memory into registers, one chunk ahead; column tiles tested at run time.
template <int NMAT>
__device__ __forceinline__ void tile_registers(const GroupedArgs& a, Tile<NMAT, 0>& T, int cnt, __half* xs, const int* slot_s) {
  constexpr int kStages = stages<0>();
  constexpr int kXBytes = x_bytes<0>();
  const int lane = int(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
  const int nch = int(a.cols / kKC), ntv = (cnt + 7) / 8;
  auto stage = [&](int c) {
    if (c < nch) {
      const uint32_t off = uint32_t((c % kStages) * kXBytes);
#pragma unroll
      for (int i = 0; i < 4; ++i) cp16_zfill(T.dst[i] + off, T.src[i] + int64_t(c) * kKC, T.valid[i]);
    }
    cp_commit();  // one group per chunk, empty past the end: the wait count stays uniform
  };
  auto load_w = [&](int c, uint32_t (&W)[2][2][4], uint32_t (&S)[2][2]) {
#pragma unroll
    for (int q = 0; q < 2; ++q)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4 v = ldg_stream<1>(T.pw[q] + int64_t(c) * 1024 + h * 512);
        W[q][h][0] = v.x, W[q][h][1] = v.y, W[q][h][2] = v.z, W[q][h][3] = v.w;
        S[q][h] = __ldg(T.ps[q][h] + c);
      }
  };
#pragma unroll
  for (int c = 0; c < kStages - 1; ++c) stage(c);
  uint32_t W[2][2][4], S[2][2];
  load_w(0, W, S);
  float acc[2][kNT][4] = {};
  for (int c = 0; c < nch; ++c) {
    cp_wait<kStages - 2>();
    __syncthreads();         // chunk c is in shared memory; every warp is done with chunk c - 1's buffer
    stage(c + kStages - 1);  // into that buffer
    uint32_t Wn[2][2][4], Sn[2][2];
    if (c + 1 < nch) load_w(c + 1, Wn, Sn);
    const __half* xb = xs + (c % kStages) * kStageHalfs + g * kPitch + t * 8;
#pragma unroll
    for (int j = 0; j < 4; ++j) group_mma<kNT, 1>(W, S, j, xb, ntv, acc);
    if (c + 1 < nch) {
#pragma unroll
      for (int q = 0; q < 2; ++q)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          S[q][h] = Sn[q][h];
#pragma unroll
          for (int k = 0; k < 4; ++k) W[q][h][k] = Wn[q][h][k];
        }
    }
  }
  const float us[2] = {kFp4Unscale, kFp4Unscale};
  store_tile<NMAT, 0, kNT>(a, T, acc, cnt, slot_s, us);
}

// The weight fragments and scale words of variants 1-3: each warp copies its own into the stage after the
// activations (layout at stage_bytes).
template <int NMAT, int V>
struct WeightStage {
  uint32_t wdst, sdst;
  const uint32_t* ssrc;
  __device__ WeightStage(const Tile<NMAT, V>& T, uint32_t base) {
    const int warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31);
    // Fragment (q, h) to [warp][q][h][lane]; scale word (q, h) = (lane >> 1 & 1, lane & 1) of row g (+ 8h) to
    // [warp][lane]. No run-time index into T: it stays in registers.
    wdst = base + uint32_t(x_bytes<V>()) + uint32_t(warp) * 2048 + uint32_t(lane) * 16;
    sdst = base + uint32_t(x_bytes<V>() + kWBytes) + uint32_t(warp * 32 + lane) * 4;
    ssrc = (lane & 2) ? ((lane & 1) ? T.ps[1][1] : T.ps[1][0]) : ((lane & 1) ? T.ps[0][1] : T.ps[0][0]);
  }
  __device__ __forceinline__ void copy(const Tile<NMAT, V>& T, uint32_t off, int c) const {
#pragma unroll
    for (int q = 0; q < 2; ++q)
#pragma unroll
      for (int h = 0; h < 2; ++h) cp16(wdst + off + uint32_t(q * 2 + h) * 512, T.pw[q] + int64_t(c) * 1024 + h * 512);
    cp4(sdst + off, ssrc + c);
  }
  // This warp's words of the stage at `st`.
  __device__ __forceinline__ static void load(const uint8_t* st, uint32_t (&W)[2][2][4], uint32_t (&S)[2][2]) {
    const int warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31), g = lane >> 2;
#pragma unroll
    for (int q = 0; q < 2; ++q)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4 v = *reinterpret_cast<const uint4*>(st + x_bytes<V>() + warp * 2048 + (q * 2 + h) * 512 + lane * 16);
        W[q][h][0] = v.x, W[q][h][1] = v.y, W[q][h][2] = v.z, W[q][h][3] = v.w;
      }
    const uint4 sv = *reinterpret_cast<const uint4*>(st + x_bytes<V>() + kWBytes + (warp * 32 + g * 4) * 4);
    S[0][0] = sv.x, S[0][1] = sv.y, S[1][0] = sv.z, S[1][1] = sv.w;
  }
};

// Variants 1 and 2: weights and scales staged in shared memory with the activations; NTV column tiles,
// straight-line. Variant 1 applies the scale per group to an fp32 partial sum, variant 2 folds it into the weights.
template <int NMAT, int V, int NTV>
__device__ __forceinline__ void tile_staged(const GroupedArgs& a, Tile<NMAT, V>& T, int cnt, __half* xs, const int* slot_s) {
  constexpr int kStages = stages<V>();
  const int lane = int(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
  const int nch = int(a.cols / kKC);
  constexpr uint32_t SB = uint32_t(stage_bytes<V>());
  const WeightStage<NMAT, V> ws(T, smem_u32(xs));
  auto stage = [&](int c) {
    if (c < nch) {
      const uint32_t off = uint32_t(c % kStages) * SB;
#pragma unroll
      for (int i = 0; i < 4; ++i) cp16_zfill(T.dst[i] + off, T.src[i] + int64_t(c) * kKC, T.valid[i]);
      ws.copy(T, off, c);
    }
    cp_commit();
  };
#pragma unroll
  for (int c = 0; c < kStages - 1; ++c) stage(c);
  float acc[2][NTV][4] = {};
  const uint8_t* sm = reinterpret_cast<const uint8_t*>(xs);
  const uint32_t add[2] = {a.fold_add[0], a.fold_add[NMAT - 1]};
  for (int c = 0; c < nch; ++c) {
    cp_wait<kStages - 2>();
    __syncthreads();
    stage(c + kStages - 1);
    const uint8_t* st = sm + size_t(c % kStages) * SB;
    uint32_t W[2][2][4], S[2][2];
    WeightStage<NMAT, V>::load(st, W, S);
    const __half* xb = reinterpret_cast<const __half*>(st) + g * kPitch + t * 8;
    if constexpr (V == 1) {
#pragma unroll
      for (int j = 0; j < 4; ++j) group_mma<NTV, NTV>(W, S, j, xb, NTV, acc);
    } else {
#pragma unroll
      for (int q = 0; q < 2; ++q) S[q][0] = fold_word(S[q][0], add[q % NMAT]), S[q][1] = fold_word(S[q][1], add[q % NMAT]);
#pragma unroll
      for (int j = 0; j < 4; ++j) group_mma_folded<NTV>(W, S, j, xb, acc);
    }
  }
  if constexpr (V == 1) {
    const float us[2] = {kFp4Unscale, kFp4Unscale};
    store_tile<NMAT, V, NTV>(a, T, acc, cnt, slot_s, us);
  } else {
    const float us[2] = {a.fold_unscale[0], a.fold_unscale[NMAT - 1]};
    store_tile<NMAT, V, NTV>(a, T, acc, cnt, slot_s, us);
  }
}

// ---- variant 3: wgmma (sm_90a), decoded weights from registers, activations from shared memory ----

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// The accumulators as seen by code after a wgmma_wait: an empty asm that "writes" them, so the compiler reads them
// only after the wait.
template <int NTV>
__device__ __forceinline__ void wgmma_touch(float (&d)[NTV][4]) {
#pragma unroll
  for (int n = 0; n < NTV; ++n)
#pragma unroll
    for (int k = 0; k < 4; ++k) asm volatile("" : "+f"(d[n][k])::"memory");
}
// Shared memory written by cp.async (the generic proxy) made visible to wgmma's reads (the async proxy).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// D[64 x 8NTV] += A[64 x 16] (f16, registers: this warp's m16n8k16-style fragment of rows 16w .. 16w + 15) *
// B[16 x 8NTV] (f16, shared memory, K-major, no swizzle: desc).
template <int NTV>
__device__ __forceinline__ void wgmma_rs(float (&d)[NTV][4], const uint32_t* a, uint64_t desc);
template <>
__device__ __forceinline__ void wgmma_rs<2>(float (&d)[2][4], const uint32_t* a, uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7}, "
      "{%8,%9,%10,%11}, %12, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_rs<4>(float (&d)[4][4], const uint32_t* a, uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, "
      "{%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_rs<6>(float (&d)[6][4], const uint32_t* a, uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %29, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n48k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23}, "
      "{%24,%25,%26,%27}, %28, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_rs<8>(float (&d)[8][4], const uint32_t* a, uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
      "{%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

template <>
__device__ __forceinline__ void wgmma_rs<10>(float (&d)[10][4], const uint32_t* a, uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %45, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n80k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39}, "
      "{%40,%41,%42,%43}, %44, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_rs<12>(float (&d)[12][4], const uint32_t* a, uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %53, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n96k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47}, "
      "{%48,%49,%50,%51}, %52, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_rs<14>(float (&d)[14][4], const uint32_t* a, uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %61, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n112k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55}, "
      "{%56,%57,%58,%59}, %60, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_rs<16>(float (&d)[16][4], const uint32_t* a, uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
      "{%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

// The B descriptor of k-step ks (16 columns) of the stage at `xs`: no swizzle, core matrices of 8 tokens x 16
// bytes, the two of a k-step 128 bytes apart (leading byte offset, along K), token blocks of 8 2048 bytes apart
// (stride byte offset, along N).
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t xs, int ks) {
  const uint32_t addr = xs + uint32_t(ks) * 256;
  return uint64_t((addr & 0x3FFFFu) >> 4) | (uint64_t(128 >> 4) << 16) | (uint64_t(2048 >> 4) << 32);
}
// Variant 6's B descriptor: the 128-byte swizzle (layout type 1, bits 62-63). A stage holds two 64-column halves
// (16 KB apart), each 8-token blocks of 8 rows x 128 bytes (1024 bytes, the swizzle's repeat; stride byte offset),
// K-major, so a k-step is 32 bytes of each token row: k-step ks starts 32 (ks % 4) bytes into its half (the
// hardware applies the XOR to the address it forms, so the start moves by plain bytes; the leading byte offset is
// not used by swizzled K-major layouts). 16-byte piece p of token row r is stored at piece p ^ (r % 8).
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t xs, int ks) {
  const uint32_t addr = xs + uint32_t(ks >> 2) * 16384 + uint32_t(ks & 3) * 32;
  return uint64_t((addr & 0x3FFFFu) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// Half s of fp4_frag_folded (the A fragment of k-step 2j + s of a 16-row tile: f[4s .. 4s + 3] there), the same
// operations on the same bits, so variants 5-6 decode exactly what variant 4 does, one k-step at a time.
__device__ __forceinline__ void fp4_half_folded(uint32_t wa, uint32_t wb, uint32_t ma, uint32_t mb, int j, int s, uint32_t (&f)[4]) {
  const uint32_t loa = fp4::lo_codes(wa), lob = fp4::lo_codes(wb), hia = fp4::hi_codes(wa), hib = fp4::hi_codes(wb);
  // s = 0: (p01, p23); s = 1: (p45, p67) of fp4::to_f16x2
  const uint32_t sel_lo = s ? fp4::kSelLo23 : fp4::kSelLo01, sel_hi = s ? fp4::kSelHi10 : fp4::kSelHi32;
  const uint32_t xa = fold_mul(ma, j), xb = fold_mul(mb, j);
  f[0] = hmul2_bits(fp4::byte_perm0(loa, sel_lo), xa), f[1] = hmul2_bits(fp4::byte_perm0(lob, sel_lo), xb);
  f[2] = hmul2_bits(fp4::byte_perm0(hia, sel_hi), xa), f[3] = hmul2_bits(fp4::byte_perm0(hib, sel_hi), xb);
}

// Variants 3-6. Block: two warpgroups; warpgroup G multiplies 64-row A tiles (gate+up: rows 64G.. of w1 and of
// w3; down: rows 128G.. and 128G + 64..) by all the tile's tokens (N = 8 NTV). The k order inside a group is the
// decode layout's: lane t's fragment of k-step s holds the group's columns 8t + 4s + (0, 1) (k 2t, 2t + 1) and
// 8t + 4s + (2, 3) (k 2t + 8, 2t + 9), so the activations are staged in that order, 4-byte column pairs (cp.async
// of 4 bytes) placed in the core matrices (token row r: row r % 8 of core-matrix block r / 8).
// * Variants 3-4: per 32-column group j of a chunk each warp decodes its A fragments (scale folded) into one of
//   two register buffers and issues 4 wgmma (2 k-steps x 2 tiles) as one commit group; before decoding group j it
//   waits for all but the last group, so the decode of group j overlaps the tensor cores' work on group j - 1
//   only. Staging: a warp's cp.async covers 8 token rows (8 cache lines) x 16 bytes.
// * Variant 5: one commit group per k-step (2 wgmma: the two tiles) and four buffers of one k-step's fragments
//   (the same 32 registers), waiting for all but 3 groups: up to three k-steps (1.5 groups of variant 4) queued on
//   the tensor cores while the next is decoded, and across the chunk boundary (barrier, staging, the weights'
//   shared-memory loads). Each accumulator still takes its k-steps in increasing order: the same sums.
// * Variant 6: variant 5 with the activations in the 128-byte swizzled layout (wgmma_desc_sw128): a warp's
//   cp.async covers one token row's 64 contiguous columns (one cache line) and, through the XOR, 32 distinct banks;
//   only the 8 NTV token rows the MMAs read are staged (variant 4: 64 or 128).
template <int NMAT, int V, int NTV>
__device__ __forceinline__ void tile_wgmma(const GroupedArgs& a, Tile<NMAT, V>& T, int cnt, __half* xs, const int* slot_s,
                                           const int64_t* xoff) {
  constexpr int kStages = stages<V>();
  constexpr int kAhead = kStages - 2;  // chunks prefetched
  const int nch = int(a.cols / kKC);
  constexpr uint32_t SB = uint32_t(stage_bytes<V>());
  constexpr int NR = NTV > 8 ? 2 : 1;  // 64-token row blocks staged (variants 4-5 with more than 64 tokens: both)
  const uint32_t base = smem_u32(xs);
  const WeightStage<NMAT, V> ws(T, base);
  const int warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31);
  // Variant 6: lane (p, t) = (lane / 4, lane % 4) copies the column pair of logical 16-byte piece p (k-step p / 2
  // of the half, core matrix p % 2) and quarter t, i.e. column 32 (p / 4) + 8t + 2 (p % 4) of the half, for token
  // rows warp + 8m (row warp of 8-token block m), to piece p ^ warp.
  const int p6 = lane >> 2, t6 = lane & 3;
  const int col6 = (p6 >> 2) * 32 + 8 * t6 + 2 * (p6 & 3);
  const uint32_t dst6 = uint32_t(warp * 128 + ((p6 ^ warp) * 16) + 4 * t6);
  const __half* x6 = static_cast<const __half*>(a.x);
  auto stage = [&](int c) {
    if (c < nch) {
      const uint32_t off = uint32_t(c % kStages) * SB;
      if constexpr (V == 6) {
#pragma unroll
        for (int m = 0; m < NTV; ++m) {
          const int64_t o = xoff[warp + 8 * m];  // the same for the whole warp: a broadcast
          const bool ok = o >= 0;
          const __half* src = ok ? x6 + o + int64_t(c) * kKC + col6 : x6;
          const uint32_t d = base + off + dst6 + uint32_t(m) * 1024;
          cp4_zfill(d, src, ok);
          cp4_zfill(d + 16384, src + 64, ok);
        }
      } else {
        // Column pair 8t + 2v of group j (v = 2s + h): k-step 2j + s, core matrix h, bytes 4t of the token's row.
#pragma unroll
        for (int i = 0; i < NR; ++i) {
          const __half* src = T.src[i] + int64_t(c) * kKC;
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int v = 0; v < 4; ++v)
              cp4_zfill(T.dst[i] + off + uint32_t((2 * (2 * j + (v >> 1)) + (v & 1)) * 128), src + j * 32 + 2 * v, T.valid[i]);
        }
      }
      ws.copy(T, off, c);
    }
    cp_commit();
  };
#pragma unroll
  for (int c = 0; c < kAhead; ++c) stage(c);
  float acc[2][NTV][4];
#pragma unroll
  for (int q = 0; q < 2; ++q)
#pragma unroll
    for (int n = 0; n < NTV; ++n)
#pragma unroll
      for (int k = 0; k < 4; ++k) acc[q][n][k] = 0.0f;
  const uint32_t add[2] = {a.fold_add[0], a.fold_add[NMAT - 1]};
  const uint8_t* sm = reinterpret_cast<const uint8_t*>(xs);
  // Chunk c's start, in both pipelines: its stage landed and visible to the tensor cores, the stage of chunk c - 2
  // refilled with chunk c + kAhead, its weights and folded scales loaded; returns its activations' address.
  // Variants 3-4 first wait for this warpgroup's MMAs of chunk c - 2 (the stage refilled); variants 5-6 need no
  // wait: at most 3 commit groups are pending, all of chunk c - 1 (8 a chunk), so chunk c - 2's MMAs, the last
  // readers of that stage, are done in both warpgroups once all threads pass the barrier.
  auto begin_chunk = [&](int c, uint32_t (&W)[2][2][4], uint32_t (&S)[2][2]) {
    cp_wait<kAhead - 1>();  // chunk c has landed (this thread's copies)
    fence_proxy_async();    // ... and is visible to the tensor cores' reads
    if constexpr (V < 5) wgmma_wait<1>();
    __syncthreads();
    stage(c + kAhead);  // into chunk c - 2's buffer
    WeightStage<NMAT, V>::load(sm + size_t(c % kStages) * SB, W, S);
#pragma unroll
    for (int q = 0; q < 2; ++q) S[q][0] = fold_word(S[q][0], add[q % NMAT]), S[q][1] = fold_word(S[q][1], add[q % NMAT]);
    return base + uint32_t(c % kStages) * SB;
  };
  if constexpr (V >= 5) {
    uint32_t A[4][2][4];  // [buffer: k-step % 4][tile q][fragment]
    for (int c = 0; c < nch; ++c) {
      uint32_t W[2][2][4], S[2][2];
      const uint32_t sx = begin_chunk(c, W, S);
#pragma unroll
      for (int ks = 0; ks < 8; ++ks) {
        const int j = ks >> 1, s = ks & 1;
        uint32_t (&F)[2][4] = A[ks & 3];
        wgmma_wait<3>();  // the group that last read buffer ks % 4 (k-step ks - 4) is done
#pragma unroll
        for (int q = 0; q < 2; ++q) fp4_half_folded(W[q][0][j], W[q][1][j], S[q][0], S[q][1], j, s, F[q]);
        wgmma_fence();
        const uint64_t desc = V == 6 ? wgmma_desc_sw128(sx, ks) : wgmma_desc(sx, ks);
#pragma unroll
        for (int q = 0; q < 2; ++q) wgmma_rs<NTV>(acc[q], F[q], desc);
        wgmma_commit();
      }
    }
  } else {
    uint32_t A[2][2][8];  // [buffer][tile q][fragment]
    for (int c = 0; c < nch; ++c) {
      uint32_t W[2][2][4], S[2][2];
      const uint32_t sx = begin_chunk(c, W, S);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t (&F)[2][8] = A[j & 1];
        wgmma_wait<1>();  // the group that last read buffer j & 1 (group j - 2) is done
#pragma unroll
        for (int q = 0; q < 2; ++q) fp4_frag_folded(W[q][0][j], W[q][1][j], S[q][0], S[q][1], j, F[q]);
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < 2; ++s)
#pragma unroll
          for (int q = 0; q < 2; ++q) wgmma_rs<NTV>(acc[q], F[q] + 4 * s, wgmma_desc(sx, 2 * j + s));
        wgmma_commit();
      }
    }
  }
  wgmma_wait<0>();
  wgmma_touch<NTV>(acc[0]);
  wgmma_touch<NTV>(acc[1]);
  const float us[2] = {a.fold_unscale[0], a.fold_unscale[NMAT - 1]};
  store_tile<NMAT, V, NTV>(a, T, acc, cnt, slot_s, us);
}

// Grid (row blocks, tile bound); blocks past the tile count exit.
template <int NMAT, int VARIANT>
__global__ void __launch_bounds__(kWarps * 32, 1) grouped_kernel(const GroupedArgs a, const GroupLayout L) {
  extern __shared__ __align__(128) __half xs_raw[];  // [stages][stage_bytes<VARIANT>()] (+ smem_align's slack)
  constexpr int BT = block_tokens<VARIANT>();
  __shared__ int slot_s[BT];
  __shared__ int64_t xoff_s[VARIANT == 6 ? BT : 1];  // variant 6: each token row's element offset in x, -1: none
  const int tile = int(blockIdx.y);
  if (tile >= a.groups[0]) return;
  const int e = a.groups[L.tiles + 2 * tile];
  int start = a.groups[L.tiles + 2 * tile + 1];
  const int e0 = a.groups[L.offs + e], e1 = a.groups[L.offs + e + 1];
  // Variant 4 on: the block of an expert's even tile also takes the odd one after it; the odd tile's block exits.
  if (BT > kBN && ((start - e0) / kBN) % 2) return;
  int cnt = min(BT, e1 - start);
  if constexpr (VARIANT >= 5) {
    // The expert's c slots in nb = ceil(c / 128) blocks of near-equal size (c = 192: 96 + 96, not 128 + 64; as many
    // blocks as variant 4 has even tiles). A token's outputs do not depend on its tile mates (MMA columns do not
    // interact), only the per-block work evens out.
    const int c = e1 - e0, nb = (c + BT - 1) / BT, p = (start - e0) / BT;
    const int lo = int(int64_t(p) * c / nb), hi = int(int64_t(p + 1) * c / nb);
    start = e0 + lo, cnt = hi - lo;
  }
  const int tid = int(threadIdx.x);
  if (tid < BT) {
    slot_s[tid] = tid < cnt ? a.groups[L.list + start + tid] : -1;
    if constexpr (VARIANT == 6) xoff_s[tid] = tid < cnt ? int64_t(slot_s[tid] / a.x_div) * a.x_ld : -1;
  }
  __syncthreads();
  __half* xs = xs_raw;
  if constexpr (smem_align<VARIANT>() > 0)  // round up to the swizzle pattern's 1024 bytes
    xs = reinterpret_cast<__half*>(reinterpret_cast<char*>(xs_raw) + ((smem_align<VARIANT>() - (smem_u32(xs_raw) & (smem_align<VARIANT>() - 1))) & (smem_align<VARIANT>() - 1)));
  Tile<NMAT, VARIANT> T(a, e, xs, slot_s);
  const int ntv = (cnt + 7) / 8;
  const int64_t* xo = xoff_s;
  if constexpr (VARIANT == 0) {
    tile_registers<NMAT>(a, T, cnt, xs, slot_s);
  } else if constexpr (VARIANT >= 3) {  // N = 16, 32, .. 64 (128) tokens: at most one 8-token block in vain
    if (ntv <= 2) tile_wgmma<NMAT, VARIANT, 2>(a, T, cnt, xs, slot_s, xo);
    else if (ntv <= 4) tile_wgmma<NMAT, VARIANT, 4>(a, T, cnt, xs, slot_s, xo);
    else if (ntv <= 6) tile_wgmma<NMAT, VARIANT, 6>(a, T, cnt, xs, slot_s, xo);
    else if (VARIANT == 3 || ntv <= 8) tile_wgmma<NMAT, VARIANT, 8>(a, T, cnt, xs, slot_s, xo);
    else if constexpr (VARIANT >= 4) {
      if (ntv <= 10) tile_wgmma<NMAT, VARIANT, 10>(a, T, cnt, xs, slot_s, xo);
      else if (ntv <= 12) tile_wgmma<NMAT, VARIANT, 12>(a, T, cnt, xs, slot_s, xo);
      else if (ntv <= 14) tile_wgmma<NMAT, VARIANT, 14>(a, T, cnt, xs, slot_s, xo);
      else tile_wgmma<NMAT, VARIANT, 16>(a, T, cnt, xs, slot_s, xo);
    }
  } else {  // 2, 4, 6 or 8 column tiles: at most one computed in vain
    if (ntv <= 2) tile_staged<NMAT, VARIANT, 2>(a, T, cnt, xs, slot_s);
    else if (ntv <= 4) tile_staged<NMAT, VARIANT, 4>(a, T, cnt, xs, slot_s);
    else if (ntv <= 6) tile_staged<NMAT, VARIANT, 6>(a, T, cnt, xs, slot_s);
    else tile_staged<NMAT, VARIANT, kNT>(a, T, cnt, xs, slot_s);
  }
}

template <int NMAT, int VARIANT>
void launch_grouped_t(const GroupedArgs& a, Stream s) {
  constexpr int ROWS = Tile<NMAT, VARIANT>::ROWS;
  if (a.rows % ROWS) throw_arg("moe grouped: rows must be a multiple of " + std::to_string(ROWS));
  constexpr size_t smem = size_t(stages<VARIANT>()) * stage_bytes<VARIANT>() + size_t(smem_align<VARIANT>());
  // The shared-memory opt-in, once per device for this instantiation.
  static bool set[64] = {};
  int dev = 0;
  PLUMB_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 64 && !set[dev]) {
    PLUMB_CUDA_CHECK(cudaFuncSetAttribute(grouped_kernel<NMAT, VARIANT>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    set[dev] = true;
  }
  const GroupLayout L = group_layout(a.slots, a.E);
  const dim3 grid(unsigned(a.rows / ROWS), unsigned(L.max_tiles));
  grouped_kernel<NMAT, VARIANT><<<grid, kWarps * 32, smem, s>>>(a, L);
  check_launch("moe grouped_kernel");
}

template <int NMAT>
void launch_grouped_v(const GroupedArgs& a, int v, Stream s) {
  switch (v) {
    case 0: return launch_grouped_t<NMAT, 0>(a, s);
    case 1: return launch_grouped_t<NMAT, 1>(a, s);
    case 2: return launch_grouped_t<NMAT, 2>(a, s);
    case 3: return launch_grouped_t<NMAT, 3>(a, s);
    case 4: return launch_grouped_t<NMAT, 4>(a, s);
    case 5: return launch_grouped_t<NMAT, 5>(a, s);
    default: return launch_grouped_t<NMAT, 6>(a, s);
  }
}

}  // namespace

void launch_moe_group(const int32_t* idx, int slots, int E, int32_t* groups, Stream s) {
  if (E < 1 || E > 1024) throw_arg("moe group: 1..1024 experts");
  if (slots <= 0) return;
  const GroupLayout L = group_layout(slots, E);
  if (L.max_tiles > 65535) throw_arg("moe group: too many slots for one launch");
  group_count_kernel<<<1, 1024, 0, s>>>(idx, slots, E, groups, L);
  check_launch("moe group_count_kernel");
  group_list_kernel<<<unsigned((E + 7) / 8), 256, 0, s>>>(idx, slots, E, groups, L);
  check_launch("moe group_list_kernel");
}

void launch_moe_grouped(const GroupedArgs& a, Stream s) {
  if (a.slots <= 0) return;
  if (a.cols <= 0 || a.cols % kKC) throw_arg("moe grouped: columns must be a multiple of 128");
  if (!a.x || !a.out || !a.groups || !a.w[0] || !a.s[0] || (a.nmat == 2 && (!a.w[1] || !a.s[1])))
    throw_arg("moe grouped: null pointer argument");
  if ((reinterpret_cast<uintptr_t>(a.x) & 15u) || (a.x_ld * 2) % 16 || a.x_div < 1)
    throw_arg("moe grouped: activations must be 16-byte aligned, rows included");
  // The default: the folded-scale kernel where the scales allow it, else the per-group scale (variant 1).
  const int v = a.variant < 0 ? (a.fold_ok ? kGroupedDefaultVariant : 1) : a.variant;
  if (v >= kGroupedVariants) throw_arg("moe grouped: variant must be 0.." + std::to_string(kGroupedVariants - 1));
  if (v >= 2 && !a.fold_ok)
    throw_arg("moe grouped: variant " + std::to_string(v) + " folds the scales into f16 weights, which needs the E8M0 "
              "scale bytes within 24 of each other (Fp4Matrices::scale_lo/hi)");
  if (a.nmat == 2) return launch_grouped_v<2>(a, v, s);
  if (a.nmat == 1) return launch_grouped_v<1>(a, v, s);
  throw_arg("moe grouped: nmat must be 1 or 2");
}

}  // namespace plumb::cuda::detail
