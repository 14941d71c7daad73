// Shared by the fuzz harnesses (tests/fuzz/README.md): a byte reader for structured inputs, a temporary file for the
// loaders that take a path, and a property check that aborts (the fuzzer, or the corpus replay, reports the input).
#pragma once
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <string_view>
#include <system_error>

namespace plumb_fuzz {

// Consumes an input front to back; past its end every read returns zeros / empty.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  uint8_t byte() { return n_ ? (--n_, *p_++) : 0; }
  bool empty() const { return n_ == 0; }
  std::string_view bytes(size_t k) {
    k = k < n_ ? k : n_;
    std::string_view s(reinterpret_cast<const char*>(p_), k);
    p_ += k, n_ -= k;
    return s;
  }
  std::string_view rest() { return bytes(n_); }

 private:
  const uint8_t* p_;
  size_t n_;
};

// The paths temp_file made (and the folders the harnesses make beside them, `<path>ir` / `<path>.d`), removed when
// the process exits normally, so a corpus replay in CTest leaves nothing in the temporary folder.
struct TempPaths {
  std::set<std::string> paths;
  ~TempPaths() {
    std::error_code ec;
    for (const auto& p : paths)
      for (const std::string& q : {p, p + "ir", p + ".d"}) std::filesystem::remove_all(q, ec);
  }
};
inline TempPaths& temp_paths() {
  static TempPaths t;
  return t;
}

// A file of this process's own holding the bytes (the loaders open paths): rewritten for every input.
inline std::string temp_file(std::string_view suffix, std::string_view bytes) {
  static const std::string dir = [] {
    const char* t = std::getenv("TMPDIR");
    return std::string(t && *t ? t : "/tmp");
  }();
  const std::string path = dir + "/plumb-fuzz-" + std::to_string(::getpid()) + std::string(suffix);
  temp_paths().paths.insert(path);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || std::fclose(f) != 0) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
  return path;
}

// A violated property: say which, then abort so that the input is kept as a crash.
[[noreturn]] inline void violated(const char* what) {
  std::fprintf(stderr, "fuzz: property violated: %s\n", what);
  std::abort();
}
#define PLUMB_FUZZ_CHECK(cond) \
  do {                         \
    if (!(cond)) ::plumb_fuzz::violated(#cond); \
  } while (0)

}  // namespace plumb_fuzz
