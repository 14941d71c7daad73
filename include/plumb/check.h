// fail() and PLUMB_CHECK: throw a plumb::Error whose message is formatted with fmt (the library's own checks, and
// the CLI's). Optional for code built on plumb: the other public headers do not include it, nor need fmt.
#pragma once
#include <fmt/format.h>

#include <utility>

#include "plumb/error.h"

namespace plumb {

template <typename... Args>
[[noreturn]] inline void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

#define PLUMB_CHECK(cond, ...)                  \
  do {                                          \
    if (!(cond)) ::plumb::fail(__VA_ARGS__);    \
  } while (0)

}  // namespace plumb
