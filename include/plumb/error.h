// plumb::Error: the exception type of the library; its message names the file, tensor, token or option at fault.
// (plumb/check.h has fail() and PLUMB_CHECK, which build one with fmt: for code built on plumb that wants them.)
#pragma once
#include <stdexcept>

namespace plumb {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A call that the caller asked to stop (Session::set_prefill_stop): not a failure; the session is as it was before
// the call. An Error, so that code catching Error alone still sees it.
struct Stopped : Error {
  using Error::Error;
};

}  // namespace plumb
