// A review of session 81's OutputFormat::ToolCalls (ToolCallRecognizer, ToolCallSpec, the tool-call mask and
// check_output_options' rules for it): the findings (each marked FINDING; all mended since, each test now passing),
// and the coverage the review added (an
// independent oracle over random blocks, dead-end walks around held-back closes, the mask against a per-token feed over
// tricky vocabularies, and the step cost at a 129K vocabulary in states the existing cost test does not reach).
#include <gtest/gtest.h>

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

using rjson = nlohmann::json;
using rojson = nlohmann::ordered_json;
using plumb::gen::SchemaRecognizer;
using plumb::gen::ToolCallRecognizer;
using plumb::gen::ToolCallSpec;

const std::string kRevOpen = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"";
const std::string kRevP = "<｜DSML｜parameter name=\"";
const std::string kRevClose = "</｜DSML｜parameter>";
const std::string kRevEnd = "\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";

std::string rev_tool(const std::string& name, const std::string& params) {
  return R"({"type": "function", "function": {"name": ")" + name + R"(", "parameters": )" + params + "}}";
}

ToolCallRecognizer rev_recognizer(const std::string& tools, std::vector<std::string> names = {}, bool parallel = true) {
  return ToolCallRecognizer(ToolCallSpec::build(tools, names, parallel));
}

bool rev_takes(ToolCallRecognizer r, const std::string& text) { return r.feed(text) && r.complete(); }

// Whether a state can still go on: some byte is taken (or the block is complete).
bool rev_goes_on(const ToolCallRecognizer& r) {
  if (r.complete()) return true;
  for (int b = 0; b < 256; ++b) {
    ToolCallRecognizer t = r;
    if (t.feed(uint8_t(b))) return true;
  }
  return false;
}

// The oracle: what the block must be, from parse_calls and the schema alone: the block read back (after its blank
// line), each call's function among the tools, one call unless parallel, its arguments (compact) taken by the
// structured-output recognizer of the function's parameters (itself checked against Python's jsonschema). The
// documented choices that parse_calls does not check (string="true" for JSON strings, string="false" for JSON that is
// not a string, an invoke without parameters written with its empty line) are the callers'.
struct RevOracle {
  std::shared_ptr<const ToolCallSpec> spec;
  bool operator()(const std::string& text, std::string* why = nullptr) const {
    auto no = [&](const std::string& w) {
      if (why) *why = w;
      return false;
    };
    if (text.rfind("\n\n", 0) != 0) return no("no blank line");
    const auto calls = plumb::dsml::parse_calls(std::string_view(text).substr(2));
    if (!calls) return no("parse_calls refuses it");
    if (calls->empty()) return no("no call");
    if (!spec->parallel && calls->size() != 1) return no("several calls");
    for (const auto& c : *calls) {
      const auto t = std::find_if(spec->tools.begin(), spec->tools.end(), [&](const auto& x) { return x.name == c.name; });
      if (t == spec->tools.end()) return no("unknown function " + c.name);
      rojson args;
      try {
        args = rojson::parse(c.arguments);
      } catch (const std::exception& e) {
        return no(std::string("arguments are no JSON: ") + e.what());
      }
      SchemaRecognizer s(t->params);
      if (!(s.feed(args.dump()) && s.complete())) return no("schema refuses " + args.dump());
    }
    return true;  // (the layout rules that parse_calls does not check are the caller's: RevBlock::layout_ok)
  }
};

// ---------------------------------------------------------------------------------------------------------------
// Findings
// ---------------------------------------------------------------------------------------------------------------

// FINDING: the mask's plain_ok (tool_call_mask) looks for a whole "</｜DSML｜parameter>" only in tables->plain, but the
// in-string shortcut also passes tables->plain_escaped untried wherever escapes_pass() (every Value state). A token that
// holds a backslash escape and a whole close ("\t</｜DSML｜parameter>") is in plain_escaped: it passes untried inside a
// raw value even where the value cannot end (minLength), or where bytes after the close cannot follow it, and
// accept() then throws ("token ... cannot continue the output") in the middle of a generation.
TEST(ToolCallReview, AnEscapedPlainTokenHoldingTheCloseIsTried) {
  const auto dir = std::filesystem::temp_directory_path() / ("plumb_tcreview_esc_" + std::to_string(::getpid()));
  const std::string esc_close = "\\t" + kRevClose, esc_close_more = "\\t" + kRevClose + "zz";
  const plumb::Tokenizer tok =
      plumb::Tokenizer::load(plumb::testing::write_byte_level_tokenizer(dir, {esc_close, esc_close_more}));
  const int32_t eos = tok.token_id("<｜end▁of▁sentence｜>"), vocab = tok.vocab_size();
  const std::string tools = "[" + rev_tool("f", R"({"type": "object", "properties": {"city": {"type": "string",
      "minLength": 5}}, "required": ["city"], "additionalProperties": false})") + "]";
  const auto spec = ToolCallSpec::build(tools, {}, true);
  auto mask = plumb::gen::tool_call_mask(tok, vocab, {eos}, spec);
  ToolCallRecognizer shadow(spec);
  const std::string head = kRevOpen + "f\">\n" + kRevP + "city\" string=\"true\">";
  for (char c : head) mask->accept(uint8_t(c)), shadow.feed(uint8_t(c));
  std::vector<uint32_t> bits(plumb::gen::token_bits_words(vocab), 0);
  mask->allowed(bits);
  int wrong = 0;
  for (int32_t id = 0; id < vocab; ++id) {
    ToolCallRecognizer t = shadow;
    const std::string b = tok.is_added(id) ? std::string() : tok.token_bytes(id);
    const bool want = !b.empty() && t.feed(b);
    if (plumb::gen::token_bit(bits, size_t(id)) != want) {
      ++wrong;
      ADD_FAILURE() << "token " << id << " [" << tok.token_bytes(id) << "]: mask " << !want << ", its bytes " << want;
    }
  }
  EXPECT_EQ(wrong, 0);
  // (a sampler that draws a token the bits let through: accept() throws in the middle of the generation)
  for (int32_t i = 0; i < vocab; ++i)
    if (tok.token_bytes(i) == esc_close_more && plumb::gen::token_bit(bits, size_t(i))) {
      EXPECT_NO_THROW(mask->accept(i)) << "the bits let [" << esc_close_more << "] through";
    }
  std::filesystem::remove_all(dir);
}

// FINDING: the added tokens that pass as their text are those found inside tool_call_fixed_texts(ToolCallSpec{}), which
// with no tool leaves out the block's opening (choices(0) comes only with a function's call_opening): a tokenizer that
// holds "<｜DSML｜tool_calls>" as an added token (the tag the model writes first) has it masked out at the block's
// first tag, while "</｜DSML｜tool_calls>" (the last) passes.
TEST(ToolCallReview, AnAddedCallsOpenTagPassesAsText) {
  const auto dir = std::filesystem::temp_directory_path() / ("plumb_tcreview_added_" + std::to_string(::getpid()));
  const plumb::Tokenizer tok = plumb::Tokenizer::load(plumb::testing::write_byte_level_tokenizer(
      dir, {}, false, {"<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>"}));
  const int32_t eos = tok.token_id("<｜end▁of▁sentence｜>"), vocab = tok.vocab_size();
  const int32_t open = tok.token_id("<｜DSML｜tool_calls>"), close = tok.token_id("</｜DSML｜tool_calls>");
  ASSERT_GE(open, 0);
  ASSERT_GE(close, 0);
  ASSERT_TRUE(tok.is_added(open));
  const auto spec = ToolCallSpec::build("[" + rev_tool("f", R"({"type": "object", "properties": {}})") + "]", {}, true);
  auto mask = plumb::gen::tool_call_mask(tok, vocab, {eos}, spec);
  mask->accept('\n');
  mask->accept('\n');
  EXPECT_TRUE(mask->allows(open)) << "the added <｜DSML｜tool_calls> is masked out where the block's tag comes";
  // (the closing tag, for comparison, passes where it comes)
  auto m2 = plumb::gen::tool_call_mask(tok, vocab, {eos}, spec);
  for (char c : kRevOpen + "f\">\n\n</｜DSML｜invoke>\n") m2->accept(uint8_t(c));
  EXPECT_TRUE(m2->allows(close));
  std::filesystem::remove_all(dir);
}

// FINDING: inside a string="false" value, a JSON string's escape may be a lone surrogate ("\ud800": the recognizer's
// grammar allows it, as Python's json does), but parse_calls reads the value with nlohmann::json::accept, which refuses
// a lone surrogate: the whole value then becomes a JSON string. So the mask lets through a block whose call has
// {"tags": "[\"\\ud800\"]"} (a string) where the schema asks for an array of strings.
TEST(ToolCallReview, ALoneSurrogateEscapeReadsBackAsTheSchemaSays) {
  const std::string tools = "[" + rev_tool("f", R"({"type": "object", "properties": {"tags": {"type": "array",
      "items": {"type": "string"}}}, "required": ["tags"], "additionalProperties": false})") + "]";
  const auto r = rev_recognizer(tools);
  for (const char* value : {R"(["\ud800"])", R"(["\udc00x"])", R"(["a\ud83d"])"}) {
    const std::string text = kRevOpen + "f\">\n" + kRevP + "tags\" string=\"false\">" + value + kRevClose + kRevEnd;
    if (!rev_takes(r, text)) continue;  // (refused: fine)
    const auto calls = plumb::dsml::parse_calls(std::string_view(text).substr(2));
    ASSERT_TRUE(calls) << text;
    const rjson args = rjson::parse(calls->at(0).arguments);
    EXPECT_TRUE(args.at("tags").is_array()) << "taken by the mask, read back as " << calls->at(0).arguments;
  }
}

// FINDING: a number past a double's range ("1e400") is JSON the recognizer takes, but nlohmann::json::accept refuses
// it (out_of_range 406), so parse_calls turns the value into a string: {"x": "1e400"} where the schema asks for a
// number (likewise [1e400] for an array of numbers).
TEST(ToolCallReview, ANumberPastADoubleReadsBackAsTheSchemaSays) {
  const std::string tools = "[" + rev_tool("f", R"({"type": "object", "properties": {"x": {"type": "number"},
      "v": {"type": "array", "items": {"type": "number"}}}, "additionalProperties": false})") + "]";
  const auto r = rev_recognizer(tools);
  for (const std::string p : {"x\" string=\"false\">1e400", "v\" string=\"false\">[1, -2E+999]"}) {
    const std::string text = kRevOpen + "f\">\n" + kRevP + p + kRevClose + kRevEnd;
    if (!rev_takes(r, text)) continue;
    const auto calls = plumb::dsml::parse_calls(std::string_view(text).substr(2));
    ASSERT_TRUE(calls) << text;
    const rjson args = rjson::parse(calls->at(0).arguments);
    SchemaRecognizer s(ToolCallSpec::build(tools, {}, true)->tools[0].params);
    EXPECT_TRUE(s.feed(args.dump()) && s.complete()) << "taken by the mask, read back as " << calls->at(0).arguments;
  }
}

// FINDING (mended: names are checked wherever the top-level object may come from; only '"' cannot be written, a
// backslash or control character is written raw and read back by parse_calls as the key it spells):
// params_problem checks the property names DSML cannot write only in the parameters' own "properties"; the
// same object behind a top-level $ref (or anyOf) is compiled as held, not loose: a required property 'a"b' can then
// never be written, and the recognizer dead-ends inside the key (after "a" no byte is taken: '"' ends a key that is no
// property, a backslash is refused). A strict tool with such parameters is accepted instead of refused.
TEST(ToolCallReview, APropertyNameDsmlCannotWriteBehindARefIsLooseNotADeadEnd) {
  for (const char* params :
       {R"({"$ref": "#/$defs/A", "$defs": {"A": {"type": "object", "properties": {"a\"b": {"type": "integer"}},
            "required": ["a\"b"], "additionalProperties": false}}})",
        R"({"anyOf": [{"type": "object", "properties": {"a\\b": {"type": "integer"}}, "required": ["a\\b"],
            "additionalProperties": false}]})"}) {
    SCOPED_TRACE(params);
    const auto spec = ToolCallSpec::build("[" + rev_tool("f", params) + "]", {}, true);
    ToolCallRecognizer r(spec);
    ASSERT_TRUE(r.feed(kRevOpen + "f\">\n"));
    ToolCallRecognizer k = r;
    if (k.feed(kRevP + "a")) {
      EXPECT_TRUE(rev_goes_on(k)) << "dead end after the key's \"a\" (loose: " << spec->loose.size() << ")";
    }
    EXPECT_TRUE(rev_goes_on(r));
    // strict: refused where the name holds a '"' (DSML cannot write it); a backslash is written raw (mended so: keys
    // take any other character, as parse_calls reads them back), so that tool is held, strict or not.
    const std::string strict = R"([{"type": "function", "function": {"name": "f", "strict": true, "parameters": )" +
                               std::string(params) + "}}]";
    if (std::string(params).find("a\\\"b") != std::string::npos) {
      EXPECT_THROW(ToolCallSpec::build(strict, {}, true), plumb::Error);
    } else {
      const auto held = ToolCallSpec::build(strict, {}, true);
      EXPECT_TRUE(held->loose.empty());
      ToolCallRecognizer w(held);
      const std::string text = kRevOpen + "f\">\n" + kRevP + "a\\b\" string=\"false\">7</｜DSML｜parameter>\n"
                               "</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
      EXPECT_TRUE(w.feed(text) && w.complete()) << text;
      const auto calls = plumb::dsml::parse_calls(std::string_view(text).substr(2));
      ASSERT_TRUE(calls);
      EXPECT_EQ(rjson::parse(calls->at(0).arguments), rjson::parse(R"({"a\\b": 7})"));
    }
  }
}

// FINDING: check_output_options refuses a stop string found inside one of tool_call_fixed_texts' pieces, but every
// block also holds text that spans two pieces: each block ends "</｜DSML｜invoke>\n</｜DSML｜tool_calls>" (the pieces
// "\n</｜DSML｜invoke>" and "\n</｜DSML｜tool_calls>"), so a stop "invoke>\n" or ">\n<" ends every reply before its block
// is whole, yet is accepted.
TEST(ToolCallReview, AStopStringThatEveryBlockHoldsIsRefused) {
  const auto dir = std::filesystem::temp_directory_path() / ("plumb_tcreview_stop_" + std::to_string(::getpid()));
  const plumb::Tokenizer tok = plumb::Tokenizer::load(plumb::testing::write_byte_level_tokenizer(dir, {}));
  const int32_t eos = tok.token_id("<｜end▁of▁sentence｜>");
  const std::string tools = "[" + rev_tool("f", R"({"type": "object", "properties": {"a": {"type": "integer"}}})") + "]";
  for (const std::string stop : {"invoke>\n", ">\n<", "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"}) {
    // every block over these tools holds it
    for (const char* args : {"{}", R"({"a": 1})"})
      ASSERT_NE(plumb::dsml::render_calls({{"", "f", args}}, "t").find(stop), std::string::npos);
    plumb::GenerateOptions g;
    g.format = plumb::OutputFormat::ToolCalls;
    g.tool_calls.tools = tools;
    g.stop_strings = {stop};
    EXPECT_THROW(plumb::check_output_options(g, tok, eos), plumb::OptionError) << "stop [" << stop << "] accepted";
  }
  std::filesystem::remove_all(dir);
}

// FINDING (minor): two tools of one name are taken (ToolCallSpec::build does not refuse them) and the recognizer holds
// every call of that name to the first tool's parameters: a call that the second tool's parameters allow is masked out.
TEST(ToolCallReview, TwoToolsOfOneNameAreRefusedOrBothHeld) {
  const std::string tools = "[" +
                            rev_tool("f", R"({"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"],
                                "additionalProperties": false})") + ", " +
                            rev_tool("f", R"({"type": "object", "properties": {"y": {"type": "string"}}, "required": ["y"],
                                "additionalProperties": false})") + "]";
  std::shared_ptr<const ToolCallSpec> spec;
  try {
    spec = ToolCallSpec::build(tools, {}, true);
  } catch (const plumb::Error&) {
    return;  // (refused, naming the duplicate: fine)
  }
  EXPECT_TRUE(rev_takes(ToolCallRecognizer(spec), plumb::dsml::render_calls({{"", "f", R"({"y": "a"})"}}, "t")));
}


// ---------------------------------------------------------------------------------------------------------------
// Coverage (these pass)
// ---------------------------------------------------------------------------------------------------------------

// Small hand-made tools: keys that are prefixes of others, bounds, lengths, enums holding '<' and the close's own
// beginning, nested objects and arrays, anyOf, additionalProperties true / false / a schema, $ref, required keys, a
// function without parameters.
const char* kRevToolsA = R"([
  {"type": "function", "function": {"name": "a", "parameters": {"type": "object", "properties": {
     "s": {"type": "string", "maxLength": 3}, "st": {"type": "integer", "minimum": 0, "maximum": 20},
     "e": {"enum": ["x<", "</｜DSML｜", "y", 1, null]}, "m": {"type": "string", "minLength": 2}},
     "required": ["s"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "ab", "parameters": {"type": "object", "properties": {
     "n": {"type": "object", "properties": {"k": {"type": "integer"}}, "additionalProperties": false},
     "arr": {"type": "array", "items": {"type": "string", "maxLength": 2}, "maxItems": 2},
     "any": {"anyOf": [{"type": "string", "maxLength": 1}, {"type": "integer"}]}},
     "additionalProperties": {"type": "boolean"}}}},
  {"type": "function", "function": {"name": "r", "parameters": {"$ref": "#/$defs/o", "$defs": {
     "o": {"type": "object", "properties": {"r": {"$ref": "#/$defs/r"}, "free": {}}, "required": ["r"]},
     "r": {"type": "string", "enum": ["a", "b<c"]}}}}},
  {"type": "function", "function": {"name": "p"}},
  {"type": "function", "function": {"name": "o", "parameters": {"type": "object"}}}])";

// A random block over kRevToolsA, built part by part, and whether its layout is the documented one (string="false"
// values JSON that is not a string, the empty line of an invoke without parameters); the rest is for the oracle.
struct RevBlock {
  std::string text;
  bool layout_ok = true;
};

RevBlock rev_random_block(std::mt19937& rng, bool parallel) {
  static const std::vector<std::string> names = {"a", "ab", "r", "p", "o", "a", "ab", "r", "abc", "q"};
  static const std::vector<std::string> keys = {"s", "st", "e", "m", "n", "arr", "any", "r", "free", "k", "zz", "x<y",
                                                "s", "st", "e", "r"};
  static const std::vector<std::string> pieces = {"a", "b", "x", "y", "<", "/", "｜", "DSML", "parameter", ">", "\"",
                                                  "\\", "\n", "é", " ", "</｜DSML｜", "</｜DSML｜parameter", "c", "\t"};
  static const std::vector<std::string> raws = {"", "a", "b<c", "x<", "</｜DSML｜", "y", "ab", "abcd", "1", "</"};
  static const std::vector<std::string> jsons = {
      "1", "-3", "15", "21", "0", "1.5", "true", "false", "null", "[]", "[\"a\"]", "[\"abc\"]", "[\"a\", \"b\"]",
      "[\"a\", \"b\", \"c\"]", "{}", "{\"k\": 1}", "{\"k\": \"1\"}", "{\"j\": 1}", " 7 ", "\n1", "\"s\"", "[\"a\",", "x",
      "01", "1e2", "[\"x</｜DSML｜parameter\"]", "[1, 2]", "{\"k\": -1}", "[\"\\u00e9\"]", "[\"\\n\"]", "-0",
      "1.0", "tru", "[\"a\"]]", "}", "{\"k\": 1},", "[\"<\"]", "[\"</｜DSML｜\"]"};
  RevBlock b;
  b.text = "\n\n<｜DSML｜tool_calls>\n";
  const int calls = 1 + int(rng() % (parallel ? 3 : 2));
  for (int c = 0; c < calls; ++c) {
    if (c) b.text += "\n";
    b.text += std::string(plumb::dsml::kInvokeOpen) + names[rng() % names.size()] + "\">\n";
    const int params = int(rng() % 4);
    for (int i = 0; i < params; ++i) {
      if (i) b.text += "\n";
      b.text += kRevP + keys[rng() % keys.size()];
      const bool raw = rng() % 2;
      b.text += raw ? "\" string=\"true\">" : "\" string=\"false\">";
      std::string v;
      if (raw) {
        if (rng() % 2) v = raws[rng() % raws.size()];
        else
          for (int n = int(rng() % 5); n > 0; --n) v += pieces[rng() % pieces.size()];
      } else {
        v = jsons[rng() % jsons.size()];
        const bool is_json = rojson::accept(v);
        if (!is_json || rojson::parse(v).is_string()) b.layout_ok = false;
      }
      b.text += v + kRevClose;
    }
    if (params == 0) {
      if (rng() % 8) b.text += "\n";
      else b.layout_ok = false;  // (parse_calls also reads an invoke without its empty line)
    } else {
      b.text += "\n";
    }
    b.text += "</｜DSML｜invoke>";
  }
  b.text += "\n</｜DSML｜tool_calls>";
  return b;
}

// The recognizer against the oracle (parse_calls, the schema on the arguments read back, the documented layout) on
// random blocks; and on single-byte mutations of them, that a text the recognizer takes is one the oracle takes.
// (Left out of the pool: a nested object with a key twice, which the recognizer refuses as structured output does
// while nlohmann keeps the last; and the two findings above, lone surrogate escapes and numbers past a double.)
TEST(ToolCallReview, RandomBlocksAgreeWithParseCallsAndTheSchema) {
  int compared = 0, valid = 0, mutated = 0, mutated_taken = 0, disagree = 0;
  for (const bool parallel : {true, false}) {
    const auto spec = ToolCallSpec::build(kRevToolsA, {}, parallel);
    ASSERT_TRUE(spec->loose.empty());
    const RevOracle oracle{spec};
    std::mt19937 rng(parallel ? 5 : 6);
    // (60,000 in the review itself; fewer keep CI's ASan build short; a quarter of the blocks under the sanitizers:
    // every path still runs; the Release run takes them all)
    for (int i = 0; i < plumb_test::walks(15000); ++i) {
      const RevBlock b = rev_random_block(rng, parallel);
      std::string why;
      const bool want = oracle(b.text, &why) && b.layout_ok;
      ToolCallRecognizer r(spec);
      const bool got = rev_takes(r, b.text);
      ++compared, valid += want;
      if (got != want && ++disagree <= 20)
        ADD_FAILURE() << "recognizer " << got << ", oracle " << want << " (" << why << ", layout " << b.layout_ok
                      << "):\n" << b.text;
      // a byte changed, dropped or doubled: whatever the recognizer takes must be what the oracle takes
      std::string m = b.text;
      const size_t at = rng() % m.size();
      switch (rng() % 3) {
        case 0: m[at] = "<>/\"\n a1{}[],"[rng() % 13]; break;
        case 1: m.erase(at, 1); break;
        default: m.insert(at, 1, m[at]); break;
      }
      ++mutated;
      ToolCallRecognizer rm(spec);
      if (rev_takes(rm, m)) {
        ++mutated_taken;
        if (!oracle(m, &why) && ++disagree <= 20) ADD_FAILURE() << "a mutation taken: " << why << ":\n" << m;
      }
    }
  }
  std::printf("[ review ] %d random blocks compared (%d valid), %d mutations (%d taken), %d disagreements\n", compared,
              valid, mutated, mutated_taken, disagree);
  EXPECT_EQ(disagree, 0);
  EXPECT_GT(valid, plumb_test::walks(1000));  // (of 30,000 blocks: 7,500 under the sanitizers)
}

// Every raw value (string="true") and every string="false" value of up to 5 symbols over small alphabets that cut across
// the close (its pieces, '<', '/', '>', quotes, brackets), for properties with no bound, maxLength, minLength, an enum
// holding the close's beginning, anyOf, and arrays: the recognizer takes the block exactly when the oracle does
// (but for runs of spaces in JSON, which JSON mode bounds to one: left out).
TEST(ToolCallReview, EveryShortValueAgreesWithTheOracle) {
  const std::string tools = "[" + rev_tool("f", R"({"type": "object", "properties": {
      "free": {"type": "string"}, "max": {"type": "string", "maxLength": 3}, "min": {"type": "string", "minLength": 2},
      "en": {"enum": ["a<", "</｜DSML｜", "<a/", 1]}, "any": {"anyOf": [{"type": "string", "maxLength": 1},
      {"type": "array", "items": {"type": "string"}}]}, "arr": {"type": "array", "items": {"type": "integer"}},
      "obj": {"type": "object", "additionalProperties": {"type": "string"}}}, "additionalProperties": false})") + "]";
  const auto spec = ToolCallSpec::build(tools, {}, true);
  ASSERT_TRUE(spec->loose.empty());
  const RevOracle oracle{spec};
  const std::vector<std::string> raw_alpha = {"<", "/", "a", ">", "｜", "DSML", "parameter", "\"", "</｜DSML｜parameter>"};
  const std::vector<std::string> json_alpha = {"[", "]", "\"", "1", "<", ",", " ", "a", "</｜DSML｜parameter>", "{", ":"};
  long compared = 0, taken = 0, disagree = 0;
  for (const bool raw : {true, false}) {
    const auto& alpha = raw ? raw_alpha : json_alpha;
    const std::vector<std::string> keys = raw ? std::vector<std::string>{"free", "max", "min", "en", "any"}
                                              : std::vector<std::string>{"any", "arr", "obj", "en"};
    std::vector<std::string> values = {""};
    for (size_t i = 0; i < values.size(); ++i)
      if (values[i].size() < 40 && std::count(values[i].begin(), values[i].end(), '\x01') < 4) {
        // (symbols counted by a separator, removed below; up to 4 of them, 5 in the review itself)
        for (const auto& a : alpha)
          if (std::count(values[i].begin(), values[i].end(), '\x01') < 4) values.push_back(values[i] + a + '\x01');
      }
    for (const std::string& key : keys)
      for (std::string v : values) {
        v.erase(std::remove(v.begin(), v.end(), '\x01'), v.end());
        if (!raw && v.find("  ") != std::string::npos) continue;  // (JSON whitespace runs are bounded: one space)
        const std::string text = kRevOpen + "f\">\n" + kRevP + key + (raw ? "\" string=\"true\">" : "\" string=\"false\">") +
                                 v + kRevClose + kRevEnd;
        bool layout = true;
        if (!raw) {
          // (the close inside the value: parse_calls ends the value there; the layout rule is about what it reads)
          const size_t cut = v.find(kRevClose);
          const std::string read = cut == std::string::npos ? v : v.substr(0, cut);
          layout = rojson::accept(read) && !rojson::parse(read).is_string();
        }
        std::string why;
        const bool want = layout && oracle(text, &why);
        const bool got = rev_takes(ToolCallRecognizer(spec), text);
        ++compared, taken += got;
        if (got != want && ++disagree <= 10)
          ADD_FAILURE() << "recognizer " << got << ", oracle " << want << " (" << why << "): [" << key << "] [" << v << "]";
      }
  }
  std::printf("[ review ] %ld short values compared (%ld taken), %ld disagreements\n", compared, taken, disagree);
  EXPECT_EQ(disagree, 0);
}

// Random walks over the bytes each state takes (leaning to '<', the close's bytes and the tags' bytes), on tools whose
// values hold the close's beginning, sit at their length bounds, or whose keys are prefixes of others: no state takes
// no byte, and each completed block is one the oracle takes.
TEST(ToolCallReview, WalksAroundHeldClosesNeverDeadEnd) {
  const std::string extra = R"([
    {"type": "function", "function": {"name": "e", "parameters": {"type": "object", "properties": {
       "v": {"enum": ["</｜DSML｜", "a</｜DSML｜paramete", "</｜DSML｜parameterX", "<", "a<"]},
       "w": {"type": "string", "minLength": 3, "maxLength": 4}, "wx": {"type": "string", "maxLength": 0},
       "c": {"const": "</｜DSML｜parameter"}}, "required": ["v", "w"], "additionalProperties": false}}}])";
  const std::string close = kRevClose;
  int walks = 0, completed = 0, steps_total = 0;
  for (const std::string& tools : {std::string(kRevToolsA), extra}) {
    for (const bool parallel : {true, false}) {
      const auto spec = ToolCallSpec::build(tools, {}, parallel);
      const RevOracle oracle{spec};
      std::mt19937 rng(walks + 11);
      // (150 in the review itself; a quarter of the walks under the sanitizers: every path still runs; the Release
      // run takes them all)
      for (int w = 0; w < plumb_test::walks(40); ++w, ++walks) {
        ToolCallRecognizer r(spec);
        std::string text;
        for (int step = 0; step < 700 && !r.complete(); ++step, ++steps_total) {
          const std::vector<uint8_t> ok = plumb::testing::bytes_taken(r);
          ASSERT_FALSE(ok.empty()) << "dead end after [" << text << "]";
          uint8_t pick = ok[rng() % ok.size()];
          auto lean = [&](uint8_t c) {
            if (std::find(ok.begin(), ok.end(), c) != ok.end()) pick = c;
          };
          // (go on with the close where it began, or with the text of a tag; else now and then begin a close)
          size_t held = 0;
          for (size_t n = std::min(close.size() - 1, text.size()); n > 0; --n)
            if (text.compare(text.size() - n, n, close, 0, n) == 0) {
              held = n;
              break;
            }
          if (held && rng() % 4) lean(uint8_t(close[held]));
          else if (rng() % 5 == 0) lean('<');
          else if (rng() % 3 == 0) for (uint8_t c : {'"', '>', '\n', ']', '}', '0'}) if (rng() % 2) lean(c);
          if (ok.size() <= 2) pick = ok[rng() % ok.size()];
          ASSERT_TRUE(r.feed(pick));
          text += char(pick);
        }
        if (!r.complete()) continue;
        ++completed;
        std::string why;
        EXPECT_TRUE(oracle(text, &why)) << why << ":\n" << text;
      }
    }
  }
  std::printf("[ review ] %d walks, %d steps, %d completed blocks read back valid\n", walks, steps_total, completed);
  EXPECT_GT(completed, walks / 5);
}

// The mask over tokens that cut across the close and the tags, hold escapes, '<' in their middle, JSON punctuation and
// the DSML markers as added tokens: at every step of random generations over kRevToolsA each token's bit is whether
// the recognizer takes its bytes.
TEST(ToolCallReview, MaskBitsEqualAPerTokenFeed) {
  const std::vector<std::string> extra = {
      "</", "</｜DSML｜", "</｜DSML｜param", "parameter>", "eter>", "eter>\n", ">\n<｜DSML｜parameter name=\"", "meter>\nx",
      "\\n", "a\\\"b", "x<", "<x", "a<b", "｜DSML｜parameter>", "\" string=\"", "true\">", "false\">", "[\"", "\"]",
      "\\u00e9", "é", "abc", "ab", "12", "1", "}", "]", " ", "null", "st", "s\"", "\">\n", "\n</｜DSML｜invoke>",
      "\n</｜DSML｜tool_calls>", "</｜DSML｜parameter>\n", "x</｜DSML｜parameter>\n</", "b<c", "b<", "<c", "\\\\", "\\t",
      "DSML｜", "｜", "\xef\xbd", "\x9c", "k\": 1}", ", \"", "r\" string=\"true\">a"};
  for (const int config : {0, 1, 2}) {
    const bool added = config == 1;  // (config 2: a plain token holding a whole close, which turns the shortcut off)
    const auto dir = std::filesystem::temp_directory_path() /
                     ("plumb_tcreview_bits_" + std::to_string(::getpid()) + "_" + std::to_string(config));
    const std::vector<std::string> added_tokens =
        added ? std::vector<std::string>{"<｜DSML｜", "</｜DSML｜", "｜DSML｜"} : std::vector<std::string>{};
    std::vector<std::string> vocab_extra = extra;
    if (config == 2) vocab_extra.push_back("ab</｜DSML｜parameter>");
    const plumb::Tokenizer tok =
        plumb::Tokenizer::load(plumb::testing::write_byte_level_tokenizer(dir, vocab_extra, false, added_tokens));
    const int32_t eos = tok.token_id("<｜end▁of▁sentence｜>"), vocab = tok.vocab_size();
    const auto spec = ToolCallSpec::build(kRevToolsA, {}, true);
    std::mt19937 rng(3 + config);
    int steps = 0, completed = 0;
    // (a quarter of the walks under the sanitizers: every path still runs; the Release run takes them all)
    for (int walk = 0; walk < plumb_test::walks(40); ++walk) {
      auto mask = plumb::gen::tool_call_mask(tok, vocab, {eos}, spec);
      ToolCallRecognizer shadow(spec);
      std::string text;
      for (int step = 0; step < 200; ++step, ++steps) {
        const auto allowed = plumb::testing::mask_step_matches_feed(*mask, shadow, tok, {eos}, added_tokens, text);
        ASSERT_TRUE(allowed && !allowed->empty());
        const std::vector<int32_t>& ok = *allowed;
        int32_t id = ok[rng() % ok.size()];
        for (int32_t prefer : ok)
          if (rng() % 3 == 0 && tok.token_bytes(prefer).size() > tok.token_bytes(id).size()) id = prefer;
        mask->accept(id);
        if (id == eos) break;
        shadow.feed(tok.token_bytes(id));
        text += tok.token_bytes(id);
      }
      completed += shadow.complete();
    }
    std::printf("[ review ] mask bits over %d tokens: %d steps, %d blocks completed (config %d)\n", vocab, steps,
                completed, config);
    EXPECT_GT(completed, 0);
    std::filesystem::remove_all(dir);
  }
}

// The mask at every byte of blocks whose values hold the close's beginning, '<', escapes and added-token text (each
// byte fed as its one-byte token), against a per-token feed: the held-back states, one by one.
TEST(ToolCallReview, MaskBitsAlongBlocksThatHoldCloses) {
  const std::vector<std::string> extra = {"</", "</｜DSML｜", "</｜DSML｜param", "parameter>", "eter>", "eter>\n", "eter>\n<",
                                          ">\n<｜DSML｜parameter name=\"", "meter>\nx", "\\n", "a\\\"b", "x<", "<x", "｜",
                                          "DSML｜", "\xef\xbd", "\x9c", "\\t", "\\\\", "ab", "b<c", "<c", "a</｜DSML｜"};
  const auto dir = std::filesystem::temp_directory_path() / ("plumb_tcreview_along_" + std::to_string(::getpid()));
  const std::vector<std::string> added = {"<｜DSML｜", "｜DSML｜"};
  const plumb::Tokenizer tok = plumb::Tokenizer::load(plumb::testing::write_byte_level_tokenizer(dir, extra, false, added));
  const int32_t eos = tok.token_id("<｜end▁of▁sentence｜>"), vocab = tok.vocab_size();
  const auto spec = ToolCallSpec::build(kRevToolsA, {}, true);
  const std::vector<std::string> blocks = {
      plumb::dsml::render_calls({{"", "a", R"({"s": "</｜", "e": "</｜DSML｜", "m": "a</｜DSML｜parameteX<"})"}}, "t"),
      plumb::dsml::render_calls({{"", "a", R"({"s": "<", "e": "x<", "st": 20})"}, {"", "r", R"({"r": "b<c", "free": "</"})"}}, "t"),
      plumb::dsml::render_calls({{"", "o", R"({"k</｜DSML｜": "v\\n\\\"</｜DSML｜parameter", "k2": ["</｜DSML｜parameter"]})"}}, "t"),
      plumb::dsml::render_calls({{"", "ab", R"({"arr": ["<", "</"], "n": {"k": 1}, "any": 5, "zz": true})"}, {"", "p", "{}"}}, "t")};
  int states = 0;
  for (const std::string& b : blocks) {
    auto mask = plumb::gen::tool_call_mask(tok, vocab, {eos}, spec);
    ToolCallRecognizer shadow(spec);
    ASSERT_TRUE(rev_takes(shadow, b)) << b;
    for (size_t i = 0; i <= b.size(); ++i, ++states) {
      ASSERT_TRUE(plumb::testing::mask_step_matches_feed(*mask, shadow, tok, {eos}, added, b.substr(0, i)));
      if (i == b.size()) break;
      mask->accept(uint8_t(b[i]));
      ASSERT_TRUE(shadow.feed(uint8_t(b[i])));
    }
  }
  std::printf("[ review ] mask bits at %d states along %zu blocks\n", states, blocks.size());
  std::filesystem::remove_all(dir);
}

// Rules of ToolCallSpec::build and check_output_options that hold (names filter, parallel, strict, loose, errors).
TEST(ToolCallReview, SpecAndOptionRules) {
  const auto spec = ToolCallSpec::build(kRevToolsA, {"r", "p"}, false);
  ASSERT_EQ(spec->tools.size(), 2u);
  EXPECT_FALSE(spec->parallel);
  EXPECT_TRUE(rev_takes(ToolCallRecognizer(spec), plumb::dsml::render_calls({{"", "r", R"({"r": "b<c"})"}}, "t")));
  EXPECT_FALSE(rev_takes(ToolCallRecognizer(spec), plumb::dsml::render_calls({{"", "a", R"({"s": "x"})"}}, "t")));
  EXPECT_FALSE(rev_takes(ToolCallRecognizer(spec),
                         plumb::dsml::render_calls({{"", "p", "{}"}, {"", "p", "{}"}}, "t")));
  // a tool that is filtered out may have a name DSML cannot write; one that is named may not
  const std::string bad = R"([{"type": "function", "function": {"name": "x\"y"}}, )" + rev_tool("f", "{}") + "]";
  EXPECT_NO_THROW(ToolCallSpec::build(bad, {"f"}, true));
  EXPECT_THROW(ToolCallSpec::build(bad, {}, true), plumb::Error);
  // no tool at all
  EXPECT_THROW(ToolCallSpec::build("[]", {}, true), plumb::Error);
  // check_output_options: the field named
  const auto dir = std::filesystem::temp_directory_path() / ("plumb_tcreview_opts_" + std::to_string(::getpid()));
  const plumb::Tokenizer tok = plumb::Tokenizer::load(plumb::testing::write_byte_level_tokenizer(dir, {}));
  const int32_t eos = tok.token_id("<｜end▁of▁sentence｜>");
  auto field = [&](const plumb::GenerateOptions& g, int32_t e) -> std::string {
    try {
      plumb::check_output_options(g, tok, e);
    } catch (const plumb::OptionError& x) {
      return x.field;
    }
    return "(accepted)";
  };
  plumb::GenerateOptions g;
  g.format = plumb::OutputFormat::ToolCalls;
  g.tool_calls.tools = kRevToolsA;
  EXPECT_EQ(field(g, eos), "(accepted)");
  EXPECT_EQ(field(g, -1), "format");
  g.tool_calls.names = {"nope"};
  EXPECT_EQ(field(g, eos), "tool_calls");
  g.tool_calls.names = {};
  g.stop_strings = {"parameter"};
  EXPECT_EQ(field(g, eos), "stop_strings");
  g.stop_strings = {};
  g.stop_tokens = {int32_t('\n')};
  EXPECT_EQ(field(g, eos), "stop_tokens");
  g.stop_tokens = {};
  g.tool_calls.tools = R"([{"type": "function", "function": {"name": "f", "strict": true, "parameters": {"type": "object",
      "properties": {"a": {"type": "string", "pattern": "x"}}}}}])";
  EXPECT_EQ(field(g, eos), "tool_calls");
  const plumb::Tokenizer spaced = plumb::Tokenizer::load(plumb::testing::write_byte_level_tokenizer(dir / "s", {}, true));
  g.tool_calls.tools = kRevToolsA;
  try {
    plumb::check_output_options(g, spaced, eos);
    ADD_FAILURE() << "a spaced tokenizer accepted";
  } catch (const plumb::OptionError& x) {
    EXPECT_EQ(x.field, "tool_calls");
  }
  std::filesystem::remove_all(dir);
}

// The synthetic 129K-token tokenizer (json_test_util.h), plain or with "</｜DSML｜parameter>" as an added token (a DSML
// tag, which the tool-call mask lets through as text), built once.
const plumb::Tokenizer& rev_big_tok(bool close_token) {
  static const auto dir = std::filesystem::temp_directory_path() / ("plumb_tcreview_big_" + std::to_string(::getpid()));
  static const std::vector<std::string> words = plumb::testing::synthetic_vocabulary();
  static const plumb::Tokenizer plain = plumb::Tokenizer::load(plumb::testing::write_byte_level_tokenizer(dir, words));
  static const plumb::Tokenizer with_close = [] {
    plumb::Tokenizer t = plumb::Tokenizer::load(
        plumb::testing::write_byte_level_tokenizer(dir / "c", words, false, {"</｜DSML｜parameter>"}));
    std::filesystem::remove_all(dir);  // (both loaded: the files are not needed any more)
    return t;
  }();
  return close_token ? with_close : plain;
}

// The best of 5 allowed() calls after `prefix` (ms), at the big vocabulary.
double rev_step_ms(const plumb::Tokenizer& tok, const std::string& tools, const std::string& prefix) {
  const int32_t vocab = tok.vocab_size(), eos = tok.token_id("<｜end▁of▁sentence｜>");
  auto mask = plumb::gen::tool_call_mask(tok, vocab, {eos}, ToolCallSpec::build(tools, {}, true));
  for (char ch : prefix) mask->accept(uint8_t(ch));
  std::vector<uint32_t> bits(plumb::gen::token_bits_words(vocab));
  double best = 1e9;
  for (int i = 0; i < 5; ++i) {
    std::fill(bits.begin(), bits.end(), 0u);
    const auto t0 = std::chrono::steady_clock::now();
    mask->allowed(bits);
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

const std::string kRevCostTools = R"([{"type": "function", "function": {"name": "t", "parameters": {"type": "object",
    "properties": {"free": {"type": "string"}, "short": {"type": "string", "maxLength": 200}},
    "additionalProperties": false}}}])";

// FINDING (cost): one plain-text token that holds a whole "</｜DSML｜parameter>" (here a tokenizer that holds the tag as
// an added token: the mask makes it text, and plain) turns the in-string shortcut off for the whole generation
// (plain_ok false): every step inside a raw string then tries every token, ~23 ms per step at 129K tokens on the
// review machine against ~1.6 ms with the shortcut (14x), for the sake of a handful of tokens.
TEST(ToolCallReview, DISABLED_ACloseTokenDoesNotTurnTheShortcutOff) {  // (timed: run by hand)
  const std::string prefix = kRevOpen + "t\">\n" + kRevP + "free\" string=\"true\">Some text about Paris";
  const double on = rev_step_ms(rev_big_tok(false), kRevCostTools, prefix);
  const double off = rev_step_ms(rev_big_tok(true), kRevCostTools, prefix);
  std::printf("[ review ] raw free string at 129K tokens: %.2f ms per step, %.2f ms with a close token\n", on, off);
  EXPECT_LT(off, 3 * on + 1.0) << "with the shortcut " << on << " ms, with a close token in the vocabulary " << off << " ms";
}

// FINDING (cost, inherited from structured output): a string parameter with maxLength (common in tool schemas) is not
// "free" (SchemaRecognizer::between_string_chars: max_length < 0 only), so every step inside it tries every token
// whose first two bytes pass (all of them): ~21 ms per step at 129K tokens, ~13x a free string's (structured output's
// own mask: ~18 ms in the same state).
TEST(ToolCallReview, DISABLED_ARawStringWithMaxLengthCostsAboutAFreeOne) {  // (timed: run by hand)
  const std::string head = kRevOpen + "t\">\n" + kRevP;
  const double free_ms = rev_step_ms(rev_big_tok(false), kRevCostTools, head + "free\" string=\"true\">Some text");
  const double bounded = rev_step_ms(rev_big_tok(false), kRevCostTools, head + "short\" string=\"true\">Some text");
  std::printf("[ review ] raw string at 129K tokens: %.2f ms per step, %.2f ms with maxLength 200\n", free_ms, bounded);
  EXPECT_LT(bounded, 3 * free_ms + 1.0) << "free " << free_ms << " ms, with maxLength " << bounded << " ms";
}

// The two cost findings above, as what gives the speed rather than a timing (which has no place in a unit test): the
// in-string shortcut holds in a raw string whatever plain tokens hold a close (those are tried, recheck_ids), and in a
// string with maxLength while the longest plain token fits what is left.
TEST(ToolCallReview, TheShortcutHoldsWithCloseTokensAndInBoundedStrings) {
  const auto spec = ToolCallSpec::build(kRevCostTools, {}, true);
  const std::string head = kRevOpen + "t\">\n" + kRevP;
  ToolCallRecognizer free_string(spec, {7, 9});  // (two ids standing for plain tokens that hold a close)
  ASSERT_TRUE(free_string.feed(head + "free\" string=\"true\">Some text"));
  EXPECT_TRUE(free_string.between_string_chars(16));
  EXPECT_EQ(free_string.recheck_ids(), (std::vector<int32_t>{7, 9}));
  ToolCallRecognizer bounded(spec);
  ASSERT_TRUE(bounded.feed(head + "short\" string=\"true\">Some text"));  // (maxLength 200: 191 left)
  EXPECT_TRUE(bounded.between_string_chars(16));
  EXPECT_TRUE(bounded.between_string_chars(191));
  EXPECT_FALSE(bounded.between_string_chars(192));
}

// The cost of one step's mask at the synthetic 129K vocabulary in states the existing cost test does not reach (run by
// hand: --gtest_also_run_disabled_tests --gtest_filter='*ReviewStepCost*').
TEST(ToolCallReview, DISABLED_ReviewStepCost) {
  const auto dir = std::filesystem::temp_directory_path() / ("plumb_tcreview_cost_" + std::to_string(::getpid()));
  auto vocab_words = plumb::testing::synthetic_vocabulary();
  const plumb::Tokenizer tok = plumb::Tokenizer::load(plumb::testing::write_byte_level_tokenizer(dir, vocab_words));
  const plumb::Tokenizer tok_close = plumb::Tokenizer::load(
      plumb::testing::write_byte_level_tokenizer(dir / "c", vocab_words, false, {"</｜DSML｜parameter>"}));
  const std::string tools = R"([{"type": "function", "function": {"name": "t", "parameters": {"type": "object",
      "properties": {"free": {"type": "string"}, "short": {"type": "string", "maxLength": 200},
      "long_name_of_a_parameter": {"type": "string"}, "n": {"type": "integer", "minimum": 0, "maximum": 1000000},
      "x": {"type": "number"}, "tags": {"type": "array", "items": {"type": "string"}},
      "obj": {"type": "object", "properties": {"q": {"type": "string"}, "r": {"type": "integer"}}},
      "kind": {"enum": ["alpha", "beta", "gamma", "delta"]}}, "additionalProperties": false}}},
    {"type": "function", "function": {"name": "u", "parameters": {"type": "object"}}}])";
  const auto spec = ToolCallSpec::build(tools, {}, true);
  struct Case {
    const char* what;
    std::string prefix;
    bool close_token = false;
  };
  const std::string head = kRevOpen + "t\">\n" + kRevP;
  const std::vector<Case> cases = {
      {"raw free string", head + "free\" string=\"true\">Some text about Paris"},
      {"raw free string, close held (</｜DSML｜)", head + "free\" string=\"true\">abc</｜DSML｜"},
      {"raw string with maxLength 200", head + "short\" string=\"true\">Some text"},
      {"raw string, enum", head + "kind\" string=\"true\">"},
      {"key (declared properties)", head + "lo"},
      {"key (free: additionalProperties true)", kRevOpen + "u\">\n" + kRevP + "some_k"},
      {"string=\"false\": integer", head + "n\" string=\"false\">12"},
      {"string=\"false\": number", head + "x\" string=\"false\">-1.5"},
      {"string=\"false\": in an array's string", head + "tags\" string=\"false\">[\"news\", \"ma"},
      {"string=\"false\": after an array's item", head + "tags\" string=\"false\">[\"news\""},
      {"string=\"false\": in an object's string", head + "obj\" string=\"false\">{\"q\": \"hello"},
      {"string=\"false\": a free object's key", kRevOpen + "u\">\n" + kRevP + "k\" string=\"false\">{\"ab"},
      {"kind point", head + "free\""},
      {"after a parameter", head + "free\" string=\"true\">x</｜DSML｜parameter>"},
      {"raw free string, a plain token holds the close (shortcut off)", head + "free\" string=\"true\">Some text", true},
      {"raw free string, close held, shortcut off", head + "free\" string=\"true\">abc</｜DSML｜", true},
  };
  for (const Case& c : cases) {
    const plumb::Tokenizer& t = c.close_token ? tok_close : tok;
    const int32_t vocab = t.vocab_size(), eos = t.token_id("<｜end▁of▁sentence｜>");
    auto mask = plumb::gen::tool_call_mask(t, vocab, {eos}, spec);
    for (char ch : c.prefix) mask->accept(uint8_t(ch));
    std::vector<uint32_t> bits(plumb::gen::token_bits_words(vocab));
    double best = 1e9, total = 0;
    const int reps = 5;
    size_t allowed = 0;
    for (int i = 0; i < reps; ++i) {
      std::fill(bits.begin(), bits.end(), 0u);
      const auto t0 = std::chrono::steady_clock::now();
      mask->allowed(bits);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      best = std::min(best, ms), total += ms;
    }
    for (uint32_t w : bits) allowed += size_t(__builtin_popcount(w));
    std::printf("[ review ] %-62s best %7.2f ms, mean %7.2f ms per allowed() (%zu tokens pass)\n", c.what, best,
                total / reps, allowed);
  }
  // (for comparison: structured output's mask, JSON mode's recognizer of the same schema, in a string with maxLength)
  {
    const int32_t vocab = tok.vocab_size(), eos = tok.token_id("<｜end▁of▁sentence｜>");
    plumb::gen::SchemaMask mask(tok, vocab, {eos}, SchemaRecognizer(spec->tools[0].params));
    for (char ch : std::string("{\"short\": \"Some text")) mask.accept(uint8_t(ch));
    std::vector<uint32_t> bits(plumb::gen::token_bits_words(vocab));
    double best = 1e9;
    for (int i = 0; i < 5; ++i) {
      std::fill(bits.begin(), bits.end(), 0u);
      const auto t0 = std::chrono::steady_clock::now();
      mask.allowed(bits);
      best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::printf("[ review ] %-62s best %7.2f ms per allowed()\n", "(structured output, string with maxLength 200)", best);
  }
  std::filesystem::remove_all(dir);
}

// FINDING (minor): the mask lets the DSML tags a tokenizer holds as (special) added tokens pass as their text, but
// generate() decodes with GenerateOptions::skip_special, which drops special tokens from the text: with skip_special
// (a library caller's option; plumb serve turns it off with tools) and OutputFormat::ToolCalls, a model that writes the
// tags as those tokens gives a reply whose block has lost its tags, which parse_reply cannot read. check_output_options
// takes the combination.
TEST(ToolCallReview, SkipSpecialDoesNotLoseTheTagsTheMaskLetThrough) {
  const auto dir = std::filesystem::temp_directory_path() / ("plumb_tcreview_skip_" + std::to_string(::getpid()));
  const plumb::Tokenizer tok = plumb::Tokenizer::load(plumb::testing::write_byte_level_tokenizer(
      dir, {}, false, {"<｜DSML｜", "</｜DSML｜"}));
  plumb::ModelInfo info;
  info.vocab_size = tok.vocab_size(), info.bos_token = 0, info.eos_token = tok.token_id("<｜end▁of▁sentence｜>");
  info.max_positions = 4096;
  plumb::GenerateOptions g;
  g.sampling.temperature = 0, g.max_tokens = 400;
  g.format = plumb::OutputFormat::ToolCalls;
  g.tool_calls.tools = "[" + rev_tool("f", R"({"type": "object", "properties": {"city": {"type": "string"}},
      "required": ["city"]})") + "]";
  const std::string target = plumb::dsml::render_calls({{"", "f", R"({"city": "Paris"})"}}, "t");
  const std::vector<int32_t> prompt = {0};
  {
    plumb::testing::PreferringSession s(tok, target, info, true);
    const auto r = plumb::generate(s, tok, prompt, g);
    ASSERT_EQ(r.text, target);  // (the tags written as the added tokens)
    ASSERT_EQ(plumb::parse_reply(r.text, false).tool_calls.size(), 1u);
  }
  g.skip_special = true;
  plumb::testing::PreferringSession s(tok, target, info, true);
  try {
    const auto r = plumb::generate(s, tok, prompt, g);
    EXPECT_EQ(plumb::parse_reply(r.text, false).tool_calls.size(), 1u) << "the reply's text: [" << r.text << "]";
  } catch (const plumb::OptionError&) {
    // (refused up front: fine)
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
