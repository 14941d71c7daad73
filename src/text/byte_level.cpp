// The GPT-2 byte <-> code point table, built once: printable Latin-1 bytes map to themselves, the other 68
// bytes to U+0100 upwards in byte order.
#include "text/byte_level.h"

#include <array>

#include "text/utf8.h"

namespace plumb::text {

namespace {

struct Tables {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 0x144> to_byte{};  // the alphabet's highest code point is U+0143
  std::array<std::string, 256> utf8;     // pre-encoded alphabet characters
  Tables() {
    to_byte.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[b] = printable ? uint32_t(b) : next++;
      to_byte[to_cp[b]] = int16_t(b);
      utf8_append(utf8[b], to_cp[b]);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

uint32_t byte_to_codepoint(uint8_t b) { return tables().to_cp[b]; }

int codepoint_to_byte(uint32_t cp) { return cp < tables().to_byte.size() ? tables().to_byte[cp] : -1; }

void byte_level_encode(std::string_view raw, std::string& out) {
  const auto& t = tables();
  for (unsigned char c : raw) out += t.utf8[c];
}

void byte_level_decode_token(std::string_view token, std::string& out) {
  const size_t mark = out.size();
  for (size_t i = 0; i < token.size();) {
    const size_t n = utf8_valid_len(token, i);
    const int b = n ? codepoint_to_byte(utf8_decode_at(token, i, n)) : -1;
    if (b < 0) {
      // Not all alphabet characters: hf falls back to the token's own bytes, for the whole token.
      out.resize(mark);
      out.append(token);
      return;
    }
    out += char(b);
    i += n;
  }
}

}  // namespace plumb::text
