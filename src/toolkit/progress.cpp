// A toolkit run's progress line (toolkit/progress.h).
#include "toolkit/progress.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace plumb::toolkit {

RunProgress::RunProgress(std::string label, std::vector<int64_t> step_tokens, int64_t n_layers, Clock::duration interval,
                         std::function<void(const std::string&)> print, std::function<Clock::time_point()> now)
    : label_(std::move(label)), steps_(std::move(step_tokens)), n_layers_(std::max<int64_t>(n_layers, 1)),
      interval_(interval), print_(std::move(print)), now_(std::move(now)), t0_(now_()), last_(t0_) {
  for (int64_t n : steps_) total_ += n;
}

void RunProgress::step(size_t si) {
  if (si > 0 && si - 1 < steps_.size()) done_ += steps_[si - 1];
  si_ = si, layer_ = -1;
  maybe_print();
}

void RunProgress::tap(const std::string& name) {
  if (name.size() < 3 || name[0] != 'L' || name[1] < '0' || name[1] > '9') return;
  layer_ = std::atoll(name.c_str() + 1);
  maybe_print();  // (a clock read per tap offered: a few dozen a layer)
}

void RunProgress::maybe_print() {
  const auto now = now_();
  if (now - last_ < interval_ || si_ >= steps_.size()) return;
  last_ = now;
  const int64_t n = steps_[si_];
  const double done = double(done_) + (layer_ >= 0 ? double(n) * double(layer_) / double(n_layers_) : 0.0);
  const double sec = std::max(std::chrono::duration<double>(now - t0_).count(), 1e-9);
  const std::string where = layer_ >= 0 ? fmt::format(", in layer {} of {}", layer_ + 1, n_layers_) : "";
  const std::string left = done > 0 ? fmt::format(", about {:.0f} s left", (double(total_) - done) * sec / done) : "";
  const std::string line = fmt::format("[{}] {:.0f} of {} tokens (step {} of {}: {} tokens{}), {:.1f} tokens/s{}", label_,
                                       done, total_, si_ + 1, steps_.size(), n, where, done / sec, left);
  if (print_) print_(line);
  else std::fprintf(stderr, "%s\n", line.c_str());
}

}  // namespace plumb::toolkit
