// Manifold-constrained hyper-connections on the GPU: hc_pre (norm, the (2+H)*H mixes over H*D, sigmoid, Sinkhorn,
// collapse) in one kernel per token, hc_post elementwise. Twin of src/model/hyper_connection.cpp: fp64 dot
// products, fp32 Sinkhorn in the reference's order.
#include "cuda/fwd_common.cuh"

namespace plumb::cuda::detail {

namespace {

constexpr int kMaxMix = 64;  // (2 + H) * H for H <= 6

__device__ float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }

// ops::softmax: float exponentials, fp64 sum, all -inf -> zeros.
__device__ void softmax_serial(float* x, int n) {
  float m = -INFINITY;
  for (int i = 0; i < n; ++i) m = fmaxf(m, x[i]);
  if (m == -INFINITY) {
    for (int i = 0; i < n; ++i) x[i] = 0;
    return;
  }
  double s = 0;
  for (int i = 0; i < n; ++i) s += (x[i] = expf(x[i] - m));
  for (int i = 0; i < n; ++i) x[i] = float(double(x[i]) / s);
}

__global__ void hc_pre_kernel(HcArgs a) {
  __shared__ double sh[32];
  __shared__ float mix[kMaxMix], pre[8];
  const int t = blockIdx.x, H = a.H;
  const int64_t hd = int64_t(H) * a.D;
  const float* xt = a.X + int64_t(t) * hd;
  const int nmix = a.head ? H : (2 + H) * H;

  double ss = 0;
  for (int64_t i = threadIdx.x; i < hd; i += blockDim.x) ss += double(xt[i]) * xt[i];
  ss = block_sum(ss, sh);
  const double r = 1.0 / sqrt(ss / double(hd) + a.rms_eps);
  for (int o = 0; o < nmix; ++o) {
    const float* f = a.fn + int64_t(o) * hd;
    double acc = 0;
    for (int64_t i = threadIdx.x; i < hd; i += blockDim.x) acc += double(float(double(xt[i]) * r)) * f[i];
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) mix[o] = float(acc);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const float eps = a.hc_eps;
    for (int j = 0; j < H; ++j) pre[j] = sigm(fmaf(mix[j], a.scale[0], a.base[j])) + eps;
    if (!a.head) {
      for (int j = 0; j < H; ++j) a.post[t * H + j] = 2.0f * sigm(fmaf(mix[H + j], a.scale[1], a.base[H + j]));
      float C[64];
      for (int i = 0; i < H * H; ++i) C[i] = fmaf(mix[2 * H + i], a.scale[2], a.base[2 * H + i]);
      for (int j = 0; j < H; ++j) {
        softmax_serial(C + j * H, H);
        for (int k = 0; k < H; ++k) C[j * H + k] += eps;
      }
      auto col_norm = [&] {
        for (int k = 0; k < H; ++k) {
          float s = 0;
          for (int j = 0; j < H; ++j) s += C[j * H + k];
          for (int j = 0; j < H; ++j) C[j * H + k] /= s + eps;
        }
      };
      auto row_norm = [&] {
        for (int j = 0; j < H; ++j) {
          float s = 0;
          for (int k = 0; k < H; ++k) s += C[j * H + k];
          for (int k = 0; k < H; ++k) C[j * H + k] /= s + eps;
        }
      };
      col_norm();
      for (int it = 1; it < a.iters; ++it) {
        row_norm();
        col_norm();
      }
      for (int i = 0; i < H * H; ++i) a.comb[int64_t(t) * H * H + i] = C[i];
    }
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < a.D; d += blockDim.x) {
    float acc = 0;
    for (int j = 0; j < H; ++j) acc = __fadd_rn(acc, __fmul_rn(pre[j], xt[j * a.D + d]));
    a.collapsed[int64_t(t) * a.D + d] = acc;
  }
}

__global__ void hc_post_kernel(const float* y, const float* X, const float* post, const float* comb, int n, int H, int64_t D,
                               int untransposed, float* out) {
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
  out[i] = acc;
}

}  // namespace

void fwd_hc_pre(const HcArgs& a, Stream s) {
  if (a.H > 6 || (a.head ? a.H : (2 + a.H) * a.H) > kMaxMix) throw_arg("hc_pre: hc_mult > 6 is not supported on the GPU");
  if (a.n <= 0) return;
  hc_pre_kernel<<<a.n, 256, 0, s>>>(a);
  check_launch("fwd_hc_pre");
}

void fwd_hc_post(const float* y, const float* X, const float* post, const float* comb, int n, int H, int64_t D, int untransposed,
                 float* out, Stream s) {
  const int64_t total = int64_t(n) * H * D;
  if (total <= 0) return;
  hc_post_kernel<<<fwd_blocks(total, 256), 256, 0, s>>>(y, X, post, comb, n, H, D, untransposed, out);
  check_launch("fwd_hc_post");
}

}  // namespace plumb::cuda::detail
