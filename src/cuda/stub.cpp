// The CUDA backend's entry points in a build without CUDA (-DPLUMB_CUDA=OFF): they say so and nothing more.
#ifndef PLUMB_WITH_CUDA
#include <cstdio>

#include "cuda/api.h"

namespace plumb::cuda {

namespace {
constexpr const char* kNoCuda = "this plumb was built without CUDA (configure with -DPLUMB_CUDA=ON, CUDA 13, sm_90a)";
}

bool available(std::string* why) {
  if (why) *why = kNoCuda;
  return false;
}

int run_bench(const BenchOptions&) {
  std::fprintf(stderr, "plumb bench: %s\n", kNoCuda);
  return 3;
}

}  // namespace plumb::cuda
#endif  // !PLUMB_WITH_CUDA
