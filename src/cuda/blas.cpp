// cuBLASLt bf16 GEMM and the bench's bf16 rate measurement (see blas.h). Compiled into plumb_core with
// PLUMB_WITH_CUDA; the cuBLASLt calls only with PLUMB_WITH_CUBLASLT (cmake/PlumbCuda.cmake links CUDA::cublasLt
// when the toolkit has it).
#ifdef PLUMB_WITH_CUDA
#include "cuda/blas.h"

#include <algorithm>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "cuda/kernels.h"
#include "core/error.h"

#ifdef PLUMB_WITH_CUBLASLT
#include <cublasLt.h>
#endif

namespace plumb::cuda {

namespace d = detail;

#ifndef PLUMB_WITH_CUBLASLT

bool have_cublaslt() { return false; }

void gemm_bf16(const uint16_t*, const uint16_t*, void*, bool, int, int, int, Stream) {
  throw Error("gemm_bf16: this plumb was built without cuBLASLt");
}

GemmRate measure_bf16_gemm(int m, int n, int k, int, int iters, Stream) {
  GemmRate r;
  r.m = m, r.n = n, r.k = k, r.iters = iters;
  r.why = "built without cuBLASLt";
  return r;
}

#else

bool have_cublaslt() { return true; }

namespace {

void check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) throw Error(std::string("cuBLASLt: ") + what + " failed: " + cublasLtGetStatusName(st) + " (" + cublasLtGetStatusString(st) + ")");
}

constexpr size_t kWorkspace = size_t(32) << 20;

// One planned GEMM: descriptors, layouts and the heuristic's first algorithm, for D = A . B^T (row-major A [m, k],
// B [n, k], D [m, n]). In cuBLASLt's column-major terms: D^T (n x m) = op_T(B as k x n) . (A as k x m).
struct Plan {
  cublasLtHandle_t h = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulHeuristicResult_t heur{};
  DeviceBuffer ws;

  Plan(int m, int n, int k, bool d_f32) : ws(kWorkspace) {
    check(cublasLtCreate(&h), "cublasLtCreate");
    check(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t), "set TRANSA");
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof nn), "set TRANSB");
    check(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, uint64_t(k), uint64_t(n), int64_t(k)), "layout A");
    check(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, uint64_t(k), uint64_t(m), int64_t(k)), "layout B");
    check(cublasLtMatrixLayoutCreate(&ld, d_f32 ? CUDA_R_32F : CUDA_R_16BF, uint64_t(n), uint64_t(m), int64_t(n)), "layout D");
    cublasLtMatmulPreference_t pref = nullptr;
    check(cublasLtMatmulPreferenceCreate(&pref), "preference");
    const size_t wsb = kWorkspace;
    check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb), "set workspace");
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, ld, ld, pref, 1, &heur, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    check(st, "cublasLtMatmulAlgoGetHeuristic");
    if (found < 1) throw Error("cuBLASLt: no algorithm for this bf16 GEMM");
  }
  ~Plan() {
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    if (h) cublasLtDestroy(h);
  }
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;

  void run(const uint16_t* A, const uint16_t* B, void* D, Stream s) {
    const float one = 1.0f, zero = 0.0f;
    // A null stream is plumb's default stream, the calling thread's (the CUDA code is built with
    // --default-stream per-thread); cuBLASLt itself would read 0 as the legacy stream, which cannot be captured.
    cudaStream_t cs = s ? reinterpret_cast<cudaStream_t>(s) : cudaStreamPerThread;
    check(cublasLtMatmul(h, op, &one, B, la, A, lb, &zero, D, ld, D, ld, &heur.algo, ws.get(), kWorkspace, cs),
          "cublasLtMatmul");
  }
};

}  // namespace

void gemm_bf16(const uint16_t* A, const uint16_t* B, void* D, bool d_f32, int m, int n, int k, Stream s) {
  if (m <= 0 || n <= 0 || k <= 0) throw Error("gemm_bf16: empty problem");
  // Plans are cached per thread and shape: creating one (handle, heuristic, workspace allocation) costs far more
  // than the decode step's head GEMM, and an allocation cannot happen inside a CUDA graph capture.
  struct Key {
    int m, n, k;
    bool f32;
    bool operator<(const Key& o) const { return std::tie(m, n, k, f32) < std::tie(o.m, o.n, o.k, o.f32); }
  };
  thread_local std::map<Key, std::unique_ptr<Plan>> plans;
  auto& p = plans[Key{m, n, k, d_f32}];
  if (!p) p = std::make_unique<Plan>(m, n, k, d_f32);
  p->run(A, B, D, s);
}

GemmRate measure_bf16_gemm(int m, int n, int k, int warmup, int iters, Stream s) {
  GemmRate r;
  r.m = m, r.n = n, r.k = k, r.iters = iters;
  try {
    DeviceBuffer a(size_t(m) * size_t(k) * 2), b(size_t(n) * size_t(k) * 2), dd(size_t(m) * size_t(n) * 2);
    d::fill(a.get(), size_t(m) * size_t(k), d::kFillBF16, 71, -1.0f, 1.0f, s);  // random data: zeros run faster
    d::fill(b.get(), size_t(n) * size_t(k), d::kFillBF16, 72, -1.0f, 1.0f, s);
    Plan p(m, n, k, /*d_f32=*/false);
    for (int i = 0; i < warmup; ++i) p.run(a.as<uint16_t>(), b.as<uint16_t>(), dd.get(), s);
    void* e0 = d::event_create();
    void* e1 = d::event_create();
    std::vector<double> ms;
    try {
      for (int i = 0; i < iters; ++i) {
        d::event_record(e0, s);
        p.run(a.as<uint16_t>(), b.as<uint16_t>(), dd.get(), s);
        d::event_record(e1, s);
        ms.push_back(d::event_elapsed_ms(e0, e1));
      }
    } catch (...) {
      d::event_destroy(e0), d::event_destroy(e1);
      throw;
    }
    d::event_destroy(e0), d::event_destroy(e1);
    std::sort(ms.begin(), ms.end());
    r.ms_median = ms[ms.size() / 2], r.ms_min = ms.front();
    r.tflops = 2.0 * double(m) * double(n) * double(k) / (r.ms_median * 1e-3) / 1e12;
    r.measured = true;
  } catch (const std::exception& e) {
    r.why = e.what();
  }
  return r;
}

#endif  // PLUMB_WITH_CUBLASLT

}  // namespace plumb::cuda
#endif  // PLUMB_WITH_CUDA
