// BPE loading and merging. The merge loop reproduces hf tokenizers' Word::merge_all exactly (lowest rank first,
// then leftmost position; stale queue entries detected by the merged id), so ties and duplicate merges resolve
// the same way.
#include "text/bpe.h"

#include <queue>

#include "core/error.h"
#include "io/json_int.h"
#include "text/utf8.h"

namespace plumb::text {

namespace {

struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  bool alive;
};

struct Merge {
  uint32_t rank;
  uint32_t pos;
  int32_t new_id;
};

// std::priority_queue pops the "largest": make that the lowest rank, then the lowest position.
struct MergeOrder {
  bool operator()(const Merge& a, const Merge& b) const {
    if (a.rank != b.rank) return a.rank > b.rank;
    return a.pos > b.pos;
  }
};

uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

}  // namespace

Bpe::Bpe(const nlohmann::json& model, const std::string& what) {
  if (!model.is_object()) fail("{}: \"model\" must be an object", what);
  if (model.contains("type") && model["type"] != "BPE") {
    fail("{}: model.type \"{}\" is not supported (only \"BPE\")", what,
         model["type"].is_string() ? model["type"].get<std::string>() : model["type"].dump());
  }
  const auto str_or_null = [&](const char* key) -> std::string {
    if (!model.contains(key) || model[key].is_null()) return {};
    if (!model[key].is_string()) fail("{}: model.{} must be a string or null", what, key);
    return model[key].get<std::string>();
  };
  const auto flag = [&](const char* key) {
    if (!model.contains(key) || model[key].is_null()) return false;
    if (!model[key].is_boolean()) fail("{}: model.{} must be a boolean", what, key);
    return model[key].get<bool>();
  };
  if (flag("byte_fallback")) fail("{}: model.byte_fallback true is not supported", what);
  if (!str_or_null("continuing_subword_prefix").empty() || !str_or_null("end_of_word_suffix").empty())
    fail("{}: model.continuing_subword_prefix / end_of_word_suffix are not supported", what);
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0))
    fail("{}: model.dropout is not supported (must be null or 0)", what);
  ignore_merges_ = flag("ignore_merges");
  fuse_unk_ = flag("fuse_unk");

  if (!model.contains("vocab") || !model["vocab"].is_object()) fail("{}: model.vocab must be an object", what);
  const auto& vocab = model["vocab"];
  vocab_.reserve(vocab.size());
  // Ids index a table here, so a file naming one huge id (a corrupt vocab) must not make it allocate gigabytes: real
  // vocabularies hold well under a million tokens, numbered from 0 (seen while reading this loader for tests/fuzz).
  constexpr int64_t kMaxId = (int64_t(1) << 24) - 1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const std::optional<int64_t> v = json_int(it.value(), 0, kMaxId);
    if (!v) fail("{}: model.vocab[\"{}\"] must be an integer id from 0 to {}, got {}", what, it.key(), kMaxId, it.value().dump());
    const auto id = int32_t(*v);
    vocab_.emplace(it.key(), id);
    if (size_t(id) >= id_to_token_.size()) {
      id_to_token_.resize(size_t(id) + 1);
      has_id_.resize(size_t(id) + 1, false);
    }
    id_to_token_[size_t(id)] = it.key();
    has_id_[size_t(id)] = true;
  }

  const std::string unk = str_or_null("unk_token");
  if (!unk.empty()) {
    unk_id_ = token_to_id(unk);
    if (unk_id_ < 0) fail("{}: model.unk_token \"{}\" is not in the vocab", what, unk);
  }

  small_char_ids_.assign(0x400, -1);
  for (const auto& [tok, id] : vocab_) {
    const size_t n = utf8_valid_len(tok, 0);
    if (!tok.empty() && n == tok.size()) {
      const uint32_t cp = utf8_decode_at(tok, 0, n);
      if (cp < small_char_ids_.size()) small_char_ids_[cp] = id;
    }
  }

  if (!model.contains("merges") || !model["merges"].is_array()) fail("{}: model.merges must be an array", what);
  const auto& merges = model["merges"];
  merges_.reserve(merges.size());
  std::string left, right;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& m = merges[rank];
    if (m.is_string()) {  // legacy "a b" form
      const auto& s = m.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos) fail("{}: model.merges[{}] \"{}\" is not two tokens separated by a space", what, rank, s);
      left = s.substr(0, sp);
      right = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      fail("{}: model.merges[{}] must be \"a b\" or [\"a\", \"b\"]", what, rank);
    }
    const int32_t a = token_to_id(left), b = token_to_id(right), c = token_to_id(left + right);
    if (a < 0) fail("{}: model.merges[{}]: token \"{}\" is not in the vocab", what, rank, left);
    if (b < 0) fail("{}: model.merges[{}]: token \"{}\" is not in the vocab", what, rank, right);
    if (c < 0) fail("{}: model.merges[{}]: merged token \"{}\" is not in the vocab", what, rank, left + right);
    // A repeated pair keeps its last rank, as hf's HashMap collect does.
    merges_[pair_key(a, b)] = {uint32_t(rank), c};
  }
}

int32_t Bpe::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

const std::string* Bpe::id_to_token(int32_t id) const {
  if (id < 0 || size_t(id) >= id_to_token_.size() || !has_id_[size_t(id)]) return nullptr;
  return &id_to_token_[size_t(id)];
}

int32_t Bpe::char_id(std::string_view ch, uint32_t cp) const {
  if (cp < small_char_ids_.size()) return small_char_ids_[cp];
  return token_to_id(ch);
}

void Bpe::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    const int32_t id = token_to_id(word);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    const auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  merge_word(word, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  std::lock_guard<std::mutex> lock(cache_mu_);
  if (cache_.size() < kCacheCapacity) cache_.emplace(std::string(word), std::move(ids));
}

void Bpe::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  // Initial symbols: one per character. A character missing from the vocab becomes unk (fused if asked), or is
  // dropped when there is no unk token, exactly as hf's merge_word does.
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  bool prev_unk = false;
  for (size_t i = 0; i < word.size();) {
    size_t n = utf8_valid_len(word, i);
    const uint32_t cp = n ? utf8_decode_at(word, i, n) : 0xFFFFFFFFu;
    if (n == 0) n = 1;  // an ill-formed byte: its own (unknown) character
    const int32_t id = cp == 0xFFFFFFFFu ? token_to_id(word.substr(i, n)) : char_id(word.substr(i, n), cp);
    i += n;
    if (id >= 0) {
      sym.push_back({id, int32_t(sym.size()) - 1, int32_t(sym.size()) + 1, true});
      prev_unk = false;
    } else if (unk_id_ >= 0) {
      if (!(fuse_unk_ && prev_unk)) sym.push_back({unk_id_, int32_t(sym.size()) - 1, int32_t(sym.size()) + 1, true});
      prev_unk = true;
    }
  }
  if (sym.empty()) return;
  sym.back().next = -1;

  std::priority_queue<Merge, std::vector<Merge>, MergeOrder> queue;
  for (size_t k = 0; k + 1 < sym.size(); ++k) {
    const auto it = merges_.find(pair_key(sym[k].id, sym[k + 1].id));
    if (it != merges_.end()) queue.push({it->second.first, uint32_t(k), it->second.second});
  }
  while (!queue.empty()) {
    const Merge top = queue.top();
    queue.pop();
    Symbol& cur = sym[top.pos];
    if (!cur.alive || cur.next < 0) continue;
    const int32_t next_pos = cur.next;
    const Symbol right = sym[size_t(next_pos)];
    // Stale entry: the pair at this position changed since it was queued.
    const auto it = merges_.find(pair_key(cur.id, right.id));
    if (it == merges_.end() || it->second.second != top.new_id) continue;

    cur.id = top.new_id;
    cur.next = right.next;
    sym[size_t(next_pos)].alive = false;
    if (right.next >= 0) sym[size_t(right.next)].prev = int32_t(top.pos);

    if (cur.prev >= 0) {
      const auto p = merges_.find(pair_key(sym[size_t(cur.prev)].id, cur.id));
      if (p != merges_.end()) queue.push({p->second.first, uint32_t(cur.prev), p->second.second});
    }
    if (cur.next >= 0) {
      const auto q = merges_.find(pair_key(cur.id, sym[size_t(cur.next)].id));
      if (q != merges_.end()) queue.push({q->second.first, top.pos, q->second.second});
    }
  }
  for (const Symbol& s : sym)
    if (s.alive) out.push_back(s.id);
}

}  // namespace plumb::text
