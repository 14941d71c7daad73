// Safetensors writing: owned tensor buffers and a writer whose output the validating reader accepts.
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "io/safetensors.h"

namespace plumb {
namespace {

template <typename T>
OwnedTensor owned(const std::string& name, DType dtype, const BasicTensor<T>& t) {
  PLUMB_CHECK(t.numel() == numel_of(t.shape), "tensor {}: {} values do not match shape {}", name, t.numel(),
              shape_str(t.shape));
  OwnedTensor o{name, dtype, t.shape, std::vector<uint8_t>(t.data.size() * sizeof(T))};
  if (!o.bytes.empty()) std::memcpy(o.bytes.data(), t.data.data(), o.bytes.size());
  return o;
}

}  // namespace

OwnedTensor owned_f32(const std::string& name, const Tensor& t) { return owned(name, DType::F32, t); }

OwnedTensor owned_i64(const std::string& name, const IndexTensor& t) { return owned(name, DType::I64, t); }

void write_safetensors(const std::string& path, const std::vector<OwnedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps the header in the caller's order, matching the order of the data.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const OwnedTensor& t : tensors) {
    PLUMB_CHECK(t.name != "__metadata__", "cannot write {}: '__metadata__' is reserved, not a tensor name",
                path);
    PLUMB_CHECK(seen.insert(t.name).second, "cannot write {}: duplicate tensor name {}", path, t.name);
    for (int64_t d : t.shape)
      PLUMB_CHECK(d >= 0, "cannot write {}: tensor {} has negative shape {}", path, t.name,
                  shape_str(t.shape));
    const uint64_t need = uint64_t(numel_of(t.shape)) * dtype_size(t.dtype);
    PLUMB_CHECK(t.bytes.size() == need,
                "cannot write {}: tensor {} has {} bytes but dtype {} with shape {} needs {}", path, t.name,
                t.bytes.size(), dtype_name(t.dtype), shape_str(t.shape), need);
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = dtype_name(t.dtype);
    entry["shape"] = t.shape;
    entry["data_offsets"] = nlohmann::ordered_json::array({offset, offset + need});
    header[t.name] = std::move(entry);
    offset += need;
  }

  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {  // e.g. a name or metadata string that is not UTF-8
    fail("cannot write {}: {}", path, e.what());
  }
  // Pad with spaces (valid JSON whitespace) so the data buffer starts 8-byte aligned in the file.
  text.append((8 - text.size() % 8) % 8, ' ');

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail("cannot write {}: {}", path, std::strerror(errno));
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), sizeof len);
  out.write(text.data(), std::streamsize(text.size()));
  for (const OwnedTensor& t : tensors)
    out.write(reinterpret_cast<const char*>(t.bytes.data()), std::streamsize(t.bytes.size()));
  out.close();
  if (!out) fail("error while writing {}", path);
}

}  // namespace plumb
