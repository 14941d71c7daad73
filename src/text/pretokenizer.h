// Pre-tokenizers from tokenizer.json (Sequence, Split, ByteLevel, Digits): cut text into the pieces BPE sees.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace plumb::text {

// A pre-token. `raw` marks a run of ill-formed UTF-8 that plumb isolated before pre-tokenization: regex steps
// pass it through untouched and ByteLevel maps its bytes like any others.
struct Piece {
  std::string text;
  bool raw = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Rewrites `pieces` (each split further, possibly mapped); empty pieces are dropped, as hf does.
  virtual void apply(std::vector<Piece>& pieces) const = 0;
  // True when this step maps bytes to the byte-level alphabet (so BPE sees alphabet characters).
  virtual bool byte_level() const { return false; }
};

// Builds the pre-tokenizer described by `j`; `what` names the file and field for errors (plumb::Error for
// unsupported types or bad fields).
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, const std::string& what);

}  // namespace plumb::text
