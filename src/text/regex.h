// PCRE2-backed regexes for tokenizer.json patterns: Oniguruma (Ruby syntax, as the Rust `tokenizers` crate
// compiles them) translated to PCRE2, and matched with onig's find_iter semantics.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

struct pcre2_real_code_8;  // opaque PCRE2 pattern (keeps pcre2.h out of this header)

namespace plumb::text {

// One piece of a split: bytes [begin, end) of the subject, and whether the pattern matched it.
struct Span {
  size_t begin;
  size_t end;
  bool match;
};

class Regex {
 public:
  // Compiles an Oniguruma pattern; `what` names the file and field for error messages.
  static Regex onig(std::string_view pattern, const std::string& what);
  // A pattern matching exactly the string s (Split's {"String": ...} form).
  static Regex literal(std::string_view s, const std::string& what);

  // The PCRE2 pattern actually compiled (after translation); for diagnostics and tests.
  const std::string& pcre2_pattern() const { return translated_; }

  // hf's Pattern::find_matches: spans covering all of `text` in order, alternating gaps (match=false) and
  // matches; an empty text gives one empty gap. `text` must be valid UTF-8.
  void find_matches(std::string_view text, std::vector<Span>& out) const;

 private:
  static Regex compile(std::string translated, const std::string& what);
  std::shared_ptr<pcre2_real_code_8> code_;
  std::string translated_;
};

// Exposed for tests: the Oniguruma -> PCRE2 rewrite (throws plumb::Error for constructs with no equivalent).
std::string translate_onig_to_pcre2(std::string_view pattern, const std::string& what);

}  // namespace plumb::text
