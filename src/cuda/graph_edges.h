// cuda.pdl_joins: a captured graph's joins into PDL-launched kernels made programmatic. Host code only, header-only
// so that the standalone probe (bench/pdl_residency_probe.cu) runs the same edit as the forward's capture.
//
// Why: a kernel launched with PDL after another on its stream is captured with a programmatic edge from it, so its
// blocks are scheduled while that kernel runs and its griddepcontrol.wait returns ~0.5 us after it ends. A node that
// also joins a side stream (a second, ordinary incoming edge) loses that: its blocks enter ~2 us after the kernel
// before it ends (session 42's probe), and a V4 decode layer has three such joins on its critical path (both hc_pre
// launches, the split-K attention). Made programmatic too, the join lets the node be scheduled once both upstream
// kernels have let their dependents launch; its griddepcontrol.wait then waits for all of its programmatic upstream
// kernels to complete with their writes visible (PTX: "all prerequisite grids"), which is what the join guaranteed.
// Safe for the kernels launched through launch.cuh with PDL: each waits before it touches memory another kernel
// writes, and reads nothing of a side branch before that wait. The graph's other edges are left as captured.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <vector>

namespace plumb::cuda::detail {

struct JoinEdges {
  int converted = 0;               // ordinary kernel -> kernel edges made programmatic
  int kept = 0;                    // ordinary edges into PDL nodes left as they were (their source is not a kernel)
  std::vector<std::string> nodes;  // the kernels that gained programmatic joins, one entry per edge (function names)
};

// During a capture of `s`, the node the stream's next work would depend on: right after a launch, that launch's
// node (null when `s` is not capturing or depends on several nodes).
inline cudaError_t last_captured_node(cudaStream_t s, cudaGraphNode_t* node) {
  *node = nullptr;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  const cudaGraphNode_t* deps = nullptr;
  size_t nd = 0;
  const cudaError_t e = cudaStreamGetCaptureInfo(s, &st, nullptr, nullptr, &deps, nullptr, &nd);
  if (e == cudaSuccess && st == cudaStreamCaptureStatusActive && nd == 1) *node = deps[0];
  return e;
}

// Every ordinary edge from a kernel node into one of `pdl_nodes` (kernel nodes launched with PDL, noted during the
// capture: whether the capture gives such a node's edges the programmatic type when it also joins another stream is
// the driver's choice) becomes a programmatic edge from the upstream kernel's programmatic port. Returns the first
// failing call's error.
inline cudaError_t programmatic_joins(cudaGraph_t g, const std::vector<cudaGraphNode_t>& pdl_nodes, JoinEdges* out) {
  JoinEdges r;
  size_t n = 0;
  cudaError_t e = cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &n);
  if (e != cudaSuccess) return e;
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  if (n > 0 && (e = cudaGraphGetEdges(g, from.data(), to.data(), data.data(), &n)) != cudaSuccess) return e;
  std::vector<cudaGraphNode_t> cf, ct;
  std::vector<cudaGraphEdgeData> cd;
  for (size_t i = 0; i < n; ++i) {
    if (data[i].type != cudaGraphDependencyTypeDefault || data[i].from_port != 0 || data[i].to_port != 0) continue;
    bool pdl = false;
    for (cudaGraphNode_t p : pdl_nodes) pdl = pdl || p == to[i];
    if (!pdl) continue;
    cudaGraphNodeType t = cudaGraphNodeTypeEmpty;
    if ((e = cudaGraphNodeGetType(from[i], &t)) != cudaSuccess) return e;
    if (t != cudaGraphNodeTypeKernel) {
      ++r.kept;
      continue;
    }
    cf.push_back(from[i]), ct.push_back(to[i]), cd.push_back(data[i]);
    cudaKernelNodeParams p = {};
    const char* name = nullptr;
    if (cudaGraphKernelNodeGetParams(to[i], &p) == cudaSuccess && cudaFuncGetName(&name, p.func) == cudaSuccess && name)
      r.nodes.emplace_back(name);
    else
      r.nodes.emplace_back("?"), (void)cudaGetLastError();
  }
  if (!cf.empty()) {
    if ((e = cudaGraphRemoveDependencies(g, cf.data(), ct.data(), cd.data(), cf.size())) != cudaSuccess) return e;
    for (cudaGraphEdgeData& d : cd) d.type = cudaGraphDependencyTypeProgrammatic, d.from_port = cudaGraphKernelNodePortProgrammatic;
    if ((e = cudaGraphAddDependencies(g, cf.data(), ct.data(), cd.data(), cf.size())) != cudaSuccess) return e;
  }
  r.converted = int(cf.size());
  if (out) *out = std::move(r);
  return cudaSuccess;
}

}  // namespace plumb::cuda::detail
