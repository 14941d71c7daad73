// attn.splitk_decode: the sparse attention of fwd_attention.cu split over keys (flash-decoding), with the heads of a
// token grouped. The model's attention is MQA-like (one key/value row per position, K = V, shared by every query
// head), so a block takes one token, 16 heads and one contiguous chunk of the token's keys: the key rows of a tile
// are staged in shared memory once and serve all 16 heads, for the logits and again (K = V) for P.V. Both products
// run on the fp64 tensor cores (DMMA, m16n8k8). The block keeps a running max, an fp64 sum and an fp64 P.V per head
// in one pass (no logits scratch, no per-query shared-memory limit); the splits are merged with the sink afterwards.
// Same keys in the same order as the unsplit twin (attn_keys.cuh's KeyList); the logits are the same fp64 dot
// products summed in the tensor cores' order instead of key_logit's lane order, then rounded to float as the twin
// does, so they can differ from the twin's by a float rounding; the normalization order differs too (see
// docs/cuda.md for the measured error). attn.splitk_f16 (AttendArgs::f16, a patch with its own tolerance) runs both
// products on the f16 tensor cores instead (mma.m16n8k16, fp32 accumulation): q, the keys and the probabilities
// rounded to f16 as their fragments are read, as production engines' bf16 attention does (f16: 3 more mantissa bits).
#include <algorithm>
#include <type_traits>

#include "cuda/attn_keys.cuh"

namespace plumb::cuda::detail {

namespace {

// Block shape: kHeads heads x kTile keys per tile, one thread per (head, key) in the softmax step, one warp per 32
// dims (kSlice) in the products, so head_dim <= 512 and a multiple of 32.
constexpr int kHeads = 16, kTile = 32, kThreads = kHeads * kTile, kWarps = kThreads / 32, kSlice = 32;
constexpr int kMaxDh = kWarps * kSlice;
// Shared-memory row strides in doubles, chosen so the fragments' loads and stores are free of bank conflicts:
// partial logits [slice][head][kPart] (16-byte stores of 8 lanes over two heads), probabilities [head][kPStride]
// (8-byte loads of 16 lanes over 4 heads x 4 keys).
constexpr int kPart = 40, kPStride = 36;
// AttendArgs::q_inv_freq: a warp per query head stages the normalized heads in the partial logits' buffer.
static_assert(kWarps == kHeads && kPart * 8 >= kSlice * 4, "a warp per head; [kHeads][Dh] floats fit in part");

// One split's state, as the merge reads it: running max m (-inf when the split saw no key), the sum l of
// exp(logit - m) in fp64, and the unnormalized sum of exp(logit - m) * v stored as float.
struct Partials {
  float* m;      // [rows, S]
  double* l;     // [rows, S]
  float* acc;    // [rows, S, Dh]
};

// The merge of S splits with the sink, used both by the one-split path and by the merge kernel, so a query whose
// keys all fall in split 0 gets the same bits whether or not empty splits follow (eager launches size S by this
// step's keys, a graph by the caches' capacity): an empty split (m = -inf, l = 0, acc = 0) adds exact zeros.
// M = max(sink, m_s); then, in s order from split 0: w_s = exp(m_s - M), L = fma(l_s, w_s, L) from exp(sink - M),
// o = fma(acc_s, w_s, o) from 0; out = float(o / L).
struct Merge {
  float M;
  double L;
  __device__ Merge(float sink, float max_m) : M(fmaxf(sink, max_m)), L(double(expf(sink - M))) {}
  __device__ double weight(float ms) const { return double(expf(ms - M)); }
  __device__ void add_split(double l, double w) { L = fma(l, w, L); }
  __device__ static double add(double o, float acc, double w) { return fma(double(acc), w, o); }
  __device__ float out(double o) const { return float(o / L); }
};

// The fp64 tensor-core step is common.cuh's dmma_m16n8k8 (measured on the H200 at 8320 keys, batch 8: 272 us
// against 276 us for two 16x8x4 steps and 399 us for four 8x8x4 steps, the sm_80 shape).

// Dims d, d + 1 (d even) of output row `row` (token row / Hq): rotated back and copied to f16 where a.out_inv_freq
// asks for it (rope_f16_kernel's arithmetic: the same bits as that launch after this one).
__device__ __forceinline__ void store_out_pair(const AttendArgs& a, int64_t row, int64_t d, float v0, float v1) {
  float p[2] = {v0, v1};
  if (a.out_inv_freq) {
    if (d >= a.out_rope_off) rope_pair(p, token_pos(a, row / a.Hq), a.out_inv_freq[(d - a.out_rope_off) / 2], a.out_af, 1);
    *reinterpret_cast<__half2*>(reinterpret_cast<__half*>(a.out16) + row * a.Dh + d) = __floats2half2_rn(p[0], p[1]);
  }
  *reinterpret_cast<float2*>(a.out + row * a.Dh + d) = make_float2(p[0], p[1]);
}

// 16 bytes global -> shared without registers; src_bytes 0 writes zeros (a hole's row).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  const unsigned s = unsigned(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

// The key tile in shared memory: float [kTile][Dh], element (key, dim) at key * Dh + (dim ^ swz(key % 8)). The
// swizzle flips bits 2-4 of the dim (16-byte chunks stay whole), so both fragment patterns hit 32 distinct banks:
// the logits' B (lanes: 8 keys x 4 consecutive dims) and P.V's B (4 keys x 8 consecutive dims).
__device__ __forceinline__ int swz(int k) { return ((k & 3) << 3) | (k & 4); }

// Block (token t, heads h0 .. h0+15) x split s, 512 threads: keys [s * c, min((s + 1) * c, count)) with c =
// plan.keys_per_split(count), in tiles of 32, each tile's rows copied into shared memory (cp.async, double-buffered:
// the next tile's rows load while this one is used; slots past the split's end and holes get zero rows). Per tile:
//   logits: warp w takes dims [32w, 32w + 32) of all 16 heads x 32 keys: q fragments in registers (fp64), the key
//           fragments converted to fp64, DMMA; the 16 warps' partial dot products go to shared memory and thread
//           (head, key) sums them in slice order: logit = float(dot) * scale, -inf for a hole;
//   softmax: warp = head: the tile's max, the rescale f = exp(m_old - m_new) of the running state, p = exp(logit -
//           m) (0 for a hole); each lane keeps its keys' share of l (l = l * f + p, fp64), summed at the end;
//   P.V:    warp w rescales its fp64 accumulators (16 heads x its 32 dims) by f and adds P (fp64) x V (the same rows
//           as the keys, converted to fp64) on DMMA.
// kDirect: S == 1, so the block also merges with the sink and writes the output (else it stores its partials).
// kQNorm: the query heads' norm + RoPE here (AttendArgs::q_inv_freq). kF16 (attn.splitk_f16): both products as
// mma.m16n8k16 on f16 fragments (the same C layout as the DMMA's: the partial logits' and P.V's bookkeeping is
// shared), a slice's logits and P.V summed in fp32 (P.V across the split's tiles too; the slices' sum, l and the
// merge stay fp64). All three compile-time, as is the official layout's
// absence (KeyListT<false>): the kernel runs once per layer and step from cold instruction caches, and session 40's
// phase stamps put ~8 of its ~13 us at one token in steps whose work is a few loads (the key list and the copies'
// issue ~2.5 us, the queries' norm ~2.5, the partials' stores ~3.3), so it holds only the code its launch runs.
template <bool kDirect, bool kQNorm, bool kF16>
__global__ void __launch_bounds__(kThreads, 1) attend_split_kernel(AttendArgs a, Partials P, SplitPlan plan) {
  using Acc = std::conditional_t<kF16, float, double>;  // the products' accumulators
  extern __shared__ __align__(16) unsigned char split_smem[];
  __shared__ double Ps[kHeads * kPStride];
  __shared__ double fac[kHeads], lfin[kHeads];
  __shared__ float mfin[kHeads];
  __shared__ int kvalid[2][kTile];
  // (cuda.pdl_hc_attn) the keys, queries and positions come from earlier kernels; the KV row and the entries maybe
  // from side branches (cuda.branch_flags: a.wait, waited before the PDL wait)
  pdl_begin_after(a.wait, "attend_split");
  const int Dh = int(a.Dh), nsl = Dh / kSlice;
  float* Ks = reinterpret_cast<float*>(split_smem);                                           // [2][kTile][Dh]
  double* part = reinterpret_cast<double*>(split_smem + size_t(2 * kTile) * size_t(Dh) * 4);  // [nsl][kHeads][kPart]
  const int ngroups = (a.Hq + kHeads - 1) / kHeads;
  const int t = int(blockIdx.x) / ngroups, h0 = (int(blockIdx.x) % ngroups) * kHeads, s = int(blockIdx.y);
  const int tid = int(threadIdx.x), lane = tid & 31, wid = tid >> 5, g = lane >> 2, r = lane & 3;
  const bool mma_warp = wid < nsl;
  const int S = plan.splits;
  const KeyListT<false> keys(a, t);
  const int64_t per = plan.keys_per_split(keys.count), j0 = int64_t(s) * per, j1 = min(j0 + per, keys.count);
  const int ntiles = j1 > j0 ? int((j1 - j0 + kTile - 1) / kTile) : 0;

  // Loader: thread (row lr, sub) copies the 16-byte chunks sub, sub + 16, ... of key row lr of a tile.
  const int lr = tid >> 4, sub = tid & 15, lsw = swz(lr & 7);
  auto row_of = [&](int tile) -> const float* {
    const int64_t j = j0 + int64_t(tile) * kTile + lr;
    return j < j1 ? keys.row(j) : nullptr;
  };
  auto issue = [&](int tile, const float* src) {
    float* dst = Ks + size_t(tile & 1) * kTile * size_t(Dh) + size_t(lr) * size_t(Dh);
    for (int c = sub; c < Dh / 4; c += 16) cp_async16(dst + ((4 * c) ^ lsw), src ? src + 4 * c : a.chunk_kv, src ? 16 : 0);
    if (sub == 0) kvalid[tile & 1][lr] = src != nullptr;
    cp_async_commit();
  };
  const float* next = nullptr;
  if (ntiles > 0) issue(0, row_of(0));
  if (ntiles > 1) next = row_of(1);

  // q_inv_freq: warp w normalizes and rotates head h0 + w into `part` ([kHeads][Dh] floats: part is free until the
  // first tile's products, after the loop's first barrier), where the fragments below read it.
  float* qs = reinterpret_cast<float*>(part);
  if constexpr (kQNorm) {
    if (h0 + wid < a.Hq)
      rms_norm_rope_row_warp(a.q + (int64_t(t) * a.Hq + h0 + wid) * a.Dh, qs + size_t(wid) * size_t(Dh), Dh, nullptr, a.q_eps,
                             a.q_rope_off, a.q_rope_half, a.q_inv_freq, a.q_af, token_pos(a, t));
    __syncthreads();
  }
  // q fragments (A of the logits): qa[b][half] = q[head 8 * half + g][dim 32 * wid + 4 * b + r]; heads past Hq
  // are zeros. kF16: qh16[kc] is m16n8k16's A for dims 32 * wid + 16 * kc + [0, 16): f16 pairs (dims 2r, 2r + 1
  // and 2r + 8, 2r + 9) of heads g and g + 8.
  double qa[kF16 ? 1 : kSlice / 4][2];
  uint32_t qh16[kF16 ? 2 : 1][4];
#pragma unroll
  for (int ho = 0; ho < 2; ++ho) {
    const int h = h0 + 8 * ho + g;
    const bool live = mma_warp && h < a.Hq;
    const float* qrow = (kQNorm ? qs + size_t(8 * ho + g) * size_t(Dh) : a.q + (int64_t(t) * a.Hq + h) * a.Dh) + kSlice * wid;
    if constexpr (kF16) {
#pragma unroll
      for (int kc = 0; kc < 2; ++kc)
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
          const float2 v = live ? *reinterpret_cast<const float2*>(qrow + 16 * kc + 8 * hi + 2 * r) : make_float2(0.0f, 0.0f);
          qh16[kc][2 * hi + ho] = f32x2_to_f16x2(v.x, v.y);
        }
    } else {
#pragma unroll
      for (int b = 0; b < kSlice / 4; ++b) qa[b][ho] = live ? double(qrow[4 * b + r]) : 0.0;
    }
  }
  // Warp wid's softmax state is head wid's (m the same in every lane, l each lane's share); acc[e]: dims
  // 32 * wid + 8 * e + 2 * r (+ 1) of head g (acc[e][0], [1]) and head g + 8 ([2], [3]).
  float m = -INFINITY;
  double l = 0;
  Acc acc[4][4] = {};

  for (int i = 0; i < ntiles; ++i) {
    cp_async_wait_all();
    __syncthreads();  // tile i is in place; the other buffer, P and the partial logits are free
    if (i + 1 < ntiles) {
      issue(i + 1, next);
      if (i + 2 < ntiles) next = row_of(i + 2);
    }
    const float* K = Ks + size_t(i & 1) * kTile * size_t(Dh);
    if (mma_warp) {
      const float* kw = K + size_t(g) * size_t(Dh) + kSlice * wid;
      const int sw = swz(g);
#pragma unroll
      for (int kb = 0; kb < kTile / 8; ++kb) {  // keys 8 * kb + g
        Acc c[4] = {};
        const float* kr = kw + size_t(8 * kb) * size_t(Dh);
        if constexpr (kF16) {
#pragma unroll
          for (int kc = 0; kc < 2; ++kc) {  // B: key g's dims 16 * kc + 2r (+1) and + 8 (the swizzle keeps pairs whole)
            const float2 k0 = *reinterpret_cast<const float2*>(kr + ((16 * kc + 2 * r) ^ sw));
            const float2 k1 = *reinterpret_cast<const float2*>(kr + ((16 * kc + 8 + 2 * r) ^ sw));
            mma_f16(c, qh16[kc][0], qh16[kc][1], qh16[kc][2], qh16[kc][3], f32x2_to_f16x2(k0.x, k0.y), f32x2_to_f16x2(k1.x, k1.y));
          }
        } else {
#pragma unroll
          for (int b2 = 0; b2 < kSlice / 8; ++b2) {  // dims 8 * b2 + 4 * kh + r
            const double qf[2][2] = {{qa[2 * b2][0], qa[2 * b2][1]}, {qa[2 * b2 + 1][0], qa[2 * b2 + 1][1]}};
            const double kf[2] = {double(kr[(8 * b2 + r) ^ sw]), double(kr[(8 * b2 + 4 + r) ^ sw])};
            dmma_m16n8k8(c, qf, kf);
          }
        }
        double* pp = part + (wid * kHeads + g) * kPart + 8 * kb + 2 * r;
        *reinterpret_cast<double2*>(pp) = make_double2(double(c[0]), double(c[1]));
        *reinterpret_cast<double2*>(pp + 8 * kPart) = make_double2(double(c[2]), double(c[3]));
      }
    }
    __syncthreads();
    {  // thread (head wid, key lane)
      float x = -INFINITY;
      if (kvalid[i & 1][lane]) {
        double v[kWarps];
#pragma unroll
        for (int w = 0; w < kWarps; ++w) v[w] = w < nsl ? part[(w * kHeads + wid) * kPart + lane] : 0.0;
        double dot = 0;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) dot += v[w];
        x = float(dot) * a.scale;
      }
      const float tmax = warp_max(x);
      double f = 1.0;
      if (tmax > m) {  // never true for a tile of holes only (tmax stays -inf)
        f = m == -INFINITY ? 0.0 : double(expf(m - tmax));
        m = tmax;
      }
      const float p = x == -INFINITY ? 0.0f : expf(x - m);
      Ps[wid * kPStride + lane] = double(p);
      l = l * f + double(p);
      if (lane == 0) fac[wid] = f;
    }
    __syncthreads();
    if (mma_warp) {
      const Acc f0 = Acc(fac[g]), f1 = Acc(fac[8 + g]);  // (float values: exact as either type)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[e][0] *= f0, acc[e][1] *= f0, acc[e][2] *= f1, acc[e][3] *= f1;
      if constexpr (kF16) {
#pragma unroll
        for (int kc = 0; kc < kTile / 16; ++kc) {  // keys 16 * kc + [0, 16)
          // The MMA's k slots 2r, 2r + 1, 2r + 8, 2r + 9 take keys r, r + 4, r + 8, r + 12 of the chunk (any order
          // that A and B share sums the same products): V's rows then fall in distinct bank groups, as for DMMA.
          // A: P of heads g, g + 8 at those keys; B: their rows at dim 32 * wid + 8e + g.
          const int k0 = 16 * kc + r;
          const double* pg = Ps + g * kPStride + k0;
          const double* pg8 = Ps + (8 + g) * kPStride + k0;
          const uint32_t pa0 = f32x2_to_f16x2(float(pg[0]), float(pg[4])), pa1 = f32x2_to_f16x2(float(pg8[0]), float(pg8[4]));
          const uint32_t pa2 = f32x2_to_f16x2(float(pg[8]), float(pg[12])), pa3 = f32x2_to_f16x2(float(pg8[8]), float(pg8[12]));
          const float* v0 = K + size_t(k0) * size_t(Dh) + kSlice * wid;
          const size_t dh = size_t(Dh);
          const int s0 = swz(r), s4 = swz(r + 4);  // (keys k0 + 8 and k0 + 12 share k0's and k0 + 4's swizzle)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int d = 8 * e + g;
            const uint32_t b0 = f32x2_to_f16x2(v0[d ^ s0], v0[4 * dh + (d ^ s4)]);
            const uint32_t b1 = f32x2_to_f16x2(v0[8 * dh + (d ^ s0)], v0[12 * dh + (d ^ s4)]);
            mma_f16(acc[e], pa0, pa1, pa2, pa3, b0, b1);
          }
        }
      } else {
#pragma unroll
        for (int c2 = 0; c2 < kTile / 8; ++c2) {  // keys 8 * c2 + 4 * kh + r
          const int k0 = 8 * c2 + r, k1 = k0 + 4, sw0 = swz(k0 & 7), sw1 = swz(k1 & 7);
          const double pf[2][2] = {{Ps[g * kPStride + k0], Ps[(8 + g) * kPStride + k0]},
                                   {Ps[g * kPStride + k1], Ps[(8 + g) * kPStride + k1]}};
          const float* v0 = K + size_t(k0) * size_t(Dh) + kSlice * wid;
          const float* v1 = K + size_t(k1) * size_t(Dh) + kSlice * wid;
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const double vf[2] = {double(v0[(8 * e + g) ^ sw0]), double(v1[(8 * e + g) ^ sw1])};
            dmma_m16n8k8(acc[e], pf, vf);
          }
        }
      }
    }
  }

  l = warp_sum(l);
  if (lane == 0) mfin[wid] = m, lfin[wid] = l;
  __syncthreads();
  if (!kDirect && lane == 0 && h0 + wid < a.Hq) {
    const int64_t ps = (int64_t(t) * a.Hq + h0 + wid) * S + s;
    P.m[ps] = m, P.l[ps] = l;
  }
  if (!mma_warp) return;
#pragma unroll
  for (int ho = 0; ho < 2; ++ho) {
    const int hl = 8 * ho + g, h = h0 + hl;
    if (h >= a.Hq) continue;
    const int64_t row = int64_t(t) * a.Hq + h;
    if constexpr (kDirect) {
      Merge mg(a.sink[h], mfin[hl]);
      const double w = mg.weight(mfin[hl]);
      mg.add_split(lfin[hl], w);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t d = kSlice * wid + 8 * e + 2 * r;
        store_out_pair(a, row, d, mg.out(Merge::add(0.0, float(acc[e][2 * ho]), w)), mg.out(Merge::add(0.0, float(acc[e][2 * ho + 1]), w)));
      }
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t d = kSlice * wid + 8 * e + 2 * r;
        float* pa = P.acc + (row * S + s) * a.Dh + d;  // (4-byte aligned only: P.acc follows rows x S floats)
        pa[0] = float(acc[e][2 * ho]), pa[1] = float(acc[e][2 * ho + 1]);
      }
    }
  }
}

// Block = one (token, head) row: merges its S splits with the sink (Merge), thread per dim. The splits' m and l
// are staged in shared memory 256 at a time (loaded in parallel), their weights computed once per block; every
// thread then walks the splits in s order, as the one-split path does. The even thread of each pair of dims
// stores both (store_out_pair; Dh % 32 == 0, so every lane reaches the shuffle).
constexpr int kMergeThreads = 256;
template <int kU>
__device__ __forceinline__ void store_merged(const AttendArgs& a, int64_t row, int tid, const Merge& mg, const double (&o)[kU]) {
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const int64_t d = tid + int64_t(u) * kMergeThreads;
    const float v = mg.out(o[u]), odd = __shfl_down_sync(0xFFFFFFFFu, v, 1);
    if (d < a.Dh && (tid & 1) == 0) store_out_pair(a, row, d, v, odd);
  }
}
__global__ void __launch_bounds__(kMergeThreads) attend_merge_kernel(AttendArgs a, Partials P, int S) {
  __shared__ float ms[kMergeThreads];
  __shared__ double ls[kMergeThreads], ws[kMergeThreads];
  const int64_t row = blockIdx.x;
  const int h = int(row % a.Hq), tid = int(threadIdx.x);
  const float sink = a.sink[h];  // (a weight: read before the wait)
  pdl_begin();  // (cuda.pdl_hc_attn) the partials come from the split launch
  const float* m = P.m + row * S;
  const double* l = P.l + row * S;
  const float* acc = P.acc + row * S * a.Dh;
  constexpr int kU = kMaxDh / kMergeThreads;
  constexpr int kB = 8;  // splits whose partials are loaded together
  double o[kU] = {};
  if (S <= kB) {
    // Few splits (one token at a short context: 6-8): every load issued at once, one round of load latency after
    // the wait instead of three (m, then l, then acc); the arithmetic below in the general path's order.
    float mv[kB], av[kU][kB];
    double lv[kB];
#pragma unroll
    for (int j = 0; j < kB; ++j) mv[j] = j < S ? m[j] : -INFINITY, lv[j] = j < S ? l[j] : 0.0;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t d = tid + int64_t(u) * kMergeThreads;
#pragma unroll
      for (int j = 0; j < kB; ++j) av[u][j] = d < a.Dh && j < S ? acc[int64_t(j) * a.Dh + d] : 0.0f;
    }
    float mmax = -INFINITY;
#pragma unroll
    for (int j = 0; j < kB; ++j)
      if (j < S) mmax = fmaxf(mmax, mv[j]);
    Merge mg(sink, mmax);
    double w[kB];
#pragma unroll
    for (int j = 0; j < kB; ++j)
      if (j < S) w[j] = mg.weight(mv[j]), mg.add_split(lv[j], w[j]);
#pragma unroll
    for (int j = 0; j < kB; ++j)
      if (j < S)
#pragma unroll
        for (int u = 0; u < kU; ++u) o[u] = Merge::add(o[u], av[u][j], w[j]);
    store_merged(a, row, tid, mg, o);
    return;
  }
  float mmax = -INFINITY;
  for (int s0 = 0; s0 < S; s0 += kMergeThreads) {
    const int ns = min(kMergeThreads, S - s0);
    __syncthreads();
    if (tid < ns) ms[tid] = m[s0 + tid];
    __syncthreads();
    for (int s = 0; s < ns; ++s) mmax = fmaxf(mmax, ms[s]);
  }
  Merge mg(sink, mmax);
  for (int s0 = 0; s0 < S; s0 += kMergeThreads) {
    const int ns = min(kMergeThreads, S - s0);
    __syncthreads();
    if (tid < ns) ls[tid] = l[s0 + tid], ws[tid] = mg.weight(m[s0 + tid]);
    __syncthreads();
    for (int s = 0; s < ns; ++s) mg.add_split(ls[s], ws[s]);
    // kB splits' partials loaded together (one round of load latency per kB splits, not per split), then added in
    // split order.
    for (int sb = 0; sb < ns; sb += kB) {
      float v[kU][kB];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int64_t d = tid + int64_t(u) * kMergeThreads;
#pragma unroll
        for (int j = 0; j < kB; ++j)
          v[u][j] = d < a.Dh && sb + j < ns ? acc[int64_t(s0 + sb + j) * a.Dh + d] : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < kB; ++j)
        if (sb + j < ns)
#pragma unroll
          for (int u = 0; u < kU; ++u) o[u] = Merge::add(o[u], v[u][j], ws[sb + j]);
    }
  }
  store_merged(a, row, tid, mg, o);
}

}  // namespace

// The split launch's grid and its partials' scratch for n tokens of Hq heads at p.splits.
static void size_plan(SplitPlan& p, int n, int Hq, int64_t Dh) {
  const int64_t rows = int64_t(n) * Hq, bytes_per_split = rows * (Dh * 4 + 12);
  p.blocks = int64_t(n) * ((Hq + kHeads - 1) / kHeads) * p.splits;
  p.scratch_bytes = p.splits > 1 ? size_t(bytes_per_split) * size_t(p.splits) : 0;
}

SplitPlan fwd_attend_splitk_plan(int n, int Hq, int64_t Dh, int64_t max_keys, int sms) {
  SplitPlan p;
  const int64_t rows = int64_t(n) * Hq, bytes_per_split = rows * (Dh * 4 + 12);
  // Up to 256 tokens (the graph-captured chunks) chunk and cap depend on n only, so an eager step (S from this
  // step's keys) and a graph (S from the capacity) split each query's keys identically (keys_per_split). A block
  // holds 16 heads and a whole SM (its shared memory). One token: splits of at least one tile (32 keys), at most
  // cap = max(9, SMs / blocks per split) per query: 64 heads at 8320 keys take 33 splits of 256 (132 blocks, one
  // wave on the H200), at 704 keys 22 splits of 32. 2-8 tokens (since session 16): splits of at least two tiles, at
  // most one wave of blocks (cap = SMs / blocks per split): 8 tokens of 64 heads 3 splits of 64 at a 256-token
  // context's 192 keys, 4 of 192 at 704, 4 of 2080 at 8320. Measured on the H200, fixed keys per split, 8320 / 704
  // keys: one token 64: 94 / 22 us, 128: 66 / 29, 256: 52 / 43, 512: 78 / 74; 8 tokens 256: 314 / 45, 512: 286 /
  // 75, 1024: 272 / 94; 8 tokens with the plan 366 / 45 under the earlier rule (64 n keys, at most 256; cap >= 9)
  // and 272 / 39 with this one; whole layers at batch 4 / 8 after 256 tokens 299-319 / 394-406 -> 274-293 / 367-381
  // us (A/B, 2 rounds). A short context's few splits leave most SMs idle while each block's fp64 tensor-core
  // products run (about 2 us per tile of 32 keys). Up to 256 tokens: 1024 per split. Longer (prefill, eager only):
  // few splits, partials kept under 256 MB.
  if (n == 1) {
    const int64_t blocks_per_split = (Hq + kHeads - 1) / kHeads;
    p.chunk = kTile;
    p.cap = std::max<int64_t>(9, (std::max(sms, 1) + blocks_per_split - 1) / blocks_per_split);
  } else if (n <= 8) {
    const int64_t blocks_per_split = int64_t(n) * ((Hq + kHeads - 1) / kHeads);
    p.chunk = 2 * kTile;
    p.cap = std::max<int64_t>(1, std::max(sms, 1) / blocks_per_split);
  } else if (n <= 256) {
    p.chunk = 1024;
  } else {
    const int64_t fit = std::max<int64_t>(1, (int64_t(256) << 20) / bytes_per_split);
    const int64_t S = std::min(std::max<int64_t>(1, (max_keys + 1023) / 1024), fit);
    p.chunk = ((max_keys + S - 1) / S + kTile - 1) / kTile * kTile;
  }
  // Every query of up to max_keys keys fits: ceil(count / keys_per_split) <= ceil(max_keys / chunk), and <= cap.
  int64_t S = (max_keys + p.chunk - 1) / p.chunk;
  if (p.cap > 0) S = std::min(S, p.cap);
  p.splits = int(std::max<int64_t>(1, S));
  size_plan(p, n, Hq, Dh);
  return p;
}

SplitPlan fwd_attend_splitk_plan_rows(int n, int Hq, int64_t Dh, int64_t max_keys, int sms) {
  SplitPlan p = fwd_attend_splitk_plan(1, Hq, Dh, max_keys, sms);
  size_plan(p, n, Hq, Dh);
  return p;
}

bool fwd_attend_splitk_fits(int64_t head_dim) { return head_dim > 0 && head_dim % kSlice == 0 && head_dim <= kMaxDh; }

void fwd_attend_splitk(const AttendArgs& a, const SplitPlan& plan, void* scratch, Stream s) {
  if (a.n <= 0) return;
  if (!fwd_attend_splitk_fits(a.Dh)) throw_arg("attention (split-K): head_dim must be a multiple of 32, at most 512");
  if (a.official) throw_arg("attention (split-K): the official numerics' key layout is the unsplit attention's only");
  if (a.ring_rows && !a.entries_rows && a.type != 0) throw_arg("attention (split-K): rows of several sessions need each row's entries");
  if (a.type_rows && (!a.ring_rows || a.type != 1 || !a.sel))
    throw_arg("attention (split-K): per-row types are for rows of several sessions, a CSA launch with its selection");
  if (plan.chunk <= 0 || plan.chunk % kTile != 0 || plan.cap < 0 || plan.splits < 1)
    throw_arg("attention (split-K): keys per split must be a positive multiple of 32");
  for (const void* p : {static_cast<const void*>(a.chunk_kv), static_cast<const void*>(a.ring), static_cast<const void*>(a.entries)})
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) throw_arg("attention (split-K): key rows must be 16-byte aligned");
  if (a.out_inv_freq && (!a.out16 || a.out_rope_off < 0 || a.out_rope_off % 2 || a.out_rope_off > a.Dh))
    throw_arg("attention (split-K): the output's rotation needs an f16 output and an even first rotated dim within head_dim");
  const int ngroups = (a.Hq + kHeads - 1) / kHeads;
  const int S = plan.splits;
  check_branch_wait(a.wait, int64_t(a.n) * ngroups * S, "attention (split-K)");
  Partials P{};
  if (S > 1) {
    if (!scratch) throw_arg("attention (split-K): no scratch for the partials");
    const size_t rows = size_t(a.n) * size_t(a.Hq);
    P.l = static_cast<double*>(scratch);  // doubles first: 8-byte aligned
    P.m = reinterpret_cast<float*>(P.l + rows * size_t(S));
    P.acc = P.m + rows * size_t(S);
  }
  const size_t smem = size_t(2 * kTile) * size_t(a.Dh) * 4 + size_t(a.Dh / kSlice) * kHeads * kPart * 8;
  const bool pdl = pdl_hc_attn_enabled();  // cuda.pdl_hc_attn
  auto go = [&](auto kern, size_t& raised) {  // (per process and kernel: the attribute is per kernel)
    if (smem > raised) {
      PLUMB_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      raised = smem;
    }
    launch_as(pdl, "fwd_attend_split", kern, dim3(unsigned(a.n * ngroups), unsigned(S)), kThreads, smem, s, a, P, plan);
  };
  static size_t raised[8] = {48 * 1024, 48 * 1024, 48 * 1024, 48 * 1024, 48 * 1024, 48 * 1024, 48 * 1024, 48 * 1024};
  const bool qnorm = a.q_inv_freq != nullptr;
  auto pick = [&](auto f16) {  // attn.splitk_f16's kernels take the second four
    constexpr bool kH = decltype(f16)::value;
    size_t* r = raised + (kH ? 4 : 0);
    if (S == 1) qnorm ? go(attend_split_kernel<true, true, kH>, r[0]) : go(attend_split_kernel<true, false, kH>, r[1]);
    else qnorm ? go(attend_split_kernel<false, true, kH>, r[2]) : go(attend_split_kernel<false, false, kH>, r[3]);
  };
  if (a.f16) pick(std::true_type{});
  else pick(std::false_type{});
  if (S == 1) return;
  launch_as(pdl, "fwd_attend_merge", attend_merge_kernel, dim3(unsigned(a.n * a.Hq)), kMergeThreads, 0, s, a, P, S);
}

}  // namespace plumb::cuda::detail
