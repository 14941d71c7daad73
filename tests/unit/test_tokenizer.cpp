// Tokenizer tests: a hand-built tokenizer.json with hand-computed ids (tests/data/tokenizer/tiny.json), the
// byte-level alphabet, added tokens, decoding and streaming, error reporting, and TokenizerParity over every
// tests/data/tokenizer/parity/<name>/ fixture (ids and decodes from hf tokenizers 0.23).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "core/error.h"
#include "plumb/text.h"
#include "text/byte_level.h"
#include "text/escape.h"
#include "text/regex.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace fs = std::filesystem;
using plumb::text::StreamDecoder;
using plumb::text::Tokenizer;
using Ids = std::vector<int32_t>;

namespace {

const std::string kData = PLUMB_TEST_DATA;
const std::string kTinyTokenizer = kData + "/tokenizer/tiny.json";

const Tokenizer& tiny() {
  static const Tokenizer t = Tokenizer::load(kTinyTokenizer);
  return t;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Writes `text` to a temp file and returns its path.
std::string temp_json(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / ("plumb_tok_" + name + ".json");
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

// Expects Tokenizer::load(path) to throw a plumb::Error whose message contains every needle.
void expect_load_error(const std::string& path, std::initializer_list<std::string> needles) {
  try {
    Tokenizer::load(path);
    FAIL() << "loading " << path << " did not throw";
  } catch (const plumb::Error& e) {
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

// tiny.json with one substring replaced.
std::string tiny_with(const std::string& from, const std::string& to) {
  std::string s = slurp(kTinyTokenizer);
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return s.replace(at, from.size(), to);
}

std::string ids_str(const Ids& ids) {
  std::string s;
  for (size_t k = 0; k < ids.size(); ++k) {
    if (k) s += ' ';
    s += std::to_string(ids[k]);
  }
  return s;
}

}  // namespace

// tiny.json: ids 0..255 are the byte-level alphabet in byte order (byte b -> id b), merges 256..269 are
// "b c", "a b", "h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "1 2", "12 3",
// "ä ¸" (bytes E4 B8); added tokens 270 BOS (special), 271 <｜User｜> (special), 272 <think>; DeepSeek's
// pre-tokenizer; TemplateProcessing BOS $A.
TEST(Tokenizer, HandComputedIds) {
  const auto& t = tiny();
  EXPECT_EQ(t.encode("hello world"), (Ids{261, 266}));  // "hello" | "Ġworld" via Ġw, or, Ġwor, ld, Ġworld
  EXPECT_EQ(t.encode("1234"), (Ids{268, 52}));          // \p{N}{1,3}: "123" | "4"
  EXPECT_EQ(t.encode("<｜User｜>hi<think>"), (Ids{271, 104, 105, 272}));
  EXPECT_EQ(t.encode("中"), (Ids{269, 0xAD}));           // E4 B8 merged, AD alone
  EXPECT_EQ(t.encode(""), Ids{});
  EXPECT_EQ(t.encode("hi", true), (Ids{270, 104, 105}));
  EXPECT_EQ(t.encode("", true), (Ids{270}));
  EXPECT_EQ(t.special_prefix(), (Ids{270}));
  EXPECT_TRUE(t.special_suffix().empty());
}

TEST(Tokenizer, MergePriorityFollowsRankNotPosition) {
  // "a b" (rank 1) is leftmost but "b c" (rank 0) wins: a | bc.
  EXPECT_EQ(tiny().encode("abc"), (Ids{97, 256}));
  EXPECT_EQ(tiny().encode("ab"), (Ids{257}));
}

TEST(Tokenizer, VocabAccessors) {
  const auto& t = tiny();
  EXPECT_EQ(t.vocab_size(), 273);
  EXPECT_EQ(t.token_id("hello"), 261);
  EXPECT_EQ(t.token_id("<｜User｜>"), 271);
  EXPECT_EQ(t.token_id("nope"), -1);
  EXPECT_EQ(t.token_text(266), "Ġworld");
  EXPECT_EQ(t.token_text(272), "<think>");
  EXPECT_EQ(t.token_text(9999), "");
  EXPECT_TRUE(t.is_special(270));
  EXPECT_FALSE(t.is_special(272));
  EXPECT_FALSE(t.is_special(5));
}

TEST(Tokenizer, ByteLevelAlphabetCoversAll256Bytes) {
  using namespace plumb::text;
  std::set<uint32_t> seen;
  for (int b = 0; b < 256; ++b) {
    const uint32_t cp = byte_to_codepoint(uint8_t(b));
    EXPECT_EQ(codepoint_to_byte(cp), b);
    seen.insert(cp);
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    if (printable) {
      EXPECT_EQ(cp, uint32_t(b));
    } else {
      EXPECT_GE(cp, 0x100u);
    }
  }
  EXPECT_EQ(seen.size(), 256u);
  EXPECT_EQ(byte_to_codepoint(0x00), 0x100u);
  EXPECT_EQ(byte_to_codepoint(0x20), 0x120u);  // Ġ
  EXPECT_EQ(byte_to_codepoint(0x0A), 0x10Au);  // Ċ
  EXPECT_EQ(byte_to_codepoint(0x7F), 0x121u);
  EXPECT_EQ(byte_to_codepoint(0xAD), 0x143u);
  EXPECT_EQ(codepoint_to_byte('a' + 0x1000), -1);
  // In tiny.json byte b is id b: every single byte, valid UTF-8 or not, encodes to exactly that id.
  for (int b = 0; b < 256; ++b) {
    const std::string s(1, char(b));
    EXPECT_EQ(tiny().encode(s), Ids{b}) << "byte " << b;
    EXPECT_EQ(tiny().decode_bytes({b}), s);
  }
}

TEST(Tokenizer, SpecialTokensAreNeverSplit) {
  const auto& t = tiny();
  const Ids ids = t.encode("x <｜User｜>y<｜User｜><｜User｜> hello<｜begin▁of▁sentence｜>");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 271), 3);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 270), 1);
  EXPECT_EQ(t.decode(ids), "x <｜User｜>y<｜User｜><｜User｜> hello<｜begin▁of▁sentence｜>");
  EXPECT_EQ(t.decode(ids, /*skip_special=*/true), "x y hello");
  // Partial matches are plain text.
  for (const char* s : {"<｜User", "｜User｜>", "<｜Use｜>", "<think", "think>"}) {
    const Ids p = t.encode(s);
    EXPECT_EQ(std::count(p.begin(), p.end(), 271) + std::count(p.begin(), p.end(), 272), 0) << s;
    EXPECT_EQ(t.decode(p), s);
  }
}

TEST(Tokenizer, InvalidUtf8IsEncodedAsRawBytes) {
  const auto& t = tiny();
  // An ill-formed run is its own pre-token; the text around it is tokenized as usual.
  EXPECT_EQ(t.encode("a\xFF" "b"), (Ids{97, 255, 98}));
  EXPECT_EQ(t.encode("hello\xE4\xB8"), (Ids{261, 269}));  // truncated 中: E4 B8 still merge
  EXPECT_EQ(t.encode("\xED\xA0\x80"), (Ids{0xED, 0xA0, 0x80}));  // an encoded surrogate
  EXPECT_EQ(t.decode_bytes(t.encode("a\xFF" "b")), "a\xFF" "b");
  EXPECT_EQ(t.decode(t.encode("a\xFF" "b")), "a\xEF\xBF\xBD" "b");  // lossy, like hf
  EXPECT_EQ(t.decode(t.encode("\xE4\xB8" "x")), "\xEF\xBF\xBD" "x");  // one U+FFFD per maximal subpart
}

TEST(Tokenizer, DecodeBytesInvertsEncodeForAnyBytes) {
  const auto& t = tiny();
  std::mt19937 rng(42);
  for (int k = 0; k < 500; ++k) {
    std::string s(rng() % 40, '\0');
    for (char& c : s) c = char(rng() % 4 == 0 ? rng() % 256 : "ab lo1\n\t中<"[rng() % 11]);
    EXPECT_EQ(t.decode_bytes(t.encode(s)), s);
    if (plumb::text::utf8_is_valid(s)) {
      EXPECT_EQ(t.decode(t.encode(s)), s);
    }
  }
  for (const char* s : {"Grüße, мир! 你好 👩‍💻 ١٢٣", "  \n\n\t x", "<think>\n</think>", "e\xCC\x81"})
    EXPECT_EQ(t.decode(t.encode(s)), s);
}

TEST(Tokenizer, DecodeSkipsUnknownIds) {
  EXPECT_EQ(tiny().decode({104, 99999, 105, -3}), "hi");
}

TEST(StreamDecoder, HoldsPartialCharacters) {
  const auto& t = tiny();
  StreamDecoder sd(t);
  EXPECT_EQ(sd.push(104), "h");
  EXPECT_EQ(sd.push(269), "");     // E4 B8: first two bytes of 中
  EXPECT_EQ(sd.push(0xAD), "中");  // completed
  EXPECT_EQ(sd.push(0xF0), "");    // first byte of a 4-byte emoji
  EXPECT_EQ(sd.push(0x9F), "");
  EXPECT_EQ(sd.push(0x98), "");
  EXPECT_EQ(sd.push(0x80), "😀");
  EXPECT_EQ(sd.push(0xE4), "");
  EXPECT_EQ(sd.push('a'), "\xEF\xBF\xBD" "a");  // cannot complete any more: replaced at once
  EXPECT_EQ(sd.push(0xE4), "");
  EXPECT_EQ(sd.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(sd.flush(), "");
  StreamDecoder skip(t, /*skip_special=*/true);
  EXPECT_EQ(skip.push(270), "");
  EXPECT_EQ(skip.push(272), "<think>");
}

TEST(StreamDecoder, ConcatenationEqualsDecode) {
  const auto& t = tiny();
  std::mt19937 rng(7);
  for (int k = 0; k < 300; ++k) {
    Ids ids(rng() % 20);
    for (auto& id : ids) id = int32_t(rng() % 275);
    StreamDecoder sd(t);
    std::string got;
    for (int32_t id : ids) {
      const std::string piece = sd.push(id);
      EXPECT_TRUE(plumb::text::utf8_is_valid(piece));
      got += piece;
    }
    got += sd.flush();
    EXPECT_EQ(got, t.decode(ids)) << ids_str(ids);
  }
}

TEST(TokenizerErrors, NameTheFileAndField) {
  expect_load_error("/nonexistent/tokenizer.json", {"/nonexistent/tokenizer.json", "cannot open"});
  expect_load_error(temp_json("badjson", "{\"model\": "), {"plumb_tok_badjson.json", "not valid JSON"});
  expect_load_error(temp_json("nomodel", "{}"), {"plumb_tok_nomodel.json", "model"});
  expect_load_error(temp_json("wordpiece", tiny_with("\"type\": \"BPE\"", "\"type\": \"WordPiece\"")),
                    {"plumb_tok_wordpiece.json", "model.type", "WordPiece"});
  expect_load_error(temp_json("pretok", tiny_with("\"type\": \"Sequence\",\n  \"pretokenizers\"",
                                                  "\"type\": \"Whitespace\",\n  \"pretokenizers\"")),
                    {"plumb_tok_pretok.json", "pre_tokenizer", "Whitespace"});
  expect_load_error(temp_json("merge", tiny_with("\"b c\"", "\"b zz\"")),
                    {"plumb_tok_merge.json", "merges[0]", "zz"});
  expect_load_error(temp_json("regex", tiny_with("\\\\p{N}{1,3}", "(unclosed")),
                    {"plumb_tok_regex.json", "pretokenizers[0].pattern.Regex", "cannot compile"});
  expect_load_error(temp_json("behavior", tiny_with("\"Isolated\"", "\"Sideways\"")), {"behavior", "Sideways"});
  expect_load_error(temp_json("normalizer", tiny_with("\"normalizers\": []", "\"normalizers\": [{\"type\": \"NFKC\"}]")),
                    {"plumb_tok_normalizer.json", "normalizer", "NFKC"});
  expect_load_error(temp_json("vocab", tiny_with("\"hello\": 261", "\"hello\": \"x\"")), {"model.vocab", "hello"});
  // An id that would size the id table at 2^31 entries (tens of GB) instead of a clear error.
  expect_load_error(temp_json("hugeid", tiny_with("\"hello\": 261", "\"hello\": 2147483647")),
                    {"plumb_tok_hugeid.json", "model.vocab", "hello", "2147483647"});
  // A post-processor adding an id no token has (tests/fuzz/fuzz_tokenizer_json: the template's BOS without the
  // added_tokens that define it): encode(..., add_special) gave the model an id outside the vocabulary.
  expect_load_error(temp_json("template", tiny_with("\"added_tokens\"", "\"no_added_tokens\"")),
                    {"plumb_tok_template.json", "post_processor", "270"});
}

TEST(TokenizerRegex, OnigurumaTranslation) {
  using plumb::text::translate_onig_to_pcre2;
  // \s is onig's White_Space set (PCRE2's would add U+180E); \h is a hex digit; (?m) is dot-all.
  EXPECT_EQ(translate_onig_to_pcre2("a\\sb", "t"),
            "a[\\t\\n\\x0B\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}]b");
  // and so the compiled \s does not match U+180E (MONGOLIAN VOWEL SEPARATOR), which PCRE2's own \s would.
  std::vector<plumb::text::Span> spans;
  plumb::text::Regex::onig("\\s", "t").find_matches("a\u180Eb c", spans);
  ASSERT_EQ(spans.size(), 3u);  // "a\u180Eb", " ", "c"
  EXPECT_EQ(spans[1].begin, 5u);
  EXPECT_TRUE(spans[1].match);
  EXPECT_NE(translate_onig_to_pcre2("\\s+(?!\\S)", "t").find("[^\\t"), std::string::npos);
  EXPECT_EQ(translate_onig_to_pcre2("\\h", "t"), "[0-9A-Fa-f]");
  EXPECT_EQ(translate_onig_to_pcre2("(?m:.)", "t"), "(?s:.)");
  EXPECT_EQ(translate_onig_to_pcre2("\\u00e9", "t"), "\\x{00e9}");
  EXPECT_EQ(translate_onig_to_pcre2("[一-龥]", "t"), "[一-龥]");
  EXPECT_THROW(translate_onig_to_pcre2("[a-z&&[^aeiou]]", "t"), plumb::Error);
  // Newer-Unicode letters are added to \p{L} (U+2EBF0, CJK extension I, is a letter to onig).
  const auto re = plumb::text::Regex::onig("\\p{L}+", "t");
  spans.clear();
  re.find_matches("a\xF0\xAE\xAF\xB0" "b", spans);
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_TRUE(spans[0].match);
}

TEST(TokenizerEscape, RoundTripAndErrors) {
  using namespace plumb::text;
  EXPECT_EQ(unescape_line("a\\nb\\tc\\\\d\\x41\\xff\\r"), std::string("a\nb\tc\\dA\xFF\r"));
  EXPECT_EQ(escape_line("a\nb\tc\\d\x01\x7F\r中\xFF"), "a\\nb\\tc\\\\d\\x01\\x7F\\r中\\xFF");
  for (int b = 0; b < 256; ++b) {
    const std::string s = std::string("x") + char(b) + "y";
    EXPECT_EQ(unescape_line(escape_line(s)), s);
  }
  EXPECT_THROW(unescape_line("bad\\q"), plumb::Error);
  EXPECT_THROW(unescape_line("bad\\x4"), plumb::Error);
  EXPECT_THROW(unescape_line("bad\\"), plumb::Error);
}

// The one parser of written token ids (`run --ids`, `tokenize --decode`, token files; three copies before session 57).
TEST(TokenIds, ParseAndNameTheBadItem) {
  using Ids = std::vector<int32_t>;
  EXPECT_EQ(plumb::parse_token_ids("0 15,27\t3 ", "--ids"), Ids({0, 15, 27, 3}));
  EXPECT_EQ(plumb::parse_token_ids(" 1 , 2,3 ,4", "--ids"), Ids({1, 2, 3, 4}));
  EXPECT_EQ(plumb::parse_token_ids(" \t\r\n", "--ids"), Ids());
  EXPECT_EQ(plumb::parse_token_ids("2147483647", "--ids"), Ids({2147483647}));
  for (const char* bad : {"1 -2", "-0", "+1", "1 2147483648", "3 x", "4 5a", "99999999999999999999"}) {
    try {
      (void)plumb::parse_token_ids(bad, "f.txt:3");
      ADD_FAILURE() << bad << ": accepted";
    } catch (const plumb::Error& e) {
      EXPECT_NE(std::string(e.what()).find("f.txt:3"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("at column"), std::string::npos) << e.what();
    }
  }
  // A comma with no id on one side is an id lost, not a separator to skip: each names the comma's column.
  for (const auto& [bad, col] : std::vector<std::pair<std::string, std::string>>{
           {"1,,2", "column 3"}, {"1, ,2", "column 4"}, {",1", "column 1"}, {"1 2,", "column 4"}, {" , ", "column 2"}}) {
    try {
      (void)plumb::parse_token_ids(bad, "--ids");
      ADD_FAILURE() << bad << ": accepted";
    } catch (const plumb::Error& e) {
      EXPECT_NE(std::string(e.what()).find("comma at " + col), std::string::npos) << bad << ": " << e.what();
    }
  }
}

// Every tests/data/tokenizer/parity/<name>/ holds tokenizer.json, corpus.txt (escaped lines) and expected.txt
// (ids TAB ids-with-special TAB escaped decode, from hf tokenizers: tools/tokenizer/make_parity.py or
// node_oracle.mjs).
TEST(TokenizerParity, MatchesHuggingFaceTokenizers) {
  const fs::path root = fs::path(kData) / "tokenizer" / "parity";
  std::vector<fs::path> dirs;
  if (fs::is_directory(root))
    for (const auto& e : fs::directory_iterator(root))
      if (e.is_directory() && fs::exists(e.path() / "expected.txt")) dirs.push_back(e.path());
  if (dirs.empty()) GTEST_SKIP() << "no parity fixtures under " << root << " (see tools/tokenizer/README.md)";
  std::sort(dirs.begin(), dirs.end());
  for (const auto& dir : dirs) {
    SCOPED_TRACE(dir.string());
    const Tokenizer t = Tokenizer::load((dir / "tokenizer.json").string());
    std::ifstream corpus(dir / "corpus.txt"), expected(dir / "expected.txt");
    std::string cline, eline;
    size_t lineno = 0, failures = 0;
    while (std::getline(corpus, cline)) {
      ++lineno;
      ASSERT_TRUE(std::getline(expected, eline)) << "expected.txt has fewer lines than corpus.txt";
      const size_t t1 = eline.find('\t'), t2 = eline.find('\t', t1 + 1);
      ASSERT_TRUE(t1 != std::string::npos && t2 != std::string::npos) << "expected.txt line " << lineno;
      const std::string text = plumb::text::unescape_line(cline);
      const Ids ids = t.encode(text), ids_sp = t.encode(text, true);
      const std::string want = eline.substr(0, t1), want_sp = eline.substr(t1 + 1, t2 - t1 - 1);
      const std::string dec = plumb::text::escape_line(t.decode(ids)), want_dec = eline.substr(t2 + 1);
      if (ids_str(ids) != want || ids_str(ids_sp) != want_sp || dec != want_dec) {
        // Report the first few mismatches in full, then just count.
        if (++failures <= 3)
          ADD_FAILURE() << dir.filename().string() << " corpus line " << lineno << ": " << cline
                        << "\n  expected ids: " << want << "\n  plumb ids:    " << ids_str(ids)
                        << "\n  expected ids (add_special): " << want_sp << "\n  plumb ids (add_special):    "
                        << ids_str(ids_sp) << "\n  expected decode: " << want_dec << "\n  plumb decode:    " << dec;
      }
    }
    EXPECT_EQ(failures, 0u) << "mismatching lines in " << dir;
    EXPECT_GT(lineno, 0u);
  }
}
