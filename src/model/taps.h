// Tap sink: receives named intermediate tensors (golden tap names, e.g. "L3.ffn.gate.weights") when enabled.
#pragma once
#include <string>

#include "core/tensor.h"

namespace plumb {

class TapSink {
 public:
  virtual ~TapSink() = default;
  virtual bool wants(const std::string& name) const = 0;
  virtual void put(const std::string& name, const Tensor& t) = 0;
  virtual void put_index(const std::string& name, const IndexTensor& t) = 0;
  // Teacher forcing: after `put`, a sink may replace the value the model continues with (same shape), so each
  // op downstream starts from another run's inputs. Only taps recorded through Tap::io are substitutable.
  virtual bool substitute(const std::string& name, Tensor& t) { return false; }
};

// Cheap when no sink is attached: names are only built when `sink` is non-null.
struct Tap {
  TapSink* sink = nullptr;
  std::string prefix;  // "L3." inside layer 3, "" at model level

  bool on(const char* name) const { return sink && sink->wants(prefix + name); }
  void operator()(const char* name, const Tensor& t) const {
    if (on(name)) sink->put(prefix + name, t);
  }
  // Records t and lets the sink substitute it (see TapSink::substitute).
  void io(const char* name, Tensor& t) const {
    if (!on(name)) return;
    const std::string full = prefix + name;
    sink->put(full, t);
    Tensor s = t;
    if (sink->substitute(full, s)) {
      PLUMB_CHECK(s.shape == t.shape, "substitute for tap {}: shape {} != {}", full, shape_str(s.shape), shape_str(t.shape));
      t = std::move(s);
    }
  }
  void index(const char* name, const IndexTensor& t) const {
    if (on(name)) sink->put_index(prefix + name, t);
  }
};

}  // namespace plumb
