// Manifold-constrained hyper-connections on the GPU: hc_pre (norm, the (2+H)*H mixes over H*D, then the sigmoid
// gates and Sinkhorn of model/hc_math.h, the same code the CPU reference runs, and the collapse) in one cluster
// launch, hc_post elementwise. Twin of src/model/hyper_connection.cpp: fp64 dot products.
#include <cooperative_groups.h>

#include <type_traits>

#include "cuda/official.cuh"
#include "model/hc_math.h"

namespace plumb::cuda::detail {

namespace {

constexpr int kMaxMix = 64;  // (2 + H) * H for H <= 6

// hc_pre in one launch: a cluster of S blocks (16 where the GPU schedules it, else 8) per token, block s owning
// the slice d in [s * per, (s + 1) * per) of all H streams. Between the cluster barriers (distributed shared
// memory, no global scratch, no counters):
//   1. each block's fp64 sum of squares of its slice (its first fn rows already loading); every warp of every
//      block then sums the S partials in rank order, so r = rsqrt(mean + eps) has the same bits everywhere;
//   2. each block's fp64 partial dots of the (2+H)*H mixes over its slice (per thread, a warp reduce-scatter,
//      the warps in order);
//   3. each block sums the S partials of every mix in rank order (fp32 mix; official: times float(r)), then
//      collapses its slice with the pre gates (every collapsing thread runs hc_math::gates itself); block 0's
//      first warp runs the Sinkhorn meanwhile (one thread for H*H > 32), its warp 1 the post gates.
// The fp64 sums are the twin's (exact products, fp64 accumulation); their order is this split's: per thread in
// element order, a fixed shuffle tree, warps in order, blocks in rank order (deterministic; the same in eager
// launches and graphs).
constexpr int kHcThreads = 256;
constexpr int kHcMaxCluster = 16;

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

template <bool VEC>
__device__ __forceinline__ void hc_load(const float* p, float (&v)[VEC ? 4 : 1]) {
  if constexpr (VEC) {
    const float4 q = *reinterpret_cast<const float4*>(p);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
  } else {
    v[0] = *p;
  }
}

// hc_post of the W columns at d of token t, for every stream k: out[t, k, d..] = post_k * y + sum_j comb[j][k] * x_j
// in the reference's order (post * y first, then the streams: it reproduced the official golden bit for bit); the
// H inputs are loaded once for the H outputs. The one implementation of hc_post: its kernel and hc_pre's fused
// prologue (HcArgs::y).
constexpr int kPostMaxH = 8;
template <bool VEC>
__device__ __forceinline__ void hc_post_cols(const float* y, const float* X, const float* post, const float* comb, int64_t t, int H,
                                             int64_t D, int64_t d, int untransposed, int act_bf16, float* out) {
  constexpr int W = VEC ? 4 : 1;
  float yv[W], xv[kPostMaxH][W];
  hc_load<VEC>(y + t * D + d, yv);
#pragma unroll
  for (int j = 0; j < kPostMaxH; ++j)
    if (j < H) hc_load<VEC>(X + (t * H + j) * D + d, xv[j]);
  const float* C = comb + t * H * H;
  for (int k = 0; k < H; ++k) {
    const float p = post[t * H + k];
    float acc[W];
#pragma unroll
    for (int w = 0; w < W; ++w) acc[w] = __fmul_rn(p, yv[w]);
#pragma unroll
    for (int j = 0; j < kPostMaxH; ++j) {
      if (j >= H) break;
      const float c = untransposed ? C[k * H + j] : C[j * H + k];
#pragma unroll
      for (int w = 0; w < W; ++w) acc[w] = __fadd_rn(acc[w], __fmul_rn(c, xv[j][w]));
    }
#pragma unroll
    for (int w = 0; w < W; ++w)
      if (act_bf16) acc[w] = bf16r(acc[w]);
    float* dst = out + (t * H + k) * D + d;
    if constexpr (VEC) *reinterpret_cast<float4*>(dst) = make_float4(acc[0], acc[1], acc[2], acc[3]);
    else dst[0] = acc[0];
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

template <int H, bool VEC>
__global__ void __launch_bounds__(kHcThreads, 2) hc_pre_kernel(const HcArgs a, double* mix_out) {
  constexpr int NM = (2 + H) * H;  // mixes (hc_head: the first H)
  constexpr int W = VEC ? 4 : 1;   // elements per item
  constexpr int kWarps = kHcThreads / 32;
  __shared__ double red_s[kWarps][NM];
  __shared__ double sh[32];
  __shared__ double ss_s, mixp_s[NM];
  __shared__ float mix_s[NM];

  namespace cg = cooperative_groups;
  const cg::cluster_group cl = cg::this_cluster();
  const int S = int(cl.num_blocks()), s = int(cl.block_rank());
  const int t = int(blockIdx.y), tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int nm = a.head ? H : NM, mode = a.mix_mode;
  const int64_t D = a.D, hd = int64_t(H) * D;
  const int64_t per = ((D + S - 1) / S + W - 1) / W * W;
  const int64_t d0 = min(D, int64_t(s) * per), d1 = min(D, d0 + per);
  const int nq = int((d1 - d0) / W), items = H * nq;
  const float* xt = a.X + int64_t(t) * hd;
  auto off = [&](int it) { return int64_t(it / nq) * D + d0 + int64_t(it % nq) * W; };  // item -> offset in [0, hd)
  // (2 blocks per SM: a cluster of 16 fits in 8 SMs.)

  // 0. Fused hc_post of the previous sublayer (a.y): this block's slice of the new streams, written to a.X_out
  // (= a.X), which this block alone reads below (its own writes: visible after the barrier).
  if (a.y) {
    for (int q = tid; q < nq; q += kHcThreads)
      hc_post_cols<VEC>(a.y, a.X_prev, a.post_prev, a.comb_prev, t, H, D, d0 + int64_t(q) * W, a.untransposed, a.act_bf16, a.X_out);
    __syncthreads();
  }

  // 1. This block's fn rows on their way to L2 (bulk prefetches of its H * nm contiguous rows of per floats),
  // then the sum of squares of its x.
  if constexpr (VEC) {
    const unsigned bytes = unsigned(nq) * 16u;
    if (bytes)
      for (int i = tid; i < H * nm; i += kHcThreads) {
        const float* p = a.fn + int64_t(i / H) * hd + int64_t(i % H) * D + d0;
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
      }
  }
  double ss = 0;
  for (int it = tid; it < items; it += kHcThreads) {
    float xv[W];
    hc_load<VEC>(xt + off(it), xv);
#pragma unroll
    for (int w = 0; w < W; ++w) ss += double(xv[w]) * xv[w];
  }
  ss = block_sum(ss, sh);
  if (tid == 0) ss_s = ss;
  cl.sync();
  double tot = 0;
  {
    const double part = lane < S ? *cl.map_shared_rank(&ss_s, lane) : 0.0;
    for (int q = 0; q < S; ++q) tot += __shfl_sync(0xFFFFFFFFu, part, q);
  }
  const double r = 1.0 / sqrt(tot / double(hd) + a.rms_eps);

  // 2. The partial dots: 0 the reference, float(x * r) . fn; 1 mhc.bf16_mix, bf16(x * r) . bf16(fn); 2 official, x . fn.
  double acc[NM];
#pragma unroll
  for (int o = 0; o < NM; ++o) acc[o] = 0.0;
  for (int it = tid; it < items; it += kHcThreads) {
    const int64_t oi = off(it);
    float xv[W];
    hc_load<VEC>(xt + oi, xv);
    double xr[W];
#pragma unroll
    for (int w = 0; w < W; ++w)
      xr[w] = mode == 2 ? double(xv[w]) : mode == 1 ? double(bf16r(float(double(xv[w]) * r))) : double(float(double(xv[w]) * r));
#pragma unroll
    for (int o = 0; o < NM; ++o) {
      if (o >= nm) break;
      float f[W];
      hc_load<VEC>(a.fn + o * hd + oi, f);
#pragma unroll
      for (int w = 0; w < W; ++w) acc[o] += xr[w] * (mode == 1 ? double(bf16r(f[w])) : double(f[w]));
    }
  }
  if constexpr (NM <= 32) {
    hc_warp_reduce<NM, 0, pow2_at_least(NM)>(acc, lane, red_s[warp]);
  } else {
    hc_warp_reduce<NM, 0, 32>(acc, lane, red_s[warp]);
    hc_warp_reduce<NM, 32, pow2_at_least(NM - 32)>(acc, lane, red_s[warp]);
  }
  __syncthreads();
  if (tid < nm) {
    double m = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m += red_s[w][tid];
    mixp_s[tid] = m;
  }
  cl.sync();

  // 3. The mixes from the S partials in rank order; this block's remote reads end at the arrive (it waits before
  // exiting: its shared memory must outlive the other blocks' reads).
  if (tid < nm) {
    double part[kHcMaxCluster];
#pragma unroll
    for (int q = 0; q < kHcMaxCluster; ++q) part[q] = q < S ? *cl.map_shared_rank(&mixp_s[tid], q) : 0.0;
    double m = 0;
#pragma unroll
    for (int q = 0; q < kHcMaxCluster; ++q)
      if (q < S) m += part[q];
    float mv = float(m);
    if (mode == 2) mv = __fmul_rn(mv, float(r));  // official: float(x . fn) * float(r)
    mix_s[tid] = mv;
    if (s == 0 && mix_out) mix_out[int64_t(t) * nm + tid] = double(mv);
  }
  cl.barrier_arrive();
  __syncthreads();

  const bool full = !a.head && s == 0, warp_sinkhorn = full && H * H <= 32 && !a.serial_sinkhorn;
  if (full && warp == 0) {
    if constexpr (H * H <= 32) {
      if (warp_sinkhorn) sinkhorn_warp<H>(mix_s, a.scale, a.base, a.hc_eps, a.iters, a.comb + int64_t(t) * H * H);
    }
    if (!warp_sinkhorn && lane == 0) {  // H = 6 (36 > 32 lanes), or the test's serial twin: one thread
      float pre[H], post[H], C[H * H];
      hc_math::weights_h<H>(mix_s, a.scale, a.base, a.hc_eps, a.iters, pre, post, C);
      for (int i = 0; i < H * H; ++i) a.comb[int64_t(t) * H * H + i] = C[i];
      for (int j = 0; j < H; ++j) a.post[int64_t(t) * H + j] = post[j];
    }
  }
  if (warp_sinkhorn && tid == 32) {  // the post gates beside the warp's Sinkhorn
    float pre[H], post[H];
    hc_math::gates(mix_s, a.scale, a.base, H, a.hc_eps, pre, post);
    for (int j = 0; j < H; ++j) a.post[int64_t(t) * H + j] = post[j];
  }
  // The collapse of this slice, sum_j pre_j * x_j (warp 0 of block 0 is busy with the Sinkhorn).
  const int first = full ? 32 : 0;
  if (tid - first >= 0 && tid - first < nq) {
    float pre[H];
    hc_math::gates(mix_s, a.scale, a.base, H, a.hc_eps, pre, nullptr);
    for (int q = tid - first; q < nq; q += kHcThreads - first) {
      const int64_t d = d0 + int64_t(q) * W;
      float acc2[W];
#pragma unroll
      for (int w = 0; w < W; ++w) acc2[w] = 0.0f;
#pragma unroll
      for (int j = 0; j < H; ++j) {
        float xv[W];
        hc_load<VEC>(xt + j * D + d, xv);
#pragma unroll
        for (int w = 0; w < W; ++w) acc2[w] = __fadd_rn(acc2[w], __fmul_rn(pre[j], xv[w]));
      }
#pragma unroll
      for (int w = 0; w < W; ++w)
        if (a.act_bf16) acc2[w] = bf16r(acc2[w]);
      float* dst = a.collapsed + int64_t(t) * D + d;
      if constexpr (VEC) *reinterpret_cast<float4*>(dst) = make_float4(acc2[0], acc2[1], acc2[2], acc2[3]);
      else dst[0] = acc2[0];
    }
  }
  if (!a.norm_w) {
    cl.barrier_wait();
    return;
  }

  // 4. Fused RMSNorm of the collapsed row (a.norm_w: attn_norm / ffn_norm, or the final norm after hc_head), in
  // place, with the f16 copy: rms_norm_row's arithmetic (fp64 sum of squares of the fp32 values, rms_inv,
  // rms_scaled) with the sum in this split's order (this block's slice, the blocks in rank order): the products
  // are exact, so only the fp64 rounding of the sum can differ from the norm kernel's, and it moves the fp32 inv by
  // one ulp with probability ~1e-8 per row.
  __shared__ double ss2_s;
  __syncthreads();  // this block's collapsed slice, written above by other threads
  double ss2 = 0;
  const float* crow = a.collapsed + int64_t(t) * D;
  for (int q = tid; q < nq; q += kHcThreads) {
    float xv[W];
    hc_load<VEC>(crow + d0 + int64_t(q) * W, xv);
#pragma unroll
    for (int w = 0; w < W; ++w) ss2 += double(xv[w]) * xv[w];
  }
  ss2 = block_sum(ss2, sh);
  if (tid == 0) ss2_s = ss2;
  cl.barrier_wait();  // (the arrive after phase 3)
  cl.sync();          // every block's partial in place
  double tot2 = 0;
  {
    const double part = lane < S ? *cl.map_shared_rank(&ss2_s, lane) : 0.0;
    for (int q = 0; q < S; ++q) tot2 += __shfl_sync(0xFFFFFFFFu, part, q);
  }
  cl.barrier_arrive();  // this block's remote reads are done (its own shared memory must outlive the others' reads)
  const float inv = rms_inv(tot2, D, a.norm_eps);
  for (int q = tid; q < nq; q += kHcThreads) {
    const int64_t d = d0 + int64_t(q) * W;
    float xv[W], gv[W];
    hc_load<VEC>(crow + d, xv);
    hc_load<VEC>(a.norm_w + d, gv);
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const float r = rms_scaled(xv[w], inv, gv[w]);
      a.collapsed[int64_t(t) * D + d + w] = r;
      if (a.collapsed16) reinterpret_cast<__half*>(a.collapsed16)[int64_t(t) * D + d + w] = __float2half_rn(r);
    }
  }
  cl.barrier_wait();
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
  hc_post_cols<VEC>(y, X, post, comb, t, H, D, d, untransposed, act_bf16, out);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Blocks per token: 16 where the GPU co-schedules a cluster of 16 (a non-portable size), else the portable 8.
// Fixed per kernel for the process, so every launch splits the sums the same way.
template <class Kern>
int hc_cluster_size(Kern kern) {
  return cluster_size_or_8(kern, kHcMaxCluster, kHcThreads, 0);
}

template <int H, bool VEC>
void launch_hc_pre(const HcArgs& a, double* mix_out, Stream s) {
  auto kern = hc_pre_kernel<H, VEC>;
  static const int S = hc_cluster_size(kern);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(S), unsigned(a.n), 1), cfg.blockDim = dim3(kHcThreads, 1, 1), cfg.stream = stream_of(s);
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = unsigned(S), at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
  cfg.attrs = at, cfg.numAttrs = 1;
  PLUMB_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kern, a, mix_out));
}

}  // namespace

size_t fwd_hc_scratch_doubles(int n, int H) { return size_t(n) * size_t((2 + H) * H); }

void fwd_hc_pre(const HcArgs& a, double* scratch, Stream s) {
  const int nmix = a.head ? a.H : (2 + a.H) * a.H;
  if (a.H < 1 || a.H > 6 || nmix > kMaxMix) throw_arg("hc_pre: hc_mult > 6 is not supported on the GPU");
  if (a.n <= 0) return;
  if (a.n > 65535) throw_arg("hc_pre: more than 65535 tokens in one launch");
  const bool vec = a.D % 4 == 0 && aligned16(a.X) && aligned16(a.fn) && aligned16(a.collapsed) &&
                   (!a.y || (aligned16(a.y) && aligned16(a.X_prev))) && (!a.norm_w || aligned16(a.norm_w));
  if (a.norm_w && a.act_bf16) throw_arg("hc_pre: the fused norm is the fp32 twin's (not the official numerics')");
  if (a.y && (a.X_out != a.X || !a.X_prev || !a.post_prev || !a.comb_prev || a.H > kPostMaxH))
    throw_arg("hc_pre: the fused hc_post needs X_out == X, X_prev and the previous gates");
  auto go = [&](auto h) {
    constexpr int H = decltype(h)::value;
    if (vec) launch_hc_pre<H, true>(a, scratch, s);
    else launch_hc_pre<H, false>(a, scratch, s);
  };
  switch (a.H) {
    case 1: go(std::integral_constant<int, 1>{}); break;
    case 2: go(std::integral_constant<int, 2>{}); break;
    case 3: go(std::integral_constant<int, 3>{}); break;
    case 4: go(std::integral_constant<int, 4>{}); break;
    case 5: go(std::integral_constant<int, 5>{}); break;
    default: go(std::integral_constant<int, 6>{}); break;
  }
  check_launch("fwd_hc_pre");
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
