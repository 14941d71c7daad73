// Trace files (safetensors + JSON index) and golden fixtures read as traces.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "io/json_int.h"
#include "io/safetensors.h"
#include "toolkit/tap_names.h"
#include "toolkit/trace.h"

namespace plumb::toolkit {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "plumb-trace/1";

bool is_index_dtype(DType d) { return d == DType::I64 || d == DType::I32 || d == DType::I8 || d == DType::U8; }

// Fills step data from "<step>.<tap>" tensors of `file`, for the taps listed in `order`.
void load_step(const SafetensorsFile& file, const std::string& step, const std::vector<std::string>& order, StepTaps& d) {
  for (const auto& tap : order) {
    const TensorView* v = file.find(step + "." + tap);
    if (!v) continue;
    if (is_index_dtype(v->dtype)) d.idx[tap] = to_i64(*v);
    else d.f32[tap] = to_f32(*v);
    d.order.push_back(tap);
  }
}

Trace read_fixture(const std::string& dir) {
  const auto fx = GoldenFixture::load(dir);
  Trace t;
  t.model_dir = dir;
  t.patches = "(golden: " + fx.reference + ")";
  t.source = "fixture " + dir;
  t.steps = fx.steps;
  std::vector<std::string> order = fx.taps;
  // The fixture's tap list is alphabetical and has no logits entry.
  order.push_back("logits");
  sort_execution_order(order);
  for (const auto& s : fx.steps) {
    StepTaps d;
    load_step(*fx.data, s.name, order, d);
    for (int64_t r = 0; r < int64_t(s.tokens.size()); ++r) d.positions.push_back(s.start_pos + r);
    t.data.push_back(std::move(d));
  }
  return t;
}

}  // namespace

std::string index_path_for(const std::string& p) {
  const std::string ext = ".safetensors";
  if (p.size() > ext.size() && p.compare(p.size() - ext.size(), ext.size(), ext) == 0)
    return p.substr(0, p.size() - ext.size()) + ".json";
  return p + ".json";
}

void write_trace(const Trace& t, const std::string& path) {
  std::vector<OwnedTensor> tensors;
  nlohmann::ordered_json steps = nlohmann::ordered_json::array();
  for (size_t si = 0; si < t.steps.size(); ++si) {
    const auto& s = t.steps[si];
    const auto& d = t.data[si];
    for (const auto& tap : d.order) {
      if (const Tensor* f = d.f(tap)) tensors.push_back(owned_f32(s.name + "." + tap, *f));
      else if (const IndexTensor* i = d.i(tap)) tensors.push_back(owned_i64(s.name + "." + tap, *i));
    }
    steps.push_back({{"name", s.name}, {"kind", s.kind}, {"start_pos", s.start_pos}, {"tokens", s.tokens},
                     {"positions", d.positions}});
  }
  write_safetensors(path, tensors, {{"format", kFormat}});
  nlohmann::ordered_json j;
  j["format"] = kFormat;
  j["tensors"] = fs::path(path).filename().string();
  // Absolute: the file is read from other folders too (the diagnosis reads the checkpoint through it).
  j["model"] = t.model_dir.empty() ? t.model_dir : std::filesystem::absolute(t.model_dir).lexically_normal().string();
  j["patches"] = t.patches;
  j["source"] = t.source;
  j["filter"] = t.filter;
  j["steps"] = steps;
  j["taps"] = t.tap_order();
  const std::string ipath = index_path_for(path);
  std::ofstream f(ipath);
  PLUMB_CHECK(f.good(), "cannot write trace index {}", ipath);
  f << j.dump(1) << "\n";
  PLUMB_CHECK(f.good(), "error while writing {}", ipath);
}

Trace read_trace(const std::string& path) {
  if (fs::is_directory(path)) {
    PLUMB_CHECK(fs::exists(fs::path(path) / "golden.json"), "{} is a folder but not a golden fixture (no golden.json)", path);
    return read_fixture(path);
  }
  std::string ipath = path, tpath;
  if (path.size() > 5 && path.compare(path.size() - 5, 5, ".json") == 0) {
    ipath = path;
  } else {
    ipath = index_path_for(path);
    tpath = path;
  }
  std::ifstream f(ipath);
  PLUMB_CHECK(f.good(), "cannot open trace index {} (written next to the .safetensors by `plumb trace`)", ipath);
  const auto j = nlohmann::json::parse(f, nullptr, false);
  PLUMB_CHECK(!j.is_discarded() && j.is_object(), "{}: not a JSON object", ipath);
  // (value() throws nlohmann's type_error for a field of another type: checked first, so the message names the file.)
  auto text = [&](const char* key) { return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string(); };
  PLUMB_CHECK(text("format") == kFormat, "{}: format is not {}", ipath, kFormat);
  if (tpath.empty()) tpath = (fs::path(ipath).parent_path() / text("tensors")).string();
  Trace t;
  try {
    t.model_dir = j.at("model").get<std::string>();
    t.patches = j.at("patches").get<std::string>();
    t.source = j.value("source", std::string());
    t.filter = j.value("filter", std::string());
    const auto order = j.at("taps").get<std::vector<std::string>>();
    const auto file = SafetensorsFile::open(tpath);
    for (const auto& s : j.at("steps")) {
      GoldenStep st;
      st.name = s.at("name").get<std::string>();
      st.kind = s.at("kind").get<std::string>();
      // (integers checked one by one: get<> would static_cast a float or an out-of-range value)
      const auto integer = [&](const nlohmann::json& v, const char* field, int64_t lo, int64_t hi) {
        const std::optional<int64_t> x = json_int(v, lo, hi);
        PLUMB_CHECK(x, "{}: step {}: {} {} is not an integer in [{}, {}]", ipath, st.name, field, v.dump(), lo, hi);
        return *x;
      };
      const auto integers = [&](const char* field, int64_t lo, int64_t hi) {
        const nlohmann::json& a = s.at(field);
        PLUMB_CHECK(a.is_array(), "{}: step {}: {} is not an array", ipath, st.name, field);
        std::vector<int64_t> out;
        for (const auto& v : a) out.push_back(integer(v, field, lo, hi));
        return out;
      };
      st.start_pos = integer(s.at("start_pos"), "start_pos", 0, INT64_MAX);
      for (const int64_t t : integers("tokens", INT32_MIN, INT32_MAX)) st.tokens.push_back(int32_t(t));
      StepTaps d;
      d.positions = integers("positions", 0, INT64_MAX);
      load_step(*file, st.name, order, d);
      t.steps.push_back(std::move(st));
      t.data.push_back(std::move(d));
    }
  } catch (const nlohmann::json::exception& e) {
    fail("{}: malformed trace index: {}", ipath, e.what());
  }
  return t;
}

}  // namespace plumb::toolkit
