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
// ---- Reference documentation (Doxygen): the members above without a comment of their own.

/// @struct sw::Device
/// A device: its kind and, for accelerators, its index.

/// @var sw::Device::kind
/// CPU, CUDA or the simulated device.

/// @var sw::Device::index
/// Which device of its kind (0 for the CPU).

/// @fn sw::Device::cpu()
/// The CPU.

/// @fn sw::Device::cuda(int i)
/// CUDA device `i`.

/// @fn sw::Device::sim(int i)
/// Simulated device `i` (tests).

/// @fn sw::Device::is_cpu() const
/// True for the CPU.

/// @fn sw::Device::operator==(const Device& o) const
/// Same kind and index.

/// @fn sw::Device::operator!=(const Device& o) const
/// Another kind or index.

/// @fn sw::Device::str() const
/// "cpu", "cuda:N" or "sim:N".
