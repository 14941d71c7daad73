// `plumb bench`: the CUDA decode kernels at DeepSeek-V4-Flash dimensions on synthetic weights (src/cuda/bench.cpp);
// with --layers N, the whole GPU forward pass on an N-layer V4-Flash stack (src/cuda/bench_layers.cpp).
// Without a usable GPU (or in a build without CUDA) it says why and exits non-zero.
#include "cli/commands.h"
#include "cli/input_options.h"
#include <algorithm>
#include <array>
#include <charconv>
#include <sstream>
#include <string_view>

#include "plumb/bench.h"
#include "plumb/check.h"

namespace plumb::cli {

namespace {

// The kernel bench's sections (the B.want names of src/cuda/bench_*.cpp), for --only's help, check and error.
constexpr std::array<std::string_view, 11> kSections = {"router", "moe",       "prefill", "fp8",    "fp8xs", "fp8prefill",
                                                        "bf16",   "attention", "indexer", "phases", "hc"};

std::string section_list() {
  std::string s;
  for (std::string_view n : kSections) s += std::string(s.empty() ? "" : ", ") + std::string(n);
  return s;
}

}  // namespace

void register_bench(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "Time the CUDA kernels at V4-Flash sizes against the measured bandwidth, or with --layers N the whole GPU forward pass");
  auto opt = std::make_shared<cuda::BenchOptions>();
  cmd->add_option("--iters", opt->iters, "timed runs (the median is reported): the kernel bench's of each kernel, --layers' decode steps of each batch (default 30)")->check(CLI::Range(1, 100000));
  cmd->add_option("--warmup", opt->warmup, "untimed runs first (the kernel bench: runs of each kernel, default 3; --layers: decode steps of each batch, default 2, at least 1: the first checks the logits)")->check(CLI::Range(0, 100000));
  cmd->add_option("--json", opt->json, "also write the results as JSON to this file")->check(output_file());
  cmd->add_option("--csv", opt->csv, "also write the result rows as CSV to this file")->check(output_file());
  cmd->add_flag("!--no-flush", opt->flush_l2, "keep L2 warm between timed runs (default: flush, as decode reads weights cold)");
  cmd->add_option("--only", opt->only, "kernel bench: only these sections, comma-separated (" + section_list() + "; prefill includes fp8prefill)")
      ->check([](const std::string& v) {
        std::istringstream in(v);
        for (std::string s; std::getline(in, s, ',');)
          if (std::find(kSections.begin(), kSections.end(), s) == kSections.end())
            return "unknown bench section '" + s + "' (known: " + section_list() + "; comma-separated, no spaces)";
        return std::string();
      });
  cmd->add_flag("--profile", opt->profile, "launch each main kernel once without timing (to run under ncu)");
  auto lo = std::make_shared<cuda::LayerBenchOptions>();
  auto layers = std::make_shared<int>(0);
  auto batches = std::make_shared<std::string>(), prefill = std::make_shared<std::string>();
  cmd->add_option("--layers", *layers,
                  "time the whole GPU forward pass on a stack of N layers with V4-Flash dimensions instead (synthetic "
                  "checkpoint in the official formats; decode per batch, per-layer time, implied whole-model tokens/s, "
                  "prefill)")
      ->check(CLI::Range(1, 61));
  auto model = std::make_shared<std::string>("flash");
  cmd->add_option("--model", *model, "--layers: the dimensions: flash (V4-Flash, 43 layers) or pro (V4-Pro, 61 layers)")
      ->check(CLI::IsMember({"flash", "pro"}))
      ->capture_default_str();
  cmd->add_option("--patches", lo->patches, "--layers: patches of the GPU forward pass (cuda.fast: the fast configuration; none: the fp32 twin)");
  cmd->add_option("--backend", lo->backend,
                  "--layers: cuda, or cpu: the same checkpoint and steps on the reference backend, to time it at real "
                  "dimensions (no bandwidth figures; slow: V4-Flash on 2 cores ~0.15 s per layer and ~0.16 s for the embedding and LM head per token, so use e.g. --batches 1 --prefill 0 --context 8)")
      ->check(CLI::IsMember({"cuda", "cpu"}))
      ->capture_default_str();
  auto* ab = cmd->add_option("--ab", lo->ab_patches,
                              "--layers: also load the checkpoint with these patches (model B; '' for none) and time each decode "
                              "batch's steps of both in alternating pairs in this process: the median difference with a 95 % interval "
                              "(separate runs differ by up to 10 %)");
  cmd->add_option("--dir", lo->dir, "--layers: write (or reuse) the synthetic checkpoint in this folder (default: a temp dir)");
  cmd->add_flag("--keep", lo->keep, "--layers: keep the temporary checkpoint folder");
  cmd->add_flag("--timeline", lo->timeline,
                "--layers: also print, per decode batch, when each op region starts and ends in one step as the forward "
                "runs it (CUDA graph and side streams kept; events in the graph)");
  cmd->add_flag("--skeleton", lo->skeleton,
                "--layers (CUDA): also time each decode batch with the weight-streaming launches skipped (the GEMVs and one-token "
                "linears; outputs left stale): the chain of latency-bound work alone, against the time of the layer's weight bytes");
  cmd->add_flag("--cold-l2", lo->cold_l2,
                "--layers (CUDA): overwrite twice the L2's size before each timed decode step (not timed), so data a step "
                "reuses from the previous one comes from DRAM, as between one layer's steps in a full-depth model");
  cmd->add_option("--batches", *batches, "--layers: decode batches, comma-separated (default 1,8,32,128)");
  cmd->add_option("--prefill", *prefill, "--layers: prefill lengths, comma-separated (default 1024,8192; 0: none)");
  auto sequences = std::make_shared<std::string>();
  cmd->add_option("--sequences", *sequences,
                  "--layers: also time decode steps of B sessions together (plumb::forward_batch: B sequences, one token each; and "
                  "plumb::forward_batch_sample: every row sampled where its logits are), against the same sessions stepped one after "
                  "another, and the device memory they take (the model's shared scratch, a session's caches); comma-separated B "
                  "(default: none)");
  cmd->add_option("--context", lo->context,
                  "--layers: tokens prefilled on each decode batch's session before its steps are timed (default 256; "
                  "the indexer's work grows with it: 1 entry per 4 tokens on CSA layers)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--context-alt", lo->context_alt,
                  "--layers --sequences: every other session prefilled with this many tokens instead of --context, so a step holds "
                  "sessions on both sides of a limit (the CSA indexer's at 2048 tokens on V4-Flash; default: none)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->callback([cmd, opt, lo, layers, batches, prefill, model, ab, sequences] {
    // The two benches take different options; one given to the other is refused by name rather than ignored.
    auto given = [&](const char* name) { return cmd->get_option(name)->count() > 0; };
    if (*layers == 0)
      for (const char* name : {"--ab", "--timeline", "--skeleton", "--cold-l2", "--batches", "--sequences", "--prefill", "--context", "--context-alt",
                               "--patches", "--backend", "--dir", "--keep", "--model"})
        if (given(name)) fail("{} applies to the layer bench: it needs --layers N", name);
    if (*layers > 0)
      for (const char* name : {"--only", "--profile", "--no-flush"})
        if (given(name)) fail("{} applies to the kernel bench, which runs without --layers", name);
    if (lo->skeleton && lo->backend != "cuda") fail("--skeleton skips the CUDA forward's weight launches: it needs --backend cuda");
    if (lo->cold_l2 && lo->backend != "cuda") fail("--cold-l2 flushes the GPU's L2 between the layer bench's steps: it needs --backend cuda");
    lo->ab = ab->count() > 0;
    if (*layers == 0) return set_exit_code(cuda::run_bench(*opt));
    if (*model == "pro") lo->dims = cuda::v4_pro_dims();
    if (*layers > lo->dims.model_layers) fail("--layers {}: {} has {} layers", *layers, lo->dims.model, lo->dims.model_layers);
    lo->layers = *layers;
    lo->iters = opt->iters;
    if (given("--warmup")) {  // (the layer bench's own default is 2 steps, the kernel bench's 3 runs)
      // The layer bench's first warm-up step checks the logits (its "sanity" line) and times the step for its budget;
      // under --skeleton the warm-up also keeps the graph's capture out of the timed steps.
      if (opt->warmup < 1) fail("--warmup {}: the layer bench takes at least 1 warm-up step (its first checks the logits)", opt->warmup);
      lo->warmup = opt->warmup;
    }
    lo->json = opt->json;
    lo->csv = opt->csv;
    // "1,8,32": each item a non-negative integer, spaces around it allowed. An empty item ("1,,8", "8,") or a sign is
    // refused by name, as in written token ids, rather than skipped or read leniently.
    auto ints = [](const std::string& s, const char* what) {
      std::vector<int> v;
      std::string item;
      std::istringstream in(s + ",");  // the extra comma ends the last item, so a trailing "8," leaves an empty one
      while (std::getline(in, item, ',')) {
        const size_t a = item.find_first_not_of(' '), b = item.find_last_not_of(' ') + 1;
        if (a == std::string::npos) fail("--{} '{}': an empty item (sizes are separated by single commas)", what, s);
        unsigned n = 0;
        const auto [stop, ec] = std::from_chars(item.data() + a, item.data() + b, n);
        if (ec != std::errc() || stop != item.data() + b || n > (1u << 24))
          fail("--{} '{}': '{}' is not a size (a non-negative integer up to 2^24)", what, s, item.substr(a, b - a));
        v.push_back(int(n));
      }
      return v;
    };
    if (given("--batches")) {
      lo->decode_batches = ints(*batches, "batches");
      for (int b : lo->decode_batches)
        if (b < 1) fail("--batches '{}': a decode batch has at least one sequence", *batches);
    }
    if (given("--sequences")) {
      lo->sequences = ints(*sequences, "sequences");
      for (int b : lo->sequences)
        if (b < 1) fail("--sequences '{}': a step has at least one sequence", *sequences);
    }
    if (given("--context-alt") && !given("--sequences")) fail("--context-alt prefills every other session of --sequences: it needs --sequences");
    if (given("--prefill")) {
      lo->prefill.clear();
      for (int v : ints(*prefill, "prefill"))
        if (v > 0) lo->prefill.push_back(v);
    }
    set_exit_code(cuda::run_layer_bench(*lo));
  });
}

}  // namespace plumb::cli
