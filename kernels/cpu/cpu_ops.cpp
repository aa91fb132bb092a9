// The CPU backend: forwards every Ops method to its sw::cpu function.
#include <algorithm>

#include "core/alloc.h"
#include "core/error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/ops.h"
#include "kernels/threads.h"

namespace sw {

namespace {

// This thread's grow-only fp32 scratch (an op's fp32 result before it is narrowed into its
// 16-bit output: attention's output or dqkv, a product's output or input gradient, the GELU's
// gradient), at least n floats, kept between calls (no allocation in the steady state; counted
// by the CPU's workspace declaration, kernels/cpu/workspace.cpp).
float* out_scratch(size_t n) {
  thread_local Buffer scratch;
  if (scratch.bytes() < n * sizeof(float)) scratch = Buffer(n * sizeof(float), Mem::Workspace);
  return scratch.f32();
}
size_t extent(int r, int c) { return size_t(r > 0 ? r : 0) * size_t(c > 0 ? c : 0); }

// compute_ is the precision of the matrix products (gemm, linear, attention, LM head); every
// other op is fp32 whatever it is.
class CpuOps final : public Ops {
 public:
  explicit CpuOps(DType compute) : compute_(compute) {}
  Device device() const override { return Device::cpu(); }
  DType compute() const override { return compute_; }
  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) const override {
    cpu::gemm_lowp(compute_, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void linear_forward(float* out, const float* inp, const float* w, const float* b, int N, int C,
                      int OC) const override {
    cpu::linear_forward_lowp(compute_, out, inp, w, b, N, C, OC);
  }
  void linear_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                       const float* w, int N, int C, int OC) const override {
    cpu::linear_backward_lowp(compute_, dinp, dw, db, dout, inp, w, N, C, OC);
  }
  void linear_backward_set(float* dinp, GradOut dw, GradOut db, const float* dout,
                           const float* inp, const float* w, int N, int C,
                           int OC) const override {
    cpu::linear_backward_lowp(compute_, dinp, dw.p, db.p, dout, inp, w, N, C, OC, 0.f, dw.beta(),
                              db.write);
  }
  void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                         int B, int T, int C) const override {
    cpu::embedding_forward(out, tokens, wte, wpe, B, T, C);
  }
  void embedding_forward_lp(float* out, const int32_t* tokens, Operand wte, const float* wpe,
                            int B, int T, int C, int /*V*/) const override {
    if (wte.f32) return cpu::embedding_forward(out, tokens, wte.f32, wpe, B, T, C);
    require_lowp("embedding_forward_lp");
    cpu::embedding_forward_lp(compute_, out, tokens, wte.lp, wpe, B, T, C);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                          int B, int T, int C) const override {
    cpu::embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, int N, int C) const override {
    cpu::layernorm_forward(out, mean, rstd, inp, w, b, N, C);
  }
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, int N,
                          int C) const override {
    cpu::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                       float eps) const override {
    cpu::rmsnorm_forward(out, rstd, inp, w, N, C, eps);
  }
  void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp,
                        const float* w, const float* rstd, int N, int C) const override {
    cpu::rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
  }
  void residual_layernorm_forward(float* res, float* out, float* mean, float* rstd, const float* a,
                                  const float* b, const float* w, const float* bias, int N,
                                  int C) const override {
    cpu::residual_layernorm_forward(res, out, mean, rstd, a, b, w, bias, N, C);
  }
  void residual_rmsnorm_forward(float* res, float* out, float* rstd, const float* a,
                                const float* b, const float* w, int N, int C,
                                float eps) const override {
    cpu::residual_rmsnorm_forward(res, out, rstd, a, b, w, N, C, eps);
  }
  void gelu_forward(float* out, const float* inp, size_t n) const override {
    cpu::gelu_forward(out, inp, n);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) const override {
    cpu::gelu_backward(dinp, inp, dout, n);
  }
  void gelu_backward_set(float* dinp, const float* inp, const float* dout,
                         size_t n) const override {
    cpu::gelu_backward(dinp, inp, dout, n, true);
  }
  void swiglu_forward(float* out, const float* gu, int N, int F) const override {
    cpu::swiglu_forward(out, gu, N, F);
  }
  void swiglu_backward(float* dgu, const float* dout, const float* gu, int N,
                       int F) const override {
    cpu::swiglu_backward(dgu, dout, gu, N, F);
  }
  void swiglu_backward_set(float* dgu, const float* dout, const float* gu, int N,
                           int F) const override {
    cpu::swiglu_backward(dgu, dout, gu, N, F, true);
  }
  void residual_forward(float* out, const float* a, const float* b, size_t n) const override {
    cpu::residual_forward(out, a, b, n);
  }
  void rope_forward(float* qkv, int B, int T, int H, int KVH, int hd,
                    float theta) const override {
    cpu::rope_forward(qkv, B, T, H, KVH, hd, theta);
  }
  void rope_backward(float* dqkv, int B, int T, int H, int KVH, int hd,
                     float theta) const override {
    cpu::rope_backward(dqkv, B, T, H, KVH, hd, theta);
  }
  void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int H, int KVH,
                         int hd) const override {
    cpu::attention_forward(out, lse, qkv, B, T, H, KVH, hd, compute_);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                          const float* lse, int B, int T, int H, int KVH,
                          int hd) const override {
    cpu::attention_backward(dqkv, dout, qkv, out, lse, B, T, H, KVH, hd, compute_);
  }
  void attention_backward_set(float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* lse, int B, int T, int H, int KVH,
                              int hd) const override {
    cpu::attention_backward(dqkv, dout, qkv, out, lse, B, T, H, KVH, hd, compute_, true);
  }
  void swiglu_forward_lp(uint16_t* out16, Operand gu, int N, int F) const override {
    require_lowp("swiglu_forward_lp");
    if (gu.f32)
      cpu::swiglu_forward_lp(compute_, out16, gu.f32, N, F);
    else
      cpu::swiglu_forward_lp(compute_, out16, gu.lp, N, F);
  }
  void gelu_forward_lp(uint16_t* out16, Operand inp, size_t n) const override {
    require_lowp("gelu_forward_lp");
    if (inp.f32)
      cpu::gelu_forward_lp(compute_, out16, inp.f32, n);
    else
      cpu::gelu_forward_lp(compute_, out16, inp.lp, n);
  }
  void gelu_backward_lp_set(float* dinp, uint16_t* dinp16, Operand inp, Operand dout,
                            size_t n) const override {
    require_lowp("gelu_backward_lp_set");
    SW_CHECK(dinp || dinp16, "gelu_backward_lp_set: neither dinp nor dinp16 given");
    float* d = dinp ? dinp : out_scratch(n);  // (the 16-bit form alone: fp32 in scratch)
    cpu::gelu_backward_set(compute_, d, inp.f32, inp.f32 ? nullptr : inp.lp, dout.f32,
                           dout.f32 ? nullptr : dout.lp, n);
    if (dinp16) narrow(compute_, d, dinp16, n);
  }
  void rmsnorm_forward_lp(uint16_t* out16, float* rstd, const float* inp, const float* w, int N,
                          int C, float eps) const override {
    require_lowp("rmsnorm_forward_lp");
    cpu::rmsnorm_forward_lp(compute_, out16, rstd, inp, w, N, C, eps);
  }
  void residual_rmsnorm_forward_lp(float* res, uint16_t* out16, float* rstd, const float* a,
                                   const float* b, const float* w, int N, int C,
                                   float eps) const override {
    require_lowp("residual_rmsnorm_forward_lp");
    cpu::residual_rmsnorm_forward_lp(compute_, res, out16, rstd, a, b, w, N, C, eps);
  }
  void layernorm_forward_lp(uint16_t* out16, float* mean, float* rstd, const float* inp,
                            const float* w, const float* b, int N, int C) const override {
    require_lowp("layernorm_forward_lp");
    cpu::layernorm_forward_lp(compute_, out16, mean, rstd, inp, w, b, N, C);
  }
  void residual_layernorm_forward_lp(float* res, uint16_t* out16, float* mean, float* rstd,
                                     const float* a, const float* b, const float* w,
                                     const float* bias, int N, int C) const override {
    require_lowp("residual_layernorm_forward_lp");
    cpu::residual_layernorm_forward_lp(compute_, res, out16, mean, rstd, a, b, w, bias, N, C);
  }
  void swiglu_backward_lp_set(uint16_t* dgu16, Operand dout, Operand gu, int N,
                              int F) const override {
    require_lowp("swiglu_backward_lp_set");
    cpu::swiglu_backward_lp_set(compute_, dgu16, dout.f32, dout.f32 ? nullptr : dout.lp, gu.f32,
                                gu.f32 ? nullptr : gu.lp, N, F);
  }
  void rope_backward_lp(uint16_t* dqkv16, Operand dqkv, int B, int T, int H, int KVH, int hd,
                        float theta) const override {
    require_lowp("rope_backward_lp");
    if (dqkv.f32)
      cpu::rope_backward_lp(compute_, dqkv16, dqkv.f32, B, T, H, KVH, hd, theta);
    else
      cpu::rope_backward_lp(compute_, dqkv16, dqkv.lp, B, T, H, KVH, hd, theta);
  }
  void rope_forward_lp(uint16_t* qkv16, Operand qkv, int B, int T, int H, int KVH, int hd,
                       float theta) const override {
    require_lowp("rope_forward_lp");
    if (qkv.f32)
      cpu::rope_forward_lp(compute_, qkv16, qkv.f32, B, T, H, KVH, hd, theta);
    else
      cpu::rope_forward_lp(compute_, qkv16, qkv.lp, B, T, H, KVH, hd, theta);
  }
  void attention_forward_lp(uint16_t* out16, float* lse, const uint16_t* qkv16, int B, int T,
                            int H, int KVH, int hd) const override {
    require_lowp("attention_forward_lp");
    const size_t no = extent(B * T, H * hd);
    float* o = out_scratch(no);
    cpu::attention_forward(o, lse, nullptr, B, T, H, KVH, hd, compute_, qkv16);
    cpu::narrow(compute_, o, out16, no);
  }
  // Without dqkv, its fp32 values in this thread's output scratch, narrowed into dqkv16.
  void attention_backward_lp_set(float* dqkv, uint16_t* dqkv16, Operand dout,
                                 const uint16_t* qkv16, const uint16_t* out16, const float* lse,
                                 int B, int T, int H, int KVH, int hd) const override {
    require_lowp("attention_backward_lp_set");
    SW_CHECK(dqkv || dqkv16, "attention_backward_lp_set: neither dqkv nor dqkv16 given");
    const size_t nq = extent(B * T, (H + 2 * KVH) * hd);
    float* d = dqkv ? dqkv : out_scratch(nq);
    cpu::attention_backward(d, dout.f32, nullptr, nullptr, lse, B, T, H, KVH, hd, compute_, true,
                            qkv16, out16, dout.f32 ? nullptr : dout.lp);
    if (dqkv16) cpu::narrow(compute_, d, dqkv16, nq);
  }
  // The fp32 product in this thread's output scratch (no allocation per call), narrowed.
  void linear_forward_lp16(uint16_t* out16, Operand inp, Operand w, const float* b, int N, int C,
                           int OC) const override {
    require_lowp("linear_forward_lp16");
    const size_t no = extent(N, OC);
    float* o = out_scratch(no);
    linear_forward_lp(o, inp, w, b, N, C, OC);
    cpu::narrow(compute_, o, out16, no);
  }
  // Each operand as fp32 where it has that form (a unit's weights come with both, and the
  // kernels pack from fp32); a weight given only 16-bit (the op tests) is widened first.
  void linear_forward_lp(float* out, Operand inp, Operand w, const float* b, int N, int C,
                         int OC) const override {
    require_lowp("linear_forward_lp");
    Buffer tw;
    cpu::linear_forward_lowp16(compute_, out, inp.f32, inp.f32 ? nullptr : inp.lp,
                               weight_f32(w, OC, C, tw), b, N, C, OC);
  }
  void linear_backward_lp_set(float* dinp, GradOut dw, GradOut db, Operand dout, Operand inp,
                              Operand w, int N, int C, int OC) const override {
    require_lowp("linear_backward_lp_set");
    Buffer tw;  // (the weight is read for dinp only)
    cpu::linear_backward_lowp16(compute_, dinp, dw.p, db.p, dout.f32,
                                dout.f32 ? nullptr : dout.lp, inp.f32, inp.f32 ? nullptr : inp.lp,
                                dinp ? weight_f32(w, OC, C, tw) : w.f32, N, C, OC, 0.f,
                                dw.beta(), db.write);
  }
  // dinp's fp32 values in this thread's output scratch, narrowed.
  void linear_backward_lp16_set(uint16_t* dinp16, GradOut dw, GradOut db, Operand dout,
                                Operand inp, Operand w, int N, int C, int OC) const override {
    require_lowp("linear_backward_lp16_set");
    const size_t ni = extent(N, C);
    float* d = dinp16 ? out_scratch(ni) : nullptr;
    linear_backward_lp_set(d, dw, db, dout, inp, w, N, C, OC);
    if (dinp16) cpu::narrow(compute_, d, dinp16, ni);
  }
  // The weight as fp32 where it has that form (a 16-bit one alone, as the simulated device
  // hands a products-only LM head, widened first).
  double lmhead_xent(float* loss, float* dx, float* dw, const float* x, Operand w,
                     const int32_t* targets, int N, int C, int V,
                     float grad_scale) const override {
    Buffer tw;
    return cpu::lmhead_xent(loss, dx, dw, x, weight_f32(w, V, C, tw), targets, N, C, V,
                            grad_scale, compute_);
  }
  void adamw(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1,
             float beta2, float eps, float wd, int step, float grad_mult) const override {
    cpu::adamw(param, grad, m, v, n, lr, beta1, beta2, eps, wd, step, grad_mult);
  }
  double sum_squares(const float* x, size_t n) const override { return cpu::sum_squares(x, n); }
  void scale(float* x, float a, size_t n) const override { cpu::scale(x, a, n); }
  void fill(float* x, float v, size_t n) const override { cpu::fill(x, v, n); }
  void add_inplace(float* y, const float* x, size_t n) const override {
    cpu::add_inplace(y, x, n);
  }
  void copy(float* dst, const float* src, size_t n) const override { cpu::copy(dst, src, n); }
  void narrow(DType dt, const float* src, void* dst, size_t n) const override {
    cpu::narrow(dt, src, dst, n);
  }
  void widen(DType dt, const void* src, float* dst, size_t n) const override {
    cpu::widen(dt, src, dst, n);
  }
  void add_widened(DType dt, const void* src, float* dst, size_t n) const override {
    cpu::add_widened(dt, src, dst, n);
  }
  void round_to(DType dt, float* x, size_t n) const override { cpu::round_to(dt, x, n); }
  void round_copy(DType dt, float* dst, const float* src, size_t n) const override {
    cpu::round_copy(dt, dst, src, n);
  }
  void round_copy_lp(DType dt, float* dst, uint16_t* dst16, const float* src,
                     size_t n) const override {
    SW_CHECK(dt != DType::F32, "round_copy_lp: needs a 16-bit dtype");
    cpu::round_copy_lp(dt, dst, dst16, src, n);
  }

 private:
  // A linear's (OC, C) weight as fp32 (operand_f32; empty shapes read nothing).
  const float* weight_f32(Operand w, int OC, int C, Buffer& t) const {
    return operand_f32(w, size_t(std::max(OC, 0)), size_t(std::max(C, 0)),
                       size_t(std::max(C, 0)), t);
  }
  DType compute_;
};

}  // namespace

const Ops& cpu_ops(DType compute) {
  static const CpuOps f32(DType::F32), bf16(DType::BF16), f16(DType::F16);
  static const int threads = num_threads();  // applies the default thread count once
  (void)threads;
  return compute == DType::BF16 ? bf16 : compute == DType::F16 ? f16 : f32;
}

}  // namespace sw
