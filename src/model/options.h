// ModelOptions: which implementation each op uses. Set only through the patch registry (patches/registry.h),
// from one `--patches a,b,c` list; the default-constructed value is the fp32 reference.
#pragma once

namespace plumb {

struct ModelOptions {
  // Speed patches and numerics modes.
  bool rsf_on_output = false;       // moe.rsf_on_output: weights sum to 1, the runner scales the routed sum
  bool weight_before_down = false;  // moe.weight_before_down: routing weight applied before W2
  bool mhc_bf16_mix = false;        // mhc.bf16_mix: hc mixing GEMM on bf16-rounded operands
  bool router_bf16 = false;         // router.bf16: router logits from bf16-rounded operands, rounded to bf16
  bool official = false;            // numerics.official: DeepSeek's inference code rounding (bf16, FP8/FP4 sim)
  bool official_initial = false;    // numerics.official_initial: its release-day revision (no FP8 KV rounding,
                                    // shared expert without the SwiGLU clamp)
  bool cuda_fp8_gemv = false;       // cuda.fp8_gemv: W8A16 tensor-core kernels for FP8 projections (backend cuda)
  bool cuda_moe_mxfp4 = false;      // cuda.moe_mxfp4: W4A16 tensor-core routed experts (backend cuda)
  bool cuda_head_bf16 = false;      // cuda.head_bf16: LM head as a cuBLASLt bf16 GEMM (backend cuda)
  bool cuda_graph = false;          // cuda.graph: decode steps replayed as CUDA graphs (backend cuda)
  bool attn_splitk_decode = false;  // attn.splitk_decode: sparse attention split over keys (backend cuda)
  bool attn_splitk_f16 = false;     // attn.splitk_f16: its products on the f16 tensor cores (backend cuda)
  bool indexer_tc_scores = false;   // indexer.tc_scores: the indexer's scores on the f16 tensor cores (backend cuda)
  bool indexer_dmma_scores = false;  // indexer.dmma_scores: the indexer's fp64 dots on the fp64 tensor cores (backend cuda)
  bool indexer_skip_short = false;  // indexer.skip_short: no indexer while its top-k would select every entry
  bool cuda_pdl = false;            // cuda.pdl: kernels launched with programmatic dependent launch (backend cuda)
  bool cuda_streams = false;        // cuda.streams: independent sublayer chains on a side stream (backend cuda)
  bool cuda_l2_prefetch = false;    // cuda.l2_prefetch: a layer's coming weights prefetched into L2 on a stream of its own (backend cuda)
  bool cuda_hc_prefetch = false;    // cuda.hc_prefetch: each hc_pre's fn prefetched into L2 a sublayer ahead, on that stream (backend cuda)
  bool cuda_pdl_hc_attn = false;   // cuda.pdl_hc_attn: with cuda.pdl, hc_pre's cluster launch and the split-K attention's two launches too (backend cuda)
  bool cuda_branch_flags = false;  // cuda.branch_flags: with cuda.streams, branch ends signalled in device memory, waited in-kernel (backend cuda)
  bool cuda_shared_first = false;  // cuda.shared_first: with cuda.streams, the shared expert forked before the router at one token too (backend cuda)
  bool cuda_topk_in_experts = false;  // cuda.topk_in_experts: at one token the routed experts' launches rank the gate's logits themselves (backend cuda)
  bool cuda_early_joins = false;  // cuda.early_joins: with cuda.streams, branches joined where a launch joins anyway, so the FFN's hc_pre joins none (backend cuda)
  bool cuda_linear_early = false;  // cuda.linear_early: with cuda.pdl, the one-token linear's first weights loaded before its wait (backend cuda)
  bool cuda_comp_deferred = false;  // cuda.comp_deferred: one-token steps project the compressors' rows once per window (backend cuda)
  bool cuda_hc_norm_after_mix = false;  // cuda.hc_norm_after_mix: hc_pre's mixes normalized after the mixing GEMM, its dots not waiting for r (backend cuda)
  bool cuda_hc_fold = false;  // cuda.hc_fold: at one token wo_b's GEMV runs the FFN hc_pre's hc_post and its sums (backend cuda)
  bool cuda_batch_rows = false;  // cuda.batch_rows: forward_batch's per-session cache steps and attention as one launch per kind (backend cuda)
  bool cuda_batch_rows_indexer = false;  // cuda.batch_rows_indexer: with it, a CSA layer's indexer too, past its limit (backend cuda)
  bool cuda_batch_rows_mixed = false;  // cuda.batch_rows_mixed: with that, rows on both sides of the limit too (backend cuda)
  bool cuda_l2_evict_first = false;  // cuda.l2_evict_first: decode GEMVs' weight loads marked evict-first in L2 (backend cuda)
  bool cuda_prefill_gemm = false;   // cuda.prefill_gemm: FP8 projections of prefill chunks as bf16 GEMMs (backend cuda)
  bool cuda_bf16_gemv = false;      // cuda.bf16_gemv: plain bf16 projections of 2-32 tokens on the bf16 GEMV (backend cuda)
  // cuda.prefill_gemm takes chunks of at least this many tokens; 0: the measured crossover with the GEMV (32 tokens,
  // 80 for single projections of 8M weights or more, 64 for the shared expert's; docs/cuda.md). Not a patch of its own: tests set 1 to run every chunk on it.
  int prefill_gemm_min_tokens = 0;
  // cuda.host_experts: the routed experts (their E2M1 codes) of this many layers, counted from the last, stay in
  // pinned host memory that the kernels read over PCIe; 0: as many as the model needs to fit the GPU, at least one.
  // Not a patch of its own: tests set every layer.
  bool cuda_host_experts = false;
  int host_expert_layers = 0;

  // Built-in faults: real bugs, for testing the toolkit. Never on unless named.
  bool fault_rsf_twice = false;
  bool fault_rsf_missing = false;
  bool fault_rsf_missing_hash_layers = false;
  bool fault_shared_scaled = false;
  bool fault_comb_untransposed = false;
  bool fault_softplus_naive = false;
  bool fault_renorm_unfloored = false;
  bool fault_swiglu_unclamped = false;
  bool fault_v3_grouped_topk = false;  // the learned top-k limited to DeepSeek-V3's best expert groups (model.cpp)

  bool operator==(const ModelOptions&) const = default;
};

}  // namespace plumb
