// Fuzz harness: the CPU sampler with any parameters, logits (NaN, infinities and extremes included) and history (ids
// outside the vocabulary included). Sampler's constructor throws plumb::Error for invalid parameters; distribution()
// for a row with no finite logit after the penalties: always when the row itself has none (penalties cannot make it
// finite: +-inf and NaN stay so), naming the model then and the penalties otherwise, and never for logits of a model's
// range (|l| <= 1e4); otherwise
// the distribution is non-empty with distinct ids inside the vocabulary, and with logits of a model's range its
// probabilities are finite, in decreasing order and sum to 1; sample() returns one of its ids, the same for the same seed.
// Crashes and sanitizer reports are bugs (a NaN logit must not reach std::sort's comparator as an unordered value).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz_util.h"
#include "plumb/text.h"

namespace {

float any_float(plumb_fuzz::Reader& in) {
  static const float kSpecial[] = {std::numeric_limits<float>::quiet_NaN(), INFINITY, -INFINITY, 0.0f, -0.0f,
                                   std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                                   std::numeric_limits<float>::denorm_min(), 1.0f, -1.0f, 30.0f, -30.0f};
  const uint8_t k = in.byte();
  if (k < 2 * std::size(kSpecial)) return kSpecial[k % std::size(kSpecial)];
  if (k < 128) return float(int(in.byte()) - 128) / 8.0f;  // a small grid: ties are common
  uint32_t bits = 0;
  for (int i = 0; i < 4; ++i) bits = bits << 8 | in.byte();
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  plumb_fuzz::Reader in(data, size);
  const int32_t vocab = 1 + in.byte() % 48;
  plumb::SamplingParams p;
  p.temperature = float(int(in.byte()) - 16) / 64.0f;
  p.top_k = int(in.byte() % 64) - 1;
  p.top_p = float(in.byte()) / 200.0f;
  p.min_p = float(in.byte()) / 220.0f;
  p.repeat_penalty = float(in.byte()) / 64.0f;
  p.presence_penalty = float(int(in.byte()) - 128) / 32.0f;
  p.frequency_penalty = float(int(in.byte()) - 128) / 32.0f;
  p.penalty_last_n = int(in.byte() % 70) - 2;
  p.seed = in.byte();
  std::vector<float> logits(static_cast<size_t>(vocab));
  bool finite = true;
  for (auto& l : logits) l = any_float(in), finite = finite && std::fabs(l) <= 1e4f;  // (false for NaN)
  std::vector<int32_t> history;
  while (!in.empty()) history.push_back(int32_t(in.byte()) - 8);
  std::optional<plumb::Sampler> a, b;
  try {
    a.emplace(p, vocab), b.emplace(p, vocab);
  } catch (const plumb::Error&) {
    return 0;  // parameters out of range
  }
  float top = -INFINITY;
  for (float l : logits) top = l > top ? l : top;  // the largest non-NaN logit
  const bool raw_finite = std::isfinite(top);
  std::vector<std::pair<int32_t, float>> dist;
  try {
    dist = a->distribution(logits, history);
  } catch (const plumb::Error& e) {
    PLUMB_FUZZ_CHECK(!finite);  // (the penalties keep a model's range finite: at most 1e4 * 64 + 4 * 70)
    const std::string m = e.what();
    PLUMB_FUZZ_CHECK(m.find(raw_finite ? "the penalties made" : "the model's output is broken") != std::string::npos);
    return 0;
  }
  PLUMB_FUZZ_CHECK(raw_finite);  // a row without a finite logit must be refused
  {
    PLUMB_FUZZ_CHECK(!dist.empty());
    std::set<int32_t> ids;
    double sum = 0;
    for (size_t i = 0; i < dist.size(); ++i) {
      const auto [id, pr] = dist[i];
      PLUMB_FUZZ_CHECK(id >= 0 && id < vocab && ids.insert(id).second);
      if (finite) PLUMB_FUZZ_CHECK(std::isfinite(pr) && pr >= 0 && (i == 0 || pr <= dist[i - 1].second));
      sum += pr;
    }
    if (finite) PLUMB_FUZZ_CHECK(std::fabs(sum - 1.0) < 1e-4);
    const int32_t s = a->sample(logits, history);
    PLUMB_FUZZ_CHECK(ids.count(s) == 1);
    PLUMB_FUZZ_CHECK(b->sample(logits, history) == s);
  }
  return 0;
}
