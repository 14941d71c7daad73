// MoE on the GPU (reference twin): routing from fp32 logits (stable scores, bias for selection, grouped top-k,
// floored renormalization, the factor folded per the caller's placement), SwiGLU with clamps, the weighted
// combine. Twin of src/model/router.cpp and experts.cpp; the expert GEMVs are fwd_linear_indexed.
#include <algorithm>
#include <cstdint>

#include "cuda/fwd_common.cuh"
#include "cuda/radix_select.cuh"
#include "model/hc_math.h"

namespace plumb::cuda::detail {

namespace {

__device__ float softplus_stable(float x) { return x > 20.0f ? x : fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x))); }

// Selection scores as unsigned keys in the top-k order (NaN largest, -0 == +0; every non-NaN value above 0, so 0
// means "no candidate"): radix::order_key_nan_first, the indexer's order.

constexpr int kRouteWarps = 4;     // tokens per block of the warp kernel
constexpr int kRouteMaxK = 32;     // one lane per choice
constexpr int kRouteMaxGroups = 64;

// DeepSeek-V3 grouped selection: a group's score is the sum of its two best selection scores (one expert per
// group: the best alone). Shared by the warp kernel and its block twin, so both rank groups alike.
__device__ __forceinline__ float group_score(const float* sel, int g, int per) {
  float b0 = -INFINITY, b1 = -INFINITY;
  for (int e = g * per; e < (g + 1) * per; ++e) {
    const float v = sel[e];
    if (v > b0) b1 = b0, b0 = v;
    else if (v > b1) b1 = v;
  }
  return b0 + (per > 1 ? b1 : 0.0f);
}

// One warp per token (the fast path: E <= 32 * P, K <= 32): lane l holds experts l, l + 32, ... in registers.
// Every value is the block kernel's below, bit for bit: the same score expressions; softmax's max by a fmaxf tree
// (the same value: max ignores order, and a +0 / -0 max gives the same exponentials) and its fp64 sum in expert
// order by lane 0 (shared memory); the grouped mask per group by the same serial scan, one lane per group;
// top-k as K rounds of (warp max key, then the lowest expert id holding it), which is the rank order of beats();
// the weights' float sum in choice order. Shared: per warp score[E], sel[E], group scores and flags.
// kV4: V4's learned routing only (sqrtsoftplus, no groups, the floored renormalization, no fault), as compile-time
// constants, so the other paths fold away: the kernel runs once per layer and step from cold instruction caches
// (the launch chooses it when the arguments say so; the same code on that path, the same bits).
template <int P, bool kV4>
__global__ void __launch_bounds__(32 * kRouteWarps) route_warp_kernel(RouteArgs a) {
  extern __shared__ float smw[];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int t = int(blockIdx.x) * kRouteWarps + warp;
  if (t >= a.n) return;  // whole warps only: no block barrier below
  const int E = a.E, K = a.K;
  const int score_fn = kV4 ? 0 : a.score;
  const bool hash = !kV4 && a.hash, naive = !kV4 && a.softplus_naive, grouped = !kV4 && a.n_group > 1 && a.topk_group < a.n_group;
  const bool renorm = kV4 || a.renorm, unfloored = !kV4 && a.unfloored;
  float* score_s = smw + warp * (2 * E + 2 * kRouteMaxGroups);
  float* sel_s = score_s + E;
  float* gs_s = sel_s + E;
  int* kept_s = reinterpret_cast<int*>(gs_s + kRouteMaxGroups);
  // Every global load of the token first, all independent (the hash row's index waits only for the token id): the
  // bias (a weight) before the PDL wait (cuda.pdl), the logits and the token id after it, as plain loads (an __ldg of
  // an address known before the wait may be hoisted above it: launch.cuh).
  float x[P], b[P];
#pragma unroll
  for (int i = 0; i < P; ++i) {
    const int e = i * 32 + lane;
    b[i] = (!hash && e < E) ? __ldg(a.bias + e) : 0.0f;
  }
  pdl_begin();
  int tok = 0;
  if (hash) tok = a.tokens[t];
  const float* lg = a.logits + int64_t(t) * E;
#pragma unroll
  for (int i = 0; i < P; ++i) {
    const int e = i * 32 + lane;
    x[i] = e < E ? lg[e] : -INFINITY;
  }
  int hidx = 0;
  if (hash && lane < K) hidx = __ldg(a.tid2eid + int64_t(tok) * K + lane);

  float score[P];
  if (score_fn == 2) {  // hc_math::softmax
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < P; ++i) m = fmaxf(m, x[i]);
    m = warp_max(m);
    if (m == -INFINITY) {
#pragma unroll
      for (int i = 0; i < P; ++i) score[i] = 0.0f;
    } else {
#pragma unroll
      for (int i = 0; i < P; ++i) {
        const int e = i * 32 + lane;
        score[i] = expf(x[i] - m);
        if (e < E) score_s[e] = score[i];
      }
      __syncwarp();
      double s = 0;
      if (lane == 0)
        for (int e = 0; e < E; ++e) s += score_s[e];
      s = __shfl_sync(0xFFFFFFFFu, s, 0);
#pragma unroll
      for (int i = 0; i < P; ++i) score[i] = float(double(score[i]) / s);
    }
  } else {
#pragma unroll
    for (int i = 0; i < P; ++i)
      score[i] = score_fn == 1 ? 1.0f / (1.0f + expf(-x[i])) : sqrtf(naive ? logf(1.0f + expf(x[i])) : softplus_stable(x[i]));
  }

  float my_score = 0.0f;  // lane k < K: choice k's score
  int my_idx = 0;
  if (hash) {
    // softmax's sum (lane 0) read score_s: a shuffle orders the lanes but not their shared-memory accesses
    // (racecheck's write-after-read hazard), so the lanes meet here before they overwrite it.
    __syncwarp();
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int e = i * 32 + lane;
      if (e < E) score_s[e] = score[i];
    }
    __syncwarp();
    my_idx = hidx;
    if (lane < K) my_score = score_s[hidx];
  } else {
    float sel[P];
#pragma unroll
    for (int i = 0; i < P; ++i) sel[i] = score[i] + b[i];
    if (grouped) {  // mask_groups, as the block kernel does it
      const int G = a.n_group, per = E / G;
#pragma unroll
      for (int i = 0; i < P; ++i) {
        const int e = i * 32 + lane;
        if (e < E) sel_s[e] = sel[i];
      }
      __syncwarp();
      for (int g = lane; g < G; g += 32) gs_s[g] = group_score(sel_s, g, per);
      __syncwarp();
      for (int g = lane; g < G; g += 32) {
        int rank = 0;
        for (int o = 0; o < G; ++o) rank += beats(gs_s[o], o, gs_s[g], g);
        kept_s[g] = rank < a.topk_group;
      }
      __syncwarp();
#pragma unroll
      for (int i = 0; i < P; ++i) {
        const int e = i * 32 + lane;
        if (e < E && !kept_s[e / per]) sel[i] = -INFINITY;
      }
    }
    unsigned key[P];
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int e = i * 32 + lane;
      key[i] = 0u;
      if (e >= E) continue;
      a.select[int64_t(t) * E + e] = sel[i];
      key[i] = radix::order_key_nan_first(sel[i]);
    }
    // K rounds: each lane's best remaining key (the lowest of its experts on equal keys: i upwards, strict >), the
    // warp's largest key, and among the lanes holding it the lowest expert id. Every expert has a key > 0 and
    // K <= E, so each round finds one.
    for (int kk = 0; kk < K; ++kk) {
      unsigned bk = 0u;
      float bs = 0.0f;
      int bi = 0;
#pragma unroll
      for (int i = 0; i < P; ++i)
        if (key[i] > bk) bk = key[i], bs = score[i], bi = i;
      const unsigned mk = __reduce_max_sync(0xFFFFFFFFu, bk);
      const unsigned cand = bk == mk ? unsigned(bi * 32 + lane) : 0xFFFFFFFFu;
      const unsigned ce = __reduce_min_sync(0xFFFFFFFFu, cand);
      const float cs = __shfl_sync(0xFFFFFFFFu, bs, int(ce & 31u));
      if (lane == kk) my_idx = int(ce), my_score = cs;
      if (cand == ce) {  // this lane owns the chosen expert: take it out
#pragma unroll
        for (int i = 0; i < P; ++i)
          if (i == bi) key[i] = 0u;
      }
    }
  }
  // The weights: the float sum of the chosen scores in choice order, the floor, the factor.
  float sum = 0;
  for (int k = 0; k < K; ++k) sum += __shfl_sync(0xFFFFFFFFu, my_score, k);
  const float denom = !renorm ? 1.0f : unfloored ? sum : sum + 1e-20f;
  if (lane < K) {
    a.idx[int64_t(t) * K + lane] = my_idx;
    a.weight[int64_t(t) * K + lane] = (my_score / denom) * a.fold;
  }
}

// The twin (any E up to shared memory, any K): one block per token, ranks by counting.
// One block per token; shared: score[E], sel[E].
__global__ void route_kernel(RouteArgs a) {
  extern __shared__ float sm[];
  float* score = sm;
  float* sel = sm + a.E;
  const int t = blockIdx.x, E = a.E, K = a.K;
  const float* lg = a.logits + int64_t(t) * E;
  int32_t* idx = a.idx + int64_t(t) * K;
  if (a.score == 2) {  // softmax: ops::softmax over the row (serial: E is small and the order is the reference's)
    if (threadIdx.x == 0) {
      for (int e = 0; e < E; ++e) score[e] = lg[e];
      hc_math::softmax(score, E);
    }
  } else {
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      const float x = lg[e];
      score[e] = a.score == 1 ? 1.0f / (1.0f + expf(-x))
                              : sqrtf(a.softplus_naive ? logf(1.0f + expf(x)) : softplus_stable(x));
    }
  }
  __syncthreads();
  if (a.hash) {
    if (threadIdx.x == 0)
      for (int k = 0; k < K; ++k) idx[k] = a.tid2eid[int64_t(a.tokens[t]) * K + k];
  } else {
    for (int e = threadIdx.x; e < E; e += blockDim.x) sel[e] = score[e] + a.bias[e];
    __syncthreads();
    if (a.n_group > 1 && a.topk_group < a.n_group && threadIdx.x == 0) {
      // DeepSeek-V3 grouped selection (mask_groups): groups ranked by the sum of their two best scores.
      const int per = E / a.n_group;
      float gs[64];
      bool kept[64];
      for (int g = 0; g < a.n_group; ++g) gs[g] = group_score(sel, g, per);
      for (int g = 0; g < a.n_group; ++g) {
        int rank = 0;
        for (int o = 0; o < a.n_group; ++o) rank += beats(gs[o], o, gs[g], g);
        kept[g] = rank < a.topk_group;
      }
      for (int g = 0; g < a.n_group; ++g)
        if (!kept[g])
          for (int e = g * per; e < (g + 1) * per; ++e) sel[e] = -INFINITY;
    }
    __syncthreads();
    // The rank of each expert = how many beat it (equal scores: the lower id wins); the top K write their slot.
    // A full, branch-free count over the row (unrolled, every thread reading the same shared value at once): an
    // early exit at rank K made the loop serial.
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      const float v = sel[e];
      a.select[int64_t(t) * E + e] = v;
      int rank = 0;
#pragma unroll 8
      for (int o = 0; o < E; ++o) rank += beats(sel[o], o, v, e);
      if (rank < K) idx[rank] = e;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0;
    for (int k = 0; k < K; ++k) sum += score[idx[k]];
    const float denom = !a.renorm ? 1.0f : a.unfloored ? sum : sum + 1e-20f;
    for (int k = 0; k < K; ++k) a.weight[int64_t(t) * K + k] = (score[idx[k]] / denom) * a.fold;
  }
}

__global__ void swiglu_kernel(const float* g, const float* u, int64_t ld, int nslots, int64_t I, float L, const float* pre, float* h,
                              int round_bf16) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(nslots) * I) return;
  const int64_t sl = i / I, c = i % I;
  float gv = g[sl * ld + c], uv = u[sl * ld + c];
  if (L > 0) {
    gv = fminf(gv, L);
    uv = fminf(fmaxf(uv, -L), L);
  }
  const float silu = gv / (1.0f + expf(-gv));
  const float v = __fmul_rn(__fmul_rn(silu, uv), pre ? pre[sl] : 1.0f);
  h[sl * I + c] = round_bf16 ? bf16r(v) : v;
}

// Block (x: a chunk of d, y: token t). ids (the official numerics, as its combine): the token's slots summed in
// (expert id, slot) order, found once per block by threads k < K (the rank of slot k among the K keys; keys are
// distinct) instead of per element; otherwise in slot order.
constexpr int kCombineMaxK = 64;
__global__ void combine_kernel(const float* ys, const float* w, int K, int64_t D, float scale, float* y, const int32_t* ids) {
  __shared__ int order_s[kCombineMaxK];
  const int64_t t = blockIdx.y, d = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int k = int(threadIdx.x);
  if (ids && k < K) {
    const int64_t key = int64_t(ids[t * K + k]) * K + k;
    int rank = 0;
    for (int j = 0; j < K; ++j) rank += int64_t(ids[t * K + j]) * K + j < key;
    order_s[rank] = k;
  }
  if (ids) __syncthreads();
  if (d >= D) return;
  float acc = 0;
  for (int r = 0; r < K; ++r) {
    const int kk = ids ? order_s[r] : r;
    acc = __fadd_rn(acc, __fmul_rn(w ? w[t * K + kk] : 1.0f, ys[(t * K + kk) * D + d]));
  }
  y[t * D + d] = __fmul_rn(acc, scale);
}

}  // namespace

void fwd_route(const RouteArgs& a, Stream s) {
  if (a.n <= 0) return;
  if (a.n_group > kRouteMaxGroups) throw_arg("router: more than 64 expert groups is not supported on the GPU");
  if (!a.twin && a.E <= 32 * 16 && a.K <= kRouteMaxK && a.K <= a.E) {
    const int P = (a.E + 31) / 32, warps = std::min(a.n, kRouteWarps);
    const size_t smem = size_t(warps) * size_t(2 * a.E + 2 * kRouteMaxGroups) * 4;
    const unsigned blocks = unsigned((a.n + kRouteWarps - 1) / kRouteWarps);
    auto go = [&](auto kern) { launch("fwd_route", kern, dim3(blocks), dim3(unsigned(32 * warps)), smem, s, a); };  // (cuda.pdl)
    // V4's learned routing (route_warp_kernel's kV4) at V4's 256 experts; every other case the general kernel.
    const bool v4 = a.score == 0 && !a.hash && !(a.n_group > 1 && a.topk_group < a.n_group) && a.renorm && !a.unfloored &&
                    !a.softplus_naive;
    if (P <= 1) go(route_warp_kernel<1, false>);
    else if (P <= 2) go(route_warp_kernel<2, false>);
    else if (P <= 4) go(route_warp_kernel<4, false>);
    else if (P <= 8) v4 ? go(route_warp_kernel<8, true>) : go(route_warp_kernel<8, false>);
    else go(route_warp_kernel<16, false>);
    return;
  }
  const size_t smem = size_t(2 * a.E) * 4;
  if (smem > 48 * 1024) throw_arg("router: too many experts for one block's shared memory");
  route_kernel<<<a.n, 256, smem, stream_of(s)>>>(a);
  check_launch("fwd_route");
}

void fwd_swiglu(const float* g, const float* u, int64_t ld, int nslots, int64_t I, float limit, const float* pre, float* h, Stream s,
                int round_bf16) {
  const int64_t total = int64_t(nslots) * I;
  if (total <= 0) return;
  swiglu_kernel<<<fwd_blocks(total, 256), 256, 0, stream_of(s)>>>(g, u, ld, nslots, I, limit, pre, h, round_bf16);
  check_launch("fwd_swiglu");
}

void fwd_moe_combine(const float* ys, const float* weight, int n, int K, int64_t D, float out_scale, float* y, Stream s,
                     const int32_t* ids) {
  if (n <= 0 || D <= 0) return;
  if (ids && K > kCombineMaxK) throw_arg("MoE combine: at most 64 experts per token in expert-id order");
  for (int t0 = 0; t0 < n; t0 += 65535) {  // (a grid's y extent)
    const int64_t o = int64_t(t0) * K;
    combine_kernel<<<dim3(unsigned((D + 255) / 256), unsigned(std::min(n - t0, 65535))), 256, 0, stream_of(s)>>>(
        ys + o * D, weight ? weight + o : nullptr, K, D, out_scale, y + int64_t(t0) * D, ids ? ids + o : nullptr);
  }
  check_launch("fwd_moe_combine");
}

}  // namespace plumb::cuda::detail
