// plumb::StopMatcher (plumb/text.h): stop strings matched on the streamed text, across token boundaries. Text
// that could still become a stop string is held back, so a stop string never reaches the output.
#include <algorithm>

#include "core/error.h"
#include "plumb/text.h"

namespace plumb {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const auto& s : stops_) PLUMB_CHECK(!s.empty(), "--stop: an empty stop string would stop at once");
}

std::string StopMatcher::push(std::string_view piece, bool& stopped) {
  held_ += piece;
  stopped = false;
  // The earliest completed stop string wins (the longest of those starting there); it and what follows are not
  // emitted, what follows kept for flush().
  size_t first = std::string::npos, len = 0;
  for (const auto& s : stops_)
    if (const size_t at = held_.find(s); at < first || (at == first && at != std::string::npos && s.size() > len))
      first = at, len = s.size();
  if (first != std::string::npos) {
    stopped = true;
    std::string out = held_.substr(0, first);
    held_.erase(0, first + len);
    return out;
  }
  // Keep the longest tail of the text that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const auto& s : stops_)
    for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k)
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace plumb
