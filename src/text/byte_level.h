// GPT-2 byte-level alphabet: the bijection between the 256 byte values and printable code points that
// byte-level BPE vocabularies are written in (hf tokenizers' bytes_char / CHAR_BYTES).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace plumb::text {

// Code point that stands for byte b (e.g. 0x20 -> U+0120 'Ġ', 0x41 -> 'A').
uint32_t byte_to_codepoint(uint8_t b);

// Byte that code point cp stands for, or -1 when cp is not in the alphabet.
int codepoint_to_byte(uint32_t cp);

// Maps every byte of raw to its alphabet character (UTF-8), appending to out.
void byte_level_encode(std::string_view raw, std::string& out);

// The ByteLevel decoder's view of one token: its bytes when every character is in the alphabet, otherwise
// the token's own UTF-8 (how hf decodes e.g. "<｜User｜>"). Appends to out.
void byte_level_decode_token(std::string_view token, std::string& out);

}  // namespace plumb::text
