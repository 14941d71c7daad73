// UTF-8 well-formedness, lossy decoding and the White_Space predicate, written to match Rust's std behaviour.
#include "text/utf8.h"

namespace plumb::text {

namespace {

// Allowed range of the second byte for a lead byte (table 3-7); later bytes are always 80..BF.
struct Lead {
  int len;           // total sequence length, 0 when the byte cannot start a sequence
  unsigned char lo;  // second-byte range
  unsigned char hi;
};

Lead lead_of(unsigned char b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};  // excludes UTF-16 surrogates
  if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};  // nothing above U+10FFFF
  return {0, 0, 0};
}

// Number of bytes at s[i] that are consistent with a well-formed sequence (stops at the first bad byte or the
// end of s); *full is set when a whole sequence was seen.
size_t scan(std::string_view s, size_t i, bool* full) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  const Lead l = lead_of(b0);
  *full = false;
  if (l.len == 0) return 0;
  if (l.len == 1) {
    *full = true;
    return 1;
  }
  size_t k = 1;
  for (; k < size_t(l.len); ++k) {
    if (i + k >= s.size()) return k;
    const auto b = static_cast<unsigned char>(s[i + k]);
    const bool ok = k == 1 ? (b >= l.lo && b <= l.hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return k;
  }
  *full = true;
  return k;
}

}  // namespace

size_t utf8_valid_len(std::string_view s, size_t i) {
  bool full = false;
  const size_t k = scan(s, i, &full);
  return full ? k : 0;
}

size_t utf8_maximal_subpart(std::string_view s, size_t i) {
  bool full = false;
  const size_t k = scan(s, i, &full);
  return k == 0 ? 1 : k;
}

bool utf8_is_valid(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    // ASCII fast path: most text is mostly ASCII.
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t n = utf8_valid_len(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_valid_len(s, i);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += utf8_maximal_subpart(s, i);
    }
  }
  return out;
}

size_t utf8_complete_prefix(std::string_view s) {
  // Only the last (up to 3) bytes can be an unfinished sequence: look for its lead byte.
  const size_t lo = s.size() > 3 ? s.size() - 3 : 0;
  for (size_t i = s.size(); i-- > lo;) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b >= 0x80 && b <= 0xBF) continue;  // a continuation byte: keep looking for the lead
    bool full = false;
    const size_t k = scan(s, i, &full);
    // Held back only when the bytes from i to the end are a proper prefix of a well-formed sequence.
    if (!full && k > 0 && i + k == s.size()) return i;
    return s.size();
  }
  return s.size();
}

uint32_t utf8_decode_at(std::string_view s, size_t i, size_t len) {
  const auto b = [&](size_t k) { return uint32_t(static_cast<unsigned char>(s[i + k])); };
  switch (len) {
    case 1: return b(0);
    case 2: return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3: return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default: return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

bool is_unicode_white_space(uint32_t cp) {
  if (cp >= 0x09 && cp <= 0x0D) return true;
  if (cp < 0x85) return cp == 0x20;
  if (cp == 0x85 || cp == 0xA0 || cp == 0x1680) return true;
  if (cp >= 0x2000 && cp <= 0x200A) return true;
  return cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

}  // namespace plumb::text
