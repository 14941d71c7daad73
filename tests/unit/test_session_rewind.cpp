// A session going back: Session::set_prefill_stop (a multi-token call stopped at any of its points, or by its progress
// function throwing, leaves the session as it was before the call, caches and all; generate() stops a prompt's
// prefill the same way) and Session::checkpoint / restore.
#include <gtest/gtest.h>

#include <stdexcept>

#include "plumb/engine.h"
#include "plumb/text.h"
#include "session_test_util.h"

namespace {

using plumb_test::csa_long_ids;

// csa-long: 3 layers, CSA and HCA windows of 4 and 8 tokens, a sliding window of 8, so a call of 60 tokens in passes
// of 7 crosses every kind of cache boundary (window keys overwritten, pending rows completing entries, CSA's previous
// series replaced) between any two of its points. The session starts mid-window: 13 tokens fed.
struct StopFixture : ::testing::Test {
  static std::shared_ptr<plumb::Engine> engine() {
    static auto e = plumb_test::csa_long_engine("cpu");
    return e;
  }
  const std::vector<int32_t> head = csa_long_ids(13, 1), body = csa_long_ids(60, 2), tail = csa_long_ids(9, 3);
  std::unique_ptr<plumb::Session> started() {
    auto s = engine()->new_session();
    s->forward(head);
    return s;
  }
};

// A stop at each of the call's points: before its first pass, then after each layer of each of its 9 passes (8 of 7
// tokens and one of 4) but the last layer of the last. After each, the session is at its position before the call and
// its next calls give the logits of a session never stopped, bit for bit (the caches were put back whole).
TEST_F(StopFixture, AStopAtAnyPointLeavesTheSessionAsItWas) {
  auto ref = started();
  const auto want_body = ref->forward_all(body), want_tail = ref->forward_all(tail);
  int asks = 0;
  {
    auto s = started();
    s->set_prefill_stop([&] { return ++asks, false; });
    EXPECT_EQ(s->forward_all(body), want_body);  // asked, never stopping: the results of a session without it
  }
  ASSERT_EQ(asks, 1 + 9 * 3 - 1);
  for (int k = 1; k <= asks; ++k) {
    auto s = started();
    int n = 0;
    s->set_prefill_stop([&] { return ++n == k; });
    try {
      s->forward_all(body);
      ADD_FAILURE() << "not stopped at point " << k;
    } catch (const plumb::Stopped& e) {
      EXPECT_NE(std::string(e.what()).find("of the call's 60 tokens (Session::set_prefill_stop): the session is as it was "
                                           "before the call"), std::string::npos) << e.what();
    }
    ASSERT_EQ(s->position(), 13) << "stopped at point " << k;
    EXPECT_EQ(s->forward_all(body), want_body) << "after a stop at point " << k;  // (asked again, not stopping)
    EXPECT_EQ(s->forward_all(tail), want_tail) << "after a stop at point " << k;
  }
}

// Every call that feeds several tokens is stoppable (forward, forward_all, forward_sample), one-token calls are not
// asked, and set_prefill_stop returns the function it replaces.
TEST_F(StopFixture, EveryMultiTokenCallIsStoppableAndOneTokenCallsAreNotAsked) {
  auto ref = started();
  auto s = started();
  int asked = 0;
  const auto always = [&] { return ++asked, true; };
  EXPECT_FALSE(s->set_prefill_stop(always));  // none before
  EXPECT_THROW(s->forward(body), plumb::Stopped);
  plumb::Sampler sampler(plumb::SamplingParams{}, engine()->info().vocab_size);
  EXPECT_THROW(s->forward_sample(body, sampler, body), plumb::Stopped);
  EXPECT_EQ(asked, 2);  // each stopped before its first pass
  EXPECT_EQ(s->position(), 13);
  s->forward(std::vector<int32_t>{7});  // one token: not asked
  EXPECT_EQ(asked, 2);
  auto previous = s->set_prefill_stop({});
  ASSERT_TRUE(previous);
  previous();
  EXPECT_EQ(asked, 3);  // the function given back is the one set
  ref->forward(std::vector<int32_t>{7});
  EXPECT_EQ(s->forward(tail), ref->forward(tail));
}

// A progress function that throws ends the call with its exception, and the session is put back as for a stop
// (the pass it interrupted had written part of its layers).
TEST_F(StopFixture, AProgressFunctionThatThrowsLeavesTheSessionAsItWas) {
  auto ref = started();
  const auto want = ref->forward(body);
  auto s = started();
  s->set_prefill_progress([](int64_t done, int64_t) {
    if (done >= 30) throw std::runtime_error("the front end went away");
  });
  EXPECT_THROW(s->forward(body), std::runtime_error);
  EXPECT_EQ(s->position(), 13);
  s->set_prefill_progress({});
  EXPECT_EQ(s->forward(body), want);
}

// The session's own calls from inside its progress or stop function would act on a pass half done (a checkpoint
// there would hold some layers of the call and not others): refused by name, and the call is put back.
TEST_F(StopFixture, CallsFromInsideACallbackAreRefused) {
  auto ref = started();
  const auto want = ref->forward(body);
  auto s = started();
  plumb::Session* self = s.get();
  for (int what = 0; what < 4; ++what) {
    s->set_prefill_progress([&, what](int64_t done, int64_t) {
      if (done < 20) return;
      if (what == 0) self->checkpoint();
      if (what == 1) self->forward(std::vector<int32_t>{5});
      if (what == 2) self->set_prefill_stop({});
      if (what == 3) self->reset();
    });
    try {
      s->forward(body);
      ADD_FAILURE() << "call " << what << " from inside the progress function ran";
    } catch (const plumb::Error& e) {
      EXPECT_NE(std::string(e.what()).find("called from inside a call's progress or stop function"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(s->position(), 13) << what;
  }
  s->set_prefill_progress({});
  EXPECT_EQ(s->forward(body), want);
}

// generate(): should_stop is asked while the prompt prefills, beside the session's own stop function (either stops);
// a stop there returns Cancelled with no token and the session as it was, and the session's own stop function alone
// is back afterwards (also when generate() ran to the end).
TEST_F(StopFixture, GenerateStopsAPrefillAndPutsTheSessionsStopBack) {
  const auto tok = plumb::Tokenizer::load(std::string(PLUMB_TEST_DATA) + "/../../models/tiny");
  auto s = started();
  int own = 0;
  s->set_prefill_stop([&] { return ++own, false; });
  plumb::GenerateOptions g;
  g.sampling.temperature = 0, g.max_tokens = 3, g.stop_at_eos = false;
  int asked = 0;
  g.should_stop = [&] { return ++asked == 4; };  // at the end of the first pass
  const auto r = plumb::generate(*s, tok, body, g);
  EXPECT_EQ(r.stop, plumb::StopReason::Cancelled);
  EXPECT_TRUE(r.tokens.empty());
  EXPECT_TRUE(r.text.empty());
  EXPECT_EQ(r.unfed, -1);
  EXPECT_EQ(s->position(), 13);
  EXPECT_EQ(asked, 4);
  EXPECT_EQ(own, 3);  // asked too, at the points before the stop
  s->forward(tail);
  EXPECT_EQ(own, 3 + 6);  // back alone after it: 9 tokens in passes of 7 and 2 over 3 layers make 1 + 3 + 2 points
  asked = 0;
  g.should_stop = [&] { return ++asked, false; };
  const auto full = plumb::generate(*s, tok, body, g);
  EXPECT_EQ(full.stop, plumb::StopReason::Length);
  EXPECT_EQ(full.tokens.size(), 3u);
  EXPECT_EQ(own, 9 + 27);  // the 60-token prompt's 27 points (as the first test counts them)
  EXPECT_EQ(asked, 27 + 2);  // and after the first 2 tokens (the third is the last: max_tokens)
  s->forward(tail);
  EXPECT_EQ(own, 36 + 6);
  EXPECT_EQ(asked, 29);
}

// Checkpoints: restoring one gives the logits a session gave after that point, bit for bit, as often as asked; one
// taken before the session went back below its position (a restore, a reset) is refused by name, the session
// unchanged; a checkpoint survives a stopped call; another session's checkpoint is refused.
TEST_F(StopFixture, CheckpointsComeBackBitForBitAndStaleOnesAreRefused) {
  auto s = started();
  const auto at13 = s->checkpoint();
  EXPECT_EQ(at13->position(), 13);
  const auto l_body = s->forward_all(body);
  const auto at73 = s->checkpoint();
  const auto l_tail = s->forward_all(tail);
  for (int i = 0; i < 2; ++i) {
    s->restore(*at73);
    EXPECT_EQ(s->position(), 73);
    EXPECT_EQ(s->forward_all(tail), l_tail) << "restore " << i;
  }
  int asked = 0;
  s->set_prefill_stop([&] { return ++asked == 5; });  // within the call's second pass
  EXPECT_THROW(s->forward(body), plumb::Stopped);  // (the session goes back to 82: both checkpoints stay usable)
  EXPECT_EQ(s->position(), 82);
  s->set_prefill_stop({});
  s->restore(*at73);
  EXPECT_EQ(s->forward_all(tail), l_tail);
  s->restore(*at13);
  EXPECT_EQ(s->forward_all(body), l_body);
  EXPECT_EQ(s->position(), 73);
  try {
    s->restore(*at73);  // the session went back to 13 after it: positions 13-72 were fed anew
    ADD_FAILURE() << "a checkpoint left behind was restored";
  } catch (const plumb::Error& e) {
    EXPECT_NE(std::string(e.what()).find("restore: the checkpoint at position 73 was left behind when the session went "
                                         "back to position 13"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s->position(), 73);
  const auto again = s->checkpoint();
  s->forward(tail);
  s->restore(*again);
  EXPECT_EQ(s->forward_all(tail), l_tail);
  auto other = started();
  try {
    other->restore(*again);
    ADD_FAILURE() << "another session's checkpoint was restored";
  } catch (const plumb::Error& e) {
    EXPECT_NE(std::string(e.what()).find("another session's"), std::string::npos) << e.what();
  }
  EXPECT_EQ(other->position(), 13);
  // reset(): the empty session's checkpoint still comes back, later ones do not.
  auto fresh = engine()->new_session();
  const auto empty = fresh->checkpoint();
  const auto l_head = fresh->forward_all(head);
  const auto after_head = fresh->checkpoint();
  fresh->reset();
  EXPECT_THROW(fresh->restore(*after_head), plumb::Error);
  fresh->forward(body);
  fresh->restore(*empty);
  EXPECT_EQ(fresh->position(), 0);
  EXPECT_EQ(fresh->forward_all(head), l_head);
}

// forward_sample_masked draws what the sampler draws from the masked row (session_test_util.h), on the CPU reference,
// and refuses a sampler of another vocabulary before feeding anything.
TEST_F(StopFixture, ForwardSampleMaskedDrawsFromTheMaskedRow) {
  plumb_test::check_masked_sampling(*engine(), "cpu");
  auto s = engine()->new_session();
  plumb::Sampler other(plumb::SamplingParams{}, 10);
  EXPECT_THROW(s->forward_sample_masked(head, other, head, [](std::span<uint32_t>) {}), plumb::Error);
  EXPECT_EQ(s->position(), 0);
}

// A Session of one's own has no checkpoints: the defaults refuse by name.
TEST(SessionCheckpoint, ASessionOfOnesOwnRefuses) {
  struct Own : plumb::Session {
    std::vector<float> forward(std::span<const int32_t>) override { return {}; }
    std::vector<float> forward_all(std::span<const int32_t>) override { return {}; }
    int64_t position() const override { return 0; }
    void reset() override {}
    const plumb::ModelInfo& info() const override { return info_; }
    plumb::ModelInfo info_;
  } own;
  EXPECT_THROW(own.checkpoint(), plumb::Error);
  EXPECT_FALSE(own.set_prefill_stop([] { return true; }));
}

}  // namespace
