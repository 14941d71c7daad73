// A review of session 80 (forward_sample_masked, the shared token tables, tool_choice's mask, the DSML opening): what
// the review found, and the coverage it added. (Session 81 replaced the opening's mask by the whole block's,
// OutputFormat::ToolCalls: the findings' tests hold the block to the same rules.)
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "generate/json_mode.h"
#include "generate/tool_call_mask.h"
#include "generate/token_bits.h"
#include "json_test_util.h"
#include "session_test_util.h"
#include "plumb/engine.h"
#include "plumb/text.h"
#include "text/dsml.h"

namespace {

using plumb::testing::PreferringSession;

struct MaskReview : ::testing::Test {
  plumb::Tokenizer tok = plumb::Tokenizer::load(PLUMB_TEST_DATA "/../../models/tiny");
  const int32_t vocab = 1216, eos = 1;
  const std::string weather = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n";
  const std::string weather_tools = R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type":
      "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": false}}}])";
  plumb::GenerateOptions calls() const {
    plumb::GenerateOptions g;
    g.sampling.temperature = 0, g.max_tokens = 80;
    g.format = plumb::OutputFormat::ToolCalls, g.tool_calls.tools = weather_tools;
    return g;
  }
  // generate() on `s` either refuses before feeding anything or writes a reply that opens with `weather`.
  void expect_opens_or_refused(PreferringSession& s, const plumb::GenerateOptions& g) const {
    const std::vector<int32_t> prompt = {0};
    try {
      const auto r = plumb::generate(s, tok, prompt, g);
      EXPECT_EQ(r.text.rfind(weather, 0), 0u) << "the reply [" << r.text << "] (" << r.tokens.size() << " tokens, stop: "
                                              << plumb::stop_reason_name(r.stop) << ") does not open with the opening";
    } catch (const plumb::Error& e) {
      EXPECT_EQ(s.position(), 0) << e.what();  // (refused before feeding: fine)
    }
  }
  plumb::ModelInfo info(int32_t eos_token = 1) const {
    plumb::ModelInfo i;
    i.vocab_size = vocab, i.bos_token = 0, i.eos_token = eos_token, i.max_positions = 4096;
    return i;
  }
};

// Found by a review (fixed since): a stop string that lies inside the opening ends the reply inside it (here at its first byte): the reply
// does not begin with the opening, although a stop token inside an opening is refused for this very reason. (plumb
// serve passes the client's "stop" through: tool_choice "required" with "stop": "\n" can never give a call.)
TEST_F(MaskReview, AStopStringInsideTheOpeningIsRefusedOrKeptOut) {
  PreferringSession s(tok, "I will not call anything.", info());
  plumb::GenerateOptions g = calls();
  g.stop_strings = {"\n"};
  expect_opens_or_refused(s, g);
}

// Found by a review (fixed since): EOS stops the generation (stop_at_eos) but is not among the OpeningMask's end tokens, nor checked against
// the openings as the stop tokens are: a model whose EOS is a text token ("\n" here) can end the reply before its
// opening (JSON mode counts EOS among its ends; reply_opens_with did not; the tool-call block refuses a text EOS).
TEST_F(MaskReview, EosIsKeptOutUntilTheOpeningIsWhole) {
  const int32_t newline = tok.encode("\n").at(0);
  ASSERT_FALSE(tok.is_added(newline));
  PreferringSession s(tok, "", info(newline));  // (prefers EOS from the first token)
  expect_opens_or_refused(s, calls());
}

// FINDING (minor, a lost check): TokenMask::apply used to refuse a logits row of another size than the vocabulary
// ("JSON mode: N logits for a vocabulary of M"); now the check compares word counts ((n + 31) / 32), so a row a few
// logits short of the vocabulary is masked as if it were whole.
TEST_F(MaskReview, ApplyRefusesARowOfAnotherSize) {
  plumb::gen::JsonMask json(tok, vocab, {eos});
  std::vector<float> short_row(size_t(vocab - 6), 0.0f);
  EXPECT_THROW(json.apply(short_row), plumb::Error);
  const auto block = plumb::gen::tool_call_mask(tok, vocab, {eos}, plumb::gen::ToolCallSpec::build(weather_tools, {}, true));
  EXPECT_THROW(block->apply(short_row), plumb::Error);
}

// JSON mode's per-mask end tokens: when every token that could come next is an end token (inside the object), the
// mask has nothing left and says so (its `kept` count taken down for each end token it clears).
TEST(JsonMaskEnds, OnlyEndTokensLeftIsNoWayOn) {
  const auto dir = std::filesystem::temp_directory_path() / ("plumb_review_json_" + std::to_string(::getpid()));
  const plumb::Tokenizer tok = plumb::Tokenizer::load(plumb::testing::write_byte_level_tokenizer(dir, {}));
  const int32_t vocab = tok.vocab_size(), eos = 256;
  // After "{": '"', '}' or whitespace; all of them ends here.
  plumb::gen::JsonMask mask(tok, vocab, {eos, '"', '}', ' ', '\t', '\n', '\r'});
  mask.accept('{');
  std::vector<uint32_t> bits(plumb::gen::token_bits_words(vocab), 0);
  EXPECT_THROW(mask.allowed(bits), plumb::Error);
  for (int32_t id = 0; id < vocab; ++id) EXPECT_FALSE(mask.allows(id)) << id;
  // The same text with only EOS as the end: the object goes on.
  plumb::gen::JsonMask open(tok, vocab, {eos});
  open.accept('{');
  std::fill(bits.begin(), bits.end(), 0u);
  open.allowed(bits);
  EXPECT_TRUE(plumb::gen::token_bit(bits, '"'));
  EXPECT_FALSE(plumb::gen::token_bit(bits, size_t(eos)));
  std::filesystem::remove_all(dir);
}

// The tables are one object per tokenizer and vocabulary, also when many threads ask at once.
TEST_F(MaskReview, TablesAreBuiltOnceUnderConcurrentCalls) {
  const plumb::Tokenizer fresh = plumb::Tokenizer::load(PLUMB_TEST_DATA "/../../models/tiny");
  std::vector<std::shared_ptr<const plumb::gen::TokenTables>> got(8);
  std::vector<std::thread> ts;
  for (size_t i = 0; i < got.size(); ++i) ts.emplace_back([&, i] { got[i] = plumb::gen::TokenTables::of(fresh, 999); });
  for (auto& t : ts) t.join();
  for (const auto& p : got) EXPECT_EQ(p, got[0]);
}

// Session::forward_sample_masked's default (a Session of one's own): the mask's words zeroed, the draw from the masked
// row; an empty function is forward_sample; a throwing one leaves the tokens fed and the sampler's draws untouched.
TEST_F(MaskReview, TheDefaultMaskedSampleKeepsItsContract) {
  PreferringSession s(tok, "Hello there", info()), ref(tok, "Hello there", info());
  plumb::SamplingParams sp;
  sp.seed = 3;
  plumb::Sampler a(sp, vocab), b(sp, vocab);
  std::vector<int32_t> history = {0};
  const int32_t only = 77;
  const int32_t got = s.forward_sample_masked(history, a, history, [&](std::span<uint32_t> bits) {
    ASSERT_EQ(bits.size(), size_t((vocab + 31) / 32));
    for (uint32_t w : bits) ASSERT_EQ(w, 0u);
    plumb::gen::set_token_bit(bits, only);
  });
  EXPECT_EQ(got, only);
  ref.forward(history);
  history.push_back(got);
  EXPECT_THROW(s.forward_sample_masked(std::vector<int32_t>{got}, a, history,
                                       [](std::span<uint32_t>) { throw std::runtime_error("no grammar"); }),
               std::runtime_error);
  EXPECT_EQ(s.position(), 2);
  ref.forward(std::vector<int32_t>{got});
  const std::vector<int32_t> next = {5};
  EXPECT_EQ(s.forward_sample_masked(next, a, history, {}), ref.forward_sample(next, b, history));
}

// generate() with OutputFormat::ToolCalls: every step is masked, to the block's end and the EOS after it (a model that
// writes the call: the block taken whole, then EOS); with on_logits, each step's logits are the model's own (the mask on
// a copy) and the tokens the same.
TEST_F(MaskReview, EveryStepIsMaskedOnBothPaths) {
  struct Counting : PreferringSession {
    using PreferringSession::PreferringSession;
    int masked = 0, plain = 0;
    int32_t forward_sample(std::span<const int32_t> t, plumb::Sampler& s, std::span<const int32_t> h) override {
      ++plain;
      return PreferringSession::forward_sample(t, s, h);
    }
    int32_t forward_sample_masked(std::span<const int32_t> t, plumb::Sampler& s, std::span<const int32_t> h,
                                  const std::function<void(std::span<uint32_t>)>& f) override {
      ++masked;
      return PreferringSession::forward_sample_masked(t, s, h, f);
    }
  };
  const std::string target = plumb::dsml::render_calls({{"", "get_weather", R"({"city": "Paris"})"}}, "t");
  Counting s(tok, target, info());
  plumb::GenerateOptions g = calls();
  g.max_tokens = 400;
  const std::vector<int32_t> prompt = {0};
  const auto r = plumb::generate(s, tok, prompt, g);
  ASSERT_EQ(r.text, target);
  EXPECT_EQ(r.stop, plumb::StopReason::Token) << r.text;
  const plumb::ChatMessage m = plumb::parse_reply(r.text, false);
  ASSERT_EQ(m.tool_calls.size(), 1u) << r.text;
  EXPECT_EQ(m.tool_calls[0].name, "get_weather");
  EXPECT_EQ(nlohmann::json::parse(m.tool_calls[0].arguments).at("city").is_string(), true) << m.tool_calls[0].arguments;
  EXPECT_EQ(s.masked, int(r.tokens.size()));
  EXPECT_EQ(s.plain, 0);
  Counting h(tok, target, info());
  int finite_rows = 0, rows = 0;
  g.on_logits = [&](std::span<const float> l, int32_t) {
    ++rows;
    finite_rows += std::all_of(l.begin(), l.end(), [](float v) { return std::isfinite(v); });
  };
  const auto rh = plumb::generate(h, tok, prompt, g);
  EXPECT_EQ(rh.tokens, r.tokens);
  EXPECT_EQ(h.masked + h.plain, 0);
  EXPECT_EQ(finite_rows, rows);
}

// The library session on the CPU, watched (a progress function: its calls are guarded) over a prefill of several
// passes: a throwing mask leaves every token fed and the session usable (the next call's logits are a reference
// session's); a prefill stop ends the call before the mask is asked for, the session as it was.
TEST(MaskedSampleSession, AThrowingMaskAfterAWatchedPrefillKeepsTheFeed) {
  const auto e = plumb_test::csa_long_engine("cpu");
  const int32_t V = e->info().vocab_size;
  std::vector<int32_t> feed = plumb_test::csa_long_ids(40, 5);
  for (auto& t : feed) t %= V;
  auto s = e->new_session(), ref = e->new_session();
  int reports = 0;
  s->set_prefill_progress([&](int64_t, int64_t) { ++reports; });
  plumb::Sampler a(plumb::SamplingParams{}, V);
  EXPECT_THROW(s->forward_sample_masked(feed, a, feed, [](std::span<uint32_t>) { throw std::runtime_error("x"); }),
               std::runtime_error);
  EXPECT_GT(reports, 0);
  EXPECT_EQ(s->position(), int64_t(feed.size()));
  ref->forward(feed);
  const std::vector<int32_t> next = {3 % V};
  EXPECT_EQ(s->forward(next), ref->forward(next));
  auto t = e->new_session();
  t->set_prefill_stop([] { return true; });
  bool asked = false;
  EXPECT_THROW(t->forward_sample_masked(feed, a, feed, [&](std::span<uint32_t>) { asked = true; }), plumb::Stopped);
  EXPECT_FALSE(asked);
  EXPECT_EQ(t->position(), 0);
}

// dsml::call_opening is what the chat encoder writes for an assistant turn whose content is empty and which calls that
// function first; render_calls for several calls is the block's opening, the invokes a line apart, and its close.
TEST(DsmlOpening, TheOpeningIsTheEncodersAndCallsRenderAsBefore) {
  plumb::ChatOptions co;
  co.tools = R"([{"type": "function", "function": {"name": "f{}", "parameters": {"type": "object"}}}])";
  plumb::ChatMessage a("assistant", "");
  a.tool_calls = {{"c1", "f{}", R"({"x": 1})"}, {"c2", "g", R"({"s": "t", "n": [1, 2]})"}, {"c3", "h", "not json"}};
  plumb::ChatMessage res("tool", "ok");
  res.tool_call_id = "c1";
  const std::string text = plumb::encode_chat({{"user", "hi"}, a, res}, co);
  const std::string head = "<｜Assistant｜></think>" + plumb::dsml::call_opening("f{}");
  EXPECT_NE(text.find(head), std::string::npos) << text;
  const std::string want =
      "\n\n<｜DSML｜tool_calls>\n"
      "<｜DSML｜invoke name=\"f{}\">\n<｜DSML｜parameter name=\"x\" string=\"false\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
      "<｜DSML｜invoke name=\"g\">\n<｜DSML｜parameter name=\"s\" string=\"true\">t</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"n\" string=\"false\">[1, 2]</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
      "<｜DSML｜invoke name=\"h\">\n<｜DSML｜parameter name=\"arguments\" string=\"true\">not json</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  EXPECT_EQ(plumb::dsml::render_calls(a.tool_calls, "t"), want);
  EXPECT_EQ(plumb::dsml::render_calls({a.tool_calls[1]}, "t").rfind(plumb::dsml::call_opening("g"), 0), 0u);
  EXPECT_EQ(plumb::dsml::render_calls({}, "t"), "");
}

}  // namespace
