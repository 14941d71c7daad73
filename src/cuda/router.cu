// The MoE router for a batch of tokens, in one kernel. Grid (E/16 expert groups, S slices of D, token chunks of
// up to 8). Each block computes, for its 16 experts, its slice of D and its chunk's tokens, the fp64 partial dot
// products x . bf16(gate) (exact products, fp64 sums in a fixed order: the reference's double accumulation), and
// writes them to the workspace; the last block of a chunk to finish (a per-chunk counter it resets) sums the S
// slices in slice order and, one warp per token, forms the fp32 logits, the scores (stable sqrt(softplus),
// sigmoid or softmax), the selection scores (+ bias), the top-k (equal scores: the lower expert id first; NaN
// counts as largest) or the hash table's choice, and the weights renormalized with the 1e-20 floor, times `fold`
// (routed_scaling_factor iff the Folded placement).
//
// Work split inside a block (8 warps): warp w takes experts 4*(w%4) .. +3 of the block's 16 and half w/4 of the
// block's slice; lane l takes 8 consecutive elements every 256. Each lane keeps the 4 experts' 8 weights as
// doubles and reuses every staged x value (fp64, shared memory) for the 4 experts, so shared-memory traffic
// matches the fp64 FMA rate. The 4 x NT per-lane sums are reduced across the warp by a reduce-scatter butterfly
// (a fixed tree: deterministic), the two halves are added in shared memory (half 0 + half 1).
// Indexing is 32-bit (launch_router checks the sizes).
#include "cuda/common.cuh"
#include "cuda/radix_select.cuh"
#include "cuda/kernels.h"

// Optional timing probes (a diagnostic build defines PLUMB_ROUTER_STAMP(slot) before including this file).
#ifndef PLUMB_ROUTER_STAMP
#define PLUMB_ROUTER_STAMP(slot)
#endif

namespace plumb::cuda::detail {

namespace {

constexpr int kThreads = 256;   // 8 warps
constexpr int kR = 4;           // experts per warp
constexpr int kEB = 16;         // experts per block (4 warps x kR; two halves of the slice)
constexpr int kTokChunk = 8;    // tokens per chunk (one finalizing warp each)
constexpr int kMaxE = 512;      // experts per router (finalization keeps E/32 per lane)
constexpr int kMaxK = 16;
constexpr int kMaxS = 8;        // slices of D (router_ksplit)

// Eight activations from x + i (i a multiple of 8), as floats.
template <class XT>
__device__ __forceinline__ void load_act8(const XT* p, bool vec, float (&v)[8]);
template <>
__device__ __forceinline__ void load_act8<float>(const float* p, bool vec, float (&v)[8]) {
  if (vec) {
    const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = p[j];
  }
}
template <class H>
__device__ __forceinline__ float half_bits_to_f32(uint32_t b);
template <>
__device__ __forceinline__ float half_bits_to_f32<__nv_bfloat16>(uint32_t b) { return bf16_bits_to_f32(b); }
template <>
__device__ __forceinline__ float half_bits_to_f32<__half>(uint32_t b) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(b)));
}
template <class XT>
__device__ __forceinline__ void load_act8(const XT* p, bool vec, float (&v)[8]) {
  uint32_t w[4];
  if (vec) {
    const uint4 q = *reinterpret_cast<const uint4*>(p);
    w[0] = q.x, w[1] = q.y, w[2] = q.z, w[3] = q.w;
  } else {
    const uint16_t* s = reinterpret_cast<const uint16_t*>(p);
#pragma unroll
    for (int j = 0; j < 4; ++j) w[j] = uint32_t(s[2 * j]) | (uint32_t(s[2 * j + 1]) << 16);
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    v[2 * j] = half_bits_to_f32<XT>(w[j] & 0xFFFFu);
    v[2 * j + 1] = half_bits_to_f32<XT>(w[j] >> 16);
  }
}

// The reference's scores (model/router.cpp, ops::softplus): PyTorch's threshold-20 softplus without overflow.
__device__ __forceinline__ float score_of(int f, float logit) {
  if (f == 0) {
    const float sp = logit > 20.0f ? logit : fmaxf(logit, 0.0f) + log1pf(expf(-fabsf(logit)));
    return sqrtf(sp);
  }
  return 1.0f / (1.0f + expf(-logit));  // sigmoid (softmax is handled per row)
}

// Selection scores as unsigned keys in the top-k order (NaN largest, -0 == +0; every non-NaN value above 0, so 0
// means "no candidate"): radix::order_key_nan_first, the indexer's order.

template <class XT, int NT>
__global__ void __launch_bounds__(kThreads, 1) router_kernel(const RouterArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  double* xs = reinterpret_cast<double*>(smem_raw);  // [NT][L] this block's x slice, fp64
  __shared__ double comb[2][4][kR * NT];              // per half, per warp of the half: the reduced sums
  __shared__ float bias_s[kMaxE];
  __shared__ int hash_s[kTokChunk * kMaxK];
  __shared__ bool last_s;
  constexpr int C = kR * NT;                          // values per lane to reduce
  constexpr int LOGC = NT == 1 ? 2 : NT == 2 ? 3 : NT == 4 ? 4 : 5;

  const int E = int(a.E), D = int(a.D), n = a.n;
  const int S = int(gridDim.y), s = int(blockIdx.y), chunk = int(blockIdx.z);
  const int L = D / S, H = L / 2;
  const int t0 = chunk * kTokChunk, nt = min(NT, n - t0);
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int half = warp / 4, e0 = int(blockIdx.x) * kEB + (warp % 4) * kR;
  const int kb = s * L + half * H;  // this warp's range of D: [kb, kb + H)

  // First weight loads in flight before x is staged.
  int k = lane * 8;  // offset within the warp's half
  uint4 wv[kR];
  if (k < H) {
#pragma unroll
    for (int r = 0; r < kR; ++r) wv[r] = __ldg(reinterpret_cast<const uint4*>(a.gate + (e0 + r) * D + kb + k));
  }

  PLUMB_ROUTER_STAMP(0);
  // The finalizer's inputs, loaded now (their latency hides under the weight loads) by every block, kept in
  // shared memory: the bias, or the hash table's rows of the chunk's tokens.
  float bias0 = 0.0f, bias1 = 0.0f;  // experts tid and tid + 256 (E <= 512)
  int hash_e = 0;
  if (!a.hash) {
    if (tid < E) bias0 = __ldg(a.bias + tid);
    if (tid + kThreads < E) bias1 = __ldg(a.bias + tid + kThreads);
  }
  if (a.hash && tid < nt * int(a.K)) hash_e = __ldg(a.tid2eid + __ldg(a.tokens + t0 + tid / int(a.K)) * int(a.K) + tid % int(a.K));

  // Stage x[t0 .. t0+nt) [s*L, s*L + L) as fp64; expert group 0 also writes the f16 copy. All of a batch's
  // loads are issued before any store (the f16 stores could alias x for all the compiler knows).
  {
    const XT* xb = static_cast<const XT*>(a.x);
    const bool vec = (reinterpret_cast<uintptr_t>(a.x) & 15u) == 0;
    const bool vec16 = (reinterpret_cast<uintptr_t>(a.x16) & 15u) == 0;
    const int v8 = L / 8, items = nt * v8;
    constexpr int kU = 4;
    for (int base = 0; base < items; base += kU * kThreads) {
      float f[kU][8];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int i = base + u * kThreads + tid;
        if (i < items) {
          const int tt = i / v8, v = i - tt * v8;
          load_act8<XT>(xb + (t0 + tt) * D + s * L + v * 8, vec, f[u]);
        }
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int i = base + u * kThreads + tid;
        if (i >= items) break;
        const int tt = i / v8, v = i - tt * v8;
        double2* dst = reinterpret_cast<double2*>(xs + tt * L + v * 8);
#pragma unroll
        for (int j = 0; j < 4; ++j) dst[j] = make_double2(double(f[u][2 * j]), double(f[u][2 * j + 1]));
        if (a.x16 && blockIdx.x == 0) {
          const int gi = (t0 + tt) * D + s * L + v * 8;
          uint4 h;
          h.x = f32x2_to_f16x2(f[u][0], f[u][1]), h.y = f32x2_to_f16x2(f[u][2], f[u][3]);
          h.z = f32x2_to_f16x2(f[u][4], f[u][5]), h.w = f32x2_to_f16x2(f[u][6], f[u][7]);
          if (vec16) *reinterpret_cast<uint4*>(a.x16 + gi) = h;
          else {
            const uint32_t hh[4] = {h.x, h.y, h.z, h.w};
#pragma unroll
            for (int j = 0; j < 4; ++j) a.x16[gi + 2 * j] = uint16_t(hh[j] & 0xFFFFu), a.x16[gi + 2 * j + 1] = uint16_t(hh[j] >> 16);
          }
        }
      }
    }
  }
  if (!a.hash) {
    if (tid < E) bias_s[tid] = bias0;
    if (tid + kThreads < E) bias_s[tid + kThreads] = bias1;
  }
  if (a.hash && tid < nt * int(a.K)) hash_s[tid] = hash_e;
  __syncthreads();
  PLUMB_ROUTER_STAMP(1);

  double acc[kR][NT];
#pragma unroll
  for (int r = 0; r < kR; ++r)
#pragma unroll
    for (int tt = 0; tt < NT; ++tt) acc[r][tt] = 0.0;
  for (; k < H; k += 256) {
    double wd[kR][8];
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const uint32_t ww[4] = {wv[r].x, wv[r].y, wv[r].z, wv[r].w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        wd[r][2 * i] = double(bf16_bits_to_f32(ww[i] & 0xFFFFu));
        wd[r][2 * i + 1] = double(__uint_as_float(ww[i] & 0xFFFF0000u));
      }
    }
    if (k + 256 < H) {
#pragma unroll
      for (int r = 0; r < kR; ++r) wv[r] = __ldg(reinterpret_cast<const uint4*>(a.gate + (e0 + r) * D + kb + k + 256));
    }
    const double* xk = xs + half * H + k;
#pragma unroll
    for (int tt = 0; tt < NT; ++tt) {
      if (tt >= nt) break;
      const double2* xp = reinterpret_cast<const double2*>(xk + tt * L);
      double xv[8];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const double2 q = xp[j];
        xv[2 * j] = q.x, xv[2 * j + 1] = q.y;
      }
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        double sum = acc[r][tt];
#pragma unroll
        for (int j = 0; j < 8; ++j) sum = fma(xv[j], wd[r][j], sum);
        acc[r][tt] = sum;
      }
    }
  }

  // Reduce-scatter across the warp: after the rounds with lane masks 16, 8, ... the lane holds the sum of value
  // j = lane >> (5 - LOGC) over all 32 lanes (value index r * NT + tt).
  double v[C];
#pragma unroll
  for (int r = 0; r < kR; ++r)
#pragma unroll
    for (int tt = 0; tt < NT; ++tt) v[r * NT + tt] = acc[r][tt];
  warp_reduce_scatter<C>(v, lane);
  if ((lane & ((1 << (5 - LOGC)) - 1)) == 0) comb[half][warp % 4][lane >> (5 - LOGC)] = v[0];
  __syncthreads();
  if (tid < 4 * C) {
    const int w4 = tid / C, j = tid % C, r = j / NT, tt = j % NT;
    if (tt < nt) a.partial[(s * n + t0 + tt) * E + int(blockIdx.x) * kEB + w4 * kR + r] = comb[0][w4][j] + comb[1][w4][j];
  }

  PLUMB_ROUTER_STAMP(2);
  // The last block of this chunk finalizes its tokens.
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    const unsigned prev = atomicAdd(a.counter + chunk, 1u);
    last_s = prev + 1 == gridDim.x * gridDim.y;
  }
  __syncthreads();
  PLUMB_ROUTER_STAMP(3);
  if (!last_s) return;
  if (tid == 0) a.counter[chunk] = 0u;
  __threadfence();

  float* lg = reinterpret_cast<float*>(smem_raw);  // [NT][E] logits of the chunk
  float* sc = lg + NT * E + warp * E;              // this warp's token scores
  for (int i = tid; i < nt * E; i += kThreads) {
    const int gi = t0 * E + i;
    double part[kMaxS];  // all slices' loads in flight at once, then summed in slice order
#pragma unroll
    for (int z = 0; z < kMaxS; ++z) part[z] = z < S ? __ldcg(a.partial + z * n * E + gi) : 0.0;
    double sum = 0.0;
#pragma unroll
    for (int z = 0; z < kMaxS; ++z)
      if (z < S) sum += part[z];
    lg[i] = float(sum);
    if (a.logits) a.logits[gi] = float(sum);
  }
  __syncthreads();
  PLUMB_ROUTER_STAMP(4);
  if (warp >= nt) return;
  const int tok = t0 + warp, epl = E / 32;
  float logit[kMaxE / 32], score[kMaxE / 32];
  unsigned key[kMaxE / 32];
#pragma unroll
  for (int i = 0; i < kMaxE / 32; ++i) logit[i] = i < epl ? lg[warp * E + i * 32 + lane] : -INFINITY;
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
    key[i] = 0u;
    if (i >= epl) continue;
    const int ex = i * 32 + lane;
    sc[ex] = score[i];
    const float sel = a.hash ? score[i] : score[i] + bias_s[ex];
    key[i] = radix::order_key_nan_first(sel);
    if (a.select && !a.hash) a.select[tok * E + ex] = sel;
  }
  __syncwarp();

  int chosen[kMaxK];
  if (a.hash) {
#pragma unroll
    for (int kk = 0; kk < kMaxK; ++kk)
      if (kk < a.K) chosen[kk] = hash_s[warp * int(a.K) + kk];
  } else {
    // K rounds: each lane's best remaining key (lower index on ties: scan i upwards, strict >), the warp's
    // largest key, and among the lanes holding it the lowest expert id.
#pragma unroll
    for (int kk = 0; kk < kMaxK; ++kk) {
      if (kk >= a.K) break;
      unsigned bk = 0u;
      int bi = 0;
#pragma unroll
      for (int i = 0; i < kMaxE / 32; ++i)
        if (key[i] > bk) bk = key[i], bi = i;
      const unsigned mk = __reduce_max_sync(0xFFFFFFFFu, bk);
      const unsigned cand = (bk == mk && bk != 0u) ? unsigned(bi * 32 + lane) : 0xFFFFFFFFu;
      const unsigned ce = __reduce_min_sync(0xFFFFFFFFu, cand);
      chosen[kk] = int(ce);
      if (cand == ce) {  // this lane owns the chosen expert: take it out
#pragma unroll
        for (int i = 0; i < kMaxE / 32; ++i)
          if (i == bi) key[i] = 0u;
      }
    }
  }
  if (lane == 0) {
    float sum = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kMaxK; ++kk)
      if (kk < a.K) sum += sc[chosen[kk]];
    const float denom = a.renorm ? sum + 1e-20f : 1.0f;
#pragma unroll
    for (int kk = 0; kk < kMaxK; ++kk) {
      if (kk >= a.K) break;
      float w = sc[chosen[kk]] / denom;
      if (a.fold != 1.0f) w *= a.fold;
      a.idx[tok * int(a.K) + kk] = chosen[kk];
      a.weight[tok * int(a.K) + kk] = w;
    }
    PLUMB_ROUTER_STAMP(5);
  }
}

int tok_template(int n) { return n >= 5 ? 8 : n >= 3 ? 4 : n; }

}  // namespace

int router_ksplit(int64_t D) {
  for (int ks : {8, 4, 2, 1})
    if (D % (int64_t(ks) * 16) == 0 && D / (2 * ks) >= 256) return ks;
  return 1;
}

int router_counters(int n) { return (n + kTokChunk - 1) / kTokChunk; }

void launch_router(const RouterArgs& a, Stream s) {
  if (a.n <= 0) return;
  if (a.E % 32 || a.E > kMaxE || a.K < 1 || a.K > kMaxK || a.K > a.E)
    throw_arg("router: needs E a multiple of 32 up to 512 and 1 <= K <= min(16, E)");
  if (a.D % 128) throw_arg("router: D must be a multiple of 128");
  if (!a.gate || !a.x || !a.idx || !a.weight || !a.partial || !a.counter) throw_arg("router: null pointer argument");
  if (a.hash ? (!a.tid2eid || !a.tokens) : !a.bias) throw_arg("router: hash layers need tid2eid and tokens, others a bias");
  if (reinterpret_cast<uintptr_t>(a.gate) % 16) throw_arg("router: gate must be 16-byte aligned");
  if (int64_t(a.n) * std::max(a.D, a.E) * 8 >= (int64_t(1) << 31) || a.E * a.D >= (int64_t(1) << 31))
    throw_arg("router: sizes beyond 32-bit indexing");
  const int ks = router_ksplit(a.D);
  const int nt = tok_template(std::min(a.n, kTokChunk));
  const size_t smem = std::max(size_t(nt) * size_t(a.D / ks) * sizeof(double), size_t(nt + kThreads / 32) * size_t(a.E) * sizeof(float));
  if (smem > 200 * 1024) throw_arg("router: D too large for one slice in shared memory");
  const dim3 grid(unsigned(a.E / kEB), unsigned(ks), unsigned(router_counters(a.n)));
  auto go = [&](auto kern) {
    if (smem > 48 * 1024) PLUMB_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    kern<<<grid, kThreads, smem, s>>>(a);
  };
  auto by_nt = [&](auto xt) {
    using XT = decltype(xt);
    switch (nt) {
      case 1: go(router_kernel<XT, 1>); break;
      case 2: go(router_kernel<XT, 2>); break;
      case 4: go(router_kernel<XT, 4>); break;
      default: go(router_kernel<XT, 8>); break;
    }
  };
  switch (a.act) {
    case kF32: by_nt(float{}); break;
    case kBF16: by_nt(__nv_bfloat16{}); break;
    case kF16: by_nt(__half{}); break;
    default: throw_arg("router: unknown activation type");
  }
  check_launch("router_kernel");
}

}  // namespace plumb::cuda::detail
