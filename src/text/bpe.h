// The BPE model of tokenizer.json: vocab, ranked merges, and hf's priority-queue merge loop with a word cache.
#pragma once
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace plumb::text {

// Transparent hashing so string_view lookups need no temporary std::string.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class Bpe {
 public:
  // Parses `model` (the tokenizer.json "model" object); `what` names the file for errors.
  Bpe(const nlohmann::json& model, const std::string& what);

  // Appends the ids of one pre-token (already byte-level mapped where the pipeline says so).
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  int32_t token_to_id(std::string_view token) const;    // -1 if absent
  const std::string* id_to_token(int32_t id) const;     // nullptr if absent
  size_t size() const { return vocab_.size(); }        // hf's get_vocab_size(): number of entries
  int32_t max_id() const { return int32_t(id_to_token_.size()) - 1; }

 private:
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;
  int32_t char_id(std::string_view ch, uint32_t cp) const;

  StringIdMap vocab_;
  std::vector<std::string> id_to_token_;  // indexed by id
  std::vector<bool> has_id_;
  // (left id << 32 | right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<uint32_t, int32_t>> merges_;
  std::vector<int32_t> small_char_ids_;  // id of the one-character token for code points < 0x400, -1 if none
  bool ignore_merges_ = false;
  int32_t unk_id_ = -1;
  bool fuse_unk_ = false;

  // Word -> ids, like hf's cache (bounded; once full it stops growing). Guarded: encode() is const and may be
  // called from several threads.
  static constexpr size_t kCacheCapacity = 10000;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace plumb::text
