// A review of structured outputs' string lengths (minLength / maxLength in code points) and integer bounds (minimum /
// maximum / exclusive forms): the recognizer against texts labelled by Python's jsonschema (Draft 2020-12;
// tests/data/json_schema/bounds_review.json: random string / integer / anyOf schemas, strings spelled with escapes,
// escaped surrogate pairs, lone surrogates and raw UTF-8, integers around and past the bounds, "-0"), random walks
// that must never reach a dead end, the mask's plain-text shortcut, and what the review found.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "generate/json_schema.h"
#include "json_test_util.h"
#include "plumb/text.h"

namespace {

using plumb::gen::JsonSchema;
using plumb::gen::SchemaRecognizer;
using json = nlohmann::json;

json bounds_review_data() {
  std::ifstream in(PLUMB_TEST_DATA "/json_schema/bounds_review.json");
  return json::parse(in);
}

bool bounds_review_is_space(int b) { return b == ' ' || b == '\t' || b == '\n' || b == '\r'; }

// Whether `r` can still be completed within `depth` bytes of a small alphabet (closing bytes first; a depth-first
// search with a budget of states).
bool bounds_review_completes(const SchemaRecognizer& r, int depth, int& budget) {
  if (r.complete()) return true;
  if (depth == 0 || --budget < 0) return false;
  static const std::string alphabet = "\"}]0:,1-9vwa[{nul";
  for (char c : alphabet) {
    SchemaRecognizer t = r;
    if (t.feed(uint8_t(c)) && bounds_review_completes(t, depth - 1, budget)) return true;
  }
  return false;
}

// Whether the prefix, if the recognizer takes all of it, can still be completed.
bool bounds_review_prefix_ok(const std::string& schema, const std::string& prefix) {
  SchemaRecognizer r(JsonSchema::compile(schema));
  if (!r.feed(prefix)) return true;  // (refused: no dead end there)
  int budget = 200000;
  return bounds_review_completes(r, 90, budget);
}

// The schemas are kept as text (bounds past 64 bits stay exact); every one compiles; each text is taken whole exactly
// when jsonschema says it is valid.
TEST(SchemaBoundsReview, AgreesWithJsonschema) {
  const json data = bounds_review_data();
  std::vector<std::shared_ptr<const JsonSchema>> schemas;
  for (const auto& s : data["schemas"]) {
    ASSERT_NO_THROW(schemas.push_back(JsonSchema::compile(s.get<std::string>()))) << s.get<std::string>();
  }
  int valid = 0, invalid = 0;
  for (const auto& c : data["cases"]) {
    const size_t k = c[0].get<size_t>();
    const std::string text = c[1];
    const bool want = c[2].get<bool>();
    SchemaRecognizer r(schemas.at(k));
    EXPECT_EQ(r.feed(text) && r.complete(), want) << text << "\nunder " << data["schemas"][k].get<std::string>();
    (want ? valid : invalid)++;
  }
  EXPECT_GT(valid, 1500);
  EXPECT_GT(invalid, 1500);
}

// Random walks over the bytes each state takes (leaning to escapes, surrogates' hex digits, '-' and digits, and to
// closing): some byte other than whitespace is always taken before the value is complete, and wherever the mask's
// plain-text shortcut holds (between_string_chars), plain text, whole escapes and surrogate halves included, passes.
TEST(SchemaBoundsReview, WalksNeverDeadEndAndTheShortcutHolds) {
  const json data = bounds_review_data();
  std::vector<std::string> schemas;
  for (const auto& s : data["schemas"]) schemas.push_back(s.get<std::string>());
  // (anyOf branches with and without maxLength, and tight or far integer bounds)
  for (const char* s : {
           R"({"type":"object","properties":{"s":{"anyOf":[{"type":"string","minLength":3},{"type":"string","maxLength":1}]}}})",
           R"({"type":"object","properties":{"s":{"type":"string","minLength":2}},"required":["s"]})",
           R"({"type":"object","properties":{"s":{"type":"array","items":{"type":"string","maxLength":2}}}})",
           R"({"type":"object","properties":{"n":{"type":"array","items":{"type":"integer","minimum":-9223372036854775808,"maximum":-9000000000000000000}}}})",
           R"({"type":"object","properties":{"n":{"type":"integer","minimum":18446744073709551000,"maximum":18446744073709551615}}})",
           R"({"type":"object","properties":{"n":{"anyOf":[{"type":"integer","maximum":-3},{"type":"integer","minimum":3}]}}})",
           R"({"type":"object","properties":{"n":{"type":"integer","exclusiveMinimum":-0.5,"exclusiveMaximum":0.5}}})"})
    schemas.push_back(s);
  const std::vector<std::string> plain = {"a", "\xc3\xa9", "\xf0\x9f\x98\x80", "\\n", "\\\"", "\\u00e9", "\\ud83d", "\\ude00",
                                          "\\uD83D\\uDE00", "ab cd"};
  const std::string lean = "\"}],-0123456789\\uUdD8cCeE0";
  std::mt19937 rng(2024);
  int completed = 0, walks = 0, shortcut_states = 0;
  for (const std::string& schema : schemas) {
    const auto compiled = JsonSchema::compile(schema);
    for (int w = 0; w < 4; ++w, ++walks) {
      SchemaRecognizer r(compiled);
      std::string text;
      for (int step = 0; step < 300 && !r.complete(); ++step) {
        std::vector<uint8_t> ok;
        for (int b = 0; b < 256; ++b) {
          SchemaRecognizer t = r;
          if (!bounds_review_is_space(b) && t.feed(uint8_t(b))) ok.push_back(uint8_t(b));
        }
        ASSERT_FALSE(ok.empty()) << "dead end after '" << text << "' under " << schema;
        if (r.between_string_chars()) {
          ++shortcut_states;
          for (const std::string& p : plain) {
            SchemaRecognizer t = r;
            EXPECT_TRUE(t.feed(p)) << "plain text '" << p << "' refused after '" << text << "' under " << schema
                                   << ", where between_string_chars() lets it pass unfed";
          }
        }
        uint8_t pick = ok[rng() % ok.size()];
        if (rng() % 3 != 0) {  // (a leaning byte, where one is taken)
          std::vector<uint8_t> leaning;
          for (uint8_t b : ok)
            if (lean.find(char(b)) != std::string::npos) leaning.push_back(b);
          if (!leaning.empty()) pick = leaning[rng() % leaning.size()];
        }
        r.feed(pick);
        text += char(pick);
      }
      completed += r.complete();
    }
  }
  EXPECT_GT(completed, walks / 3);
  EXPECT_GT(shortcut_states, 50);
}

// Found by the review: integer bounds that no integer of at most 64 bytes (JsonRecognizer::kMaxNumber) meets compile,
// and the recognizer then reaches a dead end: maximum -1e64 takes `{"n":-` and then no digit (number_may_go_on
// answers "-" with lo <= 0 alone, not whether a negative of at most 63 digits is <= hi); minimum 1e64 takes `{"n":`
// and then no value at all (the node counts as having an instance: `sat`). Either the schema is refused, or every
// prefix the recognizer takes can be completed.
TEST(SchemaBoundsReview, UnreachableIntegerBoundsLeaveNoDeadEnd) {
  for (const char* n : {R"({"type":"integer","maximum":-1e64})", R"({"type":"integer","maximum":-1e63})",
                        R"({"type":"integer","exclusiveMaximum":-1e70})", R"({"type":"integer","minimum":1e64})",
                        R"({"type":"integer","minimum":1e300})", R"({"type":["integer","string"],"maximum":-1e64})"}) {
    const std::string schema = std::string(R"({"type":"object","properties":{"n":)") + n + "}}";
    SCOPED_TRACE(schema);
    try {
      JsonSchema::compile(schema);
    } catch (const plumb::Error&) {
      continue;  // (refused: fine)
    }
    for (const char* prefix : {"{\"n\":", "{\"n\":-"})
      EXPECT_TRUE(bounds_review_prefix_ok(schema, prefix)) << "dead end after " << prefix;
  }
}

// Found by the review: a bound written as an integer literal past 64 bits (below -2^63 or above 2^64 - 1) is read by
// nlohmann as a double, so plumb's bound is not the schema's (Python's jsonschema reads the literal exactly):
// minimum -9223372036854775809 refuses -9223372036854775809; maximum -9223372036854775809 takes -9223372036854775808.
// Either the schema is refused (as an enum's integer past 2^53 as a double is), or the bound is exact.
TEST(SchemaBoundsReview, IntegerLiteralBoundsPast64BitsAreExact) {
  struct Case {
    const char* bounds;
    const char* text;
    bool valid;  // (jsonschema's answer)
  };
  for (const Case& c : std::vector<Case>{
           {R"("minimum":-9223372036854775809)", "-9223372036854775809", true},
           {R"("maximum":-9223372036854775809)", "-9223372036854775808", false},
           {R"("minimum":100000000000000000000001)", "100000000000000000000002", true},
           {R"("minimum":18446744073709551617,"maximum":18446744073709551617)", "18446744073709551616", false},
           {R"("minimum":18446744073709551617,"maximum":18446744073709551617)", "18446744073709551617", true}}) {
    const std::string schema = std::string(R"({"type":"object","properties":{"n":{"type":"integer",)") + c.bounds + "}}}";
    SCOPED_TRACE(schema);
    std::shared_ptr<const JsonSchema> s;
    try {
      s = JsonSchema::compile(schema);
    } catch (const plumb::Error&) {
      continue;  // (refused: fine)
    }
    SchemaRecognizer r(s);
    EXPECT_EQ(r.feed(std::string("{\"n\":") + c.text + "}") && r.complete(), c.valid) << c.text;
  }
}

// (Not from these changes, the same mechanism as above: an optional property whose schema has no finite instance is
// still taken as a key, and then no value can begin.) Either refused, or no dead end after the key.
TEST(SchemaBoundsReview, OptionalPropertyWithoutAnInstanceIsNoDeadEnd) {
  const std::string schema = R"({"type":"object","properties":{"a":{"$ref":"#/$defs/X"}},
    "$defs":{"X":{"type":"object","required":["b"],"properties":{"b":{"$ref":"#/$defs/X"}}}}})";
  try {
    JsonSchema::compile(schema);
  } catch (const plumb::Error&) {
    return;
  }
  EXPECT_TRUE(bounds_review_prefix_ok(schema, "{\"a\":"));
}

// check_output_options (public): each rule's OptionError names its field and flag, as plumb serve maps them; the valid
// options pass, a JSON format on a spaced tokenizer included.
TEST(OutputOptionsReview, EachRuleNamesItsField) {
  const plumb::Tokenizer tok = plumb::Tokenizer::load(PLUMB_TEST_DATA "/../../models/tiny");
  const auto dir = std::filesystem::temp_directory_path() / ("plumb_output_review_" + std::to_string(::getpid()));
  const plumb::Tokenizer spaced = plumb::Tokenizer::load(plumb::testing::write_byte_level_tokenizer(dir, {}, true));
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(spaced.spaced_tokens());
  const int32_t eos = 1, newline = tok.encode("\n").at(0);
  auto field_of = [&](const plumb::GenerateOptions& g, const plumb::Tokenizer& t, int32_t e) -> std::string {
    try {
      plumb::check_output_options(g, t, e);
      return "";
    } catch (const plumb::OptionError& x) {
      return x.field + " " + x.flag;
    }
  };
  plumb::GenerateOptions json_mode;
  json_mode.format = plumb::OutputFormat::JsonObject;
  EXPECT_EQ(field_of(json_mode, tok, eos), "");
  EXPECT_EQ(field_of(json_mode, spaced, eos), "");
  EXPECT_EQ(field_of(json_mode, tok, -1), "format --json");
  json_mode.stop_tokens = {newline};
  EXPECT_EQ(field_of(json_mode, tok, -1), "");
  plumb::GenerateOptions schema;
  schema.format = plumb::OutputFormat::JsonSchema;
  EXPECT_EQ(field_of(schema, tok, eos), "json_schema --json-schema");  // (empty)
  schema.json_schema = R"({"type":"object","properties":{"n":{"type":"integer","minimum":2,"maximum":1}}})";
  EXPECT_EQ(field_of(schema, tok, eos), "json_schema --json-schema");
  schema.json_schema = R"({"type":"object","properties":{"n":{"type":"integer","minimum":1},"s":{"maxLength":3}}})";
  EXPECT_EQ(field_of(schema, tok, eos), "");
  EXPECT_EQ(field_of(schema, spaced, eos), "json_schema --json-schema");
  schema.stop_at_eos = false;
  EXPECT_EQ(field_of(schema, tok, eos), "format --json-schema");
  plumb::GenerateOptions calls;
  calls.format = plumb::OutputFormat::ToolCalls;
  calls.tool_calls.tools = R"([{"type": "function", "function": {"name": "f"}}])";
  EXPECT_EQ(field_of(calls, tok, eos), "");  // (EOS is an added token: no text inside the block)
  EXPECT_EQ(field_of(calls, spaced, eos), "tool_calls tool_choice");
  calls.tool_calls.names = {"g"};
  EXPECT_EQ(field_of(calls, tok, eos), "tool_calls tool_choice");
  calls.tool_calls.names.clear();
  calls.stop_tokens = {newline};
  EXPECT_EQ(field_of(calls, tok, eos), "stop_tokens --stop-token");
  calls.stop_at_eos = false;
  EXPECT_EQ(field_of(calls, tok, newline), "stop_tokens --stop-token");
  calls.stop_tokens.clear();
  EXPECT_EQ(field_of(calls, tok, newline), "format tool_choice");  // (EOS that does not stop: nothing ends the block)
  calls.stop_at_eos = true;
  calls.stop_strings = {"b\nc"};
  EXPECT_EQ(field_of(calls, tok, eos), "");
  calls.stop_strings = {"invoke"};
  EXPECT_EQ(field_of(calls, tok, eos), "stop_strings --stop");
}

}  // namespace
