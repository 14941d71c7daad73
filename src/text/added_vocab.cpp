// Added-token extraction following hf tokenizers' AddedVocabulary::find_matches, including the single_word,
// lstrip and rstrip adjustments.
#include "text/added_vocab.h"

#include <algorithm>

#include "text/regex.h"
#include "text/utf8.h"

namespace plumb::text {

namespace {

// Code point of the character ending at s[end) (or -1), walking back over continuation bytes.
int64_t last_char(std::string_view s) {
  if (s.empty()) return -1;
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80 && s.size() - i < 4) --i;
  const size_t n = utf8_valid_len(s, i);
  return n == s.size() - i ? int64_t(utf8_decode_at(s, i, n)) : -1;
}

int64_t first_char(std::string_view s) {
  if (s.empty()) return -1;
  const size_t n = utf8_valid_len(s, 0);
  return n ? int64_t(utf8_decode_at(s, 0, n)) : -1;
}

// hf tests \w with the Rust regex crate (Unicode word characters); PCRE2's UCP \w is the close equivalent
// (letters, numbers, underscore). Only single_word tokens consult this; DeepSeek's files have none.
bool is_word_char(int64_t cp) {
  if (cp < 0) return false;
  static const Regex word = Regex::onig("\\w", "single_word check");
  std::string ch;
  utf8_append(ch, uint32_t(cp));
  std::vector<Span> spans;
  word.find_matches(ch, spans);
  return spans.size() == 1 && spans[0].match;
}

// Start of the run of white space that ends s (s.size() when s does not end in white space).
size_t white_run_start(std::string_view s) {
  size_t start = s.size();
  while (start > 0) {
    size_t i = start - 1;
    while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80 && start - i < 4) --i;
    const size_t n = utf8_valid_len(s, i);
    if (n != start - i || !is_unicode_white_space(utf8_decode_at(s, i, n))) break;
    start = i;
  }
  return start;
}

// Length of the run of white space that starts s.
size_t white_run_len(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const size_t n = utf8_valid_len(s, i);
    if (n == 0 || !is_unicode_white_space(utf8_decode_at(s, i, n))) break;
    i += n;
  }
  return i;
}

}  // namespace

void AddedVocab::Trie::insert(std::string_view s, int32_t token) {
  int32_t node = 0;
  for (unsigned char c : s) {
    int32_t next = -1;
    for (const auto& [b, child] : nodes[size_t(node)].kids)
      if (b == c) next = child;
    if (next < 0) {
      next = int32_t(nodes.size());
      nodes[size_t(node)].kids.emplace_back(c, next);
      nodes.emplace_back();
    }
    node = next;
  }
  nodes[size_t(node)].token = token;
  first_byte[static_cast<unsigned char>(s[0])] = true;
}

size_t AddedVocab::Trie::longest_at(std::string_view s, size_t i, int32_t* token) const {
  size_t best = 0;
  int32_t node = 0;
  for (size_t k = i; k < s.size(); ++k) {
    const auto c = static_cast<unsigned char>(s[k]);
    int32_t next = -1;
    for (const auto& [b, child] : nodes[size_t(node)].kids)
      if (b == c) next = child;
    if (next < 0) break;
    node = next;
    if (nodes[size_t(node)].token >= 0) {
      best = k + 1 - i;
      *token = nodes[size_t(node)].token;
    }
  }
  return best;
}

void AddedVocab::add(const std::vector<AddedToken>& tokens, const Bpe& model) {
  for (const AddedToken& t : tokens) {
    if (t.content.empty()) continue;  // hf ignores empty contents
    const auto it = content_to_index_.find(t.content);
    if (it != content_to_index_.end()) {
      // A repeated content keeps its id; the later entry's flags win, and "special" sticks.
      AddedToken& old = tokens_[size_t(it->second)];
      const bool was_special = old.special;
      const int32_t id = old.id;
      old = t;
      old.id = id;
      old.special = old.special || was_special;
      continue;
    }
    int32_t id = model.token_to_id(t.content);
    if (id < 0) {
      // hf: the next id after the largest added id when that is already past the vocab, else vocab.len().
      const auto vsize = int32_t(model.size());
      id = (max_id_ >= vsize || vsize == 0) ? max_id_ + 1 : vsize;
    }
    AddedToken copy = t;
    copy.id = id;
    content_to_index_.emplace(copy.content, int32_t(tokens_.size()));
    tokens_.push_back(std::move(copy));
    max_id_ = std::max(max_id_, id);
  }
  id_to_index_.assign(size_t(max_id_ + 1), -1);
  raw_trie_ = Trie{};
  normalized_trie_ = Trie{};
  has_normalized_ = false;
  for (size_t k = 0; k < tokens_.size(); ++k) {
    id_to_index_[size_t(tokens_[k].id)] = int32_t(k);
    if (tokens_[k].normalized) {
      normalized_trie_.insert(tokens_[k].content, int32_t(k));
      has_normalized_ = true;
    } else {
      raw_trie_.insert(tokens_[k].content, int32_t(k));
    }
  }
}

void AddedVocab::find_matches(std::string_view s, const Trie& trie, size_t base, std::vector<Segment>& out) const {
  size_t start_offset = 0;  // end of what has been emitted
  size_t pos = 0;           // where the automaton resumes: the raw end of the previous match
  while (pos < s.size()) {
    size_t len = 0;
    int32_t tok = -1;
    size_t i = pos;
    for (; i < s.size(); ++i) {
      if (!trie.first_byte[static_cast<unsigned char>(s[i])]) continue;
      len = trie.longest_at(s, i, &tok);
      if (len) break;
    }
    if (!len) break;
    size_t start = i, stop = i + len;
    pos = stop;
    const AddedToken& t = tokens_[size_t(tok)];
    if (t.single_word) {
      const bool start_space = start == 0 || !is_word_char(last_char(s.substr(0, start)));
      const bool stop_space = stop == s.size() || !is_word_char(first_char(s.substr(stop)));
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) start = std::max(white_run_start(s.substr(0, start)), start_offset);
    if (t.rstrip) stop += white_run_len(s.substr(stop));
    if (start_offset < start) out.push_back({base + start_offset, base + start, -1});
    out.push_back({base + start, base + stop, t.id});
    start_offset = stop;
  }
  if (start_offset < s.size()) out.push_back({base + start_offset, base + s.size(), -1});
}

void AddedVocab::split(std::string_view text, std::vector<Segment>& out) const {
  if (text.empty()) return;
  if (!has_normalized_) {
    find_matches(text, raw_trie_, 0, out);
    return;
  }
  std::vector<Segment> phase1;
  find_matches(text, raw_trie_, 0, phase1);
  for (const Segment& seg : phase1) {
    if (seg.id >= 0) out.push_back(seg);
    else find_matches(text.substr(seg.begin, seg.end - seg.begin), normalized_trie_, seg.begin, out);
  }
}

int32_t AddedVocab::token_to_id(std::string_view content) const {
  const auto it = content_to_index_.find(content);
  return it == content_to_index_.end() ? -1 : tokens_[size_t(it->second)].id;
}

const AddedToken* AddedVocab::by_id(int32_t id) const {
  if (id < 0 || size_t(id) >= id_to_index_.size() || id_to_index_[size_t(id)] < 0) return nullptr;
  return &tokens_[size_t(id_to_index_[size_t(id)])];
}

bool AddedVocab::is_special_content(std::string_view content) const {
  const auto it = content_to_index_.find(content);
  return it != content_to_index_.end() && tokens_[size_t(it->second)].special;
}

}  // namespace plumb::text
