// OutputFormat::ToolCalls: the DSML block's recognizer against the block render_calls writes and parse_calls reads,
// against Python's jsonschema on its labelled cases (each object rendered as a call), along random walks (no dead end,
// every completed block read back), and the mask over a tokenizer against a brute-force check of each token.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "generate/json_schema.h"
#include "generate/token_bits.h"
#include "generate/tool_call_mask.h"
#include "json_test_util.h"
#include "sanitized.h"
#include "tool_call_test_util.h"
#include "plumb/text.h"
#include "text/dsml.h"

namespace {

using json = nlohmann::json;
using plumb::gen::SchemaRecognizer;
using plumb::gen::ToolCallRecognizer;
using plumb::gen::ToolCallSpec;

const char* kTools = R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string", "minLength": 1}, "days": {"type": "integer", "minimum": 1, "maximum": 14},
                   "units": {"enum": ["metric", "imperial"]}},
    "required": ["city"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
  {"type": "function", "function": {"name": "search", "parameters": {"type": "object",
    "properties": {"query": {"type": "string"}, "filters": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                   "exact": {"type": "boolean"}}, "required": ["query", "filters"]}}},
  {"type": "function", "function": {"name": "ping"}}])";

ToolCallRecognizer recognizer(const char* tools = kTools, std::vector<std::string> names = {}, bool parallel = true) {
  return ToolCallRecognizer(ToolCallSpec::build(tools, names, parallel));
}

// Whether `text` is taken whole, each prefix along the way, and is complete only at its end.
::testing::AssertionResult whole(ToolCallRecognizer r, const std::string& text) {
  for (size_t i = 0; i < text.size(); ++i) {
    if (r.complete()) return ::testing::AssertionFailure() << "complete before byte " << i << " of [" << text << "]";
    if (!r.feed(uint8_t(text[i])))
      return ::testing::AssertionFailure() << "refused at byte " << i << " ('" << text[i] << "') after ["
                                           << text.substr(0, i) << "]";
  }
  if (!r.complete()) return ::testing::AssertionFailure() << "not complete after [" << text << "]";
  return ::testing::AssertionSuccess();
}

bool has_float(const nlohmann::ordered_json& j) {
  if (j.is_number_float()) return true;
  if (j.is_structured())
    for (const auto& x : j)
      if (has_float(x)) return true;
  return false;
}

std::string block(const std::vector<plumb::ToolCall>& calls) { return plumb::dsml::render_calls(calls, "test"); }

TEST(ToolCallRecognizer, TakesTheBlocksTheEncoderRenders) {
  const auto r = recognizer();
  EXPECT_TRUE(whole(r, block({{"", "get_weather", R"({"city": "Paris"})"}})));
  EXPECT_TRUE(whole(r, block({{"", "get_weather", R"({"days": 3, "city": "Saint-Étienne", "units": "metric"})"}})));
  EXPECT_TRUE(whole(r, block({{"", "get_time", "{}"}})));
  EXPECT_TRUE(whole(r, block({{"", "ping", "{}"}})));
  EXPECT_TRUE(whole(r, block({{"", "search", R"({"query": "a \"quoted\" <b>bold</b>\nline", "filters": ["x", "y"], "more": {"k": [1, null]}})"}})));
  // Several calls (parallel_tool_calls, the default).
  EXPECT_TRUE(whole(r, block({{"", "get_time", "{}"}, {"", "get_weather", R"({"city": "Oslo"})"}, {"", "ping", "{}"}})));
  // A raw value holding control characters, a backslash and text that starts the close (the close is not whole).
  EXPECT_TRUE(whole(r, block({{"", "search", "{\"query\": \"tab\\there \\\\ </｜DSML｜param \\u0001\", \"filters\": []}"}})));
}

TEST(ToolCallRecognizer, RefusesWhatTheToolsDoNotAllow) {
  const auto r = recognizer();
  // (each text below is refused at one of its bytes, not merely left incomplete)
  auto refused = [&](const std::string& text, ToolCallRecognizer from) {
    for (char c : text)
      if (!from.feed(uint8_t(c))) return true;
    return false;
  };
  const std::string open = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"";
  const std::string p = "<｜DSML｜parameter name=\"", close = "</｜DSML｜parameter>\n";
  const std::string end = "</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  EXPECT_TRUE(whole(r, open + "get_weather\">\n" + p + "city\" string=\"true\">Rome" + close + end));
  EXPECT_TRUE(refused(open + "get_wether\">\n", r));                                  // an unknown function
  EXPECT_TRUE(refused(open + "get_weather\">\n" + p + "days\" string=\"false\">2" + close + end, r));  // city required
  EXPECT_TRUE(refused(open + "get_weather\">\n" + p + "city\" string=\"false\">5" + close + end, r));  // city a string
  EXPECT_TRUE(refused(open + "get_weather\">\n" + p + "city\" string=\"true\">" + close + end, r));  // minLength 1
  EXPECT_TRUE(refused(open + "get_weather\">\n" + p + "days\" string=\"true\">2", r));  // an integer as text
  EXPECT_TRUE(refused(open + "get_weather\">\n" + p + "city\" string=\"false\">\"Rome\"" + close + end, r));
  EXPECT_TRUE(refused(open + "get_weather\">\n" + p + "city\" string=\"true\">A" + close + p + "days\" string=\"false\">15" + close + end, r));
  EXPECT_TRUE(refused(open + "get_weather\">\n" + p + "city\" string=\"true\">A" + close + p + "city\" string=\"true\">B" + close + end, r));
  EXPECT_TRUE(refused(open + "get_weather\">\n" + p + "country\"", r));  // additionalProperties false
  EXPECT_TRUE(refused(open + "get_weather\">\n" + p + "units\" string=\"true\">kelvin" + close, r));  // not in the enum
  // A key written twice where the schema would allow it (search's other keys): parse_calls refuses such a block.
  EXPECT_TRUE(refused(open + "search\">\n" + p + "query\" string=\"true\">q" + close + p + "filters\" string=\"false\">[]" +
                          close + p + "x\" string=\"false\">1" + close + p + "x\" string=\"false\">2" + close + end, r));
  // One call only.
  const auto one = recognizer(kTools, {}, false);
  EXPECT_TRUE(refused(block({{"", "ping", "{}"}, {"", "ping", "{}"}}), one));
  EXPECT_TRUE(whole(one, block({{"", "ping", "{}"}})));
  // A named function only.
  const auto named = recognizer(kTools, {"get_time"});
  EXPECT_TRUE(refused(block({{"", "ping", "{}"}}), named));
  EXPECT_TRUE(whole(named, block({{"", "get_time", "{}"}, {"", "get_time", "{}"}})));
  // ping (no parameters declared): no key at all.
  EXPECT_TRUE(refused(block({{"", "ping", R"({"a": 1})"}}), r));
}

TEST(ToolCallRecognizer, TheCloseEndsAValueOnlyWhereTheValueCanEnd) {
  const auto r = recognizer();
  const std::string head = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"search\">\n<｜DSML｜parameter name=\"filters\" string=\"false\">";
  ToolCallRecognizer s = r;
  ASSERT_TRUE(s.feed(head + "[\"a"));
  // Inside the JSON string the close's text cannot be whole (parse_calls would end the value there, mid-string)...
  ToolCallRecognizer t = s;
  EXPECT_TRUE(t.feed("</｜DSML｜parameter"));
  EXPECT_FALSE(t.feed(uint8_t('>')));
  // ...but its beginning is text of the string.
  EXPECT_TRUE(s.feed("</｜DSML｜parameterX\"]</｜DSML｜parameter>\n"));
  // A number ends at the close.
  ToolCallRecognizer n = recognizer();
  EXPECT_TRUE(n.feed("\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"days\" string=\"false\">1"));
  ToolCallRecognizer n2 = n, n3 = n;
  EXPECT_TRUE(n.feed("4</｜DSML｜parameter>\n"));
  EXPECT_TRUE(n2.feed("</｜DSML｜parameter>\n"));
  EXPECT_FALSE(n3.feed(uint8_t('5')));  // (15 > maximum)
  // A value that is not whole cannot end: after "[" the close cannot begin ('<' is no JSON there either).
  ToolCallRecognizer o = recognizer();
  EXPECT_TRUE(o.feed(head + "["));
  EXPECT_FALSE(o.feed(uint8_t('<')));
  // Nor can the value close the arguments or begin their next key: those are the DSML's.
  ToolCallRecognizer v = recognizer();
  EXPECT_TRUE(v.feed(head + "[]"));
  EXPECT_FALSE(ToolCallRecognizer(v).feed(uint8_t('}')));
  EXPECT_FALSE(ToolCallRecognizer(v).feed(uint8_t(',')));
  EXPECT_TRUE(v.feed(" </｜DSML｜parameter>\n"));
}

// What comes before the block: a thinking reply's reasoning (free, up to "</think>"; with required the block right
// after it, and the reply cannot end before the block), or free text (required false: the reply may end anywhere in it,
// and the block's tag begins a block, held as any other).
TEST(ToolCallRecognizer, ReasoningAndFreeTextBeforeTheBlock) {
  const std::string call = block({{"", "get_weather", R"({"city": "Rome"})"}});
  const std::string tagged = call.substr(2);  // (from the tag on)
  const auto think = ToolCallRecognizer(ToolCallSpec::build(kTools, {}, true, true, true));
  EXPECT_FALSE(think.may_end());
  EXPECT_TRUE(whole(think, "Let me see: <tag> </thin and </ then.</think>" + call));
  ToolCallRecognizer t = think;
  EXPECT_TRUE(t.feed("ok</think>"));
  EXPECT_FALSE(t.may_end());
  EXPECT_FALSE(ToolCallRecognizer(t).feed(uint8_t('H')));  // (required: the block right after the reasoning)
  EXPECT_FALSE(whole(think, "ok</think>Sure." + call));
  const auto text = ToolCallRecognizer(ToolCallSpec::build(kTools, {}, true, false, false));
  ToolCallRecognizer f = text;
  EXPECT_TRUE(f.may_end() && !f.complete());
  EXPECT_TRUE(f.feed("Plain answer, a < b, and <｜DSML｜tool not a tag."));
  EXPECT_TRUE(f.may_end());
  EXPECT_TRUE(whole(text, "I will call it." + call));
  EXPECT_TRUE(whole(text, tagged));  // (the tag without the blank line before it)
  ToolCallRecognizer g = text;
  EXPECT_TRUE(g.feed("Now: <｜DSML｜tool_calls>"));
  EXPECT_FALSE(g.may_end());  // (a block begun must be whole)
  EXPECT_FALSE(ToolCallRecognizer(g).feed(uint8_t('x')));
  EXPECT_FALSE(whole(text, "x" + block({{"", "get_weather", R"({"days": 3})"}})));  // (city required)
  const auto both = ToolCallRecognizer(ToolCallSpec::build(kTools, {}, true, true, false));
  EXPECT_TRUE(both.may_end());
  EXPECT_TRUE(whole(both, "hm <｜DSML｜tool_calls> in reasoning is text</think>Answer." + call));
  ToolCallRecognizer b = both;
  EXPECT_TRUE(b.feed("r</think>c") && b.may_end());
}

TEST(ToolCallSpec, BuildsAndRefusesByName) {
  EXPECT_EQ(ToolCallSpec::build(kTools, {}, true)->tools.size(), 4u);
  EXPECT_EQ(ToolCallSpec::build(kTools, {"ping"}, true)->tools.size(), 1u);
  auto message = [](const std::string& tools, std::vector<std::string> names = {}) {
    try {
      ToolCallSpec::build(tools, names, true);
    } catch (const plumb::Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(message(kTools, {"nope"}).find("function \"nope\" is not among the tools"), std::string::npos);
  EXPECT_NE(message("{}").find("tools must be an array"), std::string::npos);
  EXPECT_NE(message(R"([{"type": "function", "function": {"name": "a\"b"}}])").find("tools[0].function.name"), std::string::npos);
  EXPECT_NE(message(R"([{"type": "function"}])").find("tools[0]"), std::string::npos);
  // A schema outside the subset: loose (a JSON object only, said in `loose`), or refused when strict.
  const char* patterned = R"([{"type": "function", "function": {"name": "f", %s"parameters": {"type": "object",
      "properties": {"id": {"type": "string", "pattern": "^[a-z]+$"}}}}}])";
  char buf[512];
  std::snprintf(buf, sizeof buf, patterned, "");
  const auto loose = ToolCallSpec::build(buf, {}, true);
  ASSERT_EQ(loose->loose.size(), 1u);
  EXPECT_NE(loose->loose[0].find("pattern"), std::string::npos) << loose->loose[0];
  EXPECT_TRUE(whole(ToolCallRecognizer(loose), block({{"", "f", R"({"id": "ABC", "other": [1]})"}})));
  std::snprintf(buf, sizeof buf, patterned, "\"strict\": true, ");
  EXPECT_NE(message(buf).find("tools[0].function.parameters (\"f\", strict)"), std::string::npos) << message(buf);
  // A property name DSML cannot write: loose too.
  const auto quoted = ToolCallSpec::build(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
      "properties": {"a\"b": {"type": "integer"}}, "required": ["a\"b"]}}}])", {}, true);
  ASSERT_EQ(quoted->loose.size(), 1u);
  EXPECT_NE(quoted->loose[0].find("property \"a\"b\""), std::string::npos) << quoted->loose[0];
  // Parameters that are not an object's.
  const auto arr = ToolCallSpec::build(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}])", {}, true);
  EXPECT_EQ(arr->loose.size(), 1u);
}

// The labelled cases of tests/data/json_schema/cases.json (Python's jsonschema), each object rendered as the
// arguments of a call to a tool with that schema: a call is taken exactly when jsonschema calls the object valid.
// Cases whose object nlohmann would write differently (numbers past a double, duplicate keys, key spellings) and
// objects DSML cannot write (a key with '"', '\\' or a control character; a string holding the parameter's close) are
// left out.
TEST(ToolCallRecognizer, AgreesWithJsonschemaOnItsCasesAsCalls) {
  std::ifstream in(PLUMB_TEST_DATA "/json_schema/cases.json");
  ASSERT_TRUE(in.good());
  const json data = json::parse(in);
  std::vector<std::shared_ptr<const ToolCallSpec>> specs;
  for (const auto& s : data["schemas"]) {
    const json tools = json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", s}}}}});
    specs.push_back(ToolCallSpec::build(tools.dump(), {}, true));
  }
  int valid = 0, invalid = 0, skipped = 0;
  for (const auto& c : data["cases"]) {
    const std::string text = c["text"];
    const auto& spec = specs.at(c["schema"].get<size_t>());
    nlohmann::ordered_json args;
    try {
      args = nlohmann::ordered_json::parse(text);
    } catch (const std::exception&) {
      ++skipped;
      continue;
    }
    // (a float renders as Python writes it, 1e5 as 100000.0: another text, which the recognizer may type otherwise)
    bool writable = args.is_object() && args.dump() == text && spec->loose.empty() && !has_float(args);
    for (const auto& [k, v] : args.is_object() ? args.items() : nlohmann::ordered_json::object().items())
      writable = writable && k.find_first_of("\"\\") == std::string::npos &&
                 std::none_of(k.begin(), k.end(), [](char ch) { return uint8_t(ch) < 0x20; }) && !k.empty() &&
                 !(v.is_string() && v.get<std::string>().find(plumb::dsml::kParamClose) != std::string::npos);
    if (!writable) {
      ++skipped;
      continue;
    }
    const std::string call = block({{"", "f", text}});
    ToolCallRecognizer r(spec);
    const bool taken = r.feed(call) && r.complete();
    EXPECT_EQ(taken, c["valid"].get<bool>()) << "schema " << c["schema"] << ": " << text << "\n" << call << "\n"
                                             << data["schemas"][c["schema"].get<size_t>()].dump();
    (c["valid"].get<bool>() ? valid : invalid)++;
  }
  EXPECT_GT(valid, 400);
  EXPECT_GT(invalid, 300);
  EXPECT_LT(skipped, valid);
}

// Random walks over the bytes each state takes, on the cases' schemas as tools (two functions, several calls): no
// state takes no byte before the block is complete, and every completed block is read back by parse_calls with
// arguments the schema takes as JSON text (the structured-output recognizer, checked against jsonschema itself).
TEST(ToolCallRecognizer, RandomWalksNeverDeadEndAndReadBack) {
  std::ifstream in(PLUMB_TEST_DATA "/json_schema/cases.json");
  const json data = json::parse(in);
  std::mt19937 rng(81);
  int completed = 0, walks = 0;
  for (size_t k = 0; k + 1 < data["schemas"].size(); k += 3) {
    const json tools = json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", data["schemas"][k]}}}},
                                    {{"type", "function"}, {"function", {{"name", "g"}, {"parameters", data["schemas"][k + 1]}}}}});
    const auto spec = ToolCallSpec::build(tools.dump(), {}, true);
    // (one walk of 3 per pair under the sanitizers: every path still runs; the Release run takes them all)
    for (int w = 0; w < plumb_test::walks(3); ++w, ++walks) {
      ToolCallRecognizer r(spec);
      std::string text;
      for (int step = 0; step < 1500 && !r.complete(); ++step) {
        const std::vector<uint8_t> ok = plumb::testing::bytes_taken(r);
        ASSERT_FALSE(ok.empty()) << "dead end after [" << text << "] with tools " << tools.dump();
        uint8_t pick = ok[rng() % ok.size()];
        // (lean to ending values, containers and the parameter's close, so that many walks complete)
        for (uint8_t lean : {uint8_t('<'), uint8_t('/'), uint8_t('}'), uint8_t(']'), uint8_t('"'), uint8_t('0'), uint8_t('\n')})
          if (rng() % 2 == 0 && std::find(ok.begin(), ok.end(), lean) != ok.end()) pick = lean;
        if (rng() % 4 && text.size() >= 1 && text.back() == '<' && std::find(ok.begin(), ok.end(), uint8_t('/')) != ok.end())
          pick = '/';
        ASSERT_TRUE(r.feed(pick));
        text += char(pick);
      }
      if (!r.complete()) continue;
      ++completed;
      const auto calls = plumb::dsml::parse_calls(std::string_view(text).substr(2));  // (after the two line breaks)
      ASSERT_TRUE(calls) << text;
      for (const auto& c : *calls) {
        SchemaRecognizer s(spec->tools.at(c.name == "f" ? 0 : 1).params);
        // (compact: the values' own whitespace after parse_calls' ": " would be two runs, which the recognizer bounds)
        const std::string args = nlohmann::ordered_json::parse(c.arguments).dump();
        EXPECT_TRUE(s.feed(args) && s.complete()) << c.name << " " << args << "\n" << text;
      }
    }
  }
  EXPECT_GT(completed, walks / 4) << walks;
}

// The mask over a byte-level tokenizer whose tokens cut across the tags, end the close and go on, or hold escapes (a
// key's text cannot), and in a second run one plain-text token holding a whole parameter close, which turns the
// in-string shortcut off: at each step of random generations, each token's bit is whether the recognizer takes its
// bytes (tried here one by one), and the generated block reads back.
TEST(ToolCallMask, EachTokenIsAllowedExactlyWhenItsBytesAre) {
  for (int run = 0; run < 5; ++run) {
    // (runs 3 and 4: what comes before the block: a thinking reply's reasoning, "</think>" an added token as in
    // DeepSeek's tokenizer, then the block; free text in which the block's tag begins one, tool_choice "auto")
    const bool with_close_token = run == 1, dsml_added = run == 2, thinking = run == 3, free_text = run == 4;
    const auto dir = std::filesystem::temp_directory_path() / ("plumb_tool_mask_" + std::to_string(::getpid()));
    std::vector<std::string> extra = {"<｜DSML｜", "</｜DSML｜", "parameter", " name=\"", "\" string=\"", "true\">", "false\">",
                                      "get_", "weather", "city", "\">\n", "\n<", "Paris", "[\"", "\"]", "</", "｜", ">\n",
                                      "a\\nb", "q\\u00e9", "meter>", ">x", "DSML｜parameter>"};
    if (with_close_token) extra.push_back("x</｜DSML｜parameter>");  // (plain text: no quote, no control character)
    if (thinking || free_text)
      for (const char* t : {"</thi", "nk>", "x</think>", "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"", "tool_calls>", "a<｜DSML｜t"})
        extra.push_back(t);
    // (run 2: DSML's markers as added tokens, as a tokenizer may hold them: they pass as the text they are)
    const std::vector<std::string> added = dsml_added ? std::vector<std::string>{"<｜DSML｜", "</｜DSML｜", "｜DSML｜"}
                                           : thinking ? std::vector<std::string>{"</think>"}
                                                      : std::vector<std::string>{};
    const plumb::Tokenizer tok = plumb::Tokenizer::load(plumb::testing::write_byte_level_tokenizer(dir, extra, false, added));
    const int32_t eos = tok.token_id("<｜end▁of▁sentence｜>"), vocab = tok.vocab_size();
    ASSERT_GE(eos, 0);
    int added_used = 0;
    const auto spec = ToolCallSpec::build(kTools, {}, true, thinking, !free_text);
    std::mt19937 rng(7);
    int completed = 0;
    for (int walk = 0; walk < 12; ++walk) {
      auto mask = plumb::gen::tool_call_mask(tok, vocab, {eos}, spec);
      ToolCallRecognizer shadow(spec);
      std::string text;
      for (int step = 0; step < 160; ++step) {
        const auto allowed = plumb::testing::mask_step_matches_feed(*mask, shadow, tok, {eos}, added, text);
        ASSERT_TRUE(allowed && !allowed->empty());
        const std::vector<int32_t>& ok = *allowed;
        int32_t id = ok[rng() % ok.size()];
        for (int32_t prefer : ok)  // (lean to the longer tokens: the tags, so that blocks complete)
          if (rng() % 3 == 0 && tok.token_bytes(prefer).size() > tok.token_bytes(id).size() && prefer != eos) id = prefer;
        if (id == eos && !shadow.complete() && step < 150) id = ok[0] == eos ? ok.back() : ok[0];  // (free text goes on)
        mask->accept(id);
        if (id == eos) break;
        added_used += tok.is_added(id);
        shadow.feed(tok.token_bytes(id));
        text += tok.token_bytes(id);
      }
      if (!shadow.complete()) continue;
      ++completed;
      const plumb::ChatMessage m = plumb::parse_reply(text, thinking);
      EXPECT_FALSE(m.tool_calls.empty()) << text;
    }
    EXPECT_GT(completed, 0) << "run " << run;
    if (dsml_added || thinking) {
      EXPECT_GT(added_used, 0);
    }
    std::filesystem::remove_all(dir);
  }
}

// generate() with tool_choice "auto"'s form (required false): a model that answers in text is not changed (its EOS
// passes where the text may end); one that writes text then a call gets the call; one that begins a block and would
// leave it malformed (a parameter the tool lacks) is held to a valid one.
TEST(ToolCallMask, GenerateHoldsAnAutoReplyOnlyWhereItCalls) {
  const plumb::Tokenizer tok = plumb::Tokenizer::load(PLUMB_TEST_DATA "/../../models/tiny");
  plumb::ModelInfo info;
  info.vocab_size = 1216, info.bos_token = 0, info.eos_token = 1, info.max_positions = 4096;
  plumb::GenerateOptions g;
  g.sampling.temperature = 0, g.max_tokens = 600;
  g.format = plumb::OutputFormat::ToolCalls, g.tool_calls.tools = kTools, g.tool_calls.required = false;
  const std::vector<int32_t> prompt = {0};
  auto run = [&](const std::string& target) {
    plumb::testing::PreferringSession s(tok, target, info);
    return plumb::generate(s, tok, prompt, g);
  };
  const auto plain = run("Once upon a time, a fox < a bear.");
  EXPECT_EQ(plain.text, "Once upon a time, a fox < a bear.");
  EXPECT_EQ(plain.stop, plumb::StopReason::Token);
  const std::string call = block({{"", "get_weather", R"({"city": "Oslo"})"}});
  const auto called = run("Let me look." + call);
  EXPECT_EQ(called.text, "Let me look." + call);
  const plumb::ChatMessage m = plumb::parse_reply(called.text, false);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.content, "Let me look.");
  // (ping takes no parameter: from the one the model would write on, the mask writes the only call it allows; one
  // call, parallel_tool_calls false)
  g.tool_calls.parallel = false;
  const auto held = run("Sure." + block({{"", "ping", R"({"host": "a"})"}}));
  EXPECT_EQ(held.text, "Sure." + block({{"", "ping", "{}"}}));
  EXPECT_EQ(held.stop, plumb::StopReason::Token);
}

// The cost of one step's mask at a 129K-token vocabulary (not a test: run by hand, --gtest_also_run_disabled_tests),
// along a rendered call: the fixed text, a key, a raw string, a JSON value.
TEST(ToolCallMask, DISABLED_StepCostAtALargeVocabulary) {
  const auto dir = std::filesystem::temp_directory_path() / ("plumb_tool_mask_cost_" + std::to_string(::getpid()));
  const plumb::Tokenizer tok = plumb::Tokenizer::load(plumb::testing::write_byte_level_tokenizer(dir, plumb::testing::synthetic_vocabulary()));
  const int32_t vocab = tok.vocab_size();
  // Each allowed() along `text`, a byte per step (the byte-level tokenizer's ids 0-255 are the bytes).
  auto time_steps = [&](const std::shared_ptr<const ToolCallSpec>& spec, const std::string& text, const std::string& what) {
    auto mask = plumb::gen::tool_call_mask(tok, vocab, {vocab - 2}, spec);
    std::vector<uint32_t> bits(plumb::gen::token_bits_words(vocab));
    double worst = 0, total = 0;
    for (char c : text) {
      std::fill(bits.begin(), bits.end(), 0u);
      const auto t0 = std::chrono::steady_clock::now();
      mask->allowed(bits);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      worst = std::max(worst, ms), total += ms;
      mask->accept(uint8_t(c));
    }
    std::printf("%s: %zu steps (a byte each), mean %.2f ms, worst %.2f ms per allowed()\n", what.c_str(), text.size(),
                total / double(text.size()), worst);
  };
  for (int n : {1, 8, 64}) {
    json tools = json::array();
    for (int i = 0; i < n; ++i)
      tools.push_back(json::parse(kTools)[size_t((i + 2) % 4)]), tools.back()["function"]["name"] = "tool_" + std::to_string(i);
    const auto spec = ToolCallSpec::build(tools.dump(), {}, true);
    time_steps(spec, block({{"", "tool_0", R"({"query": "weather in Paris today", "filters": ["news", "maps"]})"}}),
               std::to_string(n) + " tools");
  }
  // tool_choice "auto": the reply's free text before any block (every step of a reply that does not call).
  const auto free_text = ToolCallSpec::build(kTools, {}, true, false, false);
  time_steps(free_text, "Once upon a time, in a land <far> away, \"quoted\" and\nmore </think> text.",
             "auto, free text");
  std::filesystem::remove_all(dir);
}

}  // namespace
