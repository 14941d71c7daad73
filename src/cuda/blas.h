// cuBLASLt on the device (src/cuda/blas.cpp): dense bf16 GEMMs, and the bench's measurement of the device's
// bf16 tensor-core rate. Optional: a build whose CUDA toolkit has no cuBLASLt (CMake finds no CUDA::cublasLt)
// compiles without it; then have_cublaslt() is false, the GEMM throws and the measurement says why.
// Plain C++ (no CUDA headers).
#pragma once
#include <cstdint>
#include <string>

#include "cuda/api.h"

namespace plumb::cuda {

bool have_cublaslt();  // built with cuBLASLt

// The device memory cuBLASLt may use for one GEMM (GemmDesc::workspace).
constexpr size_t kGemmWorkspaceBytes = size_t(32) << 20;

// D[m, n] (row-major, fp32 if d_f32 else bf16) = A[m, k] (row-major bf16) . B[n, k]^T (row-major bf16), fp32
// accumulation (cuBLASLt's CUBLAS_COMPUTE_32F; the "TN" layout). Throws plumb::Error without cuBLASLt or on a
// cuBLASLt error.
void gemm_bf16(const uint16_t* A, const uint16_t* B, void* D, bool d_f32, int m, int n, int k, Stream s = nullptr);

// The same product with leading dimensions and a strided batch: for b < batch, D_b = A_b . B_b^T with
// A_b = A + b * a_stride ([m, k], rows lda apart), B_b = B + b * b_stride ([n, k], rows ldb apart), D_b = D +
// b * d_stride ([m, n], rows ldd apart); strides and leading dimensions in elements. The FP8 prefill GEMMs
// (fp8_gemm.cpp) write into column slices of wider outputs (ldd > n) and run the grouped wo_a as one batch.
struct GemmDesc {
  int m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldd = 0;  // 0: k, k, n
  int batch = 1;
  int64_t a_stride = 0, b_stride = 0, d_stride = 0;
  bool d_f32 = true;
  // kGemmWorkspaceBytes of device memory for cuBLASLt, or null: the calling thread's own (freed when the thread ends).
  // A GEMM that a CUDA graph captures bakes this address in, so the forward passes its model's scratch here: a
  // session's graph may replay on another thread than the one that captured it.
  void* workspace = nullptr;
};
void gemm_bf16(const GemmDesc& g, const uint16_t* A, const uint16_t* B, void* D, Stream s = nullptr);
// Tests: the cuBLASLt plans made so far in this process (one per GEMM shape, shared by the threads), and the
// gemm_bf16 calls (host count: eager calls and captures).
int64_t gemm_plans_made();
int64_t gemm_calls();

// The device's bf16 tensor-core rate: an m x n x k bf16 GEMM (random inputs, bf16 out, fp32 accumulate), the
// median of `iters` timed runs after `warmup` untimed ones.
struct GemmRate {
  bool measured = false;
  double tflops = 0, ms_median = 0, ms_min = 0;
  int m = 0, n = 0, k = 0, iters = 0;
  std::string why;  // when not measured
};
GemmRate measure_bf16_gemm(int m, int n, int k, int warmup, int iters, Stream s = nullptr);

}  // namespace plumb::cuda
