// Diagnosis of a divergence: what kind of bug the first diverging tap looks like (routed scaling factor twice
// or missing and on which layers, shared expert scaled, transposed mHC comb, NaN origin, underflowed router
// scores, unfloored renormalization, missing SwiGLU clamps, grouped top-k, near-tie versus real selection flips).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/config.h"
#include "model/options.h"
#include "model/weights.h"
#include "toolkit/trace.h"

namespace plumb::toolkit {

struct Divergence {
  std::string tap;  // empty: none
  int step = -1;
  std::string step_name;
  bool none() const { return tap.empty(); }
};

struct Diagnosis {
  std::string kind;                   // machine tag: none, rsf_twice, rsf_missing, shared_scaled, ...
  std::string text;                   // one line for "diagnosis: <text>"
  std::vector<std::string> evidence;  // supporting measurements, one per line
  std::vector<int> layers;            // layers implicated, when known
};

// The checkpoint of the model folder, for recomputing hypotheses from A's taps (the embedding feeds layer 0's
// residual streams; hc and expert weights let a suspected op be re-run on A's inputs).
struct ModelView {
  ModelConfig cfg;
  Checkpoint ck;
  ModelWeights w;
};
// Null (and *why set) when the folder has no readable config.json + weights.
std::unique_ptr<ModelView> try_load_model_view(const std::string& dir, std::string* why);

struct DiagnosisInput {
  const Trace& a;
  const Trace& b;
  const Trace* local = nullptr;  // B teacher-forced on A (B's ops on A's inputs)
  Divergence first;              // the divergence to explain
  double tol = 1e-4;
  const ModelConfig* cfg = nullptr;
  const ModelView* model = nullptr;
  ModelOptions a_options;
};

Diagnosis diagnose(const DiagnosisInput& in);

// Names for the powers of routed_scaling_factor a fitted scale c can be: "" when c is none of rsf^{±1,±2}
// (within 2%), else e.g. "applied twice" / "missing". `power` receives the exponent.
std::string rsf_relation(double c, double rsf, int* power = nullptr);

// "0,1" for {0, 1}; with the hash / learned partition of cfg: "hash-routed layers 0,1 only", "all 4 layers".
std::string layer_phrase(const std::vector<int>& layers, const std::vector<int>& candidates, const ModelConfig* cfg);

}  // namespace plumb::toolkit
