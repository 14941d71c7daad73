// plumb's GPU benchmarks (`plumb bench`; built with -DPLUMB_CUDA=ON, a Hopper GPU): the kernels at DeepSeek-V4-Flash
// sizes against the bandwidth and bf16 GEMM rate measured in the same run, and the whole forward pass on a stack
// of V4-Flash layers. Without a usable GPU (or in a build without CUDA) each says why on stderr and returns 3.
#pragma once
#include <string>
#include <vector>

#include "plumb/error.h"

namespace plumb::cuda {

struct BenchOptions {
  int iters = 30;          // timed repetitions per kernel (median reported)
  int warmup = 3;
  std::string json;        // write the results here too ("" = no)
  std::string csv;         // and the kernel rows as CSV here ("" = no)
  bool flush_l2 = true;    // read a buffer larger than L2 before each timed run (cold weights, as in decode)
  bool profile = false;    // only launch each main kernel once (for a profiler such as ncu), no timing
  std::string only;        // comma-separated sections to run (router, moe, prefill, fp8, fp8xs, fp8prefill, bf16,
                           // attention, indexer, phases, hc; prefill includes fp8prefill); "" = all
};
// Runs the bench on the first device; prints the table to stdout. Returns the process exit code (non-zero
// without a usable GPU, with the reason on stderr).
int run_bench(const BenchOptions& o);

// The model's dimensions (defaults: DeepSeek-V4-Flash; see the spec, section 1.1). Tests use
// a tiny set; the bench runs these or V4-Pro's (`--model pro`).
struct LayerBenchDims {
  std::string model = "V4-Flash";
  int model_layers = 43;        // the whole model's layer count: the implied tokens/s scale a layer's time by it
  double routed_scaling = 1.5;  // routed_scaling_factor
  int vocab = 129280, hidden = 4096, heads = 64, head_dim = 512, rope_dim = 64;
  int q_lora = 1024, o_groups = 8, o_lora = 1024, window = 128;
  int experts = 256, top_k = 6, moe_inter = 2048;
  int hc_mult = 4, sinkhorn_iters = 20;
  int index_heads = 64, index_head_dim = 128, index_topk = 512;
  int csa_rate = 4, hca_rate = 128;
};
// DeepSeek-V4-Pro's dimensions (the spec, section 1.1): hidden 7168, 128 heads, q_lora 1536, 16 output groups,
// 384 experts with moe_inter 3072, index_topk 1024, routed_scaling_factor 2.5, 61 layers.
inline LayerBenchDims v4_pro_dims() {
  LayerBenchDims d;
  d.model = "V4-Pro", d.model_layers = 61, d.routed_scaling = 2.5;
  d.hidden = 7168, d.heads = 128, d.q_lora = 1536, d.o_groups = 16;
  d.experts = 384, d.moe_inter = 3072, d.index_topk = 1024;
  return d;
}

struct LayerBenchOptions {
  int layers = 2;
  std::string patches;  // --patches list (parse_patches), e.g. "cuda.fp8_gemv,cuda.moe_mxfp4"
  std::string dir;      // where to write the synthetic checkpoint; "" = a temp dir removed afterwards. A folder
                        // given here is kept, and reused when it already holds this exact synthetic checkpoint.
  std::vector<int> decode_batches = {1, 8, 32, 128};
  std::vector<int> prefill = {1024, 8192};
  // --sequences: decode steps of B sessions at once (plumb::forward_batch: one token of each, B sequences), each
  // session prefilled with `context` tokens first, against the same sessions stepped one after another. Empty: none.
  std::vector<int> sequences;
  int iters = 10;       // timed decode steps per batch (median reported), after `warmup` steps (the CLI passes its --iters, default 30)
  std::string json;     // write the results here too ("" = no)
  std::string csv;      // and the decode and prefill rows as CSV here ("" = no)
  bool keep = false;    // keep the temp dir (its path is printed)
  bool timeline = false;  // also each decode batch's op regions as a timeline of one replayed step (streams kept)
  // --skeleton: also time each decode batch's steps with the weight-streaming launches skipped (CUDA only): the
  // forward's chain of latency-bound work without its weight bytes, against the batch's roofline.
  bool skeleton = false;
  // --cold-l2: overwrite a buffer of twice the L2's size before each timed decode step (outside its time), so what a
  // step reuses from the one before (hc_pre's fn, the norms' weights, the caches, the kernels' code) comes from DRAM, as
  // in a 43-layer model, where each layer's ~5 MB of such data is evicted by the other layers' weights in between.
  bool cold_l2 = false;
  // --ab PATCHES: also load the checkpoint with these patches (model B) and, per decode batch, time A's and B's steps
  // in pairs (alternating which goes first) on sessions of their own: the median paired difference with a 95 %
  // interval resolves a few percent where separate runs differ by up to 10 %.
  bool ab = false;
  std::string ab_patches;

  // The defaults are what `plumb bench --layers N` runs (warmup and context are CLI flags too, the rest not):
  int warmup = 2;                    // untimed decode steps per batch first (>= 1 from the CLI: the first checks the logits)
  int context = 256;                 // tokens prefilled on each decode batch's session before timing
  // --context-alt N (--sequences only; 0: none): every other session prefilled with N tokens instead of `context`, so a
  // step holds sessions on both sides of a limit (V4-Flash's indexer at 2048 tokens under indexer.skip_short).
  int context_alt = 0;
  int prefill_chunk = 2048;          // a prefill feeds at most this many tokens per forward call
  double max_seconds = 480;          // the whole run; phases that would not fit are skipped, and say so
  double batch_budget_s = 60;        // decode: stop timing a batch once this is spent (after >= 3 steps)
  double prefill_skip_after_s = 20;  // a prefill slower than this skips the larger ones
  int threads = 0;                   // checkpoint generation threads (0: every core)
  std::string backend = "cuda";      // "cpu" runs the same flow on the reference backend (tests; no bandwidth figures)
  LayerBenchDims dims;
};

// Runs the bench on the first device: prints the table on stdout, writes JSON when asked. Returns the process exit
// code: 0 ok, 1 a phase failed (the others still ran), 2 bad options or the checkpoint/load failed, 3 no usable GPU
// (reason on stderr).
int run_layer_bench(const LayerBenchOptions& o);

}  // namespace plumb::cuda
