// The CUDA backend's host API (plain C++: no CUDA header needed to use it). Built only with -DPLUMB_CUDA=ON; without
// it, available() says so and run_bench() fails with that message (src/cuda/stub.cpp), nothing else is linked.
//
// First slice of issue 6: the decode kernels that stream weights (routed MXFP4 experts, FP8 block-scaled
// projections and shared expert) and the router. Every kernel has a CPU twin in tests/cuda and a differential test.
//
// Numerics of the weight-streaming kernels (W4A16 / W8A16): weights stay in their checkpoint formats in device
// memory (packed E2M1 + E8M0 per 32, or E4M3 + 128x128 E8M0/F32 blocks) and are converted to fp16 in registers;
// activations (fp32, bf16 or fp16 in memory) enter the tensor cores as fp16; products accumulate in fp32 and
// the block scales are applied to the fp32 partial sums. Every weight value is exact in fp16; the activation's
// fp16 rounding (2^-11 relative, finer than bf16) is the only rounding before accumulation. fp16's range
// (|x| < 65504) holds RMS-normed activations: |x_i| <= sqrt(D) * max|gamma| (64 * max|gamma| at D = 4096).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/experts.h"
#include "model/router.h"
#include "plumb/bench.h"

struct CUstream_st;  // cudaStream_t without the CUDA headers

namespace plumb::cuda {

namespace detail {
struct RouteArgs;   // kernels.h (fwd_route's arguments)
struct HcPartArgs;  // kernels.h (cuda.hc_fold's epilogue)
}  // namespace detail

using Stream = CUstream_st*;  // nullptr: the default stream

// ---- device and memory ----

struct DeviceInfo {
  std::string name;
  int cc_major = 0, cc_minor = 0, sm_count = 0;
  size_t l2_bytes = 0, mem_bytes = 0;
  int driver = 0, runtime = 0;
  bool check_only = false;  // the kernels were compiled with PLUMB_CUDA_CHECK_ONLY (device optimizers off)
};
// The line `plumb bench` prints for such a build (its timings are not the engine's).
inline constexpr const char* kCheckOnlyWarning =
    "warning: this build's kernels were compiled with -DPLUMB_CUDA_CHECK_ONLY=ON (device optimizers off, for machines "
    "without a GPU): these timings are not the engine's; rebuild with -DPLUMB_CUDA_CHECK_ONLY=OFF\n";

// True when a CUDA device of compute capability 9.x can run this build's kernels; otherwise false and `why`
// says what is missing (no driver, no device, another architecture, or a build without CUDA).
bool available(std::string* why = nullptr);
DeviceInfo device_info();
void memory_info(size_t& free_bytes, size_t& total_bytes);  // the current device's free and total memory, now
void synchronize();  // waits for the device; throws plumb::Error on any pending CUDA error

// Owning device allocation (cudaMalloc, or mapped pinned host memory: Place). Move-only. A host-mapped buffer's
// upload, download and fill synchronize the device and copy on the host: not while a graph is being captured.
class DeviceBuffer {
 public:
  // Where the bytes live: device memory, or pinned host memory mapped for the device (cuda.host_experts), which
  // kernels read over PCIe at the same address.
  enum class Place { Device, HostMapped };
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes, Place place = Place::Device);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_), host_(o.host_) { o.p_ = nullptr, o.n_ = 0, o.host_ = false; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return p_; }
  template <class T>
  T* as() const { return static_cast<T*>(p_); }
  size_t bytes() const { return n_; }
  void upload(const void* src, size_t bytes, size_t offset = 0);
  void download(void* dst, size_t bytes, size_t offset = 0) const;
  void fill_byte(int value);  // cudaMemset (tests poison outputs with 0xFF: NaN in fp16/fp32)
  bool in_host() const { return host_; }

 private:
  void release() noexcept;
  void* p_ = nullptr;
  size_t n_ = 0;
  bool host_ = false;
};

// Host-to-device uploads that do not block the host: the bytes are copied into pinned memory and an asynchronous
// copy is enqueued on the calling thread's stream, ordered before the launches that follow. A pageable cudaMemcpy
// waits for everything queued before it (a decode step's sampling inputs waited for the whole forward, then the
// sampling kernels were launched onto an idle GPU). Two pinned slots used in turn; a slot is refilled only after its
// last copy has run (an event), so a step may upload twice without waiting for the GPU. Move-free, one per session.
class HostStage {
 public:
  HostStage() = default;
  ~HostStage();
  HostStage(const HostStage&) = delete;
  HostStage& operator=(const HostStage&) = delete;
  void upload(void* dst, const void* src, size_t bytes);

 private:
  struct Slot {
    void* host = nullptr;  // pinned (cudaMallocHost)
    size_t cap = 0;
    void* done = nullptr;  // event after the slot's last copy
  };
  Slot slots_[2];
  int next_ = 0;
};

template <class T>
DeviceBuffer to_device(const std::vector<T>& v) {
  DeviceBuffer b(v.size() * sizeof(T));
  b.upload(v.data(), b.bytes());
  return b;
}
template <class T>
std::vector<T> to_host(const DeviceBuffer& b, size_t count) {
  std::vector<T> v(count);
  b.download(v.data(), count * sizeof(T));
  return v;
}

enum class Act { F32, BF16, F16 };  // activation storage type
size_t act_size(Act a);

// Scratch for split-K reductions and the router's partial sums. Grows on demand (a launch that grows it
// synchronizes the device first). Its counters reset themselves after each launch; one workspace must not serve
// two launches that run concurrently on different streams.
class Workspace {
 public:
  float* partial(size_t floats);        // >= floats of scratch
  unsigned* counters(size_t count);     // >= count zeroed counters
  uint16_t* half(size_t count);         // >= count f16 (activations converted for the kernels)
 private:
  DeviceBuffer partial_, counters_, half_;
};

// ---- weights ----

// The bit placement of the decode layout's words: F16 for the W4A16 kernels (codes become f16 values, the default
// numerics), A8 for the official numerics' W4A8 kernels (codes become E4M3 values; activations quantized to E4M3).
enum class Fp4Layout { F16, A8 };

// MXFP4 matrices [rows, cols] of `count` experts, in the decode layout: the checkpoint's E2M1 codes (4 bits each,
// still packed two per byte) permuted within each 16-row tile so that one 16-byte load gives a lane its tensor-core
// fragment and a warp's loads are contiguous (see repack_fp4_decode), and the checkpoint's E8M0 scales
// [rows, cols/32] unchanged.
struct Fp4Matrices {
  DeviceBuffer codes, scales;
  int64_t count = 0, rows = 0, cols = 0;
  Fp4Layout layout = Fp4Layout::F16;
  // The range of the E8M0 scale bytes over all `count` matrices (upload_fp4 measures it; whoever fills an alloc_fp4
  // on the device must set it). The prefill kernels that fold the scale into the f16 weights (moe_prefill.cu,
  // variants 2-4) need scale_hi - scale_lo <= 24; the full range (unknown) keeps them off.
  int scale_lo = 0, scale_hi = 255;
  size_t code_bytes() const { return size_t(rows * cols / 2); }   // per matrix
  size_t scale_bytes() const { return size_t(rows * cols / 32); }  // per matrix
};
// The layout permutation, on the host (exposed for tests; upload_fp4 applies it). `packed` is the checkpoint
// layout [rows, cols/2] (even column in the low nibble); rows % 16 == 0, cols % 128 == 0.
std::vector<uint8_t> repack_fp4_decode(const uint8_t* packed, int64_t rows, int64_t cols, Fp4Layout layout = Fp4Layout::F16);
std::vector<uint8_t> unpack_fp4_decode(const uint8_t* repacked, int64_t rows, int64_t cols,
                                       Fp4Layout layout = Fp4Layout::F16);  // the inverse
// Uploads `count` matrices given in the checkpoint layout (codes [rows, cols/2] and E8M0 scales [rows, cols/32]).
// codes_at: where the codes go (HostMapped: cuda.host_experts); the scales always go to the device.
Fp4Matrices upload_fp4(const std::vector<const uint8_t*>& codes, const std::vector<const uint8_t*>& scales, int64_t rows,
                       int64_t cols, Fp4Layout layout = Fp4Layout::F16, DeviceBuffer::Place codes_at = DeviceBuffer::Place::Device);
// Allocation only (the bench fills it with random codes on the device).
Fp4Matrices alloc_fp4(int64_t count, int64_t rows, int64_t cols, DeviceBuffer::Place codes_at = DeviceBuffer::Place::Device);

// An FP8 E4M3 matrix [rows, cols] with 128x128 block scales [ceil(rows/128), ceil(cols/128)], E8M0 or F32.
struct Fp8Matrix {
  DeviceBuffer codes, scales;
  int64_t rows = 0, cols = 0;
  bool scale_f32 = false;
  int64_t scale_cols() const { return (cols + 127) / 128; }
  size_t scale_bytes() const { return size_t(((rows + 127) / 128) * scale_cols()) * (scale_f32 ? 4 : 1); }
};
Fp8Matrix upload_fp8(const uint8_t* codes, const void* scales, bool scale_f32, int64_t rows, int64_t cols);
Fp8Matrix alloc_fp8(int64_t rows, int64_t cols, bool scale_f32 = false);

// The routed experts of one MoE layer: w1 (gate) and w3 (up) [I, D], w2 (down) [D, I], for E experts.
struct MoeExperts {
  Fp4Matrices w1, w3, w2;
  int64_t E = 0, D = 0, I = 0;
};
// The shared expert (FP8): w1, w3 [I, D], w2 [D, I].
struct Fp8Expert {
  Fp8Matrix w1, w3, w2;
};
// Router parameters: gate [E, D] bf16 (as the checkpoint holds it), bias [E] f32 (learned layers), tid2eid [V, K]
// int32 (hash layers).
struct RouterWeights {
  DeviceBuffer gate, bias, tid2eid;
  int64_t E = 0, D = 0, vocab = 0;
};

// From the reference backend's views of a checkpoint (model/weights.h): the codes and scales are recovered
// exactly from Matrix::row_raw. FP8 scales are kept as E8M0 when every one is a power of two, else as F32.
Fp4Matrices upload_fp4(const std::vector<const Matrix*>& mats, Fp4Layout layout = Fp4Layout::F16,
                       DeviceBuffer::Place codes_at = DeviceBuffer::Place::Device);  // FP4Group, one shape
Fp8Matrix upload_fp8(const Matrix& m);                                                             // FP8Block
MoeExperts upload_experts(const MoeWeights& w, Fp4Layout layout = Fp4Layout::F16,
                          DeviceBuffer::Place codes_at = DeviceBuffer::Place::Device);  // routed experts (FP4)
// The bytes upload_experts places with codes_at (every expert's w1, w3 and w2 codes): what cuda.host_experts keeps
// in host memory per layer.
size_t expert_code_bytes(const MoeWeights& w);
Fp8Expert upload_expert_fp8(const ExpertWeights& e);             // e.g. the shared expert (FP8)
// Gate rounded to bf16 (exact for a bf16 checkpoint; the official code's bf16 parameter otherwise), bias and
// tid2eid (validated against E) when present.
RouterWeights upload_router(const MoeWeights& w, int64_t E, int64_t D);

// ---- kernels (all asynchronous on `stream`; pointers are device pointers) ----
// The weight-streaming kernels take f16 activations; an F32 or BF16 input is first converted into the
// workspace (one small launch). Producers that can write f16 directly (the router's x16) avoid it.

// y[t, :] = W x[t, :] for t < n, fp32 out. x rows are `ldx` elements apart (an Act), y rows `ldy` floats apart.
// rows % 16 == 0, cols % 128 == 0.
void fp8_linear(const Fp8Matrix& w, const void* x, Act xt, int64_t ldx, int n, float* y, int64_t ldy, Workspace& ws,
                Stream s = nullptr);
// cuda.hc_fold: fp8_linear of one token (f16 x), whose blocks then run the next hc_pre's fused hc_post on their rows
// of y and leave that hc_pre's partial sums (detail::HcPartArgs, kernels.h). w.rows == hc.D, hc.H == 4, D % 16 == 0;
// throws otherwise.
void fp8_linear_hc_part(const Fp8Matrix& w, const uint16_t* x16, float* y, const detail::HcPartArgs& hc, Workspace& ws,
                        Stream s = nullptr);
// The official numerics' FP8 linear (DeepSeek's fp8_gemm): y[t, :] = bf16(sum over 128-blocks b of (the E4M3 products
// of x's codes and W's, summed in fp32) * (xs[t, b] * W's block scale)), x quantized by act_quant_e4m3 (codes [n,
// cols], scales [n, cols/128]); y rows `ldy` floats apart. The E4M3 tensor cores take both as stored.
void fp8_linear_a8(const Fp8Matrix& w, const uint8_t* x8, const float* xs, int n, float* y, int64_t ldy, Workspace& ws,
                   Stream s = nullptr);
// Grouped projection (DeepSeek's wo_a): W holds G groups of rows/G rows; group g maps x[t, g, :] (cols wide,
// x rows G*cols apart) to y[t, g*rows/G ...]. y is [n, rows]. With y16, the output goes there as f16 instead (round
// to nearest even: the bits a conversion of y would give) and y is not written: the input of a following FP8 GEMV.
void fp8_linear_grouped(const Fp8Matrix& w, int groups, const void* x, Act xt, int n, float* y, Workspace& ws,
                        Stream s = nullptr, uint16_t* y16 = nullptr);

// The shared expert: h = silu(min(W1 x, L)) * clamp(W3 x, -L, L) (fp16, [n, I] in `h`), y = W2 h (fp32 [n, D]).
// limit +inf: no clamp (swiglu_clamped's rule).
void fp8_expert_ffn(const Fp8Expert& e, const void* x, Act xt, int n, double limit, uint16_t* h, float* y, Workspace& ws,
                    Stream s = nullptr);

// ---- FP8 projections at prefill (patch cuda.prefill_gemm, src/cuda/fp8_gemm.cpp) ----
// The decode GEMVs above read every weight once per 8 tokens; at prefill the same products run as bf16 tensor-core
// GEMMs (cuBLASLt, fp32 accumulation and output): the weight dequantized into a bf16 scratch matrix (exact: an
// E4M3 value times a power of two is a bf16 value when the scale is in range), the activations rounded to bf16 (the
// one rounding that differs from the GEMV path, which rounds them to f16). Callers own the scratch.
struct Fp8GemmBuffers {
  uint16_t* w = nullptr;  // bf16 weights: at least rows * cols (shared expert: 2 * I * D)
  uint16_t* x = nullptr;  // bf16 activations: at least n * (input width)
  float* gu = nullptr;    // shared expert: W1 x | W3 x, fp32 [n, 2I]
  uint16_t* h = nullptr;  // shared expert: SwiGLU output, bf16 [n, I]
  void* lt = nullptr;     // cuBLASLt's workspace (GemmDesc::workspace; null: the calling thread's): the stream lane's
                          // where gemm_buffers was called, so the GEMMs on it must run on that lane's stream
  size_t w_elems = 0, x_elems = 0, gu_elems = 0, h_elems = 0;
};
// Whether every code x scale of w is exactly a bf16 normal: E8M0 scales 2^-117 .. 2^118 (F32 scales, which the
// upload keeps only when some scale is not a power of two, are not: those matrices stay on the GEMV).
bool fp8_gemm_exact(const Fp8Matrix& w);
void fp8_dequant_bf16(const Fp8Matrix& w, uint16_t* out, Stream s = nullptr);  // out [rows, cols]
// y[t * ldy + r] = sum_k bf16(x[t * ldx + k]) * W[r, k], fp32: fp8_linear's contract on the tensor cores.
void fp8_linear_gemm(const Fp8Matrix& w, const void* x, Act xt, int64_t ldx, int n, float* y, int64_t ldy, const Fp8GemmBuffers& b,
                     Stream s = nullptr);
// The official numerics' wo_a (DeepSeek's convert.py dequantizes it to bf16; the official code's bf16 F.linear):
// y[t * G*R + g*R + r] = bf16(sum_k bf16(x[t * G*C + g*C + k]) * w[g*R + r, k]) for G groups of R rows, w bf16
// [G*R, C] row-major (fp8_dequant_bf16 of the FP8 matrix), fp32 accumulation on the bf16 tensor cores (the GEMV's
// kBf16 path, a group per grid row). x fp32 [n, G*C]; R % 16 == 0, C % 128 == 0; b.x holds x as bf16.
void bf16_linear_grouped_official(const uint16_t* w, int groups, int64_t rows_per_group, int64_t cols, const float* x, int n, float* y,
                                  const Fp8GemmBuffers& b, Stream s = nullptr);
// A plain bf16 weight w [rows, cols] (row-major, device) through the same GEMM: y[t * ldy + r] = sum_k bf16(x[t *
// ldx + k]) * w[r, k], fp32 (the weight is used as stored: no dequantization). cuda.prefill_gemm's path for the
// compressors' bf16 projections, whose alternative is the fp32 twin's fp64 GEMV.
void bf16_linear_gemm(const uint16_t* w, int64_t rows, int64_t cols, const void* x, Act xt, int64_t ldx, int n, float* y, int64_t ldy,
                      const Fp8GemmBuffers& b, Stream s = nullptr);
// bf16_linear_gemm for several weights of the same column count on the same x (the compressors' wkv and wgate, and
// the indexer's): x rounded to bf16 once, then one GEMM each; every output the bits bf16_linear_gemm gives it.
struct Bf16Proj {
  const uint16_t* w = nullptr;
  int64_t rows = 0;
  float* y = nullptr;
  int64_t ldy = 0;
};
void bf16_linear_gemm_multi(const Bf16Proj* p, int count, int64_t cols, const void* x, Act xt, int64_t ldx, int n,
                            const Fp8GemmBuffers& b, Stream s = nullptr);
// cuda.bf16_gemv: the same contract as bf16_linear_gemm_multi on the decode GEMV's bf16 tensor-core path (gemv.cu):
// x rounded to bf16 once (into b.x), then every projection in one launch (up to 4; rows % 16 == 0, cols % 128 ==
// 0), up to 32 tokens per pass over the weights. Same products, another fp32 summation order than cuBLASLt's.
void bf16_linear_gemv_multi(const Bf16Proj* p, int count, int64_t cols, const void* x, Act xt, int64_t ldx, int n,
                            const Fp8GemmBuffers& b, Stream s = nullptr);
// fp8_linear_grouped's contract (wo_a): the groups as one strided-batched GEMM.
void fp8_linear_grouped_gemm(const Fp8Matrix& w, int groups, const void* x, Act xt, int n, float* y, const Fp8GemmBuffers& b,
                             Stream s = nullptr);
// fp8_expert_ffn's contract: [W1; W3] x in one GEMM, SwiGLU (the GEMV epilogue's formula) into bf16 h, then W2 h;
// y fp32 [n, D].
void fp8_expert_ffn_gemm(const Fp8Expert& e, const void* x, Act xt, int n, double limit, float* y, const Fp8GemmBuffers& b,
                         Stream s = nullptr);

// Routing on the device: idx [n, K] int32, weight [n, K] f32 (placement P: contains routed_scaling_factor iff
// Folded), logits [n, E] f32, select [n, E] f32 (learned layers; may be null).
template <Rsf P>
struct DeviceRouting {
  int32_t* idx = nullptr;
  float* weight = nullptr;
  float* logits = nullptr;
  float* select = nullptr;
  int n = 0, K = 0;
};

struct RouterConfig {
  int64_t E = 0, K = 0, D = 0;
  ScoreFunc score = ScoreFunc::SqrtSoftplus;
  double routed_scaling = 1.0;
  bool hash = false;    // tid2eid[token] selects; no bias
  bool renorm = true;   // false: the official softmax scoring (weights are the scores)
};
RouterConfig router_config(const ModelConfig& c, MlpType type);

// One kernel for the whole token batch: fp32 logits (fp64 accumulation of x . bf16 gate, as the reference),
// stable scores, bias for selection only, top-k (equal scores: lower expert id first), renormalization with the
// 1e-20 floor, routed_scaling_factor folded in iff P == Folded. `tokens` (device, int32 [n]) for hash layers.
// `x16` (optional, [n, D]): the kernel also writes x as f16, the input of the routed experts.
template <Rsf P>
void route(const RouterWeights& w, const RouterConfig& c, const void* x, Act xt, int n, const int32_t* tokens,
           const DeviceRouting<P>& out, Workspace& ws, Stream s = nullptr, uint16_t* x16 = nullptr);

// Routed experts for decode. gate_up: for every (token t, choice k), h[t*K + k, :] = silu(min(W1_e x_t, L)) *
// clamp(W3_e x_t, -L, L) with e = idx[t, k] (times weight[t, k] when `pre_weight` is given: the official order);
// each selected expert's weights are read once per launch whichever tokens chose it. h is fp16 (`h16`) or fp32
// (`h32`, for tests); exactly one is non-null. `groups` (optional): moe_group's table for these idx, so that the
// kernel's blocks go by the table's tiles instead of each scanning every slot (the same bits; pays from a few dozen
// slots).
void moe_gate_up(const MoeExperts& m, const int32_t* idx, int n, int K, const void* x, Act xt, double limit,
                 const float* pre_weight, uint16_t* h16, float* h32, Workspace& ws, Stream s = nullptr, const void* groups = nullptr);
// ys[t*K + k, :] = W2_e h[t*K + k, :] (fp32, [n*K, D]); h as f16 (h16) or fp32 (h32, converted first). idx must
// have been written before the launch that precedes this one on the stream (moe_gate_up's, as the forward calls
// them), or by that launch before it lets this one start (moe_gate_up_ranked's): under PDL (cuda.pdl) the per-tile
// kernel reads it, and requests its first weights, before it waits for that launch (GemvArgs::pdl_early).
void moe_down(const MoeExperts& m, const int32_t* idx, int n, int K, const uint16_t* h16, const float* h32, float* ys,
              Workspace& ws, Stream s = nullptr, const void* groups = nullptr);
// cuda.topk_in_experts: moe_gate_up for one token whose routing the launch ranks itself from the gate's logits
// (`route`: fwd_route's arguments for that token, route.n == 1), one warp per block with the router's own device
// code, so the same bits as fwd_route then moe_gate_up; the router's launch is left out. The launch waits for the
// logits' producer (the launch before it) and stores route.idx, route.weight and route.select as fwd_route would,
// before it lets the next launch start (cuda.pdl), so moe_down may follow it as it follows moe_gate_up.
// moe_ranks_in_experts: whether it takes these arguments (one token, K <= 8, the experts' E <= 256, the router's
// warp kernel).
bool moe_ranks_in_experts(const detail::RouteArgs& route, const MoeExperts& m);
void moe_gate_up_ranked(const MoeExperts& m, const detail::RouteArgs& route, const void* x, Act xt, double limit, uint16_t* h16,
                        Workspace& ws, Stream s = nullptr);
// The official numerics' routed experts (DeepSeek's fp4_gemm, numerics.official): activations quantized to E4M3 per
// row and 128-block by act_quant_e4m3 (official::fp8_quant_block: amax floored at 1e-4, the power-of-two scale
// 2^ceil(log2(amax / 448)), RNE; codes [rows, K], scales [rows, K/128]); experts uploaded in the A8 layout; E4M3 x
// E4M3 tensor-core products (exact), each 32-group's sum times its E8M0 weight scale, each 128-chunk's times the
// activation scale, fp32 accumulation; outputs rounded to bf16 as the official linear stores them. gate_up: h32 =
// bf16(silu(min(bf16(W1 x), L)) * clamp(bf16(W3 x), -L, L) * pre_weight) (fwd_swiglu's arithmetic), x by token;
// down: ys = bf16(W2 h), h by slot (act_quant_e4m3 of h32). D and I multiples of 128.
void act_quant_e4m3(const float* x, int64_t rows, int64_t K, int64_t ldx, uint8_t* codes, float* scales, Stream s = nullptr);
void moe_gate_up_a8(const MoeExperts& m, const int32_t* idx, int n, int K, const uint8_t* x8, const float* xs, double limit,
                    const float* pre_weight, float* h32, Stream s = nullptr, const void* groups = nullptr);
void moe_down_a8(const MoeExperts& m, const int32_t* idx, int n, int K, const uint8_t* h8, const float* hs, float* ys,
                 Stream s = nullptr, const void* groups = nullptr);
// y[t, :] = out_scale * sum_k weight[t, k] * ys[t*K + k, :] (+ add[t, :]), k in order: deterministic. weight null:
// unit weights (the weight was applied before W2).
void moe_combine(const float* ys, const float* weight, int n, int K, int64_t D, float out_scale, const float* add, float* y,
                 Stream s = nullptr);

// Routed experts for prefill (many tokens per expert): the same results as moe_gate_up / moe_down (up to the fp32
// accumulation order across K: the same per-group products and scales), by grouped GEMMs that read each expert's
// weights once per tile of 64 of its tokens instead of once per 8. moe_group sorts the routing into per-expert
// slot lists on the device (token order within an expert) in `groups` (moe_group_bytes); both grouped kernels take
// that buffer. h16 [n*K, I], ys [n*K, D] per slot as for decode (moe_combine sums them in k order). Needs E <= 1024,
// I % 128 == 0 and D % 256 == 0; nothing returns to the host (a CUDA graph can capture it). `variant`: the kernel
// variant (moe_prefill.cu: 0 or 1; the tests and `plumb bench` run each), < 0 for the default.
size_t moe_group_bytes(int n, int K, int64_t E);
void moe_group(const int32_t* idx, int n, int K, int64_t E, void* groups, Stream s = nullptr);
void moe_gate_up_grouped(const MoeExperts& m, const void* groups, int n, int K, const void* x, Act xt, double limit,
                         const float* pre_weight, uint16_t* h16, Workspace& ws, Stream s = nullptr, int variant = -1);
void moe_down_grouped(const MoeExperts& m, const void* groups, int n, int K, const uint16_t* h16, float* ys,
                      Stream s = nullptr, int variant = -1);

// Scratch the routed-expert path needs between its kernels (and the router's f16 copy of x).
struct MoeScratch {
  DeviceBuffer h, ys, x16;
  void reserve(int n, int K, int64_t D, int64_t I);
};

// The GPU expert runners, under the routed-scaling contract of model/experts.h: each consumes one placement.
struct GpuRunnerFolded {
  static constexpr Rsf consumes = Rsf::Folded;
  static float output_scale(const ModelConfig&) { return 1.0f; }
};
struct GpuRunnerScalesOutput {
  static constexpr Rsf consumes = Rsf::Unfolded;
  static float output_scale(const ModelConfig& c) { return float(c.routed_scaling); }
};

// routed(x) for the decode batch: gate_up -> down -> combine (+ `add`, e.g. the shared expert's output), from the
// f16 activations the router wrote (route(..., x16)). A runner accepts only the placement it declares, so the
// factor is applied exactly once.
template <class Runner, Rsf P>
  requires RunnerAccepts<Runner, P>
void moe_routed(const Runner&, const ModelConfig& c, const MoeExperts& m, const DeviceRouting<P>& r, const uint16_t* x16,
                MoeScratch& scratch, Workspace& ws, const float* add, float* y, Stream s = nullptr) {
  scratch.reserve(r.n, r.K, m.D, m.I);
  moe_gate_up(m, r.idx, r.n, r.K, x16, Act::F16, c.swiglu_limit, nullptr, scratch.h.as<uint16_t>(), nullptr, ws, s);
  moe_down(m, r.idx, r.n, r.K, scratch.h.as<uint16_t>(), nullptr, scratch.ys.as<float>(), ws, s);
  moe_combine(scratch.ys.as<float>(), r.weight, r.n, r.K, m.D, Runner::output_scale(c), add, y, s);
}

// ---- bench: BenchOptions and run_bench are public (plumb/bench.h) ----

}  // namespace plumb::cuda
