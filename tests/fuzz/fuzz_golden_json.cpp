// Fuzz harness: any bytes as a golden fixture's golden.json (beside an empty golden.safetensors). GoldenFixture::load
// either rejects it with a plumb::Error naming the file or returns steps that verify-golden can replay: named,
// prefill or decode, with tokens (one for a decode); other exceptions (nlohmann's type errors included), crashes and
// sanitizer reports are bugs.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "fuzz_util.h"
#include "tools/golden_fixture.h"

namespace {

// A folder of this process's own with an empty golden.safetensors (an 8-byte header length, then "{}" padded).
const std::string& fixture_dir() {
  static const std::string dir = [] {
    const std::string st = plumb_fuzz::temp_file("-golden.safetensors", std::string("\x08\0\0\0\0\0\0\0{}      ", 16));
    const std::filesystem::path d = st + ".d";
    std::filesystem::create_directories(d);
    std::filesystem::rename(st, d / "golden.safetensors");
    return d.string();
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  plumb_fuzz::Reader in(data, size);
  const std::string& dir = fixture_dir();
  const std::string json = plumb_fuzz::temp_file("-golden.json", in.rest());
  std::filesystem::rename(json, std::filesystem::path(dir) / "golden.json");
  try {
    const plumb::GoldenFixture g = plumb::GoldenFixture::load(dir);
    for (const auto& s : g.steps) {
      PLUMB_FUZZ_CHECK(s.kind == "prefill" || s.kind == "decode");
      PLUMB_FUZZ_CHECK(!s.tokens.empty() && (s.kind == "prefill" || s.tokens.size() == 1));
    }
  } catch (const plumb::Error&) {
  }
  return 0;
}
