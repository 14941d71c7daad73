// UTF-8 helpers shared by the tokenizer: well-formedness (Unicode 3.9 table 3-7), lossy decoding, white space.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace plumb::text {

// Length of the well-formed UTF-8 sequence starting at s[i] (1..4), or 0 when s[i] starts none.
size_t utf8_valid_len(std::string_view s, size_t i);

// Length of the maximal subpart at s[i] (Unicode "substitution of maximal subparts"): the longest prefix of
// a well-formed sequence, at least 1. Only meaningful where utf8_valid_len(s, i) == 0.
size_t utf8_maximal_subpart(std::string_view s, size_t i);

// True when every byte of s belongs to a well-formed sequence.
bool utf8_is_valid(std::string_view s);

// Like Rust's String::from_utf8_lossy (what hf's ByteLevel decoder ends with): each maximal subpart of an
// ill-formed sequence becomes one U+FFFD.
std::string utf8_lossy(std::string_view s);

// How many leading bytes of s can be emitted now by a streaming lossy decoder: everything except a trailing
// proper prefix of a well-formed sequence, which later bytes may still complete.
size_t utf8_complete_prefix(std::string_view s);

// Decodes the well-formed sequence of length len at s[i].
uint32_t utf8_decode_at(std::string_view s, size_t i, size_t len);

// Appends the UTF-8 encoding of a scalar value.
void utf8_append(std::string& out, uint32_t cp);

// Rust's char::is_whitespace (Unicode White_Space); also exactly what oniguruma's \s matches in hf tokenizers.
bool is_unicode_white_space(uint32_t cp);

}  // namespace plumb::text
