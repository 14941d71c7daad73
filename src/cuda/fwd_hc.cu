// Manifold-constrained hyper-connections on the GPU: hc_pre (norm, the (2+H)*H mixes over H*D, then the sigmoid
// gates and Sinkhorn of model/hc_math.h, the same code the CPU reference runs, and the collapse), hc_post
// elementwise. Twin of src/model/hyper_connection.cpp: fp64 dot products.
#include "cuda/official.cuh"
#include "model/hc_math.h"

namespace plumb::cuda::detail {

namespace {

constexpr int kMaxMix = 64;  // (2 + H) * H for H <= 6

// hc_pre in three parallel launches (one block per token was latency-bound: 80 us at V4-Flash size):
//   1. partial sums of squares of the token's H*D streams over kHcSplit slices;
//   2. per (mix o, slice s): r = rsqrt(mean + eps) from the partials (fixed order), the partial dot
//      sum_i float(x_i * r) * fn[o, i] over the slice (fp64);
//   3. per (D slice, token): mix = fp32(sum of partials in slice order), then pre/post/comb and the collapse.
constexpr int kHcSplit = 16;

__device__ __forceinline__ void slice_of(int64_t hd, int s, int64_t& b, int64_t& e) {
  const int64_t per = (hd + kHcSplit - 1) / kHcSplit;
  b = min(hd, int64_t(s) * per), e = min(hd, b + per);
}

__global__ void hc_ss_kernel(HcArgs a, double* ssp) {
  __shared__ double sh[32];
  const int s = blockIdx.x, t = blockIdx.y;
  const int64_t hd = int64_t(a.H) * a.D;
  const float* xt = a.X + int64_t(t) * hd;
  int64_t b, e;
  slice_of(hd, s, b, e);
  double ss = 0;
  for (int64_t i = b + threadIdx.x; i < e; i += blockDim.x) ss += double(xt[i]) * xt[i];
  ss = block_sum(ss, sh);
  if (threadIdx.x == 0) ssp[int64_t(t) * kHcSplit + s] = ss;
}

__global__ void hc_mix_kernel(HcArgs a, const double* ssp, double* mixp, int nmix) {
  __shared__ double sh[32];
  const int o = blockIdx.x, s = blockIdx.y, t = blockIdx.z;
  const int64_t hd = int64_t(a.H) * a.D;
  const float* xt = a.X + int64_t(t) * hd;
  double ss = 0;
  for (int i = 0; i < kHcSplit; ++i) ss += ssp[int64_t(t) * kHcSplit + i];
  const double r = 1.0 / sqrt(ss / double(hd) + a.rms_eps);
  const float* f = a.fn + int64_t(o) * hd;
  int64_t b, e;
  slice_of(hd, s, b, e);
  double acc = 0;
  if (a.mix_mode == 2)  // official: x . fn, times r in hc_finish
    for (int64_t i = b + threadIdx.x; i < e; i += blockDim.x) acc += double(xt[i]) * f[i];
  else if (a.mix_mode == 1)  // mhc.bf16_mix
    for (int64_t i = b + threadIdx.x; i < e; i += blockDim.x) acc += double(bf16r(float(double(xt[i]) * r))) * bf16r(f[i]);
  else
    for (int64_t i = b + threadIdx.x; i < e; i += blockDim.x) acc += double(float(double(xt[i]) * r)) * f[i];
  acc = block_sum(acc, sh);
  if (threadIdx.x == 0) mixp[(int64_t(t) * nmix + o) * kHcSplit + s] = acc;
}

// comb by one warp, lane j*H + k holding C[j][k]: hc_math::weights_h's Sinkhorn step for step (row softmax + eps,
// a column normalization, then iters - 1 row and column normalizations), each sum taken in the same order through
// shuffles, so the result is bit-identical to that thread's (tests/cuda: HcPreWarpSinkhornMatchesSerial). H * H <= 32. One thread doing
// the 20 iterations alone took ~40 us (dependent divisions); here a row or column step is one division per lane.
__device__ void sinkhorn_warp(const float* mix, const float* scale, const float* base, int H, float eps, int iters, float* comb) {
  const int lane = threadIdx.x & 31, j = lane / H, k = lane % H;
  const bool on = lane < H * H;
  float c = on ? fmaf(mix[2 * H + lane], scale[2], base[2 * H + lane]) : 0.0f;
  auto at = [&](float v, int src) { return __shfl_sync(0xFFFFFFFFu, v, src); };
  // hc_math::softmax of row j, then + eps.
  float m = -INFINITY;
  for (int kk = 0; kk < H; ++kk) m = fmaxf(m, at(c, j * H + kk));
  const float e = expf(c - m);
  double s = 0;
  for (int kk = 0; kk < H; ++kk) s += double(__shfl_sync(0xFFFFFFFFu, e, j * H + kk));
  c = m == -INFINITY ? 0.0f : float(double(e) / s);
  c += eps;
  auto col_norm = [&] {
    float t = 0;
    for (int jj = 0; jj < H; ++jj) t += at(c, jj * H + k);
    c /= t + eps;
  };
  auto row_norm = [&] {
    float t = 0;
    for (int kk = 0; kk < H; ++kk) t += at(c, j * H + kk);
    c /= t + eps;
  };
  col_norm();
  for (int it = 1; it < iters; ++it) {
    row_norm();
    col_norm();
  }
  if (on) comb[lane] = c;
}

// One block per (D slice, token): the pre weights (every block), post and the Sinkhorn-normalized comb (the first
// block of the token), then this slice of the collapse sum_j pre_j * x_j.
__global__ void hc_finish_kernel(HcArgs a, const double* ssp, const double* mixp, int nmix) {
  __shared__ float pre[8], mix[kMaxMix];
  const int t = blockIdx.y, H = a.H;
  const float* xt = a.X + int64_t(t) * H * a.D;
  // Thread o sums mix o's slice partials (in slice order); one thread then runs the gates and Sinkhorn. (Thread 0
  // alone summing all (2+H)*H*16 partials was a chain of dependent global loads: 80 us at V4 size.)
  if (threadIdx.x < nmix) {
    double acc = 0;
    for (int i = 0; i < kHcSplit; ++i) acc += mixp[(int64_t(t) * nmix + threadIdx.x) * kHcSplit + i];
    mix[threadIdx.x] = float(acc);
    if (a.mix_mode == 2) {  // official: float(x . fn) * float(r), r from the same partials in the same order
      double ss = 0;
      for (int i = 0; i < kHcSplit; ++i) ss += ssp[int64_t(t) * kHcSplit + i];
      const double r = 1.0 / sqrt(ss / double(int64_t(H) * a.D) + a.rms_eps);
      mix[threadIdx.x] = __fmul_rn(float(acc), float(r));
    }
  }
  __syncthreads();
  // post and comb once per token (the first D slice); every slice needs pre for its collapse.
  const bool full = !a.head && blockIdx.x == 0, warp_sinkhorn = full && H * H <= 32 && !a.serial_sinkhorn;
  if (warp_sinkhorn && threadIdx.x < 32) sinkhorn_warp(mix, a.scale, a.base, H, a.hc_eps, a.iters, a.comb + int64_t(t) * H * H);
  if (threadIdx.x == (warp_sinkhorn ? 32 : 0)) {  // the gates, beside the warp's Sinkhorn
    float post[6], C[36];
    if (full && !warp_sinkhorn) {  // H = 6 (36 > 32 lanes): one thread
      hc_math::weights(mix, a.scale, a.base, H, a.hc_eps, a.iters, pre, post, C);
      for (int i = 0; i < H * H; ++i) a.comb[int64_t(t) * H * H + i] = C[i];
    } else {
      hc_math::gates(mix, a.scale, a.base, H, a.hc_eps, pre, full ? post : nullptr);
    }
    if (full)
      for (int j = 0; j < H; ++j) a.post[t * H + j] = post[j];
  }
  __syncthreads();
  const int64_t d = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (d >= a.D) return;
  float acc = 0;
  for (int j = 0; j < H; ++j) acc = __fadd_rn(acc, __fmul_rn(pre[j], xt[j * a.D + d]));
  a.collapsed[int64_t(t) * a.D + d] = a.act_bf16 ? bf16r(acc) : acc;
}

__global__ void hc_post_kernel(const float* y, const float* X, const float* post, const float* comb, int n, int H, int64_t D,
                               int untransposed, int act_bf16, float* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(n) * H * D) return;
  const int64_t d = i % D, k = (i / D) % H, t = i / (D * H);
  const float* C = comb + t * H * H;
  // The reference's order (post * y first, then the streams): it reproduced the official golden bit for bit.
  float acc = __fmul_rn(post[t * H + k], y[t * D + d]);
  for (int j = 0; j < H; ++j) {
    const float c = untransposed ? C[k * H + j] : C[j * H + k];
    acc = __fadd_rn(acc, __fmul_rn(c, X[(t * H + j) * D + d]));
  }
  out[i] = act_bf16 ? bf16r(acc) : acc;
}

}  // namespace

size_t fwd_hc_scratch_doubles(int n, int H) { return size_t(n) * kHcSplit * size_t(1 + (2 + H) * H); }

void fwd_hc_pre(const HcArgs& a, double* scratch, Stream s) {
  const int nmix = a.head ? a.H : (2 + a.H) * a.H;
  if (a.H > 6 || nmix > kMaxMix) throw_arg("hc_pre: hc_mult > 6 is not supported on the GPU");
  if (a.n <= 0) return;
  double* ssp = scratch;
  double* mixp = scratch + size_t(a.n) * kHcSplit;
  hc_ss_kernel<<<dim3(kHcSplit, unsigned(a.n)), 256, 0, s>>>(a, ssp);
  check_launch("fwd_hc_ss");
  hc_mix_kernel<<<dim3(unsigned(nmix), kHcSplit, unsigned(a.n)), 256, 0, s>>>(a, ssp, mixp, nmix);
  check_launch("fwd_hc_mix");
  hc_finish_kernel<<<dim3(unsigned(fwd_blocks(a.D, 256)), unsigned(a.n)), 256, 0, s>>>(a, ssp, mixp, nmix);
  check_launch("fwd_hc_finish");
}

void fwd_hc_post(const float* y, const float* X, const float* post, const float* comb, int n, int H, int64_t D, int untransposed,
                 float* out, Stream s, int act_bf16) {
  const int64_t total = int64_t(n) * H * D;
  if (total <= 0) return;
  hc_post_kernel<<<fwd_blocks(total, 256), 256, 0, s>>>(y, X, post, comb, n, H, D, untransposed, act_bf16, out);
  check_launch("fwd_hc_post");
}

}  // namespace plumb::cuda::detail
