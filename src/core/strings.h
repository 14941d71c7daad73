// Small string helpers shared by option parsers.
#pragma once
#include <string>
#include <vector>

namespace plumb {

// Splits "a, b,,c" at `sep` into {"a", "b", "c"}: items trimmed of spaces and tabs, empty items dropped.
std::vector<std::string> split_list(const std::string& s, char sep = ',');

}  // namespace plumb
