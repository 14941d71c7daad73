// The attention's key list, shared by the unsplit attention (fwd_attention.cu) and its split-K patch
// (fwd_attn_splitk.cu), so both see the same keys in the same order; and the twin's logit (key_logit).
#pragma once
#include "cuda/fwd_common.cuh"
#include "model/official_math.h"

namespace plumb::cuda::detail {

// The keys of query t (position p): j < nwin are the window positions max(0, p-W+1) .. p in ascending order
// (earlier ones from the ring, this chunk's from chunk_kv); then HCA: the visible entries in order; CSA: the ksel
// selection slots in order, where a slot of -1 is a hole (no key: logit -inf, probability exactly 0). Holes stay
// in place instead of being compacted, so a graph's wider selection (-1 slots at the end) sums the same values in
// the same order as an eager launch. numerics.official: the window takes wslots slots as the official index list
// lays it out (official_math::window_slots, as model/attention.cpp), slots nwin .. wslots-1 holes; they decide which
// keys share a block while the window is not yet full. kOfficial false: a kernel that never runs the official
// numerics (the split-K attention, whose launch refuses them) compiles without that layout.
template <bool kOfficial = true>
struct KeyListT {
  const AttendArgs& a;
  int t;
  int64_t pos0, wstart, nwin, wslots, count;  // count: window slots + entry slots
  __device__ KeyListT(const AttendArgs& args, int tok) : a(args), t(tok) {
    pos0 = *a.pos;
    const int64_t p = pos0 + t;
    wstart = max(int64_t(0), p - a.window + 1), nwin = p - wstart + 1;
    wslots = kOfficial && a.official ? official_math::window_slots(pos0, a.n, a.window) : nwin;
    count = wslots + (a.type == 2 ? min((p + 1) / a.rate, a.ne) : a.type == 1 ? int64_t(a.ksel) : 0);
  }
  // The key/value row of slot j, or null for a hole.
  __device__ const float* row(int64_t j) const {
    if (j < wslots) {
      if (j >= nwin) return nullptr;
      const int64_t q = wstart + j;
      return q < pos0 ? a.ring + (q % a.window) * a.Dh : a.chunk_kv + (q - pos0) * a.Dh;
    }
    const int64_t e = a.type == 1 ? a.sel[int64_t(t) * a.ksel + (j - wslots)] : j - wslots;
    return e < 0 ? nullptr : a.entries + e * a.Dh;
  }
};
using KeyList = KeyListT<true>;

// The logit of one key for one head: the fp64 dot product q . k over Dh (lanes strided, warp-reduced), times
// the scale, as the reference computes it; every lane of the warp gets it.
__device__ __forceinline__ float key_logit(const float* q, const float* k, int64_t Dh, float scale) {
  double dot = 0;
#pragma unroll 4
  for (int64_t i = threadIdx.x & 31; i < Dh; i += 32) dot += double(q[i]) * k[i];
  return float(warp_sum(dot)) * scale;
}

}  // namespace plumb::cuda::detail
