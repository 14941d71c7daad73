// Fuzz harness: the bundled model's weights (models/tiny/model.safetensors) under configurations the fuzzer chooses,
// run on one session. Most config.json fields fix tensor shapes, so a changed one is refused when the weights are
// bound; the others (sliding window, index top-k, rope, eps, scoring, clamps, Sinkhorn iterations, routed scaling,
// context length) leave the weights valid and change only the computation, including to values no checkpoint uses
// (an hc_eps of 0, a window of 1, a clamp of 0, thetas of 1e-3 or 1e30; the config reader refuses some, such as an
// rms_norm_eps of 0 or an index_topk of 0, by name). Two input forms:
// - text starting with '{': the whole config.json (the committed seeds are the tiny model's and a few variants);
// - anything else: bytes choosing those fields' values from lists of ordinary and extreme ones over the tiny model's
//   config, then the step schedule (prefill and chunk sizes, token ids), so every input reaches the forward.
// Model::load and forward may refuse with a plumb::Error naming the field; any other exception (nlohmann's type
// errors included), a crash or a sanitizer report is a bug. Logits need not be finite (a routed scaling of 1e30 or
// a clamp of 1e300 may overflow).
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz_util.h"
#include "model/model.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path& tiny_dir() {
  static const fs::path d = fs::path(PLUMB_SOURCE_DIR) / "models" / "tiny";
  return d;
}

// A folder of this process's own holding a link to the bundled model's weights; config.json is rewritten per input.
const std::string& model_dir() {
  static const std::string dir = [] {
    const fs::path d = plumb_fuzz::temp_file("-model", "") + ".d";
    fs::create_directories(d);
    fs::create_symlink(tiny_dir() / "model.safetensors", d / "model.safetensors");
    return d.string();
  }();
  return dir;
}

const json& tiny_config() {
  static const json c = json::parse(std::ifstream(tiny_dir() / "config.json"));
  return c;
}

template <class T, size_t N>
T pick(plumb_fuzz::Reader& in, const T (&v)[N]) {
  return v[in.byte() % N];
}

// The structured form: field values from the input's bytes, over the tiny model's config.
json structured_config(plumb_fuzz::Reader& in) {
  json c = tiny_config();
  const double eps[] = {1e-6, 0.0, 1e-30, 0.5, 1e3};
  const double theta[] = {10000.0, 1.0, 1e-3, 1e30, 160000.0};
  const double limit[] = {10.0, 0.0, -1.0, 1e-3, 1e300};
  const double rsf[] = {1.5, 1.0, 0.0, -2.0, 1e30};
  const char* scoring[] = {"sqrtsoftplus", "sigmoid", "softmax"};
  const int64_t window[] = {128, 1, 2, 3, 5, 7, 64, 4096};
  const int64_t topk[] = {8, 1, 2, 3, 64, 0};
  const int64_t iters[] = {20, 1, 2, 50, 0};
  const int64_t max_pos[] = {2048, 1, 4, 16, 3};
  c["sliding_window"] = pick(in, window);
  c["index_topk"] = pick(in, topk);
  c["hc_sinkhorn_iters"] = pick(in, iters);
  c["rms_norm_eps"] = pick(in, eps);
  c["hc_eps"] = pick(in, eps);
  c["swiglu_limit"] = pick(in, limit);
  c["routed_scaling_factor"] = pick(in, rsf);
  c["scoring_func"] = pick(in, scoring);
  c["norm_topk_prob"] = (in.byte() & 1) != 0;
  c["max_position_embeddings"] = pick(in, max_pos);
  const double t_main = pick(in, theta), t_comp = pick(in, theta);
  c["rope_theta"] = t_main, c["compress_rope_theta"] = t_comp;
  c["rope_parameters"]["main"]["rope_theta"] = t_main;
  c["rope_parameters"]["compress"]["rope_theta"] = t_comp;
  if (in.byte() % 4 == 0) {  // YaRN on the compress rope, as V4's checkpoints have it
    json& r = c["rope_parameters"]["compress"];
    r["rope_type"] = "yarn", r["factor"] = pick(in, eps) * 4 + 1, r["original_max_position_embeddings"] = 16;
    r["beta_fast"] = 32, r["beta_slow"] = 1;
  }
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  plumb_fuzz::Reader in(data, size);
  std::string text;
  std::vector<int> chunks;  // tokens per forward call
  if (size > 0 && data[0] == '{') {
    text = std::string(in.rest());
    if (json::parse(text, nullptr, /*allow_exceptions=*/false).is_discarded()) return 0;
    chunks = {7, 1, 1, 1};
  } else {
    text = structured_config(in).dump();
    const int n = 1 + in.byte() % 6;
    for (int k = 0; k < n; ++k) chunks.push_back(1 + in.byte() % (k ? 4 : 24));
  }
  const std::string& dir = model_dir();
  fs::rename(plumb_fuzz::temp_file("-config.json", text), fs::path(dir) / "config.json");
  try {
    const auto m = plumb::Model::load(dir);
    const int64_t vocab = m->config().vocab;
    plumb::SessionState st = m->new_state();
    for (const int n : chunks) {
      std::vector<int32_t> toks;
      for (int t = 0; t < n; ++t) toks.push_back(int32_t((in.byte() * 37 + t * 11 + 5) % vocab));
      const plumb::Tensor l = m->forward(st, toks, nullptr, plumb::LogitRows::All);
      PLUMB_FUZZ_CHECK(l.shape == plumb::Shape({int64_t(n), vocab}));
    }
  } catch (const plumb::Error&) {
  }
  return 0;
}
