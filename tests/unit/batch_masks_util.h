// forward_batch_sample's masks spread over the CPU threads (batch_masks), shared by the CPU and GPU tests: every
// row drawn from its own mask (each row's a different residue class of the ids), one row's throwing mask its error
// alone, the masks run on more than one thread where the pool has them.
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/parallel.h"
#include "plumb/engine.h"
#include "session_test_util.h"

namespace plumb_test {

// 12 sessions stepped together 3 times, each row with a sampler and a mask allowing the ids i (mod 12) of row i (row
// 3's mask throws), against twin sessions stepped by forward_batch and drawn on the host by twin samplers from their
// rows masked here. The pool takes the masks whatever the vocabulary (set_parallel_min_work(0)); each mask waits 5 ms,
// so that the pool's threads overlap.
inline void check_parallel_masks(const plumb::Engine& e, const std::string& what) {
  SCOPED_TRACE(what);
  struct MinWork {
    MinWork() { plumb::set_parallel_min_work(0); }
    ~MinWork() { plumb::set_parallel_min_work(double(1 << 18)); }
  } min_work;
  const int32_t V = e.info().vocab_size;
  constexpr size_t kRows = 12, kThrows = 3;
  std::vector<std::unique_ptr<plumb::Session>> s, twin;
  std::vector<plumb::Sampler> sa, sb;
  std::vector<std::vector<int32_t>> hist;
  std::vector<int32_t> next;
  for (size_t i = 0; i < kRows; ++i) {
    plumb::SamplingParams p;
    p.seed = 100 + i;
    s.push_back(e.new_session()), twin.push_back(e.new_session());
    sa.emplace_back(p, V), sb.emplace_back(p, V);
    hist.push_back(csa_long_ids(4 + i, int(i) + 60));
    s[i]->forward(hist[i]), twin[i]->forward(hist[i]);
    next.push_back(int32_t((i * 37 + 5) % size_t(V)));
  }
  std::mutex mu;
  std::set<std::thread::id> threads;
  for (int step = 0; step < 3; ++step) {
    std::vector<plumb::BatchRow> rows(kRows);
    std::vector<plumb::Session*> ps, pt;
    for (size_t i = 0; i < kRows; ++i) {
      hist[i].push_back(next[i]);
      rows[i].token = next[i], rows[i].history = hist[i], rows[i].sampler = &sa[i];
      rows[i].allowed = [&, i](std::span<uint32_t> bits) {
        {
          const std::lock_guard lock(mu);
          threads.insert(std::this_thread::get_id());
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        if (i == kThrows) throw std::runtime_error("row 3's mask");
        for (size_t id = i; id < bits.size() * 32; id += kRows) bits[id / 32] |= 1u << (id % 32);
      };
      ps.push_back(s[i].get()), pt.push_back(twin[i].get());
    }
    plumb::forward_batch_sample(ps, rows);
    const std::vector<float> want = plumb::forward_batch(pt, next);
    for (size_t i = 0; i < kRows; ++i) {
      const std::string where = "step " + std::to_string(step) + ", row " + std::to_string(i);
      if (i == kThrows) {
        EXPECT_TRUE(rows[i].error) << where << ": the throwing mask's row has no error";
        EXPECT_EQ(rows[i].sampled, -1) << where;
        next[i] = int32_t((size_t(step) * 11 + 1) % size_t(V));
        continue;
      }
      ASSERT_FALSE(rows[i].error) << where << ": another row's mask failed this one";
      std::vector<float> row(want.begin() + ptrdiff_t(i * size_t(V)), want.begin() + ptrdiff_t((i + 1) * size_t(V)));
      for (size_t id = 0; id < row.size(); ++id)
        if (id % kRows != i) row[id] = -std::numeric_limits<float>::infinity();
      const int32_t t = sb[i].sample(row, hist[i]);
      EXPECT_EQ(rows[i].sampled, t) << where;
      EXPECT_EQ(size_t(rows[i].sampled) % kRows, i) << where << ": drawn outside its own mask";
      next[i] = t;
    }
  }
  if (plumb::threads() >= 2) {
    EXPECT_GE(threads.size(), 2u) << "the rows' masks all ran on one thread";
  }
}

}  // namespace plumb_test
