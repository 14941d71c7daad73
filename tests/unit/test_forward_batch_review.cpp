// Review tests of plumb::forward_batch on the CPU reference: larger batches, other models and patches, the context's
// last position, foreign sessions, and a batch run from inside another session's call.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "plumb/engine.h"
#include "session_test_util.h"

namespace {

using plumb_test::csa_long_ids;

// n sessions at the given fed lengths, stepped `steps` times together; each row must be its twin's forward() bits.
void batch_equals_single(const plumb::Engine& e, const std::vector<size_t>& fed, int steps, const std::string& what) {
  SCOPED_TRACE(what);
  const int32_t V = e.info().vocab_size;
  std::vector<std::unique_ptr<plumb::Session>> s, twin;
  std::vector<int32_t> next;
  for (size_t i = 0; i < fed.size(); ++i) {
    s.push_back(e.new_session()), twin.push_back(e.new_session());
    std::vector<int32_t> head = csa_long_ids(fed[i], int(i) + 3);
    for (int32_t& t : head) t %= V;
    if (!head.empty()) s[i]->forward(head), twin[i]->forward(head);
    next.push_back(int32_t((i * 31 + 7) % size_t(V)));
  }
  for (int step = 0; step < steps; ++step) {
    std::vector<plumb::Session*> ptrs;
    for (auto& x : s) ptrs.push_back(x.get());
    const std::vector<float> got = plumb::forward_batch(ptrs, next);
    ASSERT_EQ(got.size(), s.size() * size_t(V));
    for (size_t i = 0; i < s.size(); ++i) {
      const std::vector<float> want = twin[i]->forward(std::vector<int32_t>{next[i]});
      ASSERT_TRUE(std::equal(want.begin(), want.end(), got.begin() + std::ptrdiff_t(i * size_t(V))))
          << "step " << step << ", session " << i << " (fed " << fed[i] << ")";
      ASSERT_EQ(s[i]->position(), twin[i]->position());
      next[i] = int32_t((next[i] * 17 + int32_t(i) + 1) % V);
    }
  }
}

// Eleven sessions (more than the unit test's five), two at position 0, on csa-long and on other fixtures, and with
// the CPU patches that change the row-wise ops: each row its own session's bits.
TEST(ForwardBatchReview, ElevenSessionsOnSeveralModelsAndPatches) {
  const std::vector<size_t> fed = {0, 1, 2, 0, 5, 8, 9, 16, 17, 31, 40};
  batch_equals_single(*plumb_test::csa_long_engine("cpu"), fed, 6, "csa-long");
  batch_equals_single(*plumb_test::csa_long_engine("cpu", "moe.rsf_in_topk,router.bf16,mhc.bf16_mix"), fed, 4,
                      "csa-long patched");
  batch_equals_single(*plumb_test::golden_engine("swa-hash", "cpu"), fed, 4, "swa-hash");
  batch_equals_single(*plumb_test::golden_engine("tiny-official", "cpu", "numerics.official"), fed, 4,
                      "tiny-official official");
}

// csa-long with a context of `ctx` positions (a copy of the fixture, its config.json changed).
std::shared_ptr<plumb::Engine> short_context_engine(int ctx) {
  namespace fs = std::filesystem;
  const fs::path src = fs::path(PLUMB_TEST_DATA) / "golden" / "csa-long";
  const fs::path dst = fs::temp_directory_path() / ("plumb_review_ctx" + std::to_string(ctx) + "_" + std::to_string(::getpid()));
  fs::create_directories(dst);
  for (const char* f : {"model.safetensors"}) fs::copy_file(src / f, dst / f, fs::copy_options::overwrite_existing);
  std::ifstream in(src / "config.json");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string cfg = ss.str();
  const std::string key = "\"max_position_embeddings\": 1048576";
  const size_t at = cfg.find(key);
  EXPECT_NE(at, std::string::npos);
  cfg.replace(at, key.size(), "\"max_position_embeddings\": " + std::to_string(ctx));
  std::ofstream(dst / "config.json") << cfg;
  plumb::EngineOptions o;
  o.prefill_chunk = 7;
  auto e = plumb::Engine::load(dst.string(), o);
  fs::remove_all(dst);
  return e;
}

// A session one position before the end of the context steps in a batch (to the context's end); at the end, it is
// refused, and no session of that batch moves. A batch mixing position 0 and ctx-1 gives each its own bits.
TEST(ForwardBatchReview, TheContextsLastPosition) {
  const int ctx = 12;
  auto e = short_context_engine(ctx);
  ASSERT_EQ(e->info().max_positions, ctx);
  auto a = e->new_session(), b = e->new_session(), ta = e->new_session(), tb = e->new_session();
  a->forward(csa_long_ids(ctx - 1, 1)), ta->forward(csa_long_ids(ctx - 1, 1));
  plumb::Session* both[] = {b.get(), a.get()};
  const std::vector<float> got = plumb::forward_batch(both, std::vector<int32_t>{5, 6});
  const std::vector<float> wb = tb->forward(std::vector<int32_t>{5}), wa = ta->forward(std::vector<int32_t>{6});
  EXPECT_TRUE(std::equal(wb.begin(), wb.end(), got.begin()));
  EXPECT_TRUE(std::equal(wa.begin(), wa.end(), got.begin() + 256));
  EXPECT_EQ(a->position(), ctx);
  EXPECT_EQ(b->position(), 1);
  try {
    plumb::forward_batch(both, std::vector<int32_t>{7, 8});
    ADD_FAILURE() << "a session at the context's end was stepped";
  } catch (const plumb::Error& x) {
    EXPECT_NE(std::string(x.what()).find("session 1 of 2"), std::string::npos) << x.what();
    EXPECT_NE(std::string(x.what()).find("past the model's context"), std::string::npos) << x.what();
  }
  EXPECT_EQ(a->position(), ctx);
  EXPECT_EQ(b->position(), 1);
  // b still steps as its twin (the refused batch wrote nothing of it).
  plumb::Session* one[] = {b.get()};
  const std::vector<float> g1 = plumb::forward_batch(one, std::vector<int32_t>{9});
  EXPECT_EQ(g1, tb->forward(std::vector<int32_t>{9}));
}

// A Session that is not the library's: refused by index, nothing fed.
class Foreign : public plumb::Session {
 public:
  explicit Foreign(const plumb::Session& s) : info_(s.info()) {}
  std::vector<float> forward(std::span<const int32_t>) override { return {}; }
  std::vector<float> forward_all(std::span<const int32_t>) override { return {}; }
  void set_prefill_progress(std::function<void(int64_t, int64_t)>) override {}
  std::function<bool()> set_prefill_stop(std::function<bool()>) override { return {}; }
  void reserve(int64_t) override {}
  int64_t position() const override { return 0; }
  void reset() override {}
  const plumb::ModelInfo& info() const override { return info_; }

 private:
  plumb::ModelInfo info_;
};

TEST(ForwardBatchReview, AForeignSessionIsRefusedBeforeAnythingIsFed) {
  auto e = plumb_test::csa_long_engine("cpu");
  auto a = e->new_session();
  a->forward(csa_long_ids(3, 1));
  Foreign f(*a);
  plumb::Session* ss[] = {a.get(), &f};
  try {
    plumb::forward_batch(ss, std::vector<int32_t>{1, 2});
    ADD_FAILURE() << "accepted";
  } catch (const plumb::Error& x) {
    EXPECT_NE(std::string(x.what()).find("session 1 of 2 is not one of the library's"), std::string::npos) << x.what();
  }
  EXPECT_EQ(a->position(), 3);
}

// A batch of other sessions run from inside a session's own call (its progress function) is allowed, and neither
// the call nor the batch changes the other's numbers.
TEST(ForwardBatchReview, ABatchInsideAnotherSessionsCall) {
  auto e = plumb_test::csa_long_engine("cpu");
  auto a = e->new_session(), b = e->new_session(), c = e->new_session();
  auto ta = e->new_session(), tb = e->new_session(), tc = e->new_session();
  b->forward(csa_long_ids(4, 2)), tb->forward(csa_long_ids(4, 2));
  int ran = 0;
  std::vector<float> inside;
  a->set_prefill_progress([&](int64_t, int64_t) {
    if (ran++ > 0) return;
    plumb::Session* two[] = {b.get(), c.get()};
    inside = plumb::forward_batch(two, std::vector<int32_t>{3, 4});
  });
  const std::vector<float> got = a->forward(csa_long_ids(20, 5));
  EXPECT_EQ(got, ta->forward(csa_long_ids(20, 5)));
  ASSERT_EQ(inside.size(), 512u);
  const std::vector<float> wb = tb->forward(std::vector<int32_t>{3}), wc = tc->forward(std::vector<int32_t>{4});
  EXPECT_TRUE(std::equal(wb.begin(), wb.end(), inside.begin()));
  EXPECT_TRUE(std::equal(wc.begin(), wc.end(), inside.begin() + 256));
}

// Checkpoints across batched steps: taken before, restored after, and the session goes on as its twin.
TEST(ForwardBatchReview, ACheckpointBeforeBatchedStepsRestores) {
  auto e = plumb_test::csa_long_engine("cpu");
  auto a = e->new_session(), b = e->new_session(), ta = e->new_session();
  a->forward(csa_long_ids(9, 1)), ta->forward(csa_long_ids(9, 1)), b->forward(csa_long_ids(2, 2));
  const auto cp = a->checkpoint();
  for (int k = 0; k < 7; ++k) {
    plumb::Session* two[] = {a.get(), b.get()};
    plumb::forward_batch(two, std::vector<int32_t>{int32_t(k + 10), int32_t(k + 20)});
  }
  a->restore(*cp);
  EXPECT_EQ(a->position(), 9);
  for (int k = 0; k < 5; ++k) {
    plumb::Session* two[] = {b.get(), a.get()};
    const std::vector<float> got = plumb::forward_batch(two, std::vector<int32_t>{int32_t(k + 40), int32_t(k + 50)});
    const std::vector<float> want = ta->forward(std::vector<int32_t>{int32_t(k + 50)});
    ASSERT_TRUE(std::equal(want.begin(), want.end(), got.begin() + 256)) << "step " << k;
  }
}

}  // namespace
