// Device pieces of the radix selects (the GPU sampler's top-k, the lightning indexer's top-k): order-preserving
// float keys, the block-wide steps that find the histogram bin holding the k-th largest key, the sort of the winners.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace plumb::cuda::detail::radix {

constexpr unsigned kFull = 0xFFFFFFFFu;

// Order-preserving image of a non-NaN float: a > b iff bits(a) > bits(b); -0 and +0 both map to +0's image. The
// images lie in [0x007FFFFF (-inf), 0xFF800000 (+inf)], so 0 and 0xFFFFFFFF are free for NaN, whichever end a
// caller's order puts it at.
__device__ __forceinline__ uint32_t order_bits(float v) {
  uint32_t b = __float_as_uint(v);
  if (b == 0x80000000u) b = 0u;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
// The sampler's order: NaN lowest (key 0).
__device__ __forceinline__ uint32_t order_key(float v) { return isnan(v) ? 0u : order_bits(v); }
// The indexer's order (beats() in fwd_common.cuh): NaN highest.
__device__ __forceinline__ uint32_t order_key_nan_first(float v) { return isnan(v) ? 0xFFFFFFFFu : order_bits(v); }

// Exclusive prefix sum over the block in thread order; *total gets the block's sum. `sh` holds 32 values.
// Deterministic (a fixed order of additions), also for doubles. blockDim.x a multiple of 32.
template <class T>
__device__ T block_exclusive_scan(T v, T* sh, T* total) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  T inc = v;
  for (int o = 1; o < 32; o <<= 1) {
    const T t = __shfl_up_sync(kFull, inc, o);
    if (lane >= o) inc += t;
  }
  T ex = __shfl_up_sync(kFull, inc, 1);
  if (lane == 0) ex = T(0);
  __syncthreads();  // sh may still be read by a previous call
  if (lane == 31) sh[wid] = inc;
  __syncthreads();
  if (wid == 0) {
    T w = lane < nw ? sh[lane] : T(0);
    for (int o = 1; o < 32; o <<= 1) {
      const T t = __shfl_up_sync(kFull, w, o);
      if (lane >= o) w += t;
    }
    if (lane < nw) sh[lane] = w;
  }
  __syncthreads();
  *total = sh[nw - 1];
  return (wid > 0 ? sh[wid - 1] : T(0)) + ex;
}

// The bin that holds the k-th largest element of a histogram (h[b] counts digit b; larger digits rank first):
// the largest b with sum_{c >= b} h[c] >= k. *bin = b, *above = sum_{c > b} h[c]. Needs 1 <= k <= sum h.
// Ends with __syncthreads(): every thread may read *bin and *above.
__device__ inline void find_boundary(const uint32_t* h, int nbins, uint32_t k, int* bin, uint32_t* above, uint32_t* scan_sh) {
  const int per = (nbins + int(blockDim.x) - 1) / int(blockDim.x);
  const int j0 = min(nbins, int(threadIdx.x) * per), j1 = min(nbins, j0 + per);  // j counts bins from the top
  uint32_t local = 0;
  for (int j = j0; j < j1; ++j) local += h[nbins - 1 - j];
  uint32_t total;
  const uint32_t ex = block_exclusive_scan(local, scan_sh, &total);
  if (ex < k && ex + local >= k) {  // exactly one thread
    uint32_t acc = ex;
    for (int j = j0; j < j1; ++j) {
      const uint32_t c = h[nbins - 1 - j];
      if (acc + c >= k) {
        *bin = nbins - 1 - j;
        *above = acc;
        break;
      }
      acc += c;
    }
  }
  __syncthreads();
}

// Appends v to buf at a slot taken from *counter when pred holds. Every lane of the warp must call it.
__device__ __forceinline__ void warp_append(bool pred, uint32_t* counter, uint64_t* buf, uint64_t v) {
  const unsigned mask = __ballot_sync(kFull, pred);
  if (mask == 0u) return;
  const int lane = threadIdx.x & 31, leader = __ffs(int(mask)) - 1;
  uint32_t pos = 0;
  if (lane == leader) pos = atomicAdd(counter, uint32_t(__popc(mask)));
  pos = __shfl_sync(kFull, pos, leader);
  if (pred) buf[pos + uint32_t(__popc(mask & ((1u << lane) - 1u)))] = v;
}

// Sorts a[0..P) (P a power of two) into descending order. Starts and ends with all threads synchronized.
__device__ inline void bitonic_sort_desc(uint64_t* a, int P) {
  __syncthreads();
  for (int k = 2; k <= P; k <<= 1)
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < P; i += blockDim.x) {
        const int l = i ^ j;
        if (l > i) {
          const uint64_t x = a[i], y = a[l];
          if ((i & k) == 0 ? (x < y) : (x > y)) a[i] = y, a[l] = x;
        }
      }
      __syncthreads();
    }
}

}  // namespace plumb::cuda::detail::radix
