// Running a configuration over an input: a recording sink (with the tap filter) and teacher forcing.
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <set>

#include "patches/registry.h"
#include "toolkit/progress.h"
#include "toolkit/tap_names.h"
#include "toolkit/trace.h"

namespace plumb::toolkit {

namespace {

// Records what the filter keeps; with a forcing step, records everything (the forced values must reach every
// substitutable tap) and hands back the forcing run's value wherever the shapes agree.
class RecordingSink : public TapSink {
 public:
  RecordingSink(const TapFilter* filter, const StepTaps* force, std::set<std::string>* offered, RunProgress* progress)
      : filter_(filter), force_(force), offered_(offered), progress_(progress) {}
  bool wants(const std::string& name) const override {
    offered_->insert(name);
    progress_->tap(name);
    return force_ || !filter_ || filter_->keeps_tap(name);
  }
  void put(const std::string& name, const Tensor& t) override {
    if (rec.f32.emplace(name, t).second) rec.order.push_back(name);
  }
  void put_index(const std::string& name, const IndexTensor& t) override {
    if (rec.idx.emplace(name, t).second) rec.order.push_back(name);
  }
  bool substitute(const std::string& name, Tensor& t) override {
    if (!force_) return false;
    const Tensor* v = force_->f(name);
    PLUMB_CHECK(v, "teacher forcing: the forcing run has no tap {} (was it recorded with a filter?)", name);
    PLUMB_CHECK(v->shape == t.shape, "teacher forcing: tap {} has shape {} in the forcing run but {} here", name,
                shape_str(v->shape), shape_str(t.shape));
    t = *v;
    return true;
  }
  StepTaps rec;

 private:
  const TapFilter* filter_;
  const StepTaps* force_;
  std::set<std::string>* offered_;
  RunProgress* progress_;
};

template <typename T>
BasicTensor<T> keep_rows(const BasicTensor<T>& t, const std::vector<int64_t>& rows) {
  Shape s = t.shape;
  s[0] = int64_t(rows.size());
  BasicTensor<T> out(s);
  const int64_t w = t.dim(0) ? t.numel() / t.dim(0) : 0;
  for (size_t r = 0; r < rows.size(); ++r)
    std::copy(t.data.begin() + rows[r] * w, t.data.begin() + (rows[r] + 1) * w, out.data.begin() + int64_t(r) * w);
  return out;
}

// Keeps the rows of `rec` (now rec.positions.size() of them, one per position) whose position `keep` holds. Every
// tap's dim 0 is the step's token rows (the model's taps are all per token; the indexer's scores are [rows,
// entries]); one that is not is an Error rather than compared whole.
void keep_step_rows(StepTaps& rec, const std::function<bool(int64_t)>& keep) {
  const int64_t n = int64_t(rec.positions.size());
  std::vector<int64_t> rows, kept;
  for (int64_t r = 0; r < n; ++r)
    if (keep(rec.positions[size_t(r)])) rows.push_back(r), kept.push_back(rec.positions[size_t(r)]);
  if (int64_t(rows.size()) == n) return;
  auto slice = [&](const std::string& name, auto& t) {
    PLUMB_CHECK(t.dim(0) == n, "tap {} has {} rows where the step has {} token rows: it cannot be cut to positions", name,
                t.dim(0), n);
    t = keep_rows(t, rows);
  };
  for (auto& [name, t] : rec.f32) slice(name, t);
  for (auto& [name, t] : rec.idx) slice(name, t);
  rec.positions = std::move(kept);
}

}  // namespace

const Tensor* StepTaps::f(const std::string& name) const {
  auto it = f32.find(name);
  return it == f32.end() ? nullptr : &it->second;
}

const IndexTensor* StepTaps::i(const std::string& name) const {
  auto it = idx.find(name);
  return it == idx.end() ? nullptr : &it->second;
}

std::vector<std::string> Trace::tap_order() const {
  // The recorded execution order; a name only some steps have (an indexer top-k that starts once entries
  // exist) goes right after its predecessor in the step that has it.
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const auto& d : data)
    for (size_t i = 0; i < d.order.size(); ++i) {
      if (!seen.insert(d.order[i]).second) continue;
      auto at = i == 0 ? out.begin() : std::find(out.begin(), out.end(), d.order[i - 1]);
      out.insert(at == out.end() ? out.end() : i == 0 ? at : at + 1, d.order[i]);
    }
  return out;
}

std::unique_ptr<Model> load_model(const std::string& dir, const std::string& patches) {
  const RunConfig rc = parse_config(patches);
  return Model::load(dir, rc.patches.options, {}, rc.backend);
}

Trace run_trace(const Model& model, const RunInput& in, const std::string& patches, const TapFilter* filter,
                const Trace* force, const char* role) {
  Trace tr{in.model_dir, patches, in.source, filter ? filter->describe() : "", {}, {}, {}};
  if (force)
    PLUMB_CHECK(force->steps.size() == in.steps.size() && force->filter.empty(),
                "teacher forcing needs an unfiltered trace of all {} steps of {} (it has {} steps{})", in.steps.size(),
                in.source, force->steps.size(), force->filter.empty() ? "" : ", filtered");
  auto state = model.new_state();
  const std::string config = patches.empty() ? "reference" : patches;
  std::vector<int64_t> step_tokens;
  for (const auto& s : in.steps) step_tokens.push_back(int64_t(s.tokens.size()));
  RunProgress progress(role ? fmt::format("{}: {}", role, config) : config, std::move(step_tokens), model.config().n_layers);
  std::set<std::string> offered{"logits"};
  for (size_t si = 0; si < in.steps.size(); ++si) {
    progress.step(si);
    const GoldenStep& step = in.steps[si];
    PLUMB_CHECK(step.start_pos == state.pos, "{}: step {} starts at position {}, but the session is at {}", in.source,
                step.name, step.start_pos, state.pos);
    RecordingSink sink(filter, force ? &force->data[si] : nullptr, &offered, &progress);
    Tensor logits;
    try {
      logits = model.forward(state, step.tokens, &sink);
    } catch (const Error& e) {  // (a token id outside the vocabulary, ...): which input and step
      fail("{}: step {}: {}", in.source, step.name, e.what());
    }
    if (filter && !filter->keeps_step(step.name, si)) continue;
    StepTaps rec = std::move(sink.rec);
    rec.f32["logits"] = std::move(logits);
    rec.order.push_back("logits");
    const int64_t n = int64_t(step.tokens.size());
    if (force && filter) {  // forcing recorded everything: apply the tap filter now
      std::vector<std::string> kept;
      for (const auto& name : rec.order)
        if (filter->keeps_tap(name)) kept.push_back(name);
        else rec.f32.erase(name), rec.idx.erase(name);
      rec.order = std::move(kept);
    }
    for (int64_t r = 0; r < n; ++r) rec.positions.push_back(step.start_pos + r);
    if (filter) keep_step_rows(rec, [&](int64_t pos) { return filter->keeps_position(pos); });
    tr.steps.push_back(step);
    tr.data.push_back(std::move(rec));
  }
  tr.offered.assign(offered.begin(), offered.end());
  return tr;
}

void keep_positions(Trace& t, const IntRanges& positions) {
  if (positions.empty()) return;
  for (auto& d : t.data) keep_step_rows(d, [&](int64_t pos) { return positions.contains(pos); });
}

void check_positions_reach(const IntRanges& positions, const RunInput& in) {
  if (in.steps.empty()) return;
  const int64_t end = in.steps.back().start_pos + int64_t(in.steps.back().tokens.size());
  for (const auto& [a, b] : positions.ranges)
    PLUMB_CHECK(a < end, "--positions: position {} is beyond the {} positions of {} (0-{})", a, end, in.source, end - 1);
}

}  // namespace plumb::toolkit
