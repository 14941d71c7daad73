// A review of commit 1ff2174 ("Tool calls before and beside text"): ToolCallSpec::thinking (a reasoning, free up to
// "</think>"), required false (tool_choice "auto": free text, the block's tag begins a block), TokenMask letting end
// tokens through where may_end(), the in-string shortcut in the free phases (recheck_first_byte / recheck_ids), added
// "</think>" as text, and check_output_options' rules. Tests marked FINDING showed a bug (they failed on 1ff2174; all mended since); the
// others are the coverage the review added (an oracle from parse_reply over edge cases and random walks, the mask
// against a per-token feed with several end tokens and added tags, generate() end to end, the step cost at 129K).
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "generate/json_mode.h"
#include "generate/json_schema.h"
#include "generate/token_bits.h"
#include "generate/tool_call_mask.h"
#include "json_test_util.h"
#include "sanitized.h"
#include "tool_call_test_util.h"
#include "plumb/engine.h"
#include "plumb/text.h"
#include "text/dsml.h"

namespace {

using fjson = nlohmann::json;
using plumb::gen::SchemaRecognizer;
using plumb::gen::ToolCallRecognizer;
using plumb::gen::ToolCallSpec;

const char* kFreeTools = R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string", "minLength": 1}, "days": {"type": "integer", "minimum": 1, "maximum": 14},
                   "units": {"enum": ["metric", "imperial"]}},
    "required": ["city"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "search", "parameters": {"type": "object",
    "properties": {"query": {"type": "string"}, "filters": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
    "required": ["query"]}}},
  {"type": "function", "function": {"name": "ping"}}])";

const std::string kFreeTag = "<｜DSML｜tool_calls>";
const std::string kThinkEndText = "</think>";

std::shared_ptr<const ToolCallSpec> free_spec(bool thinking, bool required, bool parallel = true,
                                              const char* tools = kFreeTools) {
  return ToolCallSpec::build(tools, {}, parallel, thinking, required);
}

std::string free_block(const std::vector<plumb::ToolCall>& calls) { return plumb::dsml::render_calls(calls, "review"); }

// Whether the recognizer takes every byte of `text` (not necessarily complete).
bool free_takes(ToolCallRecognizer r, const std::string& text) { return r.feed(text); }
bool free_whole(ToolCallRecognizer r, const std::string& text) { return r.feed(text) && r.complete(); }

// The oracle's reading of a reply the recognizer calls complete: parse_reply finds calls, each naming a tool of the
// spec, each one's arguments (compact) an instance of that tool's parameters, one call unless parallel.
::testing::AssertionResult free_reads_back(const ToolCallSpec& spec, const std::string& text) {
  const plumb::ChatMessage m = plumb::parse_reply(text, spec.thinking);
  if (m.tool_calls.empty()) return ::testing::AssertionFailure() << "parse_reply finds no call in [" << text << "]";
  if (!spec.parallel && m.tool_calls.size() != 1)
    return ::testing::AssertionFailure() << m.tool_calls.size() << " calls, parallel false: [" << text << "]";
  for (const auto& c : m.tool_calls) {
    const auto t = std::find_if(spec.tools.begin(), spec.tools.end(), [&](const ToolCallSpec::Tool& x) { return x.name == c.name; });
    if (t == spec.tools.end()) return ::testing::AssertionFailure() << "call of an unknown tool " << c.name;
    SchemaRecognizer s(t->params);
    const std::string args = nlohmann::ordered_json::parse(c.arguments).dump();
    if (!(s.feed(args) && s.complete()))
      return ::testing::AssertionFailure() << c.name << "'s arguments " << args << " break its schema: [" << text << "]";
  }
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------------------------------------------------
// (1) The recognizer in and around the free phases, against parse_reply.

TEST(ToolCallFreeReview, EdgeCasesOfTheFreePhasesAgreeWithParseReply) {
  const std::string call = free_block({{"", "get_weather", R"({"city": "Rome"})"}});
  const std::string tagged = call.substr(2);
  const auto autos = free_spec(false, false), think_req = free_spec(true, true), think_auto = free_spec(true, false);
  const ToolCallRecognizer a(autos), tr(think_req), ta(think_auto);
  // The tag at the very start (no blank line, no text), and after text that holds partial tags and "<<".
  EXPECT_TRUE(free_whole(a, tagged));
  EXPECT_TRUE(free_reads_back(*autos, tagged));
  for (const std::string& before : {std::string("<"), std::string("<<"), std::string("<｜DSML｜tool"),
                                    std::string("<｜DSML｜tool_calls <｜DSML｜tool_callsX"), std::string("</think>"),
                                    std::string("a</｜DSML｜tool_calls>b"), std::string("\n\n\n")}) {
    SCOPED_TRACE(before);
    EXPECT_TRUE(free_whole(a, before + call));
    EXPECT_TRUE(free_reads_back(*autos, before + call));
    EXPECT_TRUE(free_whole(a, before + tagged));
    EXPECT_TRUE(free_reads_back(*autos, before + tagged));
    // (the partial tag then a cut: the reply may end, parse_reply finds no call)
    ToolCallRecognizer r = a;
    ASSERT_TRUE(r.feed(before));
    EXPECT_TRUE(r.may_end());
    EXPECT_TRUE(plumb::parse_reply(before, false).tool_calls.empty());
  }
  // A tag then a cut: no end (the block must be whole), and parse_reply would find no call there either.
  for (size_t cut = 1; cut < call.size(); ++cut) {
    ToolCallRecognizer r = a;
    ASSERT_TRUE(r.feed("Text." + call.substr(0, cut)));
    const bool begun = cut >= 2 + kFreeTag.size();
    EXPECT_EQ(r.may_end(), !begun) << cut;
    EXPECT_TRUE(plumb::parse_reply("Text." + call.substr(0, cut), false).tool_calls.empty());
  }
  // A second tag (or anything) after a complete block: refused; the block is the reply's end.
  for (const std::string& after : {tagged, std::string("\n"), std::string(" "), kThinkEndText, std::string("x")}) {
    ToolCallRecognizer r = a;
    ASSERT_TRUE(r.feed(call));
    ASSERT_TRUE(r.complete() && r.may_end());
    EXPECT_FALSE(free_takes(r, after)) << after;
    EXPECT_TRUE(plumb::parse_reply(call + after, false).tool_calls.empty() || after.empty());
  }
  // "<｜DSML｜tool_calls>" inside the reasoning stays text (thinking: required or not); the block after "</think>".
  const std::string reasoning = "Think: " + call + " and " + kFreeTag + " are text here.";
  EXPECT_TRUE(free_whole(tr, reasoning + kThinkEndText + call));
  EXPECT_TRUE(free_reads_back(*think_req, reasoning + kThinkEndText + call));
  EXPECT_TRUE(free_whole(ta, reasoning + kThinkEndText + "Answer: " + tagged));
  EXPECT_TRUE(free_reads_back(*think_auto, reasoning + kThinkEndText + "Answer: " + tagged));
  {
    ToolCallRecognizer r = ta;
    ASSERT_TRUE(r.feed(reasoning));
    EXPECT_TRUE(r.may_end());
    EXPECT_TRUE(plumb::parse_reply(reasoning, true).tool_calls.empty());
    ToolCallRecognizer q = tr;
    ASSERT_TRUE(q.feed(reasoning));
    EXPECT_FALSE(q.may_end());
  }
  // "</think>" split across feeds, doubled, inside the block's raw value and after the block.
  EXPECT_TRUE(free_whole(tr, "a </th</</think" + std::string(">") + call));
  const std::string with_think = free_block({{"", "search", R"({"query": "what </think> means"})"}});
  EXPECT_TRUE(free_whole(tr, "r</think>" + with_think));
  EXPECT_TRUE(free_reads_back(*think_req, "r</think>" + with_think));
  EXPECT_TRUE(free_whole(a, "no thinking </think> here" + with_think));
  EXPECT_TRUE(free_reads_back(*autos, "no thinking </think> here" + with_think));
  {
    ToolCallRecognizer r = tr;
    ASSERT_TRUE(r.feed("r</think>" + call));
    EXPECT_FALSE(free_takes(r, kThinkEndText));
  }
  // A raw value that holds the tag itself (the block's first tag began it; the second is the value's text).
  const std::string inner = free_block({{"", "search", R"({"query": "<｜DSML｜tool_calls> and </｜DSML｜tool_calls>"})"}});
  EXPECT_TRUE(free_whole(a, "x" + inner));
  EXPECT_TRUE(free_reads_back(*autos, "x" + inner));
  // Thinking and required: text between "</think>" and the block is refused (the block right after), and so is the tag
  // without its blank line; a reply that never closes its reasoning may not end.
  EXPECT_FALSE(free_takes(tr, "r</think>Sure." + call));
  EXPECT_FALSE(free_takes(tr, "r</think>" + tagged));
}

// Random walks from each free configuration over bytes biased to the tags' pieces: never a dead end; wherever the
// reply may end before a block, parse_reply finds no call; every completed reply reads back as calls the schemas take,
// and parse_reply's content / reasoning are the text before the block / before "</think>".
TEST(ToolCallFreeReview, RandomWalksFromTheFreePhasesAgreeWithParseReply) {
  const std::vector<std::string> pieces = {kFreeTag, kThinkEndText, "\n\n", "<", "</", "</think", "<｜DSML｜", "｜",
                                           "\n<｜DSML｜invoke name=\"", "get_weather\">\n", "ping\">\n\n</｜DSML｜invoke>",
                                           "<｜DSML｜parameter name=\"city\" string=\"true\">", "</｜DSML｜parameter>",
                                           "\n</｜DSML｜invoke>", "\n</｜DSML｜tool_calls>", "Rome", " ", "x"};
  std::mt19937 rng(1181);
  int completed = 0, ended_free = 0, walks = 0;
  for (int config = 0; config < 4; ++config) {
    // (auto; auto with one call; thinking and required; thinking and auto)
    const bool thinking = config >= 2, required = config == 2, parallel = config != 1;
    const auto spec = free_spec(thinking, required, parallel);
    // (a quarter of the walks under the sanitizers: every path still runs; the Release run takes them all)
    for (int w = 0; w < plumb_test::walks(150); ++w, ++walks) {
      ToolCallRecognizer r(spec);
      std::string text;
      for (int step = 0; step < 400 && !r.complete(); ++step) {
        // Ending where may_end(), now and then, in a free phase.
        if (r.may_end() && rng() % 40 == 0) {
          ++ended_free;
          const plumb::ChatMessage m = plumb::parse_reply(text, thinking);
          EXPECT_TRUE(m.tool_calls.empty()) << "may end in free text, yet parse_reply reads calls: [" << text << "]";
          break;
        }
        // A piece the recognizer takes whole (tried in a random order), else a byte it takes.
        bool moved = false;
        if (rng() % 3) {
          const std::string& p = pieces[rng() % pieces.size()];
          ToolCallRecognizer t = r;
          if (t.feed(p)) r = t, text += p, moved = true;
        }
        if (moved) continue;
        const std::vector<uint8_t> ok = plumb::testing::bytes_taken(r);
        ASSERT_FALSE(ok.empty()) << "dead end after [" << text << "]";
        uint8_t pick = ok[rng() % ok.size()];
        for (uint8_t lean : {uint8_t('<'), uint8_t('/'), uint8_t('\n'), uint8_t('"'), uint8_t('1'), uint8_t(']')})
          if (rng() % 3 == 0 && std::find(ok.begin(), ok.end(), lean) != ok.end()) pick = lean;
        ASSERT_TRUE(r.feed(pick));
        text += char(pick);
      }
      if (!r.complete()) continue;
      ++completed;
      EXPECT_TRUE(free_reads_back(*spec, text));
      const plumb::ChatMessage m = plumb::parse_reply(text, thinking);
      const size_t think_end = thinking ? text.find(kThinkEndText) : 0;
      ASSERT_NE(think_end, std::string::npos) << text;
      const std::string after = thinking ? text.substr(think_end + kThinkEndText.size()) : text;
      const size_t tag = after.find(kFreeTag);
      ASSERT_NE(tag, std::string::npos) << text;
      std::string before = after.substr(0, tag);
      if (before.size() >= 2 && before.compare(before.size() - 2, 2, "\n\n") == 0) before.resize(before.size() - 2);
      EXPECT_EQ(m.content, before) << text;
      if (thinking) {
        EXPECT_EQ(m.reasoning, text.substr(0, think_end));
      }
      if (required) {
        EXPECT_EQ(m.content, "") << text;
      }
    }
  }
  std::printf("free-phase walks: %d, %d completed, %d ended in free text\n", walks, completed, ended_free);
  EXPECT_GT(completed, walks / 10);
  EXPECT_GT(ended_free, walks / 10);
}

// Completeness the other way: a reply of random free text (with partial tags, "</think>" where it is text) then a
// rendered block is taken whole exactly where parse_reply reads the block's calls from it.
TEST(ToolCallFreeReview, FreeTextThenABlockIsTakenWhereParseReplyReadsIt) {
  const std::vector<std::string> bits = {"<", "｜", "DSML", "tool_calls", ">", "</", "think", "\n", " ", "a", "<｜DSML｜",
                                         "</think>", "<｜DSML｜tool_calls"};
  const std::vector<std::string> calls = {free_block({{"", "get_weather", R"({"city": "Oslo", "days": 2})"}}),
                                          free_block({{"", "ping", "{}"}, {"", "search", R"({"query": "q", "filters": ["a"]})"}})};
  std::mt19937 rng(7);
  int agree = 0, taken = 0;
  for (int thinking = 0; thinking < 2; ++thinking) {
    const auto spec = free_spec(thinking, false);
    for (int i = 0; i < 3000; ++i) {
      std::string reasoning, text;
      for (int n = int(rng() % 6); n > 0; --n) reasoning += bits[rng() % bits.size()];
      for (int n = int(rng() % 6); n > 0; --n) text += bits[rng() % bits.size()];
      const std::string block = calls[rng() % calls.size()];
      const std::string reply = (thinking ? reasoning + kThinkEndText : std::string()) + text + (rng() % 2 ? block : block.substr(2));
      const bool parsed = !plumb::parse_reply(reply, thinking).tool_calls.empty();
      const bool whole = free_whole(ToolCallRecognizer(spec), reply);
      EXPECT_EQ(whole, parsed) << "[" << reply << "]";
      agree += whole == parsed, taken += whole;
    }
  }
  std::printf("free text + block: %d agree, %d taken\n", agree, taken);
  EXPECT_GT(taken, 1000);
}

// A default-constructed recognizer (no spec) is Done: complete, may end, takes nothing (may_end() never reaches the
// null spec).
TEST(ToolCallFreeReview, ADefaultRecognizerIsDone) {
  ToolCallRecognizer r;
  EXPECT_TRUE(r.complete());
  EXPECT_TRUE(r.may_end());
  EXPECT_FALSE(r.feed(uint8_t('a')));
}

// ---------------------------------------------------------------------------------------------------------------------
// (2) The mask against a per-token feed: several end tokens (EOS, and stop tokens that are text outside the block's
// fixed texts), added tokens that are tags, "</think>", and a chat marker that is not, tokens that cut across the tags.

struct FreeVocab {
  std::filesystem::path dir;
  std::unique_ptr<plumb::Tokenizer> tok;
  ~FreeVocab() { std::filesystem::remove_all(dir); }
};

std::unique_ptr<FreeVocab> free_vocab(const std::string& name, const std::vector<std::string>& extra,
                                      const std::vector<std::string>& added) {
  auto v = std::make_unique<FreeVocab>();
  v->dir = std::filesystem::temp_directory_path() / ("plumb_free_review_" + name + "_" + std::to_string(::getpid()));
  v->tok = std::make_unique<plumb::Tokenizer>(
      plumb::Tokenizer::load(plumb::testing::write_byte_level_tokenizer(v->dir, extra, false, added)));
  return v;
}

TEST(ToolCallFreeReview, MaskBitsEqualAPerTokenFeedInTheFreePhases) {
  const std::vector<std::string> extra = {
      "<｜DSML｜", "</｜DSML｜", "｜DSML｜", "tool_calls>", "tool_calls>\n", "<｜DS", "ML｜tool_calls>", "｜tool", "_calls>",
      "x<｜DSML｜tool_calls>", "x<｜DSML｜tool_calls>y", "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"",
      "\n\n<｜DSML｜tool_calls>", "a<｜DSML｜t", "<｜", "</thi", "nk>", "x</think>", "</think>y", "</think>\n\n",
      "</think><｜DSML｜tool_calls>", "</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"", "think>", "hink>",
      "<<", "</", "<｜DSML｜invoke name=\"", "parameter", " name=\"", "\" string=\"", "true\">", "false\">", "get_",
      "weather", "city", "\">\n", "\n<", "Rome", "[\"", "\"]", ">\n", "meter>", "DSML｜parameter>", "ping\">\n\n",
      "</｜DSML｜invoke>", "\n</｜DSML｜tool_calls>", "Bye", "STOP", "\xef\xbd\x9c", "\xef", "\xbd\x9c"};
  // (added tokens: DSML pieces and "</think>" pass as text; <｜User｜> never does)
  const std::vector<std::string> added = {"<｜DSML｜tool_calls>", "</｜DSML｜", "</think>", "<｜User｜>"};
  auto v = free_vocab("bits", extra, added);
  const plumb::Tokenizer& tok = *v->tok;
  const int32_t eos = tok.token_id("<｜end▁of▁sentence｜>"), vocab = tok.vocab_size();
  // (a stop token that is text but not the block's fixed text: "Bye" and "STOP"; those inside it are refused)
  std::vector<int32_t> text_stops;
  for (int32_t id = 0; id < vocab; ++id)
    if (!tok.is_added(id) && (tok.token_bytes(id) == "Bye" || tok.token_bytes(id) == "STOP")) text_stops.push_back(id);
  ASSERT_EQ(text_stops.size(), 2u);
  std::mt19937 rng(29);
  int steps = 0, completed = 0, ended = 0, added_used = 0;
  for (int config = 0; config < 3; ++config) {
    const bool thinking = config >= 1, required = config == 1;
    const auto spec = free_spec(thinking, required);
    std::vector<std::string> added_text = {"<｜DSML｜tool_calls>", "</｜DSML｜"};
    if (thinking) added_text.push_back("</think>");
    std::vector<int32_t> ends = {eos};
    ends.insert(ends.end(), text_stops.begin(), text_stops.end());
    // (since the review's findings, check_output_options refuses every stop token that is text, which a call may
    // need to write; the mask itself still takes them as ends where the reply may end, checked here)
    plumb::GenerateOptions g;
    g.format = plumb::OutputFormat::ToolCalls, g.tool_calls.tools = kFreeTools, g.tool_calls.required = required;
    g.tool_calls.thinking = thinking, g.stop_tokens = text_stops;
    ASSERT_THROW(plumb::check_output_options(g, tok, eos), plumb::OptionError);
    for (int walk = 0; walk < 14; ++walk) {
      auto mask = plumb::gen::tool_call_mask(tok, vocab, ends, spec);
      ToolCallRecognizer shadow(spec);
      std::string text;
      std::vector<int32_t> ok;
      for (int step = 0; step < 120; ++step, ++steps) {
        {
          auto step_ok = plumb::testing::mask_step_matches_feed(*mask, shadow, tok, ends, added_text, text);
          ASSERT_TRUE(step_ok) << "config " << config;
          ok = std::move(*step_ok);
        }
        int32_t id = ok[rng() % ok.size()];
        for (int32_t prefer : ok)  // (lean to longer tokens: the tags)
          if (rng() % 3 == 0 && tok.token_bytes(prefer).size() > tok.token_bytes(id).size()) id = prefer;
        const bool is_end = std::find(ends.begin(), ends.end(), id) != ends.end();
        if (is_end && !shadow.complete() && step < 100) {  // (go on in free text, mostly)
          const auto other = std::find_if(ok.begin(), ok.end(), [&](int32_t x) { return std::find(ends.begin(), ends.end(), x) == ends.end(); });
          if (other != ok.end()) id = *other;
        }
        mask->accept(id);
        if (std::find(ends.begin(), ends.end(), id) != ends.end()) {
          ++ended;
          if (!shadow.complete()) {
            EXPECT_TRUE(plumb::parse_reply(text, thinking).tool_calls.empty()) << text;
          }
          break;
        }
        added_used += tok.is_added(id);
        ASSERT_TRUE(shadow.feed(tok.token_bytes(id)));
        text += tok.token_bytes(id);
      }
      if (shadow.complete()) {
        ++completed;
        EXPECT_TRUE(free_reads_back(*spec, text));
      }
    }
  }
  std::printf("mask steps checked: %d, %d blocks completed, %d ended by an end token, %d added tokens taken\n", steps,
              completed, ended, added_used);
  EXPECT_GT(completed, 0);
  EXPECT_GT(added_used, 0);
}

// The end tokens' rules under required false: a stop token whose text lies in the block's fixed text ("\n", "<") is
// refused (the mask would keep it out inside the block); EOS and a stop token outside it are taken.
TEST(ToolCallFreeReview, TextStopTokensAreRefused) {
  auto v = free_vocab("stops", {"Bye"}, {});
  const plumb::Tokenizer& tok = *v->tok;
  const int32_t eos = tok.token_id("<｜end▁of▁sentence｜>");
  plumb::GenerateOptions g;
  g.format = plumb::OutputFormat::ToolCalls, g.tool_calls.tools = kFreeTools, g.tool_calls.required = false;
  for (const std::string s : {"\n", "<", ">", "\"", "D", "_"}) {
    g.stop_tokens = {int32_t(uint8_t(s[0]))};  // (ids 0-255: the bytes)
    try {
      plumb::check_output_options(g, tok, eos);
      ADD_FAILURE() << "a stop token [" << s << "] inside the block's text is taken";
    } catch (const plumb::OptionError& e) {
      EXPECT_EQ(e.field, "stop_tokens") << e.what();
    }
  }
  // (mended since: any stop token that is text is refused, "Bye" too: a key or value may need it)
  g.stop_tokens = {tok.token_id("Bye")};
  ASSERT_GE(g.stop_tokens[0], 256);
  EXPECT_THROW(plumb::check_output_options(g, tok, eos), plumb::OptionError);
  // Stop strings inside the block are taken under auto (they cut a block as any text), refused under required.
  g.stop_tokens.clear();
  g.stop_strings = {"\n", "</｜DSML｜parameter>"};
  EXPECT_NO_THROW(plumb::check_output_options(g, tok, eos));
  g.tool_calls.required = true;
  EXPECT_THROW(plumb::check_output_options(g, tok, eos), plumb::OptionError);
}

// ---------------------------------------------------------------------------------------------------------------------
// (3) generate() end to end with a scripted session.

plumb::ModelInfo free_info(const plumb::Tokenizer& tok) {
  plumb::ModelInfo info;
  info.vocab_size = tok.vocab_size();
  info.bos_token = 0;
  info.eos_token = tok.token_id("<｜end▁of▁sentence｜>");
  info.max_positions = 8192;
  return info;
}

std::unique_ptr<FreeVocab> free_gen_vocab() {
  return free_vocab("gen", {"<｜DSML｜", "</｜DSML｜", "tool_calls>", "invoke", "parameter", " name=\"", "\" string=\"",
                            "true\">", "false\">", "get_weather", "search", "city", "query", "\">\n", "\n<", "Let me",
                            " look", "Paris", "Rome", "reason", "ing"},
                    {"</think>"});
}

TEST(ToolCallFreeReview, GenerateAutoAndThinkingRepliesEndToEnd) {
  auto v = free_gen_vocab();
  const plumb::Tokenizer& tok = *v->tok;
  const plumb::ModelInfo info = free_info(tok);
  const std::vector<int32_t> prompt = {0};
  const std::string call = free_block({{"", "get_weather", R"({"city": "Paris", "days": 3})"}});
  struct Case {
    bool thinking, required;
    std::string target, text;  // text: what comes back ("" = the target)
    bool calls;
  };
  const std::vector<Case> cases = {
      {false, false, "Just text, no call. a < b", "", false},
      {false, false, "Let me look." + call, "", true},
      {false, false, call.substr(2), "", true},
      {true, false, "reasoning about " + kFreeTag + "</think>Answer: none.", "", false},
      {true, false, "reasoning</think>Let me look." + call, "", true},
      {true, true, "reasoning</think>" + call, "", true},
      {true, false, "reasoning never closed", "", false},
  };
  for (const Case& c : cases) {
    for (int host = 0; host < 2; ++host) {
      SCOPED_TRACE(c.target + (host ? " (host path)" : ""));
      plumb::GenerateOptions g;
      g.sampling.temperature = 0, g.max_tokens = 400;
      g.format = plumb::OutputFormat::ToolCalls, g.tool_calls.tools = kFreeTools;
      g.tool_calls.required = c.required, g.tool_calls.thinking = c.thinking;
      int logits_seen = 0;
      if (host) g.on_logits = [&](std::span<const float>, int32_t) { ++logits_seen; };
      plumb::testing::PreferringSession s(tok, c.target, info, true);
      plumb::GenerateResult r;
      ASSERT_NO_THROW(r = plumb::generate(s, tok, prompt, g));
      EXPECT_EQ(r.text, c.text.empty() ? c.target : c.text);
      EXPECT_EQ(r.stop, plumb::StopReason::Token);
      const plumb::ChatMessage m = plumb::parse_reply(r.text, c.thinking);
      EXPECT_EQ(!m.tool_calls.empty(), c.calls);
      if (host) {
        EXPECT_EQ(logits_seen, int(r.tokens.size()));
      }
    }
  }
}

// Sampling (high temperature: the reply strays from the target, inside the block too), several choices (seeds), both
// paths: never an error mid-way; a reply that ends by a token is either free of a block or a block read back.
TEST(ToolCallFreeReview, SampledRepliesNeverFailMidWay) {
  auto v = free_gen_vocab();
  const plumb::Tokenizer& tok = *v->tok;
  const plumb::ModelInfo info = free_info(tok);
  const std::vector<int32_t> prompt = {0};
  const std::string call = free_block({{"", "search", R"({"query": "weather in Paris", "filters": ["news"]})"}});
  int calls = 0, texts = 0, cut = 0;
  for (int config = 0; config < 3; ++config) {
    const bool thinking = config > 0, required = config == 2;
    const auto spec = free_spec(thinking, required);
    // (a quarter of the seeds under the sanitizers: every path still runs; the Release run takes them all)
    for (uint64_t seed = 0; seed < uint64_t(plumb_test::walks(12)); ++seed) {
      std::string device_text;
      for (int host = 0; host < 2; ++host) {
        plumb::GenerateOptions g;
        g.sampling.temperature = 2.5f, g.sampling.top_k = 0, g.sampling.top_p = 1, g.sampling.min_p = 0;
        g.sampling.seed = seed, g.max_tokens = 300;
        g.format = plumb::OutputFormat::ToolCalls, g.tool_calls.tools = kFreeTools;
        g.tool_calls.required = required, g.tool_calls.thinking = thinking;
        if (host) g.on_logits = [](std::span<const float>, int32_t) {};
        plumb::testing::PreferringSession s(tok, (thinking ? "reasoning</think>" : "") + std::string("Let me look.") + call, info, true);
        plumb::GenerateResult r;
        try {
          r = plumb::generate(s, tok, prompt, g);
        } catch (const std::exception& e) {
          ADD_FAILURE() << "config " << config << " seed " << seed << ": " << e.what();
          continue;
        }
        if (host) {
          EXPECT_EQ(r.text, device_text) << "the host path (on_logits) draws otherwise";
        } else {
          device_text = r.text;
        }
        ToolCallRecognizer shadow(spec);
        EXPECT_TRUE(shadow.feed(r.text)) << r.text;
        if (r.stop == plumb::StopReason::Token) {
          EXPECT_TRUE(shadow.may_end()) << r.text;
          if (shadow.complete()) {
            EXPECT_TRUE(free_reads_back(*spec, r.text));
            ++calls;
          } else {
            EXPECT_TRUE(plumb::parse_reply(r.text, thinking).tool_calls.empty());
            ++texts;
          }
        } else {
          ++cut;
        }
      }
    }
  }
  std::printf("sampled: %d calls, %d texts, %d cut by max_tokens\n", calls, texts, cut);
}

// A stop string cutting a block in auto mode: the reply comes back as text (no error), and so does max_tokens'.
TEST(ToolCallFreeReview, StopStringsAndMaxTokensCutAnAutoBlockIntoText) {
  auto v = free_gen_vocab();
  const plumb::Tokenizer& tok = *v->tok;
  const plumb::ModelInfo info = free_info(tok);
  const std::vector<int32_t> prompt = {0};
  const std::string call = free_block({{"", "get_weather", R"({"city": "Paris"})"}});
  for (const std::string stop : {"\n", "<｜DSML｜invoke", "Paris", "</｜DSML｜parameter>", "</｜DSML｜tool_calls>"}) {
    for (int host = 0; host < 2; ++host) {
      SCOPED_TRACE(stop);
      plumb::GenerateOptions g;
      g.sampling.temperature = 0, g.max_tokens = 400, g.stop_strings = {stop};
      g.format = plumb::OutputFormat::ToolCalls, g.tool_calls.tools = kFreeTools, g.tool_calls.required = false;
      if (host) g.on_logits = [](std::span<const float>, int32_t) {};
      plumb::testing::PreferringSession s(tok, "Let me look." + call, info, true);
      plumb::GenerateResult r;
      ASSERT_NO_THROW(r = plumb::generate(s, tok, prompt, g));
      EXPECT_EQ(r.stop, plumb::StopReason::String);
      const std::string full = "Let me look." + call;
      EXPECT_EQ(r.text, full.substr(0, full.find(stop)));
      EXPECT_TRUE(plumb::parse_reply(r.text, false).tool_calls.empty());
    }
  }
  for (int max = 1; max < 40; max += 3) {
    plumb::GenerateOptions g;
    g.sampling.temperature = 0, g.max_tokens = max;
    g.format = plumb::OutputFormat::ToolCalls, g.tool_calls.tools = kFreeTools, g.tool_calls.required = false;
    plumb::testing::PreferringSession s(tok, "Let me look." + call, info, true);
    plumb::GenerateResult r;
    ASSERT_NO_THROW(r = plumb::generate(s, tok, prompt, g));
    EXPECT_EQ(r.stop, plumb::StopReason::Length);
    // (a cut inside a character ends in U+FFFD, as any text cut there does)
    std::string text = r.text;
    if (text.size() >= 3 && text.compare(text.size() - 3, 3, "\xef\xbf\xbd") == 0) text.resize(text.size() - 3);
    EXPECT_TRUE(("Let me look." + call).rfind(text, 0) == 0) << r.text;
    EXPECT_TRUE(plumb::parse_reply(r.text, false).tool_calls.empty());
  }
}

// FINDING: with thinking and required, every reply holds "</think>" right before the block (and ">\n\n<" across the
// two), yet a stop string there is taken: the reply then ends with its reasoning, never with the call that `required`
// holds it to. check_tool_calls refuses stop strings inside the block's fixed text under required (they "would end every
// reply early"), but its fixed texts (tool_call_fixed_texts) leave out "</think>" and what meets across it and the
// block's opening. (The same for a text stop token "</think>": kept out of the reasoning by the mask, not refused.)
TEST(ToolCallFreeReview, AStopStringEveryThinkingRequiredReplyHoldsIsRefused) {
  auto v = free_gen_vocab();
  const plumb::Tokenizer& tok = *v->tok;
  const plumb::ModelInfo info = free_info(tok);
  const std::string call = free_block({{"", "get_weather", R"({"city": "Rome"})"}});
  for (const std::string stop : {"</think>", "think>", ">\n\n<"}) {
    SCOPED_TRACE(stop);
    plumb::GenerateOptions g;
    g.sampling.temperature = 0, g.max_tokens = 300, g.stop_strings = {stop};
    g.format = plumb::OutputFormat::ToolCalls, g.tool_calls.tools = kFreeTools;
    g.tool_calls.required = true, g.tool_calls.thinking = true;
    try {
      plumb::check_output_options(g, tok, info.eos_token);
    } catch (const plumb::OptionError& e) {
      EXPECT_EQ(e.field, "stop_strings");
      continue;  // (refused: what the rule says)
    }
    plumb::testing::PreferringSession s(tok, "reasoning</think>" + call, info, true);
    const plumb::GenerateResult r = plumb::generate(s, tok, std::vector<int32_t>{0}, g);
    const plumb::ChatMessage m = plumb::parse_reply(r.text, true);
    EXPECT_FALSE(m.tool_calls.empty()) << "taken, and the required reply [" << r.text << "] ends ("
                                       << plumb::stop_reason_name(r.stop) << ") without its call";
  }
}

// FINDING: a stop token whose text is not the block's fixed text but is needed inside it (here "y", the last letter of
// the required key "city" under additionalProperties false) is taken by check_output_options; the mask lets the block
// go into the key ("cit") and then keeps the stop token out as text, so no token can continue: generate() throws
// mid-reply ("no token of the vocabulary can continue the output"; plumb serve: a 500). Since 1ff2174 every tool_choice
// "auto" chat goes through this mask, so a server --stop-token of that kind now breaks calls it did not touch before.
TEST(ToolCallFreeReview, AStopTokenNeededInsideAKeyIsNoErrorMidReply) {
  auto v = free_vocab("keystop", {"Let me", " look"}, {});
  const plumb::Tokenizer& tok = *v->tok;
  const plumb::ModelInfo info = free_info(tok);
  const std::string call = free_block({{"", "get_weather", R"({"city": "Rome"})"}});
  plumb::GenerateOptions g;
  g.sampling.temperature = 0, g.max_tokens = 400;
  g.format = plumb::OutputFormat::ToolCalls, g.tool_calls.tools = kFreeTools, g.tool_calls.required = false;
  g.stop_tokens = {int32_t('y')};  // (ids 0-255: the bytes)
  bool refused = false;
  try {
    plumb::check_output_options(g, tok, info.eos_token);
  } catch (const plumb::OptionError&) {
    refused = true;  // (refusing it up front would be a fix too)
  }
  if (refused) return;
  plumb::testing::PreferringSession s(tok, "Let me look." + call, info);
  try {
    const plumb::GenerateResult r = plumb::generate(s, tok, std::vector<int32_t>{0}, g);
    SUCCEED() << r.text;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "taken, then generate() fails mid-reply: " << e.what();
  }
}

// The mask over the bundled tiny model's tokenizer (ByteLevel, DeepSeek's added markers: "</think>" and "<｜DSML｜>"
// among them, the latter no tag's text), in each free configuration: every token's bit is the per-token feed's.
TEST(ToolCallFreeReview, MaskBitsOverTheTinyTokenizer) {
  const plumb::Tokenizer tok = plumb::Tokenizer::load(PLUMB_TEST_DATA "/../../models/tiny");
  const int32_t eos = tok.token_id("<｜end▁of▁sentence｜>"), vocab = tok.vocab_size();
  ASSERT_GE(eos, 0);
  std::mt19937 rng(5);
  int steps = 0;
  for (int config = 0; config < 3; ++config) {
    const bool thinking = config >= 1, required = config == 1;
    const auto spec = free_spec(thinking, required);
    std::vector<std::string> added_text;
    if (thinking) added_text.push_back("</think>");
    const std::string target = (thinking ? "Hmm <｜DSML｜tool_calls> </thi</think>" : "") + std::string(required ? "" : "Ok <｜DSML｜tool") +
                               free_block({{"", "get_weather", R"({"city": "Oslo", "units": "metric"})"}});
    // (one walk of 3 under the sanitizers: every path still runs; the Release run takes them all)
    for (int walk = 0; walk < plumb_test::walks(3); ++walk) {
      auto mask = plumb::gen::tool_call_mask(tok, vocab, {eos}, spec);
      ToolCallRecognizer shadow(spec);
      std::string text;
      std::vector<int32_t> ok;
      for (int step = 0; step < 150 && !shadow.complete(); ++step, ++steps) {
        {
          auto step_ok = plumb::testing::mask_step_matches_feed(*mask, shadow, tok, {eos}, added_text, text);
          ASSERT_TRUE(step_ok);
          ok = std::move(*step_ok);
        }
        // (follow the target with the longest allowed token that goes on with it, else a random allowed token)
        int32_t id = -1;
        const std::string rest = target.compare(0, text.size(), text) == 0 ? target.substr(text.size()) : "";
        for (int32_t x : ok)
          if (x != eos && !tok.token_bytes(x).empty() && rest.compare(0, tok.token_bytes(x).size(), tok.token_bytes(x)) == 0 &&
              (id < 0 || tok.token_bytes(x).size() > tok.token_bytes(id).size()))
            id = x;
        if (id < 0 || rng() % 8 == 0) id = ok[rng() % ok.size()];
        if (id == eos) break;
        mask->accept(id);
        ASSERT_TRUE(shadow.feed(tok.token_bytes(id)));
        text += tok.token_bytes(id);
      }
      if (shadow.complete()) {
        EXPECT_TRUE(free_reads_back(*spec, text));
      }
    }
  }
  std::printf("tiny tokenizer: %d steps checked\n", steps);
}

// By design (the commit's rule, as parse_reply finds a block): under auto the tag's first occurrence begins a block,
// so a reply that writes the tag in prose ("the tag <｜DSML｜tool_calls> starts a call") is made a call, where the
// unmasked reply would have come back as text (parse_reply finds no block in it). Documented here, not a failure.
TEST(ToolCallFreeReview, TheTagInProseBeginsABlockUnderAuto) {
  auto v = free_gen_vocab();
  const plumb::Tokenizer& tok = *v->tok;
  const plumb::ModelInfo info = free_info(tok);
  const std::string prose = "The tag " + kFreeTag + " starts a call.";
  EXPECT_TRUE(plumb::parse_reply(prose, false).tool_calls.empty());
  plumb::GenerateOptions g;
  g.sampling.temperature = 0, g.max_tokens = 200;
  g.format = plumb::OutputFormat::ToolCalls, g.tool_calls.tools = kFreeTools, g.tool_calls.required = false;
  plumb::testing::PreferringSession s(tok, prose, info, true);
  const plumb::GenerateResult r = plumb::generate(s, tok, std::vector<int32_t>{0}, g);
  EXPECT_EQ(r.text.rfind("The tag " + kFreeTag + "\n<｜DSML｜invoke name=\"", 0), 0u) << r.text;
}

// End tokens that are tag text: an added "<｜DSML｜tool_calls>" (a tokenizer's DSML tag, which passes as text since
// b40f642) that is also a stop token. check_tool_calls skips added tokens' text, so it is taken; then under required
// the mask keeps it out of the block and the block is spelled by other tokens (no dead end), and under auto it ends the
// reply where the model would begin a call (what a stop token does; the reply is text). Coverage of both.
TEST(ToolCallFreeReview, AnAddedTagThatIsAStopTokenIsNoDeadEnd) {
  auto v = free_vocab("addedstop", {"<｜DSML｜", "Let me", " look", "get_weather", "city", "Rome"}, {"<｜DSML｜tool_calls>"});
  const plumb::Tokenizer& tok = *v->tok;
  const plumb::ModelInfo info = free_info(tok);
  const int32_t tag = tok.token_id(kFreeTag);
  ASSERT_GE(tag, 0);
  ASSERT_TRUE(tok.is_added(tag));
  const std::string call = free_block({{"", "get_weather", R"({"city": "Rome"})"}});
  for (int required = 0; required < 2; ++required) {
    SCOPED_TRACE(required ? "required" : "auto");
    plumb::GenerateOptions g;
    g.sampling.temperature = 0, g.max_tokens = 400, g.stop_tokens = {tag};
    g.format = plumb::OutputFormat::ToolCalls, g.tool_calls.tools = kFreeTools, g.tool_calls.required = required;
    EXPECT_NO_THROW(plumb::check_output_options(g, tok, info.eos_token));
    plumb::testing::PreferringSession s(tok, (required ? "" : "Let me look.") + call, info, true);
    plumb::GenerateResult r;
    ASSERT_NO_THROW(r = plumb::generate(s, tok, std::vector<int32_t>{0}, g));
    if (required) {
      EXPECT_EQ(r.text, call);
      EXPECT_EQ(plumb::parse_reply(r.text, false).tool_calls.size(), 1u);
    } else {
      EXPECT_EQ(r.text, "Let me look.\n\n");
      EXPECT_EQ(r.stop, plumb::StopReason::Token);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------------
// (5) Cost: allowed() per step at the synthetic 129K vocabulary in the free phases (auto, thinking), with a partial
// tag or "</think>" held, and just after "</think>" (the block's opening under required; free text under auto).

TEST(ToolCallFreeReview, DISABLED_FreePhaseStepCostAtALargeVocabulary) {  // (timed: run by hand)
  auto v = free_vocab("cost", plumb::testing::synthetic_vocabulary(), {"</think>"});
  const plumb::Tokenizer& tok = *v->tok;
  const int32_t vocab = tok.vocab_size(), eos = tok.token_id("<｜end▁of▁sentence｜>");
  std::vector<uint32_t> bits(plumb::gen::token_bits_words(vocab));
  struct Probe {
    const char* what;
    bool thinking, required;
    std::string before;
  };
  const std::vector<Probe> probes = {
      {"auto, free text", false, false, "Once upon a time, in a land"},
      {"auto, after '<'", false, false, "a <"},
      {"auto, after a partial tag", false, false, "a <｜DSML｜tool_"},
      {"auto, just after the tag", false, false, "a " + kFreeTag},
      {"thinking, reasoning", true, true, "Let me think about this"},
      {"thinking, after '</thi'", true, true, "so </thi"},
      {"thinking+required, just after </think>", true, true, "done</think>"},
      {"thinking+auto, just after </think>", true, false, "done</think>"},
      {"thinking+auto, content", true, false, "done</think>The answer is"},
  };
  double worst_mean = 0, build_ms = 0;
  for (const Probe& p : probes) {
    const auto spec = free_spec(p.thinking, p.required);
    const auto b0 = std::chrono::steady_clock::now();
    auto mask = plumb::gen::tool_call_mask(tok, vocab, {eos}, spec);
    build_ms = std::max(build_ms, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - b0).count());
    for (char c : p.before) mask->accept(uint8_t(c));  // (the byte-level tokenizer's ids 0-255 are the bytes)
    double total = 0, worst = 0;
    const int reps = 10;
    for (int i = 0; i < reps; ++i) {
      std::fill(bits.begin(), bits.end(), 0u);
      const auto t0 = std::chrono::steady_clock::now();
      mask->allowed(bits);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      total += ms, worst = std::max(worst, ms);
    }
    std::printf("%-42s mean %.2f ms, worst %.2f ms per allowed()\n", p.what, total / reps, worst);
    worst_mean = std::max(worst_mean, total / reps);
  }
  std::printf("building a mask (tool_call_mask, tables cached): at most %.1f ms\n", build_ms);
  EXPECT_LT(worst_mean, 5.0);
}

}  // namespace
