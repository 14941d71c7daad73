// MoE on the GPU (reference twin): routing from fp32 logits (stable scores, bias for selection, grouped top-k,
// floored renormalization, the factor folded per the caller's placement), SwiGLU with clamps, the weighted
// combine. Twin of src/model/router.cpp and experts.cpp; the expert GEMVs are fwd_linear_indexed.
#include "cuda/fwd_common.cuh"
#include "model/hc_math.h"

namespace plumb::cuda::detail {

namespace {

__device__ float softplus_stable(float x) { return x > 20.0f ? x : fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x))); }

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
      for (int g = 0; g < a.n_group; ++g) {
        float b0 = -INFINITY, b1 = -INFINITY;
        for (int e = g * per; e < (g + 1) * per; ++e) {
          const float v = sel[e];
          if (v > b0) b1 = b0, b0 = v;
          else if (v > b1) b1 = v;
        }
        gs[g] = b0 + (per > 1 ? b1 : 0.0f);
      }
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

__global__ void swiglu_kernel(const float* g, const float* u, int64_t ld, int nslots, int64_t I, float L, const float* pre, float* h) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(nslots) * I) return;
  const int64_t sl = i / I, c = i % I;
  float gv = g[sl * ld + c], uv = u[sl * ld + c];
  if (L > 0) {
    gv = fminf(gv, L);
    uv = fminf(fmaxf(uv, -L), L);
  }
  const float silu = gv / (1.0f + expf(-gv));
  h[sl * I + c] = __fmul_rn(__fmul_rn(silu, uv), pre ? pre[sl] : 1.0f);
}

__global__ void combine_kernel(const float* ys, const float* w, int n, int K, int64_t D, float scale, float* y) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(n) * D) return;
  const int64_t t = i / D, d = i % D;
  float acc = 0;
  for (int k = 0; k < K; ++k) acc = __fadd_rn(acc, __fmul_rn(w ? w[t * K + k] : 1.0f, ys[(t * K + k) * D + d]));
  y[i] = __fmul_rn(acc, scale);
}

}  // namespace

void fwd_route(const RouteArgs& a, Stream s) {
  if (a.n <= 0) return;
  if (a.n_group > 64) throw_arg("router: more than 64 expert groups is not supported on the GPU");
  const size_t smem = size_t(2 * a.E) * 4;
  if (smem > 48 * 1024) throw_arg("router: too many experts for one block's shared memory");
  route_kernel<<<a.n, 256, smem, s>>>(a);
  check_launch("fwd_route");
}

void fwd_swiglu(const float* g, const float* u, int64_t ld, int nslots, int64_t I, float limit, const float* pre, float* h, Stream s) {
  const int64_t total = int64_t(nslots) * I;
  if (total <= 0) return;
  swiglu_kernel<<<fwd_blocks(total, 256), 256, 0, s>>>(g, u, ld, nslots, I, limit, pre, h);
  check_launch("fwd_swiglu");
}

void fwd_moe_combine(const float* ys, const float* weight, int n, int K, int64_t D, float out_scale, float* y, Stream s) {
  const int64_t total = int64_t(n) * D;
  if (total <= 0) return;
  combine_kernel<<<fwd_blocks(total, 256), 256, 0, s>>>(ys, weight, n, K, D, out_scale, y);
  check_launch("fwd_moe_combine");
}

}  // namespace plumb::cuda::detail
