// When do a PDL-launched kernel's blocks become resident after the kernel before it? Session 41 aligned hc_pre's
// per-block global-timer stamps with the kernel timeline: its grid is launched before the GEMV ahead of it ends, but
// its cluster's 16 blocks enter 1.4-3.3 us after that GEMV's end. One reading: the GEMV keeps two blocks of 256 threads
// x 120 registers per SM (61K of 64K registers) until its last tiles, so no block of hc_pre (256 x 128 registers)
// fits beside them, and a cluster needs 8 such SMs in one GPC. This probe times the dependent's first and last block
// entry and its PDL wait's return against the predecessor's last block exit, for dependents of several shapes (a
// cluster of 16 like hc_pre, with few or many registers, with 101 KB of shared memory, plain blocks) after
// predecessors that fill or leave room in the SMs' registers. Medians of 25 trials, in us after the predecessor's end.
// Then the same in CUDA graphs (session 42: a node that also joins a side stream loses its PDL edge), with the
// dependent's incoming edges as the capture made them (session 43: the join's edge is programmatic too, yet the node
// is launched only once both upstream kernels have completed) and a side branch that ends late, the dependent
// checking that its wait returned only after the branch's end was visible.
//   nvcc -O3 -std=c++17 -arch=sm_90a -o /tmp/pdlr bench/pdl_residency_probe.cu && /tmp/pdlr
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "probe_common.cuh"

__device__ unsigned long long g_pred_end, g_dep_first, g_dep_last, g_dep_wait, g_side_end, g_dep_seen;

// A side branch's kernel (as the forward's hc gates on their own stream): spins `ns` (0: done long before the
// predecessor ends; more than the predecessor's 20 us: a late branch), then stamps its end. kTrigger: it lets its
// dependents launch at its start, as the forward's kernels do in pdl_begin (whether a dependent joined to it is then
// scheduled before it ends).
template <bool kTrigger>
__global__ void side_kernel(float* sink, uint64_t ns) {
  if (kTrigger) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const uint64_t t0 = global_ns();
  while (global_ns() - t0 < ns) {
  }
  if (threadIdx.x == 0) sink[1000] = 1.f, atomicMax(&g_side_end, global_ns());
}

// Registers held: NR floats per thread kept live through a spin of `ns` nanoseconds (the predecessor), or through
// the dependent's body. The values reach memory only if *never (always 0) is set, so the compiler keeps them.
template <int NR>
__device__ __forceinline__ void hold(float (&r)[NR], uint64_t until, const int* never, float* sink) {
#pragma unroll
  for (int i = 0; i < NR; ++i) r[i] = float(threadIdx.x + i);
  while (global_ns() < until) {
#pragma unroll
    for (int i = 0; i < NR; ++i) r[i] = fmaf(r[i], 1.0001f, 0.5f);
  }
  if (*never) {
    float s = 0;
#pragma unroll
    for (int i = 0; i < NR; ++i) s += r[i];
    sink[threadIdx.x] = s;
  }
}

// The predecessor: as the forward's GEMVs, it waits on its own predecessor and lets its dependent launch at once
// (pdl_begin), then works (spins) for ns nanoseconds; the last block's exit time is kept.
template <int NR>
__global__ void __launch_bounds__(256) pred_kernel(uint64_t ns, const int* never, float* sink) {
  asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory");
  float r[NR];
  hold(r, global_ns() + ns, never, sink);
  __syncthreads();
  if (threadIdx.x == 0) atomicMax(&g_pred_end, global_ns());
}

// The dependent: its entry (first and last block), then its PDL wait's return (last block), then a short body.
template <int NR>
__global__ void dep_kernel(const int* never, float* sink) {
  extern __shared__ float dsm[];
  const uint64_t entry = global_ns();
  if (threadIdx.x == 0) atomicMin(&g_dep_first, entry), atomicMax(&g_dep_last, entry);
  asm volatile("griddepcontrol.wait;" ::: "memory");
  // What the wait returned to: its time, and the side branch's end stamp as this block sees it (0: not written yet).
  if (threadIdx.x == 0) atomicMax(&g_dep_wait, global_ns()), atomicMax(&g_dep_seen, *reinterpret_cast<volatile unsigned long long*>(&g_side_end));
  float r[NR];
  hold(r, global_ns() + 1000, never, sink);
  if (*never) dsm[threadIdx.x] = r[0];
}

struct Dep {
  const char* name;
  void (*kern)(const int*, float*);
  int cluster, blocks, threads;
  size_t smem;
};

int regs_of(const void* k) {
  cudaFuncAttributes fa;
  CK(cudaFuncGetAttributes(&fa, k));
  return fa.numRegs;
}

double med(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The dependent's first and last block entry and its wait's return, us after the predecessor's last block exit:
// medians of 25 runs of `launch` (after 2 warm-up runs) on stream s.
struct Medians {
  double first, last, wait;
  double side;  // the side branch's end (0 where none ran)
  int unseen;   // trials whose dependent passed its wait before the side branch's end was visible to it
};
template <class Launch>
Medians trials(cudaStream_t s, Launch launch) {
  std::vector<double> fe, le, wr, se;
  int unseen = 0;
  for (int t = 0; t < 27; ++t) {
    const unsigned long long zero = 0, big = ~0ull;
    CK(cudaMemcpyToSymbolAsync(g_side_end, &zero, 8, 0, cudaMemcpyHostToDevice, s));
    CK(cudaMemcpyToSymbolAsync(g_dep_seen, &zero, 8, 0, cudaMemcpyHostToDevice, s));
    CK(cudaMemcpyToSymbolAsync(g_pred_end, &zero, 8, 0, cudaMemcpyHostToDevice, s));
    CK(cudaMemcpyToSymbolAsync(g_dep_last, &zero, 8, 0, cudaMemcpyHostToDevice, s));
    CK(cudaMemcpyToSymbolAsync(g_dep_wait, &zero, 8, 0, cudaMemcpyHostToDevice, s));
    CK(cudaMemcpyToSymbolAsync(g_dep_first, &big, 8, 0, cudaMemcpyHostToDevice, s));
    launch();
    CK(cudaStreamSynchronize(s));
    unsigned long long pe, f, l, w, side, seen;
    CK(cudaMemcpyFromSymbol(&side, g_side_end, 8));
    CK(cudaMemcpyFromSymbol(&seen, g_dep_seen, 8));
    CK(cudaMemcpyFromSymbol(&pe, g_pred_end, 8));
    CK(cudaMemcpyFromSymbol(&f, g_dep_first, 8));
    CK(cudaMemcpyFromSymbol(&l, g_dep_last, 8));
    CK(cudaMemcpyFromSymbol(&w, g_dep_wait, 8));
    if (t < 2) continue;  // warm-up
    fe.push_back((double(f) - double(pe)) / 1e3), le.push_back((double(l) - double(pe)) / 1e3), wr.push_back((double(w) - double(pe)) / 1e3);
    se.push_back(side ? (double(side) - double(pe)) / 1e3 : 0.0);
    unseen += side != 0 && seen != side;
  }
  return {med(fe), med(le), med(wr), med(se), unseen};
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  int* never;
  float* sink;
  CK(cudaMalloc(&never, 4));
  CK(cudaMemset(never, 0, 4));
  CK(cudaMalloc(&sink, 1024 * 4));
  cudaStream_t s;
  CK(cudaStreamCreate(&s));

  // Predecessors: 2 blocks per SM of 256 threads with many registers (the GEMV before hc_pre) or few; and one block
  // per SM with many (room for a dependent block beside it).
  struct Pred {
    const char* name;
    void (*kern)(uint64_t, const int*, float*);
    int blocks;
  };
  const Pred preds[] = {{"2/SM x 256 thr, many regs", pred_kernel<112>, 2 * sms},
                        {"2/SM x 256 thr, few regs", pred_kernel<8>, 2 * sms},
                        {"1/SM x 256 thr, many regs", pred_kernel<112>, sms}};
  const Dep deps[] = {{"cluster 16 x 256 thr, many regs (hc_pre)", dep_kernel<112>, 16, 16, 256, 5 * 1024},
                      {"cluster 16 x 256 thr, many regs, 101 KB smem", dep_kernel<112>, 16, 16, 256, 101 * 1024},
                      {"cluster 16 x 256 thr, few regs", dep_kernel<8>, 16, 16, 256, 5 * 1024},
                      {"16 plain blocks x 256 thr, many regs", dep_kernel<112>, 1, 16, 256, 5 * 1024},
                      {"1 block x 32 thr, few regs (a one-warp top-k)", dep_kernel<8>, 1, 1, 32, 0}};
  CK(cudaFuncSetAttribute(dep_kernel<112>, cudaFuncAttributeMaxDynamicSharedMemorySize, 101 * 1024));
  CK(cudaFuncSetAttribute(dep_kernel<112>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  CK(cudaFuncSetAttribute(dep_kernel<8>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  std::printf("%d SMs; registers per thread: predecessor many %d, few %d; dependent many %d, few %d\n", sms,
              regs_of(reinterpret_cast<const void*>(pred_kernel<112>)), regs_of(reinterpret_cast<const void*>(pred_kernel<8>)),
              regs_of(reinterpret_cast<const void*>(dep_kernel<112>)), regs_of(reinterpret_cast<const void*>(dep_kernel<8>)));
  std::printf("us after the predecessor's last block exit (medians of 25; the predecessor works 20 us):\n");
  std::printf("  %-4s %-28s %-46s %9s %9s %9s\n", "pdl", "predecessor", "dependent", "1st entry", "last entry", "wait ret");
  // Each pair with PDL (the dependent launched early, waiting in griddepcontrol.wait) and without (stream order: the
  // dependent launches once the predecessor completes), the latter the baseline a launch without PDL would see.
  for (int pdl = 1; pdl >= 0; --pdl)
  for (const Pred& p : preds)
    for (const Dep& d : deps) {
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(unsigned(d.blocks)), cfg.blockDim = dim3(unsigned(d.threads)), cfg.dynamicSmemBytes = d.smem, cfg.stream = s;
      cudaLaunchAttribute at[2];
      int na = 0;
      at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization, at[na++].val.programmaticStreamSerializationAllowed = pdl;
      if (d.cluster > 1) {
        at[na].id = cudaLaunchAttributeClusterDimension;
        at[na].val.clusterDim.x = unsigned(d.cluster), at[na].val.clusterDim.y = 1, at[na++].val.clusterDim.z = 1;
        cudaLaunchConfig_t q = cfg;
        cudaLaunchAttribute qa = at[1];
        q.attrs = &qa, q.numAttrs = 1;
        int clusters = 0;
        if (cudaOccupancyMaxActiveClusters(&clusters, d.kern, &q) != cudaSuccess || clusters == 0) {
          (void)cudaGetLastError();
          std::printf("  %-4s %-28s %-46s not schedulable\n", pdl ? "pdl" : "-", p.name, d.name);
          continue;
        }
      }
      cfg.attrs = at, cfg.numAttrs = na;
      const Medians m = trials(s, [&] {
        p.kern<<<p.blocks, 256, 0, s>>>(20000, never, sink);
        CK(cudaGetLastError());
        CK(cudaLaunchKernelEx(&cfg, d.kern, static_cast<const int*>(never), sink));
      });
      std::printf("  %-4s %-28s %-46s %9.2f %9.2f %9.2f\n", pdl ? "pdl" : "-", p.name, d.name, m.first, m.last, m.wait);
    }

  // The same in a CUDA graph, as the forward's step runs: the dependent's edge from the predecessor is programmatic
  // (captured from a PDL launch), alone or with a second incoming edge from a side branch (a kernel on another
  // stream, joined by an event just before the dependent, or before the predecessor), and without PDL.
  std::printf("in a CUDA graph, after \"%s\" (us after its last block exit, medians of 25):\n", preds[2].name);
  std::printf("  %-44s %-46s %9s %9s %9s\n", "graph", "dependent", "1st entry", "last entry", "wait ret");
  cudaStream_t s2;
  CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  cudaEvent_t evf, evj;
  CK(cudaEventCreateWithFlags(&evf, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&evj, cudaEventDisableTiming));
  struct GCase {
    const char* name;
    // join: 0 no side branch, 1 joined just before the dependent, 2 joined before the predecessor, 3 forked between
    // the predecessor and the dependent (joined after the dependent), 4 forked before the predecessor (joined after).
    // side_ns: how long the side kernel works (25 us: it ends after the predecessor's 20), trigger: it lets its
    // dependents launch at its start.
    int pdl, join;
    uint64_t side_ns;
    bool trigger;
  };
  const GCase gcases[] = {{"PDL edge only", 1, 0, 0, false},
                          {"PDL edge + side branch joined before dep", 1, 1, 0, false},
                          {"PDL edge + side branch joined before pred", 1, 2, 0, false},
                          {"PDL edge + side branch forked before dep", 1, 3, 0, false},
                          {"PDL edge + side branch forked before pred", 1, 4, 0, false},
                          {"no PDL", 0, 0, 0, false},
                          {"no PDL + side branch joined before dep", 0, 1, 0, false},
                          {"PDL edge + join before dep, side late", 1, 1, 25000, false},
                          {"PDL + join, side late, triggers at start", 1, 1, 25000, true}};
  std::printf("  (side end: the side kernel's end; unseen: trials whose dependent passed its wait before seeing it, a\n"
              "   check that applies where the side branch joins before the dependent; edges in: the dependent's\n"
              "   incoming edges as captured, t<type: 0 ordinary, 1 programmatic>p<upstream port>)\n");
  for (const GCase& g : gcases)
    for (int di : {0, 3}) {
      const Dep& d = deps[di];
      const Pred& p = preds[2];
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(unsigned(d.blocks)), cfg.blockDim = dim3(unsigned(d.threads)), cfg.dynamicSmemBytes = d.smem, cfg.stream = s;
      cudaLaunchAttribute at[2];
      int na = 0;
      at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization, at[na++].val.programmaticStreamSerializationAllowed = g.pdl;
      if (d.cluster > 1) {
        at[na].id = cudaLaunchAttributeClusterDimension;
        at[na].val.clusterDim.x = unsigned(d.cluster), at[na].val.clusterDim.y = 1, at[na++].val.clusterDim.z = 1;
      }
      cfg.attrs = at, cfg.numAttrs = na;
      CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      auto fork = [&] {
        CK(cudaEventRecord(evf, s));
        CK(cudaStreamWaitEvent(s2, evf, 0));
        if (g.trigger) side_kernel<true><<<1, 32, 0, s2>>>(sink, g.side_ns);
        else side_kernel<false><<<1, 32, 0, s2>>>(sink, g.side_ns);
        CK(cudaEventRecord(evj, s2));
      };
      if (g.join == 1 || g.join == 2 || g.join == 4) fork();
      if (g.join == 2) CK(cudaStreamWaitEvent(s, evj, 0));
      p.kern<<<p.blocks, 256, 0, s>>>(20000, never, sink);
      if (g.join == 3) fork();
      if (g.join == 1) CK(cudaStreamWaitEvent(s, evj, 0));
      CK(cudaLaunchKernelEx(&cfg, d.kern, static_cast<const int*>(never), sink));
      // The dependent's node: the capture's one dependency right after its launch.
      cudaStreamCaptureStatus cst = cudaStreamCaptureStatusNone;
      const cudaGraphNode_t* cdeps = nullptr;
      size_t ncd = 0;
      CK(cudaStreamGetCaptureInfo(s, &cst, nullptr, nullptr, &cdeps, nullptr, &ncd));
      const cudaGraphNode_t dep_node = ncd == 1 ? cdeps[0] : nullptr;
      if (g.join >= 3) CK(cudaStreamWaitEvent(s, evj, 0));
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      CK(cudaStreamEndCapture(s, &graph));
      // The dependent's incoming edges as captured (type: 0 ordinary, 1 programmatic; the upstream port).
      std::string captured;
      if (dep_node) {
        size_t nd = 0;
        CK(cudaGraphNodeGetDependencies(dep_node, nullptr, nullptr, &nd));
        std::vector<cudaGraphNode_t> up(nd);
        std::vector<cudaGraphEdgeData> ed(nd);
        if (nd) CK(cudaGraphNodeGetDependencies(dep_node, up.data(), ed.data(), &nd));
        for (size_t i = 0; i < nd; ++i) captured += " t" + std::to_string(ed[i].type) + "p" + std::to_string(ed[i].from_port);
      }
      CK(cudaGraphInstantiate(&exec, graph, 0));
      const Medians m = trials(s, [&] { CK(cudaGraphLaunch(exec, s)); });
      std::printf("  %-44s %-46s %9.2f %9.2f %9.2f", g.name, d.name, m.first, m.last, m.wait);
      if (g.join) std::printf("  side end %6.2f unseen %d", m.side, m.unseen);
      std::printf("  edges in:%s", captured.c_str());
      std::printf("\n");
      CK(cudaGraphExecDestroy(exec));
      CK(cudaGraphDestroy(graph));
    }
  return 0;
}
