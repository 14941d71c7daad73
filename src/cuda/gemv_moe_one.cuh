// The routed experts of a decode step in one launch (cuda.moe_one_launch): gate/up + SwiGLU and down as work items
// of one grid, the same per-tile code (gemv_block) and so the same bits as moe_gate_up then moe_down at <= 8 slots.
// Included by gemv.cu (its anonymous namespace: gemv_block, BlockAt).
//
// Why: at one token gate/up (768 blocks) and down (1536) are two launches, each with its own ramp and tail, and
// down's blocks cannot start streaming before gate/up's last block ends. Here every block takes the next item from a
// counter: all gate/up tiles first (slot by slot), then down's, so down's weight stream starts on the SMs that
// gate/up's early tiles leave, while its later tiles still run.
//
// Items: slot s's gate/up tile x (s * tiles + x), then slot s's down tile pair x (down's per-tile split at <= 8 slots
// is 2 warps per tile: a 4-warp block takes two adjacent tiles, each on 2 warps, gemv_block's NG = 2). A down item
// requests its first weights, then each warp waits (XReady) until every gate/up tile of the slot that serves its
// expert has stored h (a per-slot counter each such block raises after its stores and a fence). Items are taken in
// order, so a down item waits only on items already taken by running blocks: no deadlock, whatever the residency.
// The last block to finish resets the counters for the next launch. The grid is one block per item, or fewer blocks
// that each loop over items (launch_moe_one's `blocks`: the forward's takes what is resident at once, so that every
// block starts early and lets the next kernel launch under PDL; with one block per item the blocks of a second wave
// start, and let it launch, only as the first wave ends).
//
// Counters (moe_one_counters() of them, zero before the first launch): [0] the next item, [1] blocks finished,
// [2 + s] slot s's gate/up tiles stored.

namespace moe1 {

constexpr int kWarps = 4;  // gate/up's per-tile split at <= 8 slots (4 warps, <= 85 registers), down's two tiles
constexpr int kSlots = 8;  // the per-tile split above is the default's at <= 8 slots only

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Down's wait for h: lane 0 of each warp until the slot's gate/up tiles are all stored (acquire), then the warp.
struct XReady {
  const unsigned* done;
  unsigned tiles;
  __device__ void operator()(int slot) const {
    if ((threadIdx.x & 31) == 0)
      while (ld_acquire(done + slot) < tiles) __nanosleep(64);
    __syncwarp();
  }
};

__global__ void __launch_bounds__(kWarps * 32, 6) moe_one_kernel(const GemvArgs gu, const GemvArgs dn, unsigned* ctr) {
  __shared__ unsigned item_s;
  const int slots = gu.n * gu.topk, gu_tiles = int(gu.rows / 16), dn_pairs = int(dn.rows / 32);
  const int gu_items = slots * gu_tiles, items = gu_items + slots * dn_pairs;
  unsigned* done = ctr + 2;
  // Under PDL the counters are taken only after the previous kernel has completed: launched after itself (the
  // bench's back-to-back launches), this launch's blocks start once the previous one's have all let it, and would
  // otherwise take that launch's remaining items (session 50: the bench hung so). Gate/up reads the routing after
  // this wait anyway.
  if (gu.pdl > 0) pdl_wait();
  // A grid of fewer blocks than items (launch_moe_one's `blocks`) loops: each block takes items until none is left.
  for (;;) {
    if (threadIdx.x == 0) item_s = atomicAdd(ctr, 1u);
    __syncthreads();
    const int item = int(item_s);
    if (item >= items) break;
    if (item < gu_items) {
      const int slot = item / gu_tiles, x = item % gu_tiles;
      // gemv_block ends with a barrier after warp 0's stores of h: thread 0's fence then publishes them (cumulative).
      if (gemv_block<kFp4, 2, kSwiglu, kMoe, __half, 3, 2, 1, false>(gu, BlockAt{x, slot, 0, gu_tiles, 1}) && threadIdx.x == 0) {
        __threadfence();
        atomicAdd(done + slot, 1u);
      }
    } else {
      const int i = item - gu_items, slot = i / dn_pairs, x = i % dn_pairs;
      gemv_block<kFp4, 1, kStore, kMoe, float, 3, 2, 1, false, 2>(dn, BlockAt{x, slot, 0, dn_pairs, 1},
                                                                 XReady{done, unsigned(gu_tiles)});
    }
    __syncthreads();  // (the block's shared state, item_s included, is read before the next item writes it)
  }
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(ctr + 1, 1u) + 1 == gridDim.x)  // every block has taken its last item and finished
      for (int c = 0; c < 2 + slots; ++c) ctr[c] = 0u;
  }
}

}  // namespace moe1
