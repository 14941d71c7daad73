// Oniguruma -> PCRE2 translation and onig-compatible match iteration.
//
// What differs between onig (Ruby syntax, UTF-8, as hf tokenizers builds it) and PCRE2 with UTF|UCP, and how
// each difference is handled:
//   \s, \S   onig: Unicode White_Space (25 code points). PCRE2 UCP adds U+180E. Rewritten to an explicit
//            class; \S inside a bracket stays PCRE2's (differs on U+180E only).
//   \h, \H   onig/Ruby: hex digit. PCRE2: horizontal space. Rewritten to [0-9A-Fa-f].
//   \uHHHH   onig only. Rewritten to \x{HHHH}.
//   (?m)     Ruby's m is "dot matches newline" = PCRE2's (?s). Rewritten.
//   ^ $      always line anchors in Ruby: compiled with PCRE2_MULTILINE, newline = LF.
//   &&, [[  class intersection / nested classes: onig only; refused with an error.
//   \p{..}   same names. PCRE2 10.42 has Unicode 14 tables, hf's onig newer ones: for the general categories
//            in unicode_delta.inc the code points onig has and PCRE2 lacks are added to the class (probed from
//            hf tokenizers 0.23.2 by tools/tokenizer/gen_unicode_delta.sh). Not patched: negated properties
//            inside brackets, scripts, and U+1171E (Mn in PCRE2's tables, Mc in onig's).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/regex.h"

#include <pcre2.h>

#include "core/error.h"
#include "text/utf8.h"

namespace plumb::text {

namespace {

// onig's \s: Unicode White_Space, as PCRE2 class items.
constexpr const char* kWhiteSpaceItems =
    "\\t\\n\\x0B\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";
constexpr const char* kHexItems = "0-9A-Fa-f";

struct CategoryDelta {
  const char* name;
  const char* extra;  // PCRE2 class items
};
constexpr CategoryDelta kDeltas[] = {
#include "text/unicode_delta.inc"
};

const char* delta_for(std::string_view name) {
  for (const auto& d : kDeltas)
    if (name == d.name) return *d.extra ? d.extra : nullptr;
  return nullptr;
}

bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

size_t char_len(std::string_view s, size_t i) {
  const size_t n = utf8_valid_len(s, i);
  return n ? n : 1;
}

// Per-thread PCRE2 match state: regexes are shared between threads, match data and JIT stacks are not.
struct MatchState {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mctx = nullptr;
  pcre2_jit_stack* jit = nullptr;
  MatchState() {
    md = pcre2_match_data_create(1, nullptr);
    mctx = pcre2_match_context_create(nullptr);
    jit = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (jit) pcre2_jit_stack_assign(mctx, nullptr, jit);
  }
  ~MatchState() {
    pcre2_match_data_free(md);
    pcre2_match_context_free(mctx);
    if (jit) pcre2_jit_stack_free(jit);
  }
};

MatchState& match_state() {
  thread_local MatchState st;
  return st;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

std::string translate_onig_to_pcre2(std::string_view p, const std::string& what) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < p.size();) {
    const char c = p[i];
    if (c == '\\') {
      if (i + 1 >= p.size()) fail("{}: regex ends with a lone backslash", what);
      const char e = p[i + 1];
      // Appends "[" items "]" (or "[^" ... when negated) outside a bracket, the bare items inside one.
      const auto put_class = [&](const char* items, bool negate) {
        if (!in_class) out += negate ? "[^" : "[";
        out += items;
        if (!in_class) out += ']';
      };
      if (e == 's') {
        put_class(kWhiteSpaceItems, false);
      } else if (e == 'S' && !in_class) {
        put_class(kWhiteSpaceItems, true);
      } else if (e == 'h') {
        put_class(kHexItems, false);
      } else if (e == 'H') {
        if (in_class) fail("{}: \\H inside a bracket has no PCRE2 equivalent", what);
        put_class(kHexItems, true);
      } else if ((e == 'p' || e == 'P') && i + 2 < p.size() && p[i + 2] == '{' &&
                 p.find('}', i + 3) != std::string_view::npos) {
        // Unicode property: patch in the code points newer Unicode versions added (see the file comment).
        const size_t close = p.find('}', i + 3);
        std::string_view name = p.substr(i + 3, close - i - 3);
        bool negated = e == 'P';
        if (!name.empty() && name[0] == '^') {
          negated = !negated;
          name.remove_prefix(1);
        }
        const char* extra = delta_for(name);
        if (!extra || (negated && in_class)) {
          out.append(p.substr(i, close + 1 - i));
        } else {
          if (!in_class) out += negated ? "[^" : "[";
          out += "\\p{";
          out.append(name);
          out += '}';
          out += extra;
          if (!in_class) out += ']';
        }
        i = close + 1;
        continue;
      } else if (e == 'u' && i + 5 < p.size() && is_hex(p[i + 2]) && is_hex(p[i + 3]) && is_hex(p[i + 4]) &&
                 is_hex(p[i + 5])) {
        out += "\\x{";
        out.append(p.substr(i + 2, 4));
        out += '}';
        i += 6;
        continue;
      } else {
        out += '\\';
        out.append(p.substr(i + 1, char_len(p, i + 1)));
        i += 1 + char_len(p, i + 1);
        continue;
      }
      i += 2;
      continue;
    }
    if (in_class) {
      if (c == ']') {
        in_class = false;
      } else if (c == '[') {
        if (i + 1 < p.size() && p[i + 1] == ':') {  // POSIX bracket [:name:], same in both
          const size_t close = p.find(":]", i + 2);
          if (close == std::string_view::npos) fail("{}: unterminated POSIX bracket in regex", what);
          out.append(p.substr(i, close + 2 - i));
          i = close + 2;
          continue;
        }
        fail("{}: nested character class at offset {} is not supported (Oniguruma-only syntax)", what, i);
      } else if (c == '&' && i + 1 < p.size() && p[i + 1] == '&') {
        fail("{}: character class intersection '&&' at offset {} is not supported", what, i);
      }
      out.append(p.substr(i, char_len(p, i)));
      i += char_len(p, i);
      continue;
    }
    if (c == '[') {
      in_class = true;
      out += '[';
      ++i;
      if (i < p.size() && p[i] == '^') out += p[i++];
      if (i < p.size() && p[i] == ']') out += p[i++];  // a leading ']' is a literal in both dialects
      continue;
    }
    if (c == '(' && i + 1 < p.size() && p[i + 1] == '?') {
      // Option groups (?imx-imx) / (?imx-imx:...): Ruby's m is PCRE2's s.
      size_t j = i + 2;
      while (j < p.size() && (p[j] == 'i' || p[j] == 'm' || p[j] == 'x' || p[j] == '-')) ++j;
      if (j > i + 2 && j < p.size() && (p[j] == ':' || p[j] == ')')) {
        out += "(?";
        for (size_t k = i + 2; k < j; ++k) out += p[k] == 'm' ? 's' : p[k];
        i = j;
        continue;
      }
    }
    out.append(p.substr(i, char_len(p, i)));
    i += char_len(p, i);
  }
  if (in_class) fail("{}: unterminated character class in regex", what);
  return out;
}

Regex Regex::onig(std::string_view pattern, const std::string& what) {
  return compile(translate_onig_to_pcre2(pattern, what), what);
}

Regex Regex::literal(std::string_view s, const std::string& what) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    const bool alnum = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (c < 0x80 && !alnum) out += '\\';  // backslash + non-alphanumeric is always that character in PCRE2
    out += char(c);
  }
  return compile(std::move(out), what);
}

Regex Regex::compile(std::string translated, const std::string& what) {
  pcre2_compile_context* cctx = pcre2_compile_context_create(nullptr);
  pcre2_set_newline(cctx, PCRE2_NEWLINE_LF);
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &err, &off, cctx);
  pcre2_compile_context_free(cctx);
  if (!code) fail("{}: cannot compile regex (as PCRE2: {}) at offset {}: {}", what, translated, off, pcre2_message(err));
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // failure is fine: the interpreter runs instead
  Regex r;
  r.code_ = std::shared_ptr<pcre2_real_code_8>(code, pcre2_code_free);
  r.translated_ = std::move(translated);
  return r;
}

void Regex::find_matches(std::string_view text, std::vector<Span>& out) const {
  if (text.empty()) {
    out.push_back({0, 0, false});
    return;
  }
  MatchState& st = match_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t prev = 0;          // end of the last emitted span
  size_t search_from = 0;   // onig's last_end
  bool have_last = false;   // onig's last_match_end, as (have_last, last_match_end)
  size_t last_match_end = 0;
  while (search_from <= text.size()) {
    const int rc = pcre2_match(code_.get(), subject, text.size(), search_from, PCRE2_NO_UTF_CHECK, st.md, st.mctx);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) fail("regex {} failed while matching: {}", translated_, pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.md);
    const size_t s = ov[0], e = ov[1];
    if (s == e && have_last && last_match_end == e) {
      // onig's find_iter refuses an empty match right after the previous match: step one character on.
      search_from += search_from < text.size() ? char_len(text, search_from) : 1;
      continue;
    }
    search_from = e;
    have_last = true;
    last_match_end = e;
    if (prev != s) out.push_back({prev, s, false});
    out.push_back({s, e, true});
    prev = e;
  }
  if (prev != text.size()) out.push_back({prev, text.size(), false});
}

}  // namespace plumb::text
