// Structured outputs (GenerateOptions::format = OutputFormat::JsonSchema): a JSON Schema compiled to the subset a
// byte-level recognizer can hold generation to, and that recognizer (JsonRecognizer's syntax plus the schema's
// constraints), which json_mode.h's token mask runs like JSON mode's.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "generate/json_mode.h"

namespace plumb::gen {

// One schema, compiled. Types are a set (a "type" array, or what an enum's values are); anyOf, oneOf (compile() checks
// that its branches cannot overlap) and $ref are resolved when a value starts.
struct SchemaNode {
  enum Type : uint8_t { Obj = 1, Arr = 2, Str = 4, Int = 8, Num = 16, Bool = 32, Null = 64, Any = 127 };
  uint8_t types = Any;
  std::vector<const SchemaNode*> any_of;  // non-empty: the value matches one of these (the node's other fields unused)
  const SchemaNode* ref = nullptr;         // $ref: the value matches that node
  // Objects: each property's key as the model must write it (JSON-escaped as nlohmann writes it, without the quotes).
  std::vector<std::pair<std::string, const SchemaNode*>> props;
  uint64_t required = 0;                  // bits over props
  const SchemaNode* additional = nullptr;  // the schema of other keys' values; nullptr: no other key
  // Arrays.
  const SchemaNode* items = nullptr;  // nullptr: any value
  int64_t min_items = 0, max_items = -1;
  // Strings: their length in code points, as JSON Schema counts it (an escape, or an escaped surrogate pair, is one).
  int64_t min_length = 0, max_length = -1;
  // Integers (nodes whose numbers are integers only): minimum / maximum / exclusiveMinimum / exclusiveMaximum as the
  // inclusive integer bounds they make (minimum 0.5 is lo "1", exclusiveMaximum 10 hi "9"), in JSON's spelling ("-12");
  // empty: none.
  std::string int_lo, int_hi;
  bool int_bounded() const { return !int_lo.empty() || !int_hi.empty(); }
  // enum / const: the values' texts as nlohmann writes them (compact); empty: no enum.
  std::vector<std::string> enum_texts;
  bool sat = false;  // some finite instance exists (JsonSchema::compile's fixpoint; unions skip nodes without one)
  // The index of the property whose key is written `key`; props.size() when none is.
  size_t prop(std::string_view key) const {
    size_t i = 0;
    while (i < props.size() && props[i].first != key) ++i;
    return i;
  }
  // What keys an object of this node can still take (after `seen`, its properties written): property i, or another key
  // (additional), only where its value can be written (a schema with a finite instance), or the value could not be.
  bool takes_prop(size_t i, uint64_t seen) const { return !((seen >> i) & 1) && props[i].second->sat; }
  bool takes_other_keys() const { return additional && additional->sat; }
};

// A compiled schema. Supported: type (one or an array), properties, required, additionalProperties (true, false or a
// schema), items (a schema), minItems, maxItems, minLength, maxLength, minimum / maximum / exclusiveMinimum /
// exclusiveMaximum on integers, enum and const of scalars, anyOf, oneOf whose branches cannot overlap
// (other types, or objects told apart by a required property's const / enum values: pydantic's discriminated unions),
// allOf of one schema, $ref to "#", "#/$defs/..." or "#/definitions/...", true / {} (any value), $id at the root only.
// A keyword that constrains values and is not among these (pattern, minimum, uniqueItems, not, ...) is refused by name
// (plumb::Error "... at <path>"), as a constraint plumb would not hold the output to; other keywords are annotations,
// as JSON Schema 2020-12 has it (title, description, examples, x-...). Also refused: a cycle of $ref / anyOf that
// reads no byte, a union of more than 8 branches, an enum integer beyond 2^53 as a float, a root without a finite
// instance that is an object. At most 64 properties per object.
class JsonSchema {
 public:
  static std::shared_ptr<const JsonSchema> compile(std::string_view schema_text);
  const SchemaNode* root() const { return root_; }
  const SchemaNode* any() const { return any_; }
  ~JsonSchema();

 private:
  JsonSchema() = default;
  struct Compiler;
  std::vector<std::unique_ptr<SchemaNode>> nodes_;
  const SchemaNode* root_ = nullptr;
  const SchemaNode* any_ = nullptr;
};

// The bytes of one value that a compiled schema allows, read as JsonRecognizer reads its syntax: feed() is false at the
// first byte no valid instance can have there. A union is followed as alternative states (at most kMaxAlternatives
// at a time, duplicates merged; past that the later ones are dropped, which keeps the output valid). A key written
// with escapes counts as the property it spells; where no other key may come, keys must be written as the schema's
// property names are (nlohmann's escaping); enum values as nlohmann writes them. Copied to try a token's bytes (the
// containers' frames are shared between copies).
class SchemaRecognizer {
 public:
  static constexpr int kMaxAlternatives = 8;
  SchemaRecognizer() = default;  // (no schema: takes nothing; JsonMask's default state)
  explicit SchemaRecognizer(std::shared_ptr<const JsonSchema> schema);
  // (copies take the live alternatives only: a mask copies the state for every token it tries)
  SchemaRecognizer(const SchemaRecognizer& o) : schema_(o.schema_), syntax_(o.syntax_), n_(o.n_) {
    std::copy_n(o.alts_.begin(), n_, alts_.begin());
  }
  SchemaRecognizer& operator=(const SchemaRecognizer& o) {
    if (this == &o) return *this;
    schema_ = o.schema_, syntax_ = o.syntax_;
    std::copy_n(o.alts_.begin(), o.n_, alts_.begin());
    for (int i = o.n_; i < n_; ++i) alts_[size_t(i)] = Alt{};
    n_ = o.n_;
    return *this;
  }
  SchemaRecognizer(SchemaRecognizer&&) = default;
  SchemaRecognizer& operator=(SchemaRecognizer&&) = default;
  bool feed(uint8_t c);
  bool feed(std::string_view bytes);
  bool complete() const { return syntax_.complete() && n_ > 0; }
  // Between the characters of a string whose text the schema leaves free (no enum; at least longest_plain characters
  // left to its maxLength; a key where any key may come): where plain text of up to that many characters passes (the
  // mask's shortcut).
  bool between_string_chars(int64_t longest_plain = INT64_MAX) const;
  bool in_string() const { return syntax_.in_string(); }
  int depth() const { return syntax_.depth(); }  // the containers open

  struct Frame;  // an open container, shared by the states that hold it

 private:
  // One alternative: the open containers, what the next value must match, and the text of a key or of a scalar
  // with an enum, as far as it has come.
  struct Alt {
    enum Phase : uint8_t { Value, Key, InKey, InScalar, After };
    std::shared_ptr<const Frame> top;
    const SchemaNode* value = nullptr;   // Value: the next value's schema; InScalar: the scalar's (resolved) node
    JsonEvent::Kind kind = JsonEvent::String;  // InScalar: what the scalar is
    Phase phase = Value;
    std::string text;                    // InKey: the key so far; InScalar with an enum: the value's text so far
    // InScalar, a string: its code points so far (minLength / maxLength), where an escape is (kAfterBackslash: its
    // letter next; 1-4: \u's hex digits left), the \u value so far, and whether the last character was an escaped
    // high surrogate (an escaped low one right after it is the same code point).
    int64_t chars = 0;
    uint8_t esc = 0;
    uint16_t u = 0;
    bool high = false;
    bool pending = false;  // at maxLength, an escape that must be that high surrogate's low half (string_byte)
    static constexpr uint8_t kAfterBackslash = 5;
    void clear_scalar() { text.clear(), chars = 0, esc = 0, u = 0, high = false, pending = false; }
    // A value of the container has ended (a scalar's last byte, a container's close).
    void after_value() { phase = After, clear_scalar(), value = nullptr, kind = JsonEvent::String; }
    bool operator==(const Alt& o) const;
  };
  using Alts = std::array<Alt, kMaxAlternatives>;
  void step(const Alt& a, uint8_t c, const JsonEvent& ev, Alts& out, int& m) const;  // a's successors
  void begin_value(Alt a, uint8_t c, const JsonEvent& ev, Alts& out, int& m) const;
  bool scalar_byte(Alt& a, uint8_t c) const;
  static bool string_byte(Alt& a, uint8_t c);  // a byte inside a string (not its quotes): false past maxLength
  static bool end_scalar(const Alt& a);
  static bool number_may_go_on(const SchemaNode* n, std::string_view text);  // an integer's text so far, within its bounds
  bool key_prefix_ok(const Alt& a) const;
  static void push(Alts& out, int& m, Alt&& x);  // (duplicates merged)

  std::shared_ptr<const JsonSchema> schema_;
  JsonRecognizer syntax_;
  Alts alts_{};
  int n_ = 0;
};

using SchemaMask = TokenMask<SchemaRecognizer>;
extern template class TokenMask<SchemaRecognizer>;

}  // namespace plumb::gen
