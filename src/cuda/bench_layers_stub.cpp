// `plumb bench --layers` in a build without CUDA (-DPLUMB_CUDA=OFF): says so, like src/cuda/stub.cpp.
#ifndef PLUMB_WITH_CUDA
#include <cstdio>

#include "core/error.h"
#include "cuda/bench_layers.h"

namespace plumb::cuda {

namespace {
constexpr const char* kNoCuda = "this plumb was built without CUDA (configure with -DPLUMB_CUDA=ON, CUDA 13, sm_90a)";
}

std::vector<std::string> layer_bench_types(int) { return {}; }

uint64_t write_layer_bench_checkpoint(const std::string&, const LayerBenchOptions&, bool) {
  fail("bench --layers: {}", kNoCuda);
}

int run_layer_bench(const LayerBenchOptions&) {
  std::fprintf(stderr, "error: plumb bench --layers: %s\n", kNoCuda);
  return 3;
}

}  // namespace plumb::cuda
#endif  // !PLUMB_WITH_CUDA
