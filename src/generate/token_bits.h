// The allowed-token bitset of Session::forward_sample_masked (bit id % 32 of word id / 32: token id may be drawn)
// and its one host application to a logits row. The GPU's is fwd_mask_logits (src/cuda/sample.h).
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <vector>

#include "core/error.h"
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

}  // namespace plumb::gen
