// The patch registry: every speed patch, numerics mode and built-in fault as a named, switchable object with
// the reference op it replaces, a description, a risk note and its tolerance.
#pragma once
#include <string>
#include <vector>

#include "model/options.h"

namespace plumb {

// Tolerance of a patch, as err <= tol * max(1, max|ref|) per tensor.
struct Tolerance {
  double fp32;   // the patch on the fp32 reference path (CPU), free running (errors accumulate over layers)
  double bf16;   // the patch on a bf16 backend (GPU)
  double local;  // teacher forced (verify-golden --mode forced): each op's own error only
};

struct Patch {
  std::string name;         // e.g. "moe.rsf_on_output"
  std::string replaces;     // the reference op it stands in for
  std::string description;  // one line
  std::string risk;         // what goes wrong if it is itself wrong
  Tolerance tol;
  bool fault = false;       // a deliberate bug: refused unless named explicitly
  void (*enable)(ModelOptions&);
  // A numerics mode changes what "the reference" computes: it is verified against goldens produced by the code
  // it reproduces (DeepSeek's official inference code), and against other goldens only reported (plumb kld).
  bool numerics_mode = false;
  // Set for a kernel of one backend ("cuda"): refused on the others, with a message naming it.
  std::string backend = "";
};

const std::vector<Patch>& patch_registry();
const Patch* find_patch(const std::string& name);

// A named list of patches, accepted wherever a patch name is (`plumb patches` lists them): `cuda.fast` is the CUDA
// backend's fast configuration, the one `plumb bench` figures and docs/cuda.md call FAST.
struct PatchPreset {
  std::string name;
  std::string description;
  std::vector<std::string> patches;
};
const std::vector<PatchPreset>& patch_presets();
const PatchPreset* find_preset(const std::string& name);
// verify-golden's stand-in for a numerics mode: each fixture's own (numerics.official, or numerics.official_initial
// for the release-day revision, where DeepSeek's official code computed the golden; numerics.reference otherwise),
// which verify-golden also takes when --patches names no numerics mode. Every other command refuses it by name.
inline constexpr const char* kFixtureNumerics = "numerics.fixture";
// "a,b,P" with each preset P replaced by its patches: names in order, each kept once where it first comes (a patch
// also in a preset, or in two presets, is one patch); a name written twice is an Error, as is an unknown one.
std::vector<std::string> expand_patch_list(const std::string& list);
// Throws Error for an empty item ("a,,b", ",a", "a,"); expand_patch_list checks it first.
void check_patch_list_items(const std::string& list);
// Throws Error naming the first of `names` that is a kernel of another backend than `backend` ("patch cuda.fp8_gemv
// is a CUDA kernel: <how> cuda"), for a command that checks its patch list before it loads anything (Model::load
// refuses such a patch too, from the options).
void check_patches_run_on(const std::vector<std::string>& names, const std::string& backend, const std::string& how);

struct PatchSet {
  std::vector<const Patch*> active;
  ModelOptions options;
  double tolerance_fp32() const;   // the loosest active tolerance, or the reference's 1e-4
  double tolerance_local() const;  // the same for teacher-forced comparisons
  bool numerics_official() const { return options.official; }
  std::string names() const;      // comma-separated, "" for the reference
  bool has_fault() const;
};

// Parses "a,b,c" (spaces ignored, "" = reference; presets expanded: expand_patch_list). Unknown names are an Error
// listing the known ones; a fault must be named exactly (no wildcard or preset ever enables one).
PatchSet parse_patches(const std::string& list);

// A run configuration as the toolkit (trace, diff, kld, selftest) names one: "[BACKEND:]PATCHES". No prefix is
// the CPU reference backend; "cuda:" the CUDA backend with no patch, "cuda:moe.rsf_on_output" with one. So
// `plumb diff --a '' --b cuda:` compares the GPU against the CPU reference op by op.
struct RunConfig {
  std::string backend = "cpu";
  PatchSet patches;
};
RunConfig parse_config(const std::string& spec);

}  // namespace plumb
