// Manifold-constrained hyper-connections on the GPU: hc_pre (norm, the (2+H)*H mixes over H*D, then the sigmoid
// gates and Sinkhorn of model/hc_math.h, the same code the CPU reference runs, and the collapse) in one cluster
// launch, hc_post elementwise. Twin of src/model/hyper_connection.cpp: fp64 dot products.
#include <cooperative_groups.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "cuda/cluster_push.cuh"
#include "cuda/hc_fold.cuh"
#include "cuda/official.cuh"
#include "model/hc_math.h"

namespace plumb::cuda::detail {

namespace {

constexpr int kMaxHc = 8;                      // hc_mult 1..8, as the config reader (model/config.cpp)
constexpr int kMaxMix = (2 + kMaxHc) * kMaxHc;  // 80

// hc_pre in one launch: a cluster of S blocks (16 where the GPU schedules it, else 8) per token, block s owning
// the slice d in [s * per, (s + 1) * per) of all H streams, which it keeps in shared memory (the fused hc_post's
// output, or loaded once). Three cluster reductions, each pushed (hc_push: every block stores its partials into the
// inbox of each block that needs them, and waits on its own mbarrier for the bytes it expects; no global scratch,
// no counters, no cluster barrier after the prologue's):
//   1. each block's fp64 sum of squares of its slice (its fn rows already on their way to L2, or with SF into its
//      shared memory); every block sums the S partials in rank order, so r = rsqrt(mean + eps) has the same bits
//      everywhere;
//   2. each block's fp64 partial dots of the (2+H)*H mixes over its slice (per thread, a warp reduce-scatter,
//      the warps in order), pushed: the H pre mixes to every block, the others to the token's block;
//   3. each block sums the S partials of the mixes it holds in rank order (fp32 mix; official: times float(r)),
//      then collapses its slice with the pre gates (every collapsing thread runs hc_math::gates itself); block m's
//      first warp runs token m's Sinkhorn meanwhile (one thread for H*H > 32), its warp 1 the post gates (unless
//      HcArgs::gates_apart leaves both to fwd_hc_gates, beside the next kernels);
//   4. (HcArgs::norm_w) the RMSNorm of the collapsed row, its sum of squares over the cluster like r's, while
//      the first warps may still be in their Sinkhorns.
// The fp64 sums are the twin's (exact products, fp64 accumulation); their order is this split's: per thread in
// element order, a fixed shuffle tree, warps in order, blocks in rank order (deterministic; the same in eager
// launches and graphs). With many tokens a cluster takes M = 2 or 4 tokens, each phase running for all of them
// (launch_hc_pre), in the same order per token.
constexpr int kHcThreads = 256;
constexpr int kHcMaxCluster = 16;

// The width of a block's slice of D (a multiple of the item width W), for the launch's shared memory and the staging
// rule; the kernel writes the same expression inline (through this function its code came out different, session 41).
__host__ __device__ constexpr int64_t hc_slice_width(int64_t D, int S, int W) { return ((D + S - 1) / S + W - 1) / W * W; }

__host__ __device__ constexpr int pow2_at_least(int v) { return v <= 1 ? 1 : 2 * pow2_at_least((v + 1) / 2); }
__host__ __device__ constexpr int log2_of(int v) { return v <= 1 ? 0 : 1 + log2_of(v / 2); }

// Values [B, B + C) of acc (zero beyond NM) reduced over the warp into red[B + i] (lane 0 of each group of lanes
// holding value i writes it).
template <int NM, int B, int C>
__device__ __forceinline__ void hc_warp_reduce(const double (&acc)[NM], int lane, double* red) {
  double v[C];
#pragma unroll
  for (int i = 0; i < C; ++i) v[i] = B + i < NM ? acc[B + i] : 0.0;
  warp_reduce_scatter<C>(v, lane);
  constexpr int shift = 5 - log2_of(C);
  if ((lane & ((1 << shift) - 1)) == 0 && B + (lane >> shift) < NM) red[B + (lane >> shift)] = v[0];
}
// All NM values in chunks of 32 (the last one's width the next power of two): one chunk up to hc_mult 4 (24 mixes),
// two up to 6 (48), three at 8 (80).
template <int NM, int B = 0>
__device__ __forceinline__ void hc_warp_reduce_all(const double (&acc)[NM], int lane, double* red) {
  hc_warp_reduce<NM, B, (NM - B >= 32 ? 32 : pow2_at_least(NM - B))>(acc, lane, red);
  if constexpr (B + 32 < NM) hc_warp_reduce_all<NM, B + 32>(acc, lane, red);
}

template <bool VEC>
__device__ __forceinline__ void hc_load(const float* p, float (&v)[VEC ? 4 : 1]) {
  if constexpr (VEC) {
    const float4 q = *reinterpret_cast<const float4*>(p);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
  } else {
    v[0] = *p;
  }
}

// The previous sublayer's output y at W columns d of token t: loaded, or (HcArgs::y_slots) the MoE combine of its
// slots' rows (moe_combine_cols: the combine launch's arithmetic).
struct HcY {
  const float* y = nullptr;
  const float* slots = nullptr;
  const float* w = nullptr;
  const float* add = nullptr;
  int k = 0;
  float scale = 1.0f;
};
template <bool VEC>
__device__ __forceinline__ void hc_y(const HcY& src, int64_t t, int64_t D, int64_t d, float (&yv)[VEC ? 4 : 1]) {
  if (src.slots) moe_combine_cols<VEC ? 4 : 1>(src.slots, src.w, src.add, src.k, src.scale, D, t, d, yv);
  else hc_load<VEC>(src.y + t * D + d, yv);
}

__host__ __device__ inline HcY hc_y_of(const HcArgs& a) { return HcY{a.y, a.y_slots, a.y_w, a.y_add, a.y_k, a.y_scale}; }

// hc_post of the W columns at d of token t, for every stream k: out[t, k, d..] = post_k * y + sum_j comb[j][k] * x_j
// (hc_post_stream, hc_fold.cuh: the same arithmetic in cuda.hc_fold's GEMV epilogue); the H inputs are loaded once
// for the H outputs. The one implementation of hc_post: its kernel and hc_pre's fused
// prologue (HcArgs::y or y_slots), which also keeps the outputs in shared memory (sm: stream k's at sm[k * sm_ld]).
// BF (the official numerics' bf16 activations) a template parameter and the comb's strides chosen once: per element,
// the rounding and the untransposed fault's choice were if-converted into selects and conversions in every mode
// (FSEL 8.6 % and F2F 7.5 % of hc_pre's instructions at 32 tokens under ncu, session 25).
constexpr int kPostMaxH = kMaxHc;
template <bool VEC, bool BF>
__device__ __forceinline__ void hc_post_cols(const HcY& ysrc, const float* X, const float* post, const float* comb, int64_t t, int H,
                                             int64_t D, int64_t d, int untransposed, float* out, float* sm = nullptr, int sm_ld = 0) {
  constexpr int W = VEC ? 4 : 1;
  float yv[W], xv[kPostMaxH][W];
  hc_y<VEC>(ysrc, t, D, d, yv);
#pragma unroll
  for (int j = 0; j < kPostMaxH; ++j)
    if (j < H) hc_load<VEC>(X + (t * H + j) * D + d, xv[j]);
  const float* C = comb + t * H * H;
  const int sj = untransposed ? 1 : H, sk = untransposed ? H : 1;  // comb[j][k], or fault.comb_untransposed's comb[k][j]
  for (int k = 0; k < H; ++k) {
    float acc[W];
    hc_post_stream<W, kPostMaxH>(yv, xv, post[t * H + k], C, H, sj, sk, k, acc);
    if constexpr (BF) {
#pragma unroll
      for (int w = 0; w < W; ++w) acc[w] = bf16r(acc[w]);
    }
    float* dst = out + (t * H + k) * D + d;
    if constexpr (VEC) *reinterpret_cast<float4*>(dst) = make_float4(acc[0], acc[1], acc[2], acc[3]);
    else dst[0] = acc[0];
    if (sm) {
#pragma unroll
      for (int w = 0; w < W; ++w) sm[k * sm_ld + w] = acc[w];
    }
  }
}

// comb by one warp, lane j*H + k holding C[j][k]: hc_math::weights_h's Sinkhorn step for step (row softmax + eps,
// a column normalization, then iters - 1 row and column normalizations), each sum taken in the same order through
// shuffles, so the result is bit-identical to that thread's (tests/cuda: HcPreWarpSinkhornMatchesSerial). H * H <= 32.
// H is a template parameter: a row's or column's H shuffles are issued together, then the H dependent adds and
// one division per lane. One thread doing the 20 iterations alone took ~40 us (dependent divisions).
template <int H>
__device__ void sinkhorn_warp(const float* mix, const float* scale, const float* base, float eps, int iters, float* comb) {
  const int lane = threadIdx.x & 31, j = lane / H, k = lane % H;
  const bool on = lane < H * H;
  float c = on ? fmaf(mix[2 * H + lane], scale[2], base[2 * H + lane]) : 0.0f;
  // hc_math::softmax of row j, then + eps.
  float v[H];
#pragma unroll
  for (int kk = 0; kk < H; ++kk) v[kk] = __shfl_sync(0xFFFFFFFFu, c, j * H + kk);
  float m = -INFINITY;
#pragma unroll
  for (int kk = 0; kk < H; ++kk) m = fmaxf(m, v[kk]);
  const float e = expf(c - m);
#pragma unroll
  for (int kk = 0; kk < H; ++kk) v[kk] = __shfl_sync(0xFFFFFFFFu, e, j * H + kk);
  double s = 0;
#pragma unroll
  for (int kk = 0; kk < H; ++kk) s += double(v[kk]);
  c = m == -INFINITY ? 0.0f : float(double(e) / s);
  c += eps;
  // Divides by the sum (in index order) + eps of the H elements at lanes first + i * stride: this lane's column
  // (first k, stride H) or row (first j * H, stride 1).
  auto normalize = [&](int first, int stride) {
#pragma unroll
    for (int i = 0; i < H; ++i) v[i] = __shfl_sync(0xFFFFFFFFu, c, first + i * stride);
    float t = 0;
#pragma unroll
    for (int i = 0; i < H; ++i) t += v[i];
    c /= t + eps;
  };
  normalize(k, H);
  for (int it = 1; it < iters; ++it) {
    normalize(j * H, 1);
    normalize(k, H);
  }
  if (on) comb[lane] = c;
}

// v[m] for a runtime m without local memory (v stays in registers).
template <int M, class T>
__device__ __forceinline__ T pick(const T (&v)[M], int m) {
  T x = v[0];
#pragma unroll
  for (int k = 1; k < M; ++k)
    if (m == k) x = v[k];
  return x;
}

// Each token's v[m] (m < mt) summed over the warps [w0, kWarps) of the block, handed to emit(m, sum): each warp's
// lanes first, then the warps in order (block_sum's order), meeting at `sync` (the whole block's barrier, or a named
// barrier of the warps taking part); lane 0 of each warp leaves its sums in sh. Phase 1's and phase 4's sums of squares.
template <int M, int kWarps, class Sync, class Emit>
__device__ __forceinline__ void hc_token_sums(double (&v)[M], double (&sh)[M][kWarps], int mt, int w0, Sync sync, Emit emit) {
  const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5), i = int(threadIdx.x) - 32 * w0;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    v[m] = warp_sum(v[m]);
    if (lane == 0) sh[m][warp] = v[m];
  }
  sync();
  if (i >= 0 && i < mt) {
    double tot = 0;
    for (int w = w0; w < kWarps; ++w) tot += sh[i][w];
    emit(i, tot);
  }
}

// The S partials of an inbox column in rank order (the order of every earlier split of these sums).
template <class F>
__device__ __forceinline__ double hc_rank_sum(int S, F part) {
  double t = 0;
  for (int q = 0; q < S; ++q) t += part(q);
  return t;
}

// 2 blocks per SM: a cluster of 16 fits in 8 SMs. (Session 8 measured a variant with one block per SM, all
// registers, and each thread's first fn values loaded into registers at the start: the GPU then schedules no
// cluster of 16, and with 8 blocks per token it took 18.7 us against 16.5.)
// M tokens per cluster (launch_hc_pre): block s holds slice s of each of its tokens, and every phase runs for the M
// tokens between the same barriers, so the launch's chain of cluster barriers is paid once per M tokens. A token's
// arithmetic is the one-token launch's (the same items per thread, in the same order): its bits do not depend on M.
// F (the forward's launch with the reference numerics: HcArgs::mix_mode 0, fp32 activations, the warp's Sinkhorn):
// those choices compile-time constants, so the kernel holds only their path (hc_mult 4 on the vector path: 5168
// instructions against 8736 with every mode's; the launch runs from a cold instruction cache, and ncu's source
// pages found it waiting for instructions at every phase, session 38). The same arithmetic: the bits of F = false.
// SF (one token per cluster, the vector path): each thread copies the fn values of its own items (all nm rows) into
// shared memory before the PDL wait (fn is a weight), where phase 2 reads them; without SF phase 2 reads them from
// L2 (prefetched there at the start): the stamps of session 41 put ~1.8 us of the launch in that phase, its 16 blocks
// reading 1.5 MB through the L2 ports of 8 SMs. The same values in the same order: the same bits.
// NA (cuda.hc_norm_after_mix; with F, one token per cluster): phase 2's dots take the raw streams, x . fn (the
// official order: the norm after the mixing GEMM), so they start while phase 1's sums travel, and phase 3 scales them,
// mix = float(r * (x . fn)) in fp64, where the reference takes float(x * r) . fn: the fp32 rounding of x * r skipped
// (~1e-7 relative; tests/cuda: HcNormAfterMixMatchesExact).
// PP (cuda.hc_fold; NA's form, one token): the streams' slice is the previous GEMV's hc_post (HcArgs::part's launch
// wrote X), and its partial sums replace phases 1 and 2: every block totals them itself (phase 3).
template <int H, bool VEC, int M, bool F = false, bool SF = false, bool NA = false, bool PP = false>
__global__ void __launch_bounds__(kHcThreads, 2) hc_pre_kernel(const HcArgs a, double* mix_out) {
  constexpr int NM = (2 + H) * H;  // mixes (hc_head: the first H)
  constexpr int W = VEC ? 4 : 1;   // elements per item
  static_assert(!SF || (VEC && M == 1), "fn staged for one token's vector launch");
  static_assert(!NA || (F && M == 1), "the norm after the mix: the forward's numerics, one token per cluster");
  static_assert(!PP || (NA && VEC && !SF && H == kHcFoldH), "the GEMV's partials: NA's numerics, hc_mult 4, fn not read here");
  constexpr int kWarps = kHcThreads / 32;
  // Phase 3's threads per token: 64 (M <= 4 tokens; hc_mult <= 6), the whole block for hc_mult 7 and 8 (one token).
  constexpr int kPerToken = NM <= 64 ? 64 : kHcThreads / M;
  static_assert(M <= 4 && NM <= kPerToken && M * kPerToken <= kHcThreads, "phase 3 gives each token kPerToken threads");
  __shared__ double red_s[kWarps][NM];
  __shared__ double sh[M][kWarps];
  // The pushed reductions' inboxes, [source rank]...: each token's sums of squares (phase 1, phase 4), its H pre
  // mixes, and the other mixes of this block's own token (block m < mt: token m's gates). Their mbarriers: 0 the
  // sums of squares, 1 the mixes, 2 the collapsed rows' sums.
  __shared__ double in_ss[kHcMaxCluster][M], in_ss2[kHcMaxCluster][M], in_pre[kHcMaxCluster][M][H], in_own[kHcMaxCluster][NM];
  __shared__ __align__(8) uint64_t bars[3];
  __shared__ float mix_s[M][NM];
  // This block's slice of the H streams of each token m, item-major (item it at xs(m) + it * W: stream it / nq, quad
  // it % nq), and of the collapsed row (cs(m) + q * W): written once, then read from shared memory by every phase.
  extern __shared__ float hc_smem[];

  namespace cg = cooperative_groups;
  const cg::cluster_group cl = cg::this_cluster();
  const int S = int(cl.num_blocks()), s0 = int(cl.block_rank());
  // This cluster's tokens t0 .. t0 + mt - 1 (mt <= M): the n tokens split evenly over the grid's clusters.
  const int t0 = int(int64_t(blockIdx.y) * a.n / gridDim.y), mt = int(int64_t(blockIdx.y + 1) * a.n / gridDim.y) - t0;
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  // (F: mode, act_bf16 and, below, warp_sinkhorn constants, so the other paths' branches compile to nothing: the
  // cubin's kernel sizes above were measured with this form.)
  const int nm = a.head ? H : NM, mode = F ? 0 : a.mix_mode;
  const int ms = s0;                     // the token whose gates this block computes, if any
  const bool own = !a.head && ms < mt;  // (S >= 8 >= M: every token has its block)
  const bool act_bf16 = !F && a.act_bf16;
  const int64_t D = a.D, hd = int64_t(H) * D;
  const int64_t per = ((D + S - 1) / S + W - 1) / W * W;
  const int64_t d0 = min(D, int64_t(s0) * per);
  const int nq = int((min(D, d0 + per) - d0) / W);
  auto xs = [&](int m) { return hc_smem + m * (H + 1) * per; };
  auto cs = [&](int m) { return hc_smem + m * (H + 1) * per + H * per; };
  // item -> offset in [0, hd)
  auto off = [&](int it) { return int64_t(it / nq) * D + d0 + int64_t(it % nq) * W; };

  // The fn rows of this block's slice on their way to L2 (once for the M tokens): H * nm contiguous rows of nq * W
  // floats each, a 128-byte line per thread and step (per-lane addresses: the bulk prefetch takes a uniform operand,
  // which the compiler served lane by lane, a 32-step loop on the critical path).
  // (SF: this block's fn values, [o][item] float4s after the slices, each thread's own items.)
  float* const fs = hc_smem + (H + 1) * per;
  if constexpr (SF) {
    for (int it = tid; it < H * nq; it += kHcThreads)
      for (int o = 0; o < nm; ++o) cp16(smem_u32(fs + (int64_t(o) * H * nq + it) * 4), a.fn + o * hd + off(it));
    cp_commit();
  } else if constexpr (!PP) {
    const int lines = int((int64_t(nq) * W * 4 + 127) / 128), n = H * nm * lines;
    for (int i = tid; i < n; i += kHcThreads) {
      const int row = i / lines, l = i - row * lines;
      const float* p = a.fn + int64_t(row / H) * hd + int64_t(row % H) * D + d0 + int64_t(l) * 32;
      asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
    }
  }
  if (tid == 0) {
    hc_bar_init(&bars[0], uint32_t(PP ? 0 : S * mt * 8));  // (PP: phases 1 and 2 push nothing)
    hc_bar_init(&bars[1], uint32_t(PP ? 0 : S * mt * H * 8 + (own ? S * (nm - H) * 8 : 0)));
    hc_bar_init(&bars[2], uint32_t(a.norm_w ? S * mt * 8 : 0));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cl.barrier_arrive();  // every block's mbarriers in place before any push (waited before phase 1's)
  // (cuda.pdl_hc_attn) everything below reads or writes what earlier kernels write or read; fn is a weight. Before
  // the wait, cuda.branch_flags' wait for the side branches this launch reads (a.wait).
  pdl_begin_after(a.wait, "hc_pre");

  // 0. This block's slice of each token's streams into shared memory: the fused hc_post of the previous sublayer
  // (a.y, or the MoE combine a.y_slots; also written to a.X_out = a.X, the new residual streams), or a.X. Elementwise,
  // so the M tokens' columns are spread over the whole block at once (their global loads in flight together).
  if (nq > 0) {
    if (a.y || a.y_slots) {
      auto post_all = [&](auto bf) {
        for (int i = tid; i < mt * nq; i += kHcThreads) {
          const int m = i / nq, q = i - m * nq;
          hc_post_cols<VEC, decltype(bf)::value>(hc_y_of(a), a.X_prev, a.post_prev, a.comb_prev, t0 + m, H, D, d0 + int64_t(q) * W,
                                                 a.untransposed, a.X_out, xs(m) + q * W, nq * W);
        }
      };
      if (act_bf16) post_all(std::true_type{});
      else post_all(std::false_type{});
    } else {
      for (int i = tid; i < mt * H * nq; i += kHcThreads) {
        const int m = i / (H * nq), it = i - m * (H * nq);
        float x4[W];
        hc_load<VEC>(a.X + int64_t(t0 + m) * hd + off(it), x4);
#pragma unroll
        for (int w = 0; w < W; ++w) xs(m)[it * W + w] = x4[w];
      }
    }
  }
  __syncthreads();

  // 1. Each token's sum of squares over the slice (per thread, its warp, the warps in order: block_sum's order), then
  // over the split (every warp of every block sums the S partials in rank order, so r = rsqrt(mean + eps) has the
  // same bits everywhere).
  if constexpr (PP) {
    cl.barrier_wait();  // (the prologue's: every block's mbarriers in place before phase 4's pushes)
  } else {
    double ss[M];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      ss[m] = 0;
      if (m < mt)
        for (int it = tid; it < H * nq; it += kHcThreads) {
#pragma unroll
          for (int w = 0; w < W; ++w) ss[m] += double(xs(m)[it * W + w]) * xs(m)[it * W + w];
        }
    }
    cl.barrier_wait();
    hc_token_sums(ss, sh, mt, 0, [] { __syncthreads(); }, [&](int m, double v) {
      for (int q = 0; q < S; ++q) hc_push(&in_ss[s0][m], &bars[0], q, v);
    });
  }
  double r[M];
  auto take_r = [&] {  // (NA: after the dots)
    hc_bar_wait(&bars[0]);
#pragma unroll
    for (int m = 0; m < M; ++m) r[m] = m < mt ? 1.0 / sqrt(hc_rank_sum(S, [&](int q) { return in_ss[q][m]; }) / double(hd) + a.rms_eps) : 0.0;
  };
  if constexpr (!NA && !PP) take_r();

  // 2. Each token's partial dots over the slice: 0 the reference, float(x * r) . fn; 1 mhc.bf16_mix,
  // bf16(x * r) . bf16(fn); 2 official, x . fn. One token at a time (fn's slice is read from L1/L2 again per
  // token: its NM accumulators per token are what the registers hold).
  if constexpr (SF) cp_wait<0>();  // (this thread's own fn copies)
#pragma unroll 1
  for (int m = 0; m < (PP ? 0 : mt); ++m) {
    const double rm = NA ? 0.0 : pick(r, m);
    double acc[NM];
#pragma unroll
    for (int o = 0; o < NM; ++o) acc[o] = 0.0;
    // The mode a constant of each loop: read per element, mode 1's bf16 roundings and selects ran in mode 0 too
    // (if-converted; FSEL and F2F were 7 % and 11.5 % of the kernel's instructions under ncu); 2.7-3.0 us per layer
    // less at batch 1 (paired A/B, session 22).
    auto dots = [&](auto mode_c) {
      constexpr int md = decltype(mode_c)::value;
      for (int it = tid; it < H * nq; it += kHcThreads) {
        [[maybe_unused]] const int64_t oi = off(it);
        double xr[W];
#pragma unroll
        for (int w = 0; w < W; ++w) {
          const float xv = xs(m)[it * W + w];
          xr[w] = md == 2 ? double(xv) : md == 1 ? double(bf16r(float(double(xv) * rm))) : double(float(double(xv) * rm));
        }
#pragma unroll
        for (int o = 0; o < NM; ++o) {
          if (o >= nm) break;
          float f[W];
          if constexpr (SF) hc_load<VEC>(fs + (int64_t(o) * H * nq + it) * 4, f);
          else hc_load<VEC>(a.fn + o * hd + oi, f);
#pragma unroll
          for (int w = 0; w < W; ++w) acc[o] += xr[w] * (md == 1 ? double(bf16r(f[w])) : double(f[w]));
        }
      }
    };
    if (NA) dots(std::integral_constant<int, 2>{});  // the raw streams; r comes in phase 3
    else if (mode == 0) dots(std::integral_constant<int, 0>{});
    else if (mode == 1) dots(std::integral_constant<int, 1>{});
    else dots(std::integral_constant<int, 2>{});
    if (m > 0) __syncthreads();  // (the previous token's red_s read)
    hc_warp_reduce_all<NM>(acc, lane, red_s[warp]);
    __syncthreads();
    if (tid < nm) {
      double s = 0;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) s += red_s[w][tid];
      if (tid < H) {
        for (int q = 0; q < S; ++q) hc_push(&in_pre[s0][m][tid], &bars[1], q, s);
      } else {
        hc_push(&in_own[s0][tid], &bars[1], m, s);  // (nm > H: not hc_head) to token m's block
      }
    }
  }
  if constexpr (!PP) hc_bar_wait(&bars[1]);
  if constexpr (NA && !PP) take_r();

  // 3. The mixes this block holds from the S partials in rank order, kPerToken threads per token: every token's pre mixes,
  // its own token's others (block m writes token m's mixes out).
  if constexpr (PP) {
    // (cuda.hc_fold) The GEMV tiles' partials (tile b: its NM dots, then its sum of squares), totalled in one fixed
    // order in every block: per thread its tiles tid, tid + 256, ... in order (one tile each at V4-Flash's 256: the
    // 25 loads in flight together), warp_reduce_scatter's tree, then the warps in order. r and the mixes then have
    // the same bits in every block: float(r * (x . fn)), NA's.
    constexpr int NV = kHcFoldSums;
    __shared__ double wsum_s[kWarps][NV];
    const int64_t tiles = D / 16;
    double v[32];
#pragma unroll
    for (int o = 0; o < 32; ++o) v[o] = 0.0;
    for (int64_t b = tid; b < tiles; b += kHcThreads)
#pragma unroll
      for (int o = 0; o < NV; ++o) v[o] += a.part[o * tiles + b];  // (value-major: coalesced over b)
    warp_reduce_scatter<32>(v, lane);
    if (lane < NV) wsum_s[warp][lane] = v[0];
    __syncthreads();
    if (tid < NM) {
      double dot = 0, ss = 0;
      for (int w = 0; w < kWarps; ++w) dot += wsum_s[w][tid], ss += wsum_s[w][NM];
      const float mv = float(dot * (1.0 / sqrt(ss / double(hd) + a.rms_eps)));  // (take_r's r)
      mix_s[0][tid] = mv;
      if (own && mix_out) mix_out[int64_t(t0) * NM + tid] = double(mv);
    }
  } else {
    const int m = tid >> log2_of(kPerToken), o = tid & (kPerToken - 1);  // (kPerToken a power of 2)
    if (m < mt && o < nm && (o < H || m == ms)) {
      const double s = o < H ? hc_rank_sum(S, [&](int q) { return in_pre[q][m][o]; }) : hc_rank_sum(S, [&](int q) { return in_own[q][o]; });
      float mv = float(s);
      if (NA) mv = float(s * pick(r, m));  // fp64: r * (x . fn)
      else if (mode == 2) mv = __fmul_rn(mv, float(pick(r, m)));  // official: float(x . fn) * float(r)
      mix_s[m][o] = mv;
      if (m == ms && mix_out) mix_out[int64_t(t0 + m) * nm + o] = double(mv);
    }
  }
  __syncthreads();

  // Warp 0 of each block takes no part in the collapse and the norm: in block m < mt it runs token m's Sinkhorn (the
  // warp, or its lane 0 for H * H > 32 and the tests' serial twin) meanwhile. It stays out of their barriers (the
  // norm sums over warps 1.. with named barrier 1).
  const bool gates = own && !a.gates_apart, warp_sinkhorn = gates && H * H <= 32 && (F || !a.serial_sinkhorn);
  if (warp == 0) {
    if constexpr (H * H <= 32) {
      if (warp_sinkhorn) sinkhorn_warp<H>(mix_s[ms], a.scale, a.base, a.hc_eps, a.iters, a.comb + int64_t(t0 + ms) * H * H);
    }
    if (gates && !warp_sinkhorn && lane == 0) {  // H >= 6 (36+ > 32 lanes), or the test's serial twin: one thread
      float pre[H], post[H], C[H * H];
      hc_math::weights_h<H>(mix_s[ms], a.scale, a.base, a.hc_eps, a.iters, pre, post, C);
      for (int i = 0; i < H * H; ++i) a.comb[int64_t(t0 + ms) * H * H + i] = C[i];
      for (int j = 0; j < H; ++j) a.post[int64_t(t0 + ms) * H + j] = post[j];
    }
    return;
  }
  if (warp_sinkhorn && tid == 32) {  // the post gates beside the warp's Sinkhorn
    float pre[H], post[H];
    hc_math::gates(mix_s[ms], a.scale, a.base, H, a.hc_eps, pre, post);
    for (int j = 0; j < H; ++j) a.post[int64_t(t0 + ms) * H + j] = post[j];
  }
  // The collapse of each token's slice, sum_j pre_j * x_j, by warps 1..: to the output, or (with the fused norm) to
  // cs, where each thread reads back only its own columns.
  constexpr int first = 32, kCollapse = kHcThreads - first;
  auto collapse = [&](auto bf) {
#pragma unroll 1
    for (int m = 0; m < mt; ++m) {
      float pre[H];
      hc_math::gates(mix_s[m], a.scale, a.base, H, a.hc_eps, pre, nullptr);
      for (int q = tid - first; q < nq; q += kCollapse) {
        float acc2[W];
#pragma unroll
        for (int w = 0; w < W; ++w) acc2[w] = 0.0f;
#pragma unroll
        for (int j = 0; j < H; ++j) {
#pragma unroll
          for (int w = 0; w < W; ++w) acc2[w] = __fadd_rn(acc2[w], __fmul_rn(pre[j], xs(m)[(j * nq + q) * W + w]));
        }
        if constexpr (decltype(bf)::value) {
#pragma unroll
          for (int w = 0; w < W; ++w) acc2[w] = bf16r(acc2[w]);
        }
        if (a.norm_w) {
#pragma unroll
          for (int w = 0; w < W; ++w) cs(m)[q * W + w] = acc2[w];
        } else {
          float* dst = a.collapsed + int64_t(t0 + m) * D + d0 + int64_t(q) * W;
          if constexpr (VEC) *reinterpret_cast<float4*>(dst) = make_float4(acc2[0], acc2[1], acc2[2], acc2[3]);
          else dst[0] = acc2[0];
        }
      }
    }
  };
  if (act_bf16) collapse(std::true_type{});
  else collapse(std::false_type{});
  if (!a.norm_w) return;

  // 4. Fused RMSNorm of the collapsed rows (a.norm_w: attn_norm / ffn_norm, or the final norm after hc_head), with
  // the f16 copy: rms_norm_row's arithmetic (fp64 sum of squares of the fp32 values, rms_inv, rms_scaled) with the
  // sum in this split's order (per thread, its warp, the warps 1.. in order, the blocks in rank order): the products
  // are exact, so only the fp64 rounding of the sum can differ from the norm kernel's, and it moves the fp32 inv by
  // one ulp with probability ~1e-8 per row.
  {
    double ss2[M];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      ss2[m] = 0;
      if (m < mt)
        for (int q = tid - first; q < nq; q += kCollapse) {
#pragma unroll
          for (int w = 0; w < W; ++w) ss2[m] += double(cs(m)[q * W + w]) * cs(m)[q * W + w];
        }
    }
    hc_token_sums(ss2, sh, mt, first / 32, [] { asm volatile("bar.sync 1, %0;" ::"r"(kCollapse) : "memory"); }, [&](int m, double v) {
      for (int q = 0; q < S; ++q) hc_push(&in_ss2[s0][m], &bars[2], q, v);
    });
  }
  hc_bar_wait(&bars[2]);
  float inv[M];
#pragma unroll
  for (int m = 0; m < M; ++m) inv[m] = m < mt ? rms_inv(hc_rank_sum(S, [&](int q) { return in_ss2[q][m]; }), D, a.norm_eps) : 0.0f;
  // The rows out, elementwise: the M tokens' columns over the collapsing warps at once.
  for (int i = tid - first; i < mt * nq; i += kCollapse) {
    const int m = i / nq, q = i - m * nq;
    const int64_t t = t0 + m, d = d0 + int64_t(q) * W;
    const float im = pick(inv, m);
    float gv[W];
    hc_load<VEC>(a.norm_w + d, gv);
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const float y = rms_scaled(cs(m)[q * W + w], im, gv[w]);
      a.collapsed[t * D + d + w] = y;
      if (a.collapsed16) reinterpret_cast<__half*>(a.collapsed16)[t * D + d + w] = __float2half_rn(y);
    }
  }
}
// hc_post, one thread per (token, W consecutive d) writing all H streams (hc_post_cols).
constexpr int kPostThreads = 128;

template <bool VEC>
__global__ void __launch_bounds__(kPostThreads) hc_post_kernel(const float* y, const float* X, const float* post, const float* comb, int n,
                                                               int H, int64_t D, int untransposed, int act_bf16, float* out) {
  constexpr int W = VEC ? 4 : 1;
  const int64_t nq = D / W, i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(n) * nq) return;
  const int64_t t = i / nq, d = (i - t * nq) * W;
  if (act_bf16) hc_post_cols<VEC, true>(HcY{y}, X, post, comb, t, H, D, d, untransposed, out);
  else hc_post_cols<VEC, false>(HcY{y}, X, post, comb, t, H, D, d, untransposed, out);
}

// The gates hc_pre left apart: one warp per token, from the fp32 mixes hc_pre wrote (as doubles, exactly), the
// code hc_pre's warp 0 and thread 32 run.
template <int H>
__global__ void __launch_bounds__(32) hc_gates_kernel(const HcArgs a, const double* mix) {
  constexpr int NM = (2 + H) * H;
  __shared__ float mix_s[NM];
  const int64_t t = blockIdx.x;
  const int lane = int(threadIdx.x);
  for (int o = lane; o < NM; o += 32) mix_s[o] = float(mix[t * NM + o]);
  __syncwarp();
  if constexpr (H * H <= 32) {
    if (!a.serial_sinkhorn) {
      sinkhorn_warp<H>(mix_s, a.scale, a.base, a.hc_eps, a.iters, a.comb + t * H * H);
      if (lane == 0) {
        float pre[H], post[H];
        hc_math::gates(mix_s, a.scale, a.base, H, a.hc_eps, pre, post);
        for (int j = 0; j < H; ++j) a.post[t * H + j] = post[j];
      }
      return;
    }
  }
  if (lane == 0) {
    float pre[H], post[H], C[H * H];
    hc_math::weights_h<H>(mix_s, a.scale, a.base, a.hc_eps, a.iters, pre, post, C);
    for (int i = 0; i < H * H; ++i) a.comb[t * H * H + i] = C[i];
    for (int j = 0; j < H; ++j) a.post[t * H + j] = post[j];
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// f(std::integral_constant<int, H>) for hc_mult H in 1..8 (the kernels are templated on it).
template <class F>
void with_hc_mult(int H, F f) {
  switch (H) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    case 7: f(std::integral_constant<int, 7>{}); break;
    case 8: f(std::integral_constant<int, 8>{}); break;
    default: throw_arg("hc: hc_mult " + std::to_string(H) + " is not in 1..8");
  }
}

// Blocks per token: 16 where the GPU co-schedules a cluster of 16 (a non-portable size), else the portable 8.
// Fixed per kernel for the process, so every launch splits the sums the same way.
// The slices of the streams and of the collapsed row: at most 36 KiB, so that with the static shared memory (up to
// ~10.5 KiB with the push reductions' inboxes, hc_mult 6) a block stays under the 48 KiB that needs no opt-in (the
// cluster-size query at 48 KiB found no cluster of 16 and fell back to 8 blocks per token). V4-Pro's slices at 4
// tokens per cluster: 35 KiB.
constexpr size_t kHcMaxSmem = 36 * 1024;
// hc_mult 7 and 8: their inboxes and reductions take up to ~16.7 KiB of static shared memory (80 mixes), so their
// slices get less (hidden sizes up to ~12K at 16 blocks per token).
constexpr size_t hc_max_smem(int H) { return H <= 6 ? kHcMaxSmem : 28 * 1024; }
template <int H, class Kern>
int hc_cluster_size(Kern kern) {
  return cluster_size_or_8(kern, kHcMaxCluster, kHcThreads, hc_max_smem(H));
}

// Clusters of Sv blocks (16 where the GPU schedules them, else 8), each block one slice of D, each cluster M tokens
// (HcArgs::tokens_per_cluster, or hc_pre_split's rule): the same arithmetic in the same order for
// every M (the Sv-way split), so a token's bits do not depend on the batch. M > 1 only on the vector path with
// hc_mult 4 (V4's shapes, Flash and Pro): other hc_mult values and the scalar path (odd hidden sizes) take one token
// per cluster, whatever tokens_per_cluster asks, with the same bits; their M = 2 and 4 kernels, 22 of the 36
// instantiations, are not compiled (this file was the build's longest, 88 s on one core).
// The fn values of a block's items (SF): all (2 + H) * H rows of its slice, at most kHcMaxStaged bytes of dynamic
// shared memory with the slice (two blocks per SM: 2 x (104 + ~6.5 static and reserved) KiB of the SM's 228). V4-Flash:
// 96 KiB + 5 KiB; V4-Pro's 7168-wide rows do not fit and take the L2 path.
constexpr size_t kHcMaxStaged = 104 * 1024;
size_t hc_fn_stage_bytes(int H, int64_t per) { return size_t((2 + H) * H) * size_t(H) * size_t(per) * sizeof(float); }
// Whether the GPU schedules the staged kernel's clusters of Sv blocks at kHcMaxStaged (asked once; a smaller launch
// fits where the largest does). Opts the kernel in to that much shared memory.
template <int H, bool NA = false>
bool hc_staged_ok(int Sv) {
  static const bool ok = [Sv] {
    auto k = hc_pre_kernel<H, true, 1, true, true, NA>;
    if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kHcMaxStaged)) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return max_active_clusters(k, Sv, kHcThreads, kHcMaxStaged) > 0;
  }();
  return ok;
}
// Whether one token's launch (hc_mult H, the vector path, the forward's numerics) stages fn: its slice and fn's fit
// in kHcMaxStaged and the GPU schedules the staged kernel's clusters. Returns the dynamic shared memory it takes.
template <int H, bool NA = false>
size_t hc_staged_smem(int Sv, int64_t per) {
  const size_t bytes = size_t(H + 1) * size_t(per) * sizeof(float) + hc_fn_stage_bytes(H, per);
  return bytes <= kHcMaxStaged && hc_staged_ok<H, NA>(Sv) ? bytes : 0;
}

// The launch's shape: clusters of Sv blocks, M tokens per cluster, `clusters` clusters; `slice_smem` a token's slices.
struct HcShape {
  int Sv, M, clusters;
  int64_t per;
  size_t slice_smem;
};
template <int H, bool VEC>
HcShape hc_pre_shape(const HcArgs& a) {
  static const int Sv = hc_cluster_size<H>(hc_pre_kernel<H, VEC, 1>);
  constexpr int W = VEC ? 4 : 1;
  const int64_t per = hc_slice_width(a.D, Sv, W);
  const size_t slice_smem = size_t(H + 1) * size_t(per) * sizeof(float);
  if (slice_smem > hc_max_smem(H)) throw_arg("hc_pre: hidden size " + std::to_string(a.D) + " too large for the GPU kernel's slices");
  int M = 1, clusters = a.n;
  if (a.tokens_per_cluster != 0 && a.tokens_per_cluster != 1 && a.tokens_per_cluster != 2 && a.tokens_per_cluster != 4)
    throw_arg("hc_pre: tokens_per_cluster must be 1, 2 or 4");
  if constexpr (VEC && H == 4) {
    // The M > 1 kernels at the M = 1 kernel's cluster size (their split must be the same); one that the GPU does not
    // schedule at that size is not used.
    // (The M = 4 kernel's count, the most static shared memory, is the launch rule's count of resident clusters.)
    static const int resident = max_active_clusters(hc_pre_kernel<H, VEC, 4>, Sv, kHcThreads, kHcMaxSmem);
    static const bool many = resident > 0 && max_active_clusters(hc_pre_kernel<H, VEC, 2>, Sv, kHcThreads, kHcMaxSmem) > 0;
    if (a.tokens_per_cluster > 0) {
      M = a.tokens_per_cluster;
      clusters = (a.n + M - 1) / M;
    } else {
      const HcSplit sp = hc_pre_split(a.n, resident);
      M = sp.tokens_per_cluster, clusters = sp.clusters;
    }
    // (an M that the GPU or the shared memory does not take: halved, in ceil(n / M) clusters)
    while (M > 1 && (!many || size_t(M) * slice_smem > kHcMaxSmem)) M /= 2, clusters = (a.n + M - 1) / M;
  }
  return {Sv, M, clusters, per, slice_smem};
}

template <int H, bool VEC>
void launch_hc_pre(const HcArgs& a, double* mix_out, Stream s) {
  const HcShape sh = hc_pre_shape<H, VEC>(a);
  check_branch_wait(a.wait, int64_t(sh.clusters) * sh.Sv, "hc_pre");
  const int M = sh.M, Sv = sh.Sv;
  auto kern = hc_pre_kernel<H, VEC, 1>;
  size_t smem = size_t(M) * sh.slice_smem;
  if constexpr (VEC && H == 4) {
    // The forward's numerics (the reference's mixes, fp32 activations, the warp's Sinkhorn): the kernels compiled
    // for them alone (F), where the GPU schedules them at this cluster size (the query also allows the size).
    static const bool f_ok = max_active_clusters(hc_pre_kernel<H, VEC, 1, true>, Sv, kHcThreads, kHcMaxSmem) > 0 &&
                             max_active_clusters(hc_pre_kernel<H, VEC, 2, true>, Sv, kHcThreads, kHcMaxSmem) > 0 &&
                             max_active_clusters(hc_pre_kernel<H, VEC, 4, true>, Sv, kHcThreads, kHcMaxSmem) > 0;
    const bool fast = f_ok && a.mix_mode == 0 && !a.act_bf16 && !a.serial_sinkhorn;
    if (M == 4) kern = fast ? hc_pre_kernel<H, VEC, 4, true> : hc_pre_kernel<H, VEC, 4>;
    if (M == 2) kern = fast ? hc_pre_kernel<H, VEC, 2, true> : hc_pre_kernel<H, VEC, 2>;
    // One token per cluster: the kernel for the forward's numerics, with fn staged where it fits; under
    // cuda.hc_norm_after_mix (HcArgs::norm_after_mix) its NA form.
    auto one = [&](auto na) {
      constexpr bool NA = decltype(na)::value;
      kern = hc_pre_kernel<H, VEC, 1, true, false, NA>;
      if (const size_t staged = hc_staged_smem<H, NA>(Sv, sh.per)) {
        kern = hc_pre_kernel<H, VEC, 1, true, true, NA>;
        smem = staged;
      }
    };
    auto na_ok = [&] {  // (asked once, and only where the patch is on)
      static const bool ok = max_active_clusters(hc_pre_kernel<H, VEC, 1, true, false, true>, Sv, kHcThreads, kHcMaxSmem) > 0;
      return ok;
    };
    if (a.part) {  // cuda.hc_fold (fwd_hc_pre checked the rest)
      static const bool pp_ok = max_active_clusters(hc_pre_kernel<H, VEC, 1, true, false, true, true>, Sv, kHcThreads, kHcMaxSmem) > 0;
      if (M != 1 || !fast || !pp_ok) throw_arg("hc_pre: the GEMV's partials need one token per cluster in the forward's numerics");
      kern = hc_pre_kernel<H, VEC, 1, true, false, true, true>;
    } else if (M == 1 && fast && a.norm_after_mix && na_ok()) {
      one(std::true_type{});
    } else if (M == 1 && fast) {
      one(std::false_type{});
    }
  } else {
    if (a.part) throw_arg("hc_pre: the GEMV's partials need hc_mult 4 and the vector path");
  }
  launch_cluster(pdl_hc_attn_enabled(), "fwd_hc_pre", kern, unsigned(Sv), unsigned(sh.clusters), unsigned(kHcThreads), smem, s, a, mix_out);
}

// Whether the vector kernels take a's rows (16-byte aligned, D a multiple of 4).
bool hc_vec(const HcArgs& a) {
  return a.D % 4 == 0 && aligned16(a.X) && aligned16(a.fn) && aligned16(a.collapsed) && (!a.y || (aligned16(a.y) && aligned16(a.X_prev))) &&
         (!a.norm_w || aligned16(a.norm_w)) && (!a.y_slots || (aligned16(a.y_slots) && aligned16(a.X_prev) && (!a.y_add || aligned16(a.y_add))));
}

}  // namespace

// H200 (132 SMs, clusters of 16, at most 14 resident at once), us per launch in graph replay (`plumb bench --only hc`,
// the forward's variant), session 25, with 1 / 2 / 4 tokens in each of ceil(n / M) clusters: 8 tokens 14.0 / 15.5 /
// 23.1, 16 tokens 24.5 / 19.3 / 23.4, 32 tokens 37.6 / 32.2 / 31.6, 64 tokens 63.4 / 49.1 / 50.6, 128 tokens 122.5 /
// 87.6 / 77.9; 32 tokens spread over the 14 resident clusters (2-3 each) 27.7. So: one wave of clusters while at
// most 4 tokens per cluster do, the tokens spread evenly over them; beyond, 2 per cluster up to 6 waves' worth of
// tokens (64: 49.1 against 50.6 with 4), then 4.
HcSplit hc_pre_split(int n, int resident) {
  const int c = std::max(1, std::min(n, resident)), need = (n + c - 1) / c;
  if (need > 4) {
    const int m = n <= 6 * resident ? 2 : 4;
    return {m, (n + m - 1) / m};
  }
  return {need > 2 ? 4 : need, c};
}

bool fwd_hc_pre_staged(int64_t D, bool norm_after_mix) {
  static const int Sv = hc_cluster_size<4>(hc_pre_kernel<4, true, 1>);
  const int64_t per = hc_slice_width(D, Sv, 4);
  return (norm_after_mix ? hc_staged_smem<4, true>(Sv, per) : hc_staged_smem<4>(Sv, per)) > 0;
}

int64_t fwd_hc_pre_blocks(const HcArgs& a) {
  if (a.n <= 0) return 0;
  int64_t blocks = 0;
  with_hc_mult(a.H, [&](auto h) {
    constexpr int H = decltype(h)::value;
    const HcShape sh = hc_vec(a) ? hc_pre_shape<H, true>(a) : hc_pre_shape<H, false>(a);
    blocks = int64_t(sh.clusters) * sh.Sv;
  });
  return blocks;
}

size_t fwd_hc_scratch_doubles(int n, int H) { return size_t(n) * size_t((2 + H) * H); }

void fwd_hc_pre(const HcArgs& a, double* scratch, Stream s) {
  const int nmix = a.head ? a.H : (2 + a.H) * a.H;
  if (a.H < 1 || a.H > kMaxHc || nmix > kMaxMix) throw_arg("hc_pre: hc_mult " + std::to_string(a.H) + " is not in 1..8");
  if (a.n <= 0) return;
  if (a.n > 65535) throw_arg("hc_pre: more than 65535 tokens in one launch");
  const bool vec = hc_vec(a);
  if (a.norm_w && a.act_bf16) throw_arg("hc_pre: the fused norm is the fp32 twin's (not the official numerics')");
  if (a.gates_apart && (a.head || !scratch)) throw_arg("hc_pre: gates_apart needs the mixes' scratch, and not hc_head");
  if (a.y && a.y_slots) throw_arg("hc_pre: y and y_slots are exclusive");
  if (a.y_slots && a.y_k < 1) throw_arg("hc_pre: y_slots needs y_k >= 1");
  if ((a.y || a.y_slots) && (a.X_out != a.X || !a.X_prev || !a.post_prev || !a.comb_prev || a.H > kPostMaxH))
    throw_arg("hc_pre: the fused hc_post needs X_out == X, X_prev and the previous gates");
  if (a.part && (a.y || a.y_slots || a.head || a.n != 1 || a.H != kHcFoldH || !a.norm_after_mix || a.mix_mode != 0 || a.act_bf16 ||
                 a.D % 16))
    throw_arg("hc_pre: the GEMV's partials (cuda.hc_fold) are one token's, hc_mult 4, cuda.hc_norm_after_mix's numerics, a tile per 16 "
              "columns, without a fused hc_post");
  with_hc_mult(a.H, [&](auto h) {
    constexpr int H = decltype(h)::value;
    if (vec) launch_hc_pre<H, true>(a, scratch, s);
    else launch_hc_pre<H, false>(a, scratch, s);
  });
}

void fwd_hc_gates(const HcArgs& a, const double* scratch, Stream s) {
  if (a.head || !a.gates_apart) throw_arg("hc_gates: only for an hc_pre launch with gates_apart");
  if (a.n <= 0) return;
  if (a.H < 1 || a.H > kMaxHc) throw_arg("hc_gates: hc_mult " + std::to_string(a.H) + " is not in 1..8");
  with_hc_mult(a.H, [&](auto h) {
    constexpr int H = decltype(h)::value;
    hc_gates_kernel<H><<<unsigned(a.n), 32, 0, stream_of(s)>>>(a, scratch);
  });
  check_launch("fwd_hc_gates");
}

void fwd_hc_post(const float* y, const float* X, const float* post, const float* comb, int n, int H, int64_t D, int untransposed,
                 float* out, Stream s, int act_bf16) {
  if (int64_t(n) * H * D <= 0) return;
  if (H > kPostMaxH) throw_arg("hc_post: hc_mult > 8");
  const bool vec = D % 4 == 0 && aligned16(y) && aligned16(X) && aligned16(out);
  const int64_t threads = int64_t(n) * (vec ? D / 4 : D);
  const int blocks = fwd_blocks(threads, kPostThreads);
  if (vec) hc_post_kernel<true><<<blocks, kPostThreads, 0, stream_of(s)>>>(y, X, post, comb, n, H, D, untransposed, act_bf16, out);
  else hc_post_kernel<false><<<blocks, kPostThreads, 0, stream_of(s)>>>(y, X, post, comb, n, H, D, untransposed, act_bf16, out);
  check_launch("fwd_hc_post");
}

}  // namespace plumb::cuda::detail
