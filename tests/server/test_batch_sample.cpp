// `plumb serve --parallel N` sampling in the batch (EngineThread::step_sample, plumb::forward_batch_sample): rows that
// sample and rows whose logits come back share one step; a row's own failure reaches only its caller; the server's
// responses are those of one generation at a time. On the CPU a batched row is its session's own bits and its draw
// the host's, so every token must match exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <future>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "running_server.h"
#include "server/engine_thread.h"

namespace plumb::server {
namespace {

using testing::Running;
using testing::tiny_engine;
using testing::with_parallel;

SamplingParams seeded(uint64_t seed, float temperature) {
  SamplingParams p;
  p.seed = seed, p.temperature = temperature, p.presence_penalty = 50.0f;  // (a penalty: the history must arrive too)
  return p;
}

// The n ids of the highest logits (a history that the penalty makes matter).
std::vector<int32_t> top_ids(const std::vector<float>& logits, size_t n) {
  std::vector<int32_t> ids(logits.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
  std::partial_sort(ids.begin(), ids.begin() + std::ptrdiff_t(n), ids.end(),
                    [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
  ids.resize(n);
  return ids;
}

// Only the even ids.
void even_ids(std::span<uint32_t> bits) {
  for (uint32_t& w : bits) w = 0x55555555u;
}

// The steps in `fs`, each on a thread of its own, queued while a job holds the engine thread, so that they all wait
// together and go as one batch.
void queued_together(EngineThread& et, const std::vector<std::function<void()>>& fs) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::thread holder([&] { et.run([&] { released.wait(); }); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // (the job runs: the steps below wait together)
  std::vector<std::thread> ts;
  for (const auto& f : fs) ts.emplace_back(f);
  std::this_thread::sleep_for(std::chrono::milliseconds(250));  // (each thread has queued its step)
  release.set_value();
  holder.join();
  for (auto& t : ts) t.join();
}

// What the call threw ("" for nothing).
template <class F>
std::string thrown_by(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// One batch of five: a step() (its logits), an unmasked draw, a masked draw, a mask that throws and a mask that lets
// nothing through (no finite logit: the sampler refuses). The good three get what their own calls on plain sessions
// give (the sampler's RNG left where sample() leaves it: the next draws agree too); the two failures reach only their
// callers, their tokens fed; every row ran in the one batch, four of them sampled there.
TEST(BatchSample, EngineThreadMixesLogitRowsSampledRowsAndFailingRowsInOneBatch) {
  EngineThread et;
  const Engine& e = *tiny_engine();
  const int32_t V = e.info().vocab_size;
  std::vector<std::unique_ptr<QueuedSession>> q;
  std::vector<std::unique_ptr<Session>> twin;
  for (int i = 0; i < 5; ++i) {
    q.push_back(std::make_unique<QueuedSession>(et, e)), twin.push_back(e.new_session());
    const std::vector<int32_t> prompt = {0, int32_t(20 + i), 21, 22};
    q.back()->forward(prompt), twin.back()->forward(prompt);
  }
  // What the rows' own calls give: b's and c's logits on plain sessions, each with a history of its likeliest tokens
  // (their draws without it differ: the penalty shows whether the history reached the batch).
  const std::vector<float> lb = twin[1]->forward(std::vector<int32_t>{24});
  std::vector<float> lc = twin[2]->forward(std::vector<int32_t>{25});
  for (size_t i = 1; i < lc.size(); i += 2) lc[i] = -INFINITY;
  const std::vector<int32_t> hb = top_ids(lb, 8), hc = top_ids(lc, 8), hd = {0, 20, 21};
  ASSERT_NE(Sampler(seeded(7, 0.9f), V).sample(lb, hb), Sampler(seeded(7, 0.9f), V).sample(lb, {}));
  ASSERT_NE(Sampler(seeded(8, 0.9f), V).sample(lc, hc), Sampler(seeded(8, 0.9f), V).sample(lc, {}));

  Sampler sb(seeded(7, 0.9f), V), sc(seeded(8, 0.9f), V), sd(seeded(9, 0.9f), V), se(seeded(10, 0.9f), V);
  Sampler tb(seeded(7, 0.9f), V), tc(seeded(8, 0.9f), V);
  std::vector<float> logits_a;
  int32_t tok_b = -1, tok_c = -1;
  std::string err_a, err_b, err_c, err_d, err_e;
  const EngineThread::Counts before = et.counts();
  queued_together(et, {
      [&] { err_a = thrown_by([&] { logits_a = q[0]->forward(std::vector<int32_t>{23}); }); },
      [&] { err_b = thrown_by([&] { tok_b = q[1]->forward_sample(std::vector<int32_t>{24}, sb, hb); }); },
      [&] { err_c = thrown_by([&] { tok_c = q[2]->forward_sample_masked(std::vector<int32_t>{25}, sc, hc, even_ids); }); },
      [&] {
        auto broken = [](std::span<uint32_t>) { throw std::runtime_error("mask d broke"); };
        err_d = thrown_by([&] { q[3]->forward_sample_masked(std::vector<int32_t>{26}, sd, hd, broken); });
      },
      [&] {
        auto none = [](std::span<uint32_t>) {};
        err_e = thrown_by([&] { q[4]->forward_sample_masked(std::vector<int32_t>{27}, se, hd, none); });
      },
  });
  const EngineThread::Counts after = et.counts();
  EXPECT_EQ(after.batches - before.batches, 1) << "the five steps did not go as one batch";
  EXPECT_EQ(after.rows - before.rows, 5);
  EXPECT_EQ(after.sampled - before.sampled, 4) << "the sampling calls' rows were not sampled in the batch";
  EXPECT_EQ(after.largest, 5);
  EXPECT_EQ(err_a, "");
  EXPECT_EQ(err_b, "");
  EXPECT_EQ(err_c, "");
  EXPECT_EQ(err_d, "mask d broke");
  EXPECT_NE(err_e.find("no finite logit"), std::string::npos) << err_e;
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(q[i]->position(), 5) << "session " << i;  // (a failed row's token stays fed)

  EXPECT_EQ(logits_a, twin[0]->forward(std::vector<int32_t>{23}));
  EXPECT_EQ(tok_b, tb.sample(lb, hb));
  EXPECT_EQ(tok_c, tc.sample(lc, hc));
  EXPECT_EQ(tok_c % 2, 0);
  // The next draws, alone: the batch left each RNG where sample() leaves it.
  const std::vector<int32_t> next_b = {tok_b}, next_c = {tok_c};
  EXPECT_EQ(q[1]->forward_sample(next_b, sb, hb), tb.sample(twin[1]->forward(next_b), hb));
  EXPECT_EQ(q[2]->forward_sample(next_c, sc, hc), tc.sample(twin[2]->forward(next_c), hc));
}

// A batch that forward_batch_sample refuses before feeding (a sampler made for another vocabulary; a token outside the
// vocabulary): each step runs alone, so the refusal reaches only its own caller, and the others get their tokens and
// logits, their sessions one step on.
TEST(BatchSample, ARefusedSampledStepFailsOnlyItsOwnCaller) {
  EngineThread et;
  const Engine& e = *tiny_engine();
  const int32_t V = e.info().vocab_size;
  const std::vector<int32_t> head = {0, 20, 21, 22};
  QueuedSession good(et, e), sampled(et, e), wrong_vocab(et, e), bad_token(et, e);
  auto twin_good = e.new_session(), twin_sampled = e.new_session();
  for (Session* s : std::initializer_list<Session*>{&good, &sampled, &wrong_vocab, &bad_token, twin_good.get(), twin_sampled.get()})
    s->forward(head);
  Sampler s1(seeded(3, 0.8f), V), t1(seeded(3, 0.8f), V), small(seeded(4, 0.8f), V - 1), s3(seeded(5, 0.8f), V);
  std::vector<float> got;
  int32_t tok = -1;
  std::string e_good, e_sampled, e_vocab, e_token;
  const EngineThread::Counts before = et.counts();
  queued_together(et, {
      [&] { e_good = thrown_by([&] { got = good.forward(std::vector<int32_t>{23}); }); },
      [&] { e_sampled = thrown_by([&] { tok = sampled.forward_sample(std::vector<int32_t>{24}, s1, head); }); },
      [&] { e_vocab = thrown_by([&] { wrong_vocab.forward_sample(std::vector<int32_t>{25}, small, head); }); },
      [&] { e_token = thrown_by([&] { bad_token.forward_sample_masked(std::vector<int32_t>{V}, s3, head, even_ids); }); },
  });
  EXPECT_EQ(et.counts().batches, before.batches) << "a refused batch was counted";
  EXPECT_EQ(e_good, "");
  EXPECT_EQ(e_sampled, "");
  EXPECT_NE(e_vocab.find("vocabulary"), std::string::npos) << e_vocab;
  EXPECT_NE(e_token, "") << "a token outside the vocabulary was accepted";
  EXPECT_EQ(good.position(), 5);
  EXPECT_EQ(sampled.position(), 5);
  EXPECT_EQ(wrong_vocab.position(), 4);
  EXPECT_EQ(bad_token.position(), 4);
  EXPECT_EQ(got, twin_good->forward(std::vector<int32_t>{23}));
  EXPECT_EQ(tok, t1.sample(twin_sampled->forward(std::vector<int32_t>{24}), head));
}

// Everything of a response but its ids, times and which slot's cache it found.
json response_parts(json r) {
  r.erase("id"), r.erase("created");
  if (r.contains("usage")) r["usage"].erase("prompt_tokens_details");
  return r;
}

// Requests sampled (seeded, temperature > 0), greedy, held to JSON (a mask) and with logprobs (their rows' logits
// come back), sent at once: each response is the one --parallel 1 gives, one after another. Steps ran batched, rows
// of both kinds in them: without logprobs every batched row is sampled in the batch.
TEST(BatchSample, ConcurrentRequestsSampledInTheBatchGetTheResponsesOfOneAtATime) {
  const json chat = json::array({{{"role", "user"}, {"content", "Give me JSON."}}});
  using plumb_test::tokens;  // (a quarter of the tokens under the sanitizers: the generations still overlap and are compared; the Release run generates them all)
  std::vector<std::pair<std::string, json>> plain = {
      {"/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", tokens(60)}, {"ignore_eos", true}, {"seed", 1},
                           {"temperature", 0.9}}},
      {"/v1/completions", {{"prompt", "The sea"}, {"max_tokens", tokens(70)}, {"ignore_eos", true}, {"seed", 2},
                           {"temperature", 0.7}, {"repetition_penalty", 1.2}}},
      {"/v1/completions", {{"prompt", "Zebras"}, {"max_tokens", tokens(50)}, {"ignore_eos", true}, {"temperature", 0}}},
      {"/v1/chat/completions", {{"messages", chat}, {"response_format", {{"type", "json_object"}}},
                                {"max_tokens", tokens(40)}, {"seed", 3}}},
  };
  auto with_logprobs = plain;
  with_logprobs.push_back({"/v1/completions", {{"prompt", "A lighthouse keeper"}, {"logprobs", 2}, {"max_tokens", tokens(60)},
                                               {"ignore_eos", true}, {"seed", 4}, {"temperature", 0.8}}});
  for (bool logprobs : {false, true}) {
    for (bool cache : {true, false}) {
      SCOPED_TRACE(std::string(cache ? "prefix cache" : "no prefix cache") + (logprobs ? ", a request with logprobs" : ""));
      const auto& qs = logprobs ? with_logprobs : plain;
      Running serial(with_parallel(1, cache)), par(with_parallel(int(qs.size()), cache));
      std::vector<json> want;
      for (const auto& [path, body] : qs) want.push_back(serial.post(path, body));
      const std::vector<json> got = testing::post_at_once(par, qs);
      for (size_t i = 0; i < qs.size(); ++i) EXPECT_EQ(response_parts(got[i]), response_parts(want[i])) << "request " << i;
      const Server::Stats st = par.srv->stats();
      EXPECT_GT(st.batched_steps, 0) << "no step ran two sessions together";
      EXPECT_GT(st.sampled_rows, 0) << "no row was sampled in a batch";
      if (logprobs) {
        EXPECT_LT(st.sampled_rows, st.batched_rows) << "the logprobs request's rows were sampled in the batch";
      } else {
        EXPECT_EQ(st.sampled_rows, st.batched_rows) << "a row without logprobs came back as logits";
      }
    }
  }
}

// A request whose mask fails part way (structured output whose only key, "j", needs the token "j", which the server's
// stop tokens take out of the text: "no token of the vocabulary can continue the output"), sent while two others
// generate (their steps already batched, so its steps join theirs): it fails as it does alone (a 500), and the others
// get the responses --parallel 1 gives them.
TEST(BatchSample, ARequestWhoseMaskFailsFailsOnlyItself) {
  Defaults d = testing::tiny_model_defaults();
  const int32_t j = testing::tiny_tok().token_id("j");
  ASSERT_GE(j, 0);
  d.stop_tokens.push_back(j);
  const json schema = {{"type", "object"}, {"properties", {{"j", {{"type", "integer"}}}}}, {"required", {"j"}},
                       {"additionalProperties", false}};
  const json failing = {{"messages", json::array({{{"role", "user"}, {"content", "Give me JSON."}}})},
                        {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "j"}, {"schema", schema}}}}},
                        {"max_tokens", 40}, {"temperature", 0}};
  // (all 300 under the sanitizers too: with a quarter of them, session 86's ASan/UBSan run saw both others end before
  // the failing request's steps came, the check below being a race the others must win by a margin)
  const int n = 300;
  const std::vector<json> others = {{{"prompt", "Once upon a time"}, {"max_tokens", n}, {"ignore_eos", true}, {"seed", 1}},
                                    {{"prompt", "The sea"}, {"max_tokens", n}, {"ignore_eos", true}, {"temperature", 0}}};
  Running serial(with_parallel(1), d), par(with_parallel(3), d);
  const json want_failed = serial.post("/v1/chat/completions", failing, 500);
  ASSERT_NE(want_failed.dump().find("no token of the vocabulary can continue"), std::string::npos) << want_failed.dump();
  std::vector<json> want, got(others.size());
  for (const json& q : others) want.push_back(serial.post("/v1/completions", q));
  std::vector<std::thread> ts;
  for (size_t i = 0; i < others.size(); ++i) ts.emplace_back([&, i] { got[i] = par.post("/v1/completions", others[i]); });
  for (int i = 0; i < 5000 && par.srv->stats().batched_steps == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const json got_failed = par.post("/v1/chat/completions", failing, 500);
  const int64_t done = par.srv->stats().requests;
  for (auto& t : ts) t.join();
  // (a failed request is no completion answered: requests counts the others, neither ended by then)
  EXPECT_EQ(done, 0) << "the others had ended: the failing request's steps ran alone";
  EXPECT_EQ(got_failed, want_failed);
  for (size_t i = 0; i < others.size(); ++i) EXPECT_EQ(response_parts(got[i]), response_parts(want[i])) << "request " << i;
  // The failed request's slot serves on.
  EXPECT_EQ(response_parts(par.post("/v1/completions", others[1])), response_parts(want[1]));
}

}  // namespace
}  // namespace plumb::server
