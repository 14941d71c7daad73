// The allowed-token bitset of Session::forward_sample_masked (bit id % 32 of word id / 32: token id may be drawn)
// and its one host application to a logits row. The GPU's is fwd_mask_logits (src/cuda/sample.h).
#pragma once
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <span>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "plumb/text.h"

namespace plumb::gen {

inline size_t token_bits_words(int64_t vocab) { return size_t((vocab + 31) / 32); }
inline bool token_bit(std::span<const uint32_t> bits, size_t id) { return (bits[id / 32] >> (id % 32)) & 1u; }
inline void set_token_bit(std::span<uint32_t> bits, size_t id) { bits[id / 32] |= 1u << (id % 32); }
inline void clear_token_bit(std::span<uint32_t> bits, size_t id) { bits[id / 32] &= ~(1u << (id % 32)); }

// Every logit whose bit is clear becomes -inf.
inline void mask_logits(std::span<float> logits, std::span<const uint32_t> bits) {
  PLUMB_CHECK(bits.size() == token_bits_words(int64_t(logits.size())), "token mask: {} words for {} logits",
              bits.size(), logits.size());
  for (size_t i = 0; i < logits.size(); ++i)
    if (!token_bit(bits, i)) logits[i] = -std::numeric_limits<float>::infinity();
}

// The host's draw of Session::forward_sample_masked: `allowed` (may be empty: every token) fills a mask applied to the
// row in place (the callers own it), then the sampler draws from it.
inline int32_t sample_masked(Sampler& sampler, std::span<float> logits, std::span<const int32_t> history,
                             const std::function<void(std::span<uint32_t>)>& allowed) {
  if (allowed) {
    std::vector<uint32_t> bits(token_bits_words(int64_t(logits.size())), 0);
    allowed(bits);
    mask_logits(logits, bits);
  }
  return sampler.sample(logits, history);
}

// The masks of n rows (forward_batch_sample's): allowed_of(b) is row b's function or null (no mask), which fills
// words [b * words, (b + 1) * words) of the result (zeroed). A mask at V4's vocabulary takes 0.1-1.3 ms on the host,
// so a batch's masks one after another could outlast its forward pass: the rows are spread over the CPU threads
// (parallel_for; each row's function runs on one thread, several rows' at the same time). A function that throws
// leaves its exception in errors[b] (resized to n).
template <class AllowedOf>
std::vector<uint32_t> row_masks(size_t n, size_t words, AllowedOf&& allowed_of, std::vector<std::exception_ptr>& errors) {
  std::vector<uint32_t> bits(n * words, 0);
  errors.assign(n, nullptr);
  // (work: a mask reads about a byte string per token, ~32 x words steps; the pool takes it from a few rows at V4's
  // vocabulary, and leaves a small model's rows serial)
  parallel_for(int64_t(n), double(n) * double(words) * 32.0, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      if (const std::function<void(std::span<uint32_t>)>* f = allowed_of(size_t(b))) try {
          (*f)(std::span<uint32_t>(bits.data() + size_t(b) * words, words));
        } catch (...) {
          errors[size_t(b)] = std::current_exception();
        }
  });
  return bits;
}

}  // namespace plumb::gen
