// ktrace: a CUPTI injection library that records every kernel's start and end on the GPU without serializing them
// (CUPTI's concurrent-kernel activity, the records nsys builds its timeline from; nsys itself is not on the device
// machine). Graph-launched kernels come as one record per kernel node, so a replayed decode step shows each kernel's
// real overlap with the other streams, which ncu (one kernel at a time) and `plumb bench --timeline` (op regions
// between event nodes) cannot show.
//
// Use: CUDA_INJECTION64_PATH=/path/libktrace.so PLUMB_KTRACE_OUT=k.csv <any CUDA program>. The CUDA driver loads the
// library at cuInit and calls InitializeInjection; the records are written at exit as CSV (one kernel per line, times
// in ns of the GPU's timer). bench/ktrace/ktrace_step.py cuts them into steps and prints the timeline of one.
// (The output path is an environment variable because the injection mechanism itself is one: the program under test
// is run unchanged.)
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cxxabi.h>
#include <mutex>
#include <string>
#include <vector>

namespace {

constexpr size_t kBufBytes = 8u << 20;

struct Rec {
  uint64_t start, end;
  uint32_t stream, graph;
  uint64_t node;
  int grid, block, cluster, regs;
  int smem;
  std::string name;
};
std::mutex mu;
std::vector<Rec> recs;
uint64_t dropped = 0;

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* s = nullptr;
  cuptiGetResultString(r, &s);
  std::fprintf(stderr, "ktrace: %s failed: %s\n", what, s ? s : "?");
}

std::string demangle(const char* n) {
  if (!n) return "?";
  int st = 0;
  char* d = abi::__cxa_demangle(n, nullptr, nullptr, &st);
  std::string out = st == 0 && d ? d : n;
  std::free(d);
  // "void f<...>(args)" -> "f<...>": the arguments say nothing the template does not.
  if (out.rfind("void ", 0) == 0) out = out.substr(5);
  for (const char* ns : {"(anonymous namespace)::", "plumb::cuda::detail::", "plumb::cuda::"})
    for (size_t at; (at = out.find(ns)) != std::string::npos;) out.erase(at, std::strlen(ns));
  int depth = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == '<') ++depth;
    if (out[i] == '>') --depth;
    if (out[i] == '(' && depth == 0) return out.substr(0, i);
  }
  return out;
}

void CUPTIAPI buffer_requested(uint8_t** buf, size_t* size, size_t* max_records) {
  *buf = static_cast<uint8_t*>(std::aligned_alloc(8, kBufBytes));
  *size = kBufBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buf, size_t, size_t valid) {
  CUpti_Activity* a = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  while (cuptiActivityGetNextRecord(buf, valid, &a) == CUPTI_SUCCESS) {
    if (a->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && a->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(a);
    recs.push_back(Rec{k->start, k->end, k->streamId, k->graphId, k->graphNodeId, k->gridX * k->gridY * k->gridZ,
                       k->blockX * k->blockY * k->blockZ, int(k->clusterX * k->clusterY * k->clusterZ), k->registersPerThread,
                       k->staticSharedMemory + k->dynamicSharedMemory, demangle(k->name)});
  }
  size_t d = 0;
  cuptiActivityGetNumDroppedRecords(nullptr, 0, &d);
  dropped += d;
  std::free(buf);
}

void at_exit() {
  cuptiActivityFlushAll(1);
  const char* path = std::getenv("PLUMB_KTRACE_OUT");
  FILE* f = std::fopen(path && *path ? path : "ktrace.csv", "w");
  if (!f) {
    std::fprintf(stderr, "ktrace: cannot write %s\n", path ? path : "ktrace.csv");
    return;
  }
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(f, "start_ns,end_ns,stream,graph,node,grid,block,cluster,regs,smem,name\n");
  for (const Rec& r : recs) {
    std::string n = r.name;
    for (char& c : n)
      if (c == ',') c = ';';
    std::fprintf(f, "%llu,%llu,%u,%u,%llu,%d,%d,%d,%d,%d,%s\n", (unsigned long long)r.start, (unsigned long long)r.end, r.stream,
                 r.graph, (unsigned long long)r.node, r.grid, r.block, r.cluster, r.regs, r.smem, n.c_str());
  }
  std::fclose(f);
  std::fprintf(stderr, "ktrace: %zu kernels written, %llu records dropped\n", recs.size(), (unsigned long long)dropped);
}

}  // namespace

extern "C" int InitializeInjection(void) {
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable(CONCURRENT_KERNEL)");
  std::atexit(at_exit);
  return 1;
}
