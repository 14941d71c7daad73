// One-line notes the library prints while loading or running (which patch applies where, a graph capture that
// failed): to stderr, or to the sink a front end sets (plumb::set_notice_sink, plumb/engine.h), so that a live status
// line can be moved below them instead of being run into.
#pragma once
#include <functional>
#include <string>
#include <string_view>

namespace plumb {

// Prints `line` (no trailing newline) as one line: through the sink if one is set, else on stderr. Thread-safe: notes
// from several threads come out whole, one at a time.
void notice(std::string_view line);
// Replaces the sink (an empty function: stderr again).
void set_notice_sink_impl(std::function<void(std::string_view)> sink);

}  // namespace plumb
