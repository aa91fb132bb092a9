#include "core/error.h"
#include "kernels/ops.h"

namespace sw {

const Ops& cpu_ops();  // kernels/cpu/cpu_ops.cpp

namespace {
const Ops* g_cuda_ops = nullptr;
}

void register_ops(DeviceKind kind, const Ops* ops) {
  SW_CHECK(kind == DeviceKind::CUDA, "the CPU backend is built in");
  g_cuda_ops = ops;
}

const Ops& ops_for(Device device) {
  if (device.is_cpu()) return cpu_ops();
  if (!g_cuda_ops) fail("kernels", "no backend for device " + device.str() + " in this build");
  return *g_cuda_ops;
}

const Ops& ops_for(Device device, DType compute) {
  // Placeholder until kernels/cpu implements the BF16/F16 compute variants: fp32 compute.
  (void)compute;
  return ops_for(device);
}

}  // namespace sw
