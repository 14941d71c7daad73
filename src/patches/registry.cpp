// The registry's contents. Tolerances are justified next to each entry.
#include "patches/registry.h"

#include <algorithm>
#include <set>

#include "core/error.h"
#include "core/strings.h"

namespace plumb {

namespace {

constexpr double kRefTol = 1e-4;  // the fp32 reference path against an fp32 golden

std::vector<Patch> make_registry() {
  std::vector<Patch> r;
  // --- speed patches and numerics modes ---
  r.push_back({"moe.rsf_in_topk", "router: routed_scaling_factor placement",
               "fold routed_scaling_factor into the top-k weights (the reference placement, as DeepSeek's Gate does)",
               "a runner that also scales its output would apply the factor twice (prevented by the Rsf types)",
               {kRefTol, 2e-2, kRefTol}, false, [](ModelOptions& o) { o.rsf_on_output = false; }});
  r.push_back({"moe.rsf_on_output", "router + expert runner: routed_scaling_factor placement",
               "top-k weights sum to one; the expert runner multiplies the routed sum by the factor (fused-MoE runners)",
               "a top-k that also folds the factor (or a hash top-k that ignores the request) applies it twice or never",
               // Reassociation only (rsf * sum vs sum of rsf * w): a few fp32 ulps.
               {kRefTol, 2e-2, kRefTol}, false, [](ModelOptions& o) { o.rsf_on_output = true; }});
  r.push_back({"moe.weight_before_down", "experts: routing weight after W2",
               "multiply the routing weight into the SwiGLU activation before W2, as the official code does",
               "mathematically identical; only rounding of the W2 input changes",
               {kRefTol, 2e-2, kRefTol}, false, [](ModelOptions& o) { o.weight_before_down = true; }});
  r.push_back({"mhc.bf16_mix", "hc_pre/hc_head: fp32 mixing GEMM",
               "round the normalized streams and hc_fn to bf16 before the 24-wide mixing GEMM (fp32 accumulate)",
               "mHC weights feed Sinkhorn and every residual stream: bf16 operands shift post/comb by ~1e-3 per layer",
               // bf16 operands carry 2^-9 relative error each; measured worst tap error 2.6e-3 (tiny) and 3.5e-3
               // (tiny-official) of max(1, max|ref|), on hc_*.post. 2e-2 leaves ~6x margin for deeper models.
               {2e-2, 3e-2, 2e-2}, false, [](ModelOptions& o) { o.mhc_bf16_mix = true; }});
  r.push_back({"router.bf16", "router: fp32 logits",
               "router logits from bf16 operands, rounded to bf16 (as engines that skip the fp32 cast do)",
               "perturbs near-ties in expert selection; with very negative logits (router-underflow fixture) the "
               "routing weights themselves move by ~5%: fails there, by design of the test",
               // Measured worst error 5.4e-3 (tiny) / 4.6e-3 (tiny-official) of max(1, max|ref|), on gate.logits.
               // A selection flip moves ffn.* by O(1) and fails this patch: that is a real accuracy risk.
               {2e-2, 3e-2, 2e-2}, false, [](ModelOptions& o) { o.router_bf16 = true; }});
  // --- CUDA kernels (backend cuda only): the fast paths, each against the GPU's fp32 twin of the reference ---
  r.push_back({"cuda.fp8_gemv", "linear on FP8 block-scaled weights (fp32 twin, fp64 accumulation)",
               "W8A16 tensor-core GEMV/GEMM: E4M3 weights converted to f16 in registers (exact), activations rounded "
               "to f16, fp32 accumulation, 128x128 block scales on the fp32 partial sums; the shared expert's gate/up "
               "+ SwiGLU fused; above 8 tokens the large projections share each block's staged activations in shared "
               "memory across 4-8 row tiles; used where rows % 16 == 0 and cols % 128 == 0. Under numerics.official: W8A8 as "
               "DeepSeek's fp8_gemm (x quantized to E4M3 per 128 as act_quant does, the codes into the FP8 tensor "
               "cores as stored, bf16 outputs; wo_a stays bf16 as the official convert.py makes it)",
               "an f16 activation overflows above 65504 (RMS-normed inputs stay far below); a wrong block-scale index "
               "shows as a 2^k error on whole 128-blocks",
               // f16 rounding of the input (2^-11 relative) dominates: measured 7.9e-4 normalized vs the fp32
               // reference on V4-Flash shapes (tests/cuda). 1e-2 leaves margin for a layer's sum of such terms.
               {1e-2, 1e-2, 1e-2}, false, [](ModelOptions& o) { o.cuda_fp8_gemv = true; }, false, "cuda"});
  r.push_back({"cuda.moe_mxfp4", "routed experts: fp32 SwiGLU experts on dequantized FP4",
               "MXFP4 routed experts (W4A16): packed E2M1 kept 4-bit in memory, converted in registers, f16 tensor "
               "cores with fp32 accumulation, each active expert's weights read once per launch for all its tokens; "
               "SwiGLU clamps fused; used where every expert is FP4 with dims multiple of 128. Under "
               "numerics.official: W4A8 as DeepSeek's fp4_gemm (x and h quantized to E4M3 per 128, FP8 tensor "
               "cores, bf16 outputs)",
               "a wrong nibble order or scale group silently corrupts every expert; the f16 hidden state between W1/W3 "
               "and W2 must not overflow (bounded by the SwiGLU clamp)",
               // Measured 7.9e-4 normalized vs the fp32 reference (tests/cuda, V4-Flash shapes), 4.0e-4 for the
               // whole routed MoE.
               {1e-2, 1e-2, 1e-2}, false, [](ModelOptions& o) { o.cuda_moe_mxfp4 = true; }, false, "cuda"});
  r.push_back({"cuda.host_experts", "routed experts in GPU memory",
               "cuda.moe_mxfp4's routed experts (their E2M1 codes; the E8M0 scales stay on the GPU) of the last layers "
               "kept in pinned host memory, which the same kernels read over PCIe: as many layers as the model needs to "
               "fit the GPU beside a reserve for the caches and buffers, at least one. So a model larger than the GPU "
               "runs on one (DeepSeek-V4-Flash's ~155 GB on a 141 GB H200), each such layer's active experts crossing "
               "PCIe at every step instead of streaming from HBM; needs cuda.moe_mxfp4",
               "none for the results (the same kernels read the same bytes from another memory); a layer placed "
               "wrongly computes the same bits, so the test counts the bytes the buffers hold in host memory: tested "
               "bit-identical to device memory over graph and eager steps",
               // Where the codes live only: bit-identical (tests/cuda). The tolerance is the reference's.
               {1e-4, 1e-4, 1e-4}, false, [](ModelOptions& o) { o.cuda_host_experts = true; }, false, "cuda"});
  r.push_back({"cuda.head_bf16", "LM head: fp32 twin GEMV (fp64 accumulation)",
               "the LM head as a cuBLASLt bf16 tensor-core GEMM: the normed hidden state rounded to bf16, the bf16 "
               "head weight as stored, fp32 accumulation and output; used when the head is BF16 in the checkpoint",
               "bf16 rounding of the input moves each logit by ~2^-9 of its scale: near-tied top tokens can swap",
               // One bf16 rounding of x (2^-9 relative) in a dot product of D terms: ~4e-3 of max|logit| at worst on
               // random-sign data; 1e-2 leaves margin.
               {1e-2, 1e-2, 1e-2}, false, [](ModelOptions& o) { o.cuda_head_bf16 = true; }, false, "cuda"});
  r.push_back({"cuda.graph", "a decode step as one kernel launch after another from the host",
               "each forward chunk of up to 256 tokens replayed as a captured CUDA graph: kernels read the position from "
               "device memory and size their grids by the caches' capacity, so one graph serves every step until a "
               "cache grows (then it is captured again); forwards with taps run eagerly",
               "a launch argument that should follow the position but was frozen at capture gives stale results on "
               "every later step: tested bit-identical to eager launches over many steps, window and buffer boundaries",
               // The same kernels on the same data in the same order: bit-identical (tests/cuda). The tolerance is
               // the reference's.
               {1e-4, 1e-4, 1e-4}, false, [](ModelOptions& o) { o.cuda_graph = true; }, false, "cuda"});
  r.push_back({"cuda.pdl", "plain launches (each kernel starts once the previous one has finished)",
               "programmatic dependent launch in forwards of at most 8 tokens (decode; measured slower at 32): a kernel "
               "is scheduled while the previous one finishes and waits in-kernel (griddepcontrol.wait) before touching "
               "activations, so launch latency and the first weight loads (dense GEMVs prefetch theirs into L2) overlap "
               "the previous kernel's tail",
               "a kernel that reads or writes activations before its wait races with the previous kernel: results "
               "change from run to run; tested bit-identical to launches without it",
               // The same kernels on the same data in the same order: bit-identical (tests/cuda). The tolerance is
               // the reference's.
               {1e-4, 1e-4, 1e-4}, false, [](ModelOptions& o) { o.cuda_pdl = true; }, false, "cuda"});
  r.push_back({"cuda.streams", "every kernel of a forward on one stream, one after another",
               "independent chains of a sublayer on side streams, forked and joined with events (parallel branches "
               "of the decode graph): the KV row and the compressors (projections, cache steps) beside the query path, "
               "joined before the indexer; the shared expert beside the router and routed experts, joined before the "
               "sum; each hc_pre's post gates and Sinkhorn (fwd_hc_gates) on a third stream beside the sublayer, "
               "joined before the next hc_pre; each stream has its own workspace and scratch; serial while taps or "
               "per-op timing are on",
               "a branch that reads a buffer before its producer on the other stream has finished, or two branches "
               "sharing a scratch buffer, gives results that change from run to run: tested bit-identical to the "
               "serial launches over graph and eager steps",
               // The same kernels on the same data; only their overlap changes: bit-identical (tests/cuda). The
               // tolerance is the reference's.
               {1e-4, 1e-4, 1e-4}, false, [](ModelOptions& o) { o.cuda_streams = true; }, false, "cuda"});
  r.push_back({"cuda.l2_prefetch", "each kernel reads its weights from HBM when it runs",
               "steps of 4-8 tokens: while the latency-bound launches run (hc_pre, the indexer and attention, the "
               "router), a stream of its own prefetches the weights the next launches will read into L2 "
               "(prefetch.global.L2, evict_last; 32 MiB ahead at most), so their GEMVs read from L2; forked and joined "
               "with events (graph branches); off with taps or per-op timing. On the H200 (paired A/B, 4-layer stack, "
               "session 48) it pays only there: 8 tokens -6.0 to -7.4 us per layer, 4 -1.9 / -2.7; 1 and 2 even, 16 "
               "and 32 ~9 us slower",
               "none for the results (a prefetch writes nothing): bit-identical to running without it; its risk is "
               "speed (bandwidth the prefetch takes from the kernels running beside it, lines evicted before use)",
               // Prefetches only: the same kernels on the same data, bit-identical (tests/cuda). The tolerance is the
               // reference's.
               {1e-4, 1e-4, 1e-4}, false, [](ModelOptions& o) { o.cuda_l2_prefetch = true; }, false, "cuda"});
  r.push_back({"cuda.hc_prefetch", "each hc_pre reads its fn (the mixes' weights) from HBM when it runs",
               "decode: cuda.l2_prefetch's stream prefetches only the next hc_pre's fn (1.5 MB at V4-Flash's size) into L2 "
               "(evict_last) a sublayer ahead, beside the hc_pre before it: the latency-bound hc_pre, whose 16 blocks "
               "alone read fn, then finds it in L2; off with taps or per-op timing; with cuda.l2_prefetch the weights "
               "are prefetched too",
               "none for the results (a prefetch writes nothing): bit-identical to running without it; its risk is "
               "speed (the prefetch's bandwidth, 3 MB per layer)",
               // Prefetches only: bit-identical (tests/cuda). The tolerance is the reference's.
               {1e-4, 1e-4, 1e-4}, false, [](ModelOptions& o) { o.cuda_hc_prefetch = true; }, false, "cuda"});
  r.push_back({"cuda.pdl_hc_attn", "hc_pre's cluster launch and the split-K attention's split and merge launches without PDL",
               "with cuda.pdl (steps of at most 8 tokens), those three launches take the programmatic-dependent-launch "
               "attribute too: hc_pre prefetches its fn (a weight) into L2 and the attention kernels start, then each "
               "waits for the previous kernel in pdl_begin before touching its inputs, and lets the next one launch; "
               "needs cuda.pdl",
               "a read of an input before the wait would race with its producer and change results from run to run: "
               "tested bit-identical to plain launches over graph and eager steps",
               // Launch attributes only: the same kernels on the same data, bit-identical (tests/cuda). The tolerance
               // is the reference's.
               {1e-4, 1e-4, 1e-4}, false, [](ModelOptions& o) { o.cuda_pdl_hc_attn = true; }, false, "cuda"});
  r.push_back({"cuda.linear_early", "the one-token linear waiting for the previous kernel before it loads anything",
               "with cuda.pdl (steps of at most 8 tokens), the one-token linear (the router gate and the compressors' "
               "projections at one token) requests its first round of weights (plain rows) before its PDL wait and "
               "stages the token's row after it, so its weight stream starts while the previous kernel finishes; needs "
               "cuda.pdl",
               "a read of the row before the wait would race with its producer: tested bit-identical to plain launches "
               "over graph and eager steps",
               // The same loads and sums, earlier: bit-identical (tests/cuda). The tolerance is the reference's.
               {1e-4, 1e-4, 1e-4}, false, [](ModelOptions& o) { o.cuda_linear_early = true; }, false, "cuda"});
  r.push_back({"cuda.early_joins", "cuda.streams' branches joined right before the launch that reads them",
               "with cuda.streams, a branch whose reader is not the next launch joins where a launch joins anyway: "
               "the gates apart of the hc_pre before the attention (read by the FFN's hc_pre) join with the "
               "attention's KV row before its launch, and CSA's indexer keys (read at the next step) at the forward's "
               "end, so the FFN's hc_pre joins no branch. A graph node that joins a side stream is launched only once "
               "all its upstream kernels have completed, ~2 us after the kernel before it (even with both edges "
               "programmatic, sessions 42-43), where a PDL launch alone waits ~0.5 us; needs cuda.streams",
               "a branch joined after its reader would race with it: tested bit-identical to the joins in place over "
               "graph and eager steps",
               // Where the joins sit only: the same kernels on the same data, bit-identical (tests/cuda). The
               // tolerance is the reference's.
               {1e-4, 1e-4, 1e-4}, false, [](ModelOptions& o) { o.cuda_early_joins = true; }, false, "cuda"});
  r.push_back({"cuda.shared_first", "the shared expert forked after the router at one token",
               "with cuda.streams, one-token steps fork the shared expert onto its side stream before the router, as "
               "steps of 2-8 tokens do, so its 25 MB (V4-Flash) stream beside the router's gate and top-k instead of "
               "beside the routed experts. Session 22 measured that order 5-6 us per layer slower at one token (the "
               "router's gate then shared the SMs and the bandwidth); on session 48's kernels (paired A/B, 4-layer "
               "stack, batch 1, 6 rounds in two runs, one beside a FAST-against-FAST control of 0.0 to -0.6) it is "
               "1.2-2.1 us per layer faster; needs cuda.streams",
               "none for the results (the same kernels on the same data, in another order on two streams): a missing "
               "join would race with the combine; tested bit-identical to the fork after the router over graph and "
               "eager steps",
               // Where the fork sits only: bit-identical (tests/cuda). The tolerance is the reference's.
               {1e-4, 1e-4, 1e-4}, false, [](ModelOptions& o) { o.cuda_shared_first = true; }, false, "cuda"});
  r.push_back({"cuda.topk_in_experts", "the router's top-k as a launch of its own between the gate and the routed experts",
               "one-token steps with cuda.moe_mxfp4: each block of the routed experts' gate/up launch ranks the gate's "
               "logits itself (one warp, the router kernel's own device code) and streams the expert of its slot, so "
               "the top-k's dependent launch leaves the chain; one block stores the routing (indices and weights for "
               "down and the combine, selection scores for the taps), fences, and only then lets down launch, which "
               "reads the indices before its PDL wait as it does after the router's launch. Not with the official "
               "numerics or moe.weight_before_down (gate/up would need the weights before it starts); needs "
               "cuda.moe_mxfp4. On the H200 (paired A/B, 4-layer stack, batch 1, session 49) it is 2.0-3.4 us per "
               "layer slower beside FAST: gate/up's blocks, resident while the gate runs, take the SMs before "
               "cuda.shared_first's shared expert, whose GEMV then ends after down; without cuda.shared_first it is "
               "1.0-1.2 us faster than that stack, which is itself ~4 us slower than FAST",
               "a block that ranked other logits than the router would stream another expert, and a down that read "
               "the indices before they were stored would too: O(1) errors for that token; tested bit-identical to "
               "the router's launch (the kernel over scoring functions, hash and grouped routing, with and without "
               "PDL; the forward over graph and eager steps, taps included)",
               // The same device code on the same logits: bit-identical (tests/cuda). The tolerance is the reference's.
               {1e-4, 1e-4, 1e-4}, false, [](ModelOptions& o) { o.cuda_topk_in_experts = true; }, false, "cuda"});
  r.push_back({"cuda.hc_norm_after_mix", "hc_pre's mixes of the normalized streams, float(x * r) . fn (its dots wait for r)",
               "hc_pre (and hc_head) with one token per cluster: the 24 dots of the raw streams with fn start without "
               "waiting for the cluster's sum of squares (the norm after the mixing GEMM, the official code's order), "
               "and the mixes are float(r * (x . fn)) in fp64, where the reference takes float(x * r) . fn; forwards "
               "with the reference's mixes (not mhc.bf16_mix, not the official numerics)",
               "skipping the fp32 rounding of x * r moves the mixes by ~1e-7 relative; r applied twice or not at all "
               "would scale every mix (by r ~ 1 / rms of the streams): tested against the exact kernel element by "
               "element",
               // Measured <= 1e-7 normalized on the mixes and <= 2.2e-7 on the collapsed rows against the exact kernel
               // (tests/cuda: HcNormAfterMixMatchesExact); the fp32 twin's forward within 4.2e-7 of the exact one's
               // logits over 300 tokens; 1e-4 is the reference's.
               {1e-4, 1e-4, 1e-4}, false, [](ModelOptions& o) { o.cuda_hc_norm_after_mix = true; }, false, "cuda"});
  r.push_back({"cuda.hc_fold", "the FFN's hc_pre computing its fused hc_post and its mixes' sums itself",
               "at one token with cuda.hc_norm_after_mix, the attention's last GEMV (wo_b on cuda.fp8_gemv's kernel) "
               "runs the FFN hc_pre's fused hc_post on each 16-row tile of its output as soon as the tile is done (the "
               "same arithmetic) and leaves that tile's fp64 sums for the hc_pre: the 24 dots of the new streams with fn "
               "and their sum of squares; the hc_pre launch then totals them (its own slice's sums and two cluster "
               "reductions fewer). The mixes' fp64 sums are taken in another order (tiles of 16 columns, then the "
               "tiles), so a mix can move by an fp32 ulp; hc_mult 4 only (V4's), elsewhere the hc_pre runs as before",
               "a tile's hc_post with the wrong gates or streams, or a sum taken twice or not at all, would change the "
               "FFN's input and the residual streams: O(1) errors from that layer on; tested against the unfolded "
               "forward over graph and eager steps",
               // The same products in another fp64 order, rounded to fp32 once (tests/cuda: HcFoldForwardMatchesUnfolded).
               {1e-4, 1e-4, 1e-4}, false, [](ModelOptions& o) { o.cuda_hc_fold = true; }, false, "cuda"});
  r.push_back({"cuda.comp_deferred", "the compressors' projections of each one-token step (the one-token kernel)",
               "one-token steps keep their attention input x (a ring of `rate` rows per compressed layer) and, at a "
               "window's last token, project its rows as one chunk of `rate` tokens and pool them, so the compressors' "
               "weights are read once per window instead of once per token (V4-Flash: CSA's and its indexer's 21 MB of "
               "bf16 per layer, HCA's 8 MB); a window begun otherwise (after a prefill chunk) projects per token, and a "
               "step of several tokens projects the rows kept before it first. The chunk's projection is the fp32 "
               "twin's whatever the patches: up to 4 rows (CSA) in one launch over the weights, each row's sums in the "
               "one-token kernel's order (its bits those of a one-token launch); more (HCA) the twin's chunk linear "
               "(fp64 sums in another order). On the H200 (paired A/B, 4-layer stack, batch 1) the steps that keep "
               "are ~24 us faster, each CSA window's last step ~12-17 us slower: -3.6 us per layer on average",
               "a row kept in the wrong slot or projected twice would pool the wrong tokens into an entry: O(1) errors "
               "from the window's end on; tested against per-token projections over graph and eager steps, with "
               "several-token steps between",
               {1e-4, 1e-4, 1e-4}, false, [](ModelOptions& o) { o.cuda_comp_deferred = true; }, false, "cuda"});
  r.push_back({"cuda.batch_rows", "a launch per session for forward_batch's cache steps and attention",
               "in a step of several sessions (plumb::forward_batch, plumb serve --parallel), what reads or writes a "
               "session's caches (the KV row's norm and RoPE, its ring slot, the compressors' steps, the split-K "
               "attention with its output rotation) runs as one launch per kind over the rows, each row on its own "
               "session's caches (per-row positions and tables of the rings, compressor states and entries, uploaded "
               "with the step) instead of B launches of each; each row's arithmetic is its session's own one-token "
               "launch's (the one-token split plan; a row that needs fewer splits merges exact zeros). A CSA layer's "
               "attention batches while no session's indexer runs (with indexer.skip_short: up to index_topk x rate "
               "tokens; past it see cuda.batch_rows_indexer), else the indexer's top-k and the attention stay per "
               "session; a step with taps stays per session; needs attn.splitk_decode, refused with the official numerics",
               "a row given another session's table or position would attend to or write into that session's caches: "
               "O(1) errors in both; tested bit-identical to the per-session launches and to each session's own steps",
               // Per-row tables over the same kernels' arithmetic: bit-identical (tests/cuda). The tolerance is the reference's.
               {1e-4, 1e-4, 1e-4}, false, [](ModelOptions& o) { o.cuda_batch_rows = true; }, false, "cuda"});
  r.push_back({"cuda.batch_rows_indexer", "cuda.batch_rows' CSA layers past the indexer's limit per session",
               "with cuda.batch_rows, a CSA layer whose sessions all run their indexer over index_topk entries or more "
               "(with indexer.skip_short: all past index_topk x rate tokens, 2048 on V4-Flash) runs the indexer's "
               "scores and top-k, the queries' RoPE and the attention as one launch each over the rows, each row over "
               "its own keys, position and visible entries (IndexArgs::keys_rows), instead of per session; needs "
               "cuda.batch_rows",
               "a row ranked over another session's keys or entries, or a selection with holes its own step lacks, would "
               "attend to the wrong entries (O(1)) or sum in another order; tested bit-identical to each row's own "
               "launch (IndexerRowsAreEachRowsOwnLaunch, every scores and top-k path) and to the per-session launches "
               "(ForwardBatchRowsRunAsOneLaunchPerKind)",
               // Per-row tables over the same kernels' arithmetic: bit-identical (tests/cuda). The tolerance is the reference's.
               {1e-4, 1e-4, 1e-4}, false, [](ModelOptions& o) { o.cuda_batch_rows_indexer = true; }, false, "cuda"});
  r.push_back({"cuda.batch_rows_mixed", "cuda.batch_rows_indexer's CSA layers with sessions on both sides of the limit per session",
               "with cuda.batch_rows_indexer and indexer.skip_short, a CSA layer whose batch holds sessions on both sides "
               "of the indexer's limit (some past index_topk x rate tokens, running the indexer; some short of it, taking "
               "every entry) runs the indexer and the attention as one launch each over all the rows: the indexer ranks "
               "every row (the short rows' selections go unread), and each row attends by its own kind, its selection or "
               "every visible entry in entry order (AttendArgs::type_rows, a table uploaded with the step: "
               "LayerRows::csa_types); without it such a batch runs that layer per session (a server's sessions of "
               "different lengths); needs cuda.batch_rows_indexer",
               "a row attending by the other kind would take the wrong keys (O(1)); a short row's query normalized "
               "twice or not at all, O(1); tested bit-identical to each row's own launch at V4-Flash's attention shape "
               "(AttentionSplitKRowsOfBothKindsAreEachRowsOwnLaunch) and to the per-session launches "
               "(ForwardBatchRowsRunAsOneLaunchPerKind); not yet run on a GPU (session 87), so not in cuda.fast",
               // Per-row kinds over the same kernels' arithmetic: bit-identical (tests/cuda). The tolerance is the reference's.
               {1e-4, 1e-4, 1e-4}, false, [](ModelOptions& o) { o.cuda_batch_rows_mixed = true; }, false, "cuda"});
  r.push_back({"cuda.branch_flags", "cuda.streams' branches joined by events (graph edges) before the launch that reads them",
               "with cuda.streams, where the reading launch's blocks take at most half of the SMs (so, waiting, they "
               "leave room to the branches' kernels), the branch ends with a one-thread launch that stores the "
               "forward's epoch into a device flag (release) and the reader waits for it after its PDL wait and "
               "before it lets the next kernel launch, instead of behind a graph join: hc_pre for the gates apart and "
               "the shared expert, the split-K attention for the KV row and HCA's entries; those branches join once, "
               "before hc_head. A node with a join loses its PDL edge: its blocks entered ~2 us after the kernel "
               "before it ended, against ~0.5 us for a PDL wait without it (session 42's probe); needs cuda.streams",
               "a reader that loads a branch's output before the flag (or with a non-coherent load) would race with the "
               "branch and change results from run to run; a reader whose waiting blocks fill the GPU would starve "
               "the branch and hang (a missing signal likewise: the reader traps after 10 s, naming itself): tested "
               "against a branch delayed on purpose, and bit-identical to the joins over graph and eager steps",
               // The same kernels on the same data; only how the reader waits changes: bit-identical (tests/cuda).
               // The tolerance is the reference's.
               {1e-4, 1e-4, 1e-4}, false, [](ModelOptions& o) { o.cuda_branch_flags = true; }, false, "cuda"});
  r.push_back({"cuda.l2_evict_first", "the decode GEMVs' weight loads at L2's default (evict-normal) priority",
               "the weight loads of the FP8, MXFP4 and bf16 GEMVs and of the one-token linear (the compressors' projections "
               "at one token) carry an L2 evict-first policy (createpolicy + .L2::cache_hint): the ~230 MB a V4-Flash layer "
               "streams once per step pass through L2 without evicting what the latency-bound kernels between them reuse "
               "(their code, the residual streams, activations, caches); the LM head (cuBLASLt) and prefill GEMMs unchanged",
               "none for the results (a cache hint changes no value): bit-identical to running without it; its risk is "
               "speed (weights a later kernel of the same step would have found in L2)",
               // A cache policy only: the same loads of the same bytes, bit-identical (tests/cuda). The tolerance is the
               // reference's.
               {1e-4, 1e-4, 1e-4}, false, [](ModelOptions& o) { o.cuda_l2_evict_first = true; }, false, "cuda"});
  r.push_back({"cuda.prefill_gemm", "FP8 projections of prefill chunks on the W8A16 GEMV (up to 32 or 64 tokens per pass over the weights)",
               "chunks of >= 32 tokens (80 for single projections of >= 8M weights, 64 for the shared expert's) run the FP8 block-scaled projections (attention, compressors, indexer wq_b, grouped "
               "wo_a, shared expert) as cuBLASLt bf16 tensor-core GEMMs: the weight dequantized into bf16 scratch (exact: "
               "code x power-of-two scale), activations rounded to bf16, fp32 accumulation and output; the prefill half of "
               "cuda.fp8_gemv (needs it); matrices with F32 or extreme block scales stay on the GEMV; the compressors' "
               "plain bf16 projections run the same GEMM (the weight as stored) from 2 tokens (from 33 with cuda.bf16_gemv)",
               "bf16 activations (2^-9 relative) where the GEMV rounds to f16 (2^-11): about 4x its rounding error per "
               "projection; a wrong group stride in the batched wo_a or a transposed weight would be O(1) errors",
               // One bf16 rounding of each input (2^-9 relative): measured <= 1.8e-3 normalized against an fp64 host
               // product of the unrounded inputs at V4-Flash shapes, <= 5.4e-6 against one of the bf16-rounded inputs
               // (tests/cuda/test_cuda_fp8_gemm.cpp); the shared expert (bf16 x and bf16 h) 4.7e-3 against the GEMV
               // path (f16 x and h). 1e-2 as for the other bf16-input patches (cuda.head_bf16).
               {1e-2, 1e-2, 1e-2}, false, [](ModelOptions& o) { o.cuda_prefill_gemm = true; }, false, "cuda"});
  r.push_back({"cuda.bf16_gemv", "plain bf16 projections of 2 or more tokens: the fp32 twin's fp64 GEMV, or cuBLASLt GEMMs under cuda.prefill_gemm",
               "steps of 2 to 32 tokens run the plain bf16 projections (V4-Flash: the compressors' wkv and wgate, the "
               "indexer compressor's too) on the decode GEMV's bf16 tensor-core path: x rounded to bf16 once, the "
               "sublayer's projections in one launch (a table of up to 4 matrices), bf16 MMA with fp32 accumulation, up "
               "to 32 tokens per pass over the weights (cuBLASLt spreads a few tokens' product over few blocks). Under "
               "numerics.official, whose activations are bf16 (so the rounding is exact): also the router gate (fp32 "
               "logits, as DeepSeek's Gate) and the indexer's weights_proj (bf16 out) at every token count",
               "bf16 activations (2^-9 relative), as cuda.prefill_gemm's GEMM: about 4x an f16 rounding per projection; "
               "a table entry pairing a weight with another matrix's output would be O(1) errors",
               // The GEMM's inputs and products; only the fp32 summation order differs (tests/cuda/test_cuda_fp8_gemm.cpp:
               // against an fp64 product of the same bf16-rounded inputs, of the unrounded ones, and against the GEMM).
               // 1e-2 as for the other bf16-input patches.
               {1e-2, 1e-2, 1e-2}, false, [](ModelOptions& o) { o.cuda_bf16_gemv = true; }, false, "cuda"});
  r.push_back({"attn.splitk_decode", "sparse attention: logits of every key, then one softmax and P.V per head",
               "flash-decoding: a block takes one token, 16 heads and a contiguous chunk of keys (staged once in shared "
               "memory for all 16 heads), computes logits and P.V on the fp64 tensor cores with a running max and fp64 "
               "sum, then the chunks are merged with the sink; no logits scratch and no per-query key limit, so long "
               "contexts (HCA: 8K entries at 1M tokens) stay parallel",
               "a wrong rescale when the running max grows, or a split merged without its max, mis-weights whole "
               "chunks of keys; the sink must enter the denominator exactly once",
               // The twin's keys in the twin's order (attn_keys.cuh); the tensor cores sum the fp64 products in their
               // own order and the softmax is normalized per chunk: measured <= 1.2e-7 normalized against the unsplit
               // twin (tests/cuda, key lists up to 8K entries, 4 to 64 heads). The tolerance is the reference's.
               {1e-4, 1e-4, 1e-4}, false, [](ModelOptions& o) { o.attn_splitk_decode = true; }, false, "cuda"});
  r.push_back({"attn.splitk_f16", "attn.splitk_decode's fp64 logits and P.V (fp64 tensor cores)",
               "the split-K attention's two products on the f16 tensor cores (mma.m16n8k16, fp32 accumulation): the "
               "queries, the keys and the probabilities rounded to f16 as their fragments are read (as production "
               "engines run attention in bf16; f16 keeps 3 more mantissa bits), a 32-dim slice's logits and a split's "
               "P.V summed in fp32; the slices' sum, the softmax's sum and the merge stay fp64; needs attn.splitk_decode",
               "a query or key above 65504 becomes inf (RMS-normed rows stay far below); f16 rounding moves each logit by "
               "~2^-11 of |q||k|, so near-equal keys can trade a little weight",
               // f16 inputs (2^-11 relative each), fp32 sums: measured <= 4.9e-4 normalized against the host's fp64
               // attention over tests/cuda's 12 cases (AttentionSplitKF16MatchesFp64); the bound is cuda.fp8_gemv's,
               // whose activations take the same f16 rounding.
               {1e-2, 1e-2, 1e-2}, false, [](ModelOptions& o) { o.attn_splitk_f16 = true; }, false, "cuda"});
  r.push_back({"indexer.tc_scores", "lightning indexer scores: fp64 dots in dim order, summed over heads in head order",
               "the scores on the f16 tensor cores: the token's queries and the compressed keys rounded to f16, "
               "mma.m16n8k16 with fp32 accumulation, relu and the head weights in fp32, heads summed in a fixed tree; "
               "then the same top-k; used where index_head_dim is a multiple of 16 up to 256 and index_n_heads <= 128 "
               "(V4: 64 x 128)",
               "near-equal scores can swap places in the top-k (a different key set for the sparse attention); an f16 "
               "query or key above 65504 would be inf",
               // f16 rounding of q and k (2^-11 relative each) and fp32 sums: the scores' error normalized by their
               // largest magnitude is measured in tests/cuda (IndexerTcScoresMatchExact) well below 1e-2; the
               // top-k's set can differ only among entries within that error of the k-th score.
               {1e-2, 1e-2, 1e-2}, false, [](ModelOptions& o) { o.indexer_tc_scores = true; }, false, "cuda"});
  r.push_back({"indexer.dmma_scores", "lightning indexer scores: fp64 dots in dim order, summed over heads in head order",
               "each (head, entry) dot on the fp64 tensor cores (mma.m16n8k8 f64): the products exact as in the "
               "reference, their fp64 sum in the tensor core's order; the relu, the scales and the sum over heads "
               "the reference's; then the same top-k; used where index_head_dim is a multiple of 8 up to 128 and "
               "index_n_heads <= 128 (V4: 64 x 128)",
               "were the tensor core's fp64 sum order not the reference's, a score could move by an ulp and exactly "
               "tied entries order differently in the top-k",
               // Measured in tests/cuda (IndexerDmmaScoresMatchExact, which allows an ulp per score): every score
               // bit-identical to the exact path's, 8 shapes. The tolerance is the reference's.
               {1e-4, 1e-4, 1e-4}, false, [](ModelOptions& o) { o.indexer_dmma_scores = true; }, false, "cuda"});
  r.push_back({"indexer.skip_short", "CSA key selection: the lightning indexer's top-k of the visible entries",
               "while a chunk's queries see at most index_topk compressed entries (V4-Flash: the first 2051 tokens of "
               "a context), the top-k would select every visible entry: the attention takes them in entry order and the "
               "indexer's query path (wq_b, RoPE, rotation, scores, top-k) is not run; its keys are still compressed "
               "for longer contexts. The taps show the indexer's scores (computed for the tap only) and the selection",
               "an off-by-one in the threshold would drop the top-k at the one context length where it first "
               "matters; the entries' order changes the attention's summation order (fp64 sums)",
               // The same key set as the top-k's, in entry order instead of score order; the attention's sums are
               // fp64 (softmax and P.V). tiny with index_topk 6, across the threshold: bit-identical on the CPU
               // (plumb diff), logits within 1e-6 on the GPU (tests/unit/indexer_skip_check.h, both backends).
               // The tolerance is the reference's.
               {kRefTol, kRefTol, kRefTol}, false, [](ModelOptions& o) { o.indexer_skip_short = true; }});
  // The default numerics, named: verify-golden otherwise runs each golden in its own numerics (numerics.fixture), so
  // this is how the fp32 reference is run on a golden of DeepSeek's official code (to see the gap between the two).
  r.push_back({"numerics.reference", "nothing (the default numerics)",
               "the fp32 reference: fp32 activations and weights dequantized exactly, the config read as transformers "
               "reads it (swiglu_limit, hidden_act, mlp_bias, YaRN's attention factor); what runs when no numerics "
               "mode is named",
               "none: it is the reference every other patch is measured against",
               {kRefTol, kRefTol, kRefTol}, false, [](ModelOptions&) {}, true});
  r.push_back({"numerics.official", "all ops: fp32 reference numerics",
               "DeepSeek's inference code numerics: bf16 activations, FP8 E4M3 activation quantization (128-blocks, "
               "pow2 scales) before FP8/FP4 GEMMs, FP8 simulation of KV nope dims, indexer Hadamard + FP4 simulation",
               "bf16 rounding everywhere: ~1e-2 relative drift per tensor; a rounding-sensitive tie can flip a selection",
               // Against the official goldens (tests/data/golden/*-ref). Teacher forced, each op matches to a few
               // bf16 ulps: measured worst 3.1e-3 (official-mixed-ref L1.attn.out), 1.4e-4 (tiny-official-ref);
               // leaving out the FP8 KV or Hadamard simulation shows as 0.3-2. Combined with patches that move a
               // scale across an FP8 activation quantization (moe.rsf_on_output, router.bf16) single ops differ by
               // one FP8 code: measured up to 4.7e-2 (plumb bisect). Free running, one bf16 ulp can flip an FP8
               // code and the drift compounds: measured up to 4.4e-2 on tiny-official-ref.
               {6e-2, 6e-2, 5e-2}, false, [](ModelOptions& o) { o.official = true; }, true});
  r.push_back({"numerics.official_initial", "all ops: fp32 reference numerics",
               "numerics.official as DeepSeek's release-day inference code computed it: its FP8 KV simulation was a "
               "no-op and its shared expert had no SwiGLU clamp (fixed in the current revision)",
               "engines that follow the release-day code differ from current checkpoints' intent in the shared expert",
               // Same numerics machinery as numerics.official; measured against goldens of the initial revision.
               {6e-2, 6e-2, 5e-2}, false, [](ModelOptions& o) { o.official = o.official_initial = true; }, true});
  // --- built-in faults: the real bugs, refused unless named ---
  auto fault = [&](const char* name, const char* replaces, const char* desc, void (*en)(ModelOptions&)) {
    r.push_back({name, replaces, desc, "this is a deliberate bug for testing the precision toolkit", {0, 0, 0}, true, en});
  };
  fault("fault.rsf_twice", "router + runner", "top-k folds routed_scaling_factor and the runner scales the output again",
        [](ModelOptions& o) { o.fault_rsf_twice = true; });
  fault("fault.rsf_missing", "router + runner", "top-k leaves the factor out and the runner assumes it was folded",
        [](ModelOptions& o) { o.fault_rsf_missing = true; });
  fault("fault.rsf_missing_hash_layers", "hash router",
        "the hash top-k ignores the runner's request to fold the factor: missing on hash-routed layers only",
        [](ModelOptions& o) { o.fault_rsf_missing_hash_layers = true; });
  fault("fault.shared_scaled", "MoE combine", "routed_scaling_factor applied to routed + shared (shared expert scaled)",
        [](ModelOptions& o) { o.fault_shared_scaled = true; });
  fault("fault.comb_untransposed", "hc_post", "hc_post mixes streams with C.R instead of C^T.R",
        [](ModelOptions& o) { o.fault_comb_untransposed = true; });
  fault("fault.softplus_naive", "router score", "softplus as log(1 + exp(x)) in fp32: 0 for x <= -16.6, inf above 88.7",
        [](ModelOptions& o) { o.fault_softplus_naive = true; });
  fault("fault.renorm_unfloored", "router renormalization", "w / sum(w) without a floor: 0/0 = NaN when every score underflows",
        [](ModelOptions& o) { o.fault_renorm_unfloored = true; });
  fault("fault.swiglu_unclamped", "expert SwiGLU", "swiglu_limit not passed to the activation: no gate/up clamps",
        [](ModelOptions& o) { o.fault_swiglu_unclamped = true; });
  fault("fault.v3_grouped_topk", "learned top-k",
        "DeepSeek-V3's grouped top-k on a V4 router: only the best groups' experts selectable (V4 selects over all)",
        [](ModelOptions& o) { o.fault_v3_grouped_topk = true; });
  return r;
}

}  // namespace

const std::vector<Patch>& patch_registry() {
  static const std::vector<Patch> r = make_registry();
  return r;
}

const Patch* find_patch(const std::string& name) {
  for (const auto& p : patch_registry())
    if (p.name == name) return &p;
  return nullptr;
}

const std::vector<PatchPreset>& patch_presets() {
  // FAST: every patch that measured faster at the forward's batches and keeps the bf16 tolerances (docs/cuda.md's
  // patch table says why each is in; attn.splitk_f16 and the indexer's patches are left out there). Checked against
  // bench/gpu_forward.sh's FAST by a test, so the two lists cannot drift.
  static const std::vector<PatchPreset> presets = {
      {"cuda.fast", "the CUDA backend's fast configuration (FAST in docs/cuda.md and plumb bench's figures)",
       {"cuda.fp8_gemv", "cuda.moe_mxfp4", "cuda.head_bf16", "cuda.graph", "attn.splitk_decode", "cuda.streams", "cuda.prefill_gemm",
        "indexer.skip_short", "cuda.pdl", "cuda.bf16_gemv", "cuda.l2_evict_first", "cuda.pdl_hc_attn", "cuda.linear_early",
        "cuda.early_joins", "cuda.hc_norm_after_mix", "cuda.comp_deferred", "cuda.shared_first", "cuda.l2_prefetch", "cuda.hc_fold",
        "cuda.batch_rows", "cuda.batch_rows_indexer"}},
  };
  return presets;
}

const PatchPreset* find_preset(const std::string& name) {
  for (const auto& p : patch_presets())
    if (p.name == name) return &p;
  return nullptr;
}

void check_patch_list_items(const std::string& list) {
  // "a,,b", ",a" and "a," hold an empty item: a typo, refused as the token id lists refuse it ("" is the reference).
  std::string packed;
  for (char c : list)
    if (c != ' ' && c != '\t') packed += c;
  PLUMB_CHECK(packed.empty() || (packed.front() != ',' && packed.back() != ',' && packed.find(",,") == std::string::npos),
              "patch list '{}': an empty item (names are separated by single commas)", list);
}

void check_patches_run_on(const std::vector<std::string>& names, const std::string& backend, const std::string& how) {
  for (const auto& name : names)
    if (const Patch* p = find_patch(name); p && !p->backend.empty() && p->backend != backend)
      fail("patch {} is a {} kernel: {} {}", name, p->backend == "cuda" ? "CUDA" : p->backend, how, p->backend);
}

std::vector<std::string> expand_patch_list(const std::string& list) {
  std::vector<std::string> out;
  std::set<std::string> written;
  auto add = [&](const std::string& name) {
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  };
  check_patch_list_items(list);
  for (const auto& name : split_list(list)) {
    PLUMB_CHECK(written.insert(name).second, "patch '{}' is listed twice", name);
    if (const PatchPreset* pr = find_preset(name)) {
      for (const auto& member : pr->patches) add(member);
      continue;
    }
    PLUMB_CHECK(name != kFixtureNumerics, "{} is verify-golden's (each fixture's own numerics), not a patch of this command",
                kFixtureNumerics);
    if (!find_patch(name)) {
      std::string known;
      for (const auto& q : patch_registry()) known += (known.empty() ? "" : ", ") + q.name;
      for (const auto& q : patch_presets()) known += ", " + q.name + " (a preset)";
      fail("unknown patch '{}' (known: {}); `plumb patches` lists them", name, known);
    }
    add(name);
  }
  return out;
}

double PatchSet::tolerance_fp32() const {
  double t = kRefTol;
  for (auto* p : active)
    if (!p->fault) t = std::max(t, p->tol.fp32);
  return t;
}

double PatchSet::tolerance_local() const {
  double t = kRefTol;
  for (auto* p : active)
    if (!p->fault) t = std::max(t, p->tol.local);
  return t;
}

std::string PatchSet::names() const {
  std::string s;
  for (auto* p : active) s += (s.empty() ? "" : ",") + p->name;
  return s;
}

bool PatchSet::has_fault() const {
  return std::any_of(active.begin(), active.end(), [](const Patch* p) { return p->fault; });
}

PatchSet parse_patches(const std::string& list) {
  PatchSet ps;
  std::set<std::string> seen;
  for (const auto& name : expand_patch_list(list)) {
    const Patch* p = find_patch(name);
    seen.insert(name);
    ps.active.push_back(p);
    p->enable(ps.options);
  }
  // A numerics mode is what "the reference" computes: one at a time.
  std::vector<std::string> modes;
  for (const Patch* p : ps.active)
    if (p->numerics_mode) modes.push_back(p->name);
  PLUMB_CHECK(modes.size() <= 1, "{} and {} are two numerics modes{}: choose one", modes[0], modes[1],
              modes[0].starts_with("numerics.official") && modes[1].starts_with("numerics.official")
                  ? " (two revisions of the same code)"
                  : "");
  PLUMB_CHECK(!(seen.count("moe.rsf_on_output") && seen.count("moe.rsf_in_topk")),
              "moe.rsf_in_topk and moe.rsf_on_output are two placements of the same factor: choose one");
  return ps;
}

RunConfig parse_config(const std::string& spec) {
  RunConfig rc;
  std::string list = spec;
  if (const auto colon = spec.find(':'); colon != std::string::npos) {
    rc.backend = spec.substr(0, colon);
    PLUMB_CHECK(rc.backend == "cpu" || rc.backend == "cuda", "unknown backend '{}' in '{}' (a configuration is [cpu:|cuda:]PATCHES)",
                rc.backend, spec);
    list = spec.substr(colon + 1);
  }
  rc.patches = parse_patches(list);
  return rc;
}

}  // namespace plumb
