// cuBLASLt bf16 GEMM and the bench's bf16 rate measurement (see blas.h). Compiled into plumb_core with
// PLUMB_WITH_CUDA; the cuBLASLt calls only with PLUMB_WITH_CUBLASLT (cmake/PlumbCuda.cmake, when the toolkit has
// it), through the library loaded on first use (lt() below).
#ifdef PLUMB_WITH_CUDA
#include "cuda/blas.h"

#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "cuda/kernels.h"
#include "core/error.h"

#ifdef PLUMB_WITH_CUBLASLT
#include <cublasLt.h>
#include <dlfcn.h>
#endif

namespace plumb::cuda {

namespace d = detail;

#ifndef PLUMB_WITH_CUBLASLT

bool have_cublaslt() { return false; }

void gemm_bf16(const uint16_t*, const uint16_t*, void*, bool, int, int, int, Stream) {
  throw Error("gemm_bf16: this plumb was built without cuBLASLt");
}
void gemm_bf16(const GemmDesc&, const uint16_t*, const uint16_t*, void*, Stream) {
  throw Error("gemm_bf16: this plumb was built without cuBLASLt");
}

int64_t gemm_plans_made() { return 0; }
int64_t gemm_calls() { return 0; }

GemmRate measure_bf16_gemm(int m, int n, int k, int, int iters, Stream) {
  GemmRate r;
  r.m = m, r.n = n, r.k = k, r.iters = iters;
  r.why = "built without cuBLASLt";
  return r;
}

#else

bool have_cublaslt() { return true; }

namespace {

// The cuBLASLt functions plumb calls, from libcublasLt.so.<major> loaded on the first GEMM (dlopen), not at start:
// linked, the library (540 MB, registering its kernels as it loads) made every start of a CUDA build ~80 ms slower
// and its resident memory ~200 MB larger, for commands that never touch the GPU too. The loader's search first
// (LD_LIBRARY_PATH, the cache), then the toolkit's folder this build found.
#define PLUMB_LT_FUNCTIONS(X)                                                                                        \
  X(Create) X(Destroy) X(GetStatusName) X(GetStatusString) X(Matmul) X(MatmulAlgoGetHeuristic) X(MatmulDescCreate)    \
  X(MatmulDescDestroy) X(MatmulDescSetAttribute) X(MatmulPreferenceCreate) X(MatmulPreferenceDestroy)                 \
  X(MatmulPreferenceSetAttribute) X(MatrixLayoutCreate) X(MatrixLayoutDestroy) X(MatrixLayoutSetAttribute)
#define PLUMB_STR2(x) #x
#define PLUMB_STR(x) PLUMB_STR2(x)
struct LtApi {
#define PLUMB_LT_MEMBER(f) decltype(&cublasLt##f) f = nullptr;
  PLUMB_LT_FUNCTIONS(PLUMB_LT_MEMBER)
#undef PLUMB_LT_MEMBER
};
const LtApi& lt() {
  static const LtApi api = [] {
    const std::string name = "libcublasLt.so." PLUMB_STR(CUBLAS_VER_MAJOR);
    void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    std::string why = h ? "" : dlerror();
    if (!h) h = dlopen((std::string(PLUMB_CUBLASLT_DIR) + "/" + name).c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h)
      throw Error("cuBLASLt: cannot load " + name + " (" + why + "; not in " PLUMB_CUBLASLT_DIR " either): add the folder that holds it "
                  "(the CUDA toolkit's lib64, or the nvidia-cublas wheel's lib) to LD_LIBRARY_PATH");
    LtApi a;
#define PLUMB_LT_LOAD(f)                                                                                    \
  a.f = reinterpret_cast<decltype(a.f)>(dlsym(h, "cublasLt" #f));                                         \
  if (!a.f) throw Error("cuBLASLt: " + name + " has no cublasLt" #f " (a cuBLASLt older than this build's headers?)");
    PLUMB_LT_FUNCTIONS(PLUMB_LT_LOAD)
#undef PLUMB_LT_LOAD
    return a;  // (the library stays loaded: its handles live as long as the plans cached below)
  }();
  return api;
}
#undef PLUMB_LT_FUNCTIONS
#undef PLUMB_STR
#undef PLUMB_STR2

void check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("cuBLASLt: ") + what + " failed: " + lt().GetStatusName(st) + " (" + lt().GetStatusString(st) + ")");
}

constexpr size_t kWorkspace = kGemmWorkspaceBytes;

// cuBLASLt's scratch for GEMMs given none (GemmDesc::workspace; the forward gives its model's), one per thread and
// stream for every plan: the plans are cached per shape (prefill chunks of many sizes make many), and all of a
// thread's GEMMs on one stream run in order, so they can share it; cuda.streams' side stream (detail::stream_of) runs
// concurrently and has its own. Allocated at a thread's first such GEMM (the bench's, never inside a graph capture);
// a forward's GEMMs never touch them (a capture must not allocate).
void* shared_workspace(int lane) {
  thread_local DeviceBuffer ws[3] = {DeviceBuffer(kWorkspace), DeviceBuffer(kWorkspace), DeviceBuffer(kWorkspace)};
  return ws[lane].get();
}

void set_batch(cublasLtMatrixLayout_t l, int batch, int64_t stride, const char* what) {
  if (batch <= 1) return;
  const int32_t b = batch;
  check(lt().MatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof b), what);
  check(lt().MatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride), what);
}

// One planned GEMM: descriptors, layouts and the heuristic's first algorithm, for D = A . B^T (row-major A [m, k],
// B [n, k], D [m, n], each with its leading dimension). In cuBLASLt's column-major terms: D^T (n x m) = op_T(B as
// k x n) . (A as k x m).
struct Plan {
  cublasLtHandle_t h = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulHeuristicResult_t heur{};

  // align: the byte alignment (a power of two, <= 256) every pointer, leading dimension and batch stride of A, B, D
  // share, so that the heuristic picks an algorithm that can run on them.
  Plan(const GemmDesc& g, const std::array<int, 3>& align) {
    const int m = g.m, n = g.n, k = g.k;
    check(lt().Create(&h), "cublasLtCreate");
    check(lt().MatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
    check(lt().MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t), "set TRANSA");
    check(lt().MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof nn), "set TRANSB");
    check(lt().MatrixLayoutCreate(&la, CUDA_R_16BF, uint64_t(k), uint64_t(n), g.ldb), "layout A");
    check(lt().MatrixLayoutCreate(&lb, CUDA_R_16BF, uint64_t(k), uint64_t(m), g.lda), "layout B");
    check(lt().MatrixLayoutCreate(&ld, g.d_f32 ? CUDA_R_32F : CUDA_R_16BF, uint64_t(n), uint64_t(m), g.ldd), "layout D");
    set_batch(la, g.batch, g.b_stride, "batch A");
    set_batch(lb, g.batch, g.a_stride, "batch B");
    set_batch(ld, g.batch, g.d_stride, "batch D");
    cublasLtMatmulPreference_t pref = nullptr;
    check(lt().MatmulPreferenceCreate(&pref), "preference");
    const size_t wsb = kWorkspace;
    check(lt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb), "set workspace");
    const uint32_t al_a = uint32_t(align[0]), al_b = uint32_t(align[1]), al_d = uint32_t(align[2]);
    // cuBLASLt's A is plumb's B (the weights) and its B plumb's A (see above).
    check(lt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_b, sizeof al_b), "set align A");
    check(lt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_a, sizeof al_a), "set align B");
    check(lt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof al_d), "set align C");
    check(lt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d), "set align D");
    int found = 0;
    const cublasStatus_t st = lt().MatmulAlgoGetHeuristic(h, op, la, lb, ld, ld, pref, 1, &heur, &found);
    lt().MatmulPreferenceDestroy(pref);
    check(st, "cublasLtMatmulAlgoGetHeuristic");
    if (found < 1)
      throw Error("cuBLASLt: no algorithm for the bf16 GEMM m " + std::to_string(m) + ", n " + std::to_string(n) + ", k " +
                  std::to_string(k) + ", batch " + std::to_string(g.batch));
  }
  ~Plan() {
    if (ld) lt().MatrixLayoutDestroy(ld);
    if (lb) lt().MatrixLayoutDestroy(lb);
    if (la) lt().MatrixLayoutDestroy(la);
    if (op) lt().MatmulDescDestroy(op);
    if (h) lt().Destroy(h);
  }
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;

  void run(const uint16_t* A, const uint16_t* B, void* D, Stream s, void* workspace = nullptr) {
    const float one = 1.0f, zero = 0.0f;
    // A null stream is plumb's default stream, the calling thread's (the CUDA code is built with
    // --default-stream per-thread); cuBLASLt itself would read 0 as the legacy stream, which cannot be captured.
    const cudaStream_t cs = detail::stream_of(s);  // a StreamScope's stream (cuda.streams), else the thread's
    void* ws = workspace ? workspace : shared_workspace(s ? 0 : detail::stream_lane());
    check(lt().Matmul(h, op, &one, B, la, A, lb, &zero, D, ld, D, ld, &heur.algo, ws, kWorkspace, cs),
          "cublasLtMatmul");
  }
};

// The largest power of two <= 256 dividing the address and the byte sizes of the leading dimension and batch stride.
int alignment(const void* p, int64_t ld_bytes, int64_t stride_bytes) {
  uint64_t v = reinterpret_cast<uintptr_t>(p) | uint64_t(ld_bytes) | uint64_t(stride_bytes) | 256u;
  return int(v & (~v + 1));
}

std::mutex plans_mu;  // gemm_bf16's plan cache and the counters below (tests)
int64_t plans_made = 0, calls = 0;

GemmDesc filled(GemmDesc g) {
  if (!g.lda) g.lda = g.k;
  if (!g.ldb) g.ldb = g.k;
  if (!g.ldd) g.ldd = g.n;
  return g;
}

}  // namespace

void gemm_bf16(const GemmDesc& g0, const uint16_t* A, const uint16_t* B, void* D, Stream s) {
  const GemmDesc g = filled(g0);
  if (g.m <= 0 || g.n <= 0 || g.k <= 0 || g.batch < 1) throw Error("gemm_bf16: empty problem");
  if (g.lda < g.k || g.ldb < g.k || g.ldd < g.n)
    throw Error("gemm_bf16: leading dimensions (" + std::to_string(g.lda) + ", " + std::to_string(g.ldb) + ", " + std::to_string(g.ldd) +
                ") below the row lengths (k " + std::to_string(g.k) + ", n " + std::to_string(g.n) + ")");
  // Plans are cached per shape for the whole process: creating one (handle, heuristic) costs far more than the decode
  // step's head GEMM, and nothing may be created inside a CUDA graph capture. Shared by the threads, because a step's
  // graph may be captured on a thread other than the one whose eager warm-up step made its plans (plumb serve's
  // requests run on its worker threads); a cache per thread made that capture create a plan (which CUDA 13's cuBLASLt
  // survived in session 86's probe, though nothing documents it). cuBLASLt's calls are
  // thread safe on one handle, and nothing of a plan changes once made (the stream and workspace come with each call).
  // Kept to the process's end, never destroyed: at exit the CUDA runtime may already be gone. (One device: the
  // backend runs on device 0.)
  const int ds = g.d_f32 ? 4 : 2;
  const std::array<int, 3> al = {alignment(A, g.lda * 2, g.a_stride * 2), alignment(B, g.ldb * 2, g.b_stride * 2),
                                 alignment(D, g.ldd * ds, g.d_stride * ds)};
  using Key = std::tuple<int, int, int, int64_t, int64_t, int64_t, int, int64_t, int64_t, int64_t, bool, std::array<int, 3>>;
  static auto* plans = new std::map<Key, std::unique_ptr<Plan>>;
  Plan* p = nullptr;
  {
    const std::lock_guard<std::mutex> lock(plans_mu);
    auto& slot = (*plans)[Key{g.m, g.n, g.k, g.lda, g.ldb, g.ldd, g.batch, g.a_stride, g.b_stride, g.d_stride, g.d_f32, al}];
    if (!slot) {
      slot = std::make_unique<Plan>(g, al);  // (a throwing constructor leaves the slot empty: tried again next time)
      ++plans_made;
    }
    p = slot.get();
    ++calls;
  }
  p->run(A, B, D, s, g.workspace);
}

int64_t gemm_plans_made() {
  const std::lock_guard<std::mutex> lock(plans_mu);
  return plans_made;
}
int64_t gemm_calls() {
  const std::lock_guard<std::mutex> lock(plans_mu);
  return calls;
}

void gemm_bf16(const uint16_t* A, const uint16_t* B, void* D, bool d_f32, int m, int n, int k, Stream s) {
  GemmDesc g;
  g.m = m, g.n = n, g.k = k, g.d_f32 = d_f32;
  gemm_bf16(g, A, B, D, s);
}

GemmRate measure_bf16_gemm(int m, int n, int k, int warmup, int iters, Stream s) {
  GemmRate r;
  r.m = m, r.n = n, r.k = k, r.iters = iters;
  try {
    DeviceBuffer a(size_t(m) * size_t(k) * 2), b(size_t(n) * size_t(k) * 2), dd(size_t(m) * size_t(n) * 2);
    d::fill(a.get(), size_t(m) * size_t(k), d::kFillBF16, 71, -1.0f, 1.0f, s);  // random data: zeros run faster
    d::fill(b.get(), size_t(n) * size_t(k), d::kFillBF16, 72, -1.0f, 1.0f, s);
    GemmDesc g;
    g.m = m, g.n = n, g.k = k, g.d_f32 = false;
    Plan p(filled(g), {256, 256, 256});
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
