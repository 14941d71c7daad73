// OutputFormat::ToolCalls (plumb serve's tool_choice "required" or a named function): a byte-level recognizer of one
// DSML tool-call block as DeepSeek-V4's chat encoder renders an assistant turn's calls (dsml::render_calls), each
// invoke naming an allowed function and its parameters an instance of that function's `parameters` schema, and the
// token mask that runs it (json_mode.h's TokenMask).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "generate/json_schema.h"

namespace plumb::gen {

// The functions a block may call, compiled once per generation.
struct ToolCallSpec {
  struct Tool {
    std::string name;
    std::shared_ptr<const JsonSchema> params;  // what the call's arguments object must be
  };
  std::vector<Tool> tools;
  bool parallel = true;  // more than one invoke in the block
  // What comes before the block (ToolCallOptions): a thinking-mode reply's reasoning up to "</think>"; and with
  // `required` false, free text in which the block's tag begins the block (a reply may then end without one).
  bool thinking = false, required = true;
  // One line per tool whose parameters could not be held (a keyword plumb does not support, a property name DSML
  // cannot write): its arguments are held to be a JSON object only. A tool with "strict": true is refused instead.
  std::vector<std::string> loose;
  // tools_json: OpenAI's tools array. names: the functions that may be called (empty: every tool). Throws plumb::Error
  // naming the tool at fault (tools[i]: no name, a name DSML cannot write, a strict tool's schema) or a name not found.
  static std::shared_ptr<const ToolCallSpec> build(std::string_view tools_json, const std::vector<std::string>& names,
                                                   bool parallel, bool thinking = false, bool required = true);
};

// Reads one block, a byte at a time, as dsml::parse_calls reads it back and as render_calls writes it (after a
// thinking reply's reasoning and "</think>", and with required false after free text, where the block begins at its
// tag "<｜DSML｜tool_calls>", as parse_reply finds it):
//   "\n\n<｜DSML｜tool_calls>\n" INVOKE ("\n" INVOKE)* "\n</｜DSML｜tool_calls>"
//   INVOKE: "<｜DSML｜invoke name=\"F\">\n" (PARAM "\n")* "</｜DSML｜invoke>", or with no parameter "...\">\n\n</｜DSML｜invoke>"
//   PARAM:  "<｜DSML｜parameter name=\"K\" string=\"true\">" raw text "</｜DSML｜parameter>", or string="false" and a JSON
//           value (not a string).
// The arguments each invoke stands for, {"K": value, ...}, go byte by byte to a SchemaRecognizer of F's parameters
// (raw text escaped as nlohmann escapes it), so the schema decides keys, values, required keys, lengths and bounds; a
// key never comes twice (parse_calls refuses that). A value ends at the first "</｜DSML｜parameter>" (as parse_calls
// reads it), so those bytes are held back until they are known to be the close or text; the close may begin only
// where the value can end. feed() is false at the first byte that no such block can have there; every state it takes
// can be completed (no dead end), but for a schema whose only values hold the close's text. A JSON value is held to
// what nlohmann reads (parse_calls): no lone surrogate escape, no number beyond a double.
class ToolCallRecognizer {
 public:
  ToolCallRecognizer() = default;  // (no spec: takes nothing)
  // tried: the plain-text tokens of the vocabulary the mask's shortcut must try (recheck_ids(): those that hold a whole
  // "</｜DSML｜parameter>", a surrogate's \u escape or an escaped quote; tool_call_mask finds them).
  explicit ToolCallRecognizer(std::shared_ptr<const ToolCallSpec> spec, std::vector<int32_t> tried = {});
  bool feed(uint8_t c);
  bool feed(std::string_view bytes);
  bool complete() const { return phase_ == Phase::Done; }
  // The reply may end here (TokenMask lets the end tokens through beside the text): the block is whole, or (required
  // false) no block has begun.
  bool may_end() const { return complete() || (!spec_->required && (phase_ == Phase::Reasoning || phase_ == Phase::Text)); }
  // Where plain text passes (TokenMask's shortcut, with the two lists below tried after all): inside a free string of
  // a value (with bytes of the close held back: where they would be text), or of a key that may be any key.
  bool between_string_chars(int64_t longest_plain = INT64_MAX) const;
  // Held back bytes of the close: the byte that goes on with it (the plain tokens that begin with it might end the
  // value, and must be tried); else -1.
  int recheck_first_byte() const;
  const std::vector<int32_t>& recheck_ids() const { return *tried_; }

 private:
  // Reasoning: a thinking reply's, up to "</think>"; Text: free text before the block (required false); Choice: one of
  // a point's fixed texts comes next; Name: a function's name; Key: a parameter's name; Value: its value.
  enum class Phase : uint8_t { Reasoning, Text, Choice, Name, Key, Value, Done };
  // The points where fixed text comes: the block's opening, after an invoke's header, after a parameter, a key's
  // string="..." attribute, after an invoke. Each has at most two texts (choices(p)), told apart by their bytes.
  enum class Point : uint8_t { Open, Head, AfterParam, Kind, AfterInvoke };
  bool enter(Point p);  // false where no text of p can come (the arguments can take none of them)
  bool choose(uint8_t c);
  bool name_byte(uint8_t c);
  bool key_byte(uint8_t c);
  bool value_byte(uint8_t c);
  bool free_byte(uint8_t c);       // Reasoning, Text: watching for the text that ends them (free_end())
  std::string_view free_end() const;
  bool content(uint8_t c);         // a byte of the value's text, to the arguments (raw text escaped)
  bool content(std::string_view bytes);
  bool json_text(uint8_t c);       // a byte of a JSON value: what nlohmann (parse_calls) reads as the schema does
  bool value_may_end() const;      // the value could end here, and the invoke go on after it
  bool args_take_key() const;      // another parameter can begin
  bool args_take_close() const;    // the arguments can end

  std::shared_ptr<const ToolCallSpec> spec_;
  SchemaRecognizer args_;  // the current invoke's arguments as the JSON object they stand for
  Phase phase_ = Phase::Done;
  Point point_ = Point::Open;
  uint8_t alts_ = 0;   // Choice: bit i, text i of the point is still possible
  uint32_t at_ = 0;    // Choice: the bytes of the point's text matched; Reasoning, Text: of free_end()
  std::string text_;   // Name: the function's name so far; Key: the key so far
  std::shared_ptr<const std::vector<std::string>> keys_;  // the current invoke's keys (shared between copies)
  bool raw_ = false;       // Value: string="true" (raw text), else a JSON value
  bool begun_ = false;     // Value, JSON: its first byte other than whitespace has come
  uint8_t held_ = 0;       // Value: bytes of the parameter's close matched and held back (they may still be text)
  // Value, JSON (json_text): a string's escape so far (0: none; 1: after the backslash; 2-5: \u's hex digits read),
  // the \u's value so far, whether a high surrogate's escape must come next, and the number being read.
  uint8_t esc_ = 0;
  uint16_t u_ = 0;
  bool need_low_ = false;
  std::string number_;
  std::shared_ptr<const std::vector<int32_t>> tried_ = std::make_shared<const std::vector<int32_t>>();
};

using ToolCallMask = TokenMask<ToolCallRecognizer>;
extern template class TokenMask<ToolCallRecognizer>;

// The mask of one generation over `spec` (the tables with the DSML tags a tokenizer holds as added tokens as text).
std::unique_ptr<OutputMask> tool_call_mask(const Tokenizer& tok, int32_t vocab, std::vector<int32_t> ends,
                                           std::shared_ptr<const ToolCallSpec> spec);

// The text every block over `spec` holds whatever its arguments (the opening for each function, the tags): a stop
// string or a stop token's text inside one of these would end every such reply early.
std::vector<std::string> tool_call_fixed_texts(const ToolCallSpec& spec);

}  // namespace plumb::gen
