// attn.splitk_decode: the sparse attention of fwd_attention.cu split over keys (flash-decoding). Each block takes
// one (token, head) and one contiguous chunk of its keys, keeps a running max, sum and P.V in one pass (no logits
// scratch, no per-query shared-memory limit), and the splits are merged with the sink afterwards. Same keys and
// bit-identical logits as the unsplit twin (attn_keys.cuh); only the softmax's normalization order differs.
#include <algorithm>

#include "cuda/attn_keys.cuh"

namespace plumb::cuda::detail {

namespace {

constexpr int kThreads = 256, kTile = 64, kMaxDimsPerThread = 4;  // Dh <= 1024

// One split's state, as the merge reads it: running max m (-inf when the split saw no key), the sum l of
// exp(logit - m) in fp64, and the unnormalized sum of exp(logit - m) * v stored as float.
struct Partials {
  float* m;      // [rows, S]
  double* l;     // [rows, S]
  float* acc;    // [rows, S, Dh]
};

// The merge of S splits with the sink, written once and used both by the one-split path and by the merge kernel, so
// a query whose keys all fall in split 0 gets the same bits whether or not empty splits follow (eager launches size
// S by this step's keys, a graph by the caches' capacity): an empty split adds exact zeros.
struct Merge {
  float M;   // max(sink, m_s)
  double L;  // exp(sink - M) + sum_s l_s exp(m_s - M)
  __device__ Merge(float sink, const float* m, const double* l, int S) {
    M = sink;
    for (int s = 0; s < S; ++s) M = fmaxf(M, m[s]);
    L = double(expf(sink - M));
    for (int s = 0; s < S; ++s) L += l[s] * double(expf(m[s] - M));
  }
  __device__ float out(const float* acc, int64_t stride, const float* m, int S) const {
    double o = 0;
    for (int s = 0; s < S; ++s) o += double(acc[s * stride]) * double(expf(m[s] - M));
    return float(o / L);
  }
};

// Block (t, h) x split s, 256 threads: keys [s * chunk, min((s + 1) * chunk, count)) in tiles of 64. Per tile
// each warp computes 8 logits two at a time (key_logit2: the twin's fp64 dot products), slots past the split's end
// become holes; every thread takes the tile's max from shared memory (the same value in each thread), rescales
// its running state when the max grows, and adds p = exp(logit - m) (a hole: p = 0 on the query row as a dummy,
// adding exact zeros) times the thread's dims d = tid + 256 u, the rows of 8 keys loaded before their products.
// direct: S == 1, so the block also merges with the sink and writes the output.
__global__ void __launch_bounds__(kThreads) attend_split_kernel(AttendArgs a, Partials P, int64_t chunk, int S, int direct) {
  constexpr int kGroup = 8;
  __shared__ float lg[kTile];
  __shared__ const float* krow[kTile];
  const int th = blockIdx.x, t = th / a.Hq, h = th % a.Hq, s = blockIdx.y;
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nwarps = kThreads / 32;
  const KeyList keys(a, t);
  const float* qh = a.q + int64_t(th) * a.Dh;
  const int64_t j0 = int64_t(s) * chunk, j1 = min(j0 + chunk, keys.count);
  float m = -INFINITY;
  double l = 0, acc[kMaxDimsPerThread] = {};
  for (int64_t b = j0; b < j1; b += kTile) {
    const int nt = int(min(int64_t(kTile), j1 - b));
    for (int i = 2 * wid; i < kTile; i += 2 * nwarps) {
      const float* k0 = i < nt ? keys.row(b + i) : nullptr;
      const float* k1 = i + 1 < nt ? keys.row(b + i + 1) : nullptr;
      float l0 = -INFINITY, l1 = -INFINITY;
      if (k0 && k1) key_logit2(qh, k0, k1, a.Dh, a.scale, l0, l1);
      else if (k0) l0 = key_logit(qh, k0, a.Dh, a.scale);
      else if (k1) l1 = key_logit(qh, k1, a.Dh, a.scale);
      if (lane == 0) lg[i] = l0, krow[i] = k0 ? k0 : qh, lg[i + 1] = l1, krow[i + 1] = k1 ? k1 : qh;
    }
    __syncthreads();
    float tmax = m;
    for (int i = 0; i < kTile; ++i) tmax = fmaxf(tmax, lg[i]);
    if (tmax > m) {  // never true for a tile of holes only (tmax stays -inf)
      const double f = m == -INFINITY ? 0.0 : double(expf(m - tmax));
      l *= f;
#pragma unroll
      for (int u = 0; u < kMaxDimsPerThread; ++u) acc[u] *= f;
      m = tmax;
    }
    const int ng = (nt + kGroup - 1) / kGroup * kGroup;  // whole groups: the padding slots are holes
    for (int i0 = 0; i0 < ng; i0 += kGroup) {
      float v[kGroup][kMaxDimsPerThread];
#pragma unroll
      for (int g = 0; g < kGroup; ++g)
#pragma unroll
        for (int u = 0; u < kMaxDimsPerThread; ++u) {
          const int64_t d = threadIdx.x + int64_t(u) * kThreads;
          v[g][u] = d < a.Dh ? krow[i0 + g][d] : 0.0f;
        }
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        const float x = lg[i0 + g];
        const float p = x == -INFINITY ? 0.0f : expf(x - m);
        l += double(p);
#pragma unroll
        for (int u = 0; u < kMaxDimsPerThread; ++u) acc[u] += double(p) * v[g][u];
      }
    }
    __syncthreads();  // lg / krow are rewritten by the next tile
  }
  const int64_t ps = int64_t(th) * S + s;
  if (direct) {
    const Merge mg(a.sink[h], &m, &l, 1);
#pragma unroll
    for (int u = 0; u < kMaxDimsPerThread; ++u) {
      const int64_t d = threadIdx.x + int64_t(u) * kThreads;
      const float av = float(acc[u]);
      if (d < a.Dh) a.out[int64_t(th) * a.Dh + d] = mg.out(&av, 0, &m, 1);
    }
    return;
  }
  if (threadIdx.x == 0) P.m[ps] = m, P.l[ps] = l;
#pragma unroll
  for (int u = 0; u < kMaxDimsPerThread; ++u) {
    const int64_t d = threadIdx.x + int64_t(u) * kThreads;
    if (d < a.Dh) P.acc[ps * a.Dh + d] = float(acc[u]);
  }
}

// Block (t, h): merges its S splits with the sink (Merge), thread per dim.
__global__ void attend_merge_kernel(AttendArgs a, Partials P, int S) {
  const int th = blockIdx.x, h = th % a.Hq;
  const float* m = P.m + int64_t(th) * S;
  const Merge mg(a.sink[h], m, P.l + int64_t(th) * S, S);
  const float* acc = P.acc + int64_t(th) * S * a.Dh;
  for (int64_t d = threadIdx.x; d < a.Dh; d += blockDim.x) a.out[int64_t(th) * a.Dh + d] = mg.out(acc + d, a.Dh, m, S);
}

}  // namespace

SplitPlan fwd_attend_splitk_plan(int n, int Hq, int64_t Dh, int64_t max_keys) {
  SplitPlan p;
  const int64_t rows = int64_t(n) * Hq, bytes_per_split = rows * (Dh * 4 + 12);
  // Up to 256 tokens (the graph-captured chunks) the chunk depends on n only, so an eager step (S from this step's
  // keys) and a graph (S from the capacity) split each query's keys identically. Decode (n <= 8): one tile of 64
  // keys per split, so one token's 64 heads x 640 keys make 640 blocks; up to 256 tokens: 1024 keys. Longer (prefill, eager only): few splits, partials
  // kept under 256 MB.
  if (n <= 256) {
    p.chunk = n <= 8 ? kTile : 1024;
  } else {
    const int64_t cap = std::max<int64_t>(1, (int64_t(256) << 20) / bytes_per_split);
    const int64_t S = std::min(std::max<int64_t>(1, (max_keys + 1023) / 1024), cap);
    p.chunk = ((max_keys + S - 1) / S + kTile - 1) / kTile * kTile;
  }
  p.splits = int(std::max<int64_t>(1, (max_keys + p.chunk - 1) / p.chunk));
  p.scratch_bytes = p.splits > 1 ? size_t(bytes_per_split) * size_t(p.splits) : 0;
  return p;
}

void fwd_attend_splitk(const AttendArgs& a, const SplitPlan& plan, void* scratch, Stream s) {
  if (a.n <= 0) return;
  if (a.Dh > int64_t(kThreads) * kMaxDimsPerThread) throw_arg("attention (split-K): head_dim above 1024");
  const unsigned rows = unsigned(a.n * a.Hq);
  const int S = plan.splits;
  Partials P{};
  if (S > 1) {
    if (!scratch) throw_arg("attention (split-K): no scratch for the partials");
    P.l = static_cast<double*>(scratch);  // doubles first: 8-byte aligned
    P.m = reinterpret_cast<float*>(P.l + size_t(rows) * S);
    P.acc = P.m + size_t(rows) * S;
  }
  attend_split_kernel<<<dim3(rows, unsigned(S)), kThreads, 0, s>>>(a, P, plan.chunk, S, S == 1);
  check_launch("fwd_attend_split");
  if (S == 1) return;
  attend_merge_kernel<<<rows, kThreads, 0, s>>>(a, P, S);
  check_launch("fwd_attend_merge");
}

}  // namespace plumb::cuda::detail
