// The MoE router for a batch of decode tokens, in one kernel: every block computes the logits of 16 experts over
// one slice of D for all tokens (x . bf16 gate in fp64, exact products, as the reference's double accumulation),
// and the last block to finish (a counter it resets) sums the slices in a fixed order and, one warp per token,
// forms the fp32 logits, the scores (stable sqrt(softplus), sigmoid or softmax), the selection scores (+ bias),
// the top-k (equal scores: the lower expert id first; NaN counts as largest) or the hash table's choice, and the
// weights renormalized with the 1e-20 floor, times `fold` (routed_scaling_factor iff the Folded placement).
#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace plumb::cuda::detail {

namespace {

constexpr int kThreads = 256;  // 16 experts x 16 lanes along D
constexpr int kTokChunk = 8;   // tokens whose x slice is staged in shared memory at once
constexpr int kMaxE = 512;     // experts per router (finalization keeps E/32 per lane)
constexpr int kMaxK = 16;

template <class XT>
__device__ __forceinline__ float load_act(const XT* p);
template <>
__device__ __forceinline__ float load_act<float>(const float* p) { return *p; }
template <>
__device__ __forceinline__ float load_act<__nv_bfloat16>(const __nv_bfloat16* p) { return __bfloat162float(*p); }
template <>
__device__ __forceinline__ float load_act<__half>(const __half* p) { return __half2float(*p); }

// The reference's scores (model/router.cpp, ops::softplus): PyTorch's threshold-20 softplus without overflow.
__device__ __forceinline__ float score_of(int f, float logit) {
  if (f == 0) {
    const float sp = logit > 20.0f ? logit : fmaxf(logit, 0.0f) + log1pf(expf(-fabsf(logit)));
    return sqrtf(sp);
  }
  return 1.0f / (1.0f + expf(-logit));  // sigmoid (softmax is handled per row)
}

// a before b in top-k order: NaN first, then larger, equal values by lower index.
__device__ __forceinline__ bool better(float va, int ia, float vb, int ib) {
  const bool na = isnan(va), nb = isnan(vb);
  if (na != nb) return na;
  if (!na && va != vb) return va > vb;
  return ia < ib;
}

template <class XT>
__global__ void __launch_bounds__(kThreads) router_kernel(const RouterArgs a) {
  extern __shared__ float smem[];  // max(kTokChunk * kblk floats, 8 warps * E floats)
  __shared__ bool last_s;
  const int ks = int(gridDim.y), kz = int(blockIdx.y);
  const int64_t kblk = a.D / ks, k0 = int64_t(kz) * kblk;
  const int el = int(threadIdx.x) / 16, l16 = int(threadIdx.x) % 16;
  const int64_t e = int64_t(blockIdx.x) * 16 + el;
  const uint16_t* wrow = a.gate + e * a.D + k0;

  for (int t0 = 0; t0 < a.n; t0 += kTokChunk) {
    const int nt = min(kTokChunk, a.n - t0);
    __syncthreads();
    for (int64_t i = threadIdx.x; i < int64_t(nt) * kblk; i += kThreads) {
      const int tt = int(i / kblk);
      const int64_t k = i % kblk;
      const float v = load_act<XT>(static_cast<const XT*>(a.x) + int64_t(t0 + tt) * a.D + k0 + k);
      smem[i] = v;
      if (a.x16 && blockIdx.x == 0) {  // one block per D slice writes the f16 copy
        const __half h = __float2half_rn(v);
        a.x16[int64_t(t0 + tt) * a.D + k0 + k] = *reinterpret_cast<const uint16_t*>(&h);
      }
    }
    __syncthreads();
    double acc[kTokChunk];
#pragma unroll
    for (int tt = 0; tt < kTokChunk; ++tt) acc[tt] = 0.0;
    for (int64_t k = int64_t(l16) * 8; k < kblk; k += 128) {
      const uint4 wv = __ldg(reinterpret_cast<const uint4*>(wrow + k));
      float w[8];
      const uint32_t ww[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        w[2 * i] = bf16_bits_to_f32(ww[i] & 0xFFFFu);
        w[2 * i + 1] = __uint_as_float(ww[i] & 0xFFFF0000u);
      }
#pragma unroll
      for (int tt = 0; tt < kTokChunk; ++tt) {
        if (tt >= nt) break;
        const float4 xa = *reinterpret_cast<const float4*>(smem + tt * kblk + k);
        const float4 xb = *reinterpret_cast<const float4*>(smem + tt * kblk + k + 4);
        double s = acc[tt];
        s = fma(double(xa.x), double(w[0]), s);
        s = fma(double(xa.y), double(w[1]), s);
        s = fma(double(xa.z), double(w[2]), s);
        s = fma(double(xa.w), double(w[3]), s);
        s = fma(double(xb.x), double(w[4]), s);
        s = fma(double(xb.y), double(w[5]), s);
        s = fma(double(xb.z), double(w[6]), s);
        s = fma(double(xb.w), double(w[7]), s);
        acc[tt] = s;
      }
    }
#pragma unroll
    for (int tt = 0; tt < kTokChunk; ++tt) {
      if (tt >= nt) break;
      double s = acc[tt];
      for (int off = 8; off > 0; off >>= 1) s += __shfl_xor_sync(0xFFFFFFFFu, s, off, 16);
      if (l16 == 0) a.partial[(int64_t(kz) * a.n + t0 + tt) * a.E + e] = s;
    }
  }

  // The last block to finish finalizes every token.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned prev = atomicAdd(a.counter, 1u);
    last_s = prev + 1 == gridDim.x * gridDim.y;
  }
  __syncthreads();
  if (!last_s) return;
  if (threadIdx.x == 0) *a.counter = 0u;
  __threadfence();

  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int epl = int(a.E / 32);
  float* lg = smem;                              // [kTokChunk][E] logits of this token chunk
  float* sc = smem + kTokChunk * a.E + warp * a.E;  // this warp's token scores
  for (int t0 = 0; t0 < a.n; t0 += kTokChunk) {
    const int nt = min(kTokChunk, a.n - t0);
    __syncthreads();
    // The logits of the chunk's tokens: every thread sums the slices of some (token, expert) in slice order.
    for (int i = threadIdx.x; i < nt * a.E; i += kThreads) {
      const int64_t gi = int64_t(t0) * a.E + i;
      double parts[8];
#pragma unroll
      for (int z = 0; z < 8; ++z) parts[z] = z < ks ? __ldcg(a.partial + int64_t(z) * a.n * a.E + gi) : 0.0;
      double s = 0.0;
#pragma unroll
      for (int z = 0; z < 8; ++z) s += parts[z];
      lg[i] = float(s);
      if (a.logits) a.logits[gi] = float(s);
    }
    __syncthreads();
    if (warp >= nt) continue;
    const int tok = t0 + warp;
    float logit[kMaxE / 32], score[kMaxE / 32], sel[kMaxE / 32];
#pragma unroll
    for (int i = 0; i < kMaxE / 32; ++i) logit[i] = i < epl ? lg[warp * a.E + i * 32 + lane] : -INFINITY;
    if (a.score == 2) {  // softmax over the row (ops::softmax)
      float mx = -INFINITY;
#pragma unroll
      for (int i = 0; i < kMaxE / 32; ++i) mx = fmaxf(mx, logit[i]);
      for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, off));
      double sum = 0.0;
#pragma unroll
      for (int i = 0; i < kMaxE / 32; ++i) {
        score[i] = (i < epl && mx != -INFINITY) ? expf(logit[i] - mx) : 0.0f;
        sum += score[i];
      }
      for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, off);
      if (mx != -INFINITY) {
#pragma unroll
        for (int i = 0; i < kMaxE / 32; ++i) score[i] = float(double(score[i]) / sum);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kMaxE / 32; ++i) score[i] = score_of(a.score, logit[i]);
    }
#pragma unroll
    for (int i = 0; i < kMaxE / 32; ++i) {
      if (i >= epl) continue;
      const int64_t ex = int64_t(i) * 32 + lane;
      sc[ex] = score[i];
      sel[i] = a.hash ? score[i] : score[i] + a.bias[ex];
      if (a.select && !a.hash) a.select[int64_t(tok) * a.E + ex] = sel[i];
    }
    __syncwarp();

    int chosen[kMaxK];
    if (a.hash) {
      const int64_t row = int64_t(a.tokens[tok]) * a.K;
      for (int k = 0; k < a.K; ++k) chosen[k] = a.tid2eid[row + k];
    } else {
      unsigned taken = 0;  // bit i: my expert i*32 + lane is already chosen
      for (int k = 0; k < a.K; ++k) {
        float bv = 0.0f;
        int bi = -1;
#pragma unroll
        for (int i = 0; i < kMaxE / 32; ++i) {
          if (i >= epl || (taken >> i & 1u)) continue;
          const int ex = i * 32 + lane;
          if (bi < 0 || better(sel[i], ex, bv, bi)) bv = sel[i], bi = ex;
        }
        for (int off = 16; off > 0; off >>= 1) {
          const float ov = __shfl_xor_sync(0xFFFFFFFFu, bv, off);
          const int oi = __shfl_xor_sync(0xFFFFFFFFu, bi, off);
          if (oi >= 0 && (bi < 0 || better(ov, oi, bv, bi))) bv = ov, bi = oi;
        }
        chosen[k] = bi;
        if (bi >= 0 && bi % 32 == lane) taken |= 1u << (bi / 32);
      }
    }
    if (lane == 0) {
      float sum = 0.0f;
      for (int k = 0; k < a.K; ++k) sum += sc[chosen[k]];
      const float denom = a.renorm ? sum + 1e-20f : 1.0f;
      for (int k = 0; k < a.K; ++k) {
        float w = sc[chosen[k]] / denom;
        if (a.fold != 1.0f) w *= a.fold;
        a.idx[int64_t(tok) * a.K + k] = chosen[k];
        a.weight[int64_t(tok) * a.K + k] = w;
      }
    }
    __syncwarp();
  }
}

}  // namespace

int router_ksplit(int64_t D) {
  for (int ks : {8, 4, 2, 1})
    if (D % (int64_t(ks) * 128) == 0 && D / ks >= 256) return ks;
  return 1;
}

void launch_router(const RouterArgs& a, Stream s) {
  if (a.n <= 0) return;
  if (a.E % 32 || a.E > kMaxE || a.K < 1 || a.K > kMaxK || a.K > a.E)
    throw_arg("router: needs E a multiple of 32 up to 512 and 1 <= K <= min(16, E)");
  if (a.D % 128) throw_arg("router: D must be a multiple of 128");
  if (router_ksplit(a.D) > 8) throw_arg("router: internal split too deep");
  if (!a.gate || !a.x || !a.idx || !a.weight || !a.partial || !a.counter) throw_arg("router: null pointer argument");
  if (a.hash ? (!a.tid2eid || !a.tokens) : !a.bias) throw_arg("router: hash layers need tid2eid and tokens, others a bias");
  const int ks = router_ksplit(a.D);
  const size_t smem =
      std::max(size_t(kTokChunk) * size_t(a.D / ks), size_t(kTokChunk + kThreads / 32) * size_t(a.E)) * sizeof(float);
  const dim3 grid(unsigned(a.E / 16), unsigned(ks));
  auto go = [&](auto kern) {
    if (smem > 48 * 1024) PLUMB_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    kern<<<grid, kThreads, smem, s>>>(a);
  };
  switch (a.act) {
    case kF32: go(router_kernel<float>); break;
    case kBF16: go(router_kernel<__nv_bfloat16>); break;
    case kF16: go(router_kernel<__half>); break;
    default: throw_arg("router: unknown activation type");
  }
  check_launch("router_kernel");
}

}  // namespace plumb::cuda::detail
