// The CUDA backend's forward pass (Model::load(..., "cuda")): weights uploaded once in their checkpoint formats,
// caches resident on the device per session, every op a kernel (src/cuda/fwd_*.cu), the same taps as the
// reference (copied to the host only when a sink asks). Twin of src/model/model.cpp.
#ifdef PLUMB_WITH_CUDA
#include "core/notice.h"
#include "cuda/blas.h"
#include "cuda/gpu_attention.h"
#include "cuda/gpu_common.h"
#include "cuda/gpu_moe.h"
#include "cuda/gpu_numerics.h"
#include "cuda/sample.h"
#include "model/attention.h"
#include "plumb/text.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <mutex>

namespace plumb {

namespace cuda {
namespace {

using namespace detail;

GpuHc upload_hc(const HyperConnWeights& h) { return {upload_tensor(h.fn), upload_tensor(h.base), upload_tensor(h.scale)}; }

std::unique_ptr<GpuComp> upload_comp(const CompressorWeights& c, bool fp8) {
  auto g = std::make_unique<GpuComp>();
  g->wkv = upload_matrix(c.wkv, fp8);
  g->wgate = upload_matrix(c.wgate, fp8);
  g->ape = upload_tensor(c.ape);
  g->norm = upload_tensor(c.norm);
  g->rate = c.rate, g->dim = c.dim, g->overlap = c.overlap;
  return g;
}

GpuExperts upload_routed(const std::vector<ExpertWeights>& ex) {
  GpuExperts g;
  std::vector<DMat> d1, d2, d3;
  for (const auto& e : ex) {
    g.w1.push_back(upload_matrix(e.w1));
    g.w2.push_back(upload_matrix(e.w2));
    g.w3.push_back(upload_matrix(e.w3));
    d1.push_back(g.w1.back().d), d2.push_back(g.w2.back().d), d3.push_back(g.w3.back().d);
  }
  g.d1 = to_device(d1), g.d2 = to_device(d2), g.d3 = to_device(d3);
  return g;
}

// The W4A16 routed-expert kernels take FP4 experts whose dims are multiples of 128 (rows also of 16).
bool fp4_fits(const MoeWeights& M) {
  for (const auto& e : M.experts)
    for (const Matrix* m : {&e.w1, &e.w2, &e.w3})
      if (m->layout() != Matrix::Layout::FP4Group || m->rows() % 128 || m->cols() % 128) return false;
  return !M.experts.empty();
}

// cuda.host_experts' notice: "layers 40-43" (1-based, as the upload's progress counts them), or a list.
std::string host_layers_text(const std::vector<char>& host) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < host.size();) {
    if (!host[i]) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j + 1 < host.size() && host[j + 1]) ++j;
    parts.push_back(i == j ? fmt::format("{}", i + 1) : fmt::format("{}-{}", i + 1, j + 1));
    i = j + 1;
  }
  size_t n = 0;
  for (char h : host) n += h != 0;
  std::string r = n == 1 ? "layer " : "layers ";
  for (size_t k = 0; k < parts.size(); ++k) r += (k ? ", " : "") + parts[k];
  return r + fmt::format(" of {}", host.size());
}

// Every option runs on the GPU (the numerics modes through GpuNumerics, every built-in fault so that the toolkit's
// selftest runs here too), but the official numerics emulate DeepSeek's GEMMs, which most tensor-core kernels do
// not: those pairs are refused by name rather than computing something else. cuda.moe_mxfp4 and cuda.fp8_gemv have
// the official numerics' own kernels (W4A8 / W8A8: E4M3 activations, as DeepSeek's fp4_gemm / fp8_gemm), and
// cuda.bf16_gemv's bf16 rounding of the activations is exact there (they are stored as bf16).
void check_options(const ModelOptions& o) {
  const char* mode = o.official_initial ? "numerics.official_initial" : "numerics.official";
  auto refuse = [&](bool on, const char* patch) {
    PLUMB_CHECK(!(o.official && on),
                "backend cuda: {} does not combine with {} (its kernels do not reproduce the official code's roundings: "
                "FP8 activation quantization, bf16 storage, the attention's bf16 probabilities): drop one of the two",
                mode, patch);
  };
  refuse(o.attn_splitk_decode, "attn.splitk_decode");
  refuse(o.attn_splitk_f16, "attn.splitk_f16");
  // The f16 products are the split-K kernel's: without it the attention would silently stay fp64.
  PLUMB_CHECK(!o.attn_splitk_f16 || o.attn_splitk_decode,
              "backend cuda: attn.splitk_f16 changes attn.splitk_decode's products and needs it: add attn.splitk_decode");
  refuse(o.indexer_tc_scores, "indexer.tc_scores");
  refuse(o.indexer_dmma_scores, "indexer.dmma_scores");
  refuse(o.cuda_prefill_gemm, "cuda.prefill_gemm");
  refuse(o.cuda_hc_norm_after_mix, "cuda.hc_norm_after_mix");
  refuse(o.cuda_hc_fold, "cuda.hc_fold");
  refuse(o.cuda_comp_deferred, "cuda.comp_deferred");
  refuse(o.cuda_batch_rows, "cuda.batch_rows");
  refuse(o.cuda_batch_rows_indexer, "cuda.batch_rows_indexer");
  refuse(o.cuda_batch_rows_mixed, "cuda.batch_rows_mixed");
  PLUMB_CHECK(!o.cuda_batch_rows_indexer || o.cuda_batch_rows,
              "backend cuda: cuda.batch_rows_indexer batches the indexer of cuda.batch_rows' rows and needs it: add cuda.batch_rows");
  PLUMB_CHECK(!o.cuda_batch_rows_mixed || o.cuda_batch_rows_indexer,
              "backend cuda: cuda.batch_rows_mixed extends cuda.batch_rows_indexer's batches and needs it: add cuda.batch_rows_indexer");
  // Its attention is the split-K kernel's over per-row tables: without it every launch would silently stay per session.
  PLUMB_CHECK(!o.cuda_batch_rows || o.attn_splitk_decode,
              "backend cuda: cuda.batch_rows batches the split-K attention's launches over sessions and needs it: add attn.splitk_decode");
  // Its kernel computes the reference's mixes from fp32 streams: with bf16 mixing it would silently not apply.
  PLUMB_CHECK(!o.cuda_hc_norm_after_mix || !o.mhc_bf16_mix,
              "backend cuda: cuda.hc_norm_after_mix computes the reference's fp32 mixes and does not combine with mhc.bf16_mix: drop one of "
              "the two");
  // The fold computes NA's mixes (the norm after the mixing GEMM) in cuda.fp8_gemv's wo_b launch: without either it
  // would silently not apply.
  PLUMB_CHECK(!o.cuda_hc_fold || (o.cuda_hc_norm_after_mix && o.cuda_fp8_gemv),
              "backend cuda: cuda.hc_fold folds cuda.hc_norm_after_mix's hc_pre into cuda.fp8_gemv's wo_b launch and needs both: add them");
  // The prefill GEMMs take over the FP8 matrices that cuda.fp8_gemv holds in its form; alone they would have none.
  PLUMB_CHECK(!o.cuda_prefill_gemm || o.cuda_fp8_gemv,
              "backend cuda: cuda.prefill_gemm is the prefill half of the FP8 tensor-core path and needs cuda.fp8_gemv: add it");
  // PDL for hc_pre and the split-K attention extends cuda.pdl's launches; alone it would launch nothing with PDL.
  PLUMB_CHECK(!o.cuda_pdl_hc_attn || o.cuda_pdl, "backend cuda: cuda.pdl_hc_attn extends cuda.pdl to more launches and needs it: add cuda.pdl");
  PLUMB_CHECK(!o.cuda_linear_early || o.cuda_pdl, "backend cuda: cuda.linear_early acts before cuda.pdl's wait and needs it: add cuda.pdl");
  PLUMB_CHECK(!o.cuda_early_joins || o.cuda_streams,
              "backend cuda: cuda.early_joins moves cuda.streams' joins and needs it: add cuda.streams");
  PLUMB_CHECK(!o.cuda_shared_first || o.cuda_streams,
              "backend cuda: cuda.shared_first moves cuda.streams' fork of the shared expert and needs it: add cuda.streams");
  // The top-k moves into the W4A16 experts' launches; the official numerics' W4A8 launches and a weight applied
  // before W2 need the routing before gate/up, so there it would silently not apply.
  PLUMB_CHECK(!o.cuda_topk_in_experts || o.cuda_moe_mxfp4,
              "backend cuda: cuda.topk_in_experts ranks the routing inside cuda.moe_mxfp4's launches and needs it: add cuda.moe_mxfp4");
  PLUMB_CHECK(!o.cuda_topk_in_experts || !(o.official || o.weight_before_down),
              "backend cuda: cuda.topk_in_experts does not combine with {} (gate/up then needs the routing's weights before it "
              "starts): drop one of the two",
              o.official ? mode : "moe.weight_before_down");
  // The host placement is of cuda.moe_mxfp4's FP4 copies: without them it would silently place nothing.
  PLUMB_CHECK(!o.cuda_host_experts || o.cuda_moe_mxfp4,
              "backend cuda: cuda.host_experts keeps cuda.moe_mxfp4's expert weights in host memory and needs it: add cuda.moe_mxfp4");
  PLUMB_CHECK(o.host_expert_layers >= 0, "backend cuda: cuda.host_experts' layer count ({}) must be 0 (as the fit needs) or more",
              o.host_expert_layers);
  PLUMB_CHECK(!o.cuda_branch_flags || o.cuda_streams,
              "backend cuda: cuda.branch_flags changes how cuda.streams' branches end and needs it: add cuda.streams");
  PLUMB_CHECK(o.prefill_gemm_min_tokens >= 0, "backend cuda: cuda.prefill_gemm's minimum chunk ({}) must be 0 (the default) or more",
              o.prefill_gemm_min_tokens);
}

// cuda.bf16_gemv: the token counts (from 2) whose plain bf16 projections run on the bf16 GEMV. H200, a CSA layer's
// four compressor projections with their bf16 conversion (`plumb bench --only bf16`, graph replay, us): GEMV against
// cuBLASLt 14.8 / 27.8 at 2 tokens, 15.7 / 27.8 at 8, 16.1 / 28.6 at 16, 27.2 / 28.6 at 32 (session 23: one pass of
// up to 32 tokens; in passes of 8 tokens it took 26.9 at 16 and 48.1 at 32).
constexpr int kBf16GemvMaxTokens = 32;

// Where the requested fast kernels apply (they fall back to the fp32 twin elsewhere): said once at load.
struct FastCount {
  int fp8 = 0, fp8_of = 0, fp4 = 0, fp4_of = 0, gemm = 0, gemm_bf16 = 0, gemv_bf16 = 0;
  size_t gemm_w = 0;  // cuda.prefill_gemm: the largest bf16 weight a GEMM dequantizes
  void mat(const GMat& g, const Matrix& m) {
    if (m.layout() == Matrix::Layout::FP8Block) ++fp8_of, fp8 += g.fp8 != nullptr;
    gemm_mat(g);
  }
  void gemm_mat(const GMat& g) {
    if (g.gemm_min && g.fp8) ++gemm, gemm_w = std::max(gemm_w, size_t(g.fp8->rows * g.fp8->cols));
  }
};

// The device sampler's parameters: SamplingParams' per-row ones (the window and the seed stay on the host).
SampleParams sample_params(const SamplingParams& sp) {
  SampleParams p;
  p.temperature = sp.temperature, p.top_k = sp.top_k, p.top_p = sp.top_p, p.min_p = sp.min_p;
  p.repeat_penalty = sp.repeat_penalty, p.presence_penalty = sp.presence_penalty, p.frequency_penalty = sp.frequency_penalty;
  return p;
}
bool same_params(const SampleParams& a, const SampleParams& b) {
  return a.temperature == b.temperature && a.top_k == b.top_k && a.top_p == b.top_p && a.min_p == b.min_p &&
         a.repeat_penalty == b.repeat_penalty && a.presence_penalty == b.presence_penalty && a.frequency_penalty == b.frequency_penalty;
}

// A call's turn on the model's device state (Scratch::use: the shared scratch, its streams), for the whole call: the
// forwards, and what else a session does on the device (new_state, reserve, mark, rollback); another thread waits.
// A call that throws may leave launches queued: they finish before the turn passes on, so that the next forward's
// writes to the same buffers cannot overtake them.
class Turn {
 public:
  explicit Turn(Scratch& sc) : lock_(sc.use), exceptions_(std::uncaught_exceptions()) {}
  Turn(const Turn&) = delete;
  Turn& operator=(const Turn&) = delete;
  ~Turn() {
    if (std::uncaught_exceptions() > exceptions_) try {
        synchronize();
      } catch (...) {  // (the error already unwinding is the one to report)
      }
  }

 private:
  std::unique_lock<std::mutex> lock_;
  int exceptions_;
};

class GpuForward : public DeviceForward {
 public:
  GpuForward(const Model& m, const std::function<void(int64_t, int64_t)>& on_layer)
      : cfg_(m.config()), opt_(m.options()), nm_(opt_) {
    std::string why;
    PLUMB_CHECK(available(&why), "backend cuda: {}", why);
    check_options(opt_);
    // The weights go up in their checkpoint formats, so the bytes the model bound of its checkpoint are a lower bound
    // of what the upload needs: refuse before the first upload, naming both sizes, rather than fail in cudaMalloc
    // minutes into it (DeepSeek-V4-Flash's ~155 GB does not fit one 141 GB H200).
    size_t free_b = 0, total_b = 0;
    memory_info(free_b, total_b);
    memory_.device = device_info().name;
    const auto& w = m.weights();
    const auto& c = cfg_;
    // transformers' hidden_act other than SiLU and mlp_bias (the shared MLP's biases; both SiLU and none under the
    // official numerics, as the official code has neither) run on the fp32 twin kernels (swiglu_kernel takes the
    // activation and the biases): the fused SwiGLU epilogues of cuda.moe_mxfp4 and cuda.fp8_gemv apply SiLU with no
    // bias, so they do not apply to those experts (said once below).
    const bool other_act = expert_activation(c, nm_.official()) != ExpertAct::Silu;
    const bool shared_bias = c.mlp_bias && !nm_.official();
    const bool fp8 = opt_.cuda_fp8_gemv, fp4 = opt_.cuda_moe_mxfp4;
    auto fp4_path = [&](const MoeWeights& M) { return fp4 && !other_act && fp4_fits(M); };
    const uint64_t weight_bytes = m.checkpoint().found_bytes();
    HostExpertPlan host_plan;
    if (opt_.cuda_host_experts) {
      std::vector<uint64_t> eb;
      for (const auto& L : w.layers) eb.push_back(fp4_path(L.moe) ? expert_code_bytes(L.moe) : 0);
      host_plan = plan_host_experts(weight_bytes, eb, free_b, total_b, opt_.host_expert_layers, memory_.device);
      PLUMB_CHECK(host_plan.problem.empty(), "backend cuda: {}", host_plan.problem);
      const double hb = double(host_plan.host_bytes);
      notice(host_plan.layers ? fmt::format("backend cuda: cuda.host_experts keeps the routed experts of {} in pinned host memory "
                                            "({:.2f} {}, read over PCIe at each step)", host_layers_text(host_plan.host),
                                            hb >= 1e9 ? hb / 1e9 : hb / 1e6, hb >= 1e9 ? "GB" : "MB")
                              : std::string("backend cuda: cuda.host_experts does not apply: no layer's routed experts run on "
                                            "cuda.moe_mxfp4's kernels (FP4 with dims multiple of 128, SiLU)"));
    } else {
      const std::string no_fit = weights_fit_problem(weight_bytes, free_b, total_b, memory_.device);
      PLUMB_CHECK(no_fit.empty(), "backend cuda: {}", no_fit);
    }
    try {
      g_.embed = upload_matrix(w.embed);
      // A tied head (tie_word_embeddings) is the embedding's matrix: its view, not a second upload of vocab x hidden.
      if (c.tie_embeddings) g_.head.d = g_.embed.d;
      else g_.head = upload_matrix(w.head);
      g_.norm = upload_tensor(w.norm);
      g_.hc_head = upload_hc(w.hc_head);
      g_.rope_main = upload_rope(m.rope_main());
      g_.rope_compress = upload_rope(m.rope_compress());
    } catch (...) {
      rethrow_for("backend cuda: uploading the embedding, the head and the rope tables");
    }
    if ((fp4 && other_act) || (fp8 && (other_act || shared_bias)))
      notice(fmt::format("backend cuda: {} {} not apply to the experts ({}: their fused SwiGLU applies SiLU with no bias); "
                         "those run on the fp32 twin kernels",
                         fp4 && other_act && fp8 ? "cuda.moe_mxfp4 and cuda.fp8_gemv" : fp4 && other_act ? "cuda.moe_mxfp4" : "cuda.fp8_gemv",
                         fp4 && other_act && fp8 ? "do" : "does",
                         other_act ? fmt::format("hidden_act {}", expert_act_name(c.act)) : std::string("mlp_bias")));
    FastCount fc;
    const bool gemm = opt_.cuda_prefill_gemm;
    // cuda.prefill_gemm: FP8 matrices on the fast path whose block scales make the bf16 dequantization exact, from
    // the token count where the GEMM (a dequantization pass, then the weight read once) overtakes the GEMV (the
    // weight read once per pass of up to 32 tokens, or of 64 on the shared-activation kernel). H200 crossover (`plumb
    // bench --only fp8prefill`, GEMV vs GEMM, graph replay, us; session 24): wkv [512, 4096] 9.8 / 10.7 at 24
    // tokens, 11.0 / 10.7 at 32, 17.5 / 10.8 at 48 (the register-path GEMV: < 128 blocks for the shared-activation
    // kernel); the single projections of >= 8M weights on the shared-activation kernel (backend.cpp dense_split): wq_b
    // [32768, 1024] 27.0 / 53.6 at 64, 49.6 / 54.8 at 96, 50.1 / 56.3 at 128; wo_a 40.5 / 57.7 at 64, 77.1 / 60.7 at
    // 96; wo_b [4096, 8192] 43.4 / 55.9 at 64, 79.8 / 57.8 at 96; the indexer's wq_b 13.1 / 17.3 at 64, 23.9 / 17.4
    // at 96 (so the GEMM from 80, between the two). The shared expert keeps 64: its gate and up stay on the
    // register-path GEMV (slower on the shared-activation kernel: 48.3 against 30.1 us for the expert at 32 tokens),
    // which would take 64 tokens in two passes; with the GEMM from 80 there, layer A/B at 64 tokens lost 7-10 us per
    // layer.
    auto gemm_min = [&](const Fp8Matrix& f, bool single = true) {
      if (!gemm || !fp8_gemm_exact(f)) return 0;
      if (opt_.prefill_gemm_min_tokens > 0) return opt_.prefill_gemm_min_tokens;
      if (f.rows * f.cols < (int64_t(8) << 20)) return 32;
      return single ? 80 : 64;
    };
    // Under the official numerics cuda.fp8_gemv takes the FP8 projections that the official code quantizes its input
    // for (GpuNumerics::proj: W8A8); wo_a (dequantized to bf16 by DeepSeek's convert.py) and the compressors (their
    // own numerics) keep the twin's path, so they get no tensor-core form.
    const bool fp8_rest = fp8 && !opt_.official;
    auto mat = [&](const Matrix& m, bool fast = true) {
      GMat g = upload_matrix(m, fp8 && fast);
      if (g.fp8) g.gemm_min = gemm_min(*g.fp8);
      fc.mat(g, m);
      return g;
    };
    // The compressors' matrices (uploaded by upload_comp, not counted in cuda.fp8_gemv's line). Plain bf16 ones
    // (V4-Flash's) run as GEMMs from 2 tokens: their alternative is the fp32 twin's fp64 GEMV, not a tensor-core
    // GEMV, and the GEMM needs no dequantization pass (one token keeps the exact one-token GEMV).
    const int bf16_gemm_min = opt_.prefill_gemm_min_tokens > 0 ? opt_.prefill_gemm_min_tokens : 2;
    auto set_gemm = [&](GpuComp& g) {
      for (GMat* gm : {&g.wkv, &g.wgate}) {
        if (gm->fp8) gm->gemm_min = gemm_min(*gm->fp8);
        else if (gemm && plain_bf16(*gm) && have_cublaslt())
          gm->gemm_min = bf16_gemm_min, ++fc.gemm_bf16;
        if (opt_.cuda_bf16_gemv && plain_bf16(*gm) && gm->d.rows % 16 == 0 && gm->d.cols % 128 == 0)
          gm->gemv16_max = kBf16GemvMaxTokens, ++fc.gemv_bf16;
        fc.gemm_mat(*gm);
      }
    };
    // An allocation that fails past the fit check (another process took the memory, or the fast paths' copies
    // did not fit beside the weights) names the layer and how far free memory fell since the upload began (this
    // upload's and any other process's allocations), beside dmalloc's sizes. (No second error from here: a failing
    // memory query leaves the figure out.)
    auto uploading = [&](size_t layer) {
      std::string fell;
      try {
        size_t free_now = 0, total_now = 0;
        memory_info(free_now, total_now);
        fell = fmt::format(" (the GPU's free memory fell by {:.3f} GB since the upload began)",
                           double(free_b > free_now ? free_b - free_now : 0) / 1e9);
      } catch (...) {
      }
      return fmt::format("backend cuda: uploading layer {} of {}{}", layer + 1, w.layers.size(), fell);
    };
    for (const auto& L : w.layers) {
      GpuLayer gl;
      try {
        gl.attn_norm = upload_tensor(L.attn_norm);
        gl.ffn_norm = upload_tensor(L.ffn_norm);
        gl.hc_attn = upload_hc(L.hc_attn);
        gl.hc_ffn = upload_hc(L.hc_ffn);
        const auto& a = L.attn;
        gl.attn.wq_a = mat(a.wq_a);
        gl.attn.wq_b = mat(a.wq_b);
        gl.attn.wkv = mat(a.wkv);
        gl.attn.wo_a = mat(a.wo_a, fp8_rest);
        if (fp8 && opt_.official) {  // its bf16 copy (where exact), as DeepSeek's convert.py makes it
          gl.attn.wo_a.w16 = bf16_copy_if_exact(a.wo_a);
          if (gl.attn.wo_a.w16.get()) ++fc.fp8;
        }
        gl.attn.wo_b = mat(a.wo_b);
        gl.attn.q_norm = upload_tensor(a.q_norm);
        gl.attn.kv_norm = upload_tensor(a.kv_norm);
        gl.attn.sink = upload_tensor(a.sink);
        // The split-K kernel's head_dim rule holds for every layer or none (one head_dim per model).
        gl.attn.splitk = opt_.attn_splitk_decode && fwd_attend_splitk_fits(c.head_dim);
        gl.attn.splitk_f16 = gl.attn.splitk && opt_.attn_splitk_f16;
        gl.attn.index_tc = opt_.indexer_tc_scores;
        gl.attn.index_dmma = opt_.indexer_dmma_scores;
        gl.attn.skip_short = opt_.indexer_skip_short;
        gl.attn.rows_indexer = opt_.cuda_batch_rows_indexer;
        gl.attn.rows_mixed = opt_.cuda_batch_rows_mixed;
        gl.attn.comp_deferred = opt_.cuda_comp_deferred;
        if (a.comp) gl.attn.comp = upload_comp(*a.comp, fp8_rest), set_gemm(*gl.attn.comp);
        if (a.indexer) {
          gl.attn.icomp = upload_comp(a.indexer->comp, fp8_rest);
          set_gemm(*gl.attn.icomp);
          gl.attn.iwq_b = mat(a.indexer->wq_b);
          gl.attn.iweights = upload_matrix(a.indexer->weights_proj);
          // cuda.bf16_gemv under the official numerics: weights_proj (a bf16 Linear there, x stored as bf16) on the
          // bf16 GEMV at every token count (its twin: a warp per output row, 64 rows at V4-Flash's size).
          const GMat& iw = gl.attn.iweights;
          gl.attn.iweights_gemv = opt_.official && opt_.cuda_bf16_gemv && plain_bf16(iw) && iw.d.rows % 16 == 0 && iw.d.cols % 128 == 0;
        }
        const auto& M = L.moe;
        gl.moe.gate = upload_matrix(M.gate);
        if (M.bias.numel()) gl.moe.bias = upload_tensor(M.bias);
        if (M.tid2eid.numel()) {
          std::vector<int32_t> t(M.tid2eid.data.begin(), M.tid2eid.data.end());  // validated against E at load
          gl.moe.tid2eid = to_device(t);
        }
        ++fc.fp4_of;
        if (fp4_path(M)) {
          // The official numerics quantize the experts' activations to E4M3 (DeepSeek's fp4_gemm): the W4A8 kernels'
          // layout; else the W4A16 kernels'.
          const bool host = !host_plan.host.empty() && host_plan.host[g_.layers.size()];
          gl.moe.fp4 = std::make_unique<MoeExperts>(upload_experts(M, opt_.official ? Fp4Layout::A8 : Fp4Layout::F16,
                                                                   host ? DeviceBuffer::Place::HostMapped : DeviceBuffer::Place::Device));
          ++fc.fp4;
        } else {
          gl.moe.routed = upload_routed(M.experts);
        }
        const auto& S = M.shared;
        if (S && fp8 && !other_act && !shared_bias && fp8_fast_fits(S->w1) && fp8_fast_fits(S->w2) && fp8_fast_fits(S->w3)) {
          gl.moe.sfp8 = std::make_unique<Fp8Expert>(upload_expert_fp8(*S));
          fc.fp8 += 3, fc.fp8_of += 3;
          const Fp8Expert& e = *gl.moe.sfp8;
          const int g1 = gemm_min(e.w1, false), g3 = gemm_min(e.w3, false), g2 = gemm_min(e.w2, false);  // each downloads its scales
          if (g1 && g3 && g2) {
            gl.moe.shared_gemm_min = std::max({g1, g3, g2});
            fc.gemm += 3, fc.gemm_w = std::max(fc.gemm_w, size_t(2 * e.w1.rows * e.w1.cols));
          }
        } else if (M.shared) {
          gl.moe.s1 = std::make_unique<GMat>(upload_matrix(M.shared->w1));
          gl.moe.s2 = std::make_unique<GMat>(upload_matrix(M.shared->w2));
          gl.moe.s3 = std::make_unique<GMat>(upload_matrix(M.shared->w3));
          gl.moe.shared_desc = to_device(std::vector<DMat>{gl.moe.s1->d, gl.moe.s2->d, gl.moe.s3->d});
          if (shared_bias) {  // bound at load with the config (ModelWeights: a missing one is named there)
            gl.moe.sb1 = upload_tensor(M.shared->b1);
            gl.moe.sb2 = upload_tensor(M.shared->b2);
            gl.moe.sb3 = upload_tensor(M.shared->b3);
          }
        }
      } catch (...) {
        rethrow_for(uploading(g_.layers.size()));
      }
      g_.layers.push_back(std::move(gl));
      if (on_layer) on_layer(int64_t(g_.layers.size()), int64_t(w.layers.size()));  // (the uploads are synchronous copies)
    }
    synchronize();
    // What the upload took (the weights, their fast-path copies and the backend's first buffers), for the CLI's
    // memory line: the free memory before and after it.
    size_t free_after = 0;
    memory_info(free_after, total_b);
    memory_.loaded = int64_t(free_b > free_after ? free_b - free_after : 0);
    memory_.free = int64_t(free_after), memory_.total = int64_t(total_b);
    // The bytes the buffers hold in host memory (measured, not the plan's: a placement lost on the way shows here).
    memory_.host = 0;
    for (const GpuLayer& gl : g_.layers)
      if (gl.moe.fp4)
        for (const Fp4Matrices* f : {&gl.moe.fp4->w1, &gl.moe.fp4->w3, &gl.moe.fp4->w2})
          if (f->codes.in_host()) memory_.host += int64_t(f->codes.bytes());
    if (opt_.attn_splitk_decode && !fwd_attend_splitk_fits(c.head_dim))
      notice(fmt::format("backend cuda: attn.splitk_decode{} does not apply: head_dim {} is not a multiple of 32 up to 512 (the "
                         "unsplit attention runs)", opt_.attn_splitk_f16 ? " (and attn.splitk_f16)" : "", c.head_dim));
    if (opt_.cuda_head_bf16) {
      head_bf16_ = w.head.layout() == Matrix::Layout::Plain && w.head.values().dtype == DType::BF16 && have_cublaslt();
      notice(fmt::format("backend cuda: cuda.head_bf16 {}",
                         head_bf16_ ? "runs the LM head" : have_cublaslt() ? "does not apply: the head is not BF16 in the checkpoint"
                                                                          : "does not apply: built without cuBLASLt"));
    }
    if (fp8)
      notice(fmt::format("backend cuda: cuda.fp8_gemv runs {} of {} FP8 matrices{}{}", fc.fp8, fc.fp8_of,
                         opt_.official ? " as W8A8 (the official numerics' E4M3 activations; wo_a as its bf16 copy, as DeepSeek's convert.py "
                                         "makes it)"
                                       : "",
                         fc.fp8 >= fc.fp8_of ? ""
                         : opt_.official   ? " (the others have shapes or block scales the kernels do not take: the official twin runs them)"
                                           : " (the others have shapes the kernel does not take: the fp32 twin runs them)"));
    if (gemm)
      notice(fmt::format("backend cuda: cuda.prefill_gemm runs {} FP8 matrices in chunks of >= {} (matrices with F32 or out-of-range "
                         "block scales stay on the GEMV), and {} bf16 compressor matrices from {} tokens", fc.gemm,
                         opt_.prefill_gemm_min_tokens ? fmt::format("{} tokens", opt_.prefill_gemm_min_tokens)
                                                      : std::string("32 tokens, 80 for projections of >= 8M weights, 64 for the shared expert's"),
                         fc.gemm_bf16, bf16_gemm_min));
    scratch_->gemm_w_elems = fc.gemm_w;
    if (opt_.cuda_bf16_gemv)
      notice(fmt::format("backend cuda: cuda.bf16_gemv runs {} bf16 compressor matrices at 2 to {} tokens{}", fc.gemv_bf16,
                         kBf16GemvMaxTokens, fc.gemv_bf16 ? "" : " (none is a plain bf16 matrix of rows % 16 == 0 and columns % 128 == 0)"));
    if (fp4)
      notice(fmt::format("backend cuda: cuda.moe_mxfp4 runs the routed experts of {} of {} layers{}{}", fc.fp4, fc.fp4_of,
                         opt_.official ? " as W4A8 (the official numerics' E4M3 activations)" : "", fc.fp4 < fc.fp4_of ? " (the others are not FP4 with dims multiple of 128: the fp32 twin runs them)" : ""));
  }

  Memory memory() const override { return memory_; }

  std::shared_ptr<DeviceSessionState> new_state() const override {
    const Turn turn(*scratch_);
    auto s = std::make_shared<DeviceSessionState>(scratch_);
    s->layers.resize(size_t(cfg_.n_layers));
    for (size_t i = 0; i < s->layers.size(); ++i) init_attention_state(g_.layers[i].attn, cfg_, s->layers[i]);
    synchronize();  // (the caches' zeroing ran on this thread's stream: a session may step on another thread)
    return s;
  }

  // (Each entry point holds its Turn until its results are on the host: run() returns with the pass still queued.)
  Tensor forward_batch(std::span<SessionState* const> states, std::span<const int32_t> tokens) const override {
    for (SessionState* st : states) own(*st);
    const Turn turn(states[0]->dev->scratch);
    const float* logits = run_batch(states, tokens);
    return download(logits, {int64_t(tokens.size()), int64_t(cfg_.vocab)});  // synchronizes
  }

  Tensor forward(SessionState& st, std::span<const int32_t> tokens, TapSink* taps, LogitRows rows) const override {
    own(st);
    const Turn turn(st.dev->scratch);
    const float* logits = run(st, tokens, taps, rows);
    if (rows == LogitRows::None) {
      synchronize();  // as the other forms do (download synchronizes): the caller may time or reuse the session
      return Tensor();
    }
    return download(logits, {rows == LogitRows::Last ? 1 : int64_t(tokens.size()), int64_t(cfg_.vocab)});  // synchronizes
  }

  // The last token's logits never leave the device: fwd_sample (sample.h) draws with the host sampler's
  // parameters, penalty window and uniform draw, and only the token comes back.
  // With `allowed`, its bits are asked for once the forward is queued (the host builds them while the GPU runs the
  // pass), go up behind it and mask the row in place (fwd_mask_logits) before the sampling.
  int32_t forward_sample(SessionState& st, std::span<const int32_t> tokens, Sampler& sampler,
                         std::span<const int32_t> history, const TokenFilter* allowed,
                         std::vector<float>& no_finite_row) const override {
    own(st);
    Scratch& sc = st.dev->scratch;
    const Turn turn(sc);
    const SampleParams p = sample_params(sampler.params());
    const auto window = sampler.penalty_window(history);
    // One upload: u (double), then the window's ids and counts (int32).
    std::vector<int32_t> in(2 + 2 * window.size());
    const double u = fwd_sample_path(p, cfg_.vocab) == kSampleGreedy ? 0.0 : sampler.peek_draw();
    std::memcpy(in.data(), &u, 8);
    for (size_t i = 0; i < window.size(); ++i) in[2 + i] = window[i].first, in[2 + window.size() + i] = window[i].second;
    // Sized by powers of two from 16 KiB: a reallocation bumps the scratch's generation, which would make
    // the decode graph re-capture each time the penalty window gains a distinct token.
    size_t in_bytes = size_t(16) << 10;
    while (in_bytes < in.size() * 4) in_bytes *= 2;
    auto* dev_in = static_cast<int32_t*>(sc.get("sample.in", in_bytes));
    auto* out = static_cast<int32_t*>(sc.get("sample.out", 8));
    const size_t scratch_bytes = fwd_sample_scratch_bytes(1, cfg_.vocab, &p);
    void* scratch = sc.get("sample.scratch", scratch_bytes);
    const size_t words = (size_t(cfg_.vocab) + 31) / 32;
    auto* dev_bits = allowed ? static_cast<uint32_t*>(sc.get("sample.mask", words * 4)) : nullptr;
    // (Its buffers are taken before the forward: an allocation moves the session's memory, and after the forward it
    // would make the next step run eagerly again instead of capturing the graph this one warmed.)
    const float* logits = run(st, tokens, nullptr, LogitRows::Last);
    std::vector<uint32_t> bits;
    if (allowed) {
      bits.assign(words, 0);
      try {
        (*allowed)(bits);
      } catch (...) {
        synchronize();  // (the pass is done before the caller sees the error: the tokens count as fed)
        throw;
      }
    }
    {
      OpRegion region(sc.timer, "sample");  // (plumb bench counts it outside the layers, as the head)
      if (allowed) {
        st.dev->stage.upload(dev_bits, bits.data(), words * 4);
        // (the row is the forward's own output buffer, read by nothing after the sampling but the error path below,
        // which then shows the masked row the sampler saw)
        fwd_mask_logits(const_cast<float*>(logits), 1, cfg_.vocab, dev_bits, nullptr);
      }
      st.dev->stage.upload(dev_in, in.data(), in.size() * 4);  // queued behind the forward: no host wait
      SampleOut o;
      o.token = out, o.n = out + 1;
      fwd_sample(logits, 1, cfg_.vocab, p, dev_in + 2, dev_in + 2 + window.size(), int(window.size()),
                 reinterpret_cast<const double*>(dev_in), o, scratch, scratch_bytes, nullptr);
    }
    int32_t got[2];
    d2h(got, out, 8);  // synchronizes
    if (got[0] == kSampleNoFinite) {  // an error path: the row comes back for the host sampler's message
      no_finite_row.resize(size_t(cfg_.vocab));
      d2h(no_finite_row.data(), logits, no_finite_row.size() * sizeof(float));
      return -1;
    }
    if (got[1] > 1) sampler.commit_draw();  // the distribution kept more than one token: sample() would have drawn
    return got[0];
  }

  // forward_batch_sample: the batch's pass, then every row with a sampler drawn on the device (fwd_sample, as
  // forward_sample draws one row: the host's u, the penalty window, the mask built while the pass runs), and only the
  // tokens and the rows without a sampler downloaded. Consecutive rows with equal parameters and no penalty window
  // share a launch (a server's requests mostly do); a row with a window takes one of its own (fwd_sample's window
  // belongs to its launch).
  void forward_batch_sample(std::span<SessionState* const> states, std::span<const int32_t> tokens,
                            std::span<BatchRow> rows) const override {
    const int n = int(rows.size());
    const size_t V = size_t(cfg_.vocab), words = (V + 31) / 32;
    for (SessionState* st : states) own(*st);
    Scratch& sc = states[0]->dev->scratch;
    const Turn turn(sc);
    struct Launch {
      int row0 = 0, rows = 0;
      SampleParams p;
      size_t pen = 0, npen = 0;  // the window's ids at word pen of the upload, its counts after them
    };
    std::vector<Launch> launches;
    // One upload: u [n] (doubles), then each launch's window (ids, then counts; int32).
    std::vector<int32_t> in(2 * size_t(n), 0);
    std::vector<double> u(size_t(n), 0.0);
    bool any_mask = false;
    for (int b = 0; b < n; ++b) {
      BatchRow& r = rows[size_t(b)];
      if (!r.sampler) continue;
      any_mask = any_mask || bool(r.allowed);
      const SampleParams p = sample_params(r.sampler->params());
      const auto window = r.sampler->penalty_window(r.history);
      u[size_t(b)] = fwd_sample_path(p, int(V)) == kSampleGreedy ? 0.0 : r.sampler->peek_draw();
      Launch* last = launches.empty() ? nullptr : &launches.back();
      if (last && window.empty() && last->npen == 0 && last->row0 + last->rows == b && same_params(last->p, p)) {
        ++last->rows;
        continue;
      }
      launches.push_back({b, 1, p, in.size(), window.size()});
      for (const auto& [id, count] : window) in.push_back(id);
      for (const auto& [id, count] : window) in.push_back(count);
    }
    std::memcpy(in.data(), u.data(), u.size() * 8);
    size_t scratch_bytes = 0;
    for (const Launch& l : launches) scratch_bytes = std::max(scratch_bytes, fwd_sample_scratch_bytes(l.rows, int(V), &l.p));
    // The buffers first, in powers of two (an allocation after the pass would move the first session's memory, and its
    // batch graph would re-capture).
    auto pow2 = [](size_t bytes) {
      size_t b = size_t(16) << 10;
      while (b < bytes) b *= 2;
      return b;
    };
    auto* dev_in = static_cast<int32_t*>(sc.get("batch.sample.in", pow2(in.size() * 4)));
    auto* dev_out = static_cast<int32_t*>(sc.get("batch.sample.out", pow2(size_t(n) * 8)));
    void* scratch = scratch_bytes ? sc.get("batch.sample.scratch", pow2(scratch_bytes)) : nullptr;
    auto* dev_bits = any_mask ? static_cast<uint32_t*>(sc.get("batch.sample.mask", pow2(size_t(n) * words * 4))) : nullptr;
    const float* logits = run_batch(states, tokens);
    // The masks, built while the pass runs. A mask that throws is its row's error (nothing drawn: its draw stays
    // pending, as forward_sample_masked leaves it); the launch still computes the row, unread.
    std::vector<std::exception_ptr> mask_errors(rows.size());
    if (any_mask) {
      const std::vector<uint32_t> bits = batch_masks(rows, words, mask_errors);
      for (int b = 0; b < n; ++b)
        if (mask_errors[size_t(b)]) rows[size_t(b)].error = mask_errors[size_t(b)];
      states[0]->dev->stage.upload(dev_bits, bits.data(), bits.size() * 4);
      for (int b = 0; b < n; ++b)
        if (rows[size_t(b)].sampler && rows[size_t(b)].allowed && !mask_errors[size_t(b)])
          fwd_mask_logits(const_cast<float*>(logits) + size_t(b) * V, 1, int(V), dev_bits + size_t(b) * words, nullptr);
    }
    {
      OpRegion region(sc.timer, "sample");
      states[0]->dev->stage.upload(dev_in, in.data(), in.size() * 4);
      for (const Launch& l : launches) {
        SampleOut o;
        o.token = dev_out + l.row0, o.n = dev_out + n + l.row0;
        fwd_sample(logits + size_t(l.row0) * V, l.rows, int(V), l.p, dev_in + l.pen, dev_in + l.pen + l.npen, int(l.npen),
                   reinterpret_cast<const double*>(dev_in) + l.row0, o, scratch, scratch_bytes, nullptr);
      }
    }
    std::vector<int32_t> got(2 * size_t(n), 0);
    if (!launches.empty()) d2h(got.data(), dev_out, got.size() * 4);  // synchronizes
    for (int b = 0; b < n;) {  // the rows without a sampler, a download per run of them
      if (rows[size_t(b)].sampler) {
        ++b;
        continue;
      }
      int e = b;
      while (e < n && !rows[size_t(e)].sampler) ++e;
      std::vector<float> part(size_t(e - b) * V);
      d2h(part.data(), logits + size_t(b) * V, part.size() * 4);
      for (int k = b; k < e; ++k) rows[size_t(k)].logits.assign(part.begin() + ptrdiff_t(size_t(k - b) * V), part.begin() + ptrdiff_t(size_t(k - b + 1) * V));
      b = e;
    }
    if (launches.empty()) synchronize();
    for (int b = 0; b < n; ++b) {
      BatchRow& r = rows[size_t(b)];
      if (!r.sampler || mask_errors[size_t(b)]) continue;
      const int32_t token = got[size_t(b)], count = got[size_t(n + b)];
      if (token == kSampleNoFinite) {  // the row comes back for the host sampler's message (as forward_sample's)
        std::vector<float> row(V);
        d2h(row.data(), logits + size_t(b) * V, V * 4);
        try {
          throw_no_finite_row(*r.sampler, row, r.history, fmt::format("forward_batch: session {}", b));
        } catch (...) {
          r.error = std::current_exception();
        }
        continue;
      }
      if (count > 1) r.sampler->commit_draw();  // the distribution kept more than one token: sample() would have drawn
      r.sampled = token;
    }
  }

  // At most kReserveMax positions up front (V4-Flash: ~13 KB of compressed entries per position over its CSA
  // layers, 0.8 GB at 64K): a long --max-tokens must not take memory a generation that stops early never uses;
  // past it the caches double as before, each growth (and re-capture) rarer than the last.
  static constexpr int64_t kReserveMax = 65536;
  void reserve(SessionState& st, int64_t positions) const override {
    own(st);
    DeviceSessionState& ds = *st.dev;
    const Turn turn(ds.scratch);
    positions = std::min(positions, kReserveMax);
    try {
      reserve_caches(ds, positions);
      synchronize();  // (as new_state)
    } catch (...) {
      rethrow_for(fmt::format("reserving the GPU's caches for {} positions", positions));
    }
  }

  // StateMark::dev: what a forward overwrites in the session's device caches (the window's key ring, the compressors'
  // pending rows and CSA's previous series, cuda.comp_deferred's kept inputs and where they start), copied to the
  // host: a few windows of rows per layer. The entries only grow and their count follows from the position, so they
  // are kept as they are (rows past the restored count are rewritten before any kernel reads them).
  struct DeviceMark {
    std::vector<std::vector<char>> bufs;  // marked_buffers' contents, in their order
    int64_t defer_from = 0;
  };
  template <class State>
  static auto marked_buffers(State& ds) {
    std::vector<decltype(&ds.layers[0].ring)> out;
    for (auto& l : ds.layers)
      for (auto* b : {&l.ring, &l.comp.pend_kv, &l.comp.pend_gate, &l.comp.prev_kv, &l.comp.prev_gate, &l.icomp.pend_kv,
                      &l.icomp.pend_gate, &l.icomp.prev_kv, &l.icomp.prev_gate, &l.xring, &l.xpos})
        if (b->bytes() > 0) out.push_back(b);
    return out;
  }
  std::shared_ptr<void> mark(const SessionState& st, int64_t& bytes) const override {
    own(st);
    const Turn turn(st.dev->scratch);
    synchronize();  // (the forwards queued before the mark have written what it copies)
    auto m = std::make_shared<DeviceMark>();
    m->defer_from = st.dev->defer_from;
    for (const DeviceBuffer* b : marked_buffers(*st.dev)) {
      m->bufs.emplace_back(b->bytes());
      b->download(m->bufs.back().data(), b->bytes());
      bytes += int64_t(b->bytes());
    }
    return m;
  }
  void rollback(SessionState& st, const void* mark) const override {
    const auto& m = *static_cast<const DeviceMark*>(mark);
    own(st);
    const Turn turn(st.dev->scratch);
    synchronize();  // (a pass stopped or failed may still be running: it must not write after the restore)
    const auto bufs = marked_buffers(*st.dev);
    PLUMB_CHECK(bufs.size() == m.bufs.size(), "rollback: the mark holds {} device buffers, the session {} (not this session's mark)",
                m.bufs.size(), bufs.size());
    for (size_t i = 0; i < bufs.size(); ++i) {
      PLUMB_CHECK(bufs[i]->bytes() == m.bufs[i].size(), "rollback: device buffer {} is {} bytes, its mark {}", i,
                  bufs[i]->bytes(), m.bufs[i].size());
      bufs[i]->upload(m.bufs[i].data(), m.bufs[i].size());
    }
    st.dev->defer_from = m.defer_from;
  }

 private:
  // Runs the forward pass for these tokens and returns the device logits [n or 1 or 0, vocab] (valid until the next
  // call). Its callers, the entry points above, hold their Turn until those logits are read.
  const float* run(SessionState& st, std::span<const int32_t> tokens, TapSink* taps, LogitRows rows) const {
    const int n = int(tokens.size());
    DeviceSessionState& ds = *st.dev;
    Scratch& sc = ds.scratch;
    // The step's inputs in one upload: the position (int64), then the tokens (int32). Kernels read the position
    // from here, so a captured step replays at any position.
    std::vector<int32_t> host(2 + size_t(n));
    std::memcpy(host.data(), &st.pos, 8);
    std::copy(tokens.begin(), tokens.end(), host.begin() + 2);
    auto* buf = static_cast<int32_t*>(sc.get("step", host.size() * 4));
    ds.stage.upload(buf, host.data(), host.size() * 4);
    Step step{reinterpret_cast<const int64_t*>(buf), st.pos, false};
    // cuda.comp_deferred: one-token steps may keep their compressor rows (comp_defer_mode); a step that does not
    // projects the rows kept before it first, eagerly (a transition: graphs are for the steady states).
    step.defer = opt_.cuda_comp_deferred && n == 1;
    step.defer_from = opt_.cuda_comp_deferred ? ds.defer_from : INT64_MAX;
    const DeferScan scan = scan_defer(step, n);
    const bool flush = scan.flush;
    ds.comp_windows_projected += scan.project;
    if (!step.defer) ds.defer_from = st.pos + n;
    const LaunchScopes scopes(*this, sc, n);
    reserve_caches(ds, step.pos0 + n);
    if (taps || !graph_allowed(ds, n, flush)) {
      const SessionRows one{&ds, step, 0, n};
      return body(std::span(&one, 1), buf + 2, taps, rows);
    }
    step.bounds = true;
    // One captured step per (chunk size, logit rows, CSA layers skipping their indexer), and apart from them the
    // timeline's (OpTimer: its events are nodes of the graph) and bench --skeleton's (weights_skipped).
    auto& g = ds.graphs[n * 4 + int(rows) + (sc.timer.on && sc.timer.timeline ? 1 << 20 : 0) + (indexer_skips(step.pos0 + n) << 21) +
                        (weights_skipped() ? 1 << 30 : 0) + (comp_defer_modes(step, n) << 32)];
    if (!g) g = std::make_unique<GpuGraph>();
    const SessionRows one{&ds, step, 0, n};
    return run_graph(std::span(&one, 1), *g, buf + 2, rows);
  }

  // forward_batch: one token of each session (eagerly, or as the batch's captured graph, kept by its first session).
  // Each session's caches are grown here, against its own cache generation, so that its captured graphs (and the
  // batch's) are re-captured if they move. Not a deferring step (cuda.comp_deferred): a session's kept compressor
  // rows are projected first by its attention, as a multi-token step's are. (The caller holds its Turn, as run()'s.)
  const float* run_batch(std::span<SessionState* const> states, std::span<const int32_t> tokens) const {
    const int n = int(tokens.size());
    DeviceSessionState& first = *states[0]->dev;
    Scratch& sc = first.scratch;
    // The inputs in one upload: each session's position (int64), then the tokens (int32).
    std::vector<int32_t> host(2 * size_t(n) + size_t(n));
    for (int b = 0; b < n; ++b) std::memcpy(host.data() + 2 * b, &states[size_t(b)]->pos, 8);
    std::copy(tokens.begin(), tokens.end(), host.begin() + 2 * n);
    auto* buf = static_cast<int32_t*>(sc.get("batch.step", host.size() * 4));
    first.stage.upload(buf, host.data(), host.size() * 4);
    std::vector<SessionRows> runs;
    // cuda.graph: one captured step per batch of these sessions in this order (by their ids: an address may be reused)
    // and the CSA layers each skips its indexer in; eager where a session projects kept compressor rows first.
    std::vector<int64_t> key;
    bool flush = false;
    for (int b = 0; b < n; ++b) {
      SessionState& st = *states[size_t(b)];
      DeviceSessionState& ds = *st.dev;
      Step step{reinterpret_cast<const int64_t*>(buf) + b, st.pos, false};
      step.defer_from = opt_.cuda_comp_deferred ? ds.defer_from : INT64_MAX;
      flush = flush || scan_defer(step, 1).flush;
      reserve_caches(ds, st.pos + 1);
      runs.push_back({&ds, step, b, 1});
      key.push_back(int64_t(ds.id)), key.push_back(indexer_skips(st.pos + 1));
    }
    const std::vector<LayerRows> rows_tab = opt_.cuda_batch_rows ? upload_rows(states, first) : std::vector<LayerRows>();
    const LayerRows* layer_rows = rows_tab.empty() ? nullptr : rows_tab.data();
    const LaunchScopes scopes(*this, sc, n);
    const float* logits = nullptr;
    if (!graph_allowed(first, n, flush)) {
      logits = body(runs, buf + 2 * n, nullptr, LogitRows::All, layer_rows);
    } else {
      for (SessionRows& r : runs) r.step.bounds = true;
      key.push_back((sc.timer.on && sc.timer.timeline ? 1 : 0) + (weights_skipped() ? 2 : 0));
      // (a few batches kept: continuous batching changes them as requests come and go)
      if (first.batch_graphs.size() >= kBatchGraphs && !first.batch_graphs.count(key)) first.batch_graphs.clear();
      auto& g = first.batch_graphs[key];
      if (!g) g = std::make_unique<GpuGraph>();
      logits = run_graph(runs, *g, buf + 2 * n, LogitRows::All, layer_rows);
    }
    // (once the step is queued: a batch that throws before leaves every session's kept compressor rows counted)
    for (SessionRows& r : runs) r.ds->defer_from = r.step.pos0 + 1;
    return logits;
  }
  static constexpr size_t kBatchGraphs = 8;

  // cuda.batch_rows: every layer's tables of the batch's sessions' caches (gpu_attention's LayerRows), uploaded into
  // the shared scratch with the step (a captured batch graph reads them there: the same values while its
  // sessions' caches stay, which their cache generations vouch for; the row types, set by each session's position,
  // while the CSA layers each skips its indexer in stay, which the graph's key holds). Per layer: rings [n], entries
  // [n], the indexer's keys [n], the compressors' states [n] each, then the CSA row types [n] (int8; each layer's
  // table 16-byte aligned).
  std::vector<LayerRows> upload_rows(std::span<SessionState* const> states, DeviceSessionState& first) const {
    const size_t n = states.size(), L = g_.layers.size();
    const size_t per_layer = (n * (3 * sizeof(void*) + 2 * sizeof(detail::CompCaches) + 1) + 15) / 16 * 16;
    std::vector<unsigned char> host(per_layer * L);
    auto* dev = static_cast<unsigned char*>(first.scratch.get("batch.rows", host.size()));
    std::vector<LayerRows> out(L);
    auto caches = [](GpuCompState& s) {
      return detail::CompCaches{s.pend_kv.as<float>(), s.pend_gate.as<float>(), s.prev_kv.as<float>(), s.prev_gate.as<float>(), s.entries.as<float>()};
    };
    for (size_t i = 0; i < L; ++i) {
      unsigned char* h = host.data() + i * per_layer;
      auto* rings = reinterpret_cast<float**>(h);
      auto* entries = reinterpret_cast<const float**>(h + n * sizeof(void*));
      auto* ikeys = reinterpret_cast<const float**>(h + 2 * n * sizeof(void*));
      auto* comp = reinterpret_cast<detail::CompCaches*>(h + 3 * n * sizeof(void*));
      detail::CompCaches* icomp = comp + n;
      auto* types = reinterpret_cast<int8_t*>(icomp + n);
      for (size_t b = 0; b < n; ++b) {
        GpuLayerState& st = states[b]->dev->layers[i];
        rings[b] = st.ring.as<float>(), entries[b] = st.comp.entries.as<float>(), ikeys[b] = st.icomp.entries.as<float>();
        comp[b] = caches(st.comp), icomp[b] = caches(st.icomp);
        types[b] = takes_all_entries(g_.layers[i].attn, cfg_, states[b]->pos + 1) ? 2 : 1;  // (gpu_attention's all_entries)
      }
      const size_t off = i * per_layer;
      out[i].rings = reinterpret_cast<float* const*>(dev + off);
      out[i].entries = reinterpret_cast<const float* const*>(dev + off + n * sizeof(void*));
      out[i].ikeys = reinterpret_cast<const float* const*>(dev + off + 2 * n * sizeof(void*));
      out[i].comp = reinterpret_cast<const detail::CompCaches*>(dev + off + 3 * n * sizeof(void*));
      out[i].icomp = out[i].comp + n;
      out[i].csa_types = reinterpret_cast<const int8_t*>(out[i].icomp + n);
    }
    first.stage.upload(dev, host.data(), host.size());
    return out;
  }

  // Grows a session's caches for positions up to pos_end, against its own cache generation.
  void reserve_caches(DeviceSessionState& ds, int64_t pos_end) const {
    for (size_t i = 0; i < ds.layers.size(); ++i) reserve_attention_state(g_.layers[i].attn, pos_end, ds.layers[i], ds.generation);
  }
  // cuda.comp_deferred over the layers for a step of n tokens: whether it first projects rows kept by earlier steps
  // (flush: then it runs eagerly) and whether a layer projects its window's kept rows at it (project).
  struct DeferScan {
    bool flush = false, project = false;
  };
  DeferScan scan_defer(const Step& step, int n) const {
    DeferScan d;
    for (const auto& l : g_.layers) {
      int64_t kept = 0;
      const CompDeferMode mode = comp_defer_mode(l.attn, step, n, &kept);
      d.flush = d.flush || (mode == kCompNormal && kept > 0);
      d.project = d.project || mode == kCompProject;
    }
    return d;
  }
  // cuda.graph for a step of n rows whose buffers are ds's scratch (a session's own step, or a batch's first session):
  // not under per-op timing without a timeline, after a failed capture, for prefill-sized chunks, or where kept
  // compressor rows are projected first.
  bool graph_allowed(const DeviceSessionState& ds, int n, bool flush) const {
    const Scratch& sc = ds.scratch;
    return opt_.cuda_graph && (!sc.timer.on || sc.timer.timeline) && !ds.graphs_failed && n <= kGraphMaxTokens && !flush;
  }

  // The rows of a forward chunk that belong to one session: its caches, its step (position), and where its rows
  // sit in the chunk.
  struct SessionRows {
    DeviceSessionState* ds = nullptr;
    Step step;
    int64_t row0 = 0, n = 0;
  };

  // The per-forward switches of the patches that change how launches are made (RAII), and the scratch's streams.
  struct LaunchScopes {
    PdlScope pdl;                  // cuda.pdl: this forward's launches (and a capture of them)
    EvictFirstScope evict_first;   // cuda.l2_evict_first: its GEMVs' weight loads
    PdlHcAttnScope pdl_hc_attn;    // cuda.pdl_hc_attn (under the PdlScope above)
    LinearEarlyScope linear_early; // cuda.linear_early (likewise)
    LaunchScopes(const GpuForward& f, Scratch& sc, int n)
        : pdl(f.opt_.cuda_pdl && n <= kPdlMaxTokens), evict_first(f.opt_.cuda_l2_evict_first), pdl_hc_attn(f.opt_.cuda_pdl_hc_attn),
          linear_early(f.opt_.cuda_linear_early) {
      if (f.opt_.cuda_streams) sc.enable_side();  // once per model, before any capture
      if (f.opt_.cuda_l2_prefetch || f.opt_.cuda_hc_prefetch) sc.enable_prefetch();
    }
  };

  // indexer.skip_short: how many CSA layers skip their indexer in a step ending before pos_end (gpu_attention). Each
  // layer skips up to a position of its own and never after, so the count names the set: a captured step replays
  // only where it is the same.
  int indexer_skips(int64_t pos_end) const {
    int k = 0;
    for (const auto& l : g_.layers) k += takes_all_entries(l.attn, cfg_, pos_end);
    return k;
  }

  // cuda.comp_deferred: the layers' modes (comp_defer_mode) as one number, a base-3 digit per compressor rate (the
  // layers that can defer take their rate's mode), so a captured step replays only where each layer keeps, projects
  // or neither as it did.
  int64_t comp_defer_modes(const Step& step, int n) const {
    int64_t code = 0;
    std::vector<int64_t> rates;
    if (step.defer)
      for (const auto& l : g_.layers)
        if (comp_deferrable(l.attn) && std::find(rates.begin(), rates.end(), l.attn.comp->rate) == rates.end()) {
          rates.push_back(l.attn.comp->rate);
          code = code * 3 + comp_defer_mode(l.attn, step, n);
        }
    return code;
  }

  // cuda.pdl applies to forwards of at most this many tokens. H200 A/B of FAST with and without it (layer bench,
  // us per layer, one machine each, interleaved rounds): batch 1 212 -> 198 (3 rounds), batch 8 even (session 15);
  // batch 32 965 / 980 -> 1031 / 1035, batch 128 1933 / 1962 against 1953 / 1953 (2 rounds, session 16): at 32
  // tokens the waiting blocks of the next kernel take SM slots from the running one.
  static constexpr int kPdlMaxTokens = 8;
  // cuda.l2_prefetch's steps. Paired A/B on the H200 (session 48, 4-layer stack, FAST, us per layer, 2-3 rounds):
  // 1 token -0.1 to -1.1 (within noise), 2 +0.5 / +0.7, 4 -1.9 / -2.7, 8 -6.0 to -7.4, 16 +8.2 / +8.7, 32 +9.0 to +9.5
  // (session 9, before the evict-first loads and the other FAST patches: slower at 1, 8 and 32).
  static constexpr int kL2PrefetchMinTokens = 4, kL2PrefetchMaxTokens = 8;
  static constexpr int kGraphMaxTokens = 256;  // larger chunks (prefill) launch eagerly: the launch cost is amortized

  // cuda.graph: replays the step captured in g when the memory of every session it reads has not moved since;
  // otherwise runs it eagerly with graph bounds once (every allocation happens there) and captures the next one.
  // runs: as body's, their steps with graph bounds and their caches reserved.
  const float* run_graph(std::span<const SessionRows> runs, GpuGraph& g, const int32_t* tok, LogitRows rows,
                         const LayerRows* layer_rows = nullptr) const {
    DeviceSessionState& ds = *runs[0].ds;
    Scratch& sc = ds.scratch;
    const auto marks = [&] {
      return std::array<const void*, 9>{sc.ws.partial(0),       sc.ws.half(0),       sc.ws.counters(0),
                                        sc.ws_side.partial(0),  sc.ws_side.half(0),  sc.ws_side.counters(0),
                                        sc.ws_side2.partial(0), sc.ws_side2.half(0), sc.ws_side2.counters(0)};
    };
    // (the shared scratch's buffers, then each session's caches)
    const auto generations = [&] {
      std::vector<uint64_t> v{sc.generation};
      for (const SessionRows& r : runs) v.push_back(r.ds->generation);
      return v;
    };
    const bool same = g.generations == generations() && g.workspace == marks();
    if (g.exec && same) {
      graph_launch(g.exec, nullptr);
      ++ds.graph_launches;
      return g.logits;
    }
    if (g.exec) graph_destroy(g.exec), g.exec = nullptr;
    auto warm_up = [&] {
      const float* out = body(runs, tok, nullptr, rows, layer_rows);
      g.warm = true, g.generations = generations(), g.workspace = marks();
      return out;
    };
    if (!g.warm || !same) return warm_up();
    capture_begin(nullptr);
    const float* out = nullptr;
    void* exec = nullptr;
    try {
      out = body(runs, tok, nullptr, rows, layer_rows);
      exec = capture_end_instantiate(nullptr);
    } catch (const std::exception& e) {
      capture_abort(nullptr);
      ds.graphs_failed = true;
      notice(fmt::format("backend cuda: cuda.graph: capturing the step failed ({}); launching eagerly from now on", e.what()));
      return body(runs, tok, nullptr, rows, layer_rows);
    }
    if (generations() != g.generations || g.workspace != marks()) {  // memory moved during the capture: not valid
      graph_destroy(exec);
      return warm_up();
    }
    g.exec = exec, g.logits = out;
    ++ds.graph_captures;
    graph_launch(exec, nullptr);
    ++ds.graph_launches;
    return out;
  }

  // The whole forward as launches on the default stream (eager, or recorded by a capture). Returns the device
  // logits of the requested rows ([n, vocab], [1, vocab] or none: taps always get every row). runs: the chunk's rows
  // by session (one run, or forward_batch's one row per session); the model's scratch holds the chunk's
  // buffers. Every launch that reads weights works row by row, so all the rows share it (and its weight reads); what
  // reads or writes a session's caches runs per session, at its position (gpu_attention's runs).
  // layer_rows (cuda.batch_rows, or null): forward_batch's per-layer tables of its sessions' caches (gpu_attention).
  const float* body(std::span<const SessionRows> runs, const int32_t* tok, TapSink* taps, LogitRows rows,
                    const LayerRows* layer_rows = nullptr) const {
    const auto& c = cfg_;
    const int64_t D = c.hidden, H = c.hc_mult;
    DeviceSessionState& ds = *runs[0].ds;
    const int n = int(runs.back().row0 + runs.back().n);
    Scratch& sc = ds.scratch;
    // cuda.streams: independent chains of each sublayer on a side stream (gpu_attention, gpu_moe); serial with
    // taps (their downloads order against the thread's stream) and per-op timing (regions on one stream; a
    // timeline keeps the streams, see OpTimer).
    const bool serial_timer = sc.timer.on && !sc.timer.timeline;
    // (A batch of sessions runs serially: its sessions' attention sublayers reuse one scratch, which a branch of one
    // could still be reading while the next one's launches write it.)
    sc.branch = opt_.cuda_streams && !taps && !serial_timer && runs.size() == 1 ? sc.side : nullptr;
    sc.branch2 = sc.branch ? sc.side2 : nullptr;
    sc.gates = sc.branch ? sc.side3 : nullptr;
    // cuda.branch_flags: branches whose reader can wait in-kernel (hc_pre, the split-K attention) signal instead of
    // joining (Scratch::wait_or_join); they join once, before hc_head.
    sc.start_signals(opt_.cuda_branch_flags && sc.branch != nullptr);
    // cuda.early_joins (joins only: with the flags the readers wait in-kernel): see Scratch::early_joins.
    sc.early_joins = opt_.cuda_early_joins && sc.branch != nullptr && !sc.flags;
    sc.gates_to_join = nullptr;
    // cuda.hc_prefetch: decode-sized chunks (larger ones are compute-bound, and their hc_pre launches read fn from L2
    // many times over). cuda.l2_prefetch: steps of kL2PrefetchMinTokens-kL2PrefetchMaxTokens tokens, where it pays.
    const bool pf_weights = opt_.cuda_l2_prefetch && n >= kL2PrefetchMinTokens && n <= kL2PrefetchMaxTokens;
    sc.prefetch = (pf_weights || (opt_.cuda_hc_prefetch && n <= 32)) && !taps && !serial_timer ? sc.pf : nullptr;
    sc.pf_weights = pf_weights;
    sc.pf_forked = false;
    if (sc.prefetch && pf_weights) ++ds.prefetch_steps;

    float* X = sc.f("X", n * H * D);
    float* X2 = sc.f("X2", n * H * D);
    float* post = sc.f("hc.post", n * H);
    float* comb = sc.f("hc.comb", n * H * H);
    float* col = sc.f("hc.collapsed", n * D);
    float* y = sc.f("sublayer.out", n * D);
    auto* mixbuf = static_cast<double*>(sc.get("hc.mix", fwd_hc_scratch_doubles(n, int(H)) * 8));
    OpTimer& tm = sc.timer;
    {
      OpRegion r(tm, "embed");
      fwd_embed(g_.embed.d, tok, n, int(H), X, nullptr, sc.flags ? sc.sync() : nullptr);
      nm_.act(X, int64_t(n) * H * D);
    }

    // The normed x also as f16 when tensor-core kernels read it (written by the norm: no conversion launch per GEMV).
    auto* col16 = opt_.cuda_fp8_gemv || opt_.cuda_moe_mxfp4 ? static_cast<uint16_t*>(sc.get("hc.collapsed16", size_t(n) * size_t(D) * 2))
                                                            : nullptr;
    // The hc_post of a sublayer runs inside the next hc_pre (or hc_head), which computes the new streams of its
    // slice first (HcArgs::y: the same arithmetic, one launch fewer); serial with taps, which read X in between.
    const bool fuse_post = !taps;
    bool post_pending = false;
    // cuda.streams: each hc_pre's post gates and Sinkhorn run apart on sc.gates (HcArgs::gates_apart), joined before
    // the next launch that reads them (the next hc_pre's fused hc_post, hc_head) or the forward's end.
    bool gates_pending = false;
    auto join_gates = [&] {
      if (gates_pending) branch_join(sc.gates, sc.ev_gates_join), gates_pending = false;
    };
    GpuCombine moe_y;  // the MoE sublayer's combine, left to the next launch's fused hc_post (gpu_moe's defer)
    Stream shared_pending = nullptr;  // (cuda.branch_flags) the shared expert of the combine taken, not yet joined
    // take_post: the pending hc_post into this launch, rows from r0 (and its shared expert's branch to shared_pending)
    auto take_post = [&](HcArgs& a, int64_t r0) {
      if (!post_pending) return;
      if (moe_y.ys) {
        a.y_slots = moe_y.ys + r0 * moe_y.K * D, a.y_w = moe_y.w ? moe_y.w + r0 * moe_y.K : nullptr;
        a.y_add = moe_y.add ? moe_y.add + r0 * D : nullptr, a.y_k = moe_y.K, a.y_scale = moe_y.scale;
        shared_pending = moe_y.branch;
        moe_y = GpuCombine{};
      } else {
        a.y = y + r0 * D;
      }
      a.X_prev = X + r0 * H * D, a.post_prev = post + r0 * H, a.comb_prev = comb + r0 * H * H;
      a.X_out = X2 + r0 * H * D, a.X = a.X_out, a.untransposed = opt_.fault_comb_untransposed;
      std::swap(X, X2);
      post_pending = false;
    };
    // hc_pre, then the RMSNorm of the collapsed row (attn_norm / ffn_norm): in the same launch (HcArgs::norm_w)
    // unless taps want the collapsed row before it or the official numerics round it their way. Returns the normed x
    // as f16 for the tensor-core kernels (col16, when they run), else null.
    const bool fuse_norm = !taps && !nm_.official();
    // part (cuda.hc_fold): the sums wo_b's launch left, which also ran this hc_pre's hc_post (nothing pending).
    auto hc_pre_norm = [&](const GpuHc& w, const Tap& tap, const std::string& site, const float* norm_w,
                           const double* part = nullptr) -> const uint16_t* {
      HcArgs a;
      a.X = X, a.fn = f32(w.fn), a.base = f32(w.base), a.scale = f32(w.scale);
      take_post(a, 0);
      a.part = part;
      if (fuse_norm) a.norm_w = norm_w, a.norm_eps = c.rms_eps, a.collapsed16 = col16;
      a.n = n, a.H = int(H), a.iters = c.hc_sinkhorn_iters, a.D = D;
      a.hc_eps = float(c.hc_eps), a.rms_eps = c.rms_eps;
      a.post = post, a.comb = comb, a.collapsed = col;
      a.mix_mode = mix_mode(), a.act_bf16 = nm_.official();
      a.gates_apart = sc.gates != nullptr;
      a.norm_after_mix = opt_.cuda_hc_norm_after_mix;
      // The branches this launch reads (the previous gates, the shared expert of the combine it takes): with
      // cuda.branch_flags waited for in-kernel where its grid leaves room to them, else joined.
      const bool in_kernel = sc.flags && (gates_pending || shared_pending) && branch_wait_fits(fwd_hc_pre_blocks(a));
      if (gates_pending) sc.wait_or_join(a.wait, in_kernel, sc.gates, sc.ev_gates_join), gates_pending = false;
      sc.wait_or_join(a.wait, in_kernel, shared_pending, sc.ev_join), shared_pending = nullptr;
      {
        OpRegion r(tm, "hc_pre");
        fwd_hc_pre(a, mixbuf, nullptr);
      }
      if (a.gates_apart) {
        branch_fork(sc.gates, sc.ev_gates_fork);
        fwd_hc_gates(a, mixbuf, sc.gates);
        gates_pending = true;
      }
      tap_io(tap, (site + ".post").c_str(), post, {n, H});
      tap_io(tap, (site + ".comb").c_str(), comb, {n, H, H});
      tap_io(tap, (site + ".collapsed").c_str(), col, {n, D});
      if (fuse_norm) return col16;
      OpRegion r(tm, "norm");
      return nm_.rms_norm(col, n, D, norm_w, c.rms_eps, col16) ? col16 : nullptr;
    };
    auto hc_post = [&] {
      if (fuse_post) {
        post_pending = true;
        return;
      }
      OpRegion r(tm, "hc_post");
      fwd_hc_post(y, X, post, comb, n, int(H), D, opt_.fault_comb_untransposed, X2, nullptr, nm_.official());
      std::swap(X, X2);
    };

    // cuda.hc_fold: at one token wo_b's launch runs the FFN hc_pre's hc_post and leaves its sums (HcPartArgs), where
    // hc_pre runs NA's kernel with its hc_post fused (no taps, the fp32 twin's numerics), hc_mult 4, whole 16-row
    // tiles, and no in-kernel branch waits (cuda.branch_flags would leave the gates wo_b reads to hc_pre's wait).
    const bool fold_hc = opt_.cuda_hc_fold && opt_.cuda_hc_norm_after_mix && n == 1 && fuse_post && fuse_norm && H == kHcFoldH && D % 16 == 0 &&
                         mix_mode() == 0 && !sc.flags;
    auto* hc_part = fold_hc ? static_cast<double*>(sc.get("hc.part", size_t(D / 16) * size_t(kHcFoldSums) * 8)) : nullptr;
    std::vector<AttnRun> attn_runs;  // (each layer's: its caches in each session)
    for (const SessionRows& r : runs) attn_runs.push_back({r.row0, r.n, r.step, nullptr});
    for (int i = 0; i < c.n_layers; ++i) {
      const auto& L = g_.layers[size_t(i)];
      const Tap tap{taps, taps ? fmt::format("L{}.", i) : std::string()};
      const auto type = c.attn[size_t(i)];
      // cuda.l2_prefetch: while hc_pre runs (latency-bound), the second hc_pre's fn (1.5 MB at V4-Flash's size, read
      // by that launch's 16 blocks alone, so their SMs' bandwidth bounds it when it comes from HBM), then the
      // attention's first weights in order of use; the output projections follow from gpu_attention, the router, the
      // shared expert and the next hc_pre's fn before the second hc_pre. cuda.hc_prefetch: the two fn alone (evict_last:
      // they stay in L2 while the sublayer's ~100 MB of weights stream past).
      const auto comp = [](const std::unique_ptr<GpuComp>& cp, bool gate) {
        return cp ? weight_bytes(gate ? cp->wgate : cp->wkv) : ByteRange{};
      };
      const auto fn = [](const GpuHc& h) { return ByteRange{h.fn.get(), int64_t(h.fn.bytes())}; };
      if (sc.pf_weights)
        sc.prefetch_l2({fn(L.hc_ffn), weight_bytes(L.attn.wq_a), weight_bytes(L.attn.wkv), comp(L.attn.comp, false), comp(L.attn.comp, true),
                        comp(L.attn.icomp, false), comp(L.attn.icomp, true), weight_bytes(L.attn.iweights), weight_bytes(L.attn.iwq_b),
                        weight_bytes(L.attn.wq_b)});
      else
        sc.prefetch_l2({fn(L.hc_ffn)});
      const uint16_t* x16 = hc_pre_norm(L.hc_attn, tap, "hc_attn", f32(L.attn_norm));
      // cuda.early_joins: these gates (read by the FFN's hc_pre) join with the attention's branches instead.
      if (sc.early_joins && gates_pending) sc.gates_to_join = sc.gates, gates_pending = false;
      HcPartArgs fold;
      if (fold_hc) {
        // wo_b reads these gates (post, comb): joined before the attention's launch (cuda.early_joins, with its side
        // stream), else here.
        if (gates_pending || (sc.gates_to_join && !sc.branch)) join_gates(), sc.join_deferred_gates();
        fold.X_prev = X, fold.post = post, fold.comb = comb, fold.X_out = X2, fold.fn = f32(L.hc_ffn.fn), fold.part = hc_part;
        fold.D = D, fold.H = int(H), fold.untransposed = opt_.fault_comb_untransposed;
      }
      const GpuRope& rope = type == AttnType::Sliding ? g_.rope_main : g_.rope_compress;
      for (size_t k = 0; k < runs.size(); ++k) attn_runs[k].st = &runs[k].ds->layers[size_t(i)];
      const bool folded = gpu_attention(L.attn, c, type, rope, col, x16, attn_runs, sc, nm_, tap, y, fold_hc ? &fold : nullptr,
                                        layer_rows ? &layer_rows[i] : nullptr);
      sc.join_deferred_gates();  // (where the attention had no join to share: here, as before)
      if (folded) std::swap(X, X2);  // (the new streams, which wo_b's launch wrote into X2)
      else hc_post();
      const auto& M = L.moe;
      const auto shared = [&](int k) {  // the shared expert's w1, w3, w2 as its kernels read them
        if (M.sfp8) {
          const Fp8Matrix& f = k == 0 ? M.sfp8->w1 : k == 1 ? M.sfp8->w3 : M.sfp8->w2;
          return ByteRange{f.codes.get(), int64_t(f.codes.bytes())};
        }
        const std::unique_ptr<GMat>& g = k == 0 ? M.s1 : k == 1 ? M.s3 : M.s2;
        return g ? weight_bytes(*g) : ByteRange{};
      };
      const GpuHc& next_hc = i + 1 < c.n_layers ? g_.layers[size_t(i) + 1].hc_attn : g_.hc_head;
      if (sc.pf_weights) sc.prefetch_l2({weight_bytes(M.gate), shared(0), shared(1), shared(2), fn(next_hc)});
      else sc.prefetch_l2({fn(next_hc)});
      x16 = hc_pre_norm(L.hc_ffn, tap, "hc_ffn", f32(L.ffn_norm), folded ? hc_part : nullptr);
      gpu_moe(L.moe, c, c.mlp[size_t(i)], opt_, col, x16, n, tok, sc, tap, y, fuse_post ? &moe_y : nullptr);
      hc_post();
      tap_io(tap, "out", X, {n, H, D});
    }
    join_gates();
    if (moe_y.branch) branch_join(moe_y.branch, sc.ev_join), moe_y.branch = nullptr;  // (taken or not: before hc_head)
    sc.join_signalled();
    if (sc.pf_forked) branch_join(sc.prefetch, sc.ev_pf_join);  // (a graph's branches must all join)

    if (taps) rows = LogitRows::All;
    if (rows == LogitRows::None) return nullptr;
    const Tap top{taps, ""};
    // hc_head, the final norm and the LM head on the requested rows only (each row on its own: the last row alone
    // gives the same bits as in the whole chunk).
    const int m = rows == LogitRows::Last ? 1 : n;
    float* hx = col + int64_t(n - m) * D;
    HcArgs a;
    a.X = X + int64_t(n - m) * H * D, a.fn = f32(g_.hc_head.fn), a.base = f32(g_.hc_head.base), a.scale = f32(g_.hc_head.scale);
    a.n = m, a.H = int(H), a.D = D, a.hc_eps = float(c.hc_eps), a.rms_eps = c.rms_eps, a.head = 1;
    a.mix_mode = mix_mode(), a.act_bf16 = nm_.official(), a.norm_after_mix = opt_.cuda_hc_norm_after_mix;
    a.collapsed = hx;
    take_post(a, n - m);  // the last layer's hc_post, on these rows only
    if (fuse_norm) a.norm_w = f32(g_.norm), a.norm_eps = c.rms_eps;  // the final norm in the same launch
    {
      OpRegion r(tm, "head");
      fwd_hc_pre(a, mixbuf, nullptr);
    }
    tap_io(top, "hc_head.out", col, {n, D});  // taps: every row (rows is All)
    float* logits = sc.f("logits", int64_t(m) * c.vocab);
    {
      OpRegion r(tm, "head");
      if (!fuse_norm) nm_.rms_norm(hx, m, D, f32(g_.norm), c.rms_eps);
      if (head_bf16_) {  // cuda.head_bf16: logits = bf16(x) . head^T on the tensor cores, fp32 out
        auto* xb = static_cast<uint16_t*>(sc.get("head.x16", size_t(m) * size_t(D) * 2));
        fwd_to_bf16(hx, int64_t(m) * D, xb, nullptr);
        GemmDesc hg;
        hg.m = m, hg.n = int(c.vocab), hg.k = int(D), hg.workspace = gemm_workspace(sc);
        gemm_bf16(hg, xb, static_cast<const uint16_t*>(g_.head.d.w), logits);
      } else {
        fwd_linear(g_.head.d, hx, m, D, 0, c.vocab, logits, c.vocab, nullptr);
      }
    }
    return logits;
  }

  // The hc mixing GEMM's numerics (HcArgs::mix_mode); official takes precedence, as in the CPU's mixes().
  int mix_mode() const { return opt_.official ? 2 : opt_.mhc_bf16_mix ? 1 : 0; }

  ModelConfig cfg_;
  ModelOptions opt_;
  GpuNumerics nm_;
  GpuWeights g_;
  bool head_bf16_ = false;  // cuda.head_bf16 applies
  Memory memory_;  // memory(): what the upload took of the GPU
  // The forwards' buffers, shared by every session of this model (Scratch): a session keeps only its caches.
  const std::shared_ptr<Scratch> scratch_ = std::make_shared<Scratch>();
  // Every entry point first: a session made by another model would lock and use that model's scratch (and this one's
  // layers on its caches). (Engine refuses such mixes before; this is the backend's own guard.)
  void own(const SessionState& st) const {
    PLUMB_CHECK(st.dev && st.dev->scratch_owner == scratch_, "backend cuda: a session of another model (or of the CPU backend)");
  }
};

}  // namespace
}  // namespace cuda

std::unique_ptr<DeviceForward> make_cuda_forward(const Model& m, const std::function<void(int64_t, int64_t)>& on_layer) {
  return std::make_unique<cuda::GpuForward>(m, on_layer);
}

}  // namespace plumb
#endif  // PLUMB_WITH_CUDA
