// Fuzz harness: any bytes as a .safetensors file. SafetensorsFile::open either rejects the file with a plumb::Error
// or accepts a header whose every tensor can be decoded (to_f32 reads every byte it names) without leaving the
// mapping; any other exception, a crash or a sanitizer report is a bug.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  plumb_fuzz::Reader in(data, size);
  const std::string path = plumb_fuzz::temp_file(".safetensors", in.rest());
  try {
    const auto st = plumb::SafetensorsFile::open(path);
    for (const auto& [name, view] : st->tensors()) plumb::to_f32(view);
  } catch (const plumb::Error&) {
  }
  return 0;
}
