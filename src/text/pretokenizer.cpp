// Split / ByteLevel / Digits / Sequence pre-tokenizers with hf tokenizers' split-behaviour semantics.
#include "text/pretokenizer.h"

#include "core/error.h"
#include "text/byte_level.h"
#include "text/regex.h"

namespace plumb::text {

namespace {

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Behavior parse_behavior(const nlohmann::json& j, const std::string& what) {
  if (!j.is_string()) fail("{}.behavior: expected a string", what);
  const auto s = j.get<std::string>();
  if (s == "Removed") return Behavior::Removed;
  if (s == "Isolated") return Behavior::Isolated;
  if (s == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (s == "MergedWithNext") return Behavior::MergedWithNext;
  if (s == "Contiguous") return Behavior::Contiguous;
  fail("{}.behavior: unknown split behavior \"{}\"", what, s);
}

bool get_bool(const nlohmann::json& j, const char* key, bool dflt, const std::string& what) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  if (!j[key].is_boolean()) fail("{}.{}: expected a boolean", what, key);
  return j[key].get<bool>();
}

// Applies a split behavior to find_matches output (NormalizedString::split in hf): returns the spans to keep.
std::vector<Span> apply_behavior(const std::vector<Span>& m, Behavior b) {
  std::vector<Span> acc;
  acc.reserve(m.size());
  switch (b) {
    case Behavior::Isolated:
      return m;
    case Behavior::Removed:
      for (const Span& s : m)
        if (!s.match) acc.push_back(s);
      return acc;
    case Behavior::Contiguous: {
      bool prev = false;
      for (const Span& s : m) {
        if (s.match == prev && !acc.empty()) acc.back().end = s.end;
        else acc.push_back(s);
        prev = s.match;
      }
      return acc;
    }
    case Behavior::MergedWithPrevious: {
      bool prev = false;
      for (const Span& s : m) {
        if (s.match && !prev && !acc.empty()) acc.back().end = s.end;
        else acc.push_back(s);
        prev = s.match;
      }
      return acc;
    }
    case Behavior::MergedWithNext: {
      bool prev = false;
      for (size_t k = m.size(); k-- > 0;) {
        const Span& s = m[k];
        if (s.match && !prev && !acc.empty()) acc.back().begin = s.begin;
        else acc.push_back(s);
        prev = s.match;
      }
      return {acc.rbegin(), acc.rend()};
    }
  }
  return acc;
}

// Splits every non-raw piece with `re`, then applies the behavior; invert swaps what counts as a match.
void split_pieces(std::vector<Piece>& pieces, const Regex& re, Behavior behavior, bool invert) {
  std::vector<Piece> out;
  out.reserve(pieces.size() * 2);
  std::vector<Span> spans;
  for (Piece& p : pieces) {
    if (p.raw) {
      out.push_back(std::move(p));
      continue;
    }
    spans.clear();
    re.find_matches(p.text, spans);
    if (invert)
      for (Span& s : spans) s.match = !s.match;
    for (const Span& s : apply_behavior(spans, behavior))
      if (s.end > s.begin) out.push_back({p.text.substr(s.begin, s.end - s.begin), false});
  }
  pieces = std::move(out);
}

class SplitPre final : public PreTokenizer {
 public:
  SplitPre(Regex re, Behavior b, bool invert) : re_(std::move(re)), behavior_(b), invert_(invert) {}
  void apply(std::vector<Piece>& pieces) const override { split_pieces(pieces, re_, behavior_, invert_); }

 private:
  Regex re_;
  Behavior behavior_;
  bool invert_;
};

// GPT-2's pattern, which ByteLevel applies itself when use_regex is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPre final : public PreTokenizer {
 public:
  ByteLevelPre(bool add_prefix_space, bool use_regex, const std::string& what)
      : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {
    if (use_regex_) re_ = std::make_unique<Regex>(Regex::onig(kGpt2Pattern, what));
  }
  void apply(std::vector<Piece>& pieces) const override {
    // hf adds the prefix space to every piece that does not start with one, then splits, then maps bytes.
    if (add_prefix_space_)
      for (Piece& p : pieces)
        if (p.text.empty() || p.text[0] != ' ') p.text.insert(p.text.begin(), ' ');
    if (use_regex_) split_pieces(pieces, *re_, Behavior::Isolated, false);
    std::string mapped;
    for (Piece& p : pieces) {
      mapped.clear();
      byte_level_encode(p.text, mapped);
      p.text.swap(mapped);
      p.raw = false;  // alphabet characters are valid UTF-8
    }
  }
  bool byte_level() const override { return true; }

 private:
  bool add_prefix_space_;
  bool use_regex_;
  std::unique_ptr<Regex> re_;
};

class SequencePre final : public PreTokenizer {
 public:
  explicit SequencePre(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  void apply(std::vector<Piece>& pieces) const override {
    for (const auto& s : steps_) s->apply(pieces);
  }
  bool byte_level() const override {
    for (const auto& s : steps_)
      if (s->byte_level()) return true;
    return false;
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, const std::string& what) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    fail("{}: expected an object with a string \"type\"", what);
  const auto type = j["type"].get<std::string>();
  if (type == "Sequence") {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array())
      fail("{}.pretokenizers: expected an array", what);
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t k = 0; k < j["pretokenizers"].size(); ++k)
      steps.push_back(make_pre_tokenizer(j["pretokenizers"][k], fmt::format("{}.pretokenizers[{}]", what, k)));
    return std::make_unique<SequencePre>(std::move(steps));
  }
  if (type == "Split") {
    if (!j.contains("pattern") || !j["pattern"].is_object()) fail("{}.pattern: expected an object", what);
    const auto& pat = j["pattern"];
    const std::string pwhat = what + ".pattern";
    std::unique_ptr<Regex> re;
    if (pat.contains("Regex") && pat["Regex"].is_string()) {
      re = std::make_unique<Regex>(Regex::onig(pat["Regex"].get<std::string>(), pwhat + ".Regex"));
    } else if (pat.contains("String") && pat["String"].is_string()) {
      re = std::make_unique<Regex>(Regex::literal(pat["String"].get<std::string>(), pwhat + ".String"));
    } else {
      fail("{}: expected {{\"Regex\": string}} or {{\"String\": string}}", pwhat);
    }
    if (!j.contains("behavior")) fail("{}.behavior: missing", what);
    return std::make_unique<SplitPre>(std::move(*re), parse_behavior(j["behavior"], what),
                                      get_bool(j, "invert", false, what));
  }
  if (type == "ByteLevel") {
    // trim_offsets only affects offsets, which plumb does not report.
    return std::make_unique<ByteLevelPre>(get_bool(j, "add_prefix_space", true, what),
                                          get_bool(j, "use_regex", true, what), what);
  }
  if (type == "Digits") {
    const bool individual = get_bool(j, "individual_digits", false, what);
    return std::make_unique<SplitPre>(Regex::onig("\\p{N}", what), individual ? Behavior::Isolated : Behavior::Contiguous,
                                      false);
  }
  fail("{}.type: unsupported pre_tokenizer type \"{}\" (supported: Sequence, Split, ByteLevel, Digits)", what, type);
}

}  // namespace plumb::text
