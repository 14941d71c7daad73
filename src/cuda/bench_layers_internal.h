// What the three files of `plumb bench --layers` share (CUDA builds only): bench_layers_checkpoint.cpp writes and
// reuses the synthetic checkpoint, bench_layers.cpp loads it and times decode and prefill, bench_layers_report.cpp
// prints the tables and writes the JSON and CSV. Not a public interface (src/cuda/bench_layers.h is).
#pragma once
#ifdef PLUMB_WITH_CUDA
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cuda/bench_layers.h"
#include "cuda/gpu_common.h"
#include "model/attention.h"
#include "model/model.h"

namespace plumb::cuda::bench_layers {

using Clock = std::chrono::steady_clock;
using ojson = nlohmann::ordered_json;

inline double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
void out(const std::string& s);  // stdout, flushed (progress lines of a long run show as they happen)
std::string fmt_num(double v, int prec = 1);  // "-" for NaN / Inf
inline ojson jnum(double v) { return std::isfinite(v) ? ojson(v) : ojson(nullptr); }

// ---- the synthetic checkpoint (bench_layers_checkpoint.cpp) ----

std::vector<AttnType> stack_types(int layers);  // layer_bench_types' kinds

// A folder removed on destruction when `remove` (the run's temporary folder without --keep).
struct WorkDir {
  std::filesystem::path path;
  bool remove = false;
  ~WorkDir();
};

struct PreparedCheckpoint {
  uint64_t bytes = 0;  // of the tensors' data
  bool reused = false;
  double generate_s = 0;
};
// The checkpoint's data bytes and tensor count at these options (nothing written).
std::pair<uint64_t, size_t> checkpoint_size(const LayerBenchOptions& o);
// Points wd at o.dir (refusing a folder that is not the bench's own) or at a new temporary folder, and makes it hold
// this run's exact checkpoint: reused when a run with the same dimensions and generator wrote it, written otherwise.
PreparedCheckpoint prepare_checkpoint(const LayerBenchOptions& o, WorkDir& wd);

// ---- the measured rows (bench_layers.cpp) and their report (bench_layers_report.cpp) ----

// --ab: one decode batch's pairs of steps, model A's and model B's (d = b - a per pair): the medians, the median
// difference, and a distribution-free 95 % interval for it (order statistics d(k) and d(n + 1 - k), k the largest
// rank with P(Binomial(n, 1/2) < k) <= 2.5 %; none below 6 pairs); and the mean difference, for a B whose steps
// differ by position (cuda.comp_deferred's projecting steps: one in four, which the median leaves out).
struct PairedStats {
  int pairs = 0;
  double a = NAN, b = NAN, diff = NAN, lo = NAN, hi = NAN, mean_diff = NAN;
};

struct DecodeRow {
  int batch = 0, steps = 0;
  std::vector<double> steps_us;  // every timed step, in order (positions pos_first, pos_first + B, ...)
  double us_step = NAN, us_step_min = NAN, us_step_mean = NAN, us_non_layer = NAN, us_layer = NAN, tok_s = NAN;
  double layer_bytes = NAN, gbps = NAN, pct = NAN, implied = NAN, experts_expected = NAN, experts_measured = NAN;
  double context_s = NAN;
  // A session checkpoint at the batch's last position (Model::mark / rollback: Session::checkpoint / restore and a
  // stopped prefill's cost): what it holds and the median time of each (5 rounds).
  double checkpoint_mb = NAN, mark_ms = NAN, rollback_ms = NAN;
  double us_step_skeleton = NAN, us_layer_skeleton = NAN;  // --skeleton: without the weight-streaming launches
  int64_t pos_first = 0, pos_last = 0;
  bool split_measured = false;
  std::vector<std::pair<std::string, double>> breakdown;  // per-op region: us per step over all layers
  std::vector<OpTimer::Span> timeline;                    // --timeline: one replayed step's regions
  PairedStats ab;                                          // --ab: us per step
  std::string ab_error;
  std::string note, error;
};
struct PrefillRow {
  int tokens = 0, chunks = 0;
  double seconds = NAN, tok_s = NAN;
  std::vector<double> chunk_s;
  std::string skipped, error;
};

// --sequences B: B sessions stepped together (Model::forward_batch) and one after another (as generation steps one).
struct SequencesRow {
  int sessions = 0, steps = 0;
  double us_step = NAN, us_alone = NAN, tok_s = NAN, tok_s_alone = NAN;  // median us of a step of all B sessions
  // the steps together with every row drawn where the logits are (Model::forward_batch_sample: on the device, only
  // the tokens downloaded), against us_step's every row's logits downloaded
  double us_sampled = NAN, tok_s_sampled = NAN;
  int replayed = 0;  // timed steps together that replayed their captured graph (cuda.graph)
  // Device memory after the timed steps (GPU only): the model's scratch, which its sessions share, and one session's
  // caches, in MB.
  double scratch_mb = NAN, cache_mb = NAN;
  std::vector<std::pair<std::string, double>> breakdown;  // one eager step together: us per op region, all layers
  std::string note, error;
};

// Everything a run measured, for the report.
struct LayerBenchResult {
  std::string device;
  std::vector<std::string> type_names;
  std::string patches, ab_patches;  // PatchSet::names(); ab_patches only with --ab
  bool ab = false;
  double copy_gbps = NAN, load_s = 0;
  PreparedCheckpoint checkpoint;
  std::string checkpoint_dir;
  bool checkpoint_removed = false;
  std::vector<DecodeRow> decode;
  std::vector<PrefillRow> prefill;
  std::vector<SequencesRow> sequences;
  ojson sanity = ojson::array();
  double total_s = 0;
};

void print_tables(const LayerBenchOptions& o, const LayerBenchResult& r);
// The JSON (o.json) and CSV (o.csv) files, where asked for; false (after a message on stderr) when one cannot be
// written.
bool write_json(const LayerBenchOptions& o, const LayerBenchResult& r);
bool write_csv(const LayerBenchOptions& o, const LayerBenchResult& r);

}  // namespace plumb::cuda::bench_layers
#endif  // PLUMB_WITH_CUDA
