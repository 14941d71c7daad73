// Entry points of plumb's tools (verification and, later, the precision toolkit), used by the CLI.
#pragma once
#include <string>

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

// Runs the fixture's steps on one session and compares logits and taps. Prints the per-step tables and a
// final one-line verdict. Returns 0 when everything passes, 1 when something fails.
int verify_golden(const VerifyGoldenOptions& opt);

}  // namespace plumb::tools
