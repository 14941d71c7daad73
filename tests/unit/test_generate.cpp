// Sampling and generation tests: hand-computed distributions for temperature, top-k, top-p, min-p and the
// penalties; seeded determinism; stop strings across token boundaries; and plumb::generate on a scripted
// session (stop token, stop string, max tokens, context end, the errors checked before the session is touched).
#include <gtest/gtest.h>

#include <type_traits>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <thread>

#include "core/error.h"
#include "core/notice.h"
#include "plumb/engine.h"
#include "plumb/text.h"

namespace {

using plumb::Sampler;
using plumb::SamplingParams;
using Dist = std::vector<std::pair<int32_t, float>>;

SamplingParams plain(float temperature = 1.0f) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  return p;
}

std::vector<float> logits_of(std::initializer_list<double> probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(float(std::log(p)));
  return l;
}

void expect_dist(const Dist& got, const std::vector<std::pair<int32_t, double>>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first) << "rank " << i;
    EXPECT_NEAR(got[i].second, want[i].second, 1e-6) << "rank " << i;
  }
}

TEST(Sampler, GreedyPicksTheLowestIdAmongTies) {
  Sampler s(plain(0.0f), 4);
  const std::vector<float> l = {1, 3, 3, 2};
  EXPECT_EQ(s.sample(l, {}), 1);
  expect_dist(s.distribution(l, {}), {{1, 1.0}});
  SamplingParams k1 = plain();
  k1.top_k = 1;  // top-1 is greedy too
  EXPECT_EQ(Sampler(k1, 4).sample(l, {}), 1);
}

TEST(Sampler, TemperatureSoftmax) {
  // p proportional to 1, 2, 4 at T = 1; logits 0, ln 4, ln 16 at T = 2 give the same.
  expect_dist(Sampler(plain(1.0f), 3).distribution(logits_of({1, 2, 4}), {}), {{2, 4.0 / 7}, {1, 2.0 / 7}, {0, 1.0 / 7}});
  const std::vector<float> l = {0.0f, float(std::log(4.0)), float(std::log(16.0))};
  expect_dist(Sampler(plain(2.0f), 3).distribution(l, {}), {{2, 4.0 / 7}, {1, 2.0 / 7}, {0, 1.0 / 7}});
}

// A NaN logit is a probability 0 (ranked last, as the GPU sampler ranks it), and greedy decoding never picks one, at id
// 0 either.
TEST(Sampler, NanLogitsHaveProbabilityZero) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> l = {nan, float(std::log(1.0)), nan, float(std::log(3.0))};
  expect_dist(Sampler(plain(1.0f), 4).distribution(l, {}), {{3, 0.75}, {1, 0.25}, {0, 0.0}, {2, 0.0}});
  SamplingParams k = plain();
  k.top_k = 3;
  expect_dist(Sampler(k, 4).distribution(l, {}), {{3, 0.75}, {1, 0.25}, {0, 0.0}});
  for (uint64_t seed = 0; seed < 50; ++seed) {
    SamplingParams q = plain();
    q.seed = seed;
    const int32_t t = Sampler(q, 4).sample(l, {});
    EXPECT_TRUE(t == 1 || t == 3) << "seed " << seed << " sampled " << t;
  }
  EXPECT_EQ(Sampler(plain(0.0f), 4).sample(l, {}), 3);  // greedy: the largest finite logit
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(Sampler(plain(0.0f), 4).sample(std::vector<float>{nan, -inf, 2.0f, -inf}, {}), 2);
}

// A row with no finite logit (a broken model: all NaN, all -inf, or a +inf) is an error that says what the row held,
// in every mode: it used to give id 0 (greedy) or a distribution of NaN probabilities.
TEST(Sampler, RowWithoutAFiniteLogitIsAnError) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<std::pair<std::vector<float>, std::string>> rows = {
      {{nan, nan, nan}, "(3 of 3 logits NaN, 0 -inf, 0 +inf after the penalties)"},
      {{-inf, nan, -inf}, "(1 of 3 logits NaN, 2 -inf, 0 +inf after the penalties)"},
      {{0.0f, inf, 1.0f}, "(0 of 3 logits NaN, 0 -inf, 1 +inf after the penalties)"},
  };
  for (const auto& [row, counts] : rows)
    for (float t : {0.0f, 1.0f}) {
      Sampler s(plain(t), 3);
      for (int call = 0; call < 2; ++call) {
        try {
          if (call == 0) (void)s.distribution(row, {});
          else (void)s.sample(row, {});
          ADD_FAILURE() << "no error for " << counts << " at temperature " << t;
        } catch (const plumb::Error& e) {
          EXPECT_NE(std::string(e.what()).find("no finite logit to sample from " + counts), std::string::npos) << e.what();
          EXPECT_NE(std::string(e.what()).find("the model's output is broken"), std::string::npos) << e.what();
        }
      }
    }
  // A finite row that the penalties overflow (a repeat penalty of 1e-40 divides 2 to +inf) names the penalties.
  SamplingParams p = plain(0.0f);
  p.repeat_penalty = 1e-40f;
  try {
    (void)Sampler(p, 3).sample(std::vector<float>{0.5f, 2.0f, -1.0f}, std::vector<int32_t>{1});
    ADD_FAILURE() << "no error for an overflowing penalty";
  } catch (const plumb::Error& e) {
    EXPECT_NE(std::string(e.what()).find("(0 of 3 logits NaN, 0 -inf, 1 +inf after the penalties): the penalties made the "
                                         "model's finite logits so (repeat_penalty (--repeat-penalty) 1e-40"),
              std::string::npos) << e.what();
  }
}

TEST(Sampler, TopK) {
  SamplingParams p = plain();
  p.top_k = 2;
  expect_dist(Sampler(p, 3).distribution(logits_of({1, 2, 4}), {}), {{2, 4.0 / 6}, {1, 2.0 / 6}});
}

TEST(Sampler, TopP) {
  // 0.5, 0.3, 0.15, 0.05: cumulative 0.5, 0.8, 0.95, 1.
  SamplingParams p = plain();
  p.top_p = 0.75f;
  expect_dist(Sampler(p, 4).distribution(logits_of({0.15, 0.5, 0.05, 0.3}), {}), {{1, 0.625}, {3, 0.375}});
  p.top_p = 0.85f;
  expect_dist(Sampler(p, 4).distribution(logits_of({0.15, 0.5, 0.05, 0.3}), {}),
              {{1, 0.5 / 0.95}, {3, 0.3 / 0.95}, {0, 0.15 / 0.95}});
}

TEST(Sampler, MinP) {
  SamplingParams p = plain();
  p.min_p = 0.25f;  // keeps p >= 0.125
  expect_dist(Sampler(p, 4).distribution(logits_of({0.15, 0.5, 0.05, 0.3}), {}),
              {{1, 0.5 / 0.95}, {3, 0.3 / 0.95}, {0, 0.15 / 0.95}});
  p.min_p = 0.35f;  // keeps p >= 0.175
  expect_dist(Sampler(p, 4).distribution(logits_of({0.15, 0.5, 0.05, 0.3}), {}), {{1, 0.625}, {3, 0.375}});
}

TEST(Sampler, RepeatPenalty) {
  // Seen tokens 0 and 1: 2 -> 2/2 = 1, -1 -> -1*2 = -2; unseen 0.5 and 1.5 stay.
  SamplingParams p = plain(0.0f);
  p.repeat_penalty = 2.0f;
  const std::vector<float> l = {2.0f, -1.0f, 0.5f, 1.5f};
  const std::vector<int32_t> hist = {0, 1, 0};
  EXPECT_EQ(Sampler(plain(0.0f), 4).sample(l, hist), 0);
  EXPECT_EQ(Sampler(p, 4).sample(l, hist), 3);
  p.temperature = 1.0f;
  const double z = std::exp(1.0) + std::exp(-2.0) + std::exp(0.5) + std::exp(1.5);
  expect_dist(Sampler(p, 4).distribution(l, hist),
              {{3, std::exp(1.5) / z}, {0, std::exp(1.0) / z}, {2, std::exp(0.5) / z}, {1, std::exp(-2.0) / z}});
}

TEST(Sampler, PresenceAndFrequencyPenalties) {
  // History 0, 0, 1: token 0 -> 1 - 1 - 2*0.5 = -1, token 1 -> 1 - 1 - 0.5 = -0.5, token 2 unchanged at 1.
  SamplingParams p = plain();
  p.presence_penalty = 1.0f;
  p.frequency_penalty = 0.5f;
  const double z = std::exp(-1.0) + std::exp(-0.5) + std::exp(1.0);
  expect_dist(Sampler(p, 3).distribution(std::vector<float>{1, 1, 1}, std::vector<int32_t>{0, 0, 1}),
              {{2, std::exp(1.0) / z}, {1, std::exp(-0.5) / z}, {0, std::exp(-1.0) / z}});
}

TEST(Sampler, PenaltyWindow) {
  // Only the last 2 tokens (1, 2) are penalized; token 0 is outside the window.
  SamplingParams p = plain(0.0f);
  p.presence_penalty = 10.0f;
  p.penalty_last_n = 2;
  EXPECT_EQ(Sampler(p, 3).sample(std::vector<float>{0, 1, 2}, std::vector<int32_t>{0, 1, 2}), 0);
  p.penalty_last_n = 0;  // off
  EXPECT_EQ(Sampler(p, 3).sample(std::vector<float>{0, 1, 2}, std::vector<int32_t>{0, 1, 2}), 2);
}

TEST(Sampler, SeedDeterminismAndFrequencies) {
  SamplingParams p = plain();
  p.seed = 42;
  const auto l = logits_of({1, 2, 4});
  Sampler a(p, 3), b(p, 3);
  std::vector<int32_t> sa, sb;
  for (int i = 0; i < 200; ++i) sa.push_back(a.sample(l, {})), sb.push_back(b.sample(l, {}));
  EXPECT_EQ(sa, sb);
  p.seed = 43;
  Sampler c(p, 3);
  std::vector<int32_t> sc;
  for (int i = 0; i < 200; ++i) sc.push_back(c.sample(l, {}));
  EXPECT_NE(sa, sc);
  std::map<int32_t, int> n;
  const int N = 20000;
  for (int i = 0; i < N; ++i) ++n[a.sample(l, {})];
  EXPECT_NEAR(n[2] / double(N), 4.0 / 7, 0.02);
  EXPECT_NEAR(n[1] / double(N), 2.0 / 7, 0.02);
  EXPECT_NEAR(n[0] / double(N), 1.0 / 7, 0.02);
}

// What a device sampler (backend cuda) does with the host Sampler: peek the next draw, walk the distribution with
// it, commit it only when the distribution kept more than one token. That must give sample()'s token sequence;
// penalty_window() is the window as sorted distinct (id, count) pairs.
TEST(Sampler, PeekedDrawsReproduceSample) {
  SamplingParams p;  // the defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05
  p.seed = 42, p.repeat_penalty = 1.2f, p.penalty_last_n = 5;
  Sampler a(p, 64), b(p, 64);
  std::mt19937 g(3);
  std::vector<int32_t> history = {1, 2, 2, 7};
  for (int step = 0; step < 300; ++step) {
    std::vector<float> logits(64);
    const float spread = step % 3 == 0 ? 30.0f : 3.0f;  // every third row nearly one-hot: a one-token distribution
    for (auto& x : logits) x = std::uniform_real_distribution<float>(0.0f, spread)(g);
    const int32_t want = a.sample(logits, history);
    const auto dist = b.distribution(logits, history);
    int32_t got = dist.back().first;
    if (dist.size() == 1) {
      got = dist[0].first;
    } else {
      const double u = b.peek_draw();
      EXPECT_EQ(u, b.peek_draw());  // peeking twice does not advance
      double cum = 0;
      for (const auto& [id, pr] : dist)
        if (u < (cum += pr)) {
          got = id;
          break;
        }
      b.commit_draw();
    }
    ASSERT_EQ(got, want) << "step " << step;
    history.push_back(want);
  }
  const auto w = b.penalty_window(std::vector<int32_t>{5, 3, 5, 9, 3, 3});  // last 5: 3, 5, 9, 3, 3
  EXPECT_EQ(w, (std::vector<std::pair<int32_t, int>>{{3, 3}, {5, 1}, {9, 1}}));
  EXPECT_TRUE(Sampler(plain(1.0f), 64).penalty_window(history).empty());  // no penalty: no window
}

TEST(Sampler, RejectsBadParameters) {
  SamplingParams p = plain();
  p.top_p = 0.0f;
  EXPECT_THROW(Sampler(p, 3), plumb::Error);
  p = plain();
  p.min_p = 1.5f;
  EXPECT_THROW(Sampler(p, 3), plumb::Error);
  p = plain();
  p.repeat_penalty = 0.0f;
  EXPECT_THROW(Sampler(p, 3), plumb::Error);
  p = plain();
  p.temperature = -1.0f;  // not silently greedy
  EXPECT_THROW(Sampler(p, 3), plumb::Error);
  EXPECT_THROW(Sampler(plain(), 3).distribution(std::vector<float>{1, 2}, {}), plumb::Error);
  // Penalties that would make every recent token's logit NaN or -inf (the draw then undefined).
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (float v : {nan, inf, -inf}) {
    p = plain();
    p.presence_penalty = v;
    EXPECT_THROW(plumb::check_sampling(p), plumb::Error) << "presence " << v;
    p = plain();
    p.frequency_penalty = v;
    EXPECT_THROW(plumb::check_sampling(p), plumb::Error) << "frequency " << v;
    p = plain();
    p.repeat_penalty = v;
    EXPECT_THROW(Sampler(p, 3), plumb::Error) << "repeat " << v;
  }
  EXPECT_NO_THROW(plumb::check_sampling(plain()));
  // The error's parts: the field, its flag, the rule; what() joins them.
  p = plain();
  p.top_p = 7.0f;
  try {
    plumb::check_sampling(p);
    ADD_FAILURE() << "top_p 7 accepted";
  } catch (const plumb::SamplingError& e) {
    EXPECT_EQ(e.field, "top_p");
    EXPECT_EQ(e.flag, "--top-p");
    EXPECT_EQ(e.rule, "must be in (0, 1], got 7");
    EXPECT_STREQ(e.what(), "top_p (--top-p) must be in (0, 1], got 7");
  }
  p = plain();
  p.penalty_last_n = -2;
  EXPECT_THROW(plumb::check_sampling(p), plumb::SamplingError);
}

// What generate() refuses before any forward, also callable before a model loads (the CLI does).
TEST(Generate, CheckOptionsNamesTheOption) {
  plumb::GenerateOptions g;
  EXPECT_NO_THROW(plumb::check_generate_options(g));
  g.max_tokens = 0;
  try {
    plumb::check_generate_options(g);
    ADD_FAILURE() << "max_tokens 0 accepted";
  } catch (const plumb::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--max-tokens"), std::string::npos) << e.what();
  }
  g = {};
  g.sampling.top_p = 2.0f;
  EXPECT_THROW(plumb::check_generate_options(g), plumb::Error);
}

TEST(StopMatcher, MatchesAcrossPiecesAndHoldsBackPrefixes) {
  plumb::StopMatcher m({"o w", "END"});
  bool stopped = false;
  EXPECT_EQ(m.push("Hel", stopped), "Hel");
  EXPECT_FALSE(stopped);
  EXPECT_EQ(m.push("lo", stopped), "l");  // "o" may start "o w": held back
  EXPECT_EQ(m.push(" wor", stopped), "");    // "o w" completed: nothing after it is emitted
  EXPECT_TRUE(stopped);
  EXPECT_EQ(m.flush(), "or");  // (what followed the stop string, kept for a caller that wants it)

  plumb::StopMatcher k({"END"});
  EXPECT_EQ(k.push("abcE", stopped), "abc");
  EXPECT_EQ(k.push("N", stopped), "");
  EXPECT_EQ(k.push("x", stopped), "ENx");  // not a stop after all: released
  EXPECT_FALSE(stopped);
  EXPECT_EQ(k.push("E", stopped), "");
  EXPECT_EQ(k.flush(), "E");
  EXPECT_THROW(plumb::StopMatcher({""}), plumb::Error);
}

// A session that "predicts" a fixed script: the logits after the k-th forward call peak at script[k]. `info` is the
// model it claims to run (generate() reads the vocabulary, EOS and context there).
class ScriptedSession : public plumb::Session {
 public:
  ScriptedSession(std::vector<int32_t> script, plumb::ModelInfo info)
      : script_(std::move(script)), info_(std::move(info)), vocab_(info_.vocab_size) {}
  std::vector<float> forward(std::span<const int32_t> tokens) override {
    fed.insert(fed.end(), tokens.begin(), tokens.end());
    pos_ += int64_t(tokens.size());
    std::vector<float> l(size_t(vocab_), 0.0f);
    const int32_t next = script_.at(calls++);
    if (next < 0) std::fill(l.begin(), l.end(), std::numeric_limits<float>::quiet_NaN());  // a broken model's row
    else l[size_t(next)] = 10.0f;
    return l;
  }
  std::vector<float> forward_all(std::span<const int32_t> tokens) override { return forward(tokens); }
  int64_t position() const override { return pos_; }
  void reset() override { pos_ = 0, fed.clear(), calls = 0; }
  const plumb::ModelInfo& info() const override { return info_; }
  std::vector<int32_t> fed;
  size_t calls = 0;

 private:
  std::vector<int32_t> script_;
  plumb::ModelInfo info_;
  int32_t vocab_;
  int64_t pos_ = 0;
};

struct GenerateFixture : ::testing::Test {
  plumb::Tokenizer tok = plumb::Tokenizer::load(PLUMB_TEST_DATA "/../../models/tiny");
  plumb::ModelInfo info;
  GenerateFixture() {
    info.vocab_size = 1216;
    info.bos_token = 0;
    info.eos_token = 1;
    info.max_positions = 2048;
  }
  plumb::GenerateOptions greedy(int max_tokens = 100) {
    plumb::GenerateOptions g;
    g.sampling = plain(0.0f);
    g.max_tokens = max_tokens;
    g.stop_tokens = {1};
    return g;
  }
};

TEST_F(GenerateFixture, StopsAtTheStopTokenAndStreamsEveryPiece) {
  const std::string text = " there was a café ☕ by the river.";
  auto script = tok.encode(text);
  script.push_back(1);  // EOS
  ScriptedSession s(script, info);
  const std::vector<int32_t> prompt = {0, 20, 21};
  std::string streamed;
  const auto r = plumb::generate(s, tok, prompt, greedy(), [&](std::string_view p) { streamed += p; });
  EXPECT_EQ(r.text, text);
  EXPECT_EQ(streamed, text);
  EXPECT_EQ(r.stop, plumb::StopReason::Token);
  EXPECT_EQ(r.tokens, script);
  EXPECT_EQ(r.unfed, 1);
  // Fed: the prompt, then every sampled token but the last.
  std::vector<int32_t> fed = prompt;
  fed.insert(fed.end(), script.begin(), script.end() - 1);
  EXPECT_EQ(s.fed, fed);
  EXPECT_EQ(r.prompt_tokens, 3);
}

TEST_F(GenerateFixture, StopStringAcrossTokens) {
  const auto script = tok.encode(" there was a cat. The end.");
  ScriptedSession s(script, info);
  auto g = greedy();
  g.stop_strings = {"cat. T"};
  std::string streamed;
  const auto r = plumb::generate(s, tok, std::vector<int32_t>{0}, g, [&](std::string_view p) { streamed += p; });
  EXPECT_EQ(r.stop, plumb::StopReason::String);
  EXPECT_EQ(r.text, " there was a ");
  EXPECT_EQ(streamed, r.text);
}

TEST_F(GenerateFixture, MaxTokensAndContextEnd) {
  const auto script = tok.encode(" one two three four five six");
  {
    ScriptedSession s(script, info);
    const auto r = plumb::generate(s, tok, std::vector<int32_t>{0}, greedy(3));
    EXPECT_EQ(r.stop, plumb::StopReason::Length);
    EXPECT_EQ(r.tokens.size(), 3u);
    EXPECT_EQ(s.position(), 3);  // prompt + 2 fed; the third token is unfed
  }
  {
    plumb::ModelInfo small = info;
    small.max_positions = 3;  // prompt 1 + 2 fed tokens fill it
    ScriptedSession s(script, small);
    const auto r = plumb::generate(s, tok, std::vector<int32_t>{0}, greedy());
    EXPECT_EQ(r.stop, plumb::StopReason::Context);
    EXPECT_EQ(r.tokens.size(), 3u);
    EXPECT_EQ(s.position(), 3);
  }
}

TEST_F(GenerateFixture, ErrorsLeaveTheSessionUntouched) {
  auto expect_error = [&](std::vector<int32_t> prompt, plumb::ModelInfo mi, plumb::GenerateOptions g, const char* part) {
    ScriptedSession s({1, 1, 1}, mi);
    try {
      plumb::generate(s, tok, prompt, g);
      FAIL() << "no error for " << part;
    } catch (const plumb::Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
    EXPECT_EQ(s.calls, 0u);
    EXPECT_EQ(s.position(), 0);
  };
  expect_error({}, info, greedy(), "empty prompt");
  expect_error({0}, plumb::ModelInfo{}, greedy(), "the session's info() names no vocabulary");
  expect_error({0, 5000}, info, greedy(), "outside the model's vocabulary");
  plumb::ModelInfo small = info;
  small.max_positions = 2;
  expect_error({0, 5, 6}, small, greedy(), "context is 2 tokens");
  auto g = greedy();
  g.stop_tokens = {-3};
  expect_error({0}, info, g, "stop token -3");
  expect_error({0}, info, greedy(0), "--max-tokens");
}

// The model's EOS stops without being listed (stop_at_eos), unless switched off; should_stop ends the generation
// as a stop does, the result whole (its unfed token continues the session).
TEST_F(GenerateFixture, EosStopsByDefaultAndShouldStopCancels) {
  auto script = tok.encode(" one two");
  script.push_back(1);  // info.eos_token
  script.push_back(20);
  plumb::GenerateOptions g;
  g.sampling = plain(0.0f);
  {
    ScriptedSession s(script, info);
    const auto r = plumb::generate(s, tok, std::vector<int32_t>{0}, g);  // no stop_tokens given
    EXPECT_EQ(r.stop, plumb::StopReason::Token);
    EXPECT_EQ(r.tokens.back(), 1);
  }
  {
    ScriptedSession s(script, info);
    g.stop_at_eos = false, g.max_tokens = int(script.size());
    const auto r = plumb::generate(s, tok, std::vector<int32_t>{0}, g);
    EXPECT_EQ(r.stop, plumb::StopReason::Length);
    EXPECT_EQ(r.tokens, script);
  }
  {
    ScriptedSession s(script, info);
    int asked = 0;
    g.stop_at_eos = true, g.max_tokens = 100;
    g.should_stop = [&] { return ++asked == 2; };
    std::string streamed;
    const auto r = plumb::generate(s, tok, std::vector<int32_t>{0}, g, [&](std::string_view p) { streamed += p; });
    EXPECT_EQ(r.stop, plumb::StopReason::Cancelled);
    EXPECT_EQ(r.tokens, std::vector<int32_t>(script.begin(), script.begin() + 2));
    EXPECT_EQ(r.unfed, script[1]);
    EXPECT_EQ(s.position(), 2);  // the prompt and the first token: the second is unfed
    EXPECT_EQ(streamed, tok.decode(r.tokens));
    EXPECT_EQ(std::string(plumb::stop_reason_name(r.stop)), "cancelled");
  }
}

TEST_F(GenerateFixture, SkipSpecialDropsSpecialTokensFromTheText) {
  auto script = tok.encode("Hi");
  script.push_back(0);  // BOS: special, not a stop token here
  script.push_back(1);
  ScriptedSession s(script, info);
  auto g = greedy();
  g.skip_special = true;
  EXPECT_EQ(plumb::generate(s, tok, std::vector<int32_t>{0}, g).text, "Hi");
}

// The bundled model end to end through the public API (plumb/engine.h + plumb/text.h).
struct TinyModel : ::testing::Test {
  static std::shared_ptr<plumb::Engine> engine() {
    static auto e = plumb::Engine::load(std::string(PLUMB_TEST_DATA) + "/../../models/tiny");
    return e;
  }
  plumb::Tokenizer tok = plumb::Tokenizer::load(PLUMB_TEST_DATA "/../../models/tiny");
  plumb::GenerateOptions greedy() {
    plumb::GenerateOptions g;
    g.sampling = plain(0.0f);
    g.max_tokens = 40;
    g.stop_tokens = {engine()->info().eos_token};
    return g;
  }
};

TEST_F(TinyModel, AnswersInChatFormat) {
  auto s = engine()->new_session();
  const auto prompt = tok.encode(plumb::encode_chat({{"user", "What color is the sky?", ""}}, plumb::ChatOptions{}));
  const auto r = plumb::generate(*s, tok, prompt, greedy());
  EXPECT_EQ(r.stop, plumb::StopReason::Token);
  EXPECT_NE(r.text.find("blue"), std::string::npos) << r.text;
}

// A continued session samples with penalties as the whole sequence in one call does once history_before names what
// it holds (a server's cached prefix); without it the penalties miss those tokens. The prompt repeats itself, so the
// penalties change what greedy picks (checked: the two uncontinued results differ).
TEST_F(TinyModel, HistoryBeforeGivesContinuedSessionsTheWholePenaltyWindow) {
  const auto prompt = plumb::encode_prompt(tok, "1 2 3 1 2 3 1 2 3 1 2", engine()->info().bos_token);
  plumb::GenerateOptions g = greedy();
  g.max_tokens = 12;
  g.sampling.repeat_penalty = 3.0f;
  g.sampling.presence_penalty = 2.0f;
  g.sampling.penalty_last_n = -1;
  auto whole = engine()->new_session();
  const auto want = plumb::generate(*whole, tok, prompt, g);
  const std::span<const int32_t> all(prompt), head = all.first(prompt.size() - 1), last = all.last(1);
  auto continued = [&](bool with_history) {
    auto s = engine()->new_session();
    s->forward(head);
    plumb::GenerateOptions c = g;
    if (with_history) c.history_before.assign(head.begin(), head.end());
    return plumb::generate(*s, tok, last, c).tokens;
  };
  EXPECT_EQ(continued(true), want.tokens);
  EXPECT_NE(continued(false), want.tokens);  // (what the window misses without it: the test's premise)
}

// on_logits: the logits each token was drawn from, on the host; the same tokens as the sampler on the session's side.
TEST_F(TinyModel, OnLogitsSeesEachStepAndChangesNoToken) {
  const auto prompt = plumb::encode_prompt(tok, "Once upon a time", engine()->info().bos_token);
  plumb::GenerateOptions g = greedy();
  g.sampling = SamplingParams{};
  g.sampling.seed = 11;
  g.max_tokens = 20;
  auto a = engine()->new_session();
  const auto want = plumb::generate(*a, tok, prompt, g);
  std::vector<int32_t> seen;
  std::vector<float> first;
  g.on_logits = [&](std::span<const float> logits, int32_t id) {
    if (seen.empty()) first.assign(logits.begin(), logits.end());
    seen.push_back(id);
  };
  auto b = engine()->new_session();
  const auto got = plumb::generate(*b, tok, prompt, g);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(seen, got.tokens);
  auto c = engine()->new_session();
  EXPECT_EQ(first, c->forward(prompt));
}

// A row without a finite logit stops the generation with an error naming the token and the position whose logits
// they were: from a scripted session, and from the bundled fixture whose router underflows under the planted fault
// that drops the renormalization's floor (0/0: NaN through the rest of the model).
TEST_F(GenerateFixture, NoFiniteLogitIsAnErrorNamingThePosition) {
  ScriptedSession s({5, -1}, info);
  try {
    plumb::generate(s, tok, std::vector<int32_t>{0, 20, 21}, greedy());
    ADD_FAILURE() << "NaN logits sampled";
  } catch (const plumb::Error& e) {
    EXPECT_NE(std::string(e.what()).find("generating token 2 (from the logits of position 3): sampler: no finite logit to "
                                         "sample from (1216 of 1216 logits NaN"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.position(), 4);  // the tokens were fed
}

TEST_F(GenerateFixture, NanFromAPlantedFaultIsAnError) {
  plumb::EngineOptions eo;
  eo.patches = "fault.renorm_unfloored";
  auto e = plumb::Engine::load(PLUMB_TEST_DATA "/golden/router-underflow", eo);
  auto s = e->new_session();
  plumb::GenerateOptions g = greedy(4);
  g.stop_tokens.clear();
  try {
    const auto r = plumb::generate(*s, tok, std::vector<int32_t>{0, 5, 7, 9}, g);
    ADD_FAILURE() << "generated " << r.tokens.size() << " tokens from the faulty model";
  } catch (const plumb::Error& e) {
    EXPECT_NE(std::string(e.what()).find("prefilling the prompt's 4 tokens (positions 0-3) and sampling token 1 from the last "
                                         "one's logits: sampler: no finite logit to sample from (256 of 256 logits NaN, 0 "
                                         "-inf, 0 +inf after the penalties): the model's output is broken"),
              std::string::npos) << e.what();
  }
}

// A prefill reports its progress: on the CPU after each layer of each pass (the passes done plus this one's share by
// layers) but the last layer of the last pass, through forward, forward_all and forward_sample; never for a one-token
// call, nor after the progress is cleared; the results are those of a session without it.
TEST_F(TinyModel, PrefillProgressReportsByLayers) {
  plumb::EngineOptions o;
  o.prefill_chunk = 4;
  const auto e = plumb::Engine::load(std::string(PLUMB_TEST_DATA) + "/../../models/tiny", o);
  ASSERT_NE(e->info().summary.find("4 layers"), std::string::npos) << e->info().summary;
  auto s = e->new_session(), ref = e->new_session();
  using Seen = std::vector<std::pair<int64_t, int64_t>>;
  Seen seen;
  s->set_prefill_progress([&](int64_t done, int64_t total) { seen.push_back({done, total}); });
  const std::vector<int32_t> ten = {0, 5, 6, 7, 8, 9, 10, 11, 12, 13}, six = {14, 15, 16, 17, 18, 19};
  // Passes of 4, 4 and 2 tokens over 4 layers: 4 * k / 4 within the first two, 2 * k / 4 within the last.
  const Seen ten_seen = {{1, 10}, {2, 10}, {3, 10}, {4, 10}, {5, 10}, {6, 10}, {7, 10}, {8, 10}, {8, 10}, {9, 10}, {9, 10}};
  EXPECT_EQ(s->forward(ten), ref->forward(ten));
  EXPECT_EQ(seen, ten_seen);
  seen.clear();
  EXPECT_EQ(s->forward_all(six), ref->forward_all(six));
  EXPECT_EQ(seen, (Seen{{1, 6}, {2, 6}, {3, 6}, {4, 6}, {4, 6}, {5, 6}, {5, 6}}));
  seen.clear();
  plumb::Sampler a(plain(0.0f), e->info().vocab_size), b(plain(0.0f), e->info().vocab_size);
  EXPECT_EQ(s->forward_sample(ten, a, ten), ref->forward_sample(ten, b, ten));
  EXPECT_EQ(seen, ten_seen);
  seen.clear();
  s->forward(std::vector<int32_t>{5});  // a decode step: no report
  EXPECT_TRUE(seen.empty());
  s->set_prefill_progress({});
  s->forward(ten);
  EXPECT_TRUE(seen.empty());
}

// A session carries its model: info() is the engine's, and it stays valid (and generates) after the last reference
// to the Engine is gone.
TEST_F(TinyModel, SessionOutlivesItsEngine) {
  auto e = plumb::Engine::load(std::string(PLUMB_TEST_DATA) + "/../../models/tiny");
  auto s = e->new_session();
  EXPECT_EQ(&s->info(), &e->info());
  const plumb::ModelInfo expect = e->info();
  e.reset();
  EXPECT_EQ(s->info().vocab_size, expect.vocab_size);
  EXPECT_EQ(s->info().eos_token, expect.eos_token);
  EXPECT_EQ(s->info().summary, expect.summary);
  const auto r = plumb::generate(*s, tok, tok.encode(plumb::encode_chat({{"user", "What color is the sky?", ""}}, {})), greedy());
  EXPECT_NE(r.text.find("blue"), std::string::npos) << r.text;
}

// A Session refuses to pass the model's context and a sampler of another vocabulary before anything is fed; it
// cannot be copied (one cache timeline).
TEST_F(TinyModel, SessionRefusesThePastContextAndAnotherVocabulary) {
  static_assert(!std::is_copy_constructible_v<plumb::Session> && !std::is_copy_assignable_v<plumb::Session>);
  static_assert(!std::is_copy_constructible_v<plumb::Engine> && !std::is_copy_assignable_v<plumb::Engine>);
  auto s = engine()->new_session();
  const int64_t ctx = engine()->info().max_positions;
  ASSERT_EQ(ctx, 2048);
  const std::vector<int32_t> ids(size_t(ctx) + 1, 5);
  try {
    s->forward(ids);
    ADD_FAILURE() << "a forward past the context ran";
  } catch (const plumb::Error& e) {
    EXPECT_NE(std::string(e.what()).find("2049 tokens at position 0 would reach position 2049, past the model's context "
                                         "of 2048"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s->position(), 0);
  plumb::Sampler other(plain(0.0f), 10);
  EXPECT_EQ(other.vocab(), 10);
  const std::vector<int32_t> p = {0, 5, 6};
  EXPECT_THROW(s->forward_sample(p, other, p), plumb::Error);
  EXPECT_EQ(s->position(), 0);
  plumb::Sampler right(plain(0.0f), engine()->info().vocab_size);
  s->forward_sample(p, right, p);
  EXPECT_EQ(s->position(), 3);
}

// Session::reserve is a hint: on the CPU backend it changes nothing (the same logits after it), and a negative count
// is refused by name.
TEST_F(TinyModel, ReserveIsAHintThatChangesNoLogits) {
  auto a = engine()->new_session(), b = engine()->new_session();
  a->reserve(100000);  // past the model's context: clamped, not refused
  const auto ids = tok.encode("Once upon a time");
  EXPECT_EQ(a->forward(ids), b->forward(ids));
  EXPECT_THROW(a->reserve(-1), plumb::Error);
  EXPECT_EQ(a->position(), int64_t(ids.size()));
}

TEST_F(TinyModel, ChatTurnsOnOneSessionMatchTheWholeConversation) {
  // Turn 2 prefilled on the kept cache (the previous reply's EOS + the new user turn) must leave the session in
  // the state a fresh session reaches by prefilling the whole conversation as encode_chat renders it.
  const plumb::ChatOptions co{false, false, true, "", {}};
  auto s = engine()->new_session();
  const auto p1 = tok.encode(plumb::chat_prefix("", co) + plumb::chat_user_turn("My name is Tom.", false));
  const auto r1 = plumb::generate(*s, tok, p1, greedy());
  ASSERT_EQ(r1.stop, plumb::StopReason::Token);
  std::vector<int32_t> p2 = {r1.unfed};
  const auto turn2 = tok.encode(plumb::chat_user_turn("What is my name?", false));
  p2.insert(p2.end(), turn2.begin(), turn2.end());
  const auto incremental = s->forward(p2);

  // What the session holds, as tokens, is the official rendering of the conversation, as text.
  std::vector<int32_t> whole = p1;
  whole.insert(whole.end(), r1.tokens.begin(), r1.tokens.end());
  whole.insert(whole.end(), turn2.begin(), turn2.end());
  EXPECT_EQ(int64_t(whole.size()), s->position());
  const std::vector<plumb::ChatMessage> ms = {{"user", "My name is Tom.", ""}, plumb::parse_reply(r1.text, false),
                                              {"user", "What is my name?", ""}};
  EXPECT_EQ(tok.decode(whole), plumb::encode_chat(ms, co));
  auto fresh = engine()->new_session();
  const auto reference = fresh->forward(whole);
  ASSERT_EQ(incremental.size(), reference.size());
  float worst = 0, scale = 0;
  for (size_t i = 0; i < reference.size(); ++i) {
    worst = std::max(worst, std::abs(incremental[i] - reference[i]));
    scale = std::max(scale, std::abs(reference[i]));
  }
  EXPECT_LE(worst, 1e-4f * scale);
}

// EngineOptions::prefill_chunk: a long Session call runs as several passes; the logits are the one-pass logits
// (the caches carry across passes), and a bad token anywhere leaves the session untouched before any pass runs.
TEST(EngineChunking, PassesGiveTheOnePassLogits) {
  const std::string dir = std::string(PLUMB_TEST_DATA) + "/golden/csa-long";  // CSA/HCA windows of 4/8, window 8
  plumb::EngineOptions one, chunked;
  one.prefill_chunk = 0, chunked.prefill_chunk = 7;
  const auto a = plumb::Engine::load(dir, one), b = plumb::Engine::load(dir, chunked);
  std::vector<int32_t> toks(150);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = int32_t((i * 37 + 11) % 256);
  auto sa = a->new_session(), sb = b->new_session();
  const auto la = sa->forward_all(toks), lb = sb->forward_all(toks);
  ASSERT_EQ(la.size(), lb.size());
  for (size_t i = 0; i < la.size(); ++i) ASSERT_NEAR(la[i], lb[i], 1e-5 * std::max(1.0f, std::fabs(la[i]))) << "logit " << i;
  EXPECT_EQ(sb->position(), 150);
  // forward(): the last row, through the chunked passes too.
  auto sc = b->new_session();
  const auto last = sc->forward(toks);
  for (size_t i = 0; i < last.size(); ++i) ASSERT_NEAR(last[i], la[la.size() - last.size() + i], 1e-5 * std::max(1.0f, std::fabs(last[i])));
  // A bad id in the last pass: refused before the first pass runs.
  auto sd = b->new_session();
  auto bad = toks;
  bad[140] = 999;
  EXPECT_THROW(sd->forward(bad), plumb::Error);
  EXPECT_EQ(sd->position(), 0);
  plumb::EngineOptions neg;
  neg.prefill_chunk = -1;
  EXPECT_THROW(plumb::Engine::load(dir, neg), plumb::Error);
}

// EngineOptions::on_progress on the CPU: each layer once as it is bound, in order, and no "upload" stage (that is
// the GPU's copy, test_cuda_forward.cpp).
TEST(EngineProgress, ReportsEachLayerBound) {
  plumb::EngineOptions o;
  std::vector<std::string> seen;
  o.on_progress = [&](const plumb::LoadProgress& p) { seen.push_back(fmt::format("{} {}/{}", p.stage, p.done, p.total)); };
  plumb::Engine::load(std::string(PLUMB_TEST_DATA) + "/../../models/tiny", o);
  EXPECT_EQ(seen, (std::vector<std::string>{"layers 1/4", "layers 2/4", "layers 3/4", "layers 4/4"}));
}

// plumb::set_notice_sink: the library's one-line notes reach the sink whole, one call per line and without its
// newline, from any thread; an empty sink gives them back to stderr.
TEST(EngineNotices, GoToTheSinkThatIsSet) {
  std::vector<std::string> got;
  plumb::set_notice_sink([&](std::string_view line) { got.emplace_back(line); });
  plumb::notice("backend x: first");
  std::thread([] { plumb::notice("backend x: from another thread"); }).join();
  plumb::set_notice_sink({});
  testing::internal::CaptureStderr();
  plumb::notice("backend x: on stderr");
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "backend x: on stderr\n");
  EXPECT_EQ(got, (std::vector<std::string>{"backend x: first", "backend x: from another thread"}));
}

}  // namespace
