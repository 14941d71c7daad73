// Shared by the tool-call mask's tests: one step of a mask checked against the recognizer fed each token's bytes.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "generate/token_bits.h"
#include "generate/tool_call_mask.h"
#include "plumb/text.h"

namespace plumb::testing {

// The bytes a recognizer's state takes next (empty: a dead end).
template <class R>
std::vector<uint8_t> bytes_taken(const R& r) {
  std::vector<uint8_t> ok;
  for (int b = 0; b < 256; ++b) {
    R t = r;
    if (t.feed(uint8_t(b))) ok.push_back(uint8_t(b));
  }
  return ok;
}

// Whether each token's bit in `mask`'s allowed() is exactly whether `shadow` (the mask's state, kept beside it) takes
// the token's bytes: an end token (`ends`) where the reply may end (the block complete, or free text before one), and
// once the block is complete nothing else; an added token only where it is among `added` (the DSML tags a tokenizer
// holds as added tokens, which pass as text). The allowed ids (at least one), or nullopt after a failure naming the
// token and the text so far.
inline std::optional<std::vector<int32_t>> mask_step_matches_feed(const gen::OutputMask& mask,
                                                                  const gen::ToolCallRecognizer& shadow,
                                                                  const Tokenizer& tok, const std::vector<int32_t>& ends,
                                                                  const std::vector<std::string>& added,
                                                                  const std::string& text) {
  const int32_t vocab = int32_t(mask.vocab());
  std::vector<uint32_t> bits(gen::token_bits_words(vocab), 0);
  try {
    mask.allowed(bits);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "allowed() threw after [" << text << "]: " << e.what();
    return std::nullopt;
  }
  std::vector<int32_t> ok;
  for (int32_t id = 0; id < vocab; ++id) {
    bool want;
    if (std::find(ends.begin(), ends.end(), id) != ends.end()) {
      want = shadow.may_end();
    } else if (shadow.complete()) {
      want = false;
    } else {
      const std::string b = tok.token_bytes(id);
      const bool as_text = !tok.is_added(id) || std::find(added.begin(), added.end(), b) != added.end();
      gen::ToolCallRecognizer t = shadow;
      want = as_text && !b.empty() && t.feed(b);
    }
    if (gen::token_bit(bits, size_t(id)) != want) {
      ADD_FAILURE() << "token " << id << " [" << tok.token_bytes(id) << "] " << (want ? "masked" : "allowed")
                    << " after [" << text << "]";
      return std::nullopt;
    }
    if (want) ok.push_back(id);
  }
  if (ok.empty()) {
    ADD_FAILURE() << "nothing allowed after [" << text << "]";
    return std::nullopt;
  }
  return ok;
}

}  // namespace plumb::testing
