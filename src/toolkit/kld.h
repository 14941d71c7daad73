// plumb kld: model-level drift between two configurations, per token KL(P_A || P_B) over the vocabulary from
// the logits (fp64 log-softmax), top-1 agreement and probability shifts, with llama.cpp's statistics and
// uncertainty formulas (reference notes, precision-and-formats.md section 5.1). A's top-k log-probabilities can
// be saved once and candidates compared against the file later.
#pragma once
#include <iterator>
#include <string>
#include <vector>

#include "toolkit/trace.h"

namespace plumb::toolkit {

struct KldReport {
  std::string a, b, source, model_dir, ref_file;
  std::string a_config;  // A's configuration as --a takes it (a is its label: "..., saved" against a --ref file)
  int64_t vocab = 0;
  int64_t topk = 0;  // 0: full vocabulary; k: against a saved top-k file (the rest of A's mass as one bin)
  // Per scored token (every position of every step, in order).
  std::vector<double> kld;       // KL(P_A || P_B), nats
  std::vector<double> dp_top;    // p_B(A's top token) - p_A(A's top token)
  std::vector<char> same_top;    // argmax B == argmax A
  // Per token whose next token is in the input (llama.cpp's protocol scores the actual next token).
  std::vector<double> nll_a, nll_b, dp_next;
  int64_t nonfinite_rows = 0;    // rows of B's logits holding NaN/Inf (their KLD is inf)
  int64_t next_skipped = 0;      // of those, rows followed by a token of the input (left out of the next-token figures)
  // The input's options as the command took them ("--fixture DIR", "-m M --text F --chunk 512"), for the diff command
  // printed after the statistics; empty against a --ref file without input options.
  std::string input_args;
  double seconds = 0;
};

// mean +- uncertainty as llama.cpp computes them: sqrt((S2/N - mean^2) / (N - 1)); no uncertainty for N <= 10.
struct MeanUnc {
  double mean = 0, unc = 0;
  bool has_unc = false;  // N > 10 and a finite mean
  size_t n = 0;
};
MeanUnc mean_unc(const std::vector<double>& v);
// Linear interpolation over the sorted values at fraction p in [0, 1].
double percentile(std::vector<double> v, double p);

KldReport kld_live(const RunInput& in, const std::string& a, const std::string& b);
// The same statistics from two traces of one input (their logits).
KldReport kld_of_traces(const Trace& a, const Trace& b);
// A run that records the logits only (of `model`, loaded with `patches`, or of the model `patches` loads).
Trace logits_trace(const Model& model, const RunInput& in, const std::string& patches, const char* role = nullptr);
Trace logits_trace(const RunInput& in, const std::string& patches, const char* role = nullptr);
// Runs A and writes its top-k log-probabilities (and the input, so the compare step needs none) to `path`.
void save_kld_ref(const RunInput& in, const std::string& a, const std::string& path, int64_t topk);
// A saved reference read back and checked (shapes, ids inside the vocabulary, the steps covering the tokens); throws
// plumb::Error naming the file for anything a corrupt or foreign file could hold.
struct KldRef {
  std::string patches, model, source;
  int64_t vocab = 0, topk = 0;
  std::vector<GoldenStep> steps;  // the input, with its tokens
  IndexTensor ids;                // [n, topk], inside [0, vocab)
  Tensor logprobs;                // [n, topk]
  Tensor next_logprob;            // [n]
};
KldRef read_kld_ref(const std::string& path);
// Compares configuration B against a saved reference. `model_dir` overrides the folder recorded in the file;
// `in` (may be null) must then hold the same tokens as the file.
KldReport kld_against_ref(const std::string& path, const std::string& model_dir, const std::string& b, const RunInput* in);

// Every statistic print_kld and kld_json report, computed once.
struct KldSummary {
  static constexpr double kFractions[] = {1.0, 0.999, 0.99, 0.95, 0.90, 0.5, 0.10, 0.0};  // max ... min
  MeanUnc kld;
  double percentiles[std::size(kFractions)] = {};
  int64_t max_position = -1;
  double same_top = 0, same_top_unc = 0;  // unc NaN: n/a
  MeanUnc dp_top;
  double rms_dp_top = 0, rms_dp_top_unc = 0;
  size_t next_tokens = 0;  // rows followed by a token of the input (B finite): the figures below
  double ppl_a = 0, ppl_b = 0;
  MeanUnc ln_ppl_ratio, dp_next;
  std::string examine;  // the diff command for the maximum ("" below kExamineKld)
};
KldSummary summarize(const KldReport& r);

void print_kld(const KldReport& r);
// One KL value as print_kld shows it: below 1e-3 in scientific notation with three decimals ("1.897e-07": fast paths at 1e-9 and
// 1e-6 nats differ by a thousand, which six decimals would print alike as 0.000000), else six decimals; zero (either
// sign) as 0.000000. A rounding's value a few ulps below 0 is printed as it is.
std::string format_kl(double v);
// The position (index into the report's per-token values) of the largest KL divergence, the first of equal ones;
// -1 when there is none.
int64_t max_position(const KldReport& r);
// print_kld prints the diff that examines the maximum when it is above this (nats): below, two configurations differ
// by fp32 rounding (a few ulps of a log-probability), which no op-level diff explains.
inline constexpr double kExamineKld = 1e-6;
// s as one shell word: as it is when it is plain (letters, digits and _./:=,+-@), else in single quotes.
std::string shell_quote(const std::string& s);
std::string kld_json(const KldReport& r);

}  // namespace plumb::toolkit
