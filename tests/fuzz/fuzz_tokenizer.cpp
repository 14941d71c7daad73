// Fuzz harness: any bytes as text for seven byte-level BPE tokenizers with DeepSeek's pre-tokenizer (the bundled
// model's and the parity fixtures'). Properties: decode_bytes(encode(x)) == x for every byte string (the documented
// exact inverse, invalid UTF-8 included); every id is inside the vocabulary; with add_special the post-processor's
// prefix and suffix wrap the same ids; a StreamDecoder fed the ids one at a time emits exactly decode(ids); the
// output of decode is valid UTF-8. The first byte picks the tokenizer (of seven).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace {

// The bundled model's tokenizer and the six parity ones (vocabularies of 1000-3000, different added tokens and
// post-processors: TemplateProcessing, ByteLevel, Sequence).
const plumb::text::Tokenizer& tokenizer(int which) {
  static const std::vector<plumb::text::Tokenizer> all = [] {
    std::vector<plumb::text::Tokenizer> v;
    v.push_back(plumb::text::Tokenizer::load(PLUMB_SOURCE_DIR "/models/tiny/tokenizer.json"));
    for (const char* d : {"node-a", "node-b", "node-c", "py-a", "py-b", "py-c"})
      v.push_back(plumb::text::Tokenizer::load(std::string(PLUMB_SOURCE_DIR "/tests/data/tokenizer/parity/") + d +
                                               "/tokenizer.json"));
    return v;
  }();
  return all[size_t(which) % all.size()];
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  plumb_fuzz::Reader in(data, size);
  const auto& tok = tokenizer(in.byte());
  const std::string_view text = in.rest();
  const std::vector<int32_t> ids = tok.encode(text);
  for (int32_t id : ids) PLUMB_FUZZ_CHECK(id >= 0 && id < tok.vocab_size());
  PLUMB_FUZZ_CHECK(tok.decode_bytes(ids) == text);

  const std::vector<int32_t> wrapped = tok.encode(text, /*add_special=*/true);
  std::vector<int32_t> expect = tok.special_prefix();
  expect.insert(expect.end(), ids.begin(), ids.end());
  expect.insert(expect.end(), tok.special_suffix().begin(), tok.special_suffix().end());
  PLUMB_FUZZ_CHECK(wrapped == expect);

  const std::string decoded = tok.decode(ids);
  PLUMB_FUZZ_CHECK(plumb::text::utf8_is_valid(decoded));
  plumb::text::StreamDecoder stream(tok);
  std::string streamed;
  for (int32_t id : ids) streamed += stream.push(id);
  streamed += stream.flush();
  PLUMB_FUZZ_CHECK(streamed == decoded);
  return 0;
}
