// Fuzz harness: any bytes as a `plumb kld --ref` file (a safetensors file written by --save-ref). read_kld_ref either
// rejects it with a plumb::Error or returns what the compare step indexes with: ids inside the vocabulary, tensors of
// one token count and top-k, steps covering the tokens in order. Other exceptions, crashes and sanitizer reports are
// bugs.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "fuzz_util.h"
#include "toolkit/kld.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  plumb_fuzz::Reader in(data, size);
  const std::string path = plumb_fuzz::temp_file("-kldref.safetensors", in.rest());
  try {
    const plumb::toolkit::KldRef r = plumb::toolkit::read_kld_ref(path);
    const int64_t n = r.next_logprob.numel();
    PLUMB_FUZZ_CHECK(r.ids.shape == (plumb::Shape{n, r.topk}) && r.logprobs.shape == r.ids.shape);
    for (int64_t i = 0; i < r.ids.numel(); ++i) PLUMB_FUZZ_CHECK(r.ids[i] >= 0 && r.ids[i] < r.vocab);
    int64_t pos = 0;
    for (const auto& s : r.steps) {
      PLUMB_FUZZ_CHECK(s.start_pos == pos);
      pos += int64_t(s.tokens.size());
    }
    PLUMB_FUZZ_CHECK(pos == n);
  } catch (const plumb::Error&) {
  }
  return 0;
}
