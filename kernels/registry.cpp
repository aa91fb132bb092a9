#include <algorithm>
#include <string>

#include "core/alloc.h"
#include "core/error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/ops.h"

namespace sw {

const Ops& cpu_ops(DType compute);  // kernels/cpu/cpu_ops.cpp
namespace cpu {
WorkspaceDecl declared_workspace(const StepShape& s);  // kernels/cpu/workspace.cpp
}
namespace cuda {
WorkspaceDecl declared_workspace(const StepShape& s);  // kernels/cuda/workspace.cpp (no CUDA)
}

namespace {
// [device kind][compute dtype]: one backend instance per precision; it serves one device index.
const Ops* g_ops[static_cast<size_t>(DeviceKind::Count)][4] = {};
const Ops*& slot(DeviceKind k, DType dt) {
  return g_ops[static_cast<size_t>(k)][static_cast<size_t>(dt) & 3];
}
}  // namespace

namespace {
// The built-in declarations, referenced here so that both are linked into every program (a
// static registrar in a static library would be dropped); registered ones take precedence.
WorkspaceFn builtin_workspace(DeviceKind k) {
  return k == DeviceKind::CPU ? cpu::declared_workspace
         : k == DeviceKind::CUDA ? cuda::declared_workspace
                                 : nullptr;
}
WorkspaceFn g_workspace[static_cast<size_t>(DeviceKind::Count)] = {};
}  // namespace

WorkspaceDecl kernel_workspace(DeviceKind kind, const StepShape& s) {
  SW_CHECK(kind != DeviceKind::Count, "kernel_workspace: no such device kind");
  WorkspaceFn f = g_workspace[static_cast<size_t>(kind)];
  if (!f) f = builtin_workspace(kind);
  if (f) return f(s);
  WorkspaceDecl none;
  none.what = "none declared";
  return none;
}

void register_workspace(DeviceKind kind, WorkspaceFn fn) {
  SW_CHECK(kind != DeviceKind::Count, "register_workspace: no such device kind");
  g_workspace[static_cast<size_t>(kind)] = fn;
}

void register_ops(DeviceKind kind, const Ops* ops) { register_ops(kind, DType::F32, ops); }

void register_ops(DeviceKind kind, DType compute, const Ops* ops) {
  SW_CHECK(kind != DeviceKind::CPU && kind != DeviceKind::Count, "the CPU backend is built in");
  slot(kind, compute) = ops;
}

const Ops& ops_for(Device device) { return ops_for(device, DType::F32); }

bool products_read_weights16(Device device, DType compute) {
  if (compute == DType::F32) return false;
  return !device.is_cpu() || cpu::lowp_onednn(compute);
}

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

// ---- Ops' shared pieces (kernels/ops.h).

void Ops::require_lowp(const char* op) const {
  SW_CHECK(compute() != DType::F32,
           std::string(op) + ": 16-bit forms need BF16 / F16 Ops, not F32 ones");
}

void Ops::refuse(const char* op, const char* what) {
  fail("kernels", std::string(op) + ": " + what + " is not a form this op takes (kernels/ops.h)");
}

void Ops::unsupported_tp(const char* op) const {
  fail("kernels", std::string(op) + ": tensor parallelism is not implemented on the " +
                      device().str() + " backend (parallelism.tensor_parallel_degree > 1 runs on "
                      "the CPU backend)");
}

namespace {
Buffer scratch_f32(size_t n, Device d) {
  return Buffer(std::max<size_t>(n, 1) * sizeof(float), Mem::Workspace, d);
}
}  // namespace

const float* Ops::operand_f32(Operand x, size_t r, size_t ld, size_t c, Buffer& tmp) const {
  if (x.f32 || !x.lp) return x.f32;
  require_lowp("a 16-bit operand");
  const size_t n = r == 0 || c == 0 ? 0 : (r - 1) * ld + c;  // the extent the product reads
  tmp = scratch_f32(n, device());
  if (n) widen(compute(), x.lp, tmp.f32(), n);
  return tmp.f32();
}

void Ops::adamw_copies(float* param, const float* grad, float* m, float* v, size_t n, float lr,
                       float beta1, float beta2, float eps, float wd, int step, float grad_mult,
                       DType dt, float* param32, uint16_t* param16, DType grad_dt) const {
  SW_CHECK(dt != DType::F32, "adamw_copies: needs a 16-bit dtype");
  AdamWCopies c;
  c.dt = dt, c.param32 = param32, c.param16 = param16, c.grad_dt = grad_dt;
  adamw(param, grad, m, v, n, lr, beta1, beta2, eps, wd, step, grad_mult, c);
}

void Ops::adamw_through_copies(float* param, const float* grad, float* m, float* v, size_t n,
                               float lr, float beta1, float beta2, float eps, float wd, int step,
                               float grad_mult, const AdamWCopies& c) const {
  SW_CHECK(c.dt != DType::F32, "adamw: copies need a 16-bit dtype");
  Buffer tg;
  if (c.grad_dt != DType::F32 && n > 0) {
    tg = scratch_f32(n, device());
    round_copy(c.grad_dt, tg.f32(), grad, n);
    grad = tg.f32();
  }
  adamw(param, grad, m, v, n, lr, beta1, beta2, eps, wd, step, grad_mult);
  if (c.param32)
    round_copy(c.dt, c.param32, param, n, c.param16);
  else
    narrow(c.dt, param, c.param16, n);
}

namespace {
size_t qkv_size(int B, int T, int H, int KVH, int hd) {
  return size_t(B) * size_t(T) * size_t(H + 2 * KVH) * size_t(hd);
}
}  // namespace

void Ops::attention_forward_through_f32(Out out, float* lse, Operand qkv, int B, int T, int H,
                                        int KVH, int hd) const {
  require_lowp("attention_forward");
  if (!out.lp || out.f32 || !qkv.lp) refuse("attention_forward", "one of out and qkv 16-bit");
  Buffer q, t;
  const float* qw = operand_f32(qkv.lp, 1, 0, qkv_size(B, T, H, KVH, hd), q);
  const size_t no = size_t(B) * size_t(T) * size_t(H) * size_t(hd);
  t = scratch_f32(no, device());
  attention_forward(t.f32(), lse, qw, B, T, H, KVH, hd);
  narrow(compute(), t.f32(), out.lp, no);
}

void Ops::attention_backward_through_f32(GradIn dqkv, Operand dout, Operand qkv, Operand out,
                                         const float* lse, int B, int T, int H, int KVH,
                                         int hd) const {
  require_lowp("attention_backward");
  if (!qkv.lp || !out.lp) refuse("attention_backward", "16-bit forms without 16-bit qkv and out");
  if (!dqkv.write || !dqkv) refuse("attention_backward", "16-bit forms without dqkv written");
  Buffer q, o, d, t;
  const size_t no = size_t(B) * size_t(T) * size_t(H) * size_t(hd);
  const size_t nq = qkv_size(B, T, H, KVH, hd);
  float* d32 = dqkv.f32;
  if (!d32) {
    t = scratch_f32(nq, device());
    d32 = t.f32();
  }
  attention_backward(GradIn::set(d32), operand_f32(dout, 1, 0, no, d),
                     operand_f32(qkv.lp, 1, 0, nq, q), operand_f32(out.lp, 1, 0, no, o), lse, B,
                     T, H, KVH, hd);
  if (dqkv.lp) narrow(compute(), d32, dqkv.lp, nq);
}

double Ops::sum_squares(const float* x, size_t n) const {
  double r = 0;
  sums_of_squares(&x, &n, 1, &r, SumsTo::Host);
  return r;
}

void Ops::sums_rounded_through_copies(DType dt, const float* const* xs, const size_t* ns, int k,
                                      double* out) const {
  for (int i = 0; i < k; ++i) {
    Buffer t = scratch_f32(std::max<size_t>(ns[i], 1), device());
    round_copy(dt, t.f32(), xs[i], ns[i]);
    const float* x = t.f32();
    sums_of_squares(&x, ns + i, 1, out + i, SumsTo::Device);
  }
}

void Ops::round_copy(DType dt, float* dst, const float* src, size_t n, uint16_t* dst16) const {
  if (dst16) SW_CHECK(dt != DType::F32, "round_copy: a 16-bit copy needs a 16-bit dtype");
  if (dst != src) copy(dst, src, n);
  round_to(dt, dst, n);
  if (dst16) narrow(dt, dst, dst16, n);
}

void Ops::round_copy_lp(DType dt, float* dst, uint16_t* dst16, const float* src,
                        size_t n) const {
  SW_CHECK(dt != DType::F32, "round_copy_lp: needs a 16-bit dtype");
  round_copy(dt, dst, src, n, dst16);
}

}  // namespace sw
