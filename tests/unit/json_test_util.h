// Shared by the JSON mode and structured-output tests: a byte-level tokenizer written from a list of tokens, and a
// session that prefers a given text.
#pragma once
#include <unistd.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plumb/engine.h"
#include "plumb/text.h"

namespace plumb::testing {

using json = nlohmann::json;

// A byte-level tokenizer.json (no merges) whose vocabulary holds every byte and `extra` (raw bytes), written to `dir`.
// `added`: more added tokens (special), after the two every such tokenizer has (<｜end▁of▁sentence｜>, <｜Assistant｜>).
inline std::string write_byte_level_tokenizer(const std::filesystem::path& dir, const std::vector<std::string>& extra,
                                       bool spaced = false, const std::vector<std::string>& added = {}) {
  // The ByteLevel alphabet: printable Latin-1 bytes stand for themselves, the others for U+0100 on, in byte order.
  std::array<std::string, 256> alpha;
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool self = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    const uint32_t cp = self ? uint32_t(b) : uint32_t(next++);
    alpha[size_t(b)] = cp < 0x80 ? std::string(1, char(cp)) : std::string{char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
  }
  json vocab = json::object();
  auto add = [&](const std::string& bytes) {
    std::string k;
    for (char c : bytes) k += alpha[uint8_t(c)];
    if (!vocab.contains(k)) vocab[k] = int(vocab.size());
  };
  for (int b = 0; b < 256; ++b) add(std::string(1, char(b)));
  for (const auto& e : extra) add(e);
  const int n = int(vocab.size());
  json added_tokens = json::array({{{"id", n}, {"content", "<｜end▁of▁sentence｜>"}, {"special", true}},
                                   {{"id", n + 1}, {"content", "<｜Assistant｜>"}, {"special", false}}});
  for (const auto& a : added) added_tokens.push_back({{"id", n + int(added_tokens.size())}, {"content", a}, {"special", true}});
  const json level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  // (spaced: no decoder, so decode() joins the tokens' strings with spaces, as word-level tokenizers do)
  const json t = {{"version", "1.0"}, {"added_tokens", added_tokens}, {"normalizer", nullptr}, {"pre_tokenizer", level},
                  {"post_processor", nullptr}, {"decoder", spaced ? json(nullptr) : level},
                  {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << t.dump();
  return (dir / "tokenizer.json").string();
}

// A session that would write `target` (the token whose bytes are the longest prefix of what is left of it gets the
// highest logit, every other token a seeded random one below), whatever JSON mode makes of it.
class PreferringSession : public plumb::Session {
 public:
  // added_too: added tokens may be what writes the target (the DSML tags a tokenizer holds as added tokens).
  PreferringSession(const plumb::Tokenizer& tok, std::string target, plumb::ModelInfo info, bool added_too = false)
      : tok_(tok), target_(std::move(target)), info_(std::move(info)), added_too_(added_too) {}
  std::vector<float> forward(std::span<const int32_t> tokens) override {
    if (pos_ > 0) out_ += tok_.token_bytes(tokens.back());  // (the sampled tokens come back one by one)
    pos_ += int64_t(tokens.size());
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    std::vector<float> l(size_t(info_.vocab_size));
    for (float& v : l) v = u(rng_);
    const std::string rest = target_.compare(0, out_.size(), out_) == 0 ? target_.substr(out_.size()) : "";
    if (rest.empty() && out_.size() >= target_.size()) l[size_t(info_.eos_token)] = 20.0f;
    int32_t best = -1;
    for (int32_t id = 0; id < tok_.vocab_size(); ++id) {
      const std::string b = tok_.token_bytes(id);
      if ((added_too_ || !tok_.is_added(id)) && !b.empty() && rest.compare(0, b.size(), b) == 0 &&
          (best < 0 || b.size() > tok_.token_bytes(best).size()))
        best = id;
    }
    if (best >= 0) l[size_t(best)] = 10.0f;
    return l;
  }
  std::vector<float> forward_all(std::span<const int32_t> tokens) override { return forward(tokens); }
  int64_t position() const override { return pos_; }
  void reset() override { pos_ = 0, out_.clear(); }
  const plumb::ModelInfo& info() const override { return info_; }

 private:
  const plumb::Tokenizer& tok_;
  std::string target_, out_;
  plumb::ModelInfo info_;
  int64_t pos_ = 0;
  std::mt19937 rng_{3};
  bool added_too_ = false;
};

// ~129K byte-level tokens at DeepSeek-V4's vocabulary size (its tokenizer is not in the repository): ~60 % words
// (most after a space), the rest JSON punctuation runs, digits and CJK / accented / emoji text. For the masks' cost.
inline std::vector<std::string> synthetic_vocabulary() {
  std::mt19937 rng(1);
  const std::vector<std::string> punct = {"\"", ":", ",", "{", "}", "[", "]", "\":", "\",", "{\"", "\"}", " \"", "\n", "\n  ",
                                          "  ", ".", "-", "0", "1", "2", "_", "\\", "\xc3\xa9", "\xe4\xb8\xad\xe6\x96\x87"};
  const std::vector<std::string> wide = {"\xe4\xb8\xad", "\xe6\x96\x87", "\xe7\x9a\x84", "\xc3\xa9", "\xc3\x9f", "\xf0\x9f\x98\x80"};
  std::set<std::string> seen;
  std::vector<std::string> extra;
  while (extra.size() < 128700) {
    std::string t;
    const double r = std::uniform_real_distribution<double>(0, 1)(rng);
    if (r < 0.6) {
      if (rng() % 10 < 6) t = " ";
      for (int n = 2 + int(rng() % 8); n > 0; --n) t += char('a' + rng() % 26);
    } else if (r < 0.75) {
      for (int n = 1 + int(rng() % 3); n > 0; --n) t += punct[rng() % punct.size()];
    } else if (r < 0.85) {
      for (int n = 1 + int(rng() % 3); n > 0; --n) t += char('0' + rng() % 10);
    } else {
      for (int n = 1 + int(rng() % 3); n > 0; --n) t += wide[rng() % wide.size()];
    }
    if (seen.insert(t).second) extra.push_back(t);
  }
  return extra;
}

}  // namespace plumb::testing
