// One token's routing by one warp or by one block: the router's fast kernels (fwd_moe.cu's route_warp_kernel and
// route_wide_kernel) and the routed experts' one-token launches that rank the gate's logits themselves
// (cuda.topk_in_experts, gemv.cu) share the score, the top-k and the weights below, so every path computes the same
// indices and weights bit for bit.
#pragma once

#include <cstdint>

#include "cuda/fwd_common.cuh"
#include "cuda/radix_select.cuh"

namespace plumb::cuda::detail {

constexpr int kRouteWarps = 4;  // tokens per block of the warp kernel
constexpr int kRouteMaxK = 32;  // one lane per choice
constexpr int kRouteMaxGroups = 64;
// Shared floats per warp: score[E], sel[E], group scores and flags (only softmax, hash and grouped routing use them).
__host__ __device__ constexpr int route_warp_smem_floats(int E) { return 2 * E + 2 * kRouteMaxGroups; }

// Whether the routing selects groups first (DeepSeek-V3's grouped top-k): more than one group, fewer kept.
__host__ __device__ inline bool route_grouped(const RouteArgs& a) { return a.n_group > 1 && a.topk_group < a.n_group; }

__device__ __forceinline__ float softplus_stable(float x) { return x > 20.0f ? x : fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x))); }

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

struct RouteChoice {
  int idx = 0;         // lanes k < K: choice k's expert
  float weight = 0.f;  // and its weight (the floor, the factor)
};

// One expert's score from its logit (every score function but softmax, which is not elementwise).
__device__ __forceinline__ float route_score(int score_fn, bool naive, float x) {
  return score_fn == 1 ? 1.0f / (1.0f + expf(-x)) : sqrtf(naive ? logf(1.0f + expf(x)) : softplus_stable(x));
}

// Top-k in rank order over the warp's keys (lane l holds experts l, l + 32, ...: key[i] of expert 32 i + l, 0 for
// none; every expert's key > 0 and K <= E, so each round finds one): K rounds of each lane's best remaining key (the
// lowest of its experts on equal keys: i upwards, strict >), the warp's largest key, and among the lanes holding it
// the lowest expert id, which is the rank order of beats(). Lane k < K gets choice k's expert and score.
template <int P>
__device__ __forceinline__ void route_topk(int K, unsigned (&key)[P], const float (&score)[P], int lane, int& my_idx, float& my_score) {
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

// The weights of the warp's choices (lane k < K: expert my_idx, score my_score): the float sum of the chosen scores
// in choice order, the floor, the factor; stored (idx and weight) when `write`.
__device__ __forceinline__ RouteChoice route_weights(const RouteArgs& a, int t, int lane, int my_idx, float my_score, bool renorm,
                                                     bool unfloored, bool write) {
  const int K = a.K;
  float sum = 0;
  for (int k = 0; k < K; ++k) sum += __shfl_sync(0xFFFFFFFFu, my_score, k);
  const float denom = !renorm ? 1.0f : unfloored ? sum : sum + 1e-20f;
  RouteChoice c;
  c.idx = my_idx;
  c.weight = (my_score / denom) * a.fold;
  if (write && lane < K) {
    a.idx[int64_t(t) * K + lane] = c.idx;
    a.weight[int64_t(t) * K + lane] = c.weight;
  }
  return c;
}

// Token t's routing by the calling warp (every lane; the fast path: E <= 32 * P, K <= 32). Lane l holds experts l,
// l + 32, ... in registers. Every value is the block kernel's (route_kernel), bit for bit: the same score
// expressions; softmax's max by a fmaxf tree (the same value: max ignores order, and a +0 / -0 max gives the same
// exponentials) and its fp64 sum in expert order by lane 0 (shared memory); the grouped mask per group by the same
// serial scan, one lane per group; top-k as K rounds of (warp max key, then the lowest expert id holding it), which
// is the rank order of beats(); the weights' float sum in choice order. `smw`: route_warp_smem_floats(E) floats of
// this warp. `wait()` runs after the bias (a weight) is requested and before the logits and token ids are read (the
// caller's PDL wait). `write`: store idx, weight and (learned layers) the selection scores.
// kV4: V4's learned routing only (sqrtsoftplus, no groups, the floored renormalization, no fault), as compile-time
// constants, so the other paths fold away (the launches choose it when the arguments say so: route_warp_variant).
template <int P, bool kV4, class Wait>
__device__ __forceinline__ RouteChoice route_token_warp(const RouteArgs& a, int t, int lane, float* smw, bool write, Wait&& wait) {
  const int E = a.E, K = a.K;
  const int score_fn = kV4 ? 0 : a.score;
  const bool hash = !kV4 && a.hash, naive = !kV4 && a.softplus_naive, grouped = !kV4 && route_grouped(a);
  const bool renorm = kV4 || a.renorm, unfloored = !kV4 && a.unfloored;
  float* score_s = smw;
  float* sel_s = score_s + E;
  float* gs_s = sel_s + E;
  int* kept_s = reinterpret_cast<int*>(gs_s + kRouteMaxGroups);
  // Every global load of the token first, all independent (the hash row's index waits only for the token id): the
  // bias (a weight) before the wait, the logits and the token id after it, as plain loads (an __ldg of an address
  // known before the wait may be hoisted above it: launch.cuh).
  float x[P], b[P];
#pragma unroll
  for (int i = 0; i < P; ++i) {
    const int e = i * 32 + lane;
    b[i] = (!hash && e < E) ? __ldg(a.bias + e) : 0.0f;
  }
  wait();
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
    for (int i = 0; i < P; ++i) score[i] = route_score(score_fn, naive, x[i]);
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
    // Selection scores as unsigned keys in the top-k order (NaN largest, -0 == +0; every non-NaN value above 0, so
    // 0 means "no candidate"): radix::order_key_nan_first, the indexer's order.
    unsigned key[P];
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int e = i * 32 + lane;
      key[i] = 0u;
      if (e >= E) continue;
      if (write) a.select[int64_t(t) * E + e] = sel[i];
      key[i] = radix::order_key_nan_first(sel[i]);
    }
    route_topk<P>(K, key, score, lane, my_idx, my_score);
  }
  return route_weights(a, t, lane, my_idx, my_score, renorm, unfloored, write);
}

// Token t's routing by a block of 32 * P threads, for an elementwise score without groups (fwd_route's
// route_wide_form): thread e scores expert e with the warp code's expression (route_score: the same bits), then warp
// 0 reads the keys and scores back as route_token_warp holds them (lane l: experts l, l + 32, ...) and ranks and
// weighs them with the same code. Why: one warp scoring its P experts in turn took ~4.4 of the router's ~9.6 us per
// layer at one token beside the shared expert's stream, ~2.3 without it (session 53's stamps: the scores' exp,
// log1p and sqrt chains waiting for issue slots on busy SMs); a thread per expert waits for one chain. Every thread
// calls it (a block barrier); the choices are stored (idx, weight and, for learned layers, the selection scores)
// and warp 0 returns them. `score_s`, `key_s`: 32 * P words each.
template <int P, bool kV4>
__device__ __forceinline__ RouteChoice route_token_wide(const RouteArgs& a, int t, float* score_s, unsigned* key_s) {
  const int E = a.E, K = a.K, e = int(threadIdx.x), lane = e & 31;
  const int score_fn = kV4 ? 0 : a.score;
  const bool hash = !kV4 && a.hash, naive = !kV4 && a.softplus_naive;
  const bool renorm = kV4 || a.renorm, unfloored = !kV4 && a.unfloored;
  // The bias (a weight) requested before the PDL wait; the logits and the token id after it, as plain loads.
  const float b = (!hash && e < E) ? __ldg(a.bias + e) : 0.0f;
  pdl_begin();
  int hidx = 0;
  if (hash && e < K) hidx = __ldg(a.tid2eid + int64_t(a.tokens[t]) * K + e);
  const float x = e < E ? a.logits[int64_t(t) * E + e] : -INFINITY;
  const float sc = route_score(score_fn, naive, x);
  unsigned key = 0u;  // radix::order_key_nan_first of the selection score, 0 for no expert (route_token_warp's keys)
  if (!hash && e < E) {
    const float sel = sc + b;
    a.select[int64_t(t) * E + e] = sel;
    key = radix::order_key_nan_first(sel);
  }
  score_s[e] = sc, key_s[e] = key;
  __syncthreads();
  if (e >= 32) return RouteChoice{};
  int my_idx = 0;
  float my_score = 0.0f;
  if (hash) {
    my_idx = hidx;
    if (lane < K) my_score = score_s[hidx];
  } else {
    float score[P];
    unsigned keys[P];
#pragma unroll
    for (int i = 0; i < P; ++i) score[i] = score_s[i * 32 + lane], keys[i] = key_s[i * 32 + lane];
    route_topk<P>(K, keys, score, lane, my_idx, my_score);
  }
  return route_weights(a, t, lane, my_idx, my_score, renorm, unfloored, true);
}

// route_token_warp at the host's route_warp_variant (1-5: experts per lane 1, 2, 4, 8, and 8 with V4's routing;
// the routed experts' launches take E <= 256, so not 6).
template <class Wait>
__device__ __forceinline__ RouteChoice route_token_warp_v(int variant, const RouteArgs& a, int t, int lane, float* smw, bool write,
                                                          Wait&& wait) {
  switch (variant) {
    case 1: return route_token_warp<1, false>(a, t, lane, smw, write, wait);
    case 2: return route_token_warp<2, false>(a, t, lane, smw, write, wait);
    case 3: return route_token_warp<4, false>(a, t, lane, smw, write, wait);
    case 4: return route_token_warp<8, false>(a, t, lane, smw, write, wait);
    default: return route_token_warp<8, true>(a, t, lane, smw, write, wait);
  }
}

}  // namespace plumb::cuda::detail
