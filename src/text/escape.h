// The one-line escaped text form used by `plumb tokenize` and the parity fixtures, so any byte string fits
// on one line: \\ \n \t \r and \xHH (one raw byte) escapes; everything else is literal.
#pragma once
#include <string>
#include <string_view>

namespace plumb::text {

// Decodes escapes; throws plumb::Error naming the column of a bad escape.
std::string unescape_line(std::string_view line);

// Escapes backslash, \n, \t, \r as such, other ASCII control bytes and DEL as \xHH, and every byte of an
// ill-formed UTF-8 sequence as \xHH; well-formed non-ASCII characters stay literal.
std::string escape_line(std::string_view bytes);

}  // namespace plumb::text
