/// Where memory lives and kernels run. Core logic never branches on the backend: @file
/// it asks kernels/ops.h for the Ops of a Device.
#pragma once
#include <string>

namespace sw {

/// Sim: a simulated accelerator for tests (tests/support/sim_device.*): its memory is host
/// memory that host code cannot touch outside the device's own ops and copies, so a test run on
/// it proves that the engine reaches device memory only through Ops and copy_bytes.
enum class DeviceKind : unsigned char { CPU, CUDA, Sim, Count };

struct Device {
  DeviceKind kind = DeviceKind::CPU;
  int index = 0;
  static Device cpu() { return {}; }
  static Device cuda(int i) { return {DeviceKind::CUDA, i}; }
  static Device sim(int i) { return {DeviceKind::Sim, i}; }
  bool is_cpu() const { return kind == DeviceKind::CPU; }
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const {
    return is_cpu() ? "cpu"
                    : (kind == DeviceKind::CUDA ? "cuda:" : "sim:") + std::to_string(index);
  }
};

}  // namespace sw
