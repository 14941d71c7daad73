// JSON mode (GenerateOptions::format = OutputFormat::JsonObject): a byte-level recognizer of one JSON object and the
// token mask generate() applies with it, so that every sampled token keeps the output a prefix of a valid object
// (within the recognizer's bounds).
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace plumb {
class Tokenizer;
}

namespace plumb::gen {

// What one byte did to the structure (JsonRecognizer::event(), for a schema layer reading the same bytes): at most one
// structural event, after a number that this byte ended (number_end: the byte itself belongs to what follows).
struct JsonEvent {
  enum What : uint8_t { None, Open, Close, Comma, KeyStart, KeyEnd, ScalarStart, ScalarEnd };
  // Open / Close: Object or Array; ScalarStart: String, Number, True, False or Null (ScalarEnd: a string's closing
  // quote or a literal's last byte; a number ends with number_end on the byte after it).
  enum Kind : uint8_t { Object, Array, String, Number, True, False, Null };
  bool number_end = false;
  What what = None;
  Kind kind = Object;
};

// Recognizes the text of one JSON object (RFC 8259's grammar, the root an object), a byte at a time: feed() is false
// at the first byte that no valid object can have there (and the state is then unspecified), and every state it takes
// can still be completed (no dead end: tested by a search over the states). Strings must be well-formed UTF-8 (no
// overlong forms or surrogates) without raw control characters. Bounds: nesting at most kMaxDepth containers, numbers
// at most kMaxNumber bytes, and whitespace between tokens either one space or tab, or one line break ("\n" or "\r\n")
// and at most kMaxIndent spaces or tabs after it, as pretty-printed JSON has it (JSON mode's known failure is an
// endless run of whitespace; strings and arrays stay unbounded: max tokens ends those). The state is a few plain
// fields, copied to try a token's bytes.
class JsonRecognizer {
 public:
  static constexpr int kMaxDepth = 64, kMaxIndent = 32, kMaxNumber = 64;
  bool feed(uint8_t c);
  bool feed(std::string_view bytes);  // every byte, stopping at the first refused
  bool complete() const { return mode_ == Mode::Done; }
  // Inside a string, between characters: where any text without '"', control characters and broken UTF-8 passes.
  bool between_string_chars(int64_t = 0) const { return mode_ == Mode::String && utf8_need_ == 0; }
  bool in_string() const { return mode_ == Mode::String || mode_ == Mode::Escape || mode_ == Mode::Unicode; }
  // What the last byte fed did (JsonEvent).
  const JsonEvent& event() const { return event_; }
  // Two states that take the same bytes the same way are equal (a search over the states, tests/unit/test_json_mode.cpp).
  bool operator==(const JsonRecognizer& o) const {
    return mode_ == o.mode_ && num_ == o.num_ && key_ == o.key_ && depth_ == o.depth_ && objects_ == o.objects_ &&
           utf8_need_ == o.utf8_need_ && utf8_lo_ == o.utf8_lo_ && utf8_hi_ == o.utf8_hi_ && count_ == o.count_ &&
           ws_ == o.ws_ && literal_ == o.literal_;
  }
  int depth() const { return depth_; }
  uint64_t hash() const {
    uint64_t h = objects_;
    for (uint8_t v : {uint8_t(mode_), uint8_t(num_), uint8_t(key_), depth_, utf8_need_, utf8_lo_, utf8_hi_, count_, ws_, literal_})
      h = h * 0x100000001b3ull ^ v;
    return h;
  }

 private:
  // What the next byte may be. Value / ValueOrClose: a value (after '[': or ']'); KeyOrClose: after '{'; Key: after a
  // ',' in an object; Colon: after a key; After: after a value (',' or the container's close).
  enum class Mode : uint8_t { Start, Value, ValueOrClose, KeyOrClose, Key, Colon, After, String, Escape, Unicode,
                              Number, Literal, Done };
  // Inside a number: after '-', a leading '0', integer digits, '.', fraction digits, 'e', the exponent's sign, its digits.
  enum class Num : uint8_t { Minus, Zero, Int, Dot, Frac, E, ESign, Exp };
  bool structural(uint8_t c);  // Start .. After
  bool whitespace(uint8_t c);
  bool begin_value(uint8_t c);
  void scalar(JsonEvent::Kind k) { event_.what = JsonEvent::ScalarStart, event_.kind = k; }
  bool open(bool object);
  bool close(bool object);
  void after_value() { mode_ = depth_ == 0 ? Mode::Done : Mode::After, count_ = 0, ws_ = 0; }
  bool top_is_object() const { return (objects_ >> (depth_ - 1)) & 1; }
  bool string_byte(uint8_t c);
  bool number_byte(uint8_t c);

  Mode mode_ = Mode::Start;
  Num num_ = Num::Minus;
  bool key_ = false;        // the string being read is an object key
  uint8_t depth_ = 0;       // open containers
  uint64_t objects_ = 0;    // bit i: container i (from the root) is an object, else an array
  uint8_t utf8_need_ = 0;   // continuation bytes still due in a string
  uint8_t utf8_lo_ = 0x80, utf8_hi_ = 0xBF;  // the next continuation byte's range
  uint8_t count_ = 0;       // whitespace run, number length, \u hex digits left, or the literal's bytes matched
  uint8_t ws_ = 0;          // the whitespace run: kBreak after a line break, kCR right after a '\r'
  static constexpr uint8_t kBreak = 1, kCR = 2;
  uint8_t literal_ = 0;     // 0 true, 1 false, 2 null
  JsonEvent event_;         // the last byte's (not part of the state: operator== and hash() leave it out)
};

// The mask generate() applies: JSON mode's or a schema's (TokenMask below).
class OutputMask {
 public:
  virtual ~OutputMask() = default;
  // Sets the bit (gen::set_token_bit, token_bits.h) of every token that may come next in `bits` (zeroed, one bit per
  // id of the vocabulary). Throws plumb::Error when no token can. What Session::forward_sample_masked asks for.
  virtual void allowed(std::span<uint32_t> bits) const = 0;
  // The same on a logits row: every token that cannot come next gets -inf (gen::mask_logits).
  void apply(std::span<float> logits) const;
  virtual bool allows(int32_t id) const = 0;  // whether `id` may come next (what apply() keeps)
  // The sampled token: its bytes go to the recognizer. Throws plumb::Error for a token allows() refuses.
  virtual void accept(int32_t id) = 0;
  virtual bool complete() const = 0;
  virtual size_t vocab() const = 0;  // the logits per row it masks
};

// What a mask knows of the vocabulary, built once per tokenizer and vocabulary size and kept with the tokenizer
// (TokenizerCache: 20-30 ms at 129K tokens), shared by every generation's mask: the bytes each token adds to the output
// (its decode; empty: never passes: added tokens, ids the tokenizer does not know, tokens that decode to nothing) and
// the two shortcuts' lists.
struct TokenTables {
  // added_as_text (named `added_name` in the cache's key; empty: none, as JSON mode has it): the added tokens whose text
  // the output may hold as they are (the tool-call block's DSML tags, where a tokenizer makes them added tokens).
  static std::shared_ptr<const TokenTables> of(const Tokenizer& tok, int32_t vocab, std::string_view added_name = {},
                                               const std::function<bool(std::string_view)>& added_as_text = {});
  std::vector<std::string> bytes;  // per id of the model's vocabulary
  // Outside strings the tokens are tried by their first two bytes: the one-byte tokens per byte, and the longer ones
  // grouped by their first two bytes (ids in two_ids[two_at[k] .. two_at[k + 1]) for k = 256 * first + second).
  std::array<std::vector<int32_t>, 256> one_byte;
  std::vector<int32_t> two_ids;
  std::vector<uint32_t> two_at;
  // Inside a string most tokens are plain text, which passes whatever it says: those ids, and the others to try; and
  // the most characters a plain token holds (its bytes that begin one: a string with at least that many left to its
  // maxLength takes any plain token).
  std::vector<int32_t> plain, not_plain;
  int64_t plain_max_chars = 0;
  bool spaced = false;  // a tokenizer without a byte-level decoder puts a space between tokens
};

// The mask for one generation over a recognizer R (JsonRecognizer; SchemaRecognizer, json_schema.h; ToolCallRecognizer,
// tool_call_mask.h): the bytes each
// token adds to the output (its decode), and R's state for what was sampled so far. Where R's
// between_string_chars(longest plain token) holds, the plain tokens pass untried; an R may narrow that with
// recheck_first_byte() (a byte: the plain tokens that begin with it are tried) and recheck_ids() (those are tried).
// Added tokens (special or not:
// DeepSeek's chat markers), ids the tokenizer does not know and tokens that decode to nothing never pass; the end
// tokens (EOS, the stop tokens) pass only once the value is complete, and then nothing else does.
template <class R>
class TokenMask final : public OutputMask {
 public:
  // vocab: the model's (its logits per row; ids past the tokenizer's never pass). ends: the tokens that end the
  // generation; at least one (generate() refuses JSON mode without one). start: R's state before the first byte.
  // tables: TokenTables::of(tok, vocab) when null.
  TokenMask(const Tokenizer& tok, int32_t vocab, std::vector<int32_t> ends, R start = R(),
            std::shared_ptr<const TokenTables> tables = nullptr);
  void allowed(std::span<uint32_t> bits) const override;
  bool allows(int32_t id) const override;
  void accept(int32_t id) override;
  bool complete() const override { return state_.complete(); }
  size_t vocab() const override { return is_end_.size(); }

 private:
  bool passes(int32_t id, const R& from, size_t skip = 0) const;  // the bytes of id after `skip` fed
  // The state the next token's bytes start from: the state so far, and the space a spaced tokenizer puts before every
  // token but the first. False when that space cannot come.
  bool next_start(R& s) const { return (s = state_, !t_->spaced || first_ || s.feed(uint8_t(' '))); }
  std::shared_ptr<const TokenTables> t_;
  // The end tokens pass only as the end (a stop token that is text, "}" or "\n", would otherwise end the generation
  // inside the object): the tables keep their bytes, the mask takes them out.
  std::vector<int32_t> ends_;
  std::vector<uint8_t> is_end_;
  bool first_ = true;
  R state_;
};

using JsonMask = TokenMask<JsonRecognizer>;
extern template class TokenMask<JsonRecognizer>;  // (json_mode.cpp instantiates both masks; the schema's: json_schema.h)

}  // namespace plumb::gen
