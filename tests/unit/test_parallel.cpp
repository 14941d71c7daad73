// core/parallel.h: every index exactly once for any thread count, exceptions and nested loops, and the reference
// model's outputs bit-identical with 1 and 4 threads (the pool forced on for the tiny fixtures' shapes), and sessions
// of one Engine on several threads at once.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/parallel.h"
#include "model/model.h"
#include "patches/registry.h"
#include "plumb/engine.h"

namespace {

// Restores the defaults when a test ends (the settings are process-wide).
struct ThreadSettings {
  ThreadSettings(int threads, double min_work) {
    plumb::set_threads(threads);
    plumb::set_parallel_min_work(min_work);
  }
  ~ThreadSettings() {
    plumb::set_threads(0);
    plumb::set_parallel_min_work(double(1 << 18));
  }
};

TEST(ParallelFor, EveryIndexOnceForAnyThreadCount) {
  for (int threads : {1, 2, 3, 4, 7}) {
    const ThreadSettings s(threads, 0);
    for (int64_t n : {0, 1, 2, 5, 31, 64, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      plumb::parallel_for(n, 1e9, [&](int64_t a, int64_t b) {
        ASSERT_LE(0, a);
        ASSERT_LE(a, b);
        ASSERT_LE(b, n);
        for (int64_t i = a; i < b; ++i) ++hits[size_t(i)];
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "threads " << threads << " n " << n << " index " << i;
    }
  }
}

TEST(ParallelFor, RethrowsARangesExceptionAndStaysUsable) {
  const ThreadSettings s(4, 0);
  EXPECT_THROW(plumb::parallel_for(100, 1e9, [](int64_t a, int64_t b) {
                 for (int64_t i = a; i < b; ++i)
                   if (i == 57) throw std::runtime_error("index 57");
               }),
               std::runtime_error);
  std::atomic<int64_t> sum{0};
  plumb::parallel_for(100, 1e9, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 99 * 100 / 2);
}

TEST(ParallelFor, NestedLoopsRunInTheirCallersThread) {
  const ThreadSettings s(4, 0);
  std::atomic<int64_t> count{0}, elsewhere{0};
  plumb::parallel_for(8, 1e9, [&](int64_t a, int64_t b) {
    const auto outer = std::this_thread::get_id();
    for (int64_t i = a; i < b; ++i)
      plumb::parallel_for(10, 1e9, [&](int64_t c, int64_t d) {
        count += d - c;
        elsewhere += std::this_thread::get_id() != outer;  // every inner range on the thread that called it
      });
  });
  EXPECT_EQ(count.load(), 80);
  EXPECT_EQ(elsewhere.load(), 0);
}

// The fixtures' models with every parallel loop threaded: logits the same bits as one thread, over a prefill, a
// chunk and decodes, in the reference and the official numerics.
std::vector<float> run_model(const std::string& fixture, const std::string& patches) {
  const auto model = plumb::Model::load(std::string(PLUMB_TEST_DATA) + "/golden/" + fixture, plumb::parse_patches(patches).options);
  auto st = model->new_state();
  std::vector<float> all;
  const std::vector<std::vector<int32_t>> steps = {{5, 9, 17, 3, 44, 8, 21, 30, 2, 11, 19, 7, 60, 33, 12, 4, 9, 50, 6, 27},
                                                   {13, 14, 15, 16, 17, 18}, {23}, {42}, {7}};
  for (const auto& toks : steps) {
    const plumb::Tensor lg = model->forward(st, toks);
    all.insert(all.end(), lg.data.begin(), lg.data.end());
  }
  return all;
}

TEST(ParallelFor, ModelOutputsDoNotDependOnTheThreadCount) {
  for (const auto& [fixture, patches] : std::vector<std::pair<std::string, std::string>>{
           {"csa-long", ""}, {"official-mixed-ref", "numerics.official"}, {"wide-window-ref", "numerics.official"}}) {
    std::vector<float> one, four;
    {
      const ThreadSettings s(1, 0);
      one = run_model(fixture, patches);
    }
    {
      const ThreadSettings s(4, 0);
      four = run_model(fixture, patches);
    }
    ASSERT_EQ(one.size(), four.size());
    for (size_t i = 0; i < one.size(); ++i)
      ASSERT_EQ(std::memcmp(&one[i], &four[i], 4), 0) << fixture << " [" << patches << "] logit " << i << ": " << one[i] << " vs " << four[i];
  }
}

// engine.h's thread promise: one Engine, sessions on different threads at the same time (the pool contended: a loop
// that finds it busy runs serially on its own thread), each session's logits bit-identical to the same session run
// alone. Four sessions with different prompts, each a prefill and decodes, on four threads at once.
TEST(ParallelFor, SessionsOnThreadsMatchThemAlone) {
  const ThreadSettings s(4, 0);  // the pool forced on for the fixture's shapes, so the sessions contend for it
  plumb::EngineOptions o;
  o.prefill_chunk = 7;
  const auto engine = plumb::Engine::load(std::string(PLUMB_TEST_DATA) + "/golden/csa-long", o);
  auto run = [&](int k) {
    auto session = engine->new_session();
    std::vector<int32_t> prompt;
    for (int i = 0; i < 24; ++i) prompt.push_back(int32_t((i * 7 + k * 13) % 200 + 2));
    std::vector<float> out = session->forward_all(prompt);
    for (int i = 0; i < 6; ++i) {
      const std::vector<float> l = session->forward(std::vector<int32_t>{int32_t((k + i * 5) % 200 + 2)});
      out.insert(out.end(), l.begin(), l.end());
    }
    return out;
  };
  std::vector<std::vector<float>> alone(4), together(4);
  for (int k = 0; k < 4; ++k) alone[size_t(k)] = run(k);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) threads.emplace_back([&, k] { together[size_t(k)] = run(k); });
  for (auto& t : threads) t.join();
  for (int k = 0; k < 4; ++k) {
    ASSERT_EQ(alone[size_t(k)].size(), together[size_t(k)].size()) << "session " << k;
    for (size_t i = 0; i < alone[size_t(k)].size(); ++i)
      ASSERT_EQ(std::memcmp(&alone[size_t(k)][i], &together[size_t(k)][i], 4), 0)
          << "session " << k << " logit " << i << ": alone " << alone[size_t(k)][i] << ", on a thread " << together[size_t(k)][i];
  }
}

}  // namespace
