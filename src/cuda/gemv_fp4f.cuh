// MXFP4 routed experts at decode in one launch: gate/up + SwiGLU, then down (included by gemv.cu after the
// per-tile and streaming kernels, whose helpers it uses). The same bits as the per-tile kernel's two launches.
//
// Why one launch: at batch 1 each part is short (V4-Flash: gate+up 53.5 MB, down 26.7 MB) and a launch pays a ramp
// and a tail: a launch that only reads down's bytes reaches 74.6 % of copy on an H200, one that reads both parts'
// bytes 96.9 % (`plumb bench --only moe`, reference rows). Here down's blocks load their weights while the last
// gate/up tiles run.
//
// Work: units in ticket order (an atomic counter, not blockIdx: a block takes its ticket once running, so every unit
// a waiting block depends on belongs to a block already running: no deadlock, whatever the block scheduler does).
//   units [0, NA): gate/up, (entry, 16-row tile of I): 2 warps, each half of D's chunks, reduced in warp order (the
//     per-tile kernel with 2 warps); warp 0 writes h (f16) and counts the tile done for its entry (release);
//   units [NA, NA + NB): down, (entry, 32 rows of D): each warp a 16-row tile over the whole I (the per-tile kernel
//     with 1 warp). It loads its first PRE chunks of weights, waits until its entry's I / 16 gate/up tiles are done
//     (acquire), copies the entry's h rows into shared memory (L2 reads: written in this launch), then computes.
// An entry is up to 8 tokens of one expert (group_slots: slot order, as both decode kernels pass over them). The
// last block to finish zeroes the counters for the next launch (sync: [0] tickets, [1] finished blocks, [2 + i]
// entry i's finished gate/up tiles).
#pragma once

namespace fp4f {

using fp4s::ent_expert;
using fp4s::ent_first;
using fp4s::ent_tokens;
using fp4s::group_slots;

constexpr int kThreads = 64;  // 2 warps
constexpr int kMaxSlots = kFusedMaxSlots;

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// The FP4 tile pointers of one matrix of expert e (the per-tile kernel's pa / pb / ps): rows g and g + 8 of 16-row
// tile `tile`, from 128-column chunk cb.
__device__ __forceinline__ void tile_ptrs(const GemvArgs& a, int q, int e, int tile, int cb, int lane, const uint8_t*& pa,
                                          const uint8_t*& pb, const uint8_t* (&ps)[2]) {
  const int g = lane >> 2;
  pa = a.w[q] + int64_t(e) * a.w_prob_stride + int64_t(tile) * 8 * a.cols + int64_t(cb) * 1024 + lane * 16;
  pb = pa + 512;
  const uint8_t* sb = static_cast<const uint8_t*>(a.s[q]) + int64_t(e) * a.s_prob_stride;
  const int64_t row_a = int64_t(tile) * 16 + g;
  ps[0] = sb + row_a * a.s_ld + int64_t(cb) * 4;
  ps[1] = sb + (row_a + 8) * a.s_ld + int64_t(cb) * 4;
}

// One gate/up unit: the per-tile kernel's block of 2 warps on (entry, tile), h for the entry's tokens.
template <int UA, bool MP1>
__device__ __forceinline__ void gate_up_unit(const GemvArgs& a, int ent, int tile, const short* sorted, float (&red)[2][8][32]) {
  const int warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
  const int e = ent_expert(ent), s0 = ent_first(ent), mp = ent_tokens(ent);
  const int total = int(a.cols / 128), cb = total * warp / 2, nch = total * (warp + 1) / 2 - cb;
  const uint8_t* pa[2];
  const uint8_t* pb[2];
  const uint8_t* ps[2][2];
  for (int q = 0; q < 2; ++q) tile_ptrs(a, q, e, tile, cb, lane, pa[q], pb[q], ps[q]);
  const __half* xp = nullptr;
  if (g < mp) xp = static_cast<const __half*>(a.x) + int64_t(sorted[s0 + g] / a.topk) * a.x_tok_stride + int64_t(cb) * 128 + t * 8;
  float acc[2][4] = {};
  auto step = [&](auto uconst, int c) {
    constexpr int UU = decltype(uconst)::value;
    uint4 A[UU][2], B[UU][2], X[UU][4];
    uint32_t SA[UU][2], SB[UU][2];
    fp4_load_w<UU, 2, false>(pa, pb, ps, c, A, B, SA, SB);
#pragma unroll
    for (int u = 0; u < UU; ++u)
#pragma unroll
      for (int j = 0; j < 4; ++j) X[u][j] = xp ? load_x8(xp + (c + u) * 128 + j * 32) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < UU; ++u) fp4_math<2, MP1>(A[u], B[u], SA[u], SB[u], X[u], acc);
  };
  int c = 0;
  for (; c + UA <= nch; c += UA) step(std::integral_constant<int, UA>{}, c);
  for (; c < nch; ++c) step(std::integral_constant<int, 1>{}, c);
#pragma unroll
  for (int q = 0; q < 2; ++q)
#pragma unroll
    for (int k = 0; k < 4; ++k) red[warp][q * 4 + k][lane] = acc[q][k];
  __syncthreads();
  if (warp == 0) {
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = 0.0f + red[0][i][lane] + red[1][i][lane];  // the per-tile kernel's order
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) {
      const int j = 2 * t + cc;
      if (j >= mp) continue;
      const int slot = sorted[s0 + j];
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int64_t row = int64_t(tile) * 16 + g + 8 * rr;
        const float r = epilogue<kSwiglu>(a, v[rr * 2 + cc] * kFp4Unscale, v[4 + rr * 2 + cc] * kFp4Unscale, slot);
        store_out<__half>(static_cast<__half*>(a.out) + int64_t(slot) * a.o_tok_stride + row, r);
      }
    }
  }
}

// One down unit's warp: 16-row tile `tile` of expert e over the whole K (= I), weights' first PRE chunks in
// registers since before the wait (A, B, SA, SB), the activations from shared memory (hs: the entry's rows, ld
// halves apart), the rest of the chunks loaded 4 at a time.
template <int PRE, bool MP1>
__device__ __forceinline__ void down_tile(const GemvArgs& a, int ent, int tile, const short* sorted, const __half* hs, int ld,
                                          const uint8_t* (&pa)[1], const uint8_t* (&pb)[1], const uint8_t* (&ps)[1][2],
                                          const uint4 (&A)[PRE][1], const uint4 (&B)[PRE][1], const uint32_t (&SA)[PRE][1],
                                          const uint32_t (&SB)[PRE][1]) {
  const int lane = int(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
  const int s0 = ent_first(ent), mp = ent_tokens(ent);
  const int nch = int(a.cols / 128);
  const __half* xp = g < mp ? hs + g * ld + t * 8 : nullptr;
  float acc[1][4] = {};
  auto xchunk = [&](int c, uint4 (&X)[4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) X[j] = xp ? *reinterpret_cast<const uint4*>(xp + c * 128 + j * 32) : make_uint4(0, 0, 0, 0);
  };
#pragma unroll
  for (int c = 0; c < PRE; ++c) {
    if (c < nch) {
      uint4 X[4];
      xchunk(c, X);
      fp4_math<1, MP1>(A[c], B[c], SA[c], SB[c], X, acc);
    }
  }
  for (int c = PRE; c < nch; c += 4) {  // (nch % 4 == 0 when nch > PRE: moe_fused_refusal)
    uint4 A2[4][1], B2[4][1];
    uint32_t SA2[4][1], SB2[4][1];
    fp4_load_w<4, 1, false>(pa, pb, ps, c, A2, B2, SA2, SB2);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      uint4 X[4];
      xchunk(c + u, X);
      fp4_math<1, MP1>(A2[u], B2[u], SA2[u], SB2[u], X, acc);
    }
  }
#pragma unroll
  for (int cc = 0; cc < 2; ++cc) {
    const int j = 2 * t + cc;
    if (j >= mp) continue;
    const int slot = sorted[s0 + j];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int64_t row = int64_t(tile) * 16 + g + 8 * rr;
      const float v = 0.0f + acc[0][rr * 2 + cc];  // the per-tile kernel's one-warp reduction
      store_out<float>(static_cast<float*>(a.out) + int64_t(slot) * a.o_tok_stride + row, epilogue<kStore>(a, v * kFp4Unscale, 0.0f, slot));
    }
  }
}

// One unit (see the header comment): gate/up tiles below na, down tile pairs from there.
template <int PRE, int UA>
__device__ __forceinline__ void run_unit(const MoeFusedArgs& f, int unit, int na, int tiles_a, int pairs_b, const int* ent_s,
                                         const short* sorted_s, float (&red)[2][8][32], __half* hs, unsigned* done) {
  const GemvArgs& gu = f.gu;
  const GemvArgs& dn = f.dn;
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  if (unit < na) {
    const int ei = unit / tiles_a, ent = ent_s[ei];
    if (ent_tokens(ent) == 1) gate_up_unit<UA, true>(gu, ent, unit % tiles_a, sorted_s, red);
    else gate_up_unit<UA, false>(gu, ent, unit % tiles_a, sorted_s, red);
    if (warp == 0) {  // h's stores of this tile, then the count (release)
      __threadfence();
      __syncwarp();
      if (lane == 0) atomicAdd(done + ei, 1u);
    }
  } else {
    const int ei = (unit - na) / pairs_b, ent = ent_s[ei];
    const int tile = (unit - na) % pairs_b * 2 + warp;
    const uint8_t* pa[1];
    const uint8_t* pb[1];
    const uint8_t* ps[1][2];
    tile_ptrs(dn, 0, ent_expert(ent), tile, 0, lane, pa[0], pb[0], ps[0]);
    const int nch = int(dn.cols / 128);
    uint4 A[PRE][1], B[PRE][1];
    uint32_t SA[PRE][1], SB[PRE][1];
#pragma unroll
    for (int c = 0; c < PRE; ++c) {
      if (c < nch) {
        A[c][0] = ldg_stream<1, true>(pa[0] + c * 1024);
        B[c][0] = ldg_stream<1, true>(pb[0] + c * 1024);
        SA[c][0] = __ldg(reinterpret_cast<const uint32_t*>(ps[0][0]) + c);
        SB[c][0] = __ldg(reinterpret_cast<const uint32_t*>(ps[0][1]) + c);
      }
    }
    if (tid == 0) {
      unsigned ns = 32;
      while (ld_acquire(done + ei) < unsigned(tiles_a)) {
        __nanosleep(ns);
        ns = min(ns * 2, 256u);
      }
    }
    __syncthreads();
    // The entry's h rows (mp x I halves, written in this launch: L2 reads) into shared memory, rows padded by 8
    // halves so that the 8 row groups of a warp's reads fall on different banks.
    const int mp = ent_tokens(ent), s0 = ent_first(ent);
    const int I = int(dn.cols), ld = I + 8;
    const int per_row = I / 8;  // 16-byte pieces
    for (int i = tid; i < mp * per_row; i += kThreads) {
      const int r = i / per_row, k = i % per_row;
      const auto* src = reinterpret_cast<const uint4*>(static_cast<const __half*>(dn.x) + int64_t(sorted_s[s0 + r]) * dn.x_tok_stride) + k;
      *reinterpret_cast<uint4*>(hs + r * ld + k * 8) = __ldcg(src);
    }
    __syncthreads();
    if (mp == 1) down_tile<PRE, true>(dn, ent, tile, sorted_s, hs, ld, pa, pb, ps, A, B, SA, SB);
    else down_tile<PRE, false>(dn, ent, tile, sorted_s, hs, ld, pa, pb, ps, A, B, SA, SB);
  }
}

template <int PRE, int UA>
__global__ void __launch_bounds__(kThreads, 1) moe_fused_kernel(const MoeFusedArgs f) {
  extern __shared__ __align__(16) uint8_t hsm[];  // down units: the entry's h rows
  __shared__ float red[2][8][32];
  __shared__ int scratch[7 * kMaxSlots];
  __shared__ short sorted_s[kMaxSlots];
  __shared__ int ent_s[kMaxSlots];
  __shared__ int nent_s;
  __shared__ unsigned next_s;
  const GemvArgs& gu = f.gu;
  const GemvArgs& dn = f.dn;
  const int tid = int(threadIdx.x);
  if (gu.pdl > 0) pdl_begin();
  if (tid == 0) next_s = atomicAdd(f.sync, 1u);
  group_slots(gu.idx, gu.n * gu.topk, gu.problems, kMaxSlots, scratch, sorted_s, ent_s, &nent_s);  // (ends with a barrier)
  const int nent = nent_s;
  const int tiles_a = int(gu.rows / 16), pairs_b = int(dn.rows / 32);
  const int na = nent * tiles_a, nb = nent * pairs_b;
  unsigned* done = f.sync + 2;
  // Persistent blocks: each takes units until the tickets run out. The next ticket is taken while a unit runs (its
  // latency hidden); a block waiting in a down unit then holds a later ticket, also a down unit (all gate/up tickets
  // come first), which nothing waits on.
  for (;;) {
    const int unit = int(next_s);
    __syncthreads();  // every thread has read it before thread 0 takes the next
    if (unit >= na + nb) break;
    if (tid == 0) next_s = atomicAdd(f.sync, 1u);
    run_unit<PRE, UA>(f, unit, na, tiles_a, pairs_b, ent_s, sorted_s, red, reinterpret_cast<__half*>(hsm), done);
    __syncthreads();  // the unit's shared memory reads are done; next_s is visible
  }
  // Finished: the last block (all others have taken their last tickets and are done) zeroes the counters.
  if (tid == 0) {
    __threadfence();
    if (atomicAdd(f.sync + 1, 1u) == gridDim.x - 1) {
      f.sync[0] = 0u, f.sync[1] = 0u;
      for (int i = 0; i < nent; ++i) done[i] = 0u;
      __threadfence();
    }
  }
}

// Dynamic shared memory of a launch: the h rows of the largest entry (<= 8 slots; fewer when the launch has fewer).
inline size_t fused_smem(const GemvArgs& dn) { return size_t(std::min(8, dn.n * dn.topk)) * size_t(dn.cols + 8) * 2; }

template <int PRE, int UA>
void launch_fused_cfg(const MoeFusedArgs& f, Stream s) {
  auto kern = moe_fused_kernel<PRE, UA>;
  const size_t smem = fused_smem(f.dn);
  static size_t smem_set[8] = {};
  static int per_sm_cache[8][9] = {};  // by device and rows of h in shared memory (1..8)
  int dev = 0;
  PLUMB_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev >= 8) throw_arg("moe fused: supports devices 0..7");
  if (smem > 48 * 1024 && smem > smem_set[dev]) {
    PLUMB_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    smem_set[dev] = smem;
  }
  // One wave of persistent blocks (host queries once per configuration, outside any capture in practice), at most
  // one per unit of n * topk entries.
  const int rows = std::min(8, f.dn.n * f.dn.topk);
  int& per_sm = per_sm_cache[dev][rows];
  if (per_sm == 0) {
    PLUMB_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, kThreads, smem));
    if (per_sm < 1) throw_arg("moe fused: the kernel does not fit on an SM with " + std::to_string(smem) + " bytes of shared memory");
  }
  const int slots = f.gu.n * f.gu.topk;
  const unsigned grid = unsigned(std::min<int64_t>(int64_t(sm_count()) * per_sm, int64_t(slots) * (f.gu.rows / 16 + f.dn.rows / 32)));
  launch_as(f.gu.pdl > 0, "moe_fused_kernel", kern, dim3(grid), dim3(kThreads), smem, s, f);
}

}  // namespace fp4f
