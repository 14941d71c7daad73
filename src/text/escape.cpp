// Escaping for line-based tokenizer I/O (see escape.h); tools/tokenizer/make_parity.py writes the same form.
#include "text/escape.h"

#include "core/error.h"
#include "text/utf8.h"

namespace plumb::text {

namespace {
int hex_val(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
}  // namespace

std::string unescape_line(std::string_view line) {
  std::string out;
  out.reserve(line.size());
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] != '\\') {
      out += line[i];
      continue;
    }
    if (i + 1 >= line.size()) fail("bad escape at column {}: lone backslash at end of line", i + 1);
    const char e = line[++i];
    switch (e) {
      case '\\': out += '\\'; break;
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case 'x': {
        const int hi = i + 1 < line.size() ? hex_val(line[i + 1]) : -1;
        const int lo = i + 2 < line.size() ? hex_val(line[i + 2]) : -1;
        if (hi < 0 || lo < 0) fail("bad escape at column {}: \\x needs two hex digits", i);
        out += char(hi * 16 + lo);
        i += 2;
        break;
      }
      default: fail("bad escape at column {}: \\{}", i, e);
    }
  }
  return out;
}

std::string escape_line(std::string_view s) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  const auto hex_byte = [&](unsigned char c) {
    out += "\\x";
    out += kHex[c >> 4];
    out += kHex[c & 15];
  };
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if (c == '\\') out += "\\\\";
      else if (c == '\n') out += "\\n";
      else if (c == '\t') out += "\\t";
      else if (c == '\r') out += "\\r";
      else if (c < 0x20 || c == 0x7F) hex_byte(c);
      else out += char(c);
      ++i;
      continue;
    }
    const size_t n = utf8_valid_len(s, i);
    if (n) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      hex_byte(c);
      ++i;
    }
  }
  return out;
}

}  // namespace plumb::text
