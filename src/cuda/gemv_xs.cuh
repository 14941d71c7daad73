// FP8 (W8A16) dense GEMV for 9-64 tokens with the activations shared in shared memory (GemvArgs::shared_x):
// included by gemv.cu after gemv_kernel, whose arithmetic it repeats per warp.
//
// Why: above 8 tokens gemv_kernel's warps each load their tokens' activations from L2 for every 16-row tile, so at
// 32 tokens a projection re-reads ~4x its weight bytes of activations (wq_b [32768, 1024]: 128 MB of L2 reads for
// 33.5 MB of weights) and runs at 23-30 % of copy. Here a block's warps each own a 16-row tile of their own and
// walk the same K range, so the block stages that range of the tokens' activations in shared memory once
// (cp.async) and every warp reads it from there; the weights stream from HBM into registers as before.
//
// Same bits as gemv_kernel with one warp per block (each warp the whole K range of its block, no block reduction)
// and the same blocks along K (a.kblocks) and token groups (NP): per chunk the same MMAs in the same order into a
// fresh partial per token group, acc += partial * scale, then 0 + acc per block and the blocks summed in order
// from 0 by the last to finish. (Test: CudaFp8.SharedActivationsGiveOneWarpBlocksBits.)
//
// Shared memory: [chunk of the block's range][8 NP token rows][16 slots of 16 bytes] (f16), zero rows past the
// pass's tokens. Lane (g, t) reads token 8 jg + g's slots 4t + j (j = 0..3: the elements 32t + 8j .. + 7 of the
// chunk, gemv_kernel's fragment mapping); the slot's place in the row is swizzled (xs_slot) so that each 8-lane
// phase of a 16-byte load (tokens 2p and 2p + 1, t = 0..3) hits 8 distinct bank groups.
namespace xs {

constexpr int kSlotBytes = 16, kRowBytes = 256;  // a token's 128 f16 of one chunk

__device__ __forceinline__ int xs_slot(int s, int r) { return s ^ ((s >> 3) & 1) ^ ((r & 1) << 1); }


// NMAT matrices (2: gate and up, SwiGLU), NP groups of 8 tokens per pass, U chunks' weight loads in flight per warp.
template <int NMAT, int EPI, class OT, int NP, int U>
__global__ void __launch_bounds__(kMaxWarps * 32, 1) gemv_xs_kernel(const GemvArgs a) {
  constexpr int NV = NMAT * 4, NT = 8 * NP;  // accumulators per lane and token group; token rows per pass
  extern __shared__ __align__(16) uint8_t xs_smem[];
  const int warps = int(blockDim.x >> 5);
  const int warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
  const int prob = int(blockIdx.y);
  const int tile = int(blockIdx.x) * warps + warp;
  const uint64_t wpol = weight_policy(a.l2_evict_first);  // cuda.l2_evict_first
  const bool live = int64_t(tile) * 16 < a.rows;  // (a warp past the rows still stages and meets the barriers)
  const int total = int(a.cols / 128), Z = int(gridDim.z), z = int(blockIdx.z);
  const int cb = int(int64_t(total) * z / Z), ce = int(int64_t(total) * (z + 1) / Z), nch = ce - cb;

  const uint8_t* wsel[NMAT];
  const uint8_t* pa[NMAT];
  const uint8_t* pb[NMAT];
  const uint8_t* ps[NMAT];
  const int64_t row_a = int64_t(live ? tile : 0) * 16 + g, row_b = row_a + 8;
#pragma unroll
  for (int q = 0; q < NMAT; ++q) {
    wsel[q] = a.w[q] + int64_t(prob) * a.w_prob_stride;
    const uint8_t* base = wsel[q] + int64_t(cb) * 128 + t * 32;
    pa[q] = base + row_a * a.cols;
    pb[q] = base + row_b * a.cols;
    ps[q] = static_cast<const uint8_t*>(a.s[q]) + int64_t(prob) * a.s_prob_stride +
            ((int64_t(live ? tile : 0) * 16 / 128) * a.s_ld + cb) * (a.s_f32 ? 4 : 1);
  }
  if (a.pdl > 0) {  // weights are never written during a forward: their first chunks may be on their way already
    if (live && t == 0)
#pragma unroll
      for (int q = 0; q < NMAT; ++q)
        for (int c = 0; c < min(nch, U); ++c) prefetch_l2(pa[q] + c * 128), prefetch_l2(pb[q] + c * 128);
    pdl_begin();
  }
  const uint32_t sbase = smem_u32(xs_smem);

  for (int p0 = 0; p0 < a.n; p0 += NT) {
    const int mp = min(NT, a.n - p0);
    if (p0 > 0) __syncthreads();  // every warp is done with the previous pass's activations
    // Stage the pass's activations of this block's K range (zeros past its tokens). (Unsigned piece indices: NT is
    // a power of two, so the row and chunk are a mask and a shift; signed ones cost a division's fix-ups per piece,
    // ~7 % of the stall samples at 64 tokens under ncu.)
    const unsigned pieces = unsigned(nch) * NT * 16;
    const __half* xb = static_cast<const __half*>(a.x) + int64_t(prob) * a.x_prob_stride + int64_t(cb) * 128;
#pragma unroll 4
    for (unsigned i = threadIdx.x; i < pieces; i += blockDim.x) {
      const int s = int(i & 15u), r = int((i >> 4) % NT), c = int((i >> 4) / NT);
      const bool valid = r < mp;
      const __half* src = xb + (valid ? int64_t(p0 + r) * a.x_tok_stride : 0) + int64_t(c) * 128 + s * 8;
      cp16_zfill(sbase + uint32_t(((c * NT + r) * 16 + xs_slot(s, r)) * kSlotBytes), src, valid);
    }
    cp_commit();

    float accg[NP][NMAT][4];
#pragma unroll
    for (int jg = 0; jg < NP; ++jg)
#pragma unroll
      for (int q = 0; q < NMAT; ++q) accg[jg][q][0] = accg[jg][q][1] = accg[jg][q][2] = accg[jg][q][3] = 0.0f;
    // This lane's slot addresses in chunk 0 of the stage, group 0 (token g, slots 4t + j); group jg's token 8 jg + g
    // is 8 jg rows further with the same swizzle (8 jg is even): an immediate offset.
    uint32_t xa[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) xa[j] = uint32_t((g * 16 + xs_slot(4 * t + j, g)) * kSlotBytes);

    bool staged = false;
    auto body = [&](auto uconst, int c) {
      constexpr int UU = decltype(uconst)::value;
      uint4 A[UU][NMAT][2], B[UU][NMAT][2];
      float S[UU][NMAT];
      if (live) load_fp8_chunks<UU, NMAT>(pa, pb, ps, a.s_f32, c, wpol, A, B, S);
      if (!staged) {  // the first weights are in flight: now wait for the activations
        cp_wait<0>();
        __syncthreads();
        staged = true;
      }
      if (!live) return;
#pragma unroll
      for (int u = 0; u < UU; ++u) {
        const uint32_t coff = uint32_t((c + u) * NT * kRowBytes);
        float d[NP][NMAT][4];
#pragma unroll
        for (int jg = 0; jg < NP; ++jg)
#pragma unroll
          for (int q = 0; q < NMAT; ++q) d[jg][q][0] = d[jg][q][1] = d[jg][q][2] = d[jg][q][3] = 0.0f;
        // Slot j feeds MMAs 2j and 2j + 1 of every matrix and group; each (group, matrix) partial still takes its
        // MMAs in gemv_kernel's order i = 0..7.
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          uint4 X[NP];
#pragma unroll
          for (int jg = 0; jg < NP; ++jg) X[jg] = *reinterpret_cast<const uint4*>(xs_smem + xa[j] + coff + 8 * kRowBytes * jg);
#pragma unroll
          for (int q = 0; q < NMAT; ++q)
#pragma unroll
            for (int ii = 0; ii < 2; ++ii) {
              const int i = 2 * j + ii;
              uint32_t a0, a1, a2, a3;
              e4m3x4_to_f16x2(word(A[u][q][i / 4], i % 4), a0, a2);
              e4m3x4_to_f16x2(word(B[u][q][i / 4], i % 4), a1, a3);
#pragma unroll
              for (int jg = 0; jg < NP; ++jg) mma_f16(d[jg][q], a0, a1, a2, a3, word(X[jg], 2 * ii), word(X[jg], 2 * ii + 1));
            }
        }
#pragma unroll
        for (int jg = 0; jg < NP; ++jg)
#pragma unroll
          for (int q = 0; q < NMAT; ++q)
#pragma unroll
            for (int k = 0; k < 4; ++k) accg[jg][q][k] = fmaf(d[jg][q][k], S[u][q], accg[jg][q][k]);
      }
    };
    {
      int c = 0;
      for (; c + U <= nch; c += U) body(std::integral_constant<int, U>{}, c);
      for (; c < nch; ++c) body(std::integral_constant<int, 1>{}, c);
      if (!staged) {  // (an empty K range: still meet the barrier)
        cp_wait<0>();
        __syncthreads();
      }
    }
    if (!live) continue;

    // gemv_kernel's block reduction with one warp (0 + acc), then its reduction across blocks along K.
    float v[NP * NV];
#pragma unroll
    for (int jg = 0; jg < NP; ++jg)
#pragma unroll
      for (int q = 0; q < NMAT; ++q)
#pragma unroll
        for (int k = 0; k < 4; ++k) v[jg * NV + q * 4 + k] = 0.0f + accg[jg][q][k];
    bool last = true;
    if (Z > 1) {  // (each pass its own counters and partial sums: a later pass's blocks may run ahead of a reduction)
      const size_t key = (size_t(p0 / NT) * size_t(gridDim.y) + size_t(prob)) * size_t(a.rows / 16) + size_t(tile);
      last = splitk_last(v, a.partial + key * size_t(Z) * (NP * NV * 32), a.counters + key, Z, z, lane);
    }
    if (!last) continue;
#pragma unroll
    for (int jg = 0; jg < NP; ++jg)
#pragma unroll
      for (int cc = 0; cc < 2; ++cc) {
        const int j = 8 * jg + 2 * t + cc;
        if (j >= mp) continue;
        const int64_t orow = int64_t(p0 + j) * a.o_tok_stride + int64_t(prob) * a.o_prob_stride;
        const float* vg = v + jg * NV;
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          const int64_t row = int64_t(tile) * 16 + g + 8 * rr;
          const float up = EPI == kSwiglu ? vg[4 + rr * 2 + cc] : 0.0f;
          store_out<OT>(static_cast<OT*>(a.out) + orow + row, epilogue<EPI>(a, vg[rr * 2 + cc], up, 0));
        }
      }
  }
}

// Shared memory of a launch: the longest K range of its blocks, 8 NP token rows per chunk.
inline size_t smem_bytes(const GemvArgs& a, int np) {
  const int64_t total = a.cols / 128, most = (total + a.kblocks - 1) / a.kblocks;
  return size_t(most) * size_t(8 * np) * kRowBytes;
}

inline int token_groups_of(const GemvArgs& a) { return a.token_groups > 0 ? a.token_groups : gemv_xs_token_groups(a.n); }

// Chunks in flight: 1 or 2 for one matrix (4 spilled at 8 token groups and won nowhere in the sweep); gate/up take
// one (two spill at 4 and 8 token groups).
template <int NMAT, int EPI, class OT, int NP>
void launch_np(const GemvArgs& a, Stream s) {
  auto kern = gemv_xs_kernel<NMAT, EPI, OT, NP, 1>;
  if constexpr (NMAT == 1)
    if (a.fp8_unroll != 1) kern = gemv_xs_kernel<NMAT, EPI, OT, NP, 2>;
  const size_t smem = smem_bytes(a, NP);
  // (Once per instantiation, outside any capture's stream work: the opt-in above the default 48 KB.)
  static const bool opted = [&] {
    auto opt_in = [](auto k) { PLUMB_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kGemvXsMaxSmem))); };
    opt_in(gemv_xs_kernel<NMAT, EPI, OT, NP, 1>);
    if constexpr (NMAT == 1) opt_in(gemv_xs_kernel<NMAT, EPI, OT, NP, 2>);
    return true;
  }();
  (void)opted;
  const int tiles = int(a.rows / 16);
  const dim3 grid(unsigned((tiles + a.warps - 1) / a.warps), unsigned(a.problems), unsigned(a.kblocks));
  launch_as(a.pdl > 0, "gemv_xs_kernel", kern, grid, dim3(unsigned(a.warps * 32)), smem, s, a);
}

}  // namespace xs

// Checks and launches the shared-activation kernel (launch_gemv, GemvArgs::shared_x).
template <int NMAT, int EPI, class OT>
void launch_xs(const GemvArgs& a, Stream s) {
  const int np = xs::token_groups_of(a);
  if (np != 2 && np != 4 && np != 8) throw_arg("gemv (shared activations): token groups per pass must be 2, 4 or 8");
  if (a.fp8_unroll != 0 && a.fp8_unroll != 1 && a.fp8_unroll != 2)
    throw_arg("gemv (shared activations): 1 or 2 chunks in flight per warp (fp8_unroll 0 = 2)");
  if (a.kblocks > 1 && (!a.partial || !a.counters))
    throw_arg("gemv (shared activations): a split of K across blocks needs a workspace (gemv_workspace)");
  if (a.kblocks > a.cols / 128) throw_arg("gemv (shared activations): more blocks along K than 128-column chunks");
  const size_t smem = gemv_xs_smem(a);
  if (smem > kGemvXsMaxSmem)
    throw_arg("gemv (shared activations): " + std::to_string(smem / 1024) + " KB of staged activations per block (at most " +
              std::to_string(kGemvXsMaxSmem / 1024) + "): split K across more blocks");
  if (np == 2) return xs::launch_np<NMAT, EPI, OT, 2>(a, s);
  if (np == 4) return xs::launch_np<NMAT, EPI, OT, 4>(a, s);
  return xs::launch_np<NMAT, EPI, OT, 8>(a, s);
}
