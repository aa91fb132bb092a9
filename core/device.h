// Where memory lives and kernels run. Core logic never branches on the backend:
// it asks kernels/ops.h for the Ops of a Device.
#pragma once
#include <string>

namespace sw {

enum class DeviceKind : unsigned char { CPU, CUDA };

struct Device {
  DeviceKind kind = DeviceKind::CPU;
  int index = 0;
  static Device cpu() { return {}; }
  static Device cuda(int i) { return {DeviceKind::CUDA, i}; }
  bool is_cpu() const { return kind == DeviceKind::CPU; }
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
};

}  // namespace sw
