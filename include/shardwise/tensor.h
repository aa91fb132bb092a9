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
// ---- Reference documentation (Doxygen): the members above without a comment of their own.

/// @typedef sw::Shape
/// A tensor's dimensions, outermost first.

/// @fn sw::numel(const Shape& s)
/// The product of the dimensions (1 for an empty shape).

/// @class sw::Tensor
/// A typed, shaped view of memory, owning it (constructor) or not (view).

/// @fn sw::Tensor::shape() const
/// Its dimensions.

/// @fn sw::Tensor::dim(int i) const
/// Dimension i (negative: from the end).

/// @fn sw::Tensor::ndim() const
/// Number of dimensions.

/// @fn sw::Tensor::numel() const
/// Number of elements.

/// @fn sw::Tensor::bytes() const
/// Bytes of its elements.

/// @fn sw::Tensor::dtype() const
/// Its element type.

/// @fn sw::Tensor::device() const
/// The device its memory is on.

/// @fn sw::Tensor::data() const
/// Its memory.

/// @fn sw::Tensor::defined() const
/// True when it has memory (or no elements).
