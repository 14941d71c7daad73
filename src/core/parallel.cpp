// The reference backend's thread pool (core/parallel.h): workers started on first use, woken per loop by a
// generation counter; ranges handed out by an atomic counter, the caller taking ranges too.
#include "core/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace plumb {

namespace {

int hardware_threads() { return std::clamp(int(std::thread::hardware_concurrency()), 1, 64); }

std::atomic<int> g_threads{0};  // 0: hardware_threads()
std::atomic<double> g_min_work{double(1 << 18)};

class Pool {
 public:
  ~Pool() {
    {
      std::lock_guard<std::mutex> l(m_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }

  // False when another loop holds the pool (the caller then runs serially).
  bool run(int nthreads, int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    while (int(workers_.size()) < nthreads - 1) workers_.emplace_back([this] { work(); });
    const int64_t ranges = std::min<int64_t>(n, int64_t(nthreads) * 4);  // a few per thread: uneven rows balance out
    {
      std::lock_guard<std::mutex> l(m_);
      fn_ = &fn, n_ = n, step_ = (n + ranges - 1) / ranges, next_ = 0, error_ = nullptr;
      active_ = nthreads - 1, ++generation_;
      wanted_ = nthreads - 1;
    }
    wake_.notify_all();
    take_ranges();
    std::unique_lock<std::mutex> l(m_);
    done_.wait(l, [this] { return active_ == 0; });
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
    return true;
  }

 private:
  void take_ranges() {
    for (;;) {
      const int64_t b = next_.fetch_add(step_);
      if (b >= n_) return;
      try {
        (*fn_)(b, std::min(n_, b + step_));
      } catch (...) {
        std::lock_guard<std::mutex> l(m_);
        if (!error_) error_ = std::current_exception();
        next_ = n_;  // the rest is skipped
      }
    }
  }

  void work() {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> l(m_);
    for (;;) {
      wake_.wait(l, [&] { return stop_ || (generation_ != seen && wanted_ > 0); });
      if (stop_) return;
      seen = generation_;
      --wanted_;  // this worker joins the current loop (a worker beyond the loop's thread count stays asleep)
      l.unlock();
      take_ranges();
      l.lock();
      if (--active_ == 0) done_.notify_one();
    }
  }

  std::mutex busy_, m_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, step_ = 1;
  std::atomic<int64_t> next_{0};
  std::exception_ptr error_;
  int active_ = 0, wanted_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

Pool& pool() {
  static Pool p;
  return p;
}

}  // namespace

void set_threads(int n) { g_threads = std::max(0, n); }

int threads() {
  const int t = g_threads.load();
  return t > 0 ? std::min(t, 64) : hardware_threads();
}

void parallel_for(int64_t n, double work, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int t = int(std::min<int64_t>(threads(), n));
  if (t <= 1 || work < g_min_work.load() || !pool().run(t, n, fn)) fn(0, n);
}

void set_parallel_min_work(double work) { g_min_work = work; }

}  // namespace plumb
