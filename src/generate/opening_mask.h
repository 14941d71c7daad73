// GenerateOptions::reply_opens_with: the mask that holds a reply's first bytes to one of a few given openings (a
// named tool call's DSML opening, for plumb serve's tool_choice), then lets every token through.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string_view>
#include <string>
#include <vector>

#include "generate/json_mode.h"

namespace plumb::gen {

// Until the text written holds one of `openings` whole, a token passes only when the text with its bytes is still a
// prefix of an opening or begins with one (a token may run past an opening's end); tokens without text (added tokens:
// EOS, the chat markers) and the stop tokens `ends` do not, so nothing ends the reply before its opening (a stop token
// may be text: "\n"). From then on every token passes.
class OpeningMask final : public OutputMask {
 public:
  OpeningMask(const Tokenizer& tok, int32_t vocab, std::vector<std::string> openings, const std::vector<int32_t>& ends);
  void allowed(std::span<uint32_t> bits) const override;
  bool allows(int32_t id) const override;
  void accept(int32_t id) override;
  bool complete() const override { return opened_; }
  bool lifted() const override { return opened_; }
  size_t vocab() const override { return is_end_.size(); }

 private:
  // What is left of the openings the text so far is a prefix of, sorted and distinct, and their shortest length.
  std::vector<std::string_view> rests() const;
  static size_t shortest(const std::vector<std::string_view>& r) {
    size_t n = SIZE_MAX;
    for (auto x : r) n = std::min(n, x.size());
    return n;
  }
  static bool fits(std::string_view bytes, const std::vector<std::string_view>& rests, size_t shortest);
  std::shared_ptr<const TokenTables> t_;
  std::vector<std::string> openings_;
  std::vector<uint8_t> is_end_;
  std::string written_;
  bool opened_ = false;
};

}  // namespace plumb::gen
