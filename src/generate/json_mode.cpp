// JSON mode: the recognizer of one JSON object and the token mask built on it (json_mode.h).
#include "generate/json_mode.h"

#include <cmath>
#include <limits>
#include <type_traits>

#include "core/error.h"
#include "generate/json_schema.h"
#include "generate/tool_call_mask.h"
#include "generate/token_bits.h"
#include "generate/tokenizer_cache.h"
#include "plumb/text.h"

namespace plumb::gen {

namespace {

bool is_space(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
bool is_hex(uint8_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// Text that a string holds from any point between its characters, without leaving it: whole UTF-8 characters and
// whole escapes, no '"' and no control character (the recognizer decides, byte by byte, from just inside a string).
bool plain_string_text(std::string_view b) {
  JsonRecognizer r;
  r.feed("{\"");
  for (char c : b)
    if (!r.feed(uint8_t(c)) || !r.in_string()) return false;
  return r.between_string_chars();
}

constexpr std::string_view kLiterals[3] = {"true", "false", "null"};

}  // namespace

bool JsonRecognizer::feed(std::string_view bytes) {
  for (char c : bytes)
    if (!feed(uint8_t(c))) return false;
  return true;
}

bool JsonRecognizer::feed(uint8_t c) {
  event_ = {};
  switch (mode_) {
    case Mode::String: return string_byte(c);
    case Mode::Escape:
      if (c == 'u') {
        mode_ = Mode::Unicode, count_ = 4;
        return true;
      }
      if (c != '"' && c != '\\' && c != '/' && c != 'b' && c != 'f' && c != 'n' && c != 'r' && c != 't') return false;
      mode_ = Mode::String;
      return true;
    case Mode::Unicode:  // (any 4 hex digits: the grammar allows a lone surrogate escape, as Python's json does)
      if (!is_hex(c)) return false;
      if (--count_ == 0) mode_ = Mode::String;
      return true;
    case Mode::Number: return number_byte(c);
    case Mode::Literal: {
      const std::string_view lit = kLiterals[literal_];
      if (c != uint8_t(lit[count_])) return false;
      if (++count_ == lit.size()) after_value(), event_.what = JsonEvent::ScalarEnd;
      return true;
    }
    case Mode::Done: return false;  // nothing after the object: the generation ends there
    default: return structural(c);
  }
}

// Start .. After: whitespace (bounded runs), or the bytes of the structure.
bool JsonRecognizer::structural(uint8_t c) {
  if (is_space(c)) return whitespace(c);
  if (ws_ & kCR) return false;  // a '\r' only as the start of "\r\n"
  count_ = 0, ws_ = 0;
  switch (mode_) {
    case Mode::Start: return c == '{' && open(true);
    case Mode::ValueOrClose:
      if (c == ']') return close(false);
      return begin_value(c);
    case Mode::Value: return begin_value(c);
    case Mode::KeyOrClose:
      if (c == '}') return close(true);
      [[fallthrough]];
    case Mode::Key:
      if (c != '"') return false;
      mode_ = Mode::String, key_ = true, event_.what = JsonEvent::KeyStart;
      return true;
    case Mode::Colon:
      if (c != ':') return false;
      mode_ = Mode::Value;
      return true;
    case Mode::After:
      if (c == ',') {
        mode_ = top_is_object() ? Mode::Key : Mode::Value, event_.what = JsonEvent::Comma;
        return true;
      }
      if (c == '}' || c == ']') return close(c == '}');
      return false;
    default: return false;
  }
}

// One run of whitespace between tokens: " " or "\t" alone, or a line break and its indentation.
bool JsonRecognizer::whitespace(uint8_t c) {
  const bool brk = c == '\n' || c == '\r';
  if (ws_ & kCR) {  // "\r\n" is one line break
    if (c != '\n') return false;
    ws_ = kBreak;
    return true;
  }
  if (count_ == 0) {
    count_ = 1, ws_ = c == '\r' ? kBreak | kCR : brk ? kBreak : 0;
    return true;
  }
  if (brk || !(ws_ & kBreak)) return false;  // a second line break, or more than one space inline
  return ++count_ <= kMaxIndent + 1;
}

bool JsonRecognizer::begin_value(uint8_t c) {
  switch (c) {
    case '{': return open(true);
    case '[': return open(false);
    case '"': mode_ = Mode::String, key_ = false, scalar(JsonEvent::String); return true;
    case 't': mode_ = Mode::Literal, literal_ = 0, count_ = 1, scalar(JsonEvent::True); return true;
    case 'f': mode_ = Mode::Literal, literal_ = 1, count_ = 1, scalar(JsonEvent::False); return true;
    case 'n': mode_ = Mode::Literal, literal_ = 2, count_ = 1, scalar(JsonEvent::Null); return true;
    default:
      if (c != '-' && !is_digit(c)) return false;
      mode_ = Mode::Number, count_ = 1, scalar(JsonEvent::Number);
      num_ = c == '-' ? Num::Minus : c == '0' ? Num::Zero : Num::Int;
      return true;
  }
}

bool JsonRecognizer::open(bool object) {
  if (depth_ >= kMaxDepth) return false;
  objects_ = object ? objects_ | (uint64_t(1) << depth_) : objects_ & ~(uint64_t(1) << depth_);
  ++depth_;
  mode_ = object ? Mode::KeyOrClose : Mode::ValueOrClose;
  event_.what = JsonEvent::Open, event_.kind = object ? JsonEvent::Object : JsonEvent::Array;
  return true;
}

bool JsonRecognizer::close(bool object) {
  if (depth_ == 0 || top_is_object() != object) return false;
  --depth_;
  after_value();
  event_.what = JsonEvent::Close, event_.kind = object ? JsonEvent::Object : JsonEvent::Array;
  return true;
}

bool JsonRecognizer::string_byte(uint8_t c) {
  if (utf8_need_) {  // a continuation byte, in the range the lead byte allows
    if (c < utf8_lo_ || c > utf8_hi_) return false;
    --utf8_need_, utf8_lo_ = 0x80, utf8_hi_ = 0xBF;
    return true;
  }
  if (c == '"') {
    if (key_) mode_ = Mode::Colon, count_ = 0, ws_ = 0, event_.what = JsonEvent::KeyEnd;
    else after_value(), event_.what = JsonEvent::ScalarEnd;
    return true;
  }
  if (c == '\\') {
    mode_ = Mode::Escape;
    return true;
  }
  if (c < 0x20) return false;  // control characters must be escaped
  if (c < 0x80) return true;
  // A UTF-8 lead byte (Unicode's table of well-formed sequences: no overlong forms, no surrogates, <= U+10FFFF).
  if (c >= 0xC2 && c <= 0xDF) utf8_need_ = 1;
  else if (c >= 0xE0 && c <= 0xEF) utf8_need_ = 2, utf8_lo_ = c == 0xE0 ? 0xA0 : 0x80, utf8_hi_ = c == 0xED ? 0x9F : 0xBF;
  else if (c >= 0xF0 && c <= 0xF4) utf8_need_ = 3, utf8_lo_ = c == 0xF0 ? 0x90 : 0x80, utf8_hi_ = c == 0xF4 ? 0x8F : 0xBF;
  else return false;
  return true;
}

// A number ends at the first byte that cannot continue it, which is then read as what follows a value.
bool JsonRecognizer::number_byte(uint8_t c) {
  // A state that is not yet a number ('-', '.', 'e', the exponent's sign) must leave room for the digit it needs:
  // otherwise the length bound would leave no way to finish the object.
  auto next = [&](Num n) {
    num_ = n;
    const bool whole = n == Num::Zero || n == Num::Int || n == Num::Frac || n == Num::Exp;
    return ++count_ <= kMaxNumber - (whole ? 0 : 1);
  };
  switch (num_) {
    case Num::Minus:
      if (c == '0') return next(Num::Zero);
      return is_digit(c) && next(Num::Int);
    case Num::Int:
      if (is_digit(c)) return next(Num::Int);
      [[fallthrough]];
    case Num::Zero:
      if (c == '.') return next(Num::Dot);
      if (c == 'e' || c == 'E') return next(Num::E);
      break;
    case Num::Dot: return is_digit(c) && next(Num::Frac);
    case Num::Frac:
      if (is_digit(c)) return next(Num::Frac);
      if (c == 'e' || c == 'E') return next(Num::E);
      break;
    case Num::E:
      if (c == '+' || c == '-') return next(Num::ESign);
      [[fallthrough]];
    case Num::ESign: return is_digit(c) && next(Num::Exp);
    case Num::Exp:
      if (is_digit(c)) return next(Num::Exp);
      break;
  }
  // Zero, Int, Frac and Exp are complete numbers: the byte belongs to what follows.
  after_value();
  event_.number_end = true;  // (a number is never the root, so this is After)
  return structural(c);
}

std::shared_ptr<const TokenTables> TokenTables::of(const Tokenizer& tok, int32_t vocab, std::string_view added_name,
                                                   const std::function<bool(std::string_view)>& added_as_text) {
  const std::string key = fmt::format("json-mode tables, vocabulary {}{}{}", vocab, added_name.empty() ? "" : ", added text: ",
                                      added_name);
  return TokenizerCache::get_as<TokenTables>(tok, key, [&] {
    auto t = std::make_shared<TokenTables>();
    t->bytes.resize(size_t(vocab));
    t->spaced = tok.spaced_tokens();
    const int32_t known = std::min(vocab, tok.vocab_size());
    for (int32_t id = 0; id < known; ++id) {
      // Chat markers (added tokens, special or not) are never text of the object, but for those asked for.
      std::string& b = t->bytes[size_t(id)];
      b = tok.token_bytes(id);
      if (tok.is_added(id) && !(added_as_text && !b.empty() && added_as_text(b))) {
        b.clear();
        continue;
      }
      if (b.empty()) continue;
      if (b.size() == 1) t->one_byte[uint8_t(b[0])].push_back(id);
      if (plain_string_text(b)) {
        t->plain.push_back(id);
        t->plain_max_chars = std::max(t->plain_max_chars, int64_t(std::count_if(b.begin(), b.end(), [](char c) {
                                                           return (uint8_t(c) & 0xC0) != 0x80;
                                                         })));
      } else {
        t->not_plain.push_back(id);
      }
    }
    // (a counting sort of the longer tokens by their first two bytes)
    auto key = [&](int32_t id) { return size_t(uint8_t(t->bytes[size_t(id)][0])) * 256 + uint8_t(t->bytes[size_t(id)][1]); };
    t->two_at.assign(256 * 256 + 1, 0);
    for (int32_t id = 0; id < known; ++id)
      if (t->bytes[size_t(id)].size() >= 2) ++t->two_at[key(id) + 1];
    for (size_t k = 0; k < 256 * 256; ++k) t->two_at[k + 1] += t->two_at[k];
    t->two_ids.resize(t->two_at.back());
    std::vector<uint32_t> fill(t->two_at.begin(), t->two_at.end() - 1);
    for (int32_t id = 0; id < known; ++id)
      if (t->bytes[size_t(id)].size() >= 2) t->two_ids[fill[key(id)]++] = id;
    return t;
  });
}

namespace {
// What the errors call a mask over R.
template <class R>
constexpr const char* mask_name() {
  if constexpr (std::is_same_v<R, ToolCallRecognizer>) return "tool calls";
  if constexpr (std::is_same_v<R, SchemaRecognizer>) return "structured output";
  return "JSON mode";
}

// Whether the output may end in state s: where R says so (ToolCallRecognizer before its block), else once complete.
template <class R>
bool may_end(const R& s) {
  if constexpr (requires { s.may_end(); }) return s.may_end();
  return s.complete();
}
}  // namespace

template <class R>
TokenMask<R>::TokenMask(const Tokenizer& tok, int32_t vocab, std::vector<int32_t> ends, R start,
                        std::shared_ptr<const TokenTables> tables)
    : t_(tables ? std::move(tables) : TokenTables::of(tok, vocab)), is_end_(size_t(vocab), 0), state_(std::move(start)) {
  PLUMB_CHECK(!ends.empty(), "{} needs a token that ends the generation (EOS or a stop token)", mask_name<R>());
  for (int32_t id : ends) {
    PLUMB_CHECK(id >= 0 && id < vocab, "{}: end token {} is outside the vocabulary [0, {})", mask_name<R>(), id, vocab);
    if (!is_end_[size_t(id)]) ends_.push_back(id);
    is_end_[size_t(id)] = 1;
  }
}

template <class R>
bool TokenMask<R>::passes(int32_t id, const R& from, size_t skip) const {
  R s = from;
  if (!s.feed(std::string_view(t_->bytes[size_t(id)]).substr(skip))) return false;
  // A tokenizer that puts a space before each next token: the text must be able to take it (not "tr", "-" or "1.").
  return !t_->spaced || s.complete() || s.feed(uint8_t(' '));
}

template <class R>
bool TokenMask<R>::allows(int32_t id) const {
  if (id < 0 || size_t(id) >= is_end_.size()) return false;
  if (state_.complete()) return is_end_[size_t(id)];
  if (is_end_[size_t(id)]) return may_end(state_);
  if (t_->bytes[size_t(id)].empty()) return false;
  R s;
  return next_start(s) && passes(id, s);
}

void OutputMask::apply(std::span<float> logits) const {
  PLUMB_CHECK(logits.size() == vocab(), "token mask: {} logits for a vocabulary of {}", logits.size(), vocab());
  std::vector<uint32_t> bits(token_bits_words(int64_t(logits.size())), 0);
  allowed(bits);
  mask_logits(logits, bits);
}

template <class R>
void TokenMask<R>::allowed(std::span<uint32_t> bits) const {
  PLUMB_CHECK(bits.size() == token_bits_words(int64_t(is_end_.size())), "{}: a mask of {} words for a vocabulary of {}",
              mask_name<R>(), bits.size(), is_end_.size());
  const TokenTables& t = *t_;
  // (every id is set at most once below: the lists and the two-byte buckets are disjoint)
  auto keep = [&](size_t id) { set_token_bit(bits, id); };
  size_t kept = 0;
  R s;
  if (state_.complete()) {
    for (size_t i = 0; i < is_end_.size(); ++i)
      if (is_end_[i]) keep(i), ++kept;
  } else if (!next_start(s)) {
    // (no token can start here: the check below names it)
  } else if (s.between_string_chars(t.plain_max_chars)) {  // (~96 % of a byte-level vocabulary is plain text)
    for (int32_t id : t.plain) keep(size_t(id));
    kept += t.plain.size();
    for (int32_t id : t.not_plain)
      if (passes(id, s)) keep(size_t(id)), ++kept;
    // (the plain tokens R names, tried after all)
    auto recheck = [&](int32_t id) {
      if (token_bit(bits, size_t(id)) && !passes(id, s)) clear_token_bit(bits, size_t(id)), --kept;
    };
    if constexpr (requires { s.recheck_first_byte(); }) {
      if (const int first = s.recheck_first_byte(); first >= 0) {  // (the tokens that begin with it: its buckets)
        for (int32_t id : t.one_byte[size_t(first)]) recheck(id);
        for (uint32_t i = t.two_at[size_t(first) * 256]; i < t.two_at[size_t(first) * 256 + 256]; ++i) recheck(t.two_ids[i]);
      }
    }
    if constexpr (requires { s.recheck_ids(); })
      for (int32_t id : s.recheck_ids()) recheck(id);
  } else {
    // Only the tokens whose first two bytes can come next are tried whole (in most states a few of the 65536 pairs:
    // after a value, the many tokens " word" stop at their second byte without being tried).
    for (int b = 0; b < 256; ++b) {
      R one = s;
      if (!one.feed(uint8_t(b))) continue;
      for (int32_t id : t.one_byte[size_t(b)])
        if (passes(id, s)) keep(size_t(id)), ++kept;
      for (int c = 0; c < 256; ++c) {
        const size_t k = size_t(b) * 256 + size_t(c);
        if (t.two_at[k] == t.two_at[k + 1]) continue;
        R two = one;
        if (!two.feed(uint8_t(c))) continue;
        for (uint32_t i = t.two_at[k]; i < t.two_at[k + 1]; ++i)
          if (passes(t.two_ids[i], two, 2)) keep(size_t(t.two_ids[i])), ++kept;
      }
    }
  }
  if (!state_.complete()) {  // (an end token is the end only: the tables keep its bytes, the mask takes it out...)
    for (int32_t id : ends_)
      if (token_bit(bits, size_t(id))) clear_token_bit(bits, size_t(id)), --kept;
    if (may_end(state_))  // (...or lets it through as the end, where the output may end before it is complete)
      for (int32_t id : ends_) set_token_bit(bits, size_t(id)), ++kept;
  }
  PLUMB_CHECK(kept > 0, "{}: no token of the vocabulary can continue the output", mask_name<R>());
}

template <class R>
void TokenMask<R>::accept(int32_t id) {
  PLUMB_CHECK(allows(id), "{}: token {} cannot continue the output", mask_name<R>(), id);
  if (!state_.complete() && !is_end_[size_t(id)]) {  // (an end token ends the output: nothing to feed)
    R s;
    next_start(s);
    s.feed(t_->bytes[size_t(id)]);
    state_ = std::move(s);
  }
  first_ = false;
}

template class TokenMask<JsonRecognizer>;
template class TokenMask<SchemaRecognizer>;
template class TokenMask<ToolCallRecognizer>;

}  // namespace plumb::gen
