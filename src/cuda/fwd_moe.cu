// MoE on the GPU (reference twin): routing from fp32 logits (stable scores, bias for selection, grouped top-k,
// floored renormalization, the factor folded per the caller's placement), SwiGLU with clamps, the weighted
// combine. Twin of src/model/router.cpp and experts.cpp; the expert GEMVs are fwd_linear_indexed.
#include <algorithm>
#include <cstdint>

#include "cuda/fwd_common.cuh"
#include "cuda/route_warp.cuh"
#include "model/hc_math.h"

namespace plumb::cuda::detail {

namespace {

// The warp kernel: one warp per token (route_token_warp, route_warp.cuh), the bias requested before the PDL wait
// (cuda.pdl), the logits and token ids read after it. Shared: route_warp_smem_floats(E) per warp. (Variants 4 and 5
// with an elementwise score and no groups run route_wide_kernel instead.)
template <int P, bool kV4>
__global__ void __launch_bounds__(32 * kRouteWarps) route_warp_kernel(RouteArgs a) {
  extern __shared__ float smw[];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int t = int(blockIdx.x) * kRouteWarps + warp;
  if (t >= a.n) return;  // whole warps only: no block barrier below
  (void)route_token_warp<P, kV4>(a, t, lane, smw + warp * route_warp_smem_floats(a.E), true, [] { pdl_begin(); });
}

// The wide kernel, for the warp variants of 8 experts per lane with an elementwise score and no groups (V4's 256
// experts, learned or hash-routed): a block of 32 P threads per token, a thread per expert (route_token_wide, the
// same bits as the warp kernel).
template <int P, bool kV4>
__global__ void __launch_bounds__(32 * P) route_wide_kernel(RouteArgs a) {
  __shared__ float score_s[32 * P];
  __shared__ unsigned key_s[32 * P];
  (void)route_token_wide<P, kV4>(a, int(blockIdx.x), score_s, key_s);
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
    if (route_grouped(a) && threadIdx.x == 0) {
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
                              int round_bf16, int act, const float* bg, const float* bu) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(nslots) * I) return;
  const int64_t sl = i / I, c = i % I;
  float gv = g[sl * ld + c], uv = u[sl * ld + c];
  if (bg) gv = __fadd_rn(gv, bg[c]), uv = __fadd_rn(uv, bu[c]);  // mlp_bias: F.linear's + b, before the clamps
  // (swiglu_clamped's product is one rounded multiply, as __fmul_rn(silu, up) was here: the same bits)
  const float v = __fmul_rn(swiglu_clamped(gv, uv, L, act), pre ? pre[sl] : 1.0f);
  h[sl * I + c] = round_bf16 ? bf16r(v) : v;
}

__global__ void add_row_kernel(float* y, int64_t n, int64_t D, const float* b) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n * D) y[i] = __fadd_rn(y[i], b[i % D]);
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

int route_warp_variant(const RouteArgs& a) {
  if (a.twin || a.E > 32 * 16 || a.K > kRouteMaxK || a.K > a.E || (route_grouped(a) && a.n_group > kRouteMaxGroups)) return 0;
  const int P = (a.E + 31) / 32;
  // V4's learned routing (route_token_warp's kV4) at V4's 256 experts; every other case the general code.
  const bool v4 = a.score == 0 && !a.hash && !route_grouped(a) && a.renorm && !a.unfloored && !a.softplus_naive;
  return P <= 1 ? 1 : P <= 2 ? 2 : P <= 4 ? 3 : P <= 8 ? (v4 ? 5 : 4) : 6;
}

// The wide kernel's form for warp variant v of these arguments (route_wide_form, fwd_route).
static bool wide_form(const RouteArgs& a, int v) { return (v == 4 || v == 5) && a.score != 2 && !route_grouped(a); }
bool route_wide_form(const RouteArgs& a) { return wide_form(a, route_warp_variant(a)); }

void fwd_route(const RouteArgs& a, Stream s) {
  if (a.n <= 0) return;
  // (Groups matter only where they limit the selection: n_group > 64 with topk_group == n_group routes ungrouped.)
  if (route_grouped(a) && a.n_group > kRouteMaxGroups)
    throw_arg("router: a grouped selection over more than 64 expert groups is not supported on the GPU");
  if (const int variant = route_warp_variant(a)) {
    if (wide_form(a, variant)) {
      auto go = [&](auto kern) { launch("fwd_route", kern, dim3(unsigned(a.n)), dim3(32u * 8u), 0, s, a); };  // (cuda.pdl)
      variant == 5 ? go(route_wide_kernel<8, true>) : go(route_wide_kernel<8, false>);
      return;
    }
    const int warps = std::min(a.n, kRouteWarps);
    const size_t smem = size_t(warps) * size_t(route_warp_smem_floats(a.E)) * 4;
    const unsigned blocks = unsigned((a.n + kRouteWarps - 1) / kRouteWarps);
    auto go = [&](auto kern) { launch("fwd_route", kern, dim3(blocks), dim3(unsigned(32 * warps)), smem, s, a); };  // (cuda.pdl)
    switch (variant) {
      case 1: go(route_warp_kernel<1, false>); break;
      case 2: go(route_warp_kernel<2, false>); break;
      case 3: go(route_warp_kernel<4, false>); break;
      case 4: go(route_warp_kernel<8, false>); break;
      case 5: go(route_warp_kernel<8, true>); break;
      default: go(route_warp_kernel<16, false>); break;
    }
    return;
  }
  const size_t smem = size_t(2 * a.E) * 4;
  if (smem > 48 * 1024) throw_arg("router: too many experts for one block's shared memory");
  route_kernel<<<a.n, 256, smem, stream_of(s)>>>(a);
  check_launch("fwd_route");
}

void fwd_swiglu(const float* g, const float* u, int64_t ld, int nslots, int64_t I, float limit, const float* pre, float* h, Stream s,
                int round_bf16, int act, const float* bias_gate, const float* bias_up) {
  const int64_t total = int64_t(nslots) * I;
  if (total <= 0) return;
  if (act < 0 || act > 3) throw_arg("fwd_swiglu: activation " + std::to_string(act) + " is not 0..3 (ExpertAct)");
  if (!bias_gate != !bias_up) throw_arg("fwd_swiglu: the gate's and the up projection's biases come together");
  swiglu_kernel<<<fwd_blocks(total, 256), 256, 0, stream_of(s)>>>(g, u, ld, nslots, I, limit, pre, h, round_bf16, act, bias_gate,
                                                                  bias_up);
  check_launch("fwd_swiglu");
}

void fwd_add_row(float* y, int64_t n, int64_t D, const float* b, Stream s) {
  if (n * D <= 0) return;
  add_row_kernel<<<fwd_blocks(n * D, 256), 256, 0, stream_of(s)>>>(y, n, D, b);
  check_launch("fwd_add_row");
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
