// plumb::forward_batch on the CPU reference: a step of several sessions gives each the bits of its own step, and
// every refusal comes before anything is fed.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "plumb/engine.h"
#include "session_test_util.h"

namespace {

using plumb_test::csa_long_ids;

std::shared_ptr<plumb::Engine> batch_engine() {
  static auto e = plumb_test::csa_long_engine("cpu");
  return e;
}

TEST(ForwardBatch, EachRowIsItsSessionsOwnStep) {
  plumb_test::check_forward_batch(*batch_engine(), 0.0f, "cpu");
  // The official numerics (activations quantized per row and block, bf16 roundings) on the official formats.
  plumb_test::check_forward_batch(*plumb_test::golden_engine("tiny-official", "cpu", "numerics.official"), 0.0f,
                                  "cpu [numerics.official] tiny-official");
}

// Rows drawn where the logits are (on the CPU: the host's draws, from the rows forward_batch returns), each row's own
// failure its own; a sampler of another vocabulary is refused before anything is fed.
TEST(ForwardBatch, SampledRowsAreTheHostsDraws) {
  plumb_test::check_forward_batch_sample(*batch_engine(), "cpu");
  auto e = batch_engine();
  auto a = e->new_session(), b = e->new_session();
  plumb::Sampler wrong(plumb::SamplingParams{}, 10);
  std::vector<plumb::BatchRow> rows(2);
  rows[1].sampler = &wrong;
  plumb::Session* both[] = {a.get(), b.get()};
  try {
    plumb::forward_batch_sample(both, rows);
    ADD_FAILURE() << "a sampler of another vocabulary was accepted";
  } catch (const plumb::Error& x) {
    EXPECT_NE(std::string(x.what()).find("session 1 of 2: a sampler for a vocabulary of 10, the model's is 256"), std::string::npos)
        << x.what();
  }
  EXPECT_EQ(a->position(), 0);
  EXPECT_EQ(b->position(), 0);
}

// A batch of one is forward() of one token; and a session stepped in batches, then alone, then in batches again,
// stays on its twin's path (the batch leaves nothing behind that a single step reads differently).
TEST(ForwardBatch, ABatchOfOneAndMixedStepsAreForward) {
  auto e = batch_engine();
  auto s = e->new_session(), t = e->new_session(), other = e->new_session();
  s->forward(csa_long_ids(11, 1)), t->forward(csa_long_ids(11, 1)), other->forward(csa_long_ids(4, 2));
  for (int step = 0; step < 12; ++step) {
    const int32_t tok = int32_t((step * 29 + 3) % 256);
    std::vector<float> got;
    if (step % 4 == 1) {
      got = s->forward(std::vector<int32_t>{tok});
    } else if (step % 4 == 2) {
      plumb::Session* one[] = {s.get()};
      got = plumb::forward_batch(one, std::vector<int32_t>{tok});
    } else {
      plumb::Session* two[] = {other.get(), s.get()};
      const std::vector<float> both = plumb::forward_batch(two, std::vector<int32_t>{int32_t(step), tok});
      got.assign(both.begin() + 256, both.end());
    }
    ASSERT_EQ(got, t->forward(std::vector<int32_t>{tok})) << "step " << step;
  }
}

// Every refusal names what is at fault and leaves every session where it was.
TEST(ForwardBatch, RefusalsFeedNothing) {
  auto e = batch_engine();
  auto a = e->new_session(), b = e->new_session();
  a->forward(csa_long_ids(5, 1));
  auto refused = [&](std::vector<plumb::Session*> ss, std::vector<int32_t> toks, const std::string& needle) {
    try {
      plumb::forward_batch(ss, toks);
      ADD_FAILURE() << "accepted; expected: " << needle;
    } catch (const plumb::Error& x) {
      EXPECT_NE(std::string(x.what()).find(needle), std::string::npos) << x.what();
    }
    EXPECT_EQ(a->position(), 5);
    EXPECT_EQ(b->position(), 0);
  };
  refused({}, {}, "0 sessions and 0 tokens");
  refused({a.get(), b.get()}, {1}, "2 sessions and 1 tokens");
  refused({a.get(), nullptr}, {1, 2}, "session 1 of 2 is null");
  refused({a.get(), b.get(), a.get()}, {1, 2, 3}, "sessions 0 and 2 are the same session");
  refused({a.get(), b.get()}, {1, 256}, "session 1 of 2: token 256 at position 0 is outside the vocabulary");
  auto other_engine = plumb_test::csa_long_engine("cpu");
  auto c = other_engine->new_session();
  refused({a.get(), c.get()}, {1, 2}, "sessions 0 and 1 belong to different engines");
  // A session inside a call of its own (its progress function) may not be stepped.
  int asked = 0;
  a->set_prefill_progress([&](int64_t, int64_t) {
    ++asked;
    plumb::Session* both[] = {b.get(), a.get()};
    try {
      plumb::forward_batch(both, std::vector<int32_t>{1, 2});
      ADD_FAILURE() << "a session inside its own call was stepped";
    } catch (const plumb::Error& x) {
      EXPECT_NE(std::string(x.what()).find("Session::forward_batch called from inside a call's progress"), std::string::npos)
          << x.what();
    }
    EXPECT_EQ(b->position(), 0);
  });
  a->forward(csa_long_ids(9, 3));
  EXPECT_GT(asked, 0);
  EXPECT_EQ(a->position(), 14);
}

}  // namespace
