// OpeningMask (opening_mask.h): a reply held to begin with one of a few openings.
#include "generate/opening_mask.h"

#include <algorithm>
#include <array>

#include "core/error.h"
#include "generate/token_bits.h"
#include "plumb/text.h"

namespace plumb::gen {

OpeningMask::OpeningMask(const Tokenizer& tok, int32_t vocab, std::vector<std::string> openings,
                         const std::vector<int32_t>& ends)
    : t_(TokenTables::of(tok, vocab)), openings_(std::move(openings)), is_end_(size_t(vocab), 0) {
  PLUMB_CHECK(!openings_.empty(), "reply_opens_with: no opening given");
  for (const std::string& o : openings_) PLUMB_CHECK(!o.empty(), "reply_opens_with: an empty opening");
  for (int32_t id : ends)
    if (id >= 0 && id < vocab) is_end_[size_t(id)] = 1;
}

std::vector<std::string_view> OpeningMask::rests() const {
  std::vector<std::string_view> r;
  for (const std::string& o : openings_)
    if (o.size() >= written_.size() && o.compare(0, written_.size(), written_) == 0)
      r.push_back(std::string_view(o).substr(written_.size()));
  std::sort(r.begin(), r.end());
  r.erase(std::unique(r.begin(), r.end()), r.end());
  return r;
}

// Whether the bytes begin one of the rests (sorted: the rests that begin with them follow lower_bound), or a rest is
// a proper prefix of them (a token running past an opening's end): O(log n) per token, O(|bytes| log n) for a token
// longer than the shortest rest.
bool OpeningMask::fits(std::string_view bytes, const std::vector<std::string_view>& rests, size_t shortest) {
  if (bytes.empty()) return false;
  const auto it = std::lower_bound(rests.begin(), rests.end(), bytes);
  if (it != rests.end() && it->substr(0, bytes.size()) == bytes) return true;
  for (size_t n = shortest; n < bytes.size(); ++n)
    if (std::binary_search(rests.begin(), rests.end(), bytes.substr(0, n))) return true;
  return false;
}

bool OpeningMask::allows(int32_t id) const {
  if (id < 0 || size_t(id) >= t_->bytes.size()) return false;
  if (opened_) return true;
  const auto r = rests();
  return !is_end_[size_t(id)] && fits(t_->bytes[size_t(id)], r, shortest(r));
}

void OpeningMask::allowed(std::span<uint32_t> bits) const {
  const size_t vocab = t_->bytes.size();
  PLUMB_CHECK(bits.size() == token_bits_words(int64_t(vocab)), "reply_opens_with: a mask of {} words for a vocabulary "
              "of {}", bits.size(), vocab);
  if (opened_) {
    for (size_t id = 0; id < vocab; ++id) set_token_bit(bits, id);
    return;
  }
  const auto r = rests();
  const size_t n = shortest(r);
  std::array<bool, 256> first{};  // (most tokens fail at their first byte: tried first)
  for (auto x : r) first[uint8_t(x[0])] = true;
  size_t kept = 0;
  for (size_t id = 0; id < vocab; ++id) {
    const std::string& b = t_->bytes[id];
    if (!b.empty() && first[uint8_t(b[0])] && !is_end_[id] && fits(b, r, n)) set_token_bit(bits, id), ++kept;
  }
  PLUMB_CHECK(kept > 0, "reply_opens_with: no token of the vocabulary can continue \"{}\" toward an opening", written_);
}

void OpeningMask::accept(int32_t id) {
  PLUMB_CHECK(allows(id), "reply_opens_with: token {} cannot continue the opening", id);
  if (opened_) return;
  written_ += t_->bytes[size_t(id)];
  for (const std::string& o : openings_)
    if (written_.size() >= o.size() && written_.compare(0, o.size(), o) == 0) opened_ = true;
  if (opened_) written_.clear();
}

}  // namespace plumb::gen
