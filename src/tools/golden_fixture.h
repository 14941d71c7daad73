// Reading golden fixtures (format dsv4-golden/1, see shared/golden/FORMAT.md) and comparing tensors against them.
#pragma once
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/safetensors.h"
#include "model/taps.h"

namespace plumb {

struct GoldenStep {
  std::string name, kind;  // kind: "prefill" | "decode"
  int64_t start_pos = 0;
  std::vector<int32_t> tokens;
};

struct GoldenFixture {
  std::string dir, reference;
  std::vector<GoldenStep> steps;
  std::vector<std::string> taps;
  std::unique_ptr<SafetensorsFile> data;

  // Throws Error naming the file and field at fault.
  static GoldenFixture load(const std::string& dir);
  const TensorView* find(const std::string& step, const std::string& tap) const { return data->find(step + "." + tap); }
};

// Records the taps it is asked for (all of them if `wanted` is empty).
class TapRecorder : public TapSink {
 public:
  explicit TapRecorder(std::set<std::string> wanted = {}) : wanted_(std::move(wanted)) {}
  bool wants(const std::string& name) const override { return wanted_.empty() || wanted_.count(name); }
  void put(const std::string& name, const Tensor& t) override { f32[name] = t; order.push_back(name); }
  void put_index(const std::string& name, const IndexTensor& t) override { idx[name] = t; order.push_back(name); }

  std::map<std::string, Tensor> f32;
  std::map<std::string, IndexTensor> idx;
  std::vector<std::string> order;  // execution order

 private:
  std::set<std::string> wanted_;
};

// Teacher forcing against a fixture step: records like TapRecorder, and substitutes the fixture's value for
// every substitutable tap it has, so each sublayer starts from the reference's inputs (local error only).
class GoldenForcer : public TapRecorder {
 public:
  GoldenForcer(const GoldenFixture& fx, std::string step) : fx_(fx), step_(std::move(step)) {}
  bool substitute(const std::string& name, Tensor& t) override;

 private:
  const GoldenFixture& fx_;
  std::string step_;
};

struct FloatDiff {
  double max_abs = 0, ref_max = 0;  // max |a - b| and max |ref|
  int64_t at = -1;                  // flat index of the max error
  int64_t nonfinite = 0;            // positions where exactly one side is NaN/Inf, or they disagree
  double rel() const { return max_abs / std::max(1.0, ref_max); }
};
FloatDiff diff_f32(const Tensor& got, const Tensor& ref);

}  // namespace plumb
