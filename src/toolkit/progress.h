// The progress line of a toolkit run (trace, diff, kld, bisect, selftest): how far the steps of an input are, with a
// rate and an estimate, printed at most every `interval` (5 s) at a step's start and at the taps the forward offers.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace plumb::toolkit {

class RunProgress {
 public:
  using Clock = std::chrono::steady_clock;
  // `step_tokens`: the tokens of each step; `print` gets each line without its newline (empty: stderr); `now` is the
  // clock (a test's fake one).
  RunProgress(std::string label, std::vector<int64_t> step_tokens, int64_t n_layers,
              Clock::duration interval = std::chrono::seconds(5), std::function<void(const std::string&)> print = {},
              std::function<Clock::time_point()> now = Clock::now);
  // Step `si` begins (the steps before it are done).
  void step(size_t si);
  // A tap name the forward offers: "L<k>." names the layer it is in; the step's tokens count as done by the share of
  // the layers before it (layers are taken as equal in cost).
  void tap(const std::string& name);

 private:
  void maybe_print();
  std::string label_;
  std::vector<int64_t> steps_;
  int64_t n_layers_, total_ = 0, done_ = 0, layer_ = -1;
  size_t si_ = 0;
  Clock::duration interval_;
  std::function<void(const std::string&)> print_;
  std::function<Clock::time_point()> now_;
  Clock::time_point t0_, last_;
};

}  // namespace plumb::toolkit
