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
// The position of token t of the launch: a session's chunk from *a.pos, or (ring_rows: forward_batch's rows, each
// one token of its own session) its own a.pos[t].
__device__ __forceinline__ int64_t token_pos(const AttendArgs& a, int64_t t) { return a.ring_rows ? a.pos[t] : *a.pos + t; }

template <bool kOfficial = true>
struct KeyListT {
  const AttendArgs& a;
  int t;
  int type;                                    // a.type, or (type_rows) the row's own
  int64_t pos0, wstart, nwin, wslots, count;  // count: window slots + entry slots; pos0: the first of chunk's positions
  const float* ring, *chunk, *entries;         // the token's session's (chunk: its row of chunk_kv at pos0)
  __device__ KeyListT(const AttendArgs& args, int tok) : a(args), t(tok) {
    const int64_t p = token_pos(a, t);
    type = a.type_rows ? int(a.type_rows[t]) : a.type;
    pos0 = a.ring_rows ? p : *a.pos;
    ring = a.ring_rows ? a.ring_rows[t] : a.ring;
    entries = !a.ring_rows ? a.entries : a.entries_rows ? a.entries_rows[t] : nullptr;  // (sliding layers: none)
    chunk = a.chunk_kv + (a.ring_rows ? int64_t(t) * a.Dh : 0);
    wstart = max(int64_t(0), p - a.window + 1), nwin = p - wstart + 1;
    wslots = kOfficial && a.official ? official_math::window_slots(pos0, a.n, a.window) : nwin;
    count = wslots + (type == 2 ? min((p + 1) / a.rate, a.ne) : type == 1 ? int64_t(a.ksel) : 0);
  }
  // The key/value row of slot j, or null for a hole.
  __device__ const float* row(int64_t j) const {
    if (j < wslots) {
      if (j >= nwin) return nullptr;
      const int64_t q = wstart + j;
      return q < pos0 ? ring + (q % a.window) * a.Dh : chunk + (q - pos0) * a.Dh;
    }
    const int64_t e = type == 1 ? a.sel[int64_t(t) * a.ksel + (j - wslots)] : j - wslots;
    return e < 0 ? nullptr : entries + e * a.Dh;
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
