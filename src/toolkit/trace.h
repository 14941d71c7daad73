// A trace: the taps and logits of one configuration over the steps of one input, in execution order, and the
// input itself (fixture steps, a token file or a tokenized text).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/model.h"
#include "toolkit/tap_filter.h"
#include "tools/golden_fixture.h"

namespace plumb::toolkit {

// What to run: a model folder and the steps (prefill chunks / decode tokens) of one session.
struct RunInput {
  std::string model_dir;
  std::string source;  // "fixture DIR", "tokens FILE", "text FILE"
  std::vector<GoldenStep> steps;
};
// A golden fixture's steps; the fixture folder is also the model.
RunInput input_from_fixture(const std::string& dir);
// A token file: whitespace-separated ids, one step per non-empty line ('#' starts a comment); a one-token line
// after the first step is a decode step, anything else a prefill chunk.
RunInput input_from_tokens(const std::string& model_dir, const std::string& file);
// A text file tokenized as `plumb run` tokenizes a prompt (plumb::encode_prompt: BOS as transformers adds it) with
// `tokenizer` (a tokenizer.json, or a folder holding one; "": model_dir's); chunk > 0 splits it into prefill chunks
// of that many tokens.
RunInput input_from_text(const std::string& model_dir, const std::string& text_file, const std::string& tokenizer,
                         int64_t chunk);

// One step's recorded tensors. `positions` are the absolute positions of the rows kept (dim 0 of every tap).
struct StepTaps {
  std::map<std::string, Tensor> f32;         // float taps and "logits"
  std::map<std::string, IndexTensor> idx;    // index taps (ffn.gate.indices, attn.indexer.topk)
  std::vector<std::string> order;            // execution order; "logits" last
  std::vector<int64_t> positions;

  const Tensor* f(const std::string& name) const;
  const IndexTensor* i(const std::string& name) const;
  bool has(const std::string& name) const { return f(name) || i(name); }
};

struct Trace {
  std::string model_dir, patches, source, filter;
  std::vector<GoldenStep> steps;  // the steps kept, parallel to `data`
  std::vector<StepTaps> data;
  // Every tap name the model offered in the run, kept by the filter or not, sorted (not written to trace files:
  // what checks a filter against the run uses).
  std::vector<std::string> offered;

  // Every tap name over all steps, in execution order (a step's order, then names only later steps have).
  std::vector<std::string> tap_order() const;
};

// Loads `dir` with the options of `patches` (parse_patches: unknown names are an Error listing known ones).
std::unique_ptr<Model> load_model(const std::string& dir, const std::string& patches);

// Runs every step of `in` on one session. `filter` (may be null) selects what is kept; `force` (may be null,
// an unfiltered trace of the same input) turns on teacher forcing: every substitutable tap (Tap::io) is
// recorded as this configuration computes it, then replaced by force's value, so each op starts from the
// forcing run's inputs and what is recorded is that op's own (local) error. `role` ("A", "B", "B teacher forced";
// may be null) heads the progress line's label, so the two sides of a comparison can be told apart there.
Trace run_trace(const Model& model, const RunInput& in, const std::string& patches, const TapFilter* filter = nullptr,
                const Trace* force = nullptr, const char* role = nullptr);

// Keeps only the rows of `positions` (absolute token positions; empty: every row) in every step of `t`, as a
// `--positions` filter would have kept them in the run: what `plumb diff --positions` compares. Steps stay, with no
// rows where none of theirs is kept.
void keep_positions(Trace& t, const IntRanges& positions);
// Throws Error naming `in` when a --positions range starts past the input's last position.
void check_positions_reach(const IntRanges& positions, const RunInput& in);

// Trace files: OUT.safetensors holds "<step>.<tap>" (F32 / I64) and "<step>.logits"; OUT.json is the index
// (format plumb-trace/1: model, patches, source, filter, steps with tokens and kept positions, taps in
// execution order). index_path_for("x.safetensors") == "x.json".
std::string index_path_for(const std::string& safetensors_path);
void write_trace(const Trace& t, const std::string& safetensors_path);
// Reads a trace written by write_trace (path of the .safetensors or the .json), or a golden fixture folder
// (golden.json + golden.safetensors; its alphabetical tap list is put into execution order).
Trace read_trace(const std::string& path);

}  // namespace plumb::toolkit
