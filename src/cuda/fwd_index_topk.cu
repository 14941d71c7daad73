// The lightning indexer's top-k on the GPU: the rank twin (each entry ranked against all others, O(ne^2) per token)
// and the radix select (O(ne) per token; over many blocks per token, or in one block for ne_cap <= 4096) that must
// reproduce it bit for bit (tests/cuda/test_cuda_index_topk.cpp).
//
// Select path. Entry e of token t becomes a key that is larger exactly when e ranks earlier under beats(): the high
// bits are the score's order image with NaN highest, the low ib bits (ib: enough for ne_cap - 1) are
// (2^ib - 1) - e, so equal scores put the lower entry first and keys are unique. Radix select over 11-bit digits
// of the key, most significant first, one launch per digit (a fixed number, from ne_cap): every block counts the
// digits of its tile's keys that still match the prefix found so far, and the last block to finish (an arrival
// counter) picks the bin holding the k-th key and records the longer prefix. A digit pass whose token is already
// decided (the bin holds exactly the keys still missing) returns at once. The k keys at or above the final prefix
// are then gathered (slot order is arbitrary) and ranked among themselves: unique keys, so the ranks are a
// permutation and the output does not depend on the order of the gather's atomics.
#include <algorithm>

#include "cuda/fwd_common.cuh"
#include "cuda/radix_select.cuh"

namespace plumb::cuda::detail {

namespace {

// Rank selection over the ne existing entries: entry e lands at rank #(entries that beat it); the first k ranks are
// the top-k, sorted; the row's slots from k to k_cap are -1.
__global__ void index_topk_kernel(IndexArgs a) {
  pdl_begin();
  const int t = blockIdx.x;
  const float* s = a.scores + int64_t(t) * a.ne_cap;
  const int64_t pos0 = *a.pos, visible = (pos0 + t + 1) / a.rate, ne = (pos0 + a.n) / a.rate;
  const int64_t k = min(int64_t(a.topk), ne);
  int64_t* out = a.sel + int64_t(t) * a.k_cap;
  for (int64_t e = threadIdx.x; e < ne; e += blockDim.x) {
    const float v = s[e];
    int64_t rank = 0;
    for (int64_t o = 0; o < ne && rank < k; ++o) rank += beats(s[o], o, v, e);
    if (rank < k) out[rank] = e < visible ? e : -1;
  }
  for (int64_t j = k + threadIdx.x; j < a.k_cap; j += blockDim.x) out[j] = -1;
}

constexpr int kSelThreads = 256, kSelPer = 8, kSelTile = kSelThreads * kSelPer;  // entries per block and pass
constexpr int kSelBits = 11, kSelBins = 1 << kSelBits;
constexpr int kRankThreads = 256, kRankSplit = 8, kRankPerBlock = kRankThreads / kRankSplit;
constexpr int kRankChunk = 2048;  // candidates staged in shared memory at a time

// Where token t's select stands after a digit pass: the keys whose bits above `shift` exceed `hi` are chosen, k_rem
// more are to come from those equal to it; done: all keys equal to it are chosen too.
struct SelState {
  uint64_t hi;
  uint32_t k_rem;
  int shift, done, pad;
};

// The select path's scratch; hist, arrive, count and state are zeroed before the first pass.
struct SelScratch {
  uint32_t* hist;    // [n, passes, kSelBins]
  uint32_t* arrive;  // [n, passes]: blocks done with the pass
  uint32_t* count;   // [n]: gathered keys
  SelState* state;   // [n]
  uint64_t* cand;    // [n, k_cap]
};

size_t align_up(size_t x) { return (x + 255) & ~size_t(255); }

struct SelLayout {
  size_t hist = 0, arrive = 0, count = 0, state = 0, cand = 0, zeroed = 0, total = 0;
};
SelLayout sel_layout(int n, int passes, int k_cap) {
  SelLayout L;
  size_t off = 0;
  auto take = [&off](size_t bytes) {
    const size_t at = off;
    off += align_up(bytes);
    return at;
  };
  L.hist = take(size_t(n) * passes * kSelBins * 4);
  L.arrive = take(size_t(n) * passes * 4);
  L.count = take(size_t(n) * 4);
  L.state = take(size_t(n) * sizeof(SelState));
  L.zeroed = off;
  L.cand = take(size_t(n) * size_t(k_cap) * 8);
  L.total = off;
  return L;
}

int index_bits(int64_t ne_cap) {  // bits that hold every entry index < ne_cap (at least 1)
  int b = 1;
  while (b < 31 && (int64_t(1) << b) < ne_cap) ++b;
  return b;
}
int sel_passes(int ib) { return (32 + ib + kSelBits - 1) / kSelBits; }

__device__ __forceinline__ uint64_t sel_key(float v, int64_t e, int ib) {
  const uint64_t mask = (uint64_t(1) << ib) - 1;
  return (uint64_t(radix::order_key_nan_first(v)) << ib) | (mask - uint64_t(e));
}

// The device-side sizes every select kernel starts from (the chunk's position is read, not passed: graphs).
struct SelSizes {
  int64_t ne, k;
  __device__ explicit SelSizes(const IndexArgs& a) {
    ne = min((*a.pos + a.n) / a.rate, a.ne_cap);  // (the min only guards the scratch against a bad bound)
    k = min(int64_t(a.topk), ne);
  }
};

// This thread's kSelPer scores of the block's tile: entries e0 + u * kSelThreads (0 from ne on), all loaded before
// any is used. Returns e0.
__device__ __forceinline__ int64_t load_tile(const IndexArgs& a, int t, int64_t ne, float (&v)[kSelPer]) {
  const float* s = a.scores + int64_t(t) * a.ne_cap;
  const int64_t e0 = int64_t(blockIdx.x) * kSelTile + threadIdx.x;
#pragma unroll
  for (int u = 0; u < kSelPer; ++u) v[u] = e0 + u * kSelThreads < ne ? s[e0 + u * kSelThreads] : 0.0f;
  return e0;
}

// Digit pass `pass` over block (tile, token); the last block of the token to finish advances its state.
__global__ void __launch_bounds__(kSelThreads) sel_hist_kernel(IndexArgs a, SelScratch w, int pass, int ib, int passes) {
  pdl_begin();
  __shared__ uint32_t h[kSelBins];
  __shared__ uint32_t scan_sh[32];
  __shared__ int bin, last;
  __shared__ uint32_t above;
  const int t = blockIdx.y, lane = threadIdx.x & 31;
  const SelSizes z(a);
  if (z.k <= 0) return;
  uint64_t hi = 0;
  uint32_t k_rem = uint32_t(z.k);
  if (pass > 0) {  // uniform over the token's blocks: all of them skip, or all arrive
    const SelState st = w.state[t];
    if (st.done) return;
    hi = st.hi, k_rem = st.k_rem;
  }
  const int top = 32 + ib - pass * kSelBits, width = min(kSelBits, top), shift = top - width;
  const uint32_t dmask = (1u << width) - 1u;
  for (int i = threadIdx.x; i < kSelBins; i += blockDim.x) h[i] = 0;
  __syncthreads();
  float v[kSelPer];
  const int64_t e0 = load_tile(a, t, z.ne, v);
#pragma unroll
  for (int u = 0; u < kSelPer; ++u) {
    const int64_t e = e0 + u * kSelThreads;
    int d = -1;
    if (e < z.ne) {
      const uint64_t key = sel_key(v[u], e, ib);
      if ((key >> top) == hi) d = int((key >> shift) & dmask);
    }
    // Lanes with the same digit add once: exact ties (ReLU zeros) would otherwise serialize on one counter.
    const unsigned peers = __match_any_sync(radix::kFull, d);
    if (d >= 0 && lane == __ffs(int(peers)) - 1) atomicAdd(&h[d], uint32_t(__popc(peers)));
  }
  __syncthreads();
  uint32_t* gh = w.hist + (int64_t(t) * passes + pass) * kSelBins;
  for (int i = threadIdx.x; i <= int(dmask); i += blockDim.x)
    if (h[i]) atomicAdd(&gh[i], h[i]);
  __threadfence();  // this block's counts are visible before its arrival is
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&w.arrive[t * passes + pass], 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int i = threadIdx.x; i <= int(dmask); i += blockDim.x) h[i] = __ldcg(&gh[i]);
  if (threadIdx.x == 0) bin = -1, above = 0;
  __syncthreads();
  radix::find_boundary(h, int(dmask) + 1, k_rem, &bin, &above, scan_sh);
  if (threadIdx.x == 0) {
    SelState st{};
    st.hi = (hi << width) | uint64_t(bin);
    st.k_rem = k_rem - above;
    st.shift = shift;
    st.done = h[bin] == st.k_rem || shift == 0;
    w.state[t] = st;
  }
}

// The k keys at or above the final prefix, appended in any order.
__global__ void __launch_bounds__(kSelThreads) sel_gather_kernel(IndexArgs a, SelScratch w, int ib) {
  pdl_begin();
  const int t = blockIdx.y;
  const SelSizes z(a);
  if (z.k <= 0) return;
  const SelState st = w.state[t];
  float v[kSelPer];
  const int64_t e0 = load_tile(a, t, z.ne, v);
#pragma unroll
  for (int u = 0; u < kSelPer; ++u) {
    const int64_t e = e0 + u * kSelThreads;
    const uint64_t key = e < z.ne ? sel_key(v[u], e, ib) : 0;
    radix::warp_append(e < z.ne && (key >> st.shift) >= st.hi, &w.count[t], w.cand + int64_t(t) * a.k_cap, key);
  }
}

// Candidate j of token t is ranked by kRankSplit threads (each counts the larger keys among every kRankSplit-th
// candidate, then a shuffle sum: a short serial loop even at k = 2048) and its entry written at that rank, -1 when
// the token does not see it yet (unique keys: the ranks are a permutation of 0..k-1); slots [k, k_cap) get -1.
__global__ void __launch_bounds__(kRankThreads) sel_rank_kernel(IndexArgs a, SelScratch w, int ib) {
  pdl_begin();
  __shared__ uint64_t ks[kRankChunk];
  const int t = blockIdx.y, sub = threadIdx.x % kRankSplit;
  const int64_t j = int64_t(blockIdx.x) * kRankPerBlock + threadIdx.x / kRankSplit;
  const SelSizes z(a);
  const int64_t visible = (*a.pos + t + 1) / a.rate;
  const uint64_t* c = w.cand + int64_t(t) * a.k_cap;
  const uint64_t mine = j < z.k ? c[j] : 0;
  uint32_t rank = 0;
  for (int64_t c0 = 0; c0 < z.k; c0 += kRankChunk) {
    const int m = int(min(int64_t(kRankChunk), z.k - c0));
    __syncthreads();  // the previous chunk has been read
    for (int i = threadIdx.x; i < m; i += kRankThreads) ks[i] = c[c0 + i];
    __syncthreads();
#pragma unroll 8
    for (int i = sub; i < m; i += kRankSplit) rank += ks[i] > mine;
  }
  for (int o = kRankSplit / 2; o > 0; o >>= 1) rank += __shfl_xor_sync(radix::kFull, rank, o);
  if (sub != 0) return;
  int64_t* out = a.sel + int64_t(t) * a.k_cap;
  const uint64_t imask = (uint64_t(1) << ib) - 1;
  if (j < z.k) {
    const int64_t e = int64_t(imask - (mine & imask));
    out[rank] = e < visible ? e : -1;
  } else if (j < a.k_cap) {
    out[j] = -1;
  }
}

// Block path (ne_cap <= kBlockMaxNe): one block per token runs the same digit passes over its keys held in shared
// memory (no arrival counters, one launch), compacts the k chosen keys to the front and sorts them.
constexpr int kBlockThreads = 1024, kBlockMaxNe = int(kIndexTopkBlockMaxNe), kBlockPer = kBlockMaxNe / kBlockThreads;

__global__ void __launch_bounds__(kBlockThreads) block_select_kernel(IndexArgs a, int ib, int passes) {
  pdl_begin();
  __shared__ uint64_t ks[kBlockMaxNe];
  __shared__ uint32_t h[kSelBins];
  __shared__ uint32_t scan_sh[32];
  __shared__ int bin;
  __shared__ uint32_t above;
  const int t = blockIdx.x, lane = threadIdx.x & 31;
  const SelSizes z(a);
  const int ne = int(z.ne), k = int(z.k);
  int64_t* out = a.sel + int64_t(t) * a.k_cap;
  for (int j = max(k, 0) + int(threadIdx.x); j < a.k_cap; j += blockDim.x) out[j] = -1;
  if (k <= 0) return;
  const float* s = a.scores + int64_t(t) * a.ne_cap;
  for (int e = threadIdx.x; e < ne; e += blockDim.x) ks[e] = sel_key(s[e], e, ib);
  uint64_t hi = 0;
  uint32_t k_rem = uint32_t(k);
  int shift = 0;
  bool done = false;  // the same in every thread: all read the same shared values
  for (int pass = 0; pass < passes && !done; ++pass) {
    const int top = 32 + ib - pass * kSelBits, width = min(kSelBits, top);
    shift = top - width;
    const uint32_t dmask = (1u << width) - 1u;
    for (int i = threadIdx.x; i <= int(dmask); i += blockDim.x) h[i] = 0;
    if (threadIdx.x == 0) bin = -1, above = 0;
    __syncthreads();  // (the first time: the keys are stored)
    for (int e0 = 0; e0 < ne; e0 += blockDim.x) {  // a uniform trip count: __match_any_sync needs every lane
      const int e = e0 + int(threadIdx.x);
      int d = -1;
      if (e < ne) {
        const uint64_t key = ks[e];
        if ((key >> top) == hi) d = int((key >> shift) & dmask);
      }
      const unsigned peers = __match_any_sync(radix::kFull, d);
      if (d >= 0 && lane == __ffs(int(peers)) - 1) atomicAdd(&h[d], uint32_t(__popc(peers)));
    }
    __syncthreads();
    radix::find_boundary(h, int(dmask) + 1, k_rem, &bin, &above, scan_sh);
    hi = (hi << width) | uint64_t(bin);
    k_rem -= above;
    done = h[bin] == k_rem || shift == 0;
    __syncthreads();  // every thread has read h[bin] before the next pass clears h
  }
  // The k keys whose bits above `shift` reach hi, compacted to ks[0..k): each thread's into registers, a scan for
  // the offsets (its barriers also order every read before the first write), then written back.
  uint64_t v[kBlockPer];
  uint32_t mine = 0;
#pragma unroll
  for (int u = 0; u < kBlockPer; ++u) {
    const int e = int(threadIdx.x) + u * kBlockThreads;
    v[u] = e < ne ? ks[e] : 0;
    mine += e < ne && (v[u] >> shift) >= hi;
  }
  uint32_t total;
  uint32_t o = radix::block_exclusive_scan(mine, scan_sh, &total);
#pragma unroll
  for (int u = 0; u < kBlockPer; ++u)
    if (int(threadIdx.x) + u * kBlockThreads < ne && (v[u] >> shift) >= hi) ks[o++] = v[u];
  int P = 1;
  while (P < k) P <<= 1;
  for (int i = k + int(threadIdx.x); i < P; i += blockDim.x) ks[i] = 0;  // below every key (order images > 0)
  radix::bitonic_sort_desc(ks, P);
  const int64_t visible = (*a.pos + t + 1) / a.rate;
  const uint64_t imask = (uint64_t(1) << ib) - 1;
  for (int j = threadIdx.x; j < k; j += blockDim.x) {
    const int64_t e = int64_t(imask - (ks[j] & imask));
    out[j] = e < visible ? e : -1;
  }
}

}  // namespace

// The block path up to kBlockMaxNe entries (one launch instead of 5-7 and a memset), the select path above: the
// same indices (IndexTopkPathsMatchRankTwinAndHost, IndexTopkReplaysAsGraph). H200, IndexTopkTiming, top-512,
// batch 1 / 8: 64 entries 7.2 / 7.6 us vs select 15.8 / 16.1; 1024: 17.3 / 17.4 vs 31.9 / 33.4; 4096: 16.6 / 16.6
// vs 26.2 / 28.5 (top-2048: 37.4 / 37.5 vs 40.4 / 51.0).
int fwd_index_topk_path(int64_t ne_cap) { return ne_cap <= kBlockMaxNe ? kIndexTopkBlock : kIndexTopkSelect; }

size_t fwd_index_topk_scratch_bytes(int n, int64_t ne_cap, int k_cap, int path) {
  if (path != kIndexTopkSelect || n <= 0 || ne_cap <= 0 || k_cap <= 0) return 0;
  return sel_layout(n, sel_passes(index_bits(ne_cap)), k_cap).total;
}

void fwd_index_topk(const IndexArgs& a, int path, Stream s) {
  if (a.n <= 0 || a.ne_cap <= 0 || a.k_cap <= 0) return;
  if (int64_t(a.k_cap) < std::min<int64_t>(a.topk, a.ne_cap)) throw_arg("indexer: k_cap below min(topk, ne_cap)");
  if (path == kIndexTopkRank) {
    launch("fwd_indexer_topk", index_topk_kernel, a.n, 256, 0, s, a);
    return;
  }
  if (a.ne_cap > (int64_t(1) << 31)) throw_arg("indexer: more than 2^31 entries");
  const int ib = index_bits(a.ne_cap), passes = sel_passes(ib);
  if (path == kIndexTopkBlock) {
    if (a.ne_cap > kBlockMaxNe) throw_arg("indexer: too many entries for the one-block top-k");
    launch("fwd_indexer_topk block", block_select_kernel, a.n, kBlockThreads, 0, s, a, ib, passes);
    return;
  }
  if (path != kIndexTopkSelect) throw_arg("indexer: unknown top-k path");
  const SelLayout L = sel_layout(a.n, passes, a.k_cap);
  if (!a.topk_scratch || a.topk_scratch_bytes < L.total) throw_arg("indexer: top-k scratch too small");
  unsigned char* base = static_cast<unsigned char*>(a.topk_scratch);
  SelScratch w;
  w.hist = reinterpret_cast<uint32_t*>(base + L.hist);
  w.arrive = reinterpret_cast<uint32_t*>(base + L.arrive);
  w.count = reinterpret_cast<uint32_t*>(base + L.count);
  w.state = reinterpret_cast<SelState*>(base + L.state);
  w.cand = reinterpret_cast<uint64_t*>(base + L.cand);
  PLUMB_CUDA_CHECK(cudaMemsetAsync(base, 0, L.zeroed, stream_of(s)));
  const dim3 grid(unsigned(fwd_blocks(a.ne_cap, kSelTile)), unsigned(a.n));
  for (int p = 0; p < passes; ++p) launch("fwd_indexer_topk select", sel_hist_kernel, grid, kSelThreads, 0, s, a, w, p, ib, passes);
  launch("fwd_indexer_topk gather", sel_gather_kernel, grid, kSelThreads, 0, s, a, w, ib);
  launch("fwd_indexer_topk rank", sel_rank_kernel, dim3(unsigned(fwd_blocks(a.k_cap, kRankPerBlock)), unsigned(a.n)),
         kRankThreads, 0, s, a, w, ib);
}

}  // namespace plumb::cuda::detail
