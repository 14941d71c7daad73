// Host side of the CUDA forward pass: the model's weights as uploaded (checkpoint layouts kept), the per-session
// device caches and scratch, and taps that copy device tensors to the host (and back, for teacher forcing).
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/api.h"
#include "cuda/fwd_kernels.h"
#include "model/model.h"

namespace plumb::cuda {

// Why a model whose bound weights take `weight_bytes` in their checkpoint formats (a lower bound of what the
// backend uploads) cannot go onto a GPU with `free_bytes` free of `total_bytes`; empty when they fit.
// suggest_host_experts: name cuda.host_experts as a way out (not where it is on and places nothing).
std::string weights_fit_problem(uint64_t weight_bytes, size_t free_bytes, size_t total_bytes, const std::string& gpu,
                                bool suggest_host_experts = true);

// cuda.host_experts' placement: the last `layers` layers with routed experts on cuda.moe_mxfp4's path keep their
// codes (`host_bytes`) in pinned host memory. `expert_bytes[i]`: layer i's code bytes (expert_code_bytes), 0 for a
// layer whose experts take another path. requested > 0 takes that many such layers (all there are if fewer); 0 as
// many as the weights need to fit beside host_experts_reserve(total_bytes), at least one; none where no layer's
// experts take that path (the patch does not apply). `problem`: why the rest still does not fit (empty when it does).
struct HostExpertPlan {
  std::vector<char> host;  // per layer: its experts' codes in host memory
  int layers = 0;
  uint64_t host_bytes = 0;
  std::string problem;
};
// What the automatic count leaves free beside the weights: the caches, the forward's scratch (a 2048-token prefill
// pass's activations) and the fast paths' copies, ~2-3 GB on V4-Flash at a 64K context; 4 GB + 2 % of the GPU.
uint64_t host_experts_reserve(size_t total_bytes);
HostExpertPlan plan_host_experts(uint64_t weight_bytes, const std::vector<uint64_t>& expert_bytes, size_t free_bytes,
                                 size_t total_bytes, int requested, const std::string& gpu);

// Inside a catch block: rethrows the exception being handled with `what` (what the failed work was for: "the
// forward's scratch buffer 'x' (N bytes)") in front of its message, a plumb::Error still an Error (callers that go on
// after a bad input catch that type), any other std::exception as std::runtime_error. dmalloc's out-of-memory message
// names the sizes; this names their purpose.
[[noreturn]] void rethrow_for(const std::string& what);

// A weight matrix on the device exactly as the checkpoint stores it (FP8 / packed FP4 codes, scales, or plain).
// With `fp8_fast` (patch cuda.fp8_gemv) an FP8 matrix whose shape the W8A16 kernels take is held as an Fp8Matrix
// (the same bytes) and `d` points into it, so both paths read one copy.
struct GMat {
  DeviceBuffer w, s;
  detail::DMat d;
  std::shared_ptr<Fp8Matrix> fp8;
  int gemm_min = 0;  // cuda.prefill_gemm: chunks of at least this many tokens run fp8_linear_gemm, or
                     // bf16_linear_gemm for a plain bf16 matrix (0: never)
  int gemv16_max = 0;  // cuda.bf16_gemv: a plain bf16 matrix at 2 .. this many tokens runs bf16_linear_gemv_multi
                       // (0: never; it goes before gemm_min)
  // cuda.fp8_gemv under the official numerics, wo_a only: the bf16 copy of this FP8 matrix that DeepSeek's convert.py
  // makes (every code x scale exact in bf16: fp8_gemm_exact), for the bf16 tensor cores; empty otherwise.
  DeviceBuffer w16;
};
GMat upload_matrix(const Matrix& m, bool fp8_fast = false);
// The bf16 copy of an FP8 matrix (GMat::w16) when its shape (rows % 16, cols % 128) and block scales make it exact;
// empty otherwise.
DeviceBuffer bf16_copy_if_exact(const Matrix& m);
bool fp8_fast_fits(const Matrix& m);  // FP8, rows % 16 == 0, cols % 128 == 0
DeviceBuffer upload_tensor(const Tensor& t);  // fp32
// The bytes a matrix's kernels stream (codes, or plain values; not the small scale arrays).
struct ByteRange {
  const void* p = nullptr;
  int64_t bytes = 0;
};
inline ByteRange weight_bytes(const GMat& g) { return {g.d.w, int64_t(g.fp8 ? g.fp8->codes.bytes() : g.w.bytes())}; }
inline const float* f32(const DeviceBuffer& b) { return b.as<float>(); }

struct GpuRope {
  DeviceBuffer inv_freq;
  int dim = 0;
  float attention_factor = 1.0f;
  // Rotates the last dim values of `rows` rows (ld apart, each row ending at off + dim) at position
  // *dpos + (r / per_pos) (dpos: the device position of the chunk's first token).
  // round_bf16: the rotated values rounded to bf16 (the official numerics' rope then act).
  void apply(float* x, int64_t rows, int64_t ld, int64_t off, const int64_t* dpos, int64_t per_pos, bool inverse,
             bool round_bf16 = false) const;
};
GpuRope upload_rope(const ops::Rope& r);

struct GpuHc {
  DeviceBuffer fn, base, scale;
};
struct GpuComp {
  GMat wkv, wgate;
  DeviceBuffer ape, norm;
  int rate = 0, dim = 0;
  bool overlap = false;
};
struct GpuAttn {
  GMat wq_a, wq_b, wkv, wo_a, wo_b;
  DeviceBuffer q_norm, kv_norm, sink;
  std::unique_ptr<GpuComp> comp, icomp;  // CSA / HCA; CSA's indexer keys
  GMat iwq_b, iweights;                  // CSA indexer: wq_b, weights_proj
  bool splitk = false;                   // attn.splitk_decode: fwd_attend_splitk instead of fwd_attend
  bool splitk_f16 = false;               // attn.splitk_f16: its products on the f16 tensor cores
  bool index_tc = false;                 // indexer.tc_scores: the indexer's scores on the tensor cores where they fit
  bool index_dmma = false;               // indexer.dmma_scores: its dots on the fp64 tensor cores where they fit
  bool skip_short = false;               // indexer.skip_short: every visible entry while the top-k would take them all
  bool rows_indexer = false;             // cuda.batch_rows_indexer: a batch's indexer over its rows (gpu_attention)
  bool rows_mixed = false;               // cuda.batch_rows_mixed: and its rows on both sides of the limit (gpu_attention)
  bool comp_deferred = false;            // cuda.comp_deferred: one-token steps project the compressors' rows per window
  bool iweights_gemv = false;            // cuda.bf16_gemv under the official numerics: weights_proj on the bf16 GEMV
};
struct GpuExperts {           // E matrices each of w1, w2, w3 and their descriptors as device arrays
  std::vector<GMat> w1, w2, w3;
  DeviceBuffer d1, d2, d3;   // detail::DMat[E]
};
struct GpuMoe {
  GMat gate;
  DeviceBuffer bias, tid2eid;  // learned: [E] f32; hash: [V, K] int32
  GpuExperts routed;
  std::unique_ptr<GMat> s1, s2, s3;  // the shared expert
  DeviceBuffer shared_desc;          // detail::DMat[3]: s1, s2, s3
  DeviceBuffer sb1, sb2, sb3;        // mlp_bias (not under the official numerics): the shared MLP's biases, f32 [I] [D] [I]
  std::unique_ptr<MoeExperts> fp4;   // cuda.moe_mxfp4: the routed experts in the decode layout (instead of `routed`)
  std::unique_ptr<Fp8Expert> sfp8;   // cuda.fp8_gemv: the shared expert for the fused kernel (instead of s1..s3)
  int shared_gemm_min = 0;           // cuda.prefill_gemm: chunks of at least this many tokens run fp8_expert_ffn_gemm
};
struct GpuLayer {
  DeviceBuffer attn_norm, ffn_norm;
  GpuHc hc_attn, hc_ffn;
  GpuAttn attn;
  GpuMoe moe;
};
struct GpuWeights {
  GMat embed, head;
  DeviceBuffer norm;
  GpuHc hc_head;
  std::vector<GpuLayer> layers;
  GpuRope rope_main, rope_compress;
};

// Per-op device time of one forward, for `plumb bench --layers` (off unless asked): CUDA events around named
// regions, summed by name (collect). Regions do not nest on one stream. With `timeline` the forward keeps its
// streams and its graph (the events become nodes of the captured graph, recorded at each replay: gpu_model keeps
// that graph apart), each region's events go to the stream it began on, and collect_timeline gives each region's
// start and end in the last forward that recorded them.
class OpTimer {
 public:
  ~OpTimer();
  bool on = false, timeline = false;
  size_t begin(const char* name);  // the region's index
  void end(size_t i);
  // Synchronizes; returns (name, ms) in first-seen order and clears.
  std::vector<std::pair<std::string, double>> collect();
  struct Span {
    std::string name;
    double start_us, end_us;  // from the first region's start
  };
  // Synchronizes; the regions from index `from` on (times from that region's start), in the order they began on the
  // host; clears.
  std::vector<Span> collect_timeline(size_t from = 0);
  size_t count() const { return marks_.size(); }
  void clear();                          // drops the regions recorded so far

 private:
  struct Mark {
    std::string name;
    void* begin = nullptr;
    void* end = nullptr;
    Stream stream = nullptr;  // timeline: the stream the region began on
  };
  std::vector<Mark> marks_;
  std::vector<void*> pool_;
  size_t used_ = 0;
  void* event();
};
// RAII: times [construction, destruction) when the timer is on. A `detail` region (one kernel or step inside an op
// region, named "op/step") is recorded only in a timeline, so the per-op sums stay the op regions'.
struct OpRegion {
  OpTimer& t;
  size_t i = 0;
  bool on;
  OpRegion(OpTimer& timer, const char* name, bool detail = false) : t(timer), on(t.on && (!detail || t.timeline)) {
    if (on) i = t.begin(name);
  }
  ~OpRegion() {
    if (on) t.end(i);
  }
};

// Growable named device scratch: a name keeps its buffer across calls, growing (contents dropped) on demand.
// Also the workspace of the fast kernels (split-K partials, f16 activations), the side streams and the counters the
// tests read. One per loaded model, shared by all its sessions (DeviceSessionState::scratch): a forward's buffers
// live only for that call, so sessions need no copy of their own, and one session's 2048-token prefill (~0.3 GB of
// attention queries alone at V4-Flash's dimensions) is not kept once per session. `generation` counts every
// reallocation of these buffers: a captured graph is valid while it (and its sessions' cache generations) is
// unchanged. Forwards take `use` for their whole call (GpuForward), so two threads' sessions take turns.
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch();
  Workspace ws;
  OpTimer timer;
  uint64_t generation = 0;
  // cuda.streams: the side stream and its fork/join events (enable_side, once, outside any capture), its own
  // workspace (one workspace must not serve concurrent launches), and `branch`: the side stream this forward may
  // use (null: everything serial on the thread's stream, as with taps or per-op timing).
  Workspace ws_side;
  Stream side = nullptr, branch = nullptr;
  void* ev_fork = nullptr;
  void* ev_join = nullptr;
  void* ev_entries = nullptr;  // the CSA compressor's entries written on side2 (indexer.skip_short: gpu_attention)
  // The second side stream (lane 2; the attention's compressors beside its KV row on the first) and its workspace.
  Workspace ws_side2;
  Stream side2 = nullptr, branch2 = nullptr;
  // The third (hc_pre's gates apart: fwd_hc_gates beside the sublayer, joined before the next hc_pre) and its events.
  Stream side3 = nullptr, gates = nullptr;
  void* ev_gates_fork = nullptr;
  void* ev_gates_join = nullptr;
  void enable_side();
  // cuda.branch_flags (BranchWait, kernels.h): the flags' device words (zeroed by enable_side), the slots this forward
  // took, and `flags`: whether this forward may leave branches to their readers' in-kernel waits (set by the forward;
  // false: every branch joins).
  static constexpr int kSyncSlots = 1024;
  DeviceBuffer sync_words;
  unsigned* sync() const { return sync_words.as<unsigned>(); }
  int sync_used = 0;
  bool flags = false;
  int64_t branch_signals = 0;  // signal launches (host count of eager calls and captures; tests)
  // At the forward's start: whether it uses the flags, no slot taken, no stream to join (a forward that threw left
  // them: a capture must not join a stream it never forked).
  void start_signals(bool on);
  // The end of `side`'s work enqueued so far, for the launch about to read it: with `flags` and `in_kernel` (that
  // launch waits in-kernel: branch_wait_fits of its grid), a signal launched on `side` and its slot added to `w`, the
  // stream noted for the forward's final join; else (or with every slot taken) `side` joined here with event `ev`.
  // A null `side` does nothing.
  void wait_or_join(detail::BranchWait& w, bool in_kernel, Stream side, void* ev);
  // With `flags` or `early_joins`: `side` is left unjoined until the forward's end (its remaining work is read by no
  // launch of this forward); without, joined here with event `ev`.
  void join_later(Stream side, void* ev);
  // cuda.early_joins (set by the forward, without `flags`): a graph node that joins a side stream is launched only once
  // all its upstream kernels have completed, ~2 us after the kernel before it, even though the capture makes both edges
  // programmatic (sessions 42-43), so branches are joined where a launch joins anyway.
  // The gates apart of the hc_pre before the attention (`gates_to_join`, left by the forward) are joined with the
  // attention's own branches (join_deferred_gates, just before its launch), and CSA's indexer keys at the forward's
  // end (join_later): the FFN's hc_pre then joins nothing and keeps its PDL edge.
  bool early_joins = false;
  Stream gates_to_join = nullptr;
  void join_deferred_gates();
  // At the forward's end: joins every stream left unjoined (a graph's branches must all join).
  void join_signalled();
  // cuda.l2_prefetch: the prefetch stream and its events (enable_prefetch, once, outside any capture); `prefetch`:
  // the stream this forward may prefetch on (null: no prefetches).
  Stream pf = nullptr, prefetch = nullptr;
  bool pf_weights = false;  // cuda.l2_prefetch (the weights and hc_pre's fn); without it cuda.hc_prefetch: the fn alone
  void* ev_pf_fork = nullptr;
  void* ev_pf_join = nullptr;
  bool pf_forked = false;  // this forward forked the prefetch stream (only then may it join: a capture cannot wait
                           // for an event recorded outside it)
  void enable_prefetch();
  // Forks the prefetch stream here and queues these ranges' lines into L2 on it, at most kPrefetchBudget bytes in
  // the order given (no-op without `prefetch`); the forward joins the stream once, at its end.
  static constexpr int64_t kPrefetchBudget = int64_t(32) << 20;
  void prefetch_l2(std::initializer_list<ByteRange> ranges);
  // The workspace of the stream launches go to now (ws_side / ws_side2 inside a StreamScope of lane 1 / 2).
  Workspace& work() {
    const int lane = detail::stream_lane();
    return lane == 2 ? ws_side2 : lane == 1 ? ws_side : ws;
  }
  size_t gemm_w_elems = 0;  // cuda.prefill_gemm: the largest bf16 weight any GEMM dequantizes (allocated once)
  int64_t gemm_calls = 0;   // cuda.prefill_gemm: projections that ran as GEMMs (host count of eager calls; tests)
  // The official numerics on the tensor cores: W4A8 expert chunks, W8A8 projections and bf16 wo_a launches run
  // (cuda.moe_mxfp4, cuda.fp8_gemv; host count of eager calls; tests).
  int64_t official_tc_calls = 0;
  // cuda.batch_rows: attention sublayers whose per-session launches ran as one per kind, by AttnType (sliding, CSA,
  // HCA; counted as hc_folds)
  std::array<int64_t, 3> batch_rows{};
  int64_t batch_rows_indexed = 0;  // of those (CSA), the ones whose indexer ran batched too
  int64_t batch_rows_mixed = 0;    // of those, the ones with rows on both sides of the indexer's limit (per-row types)
  int64_t hc_folds = 0;  // cuda.hc_fold: wo_b launches that ran the FFN hc_pre's start (host count of eager calls and captures; tests)
  int64_t gemv16_calls = 0;  // cuda.bf16_gemv: launches of the bf16 GEMV (host count of eager calls; tests)
  float* f(const std::string& name, int64_t count) { return static_cast<float*>(get(name, size_t(count) * 4)); }
  void* get(const std::string& name, size_t bytes);
  size_t bytes() const;  // the named buffers' device bytes (not the workspaces')
  std::mutex use;  // held by each of GpuForward's device calls for its whole call (none calls another)

 private:
  std::map<std::string, DeviceBuffer> bufs_;
  Stream signalled_[4] = {};  // the streams join_signalled joins
};

// Where a forward chunk sits in the timeline. Kernels read the position from `dpos` (device memory, written before
// each step), never from a launch argument, so a captured graph serves every step. `bounds`: size grids and strides
// by the caches' capacity instead of this step's exact counts (graph mode; the results are the same).
struct Step {
  const int64_t* dpos = nullptr;
  int64_t pos0 = 0;  // the same position on the host: exact sizes, capacity checks
  bool bounds = false;
  // cuda.comp_deferred (comp_defer_mode): whether this step may defer its compressors' projections (one token), and
  // the position from which every earlier step did (INT64_MAX: none).
  bool defer = false;
  int64_t defer_from = INT64_MAX;
};

// y[t * ldy + r] = W x[t * ldx], all rows: the W8A16 kernel when the matrix has one (cuda.fp8_gemv), the bf16 GEMM
// for chunks of at least w.gemm_min tokens (cuda.prefill_gemm), else the fp32 twin. x16 (optional): x as f16 rows with the same ld, which the W8A16 kernel then reads instead of
// converting x again.
void linear(const GMat& w, const float* x, int n, int64_t ldx, float* y, int64_t ldy, Scratch& sc, const uint16_t* x16 = nullptr);
// A row-major bf16 matrix as stored (the compressors' projections): what cuda.prefill_gemm's GEMM and cuda.bf16_gemv
// take as is.
inline bool plain_bf16(const GMat& w) { return !w.fp8 && w.d.layout == 0 && w.d.dtype == 1; }
// Whether linear() runs a plain bf16 matrix as a bf16 GEMM (cuda.prefill_gemm) for n tokens.
bool bf16_gemm_applies(const GMat& w, int n);
bool bf16_gemv_applies(const GMat& w, int n);  // cuda.bf16_gemv for these n tokens
Fp8GemmBuffers gemv16_buffers(Scratch& sc, size_t x_elems);  // its bf16 x (counted in gemv16_calls)

// cuda.prefill_gemm's scratch from the model's Scratch: the bf16 weight (at least sc.gemm_w_elems), the bf16
// activations (x_elems), the shared expert's gu / h (gu_elems, h_elems; 0: not needed) and, unless `cublas` is
// false (a caller that runs no cuBLASLt GEMM on them), cuBLASLt's workspace of the current stream lane.
Fp8GemmBuffers gemm_buffers(Scratch& sc, size_t x_elems, size_t w_elems, size_t gu_elems = 0, size_t h_elems = 0,
                            bool cublas = true);
// cuBLASLt's workspace in sc (GemmDesc::workspace: one per stream lane, like every scratch name).
void* gemm_workspace(Scratch& sc);

// Grows b to hold at least `bytes`, keeping its first `keep` bytes (doubling, so appends are amortized); the rest
// is zeros. Returns whether it reallocated.
bool grow_keep(DeviceBuffer& b, size_t bytes, size_t keep);
// A buffer of `bytes` zeros (session state that kernels may read before every byte is written).
DeviceBuffer zeroed(size_t bytes);

// Device tensors at tap points: put copies to the host; io also lets the sink substitute (teacher forcing) and
// copies the substitute back.
Tensor download(const float* d, const Shape& shape);
void tap_put(const Tap& tap, const char* name, const float* d, const Shape& shape);
void tap_io(const Tap& tap, const char* name, float* d, const Shape& shape);

}  // namespace plumb::cuda

namespace plumb {

// One compressor's caches on the device (see CompressorState and CompressArgs): the pending rows of the
// incomplete window as a ring [m, width] (kv and gate; position q at slot q % m), CSA's previous first-half series
// [m, c] (gate + ape), entries [capacity, c] normed and rotated (entry w at row w). How many rows are pending and
// how many entries exist follow from the position alone (pos % m, pos / m), so they are not stored.
struct GpuCompState {
  cuda::DeviceBuffer pend_kv, pend_gate, prev_kv, prev_gate, entries;
  int64_t capacity = 0;  // rows of `entries`
};
struct GpuLayerState {
  cuda::DeviceBuffer ring;  // [window, head_dim]: key of position p at slot p % window
  GpuCompState comp, icomp;
  // cuda.comp_deferred (comp_defer_mode): the one-token steps' attention inputs x [rate, hidden] at slot p % rate,
  // until the window's last token projects them; xpos: the first position of the rows projected (device int64).
  cuda::DeviceBuffer xring, xpos;
};
// A captured forward for chunks of n tokens (cuda.graph): valid while the generations of the scratch and of the
// caches of the sessions it reads (one; forward_batch's: each of its sessions, in order) and the fast kernels'
// workspace are what they were at capture.
struct GpuGraph {
  void* exec = nullptr;  // cudaGraphExec_t
  const float* logits = nullptr;  // where the graph leaves them
  std::vector<uint64_t> generations;
  std::array<const void*, 9> workspace{};
  bool warm = false;  // ran once eagerly with graph bounds at `generations`: the next step may capture
  GpuGraph() = default;
  GpuGraph(const GpuGraph&) = delete;
  GpuGraph& operator=(const GpuGraph&) = delete;
  ~GpuGraph();
};
struct DeviceSessionState {
  explicit DeviceSessionState(std::shared_ptr<cuda::Scratch> shared) : scratch_owner(std::move(shared)) {}
  std::vector<GpuLayerState> layers;
  std::shared_ptr<cuda::Scratch> scratch_owner;  // the model's, shared by its sessions (see Scratch)
  cuda::Scratch& scratch = *scratch_owner;
  uint64_t generation = 0;  // reallocations of this session's caches (a captured graph that reads them checks it)
  int64_t cache_bytes() const;  // the caches' device bytes
  std::map<int64_t, std::unique_ptr<GpuGraph>> graphs;  // by chunk size (and what else changes the launches)
  // forward_batch's captured steps, kept by the batch's first session: by its sessions' ids (in order), the CSA layers
  // each skips its indexer in, and the timer's and --skeleton's bits.
  std::map<std::vector<int64_t>, std::unique_ptr<GpuGraph>> batch_graphs;
  const uint64_t id = next_id();  // this state's, unique in the process (batch_graphs' keys: an address may be reused)
  static uint64_t next_id();
  int64_t defer_from = 0;  // cuda.comp_deferred: every step from this position on was a deferring one-token step
  int64_t comp_windows_projected = 0;  // cuda.comp_deferred: steps that projected a window's kept rows (tests)
  bool graphs_failed = false;                        // a capture failed: eager launches from then on
  int64_t graph_launches = 0, graph_captures = 0;    // for tests and the bench
  int64_t prefetch_steps = 0;  // cuda.l2_prefetch: forwards run eagerly or captured with the weights' prefetch (tests)
  cuda::HostStage stage;  // each step's inputs (tokens, position, sampling) uploaded without blocking the host
};

}  // namespace plumb
