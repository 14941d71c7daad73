// plumb::Error: the one exception type; its message names the file, tensor, token or option at fault. fail() and
// PLUMB_CHECK build it with fmt.
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace plumb {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] inline void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

#define PLUMB_CHECK(cond, ...)                  \
  do {                                          \
    if (!(cond)) ::plumb::fail(__VA_ARGS__);    \
  } while (0)

}  // namespace plumb
