// Sampling on the GPU: the device twin of plumb::Sampler (include/plumb/text.h, src/generate/sampler.cpp).
// Plain types only (nvcc-safe, like fwd_kernels.h). Kernels in fwd_sample.cu.
//
// What runs where. The host keeps the RNG: for each row it draws u exactly as Sampler::sample does,
//   u = double(rng() >> 11) * 0x1.0p-53        (rng: std::mt19937_64 seeded with SamplingParams::seed),
// and the device does everything else: penalties, greedy argmax, candidate selection in Sampler's order (logit
// descending, equal logits by lower id), the fp64 softmax of logit/T from the top logit, top-p, min-p, the
// renormalization, the cast of each probability to float and the walk of u along their cumulative sum.
//
// The RNG contract. Sampler::sample draws only when the final distribution has more than one token (greedy, or
// top-p / min-p leaving one candidate, draw nothing). To reproduce its token sequence, keep one pending u per
// sequence, pass it, and replace it with a fresh draw only when that row's SampleOut::n came back > 1. (Greedy
// parameters never draw: u may be null then.)
//
// Exactness (what the CUDA tests check against plumb::Sampler, tests/cuda/test_cuda_sample.cpp):
//  * greedy (temperature <= 0 or top_k == 1): exact. The largest non-NaN logit, lowest id on ties (-0 and +0 are
//    equal); a NaN is never picked.
//  * top-k path (1 < K <= kSampleMaxExactK candidates, K = top_k, or the vocabulary when top_k is 0 or >= it):
//    the candidates and their order are exact; the softmax sum, the top-p scan, the renormalizing sum and the
//    walk are the CPU's sequential fp64 loops in the CPU's order (one thread), every operation IEEE-rounded as
//    on the CPU. The one operation that is not bit-identical by construction is exp(): CUDA's fp64 exp and the
//    host libm's agree except for rare 1-ulp differences. Such a difference can change a float-rounded
//    probability by one float ulp, and the token only if u then lies within that ulp (~1e-8 relative to the
//    probability) of a cumulative boundary. In practice the tokens are identical (the test requires it).
//  * sorted path (K > kSampleMaxExactK: top_k 0 or > 1024 with a large vocabulary): the whole row is radix
//    sorted (CUB, stable, so ties stay in id order: the order is exact), but the sums over up to the whole
//    vocabulary are computed in parallel (fixed order, deterministic run to run), not as the CPU's sequential
//    left fold. The token can then differ from the CPU only when u (or the top-p cumulative, or a min-p ratio)
//    lies within ~1e-12 relative of a boundary; the test tolerates a token difference only there.
//  * NaN outside greedy: a NaN ranks below -inf (lower id first among NaNs) and counts as -inf (probability 0), as
//    Sampler reads it.
//  * A row whose largest non-NaN logit (after the penalties) is not finite (all NaN or -inf, or a +inf) has no
//    distribution: Sampler::distribution throws for it, and every path here writes token kSampleNoFinite and n 0
//    (no distribution entries); the caller raises Sampler's error (gpu_model.cpp downloads the row and lets
//    Sampler::distribution say what it held).
//
// Measured on one H200 (2026-11-29, tests/cuda/test_cuda_sample.cpp): 1632 rows over all three paths (vocab 1000,
// 5000, 32000, 129280; ties, -0/+0, -inf, +inf, NaN in greedy rows) plus a 300-step generation: every token,
// every distribution size and all 162403 compared probabilities bit-identical to plumb::Sampler (the sorted path
// included). Since session 73 the rows without a finite logit are refused by both (an H100: 180 of 1080 rows in
// MatchesSamplerOnRandomRows, every token and size equal). Device time per launch at vocab 129280 (graph replay), 1 / 8 rows: greedy 7 / 8 us (with
// penalties 12 / 13), top_k 40 24 / 26 us (penalties 28 / 30), top_k 1024 90 / 102 us, sorted 307 / 391 us.
//
// Launches are asynchronous on `s` and capturable in a CUDA graph (no allocation, no copy, no host sync; the
// sorted path uses CUB's device radix sort with its temporary storage inside `scratch`). Scratch contents need
// no initialization and are not kept between calls. Pointers are device pointers unless said otherwise.
#pragma once
#include <cstddef>
#include <cstdint>

#include "cuda/kernels.h"

namespace plumb::cuda::detail {

// The parameters of plumb::SamplingParams that act on one row (penalty_last_n and the seed stay on the host).
struct SampleParams {
  float temperature = 0.8f;  // <= 0: greedy
  int top_k = 40;            // 0: off
  float top_p = 0.95f;       // 1: off; (0, 1]
  float min_p = 0.05f;       // 0: off; [0, 1]
  float repeat_penalty = 1.0f;     // 1: off; > 0
  float presence_penalty = 0.0f;   // 0: off
  float frequency_penalty = 0.0f;  // 0: off
};

// The token of a row without a finite logit to sample from (see Exactness).
inline constexpr int32_t kSampleNoFinite = -1;

// Outputs per row. token is required; the rest optional (null / cap 0).
struct SampleOut {
  int32_t* token = nullptr;  // [rows] the sampled token, or kSampleNoFinite
  int32_t* n = nullptr;      // [rows] size of the final distribution: > 1 means the row's u was consumed
  int32_t* ids = nullptr;    // [rows, cap] the first min(n, cap) entries of the final distribution, in order:
  float* probs = nullptr;    // [rows, cap]   what Sampler::distribution returns (greedy: {token, 1})
  int cap = 0;
};

inline constexpr int kSampleMaxExactK = 1024;

enum SamplePath : int { kSampleGreedy = 0, kSampleTopK = 1, kSampleSorted = 2 };
// Which path fwd_sample takes for these parameters (see Exactness above).
int fwd_sample_path(const SampleParams& p, int vocab);

// Scratch bytes fwd_sample needs for `rows` rows of `vocab` logits: for these parameters, or (p null) for any
// parameters. The sorted path asks CUB for its temporary size (a host query, no device work).
size_t fwd_sample_scratch_bytes(int rows, int vocab, const SampleParams* p = nullptr);

// Samples one token per row of logits [rows, vocab] (fp32, row-major). Penalties (when the parameters enable
// any): pen_ids / pen_counts [npen] are the DISTINCT tokens of the penalty window (the last penalty_last_n
// tokens of the history, as Sampler counts them) and their counts, shared by all rows; ids outside the
// vocabulary are ignored; npen may be 0. u [rows]: one draw per row (see the RNG contract; null for greedy).
// scratch: scratch_bytes >= fwd_sample_scratch_bytes(rows, vocab, &p), 16-byte aligned. Throws
// std::runtime_error on invalid arguments (the checks Sampler's constructor makes, sizes, null pointers).
void fwd_sample(const float* logits, int rows, int vocab, const SampleParams& p, const int32_t* pen_ids,
                const int32_t* pen_counts, int npen, const double* u, const SampleOut& out, void* scratch,
                size_t scratch_bytes, Stream s);

// Structured output (Session::forward_sample_masked): every logit of row r whose bit is clear in bits[r, words]
// (bit id % 32 of word id / 32; words = (vocab + 31) / 32) becomes -inf, in place, before fwd_sample reads the row.
// The host's twin is gen::mask_logits (src/generate/token_bits.h): the same -inf, so fwd_sample then draws what
// Sampler draws from the host-masked row (the -inf logits stay -inf through the penalties).
void fwd_mask_logits(float* logits, int rows, int vocab, const uint32_t* bits, Stream s);

}  // namespace plumb::cuda::detail
