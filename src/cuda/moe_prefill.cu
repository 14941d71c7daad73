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
// down: 2 x 16 rows of w2) and all 64 tokens of the tile (8 MMA column tiles, 64 fp32 accumulators per lane). The
// weights go straight from global memory into the registers of the warp that owns them (one 16-byte load per lane
// is a fragment, prefetched one 128-column chunk ahead) and are decoded once per chunk for all 64 tokens; the
// tokens' activations are gathered by slot into shared memory, a 4-stage cp.async ring of 128-column chunks, and
// read as B fragments (one 16-byte load per lane and group). Rows per block: 128 (gate+up) / 256 (down); grid:
// (row blocks, tile bound), blocks past the device-side tile count exit at once, so nothing returns to the host.
#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace plumb::cuda::detail {

namespace {

constexpr int kWarps = 8;
constexpr int kBN = kGroupTokens;  // tokens per tile
constexpr int kNT = kBN / 8;       // MMA column tiles
constexpr int kKC = 128;           // columns per stage: one chunk of the decode layout
constexpr int kStages = 4;
// Halfs per staged token row: 320 bytes, = 64 mod 128, so an LDS.128 phase (8 lanes: 2 token rows x 64
// contiguous bytes) touches 32 distinct banks.
constexpr int kPitch = kKC + 32;
constexpr int kStageHalfs = kBN * kPitch;
constexpr size_t kSmemBytes = size_t(kStages) * kStageHalfs * 2;

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

template <int NMAT>
__global__ void __launch_bounds__(kWarps * 32, 1) grouped_kernel(const GroupedArgs a, const GroupLayout L) {
  constexpr int MT = 2 / NMAT;  // 16-row tiles per matrix and warp
  constexpr int NQ = NMAT * MT;  // A tiles per warp
  constexpr int ROWS = kWarps * 16 * MT;
  extern __shared__ __align__(16) __half xs[];  // [kStages][kBN][kPitch]
  __shared__ int slot_s[kBN];

  const int tile = int(blockIdx.y);
  if (tile >= a.groups[0]) return;
  const int e = a.groups[L.tiles + 2 * tile], start = a.groups[L.tiles + 2 * tile + 1];
  const int cnt = min(kBN, a.groups[L.offs + e + 1] - start);
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  if (tid < kBN) slot_s[tid] = tid < cnt ? a.groups[L.list + start + tid] : -1;
  __syncthreads();

  // Staging: thread tid copies 16 bytes of token rows tid/16 + 16i (i < 4), column piece tid % 16; rows past cnt
  // are zero-filled.
  const __half* x = static_cast<const __half*>(a.x);
  const __half* src[4];
  bool valid[4];
  uint32_t dst[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = tid / 16 + 16 * i, sl = slot_s[r];
    valid[i] = sl >= 0;
    src[i] = x + (valid[i] ? int64_t(sl / a.x_div) * a.x_ld : 0) + (tid % 16) * 8;
    dst[i] = smem_u32(xs + r * kPitch + (tid % 16) * 8);
  }
  const int nch = int(a.cols / kKC);
  auto stage = [&](int c) {
    if (c < nch) {
      const uint32_t off = uint32_t((c % kStages) * kStageHalfs * 2);
#pragma unroll
      for (int i = 0; i < 4; ++i) cp16_zfill(dst[i] + off, src[i] + int64_t(c) * kKC, valid[i]);
    }
    cp_commit();  // one group per chunk, empty past the end: the wait count stays uniform
  };
#pragma unroll
  for (int c = 0; c < kStages - 1; ++c) stage(c);

  // The warp's weight tiles: q = (16-row tile m, matrix mat), fragments [chunk][row half][lane][16 B] (1024 bytes
  // per chunk), scales of rows g and g + 8 as one word per chunk (4 groups).
  const int row0 = int(blockIdx.x) * ROWS + warp * 16 * MT;
  const uint8_t* pw[NQ];
  const uint32_t* ps[NQ][2];
#pragma unroll
  for (int q = 0; q < NQ; ++q) {
    const int mat = q % NMAT, rt = row0 + (q / NMAT) * 16;
    pw[q] = a.w[mat] + int64_t(e) * a.w_prob_stride + int64_t(rt) * (a.cols / 2) + lane * 16;
    const uint8_t* sb = static_cast<const uint8_t*>(a.s[mat]) + int64_t(e) * a.s_prob_stride;
    ps[q][0] = reinterpret_cast<const uint32_t*>(sb + int64_t(rt + g) * (a.cols / 32));
    ps[q][1] = reinterpret_cast<const uint32_t*>(sb + int64_t(rt + g + 8) * (a.cols / 32));
  }
  uint32_t W[NQ][2][4], S[NQ][2];
  auto load_w = [&](int c, uint32_t (&Wd)[NQ][2][4], uint32_t (&Sd)[NQ][2]) {
#pragma unroll
    for (int q = 0; q < NQ; ++q)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4 v = ldg_stream<1>(pw[q] + int64_t(c) * 1024 + h * 512);
        Wd[q][h][0] = v.x, Wd[q][h][1] = v.y, Wd[q][h][2] = v.z, Wd[q][h][3] = v.w;
        Sd[q][h] = __ldg(ps[q][h] + c);
      }
  };
  load_w(0, W, S);

  float acc[NQ][kNT][4];
#pragma unroll
  for (int q = 0; q < NQ; ++q)
#pragma unroll
    for (int n = 0; n < kNT; ++n) acc[q][n][0] = acc[q][n][1] = acc[q][n][2] = acc[q][n][3] = 0.0f;
  const int ntv = (cnt + 7) / 8;  // column tiles with a token

  for (int c = 0; c < nch; ++c) {
    cp_wait<kStages - 2>();
    __syncthreads();       // chunk c is in shared memory; every warp is done with chunk c - 1's buffer
    stage(c + kStages - 1);  // into that buffer
    uint32_t Wn[NQ][2][4], Sn[NQ][2];
    if (c + 1 < nch) load_w(c + 1, Wn, Sn);
    const __half* xb = xs + (c % kStages) * kStageHalfs + g * kPitch + t * 8;
    float sc[NQ][2][4];
#pragma unroll
    for (int q = 0; q < NQ; ++q)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        sc[q][h][0] = e8m0_byte<0>(S[q][h]), sc[q][h][1] = e8m0_byte<1>(S[q][h]);
        sc[q][h][2] = e8m0_byte<2>(S[q][h]), sc[q][h][3] = e8m0_byte<3>(S[q][h]);
      }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t f[NQ][8];
#pragma unroll
      for (int q = 0; q < NQ; ++q) fp4_frag(W[q][0][j], W[q][1][j], f[q]);
#pragma unroll
      for (int n = 0; n < kNT; ++n) {
        if (n < ntv) {
          const uint4 X = *reinterpret_cast<const uint4*>(xb + n * 8 * kPitch + j * 32);
#pragma unroll
          for (int q = 0; q < NQ; ++q) fp4_mma_group<false>(f[q], X, sc[q][0][j], sc[q][1][j], acc[q][n]);
        }
      }
    }
    if (c + 1 < nch) {
#pragma unroll
      for (int q = 0; q < NQ; ++q)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          S[q][h] = Sn[q][h];
#pragma unroll
          for (int k = 0; k < 4; ++k) W[q][h][k] = Wn[q][h][k];
        }
    }
  }

  // Lane (g, t) holds rows g and g + 8 of each 16-row tile for token columns 2t and 2t + 1 of each column tile.
#pragma unroll
  for (int n = 0; n < kNT; ++n) {
    if (n >= ntv) continue;
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) {
      const int col = n * 8 + 2 * t + cc;
      if (col >= cnt) continue;
      const int slot = slot_s[col];
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        if constexpr (NMAT == 2) {
          const int row = row0 + g + 8 * rr;
          float h = swiglu_clamped(acc[0][n][rr * 2 + cc] * kFp4Unscale, acc[1][n][rr * 2 + cc] * kFp4Unscale, a.limit);
          if (a.pre_weight) h *= a.pre_weight[slot];
          store_out<__half>(static_cast<__half*>(a.out) + int64_t(slot) * a.o_ld + row, h);
        } else {
#pragma unroll
          for (int q = 0; q < NQ; ++q) {
            const int row = row0 + q * 16 + g + 8 * rr;
            store_out<float>(static_cast<float*>(a.out) + int64_t(slot) * a.o_ld + row, acc[q][n][rr * 2 + cc] * kFp4Unscale);
          }
        }
      }
    }
  }
}

template <int NMAT>
void launch_grouped_t(const GroupedArgs& a, Stream s) {
  constexpr int ROWS = kWarps * 16 * (2 / NMAT);
  if (a.rows % ROWS) throw_arg("moe grouped: rows must be a multiple of " + std::to_string(ROWS));
  // The shared-memory opt-in, once per device for this instantiation.
  static bool set[64] = {};
  int dev = 0;
  PLUMB_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 64 && !set[dev]) {
    PLUMB_CUDA_CHECK(cudaFuncSetAttribute(grouped_kernel<NMAT>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes)));
    set[dev] = true;
  }
  const GroupLayout L = group_layout(a.slots, a.E);
  const dim3 grid(unsigned(a.rows / ROWS), unsigned(L.max_tiles));
  grouped_kernel<NMAT><<<grid, kWarps * 32, kSmemBytes, s>>>(a, L);
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
  if (a.nmat == 2) return launch_grouped_t<2>(a, s);
  if (a.nmat == 1) return launch_grouped_t<1>(a, s);
  throw_arg("moe grouped: nmat must be 1 or 2");
}

}  // namespace plumb::cuda::detail
