// Safetensors reading (mmap, zero-copy, fully validated header) and writing, single file or sharded checkpoint.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace plumb {

enum class DType { F32, BF16, F16, F8_E4M3, F8_E8M0, I8, U8, I32, I64 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // the safetensors spelling, e.g. "F8_E4M3"
DType parse_dtype(const std::string& s, const std::string& context);  // throws Error naming context

// A tensor inside a mapped file. `data` stays valid as long as the owning SafetensorsFile lives.
struct TensorView {
  std::string name;
  DType dtype;
  Shape shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  std::string file;  // path of the file that holds it, for messages

  int64_t numel() const { return numel_of(shape); }
};

// One .safetensors file, memory-mapped read-only. open() validates the whole header: JSON syntax, dtypes,
// shapes, offsets in bounds and sorted without overlap, byte size == numel * dtype size; any violation
// throws Error naming the file (and tensor).
class SafetensorsFile {
 public:
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const TensorView* find(const std::string& name) const;  // nullptr if absent
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint: a directory with model.safetensors, or with model.safetensors.index.json naming shards,
// or a single .safetensors file path. Tensor names are unique across shards (a duplicate is an error).
class Checkpoint {
 public:
  static Checkpoint open(const std::string& path);
  const TensorView* find(const std::string& name) const;
  const TensorView& get(const std::string& name) const;  // throws Error "missing tensor NAME in PATH"
  std::vector<std::string> names() const;
  const std::string& path() const { return path_; }
  // The bytes of the tensors find() has returned, each counted once: once a model has bound its weights, the part
  // of the checkpoint it uses (an MTP module or other extra tensors left out), which the CUDA backend uploads in
  // these formats. (find() records what it returns: not for concurrent use while a model binds.)
  uint64_t found_bytes() const;

 private:
  std::string path_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> index_;
  mutable std::set<const TensorView*> found_;
};

// Decode any float-typed view (F32, BF16, F16, F8_E4M3, F8_E8M0) to fp32; integer views (I8,U8,I32,I64) to
// their numeric value as float. Throws Error naming the tensor for anything else.
Tensor to_f32(const TensorView& v);
// Integer views (I8, U8, I32, I64) widened to int64; throws for float dtypes.
IndexTensor to_i64(const TensorView& v);

// Writing (used for traces and tests). Tensors are written in the given order, 8-byte aligned header.
struct OwnedTensor {
  std::string name;
  DType dtype;
  Shape shape;
  std::vector<uint8_t> bytes;
};
OwnedTensor owned_f32(const std::string& name, const Tensor& t);
OwnedTensor owned_i64(const std::string& name, const IndexTensor& t);
void write_safetensors(const std::string& path, const std::vector<OwnedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace plumb
