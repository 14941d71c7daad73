// Small string helpers shared by option parsers and report writers.
#pragma once
#include <string>
#include <vector>

namespace plumb {

// Splits "a, b,,c" at `sep` into {"a", "b", "c"}: items trimmed of spaces and tabs, empty items dropped.
std::vector<std::string> split_list(const std::string& s, char sep = ',');

// Appends `item` to a `sep`-separated list (no separator before the first). (Also avoids GCC 12's false
// -Wrestrict on `(s.empty() ? "" : ",") + std::string`.)
void append_item(std::string& list, const std::string& item, char sep = ',');

// One CSV row (RFC 4180): fields joined by commas, a field quoted (quotes doubled) when it holds a comma, a quote
// or a line break; ends with "\n".
std::string csv_row(const std::vector<std::string>& fields);

}  // namespace plumb
