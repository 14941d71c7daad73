// Entry points of plumb's tools: golden verification and the precision toolkit (trace, diff, kld, bisect,
// selftest, the patch list). The CLI is a thin option parser over these; each runs, prints its report on stdout
// and returns the process exit status. Errors are plumb::Error (plumb/error.h) naming the file or option at fault.
//
// A configuration (trace --patches, diff/kld --a/--b) is "[cpu:|cuda:]PATCHES": no prefix is the CPU reference
// backend, "cuda:" the CUDA backend; PATCHES as `plumb patches` lists them ("" = the fp32 reference).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "plumb/error.h"

namespace plumb::tools {

struct VerifyGoldenOptions {
  std::string dir;              // fixture folder (config.json, model.safetensors, golden.json, golden.safetensors)
  std::string backend = "cpu";  // "cpu": the fp32 reference
  std::string patches;          // comma-separated patch names ("" = the reference)
  // "free": the engine runs on its own outputs (errors accumulate). "forced": teacher forcing, every sublayer is
  // fed the fixture's inputs, so each tap shows its op's local error. "auto": free for exact configurations
  // (the fp32 reference and exact patches), forced when an approximate patch or numerics mode is active.
  std::string mode = "auto";
  bool quiet = false;           // print only failing taps and the per-step summary lines
};

// The options alone (a known backend that can run here, a known mode, a patch list the registry takes): what
// verify_golden() checks before loading a fixture, for a caller about to verify many.
void check_verify_options(const VerifyGoldenOptions& opt);

// Runs the fixture's steps on one session and compares logits and taps. Prints the per-step tables and a
// final one-line verdict. Returns 0 when everything passes, 1 when something fails.
int verify_golden(const VerifyGoldenOptions& opt);

// An input: a golden fixture's steps (its folder is the model unless `model`), or `model` with a token file (one
// step per line) or a text file tokenized as `plumb run` tokenizes a prompt, with `tokenizer` (a tokenizer.json or
// its folder; "": the model folder's) (`chunk` > 0: prefill chunks of that many tokens).
struct InputSpec {
  std::string fixture, model, tokens, text, tokenizer;
  int64_t chunk = 0;
  bool given() const { return !fixture.empty() || !tokens.empty() || !text.empty(); }
};

// `plumb trace`: runs one configuration and writes the selected taps + logits (OUT.safetensors, OUT.json).
struct TraceOptions {
  InputSpec in;
  std::string patches, taps, layers, steps, positions, out;
};
int trace(const TraceOptions& o);

// `plumb diff`: two traces, or two configurations run live on one input; exit 0 without a divergence, 1 with.
struct DiffOptions {
  std::string trace_a, trace_b;
  InputSpec in;
  std::string a, b;
  bool local = false;   // teacher-forced columns (each op fed A's values)
  double tol = -1;      // > 0 overrides the registry tolerance
  std::string taps, layers;  // show only these rows
  std::string positions;     // compare only these token positions' rows ("0-3,7"; every position still runs)
  std::string json, html;    // also write the report here
};
int diff(const DiffOptions& o);

// `plumb kld`: per-token KL(P_A || P_B), live or against A's saved top-k log-probabilities.
struct KldOptions {
  InputSpec in;
  std::string a, b, save_ref, ref, json;
  int64_t topk = 64;
};
int kld(const KldOptions& o);

// `plumb bisect`: the smallest subsets of a patch list that still diverge. criterion: local, free or kld (with
// kld_threshold). Exit 1 when the whole list does not diverge.
struct BisectOptions {
  InputSpec in;
  std::string patches, criterion = "local";
  std::string backend = "cpu";  // cpu or cuda: where every configuration runs
  double kld_threshold = -1;
  bool quiet = false;
};
int bisect(const BisectOptions& o);

// `plumb selftest`: every built-in fault found and diagnosed (fixtures empty: the bundled defaults, relative to
// the working directory); backend "cpu" or "cuda".
int selftest(const std::vector<std::string>& fixtures, const std::string& backend = "cpu");

// `plumb patches`: the registry, with tolerances, what each replaces and its risk.
void print_patches();

}  // namespace plumb::tools
