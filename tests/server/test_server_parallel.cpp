// `plumb serve --parallel N`: several generations at once, their decode steps batched (plumb::forward_batch). On the
// CPU every batched row is its session's own bits, so each response is the one the server gives with one generation
// at a time; the prefix cache follows each conversation to its slot; the queue counts every slot.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "running_server.h"
#include "plumb/text.h"
#include "server/engine_thread.h"

namespace plumb::server {
namespace {

using testing::Running;
using testing::tiny_engine;
using testing::with_parallel;

// Requests of different lengths and samplings, each long enough (ignore_eos) that they overlap when sent at once.
std::vector<json> bodies() {
  std::vector<json> b;
  const char* prompts[] = {"Once upon a time", "The sea", "A lighthouse keeper", "Zebras", "In the morning"};
  // (a quarter of the tokens under the sanitizers: the requests still overlap; the Release run generates them all)
  for (int i = 0; i < 5; ++i)
    b.push_back({{"prompt", prompts[i]}, {"max_tokens", plumb_test::tokens(60 + 20 * i)}, {"ignore_eos", true}, {"seed", 100 + i},
                 {"temperature", i == 0 ? 0.0 : 0.8}});
  return b;
}

// Each request's text and usage, sent at once from a thread each; also with one generation at a time, one after
// another: the same responses. The steps ran batched, several sessions at once.
TEST(ParallelServe, ConcurrentRequestsGetTheTokensOfOneAtATime) {
  for (bool cache : {true, false}) {
    SCOPED_TRACE(cache ? "prefix cache" : "no prefix cache");
    Running serial(with_parallel(1, cache)), par(with_parallel(4, cache));
    const auto b = bodies();
    std::vector<std::pair<std::string, json>> requests;
    std::vector<json> want;
    for (const json& q : b) requests.push_back({"/v1/completions", q}), want.push_back(serial.post("/v1/completions", q));
    const std::vector<json> got = testing::post_at_once(par, requests);
    for (size_t i = 0; i < b.size(); ++i) {
      EXPECT_EQ(got[i]["choices"][0]["text"], want[i]["choices"][0]["text"]) << "request " << i;
      EXPECT_EQ(got[i]["usage"]["completion_tokens"], want[i]["usage"]["completion_tokens"]) << "request " << i;
    }
    const Server::Stats st = par.srv->stats();
    EXPECT_EQ(st.requests, int64_t(b.size()));
    EXPECT_GT(st.batched_steps, 0) << "no step ran two sessions together";
    EXPECT_GE(st.largest_batch, 2);
    EXPECT_LE(st.largest_batch, 4) << "more sessions than slots in one step";
    EXPECT_EQ(serial.srv->stats().batched_steps, 0);
  }
}

// A stream served beside other generations equals its whole response served alone, chunk for chunk joined.
TEST(ParallelServe, AStreamBesideOthersEqualsItsWholeResponse) {
  Running serial(with_parallel(1)), par(with_parallel(3));
  const json msgs = json::array({{{"role", "user"}, {"content", "Tell me about the sea."}}});
  const json q = {{"messages", msgs}, {"max_tokens", 50}, {"seed", 5}, {"ignore_eos", true}};
  const json want = serial.post("/v1/chat/completions", q);
  std::vector<json> events;
  std::thread other([&] { par.post("/v1/completions", bodies()[3]); });
  std::thread streamed([&] { events = par.stream("/v1/chat/completions", q); });
  par.post("/v1/completions", bodies()[1]);
  other.join(), streamed.join();
  std::string text;
  for (const json& e : events)
    if (e.is_object() && e["choices"][0]["delta"].contains("content")) text += e["choices"][0]["delta"]["content"].get<std::string>();
  EXPECT_EQ(text, want["choices"][0]["message"]["content"]);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
}

// Two conversations at once, then each one's next turn: it goes to the slot that holds its history (its prompt
// tokens come from the cache), and its reply is the one a server without a cache gives.
TEST(ParallelServe, EachConversationFindsItsSlot) {
  Running par(with_parallel(2)), fresh(with_parallel(1, false));
  json a = json::array({{{"role", "user"}, {"content", "What is a lighthouse?"}}});
  json b = json::array({{{"role", "user"}, {"content", "Name a colour."}}});
  json ra, rb;
  {
    std::thread t([&] { ra = par.post("/v1/chat/completions", {{"messages", a}, {"temperature", 0}, {"max_tokens", 12}}); });
    rb = par.post("/v1/chat/completions", {{"messages", b}, {"temperature", 0}, {"max_tokens", 12}});
    t.join();
  }
  for (auto* turn : {&a, &b}) {
    const json& r = turn == &a ? ra : rb;
    turn->push_back({{"role", "assistant"}, {"content", r["choices"][0]["message"]["content"]}});
    turn->push_back({{"role", "user"}, {"content", "And then?"}});
  }
  const json next_b = par.post("/v1/chat/completions", {{"messages", b}, {"temperature", 0}, {"max_tokens", 12}});
  const json next_a = par.post("/v1/chat/completions", {{"messages", a}, {"temperature", 0}, {"max_tokens", 12}});
  EXPECT_GE(next_a["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), ra["usage"]["prompt_tokens"].get<int64_t>());
  EXPECT_GE(next_b["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), rb["usage"]["prompt_tokens"].get<int64_t>());
  EXPECT_EQ(next_a["choices"][0]["message"], fresh.post("/v1/chat/completions", {{"messages", a}, {"temperature", 0}, {"max_tokens", 12}})["choices"][0]["message"]);
  EXPECT_EQ(next_b["choices"][0]["message"], fresh.post("/v1/chat/completions", {{"messages", b}, {"temperature", 0}, {"max_tokens", 12}})["choices"][0]["message"]);
}

// With every slot generating and no room to wait (max_queue 0), one more request gets 503; once they end, it is served.
TEST(ParallelServe, TheQueueCountsEverySlot) {
  ServerOptions o = with_parallel(2);
  o.max_queue = 0;
  Running s(o);
  std::vector<std::thread> ts;
  std::atomic<int> started{0};
  for (int i = 0; i < 2; ++i)
    ts.emplace_back([&] {
      ++started;
      // (100 tokens under the sanitizers, still ~10x the way in there; the Release run generates 400)
      s.post("/v1/completions", {{"prompt", "Once"}, {"max_tokens", plumb_test::tokens(400)}, {"ignore_eos", true}});
    });
  // (the two are in flight once both threads sent and neither finished: 400 tokens take far longer than a request's way in)
  while (started < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const bool both_running = s.srv->stats().requests == 0;
  auto c = s.client();
  auto r = c.Post("/v1/completions", R"({"prompt": "a", "max_tokens": 2})", "application/json");
  ASSERT_TRUE(r);
  if (both_running) {
    EXPECT_EQ(r->status, 503) << r->body;
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(s.post("/v1/completions", {{"prompt", "a"}, {"max_tokens", 2}})["usage"]["completion_tokens"], 2);
}


// A long prompt through a QueuedSession goes in pieces (chunked prefill): its logits are those of a plain session fed
// the same pieces (bit for bit; the whole prompt in one pass differed by up to 1.7e-4 on the tiny model: the passes'
// boundaries change the results, as session 78 found of exact indexer-score ties), another session's steps run between
// the pieces, and a stop part way puts the session back as before the call, as one call would.
TEST(ParallelServe, ALongPromptIsFedInPiecesBesideOthersSteps) {
  EngineThread et;
  const Engine& e = *tiny_engine();
  const int32_t V = e.info().vocab_size;
  // (three pieces: 1300 tokens; under the sanitizers 1100, the third piece shorter; the Release run feeds 1300)
  std::vector<int32_t> prompt(plumb_test::kSanitized ? 2 * QueuedSession::kPrefillPiece + 76 : 1300);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 7919 + 13) % size_t(V));
  ASSERT_GT(prompt.size(), 2 * QueuedSession::kPrefillPiece);

  QueuedSession q(et, e), other(et, e);
  auto ref = e.new_session();
  std::vector<float> want;
  for (size_t at = 0; at < prompt.size(); at += QueuedSession::kPrefillPiece)
    want = ref->forward(std::span(prompt).subspan(at, std::min(QueuedSession::kPrefillPiece, prompt.size() - at)));
  other.forward(std::vector<int32_t>{1, 2, 3});
  std::atomic<bool> done{false};
  std::atomic<int> during{0};
  std::thread stepper([&] {
    int32_t t = 5;
    while (!done) {
      other.forward(std::vector<int32_t>{t});
      t = (t * 31 + 7) % V;
      ++during;
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // (the other generation is stepping)
  const int before = during;
  const std::vector<float> got = q.forward(prompt);
  const int between = during - before;
  done = true;
  stepper.join();
  EXPECT_EQ(got, want);
  EXPECT_EQ(q.position(), int64_t(prompt.size()));
  EXPECT_GE(between, 2) << "the other session's steps waited for the whole prompt";

  // A stop in the second piece: the session back at its position before the call, and it goes on as a fresh one.
  QueuedSession s(et, e);
  int asks = 0;
  // (a piece's call is asked before its pass and after each of the tiny model's 4 layers but its last: 4 times)
  s.set_prefill_stop([&] { return ++asks == 7; });
  EXPECT_THROW(s.forward(prompt), Stopped);
  EXPECT_EQ(asks, 7);
  EXPECT_EQ(s.position(), 0);
  s.set_prefill_stop({});
  const std::vector<float> again = s.forward(prompt);
  EXPECT_EQ(again, got);
}

// A long prompt's first token (forward_sample / forward_sample_masked through a QueuedSession) is drawn by the real
// session on the engine thread, where the logits are (on the GPU only the token comes back), after the same pieces:
// the token of a plain session fed those pieces and sampled alike, the mask asked on the engine thread; a mask that
// throws leaves the tokens fed, as one call does, a sampler for another vocabulary is refused before anything is fed,
// and a stop in the last piece puts the session back as before the call.
TEST(ParallelServe, ALongPromptsFirstTokenIsDrawnOnTheEngineThread) {
  EngineThread et;
  const Engine& e = *tiny_engine();
  const int32_t V = e.info().vocab_size;
  std::vector<int32_t> prompt(QueuedSession::kPrefillPiece + 40);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 7919 + 13) % size_t(V));
  const std::span<const int32_t> head = std::span(prompt).first(QueuedSession::kPrefillPiece);
  const std::span<const int32_t> tail = std::span(prompt).subspan(QueuedSession::kPrefillPiece);
  SamplingParams sp;
  sp.seed = 7;
  const std::vector<int32_t> history(prompt.begin(), prompt.end());

  auto ref = e.new_session();
  ref->forward(head);
  Sampler ref_sampler(sp, V);
  const int32_t want = ref->forward_sample(tail, ref_sampler, history);

  QueuedSession q(et, e);
  Sampler sampler(sp, V);
  EXPECT_EQ(q.forward_sample(prompt, sampler, history), want);
  EXPECT_EQ(q.position(), int64_t(prompt.size()));

  // Masked: only token `only` allowed (not the unmasked draw), the mask asked on the engine thread.
  const int32_t only = (want + 1) % V;
  std::thread::id asked_on;
  const auto allowed = [&](std::span<uint32_t> bits) {
    asked_on = std::this_thread::get_id();
    std::fill(bits.begin(), bits.end(), 0u);
    bits[size_t(only) / 32] |= 1u << (only % 32);
  };
  QueuedSession m(et, e);
  Sampler masked_sampler(sp, V);
  EXPECT_EQ(m.forward_sample_masked(prompt, masked_sampler, history, allowed), only);
  EXPECT_NE(asked_on, std::thread::id());
  EXPECT_NE(asked_on, std::this_thread::get_id()) << "the prompt's first token was drawn on the calling thread";

  // A mask that throws: the call ends with its exception, the tokens fed (as one call leaves them).
  QueuedSession t(et, e);
  Sampler throw_sampler(sp, V);
  EXPECT_THROW(t.forward_sample_masked(prompt, throw_sampler, history, [](std::span<uint32_t>) { throw Error("mask"); }), Error);
  EXPECT_EQ(t.position(), int64_t(prompt.size()));

  // A sampler for another vocabulary: refused before any piece is fed (its stop function never asked).
  QueuedSession v(et, e);
  int asked = 0;
  v.set_prefill_stop([&] { return ++asked < 0; });
  Sampler wrong(sp, V + 1);
  EXPECT_THROW(v.forward_sample(prompt, wrong, history), Error);
  EXPECT_EQ(asked, 0);
  EXPECT_EQ(v.position(), 0);

  // A stop in the last piece (the tiny model's 4 layers: a piece's call asks 4 times): back at position 0.
  QueuedSession s(et, e);
  int asks = 0;
  s.set_prefill_stop([&] { return ++asks == 6; });
  Sampler stop_sampler(sp, V);
  EXPECT_THROW(s.forward_sample(prompt, stop_sampler, history), Stopped);
  EXPECT_EQ(s.position(), 0);
}

}  // namespace
}  // namespace plumb::server
