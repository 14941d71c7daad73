// The boundary between the CUDA translation units (src/cuda/*.cu, compiled by nvcc) and the host C++ that uses
// them (src/cuda/backend.cpp, bench.cpp). Plain types only: nvcc's front end cannot parse fmt's compile-time
// format strings, so no plumb header that pulls in fmt may be included by a .cu file. Errors are thrown as
// std::runtime_error (plumb::Error's base) with the CUDA call, file and line.
#pragma once
#include <cstddef>
#include <cmath>
#include <cstdint>
#include <string>

struct CUstream_st;

namespace plumb::cuda::detail {

using Stream = CUstream_st*;

// ---- runtime (runtime.cu) ----
struct Info {
  char name[256] = {};
  int cc_major = 0, cc_minor = 0, sm_count = 0;
  size_t l2_bytes = 0, mem_bytes = 0;
  int driver = 0, runtime = 0;
  bool check_only = false;  // built with PLUMB_CUDA_CHECK_ONLY: the device code unoptimized (timings mean nothing)
};
bool probe(std::string* why);  // a usable sm_90 device?
Info info();
int sm_count();  // the current device's SMs (queried once per device)
void* dmalloc(size_t bytes);  // an out-of-memory failure says how much was asked and what was free
// Tests: from now on dmalloc fails as out of memory once the bytes it hands out would pass `bytes` (-1: no budget,
// the default); allocated_under_budget() counts them. One process's allocations only, frees not given back.
void set_alloc_budget_for_testing(int64_t bytes);
int64_t allocated_under_budget();
void mem_info(size_t* free_bytes, size_t* total_bytes);  // cudaMemGetInfo on the current device
void dfree(void* p) noexcept;
void h2d(void* dst, const void* src, size_t bytes);
void d2h(void* dst, const void* src, size_t bytes);
void dmemset(void* p, int value, size_t bytes);
void* hmalloc_pinned(size_t bytes);  // page-locked host memory (cudaMallocHost)
void hfree_pinned(void* p) noexcept;
// Page-locked host memory mapped into the device's address space (cudaHostAlloc, mapped and portable): kernels read
// it over PCIe at the same address the host writes. Out of memory is an Error naming the size.
void* hmalloc_mapped(size_t bytes);
void h2d_async(void* dst, const void* src, size_t bytes, Stream s);  // src pinned; on stream_of(s)
void event_sync(void* e);                                           // waits for the event's work
void dsync();
void check_launch(const char* what);  // cudaGetLastError after a launch

// A per-thread switch of this thread's launches, set while a scope lives and restored after it (per thread: two
// models with different patches may run in one process).
enum class ThreadSwitch { kPdl, kSkipWeights, kEvictFirst, kPdlHcAttn, kLinearEarly };
bool thread_switch(ThreadSwitch which);
template <ThreadSwitch W>
struct ThreadSwitchScope {
  explicit ThreadSwitchScope(bool on);
  ~ThreadSwitchScope();
  ThreadSwitchScope(const ThreadSwitchScope&) = delete;
  ThreadSwitchScope& operator=(const ThreadSwitchScope&) = delete;
  bool prev;
};

// Programmatic dependent launch (cuda.pdl, see launch.cuh): on for this thread's launches while a PdlScope lives.
inline bool pdl_enabled() { return thread_switch(ThreadSwitch::kPdl); }
using PdlScope = ThreadSwitchScope<ThreadSwitch::kPdl>;

// Bench only (`plumb bench --layers --skeleton`): while a SkipWeightsScope lives, this thread's weight-streaming
// launches (launch_gemv: the FP8, MXFP4 and BF16 GEMVs; the one-token linear) return without launching, so a step
// times the rest of the forward's chain without the weights' bytes. Their outputs keep what the last real step
// wrote: the numbers are meaningless, the launches and their order are the forward's.
inline bool weights_skipped() { return thread_switch(ThreadSwitch::kSkipWeights); }
using SkipWeightsScope = ThreadSwitchScope<ThreadSwitch::kSkipWeights>;

// cuda.l2_evict_first: while an EvictFirstScope lives, this thread's decode GEMVs (launch_gemv, the one-token linear)
// load their weights with an L2 evict-first policy (GemvArgs::l2_evict_first, LinearSegs::evict_first).
inline bool evict_first_enabled() { return thread_switch(ThreadSwitch::kEvictFirst); }
using EvictFirstScope = ThreadSwitchScope<ThreadSwitch::kEvictFirst>;

// cuda.pdl_hc_attn: while a PdlHcAttnScope lives (and cuda.pdl's PdlScope), hc_pre's cluster launch and the split-K
// attention's split and merge launches take the PDL attribute too (each kernel waits in pdl_begin before touching
// memory another kernel writes; hc_pre first prefetches its fn, a weight, into L2).
inline bool pdl_hc_attn_enabled() { return thread_switch(ThreadSwitch::kPdl) && thread_switch(ThreadSwitch::kPdlHcAttn); }
using PdlHcAttnScope = ThreadSwitchScope<ThreadSwitch::kPdlHcAttn>;
// cuda.linear_early: while a LinearEarlyScope lives (and the PdlScope), the one-token linear requests its first round
// of weights before its PDL wait (LinearSegs::early).
inline bool linear_early_enabled() { return thread_switch(ThreadSwitch::kPdl) && thread_switch(ThreadSwitch::kLinearEarly); }
using LinearEarlyScope = ThreadSwitchScope<ThreadSwitch::kLinearEarly>;

// cuda.streams: a side branch of the forward. While a StreamScope lives, launches given a null stream go to its
// stream (stream_of) instead of the thread's default stream. branch_fork makes `side` wait for everything the
// thread's current stream has enqueued so far (event `ev`); branch_join makes the current stream wait for
// everything `side` has enqueued (event `ev`). Under stream capture this forks and joins a branch of the graph.
// A null `side` makes all three no-ops (the work stays on the thread's stream, serial).
// The stream a launch given `s` goes to: s, else the StreamScope's stream, else the thread's default stream
// (cudaStreamPerThread: never the legacy stream, which cannot be captured). Every launch resolves through it.
Stream stream_of(Stream s);
// The StreamScope's lane: 0 outside any (the thread's stream), else the lane it was opened with (1: the side
// stream, 2: the second side stream). Per-stream resources (workspaces, scratch) are chosen by it: one workspace
// must not serve concurrent launches.
int stream_lane();
struct StreamScope {
  explicit StreamScope(Stream s, int lane = 1);
  ~StreamScope();
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;
  Stream prev;
  int prev_lane;
};
void* event_create_sync();  // an event without timing (for fork and join)
void branch_fork(Stream side, void* ev);
// branch_fork in two steps, so that the current stream can enqueue work between them that `side` must not wait for
// (launched first, so its blocks are scheduled before the side's): branch_mark records `ev` on the current stream
// (when `side` is non-null), branch_wait makes `side` wait for that record.
void branch_mark(Stream side, void* ev);
void branch_wait(Stream side, void* ev);
void branch_join(Stream side, void* ev);
// branch_join in two steps, so that `side` can go on with work the current stream need not wait for yet: a
// branch_mark issued on `side` (inside its StreamScope) records `ev` there, branch_await makes the current stream
// wait for that record (when `side` is non-null); a later branch_join joins the rest.
void branch_await(Stream side, void* ev);
// cuda.branch_flags: a side branch's end signalled in device memory instead of joined. A graph node with a second
// incoming edge (a join; programmatic too, as captured) is launched only once both upstream kernels have completed:
// its blocks enter ~2 us after the kernel before it ends, against ~0.5 us for its PDL wait to return without the
// join (bench/pdl_residency_probe.cu, sessions 42-43), and a decode layer had three such joins on its critical path.
// Instead, where the reader's grid leaves room to the branch (branch_wait_fits below), the branch ends with
// branch_signal and the main-chain kernel that reads its results waits in-kernel (pdl_begin_after, launch.cuh) for
// the flag, before its PDL wait and before it lets its dependents launch; the branch joins the graph once, at the
// forward's end (Scratch::wait_or_join).
// `sync` (device, zeroed once): [0] the forward's epoch, advanced by the forward's first kernel (fwd_embed); [slot]
// the epoch at which that slot's branch last signalled. A slot serves one branch end per forward, so a flag from an
// earlier forward (an older epoch) or from another branch never satisfies a wait.
struct BranchWait {
  static constexpr int kMax = 2;
  const unsigned* sync = nullptr;  // null: no wait
  int slot[kMax] = {0, 0};         // 0: none
  // Adds a slot (0 is ignored); false when all kMax are taken (the caller then joins instead).
  bool add(const unsigned* s, int sl) {
    if (sl == 0) return true;
    for (int& x : slot) {
      if (x != 0) continue;
      sync = s, x = sl;
      return true;
    }
    return false;
  }
};
// Launches, on `side` after everything enqueued there, the kernel that stores the epoch into sync[slot] (release:
// after the branch's writes are visible).
void branch_signal(Stream side, unsigned* sync, int slot);
// Whether a launch of `blocks` blocks may wait in-kernel for side branches: its blocks, all resident and waiting, must
// leave SMs to the branches' kernels (and their clusters), so they may take at most half of the device's SMs (one
// block each at worst). A larger launch (hc_pre of many tokens, a split-K attention sized to fill the GPU) joins its
// branches instead: waiting, it could hold every SM a branch needs and never be released (a split-K attention of 256
// blocks did, at 8 tokens of V4-Flash, in session 42's first run).
bool branch_wait_fits(int64_t blocks);
// A launch's check before it waits in-kernel (w.sync set): throws, naming `who`, unless branch_wait_fits(blocks).
void check_branch_wait(const BranchWait& w, int64_t blocks, const char* who);
// Tests: a one-thread kernel that holds stream `s` for `ns` nanoseconds (a branch made late on purpose).
void device_delay(Stream s, uint64_t ns);

// Events for timing (bench).
void* event_create();
void event_destroy(void* e) noexcept;
void event_record(void* e, Stream s);
// Recorded on stream_of(s); inside a stream capture as an event node of the graph, which records it at each replay.
void event_record_node(void* e, Stream s);
float event_elapsed_ms(void* start, void* stop);  // synchronizes on stop

// Streams and CUDA graphs (the decode graph, cuda.graph; the bench times kernels as a captured step runs them).
// A null stream is the calling thread's default stream (the CUDA code is built with --default-stream
// per-thread), which can be captured.
Stream stream_create();
void stream_destroy(Stream s) noexcept;
void capture_begin(Stream s);
void* capture_end_instantiate(Stream s);  // a cudaGraphExec_t
void capture_abort(Stream s) noexcept;    // ends a capture that failed, dropping what it recorded
void graph_launch(void* exec, Stream s);
void graph_destroy(void* exec) noexcept;

// Bench helpers: device-side random fills (hash of index and seed) and bandwidth probes.
enum FillKind : int {
  kFillBytes = 0,  // uniform bytes (packed E2M1 pairs: every code equally likely)
  kFillE4M3 = 1,   // uniform E4M3 codes, NaN codes (0x7F, 0xFF) replaced by +-448
  kFillE8M0 = 2,   // uniform in [lo, hi]
  kFillBF16 = 3,   // bf16 uniform in [lo, hi)
  kFillF32 = 4,    // f32 uniform in [lo, hi)
  kFillF16 = 5,    // f16 uniform in [lo, hi)
};
void fill(void* p, size_t count, int kind, uint64_t seed, float lo, float hi, Stream s = nullptr);
// Reads `bytes` (multiple of 16) with 16-byte loads; writes one word to `sink` so the read is not elided.
void read_stream(const void* p, size_t bytes, unsigned* sink, Stream s = nullptr);
void copy_d2d(void* dst, const void* src, size_t bytes, Stream s = nullptr);
// The phase bench (bench_phases.cu): how much a layer's chain of dependent steps costs beyond its bytes, in one
// persistent launch (one block of 1024 threads per SM, cooperative: all resident) that streams `phases` buffers one
// after another with a grid barrier between them (each step's data dependency), and before each step after the
// first a latency-bound step of gap_ns on one thread (an indexer, an attention), with a grid barrier after it;
// prefetch (the persistent layer kernel's plan: weights known in advance stream while latency-bound steps run):
// meanwhile every block prefetches its lines of the next buffer into L2 (1: all, 2: the first half) or copies the
// first 200 KB of its contiguous share into shared memory (3). bar: 2 words, zero on entry, left zero.
constexpr int kMaxPhases = 8;
struct PhaseArgs {
  const void* buf[kMaxPhases] = {};
  size_t bytes[kMaxPhases] = {};  // multiples of 16
  int phases = 0;
  unsigned gap_ns = 0;
  int prefetch = 0;
  unsigned* bar = nullptr;
  unsigned* sink = nullptr;
};
void phase_stream(const PhaseArgs& a, Stream s = nullptr);
// One thread waiting ns nanoseconds: the separate-launch twin of a phase's latency-bound step.
void spin(unsigned ns, Stream s = nullptr);
// The same under programmatic dependent launch (the launch carries the attribute; the kernel waits for the previous
// one, lets the next launch, then waits ns), and a read of `bytes` launched likewise whose blocks (one per SM) first
// copy up to stage_bytes (<= 200 KB) of their contiguous share into shared memory, then wait, then read it there
// and the rest from global memory: whether a kernel launched early can stage its weights during the previous step.
void spin_pdl(unsigned ns, Stream s = nullptr);
void staged_read(const void* p, size_t bytes, size_t stage_bytes, unsigned* sink, Stream s = nullptr);

// ---- decode GEMV/GEMM (gemv.cu) ----
enum Act : int { kF32 = 0, kBF16 = 1, kF16 = 2, kE4M3 = 3 };  // kE4M3: codes [rows, cols] + GemvArgs::x_scale
// kBf16: plain bf16 weights, bf16 activations (dense). kFp4A8: MXFP4 weights in the A8 layout, E4M3 activations
// (the official numerics, MoE only). kFp8A8: FP8 weights as kFp8's, E4M3 activations (the official numerics, one
// dense matrix).
enum Fmt : int { kFp4 = 0, kFp8 = 1, kBf16 = 2, kFp4A8 = 3, kFp8A8 = 4 };
enum Mode : int { kDense = 0, kMoe = 1 };
// kHcPart (cuda.hc_fold): kStore, then the next hc_pre's start on the block's rows (GemvArgs::hc).
enum Epi : int { kStore = 0, kSwiglu = 1, kHcPart = 2 };

// cuda.hc_fold's epilogue (GemvArgs::hc, epi kHcPart: an FP8 dense GEMV of one token, one block per 16-row tile, y
// its sublayer's output row): block `tile` runs the next hc_pre's fused hc_post on its rows d (X_out[k * D + d] =
// hc_post(y, X_prev, post, comb), hc_post_cols's arithmetic, the same bits) and leaves that hc_pre's sums over them
// in part[o * (D / 16) + tile]: for o < nm = (2 + H) * H the dot of the new streams with fn row o, then (o = nm)
// their sum of squares, fp64 (hc_fold.cuh). hc_pre then takes the totals (HcArgs::part) instead of its own. The
// shape: hc_mult 4 (V4's), nm = 24 mixes, 25 sums per tile.
constexpr int kHcFoldH = 4, kHcFoldMix = (2 + kHcFoldH) * kHcFoldH, kHcFoldSums = kHcFoldMix + 1;
struct HcPartArgs {
  const float* X_prev = nullptr;  // [H, D] the streams before this sublayer
  const float* post = nullptr;    // [H] the post gates of the hc_pre before the sublayer
  const float* comb = nullptr;    // [H, H]
  float* X_out = nullptr;         // [H, D] the new streams
  const float* fn = nullptr;      // [nm, H * D] the next hc_pre's mixing weights
  double* part = nullptr;         // [kHcFoldSums, D / 16] (value-major)
  int64_t D = 0;
  int H = 0, untransposed = 0;    // H == kHcFoldH; untransposed: fault.comb_untransposed
};

// ---- the router's arguments (fwd_moe.cu's fwd_route; gemv.cu's one-token MoE launches with GemvArgs::route) ----
struct RouteArgs {
  const float* logits = nullptr;  // [n, E] fp32
  const float* bias = nullptr;    // [E] learned layers
  const int32_t* tid2eid = nullptr, *tokens = nullptr;  // hash layers: [V, K], [n]
  int n = 0, E = 0, K = 0, score = 0, hash = 0, n_group = 1, topk_group = 1;
  int renorm = 1, unfloored = 0, softplus_naive = 0;
  int twin = 0;  // tests: the block-per-token kernel (the warp kernel's twin) whatever the sizes
  float fold = 1.0f;
  int32_t* idx = nullptr;  // [n, K]
  float* weight = nullptr; // [n, K]
  float* select = nullptr; // [n, E] learned layers
};
// The warp code's variant for these arguments (route_warp.cuh: 1-5 experts per lane 1, 2, 4, 8, 8 with V4's
// routing; 6: 16), or 0 where the block-per-token twin runs (the twin, E > 512, K > 32 or > E, more than 64
// groups).
int route_warp_variant(const RouteArgs& a);
// Whether fwd_route runs these arguments as a block per token that scores a thread per expert (route_wide_kernel:
// warp variants 4 and 5 with an elementwise score and no groups; the same bits as the warp kernel).
bool route_wide_form(const RouteArgs& a);

constexpr int kGemvTab = 4;  // matrices of one BF16 table launch (GemvArgs::ntab)
struct GemvArgs {
  int fmt = kFp4, nmat = 1, epi = kStore, mode = kDense, act = kF32, out_half = 0;
  const uint8_t* w[2] = {nullptr, nullptr};  // codes of problem 0 (FP4: decode layout; FP8: row-major E4M3; BF16:
                                             // row-major bf16 values)
  const void* s[2] = {nullptr, nullptr};     // scales of problem 0 (FP4: E8M0 [rows, cols/32]; FP8: [rows/128, s_ld];
                                             // BF16: none)
  int64_t w_prob_stride = 0, s_prob_stride = 0;  // bytes from one problem (expert / group) to the next
  int64_t rows = 0, cols = 0;                    // one problem's matrix
  int64_t s_ld = 0;                              // scale row stride in elements
  int s_f32 = 0;                                 // FP8: scales are f32 (else E8M0)
  const void* x = nullptr;
  int64_t x_tok_stride = 0, x_prob_stride = 0;  // elements
  // kE4M3 activations: x row r's scale of its 128-column chunk c at x_scale[r * xs_ld + c] (powers of two).
  const float* x_scale = nullptr;
  int64_t xs_ld = 0;
  // The official numerics' output rounding: every result rounded to bf16 (kSwiglu: gate and up first, then h).
  int round_bf16 = 0;
  void* out = nullptr;
  // BF16 dense, optional: up to kGemvTab matrices of `cols` columns on the same x in one launch (grid row p: matrix p,
  // its own weight, row count, output and output row stride; `rows` is the largest row count, blocks past a
  // matrix's rows exit; w[0] / out / o_tok_stride are ignored).
  int ntab = 0;
  const void* tab_w[kGemvTab] = {};
  int64_t tab_rows[kGemvTab] = {}, tab_ld[kGemvTab] = {};
  float* tab_out[kGemvTab] = {};
  int64_t o_tok_stride = 0, o_prob_stride = 0;  // elements
  int n = 0;          // dense: columns (tokens); moe: tokens
  int problems = 1;   // dense: groups; moe: experts (idx bound)
  const int32_t* idx = nullptr;  // moe: [n, topk] expert ids
  int topk = 0;
  // moe, optional: launch_moe_group's table for these idx (the per-tile kernel then runs a block per table tile,
  // reading the expert and its slots there, instead of a block per slot scanning every slot; the same slots in the
  // same order per expert, so the same bits). Offsets in int32 words (group_layout).
  const int32_t* groups = nullptr;
  int64_t g_offs = 0, g_list = 0, g_tiles = 0;
  int g_max_tiles = 0;
  int x_by_token = 0;             // moe: x row = slot / topk (else slot)
  const float* pre_weight = nullptr;  // moe SwiGLU: h *= pre_weight[slot]
  float limit = 0.0f, out_scale = 1.0f;
  float* partial = nullptr;      // split-K across blocks (dense, n <= 8 only)
  unsigned* counters = nullptr;  // one per (problem, tile), zero on entry, left zero
  int kblocks = 1;
  int warps = 8;                 // warps per block (split K inside the block), 1..8
  int minblocks = 1;             // register budget: 1 (<= 255 per thread; MXFP4 per-tile at <= 4 warps: <= 168), 2
                                 // (<= 128) or 3 (<= 85, more warps resident; MXFP4: half the chunks in flight)
  int fp8_unroll = 0;            // one FP8 matrix: 128-column chunks whose loads a warp issues together, 2 (0) or 4
                                 // (with token_groups > 1: 1 or 2)
  int token_groups = 0;          // FP8 (W8A16) and BF16 dense: groups of 8 tokens per pass, 1, 2 or 4 (0: enough for up
                                 // to 32 tokens)
  // FP4 MoE only (the streaming kernel, gemv_fp4s.cuh; `warps`/`minblocks` above apply to the per-tile kernel):
  int fp4_kernel = 0;  // 0 auto: per-tile for gate/up at every batch (2 warps per block, <= 128 registers; at
                       // <= 8 slots 4 warps at <= 85, W4A8 2 warps at the full budget) and for down at
                       // n * topk <= 256 (<= 85 registers; 2 warps per block at <= 8 slots, 1 above); PDL at
                       // <= 8 slots and for down; down above 256 slots as 2 (gemv.cu; where the streaming kernel
                       // refuses the shape: per-tile, 1 warp);
                       // 1: per-tile (warps, minblocks as given); 2: streaming where the shape allows (cols % 512 == 0,
                       // n * topk <= 256, or 1024 with a group table, 16-byte aligned weights and scale rows),
                       // else per-tile
  int fp4_warps = 0;   // streaming: warps per CTA, 1..8 (0: default)
  int fp4_depth = 0;   // streaming: stages (512 columns each) in flight per warp, 2, 3, 4 or 6 (0: default)
  int fp4_ctas = 0;    // streaming: cap on CTAs per SM (0: as many as fit)
  int pdl = -1;        // programmatic dependent launch (the kernel waits in-kernel, before any memory access, for the
                       // previous kernel of the stream): -1 default (streaming: on for down, off for gate/up; per-tile
                       // auto: on at n * topk <= 8), 0 off, 1 on
  int fp4_ksplit = 0;  // streaming: warps of a CTA that split one tile's K (1, 2, 4, 8; divides fp4_warps; 0: default)
  int pdl_early = -1;  // under PDL, each warp's first weight loads issued before it waits for the previous kernel:
                       // -1 auto (FP8 dense: on; MoE: off), 0 off, 1 on. MoE (the per-tile W4A16 kernel, no group
                       // table) also reads idx before the wait, so idx must have been written at least two launches
                       // back (moe_down after moe_gate_up sets 1; fp4_kernel 0 keeps it where down runs per-tile)
  // FP8 (W8A16) dense only: the shared-activation kernel (gemv_xs.cuh): `warps` 16-row tiles per block, a warp
  // each, over the block's K range (kblocks along K, any token count; workspace: gemv_workspace), the pass's
  // activations of that range staged in shared memory once per block;
  // token_groups 2, 4 or 8 (0: enough for up to 64 tokens, at least 2); fp8_unroll 1 or 2 (0) chunks in flight
  // (gate/up: 1).
  int shared_x = 0;
  // cuda.l2_evict_first (set by launch_gemv while an EvictFirstScope lives): the weights' 16-byte loads carry an L2
  // evict-first policy (else evict-normal); every decode GEMV kernel (per-tile, shared-activation, FP4 streaming).
  int l2_evict_first = 0;
  // cuda.topk_in_experts (MXFP4 W4A16 gate/up, one token, n * topk <= 8, the per-tile kernel; idx unused): each
  // block ranks the gate's logits itself after its wait (route_token_warp at route_variant, one warp; the bias
  // requested before it) and serves the expert of its slot; block (0, 0) stores idx, the weights and the selection
  // scores before it lets the next kernel launch (gemv.cu).
  RouteArgs route;
  int route_variant = 0;  // 0: idx as given; 1-5: route_warp_variant(route)
  HcPartArgs hc;          // epi kHcPart (cuda.hc_fold)
};
// Warps per block of a dense decode GEMV over `tiles` 16-row tiles of `chunks` 128-column chunks: the fewest in {1,
// 2, 4, 8} that put >= 2048 warps on the GPU, at most one per chunk (the rule dense_split in backend.cpp explains).
int gemv_dense_warps(int64_t tiles, int64_t chunks);
// The workspace a launch with a split of K across blocks needs (none without): floats of partial sums and counters.
struct GemvWorkspace {
  size_t floats = 0, counters = 0;
};
GemvWorkspace gemv_workspace(const GemvArgs& a);
// The shared-activation kernel (GemvArgs::shared_x): its token groups per pass for n tokens when token_groups is 0
// (enough for up to 64, at least 2), and a launch's staged activations per block (at most kGemvXsMaxSmem).
int gemv_xs_token_groups(int n);
size_t gemv_xs_smem(const GemvArgs& a);
constexpr size_t kGemvXsMaxSmem = size_t(200) * 1024;
void launch_gemv(const GemvArgs& a, Stream s);  // activations must be f16 (act == kF16); BF16 weights: bf16 (kBF16)
// out[r, k] = f16(x[r * ldx + k]) for r < n, k < cols (x an Act).
void launch_to_f16(const void* x, int act, int n, int64_t cols, int64_t ldx, uint16_t* out, Stream s);
// ---- FP8 prefill GEMMs' helpers (fp8_gemm.cu) ----
// out [rows, cols] bf16 = E4M3 code x 2^(scale byte - 127) per 128x128 block (E8M0 scales [rows/128, s_ld]); exact for
// the scales fp8_gemm_exact admits. cols % 128 == 0; codes and out 16-byte aligned.
void launch_fp8_dequant_bf16(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, int64_t s_ld, uint16_t* out,
                             Stream s);
// out[r, k] = bf16(x[r * ldx + k]) for r < n, k < cols (x an Act), round to nearest even.
void launch_to_bf16(const void* x, int act, int n, int64_t cols, int64_t ldx, uint16_t* out, Stream s);
// h[t, c] = bf16(silu(min(gu[t, c], L)) * clamp(gu[t, I + c], -L, L)) (gu [n, 2I] fp32; L +inf: no clamp).
void launch_swiglu_bf16(const float* gu, int n, int64_t I, float limit, uint16_t* h, Stream s);

// y[t, :] = out_scale * sum_k weight[t, k] * ys[t*K + k, :] (+ add[t, :])
void launch_combine(const float* ys, const float* weight, int n, int K, int64_t D, float out_scale, const float* add,
                    float* y, Stream s);

// ---- router (router.cu) ----
struct RouterArgs {
  const uint16_t* gate = nullptr;   // bf16 [E, D]
  const float* bias = nullptr;      // [E] (learned)
  const int32_t* tid2eid = nullptr; // [V, K] (hash)
  const int32_t* tokens = nullptr;  // [n] (hash)
  const void* x = nullptr;
  int act = kF32, n = 0;
  int64_t E = 0, K = 0, D = 0;
  int score = 0;   // ScoreFunc: 0 sqrtsoftplus, 1 sigmoid, 2 softmax
  int hash = 0, renorm = 1;
  float fold = 1.0f;  // multiplies the renormalized weights (routed_scaling_factor for the Folded placement)
  int32_t* idx = nullptr;
  float* weight = nullptr;
  float* logits = nullptr;
  float* select = nullptr;
  uint16_t* x16 = nullptr;    // optional: f16 copy of x [n, D] (the activations the expert kernels take)
  double* partial = nullptr;  // [ksplit, n, E]
  unsigned* counter = nullptr;  // router_counters(n) zeroed counters (each launch leaves them zero)
};
int router_ksplit(int64_t D);  // blocks along D the router uses (partial holds ksplit * n * E doubles)
int router_counters(int n);    // counters the router uses for n tokens (one per chunk of 8 tokens)
void launch_router(const RouterArgs& a, Stream s);

// ---- prefill MoE: grouped GEMM over the MXFP4 experts (moe_prefill.cu) ----
// The routing [n, K] grouped on the device into per-expert slot lists (slot order, i.e. token order, within an
// expert) and a table of tiles of up to kGroupTokens slots of one expert. One int32 buffer: [0] the tile count,
// offs [E + 1] (expert e's slots are list[offs[e] .. offs[e + 1])), list [slots], tiles [max_tiles][2] (expert,
// first list position). Slots whose expert id is outside [0, E) are left out (their outputs are not written).
constexpr int kGroupTokens = 64;
struct GroupLayout {
  int64_t offs = 0, list = 0, tiles = 0, max_tiles = 0, ints = 0;  // offsets in int32 words; ints: the whole buffer
};
inline GroupLayout group_layout(int64_t slots, int64_t E) {
  GroupLayout g;
  // sum_e ceil(c_e / T) <= slots / T + (experts with slots), rounded up
  g.max_tiles = (slots + kGroupTokens - 1) / kGroupTokens + (E < slots ? E : slots);
  g.offs = 4, g.list = g.offs + E + 1, g.tiles = g.list + slots, g.ints = g.tiles + 2 * g.max_tiles;
  return g;
}
void launch_moe_group(const int32_t* idx, int slots, int E, int32_t* groups, Stream s);  // E <= 1024

struct GroupedArgs {
  int nmat = 2;  // 2: w1 and w3 with SwiGLU (and pre_weight), f16 out; 1: one matrix, fp32 out
  const uint8_t* w[2] = {nullptr, nullptr};  // codes of expert 0 (decode layout)
  const void* s[2] = {nullptr, nullptr};     // E8M0 scales of expert 0, [rows, cols/32]
  int64_t w_prob_stride = 0, s_prob_stride = 0;  // bytes from one expert to the next
  int64_t rows = 0, cols = 0;
  const void* x = nullptr;  // f16; slot s reads row s / x_div, rows x_ld elements apart
  int64_t x_ld = 0;
  int x_div = 1;
  void* out = nullptr;  // row = slot, o_ld elements apart
  int64_t o_ld = 0;
  const int32_t* groups = nullptr;  // launch_moe_group's buffer
  int slots = 0, E = 0;
  const float* pre_weight = nullptr;  // nmat 2: h *= pre_weight[slot]
  float limit = 0.0f;
  int variant = -1;  // kernel variant 0..kGroupedVariants - 1 (moe_prefill.cu; `plumb bench` times each); < 0: the default
  // Variants 2-6 fold the E8M0 scale into the f16 weights (moe_prefill.cu): per matrix, the word added to the
  // scale bytes to make the f16 exponent fields of the multipliers, and the fp32 factor that takes the fold out of
  // the outputs (fold_scales). fold_ok false: the matrices' scale range does not allow it (default: variant 1).
  bool fold_ok = false;
  uint32_t fold_add[2] = {0, 0};
  float fold_unscale[2] = {0.0f, 0.0f};
};
// The default variant where the scales fold (fold_ok); variant 1 where they do not.
constexpr int kGroupedFoldedDefault = 6;
// Variants of the grouped prefill GEMMs (0..6; variants 5 and 6 give variant 4's bits, moe_prefill.cu).
constexpr int kGroupedVariants = 7;
// Whether matrices whose E8M0 scale bytes lie in [lo, hi] can take the folded-scale kernels, and their constants.
// Byte b becomes the f16 multiplier 2^(b - hi - 13) (exponent field b - hi + 30, in [6, 30] for hi - lo <= 24), so
// a code v (entering as v * 2^-14, fp4_frag) becomes v * 2^(b - hi + 1) = v * 2^(b - 127) * 2^(128 - hi): exact in
// f16 (|v| in {0.5 .. 6} has two significant bits at most, its lowest >= 2^-1; 0.5 * 2^-23 = 2^-24 is the least
// f16 subnormal, 6 * 2 = 12 is far below the largest normal). The fp32 outputs are multiplied by 2^(hi - 128).
inline bool fold_scales(int lo, int hi, uint32_t& add, float& unscale) {
  if (lo < 0 || hi > 254 || hi - lo > 24 || hi < 2) return false;
  add = uint32_t(30 - hi) * 0x01010101u;  // per byte, no carry or borrow: b - hi + 30 stays in [6, 30]
  unscale = std::ldexp(1.0f, hi - 128);
  return true;
}
void launch_moe_grouped(const GroupedArgs& a, Stream s);

}  // namespace plumb::cuda::detail
