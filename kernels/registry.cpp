#include <string>

#include "core/error.h"
#include "kernels/ops.h"

namespace sw {

const Ops& cpu_ops(DType compute);  // kernels/cpu/cpu_ops.cpp

namespace {
// [device kind][compute dtype]: one backend instance per precision; it serves one device index.
const Ops* g_ops[static_cast<size_t>(DeviceKind::Count)][4] = {};
const Ops*& slot(DeviceKind k, DType dt) {
  return g_ops[static_cast<size_t>(k)][static_cast<size_t>(dt) & 3];
}
}  // namespace

void register_ops(DeviceKind kind, const Ops* ops) { register_ops(kind, DType::F32, ops); }

void register_ops(DeviceKind kind, DType compute, const Ops* ops) {
  SW_CHECK(kind != DeviceKind::CPU && kind != DeviceKind::Count, "the CPU backend is built in");
  slot(kind, compute) = ops;
}

const Ops& ops_for(Device device) { return ops_for(device, DType::F32); }

Device device_from_name(const std::string& name) {
  if (name == "cpu") return Device::cpu();
  const DeviceKind kind = name.rfind("cuda", 0) == 0 ? DeviceKind::CUDA
                          : name == "sim"            ? DeviceKind::Sim
                                                     : DeviceKind::Count;
  if (kind == DeviceKind::Count) fail("kernels", "device '" + name + "' is not cpu, cuda or cuda:N");
  const Ops* f32 = slot(kind, DType::F32);
  if (!f32) fail("kernels", "device '" + name + "': no backend for it in this build");
  if (name.size() > 5 && name.rfind("cuda:", 0) == 0) return Device::cuda(std::stoi(name.substr(5)));
  return f32->device();
}

const Ops& ops_for(Device device, DType compute) {
  if (device.is_cpu()) return cpu_ops(compute);
  const Ops* f32 = slot(device.kind, DType::F32);
  if (!f32) fail("kernels", "no backend for device " + device.str() + " in this build");
  // A device backend serves one device per process so far (kernels/cuda/cuda_ops.cu).
  if (f32->device() != device)
    fail("kernels", "no Ops for device " + device.str() + ": this process's backend serves " +
                        f32->device().str() + " only");
  const Ops* o = slot(device.kind, compute);
  if (!o)
    fail("kernels", "no " + std::string(dtype_name(compute)) + " compute for device " +
                        device.str() + " in this build");
  return *o;
}

}  // namespace sw
