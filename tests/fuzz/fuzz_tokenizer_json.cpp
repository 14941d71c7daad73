// Fuzz harness: any bytes as a tokenizer.json. Tokenizer::load either rejects the file with a plumb::Error (naming
// the file and field) or loads a tokenizer that encodes and decodes a fixed text with special tokens, invalid UTF-8
// and digits without crashing, its ids inside its vocabulary; other exceptions, crashes and sanitizer reports are
// bugs.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "fuzz_util.h"
#include "text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  plumb_fuzz::Reader in(data, size);
  const std::string path = plumb_fuzz::temp_file("-tokenizer.json", in.rest());
  try {
    const auto tok = plumb::text::Tokenizer::load(path);
    static const std::string text = "<｜User｜>Hello, world 12345!\n\xff\xfe caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd  \t<｜Assistant｜>";
    for (bool special : {false, true}) {
      const auto ids = tok.encode(text, special);
      for (int32_t id : ids) PLUMB_FUZZ_CHECK(id >= 0 && id < tok.vocab_size());
      (void)tok.decode(ids), (void)tok.decode(ids, true), (void)tok.decode_bytes(ids);
    }
  } catch (const plumb::Error&) {
  }
  return 0;
}
