// Data-parallel loops for the reference backend: [0, n) split into contiguous ranges run by a fixed pool of
// threads. Each index runs exactly the code a serial loop would (callers write disjoint outputs and keep every
// reduction inside one index), so the results are the same bits for any thread count: threads change speed only.
#pragma once
#include <cstdint>
#include <functional>

namespace plumb {

// Threads for parallel_for: 0 = the machine's cores (std::thread::hardware_concurrency, at most 64), 1 = serial.
// Set once at start-up (`plumb --threads N`); a later call takes effect from the next parallel_for.
void set_threads(int n);
int threads();

// Runs fn(begin, end) over a partition of [0, n) and returns when every range is done; an exception thrown by a
// range is rethrown here (the first one). Runs fn(0, n) on the calling thread when one thread is set, n < 2,
// `work` (a rough count of the loop's multiply-adds) is below the minimum (default 2^18: the hand-off costs a few
// microseconds), or the pool is already running a loop (a nested or concurrent call).
void parallel_for(int64_t n, double work, const std::function<void(int64_t, int64_t)>& fn);

// The least `work` worth the pool (tests set 0 so that tiny models take the threaded path too).
void set_parallel_min_work(double work);

}  // namespace plumb
