// Integers read from JSON files without undefined behaviour.
//
// nlohmann's get<int64_t>() static_casts whatever number it holds: a float such as 1e119 (undefined behaviour, found
// by tests/fuzz on a golden.json start_pos) or an unsigned above INT64_MAX (read as negative). Readers of files take
// their integers through here and report the field by name when it is not one.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

namespace plumb {

// v when it is a JSON integer (no fraction, no exponent) in [lo, hi]; nullopt otherwise.
inline std::optional<int64_t> json_int(const nlohmann::json& v, int64_t lo = std::numeric_limits<int64_t>::min(),
                                       int64_t hi = std::numeric_limits<int64_t>::max()) {
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max())) return std::nullopt;
    x = int64_t(u);
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
  } else {
    return std::nullopt;
  }
  if (x < lo || x > hi) return std::nullopt;
  return x;
}

}  // namespace plumb
