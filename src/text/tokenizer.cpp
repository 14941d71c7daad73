// Tokenizer loading (tokenizer.json via nlohmann-json), the encode pipeline (added tokens -> pre-tokenizer ->
// BPE -> post-processor), decoding and streaming decoding.
#include "text/tokenizer.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/json_int.h"
#include "text/added_vocab.h"
#include "text/bpe.h"
#include "text/byte_level.h"
#include "text/pretokenizer.h"
#include "text/utf8.h"

namespace plumb::text {

using nlohmann::json;

struct Tokenizer::Impl {
  std::string path;
  std::unique_ptr<Bpe> model;
  AddedVocab added;
  std::unique_ptr<PreTokenizer> pre;  // null: the whole gap is one pre-token
  bool byte_level_decoder = false;    // false: no decoder, tokens are joined with spaces (hf's fallback)
  std::vector<int32_t> prefix, suffix;

  void encode_gap(std::string_view gap, std::vector<int32_t>& out) const;
  // Appends the decoder's bytes for ids (before any UTF-8 repair).
  void decode_into(const std::vector<int32_t>& ids, bool skip_special, std::string& out, bool* first) const;
  const std::string* token_string(int32_t id, bool skip_special) const;
};

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("tokenizer: cannot open {}", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("tokenizer: cannot read {}", path);
  return ss.str();
}

bool opt_bool(const json& j, const char* key, bool dflt, const std::string& what) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  if (!j[key].is_boolean()) fail("{}.{}: expected a boolean", what, key);
  return j[key].get<bool>();
}

// Only identity normalizers are supported: null and (nested) empty Sequences, which is what DeepSeek ships.
void check_normalizer(const json& j, const std::string& what) {
  if (j.is_null()) return;
  if (j.is_object() && j.value("type", "") == "Sequence" && j.contains("normalizers") && j["normalizers"].is_array()) {
    for (size_t k = 0; k < j["normalizers"].size(); ++k)
      check_normalizer(j["normalizers"][k], fmt::format("{}.normalizers[{}]", what, k));
    return;
  }
  fail("{}: unsupported normalizer {} (only null or an empty Sequence)", what,
       j.is_object() && j.contains("type") ? j["type"].dump() : j.dump());
}

// Returns true for ByteLevel, false for null; anything else is unsupported.
bool parse_decoder(const json& j, const std::string& what) {
  if (j.is_null()) return false;
  const std::string type = j.is_object() ? j.value("type", "") : "";
  if (type == "ByteLevel") return true;
  if (type == "Sequence" && j.contains("decoders") && j["decoders"].is_array() && j["decoders"].size() == 1)
    return parse_decoder(j["decoders"][0], what + ".decoders[0]");
  fail("{}: unsupported decoder {} (only ByteLevel or null)", what, j.is_object() ? j.value("type", j.dump()) : j.dump());
}

// Adds the ids a post-processor puts around a single sequence (wrapping what earlier processors added).
void parse_post_processor(const json& j, const std::string& what, std::vector<int32_t>& prefix,
                          std::vector<int32_t>& suffix) {
  if (j.is_null()) return;
  if (!j.is_object()) fail("{}: expected an object or null", what);
  const std::string type = j.value("type", "");
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    if (!j.contains("processors") || !j["processors"].is_array()) fail("{}.processors: expected an array", what);
    for (size_t k = 0; k < j["processors"].size(); ++k)
      parse_post_processor(j["processors"][k], fmt::format("{}.processors[{}]", what, k), prefix, suffix);
    return;
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    const auto id_of = [&](const char* key) {
      const std::optional<int64_t> id =
          j.contains(key) && j[key].is_array() && j[key].size() == 2 ? json_int(j[key][1], 0, INT32_MAX) : std::nullopt;
      if (!id) fail("{}.{}: expected [token, id] with an id from 0 to {}", what, key, INT32_MAX);
      return int32_t(*id);
    };
    prefix.insert(prefix.begin(), id_of("cls"));
    suffix.push_back(id_of("sep"));
    return;
  }
  if (type == "TemplateProcessing") {
    if (!j.contains("single") || !j["single"].is_array()) fail("{}.single: expected an array", what);
    const json specials = j.value("special_tokens", json::object());
    std::vector<int32_t> before, after;
    bool seen_seq = false;
    for (size_t k = 0; k < j["single"].size(); ++k) {
      const json& piece = j["single"][k];
      const std::string pwhat = fmt::format("{}.single[{}]", what, k);
      if (piece.contains("Sequence")) {
        seen_seq = true;
      } else if (piece.contains("SpecialToken") && piece["SpecialToken"].contains("id")) {
        const std::string name = piece["SpecialToken"]["id"].get<std::string>();
        if (!specials.contains(name) || !specials[name].contains("ids") || !specials[name]["ids"].is_array())
          fail("{}: special token \"{}\" is not in {}.special_tokens", pwhat, name, what);
        auto& dst = seen_seq ? after : before;
        for (const auto& id : specials[name]["ids"]) {
          const std::optional<int64_t> v = json_int(id, 0, INT32_MAX);
          if (!v) fail("{}: special token \"{}\" has id {}, not an integer from 0 to {}", pwhat, name, id.dump(), INT32_MAX);
          dst.push_back(int32_t(*v));
        }
      } else {
        fail("{}: expected {{\"Sequence\": ...}} or {{\"SpecialToken\": ...}}", pwhat);
      }
    }
    prefix.insert(prefix.begin(), before.begin(), before.end());
    suffix.insert(suffix.end(), after.begin(), after.end());
    return;
  }
  fail("{}: unsupported post_processor type \"{}\"", what, type);
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::load(const std::string& path) {
  const std::string text = read_file(path);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // a syntax error, or a number out of range (out_of_range 406)
    fail("tokenizer: {} is not valid JSON: {}", path, e.what());
  }
  if (!j.is_object()) fail("tokenizer: {}: top level must be an object", path);
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  try {
    if (j.contains("truncation") && !j["truncation"].is_null())
      fail("{}: truncation is not supported (must be null)", path);
    if (j.contains("padding") && !j["padding"].is_null()) fail("{}: padding is not supported (must be null)", path);
    if (!j.contains("model")) fail("{}: missing \"model\"", path);
    impl->model = std::make_unique<Bpe>(j["model"], path);
    check_normalizer(j.value("normalizer", json()), path + ": normalizer");
    const json pre = j.value("pre_tokenizer", json());
    if (!pre.is_null()) impl->pre = make_pre_tokenizer(pre, path + ": pre_tokenizer");
    impl->byte_level_decoder = parse_decoder(j.value("decoder", json()), path + ": decoder");

    std::vector<AddedToken> added;
    const json at = j.value("added_tokens", json::array());
    if (!at.is_array()) fail("{}: added_tokens must be an array", path);
    for (size_t k = 0; k < at.size(); ++k) {
      const std::string what = fmt::format("{}: added_tokens[{}]", path, k);
      const json& t = at[k];
      if (!t.is_object() || !t.contains("content") || !t["content"].is_string())
        fail("{}: expected an object with a string \"content\"", what);
      AddedToken a;
      a.content = t["content"].get<std::string>();
      a.special = opt_bool(t, "special", false, what);
      a.single_word = opt_bool(t, "single_word", false, what);
      a.lstrip = opt_bool(t, "lstrip", false, what);
      a.rstrip = opt_bool(t, "rstrip", false, what);
      a.normalized = opt_bool(t, "normalized", !a.special, what);
      added.push_back(std::move(a));
    }
    impl->added.add(added, *impl->model);
    parse_post_processor(j.value("post_processor", json()), path + ": post_processor", impl->prefix, impl->suffix);
    // The ids the post-processor adds must be tokens of this file: the model would otherwise receive an id outside
    // the tokenizer's vocabulary (found by tests/fuzz/fuzz_tokenizer_json: a template naming an id that no added
    // token defines).
    for (const auto* ids : {&impl->prefix, &impl->suffix})
      for (int32_t id : *ids)
        if (!impl->token_string(id, false))
          fail("{}: post_processor adds id {}, which is neither in the vocabulary nor an added token", path, id);
  } catch (const json::exception& e) {
    // A field of the wrong JSON type somewhere we did not check explicitly.
    fail("{}: malformed tokenizer.json: {}", path, e.what());
  }
  return Tokenizer(std::move(impl));
}

void Tokenizer::Impl::encode_gap(std::string_view gap, std::vector<int32_t>& out) const {
  // Isolate ill-formed UTF-8 runs (see the header) so every regex runs on valid UTF-8 only.
  std::vector<Piece> pieces;
  size_t i = 0, valid_start = 0;
  while (i < gap.size()) {
    if (static_cast<unsigned char>(gap[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t n = utf8_valid_len(gap, i);
    if (n) {
      i += n;
      continue;
    }
    if (i > valid_start) pieces.push_back({std::string(gap.substr(valid_start, i - valid_start)), false});
    size_t j = i;
    while (j < gap.size() && utf8_valid_len(gap, j) == 0) j += utf8_maximal_subpart(gap, j);
    pieces.push_back({std::string(gap.substr(i, j - i)), true});
    i = valid_start = j;
  }
  if (gap.size() > valid_start) pieces.push_back({std::string(gap.substr(valid_start)), false});
  if (pre) pre->apply(pieces);
  for (const Piece& p : pieces) model->tokenize(p.text, out);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special) const {
  std::vector<int32_t> ids;
  if (add_special) ids = impl_->prefix;
  std::vector<Segment> segs;
  impl_->added.split(text, segs);
  for (const Segment& s : segs) {
    if (s.id >= 0) ids.push_back(s.id);
    else impl_->encode_gap(text.substr(s.begin, s.end - s.begin), ids);
  }
  if (add_special) ids.insert(ids.end(), impl_->suffix.begin(), impl_->suffix.end());
  return ids;
}

const std::string* Tokenizer::Impl::token_string(int32_t id, bool skip_special) const {
  const AddedToken* a = added.by_id(id);
  const std::string* s = a ? &a->content : model->id_to_token(id);
  if (!s) return nullptr;  // hf skips ids it does not know
  if (skip_special && added.is_special_content(*s)) return nullptr;
  return s;
}

void Tokenizer::Impl::decode_into(const std::vector<int32_t>& ids, bool skip_special, std::string& out,
                                  bool* first) const {
  for (int32_t id : ids) {
    const std::string* s = token_string(id, skip_special);
    if (!s) continue;
    if (byte_level_decoder) {
      byte_level_decode_token(*s, out);
    } else {
      if (!*first) out += ' ';
      out += *s;
    }
    *first = false;
  }
}

std::string Tokenizer::decode_bytes(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  bool first = true;
  impl_->decode_into(ids, skip_special, out, &first);
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  return utf8_lossy(decode_bytes(ids, skip_special));
}

int32_t Tokenizer::token_id(std::string_view token) const {
  const int32_t id = impl_->added.token_to_id(token);
  return id >= 0 ? id : impl_->model->token_to_id(token);
}

std::string_view Tokenizer::token_text(int32_t id) const {
  const std::string* s = impl_->token_string(id, false);
  return s ? std::string_view(*s) : std::string_view();
}

int32_t Tokenizer::vocab_size() const { return std::max(impl_->model->max_id(), impl_->added.max_id()) + 1; }

bool Tokenizer::is_special(int32_t id) const {
  const AddedToken* a = impl_->added.by_id(id);
  return a && a->special;
}

bool Tokenizer::is_added(int32_t id) const { return impl_->added.by_id(id) != nullptr; }

bool Tokenizer::byte_level() const { return impl_->byte_level_decoder; }

const std::vector<int32_t>& Tokenizer::special_prefix() const { return impl_->prefix; }
const std::vector<int32_t>& Tokenizer::special_suffix() const { return impl_->suffix; }

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tok_(&tokenizer), skip_special_(skip_special) {}

std::string StreamDecoder::push(int32_t id) {
  const Tokenizer::Impl& impl = *tok_->impl_;
  if (!impl.byte_level_decoder) {
    // Without a byte-level decoder tokens are whole strings joined by spaces: nothing to hold back.
    const std::string* s = impl.token_string(id, skip_special_);
    if (!s) return {};
    std::string out = started_ ? " " + *s : *s;
    started_ = true;
    return out;
  }
  bool first = true;
  impl.decode_into({id}, skip_special_, pending_, &first);
  const size_t n = utf8_complete_prefix(pending_);
  std::string out = utf8_lossy(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = utf8_lossy(pending_);
  pending_.clear();
  started_ = false;
  return out;
}

}  // namespace plumb::text
