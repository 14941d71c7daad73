// Sampling kernels: the GPU twin of plumb::Sampler (declared in cuda/sample.h, which states what is exact).
//
// Candidate order. Every logit becomes a 64-bit key that is larger exactly when the candidate ranks earlier in
// Sampler's order: the high word is an order-preserving image of the float (-0 mapped to +0, NaN to 0, below
// -inf), the low word is 0xFFFFFFFF - id (lower id ranks earlier among equal logits). Keys are unique, so "the
// K largest keys" is one well-defined set, in one well-defined order.
//
// Paths (host picks one, fwd_sample_path):
//  greedy  k_argmax: per-slice maximum key, atomicMax into one word per row; k_greedy_out writes its id.
//  top-k   radix select of the K largest keys: k_hist0 (many blocks per row) counts the top 11 bits of every key
//          into a histogram per row; k_split0 finds the bin holding the K-th key and writes the keys above it
//          to `sel` and those in it to `surv`; k_topk_final (one block per row) refines the survivors over the
//          next 11/11/10/11/11/10-bit digits until they fit in shared memory, sorts selected + survivors
//          (bitonic, descending), keeps the first K, and runs Sampler's softmax / top-p / min-p / renormalize /
//          walk: the element-wise steps in parallel, the sums and scans sequentially in the CPU's order.
//  sorted  k_sort_keys + cub::DeviceRadixSort (stable) of (row, ~order key) with ids as values; then
//          k_sorted_final: the same steps with parallel (fixed-order) sums and prefix scans.
#include <cub/cub.cuh>

#include <algorithm>
#include <cmath>

#include "cuda/common.cuh"
#include "cuda/radix_select.cuh"
#include "cuda/sample.h"

namespace plumb::cuda::detail {

namespace {

constexpr int kRowThreads = 256;   // blocks of the row-wide passes
constexpr int kRowTile = 4096;     // logits per block in the row-wide passes
constexpr int kBins = 2048;        // histogram bins (digits of at most 11 bits)
constexpr int kFinalThreads = 1024;
constexpr int kSortCap = 4096;     // keys sorted in shared memory by k_topk_final
constexpr int kMaxK = kSampleMaxExactK;
using radix::bitonic_sort_desc;
using radix::block_exclusive_scan;
using radix::find_boundary;
using radix::kFull;
using radix::order_key;  // NaN lowest
using radix::warp_append;

// ---- keys ----

// The logit a key stands for, NaN (key 0) read as -inf. -0 comes back as +0 (same softmax term).
__device__ __forceinline__ float key_logit(uint32_t ok) {
  if (ok == 0u) return -INFINITY;
  return __uint_as_float((ok & 0x80000000u) ? (ok & 0x7FFFFFFFu) : ~ok);
}
__device__ __forceinline__ uint64_t cand_key(float v, int32_t id) {
  return (uint64_t(order_key(v)) << 32) | uint64_t(0xFFFFFFFFu - uint32_t(id));
}
__device__ __forceinline__ int32_t key_id(uint64_t k) { return int32_t(0xFFFFFFFFu - uint32_t(k)); }

// Radix digits of a candidate key, most significant first: 11, 11, 10 bits of the logit, 11, 11, 10 of the id.
__device__ __forceinline__ int digit_shift(int d) {
  switch (d) {
    case 0: return 53;
    case 1: return 42;
    case 2: return 32;
    case 3: return 21;
    case 4: return 10;
    default: return 0;
  }
}
__device__ __forceinline__ int digit_bins(int d) { return (d == 2 || d == 5) ? 1024 : 2048; }
__device__ __forceinline__ int digit_of(uint64_t k, int d) { return int((k >> digit_shift(d)) & uint64_t(digit_bins(d) - 1)); }

// The logit as the non-greedy paths read it: NaN counts as -inf.
__device__ __forceinline__ float sample_logit(float v) { return isnan(v) ? -INFINITY : v; }

// A row with no finite logit to sample from: no token, no distribution (cuda/sample.h, kSampleNoFinite).
__device__ __forceinline__ void write_no_finite(const SampleOut& out, int row) {
  out.token[row] = kSampleNoFinite;
  if (out.n) out.n[row] = 0;
}

__device__ __forceinline__ void write_dist(const SampleOut& out, int row, int n, int i, int32_t id, float pr) {
  if (out.ids && out.probs && i < n && i < out.cap) {
    out.ids[int64_t(row) * out.cap + i] = id;
    out.probs[int64_t(row) * out.cap + i] = pr;
  }
}

// ---- penalties ----

// dst = src with Sampler's penalties applied to the window's distinct tokens: the block that copies a slice
// also patches the penalized tokens in it (after a barrier, so its copy of them is overwritten). Single-precision
// steps rounded one by one as on the CPU (no fused multiply-add).
__global__ void k_penalize(const float* __restrict__ src, float* __restrict__ dst, int vocab, const int32_t* ids,
                           const int32_t* counts, int npen, float rep, float pres, float freq) {
  const int64_t base = int64_t(blockIdx.y) * vocab;
  const int a = blockIdx.x * kRowTile, b = min(vocab, a + kRowTile);
  for (int i = a + threadIdx.x; i < b; i += blockDim.x) dst[base + i] = src[base + i];
  __syncthreads();
  for (int j = threadIdx.x; j < npen; j += blockDim.x) {
    const int id = ids[j];
    if (id < a || id >= b) continue;
    float x = src[base + id];
    if (rep != 1.0f) x = x > 0.0f ? __fdiv_rn(x, rep) : __fmul_rn(x, rep);
    x = __fsub_rn(x, __fadd_rn(pres, __fmul_rn(freq, float(counts[j]))));
    dst[base + id] = x;
  }
}

// ---- greedy ----

__global__ void k_argmax(const float* __restrict__ src, int vocab, unsigned long long* best) {
  __shared__ unsigned long long sh[32];
  const int row = blockIdx.y;
  const int64_t base = int64_t(row) * vocab;
  const int a = blockIdx.x * kRowTile, b = min(vocab, a + kRowTile);
  unsigned long long m = 0;
  for (int i = a + threadIdx.x; i < b; i += blockDim.x) {
    const unsigned long long k = cand_key(src[base + i], i);
    m = k > m ? k : m;
  }
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long k = __shfl_xor_sync(kFull, m, o);
    m = k > m ? k : m;
  }
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < int(blockDim.x >> 5); ++w) m = sh[w] > m ? sh[w] : m;
    atomicMax(best + row, m);
  }
}

__global__ void k_greedy_out(int rows, const unsigned long long* best, SampleOut out) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  // The maximum key is the largest non-NaN logit (NaN keys rank below -inf), lowest id on ties, as Sampler's scan
  // over the row with NaN read as -inf. A top that is not finite: no token (see kSampleNoFinite).
  if (!isfinite(key_logit(uint32_t(best[row] >> 32)))) return write_no_finite(out, row);
  const int32_t tok = key_id(best[row]);
  out.token[row] = tok;
  if (out.n) out.n[row] = 1;
  write_dist(out, row, 1, 0, tok, 1.0f);
}

// ---- top-k path ----

// hist[row, digit 0 of the key] over the row (global counts, zeroed before).
__global__ void k_hist0(const float* __restrict__ src, int vocab, uint32_t* hist) {
  __shared__ uint32_t h[kBins];
  const int row = blockIdx.y;
  const int64_t base = int64_t(row) * vocab;
  const int a = blockIdx.x * kRowTile, b = min(vocab, a + kRowTile);
  for (int i = threadIdx.x; i < kBins; i += blockDim.x) h[i] = 0;
  __syncthreads();
  for (int i = a + threadIdx.x; i < b; i += blockDim.x) atomicAdd(&h[digit_of(cand_key(src[base + i], i), 0)], 1u);
  __syncthreads();
  for (int i = threadIdx.x; i < kBins; i += blockDim.x)
    if (h[i]) atomicAdd(&hist[int64_t(row) * kBins + i], h[i]);
}

// Keys whose digit 0 ranks above the K-th key's go to sel[row] (certainly among the K), those with its digit to
// surv[row] (refined later). counts[row] = {selected, survivors} (zeroed before).
__global__ void k_split0(const float* __restrict__ src, int vocab, int K, const uint32_t* hist, uint32_t* counts,
                         uint64_t* sel, uint64_t* surv) {
  __shared__ uint32_t h[kBins];
  __shared__ uint32_t scan_sh[32];
  __shared__ int bin;
  __shared__ uint32_t above;
  const int row = blockIdx.y;
  const int64_t base = int64_t(row) * vocab;
  for (int i = threadIdx.x; i < kBins; i += blockDim.x) h[i] = hist[int64_t(row) * kBins + i];
  if (threadIdx.x == 0) bin = -1, above = 0;
  __syncthreads();
  find_boundary(h, kBins, uint32_t(K), &bin, &above, scan_sh);
  const int bb = bin;
  const int a = blockIdx.x * kRowTile, b = min(vocab, a + kRowTile);
  uint64_t* selr = sel + int64_t(row) * kMaxK;
  uint64_t* survr = surv + base;
  for (int i0 = a; i0 < b; i0 += blockDim.x) {  // the same trip count for every thread (warp_append)
    const int i = i0 + int(threadIdx.x);
    const bool valid = i < b;
    const uint64_t k = valid ? cand_key(src[base + i], i) : 0;
    const int d = valid ? digit_of(k, 0) : -1;
    warp_append(valid && d > bb, &counts[2 * row], selr, k);
    warp_append(valid && d == bb, &counts[2 * row + 1], survr, k);
  }
}

// One block per row: finishes the selection of the K largest keys and samples from them exactly as Sampler.
__global__ void __launch_bounds__(kFinalThreads) k_topk_final(const float* __restrict__ src, int vocab, int K, SampleParams p,
                                                              const double* u, const uint32_t* counts, uint64_t* sel,
                                                              uint64_t* surv_a, uint64_t* surv_b, SampleOut out) {
  __shared__ __align__(16) unsigned char raw[kSortCap * sizeof(uint64_t)];  // keys, then probabilities
  __shared__ uint32_t h[kBins];
  __shared__ int32_t ids[kMaxK];
  __shared__ uint32_t scan_sh[32];
  __shared__ int bin, s_n;
  __shared__ uint32_t above, s_nsel, s_nsurv;
  __shared__ double s_sum;
  uint64_t* keys = reinterpret_cast<uint64_t*>(raw);
  const int row = blockIdx.x;
  const int64_t base = int64_t(row) * vocab;
  uint64_t* selr = sel + int64_t(row) * kMaxK;
  uint64_t* cur = surv_a + base;
  uint64_t* nxt = surv_b + base;
  uint32_t nsel = counts[2 * row], nsurv = counts[2 * row + 1];

  // Refine the survivors digit by digit until selected + survivors fit in shared memory. After the last digit
  // the survivors are unique keys, so at most K - nsel <= kMaxK remain: the loop ends.
  for (int d = 1; nsel + nsurv > uint32_t(kSortCap) && d <= 5; ++d) {
    const int nb = digit_bins(d);
    for (int i = threadIdx.x; i < nb; i += blockDim.x) h[i] = 0;
    if (threadIdx.x == 0) bin = -1, above = 0, s_nsel = nsel, s_nsurv = 0;
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < nsurv; i += blockDim.x) atomicAdd(&h[digit_of(cur[i], d)], 1u);
    __syncthreads();
    find_boundary(h, nb, uint32_t(K) - nsel, &bin, &above, scan_sh);
    const int bb = bin;
    for (uint32_t i0 = 0; i0 < nsurv; i0 += blockDim.x) {
      const uint32_t i = i0 + threadIdx.x;
      const bool valid = i < nsurv;
      const uint64_t k = valid ? cur[i] : 0;
      const int dd = valid ? digit_of(k, d) : -1;
      warp_append(valid && dd > bb, &s_nsel, selr, k);
      warp_append(valid && dd == bb, &s_nsurv, nxt, k);
    }
    __syncthreads();
    nsel = s_nsel, nsurv = s_nsurv;
    uint64_t* t = cur;
    cur = nxt, nxt = t;
    __syncthreads();  // everyone has read s_nsel / s_nsurv before thread 0 resets them
  }

  // Selected keys all outrank the survivors: the K largest of both, in order, are the candidates.
  const int cnt = min(int(nsel + nsurv), kSortCap);  // (the bound holds; the min only guards the buffer)
  int P = 1;
  while (P < cnt) P <<= 1;
  for (int i = threadIdx.x; i < P; i += blockDim.x) keys[i] = i < int(nsel) ? selr[i] : i < cnt ? cur[i - int(nsel)] : 0;
  bitonic_sort_desc(keys, P);
  for (int i = threadIdx.x; i < K; i += blockDim.x) ids[i] = key_id(keys[i]);
  __syncthreads();
  // The top candidate's logit not finite: no token (kSampleNoFinite). Every thread reads the same ids[0], so the
  // whole block returns.
  if (!isfinite(sample_logit(src[base + ids[0]]))) {
    if (threadIdx.x == 0) write_no_finite(out, row);
    return;
  }

  // Sampler::distribution from here, step by step (its fp64 loops: sums in index order, IEEE roundings).
  double* prob = reinterpret_cast<double*>(raw);                       // [kMaxK]
  float* q = reinterpret_cast<float*>(raw + kMaxK * sizeof(double));   // [kMaxK]
  const double T = double(p.temperature);
  const double top = __ddiv_rn(double(sample_logit(src[base + ids[0]])), T);
  for (int i = threadIdx.x; i < K; i += blockDim.x)
    prob[i] = exp(__dsub_rn(__ddiv_rn(double(sample_logit(src[base + ids[i]])), T), top));
  __syncthreads();
  // Sampler's fp64 sum of prob[0..count) in index order, by one thread, shared with the block (every thread calls it).
  auto serial_sum = [&](int count) {
    if (threadIdx.x == 0) {
      double acc = 0;
#pragma unroll 8
      for (int i = 0; i < count; ++i) acc = __dadd_rn(acc, prob[i]);
      s_sum = acc;
    }
    __syncthreads();
    return s_sum;
  };
  const double sum = serial_sum(K);
  for (int i = threadIdx.x; i < K; i += blockDim.x) prob[i] = __ddiv_rn(prob[i], sum);
  __syncthreads();
  int n = K;
  if (p.top_p < 1.0f) {  // the smallest prefix whose probability reaches top_p
    if (threadIdx.x == 0) {
      const double tp = double(p.top_p);
      double cum = 0;
      int keep = 0;
      while (keep < n) {
        cum = __dadd_rn(cum, prob[keep++]);
        if (cum >= tp) break;
      }
      s_n = keep;
    }
    __syncthreads();
    n = s_n;
    __syncthreads();
  }
  if (p.min_p > 0.0f) {  // keep up to the first token below min_p * prob[0]
    if (threadIdx.x == 0) s_n = n;
    __syncthreads();
    const double thr = __dmul_rn(double(p.min_p), prob[0]);
    for (int i = 1 + int(threadIdx.x); i < n; i += blockDim.x)
      if (!(prob[i] >= thr)) atomicMin(&s_n, i);
    __syncthreads();
    n = s_n;
  }
  const double sum2 = serial_sum(n);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    q[i] = __double2float_rn(__ddiv_rn(prob[i], sum2));
    write_dist(out, row, n, i, ids[i], q[i]);
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // Sampler::sample's walk (no draw when one token is left)
    int32_t tok = ids[0];
    if (n > 1) {
      const double uu = u[row];
      double cum = 0;
      tok = ids[n - 1];
      for (int i = 0; i < n; ++i) {
        cum = __dadd_rn(cum, double(q[i]));
        if (uu < cum) {
          tok = ids[i];
          break;
        }
      }
    }
    out.token[row] = tok;
    if (out.n) out.n[row] = n;
  }
}

// ---- sorted path ----

// keys[row, i] = (row << 32) | ~order_key: ascending order = rows in order, each by logit descending; vals = ids.
__global__ void k_sort_keys(const float* __restrict__ src, int vocab, uint64_t* keys, int32_t* vals) {
  const int row = blockIdx.y;
  const int64_t base = int64_t(row) * vocab;
  const int a = blockIdx.x * kRowTile, b = min(vocab, a + kRowTile);
  for (int i = a + threadIdx.x; i < b; i += blockDim.x) {
    keys[base + i] = (uint64_t(row) << 32) | uint64_t(~order_key(src[base + i]));
    vals[base + i] = i;
  }
}

// One block per row over the K sorted candidates; thread t owns the contiguous chunk [lo, hi). Sums and prefix
// sums are per chunk (sequential) then across chunks (block scan): deterministic, not the CPU's left fold.
__global__ void __launch_bounds__(kFinalThreads) k_sorted_final(int vocab, int K, SampleParams p, const double* u,
                                                                const uint64_t* keys, const int32_t* vals, double* e,
                                                                SampleOut out) {
  __shared__ double dsh[32];
  __shared__ int s_first;
  const int row = blockIdx.x;
  const int64_t base = int64_t(row) * vocab;
  const uint64_t* kr = keys + base;
  const int32_t* vr = vals + base;
  double* er = e + base;
  const int n = K;
  const int ch = (n + int(blockDim.x) - 1) / int(blockDim.x);
  const int lo = min(n, int(threadIdx.x) * ch), hi = min(n, lo + ch);
  // The top candidate's logit not finite: no token (kSampleNoFinite); uniform over the block.
  if (!isfinite(key_logit(~uint32_t(kr[0])))) {
    if (threadIdx.x == 0) write_no_finite(out, row);
    return;
  }
  const double T = double(p.temperature);
  const double top = __ddiv_rn(double(key_logit(~uint32_t(kr[0]))), T);
  double loc = 0, tot = 0;
  for (int i = lo; i < hi; ++i) {
    const double x = exp(__dsub_rn(__ddiv_rn(double(key_logit(~uint32_t(kr[i]))), T), top));
    er[i] = x;
    loc = __dadd_rn(loc, x);
  }
  block_exclusive_scan(loc, dsh, &tot);
  const double S = tot;  // prob[i] = er[i] / S, recomputed (identically) where needed
  int n1 = n;
  if (p.top_p < 1.0f) {
    const double tp = double(p.top_p);
    loc = 0;
    for (int i = lo; i < hi; ++i) loc = __dadd_rn(loc, __ddiv_rn(er[i], S));
    double cum = block_exclusive_scan(loc, dsh, &tot);
    if (threadIdx.x == 0) s_first = n;
    __syncthreads();
    for (int i = lo; i < hi; ++i) {
      cum = __dadd_rn(cum, __ddiv_rn(er[i], S));
      if (cum >= tp) {
        atomicMin(&s_first, i);
        break;
      }
    }
    __syncthreads();
    n1 = s_first < n ? s_first + 1 : n;
    __syncthreads();
  }
  int n2 = n1;
  if (p.min_p > 0.0f) {
    const double thr = __dmul_rn(double(p.min_p), __ddiv_rn(er[0], S));
    if (threadIdx.x == 0) s_first = n1;
    __syncthreads();
    for (int i = max(lo, 1); i < min(hi, n1); ++i)
      if (!(__ddiv_rn(er[i], S) >= thr)) {
        atomicMin(&s_first, i);
        break;
      }
    __syncthreads();
    n2 = s_first;
    __syncthreads();
  }
  const int hi2 = min(hi, n2);
  loc = 0;
  for (int i = lo; i < hi2; ++i) loc = __dadd_rn(loc, __ddiv_rn(er[i], S));
  block_exclusive_scan(loc, dsh, &tot);
  const double S2 = tot;
  loc = 0;
  for (int i = lo; i < hi2; ++i) {
    const float qi = __double2float_rn(__ddiv_rn(__ddiv_rn(er[i], S), S2));
    loc = __dadd_rn(loc, double(qi));
    write_dist(out, row, n2, i, vr[i], qi);
  }
  double cum = block_exclusive_scan(loc, dsh, &tot);
  int idx = 0;
  if (n2 > 1) {
    const double uu = u[row];
    if (threadIdx.x == 0) s_first = n2 - 1;  // the CPU's fallback: the last token
    __syncthreads();
    for (int i = lo; i < hi2; ++i) {
      cum = __dadd_rn(cum, double(__double2float_rn(__ddiv_rn(__ddiv_rn(er[i], S), S2))));
      if (uu < cum) {
        atomicMin(&s_first, i);
        break;
      }
    }
    __syncthreads();
    idx = s_first;
  }
  if (threadIdx.x == 0) {
    out.token[row] = vr[idx];
    if (out.n) out.n[row] = n2;
  }
}

// ---- the allowed-token mask (fwd_mask_logits) ----

__global__ void k_mask_logits(float* logits, int vocab, const uint32_t* bits, int words) {
  const int64_t row = blockIdx.y;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= vocab) return;
  if (!((bits[row * words + i / 32] >> (i % 32)) & 1u)) logits[row * vocab + i] = -INFINITY;
}

// ---- host side ----

size_t align_up(size_t x) { return (x + 255) & ~size_t(255); }

int row_bits(int rows) {
  int b = 0;
  while (b < 31 && (int64_t(1) << b) < rows) ++b;
  return b;
}

size_t cub_sort_bytes(int rows, int vocab) {
  size_t bytes = 0;
  PLUMB_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const uint64_t*>(nullptr),
                                                   static_cast<uint64_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                   static_cast<int32_t*>(nullptr), int(int64_t(rows) * vocab), 0,
                                                   32 + row_bits(rows)));
  return bytes;
}

bool penalties_on(const SampleParams& p) {
  return p.repeat_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
}

int candidates(const SampleParams& p, int vocab) { return p.top_k > 0 && p.top_k < vocab ? p.top_k : vocab; }

// Scratch layout: [penalized logits] then the chosen path's buffers.
struct Layout {
  size_t pen = 0;  // bytes of the penalized copy (0: none)
  // greedy
  size_t best = 0;
  // top-k
  size_t hist = 0, counts = 0, sel = 0, surv_a = 0, surv_b = 0;
  // sorted
  size_t keys_in = 0, keys_out = 0, vals_in = 0, vals_out = 0, e = 0, temp = 0, temp_bytes = 0;
  size_t total = 0;
};

Layout layout(int rows, int vocab, int path, bool pen) {
  Layout L;
  const size_t R = size_t(rows), V = size_t(vocab);
  size_t off = pen ? align_up(R * V * sizeof(float)) : 0;
  L.pen = off;
  auto take = [&off](size_t bytes) {
    const size_t at = off;
    off += align_up(bytes);
    return at;
  };
  if (path == kSampleGreedy) {
    L.best = take(R * sizeof(unsigned long long));
  } else if (path == kSampleTopK) {
    L.hist = take(R * kBins * sizeof(uint32_t));
    L.counts = take(R * 2 * sizeof(uint32_t));
    L.sel = take(R * kMaxK * sizeof(uint64_t));
    L.surv_a = take(R * V * sizeof(uint64_t));
    L.surv_b = take(R * V * sizeof(uint64_t));
  } else {
    L.keys_in = take(R * V * sizeof(uint64_t));
    L.keys_out = take(R * V * sizeof(uint64_t));
    L.vals_in = take(R * V * sizeof(int32_t));
    L.vals_out = take(R * V * sizeof(int32_t));
    L.e = take(R * V * sizeof(double));
    L.temp_bytes = cub_sort_bytes(rows, vocab);
    L.temp = take(L.temp_bytes);
  }
  L.total = off;
  return L;
}

void check_params(const SampleParams& p) {
  if (!std::isfinite(p.temperature)) throw_arg("sample: temperature must be a number");
  if (p.top_k < 0) throw_arg("sample: top_k must be >= 0");
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) throw_arg("sample: top_p must be in (0, 1]");
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) throw_arg("sample: min_p must be in [0, 1]");
  if (!(p.repeat_penalty > 0.0f)) throw_arg("sample: repeat_penalty must be positive");
}

void check_sizes(int rows, int vocab) {
  if (rows < 1 || rows > 65535) throw_arg("sample: rows must be in [1, 65535]");
  if (vocab < 1) throw_arg("sample: empty vocabulary");
  if (int64_t(rows) * vocab > int64_t(INT32_MAX)) throw_arg("sample: rows * vocab must fit in 31 bits");
}

}  // namespace

int fwd_sample_path(const SampleParams& p, int vocab) {
  if (p.temperature <= 0.0f || p.top_k == 1) return kSampleGreedy;
  return candidates(p, vocab) <= kMaxK ? kSampleTopK : kSampleSorted;
}

size_t fwd_sample_scratch_bytes(int rows, int vocab, const SampleParams* p) {
  check_sizes(rows, vocab);
  if (p) return layout(rows, vocab, fwd_sample_path(*p, vocab), penalties_on(*p)).total;
  size_t m = 0;
  for (int path : {int(kSampleGreedy), int(kSampleTopK), int(kSampleSorted)}) m = std::max(m, layout(rows, vocab, path, true).total);
  return m;
}

void fwd_mask_logits(float* logits, int rows, int vocab, const uint32_t* bits, Stream s) {
  check_sizes(rows, vocab);
  if (!logits || !bits) throw_arg("mask logits: null logits or bits");
  k_mask_logits<<<dim3(unsigned((vocab + 255) / 256), unsigned(rows)), 256, 0, s>>>(logits, vocab, bits, (vocab + 31) / 32);
  check_launch("fwd_mask_logits");
}

void fwd_sample(const float* logits, int rows, int vocab, const SampleParams& p, const int32_t* pen_ids,
                const int32_t* pen_counts, int npen, const double* u, const SampleOut& out, void* scratch,
                size_t scratch_bytes, Stream s) {
  check_sizes(rows, vocab);
  check_params(p);
  const int path = fwd_sample_path(p, vocab);
  const bool pen = penalties_on(p) && npen > 0;
  if (!logits || !out.token) throw_arg("sample: null logits or token output");
  if (path != kSampleGreedy && !u) throw_arg("sample: the draws u are needed unless greedy");
  if (npen < 0 || (npen > 0 && (!pen_ids || !pen_counts))) throw_arg("sample: bad penalty window");
  if (out.cap < 0) throw_arg("sample: negative distribution capacity");
  if (reinterpret_cast<uintptr_t>(scratch) % 16 != 0) throw_arg("sample: scratch must be 16-byte aligned");
  const Layout L = layout(rows, vocab, path, pen);
  if (!scratch || scratch_bytes < L.total) throw_arg("sample: scratch too small");
  auto at = [scratch](size_t off) { return static_cast<unsigned char*>(scratch) + off; };

  const dim3 row_grid(unsigned((vocab + kRowTile - 1) / kRowTile), unsigned(rows));
  const float* src = logits;
  if (pen) {
    float* dst = reinterpret_cast<float*>(at(0));
    k_penalize<<<row_grid, kRowThreads, 0, s>>>(logits, dst, vocab, pen_ids, pen_counts, npen, p.repeat_penalty,
                                                p.presence_penalty, p.frequency_penalty);
    check_launch("fwd_sample penalties");
    src = dst;
  }
  if (path == kSampleGreedy) {
    auto* best = reinterpret_cast<unsigned long long*>(at(L.best));
    PLUMB_CUDA_CHECK(cudaMemsetAsync(best, 0, size_t(rows) * sizeof(unsigned long long), s));
    k_argmax<<<row_grid, kRowThreads, 0, s>>>(src, vocab, best);
    k_greedy_out<<<(rows + 127) / 128, 128, 0, s>>>(rows, best, out);
    check_launch("fwd_sample greedy");
    return;
  }
  const int K = candidates(p, vocab);
  if (path == kSampleTopK) {
    auto* hist = reinterpret_cast<uint32_t*>(at(L.hist));
    auto* counts = reinterpret_cast<uint32_t*>(at(L.counts));
    auto* sel = reinterpret_cast<uint64_t*>(at(L.sel));
    auto* sa = reinterpret_cast<uint64_t*>(at(L.surv_a));
    auto* sb = reinterpret_cast<uint64_t*>(at(L.surv_b));
    PLUMB_CUDA_CHECK(cudaMemsetAsync(hist, 0, L.sel - L.hist, s));  // hist and counts
    k_hist0<<<row_grid, kRowThreads, 0, s>>>(src, vocab, hist);
    k_split0<<<row_grid, kRowThreads, 0, s>>>(src, vocab, K, hist, counts, sel, sa);
    k_topk_final<<<rows, kFinalThreads, 0, s>>>(src, vocab, K, p, u, counts, sel, sa, sb, out);
    check_launch("fwd_sample top-k");
    return;
  }
  auto* kin = reinterpret_cast<uint64_t*>(at(L.keys_in));
  auto* kout = reinterpret_cast<uint64_t*>(at(L.keys_out));
  auto* vin = reinterpret_cast<int32_t*>(at(L.vals_in));
  auto* vout = reinterpret_cast<int32_t*>(at(L.vals_out));
  auto* e = reinterpret_cast<double*>(at(L.e));
  k_sort_keys<<<row_grid, kRowThreads, 0, s>>>(src, vocab, kin, vin);
  check_launch("fwd_sample sort keys");
  size_t temp_bytes = L.temp_bytes;
  PLUMB_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(at(L.temp), temp_bytes, kin, kout, vin, vout, rows * vocab, 0,
                                                   32 + row_bits(rows), s));
  k_sorted_final<<<rows, kFinalThreads, 0, s>>>(vocab, K, p, u, kout, vout, e, out);
  check_launch("fwd_sample sorted");
}

}  // namespace plumb::cuda::detail
