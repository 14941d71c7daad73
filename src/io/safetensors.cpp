// Safetensors reading: dtype table, mmap'd and fully validated single files, sharded checkpoints, decoding.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"
#include "formats/numeric.h"
#include "io/json_int.h"

namespace plumb {

// Tensor bytes are reinterpreted as host integers and floats; safetensors is little-endian by definition.
static_assert(std::endian::native == std::endian::little, "plumb assumes a little-endian host");

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// A real header is a few MB at most; anything far larger is corruption, and parsing it would waste memory.
constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;
constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

struct DTypeInfo {
  DType type;
  const char* name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::F32, "F32", 4},         {DType::BF16, "BF16", 2},       {DType::F16, "F16", 2},
    {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E8M0, "F8_E8M0", 1}, {DType::I8, "I8", 1},
    {DType::U8, "U8", 1},           {DType::I32, "I32", 4},         {DType::I64, "I64", 8},
};

const DTypeInfo& info(DType t) {
  for (const auto& d : kDTypes)
    if (d.type == t) return d;
  fail("invalid DType value {}", int(t));
}

[[noreturn]] void bad_file(const std::string& path, const std::string& what) {
  fail("invalid safetensors file {}: {}", path, what);
}

[[noreturn]] void bad_tensor(const std::string& path, const std::string& name, const std::string& what) {
  fail("invalid safetensors file {}: tensor '{}': {}", path, name, what);
}

// Closes the descriptor on every exit path of open().
struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

// Parses the header, rejecting duplicate keys at any depth: nlohmann keeps only the last value of a
// repeated key, which would silently hide a conflicting tensor entry.
json parse_header_json(const std::string& path, const char* begin, const char* end) {
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto on_event = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      open_objects.pop_back();
    } else if (event == json::parse_event_t::key && duplicate.empty() && !open_objects.empty()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!open_objects.back().insert(key).second) duplicate = key;
    }
    return true;
  };
  json header;
  try {
    header = json::parse(begin, end, on_event);
  } catch (const json::exception& e) {
    bad_file(path, fmt::format("header is not valid JSON: {}", e.what()));
  }
  if (!duplicate.empty()) bad_file(path, fmt::format("duplicate key '{}' in header", duplicate));
  return header;
}

TensorView parse_entry(const std::string& path, const std::string& name, const json& e, const uint8_t* buffer,
                       uint64_t buffer_size) {
  if (!e.is_object()) bad_tensor(path, name, "entry is not a JSON object");
  const auto dtype_it = e.find("dtype");
  if (dtype_it == e.end() || !dtype_it->is_string()) bad_tensor(path, name, "missing or non-string 'dtype'");
  const auto shape_it = e.find("shape");
  if (shape_it == e.end() || !shape_it->is_array()) bad_tensor(path, name, "missing or non-array 'shape'");
  const auto offs_it = e.find("data_offsets");
  if (offs_it == e.end() || !offs_it->is_array() || offs_it->size() != 2)
    bad_tensor(path, name, "missing 'data_offsets' or it is not an array of two integers");

  TensorView v;
  v.name = name;
  v.file = path;
  v.dtype = parse_dtype(dtype_it->get<std::string>(), fmt::format("tensor '{}' of {}", name, path));

  int64_t numel = 1;
  for (const json& d : *shape_it) {
    const std::optional<int64_t> dim = json_int(d, 0);
    if (!dim) bad_tensor(path, name, fmt::format("shape entry {} is not a non-negative 64-bit integer", d.dump()));
    if (__builtin_mul_overflow(numel, *dim, &numel))
      bad_tensor(path, name, fmt::format("shape {} has more elements than fit in 64 bits", shape_it->dump()));
    v.shape.push_back(*dim);
  }
  uint64_t need;
  if (__builtin_mul_overflow(uint64_t(numel), uint64_t(dtype_size(v.dtype)), &need))
    bad_tensor(path, name, fmt::format("shape {} needs more bytes than fit in 64 bits", shape_it->dump()));

  // Offsets above INT64_MAX are refused here: no mappable buffer is that large.
  const std::optional<int64_t> b0 = json_int((*offs_it)[0], 0), e0 = json_int((*offs_it)[1], 0);
  if (!b0 || !e0)
    bad_tensor(path, name, fmt::format("data_offsets {} are not non-negative 64-bit integers", offs_it->dump()));
  const uint64_t begin = uint64_t(*b0), end = uint64_t(*e0);
  if (end < begin) bad_tensor(path, name, fmt::format("data_offsets end {} is before begin {}", end, begin));
  if (end > buffer_size)
    bad_tensor(path, name,
               fmt::format("data_offsets end {} is beyond the {}-byte data buffer", end, buffer_size));
  if (end - begin != need)
    bad_tensor(path, name,
               fmt::format("data_offsets span {} bytes but dtype {} with shape {} needs {}", end - begin,
                           dtype_name(v.dtype), shape_str(v.shape), need));
  v.data = buffer + begin;
  v.nbytes = size_t(need);
  return v;
}

// Parses and validates the header of a mapped file of `size` >= 8 bytes into tensors and metadata.
void parse_file(const std::string& path, const uint8_t* base, uint64_t size,
                std::map<std::string, TensorView>& tensors, std::map<std::string, std::string>& metadata) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | base[i];
  if (n > kMaxHeaderBytes)
    bad_file(path, fmt::format("header length {} is absurdly large (limit {} bytes)", n, kMaxHeaderBytes));
  if (n > size - 8)
    bad_file(path,
             fmt::format("header length {} exceeds the {} bytes that follow the length field", n, size - 8));

  const char* text = reinterpret_cast<const char*>(base + 8);
  const json header = parse_header_json(path, text, text + n);
  if (!header.is_object())
    bad_file(path, fmt::format("header is a JSON {}, not an object", header.type_name()));

  const uint8_t* buffer = base + 8 + n;
  const uint64_t buffer_size = size - 8 - n;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) bad_file(path, "__metadata__ is not a JSON object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) bad_file(path, fmt::format("__metadata__ value of '{}' is not a string", mk));
        metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    tensors.emplace(key, parse_entry(path, key, value, buffer, buffer_size));
  }

  // Overlap check in offset order. Empty tensors occupy no bytes, so they cannot overlap anything.
  std::vector<const TensorView*> by_offset;
  for (const auto& [name, v] : tensors)
    if (v.nbytes) by_offset.push_back(&v);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorView* a, const TensorView* b) { return a->data < b->data; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorView* prev = by_offset[i - 1];
    if (by_offset[i]->data < prev->data + prev->nbytes)
      bad_file(path, fmt::format("tensors '{}' and '{}' overlap", prev->name, by_offset[i]->name));
  }
}

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);  // tensor data need not be aligned for T
  return v;
}

// Guards against views assembled by hand: the decoders below trust nbytes to cover numel elements.
void check_view(const TensorView& v) {
  const int64_t n = v.numel();
  PLUMB_CHECK(n >= 0 && v.nbytes == size_t(n) * dtype_size(v.dtype) && (v.data || v.nbytes == 0),
              "tensor {} in {}: {} bytes do not hold dtype {} with shape {}", v.name, v.file, v.nbytes,
              dtype_name(v.dtype), shape_str(v.shape));
}

template <typename Out, typename In, typename Fn>
void decode(const TensorView& v, Out* out, Fn fn) {
  const int64_t n = v.numel();
  for (int64_t i = 0; i < n; ++i) out[i] = fn(load<In>(v.data + size_t(i) * sizeof(In)));
}

}  // namespace

size_t dtype_size(DType t) { return info(t).size; }

const char* dtype_name(DType t) { return info(t).name; }

DType parse_dtype(const std::string& s, const std::string& context) {
  for (const auto& d : kDTypes)
    if (s == d.name) return d.type;
  fail("unknown dtype '{}' in {}", s, context);
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  FdGuard fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) fail("cannot open safetensors file {}: {}", path, std::strerror(errno));
  struct stat st;
  if (::fstat(fd.fd, &st) != 0) fail("cannot stat safetensors file {}: {}", path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail("safetensors path {} is not a regular file", path);
  const uint64_t size = uint64_t(st.st_size);
  if (size < 8) bad_file(path, fmt::format("file is {} bytes, too short for the 8-byte header length", size));

  void* map = ::mmap(nullptr, size_t(size), PROT_READ, MAP_PRIVATE, fd.fd, 0);
  if (map == MAP_FAILED) fail("cannot mmap safetensors file {}: {}", path, std::strerror(errno));
  f->map_ = map;  // owned from here on: the destructor unmaps it even if validation throws
  f->map_size_ = size_t(size);
  parse_file(path, static_cast<const uint8_t*>(map), size, f->tensors_, f->metadata_);
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_size_);
}

const TensorView* SafetensorsFile::find(const std::string& name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Checkpoint Checkpoint::open(const std::string& path) {
  Checkpoint ck;
  ck.path_ = path;

  auto add_file = [&ck](const std::string& file) {
    std::shared_ptr<SafetensorsFile> f = SafetensorsFile::open(file);
    for (const auto& [name, view] : f->tensors()) {
      const auto [it, inserted] = ck.index_.emplace(name, &view);
      if (!inserted) fail("duplicate tensor {} in {} and {}", name, it->second->file, file);
    }
    ck.files_.push_back(std::move(f));
    return ck.files_.back();
  };

  auto add_index = [&](const fs::path& index_path) {
    const std::string index = index_path.string();
    std::ifstream in(index_path, std::ios::binary);
    if (!in) fail("cannot read checkpoint index {}: {}", index, std::strerror(errno));
    std::stringstream text;
    text << in.rdbuf();
    json j;
    try {
      j = json::parse(text.str());
    } catch (const json::exception& e) {
      fail("checkpoint index {} is not valid JSON: {}", index, e.what());
    }
    const auto map = j.is_object() ? j.find("weight_map") : j.end();
    if (map == j.end() || !map->is_object()) fail("checkpoint index {} has no 'weight_map' object", index);

    std::map<std::string, std::string> shard_of;  // tensor -> shard file name
    for (const auto& [tensor, shard] : map->items()) {
      if (!shard.is_string()) fail("checkpoint index {}: shard of tensor {} is not a string", index, tensor);
      const std::string name = shard.get<std::string>();
      // Shards live next to the index; a path component could point anywhere on the machine.
      if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos)
        fail("checkpoint index {}: shard '{}' of tensor {} is not a plain file name", index, name, tensor);
      shard_of[tensor] = name;
    }

    std::map<std::string, std::shared_ptr<SafetensorsFile>> shards;
    for (const auto& [tensor, name] : shard_of) {
      if (shards.count(name)) continue;
      const fs::path shard_path = index_path.parent_path() / name;
      if (!fs::exists(shard_path))
        fail("shard {} named in checkpoint index {} is missing", shard_path.string(), index);
      shards[name] = add_file(shard_path.string());
    }
    for (const auto& [tensor, name] : shard_of)
      if (!shards[name]->find(tensor))
        fail("tensor {} listed in checkpoint index {} is absent from shard {}", tensor, index,
             shards[name]->path());
  };

  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path dir(path);
    if (fs::exists(dir / kIndexName, ec))
      add_index(dir / kIndexName);
    else if (fs::exists(dir / kSingleName, ec))
      add_file((dir / kSingleName).string());
    else
      fail("checkpoint directory {} has neither {} nor {}", path, kIndexName, kSingleName);
  } else if (fs::exists(path, ec)) {
    add_file(path);
  } else {
    fail("checkpoint {} does not exist", path);
  }
  return ck;
}

const TensorView* Checkpoint::find(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) return nullptr;
  found_.insert(it->second);
  return it->second;
}

uint64_t Checkpoint::found_bytes() const {
  uint64_t n = 0;
  for (const TensorView* v : found_) n += uint64_t(v->nbytes);
  return n;
}

const TensorView& Checkpoint::get(const std::string& name) const {
  const TensorView* v = find(name);
  if (!v) fail("missing tensor {} in {}", name, path_);
  return *v;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& [name, view] : index_) out.push_back(name);
  return out;
}

Tensor to_f32(const TensorView& v) {
  check_view(v);
  Tensor out(v.shape);
  float* o = out.ptr();
  switch (v.dtype) {
    case DType::F32:
      decode<float, float>(v, o, [](float x) { return x; });
      break;
    case DType::BF16:
      decode<float, uint16_t>(v, o, fmt8::bf16_to_f32);
      break;
    case DType::F16:
      decode<float, uint16_t>(v, o, fmt8::f16_to_f32);
      break;
    case DType::F8_E4M3:
      decode<float, uint8_t>(v, o, fmt8::e4m3_to_f32);
      break;
    case DType::F8_E8M0:
      decode<float, uint8_t>(v, o, fmt8::e8m0_to_f32);
      break;
    case DType::I8:
      decode<float, int8_t>(v, o, [](int8_t x) { return float(x); });
      break;
    case DType::U8:
      decode<float, uint8_t>(v, o, [](uint8_t x) { return float(x); });
      break;
    case DType::I32:
      decode<float, int32_t>(v, o, [](int32_t x) { return float(x); });
      break;
    case DType::I64:
      decode<float, int64_t>(v, o, [](int64_t x) { return float(x); });
      break;
  }
  return out;
}

IndexTensor to_i64(const TensorView& v) {
  check_view(v);
  IndexTensor out(v.shape);
  int64_t* o = out.ptr();
  auto widen = [](auto x) { return int64_t(x); };
  switch (v.dtype) {
    case DType::I8:
      decode<int64_t, int8_t>(v, o, widen);
      break;
    case DType::U8:
      decode<int64_t, uint8_t>(v, o, widen);
      break;
    case DType::I32:
      decode<int64_t, int32_t>(v, o, widen);
      break;
    case DType::I64:
      decode<int64_t, int64_t>(v, o, widen);
      break;
    default:
      fail("tensor {} in {} has dtype {}; an integer dtype (I8, U8, I32, I64) is required", v.name, v.file,
           dtype_name(v.dtype));
  }
  return out;
}

}  // namespace plumb
