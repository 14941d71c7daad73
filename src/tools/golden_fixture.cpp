// Golden fixture loading and the float comparison used by verify-golden.
#include "tools/golden_fixture.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/json_int.h"

namespace plumb {

GoldenFixture GoldenFixture::load(const std::string& dir) {
  namespace fs = std::filesystem;
  GoldenFixture g;
  g.dir = dir;
  const auto jpath = (fs::path(dir) / "golden.json").string();
  std::ifstream f(jpath);
  PLUMB_CHECK(f.good(), "cannot open {} (is {} a golden fixture folder?)", jpath, dir);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {  // a syntax error, or a number out of range
    // (A bare NaN, as Python's json writes a NaN value, is not JSON: the message says where it stops.)
    fail("{}: not valid JSON: {}", jpath, e.what());
  }
  try {  // (a field of another JSON type than the format says: nlohmann's type_error, named below with the file)
    PLUMB_CHECK(j.is_object(), "{}: not a JSON object", jpath);
    if (j.contains("format"))
      PLUMB_CHECK(j["format"] == "dsv4-golden/1", "{}: unsupported format {}", jpath, j["format"].dump());
    g.reference = j.value("reference", std::string("(unknown)"));
    PLUMB_CHECK(j.contains("steps") && j["steps"].is_array(), "{}: missing 'steps' array", jpath);
    for (const auto& s : j["steps"]) {
      GoldenStep st;
      PLUMB_CHECK(s.is_object() && s.contains("name") && s.contains("kind") && s.contains("start_pos") && s.contains("tokens"),
                  "{}: each step needs name, kind, start_pos and tokens: {}", jpath, s.dump());
      st.name = s["name"].get<std::string>();
      st.kind = s["kind"].get<std::string>();
      const std::optional<int64_t> start = json_int(s["start_pos"], 0);
      PLUMB_CHECK(start, "{}: step {} has start_pos {}, not a non-negative integer", jpath, st.name, s["start_pos"].dump());
      st.start_pos = *start;
      PLUMB_CHECK(s["tokens"].is_array(), "{}: step {} has tokens {}, not an array", jpath, st.name, s["tokens"].dump());
      for (const auto& t : s["tokens"]) {
        const std::optional<int64_t> v = json_int(t, INT32_MIN, INT32_MAX);
        PLUMB_CHECK(v, "{}: step {} has token {}, not an integer of 32 bits", jpath, st.name, t.dump());
        st.tokens.push_back(int32_t(*v));
      }
      PLUMB_CHECK(st.kind == "prefill" || st.kind == "decode", "{}: step {} has unknown kind '{}'", jpath, st.name, st.kind);
      PLUMB_CHECK(!st.tokens.empty(), "{}: step {} has no tokens", jpath, st.name);
      PLUMB_CHECK(st.kind != "decode" || st.tokens.size() == 1, "{}: decode step {} must have exactly one token", jpath, st.name);
      g.steps.push_back(std::move(st));
    }
    if (j.contains("taps") && j["taps"].is_array())
      for (const auto& t : j["taps"]) g.taps.push_back(t.get<std::string>());
  } catch (const nlohmann::json::exception& e) {
    fail("{}: malformed golden.json: {}", jpath, e.what());
  }
  g.data = SafetensorsFile::open((fs::path(dir) / "golden.safetensors").string());
  return g;
}

bool GoldenForcer::substitute(const std::string& name, Tensor& t) {
  const TensorView* v = fx_.find(step_, name);
  if (!v || v->dtype != DType::F32) return false;
  Tensor ref = to_f32(*v);
  if (ref.shape != t.shape) return false;  // the comparison reports the shape mismatch
  t = std::move(ref);
  return true;
}

FloatDiff diff_f32(const Tensor& got, const Tensor& ref) {
  FloatDiff d;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double a = got[i], b = ref[i];
    if (!std::isfinite(a) || !std::isfinite(b)) {
      if (!(std::isnan(a) && std::isnan(b)) && a != b) ++d.nonfinite;
      continue;
    }
    d.ref_max = std::max(d.ref_max, std::fabs(b));
    if (std::fabs(a - b) > d.max_abs) d.max_abs = std::fabs(a - b), d.at = i;
  }
  return d;
}

}  // namespace plumb
