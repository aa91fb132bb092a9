#include <algorithm>
#include <string>

#include "core/alloc.h"
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

// ---- Ops' defaults for 16-bit matrix-product inputs (kernels/ops.h): through fp32 copies.

void Ops::require_lowp(const char* op) const {
  SW_CHECK(compute() != DType::F32,
           std::string(op) + ": 16-bit product inputs need BF16 / F16 Ops, not F32 ones");
}

void Ops::swiglu_forward_lp(uint16_t* out16, const float* gu, int N, int F) const {
  require_lowp("swiglu_forward_lp");
  const size_t n = static_cast<size_t>(N) * static_cast<size_t>(F);
  Buffer t(std::max<size_t>(n, 1) * sizeof(float), Mem::Workspace, device());
  swiglu_forward(t.f32(), gu, N, F);
  narrow(compute(), t.f32(), out16, n);
}

void Ops::gelu_forward_lp(uint16_t* out16, const float* inp, size_t n) const {
  require_lowp("gelu_forward_lp");
  Buffer t(std::max<size_t>(n, 1) * sizeof(float), Mem::Workspace, device());
  gelu_forward(t.f32(), inp, n);
  narrow(compute(), t.f32(), out16, n);
}

void Ops::linear_forward_lp(float* out, const uint16_t* inp16, const float* w, const float* b,
                            int N, int C, int OC) const {
  require_lowp("linear_forward_lp");
  const size_t n = static_cast<size_t>(N) * static_cast<size_t>(C);
  Buffer t(std::max<size_t>(n, 1) * sizeof(float), Mem::Workspace, device());
  widen(compute(), inp16, t.f32(), n);
  linear_forward(out, t.f32(), w, b, N, C, OC);
}

void Ops::linear_backward_lp_set(float* dinp, float* dw, float* db, const float* dout,
                                 const uint16_t* inp16, const float* w, int N, int C,
                                 int OC) const {
  require_lowp("linear_backward_lp_set");
  const size_t n = static_cast<size_t>(N) * static_cast<size_t>(C);
  Buffer t(std::max<size_t>(n, 1) * sizeof(float), Mem::Workspace, device());
  widen(compute(), inp16, t.f32(), n);
  linear_backward_set(dinp, dw, db, dout, t.f32(), w, N, C, OC);
}

}  // namespace sw
