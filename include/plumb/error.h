// plumb::Error: the one exception type of the library; its message names the file, tensor, token or option at fault.
// (plumb/check.h has fail() and PLUMB_CHECK, which build one with fmt: for code built on plumb that wants them.)
#pragma once
#include <stdexcept>

namespace plumb {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace plumb
