#include "core/tensor.h"

#include "core/error.h"

namespace sw {

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + ")";
}

Tensor::Tensor(Shape shape, DType dtype, Mem category, Device device)
    : shape_(std::move(shape)), dtype_(dtype), device_(device) {
  for (int64_t d : shape_) SW_CHECK(d >= 0, "negative tensor dimension");
  owner_ = std::make_shared<Buffer>(bytes(), category, device);
  data_ = owner_->data();
}

Tensor Tensor::view(void* data, Shape shape, DType dtype, Device device) {
  Tensor t;
  t.data_ = data;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  return t;
}

float* Tensor::f32() const {
  SW_CHECK(dtype_ == DType::F32, "tensor is not f32");
  return static_cast<float*>(data_);
}

}  // namespace sw
