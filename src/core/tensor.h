// Host tensors for the reference path: row-major fp32 values (Tensor) or int64 indices (IndexTensor).
#pragma once
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"

namespace plumb {

using Shape = std::vector<int64_t>;

inline int64_t numel_of(const Shape& s) {
  return std::accumulate(s.begin(), s.end(), int64_t{1}, [](int64_t a, int64_t b) { return a * b; });
}
std::string shape_str(const Shape& s);

template <typename T>
struct BasicTensor {
  Shape shape;
  std::vector<T> data;

  BasicTensor() = default;
  explicit BasicTensor(Shape s, T fill = T{}) : shape(std::move(s)), data(size_t(numel_of(shape)), fill) {}
  BasicTensor(Shape s, std::vector<T> d) : shape(std::move(s)), data(std::move(d)) {
    PLUMB_CHECK(int64_t(data.size()) == numel_of(shape), "tensor data size {} does not match shape {}",
                data.size(), shape_str(shape));
  }

  int64_t numel() const { return int64_t(data.size()); }
  int64_t dim(int i) const { return shape[size_t(i < 0 ? int(shape.size()) + i : i)]; }
  T* ptr() { return data.data(); }
  const T* ptr() const { return data.data(); }
  // Row r of a tensor viewed as [rows, last_dim].
  T* row(int64_t r) { return data.data() + r * shape.back(); }
  const T* row(int64_t r) const { return data.data() + r * shape.back(); }
  T& operator[](int64_t i) { return data[size_t(i)]; }
  const T& operator[](int64_t i) const { return data[size_t(i)]; }
};

using Tensor = BasicTensor<float>;
using IndexTensor = BasicTensor<int64_t>;

}  // namespace plumb
