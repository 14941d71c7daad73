// Prefill MoE on MXFP4 experts (W4A16): the routing grouped per expert on the device, then grouped GEMMs (gate+up
// with SwiGLU, down) in which a block reads its expert's weight rows once for a tile of up to 64 tokens.
//
// Numerics are the decode kernels' (gemv.cu): f16 activations, the E2M1 codes turned into f16 by bit placement
// (exact, fp4_frag), two mma.m16n8k16 per 32-column scale group into a fresh fp32 partial sum that the group's E8M0
// scale multiplies into the fp32 accumulator (fp4_mma_group), K in increasing order; the same SwiGLU epilogue.
// Only the grouping of tokens into MMA columns differs, and columns do not interact in an MMA, so each output is
// the same sum in the same order as one warp of the decode kernel would form over all of K.
//
// Block tile: 8 warps; a warp owns 32 weight rows (gate+up: the same 16 rows of w1 and w3, for the fused SwiGLU;
// down: 2 x 16 rows of w2) and all 64 tokens of the tile (8 MMA column tiles, 64 fp32 accumulators per lane). Its
// weights are decoded once per 128-column chunk for all 64 tokens. The tokens' activations are gathered by slot
// into shared memory, a 4-stage cp.async ring of 128-column chunks, and read as B fragments (one 16-byte load per
// lane and group). Rows per block: 128 (gate+up) / 256 (down); grid: (row blocks, tile bound), blocks past the
// device-side tile count exit at once, so nothing returns to the host. Two variants (GroupedArgs::variant):
//   0 "registers": a warp's weight fragments go from global memory straight into its registers (one 16-byte load
//     per lane is a fragment), one chunk ahead; column tiles past the tile's tokens are skipped by a run-time test.
//   1 "staged" (the default): the weight fragments and scales ride in the activations' cp.async ring (each warp
//     copies its own, 4 stages deep), and the column-tile loop is specialized for 2, 4, 6 or 8 column tiles:
//     straight-line code whose 2 x NTV MMA chains the compiler interleaves (a run-time test per column tile cuts
//     the loop into 2-chain blocks). 255 registers with a few spilled words (ptxas: 64 / 156 bytes of spill
//     stores for down / gate+up), still the fastest.
// H200, `plumb bench` (bench/results/h200-moe-prefill-run3), TFLOP/s gate+up / down: 8K tokens: variant 0 188 / 189,
// variant 1 226 / 240; 1K tokens: 115 / 116 and 157 / 159 (run2 holds the dropped variants). Two variants measured there and dropped: the staging
// alone with the run-time test per column tile (173 / 179 at 8K: slower than variant 0) and per batch of 4
// column tiles (217 / 226, no spills).
#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace plumb::cuda::detail {

namespace {

constexpr int kWarps = 8;
constexpr int kBN = kGroupTokens;  // tokens per tile
constexpr int kNT = kBN / 8;       // MMA column tiles
constexpr int kKC = 128;           // columns per stage: one chunk of the decode layout
constexpr int kStages = 4;
constexpr int kGroupedDefaultVariant = 1;  // GroupedArgs::variant < 0
// Halfs per staged token row: 320 bytes, = 64 mod 128, so an LDS.128 phase (8 lanes: 2 token rows x 64
// contiguous bytes) touches 32 distinct banks.
constexpr int kPitch = kKC + 32;
constexpr int kStageHalfs = kBN * kPitch;
constexpr int kXBytes = kStageHalfs * 2;
// Variant 1's stage: the activations, then per warp its weight fragments [q 2][row half 2][lane 32][16 B] and its
// scales [lane 32][4 B] (lane 4g + 2q + h holds the scale word of row g + 8h of tile q).
constexpr int kWBytes = kWarps * 2 * 2 * 512, kSBytes = kWarps * 32 * 4;
template <int VARIANT>
__host__ __device__ constexpr size_t stage_bytes() { return VARIANT != 0 ? size_t(kXBytes + kWBytes + kSBytes) : size_t(kXBytes); }

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

__device__ __forceinline__ void cp4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}

// The per-block state of a tile: its expert's weight rows for this warp, the activation rows it gathers.
template <int NMAT>
struct Tile {
  static constexpr int MT = 2 / NMAT;   // 16-row tiles per matrix and warp
  static constexpr int NQ = NMAT * MT;  // A tiles per warp (2: both kernels)
  static constexpr int ROWS = kWarps * 16 * MT;
  const uint8_t* pw[NQ];        // this lane's fragment of chunk 0, row half 0, of A tile q
  const uint32_t* ps[NQ][2];    // the scale words of rows g and g + 8 of A tile q
  const __half* src[4];         // activation pieces this thread copies: token rows tid/16 + 16i, piece tid % 16
  bool valid[4];
  uint32_t dst[4];
  int row0;

  __device__ Tile(const GroupedArgs& a, int e, const __half* xs, const int* slot_s) {
    const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31, g = lane >> 2;
    row0 = int(blockIdx.x) * ROWS + warp * 16 * MT;
#pragma unroll
    for (int q = 0; q < NQ; ++q) {
      const int mat = q % NMAT, rt = row0 + (q / NMAT) * 16;
      pw[q] = a.w[mat] + int64_t(e) * a.w_prob_stride + int64_t(rt) * (a.cols / 2) + lane * 16;
      const uint8_t* sb = static_cast<const uint8_t*>(a.s[mat]) + int64_t(e) * a.s_prob_stride;
      ps[q][0] = reinterpret_cast<const uint32_t*>(sb + int64_t(rt + g) * (a.cols / 32));
      ps[q][1] = reinterpret_cast<const uint32_t*>(sb + int64_t(rt + g + 8) * (a.cols / 32));
    }
    const __half* x = static_cast<const __half*>(a.x);
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // rows past the tile's tokens are zero-filled (computed in vain, never stored)
      const int r = tid / 16 + 16 * i, sl = slot_s[r];
      valid[i] = sl >= 0;
      src[i] = x + (valid[i] ? int64_t(sl / a.x_div) * a.x_ld : 0) + (tid % 16) * 8;
      dst[i] = smem_u32(xs + r * kPitch + (tid % 16) * 8);
    }
  }

};

// Variant 0's and 1's K loops share the tile setup (Tile), the activation staging and the epilogue (store_tile).
template <int NMAT, int NTV>
__device__ __forceinline__ void store_tile(const GroupedArgs& a, const Tile<NMAT>& T, const float (&acc)[2][NTV][4], int cnt,
                                           const int* slot_s) {
  const int lane = int(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
  // Lane (g, t) holds rows g and g + 8 of each 16-row tile for token columns 2t and 2t + 1 of each column tile.
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
          const int row = T.row0 + g + 8 * rr;
          float h = swiglu_clamped(acc[0][n][rr * 2 + cc] * kFp4Unscale, acc[1][n][rr * 2 + cc] * kFp4Unscale, a.limit);
          if (a.pre_weight) h *= a.pre_weight[slot];
          store_out<__half>(static_cast<__half*>(a.out) + int64_t(slot) * a.o_ld + row, h);
        } else {
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            const int row = T.row0 + q * 16 + g + 8 * rr;
            store_out<float>(static_cast<float*>(a.out) + int64_t(slot) * a.o_ld + row, acc[q][n][rr * 2 + cc] * kFp4Unscale);
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

// Variant 0: weights from global memory into registers, one chunk ahead; column tiles tested at run time.
template <int NMAT>
__device__ __forceinline__ void tile_registers(const GroupedArgs& a, Tile<NMAT>& T, int cnt, __half* xs, const int* slot_s) {
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
  store_tile<NMAT, kNT>(a, T, acc, cnt, slot_s);
}

// Variant 1: weights and scales staged in shared memory with the activations; NTV column tiles, straight-line.
template <int NMAT, int NTV>
__device__ __forceinline__ void tile_staged(const GroupedArgs& a, Tile<NMAT>& T, int cnt, __half* xs, const int* slot_s) {
  const int warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
  const int nch = int(a.cols / kKC);
  constexpr uint32_t SB = uint32_t(stage_bytes<1>());
  const uint32_t base = smem_u32(xs);
  // This lane's copies of the warp's weights: fragment (q, h) to [warp][q][h][lane]; scale word (q, h) = (lane >> 1
  // & 1, lane & 1) of row g (+ 8h) to [warp][lane].
  const uint32_t wdst = base + kXBytes + uint32_t(warp) * 2048 + uint32_t(lane) * 16;
  const uint32_t sdst = base + kXBytes + kWBytes + uint32_t(warp * 32 + lane) * 4;
  const uint32_t* ssrc = (lane & 2) ? ((lane & 1) ? T.ps[1][1] : T.ps[1][0]) : ((lane & 1) ? T.ps[0][1] : T.ps[0][0]);  // no run-time index: T stays in registers
  auto stage = [&](int c) {
    if (c < nch) {
      const uint32_t off = uint32_t(c % kStages) * SB;
#pragma unroll
      for (int i = 0; i < 4; ++i) cp16_zfill(T.dst[i] + off, T.src[i] + int64_t(c) * kKC, T.valid[i]);
#pragma unroll
      for (int q = 0; q < 2; ++q)
#pragma unroll
        for (int h = 0; h < 2; ++h) cp16(wdst + off + uint32_t(q * 2 + h) * 512, T.pw[q] + int64_t(c) * 1024 + h * 512);
      cp4(sdst + off, ssrc + c);
    }
    cp_commit();
  };
#pragma unroll
  for (int c = 0; c < kStages - 1; ++c) stage(c);
  float acc[2][NTV][4] = {};
  const uint8_t* sm = reinterpret_cast<const uint8_t*>(xs);
  for (int c = 0; c < nch; ++c) {
    cp_wait<kStages - 2>();
    __syncthreads();
    stage(c + kStages - 1);
    const uint8_t* st = sm + size_t(c % kStages) * SB;
    uint32_t W[2][2][4], S[2][2];
#pragma unroll
    for (int q = 0; q < 2; ++q)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4 v = *reinterpret_cast<const uint4*>(st + kXBytes + warp * 2048 + (q * 2 + h) * 512 + lane * 16);
        W[q][h][0] = v.x, W[q][h][1] = v.y, W[q][h][2] = v.z, W[q][h][3] = v.w;
      }
    const uint4 sv = *reinterpret_cast<const uint4*>(st + kXBytes + kWBytes + (warp * 32 + g * 4) * 4);
    S[0][0] = sv.x, S[0][1] = sv.y, S[1][0] = sv.z, S[1][1] = sv.w;
    const __half* xb = reinterpret_cast<const __half*>(st) + g * kPitch + t * 8;
#pragma unroll
    for (int j = 0; j < 4; ++j) group_mma<NTV, NTV>(W, S, j, xb, NTV, acc);
  }
  store_tile<NMAT, NTV>(a, T, acc, cnt, slot_s);
}

// Grid (row blocks, tile bound); blocks past the tile count exit.
template <int NMAT, int VARIANT>
__global__ void __launch_bounds__(kWarps * 32, 1) grouped_kernel(const GroupedArgs a, const GroupLayout L) {
  extern __shared__ __align__(16) __half xs[];  // [kStages][stage_bytes<VARIANT>()]
  __shared__ int slot_s[kBN];
  const int tile = int(blockIdx.y);
  if (tile >= a.groups[0]) return;
  const int e = a.groups[L.tiles + 2 * tile], start = a.groups[L.tiles + 2 * tile + 1];
  const int cnt = min(kBN, a.groups[L.offs + e + 1] - start);
  const int tid = int(threadIdx.x);
  if (tid < kBN) slot_s[tid] = tid < cnt ? a.groups[L.list + start + tid] : -1;
  __syncthreads();
  Tile<NMAT> T(a, e, xs, slot_s);
  if constexpr (VARIANT == 0) {
    tile_registers<NMAT>(a, T, cnt, xs, slot_s);
  } else {  // 2, 4, 6 or 8 column tiles: at most one computed in vain
    const int ntv = (cnt + 7) / 8;
    if (ntv <= 2) tile_staged<NMAT, 2>(a, T, cnt, xs, slot_s);
    else if (ntv <= 4) tile_staged<NMAT, 4>(a, T, cnt, xs, slot_s);
    else if (ntv <= 6) tile_staged<NMAT, 6>(a, T, cnt, xs, slot_s);
    else tile_staged<NMAT, kNT>(a, T, cnt, xs, slot_s);
  }
}

template <int NMAT, int VARIANT>
void launch_grouped_t(const GroupedArgs& a, Stream s) {
  constexpr int ROWS = Tile<NMAT>::ROWS;
  if (a.rows % ROWS) throw_arg("moe grouped: rows must be a multiple of " + std::to_string(ROWS));
  constexpr size_t smem = size_t(kStages) * stage_bytes<VARIANT>();
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
  const int v = a.variant < 0 ? kGroupedDefaultVariant : a.variant;
  if (v > 1) throw_arg("moe grouped: variant must be 0 or 1");
  if (a.nmat == 2) return v == 0 ? launch_grouped_t<2, 0>(a, s) : launch_grouped_t<2, 1>(a, s);
  if (a.nmat == 1) return v == 0 ? launch_grouped_t<1, 0>(a, s) : launch_grouped_t<1, 1>(a, s);
  throw_arg("moe grouped: nmat must be 1 or 2");
}

}  // namespace plumb::cuda::detail
