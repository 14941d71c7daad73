// The lightning indexer on the GPU: its scores (fp64 dots, twin of src/model/indexer.cpp) and its top-k (the rank
// twin, O(ne^2) per token, and the radix selects, O(ne), that reproduce it bit for bit), as two launches or, for
// short contexts, one (tests/cuda/test_cuda_index_topk.cpp).
//
// Scores. s[t, e] = sum over heads h, in head order, of relu(q[t,h] . k[e]) * qscale * (hw[t,h] * wscale) (official:
// the bf16 roundings), each dot in fp64 in dim order (float products are exact in fp64, so fused or not, the same
// bits). Every path computes its (entry, head) terms with index_terms and an entry's sum with index_entry_score.
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
#include <cooperative_groups.h>

#include <algorithm>

#include "cuda/official.cuh"
#include "cuda/radix_select.cuh"

namespace plumb::cuda::detail {

namespace {

// The smallest power of two >= v (1 for v <= 1): the top-k paths' sort sizes, the fused kernel's score buffer.
__host__ __device__ __forceinline__ int pow2_ceil(int v) {
  int P = 1;
  while (P < v) P <<= 1;
  return P;
}

// ---- Scores: the pieces every path shares ----

// Copies a [rows, cols] float array (row strides src_ld, dst_ld) into shared memory with cp.async: 16 bytes per
// copy where the columns, both strides and both bases allow it, 4 bytes otherwise. The copies hold no registers, so
// every copy of a staging is in flight before its one wait (stage_wait); a thread's next (row, column) comes by
// increments. (The general three-segment loop this replaced, a select chain and an integer division per value, was
// ~75 % of the fused kernel's executed instructions at 65 entries: ncu, session 9.)
template <int W>
__device__ __forceinline__ void stage_rows_w(float* dst, int dst_ld, const float* src, int64_t src_ld, int rows, int cols) {
  const int units = cols / W, T = int(blockDim.x);
  int r = int(threadIdx.x) / units, c = int(threadIdx.x) - r * units;
  const int dr = T / units, dc = T - dr * units;
  const uint32_t d0 = smem_u32(dst);
  while (r < rows) {
    const float* g = src + int64_t(r) * src_ld + c * W;
    const uint32_t d = d0 + uint32_t(r * dst_ld + c * W) * 4u;
    if constexpr (W == 4) {
      cp16(d, g);
    } else {
      cp4(d, g);
    }
    c += dc, r += dr;
    if (c >= units) c -= units, ++r;
  }
}
__device__ __forceinline__ void stage_rows(float* dst, int dst_ld, const float* src, int64_t src_ld, int rows, int cols) {
  if (rows <= 0 || cols <= 0) return;
  const bool v4 = ((cols | dst_ld | int(src_ld)) & 3) == 0 &&
                  ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0;
  if (v4) {
    stage_rows_w<4>(dst, dst_ld, src, src_ld, rows, cols);
  } else {
    stage_rows_w<1>(dst, dst_ld, src, src_ld, rows, cols);
  }
}
// Waits for this thread's copies, then for the block's.
__device__ __forceinline__ void stage_wait() {
  cp_commit();
  cp_wait<0>();
  __syncthreads();
}

// Row stride of the staged queries. Float4 reads (vec, dh % 4 == 0): dh + 4 keeps the rows 16-byte aligned and puts
// the 8 lanes of a quarter warp, each on its own head, in 8 different bank groups (conflict-free 16-byte reads);
// scalar reads: dh + 1, the lanes' heads in different banks (and 3 floats fewer per head: the split kernel's blocks
// then fit 6 to an SM at 4 entries).
__host__ __device__ __forceinline__ bool index_vec(int dh, bool want) { return want && dh % 4 == 0; }
__host__ __device__ __forceinline__ int index_ldq(int dh, bool vec) { return index_vec(dh, vec) ? dh + 4 : dh + 1; }
// Row stride of the staged head terms, in doubles: odd, so the threads summing different entries spread over banks.
__host__ __device__ __forceinline__ int index_ldv(int nh) { return nh + 1; }

// The (entry, head) term from the fp64 dot of the head's query and the entry's key: relu, the scales (official:
// bf16 einsum, relu, bf16 product with the scaled, bf16 weight).
__device__ __forceinline__ double index_term(const IndexArgs& a, double dot, float hw) {
  if (a.official) return bf16r(__fmul_rn(fmaxf(bf16r(float(dot)), 0.0f), hw));
  return fmax(dot, 0.0) * double(a.qscale) * double(__fmul_rn(hw, a.wscale));
}

// The terms of the block's entries [0, ns) into vals[e * ldv + h]. An item is (head h, E consecutive entries): its
// E dots run interleaved over the dims, each still an fp64 sum in dim order of exact products (float x float fits a
// double), so the bits are those of one dot at a time. The head's query is read once per dim for its E entries
// (float4 reads where the rows allow, vec); the keys are staged as doubles (no conversion per product) and a warp's
// lanes, consecutive heads of one group, read the same key words (broadcasts).
template <int E>
__device__ __forceinline__ void index_terms(const IndexArgs& a, const float* qs, int ldq, const double* kd, const float* hw,
                                            int ns, bool vec, double* vals, int ldv) {
  const int nh = a.nh, dh = int(a.dh), ng = (ns + E - 1) / E;
  for (int p = int(threadIdx.x); p < ng * nh; p += int(blockDim.x)) {
    const int g = p / nh, h = p - g * nh;
    const float* qh = qs + h * ldq;
    const double* kr[E];
    double dot[E];
#pragma unroll
    for (int j = 0; j < E; ++j) kr[j] = kd + min(g * E + j, ns - 1) * dh, dot[j] = 0;  // a short group repeats its last entry
    if (vec) {
#pragma unroll 2
      for (int b = 0; b < dh / 4; ++b) {
        const float4 x = reinterpret_cast<const float4*>(qh)[b];
        const double q0 = x.x, q1 = x.y, q2 = x.z, q3 = x.w;
#pragma unroll
        for (int j = 0; j < E; ++j) {
          const double2 k01 = reinterpret_cast<const double2*>(kr[j])[2 * b], k23 = reinterpret_cast<const double2*>(kr[j])[2 * b + 1];
          dot[j] += q0 * k01.x;
          dot[j] += q1 * k01.y;
          dot[j] += q2 * k23.x;
          dot[j] += q3 * k23.y;
        }
      }
    } else {
#pragma unroll 4
      for (int d = 0; d < dh; ++d) {
        const double q = qh[d];
#pragma unroll
        for (int j = 0; j < E; ++j) dot[j] += q * kr[j][d];
      }
    }
    const float w = hw[h];
#pragma unroll
    for (int j = 0; j < E; ++j)
      if (g * E + j < ns) vals[(g * E + j) * ldv + h] = index_term(a, dot[j], w);
  }
}

// An entry's score from its nh head terms (v[h]), summed in head order.
__device__ __forceinline__ float index_entry_score(const IndexArgs& a, const double* v) {
  double acc = 0;
#pragma unroll 8
  for (int h = 0; h < a.nh; ++h) acc += v[h];
  return a.official ? bf16r(float(acc)) : float(acc);
}

// Token t's position, keys and entry count (ne: the entries its top-k ranks). A session's chunk: token t at *a.pos + t,
// the keys a.keys, ne the entries at the chunk's end (a token's later ones score -inf and land as -1); forward_batch's
// rows (a.keys_rows): each token its own session's, at a.pos[t], ne its own visible entries.
__device__ __forceinline__ int64_t index_pos(const IndexArgs& a, int t) { return a.keys_rows ? a.pos[t] : *a.pos + t; }
__device__ __forceinline__ const float* index_keys(const IndexArgs& a, int t) { return a.keys_rows ? a.keys_rows[t] : a.keys; }
__device__ __forceinline__ int64_t index_visible(const IndexArgs& a, int t) { return (index_pos(a, t) + 1) / a.rate; }
__device__ __forceinline__ int64_t index_ne(const IndexArgs& a, int t) {
  return a.keys_rows ? index_visible(a, t) : (*a.pos + a.n) / a.rate;
}

// Shared memory of a scores block holding eb entries: the head terms [eb, ldv] (doubles), then (16-byte aligned)
// the token's queries [nh, ldq], its head weights [nh] (floats) and the entries' keys [eb, dh] (doubles). `extra`
// bytes before it all (the fused kernel's keys).
struct ScoresSmem {
  size_t vals, qs, hw, ks, total;
  bool vec;
  __host__ __device__ static size_t up16(size_t x) { return (x + 15) & ~size_t(15); }
  __host__ __device__ ScoresSmem(int eb, int nh, int dh, size_t extra) : vec(index_vec(dh, true)) {
    vals = up16(extra);
    qs = up16(vals + size_t(eb) * size_t(index_ldv(nh)) * 8);
    hw = qs + size_t(nh) * size_t(index_ldq(dh, vec)) * 4;
    ks = up16(hw + size_t(nh) * 4);
    total = ks + size_t(eb) * size_t(dh) * 8;
  }
};

// The block's keys, count floats from src, into dst as doubles: B loads per thread in flight, then their stores.
template <int B>
__device__ __forceinline__ void stage_keys_f64(double* dst, const float* src, int count) {
  const int T = int(blockDim.x);
  for (int i0 = int(threadIdx.x); i0 < count; i0 += B * T) {
    float v[B];
#pragma unroll
    for (int u = 0; u < B; ++u) v[u] = i0 + u * T < count ? src[i0 + u * T] : 0.0f;
#pragma unroll
    for (int u = 0; u < B; ++u)
      if (i0 + u * T < count) dst[i0 + u * T] = v[u];
  }
}

// The scores of token t for entries [e0, e0 + nb) into emit(el, score) (-inf for the entries t does not see yet):
// the block stages, computes the terms (index_terms<E>), then a thread per entry sums them. Keys are staged for
// every entry below ne_cap (the buffer holds ne_cap rows; those not yet written are read and not used), so no load
// waits for the position; with keys_rows only the token's visible ones (its session's buffer may hold fewer). Ends
// with the block synchronized after the terms.
template <int E, class Emit>
__device__ __forceinline__ void index_scores_block(const IndexArgs& a, unsigned char* smem, const ScoresSmem& L, int t, int64_t e0,
                                                   int nb, int64_t visible, Emit emit) {
  const int nh = a.nh, dh = int(a.dh), ldq = index_ldq(dh, L.vec), ldv = index_ldv(nh);
  double* vals = reinterpret_cast<double*>(smem + L.vals);
  float* qs = reinterpret_cast<float*>(smem + L.qs);
  float* hws = reinterpret_cast<float*>(smem + L.hw);
  double* ks = reinterpret_cast<double*>(smem + L.ks);
  stage_rows(qs, ldq, a.q + int64_t(t) * nh * dh, dh, nh, dh);  // in flight while the keys load
  stage_rows(hws, nh, a.hw + int64_t(t) * nh, nh, 1, nh);
  const int ns = int(max(int64_t(0), min(int64_t(nb), visible - e0)));  // entries with a score
  // (rows: only the visible keys, the session's buffer may end before ne_cap; the values used are the same)
  stage_keys_f64<8>(ks, index_keys(a, t) + e0 * dh, (a.keys_rows ? ns : max(nb, 0)) * dh);
  stage_wait();
  index_terms<E>(a, qs, ldq, ks, hws, ns, L.vec, vals, ldv);
  __syncthreads();
  for (int el = threadIdx.x; el < nb; el += blockDim.x) emit(el, el < ns ? index_entry_score(a, vals + el * ldv) : -INFINITY);
}

// Split path, scores: a block (group of eb entries, token) runs index_scores_block, the fused path's terms and sums,
// so the two paths give the same bits: 4 entries per block, one per item (a thread per (entry, head): parallelism),
// or 16 per block, 4 per item (the token's queries staged once per 16 entries, each query read serving 4 entries).
constexpr int kScoresThreads = 256;
constexpr size_t kScoresMaxSmem = 160 * 1024;
template <int E>
__global__ void __launch_bounds__(kScoresThreads) index_scores_kernel(IndexArgs a, int eb) {
  pdl_begin();
  extern __shared__ __align__(16) unsigned char smem[];
  const int t = int(blockIdx.y);
  const int64_t e0 = int64_t(blockIdx.x) * eb, visible = index_visible(a, t);
  const ScoresSmem L(eb, a.nh, int(a.dh), 0);
  float* sc = a.scores + int64_t(t) * a.ne_cap + e0;
  index_scores_block<E>(a, smem, L, t, e0, int(min(int64_t(eb), a.ne_cap - e0)), visible, [&](int el, float v) { sc[el] = v; });
}

// indexer.tc_scores (a patch, its own tolerance): the scores on the f16 tensor cores. Block (token t, kTcEntries
// entries), warp w: heads [16w, 16w + 16) against every 8-entry tile of the block. The block's visible keys are
// copied once into shared memory (cp.async, rows padded by 8 floats so that the fragments' 8-byte reads are free
// of bank conflicts) while each warp loads its heads' query fragments (converted to f16, kept in registers); per
// tile the keys are converted to f16 as the fragments are read, mma.m16n8k16 accumulates each (head, entry) dot in
// fp32, then relu and the scales per (head, entry) in fp32, the warp's 16 heads summed in a shuffle tree and the
// warps' sums in warp order. Not the exact path's bits: f16 inputs (2^-11 relative each) and fp32 sums. STEPS =
// dh / 16 is a template parameter (the loops unroll). Needs nh <= 128, dh % 16 == 0, dh <= 256
// (fwd_indexer_tc_fits).
constexpr int kTcEntries = 64, kTcMaxWarps = 8, kTcMaxSteps = 16;
__host__ __device__ constexpr int tc_ldk(int dh) { return dh + 8; }
template <int STEPS>
__global__ void __launch_bounds__(kTcMaxWarps * 32) index_tc_scores_kernel(IndexArgs a) {
  pdl_begin();
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float part[kTcMaxWarps][kTcEntries];
  float* ks = reinterpret_cast<float*>(smem);  // [kTcEntries][tc_ldk(dh)]
  constexpr int dh = 16 * STEPS, ldk = tc_ldk(dh);
  const int t = int(blockIdx.y), warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31), g = lane >> 2, tq = lane & 3;
  const int nw = int(blockDim.x >> 5), h = 16 * warp + g;
  const int64_t e0 = int64_t(blockIdx.x) * kTcEntries, visible = min(index_visible(a, t), a.ne_cap);
  const int nv = int(max(min(visible - e0, int64_t(kTcEntries)), int64_t(0)));  // visible entries of the block
  stage_rows(ks, ldk, index_keys(a, t) + e0 * dh, dh, nv, dh);
  // Rows h and h + 8 of the A fragments; heads past nh (the last tile of a head count not a multiple of 16) are
  // zero rows with weight 0.
  const bool ha = h < a.nh, hb = h + 8 < a.nh;
  const float* qa = a.q + (int64_t(t) * a.nh + (ha ? h : 0)) * dh + 2 * tq;
  const float* qb = a.q + (int64_t(t) * a.nh + (hb ? h + 8 : 0)) * dh + 2 * tq;
  uint32_t qf[STEPS][4];
#pragma unroll
  for (int s = 0; s < STEPS; ++s) {
    const float2 z = make_float2(0.0f, 0.0f);
    const float2 x0 = ha ? *reinterpret_cast<const float2*>(qa + 16 * s) : z, x1 = hb ? *reinterpret_cast<const float2*>(qb + 16 * s) : z;
    const float2 x2 = ha ? *reinterpret_cast<const float2*>(qa + 16 * s + 8) : z, x3 = hb ? *reinterpret_cast<const float2*>(qb + 16 * s + 8) : z;
    qf[s][0] = f32x2_to_f16x2(x0.x, x0.y), qf[s][1] = f32x2_to_f16x2(x1.x, x1.y);
    qf[s][2] = f32x2_to_f16x2(x2.x, x2.y), qf[s][3] = f32x2_to_f16x2(x3.x, x3.y);
  }
  const float wa = ha ? __fmul_rn(a.hw[int64_t(t) * a.nh + h], a.wscale) : 0.0f;
  const float wb = hb ? __fmul_rn(a.hw[int64_t(t) * a.nh + h + 8], a.wscale) : 0.0f;
  stage_wait();
  const int tiles = (nv + 7) / 8;
  for (int j = 0; j < tiles; ++j) {
    // B column g: entry 8j + g of the block (rows past nv hold stale values: computed, never stored)
    const float* kr = ks + (8 * j + g) * ldk + 2 * tq;
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int s = 0; s < STEPS; ++s) {
      const float2 k0 = *reinterpret_cast<const float2*>(kr + 16 * s), k1 = *reinterpret_cast<const float2*>(kr + 16 * s + 8);
      mma_f16(d, qf[s][0], qf[s][1], qf[s][2], qf[s][3], f32x2_to_f16x2(k0.x, k0.y), f32x2_to_f16x2(k1.x, k1.y));
    }
    // d: (head h, entries 2tq and 2tq + 1), (head h + 8, the same entries)
    float p0 = fmaxf(d[0], 0.0f) * a.qscale * wa + fmaxf(d[2], 0.0f) * a.qscale * wb;
    float p1 = fmaxf(d[1], 0.0f) * a.qscale * wa + fmaxf(d[3], 0.0f) * a.qscale * wb;
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) p0 += __shfl_xor_sync(0xFFFFFFFFu, p0, o), p1 += __shfl_xor_sync(0xFFFFFFFFu, p1, o);
    if (g == 0) part[warp][8 * j + 2 * tq] = p0, part[warp][8 * j + 2 * tq + 1] = p1;
  }
  __syncthreads();
  for (int e = int(threadIdx.x); e < kTcEntries; e += int(blockDim.x)) {
    if (e0 + e >= a.ne_cap) break;
    float sum = 0.0f;
    if (e < nv)
      for (int w = 0; w < nw; ++w) sum += part[w][e];
    a.scores[int64_t(t) * a.ne_cap + e0 + e] = e < nv ? sum : -INFINITY;
  }
}

// The kernel for dh / 16 steps (1 .. kTcMaxSteps).
template <int S = 1>
void launch_tc_scores(const IndexArgs& a, int steps, Stream s) {
  if constexpr (S <= kTcMaxSteps) {
    if (steps != S) return launch_tc_scores<S + 1>(a, steps, s);
    const size_t smem = size_t(kTcEntries) * size_t(tc_ldk(16 * S)) * 4;  // 68 KiB at dh 256
    static bool raised = false;  // per process: the attribute is per kernel
    if (smem > 48 * 1024 && !raised) {
      PLUMB_CUDA_CHECK(cudaFuncSetAttribute(index_tc_scores_kernel<S>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      raised = true;
    }
    launch("fwd_indexer_scores tc", index_tc_scores_kernel<S>, dim3(unsigned(fwd_blocks(a.ne_cap, kTcEntries)), unsigned(a.n)),
           (a.nh + 15) / 16 * 32, smem, s, a);
  }
}

// indexer.dmma_scores (a patch, the reference's tolerance): the exact path's scores with each (head, entry) dot on
// the fp64 tensor cores (mma.m16n8k8 f64: 8 dims per step). Block (token t, kTcEntries entries), warp w: heads
// [16w, 16w + 16) against every 8-entry tile of the block, as the f16 kernel above, but the products stay exact
// (float x float in fp64) and only each dot's fp64 sum order is the tensor core's instead of dim order; the terms
// (index_term: relu, the scales in fp64) and each entry's sum over heads in head order (index_entry_score) are the
// exact path's. So a score equals the exact one or sits an fp64 rounding of its dots away, which moves the float by
// at most an ulp (tests/cuda: IndexerDmmaScoresMatchExact; on the H200 every score came out bit-identical: each
// step's 8 products are summed in k order, which the fragment mapping makes dim order). The query fragments stay in registers (STEPS = dh / 8
// steps of 4 doubles per lane: dh <= 128); the keys are staged as floats (rows padded by 4: conflict-free fragment
// reads) and converted as read; the terms go to shared memory [entry][head] for the head-order sums.
constexpr int kDmmaMaxSteps = 16;
constexpr int kDmmaChains = 4;  // 8-entry tiles per warp at a time (kTcEntries / 8 = 8 tiles divide by it)
__host__ __device__ constexpr int dmma_ldk(int dh) { return dh + 4; }
struct DmmaSmem {
  size_t ks, vals, total;
  __host__ __device__ DmmaSmem(int nh, int dh)
      : ks(0), vals(ScoresSmem::up16(size_t(kTcEntries) * size_t(dmma_ldk(dh)) * 4)),
        total(vals + size_t(kTcEntries) * size_t(index_ldv(nh)) * 8) {}
};
template <int STEPS>
__global__ void __launch_bounds__(kTcMaxWarps * 32) index_dmma_scores_kernel(IndexArgs a) {
  pdl_begin();
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int dh = 8 * STEPS, ldk = dmma_ldk(dh);
  const DmmaSmem L(a.nh, dh);
  float* ks = reinterpret_cast<float*>(smem + L.ks);       // [kTcEntries][ldk]
  double* vals = reinterpret_cast<double*>(smem + L.vals);  // [kTcEntries][ldv]
  const int ldv = index_ldv(a.nh);
  const int t = int(blockIdx.y), warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31), g = lane >> 2, r = lane & 3;
  const int h = 16 * warp + g;
  const int64_t e0 = int64_t(blockIdx.x) * kTcEntries, visible = min(index_visible(a, t), a.ne_cap);
  const int nv = int(max(min(visible - e0, int64_t(kTcEntries)), int64_t(0)));  // visible entries of the block
  stage_rows(ks, ldk, index_keys(a, t) + e0 * dh, dh, nv, dh);
  // A fragments (dmma_m16n8k8, common.cuh): lane (g, r) holds heads h and h + 8 at dims 8s + r and 8s + r + 4.
  // Heads past nh are zero rows (their terms are not stored).
  const bool ha = h < a.nh, hb = h + 8 < a.nh;
  const float* qa = a.q + (int64_t(t) * a.nh + (ha ? h : 0)) * dh + r;
  const float* qb = a.q + (int64_t(t) * a.nh + (hb ? h + 8 : 0)) * dh + r;
  double qf[STEPS][2][2];
#pragma unroll
  for (int s = 0; s < STEPS; ++s) {
    qf[s][0][0] = ha ? double(qa[8 * s]) : 0.0, qf[s][0][1] = hb ? double(qb[8 * s]) : 0.0;
    qf[s][1][0] = ha ? double(qa[8 * s + 4]) : 0.0, qf[s][1][1] = hb ? double(qb[8 * s + 4]) : 0.0;
  }
  const float wa = ha ? a.hw[int64_t(t) * a.nh + h] : 0.0f, wb = hb ? a.hw[int64_t(t) * a.nh + h + 8] : 0.0f;
  stage_wait();
  const int tiles = (nv + 7) / 8;
  // kDmmaChains 8-entry tiles at a time: independent accumulation chains per warp (each dot's steps stay in order).
  // B column g: entry 8j + g of the block (rows past nv, and a group's tiles past the last, hold stale values:
  // computed, their terms never read).
  for (int j = 0; j < tiles; j += kDmmaChains) {
    const float* kr = ks + (8 * j + g) * ldk + r;
    double d[kDmmaChains][4] = {};
#pragma unroll
    for (int s = 0; s < STEPS; ++s) {
#pragma unroll
      for (int u = 0; u < kDmmaChains; ++u) {
        const double kf[2] = {double(kr[u * 8 * ldk + 8 * s]), double(kr[u * 8 * ldk + 8 * s + 4])};
        dmma_m16n8k8(d[u], qf[s], kf);
      }
    }
    // d[u]: (head h, entries 2r and 2r + 1 of tile j + u), (head h + 8, the same entries)
#pragma unroll
    for (int u = 0; u < kDmmaChains; ++u) {
      const int e = 8 * (j + u) + 2 * r;
      if (ha) vals[e * ldv + h] = index_term(a, d[u][0], wa), vals[(e + 1) * ldv + h] = index_term(a, d[u][1], wa);
      if (hb) vals[e * ldv + h + 8] = index_term(a, d[u][2], wb), vals[(e + 1) * ldv + h + 8] = index_term(a, d[u][3], wb);
    }
  }
  __syncthreads();
  for (int e = int(threadIdx.x); e < kTcEntries; e += int(blockDim.x)) {
    if (e0 + e >= a.ne_cap) break;
    a.scores[int64_t(t) * a.ne_cap + e0 + e] = e < nv ? index_entry_score(a, vals + e * ldv) : -INFINITY;
  }
}

// The kernel for dh / 8 steps (1 .. kDmmaMaxSteps).
template <int S = 1>
void launch_dmma_scores(const IndexArgs& a, int steps, Stream s) {
  if constexpr (S <= kDmmaMaxSteps) {
    if (steps != S) return launch_dmma_scores<S + 1>(a, steps, s);
    const size_t smem = DmmaSmem(a.nh, 8 * S).total;  // 66 KiB at 64 heads x 128 dims
    static size_t raised = 48 * 1024;  // per process: the attribute is per kernel
    if (smem > raised) {
      PLUMB_CUDA_CHECK(cudaFuncSetAttribute(index_dmma_scores_kernel<S>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      raised = smem;
    }
    launch("fwd_indexer_scores dmma", index_dmma_scores_kernel<S>, dim3(unsigned(fwd_blocks(a.ne_cap, kTcEntries)), unsigned(a.n)),
           (a.nh + 15) / 16 * 32, smem, s, a);
  }
}

// Rank selection over the ne existing entries: entry e lands at rank #(entries that beat it); the first k ranks are
// the top-k, sorted; the row's slots from k to k_cap are -1.
__global__ void index_topk_kernel(IndexArgs a) {
  pdl_begin();
  const int t = blockIdx.x;
  const float* s = a.scores + int64_t(t) * a.ne_cap;
  const int64_t visible = index_visible(a, t), ne = index_ne(a, t);
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

// Digit `pass` of a key (most significant first): bits [shift, top), below width <= kSelBits, of the 32 + ib.
struct SelDigit {
  int top, width, shift;
  uint32_t mask;
  __device__ SelDigit(int pass, int ib)
      : top(32 + ib - pass * kSelBits), width(min(kSelBits, top)), shift(top - width), mask((1u << width) - 1u) {}
};
// Counts key's digit into the histogram h (this block's shared memory, or another block's of the cluster) when
// `valid` and the key's bits above the digit equal hi. Lanes with the same digit add once: exact ties (ReLU zeros)
// would otherwise serialize on one counter. Every lane of the warp calls it.
__device__ __forceinline__ void count_digit(bool valid, uint64_t key, uint64_t hi, const SelDigit& dg, uint32_t* h) {
  const int d = valid & ((key >> dg.top) == hi) ? int((key >> dg.shift) & dg.mask) : -1;
  const unsigned peers = __match_any_sync(radix::kFull, d);
  if (d >= 0 && int(threadIdx.x & 31) == __ffs(int(peers)) - 1) atomicAdd(&h[d], uint32_t(__popc(peers)));
}
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
  __device__ SelSizes(const IndexArgs& a, int t) {
    ne = min(index_ne(a, t), a.ne_cap);  // (the min only guards the scratch against a bad bound)
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
  const int t = blockIdx.y;
  const SelSizes z(a, t);
  if (z.k <= 0) return;
  uint64_t hi = 0;
  uint32_t k_rem = uint32_t(z.k);
  if (pass > 0) {  // uniform over the token's blocks: all of them skip, or all arrive
    const SelState st = w.state[t];
    if (st.done) return;
    hi = st.hi, k_rem = st.k_rem;
  }
  const SelDigit dg(pass, ib);
  for (int i = threadIdx.x; i < kSelBins; i += blockDim.x) h[i] = 0;
  __syncthreads();
  float v[kSelPer];
  const int64_t e0 = load_tile(a, t, z.ne, v);
#pragma unroll
  for (int u = 0; u < kSelPer; ++u) {
    const int64_t e = e0 + u * kSelThreads;
    count_digit(e < z.ne, e < z.ne ? sel_key(v[u], e, ib) : 0, hi, dg, h);
  }
  __syncthreads();
  uint32_t* gh = w.hist + (int64_t(t) * passes + pass) * kSelBins;
  for (int i = threadIdx.x; i <= int(dg.mask); i += blockDim.x)
    if (h[i]) atomicAdd(&gh[i], h[i]);
  __threadfence();  // this block's counts are visible before its arrival is
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&w.arrive[t * passes + pass], 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int i = threadIdx.x; i <= int(dg.mask); i += blockDim.x) h[i] = __ldcg(&gh[i]);
  if (threadIdx.x == 0) bin = -1, above = 0;
  __syncthreads();
  radix::find_boundary(h, int(dg.mask) + 1, k_rem, &bin, &above, scan_sh);
  if (threadIdx.x == 0) {
    SelState st{};
    st.hi = (hi << dg.width) | uint64_t(bin);
    st.k_rem = k_rem - above;
    st.shift = dg.shift;
    st.done = h[bin] == st.k_rem || dg.shift == 0;
    w.state[t] = st;
  }
}

// The k keys at or above the final prefix, appended in any order.
__global__ void __launch_bounds__(kSelThreads) sel_gather_kernel(IndexArgs a, SelScratch w, int ib) {
  pdl_begin();
  const int t = blockIdx.y;
  const SelSizes z(a, t);
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
  const SelSizes z(a, t);
  const int64_t visible = index_visible(a, t);
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

// The k chosen keys ks[0..k) (room for the power of two >= k) sorted, largest first, and written as entry indices
// (-1 for entries at or past `visible`). Every thread of the block calls it.
__device__ __forceinline__ void sort_and_write(uint64_t* ks, int k, int ib, int64_t visible, int64_t* out) {
  const int P = pow2_ceil(k);
  for (int i = k + int(threadIdx.x); i < P; i += int(blockDim.x)) ks[i] = 0;  // below every key (order images > 0)
  radix::bitonic_sort_desc(ks, P);  // (begins with a barrier: every key and pad is stored)
  const uint64_t imask = (uint64_t(1) << ib) - 1;
  for (int j = threadIdx.x; j < k; j += blockDim.x) {
    const int64_t e = int64_t(imask - (ks[j] & imask));
    out[j] = e < visible ? e : -1;
  }
}

// The top-k of one token from its ne keys ks[0..ne) (shared memory of room for pow2 >= ne, written by any thread
// of the block, or of the cluster, before a barrier): out[j] for j < k, -1 for entries at or past `visible`. When
// k == ne every key is chosen, so the digit passes and the compaction (which would keep them all) are skipped and
// the keys are only sorted: the same output. Needs ne <= kBlockPer * blockDim.x; every thread of the block calls it.
__device__ __forceinline__ void block_topk(uint64_t* ks, int ne, int k, int ib, int passes, int64_t visible, int64_t* out) {
  __shared__ uint32_t h[kSelBins];
  __shared__ uint32_t scan_sh[32];
  __shared__ int bin;
  __shared__ uint32_t above;
  const int T = int(blockDim.x);
  if (k < ne) {  // uniform: k and ne come from the position
    uint64_t hi = 0;
    uint32_t k_rem = uint32_t(k);
    int shift = 0;
    bool done = false;  // the same in every thread: all read the same shared values
    for (int pass = 0; pass < passes && !done; ++pass) {
      const SelDigit dg(pass, ib);
      shift = dg.shift;
      for (int i = threadIdx.x; i <= int(dg.mask); i += T) h[i] = 0;
      if (threadIdx.x == 0) bin = -1, above = 0;
      __syncthreads();  // (the first time: the keys are stored)
      for (int e0 = 0; e0 < ne; e0 += T) {  // a uniform trip count: count_digit needs every lane
        const int e = e0 + int(threadIdx.x);
        count_digit(e < ne, e < ne ? ks[e] : 0, hi, dg, h);
      }
      __syncthreads();
      radix::find_boundary(h, int(dg.mask) + 1, k_rem, &bin, &above, scan_sh);
      hi = (hi << dg.width) | uint64_t(bin);
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
      const int e = int(threadIdx.x) + u * T;
      v[u] = e < ne ? ks[e] : 0;
      mine += e < ne && (v[u] >> shift) >= hi;
    }
    uint32_t total;
    uint32_t o = radix::block_exclusive_scan(mine, scan_sh, &total);
#pragma unroll
    for (int u = 0; u < kBlockPer; ++u)
      if (int(threadIdx.x) + u * T < ne && (v[u] >> shift) >= hi) ks[o++] = v[u];
  }
  sort_and_write(ks, k, ib, visible, out);
}

__global__ void __launch_bounds__(kBlockThreads, 1) block_select_kernel(IndexArgs a, int ib, int passes) {
  pdl_begin();
  __shared__ uint64_t ks[kBlockMaxNe];
  const int t = blockIdx.x;
  const SelSizes z(a, t);
  const int ne = int(z.ne), k = int(z.k);
  int64_t* out = a.sel + int64_t(t) * a.k_cap;
  for (int j = max(k, 0) + int(threadIdx.x); j < a.k_cap; j += blockDim.x) out[j] = -1;
  if (k <= 0) return;
  const float* s = a.scores + int64_t(t) * a.ne_cap;
  for (int e = threadIdx.x; e < ne; e += blockDim.x) ks[e] = sel_key(s[e], e, ib);
  block_topk(ks, ne, k, ib, passes, index_visible(a, t), out);
}

// Cluster path (kBlockMaxNe < ne_cap <= kClusterMaxNe): the block path's digit passes over keys spread across a
// cluster of C blocks per token, each holding ceil(ne_cap / C) keys in its shared memory. Per digit: block 0 clears
// the histogram, every block counts its matching keys' digits into block 0's histogram (distributed shared memory
// atomics), block 0 picks the bin and publishes (bin, keys above, done), every block reads them; three cluster
// barriers. Then every block appends its chosen keys into block 0's candidates and block 0 sorts them. One launch,
// no scratch, no counters in global memory; the same keys, so the same indices as the other paths.
constexpr int kClusterThreads = 1024, kClusterMaxPer = 16384, kClusterMaxC = 16;
static_assert(kIndexTopkClusterMaxNe == int64_t(kClusterMaxPer) * 8, "the path's bound is the portable cluster's");
constexpr size_t kClusterMaxSmem = size_t(kClusterMaxPer + kIndexTopkClusterMaxK) * 8;  // 160 KiB
struct ClusterDigit {
  int bin;
  uint32_t above;
  int done;
};
__global__ void __launch_bounds__(kClusterThreads, 1) cluster_select_kernel(IndexArgs a, int per, int ib, int passes, int kpow) {
  namespace cg = cooperative_groups;
  const cg::cluster_group cl = cg::this_cluster();
  extern __shared__ __align__(16) unsigned char smem[];
  uint64_t* ks = reinterpret_cast<uint64_t*>(smem);  // [per] this block's keys
  uint64_t* cand = ks + per;                          // [kpow] block 0's: the chosen keys
  __shared__ uint32_t h[kSelBins];
  __shared__ uint32_t scan_sh[32];
  __shared__ ClusterDigit dig;
  __shared__ uint32_t ncand;
  const int r = int(cl.block_rank()), t = int(blockIdx.y), T = int(blockDim.x);
  const SelSizes z(a, t);
  const int ne = int(z.ne), k = int(z.k);
  const int64_t visible = index_visible(a, t);
  int64_t* out = a.sel + int64_t(t) * a.k_cap;
  if (r == 0)
    for (int j = max(k, 0) + int(threadIdx.x); j < a.k_cap; j += T) out[j] = -1;
  if (k <= 0) return;  // the same in every block of the cluster
  const int e0 = r * per, nb = max(0, min(per, ne - e0));
  const float* s = a.scores + int64_t(t) * a.ne_cap + e0;
  for (int i = int(threadIdx.x); i < nb; i += T) ks[i] = sel_key(s[i], e0 + i, ib);
  uint32_t* h0 = cl.map_shared_rank(h, 0);
  ClusterDigit* dig0 = cl.map_shared_rank(&dig, 0);
  uint32_t* ncand0 = cl.map_shared_rank(&ncand, 0);
  uint64_t* cand0 = cl.map_shared_rank(cand, 0);
  uint64_t hi = 0;
  int shift = 0;
  if (k < ne) {
    uint32_t k_rem = uint32_t(k);
    for (int pass = 0; pass < passes; ++pass) {
      const SelDigit dg(pass, ib);
      shift = dg.shift;
      if (r == 0)
        for (int i = threadIdx.x; i <= int(dg.mask); i += T) h[i] = 0;
      cl.sync();  // A: the histogram is clear (the first time: every block is running)
      for (int i0 = 0; i0 < nb; i0 += T) {  // a uniform trip count: count_digit needs every lane
        const int i = i0 + int(threadIdx.x);
        count_digit(i < nb, i < nb ? ks[i] : 0, hi, dg, h0);
      }
      cl.sync();  // B: every count is in
      if (r == 0) {
        radix::find_boundary(h, int(dg.mask) + 1, k_rem, &dig.bin, &dig.above, scan_sh);
        if (threadIdx.x == 0) dig.done = h[dig.bin] == k_rem - dig.above || shift == 0;
      }
      cl.sync();  // C: the digit is published
      const ClusterDigit pick = *dig0;
      hi = (hi << dg.width) | uint64_t(pick.bin);
      k_rem -= pick.above;
      if (pick.done) break;
    }
  }
  // The keys whose bits above `shift` reach hi (every key when k == ne): exactly k, appended in any order.
  if (r == 0 && threadIdx.x == 0) ncand = 0;
  cl.sync();
  for (int i0 = 0; i0 < nb; i0 += T) {
    const int i = i0 + int(threadIdx.x);
    radix::warp_append(i < nb && (ks[i] >> shift) >= hi, ncand0, cand0, i < nb ? ks[i] : 0);
  }
  cl.sync();  // every candidate is in block 0 (and no block exits while block 0's memory may still be written)
  if (r != 0) return;
  sort_and_write(cand, k, ib, visible, out);
}

// Fused path (ne_cap <= kIndexerFusedMaxNe): scores and top-k in one launch, a cluster of C blocks per token
// (index_cluster_size). Block r of the cluster scores entries [r * eb, (r + 1) * eb) (eb = ceil(ne_cap / C)) as the
// split path's blocks do, writes them to a.scores and their keys into block 0's shared memory (distributed shared
// memory); after the cluster barrier block 0 runs the block path's top-k on them. No scratch, no counters; the
// launch depends on (n, ne_cap) alone. At 65 entries (a 256-token context) this replaces a 17-block scores launch
// and a one-block select.
constexpr int kFusedMaxCluster = 16, kFusedMaxThreads = 1024;
constexpr size_t kFusedMaxSmem = 160 * 1024;  // 512 entries over 8 blocks: 135 KiB at V4's 64 x 128

__global__ void __launch_bounds__(kFusedMaxThreads) index_fused_kernel(IndexArgs a, int eb, int ib, int passes) {
  extern __shared__ __align__(16) unsigned char smem[];
  namespace cg = cooperative_groups;
  const cg::cluster_group cl = cg::this_cluster();
  // Every block of the cluster must be running before another writes its shared memory (block 0's keys, below):
  // arrive here, wait before the first remote write (compute-sanitizer's racecheck flagged those writes without it).
  cl.barrier_arrive();
  pdl_begin();
  const int r = int(cl.block_rank()), t = int(blockIdx.y);
  uint64_t* keys = reinterpret_cast<uint64_t*>(smem);  // [pow2_ceil(ne_cap)]: block 0's are the token's
  const ScoresSmem L(eb, a.nh, int(a.dh), size_t(pow2_ceil(int(a.ne_cap))) * 8);
  const int64_t e0 = int64_t(r) * eb, visible = index_visible(a, t);
  const int nb = int(max(int64_t(0), min(int64_t(eb), a.ne_cap - e0)));
  const SelSizes z(a, t);
  float* sc = a.scores + int64_t(t) * a.ne_cap + e0;
  uint64_t* keys0 = cl.map_shared_rank(keys, 0);
  cl.barrier_wait();
  index_scores_block<1>(a, smem, L, t, e0, nb, visible, [&](int el, float v) {
    sc[el] = v;
    if (e0 + el < z.ne) keys0[e0 + el] = sel_key(v, e0 + el, ib);
  });
  cl.sync();  // every key is in block 0's shared memory (and no block exits while block 0 may still be written)
  if (r != 0) return;
  const int ne = int(z.ne), k = int(z.k);
  int64_t* out = a.sel + int64_t(t) * a.k_cap;
  for (int j = max(k, 0) + int(threadIdx.x); j < a.k_cap; j += blockDim.x) out[j] = -1;
  if (k <= 0) return;
  block_topk(keys, ne, k, ib, passes, visible, out);
}

// Whether the fused path's block of a cluster of C holds its entries' scores in shared memory (and its top-k's
// compaction fits in registers); its configuration.
struct FusedPlan {
  int C, eb, threads;
  size_t smem;
  bool fits;
  FusedPlan(const IndexArgs& a, int C_) : C(C_) {
    eb = int((a.ne_cap + C - 1) / C);
    threads = std::min(kFusedMaxThreads, std::max(128, (eb * a.nh + 31) / 32 * 32));
    smem = ScoresSmem(eb, a.nh, int(a.dh), size_t(pow2_ceil(int(std::min<int64_t>(a.ne_cap, kIndexerFusedMaxNe)))) * 8).total;
    fits = a.ne_cap <= kIndexerFusedMaxNe && a.nh >= 1 && a.dh >= 1 && smem <= kFusedMaxSmem &&
           a.ne_cap <= int64_t(kBlockPer) * threads;
  }
};

// Blocks per token of the fused path: 16 where the GPU co-schedules a cluster of 16 at the kernel's largest
// configuration (a non-portable size), else the portable 8. Any size gives the same bits (a score is one thread's
// sums whichever block computes it; the top-k of unique keys is unique).
int index_cluster_size() {
  static const int C = [] {
    PLUMB_CUDA_CHECK(cudaFuncSetAttribute(index_fused_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kFusedMaxSmem)));
    return cluster_size_or_8(index_fused_kernel, kFusedMaxCluster, kFusedMaxThreads, kFusedMaxSmem);
  }();
  return C;
}

// Blocks of a cluster of the cluster path: 16 where the GPU co-schedules them at the kernel's largest shared
// memory, else the portable 8 (the path's bound assumes 8).
int topk_cluster_size() {
  static const int C = [] {
    PLUMB_CUDA_CHECK(cudaFuncSetAttribute(cluster_select_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kClusterMaxSmem)));
    return cluster_size_or_8(cluster_select_kernel, kClusterMaxC, kClusterThreads, kClusterMaxSmem);
  }();
  return C;
}

}  // namespace

// The block path up to kBlockMaxNe entries (one launch instead of 5-7 and a memset), above it the cluster path for
// one token and k <= 512 up to kIndexTopkClusterMaxNe, else the select path: the same indices
// (IndexTopkPathsMatchRankTwinAndHost, IndexTopkReplaysAsGraph). H200, IndexTopkTiming, top-512, batch 1 / 8: 64
// entries 7.2 / 7.6 us vs select 15.8 / 16.1; 1024: 17.3 / 17.4 vs 31.9 / 33.4; 4096: 16.6 / 16.6 vs 26.2 / 28.5
// (top-2048: 37.4 / 37.5 vs 40.4 / 51.0). Cluster vs select (session 9): 32768 entries, top-512: 22.4 vs 30.1 us at
// batch 1, 39.1 vs 36.0 at 8; top-2048: 38.3 vs 31.1 at batch 1 (its one-block sort of the k winners dominates).
int fwd_index_topk_path(int n, int64_t ne_cap, int k_cap) {
  if (ne_cap <= kBlockMaxNe) return kIndexTopkBlock;
  return n == 1 && ne_cap <= kIndexTopkClusterMaxNe && k_cap <= 512 ? kIndexTopkCluster : kIndexTopkSelect;
}

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
  if (path == kIndexTopkCluster) {
    if (a.ne_cap > kIndexTopkClusterMaxNe || a.k_cap > kIndexTopkClusterMaxK)
      throw_arg("indexer: too many entries or too large a k for the cluster top-k");
    const int C = topk_cluster_size();
    const int per = int((a.ne_cap + C - 1) / C);
    const int kpow = pow2_ceil(a.k_cap);
    launch_cluster(false, "fwd_indexer_topk cluster", cluster_select_kernel, unsigned(C), unsigned(a.n), unsigned(kClusterThreads),
                   size_t(per + kpow) * 8, s, a, per, ib, passes, kpow);
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

// Decided without the device: the fit at the portable cluster size (a cluster of 16 holds fewer entries per block).
bool fwd_indexer_fused_fits(const IndexArgs& a) { return FusedPlan(a, 8).fits; }

// Fused up to kIndexerFusedDefaultNe entries, split above. H200, IndexerTiming (graph-replayed, warm L2), V4-Flash
// sizes, n = 1, split (its default shape) / fused us (session 9's staging and terms): 65 entries 11.9 / 9.9, 128:
// 11.8 / 10.7, 256: 13.5 / 15.5, 512: 16.3 / 22.3 (the fused path's 16 blocks per token run out of parallelism);
// n = 8 at 65 and 128: 13.2 / 12.1, 13.5 / 14.1. ncu at 65 entries (one eager decode step, base clocks, cold L2):
// fused 22.1 us before the staging rewrite, against 20.7 + 12.4 us for the split path's launches before that.
int fwd_indexer_path(const IndexArgs& a) {
  return a.ne_cap <= kIndexerFusedDefaultNe && fwd_indexer_fused_fits(a) ? kIndexerFused : kIndexerSplit;
}

bool fwd_indexer_dmma_fits(const IndexArgs& a) {
  return !a.official && a.nh >= 1 && a.nh <= 16 * kTcMaxWarps && a.dh >= 8 && a.dh % 8 == 0 && a.dh <= 8 * kDmmaMaxSteps &&
         DmmaSmem(a.nh, int(a.dh)).total <= 227 * 1024;
}

bool fwd_indexer_tc_fits(const IndexArgs& a) {
  return !a.official && a.nh >= 1 && a.nh <= 16 * kTcMaxWarps && a.dh >= 16 && a.dh % 16 == 0 && a.dh <= 16 * kTcMaxSteps;
}

void fwd_indexer(const IndexArgs& a, Stream s, int path) {
  if (a.n <= 0 || a.ne_cap <= 0) return;
  if (path == kIndexerFused) {
    if (int64_t(a.k_cap) < std::min<int64_t>(a.topk, a.ne_cap)) throw_arg("indexer: k_cap below min(topk, ne_cap)");
    if (!fwd_indexer_fused_fits(a)) throw_arg("indexer: too many entries, heads or dims for the fused path");
    FusedPlan p(a, index_cluster_size());
    if (!p.fits) p = FusedPlan(a, 8);
    const int ib = index_bits(a.ne_cap), passes = sel_passes(ib);
    launch_cluster(false, "fwd_indexer fused", index_fused_kernel, unsigned(p.C), unsigned(a.n), unsigned(p.threads), p.smem, s, a, p.eb,
                   ib, passes);
    return;
  }
  if (path == kIndexerTc || path == kIndexerDmma) {  // the scores on the f16 or the fp64 tensor cores, then the top-k
    const bool tc = path == kIndexerTc;
    if (!(tc ? fwd_indexer_tc_fits(a) : fwd_indexer_dmma_fits(a)))
      throw_arg(tc ? "indexer: the tensor-core scores need at most 128 heads and a head dim multiple of 16 up to 256, not "
                     "the official numerics"
                   : "indexer: the fp64 tensor-core scores need at most 128 heads and a head dim multiple of 8 up to 128, "
                     "not the official numerics");
    if (tc) launch_tc_scores(a, int(a.dh / 16), s);
    else launch_dmma_scores(a, int(a.dh / 8), s);
    fwd_index_topk(a, fwd_index_topk_path(a.n, a.ne_cap, a.k_cap), s);
    return;
  }
  if (path != kIndexerSplit) throw_arg("indexer: unknown path");
  // Entries per block: 4 below 1024 (token, entry) pairs (parallelism), 16 from there (each block stages the
  // token's queries, nh x dh floats, from L2, and each thread's query reads serve 4 entries). H200, IndexerTiming
  // (graph-replayed, V4-Flash sizes), 4 / 1 entries per item, us: 512 x 1 16.7 / 16.3, 1024 x 1 21.9 / 23.2,
  // 256 x 8 15.5 / 20.0, 65536 x 1 144.9 / 240.0, 65536 x 8 879 / 2006 (before this session: 399 and 2899).
  if (a.scores_per_item != 0 && a.scores_per_item != 1 && a.scores_per_item != 4)
    throw_arg("indexer: scores_per_item must be 0 (by size), 1 or 4");
  const bool wide = a.scores_per_item ? a.scores_per_item == 4 : int64_t(a.n) * a.ne_cap >= 1024;
  const int eb = wide ? 16 : 4;
  const size_t smem = ScoresSmem(eb, a.nh, int(a.dh), 0).total;
  if (smem > kScoresMaxSmem)
    throw_arg("indexer: index_n_heads x index_head_dim too large for the scores kernel's shared memory (160 KiB)");
  static size_t raised[2] = {48 * 1024, 48 * 1024};  // per process: the attribute is per kernel
  if (smem > raised[wide]) {
    PLUMB_CUDA_CHECK(cudaFuncSetAttribute(wide ? index_scores_kernel<4> : index_scores_kernel<1>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    raised[wide] = smem;
  }
  const dim3 grid(unsigned(fwd_blocks(a.ne_cap, eb)), unsigned(a.n));
  if (wide) {
    launch("fwd_indexer_scores", index_scores_kernel<4>, grid, kScoresThreads, smem, s, a, eb);
  } else {
    launch("fwd_indexer_scores", index_scores_kernel<1>, grid, kScoresThreads, smem, s, a, eb);
  }
  fwd_index_topk(a, fwd_index_topk_path(a.n, a.ne_cap, a.k_cap), s);
}

}  // namespace plumb::cuda::detail
