// plumb::Sampler (plumb/text.h): penalties, temperature, top-k, top-p, min-p, then one seeded draw. The order is
// transformers' logits-processor order (repetition penalty, temperature, top-k, top-p, min-p); min-p compares
// against the top token, so it commutes with the renormalizations before it.
#include <algorithm>
#include <cmath>
#include <random>
#include <unordered_map>

#include "core/error.h"
#include "plumb/text.h"

namespace plumb {

struct Sampler::Impl {
  SamplingParams p;
  int32_t vocab = 0;
  std::mt19937_64 rng;
  bool pending = false;  // `next` holds a draw peeked but not yet used
  double next = 0;
  // 53 random bits -> [0, 1): the same value on every platform (std::uniform_real_distribution is not).
  double peek() {
    if (!pending) next = double(rng() >> 11) * 0x1.0p-53, pending = true;
    return next;
  }
  double draw() {
    const double u = peek();
    pending = false;
    return u;
  }
};

namespace {

// Counts of each token in the penalty window (the last penalty_last_n tokens of the history).
std::unordered_map<int32_t, int> window_counts(std::span<const int32_t> history, int last_n) {
  std::unordered_map<int32_t, int> counts;
  if (last_n == 0) return counts;
  const size_t n = last_n < 0 ? history.size() : std::min(history.size(), size_t(last_n));
  for (size_t i = history.size() - n; i < history.size(); ++i) ++counts[history[i]];
  return counts;
}

std::vector<float> penalized(const SamplingParams& p, std::span<const float> logits, std::span<const int32_t> history) {
  std::vector<float> l(logits.begin(), logits.end());
  if (p.repeat_penalty == 1.0f && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f) return l;
  for (const auto& [id, count] : window_counts(history, p.penalty_last_n)) {
    if (id < 0 || size_t(id) >= l.size()) continue;
    float& x = l[size_t(id)];
    if (p.repeat_penalty != 1.0f) x = x > 0 ? x / p.repeat_penalty : x * p.repeat_penalty;
    x -= p.presence_penalty + p.frequency_penalty * float(count);
  }
  return l;
}

int32_t argmax(const std::vector<float>& l) {
  // Lowest id among equal maxima, so greedy decoding does not depend on the library's max_element.
  int32_t best = 0;
  for (int32_t i = 1; i < int32_t(l.size()); ++i)
    if (l[size_t(i)] > l[size_t(best)]) best = i;
  return best;
}

float finite_top(std::span<const float> l) {
  float top = -INFINITY;
  for (float x : l) top = x > top ? x : top;  // (NaN compares false: skipped)
  return top;
}

// A row with no finite logit (all NaN or -inf, or a +inf) has no distribution: softmax(x - max) is NaN throughout.
// It is an error that says what the row held and what made it so, not a token (it used to be id 0, which hid a broken
// model behind plausible-looking output): the model's logits themselves, or penalties that overflowed a finite row
// (a repeat penalty of 1e-40 divides a logit past the float range).
void check_finite_top(const SamplingParams& p, std::span<const float> raw, const std::vector<float>& l) {
  if (std::isfinite(finite_top(l))) return;
  size_t nan = 0, neg = 0, pos = 0;
  for (float x : l) nan += std::isnan(x), neg += x == -INFINITY, pos += x == INFINITY;
  const std::string held = fmt::format("{} of {} logits NaN, {} -inf, {} +inf after the penalties", nan, l.size(), neg, pos);
  if (std::isfinite(finite_top(raw)))
    fail("sampler: no finite logit to sample from ({}): the penalties made the model's finite logits so (repeat_penalty "
         "(--repeat-penalty) {}, presence_penalty {}, frequency_penalty {})", held, p.repeat_penalty, p.presence_penalty,
         p.frequency_penalty);
  fail("sampler: no finite logit to sample from ({}): the model's output is broken (plumb diff names the op where it "
       "first goes wrong)", held);
}

}  // namespace

void check_sampling(const SamplingParams& p) {
  auto require = [](bool ok, const char* field, const char* flag, std::string rule) {
    if (!ok) throw SamplingError(field, flag, std::move(rule));
  };
  require(std::isfinite(p.temperature) && p.temperature >= 0.0f, "temperature", "--temperature",
          fmt::format("must be a number >= 0 (0 = greedy), got {}", p.temperature));
  require(p.top_k >= 0, "top_k", "--top-k", fmt::format("must be >= 0 (0 = off), got {}", p.top_k));
  require(p.top_p > 0.0f && p.top_p <= 1.0f, "top_p", "--top-p", fmt::format("must be in (0, 1], got {}", p.top_p));
  require(p.min_p >= 0.0f && p.min_p <= 1.0f, "min_p", "--min-p", fmt::format("must be in [0, 1], got {}", p.min_p));
  require(std::isfinite(p.repeat_penalty) && p.repeat_penalty > 0.0f, "repeat_penalty", "--repeat-penalty",
          fmt::format("must be a positive number (1 = off), got {}", p.repeat_penalty));
  // (a NaN or infinite penalty would turn every recent token's logit into NaN or -inf: the draw would be undefined)
  require(std::isfinite(p.presence_penalty), "presence_penalty", "--presence-penalty",
          fmt::format("must be a finite number (0 = off), got {}", p.presence_penalty));
  require(std::isfinite(p.frequency_penalty), "frequency_penalty", "--frequency-penalty",
          fmt::format("must be a finite number (0 = off), got {}", p.frequency_penalty));
  require(p.penalty_last_n >= -1, "penalty_last_n", "--repeat-last-n",
          fmt::format("must be >= -1 (-1 = whole history), got {}", p.penalty_last_n));
}

Sampler::Sampler(const SamplingParams& p, int32_t vocab) : impl_(std::make_unique<Impl>()) {
  PLUMB_CHECK(vocab > 0, "sampler: empty vocabulary");
  check_sampling(p);
  impl_->p = p;
  impl_->vocab = vocab;
  impl_->rng.seed(p.seed);
}
Sampler::~Sampler() = default;
Sampler::Sampler(Sampler&&) noexcept = default;
int32_t Sampler::vocab() const { return impl_->vocab; }

std::vector<std::pair<int32_t, float>> Sampler::distribution(std::span<const float> logits,
                                                             std::span<const int32_t> history) const {
  const SamplingParams& p = impl_->p;
  PLUMB_CHECK(int64_t(logits.size()) == impl_->vocab, "sampler: {} logits for a vocabulary of {}", logits.size(),
              impl_->vocab);
  std::vector<float> l = penalized(p, logits, history);
  check_finite_top(p, logits, l);
  // A NaN logit counts as -inf (probability 0; greedy never picks one), as the GPU sampler reads it
  // (src/cuda/fwd_sample.cu): the sort below needs ordered values, which a NaN is not.
  for (float& x : l)
    if (std::isnan(x)) x = -INFINITY;
  if (p.temperature <= 0.0f || p.top_k == 1) return {{argmax(l), 1.0f}};

  // Candidates in decreasing logit order (ties by id, so the order never depends on the sort's stability).
  std::vector<int32_t> ids(l.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
  auto by_logit = [&](int32_t a, int32_t b) { return l[size_t(a)] > l[size_t(b)] || (l[size_t(a)] == l[size_t(b)] && a < b); };
  size_t n = ids.size();
  if (p.top_k > 0 && size_t(p.top_k) < n) {
    n = size_t(p.top_k);
    std::partial_sort(ids.begin(), ids.begin() + ptrdiff_t(n), ids.end(), by_logit);
    ids.resize(n);
  } else {
    std::sort(ids.begin(), ids.end(), by_logit);
  }
  // Softmax of logit / T in double, from the largest logit (no overflow).
  std::vector<double> prob(n);
  const double top = double(l[size_t(ids[0])]) / p.temperature;
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += prob[i] = std::exp(double(l[size_t(ids[i])]) / p.temperature - top);
  for (auto& x : prob) x /= sum;
  // top-p: the smallest prefix whose probability reaches top_p.
  if (p.top_p < 1.0f) {
    double cum = 0;
    size_t keep = 0;
    while (keep < n) {
      cum += prob[keep++];
      if (cum >= double(p.top_p)) break;
    }
    n = keep;
  }
  // min-p: relative to the most likely token (prob[0]); renormalizing first would not change the ratio.
  if (p.min_p > 0.0f) {
    size_t keep = 1;
    while (keep < n && prob[keep] >= double(p.min_p) * prob[0]) ++keep;
    n = keep;
  }
  sum = 0;
  for (size_t i = 0; i < n; ++i) sum += prob[i];
  std::vector<std::pair<int32_t, float>> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = {ids[i], float(prob[i] / sum)};
  return out;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  const auto dist = distribution(logits, history);
  if (dist.size() == 1) return dist[0].first;
  const double u = impl_->draw();
  double cum = 0;
  for (const auto& [id, pr] : dist) {
    cum += pr;
    if (u < cum) return id;
  }
  return dist.back().first;
}

const SamplingParams& Sampler::params() const { return impl_->p; }

std::vector<std::pair<int32_t, int>> Sampler::penalty_window(std::span<const int32_t> history) const {
  const SamplingParams& p = impl_->p;
  std::vector<std::pair<int32_t, int>> out;
  if (p.repeat_penalty == 1.0f && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f) return out;
  for (const auto& [id, count] : window_counts(history, p.penalty_last_n)) out.push_back({id, count});
  std::sort(out.begin(), out.end());
  return out;
}

double Sampler::peek_draw() { return impl_->peek(); }
void Sampler::commit_draw() { impl_->pending = false; }

}  // namespace plumb
