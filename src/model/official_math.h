// The official kernels' quantization constants, power-of-two scale rule and sparse attention's key layout, shared by
// the CPU emulation (model/numerics.cpp, attention.cpp) and the CUDA backend's official numerics (cuda/fwd_official.cu,
// attn_keys.cuh, fwd_attention.cu). Includes no plumb header but
// host_device.h, so nvcc compiles it too (__host__ __device__ there), like model/hc_math.h.
#pragma once
#include <cstdint>
#include <cstring>

#include "model/host_device.h"

namespace plumb::official_math {

constexpr float kFp8Max = 448.0f;              // E4M3's largest finite value
constexpr float kFp8AmaxFloor = 1e-4f;         // act_quant's floor on a block's amax
constexpr float kFp4Max = 6.0f;                // E2M1's largest value
constexpr float kFp4AmaxFloor = 6.0f * 0x1p-126f;  // the FP4 simulation's floor: 6 x the smallest normal
constexpr int kActBlock = 128;                 // FP8 activation quantization before a GEMM
constexpr int kKvBlock = 64;                   // FP8 simulation of the KV nope dims
constexpr int kFp4Block = 32;                  // FP4 simulation of the indexer's rotated rows
constexpr int kAttnBlock = 64;                 // sparse_attn's online softmax: keys per block of its index list

// The window part of sparse_attn's index list for a query of a chunk of n tokens starting at pos0 (model.py's
// get_window_topk_idxs): W slots in a decode, min(n, W) in the first prefill (pos0 = 0), slot j holding position
// max(0, p-W+1) + j, -1 (a hole) where that is past p. The official code has no later prefill chunk: it decodes those
// tokens one at a time, so a later chunk's queries take the decode layout.
PLUMB_HD inline int64_t window_slots(int64_t pos0, int64_t n, int64_t W) { return pos0 == 0 && n < W ? n : W; }

// 2^ceil(log2(amax * inv_max)), computed in fp32 on the bits, as the kernels do.
PLUMB_HD inline float pow2_scale(float amax, float inv_max) {
  const float t = amax * inv_max;
  uint32_t bits;
  std::memcpy(&bits, &t, 4);
  const int e = int((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0);
  const uint32_t out = uint32_t(e + 127) << 23;
  float s;
  std::memcpy(&s, &out, 4);
  return s;
}

}  // namespace plumb::official_math
