// Internal helpers of the diagnosis: tap rows gathered over steps, tolerance checks, the MoE and hc_post
// analyses (diagnosis_moe.cpp, diagnosis_hc.cpp).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "toolkit/diagnosis.h"
#include "toolkit/metrics.h"

namespace plumb::toolkit::detail {

// Rows of `tap` from every step where both traces have it with the same shape, concatenated along dim 0.
bool cat_pair(const Trace& a, const Trace& b, const std::string& tap, Tensor& ta, Tensor& tb);
bool cat_pair_index(const Trace& a, const Trace& b, const std::string& tap, IndexTensor& ia, IndexTensor& ib);

// Within the registry tolerance: no NaN/Inf mismatch and max|a - b| <= tol * max(1, max|a|).
bool within(const Tensor& a, const Tensor& b, double tol);

std::string layers_str(const std::vector<int>& v);
std::string fmt_g(double v);  // 4 significant digits

enum class MoeVerdict { Absent, Ok, NanWeights, ZeroWeights, RouterLogits, Flip, Missing, Twice, SharedScaled,
                        Weights, Scale, Expert, Combine };
const char* verdict_name(MoeVerdict v);

struct MoeLayer {
  int layer = -1;
  bool hash = false;
  MoeVerdict verdict = MoeVerdict::Absent;
  double logits_err = 0;                  // err / max(1, max|A|) of gate.logits
  int64_t rows = 0, flips = 0, ties = 0;
  // Rows of B's gate.weights that are all zero, or hold NaN, where A's are finite and positive. NaN rows are split
  // by A's selected router logits: a score overflow (some logit above 88.7, where exp overflows fp32) or a 0/0
  // (every selected logit below -16.6, where a naive softplus is 0; below about -103 even a stable one is).
  int64_t zero_rows = 0, nan_rows = 0, nan_overflow_rows = 0, nan_zero_rows = 0;
  double zero_rows_max_logit = -1e300;      // max of A's selected logits over the all-zero rows
  double nan_zero_rows_max_logit = -1e300;  // ... over the 0/0 rows
  double nan_overflow_max_logit = -1e300;   // max of A's selected logits over the overflow rows
  double w_ratio = 1;                     // median row-sum ratio of gate.weights, B / A
  double w_sum_a = 0, w_sum_b = 0;        // median row sums
  bool w_ok = true;                       // gate.weights within tolerance
  ScaleFit routed, shared;
  bool routed_ok = true, shared_ok = true, out_ok = true;
  double out_vs_sum = 0, out_vs_scaled = 0;  // rel L2 of B's ffn.out against its inputs summed, and x rsf
};

// Analyses one layer's MoE taps: A from `a`, B from `b` (free-running or teacher-forced: `b_forced`). With
// `reliable_inputs` false (a free-running layer after the first divergence), only the checks that do not depend
// on the layer's input (row sums of gate weights, B's own combine) can give a verdict.
MoeLayer analyze_moe_layer(const Trace& a, const Trace& b, bool b_forced, int layer, double tol, const ModelConfig* cfg,
                           bool reliable_inputs);

// SwiGLU hypothesis: does B's shared (or routed) expert output equal the expert run on A's input with no clamps?
struct SwigluCheck {
  bool evaluated = false, matches_unclamped = false;
  double err_unclamped = 0, err_clamped_vs_a = 0, err_b_vs_a = 0;
  std::string tap, why_not;
};
SwigluCheck check_swiglu(const DiagnosisInput& in, const Trace& b, int layer);

// Grouped top-k hypothesis (fault.v3_grouped_topk, pitfall P-R4): B's selection scores of a learned layer
// (ffn.gate.scores) are A's but for whole aligned groups of `per` experts set to -inf (DeepSeek-V3's group-limited
// top-k masks the groups it does not keep). `per`: the largest group size that explains every row (>= 2).
struct GroupedCheck {
  bool matches = false;
  int64_t per = 0, groups = 0, rows = 0, masked_rows = 0;
  int64_t kept_min = 0, kept_max = 0;  // groups kept on the masked rows
};
GroupedCheck check_grouped_topk(const Trace& a, const Trace& b, int layer);

// hc_post hypothesis: does B's tap (L<i>.out or L<i>.hc_ffn.*) equal what A's taps give with comb applied
// untransposed (C.R instead of C^T.R)?
struct HcCheck {
  bool evaluated = false, matches_untransposed = false;
  double err_untransposed = 0, err_recompute_a = 0, err_b_vs_a = 0;
  std::string tap, why_not;
};
HcCheck check_hc_post(const DiagnosisInput& in, const Trace& b, int layer, const std::string& suffix);

}  // namespace plumb::toolkit::detail
