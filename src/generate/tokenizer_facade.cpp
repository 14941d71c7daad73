// plumb::Tokenizer / TextStream (plumb/text.h): the public face of text::Tokenizer, plus the BOS/EOS settings of
// tokenizer_config.json, which transformers (not tokenizer.json) uses to add BOS; and the public text helpers beside
// it (escaped lines, token id lists, the text files a user names).
#include <charconv>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "generate/tokenizer_cache.h"
#include "plumb/text.h"
#include "text/escape.h"
#include "text/tokenizer.h"

namespace plumb {

struct Tokenizer::Impl {
  text::Tokenizer tok;
  std::string path;
  int32_t bos = -1, eos = -1;
  bool add_bos = false;
  // bos / eos / add_bos from tokenizer_config.json.
  void read_config(const std::filesystem::path& file);
  struct Derived {  // TokenizerCache's (behind a pointer: Impl stays movable)
    std::mutex m;
    std::map<std::string, std::shared_ptr<const void>> by_key;
  };
  std::shared_ptr<Derived> derived = std::make_shared<Derived>();
};

std::shared_ptr<const void> TokenizerCache::get(const Tokenizer& tok, const std::string& key,
                                                const std::function<std::shared_ptr<const void>()>& make) {
  Tokenizer::Impl::Derived& d = *tok.impl_->derived;
  const std::lock_guard<std::mutex> lock(d.m);
  auto& slot = d.by_key[key];
  if (!slot) slot = make();  // (a throw leaves the slot empty: the next call tries again)
  return slot;
}

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// tokenizer_config.json writes special tokens either as a string or as an AddedToken object {"content": ...}.
std::string token_field(const json& j, const char* key) {
  if (!j.contains(key)) return {};
  const json& v = j[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return {};
}

}  // namespace

void Tokenizer::Impl::read_config(const std::filesystem::path& path) {
  Impl& impl = *this;
  std::ifstream in(path);
  PLUMB_CHECK(in.good(), "cannot read {}", path.string());
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    fail("{}: malformed JSON: {}", path.string(), e.what());
  }
  PLUMB_CHECK(j.is_object(), "{}: expected a JSON object", path.string());
  const std::string bos = token_field(j, "bos_token"), eos = token_field(j, "eos_token");
  if (!bos.empty()) {
    impl.bos = impl.tok.token_id(bos);
    PLUMB_CHECK(impl.bos >= 0, "{}: bos_token \"{}\" is not a token of {}", path.string(), bos, impl.path);
  }
  if (!eos.empty()) {
    impl.eos = impl.tok.token_id(eos);
    PLUMB_CHECK(impl.eos >= 0, "{}: eos_token \"{}\" is not a token of {}", path.string(), eos, impl.path);
  }
  // transformers' LlamaTokenizerFast (what DeepSeek's config names) adds BOS unless told otherwise.
  impl.add_bos = impl.bos >= 0 && (!j.contains("add_bos_token") || j["add_bos_token"] == true);
}

std::string unescape_line(std::string_view line) { return text::unescape_line(line); }
std::string escape_line(std::string_view bytes) { return text::escape_line(bytes); }

std::string read_text_file(const std::string& path, std::string_view what) {
  std::error_code ec;
  PLUMB_CHECK(!fs::is_directory(path, ec), "{} {} is a folder", what, path);
  std::ifstream f(path, std::ios::binary);
  PLUMB_CHECK(f.good(), "cannot open {} {}", what, path);
  std::ostringstream ss;
  ss << f.rdbuf();
  PLUMB_CHECK(!f.bad(), "cannot read {} {}", what, path);
  return ss.str();
}

std::vector<int32_t> parse_token_ids(std::string_view text, const std::string& what) {
  std::vector<int32_t> ids;
  const char *p = text.data(), *end = p + text.size();
  auto space = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
  auto column = [&](const char* at) { return at - text.data() + 1; };
  // A comma separates two ids; one with no id on a side ("1,,2", ",1", "1,") is refused rather than skipped: it
  // usually marks an id lost in editing, and skipping it would shift every position after it.
  const char* comma = nullptr;  // the comma since the last id, if any
  while (p < end) {
    if (space(*p)) {
      ++p;
      continue;
    }
    if (*p == ',') {
      PLUMB_CHECK(!ids.empty() && !comma, "{}: the comma at column {} has no token id before it (ids are separated by "
                  "spaces or single commas)", what, column(p));
      comma = p++;
      continue;
    }
    const char* q = p;
    while (q < end && !space(*q) && *q != ',') ++q;
    // Unsigned, so that from_chars takes no sign ("-0" was read as id 0).
    uint64_t v = 0;
    const auto [stop, ec] = std::from_chars(p, q, v);
    PLUMB_CHECK(ec == std::errc() && stop == q && v <= uint64_t(INT32_MAX),
                "{}: '{}' at column {} is not a token id (non-negative integers separated by spaces or commas)", what,
                text::escape_line(std::string_view(p, size_t(q - p))), column(p));
    ids.push_back(int32_t(v));
    comma = nullptr;
    p = q;
  }
  PLUMB_CHECK(!comma, "{}: the comma at column {} has no token id after it (ids are separated by spaces or single "
              "commas)", what, comma ? column(comma) : 0);
  return ids;
}

Tokenizer Tokenizer::load(const std::string& path) {
  fs::path json_path = path, dir = path;
  if (fs::is_directory(path)) {
    json_path = fs::path(path) / "tokenizer.json";
    PLUMB_CHECK(fs::exists(json_path), "folder {} has no tokenizer.json (the Hugging Face tokenizer file that ships with "
                "the weights)", path);
  } else {
    PLUMB_CHECK(fs::exists(json_path), "tokenizer file {} does not exist", path);
    dir = json_path.parent_path();
  }
  auto impl = std::make_shared<Impl>(Impl{text::Tokenizer::load(json_path.string()), json_path.string()});
  const fs::path cfg = dir / "tokenizer_config.json";
  if (fs::exists(cfg)) impl->read_config(cfg);
  Tokenizer t;
  t.impl_ = std::move(impl);
  return t;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special) const {
  return impl_->tok.encode(text, add_special);
}
std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  return impl_->tok.decode(ids, skip_special);
}
int32_t Tokenizer::token_id(std::string_view token) const { return impl_->tok.token_id(token); }
std::string Tokenizer::token_text(int32_t id) const { return std::string(impl_->tok.token_text(id)); }
int32_t Tokenizer::vocab_size() const { return impl_->tok.vocab_size(); }
bool Tokenizer::is_special(int32_t id) const { return impl_->tok.is_special(id); }

bool Tokenizer::is_added(int32_t id) const { return impl_->tok.is_added(id); }

std::string Tokenizer::token_bytes(int32_t id) const { return impl_->tok.decode_bytes({id}); }

bool Tokenizer::spaced_tokens() const { return !impl_->tok.byte_level(); }
int32_t Tokenizer::bos_id() const { return impl_->bos; }
int32_t Tokenizer::eos_id() const { return impl_->eos; }
bool Tokenizer::add_bos() const { return impl_->add_bos; }
const std::string& Tokenizer::path() const { return impl_->path; }

std::vector<int32_t> encode_prompt(const Tokenizer& tok, std::string_view text, int32_t config_bos) {
  const int32_t bos = tok.bos_id() >= 0 ? tok.bos_id() : config_bos;
  std::vector<int32_t> ids;
  if (bos >= 0 && (tok.bos_id() >= 0 ? tok.add_bos() : true)) ids.push_back(bos);
  const std::vector<int32_t> body = tok.encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

struct TextStream::Impl {
  std::shared_ptr<const Tokenizer::Impl> keep;  // the decoder points into it
  text::StreamDecoder dec;
};

TextStream::TextStream(const Tokenizer& tok, bool skip_special)
    : impl_(std::make_unique<Impl>(Impl{tok.impl_, text::StreamDecoder(tok.impl_->tok, skip_special)})) {}
TextStream::~TextStream() = default;
TextStream::TextStream(TextStream&&) noexcept = default;
std::string TextStream::push(int32_t id) { return impl_->dec.push(id); }
std::string TextStream::flush() { return impl_->dec.flush(); }

}  // namespace plumb
