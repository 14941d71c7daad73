// The CUDA backend's entry points in a build without CUDA (-DPLUMB_CUDA=OFF): they say so and nothing more.
#ifndef PLUMB_WITH_CUDA
#include <cstdio>

#include "cuda/api.h"
#include "model/model.h"

namespace plumb::cuda {

namespace {
constexpr const char* kNoCuda = "this plumb was built without CUDA (configure with -DPLUMB_CUDA=ON, CUDA 13, sm_90a)";
}

bool available(std::string* why) {
  if (why) *why = kNoCuda;
  return false;
}

int run_bench(const BenchOptions&) {
  std::fprintf(stderr, "error: plumb bench: %s\n", kNoCuda);
  return 3;
}

}  // namespace plumb::cuda

namespace plumb {
std::unique_ptr<DeviceForward> make_cuda_forward(const Model&, const std::function<void(int64_t, int64_t)>&) { fail("backend cuda: {}", cuda::kNoCuda); }
}  // namespace plumb
#endif  // !PLUMB_WITH_CUDA
