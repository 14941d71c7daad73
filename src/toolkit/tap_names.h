// Tap-name anatomy shared by the toolkit: layer number, sublayer suffix, canonical execution rank, the op that
// produces a tap (for NaN-origin messages) and which taps the model lets a sink substitute (teacher forcing).
#pragma once
#include <string>
#include <vector>

namespace plumb::toolkit {

struct TapName {
  int layer = -1;      // i of "L<i>.", -1 for model-level taps (hc_head.out, logits)
  std::string suffix;  // the part after "L<i>." ("ffn.gate.weights"), or the whole name
};
TapName parse_tap(const std::string& name);

// Rank of a suffix inside one layer, in the order the model runs them (unknown suffixes sort after known ones).
int suffix_rank(const std::string& suffix);
// Sorts tap names into the model's execution order: layer by layer, then by suffix rank, model-level taps
// (hc_head.out, then logits) last. Used for golden fixtures, whose tap lists are alphabetical.
void sort_execution_order(std::vector<std::string>& names);

// The op whose output the tap is ("router score + top-k renormalization" for ffn.gate.weights).
std::string tap_op(const std::string& name);

// Taps whose value depends on an hc_post mixing of the same layer (the residual streams after attention or
// after the MoE): hc_ffn.* and L<i>.out, and the next layer's hc_attn.* (which read L<i>.out).
bool depends_on_hc_post(const std::string& name);

bool is_moe_tap(const std::string& name);  // L<i>.ffn.*

// The selection scores an index tap was chosen from (for telling near ties from real flips), in the order to
// look for them: ffn.gate.scores (score + bias), else ffn.gate.logits; attn.indexer.scores. Empty if none.
std::vector<std::string> selection_score_taps(const std::string& index_tap);

}  // namespace plumb::toolkit
