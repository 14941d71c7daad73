// What the standalone device probes (bench/*_probe.cu) share: the check of a CUDA runtime call (prints the call and
// the error, then exits); the GPU's global timer is common.cuh's global_ns.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "cuda/common.cuh"

using plumb::cuda::detail::global_ns;

#define CK(x)                                                                         \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)
