// Per-session cache state of every layer: sliding-window KV, compressor buffers/overlap, compressed entries.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

namespace plumb {

// One compressor (main CSA/HCA branch, or the indexer's key branch).
struct CompressorState {
  // Rows projected but not yet forming a full window: raw kv and gate (without ape), [pending, width].
  std::vector<float> pend_kv, pend_gate;
  int64_t pending = 0;
  // CSA only: the first-half series (kv, gate + ape) of the last full window, [rate, dim]; window w mixes
  // these with its own second-half series.
  std::vector<float> prev_kv, prev_gate;
  bool has_prev = false;
  // Emitted entries, normed and rotated at position w * rate: [n_entries, dim].
  std::vector<float> entries;
  int64_t n_entries = 0;
};

struct LayerState {
  // The last (window - 1) rotated KV rows and their positions: with the current token they make the window.
  std::vector<float> win_kv;
  std::vector<int64_t> win_pos;
  CompressorState comp, index_comp;
};

// A GPU backend's caches (src/cuda/gpu_state.h); opaque here so that the reference needs no CUDA.
struct DeviceSessionState;

struct SessionState {
  std::vector<LayerState> layers;          // the CPU reference's caches
  std::shared_ptr<DeviceSessionState> dev;  // the CUDA backend's caches (set instead of `layers`)
  int64_t pos = 0;  // tokens consumed so far = position of the next token
};

// A session's state before a call, enough to put it back (Model::mark / Model::rollback: a stopped prefill leaves
// the session as it was). What later positions overwrite is copied (the window's keys, the compressors' pending
// rows and CSA's previous series); the compressed entries, which only grow, are kept by their count. So a mark
// costs a few windows of rows per layer, whatever the context.
struct StateMark {
  int64_t pos = 0;
  std::vector<LayerState> layers;  // the CPU reference's, without entries (CompressorState::n_entries: how many to keep)
  std::shared_ptr<void> dev;       // the CUDA backend's (DeviceForward::mark), opaque here
  int64_t bytes = 0;               // what it holds (plumb bench --layers reports it)
};

}  // namespace plumb
