#include <algorithm>
#include <string>

#include "core/alloc.h"
#include "core/error.h"
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

namespace {
size_t mul(int a, int b) { return static_cast<size_t>(a) * static_cast<size_t>(b); }
Buffer scratch_f32(size_t n, Device d) {
  return Buffer(std::max<size_t>(n, 1) * sizeof(float), Mem::Workspace, d);
}
// A 16-bit producer's default: `write` fills n fp32 values in device scratch, which are then
// narrowed into out16.
template <class F>
void narrowed_from(const Ops& o, uint16_t* out16, size_t n, F&& write) {
  Buffer t = scratch_f32(n, o.device());
  write(t.f32());
  o.narrow(o.compute(), t.f32(), out16, n);
}
// t = x's values as fp32 (a copy of its fp32 form, else its 16-bit form widened), n of them.
void copy_f32(const Ops& o, Operand x, float* t, size_t n) {
  if (n == 0) return;
  if (x.f32)
    o.copy(t, x.f32, n);
  else
    o.widen(o.compute(), x.lp, t, n);
}
size_t qkv_size(int B, int T, int H, int KVH, int hd) {
  return mul(B, T) * static_cast<size_t>(H + 2 * KVH) * static_cast<size_t>(hd);
}
}  // namespace

void Ops::swiglu_forward_lp(uint16_t* out16, Operand gu, int N, int F) const {
  require_lowp("swiglu_forward_lp");
  Buffer tmp;
  const float* g = operand_f32(gu, 1, 0, 2 * mul(N, F), tmp);
  narrowed_from(*this, out16, mul(N, F), [&](float* t) { swiglu_forward(t, g, N, F); });
}

void Ops::gelu_forward_lp(uint16_t* out16, Operand inp, size_t n) const {
  require_lowp("gelu_forward_lp");
  Buffer tmp;
  const float* x = operand_f32(inp, 1, 0, n, tmp);
  narrowed_from(*this, out16, n, [&](float* t) { gelu_forward(t, x, n); });
}

const float* Ops::operand_f32(Operand x, size_t r, size_t ld, size_t c, Buffer& tmp) const {
  if (x.f32 || !x.lp) return x.f32;
  require_lowp("a 16-bit operand");
  const size_t n = r == 0 || c == 0 ? 0 : (r - 1) * ld + c;  // the extent the product reads
  tmp = scratch_f32(n, device());
  if (n) widen(compute(), x.lp, tmp.f32(), n);
  return tmp.f32();
}

void Ops::rmsnorm_forward_lp(uint16_t* out16, float* rstd, const float* inp, const float* w, int N,
                             int C, float eps) const {
  require_lowp("rmsnorm_forward_lp");
  narrowed_from(*this, out16, mul(N, C),
                [&](float* t) { rmsnorm_forward(t, rstd, inp, w, N, C, eps); });
}

void Ops::residual_rmsnorm_forward_lp(float* res, uint16_t* out16, float* rstd, const float* a,
                                      const float* b, const float* w, int N, int C,
                                      float eps) const {
  require_lowp("residual_rmsnorm_forward_lp");
  narrowed_from(*this, out16, mul(N, C),
                [&](float* t) { residual_rmsnorm_forward(res, t, rstd, a, b, w, N, C, eps); });
}

void Ops::layernorm_forward_lp(uint16_t* out16, float* mean, float* rstd, const float* inp,
                               const float* w, const float* b, int N, int C) const {
  require_lowp("layernorm_forward_lp");
  narrowed_from(*this, out16, mul(N, C),
                [&](float* t) { layernorm_forward(t, mean, rstd, inp, w, b, N, C); });
}

void Ops::residual_layernorm_forward_lp(float* res, uint16_t* out16, float* mean, float* rstd,
                                        const float* a, const float* b, const float* w,
                                        const float* bias, int N, int C) const {
  require_lowp("residual_layernorm_forward_lp");
  narrowed_from(*this, out16, mul(N, C), [&](float* t) {
    residual_layernorm_forward(res, t, mean, rstd, a, b, w, bias, N, C);
  });
}

void Ops::swiglu_backward_lp_set(uint16_t* dgu16, Operand dout, Operand gu, int N,
                                 int F) const {
  require_lowp("swiglu_backward_lp_set");
  Buffer tmp, td;
  const float* g = operand_f32(gu, 1, 0, 2 * mul(N, F), tmp);
  const float* d = operand_f32(dout, 1, 0, mul(N, F), td);
  narrowed_from(*this, dgu16, 2 * mul(N, F),
                [&](float* t) { swiglu_backward_set(t, d, g, N, F); });
}

void Ops::rope_backward_lp(uint16_t* dqkv16, Operand dqkv, int B, int T, int H, int KVH,
                           int hd, float theta) const {
  require_lowp("rope_backward_lp");
  const size_t n = qkv_size(B, T, H, KVH, hd);
  narrowed_from(*this, dqkv16, n, [&](float* t) {  // (t is a copy: dqkv16 may be dqkv.lp)
    copy_f32(*this, dqkv, t, n);
    rope_backward(t, B, T, H, KVH, hd, theta);
  });
}

void Ops::rope_forward_lp(uint16_t* qkv16, Operand qkv, int B, int T, int H, int KVH, int hd,
                          float theta) const {
  require_lowp("rope_forward_lp");
  const size_t n = qkv_size(B, T, H, KVH, hd);
  narrowed_from(*this, qkv16, n, [&](float* t) {  // (t is a copy: qkv16 may be qkv.lp)
    copy_f32(*this, qkv, t, n);
    rope_forward(t, B, T, H, KVH, hd, theta);
  });
}

void Ops::attention_forward_lp(uint16_t* out16, float* lse, const uint16_t* qkv16, int B, int T,
                               int H, int KVH, int hd) const {
  require_lowp("attention_forward_lp");
  Buffer q;
  const float* qw = operand_f32(qkv16, 1, 0, qkv_size(B, T, H, KVH, hd), q);
  narrowed_from(*this, out16, mul(B, T) * static_cast<size_t>(H) * static_cast<size_t>(hd),
                [&](float* t) { attention_forward(t, lse, qw, B, T, H, KVH, hd); });
}

void Ops::attention_backward_lp_set(float* dqkv, uint16_t* dqkv16, Operand dout,
                                    const uint16_t* qkv16, const uint16_t* out16,
                                    const float* lse, int B, int T, int H, int KVH,
                                    int hd) const {
  require_lowp("attention_backward_lp_set");
  SW_CHECK(dqkv || dqkv16, "attention_backward_lp_set: neither dqkv nor dqkv16 given");
  Buffer q, o, d, t;
  const size_t no = mul(B, T) * static_cast<size_t>(H) * static_cast<size_t>(hd);
  const size_t nq = qkv_size(B, T, H, KVH, hd);
  if (!dqkv) {
    t = scratch_f32(nq, device());
    dqkv = t.f32();
  }
  attention_backward_set(dqkv, operand_f32(dout, 1, 0, no, d), operand_f32(qkv16, 1, 0, nq, q),
                         operand_f32(out16, 1, 0, no, o), lse, B, T, H, KVH, hd);
  if (dqkv16) narrow(compute(), dqkv, dqkv16, nq);
}

void Ops::gelu_backward_lp_set(float* dinp, uint16_t* dinp16, Operand inp, Operand dout,
                               size_t n) const {
  require_lowp("gelu_backward_lp_set");
  SW_CHECK(dinp || dinp16, "gelu_backward_lp_set: neither dinp nor dinp16 given");
  Buffer tmp, td, t;
  if (!dinp) {
    t = scratch_f32(n, device());
    dinp = t.f32();
  }
  gelu_backward_set(dinp, operand_f32(inp, 1, 0, n, tmp), operand_f32(dout, 1, 0, n, td), n);
  if (dinp16) narrow(compute(), dinp, dinp16, n);
}

void Ops::embedding_forward_lp(float* out, const int32_t* tokens, Operand wte, const float* wpe,
                               int B, int T, int C, int V) const {
  Buffer tmp;
  embedding_forward(out, tokens, operand_f32(wte, 1, 0, mul(V, C), tmp), wpe, B, T, C);
}

void Ops::linear_forward_residual(float* out, Operand inp, Operand w, const float* b,
                                  const float* res, int N, int C, int OC) const {
  if (inp.lp || w.lp)
    linear_forward_lp(out, inp, w, b, N, C, OC);
  else
    linear_forward(out, inp.f32, w.f32, b, N, C, OC);
  residual_forward(out, out, res, mul(N, OC));
}

void Ops::layernorm_backward_lp(float* dinp, uint16_t* dinp16, float* dw, float* db,
                                const float* dout, const float* inp, const float* w,
                                const float* mean, const float* rstd, int N, int C) const {
  require_lowp("layernorm_backward_lp");
  layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  if (dinp16) narrow(compute(), dinp, dinp16, mul(N, C));
}

void Ops::rmsnorm_backward_lp(float* dinp, uint16_t* dinp16, float* dw, const float* dout,
                              const float* inp, const float* w, const float* rstd, int N,
                              int C) const {
  require_lowp("rmsnorm_backward_lp");
  rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
  if (dinp16) narrow(compute(), dinp, dinp16, mul(N, C));
}

void Ops::adamw_copies(float* param, const float* grad, float* m, float* v, size_t n, float lr,
                       float beta1, float beta2, float eps, float wd, int step, float grad_mult,
                       DType dt, float* param32, uint16_t* param16, DType grad_dt) const {
  SW_CHECK(dt != DType::F32, "adamw_copies: needs a 16-bit dtype");
  Buffer tg;
  if (grad_dt != DType::F32 && n > 0) {
    tg = scratch_f32(n, device());
    round_copy(grad_dt, tg.f32(), grad, n);
    grad = tg.f32();
  }
  adamw(param, grad, m, v, n, lr, beta1, beta2, eps, wd, step, grad_mult);
  if (param32)
    round_copy_lp(dt, param32, param16, param, n);
  else
    narrow(dt, param, param16, n);
}

void Ops::sum_squares_rounded_into(DType dt, const float* const* xs, const size_t* ns, int k,
                                   double* out) const {
  if (dt == DType::F32) return sum_squares_into(xs, ns, k, out);  // nothing to round
  for (int i = 0; i < k; ++i) {
    Buffer t = scratch_f32(std::max<size_t>(ns[i], 1), device());
    round_copy(dt, t.f32(), xs[i], ns[i]);
    const float* x = t.f32();
    sum_squares_into(&x, ns + i, 1, out + i);
  }
}

void Ops::round_copy_lp(DType dt, float* dst, uint16_t* dst16, const float* src,
                        size_t n) const {
  SW_CHECK(dt != DType::F32, "round_copy_lp: needs a 16-bit dtype");
  round_copy(dt, dst, src, n);
  narrow(dt, dst, dst16, n);
}

void Ops::linear_forward_lp(float* out, Operand inp, Operand w, const float* b, int N, int C,
                            int OC) const {
  require_lowp("linear_forward_lp");
  Buffer t, tw;
  linear_forward(out, operand_f32(inp, size_t(N), size_t(C), size_t(C), t),
                 operand_f32(w, size_t(OC), size_t(C), size_t(C), tw), b, N, C, OC);
}

void Ops::linear_forward_lp16(uint16_t* out16, Operand inp, Operand w, const float* b, int N,
                              int C, int OC) const {
  require_lowp("linear_forward_lp16");
  narrowed_from(*this, out16, mul(N, OC),
                [&](float* t) { linear_forward_lp(t, inp, w, b, N, C, OC); });
}

void Ops::linear_backward_lp_set(float* dinp, GradOut dw, GradOut db, Operand dout, Operand inp,
                                 Operand w, int N, int C, int OC) const {
  require_lowp("linear_backward_lp_set");
  Buffer td, ti, tw;
  linear_backward_set(dinp, dw, db, operand_f32(dout, size_t(N), size_t(OC), size_t(OC), td),
                      operand_f32(inp, size_t(N), size_t(C), size_t(C), ti),
                      dinp ? operand_f32(w, size_t(OC), size_t(C), size_t(C), tw) : w.f32, N, C,
                      OC);
}

void Ops::linear_backward_lp16_set(uint16_t* dinp16, GradOut dw, GradOut db, Operand dout,
                                   Operand inp, Operand w, int N, int C, int OC) const {
  require_lowp("linear_backward_lp16_set");
  if (!dinp16) return linear_backward_lp_set(nullptr, dw, db, dout, inp, w, N, C, OC);
  narrowed_from(*this, dinp16, mul(N, C),
                [&](float* t) { linear_backward_lp_set(t, dw, db, dout, inp, w, N, C, OC); });
}

void Ops::gemm_lp(bool ta, bool tb, int M, int N, int K, float alpha, Operand A, int lda,
                  Operand B, int ldb, float beta, float* C, int ldc) const {
  require_lowp("gemm_lp");
  Buffer ta_, tb_;
  const size_t ar = size_t(ta ? K : M), ac = size_t(ta ? M : K);
  const size_t br = size_t(tb ? N : K), bc = size_t(tb ? K : N);
  gemm(ta, tb, M, N, K, alpha, operand_f32(A, ar, size_t(lda), ac, ta_), lda,
       operand_f32(B, br, size_t(ldb), bc, tb_), ldb, beta, C, ldc);
}

}  // namespace sw
