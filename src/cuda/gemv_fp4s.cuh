// MXFP4 routed-expert decode, streaming version (included by gemv.cu; see the header comment there for the
// fragment mapping, which is the same). What differs from the per-tile kernel:
//
// * Persistent warps. The grid is one wave (CTAs of `warps` warps, as many per SM as fit); each warp walks its own
//   list of work units (expert pass, 16-row tile) over the full K, units gw, gw + GW, ... (GW warps in all), and
//   writes its outputs itself: no block-wide reduction, no barrier after the prologue. Optionally (fp4_ksplit
//   KS > 1) the KS warps of a CTA split one tile's K instead: the CTA walks units of warps / KS tiles and the K
//   parts meet in shared memory at the end of each unit (one CTA barrier per unit; summed in part order).
// * Bytes in flight do not live in registers. Each warp owns a ring of DEPTH stages in shared memory; a stage is
//   512 columns of its 16 rows (per matrix): the codes (4 KB, contiguous in the tile-major decode layout, copied
//   as 8 x 512 contiguous bytes by cp.async, 16 B per lane, one commit group per stage) and their E8M0 scales
//   (16 B per row, lanes t < 2 * NMAT of row group g). The ring runs across unit boundaries, so it drains only
//   once, at the end. (A first version copied whole rows of the old row-major layout with cp.async.bulk, one per
//   lane: cp.async.bulk takes uniform operands, so 32 per-lane copies serialize; it ran at 20-36% of copy.)
// * Activations are read through L1 (__ldg), one 128-column chunk ahead of their use.
// * The slots are grouped by expert in each CTA's prologue (a scan, quadratic in the slots: up to 256), or read from
//   moe_group's table (GemvArgs::groups: up to 1024 slots); either way into entries of <= 8 tokens of one expert in
//   slot order, so both give the same bits (the entries' order only moves work between warps).
// Numerics are the per-tile kernel's: the same decode (fp4_group: E2M1 -> f16 by bit placement, exact), the same
// mma.m16n8k16 (f16 in, fp32 accumulate), two MMAs per 32-wide scale group whose fp32 partial sum the E8M0 scale
// multiplies, the same epilogue (SwiGLU with the clamp, pre_weight, f16 or fp32 out).
#pragma once

namespace fp4s {

constexpr int kMaxSlots = 256;        // n * topk the kernel groups itself (a quadratic scan per CTA)
constexpr int kMaxTableSlots = 1024;  // with moe_group's table (GemvArgs::groups): the grouping read from it
constexpr int kMaxExperts = 1024;
// Entries (passes of <= 8 tokens of one expert): at most slots / 8 + one per active expert.
constexpr int kMaxEnt = kMaxTableSlots / 8 + kMaxExperts;
constexpr int kMaxWarpsS = 8;
constexpr int kMaxDepth = 6;

template <int NMAT>
__host__ __device__ constexpr int stage_bytes() {
  return NMAT * (4096 + 256);  // codes [q][chunk 4][half 2][lane 32] x 16 B, scales [q][half 2][g 8] x 16 B
}

// Work entries (expert < 1024, first position < 1024 in the sorted slot list, tokens 1..8) packed in 32 bits.
__device__ __forceinline__ int ent_pack(int e, int s0, int m) { return e | (s0 << 10) | ((m - 1) << 20); }
__device__ __forceinline__ int ent_expert(int ent) { return ent & 0x3FF; }
__device__ __forceinline__ int ent_first(int ent) { return (ent >> 10) & 0x3FF; }
__device__ __forceinline__ int ent_tokens(int ent) { return (ent >> 20) + 1; }

// The math of one stage (512 columns of the warp's 16 rows, per matrix) from the ring slot `buf`. X holds the
// activations of the stage's first 128-column chunk (loaded by the caller before it waited for the copies); the
// next chunk's are loaded one chunk ahead, through L1. MP1: one token (see fp4_group).
template <int NMAT, bool MP1>
__device__ __forceinline__ void stage_math(const uint8_t* buf, const __half* xs, uint4 (&X)[4], int lane, int g,
                                           float (&acc)[NMAT][4]) {
  uint4 SA[NMAT], SBv[NMAT];
#pragma unroll
  for (int q = 0; q < NMAT; ++q) {
    SA[q] = *reinterpret_cast<const uint4*>(buf + NMAT * 4096 + (q * 2 + 0) * 128 + g * 16);
    SBv[q] = *reinterpret_cast<const uint4*>(buf + NMAT * 4096 + (q * 2 + 1) * 128 + g * 16);
  }
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    uint4 Xn[4];
    if (c < 3) {
#pragma unroll
      for (int j = 0; j < 4; ++j) Xn[j] = xs ? load_x8(xs + (c + 1) * 128 + j * 32) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int q = 0; q < NMAT; ++q) {
      const uint4 A = *reinterpret_cast<const uint4*>(buf + q * 4096 + (c * 2 + 0) * 512 + lane * 16);
      const uint4 B = *reinterpret_cast<const uint4*>(buf + q * 4096 + (c * 2 + 1) * 512 + lane * 16);
      const uint32_t sa = word(SA[q], c), sb = word(SBv[q], c);
      fp4_group<MP1>(A.x, B.x, X[0], scale_of<0>(sa), scale_of<0>(sb), acc[q]);
      fp4_group<MP1>(A.y, B.y, X[1], scale_of<1>(sa), scale_of<1>(sb), acc[q]);
      fp4_group<MP1>(A.z, B.z, X[2], scale_of<2>(sa), scale_of<2>(sb), acc[q]);
      fp4_group<MP1>(A.w, B.w, X[3], scale_of<3>(sa), scale_of<3>(sb), acc[q]);
    }
    if (c < 3) {
#pragma unroll
      for (int j = 0; j < 4; ++j) X[j] = Xn[j];
    }
  }
}

template <int NMAT, int EPI, class OT, int DEPTH>
__global__ void __launch_bounds__(kMaxWarpsS * 32, 1) fp4_stream_kernel(const GemvArgs a) {
  extern __shared__ __align__(128) uint8_t dsm[];
  __shared__ int ent_s[kMaxEnt];
  __shared__ short sorted_s[kMaxSlots];  // without a table: the slots grouped by expert (with one: the table's list)
  __shared__ int nent_s;

  const int warps = int(blockDim.x >> 5), nthr = int(blockDim.x), tid = int(threadIdx.x);
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int nslots = a.n * a.topk;

  if (a.pdl > 0) asm volatile("griddepcontrol.wait;" ::: "memory");  // nothing is read or written before it

  // ---- prologue: group the slots by expert (deterministic: slot order), passes of <= 8 tokens ----
  if (a.groups) {  // moe_group's table: expert e's slots are list[offs[e] .. offs[e + 1]), in slot order
    if (warp == 0) {
      int run = 0;
      for (int base = 0; base < a.problems; base += 32) {
        const int e = base + lane;
        const int c = e < a.problems ? a.groups[a.g_offs + e + 1] - a.groups[a.g_offs + e] : 0, p = (c + 7) / 8;
        int ip = p;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
          const int tp = __shfl_up_sync(0xFFFFFFFFu, ip, o);
          if (lane >= o) ip += tp;
        }
        const int off = e < a.problems ? a.groups[a.g_offs + e] : 0;
        for (int k = 0; k < p; ++k) ent_s[run + ip - p + k] = ent_pack(e, off + 8 * k, min(8, c - 8 * k));
        run += __shfl_sync(0xFFFFFFFFu, ip, 31);
      }
      if (lane == 0) nent_s = run;
    }
    __syncthreads();
  } else {
    int* idx_t = reinterpret_cast<int*>(dsm);  // scratch in the ring area, dead before the first copy
    int* rank_t = idx_t + kMaxSlots;
    int* first_t = rank_t + kMaxSlots;
    int* npass_t = first_t + kMaxSlots;
    int* ncnt_t = npass_t + kMaxSlots;
    int* pbase_t = ncnt_t + kMaxSlots;
    int* cbase_t = pbase_t + kMaxSlots;
    for (int s = tid; s < nslots; s += nthr) idx_t[s] = a.idx[s];
    __syncthreads();
    for (int s = tid; s < nslots; s += nthr) {
      const int e = idx_t[s];
      int rank = 0, cnt = 0, first = s;
      for (int s2 = 0; s2 < nslots; ++s2)
        if (idx_t[s2] == e) {
          cnt++;
          if (s2 < s) rank++, first = min(first, s2);
        }
      const bool ok = e >= 0 && e < a.problems && rank == 0;
      rank_t[s] = rank, first_t[s] = first;
      npass_t[s] = ok ? (cnt + 7) / 8 : 0;
      ncnt_t[s] = ok ? cnt : 0;
    }
    __syncthreads();
    if (warp == 0) {
      int run_p = 0, run_c = 0;
      for (int base = 0; base < nslots; base += 32) {
        const int s = base + lane;
        const int p = s < nslots ? npass_t[s] : 0, c = s < nslots ? ncnt_t[s] : 0;
        int ip = p, ic = c;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
          const int tp = __shfl_up_sync(0xFFFFFFFFu, ip, o), tc = __shfl_up_sync(0xFFFFFFFFu, ic, o);
          if (lane >= o) ip += tp, ic += tc;
        }
        if (s < nslots) pbase_t[s] = run_p + ip - p, cbase_t[s] = run_c + ic - c;
        run_p += __shfl_sync(0xFFFFFFFFu, ip, 31);
        run_c += __shfl_sync(0xFFFFFFFFu, ic, 31);
      }
      if (lane == 0) nent_s = run_p;
    }
    __syncthreads();
    for (int s = tid; s < nslots; s += nthr) {
      const int e = idx_t[s];
      if (e < 0 || e >= a.problems) continue;
      const int f = first_t[s];
      sorted_s[cbase_t[f] + rank_t[s]] = short(s);
      if (rank_t[s] == 0) {
        const int cnt = ncnt_t[s];
        for (int p = 0; p < npass_t[s]; ++p) ent_s[pbase_t[s] + p] = ent_pack(e, cbase_t[s] + 8 * p, min(8, cnt - 8 * p));
      }
    }
    __syncthreads();
  }
  if (a.pdl > 0) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  // Position i of the slots grouped by expert.
  auto slot_at = [&](int i) { return a.groups ? int(a.groups[a.g_list + i]) : int(sorted_s[i]); };

  // ---- work split ----
  // KS = 1: each warp walks its own units (entry, tile) gw, gw + GW, ... over the full K.
  // KS > 1: the CTA walks units (entry, group of TPC = warps / KS tiles) b, b + G, ...; warp w takes tile w / KS of
  // the group and the K part w % KS (PK = P / KS stages); the K parts meet in shared memory at the end of each unit
  // (a CTA barrier: every warp of the CTA has the same units and stages) and the warp of part 0 sums them in part
  // order and writes the outputs.
  const int KS = a.fp4_ksplit;
  const int tiles = int(a.rows / 16);
  const int TPC = KS == 1 ? 1 : warps / KS, wt = KS == 1 ? 0 : warp / KS, kp = KS == 1 ? 0 : warp % KS;
  const int upe = tiles / TPC;  // units per entry
  const int nunits = nent_s * upe;
  const int first = KS == 1 ? int(blockIdx.x) * warps + warp : int(blockIdx.x);
  const int stride = KS == 1 ? int(gridDim.x) * warps : int(gridDim.x);
  const int P = int(a.cols / 512), PK = P / KS;  // stages per unit and warp
  const int nmine = first < nunits ? (nunits - 1 - first) / stride + 1 : 0;
  const int total = nmine * PK;
  constexpr int SB = stage_bytes<NMAT>();
  uint8_t* ring = dsm + size_t(warp) * DEPTH * SB;
  float* red = reinterpret_cast<float*>(dsm + size_t(warps) * DEPTH * SB);  // [2][warps][NMAT * 4][32], KS > 1
  const int64_t tile_bytes = a.cols * 8;
  const uint64_t wpol = weight_policy(a.l2_evict_first);  // cuda.l2_evict_first

  // Producer state: the next position to issue, as (unit, stage).
  int iss_unit = first, iss_st = 0;
  auto issue = [&](int slot) {
    const int ent = ent_s[iss_unit / upe], tile = (iss_unit % upe) * TPC + wt;
    const int e = ent_expert(ent);
    const int stg = kp * PK + iss_st;
    const uint32_t buf = smem_u32(ring + slot * SB);
#pragma unroll
    for (int q = 0; q < NMAT; ++q) {
      const uint8_t* wq = (q ? a.w[NMAT - 1] : a.w[0]) + int64_t(e) * a.w_prob_stride;
      // The stage is 4 KB contiguous in the decode layout: 512 contiguous bytes per instruction.
      const uint8_t* src = wq + int64_t(tile) * tile_bytes + int64_t(stg) * 4096 + lane * 16;
#pragma unroll
      for (int i = 0; i < 8; ++i) cp16(buf + q * 4096 + i * 512 + lane * 16, src + i * 512, wpol);
    }
    if (t < 2 * NMAT) {  // lane t of group g: the scale row (matrix t / 2, half t % 2)
      const int q = t >> 1, h = t & 1;
      const uint8_t* sc = static_cast<const uint8_t*>(q ? a.s[NMAT - 1] : a.s[0]);
      cp16(buf + NMAT * 4096 + (q * 2 + h) * 128 + g * 16,
           sc + int64_t(e) * a.s_prob_stride + (int64_t(tile) * 16 + g + 8 * h) * a.s_ld + int64_t(stg) * 16, wpol);
    }
    if (++iss_st == PK) iss_st = 0, iss_unit += stride;
  };
  for (int i = 0; i < DEPTH; ++i) {  // DEPTH groups committed, empty ones too: the wait below counts groups
    if (i < total) issue(i);
    cp_commit();
  }

  float acc[NMAT][4];
  const __half* xp = nullptr;
  int unit = first, st = 0, ent = 0, mp = 0, parity = 0;
  for (int pos = 0; pos < total; ++pos) {
    const int slot = pos % DEPTH;
    if (st == 0) {
      ent = ent_s[unit / upe];
      mp = ent_tokens(ent);
      xp = nullptr;
      if (g < mp) {
        const int s = slot_at(ent_first(ent) + g);
        const int64_t xrow = a.x_by_token ? s / a.topk : s;
        xp = static_cast<const __half*>(a.x) + xrow * a.x_tok_stride + t * 8;
      }
#pragma unroll
      for (int q = 0; q < NMAT; ++q) acc[q][0] = acc[q][1] = acc[q][2] = acc[q][3] = 0.0f;
    }
    const __half* xs = xp ? xp + (kp * PK + st) * 512 : nullptr;
    uint4 X[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) X[j] = xs ? load_x8(xs + j * 32) : make_uint4(0, 0, 0, 0);
    cp_wait<DEPTH - 1>();  // this lane's copies of position pos have landed
    __syncwarp();          // and every lane's (the scale rows are read by the 4 lanes of a group)
    const uint8_t* buf = ring + slot * SB;
    if (mp == 1) stage_math<NMAT, true>(buf, xs, X, lane, g, acc);
    else stage_math<NMAT, false>(buf, xs, X, lane, g, acc);
    __syncwarp();  // every lane's reads of this stage are consumed (their values fed the MMAs above)
    if (pos + DEPTH < total) issue(slot);
    cp_commit();

    if (++st == PK) {  // unit done: reduce the K parts, epilogue
      const int tile = (unit % upe) * TPC + wt, s0i = ent_first(ent);
      bool mine = true;
      if (KS > 1) {
        float* r = red + size_t(parity * warps + warp) * (NMAT * 128);
#pragma unroll
        for (int q = 0; q < NMAT; ++q)
#pragma unroll
          for (int k = 0; k < 4; ++k) r[(q * 4 + k) * 32 + lane] = acc[q][k];
        __syncthreads();
        mine = kp == 0;
        if (mine) {
#pragma unroll
          for (int q = 0; q < NMAT; ++q)
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              float v = 0.0f;
              for (int k2 = 0; k2 < KS; ++k2) v += r[size_t(k2) * (NMAT * 128) + (q * 4 + k) * 32 + lane];
              acc[q][k] = v;
            }
        }
        parity ^= 1;
      }
      if (mine) {
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
          const int j = 2 * t + cc;
          if (j >= mp) continue;
          const int s = slot_at(s0i + j);
          const int64_t orow = int64_t(s) * a.o_tok_stride;
#pragma unroll
          for (int rr = 0; rr < 2; ++rr) {
            const int64_t row = int64_t(tile) * 16 + g + 8 * rr;
            // FP4 codes entered the MMA as value * 2^-14.
            const float up = EPI == kSwiglu ? acc[NMAT - 1][rr * 2 + cc] * kFp4Unscale : 0.0f;
            store_out<OT>(static_cast<OT*>(a.out) + orow + row, epilogue<EPI>(a, acc[0][rr * 2 + cc] * kFp4Unscale, up, s));
          }
        }
      }
      st = 0;
      unit += stride;
    }
  }
}

template <int NMAT>
size_t stream_smem(int warps, int depth, int ks) {
  return size_t(warps) * depth * stage_bytes<NMAT>() + (ks > 1 ? size_t(2) * warps * NMAT * 128 * 4 : 0);
}

template <int NMAT, int EPI, class OT, int DEPTH>
void launch_stream_d(const GemvArgs& a, int warps, Stream s) {
  auto kern = fp4_stream_kernel<NMAT, EPI, OT, DEPTH>;
  const int ks = a.fp4_ksplit;
  const size_t smem = stream_smem<NMAT>(warps, DEPTH, ks);
  // Per instantiation, device, CTA size and split: the smem opt-in and the CTAs per SM (host queries done once,
  // outside any stream capture in practice: the first launch of a configuration).
  static int per_sm_cache[8][kMaxWarpsS + 1][2] = {};
  int dev = 0;
  PLUMB_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev >= 8) throw_arg("gemv: the FP4 streaming kernel supports devices 0..7");
  int& per_sm_c = per_sm_cache[dev][warps][ks > 1];
  // The opt-in is one value per kernel: keep it at the largest configuration launched so far (setting it for a
  // smaller CTA would make a later, larger launch an invalid argument).
  static size_t smem_set[8] = {};
  if (smem > smem_set[dev]) {
    PLUMB_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    smem_set[dev] = smem;
  }
  if (per_sm_c == 0) {
    int per = 0;
    PLUMB_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kern, warps * 32, smem));
    per_sm_c = per < 1 ? -1 : per;
  }
  int per_sm = per_sm_c;
  const int sms = sm_count();
  if (per_sm < 1) throw_arg("gemv: the FP4 streaming kernel does not fit on an SM with this configuration");
  if (a.fp4_ctas > 0) per_sm = std::min(per_sm, a.fp4_ctas);
  launch_as(a.pdl > 0, "fp4_stream_kernel", kern, dim3(unsigned(sms * per_sm)), dim3(unsigned(warps * 32)), smem, s, a);
}

// The configuration a launch runs: warps per CTA, stages in flight, K split (defaults filled in, split reduced to
// one that divides the shape).
struct StreamCfg {
  int warps, depth, ks;
};
inline StreamCfg stream_cfg(const GemvArgs& a) {
  StreamCfg c;
  // Defaults (H200 sweep, `plumb bench`, batch 1 and 8): gate/up 2 warps per CTA, down 4; 2 stages (3 and 4 lost
  // 1-10 points at batch 1 and did not gain at batch 8); no K split (2 or 4 warps per tile gained at most a point at
  // batch 1 and lost at batch 8); PDL on for down only.
  c.warps = a.fp4_warps > 0 ? a.fp4_warps : (a.nmat == 2 ? 2 : 4);
  c.depth = a.fp4_depth > 0 ? a.fp4_depth : 2;
  c.ks = a.fp4_ksplit > 0 ? a.fp4_ksplit : 1;
  c.depth = c.depth <= 2 ? 2 : c.depth >= 4 ? 4 : 3;
  const int64_t P = a.cols / 512, tiles = a.rows / 16;
  while (c.ks > 1 && (c.warps % c.ks || P % c.ks || tiles % (c.warps / c.ks))) c.ks /= 2;
  return c;
}

template <int NMAT, int EPI, class OT>
void launch_stream(const GemvArgs& a0, Stream s) {
  GemvArgs a = a0;
  const StreamCfg c = stream_cfg(a);
  a.fp4_ksplit = c.ks;
  if (a.pdl < 0) a.pdl = NMAT == 1 ? 1 : 0;  // (launch_gemv sets 1 under cuda.pdl)
  if (c.depth == 2) return launch_stream_d<NMAT, EPI, OT, 2>(a, c.warps, s);
  if (c.depth == 3) return launch_stream_d<NMAT, EPI, OT, 3>(a, c.warps, s);
  return launch_stream_d<NMAT, EPI, OT, 4>(a, c.warps, s);
}

inline bool al16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Whether the streaming kernel handles these arguments (else the per-tile kernel runs).
inline bool stream_ok(const GemvArgs& a) {
  if (a.fp4_kernel == 1 || a.fmt != kFp4 || a.mode != kMoe) return false;
  if (a.cols % 512 || a.n * a.topk > (a.groups ? kMaxTableSlots : kMaxSlots) || a.problems > kMaxExperts || a.rows / 16 > (1 << 20))
    return false;
  if (a.fp4_warps > kMaxWarpsS || a.fp4_depth > kMaxDepth || a.fp4_ksplit > kMaxWarpsS) return false;
  for (int q = 0; q < a.nmat; ++q)
    if (!al16(a.w[q]) || !al16(a.s[q])) return false;
  return a.w_prob_stride % 16 == 0 && a.s_prob_stride % 16 == 0 && a.s_ld % 16 == 0;
}

}  // namespace fp4s
