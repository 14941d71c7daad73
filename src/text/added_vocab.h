// Added tokens of tokenizer.json ("<｜User｜>", "<think>", ...): hf's id assignment and its two-phase,
// leftmost-longest extraction that runs before pre-tokenization.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/bpe.h"

namespace plumb::text {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

// A stretch of input: either text to pre-tokenize (id == -1) or one added token.
struct Segment {
  size_t begin;
  size_t end;
  int32_t id;
};

class AddedVocab {
 public:
  // Registers the file's added_tokens in order, assigning ids the way hf's AddedVocabulary::add_tokens does
  // (the vocab id when the content is in the model vocab, else the next free id above it); the "id" written
  // in the file is not consulted, exactly as in hf.
  void add(const std::vector<AddedToken>& tokens, const Bpe& model);

  // Splits text into segments. Phase 1 extracts tokens with normalized=false from the raw text; phase 2
  // extracts tokens with normalized=true from each remaining gap (plumb supports identity normalizers only,
  // so a gap's normalized form is the gap itself).
  void split(std::string_view text, std::vector<Segment>& out) const;

  int32_t token_to_id(std::string_view content) const;  // -1 if not an added token
  const AddedToken* by_id(int32_t id) const;            // nullptr if not an added token
  bool is_special_content(std::string_view content) const;
  int32_t max_id() const { return max_id_; }
  size_t size() const { return tokens_.size(); }

 private:
  // A byte trie over token contents for leftmost-longest matching.
  struct Trie {
    struct Node {
      std::vector<std::pair<unsigned char, int32_t>> kids;
      int32_t token = -1;  // index into tokens_ when a content ends here
    };
    std::vector<Node> nodes{Node{}};
    bool first_byte[256] = {};
    void insert(std::string_view s, int32_t token);
    // Longest content starting at s[i]: its length, and the token index in *token; 0 if none.
    size_t longest_at(std::string_view s, size_t i, int32_t* token) const;
  };
  void find_matches(std::string_view s, const Trie& trie, size_t base, std::vector<Segment>& out) const;

  std::vector<AddedToken> tokens_;  // one entry per distinct content
  StringIdMap content_to_index_;
  std::vector<int32_t> id_to_index_;  // id -> index into tokens_, -1 if none
  Trie raw_trie_, normalized_trie_;
  bool has_normalized_ = false;
  int32_t max_id_ = -1;
};

}  // namespace plumb::text
