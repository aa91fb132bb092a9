#include <string>

#include "core/error.h"
#include "kernels/ops.h"

namespace sw {

const Ops& cpu_ops(DType compute);  // kernels/cpu/cpu_ops.cpp

namespace {
const Ops* g_cuda_ops = nullptr;
}

void register_ops(DeviceKind kind, const Ops* ops) {
  SW_CHECK(kind == DeviceKind::CUDA, "the CPU backend is built in");
  g_cuda_ops = ops;
}

const Ops& ops_for(Device device) {
  if (device.is_cpu()) return cpu_ops(DType::F32);
  if (!g_cuda_ops) fail("kernels", "no backend for device " + device.str() + " in this build");
  // The CUDA backend serves one device per process so far (kernels/cuda/cuda_ops.cu).
  if (g_cuda_ops->device() != device)
    fail("kernels", "no Ops for device " + device.str() + ": the CUDA backend serves " +
                        g_cuda_ops->device().str() + " only");
  return *g_cuda_ops;
}

const Ops& ops_for(Device device, DType compute) {
  if (device.is_cpu()) return cpu_ops(compute);
  if (compute != DType::F32)
    fail("kernels", "no " + std::string(dtype_name(compute)) + " compute for device " +
                        device.str() + " in this build");
  return ops_for(device);
}

}  // namespace sw
