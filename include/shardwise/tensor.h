/// A typed, shaped view of tracked memory. Kernels take raw pointers (llm.c style); Tensor is @file
/// for the public API, I/O (safetensors) and anything that needs a shape and dtype together.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardwise/alloc.h"
#include "shardwise/dtype.h"

namespace sw {

using Shape = std::vector<int64_t>;
int64_t numel(const Shape& s);
std::string shape_str(const Shape& s);  ///< "(12, 768)"

class Tensor {
 public:
  Tensor() = default;
  /// Allocates numel(shape) elements of dtype in the given memory category.
  Tensor(Shape shape, DType dtype, Mem category = Mem::Workspace, Device device = Device::cpu());
  /// A non-owning view of existing memory.
  static Tensor view(void* data, Shape shape, DType dtype, Device device = Device::cpu());

  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(static_cast<size_t>(i < 0 ? i + ndim() : i)); }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return sw::numel(shape_); }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  void* data() const { return data_; }
  float* f32() const;  ///< checks dtype == F32
  bool defined() const { return data_ != nullptr || numel() == 0; }

 private:
  std::shared_ptr<Buffer> owner_;
  void* data_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::F32;
  Device device_{};
};

}  // namespace sw
