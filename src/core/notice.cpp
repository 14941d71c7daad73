// The library's one-line notes and their process-wide sink (see notice.h).
#include "core/notice.h"

#include <cstdio>
#include <mutex>

namespace plumb {

namespace {
std::mutex& notice_mutex() {
  static std::mutex m;
  return m;
}
std::function<void(std::string_view)>& notice_sink() {
  static std::function<void(std::string_view)> sink;
  return sink;
}
}  // namespace

void notice(std::string_view line) {
  std::lock_guard<std::mutex> lock(notice_mutex());
  if (notice_sink()) return notice_sink()(line);
  std::fprintf(stderr, "%.*s\n", int(line.size()), line.data());
  std::fflush(stderr);
}

void set_notice_sink_impl(std::function<void(std::string_view)> sink) {
  std::lock_guard<std::mutex> lock(notice_mutex());
  notice_sink() = std::move(sink);
}

}  // namespace plumb
