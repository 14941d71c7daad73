// Fuzz harness for the toolkit's input files, chosen by the first byte:
// - a token file (`--tokens`: ids separated by whitespace or single commas, one step per line, '#' comments):
//   input_from_tokens throws plumb::Error or returns steps with tokens, a decode step (after the first) holding one;
// - a trace index (`plumb trace`'s OUT.json, beside a valid trace OUT.safetensors written once per process):
//   read_trace throws plumb::Error or returns one tap set per step.
// Other exceptions (nlohmann's type errors included), crashes and sanitizer reports are bugs.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "fuzz_util.h"
#include "toolkit/trace.h"

namespace {

namespace tk = plumb::toolkit;

// A two-step trace with a float tap, an index tap and logits, written once; its index is the corpus' seed.
const std::string& trace_path() {
  static const std::string path = [] {
    // A folder of this process's own, so that the index's "tensors" can name the file as the corpus writes it.
    const std::filesystem::path dir = plumb_fuzz::temp_file("-trace.d", "") + "ir";
    std::filesystem::create_directories(dir);
    const std::string p = (dir / "trace.safetensors").string();
    tk::Trace t;
    t.model_dir = "models/tiny", t.patches = "", t.source = "fuzz", t.filter = "";
    for (int s = 0; s < 2; ++s) {
      plumb::GoldenStep st{"s" + std::to_string(s), s ? "decode" : "prefill", s ? 2 : 0,
                           s ? std::vector<int32_t>{5} : std::vector<int32_t>{3, 4}};
      tk::StepTaps d;
      const int64_t n = int64_t(st.tokens.size());
      d.f32["L0.attn.out"] = plumb::Tensor({n, 2}, std::vector<float>(size_t(2 * n), 0.5f));
      d.idx["L0.ffn.gate.indices"] = plumb::IndexTensor({n, 1}, std::vector<int64_t>(size_t(n), 1));
      d.f32["logits"] = plumb::Tensor({n, 3}, std::vector<float>(size_t(3 * n), -1.0f));
      d.order = {"L0.attn.out", "L0.ffn.gate.indices", "logits"};
      for (int64_t r = 0; r < n; ++r) d.positions.push_back(st.start_pos + r);
      t.steps.push_back(st);
      t.data.push_back(std::move(d));
    }
    tk::write_trace(t, p);
    return p;
  }();
  return path;
}

void token_file(plumb_fuzz::Reader& in) {
  const std::string path = plumb_fuzz::temp_file("-tokens.txt", in.rest());
  try {
    const tk::RunInput r = tk::input_from_tokens("models/tiny", path);
    for (size_t k = 0; k < r.steps.size(); ++k) {
      PLUMB_FUZZ_CHECK(!r.steps[k].tokens.empty());
      PLUMB_FUZZ_CHECK(r.steps[k].kind != "decode" || (k > 0 && r.steps[k].tokens.size() == 1));
    }
  } catch (const plumb::Error&) {
  }
}

void trace_index(plumb_fuzz::Reader& in) {
  const std::string& st = trace_path();
  const std::string index = tk::index_path_for(st);
  const std::string tmp = plumb_fuzz::temp_file("-trace.json.new", in.rest());
  std::filesystem::rename(tmp, index);
  try {
    const tk::Trace t = tk::read_trace(index);
    PLUMB_FUZZ_CHECK(t.data.size() == t.steps.size());
  } catch (const plumb::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  plumb_fuzz::Reader in(data, size);
  if (in.byte() & 1) trace_index(in);
  else token_file(in);
  return 0;
}
