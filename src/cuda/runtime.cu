// Device management, memory, events and the bench's device-side fills and bandwidth probes.
#include <atomic>

#include "cuda/common.cuh"
#include "cuda/kernels.h"
#include "cuda/launch.cuh"

namespace plumb::cuda::detail {

bool probe(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = std::string("no usable CUDA driver or device (") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e) + ")";
    cudaGetLastError();
    return false;
  }
  if (n == 0) {
    if (why) *why = "no CUDA device";
    return false;
  }
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) {
    cudaGetLastError();
    if (why) *why = "cannot read the properties of CUDA device 0";
    return false;
  }
  if (p.major != 9) {
    if (why)
      *why = std::string("device 0 (") + p.name + ") has compute capability " + std::to_string(p.major) + "." +
             std::to_string(p.minor) + "; this build has sm_90a code only";
    return false;
  }
  return true;
}

Info info() {
  Info r;
  cudaDeviceProp p{};
  PLUMB_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
  std::snprintf(r.name, sizeof r.name, "%s", p.name);
  r.cc_major = p.major, r.cc_minor = p.minor, r.sm_count = p.multiProcessorCount;
  r.l2_bytes = size_t(p.l2CacheSize), r.mem_bytes = p.totalGlobalMem;
  PLUMB_CUDA_CHECK(cudaDriverGetVersion(&r.driver));
  PLUMB_CUDA_CHECK(cudaRuntimeGetVersion(&r.runtime));
#ifdef PLUMB_CUDA_CHECK_ONLY
  r.check_only = true;
#endif
  return r;
}

int sm_count() {
  static int cache[16] = {};
  int dev = 0;
  PLUMB_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= 16) throw_arg("sm_count: device ordinal out of range");
  if (!cache[dev]) PLUMB_CUDA_CHECK(cudaDeviceGetAttribute(&cache[dev], cudaDevAttrMultiProcessorCount, dev));
  return cache[dev];
}

namespace {
std::atomic<int64_t> g_alloc_budget{-1}, g_alloc_counted{0};
}  // namespace

void set_alloc_budget_for_testing(int64_t bytes) {
  g_alloc_counted = 0;
  g_alloc_budget = bytes;
}
int64_t allocated_under_budget() { return g_alloc_counted; }

void* dmalloc(size_t bytes) {
  void* p = nullptr;
  if (!bytes) return p;
  if (const int64_t budget = g_alloc_budget; budget >= 0) {
    const int64_t used = g_alloc_counted.fetch_add(int64_t(bytes)) + int64_t(bytes);
    if (used > budget) {
      g_alloc_counted -= int64_t(bytes);
      char buf[256];
      std::snprintf(buf, sizeof buf, "the GPU is out of memory: %.3f GB more asked for beyond a test's budget of %.3f GB",
                    double(bytes) / 1e9, double(budget) / 1e9);
      throw std::runtime_error(buf);
    }
  }
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess && g_alloc_budget >= 0) g_alloc_counted -= int64_t(bytes);  // (counted above, not handed out)
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // (not sticky: clear it, so that the caller's next CUDA call does not report it again)
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    char buf[256];
    std::snprintf(buf, sizeof buf, "the GPU is out of memory: %.3f GB more asked for with %.3f GB free of %.3f GB",
                  double(bytes) / 1e9, double(free_b) / 1e9, double(total_b) / 1e9);
    throw std::runtime_error(buf);
  }
  PLUMB_CUDA_CHECK(e);
  return p;
}
void mem_info(size_t* free_bytes, size_t* total_bytes) { PLUMB_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes)); }
void dfree(void* p) noexcept {
  if (p) cudaFree(p);
}
void h2d(void* dst, const void* src, size_t bytes) {
  if (bytes) PLUMB_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}
// (Session 86 staged downloads of 4 MB or more through two pinned 8 MB buffers, the host copying one out while the
// device filled the other: on an H100 the 128 sessions' 66 MB of logits took longer than this plain copy (a step 47.3
// -> 55.3 ms, bench/results/h100-session86/), the driver's own staging being the better one. Dropped.)
void d2h(void* dst, const void* src, size_t bytes) {
  if (bytes) PLUMB_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}
void* hmalloc_pinned(size_t bytes) {
  void* p = nullptr;
  PLUMB_CUDA_CHECK(cudaMallocHost(&p, bytes));
  return p;
}
void hfree_pinned(void* p) noexcept {
  if (p) cudaFreeHost(p);
}
void* hmalloc_mapped(size_t bytes) {
  void* p = nullptr;
  if (!bytes) return p;
  const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // (not sticky)
    char buf[160];
    std::snprintf(buf, sizeof buf, "pinning %.3f GB of host memory failed (the host is out of memory or limits locked pages)",
                  double(bytes) / 1e9);
    throw std::runtime_error(buf);
  }
  PLUMB_CUDA_CHECK(e);
  // Unified addressing (every 64-bit Hopper process): the device sees the allocation at its host address, which the
  // buffers hand to kernels as they do device pointers.
  void* dp = nullptr;
  const cudaError_t de = cudaHostGetDevicePointer(&dp, p, 0);
  if (de != cudaSuccess || dp != p) {
    cudaFreeHost(p);
    if (de != cudaSuccess) PLUMB_CUDA_CHECK(de);
    throw std::runtime_error("mapped host memory has another address on the device (no unified addressing)");
  }
  return p;
}
void h2d_async(void* dst, const void* src, size_t bytes, Stream s) {
  if (bytes) PLUMB_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_of(s)));
}
void event_sync(void* e) { PLUMB_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(e))); }
void dmemset(void* p, int value, size_t bytes) {
  if (bytes) PLUMB_CUDA_CHECK(cudaMemset(p, value, bytes));
}
void dsync() { PLUMB_CUDA_CHECK(cudaDeviceSynchronize()); }
void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw_cuda(e, what, __FILE__, __LINE__);
}

void* event_create() {
  cudaEvent_t e;
  PLUMB_CUDA_CHECK(cudaEventCreate(&e));
  return e;
}
void event_destroy(void* e) noexcept {
  if (e) cudaEventDestroy(static_cast<cudaEvent_t>(e));
}
void event_record(void* e, Stream s) { PLUMB_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(e), s)); }
void event_record_node(void* e, Stream s) {
  const cudaStream_t cs = stream_of(s);
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  PLUMB_CUDA_CHECK(cudaStreamIsCapturing(cs, &st));
  // (The external flag only under capture: outside one the runtime refuses it.)
  PLUMB_CUDA_CHECK(cudaEventRecordWithFlags(static_cast<cudaEvent_t>(e), cs,
                                            st == cudaStreamCaptureStatusActive ? cudaEventRecordExternal : cudaEventRecordDefault));
}
float event_elapsed_ms(void* start, void* stop) {
  PLUMB_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(stop)));
  float ms = 0;
  PLUMB_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(stop)));
  return ms;
}

namespace {
thread_local Stream t_stream = nullptr;  // the StreamScope's stream (cuda.streams), else null
thread_local int t_lane = 0;             // its lane (see stream_lane)
}  // namespace
Stream stream_of(Stream s) { return s ? s : t_stream ? t_stream : cudaStreamPerThread; }
int stream_lane() { return t_lane; }
StreamScope::StreamScope(Stream s, int lane) : prev(t_stream), prev_lane(t_lane) {
  if (s) t_stream = s, t_lane = lane;
}
StreamScope::~StreamScope() { t_stream = prev, t_lane = prev_lane; }
void* event_create_sync() {
  cudaEvent_t e;
  PLUMB_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}
void branch_mark(Stream side, void* ev) {
  if (side) PLUMB_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(ev), stream_of(nullptr)));
}
void branch_wait(Stream side, void* ev) {
  if (side) PLUMB_CUDA_CHECK(cudaStreamWaitEvent(side, static_cast<cudaEvent_t>(ev), 0));
}
void branch_fork(Stream side, void* ev) { branch_mark(side, ev), branch_wait(side, ev); }
void branch_await(Stream side, void* ev) {
  if (side) PLUMB_CUDA_CHECK(cudaStreamWaitEvent(stream_of(nullptr), static_cast<cudaEvent_t>(ev), 0));
}
void branch_join(Stream side, void* ev) {
  if (!side) return;
  PLUMB_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(ev), side));
  PLUMB_CUDA_CHECK(cudaStreamWaitEvent(stream_of(nullptr), static_cast<cudaEvent_t>(ev), 0));
}

namespace {
// cuda.branch_flags: the branch's previous kernel complete and its writes visible (the PDL wait), then the epoch
// into the slot with release semantics, which a consumer's acquire load (branch_flags_wait) pairs with.
__global__ void branch_signal_kernel(unsigned* sync, int slot) {
  pdl_begin();
  const unsigned epoch = *reinterpret_cast<const volatile unsigned*>(sync);
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(sync + slot), "r"(epoch) : "memory");
}
__global__ void delay_kernel(uint64_t ns) { wait_ns(ns); }
}  // namespace

void branch_signal(Stream side, unsigned* sync, int slot) {
  launch("branch_signal", branch_signal_kernel, dim3(1), dim3(1), 0, side, sync, slot);
}
bool branch_wait_fits(int64_t blocks) { return blocks > 0 && 2 * blocks <= sm_count(); }
void check_branch_wait(const BranchWait& w, int64_t blocks, const char* who) {
  if (w.sync && !branch_wait_fits(blocks))
    throw_arg(std::string(who) + ": " + std::to_string(blocks) +
              " blocks are too many to wait in-kernel for side branches (branch_wait_fits): join them instead");
}
void device_delay(Stream s, uint64_t ns) {
  delay_kernel<<<1, 1, 0, stream_of(s)>>>(ns);
  check_launch("device_delay");
}

namespace {
thread_local bool t_switch[5] = {};  // ThreadSwitch: kPdl, kSkipWeights, kEvictFirst, kPdlHcAttn, kLinearEarly
}  // namespace
bool thread_switch(ThreadSwitch which) { return t_switch[int(which)]; }
template <ThreadSwitch W>
ThreadSwitchScope<W>::ThreadSwitchScope(bool on) : prev(t_switch[int(W)]) {
  t_switch[int(W)] = on;
}
template <ThreadSwitch W>
ThreadSwitchScope<W>::~ThreadSwitchScope() {
  t_switch[int(W)] = prev;
}
template struct ThreadSwitchScope<ThreadSwitch::kPdl>;
template struct ThreadSwitchScope<ThreadSwitch::kSkipWeights>;
template struct ThreadSwitchScope<ThreadSwitch::kEvictFirst>;
template struct ThreadSwitchScope<ThreadSwitch::kPdlHcAttn>;
template struct ThreadSwitchScope<ThreadSwitch::kLinearEarly>;

Stream stream_create() {
  cudaStream_t s;
  PLUMB_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}
void stream_destroy(Stream s) noexcept {
  if (s) cudaStreamDestroy(s);
}
namespace {
cudaStream_t capture_stream(Stream s) { return s ? s : cudaStreamPerThread; }  // never the legacy stream
}  // namespace
// Thread-local mode: an unsafe call from this thread during the capture (an allocation, a synchronous copy)
// fails the capture instead of silently leaving it out of the graph.
void capture_begin(Stream s) { PLUMB_CUDA_CHECK(cudaStreamBeginCapture(capture_stream(s), cudaStreamCaptureModeThreadLocal)); }
void* capture_end_instantiate(Stream s) {
  cudaGraph_t g;
  PLUMB_CUDA_CHECK(cudaStreamEndCapture(capture_stream(s), &g));
  cudaGraphExec_t e;
  const cudaError_t err = cudaGraphInstantiate(&e, g, 0);
  cudaGraphDestroy(g);
  PLUMB_CUDA_CHECK(err);
  return e;
}
void capture_abort(Stream s) noexcept {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(capture_stream(s), &st) == cudaSuccess && st != cudaStreamCaptureStatusNone) {
    cudaGraph_t g = nullptr;
    if (cudaStreamEndCapture(capture_stream(s), &g) == cudaSuccess && g) cudaGraphDestroy(g);
  }
  (void)cudaGetLastError();  // the capture's error is not the next launch's
}
void graph_launch(void* exec, Stream s) { PLUMB_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec), capture_stream(s))); }
void graph_destroy(void* exec) noexcept {
  if (exec) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec));
}

namespace {

__device__ __forceinline__ uint64_t mix64(uint64_t x) {  // splitmix64 finalizer
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
__device__ __forceinline__ float unit(uint64_t h) { return float(h >> 40) * (1.0f / 16777216.0f); }  // [0, 1)

__global__ void fill_kernel(void* p, size_t count, int kind, uint64_t seed, float lo, float hi) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t h = mix64(seed * 0x100000001B3ull ^ i);
    switch (kind) {
      case kFillBytes: static_cast<uint8_t*>(p)[i] = uint8_t(h); break;
      case kFillE4M3: {
        uint8_t b = uint8_t(h);
        if ((b & 0x7F) == 0x7F) b = uint8_t((b & 0x80) | 0x7E);  // no NaN codes
        static_cast<uint8_t*>(p)[i] = b;
        break;
      }
      case kFillE8M0: {
        const int l = int(lo), span = int(hi) - l + 1;
        static_cast<uint8_t*>(p)[i] = uint8_t(l + int(h % uint64_t(span)));
        break;
      }
      case kFillBF16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(lo + (hi - lo) * unit(h)); break;
      case kFillF32: static_cast<float*>(p)[i] = lo + (hi - lo) * unit(h); break;
      case kFillF16: static_cast<__half*>(p)[i] = __float2half(lo + (hi - lo) * unit(h)); break;
    }
  }
}

__global__ void read_kernel(const uint4* __restrict__ p, size_t n16, unsigned* sink) {
  const uint32_t acc = xor_stream(p, n16, size_t(blockIdx.x) * blockDim.x + threadIdx.x, size_t(gridDim.x) * blockDim.x);
  if (acc == 0x12345678u) *sink = acc;  // practically never: keeps the loads alive
}

int grid_for(size_t work, int threads) {
  const size_t want = (work + threads - 1) / threads;
  return int(std::min<size_t>(want, size_t(sm_count()) * 16));
}

}  // namespace

void fill(void* p, size_t count, int kind, uint64_t seed, float lo, float hi, Stream s) {
  if (!count) return;
  fill_kernel<<<grid_for(count, 256), 256, 0, s>>>(p, count, kind, seed, lo, hi);
  check_launch("fill_kernel");
}

void read_stream(const void* p, size_t bytes, unsigned* sink, Stream s) {
  if (bytes % 16) throw_arg("read_stream: bytes must be a multiple of 16");
  read_kernel<<<grid_for(bytes / 16, 512), 512, 0, s>>>(static_cast<const uint4*>(p), bytes / 16, sink);
  check_launch("read_kernel");
}

void copy_d2d(void* dst, const void* src, size_t bytes, Stream s) {
  PLUMB_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
}

}  // namespace plumb::cuda::detail
