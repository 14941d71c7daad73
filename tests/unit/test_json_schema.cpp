// Structured outputs (OutputFormat::JsonSchema): the schema compiler's refusals; the recognizer against cases labelled
// by Python's jsonschema (tests/data/json_schema/cases.json, tools/json_schema/make_cases.py): every valid text taken
// whole, no invalid one; hand-written schemas of the shapes pydantic writes; the mask's shortcuts against the direct
// check; generate() on a session that prefers a given text.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "generate/json_schema.h"
#include "json_test_util.h"
#include "plumb/engine.h"
#include "plumb/text.h"

namespace {

using plumb::gen::JsonSchema;
using plumb::gen::SchemaRecognizer;
using json = nlohmann::json;
using plumb::testing::PreferringSession;
using plumb::testing::write_byte_level_tokenizer;

SchemaRecognizer recognizer(const json& schema) { return SchemaRecognizer(JsonSchema::compile(schema.dump())); }

// Whether the recognizer takes the whole text as a complete instance.
bool takes(const json& schema, std::string_view text) {
  SchemaRecognizer r = recognizer(schema);
  return r.feed(text) && r.complete();
}

TEST(JsonSchemaCompile, RefusesWhatItWouldNotHoldTheOutputTo) {
  const auto refused = [](const json& schema, const std::string& part) {
    try {
      JsonSchema::compile(schema.dump());
      ADD_FAILURE() << schema.dump() << " accepted";
    } catch (const plumb::Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  refused({{"type", "object"}, {"properties", {{"a", {{"type", "string"}, {"pattern", "^a"}}}}}},
          "keyword \"pattern\" at #/properties/a is not supported");
  refused({{"type", "object"}, {"properties", {{"a", {{"type", "string"}, {"minLength", 3}, {"maxLength", 2}}}}}},
          "maxLength below minLength");
  refused({{"type", "object"}, {"properties", {{"a", {{"enum", {"ab", "abc"}}, {"maxLength", 1}}}}}},
          "no value of the enum at #/properties/a has a type (and a length)");
  refused({{"type", "object"}, {"properties", {{"n", {{"type", "number"}, {"minimum", 0}}}}}}, "supported on integers only");
  refused({{"type", "object"}, {"properties", {{"n", {{"type", "integer"}, {"minimum", 0.2}, {"exclusiveMaximum", 1}}}}}},
          "no integer lies within the bounds at #/properties/n (1 to 0)");
  refused({{"type", "object"}, {"properties", {{"n", {{"type", "integer"}, {"multipleOf", 2}}}}}}, "\"multipleOf\"");
  refused({{"type", "array"}}, "the root must allow an object");
  refused({{"type", "object"}, {"required", {"a"}}}, "names \"a\", which properties does not define");
  refused({{"type", "object"}, {"properties", {{"a", {{"$ref", "#/$defs/Missing"}}}}}}, "names no schema");
  refused({{"type", "object"}, {"properties", {{"a", {{"$ref", "other.json#/x"}}}}}}, "only \"#\"");
  refused({{"type", "object"}, {"properties", {{"a", {{"enum", {json::array({1})}}}}}}}, "only strings, numbers");
  refused({{"type", "object"}, {"properties", {{"a", {{"type", "list"}}}}}}, "not a JSON Schema type");
  refused({{"type", "object"}, {"properties", {{"a", {{"type", "array"}, {"items", json::array({{{"type", "string"}}})}}}}}},
          "tuples");
  refused({{"type", "object"}, {"properties", {{"a", false}}}}, "allows no value");
  refused({{"type", "object"}, {"properties", {{"a", {{"anyOf", {{{"type", "string"}}}}, {"type", "string"}}}}}},
          "beside other constraints");
  refused({{"type", "object"}, {"properties", {{"a", {{"type", "array"}, {"minItems", 3}, {"maxItems", 2}}}}}},
          "maxItems below minItems");
  // From a helper's review: a nested $id (it changes what "#" means), an enum integer a double cannot hold, a cycle of
  // $ref / anyOf that reads no byte, a root object with no finite instance, a oneOf whose branches overlap.
  refused({{"type", "object"}, {"properties", {{"a", {{"$id", "urn:x"}, {"type", "object"}}}}}}, "$id at #/properties/a");
  refused(json::parse(R"({"type": "object", "properties": {"a": {"enum": [18446744073709551617]}}})"), "beyond 2^53");
  refused(json::parse(R"({"anyOf": [{"$ref": "#"}, {"type": "object"}]})"), "a cycle of $ref and anyOf");
  refused(json::parse(R"({"type": "object", "properties": {"k": {"$ref": "#"}}, "required": ["k"]})"),
          "the root must allow an object with a finite instance");
  refused(json::parse(R"({"type": "object", "properties": {"a": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}})"),
          "branches 0 and 1 that a value could match both of");
  refused(json::parse(R"({"type": "object", "properties": {"a": {"oneOf": [{"type": "object"}, {"type": "object"}]}}})"),
          "branches 0 and 1");
  refused(json::parse(R"({"type": "object", "properties": {"a": {"oneOf": [{"enum": [1]}, {"enum": [1.0]}]}}})"),
          "branches 0 and 1");  // (1 and 1.0 are one number)
  refused({{"type", "object"}, {"properties", {{"a", {{"anyOf", json::array({1, 2, 3, 4, 5, 6, 7, 8, 9})}}}}}}, "9 branches");
  // Keywords outside the known ones are annotations (pydantic's example, OpenAPI's x-...).
  EXPECT_NO_THROW(JsonSchema::compile(R"({"type": "object", "example": {"a": 1}, "x-order": 3})"));
  try {
    JsonSchema::compile("{\"type\": ");
    ADD_FAILURE() << "accepted";
  } catch (const plumb::Error& e) {
    EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos) << e.what();
  }
}

// Every case of the data file: a text jsonschema calls valid is taken whole (and each prefix of it along the way); one
// it calls invalid never is.
TEST(JsonSchemaRecognizer, AgreesWithJsonschemaOnItsCases) {
  std::ifstream in(PLUMB_TEST_DATA "/json_schema/cases.json");
  ASSERT_TRUE(in.good());
  const json data = json::parse(in);
  std::vector<std::shared_ptr<const JsonSchema>> schemas;
  for (const auto& s : data["schemas"]) schemas.push_back(JsonSchema::compile(s.dump()));
  int valid = 0, invalid = 0;
  for (const auto& c : data["cases"]) {
    const std::string text = c["text"];
    SchemaRecognizer r(schemas.at(c["schema"].get<size_t>()));
    const bool whole = r.feed(text) && r.complete();
    EXPECT_EQ(whole, c["valid"].get<bool>()) << "schema " << c["schema"] << ": " << text << "\n"
                                             << data["schemas"][c["schema"].get<size_t>()].dump();
    (c["valid"].get<bool>() ? valid : invalid)++;
  }
  EXPECT_GT(valid, 500);
  EXPECT_GT(invalid, 400);
}

// No dead end: random walks over the bytes each state lets through, on the data file's schemas, never reach a state
// that takes no byte before the value is complete (walks lean to closing containers and ending values, so that many
// complete).
TEST(JsonSchemaRecognizer, RandomWalksNeverDeadEnd) {
  std::ifstream in(PLUMB_TEST_DATA "/json_schema/cases.json");
  const json data = json::parse(in);
  std::mt19937 rng(9);
  int completed = 0, walks = 0;
  for (size_t k = 0; k < data["schemas"].size(); k += 2) {
    const auto schema = JsonSchema::compile(data["schemas"][k].dump());
    for (int w = 0; w < 3; ++w, ++walks) {
      SchemaRecognizer r(schema);
      std::string text;
      for (int step = 0; step < 400 && !r.complete(); ++step) {
        std::vector<uint8_t> ok;
        for (int b = 0; b < 256; ++b) {
          SchemaRecognizer t = r;
          if (t.feed(uint8_t(b))) ok.push_back(uint8_t(b));
        }
        ASSERT_FALSE(ok.empty()) << "dead end after '" << text << "' under " << data["schemas"][k].dump();
        uint8_t pick = ok[rng() % ok.size()];
        for (uint8_t lean : {uint8_t('}'), uint8_t(']'), uint8_t('"'), uint8_t(','), uint8_t('0')})
          if (rng() % 3 == 0 && std::find(ok.begin(), ok.end(), lean) != ok.end()) pick = lean;
        r.feed(pick);
        text += char(pick);
      }
      completed += r.complete();
    }
  }
  EXPECT_GT(completed, walks / 4);
}

// The shapes pydantic writes: $defs with $ref, Optional as anyOf with null, enums, nested lists, titles and defaults.
TEST(JsonSchemaRecognizer, PydanticShapes) {
  const json schema = json::parse(R"({
    "$defs": {"Pet": {"properties": {"kind": {"enum": ["cat", "dog"], "title": "Kind", "type": "string"},
                                     "age": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": null}},
                      "required": ["kind"], "title": "Pet", "type": "object"}},
    "properties": {"name": {"title": "Name", "type": "string"},
                   "pets": {"items": {"$ref": "#/$defs/Pet"}, "title": "Pets", "type": "array", "maxItems": 2},
                   "score": {"type": "number"}},
    "required": ["name", "pets"], "title": "Person", "type": "object", "additionalProperties": false})");
  EXPECT_TRUE(takes(schema, R"({"name":"Ben","pets":[{"kind":"cat","age":3},{"kind":"dog","age":null}]})"));
  EXPECT_TRUE(takes(schema, "{\n  \"pets\": [],\n  \"name\": \"Amy\",\n  \"score\": -1.5e3\n}"));
  EXPECT_FALSE(takes(schema, R"({"name":"Ben"})"));                                   // pets required
  EXPECT_FALSE(takes(schema, R"({"name":"Ben","pets":[],"x":1})"));                   // no other key
  EXPECT_FALSE(takes(schema, R"({"name":"Ben","pets":[{"kind":"cow"}]})"));           // not in the enum
  EXPECT_FALSE(takes(schema, R"({"name":"Ben","pets":[{"kind":"cat","age":1.5}]})")); // an integer
  EXPECT_FALSE(takes(schema, R"({"name":"Ben","pets":[{},{},{}]})"));                 // kind required, 3 > maxItems
  EXPECT_FALSE(takes(schema, R"({"name":"Ben","name":"Amy","pets":[]})"));            // a key twice
  EXPECT_FALSE(takes(schema, R"({"name":1,"pets":[]})"));
  // Refused at the first byte that cannot lead to an instance: the key "nope" at its 'o' ("n" starts "name").
  SchemaRecognizer r = recognizer(schema);
  const std::string text = R"({"nope")";
  size_t k = 0;
  while (k < text.size() && r.feed(uint8_t(text[k]))) ++k;
  EXPECT_EQ(k, 3u);
  // Keys written with escapes are the properties they spell (their schema, counted once); a oneOf told apart by
  // types or by a required discriminator's values is held exactly.
  const json a_string = json::parse(R"({"type": "object", "required": ["a"], "properties": {"a": {"type": "string"},
                                       "url/path": {"type": "string"}, "café": {"type": "string"}}})");
  EXPECT_FALSE(takes(a_string, R"({"\u0061":5})"));
  EXPECT_FALSE(takes(a_string, R"({"a":"x","\u0061":"y"})"));
  EXPECT_FALSE(takes(a_string, R"({"a":"x","url\/path":5})"));
  EXPECT_TRUE(takes(a_string, R"({"\u0061":"x","url\/path":"y","caf\u00e9":"z"})"));
  const json tagged = json::parse(R"({"type": "object", "properties": {"pet": {"oneOf": [
      {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}}, "required": ["kind"]},
      {"type": "object", "properties": {"kind": {"const": "dog"}, "bark": {"type": "string"}}, "required": ["kind"]},
      {"type": "null"}]}}})");
  EXPECT_TRUE(takes(tagged, R"({"pet":{"kind":"cat","lives":9}})"));
  EXPECT_TRUE(takes(tagged, R"({"pet":{"bark":"woof","kind":"dog"}})"));
  EXPECT_TRUE(takes(tagged, R"({"pet":null})"));
  EXPECT_FALSE(takes(tagged, R"({"pet":{"kind":"cat","lives":"nine"}})"));
  // Alternatives that end the same merge: pydantic's int | float three times over does not exhaust the 8.
  const json n = json::parse(R"({"anyOf": [{"type": "integer"}, {"type": "number"}]})");
  const json twice = {{"anyOf", {{{"type", "object"}, {"properties", {{"p", n}, {"q", n}, {"r", n}, {"t", {{"const", "a"}}}}}},
                                 {{"type", "object"}, {"properties", {{"p", n}, {"q", n}, {"r", n}, {"t", {{"const", "b"}}}}}}}}};
  EXPECT_TRUE(takes(twice, R"({"p":1,"q":1,"r":1,"t":"b"})"));
  // An object that can hold no key: only "{}" (the opening quote of a key is refused, not a dead end after it).
  const json empty = {{"type", "object"}, {"additionalProperties", false}};
  EXPECT_TRUE(takes(empty, "{}"));
  SchemaRecognizer e = recognizer(empty);
  EXPECT_TRUE(e.feed(uint8_t('{')));
  EXPECT_FALSE(e.feed(uint8_t('"')));
  // A recursive schema through "#".
  const json tree = {{"type", "object"},
                     {"properties", {{"v", {{"type", "integer"}}}, {"kids", {{"type", "array"}, {"items", {{"$ref", "#"}}}}}}},
                     {"required", {"v"}}};
  EXPECT_TRUE(takes(tree, R"({"v":1,"kids":[{"v":2,"kids":[{"v":3}]},{"v":4}]})"));
  EXPECT_FALSE(takes(tree, R"({"v":1,"kids":[{"kids":[]}]})"));
}

// minLength / maxLength count code points as JSON Schema does (Python's len of the decoded string): a multi-byte
// character, an escape and an escaped surrogate pair are one each; past maxLength the byte that would begin another
// character is refused (so the string can still close), before minLength the closing quote.
TEST(JsonSchemaRecognizer, StringLengthsCountCodePoints) {
  const json schema = json::parse(R"({"type": "object", "required": ["s"], "additionalProperties": false,
    "properties": {"s": {"type": "string", "minLength": 2, "maxLength": 3}}})");
  for (const std::string v : {"ab", "abc", "\xc3\xa9\xe2\x82\xac", "a\\n", "\\ud83d\\ude00a", "\\ud83d\\ude00\\ud83d\\ude00x",
                              "\xf0\x9f\x98\x80\xf0\x9f\x98\x80\xf0\x9f\x98\x80", "\\u00e9\\u00e9", "\\ud83dx", "\\ud83dx\\ude00",
                              "\\ud83d\\ude00\\ud83d\\ude00\\ud83d\\ude00", "ab\\ud83d", "ab\\ud83d\\ude00"})
    EXPECT_TRUE(takes(schema, "{\"s\":\"" + v + "\"}")) << v;
  // (text, the byte offset the recognizer refuses at)
  for (const auto& [text, at] : std::vector<std::pair<std::string, size_t>>{
           {"{\"s\":\"a\"}", 7}, {"{\"s\":\"\"}", 6}, {"{\"s\":\"abcd\"}", 9}, {"{\"s\":\"\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\"}", 12},
           {"{\"s\":\"\\u00e9\\u00e9\\u00e9\\u00e9\"}", 24}, {"{\"s\":\"\\ud83d\\ude00\\ud83d\\ude00\\ud83d\\ude00\\ud83d\"}", 42},
           {"{\"s\":\"\\u00e9\"}", 12}, {"{\"s\":\"ab\\ud83d\\n\"}", 15}, {"{\"s\":\"ab\\ud83d\\u00e9\"}", 16},
           {"{\"s\":\"ab\\ud83d\\ud83d\"}", 17}}) {
    SchemaRecognizer r = recognizer(schema);
    size_t k = 0;
    while (k < text.size() && r.feed(uint8_t(text[k]))) ++k;
    EXPECT_EQ(k, at) << text;
  }
  // An enum's strings outside the lengths are never written; the rest are.
  const json e = json::parse(R"({"type": "object", "properties": {"c": {"enum": ["a", "bb", "ccc", 7], "minLength": 2}}})");
  EXPECT_FALSE(takes(e, R"({"c":"a"})"));
  EXPECT_TRUE(takes(e, R"({"c":"bb"})"));
  EXPECT_TRUE(takes(e, R"({"c":7})"));
}

// Integer bounds (minimum, maximum, their exclusive forms; fractional and huge bounds): every integer text of up to 4
// bytes is taken exactly when its value is within them, and each text's first refused byte is one after which no
// integer within them can be written (brute force over 6 bytes): the recognizer never enters a dead end.
TEST(JsonSchemaRecognizer, IntegerBoundsHoldEveryPrefix) {
  struct Case {
    json bounds;
    long double lo, hi;
  };
  const long double inf = 1e30L;
  const std::vector<Case> cases = {
      {{{"minimum", 0}, {"maximum", 100}}, 0, 100},
      {{{"minimum", -5}, {"maximum", 5}}, -5, 5},
      {{{"minimum", 10}, {"maximum", 19}}, 10, 19},
      {{{"minimum", -100}, {"maximum", -10}}, -100, -10},
      {{{"exclusiveMinimum", 0}, {"exclusiveMaximum", 10}}, 1, 9},
      {{{"minimum", 0.5}, {"maximum", 99.5}}, 1, 99},
      {{{"exclusiveMinimum", -0.5}, {"exclusiveMaximum", 0.5}}, 0, 0},
      {{{"minimum", 250}}, 250, inf},
      {{{"maximum", -7}}, -inf, -7},
      {{{"minimum", 3}, {"exclusiveMinimum", 3}, {"maximum", 40}, {"exclusiveMaximum", 50}}, 4, 40},
  };
  std::vector<std::string> texts = {"0", "-0", "-"};
  for (int len = 1; len <= 3; ++len)
    for (int v = len == 1 ? 1 : int(std::pow(10, len - 1)); v < int(std::pow(10, len)); ++v) {
      texts.push_back(std::to_string(v));
      if (len <= 3) texts.push_back("-" + std::to_string(v));
    }
  for (const Case& c : cases) {
    json schema = {{"type", "object"}, {"properties", {{"n", {{"type", "integer"}}}}}};
    for (const auto& [k, v] : c.bounds.items()) schema["properties"]["n"][k] = v;
    auto in = [&](const std::string& t) { const long double v = std::stold(t); return v >= c.lo && v <= c.hi; };
    // Whether some integer of at most 6 bytes within the bounds begins with `p` ("-" and digits): the prefixes of
    // those within them (the ones past 4 digits sampled).
    std::set<std::string> open;
    auto add = [&](const std::string& t) {
      if (t == "-" || !in(t)) return;
      for (size_t n = 1; n <= t.size(); ++n) open.insert(t.substr(0, n));
    };
    for (const std::string& t : texts) add(t);
    for (int v = 1000; v < 1000000; v += (v < 10000 ? 1 : 97)) add(std::to_string(v)), add("-" + std::to_string(v));
    auto goes_on = [&](const std::string& p) { return open.count(p) > 0; };
    for (const std::string& t : texts) {
      if (t == "-") continue;
      const std::string doc = "{\"n\":" + t + "}";
      EXPECT_EQ(takes(schema, doc), in(t)) << c.bounds.dump() << " " << t;
      SchemaRecognizer r = recognizer(schema);
      size_t k = 0;
      while (k < doc.size() && r.feed(uint8_t(doc[k]))) ++k;
      if (k < 5 + t.size()) {  // (refused inside the number: nothing within the bounds goes on from there)
        const std::string p = t.substr(0, k - 5 + 1);
        EXPECT_FALSE(goes_on(p)) << c.bounds.dump() << ": refused \"" << p << "\", which can still become an integer within";
      } else {  // (every byte of it taken: no dead end, it is within the bounds or goes on to one that is)
        EXPECT_TRUE(goes_on(t)) << c.bounds.dump() << ": took \"" << t << "\", which cannot become an integer within";
      }
    }
  }
  // Bounds near 2^63 compare exactly, and so do the texts past 64 bits; a float bound past 2^53 (a literal nlohmann
  // would round) is refused; an enum's integers outside the bounds are dropped.
  const json big = json::parse(R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": 9223372036854775000}}})");
  EXPECT_FALSE(takes(big, R"({"n":9223372036854774999})"));
  EXPECT_TRUE(takes(big, R"({"n":9223372036854775000})"));
  EXPECT_TRUE(takes(big, R"({"n":99999999999999999999999})"));
  EXPECT_THROW(recognizer({{"type", "object"}, {"properties", {{"n", {{"type", "integer"}, {"minimum", 1e20}}}}}}), plumb::Error);
  const json e = {{"type", "object"}, {"properties", {{"n", {{"type", "integer"}, {"enum", {1, 5, 9}}, {"maximum", 5}}}}}};
  EXPECT_TRUE(takes(e, R"({"n":5})"));
  EXPECT_FALSE(takes(e, R"({"n":9})"));
}

// The mask over a schema keeps exactly what allows() keeps in every byte state of valid texts (its first-two-bytes and
// plain-text shortcuts), over tokens that cross key, value and structure boundaries; some token always passes.
TEST(JsonSchemaMask, ShortcutsKeepWhatTheDirectCheckKeeps) {
  const std::vector<std::string> words = {"{\"", "\":", "\",", "\"}", "name", "nam", "e\"", "pets", "kind", "cat", "dog",
                                          "\"cat\"", "[{", "}]", "null", "nu", "12", "1.", ".5", "true", " ", "\n  ", "age",
                                          "\"a", "b\"", "Be", "n", "\":\"", "\":[", "},{", "-", "e3"};
  const auto dir = std::filesystem::temp_directory_path() / ("plumb_schema_tok_" + std::to_string(::getpid()));
  const plumb::Tokenizer tok = plumb::Tokenizer::load(write_byte_level_tokenizer(dir, words));
  std::filesystem::remove_all(dir);
  const int32_t vocab = tok.vocab_size(), eos = tok.token_id("<｜end▁of▁sentence｜>");
  const json schema = json::parse(R"({"type": "object", "additionalProperties": false, "required": ["name", "pets"],
    "properties": {"name": {"type": "string"}, "age": {"type": ["integer", "null"]},
                   "note": {"type": "string", "minLength": 2, "maxLength": 5},
                   "pets": {"type": "array", "items": {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}},
                                                         "required": ["kind"]}}}})");
  int states = 0;
  for (const std::string text : {R"({"name":"Ben","pets":[{"kind":"cat"},{"kind":"dog","x":[1,{"y":null}]}],"age":12,"note":"Bena"})",
                                 "{\n  \"pets\": [],\n  \"age\": null,\n  \"note\": \"n\\\"\xc3\xa9\",\n  \"name\": \"a \\\"b\\\" \xc3\xa9\"\n}"}) {
    plumb::gen::SchemaMask mask(tok, vocab, {eos}, recognizer(schema));
    for (size_t k = 0; k <= text.size(); ++k, ++states) {
      std::vector<float> l(static_cast<size_t>(vocab), 0.0f);
      ASSERT_NO_THROW(mask.apply(l)) << text.substr(0, k);
      for (int32_t id = 0; id < vocab; ++id)
        ASSERT_EQ(std::isfinite(l[size_t(id)]), mask.allows(id))
            << "token '" << tok.token_bytes(id) << "' after '" << text.substr(0, k) << "'";
      if (k < text.size()) mask.accept(tok.encode(text.substr(k, 1)).at(0));
    }
    EXPECT_TRUE(mask.complete());
  }
  EXPECT_GT(states, 100);
}

// Inside a key, the plain-text shortcut holds only where any key may come: not where the other keys' schema has no
// finite instance (no other key can be written), where the mask must keep what allows() keeps, the properties' names.
TEST(JsonSchemaMask, KeysAreFreeOnlyWhereAnotherKeyCanBeWritten) {
  const auto dir = std::filesystem::temp_directory_path() / ("plumb_schema_keys_" + std::to_string(::getpid()));
  const plumb::Tokenizer tok = plumb::Tokenizer::load(write_byte_level_tokenizer(dir, {"{\"", "zz", "ab", "a", "\":"}));
  std::filesystem::remove_all(dir);
  const int32_t vocab = tok.vocab_size(), eos = tok.token_id("<｜end▁of▁sentence｜>");
  const json schema = json::parse(R"({"type": "object", "properties": {"ab": {"type": "integer"}},
    "additionalProperties": {"$ref": "#/$defs/Loop"},
    "$defs": {"Loop": {"type": "object", "required": ["x"], "properties": {"x": {"$ref": "#/$defs/Loop"}}}}})");
  plumb::gen::SchemaMask mask(tok, vocab, {eos}, recognizer(schema));
  mask.accept(tok.token_id("{\""));
  std::vector<float> l(static_cast<size_t>(vocab), 0.0f);
  mask.apply(l);
  for (int32_t id = 0; id < vocab; ++id)
    EXPECT_EQ(std::isfinite(l[size_t(id)]), mask.allows(id)) << "token '" << tok.token_bytes(id) << "' inside a key";
  EXPECT_TRUE(mask.allows(tok.token_id("ab")));
  EXPECT_FALSE(mask.allows(tok.token_id("zz")));
}

// What a step's mask costs over a schema at DeepSeek-V4's vocabulary size (a measurement: disabled; run it with
// `build/tests/plumb_tests --gtest_also_run_disabled_tests --gtest_filter='*SchemaMaskCost*'`).
TEST(JsonSchemaMask, DISABLED_SchemaMaskCost) {
  const auto dir = std::filesystem::temp_directory_path() / ("plumb_schema_cost_" + std::to_string(::getpid()));
  const plumb::Tokenizer tok = plumb::Tokenizer::load(write_byte_level_tokenizer(dir, plumb::testing::synthetic_vocabulary()));
  std::filesystem::remove_all(dir);
  const int32_t vocab = tok.vocab_size();
  const json schema = json::parse(R"({"type": "object", "additionalProperties": false, "required": ["name", "pets"],
    "properties": {"name": {"type": "string"}, "age": {"type": ["integer", "null"]},
                   "pets": {"type": "array", "items": {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}},
                                                         "required": ["kind"]}}}})");
  auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  const auto t0 = std::chrono::steady_clock::now();
  plumb::gen::SchemaMask mask(tok, vocab, {tok.token_id("<｜end▁of▁sentence｜>")}, recognizer(schema));
  std::printf("vocabulary %d: tables %.1f ms\n", vocab, ms(t0, std::chrono::steady_clock::now()));
  std::vector<float> l(static_cast<size_t>(vocab));
  for (const auto& [text, what] : std::vector<std::pair<std::string, const char*>>{
           {"", "start"}, {"{\"", "in a key"}, {"name\"", "after a key"}, {": ", "a value"}, {"\"Ben the", "in a string value"},
           {"\"", "after a value"}, {", \"pets\": [{\"kind\": \"c", "in an enum"}, {"at\"}], \"age\": 1", "in a number"}}) {
    for (int32_t id : tok.encode(text)) mask.accept(id);
    const auto a = std::chrono::steady_clock::now();
    for (int i = 0; i < 10; ++i) std::fill(l.begin(), l.end(), 0.0f), mask.apply(l);
    std::printf("%-20s %.2f ms per step, %ld tokens pass\n", what, ms(a, std::chrono::steady_clock::now()) / 10,
                long(std::count_if(l.begin(), l.end(), [](float v) { return std::isfinite(v); })));
  }
}

// generate(): a valid instance comes out as the unmasked generation writes it; invalid ones are mended into instances
// (or cut by max tokens, still a prefix of one); a schema plumb does not support is refused before anything is fed.
TEST(JsonSchemaGenerate, KeepsValidInstancesAndMendsTheRest) {
  const plumb::Tokenizer tok = plumb::Tokenizer::load(PLUMB_TEST_DATA "/../../models/tiny");
  plumb::ModelInfo info;
  info.vocab_size = 1216, info.bos_token = 0, info.eos_token = 1, info.max_positions = 4096;
  const json schema = json::parse(R"({"type": "object", "additionalProperties": false, "required": ["name", "age"],
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "pet": {"enum": ["cat", "dog"]}}})");
  auto run = [&](const std::string& target, plumb::OutputFormat f, float t = 0.0f) {
    PreferringSession s(tok, target, info);
    plumb::GenerateOptions g;
    g.sampling.temperature = t;
    g.max_tokens = 120;
    g.format = f;
    g.json_schema = schema.dump();
    const std::vector<int32_t> prompt = {0};
    return plumb::generate(s, tok, prompt, g);
  };
  const std::string valid = R"({"name": "Ben", "age": 7, "pet": "cat"})";
  const auto a = run(valid, plumb::OutputFormat::Text), b = run(valid, plumb::OutputFormat::JsonSchema);
  EXPECT_EQ(b.text, valid);
  EXPECT_EQ(b.tokens, a.tokens);
  EXPECT_EQ(b.stop, plumb::StopReason::Token);
  for (const std::string broken : {R"({"name": "Ben"})", R"({"name": "Ben", "age": 7.5})", R"({"name": "Ben", "age": 7, "pet": "cow"})",
                                   R"({"name": "Ben", "age": 7, "owner": "Amy"})", R"({"age": "seven"})"})
    for (float t : {0.0f, 1.0f}) {
      const auto r = run(broken, plumb::OutputFormat::JsonSchema, t);
      SchemaRecognizer check = recognizer(schema);
      EXPECT_TRUE(check.feed(r.text)) << broken << " -> " << r.text;
      if (r.stop == plumb::StopReason::Token) {
        EXPECT_TRUE(check.complete()) << r.text;
        const json v = json::parse(r.text);
        EXPECT_TRUE(v.contains("name") && v.contains("age") && v["age"].is_number_integer()) << r.text;
      } else {
        EXPECT_EQ(r.stop, plumb::StopReason::Length) << r.text;
      }
    }
  PreferringSession s(tok, valid, info);
  plumb::GenerateOptions g;
  g.format = plumb::OutputFormat::JsonSchema;
  g.json_schema = R"({"type": "object", "properties": {"a": {"pattern": "x"}}})";
  const std::vector<int32_t> prompt = {0};
  EXPECT_THROW(plumb::generate(s, tok, prompt, g), plumb::Error);
  EXPECT_EQ(s.position(), 0);
}

}  // namespace
