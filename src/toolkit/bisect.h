// plumb bisect: delta debugging (ddmin) over a patch list to find the smallest subsets that still diverge, each
// reported with its first diverging tap and diagnosis.
#pragma once
#include <string>
#include <vector>

#include "toolkit/diff.h"

namespace plumb::toolkit {

struct BisectOptions {
  RunInput input;
  std::vector<std::string> patches;
  // How a configuration S "diverges":
  //   local (default): some op's teacher-forced error exceeds the registry's local tolerance of S, measured
  //                    against S's numerics modes alone (numerics modes are the reference S is measured against);
  //   free:            the same with free-running errors and the registry's fp32 tolerance (drift included);
  //   kld:             mean KL(P_reference || P_S) over the input exceeds kld_threshold.
  std::string criterion = "local";
  double kld_threshold = 0;
  bool verbose = true;  // print every test
  // Where every configuration runs, the baselines too ("cuda": each subset S as the configuration "cuda:S", against
  // the GPU's own fp32 twin and numerics modes).
  std::string backend = "cpu";
};

struct Culprit {
  std::vector<std::string> patches;  // one minimal diverging set (1-minimal: removing any patch stops it)
  Divergence first;                  // its first divergence against its baseline
  std::string diagnosis;
  std::vector<std::string> alone_ok;  // members that do not diverge alone (an interaction)
};

struct BisectResult {
  bool full_diverges = false;
  std::vector<Culprit> culprits;
  std::vector<std::string> notes;
  int tests = 0;
  double seconds = 0;
};

// The options' own checks (a known criterion, a non-empty patch list), which bisect() makes first too: a command
// makes them before printing anything about the run.
void check_options(const BisectOptions& opt);
BisectResult bisect(const BisectOptions& opt);
// The patches bisect searches: the list's names, presets expanded (expand_patch_list).
std::vector<std::string> split_patch_list(const std::string& list);

}  // namespace plumb::toolkit
