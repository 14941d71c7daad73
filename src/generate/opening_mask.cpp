// OpeningMask (opening_mask.h): a reply held to begin with one of a few openings.
#include "generate/opening_mask.h"

#include <algorithm>

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

bool OpeningMask::fits(const std::string& bytes) const {
  if (bytes.empty()) return false;
  return std::any_of(openings_.begin(), openings_.end(), [&](const std::string& o) {
    // Openings the text so far has left are out; for the others, o's rest against the token's bytes.
    if (o.size() < written_.size() || o.compare(0, written_.size(), written_) != 0) return false;
    const std::string_view rest = std::string_view(o).substr(written_.size());
    const size_t n = std::min(rest.size(), bytes.size());
    return rest.compare(0, n, bytes, 0, n) == 0;
  });
}

bool OpeningMask::allows(int32_t id) const {
  if (id < 0 || size_t(id) >= t_->bytes.size()) return false;
  return opened_ || (!is_end_[size_t(id)] && fits(t_->bytes[size_t(id)]));
}

void OpeningMask::allowed(std::span<uint32_t> bits) const {
  const size_t vocab = t_->bytes.size();
  PLUMB_CHECK(bits.size() == token_bits_words(int64_t(vocab)), "reply_opens_with: a mask of {} words for a vocabulary "
              "of {}", bits.size(), vocab);
  size_t kept = 0;
  for (size_t id = 0; id < vocab; ++id)
    if (opened_ || (!is_end_[id] && fits(t_->bytes[id]))) set_token_bit(bits, id), ++kept;
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
