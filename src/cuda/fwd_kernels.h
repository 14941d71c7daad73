// The model-forward kernels of the CUDA backend (every op of the forward pass on the GPU), declared for the host
// code in src/cuda/gpu_*.cpp. Plain types only (nvcc-safe, like kernels.h): the .cu files include no plumb header.
//
// These are the GPU twins of the reference sublayers (src/model/*): fp32 storage, fp64 accumulation of every
// dot product and sum of squares, the reference's formulas and orderings where they matter. Ties in top-k
// selections resolve to the lower index (PyTorch's CUDA order), where the CPU reference follows PyTorch's CPU
// order; that is the one intended difference (verify-golden runs this backend teacher-forced, see docs/cuda.md).
// All launches are asynchronous on `s`; pointers are device pointers unless said otherwise.
#pragma once
#include <cstdint>

#include "cuda/kernels.h"
#include "model/host_device.h"

namespace plumb::cuda::detail {

// A weight matrix [rows, cols] in its checkpoint layout, on the device (see model/weights.h Matrix):
//   layout 0 plain: w is F32 (dtype 0), BF16 (1) or F16 (2), row-major;
//   layout 1 FP8: w E4M3 [rows, cols], s [ceil(rows/128), s_cols] E8M0 (s_f32 0) or F32 (s_f32 1);
//   layout 2 FP4: w packed E2M1 [rows, cols/2] (even column in the low nibble), s E8M0 [rows, s_cols = cols/32].
struct DMat {
  const void* w = nullptr;
  const void* s = nullptr;
  int64_t rows = 0, cols = 0, s_cols = 0;
  int layout = 0, dtype = 0, s_f32 = 0;
};

// ---- dense ops (fwd_ops.cu) ----
// X[t, j, :] = embed[tokens[t]] for j < H (the hc_mult residual streams); D = embed.cols.
// epoch (optional): the forward's epoch of cuda.branch_flags (BranchWait::sync[0]), advanced by one.
void fwd_embed(const DMat& embed, const int32_t* tokens, int n, int H, float* X, Stream s, unsigned* epoch = nullptr);
// y[t * ldy + r] = sum_c x[t * ldx + c] * W[r0 + r, c], r < nr, t < n (fp64 accumulation, fp32 out).
void fwd_linear(const DMat& w, const float* x, int n, int64_t ldx, int64_t r0, int64_t nr, float* y, int64_t ldy, Stream s);
// One token through several matrices that share its input row (all of w's rows each), in one launch: the same bits
// as fwd_linear per matrix. Every matrix must have x's column count and fit fwd_linear_one_fits.
struct LinearSegs {
  static constexpr int kMax = 6;
  struct Seg {
    DMat w;
    float* y = nullptr;
    int64_t r0 = 0, nr = 0;  // rows [r0, r0 + nr) of w (add: all of them)
    int64_t block0 = 0;      // the first pair of rows of this segment (set by the launch)
    int64_t ldy = 0;         // ntok > 1: token t's outputs at y + t * ldy
  } seg[kMax];
  int count = 0;
  int ntok = 1;      // tokens (at most kOneMaxTokens): rows of x, ldx apart; each token's sums as one token's
  int64_t ldx = 0;
  int evict_first = 0;  // cuda.l2_evict_first: the weights' loads evict-first in L2 (set by the launch)
  int early = 0;        // cuda.linear_early: plain rows' first round of weights requested before the PDL wait (set by the launch)
  void add(const DMat& w, float* y) { seg[count].w = w, seg[count].y = y, seg[count].r0 = 0, seg[count].nr = w.rows, ++count; }
};
bool fwd_linear_one_fits(const DMat& w);  // plain 16-byte rows, at most 12288 columns
// w can join `first` (a launch's first matrix) in a several-token launch of fwd_linear_one_multi: it fits the one-token
// kernel, has first's columns, and both have plain rows of one dtype (what the multi-token kernel reads).
bool fwd_linear_multi_fits(const DMat& w, const DMat& first);
constexpr int kOneMaxTokens = 4;  // fwd_linear_one_multi's tokens per launch (plain rows of one dtype for more than one)
// cuda.l2_prefetch: the 128-byte lines of up to kMax byte ranges prefetched into L2 (evict_last), in order; writes
// nothing. A few blocks, meant for a stream of its own beside latency-bound launches.
struct PrefetchRanges {
  static constexpr int kMax = 16;
  const void* p[kMax] = {};
  int64_t bytes[kMax] = {};
  int count = 0;
  // Adds [q, q + b) while the total stays within `budget` bytes (the part that fits of the range that does not).
  void add(const void* q, int64_t b, int64_t budget) {
    int64_t used = 0;
    for (int i = 0; i < count; ++i) used += bytes[i];
    if (!q || b <= 0 || count == kMax || used >= budget) return;
    p[count] = q, bytes[count] = b < budget - used ? b : budget - used, ++count;
  }
};
void fwd_prefetch_l2(const PrefetchRanges& r, Stream s);
void fwd_linear_one_multi(LinearSegs g, const float* x, Stream s);
// Same for E experts at once: slot i (< nslots) uses matrix mats[e] with e = idx[i] (idx null: e = 0) and input row
// x[(i / x_div) * ldx]; y[i * ldy + r].
void fwd_linear_indexed(const DMat* mats, const int32_t* idx, int nslots, int x_div, const float* x, int64_t ldx, int64_t rows,
                        int64_t cols, float* y, int64_t ldy, Stream s);
// Weighted (w non-null) or plain RMSNorm of `rows` rows of `dim` values, rows `ld` apart, in place; out16
// (optional): the result also as f16 rows [rows, dim] (what fwd_to_f16 would make of it); round_bf16 (the official
// numerics): each result rounded to bf16 (the bits of fwd_act after it).
void fwd_rms_norm(float* x, int64_t rows, int64_t dim, int64_t ld, const float* w, double eps, Stream s, uint16_t* out16 = nullptr,
                  int round_bf16 = 0);
// Positions of the RoPE kernels below (row_pos, fwd_common.cuh): per_pos > 0, rows of one session's consecutive
// tokens, row r at (*dpos) + r / per_pos; per_pos < 0 (cuda.batch_rows: forward_batch's rows), each group of -per_pos
// rows one token of its own session, row r at dpos[r / -per_pos].
// A second set of rows for fwd_rms_norm_rope: RoPE alone on x[r * ld + off .. + 2 * half) for r < rows, at
// (*dpos) + r / per_pos, with the same tables (fwd_rope's arithmetic: pos0 0, pos_step 1, not inverse).
struct RopeRows {
  float* x = nullptr;
  int64_t rows = 0, ld = 0, off = 0;
  int half = 0;
  int64_t per_pos = 1;
};
// fwd_rms_norm (rows of dim values, contiguous), then RoPE on each row's dims [off, off + 2 * half) at position
// (*dpos) + row / per_pos, in one launch: the same bits as fwd_rms_norm then fwd_rope. also (optional): RopeRows
// rotated in the same launch below the warp-per-row threshold (the query heads and the indexer's query at decode),
// by a second launch above it.
void fwd_rms_norm_rope(float* x, int64_t rows, int64_t dim, const float* w, double eps, int64_t off, int half, const float* inv_freq,
                       float attention_factor, const int64_t* dpos, int64_t per_pos, Stream s, const RopeRows* also = nullptr);
// fwd_rope on whole rows of ld values (rotated dims from off to the row's end, position (*dpos) + row / per_pos),
// then every row also as f16 into out16 [rows, ld]: one launch, the same bits as fwd_rope then a conversion.
void fwd_rope_f16(float* x, int64_t rows, int64_t ld, int64_t off, const float* inv_freq, float attention_factor, const int64_t* dpos,
                  int64_t per_pos, int inverse, uint16_t* out16, Stream s);
// Interleaved RoPE on x[row * ld + off .. + 2 * half): row r is at position (*dpos) + pos0 + (r / per_pos) * pos_step
// (dpos: a device position, null for 0). inv_freq [half] fp32; cos and sin are multiplied by attention_factor;
// inverse rotates by -angle; round_bf16 (the official numerics): the rotated values rounded to bf16 (fwd_act after it).
void fwd_rope(float* x, int64_t rows, int64_t ld, int64_t off, int half, const float* inv_freq, float attention_factor,
              const int64_t* dpos, int64_t pos0, int64_t per_pos, int64_t pos_step, int inverse, Stream s, int round_bf16 = 0);
// y = a * x elementwise over n values (in place when y == x). The official numerics' bf16 storage in the same
// launch: round_in rounds x to bf16 first, round_out the result (the bits of fwd_act before / after).
void fwd_scale(const float* x, float a, float* y, int64_t n, Stream s, int round_in = 0, int round_out = 0);
void fwd_add(float* y, const float* x, int64_t n, Stream s, int round_bf16 = 0);  // y += x (then bf16, as fwd_act)
void fwd_to_bf16(const float* x, int64_t n, uint16_t* y, Stream s);  // round to nearest even

// ---- hyper-connections (fwd_hc.cu) ----
struct HcArgs {
  const float* X = nullptr;  // [n, H, D] residual streams
  const float* fn = nullptr;  // [nmix, H*D]
  const float* base = nullptr, *scale = nullptr;  // [nmix], [3] (head: [H], [1])
  int n = 0, H = 0, iters = 0;
  int64_t D = 0;
  float hc_eps = 0;
  double rms_eps = 0;
  int head = 0;  // hc_head: only the pre weights and the collapse
  int serial_sinkhorn = 0;  // tests: one thread runs hc_math::weights (the warp-parallel Sinkhorn's twin)
  // The mixing GEMM (model/hyper_connection.cpp mixes()): 0 the reference, float(x * r) . fn; 1 mhc.bf16_mix,
  // bf16(x * r) . bf16(fn); 2 numerics.official, (x . fn) * r (the norm after the GEMM). fp64 sums in every mode.
  int mix_mode = 0;
  int act_bf16 = 0;  // numerics.official: the collapse stored as bf16
  float* post = nullptr;       // [n, H]
  float* comb = nullptr;       // [n, H, H]
  float* collapsed = nullptr;  // [n, D]
  // Fused hc_post of the previous sublayer (y or y_slots non-null): each block first writes its slice of
  // X_out = hc_post(y, X_prev, post_prev, comb_prev) (fwd_hc_post's arithmetic, bit for bit; X_out must be X), then
  // runs hc_pre on it. post_prev / comb_prev may be post / comb: they are read before this launch overwrites them.
  const float* y = nullptr;       // [n, D]
  const float* X_prev = nullptr;  // [n, H, D]
  const float* post_prev = nullptr, *comb_prev = nullptr;
  float* X_out = nullptr;
  // y as the MoE sublayer's combine, left to this launch (y_slots non-null, y null): y[t, :] = y_scale * sum_k
  // y_w[t, k] * y_slots[t * y_k + k, :] (+ y_add[t, :]), launch_combine's arithmetic in its order (the same bits).
  const float* y_slots = nullptr;  // [n * y_k, D]
  const float* y_w = nullptr;      // [n, y_k] or null (unit weights)
  const float* y_add = nullptr;    // [n, D] or null
  int y_k = 0;
  float y_scale = 1.0f;
  int untransposed = 0;  // fault.comb_untransposed
  // Fused RMSNorm of the collapsed rows (norm_w non-null; fp32 twin numerics only): collapsed = rms_norm(collapsed)
  // with weight norm_w and eps norm_eps, and the f16 copy into collapsed16 when non-null: fwd_rms_norm's arithmetic
  // (the fp64 sum of squares in another order: see hc_pre_kernel).
  const float* norm_w = nullptr;
  double norm_eps = 0;
  uint16_t* collapsed16 = nullptr;
  // Tokens per cluster (1, 2 or 4, in ceil(n / M) clusters; 0: hc_pre_split's rule): the launch's shape, never its
  // bits. The bench and the tests set it; only hc_mult 4 on the vector path takes more than 1 (launch_hc_pre).
  int tokens_per_cluster = 0;
  // The post gates and the Sinkhorn (post, comb) left to fwd_hc_gates, from the mixes hc_pre writes to its scratch:
  // cuda.streams runs them beside the sublayer (they are read only by the next hc_pre's fused hc_post), so the
  // Sinkhorn's 20 dependent iterations (~3 us) leave the launch's critical path. Not with hc_head (no gates).
  int gates_apart = 0;
  // cuda.hc_norm_after_mix: one token per cluster with the forward's numerics (mix_mode 0, fp32 activations) takes
  // hc_pre_kernel's NA form: the dots on the raw streams without waiting for r, the mixes as float(r * (x . fn)) in
  // fp64 (within ~1e-7 of the exact kernel's); elsewhere ignored.
  int norm_after_mix = 0;
  // cuda.hc_fold: the previous GEMV ran this launch's fused hc_post (X holds its new streams; y and y_slots null) and
  // left its sums over each of its D / 16 16-row tiles (HcPartArgs::part); one token, hc_mult 4, NA's numerics.
  const double* part = nullptr;
  // cuda.branch_flags: the side branches whose results this launch reads (the gates apart of the hc_pre before, the
  // shared expert the fused combine adds), waited for in-kernel instead of joined (BranchWait).
  BranchWait wait;
};
// The launch's default split of n tokens: M tokens at most per cluster (1, 2 or 4) over `clusters` clusters (n spread
// evenly), given how many clusters the GPU keeps resident at once.
struct HcSplit {
  int tokens_per_cluster, clusters;
};
HcSplit hc_pre_split(int n, int resident);
// scratch: fwd_hc_scratch_doubles(n, H) doubles; hc_pre leaves the fp32 mixes there ([n, nmix], for tests).
size_t fwd_hc_scratch_doubles(int n, int H);
void fwd_hc_pre(const HcArgs& a, double* scratch, Stream s);
// Whether one token's hc_pre at hidden size D (hc_mult 4, the forward's numerics) runs the kernel with fn staged in
// shared memory (the GPU schedules its clusters, and the slice's fn fits); norm_after_mix: that of
// cuda.hc_norm_after_mix's kernel (HcArgs::norm_after_mix).
bool fwd_hc_pre_staged(int64_t D, bool norm_after_mix = false);
// The blocks of a's hc_pre launch (clusters x blocks per cluster), as fwd_hc_pre would launch it.
int64_t fwd_hc_pre_blocks(const HcArgs& a);

// The gates hc_pre left apart (HcArgs::gates_apart): post and comb of a's n tokens from the mixes in scratch, the
// same code and bits as hc_pre's (one warp per token: hc_math's gates and the warp's Sinkhorn, or the serial twin).
void fwd_hc_gates(const HcArgs& a, const double* scratch, Stream s);
// out[t, k, :] = post[t, k] * y[t, :] + sum_j comb[t, j, k] * X[t, j, :] (untransposed: comb[t, k, j], a fault);
// act_bf16 (numerics.official): stored as bf16.
void fwd_hc_post(const float* y, const float* X, const float* post, const float* comb, int n, int H, int64_t D, int untransposed,
                 float* out, Stream s, int act_bf16 = 0);

// ---- attention (fwd_attention.cu) ----
// Position-dependent kernels read the chunk's first position from device memory (`pos`), so one launch sequence
// (a CUDA graph) serves every decode step: everything that moves with the position (window keys, ring slots,
// visible entries, completed compressor windows) is derived on the device. Host-side sizes are bounds: grids and
// row strides cover the largest case (exact in eager launches, the buffers' capacity in a graph).
struct AttendArgs {
  const float* q = nullptr;       // [n, Hq, Dh], rotated
  const float* chunk_kv = nullptr;  // [n, Dh]: this chunk's keys (K = V)
  const float* ring = nullptr;    // [W, Dh]: earlier keys, position p at slot p % W
  const float* entries = nullptr; // [ne, Dh] compressed entries (CSA / HCA)
  const int64_t* sel = nullptr;   // CSA: [n, ksel] selected entries (-1: none)
  const float* sink = nullptr;    // [Hq]
  const int64_t* pos = nullptr;   // device: position of token 0
  int n = 0, Hq = 0, ksel = 0, type = 0;  // type: 0 sliding, 1 CSA, 2 HCA
  int64_t Dh = 0, window = 0, ne = 0, rate = 1;  // ne: HCA entries bound (visible ones: (p + 1) / rate)
  float scale = 1.0f;
  float* logits = nullptr;  // scratch [n * Hq, ld_logits]; ld_logits >= window + (HCA: ne, CSA: ksel)
  int64_t ld_logits = 0;
  // fwd_attend (not official): the keys whose rows and probabilities one round stages in shared memory, a multiple
  // of 16 (0: as many as fit, up to ~16.6K; a longer query takes rounds, with the same bits). Tests set it smaller.
  int64_t stage_keys = 0;
  float* out = nullptr;  // [n, Hq, Dh]; the rope dims are not yet un-rotated (unless out_inv_freq below)
  // fwd_attend_splitk only (optional): with out_inv_freq the output's dims from out_rope_off on are rotated back at
  // the query's position (inverse RoPE, fwd_rope_f16's arithmetic) as they are written, and out16 [n, Hq, Dh] gets
  // the output as f16: the bits of fwd_attend_splitk followed by fwd_rope_f16 (inverse), one launch fewer.
  const float* out_inv_freq = nullptr;
  int64_t out_rope_off = 0;
  float out_af = 1.0f;
  uint16_t* out16 = nullptr;
  // fwd_attend_splitk only (optional): with q_inv_freq, q is wq_b's output and each block normalizes its 16 query
  // heads (unweighted RMSNorm, q_eps) and rotates their dims [q_rope_off, q_rope_off + 2 * q_rope_half) at the
  // query's position itself, in shared memory (q is left as it was): the bits of fwd_rms_norm_rope before the
  // attention (rms_norm_rope_row_warp), one launch fewer.
  const float* q_inv_freq = nullptr;
  int64_t q_rope_off = 0;
  int q_rope_half = 0;
  float q_af = 1.0f;
  double q_eps = 0;
  // numerics.official: the sparse_attn kernel's online softmax over blocks of 64 keys, probabilities rounded to
  // bf16 before P.V, the output stored as bf16 (model/attention.cpp attend()).
  int official = 0;
  int official_serial = 0;  // tests: one thread computes each key block's max and probabilities (the kernel's twin)
  // fwd_attend_splitk only: attn.splitk_f16, the logits and P.V on the f16 tensor cores (q, keys, P rounded to f16).
  int f16 = 0;
  // fwd_attend_splitk only: the side branches whose writes the split launch reads (the KV row, the compressor's
  // entries), waited for in-kernel instead of joined (cuda.branch_flags, BranchWait).
  BranchWait wait;
  // fwd_attend_splitk only, cuda.batch_rows (forward_batch): token t is one token of its own session, at position
  // pos[t] (not *pos + t), whose window keys are ring_rows[t] and compressed entries entries_rows[t] (ring and
  // entries unused); ne bounds every row's entries, and CSA's selection rows are sel[t * ksel].
  const float* const* ring_rows = nullptr;
  const float* const* entries_rows = nullptr;
  // fwd_attend_splitk only, with ring_rows (optional): row t's type instead of `type` (CSA rows on both sides of the
  // indexer's limit under indexer.skip_short: 1 for a row that reads its selection, 2 for one that takes every visible
  // entry in entry order, as its own launch would as HCA does; `type` then 1 and `sel` / `ksel` set).
  const int8_t* type_rows = nullptr;
};
// Softmax over window keys then compressed keys, with the sink in the denominator only; fp64 dot products and P.V.
// Two launches: the logits (each key once per head, keys split over blocks), then softmax and P.V per head and
// slice of 64 dims.
void fwd_attend(const AttendArgs& a, Stream s);
// attn.splitk_decode (fwd_attn_splitk.cu): the same attention split over keys (flash-decoding): block (token,
// 16 heads, split) keeps a running max, fp64 sum and P.V over one contiguous chunk of keys, then a merge with the
// sink; no logits scratch (`logits`, `ld_logits` unused). The plan: keys per split, the grid's splits for up to
// max_keys keys per query, and the partials' scratch (0 when one split suffices: the split kernel then writes the
// output).
struct SplitPlan {
  int64_t chunk = 0;  // keys per split, at least (a multiple of 32)
  int64_t cap = 0;    // > 0: a query takes at most cap splits (its keys per split grow past chunk)
  int splits = 1;     // the grid: splits per query, enough for every query of up to max_keys keys
  int64_t blocks = 0;  // the split launch's grid: n x ceil(Hq / 16) x splits blocks
  size_t scratch_bytes = 0;
  // Keys per split of a query with `count` keys: chunk, or count / cap rounded up to 32 if larger. It depends on the
  // query and on chunk and cap (functions of n alone up to 256 tokens), never on the grid, so an eager launch and a
  // graph sized by the caches' capacity split a query alike.
  PLUMB_HD int64_t keys_per_split(int64_t count) const {
    if (cap <= 0) return chunk;
    const int64_t spread = ((count + cap - 1) / cap + 31) / 32 * 32;
    return spread > chunk ? spread : chunk;
  }
};
// sms: the device's SM count (sm_count()), which sizes the decode splits to fill it.
SplitPlan fwd_attend_splitk_plan(int n, int Hq, int64_t Dh, int64_t max_keys, int sms);
// cuda.batch_rows: n rows, each one token of its own session (AttendArgs::ring_rows) of at most max_keys keys: the
// one-token plan (so each query's keys split as its session's own step splits them; a row that needs fewer splits
// than the grid has merges exact zeros from the empty ones), its grid and scratch for n rows.
SplitPlan fwd_attend_splitk_plan_rows(int n, int Hq, int64_t Dh, int64_t max_keys, int sms);
// A warp per 32 dims of a head, 16 warps: head_dim a multiple of 32 up to 512 (other layers keep fwd_attend).
bool fwd_attend_splitk_fits(int64_t head_dim);
void fwd_attend_splitk(const AttendArgs& a, const SplitPlan& plan, void* scratch, Stream s);
// Copies the chunk's last min(n, W) keys into the ring (slot p % W); pos: device position of row 0.
void fwd_ring_store(const float* chunk_kv, int n, int64_t Dh, const int64_t* pos, int64_t window, float* ring, Stream s);
// cuda.batch_rows: row r of kv [n, Dh] (one token of its own session, at position pos[r]) into rings[r]'s slot pos[r] % W.
void fwd_ring_store_rows(const float* kv, int n, int64_t Dh, const int64_t* pos, int64_t window, float* const* rings, Stream s);
// cuda.comp_deferred: *wpos = *pos - back (the first position of a chunk of deferred rows, on the device) and, with a
// ring, the one token's row x [D] into ring slot *pos % m.
void fwd_comp_defer(const float* x, int64_t D, const int64_t* pos, int m, float* ring, int64_t back, int64_t* wpos, Stream s);

// One compressor step for a chunk of n rows at positions pos .. pos+n-1 (pos on the device). Row q of the
// timeline is rows_*[q - pos] for q >= pos (this chunk's projections), pend_*[q % m] for earlier rows of the
// incomplete window (the ring of pending rows). Windows w = pos/m .. (pos+n)/m - 1 complete in this chunk:
//   pool:   entry w = softmax-over-gates pooling of its m rows (gate + ape); CSA (overlap) prepends the previous
//           window's first-half series (prev_* when window w-1 completed in an earlier chunk, else its rows);
//   finish: RMSNorm (weight `norm`) and RoPE of entry w at position w * m, in place;
//   carry:  CSA: the last completed window's first-half series into prev_* (the next chunk's previous window);
//   stash:  the rows of the still incomplete window into pend_*[q % m].
// Entry w is written at entries[w * c]. nw_max bounds the windows completing in one chunk (grid size).
// One session's compressor state on the device (GpuCompState's buffers), for a launch over several sessions' rows.
struct CompCaches {
  float* pend_kv = nullptr, *pend_gate = nullptr, *prev_kv = nullptr, *prev_gate = nullptr, *entries = nullptr;
};
struct CompressArgs {
  const float* rows_kv = nullptr, *rows_gate = nullptr;  // [n, width]; width = 2c (overlap) or c
  float* pend_kv = nullptr, *pend_gate = nullptr;        // [m, width]
  float* prev_kv = nullptr, *prev_gate = nullptr;        // [m, c] (overlap)
  const float* ape = nullptr;                            // [m, width]
  const float* norm = nullptr;                           // [c]
  const float* inv_freq = nullptr;                       // [rope_half]
  const int64_t* pos = nullptr;                          // device
  int n = 0, overlap = 0, m = 0, nw_max = 0, rope_half = 0;
  int64_t c = 0;
  double eps = 0;
  float attention_factor = 1;
  float* entries = nullptr;
  // numerics.official (model/compressor.cpp): the pooled entry, its norm and its RoPE stored as bf16, then the
  // indexer's rotation (rotate: Hadamard + FP4) or the FP8 KV simulation of the nope dims (kv_fp8).
  int official = 0, rotate = 0, kv_fp8 = 0;
  int one_launch = 1;  // one token: the four steps in one launch (0: as for more tokens; the same bits)
  // The chunk is exactly one window (n == m rows from a window boundary: cuda.comp_deferred's kept rows): it takes the
  // one launch too (one window completes, no row stays pending). The caller vouches for the alignment (pos is device).
  int whole_window = 0;
  // cuda.batch_rows (forward_batch): row r is one token of its own session, at position pos[r], with that session's
  // state and entries rows[r] (pend_*, prev_*, entries above unused): one block per row runs the one-token step.
  const CompCaches* rows = nullptr;
};
// Launches pool + finish (skipped when nw_max is 0), carry (overlap) and stash; one token or one whole window: all in
// one launch.
void fwd_compress(const CompressArgs& a, Stream s);

// Indexer scores: s[t, e] = sum_h relu(q[t,h] . key[e]) * qscale * (hw[t,h] * wscale) for e < (pos+t+1)/m,
// -inf otherwise; then the top-k per row (ties: lower entry first; entries not visible become -1). With
// ne = (pos+n)/m entries existing after this chunk (device), k = min(topk, ne) are chosen and the rest of the
// row (k_cap wide) is -1.
struct IndexArgs {
  const float* q = nullptr;     // [n, nh, dh]
  const float* keys = nullptr;  // [ne_cap, dh] (rows from ne on are read, not used)
  const float* hw = nullptr;    // [n, nh]
  const int64_t* pos = nullptr;  // device: token t at *pos + t (one session's chunk), or pos[t] (keys_rows)
  // cuda.batch_rows (forward_batch): token t is one token of its own session, at pos[t], its keys keys_rows[t] (device
  // [n] table; keys unused); each token ranks its own visible entries, (pos[t] + 1) / rate, and reads no key row past
  // them (its session's buffer may hold fewer than ne_cap). The same scores and selection as its session's own launch.
  const float* const* keys_rows = nullptr;
  int n = 0, nh = 0, k_cap = 0, topk = 0;
  int64_t dh = 0, ne_cap = 0, rate = 1;  // ne_cap: bound on ne and the row stride of scores
  float qscale = 1, wscale = 1;
  // numerics.official (model/indexer.cpp): s = bf16(sum_h bf16(relu(bf16(q.k)) * hw)), hw already scaled and bf16;
  // qscale and wscale unused.
  int official = 0;
  float* scores = nullptr;  // [n, ne_cap]
  int64_t* sel = nullptr;   // [n, k_cap]; k_cap >= min(topk, ne_cap)
  void* topk_scratch = nullptr;  // the select path's: fwd_index_topk_scratch_bytes
  size_t topk_scratch_bytes = 0;
  // The split path's scores kernel: entries per item, 1 (4 per block) or 4 (16 per block); 0: by size
  // (fwd_indexer.cu). The same bits either way.
  int scores_per_item = 0;
};
// Scores and top-k (fwd_indexer.cu). Paths, identical results (scores and indices): split (the scores kernel over
// blocks of entries, then the top-k by fwd_index_topk_path) and fused (one cluster launch, a cluster of
// blocks per token scoring its entries, then the cluster's first block selecting; ne_cap <= kIndexerFusedMaxNe and
// the heads and dims fitting its shared memory). Launches depend only on the host's sizes: graph-safe.
// tc (indexer.tc_scores, a patch: not the same bits): the scores on the f16 tensor cores, then the split path's
// top-k; nh <= 128, dh a multiple of 16 up to 256 (fwd_indexer_tc_fits).
// dmma (indexer.dmma_scores, a patch): the exact path's terms and sums with each dot on the fp64 tensor cores (its
// own fp64 sum order), then the split path's top-k; nh <= 128, dh a multiple of 8 up to 128 (fwd_indexer_dmma_fits).
enum IndexerPath : int { kIndexerSplit = 0, kIndexerFused = 1, kIndexerTc = 2, kIndexerDmma = 3 };
constexpr int64_t kIndexerFusedMaxNe = 512;      // the fused path's limit
constexpr int64_t kIndexerFusedDefaultNe = 128;  // fwd_indexer_path's choice: fused up to here (measured, fwd_indexer.cu)
bool fwd_indexer_fused_fits(const IndexArgs& a);
bool fwd_indexer_tc_fits(const IndexArgs& a);
bool fwd_indexer_dmma_fits(const IndexArgs& a);
int fwd_indexer_path(const IndexArgs& a);
void fwd_indexer(const IndexArgs& a, Stream s, int path);
inline void fwd_indexer(const IndexArgs& a, Stream s) { fwd_indexer(a, s, fwd_indexer_path(a)); }
// The top-k alone, from a.scores (fwd_indexer.cu). Paths, identical results: rank (one block per token ranks
// every entry against all: O(ne^2), the twin), select (radix select over many blocks per token, then a rank of the
// k winners: O(ne + k^2)), block (the radix select in one block per token, ne_cap <= kIndexTopkBlockMaxNe, one
// launch) and cluster (the same passes over a cluster of blocks per token, ne_cap <= kIndexTopkClusterMaxNe and
// k_cap <= kIndexTopkClusterMaxK, one launch). Launches depend only on the host's sizes (n, ne_cap, k_cap):
// graph-safe. fwd_index_topk_path picks block, cluster or select by size (measured, fwd_indexer.cu).
enum IndexTopkPath : int { kIndexTopkRank = 0, kIndexTopkSelect = 1, kIndexTopkBlock = 2, kIndexTopkCluster = 3 };
constexpr int64_t kIndexTopkBlockMaxNe = 4096, kIndexTopkClusterMaxNe = 131072;
constexpr int kIndexTopkClusterMaxK = 4096;
int fwd_index_topk_path(int n, int64_t ne_cap, int k_cap);
size_t fwd_index_topk_scratch_bytes(int n, int64_t ne_cap, int k_cap, int path);
void fwd_index_topk(const IndexArgs& a, int path, Stream s);

// ---- official numerics (fwd_official.cu): the device twins of model/numerics.h's primitives ----
// x[r * ld + off + i] = bf16(x[...]) for r < rows, i < width (Numerics::act).
void fwd_act(float* x, int64_t rows, int64_t ld, int64_t off, int64_t width, Stream s);
// act_quant: q[r, :] = E4M3(x[r, :] / s) (the code's value) with s = sa[r, b] the power-of-two scale of 128-block b
// (official::fp8_quant_block). q [rows, K], sa [rows, ceil(K / 128)].
void fwd_act_quant(const float* x, int64_t rows, int64_t K, int64_t ldx, float* q, float* sa, Stream s);
// The same quantization with the values as E4M3 codes q [rows, K] (the W4A8 kernels' activations).
void fwd_act_quant_e4m3(const float* x, int64_t rows, int64_t K, int64_t ldx, uint8_t* q, float* sa, Stream s);
// y[i * ldy + r] for slot i < nslots, row r0 + r < r0 + nr, slot i reading input row i / x_div, matrix
// mats[idx[i]] (idx null: mats[0]; mats null: w):
//   bf16 = 0, FP8/FP4 weights: Numerics::proj's block-scaled GEMM on (q, sa): exact products summed per weight
//     block (128 / 32 columns), rounded to fp32, scaled and accumulated with one fma per block in K order, bf16 out;
//   bf16 = 1 or plain weights: ops::linear_rows_bf16w: x . bf16(W) in fp64, x and y rounded to bf16 iff round_io.
struct OfficialLinearArgs {
  DMat w;
  const DMat* mats = nullptr;   // device array, or null
  const int32_t* idx = nullptr; // [nslots], or null
  int nslots = 0, x_div = 1, bf16 = 0, round_io = 1;
  const float* x = nullptr;     // [nslots / x_div, K], rows ldx apart
  const float* q = nullptr, *sa = nullptr;  // fwd_act_quant of x (bf16 = 0)
  int64_t ldx = 0, r0 = 0, nr = 0, ldy = 0;
  float* y = nullptr;
};
void fwd_linear_official(const OfficialLinearArgs& a, Stream s);
// Numerics::head_rms in official mode: per group of dim values, the bf16 square / mean / rsqrt / product.
// rope (optional; the official query heads' norm_rope): then, in the same launch, RoPE on each group's dims [off,
// off + 2 * half) at (*dpos) + group / per_pos and those values rounded to bf16, and the `also` rows rotated and
// rounded likewise (the indexer's query): the bits of fwd_rope and fwd_act after it, two or four launches fewer.
struct HeadRope {
  int64_t off = 0;
  int half = 0;
  const float* inv_freq = nullptr;
  float attention_factor = 1.0f;
  const int64_t* dpos = nullptr;
  int64_t per_pos = 1;
  RopeRows also;
};
void fwd_head_rms_bf16(float* x, int64_t groups, int64_t dim, double eps, Stream s, const HeadRope* rope = nullptr);
// official::fp8_roundtrip of x[r * ld .. + n) in blocks of `block` (the FP8 KV simulation), each row.
void fwd_fp8_roundtrip(float* x, int64_t rows, int64_t ld, int64_t n, int block, Stream s);
// Numerics::indexer_rotate of each row x[r * n .. + n): Hadamard (n <= 1024) then the FP4 simulation.
void fwd_indexer_rotate(float* x, int64_t rows, int64_t n, Stream s);

// ---- MoE (fwd_moe.cu) ----
// RouteArgs: kernels.h (the routed experts' one-token launches take one too: cuda.topk_in_experts).
// One warp per token when E <= 512 and K <= 32 (else, or with `twin`, one block per token): the same bits.
void fwd_route(const RouteArgs& a, Stream s);
// h[i, :] = act(min(g, L)) * clamp(u, -L, L) (* pre[i] if pre) from g = gu[i, 0:I], u = gu[i, I:2I] (L +inf: no clamp);
// round_bf16: h rounded to bf16 (the official numerics' act after it, in the same launch). act: ExpertAct's value
// (0 SiLU, 1 GELU, 2 GELU tanh, 3 ReLU; transformers' hidden_act); bias_gate / bias_up [I] (mlp_bias: the shared
// MLP's b1 / b3), added to g and u before the clamps, both or neither.
void fwd_swiglu(const float* g, const float* u, int64_t ld, int nslots, int64_t I, float limit, const float* pre, float* h, Stream s,
                int round_bf16 = 0, int act = 0, const float* bias_gate = nullptr, const float* bias_up = nullptr);
// y[t, :] += b for t < n (rows of D): the shared MLP's b2 after its down projection (mlp_bias).
void fwd_add_row(float* y, int64_t n, int64_t D, const float* b, Stream s);
// y[t, :] = out_scale * sum_k (weight ? weight[t, k] : 1) * ys[t*K + k, :], summed in slot order, or with ids
// ([n, K] expert ids) in ascending (id, slot) order: the official code's (and the CPU's) per-expert loop, which adds
// each expert's output to an fp32 y expert by expert (fp32 sums of 3 or more terms depend on the order).
void fwd_moe_combine(const float* ys, const float* weight, int n, int K, int64_t D, float out_scale, float* y, Stream s,
                     const int32_t* ids = nullptr);

}  // namespace plumb::cuda::detail
