// plumb::text::Tokenizer: a Hugging Face tokenizer.json byte-level BPE tokenizer with exact parity to the
// `tokenizers` library for DeepSeek-V3/V4-style configurations; StreamDecoder for incremental detokenization.
//
// Invalid UTF-8 input (which Python's `tokenizers` can never receive): each maximal run of ill-formed bytes
// becomes a pre-token of its own, encoded through the byte-level alphabet; the valid text around it is
// pre-tokenized as if the run were a boundary. decode() of such ids is lossy (U+FFFD), like hf's decode;
// decode_bytes() returns the original bytes.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace plumb::text {

class Tokenizer {
 public:
  // Loads a tokenizer.json. Throws plumb::Error naming the file and the offending field for a missing or
  // malformed file, unsupported model / normalizer / pre-tokenizer / decoder / post-processor, or bad regex.
  static Tokenizer load(const std::string& tokenizer_json_path);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Like tokenizers' encode(text, add_special_tokens=add_special).ids. Added tokens (e.g. "<｜User｜>") are
  // matched before pre-tokenization and always come out as one id.
  std::vector<int32_t> encode(std::string_view text, bool add_special = false) const;

  // Like tokenizers' decode(ids, skip_special_tokens=skip_special): unknown ids are skipped, the byte-level
  // decoder output is made valid UTF-8 with U+FFFD replacements.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;
  // The same bytes before the lossy UTF-8 step (exact inverse of encode for any input bytes).
  std::string decode_bytes(const std::vector<int32_t>& ids, bool skip_special = false) const;

  int32_t token_id(std::string_view token) const;  // added tokens first, then the vocab; -1 if none
  std::string_view token_text(int32_t id) const;   // the token's string as written in the file; "" if none
  int32_t vocab_size() const;                      // one past the largest id (vocab or added token)
  bool is_special(int32_t id) const;               // an added token marked "special"
  bool is_added(int32_t id) const;                 // a token of added_tokens, special or not
  bool byte_level() const;  // a ByteLevel decoder; without one, decode() joins the tokens with spaces
  // Ids the post-processor adds around a single sequence when add_special is true (e.g. {BOS} and {}).
  const std::vector<int32_t>& special_prefix() const;
  const std::vector<int32_t>& special_suffix() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend class StreamDecoder;
};

// Incremental decoding for generation: push() returns the text that is complete so far. A token may end in
// the middle of a UTF-8 character; those bytes are held until the character completes. Bytes that can no
// longer form a character become U+FFFD as soon as that is certain, so the concatenation of all push() and
// flush() results equals Tokenizer::decode of all ids.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false);
  std::string push(int32_t id);
  std::string flush();  // emits whatever is held (an unfinished character becomes U+FFFD) and resets

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::string pending_;
  bool started_ = false;  // for tokenizers without a byte-level decoder: a space goes before each later token
};

}  // namespace plumb::text
