// PLUMB_HD: __host__ __device__ under nvcc, nothing elsewhere; for the plain headers that both the CPU reference
// and the CUDA kernels compile (model/hc_math.h, model/official_math.h).
#pragma once

#if defined(__CUDACC__)
#define PLUMB_HD __host__ __device__
#else
#define PLUMB_HD
#endif
