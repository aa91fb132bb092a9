// An Ops that forwards every op, query and form to another Ops (`inner`, which must outlive it):
// the base of the decorators that change a few ops and leave the rest to the backend they wrap
// (kernels/fp8_ops.h Fp8Ops: the products in fp8; sharding/deferred_wgrad.cpp: weight gradients
// deferred; the tests' swtest::ForwardingOps). A derived class overrides what it changes; every
// other call reaches the inner Ops unchanged, its own device-side defaults included
// (lmhead_xent_into, round_copy).
#pragma once
#include "kernels/ops.h"

namespace sw {

class ForwardingOps : public Ops {
 public:
  explicit ForwardingOps(const Ops& inner) : in_(inner) {}
  const Ops& inner() const { return in_; }

  Device device() const override { return in_.device(); }
  Stream& stream() const override { return in_.stream(); }
  DType compute() const override { return in_.compute(); }
  bool fuses_product_residual() const override { return in_.fuses_product_residual(); }
  bool rounds_grads_on_read(DType dt) const override { return in_.rounds_grads_on_read(dt); }
  bool prefers_lp_operands() const override { return in_.prefers_lp_operands(); }

  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, Operand A, int lda, Operand B,
            int ldb, float beta, float* C, int ldc) const override {
    in_.gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void linear_forward(Out out, Operand inp, Operand w, const float* b, const float* res, int N,
                      int C, int OC) const override {
    in_.linear_forward(out, inp, w, b, res, N, C, OC);
  }
  void linear_backward(GradIn dinp, GradOut dw, GradOut db, Operand dout, Operand inp, Operand w,
                       int N, int C, int OC) const override {
    in_.linear_backward(dinp, dw, db, dout, inp, w, N, C, OC);
  }
  void embedding_forward(float* out, const int32_t* tokens, Operand wte, const float* wpe, int B,
                         int T, int C, int V) const override {
    in_.embedding_forward(out, tokens, wte, wpe, B, T, C, V);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                          int B, int T, int C) const override {
    in_.embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
  }
  void layernorm_forward(Out out, float* mean, float* rstd, NormIn inp, const float* w,
                         const float* b, int N, int C) const override {
    in_.layernorm_forward(out, mean, rstd, inp, w, b, N, C);
  }
  void layernorm_backward(GradIn dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, int N,
                          int C) const override {
    in_.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  void rmsnorm_forward(Out out, float* rstd, NormIn inp, const float* w, int N, int C,
                       float eps) const override {
    in_.rmsnorm_forward(out, rstd, inp, w, N, C, eps);
  }
  void rmsnorm_backward(GradIn dinp, float* dw, const float* dout, const float* inp,
                        const float* w, const float* rstd, int N, int C) const override {
    in_.rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
  }
  void gelu_forward(Out out, Operand inp, size_t n) const override { in_.gelu_forward(out, inp, n); }
  void gelu_backward(GradIn dinp, Operand inp, Operand dout, size_t n) const override {
    in_.gelu_backward(dinp, inp, dout, n);
  }
  void swiglu_forward(Out out, Operand gu, int N, int F) const override {
    in_.swiglu_forward(out, gu, N, F);
  }
  void swiglu_backward(GradIn dgu, Operand dout, Operand gu, int N, int F) const override {
    in_.swiglu_backward(dgu, dout, gu, N, F);
  }
  void residual_forward(float* out, const float* a, const float* b, size_t n) const override {
    in_.residual_forward(out, a, b, n);
  }
  void rope_forward(Out out, Operand qkv, int B, int T, int H, int KVH, int hd,
                    const RopeSpec& rope) const override {
    in_.rope_forward(out, qkv, B, T, H, KVH, hd, rope);
  }
  void rope_backward(Out out, Operand dqkv, int B, int T, int H, int KVH, int hd,
                     const RopeSpec& rope) const override {
    in_.rope_backward(out, dqkv, B, T, H, KVH, hd, rope);
  }
  void attention_forward(Out out, float* lse, Operand qkv, int B, int T, int H, int KVH,
                         int hd) const override {
    in_.attention_forward(out, lse, qkv, B, T, H, KVH, hd);
  }
  void attention_backward(GradIn dqkv, Operand dout, Operand qkv, Operand out, const float* lse,
                          int B, int T, int H, int KVH, int hd) const override {
    in_.attention_backward(dqkv, dout, qkv, out, lse, B, T, H, KVH, hd);
  }
  double lmhead_xent(float* loss, float* dx, float* dw, const float* x, Operand w,
                     const int32_t* targets, int N, int C, int V,
                     float grad_scale) const override {
    return in_.lmhead_xent(loss, dx, dw, x, w, targets, N, C, V, grad_scale);
  }
  void lmhead_xent_into(double* total, float* loss, float* dx, float* dw, const float* x,
                        Operand w, const int32_t* targets, int N, int C, int V,
                        float grad_scale) const override {
    in_.lmhead_xent_into(total, loss, dx, dw, x, w, targets, N, C, V, grad_scale);
  }
  void vocab_embedding_forward(float* out, const int32_t* tokens, Operand wte, int64_t v_lo,
                               int N, int C, int V) const override {
    in_.vocab_embedding_forward(out, tokens, wte, v_lo, N, C, V);
  }
  void vocab_embedding_backward(float* dwte, const float* dout, const int32_t* tokens,
                                int64_t v_lo, int N, int C, int V) const override {
    in_.vocab_embedding_backward(dwte, dout, tokens, v_lo, N, C, V);
  }
  void position_forward(float* out, const float* wpe, int64_t row_lo, int rows, int T,
                        int C) const override {
    in_.position_forward(out, wpe, row_lo, rows, T, C);
  }
  void position_backward(float* dwpe, const float* dout, int64_t row_lo, int rows, int T,
                         int C) const override {
    in_.position_backward(dwpe, dout, row_lo, rows, T, C);
  }
  void xent_shard_stats(float* stats, const float* h, Operand w, const int32_t* targets,
                        int64_t v_lo, int N, int C, int V) const override {
    in_.xent_shard_stats(stats, h, w, targets, v_lo, N, C, V);
  }
  void xent_shard_combine(double* total, float* lse, float* loss, const float* stats,
                          const int32_t* targets, int t, int N) const override {
    in_.xent_shard_combine(total, lse, loss, stats, targets, t, N);
  }
  void xent_shard_backward(float* dh, GradOut dw, const float* h, Operand w, const float* lse,
                           const int32_t* targets, int64_t v_lo, int N, int C, int V,
                           float grad_scale) const override {
    in_.xent_shard_backward(dh, dw, h, w, lse, targets, v_lo, N, C, V, grad_scale);
  }
  void adamw(float* param, const float* grad, float* m, float* v, size_t n, float lr,
             float beta1, float beta2, float eps, float wd, int step, float grad_mult,
             const AdamWCopies& copies) const override {
    in_.adamw(param, grad, m, v, n, lr, beta1, beta2, eps, wd, step, grad_mult, copies);
  }
  void sgd(float* param, const float* grad, float* m, size_t n, float lr, float momentum,
           float dampening, bool nesterov, float wd, float scale, int step,
           float grad_mult) const override {
    in_.sgd(param, grad, m, n, lr, momentum, dampening, nesterov, wd, scale, step, grad_mult);
  }
  void lamb_prepare(const float* param, float* grad, float* m, float* v, size_t n, float beta1,
                    float beta2, float eps, float wd, float grad_mult) const override {
    in_.lamb_prepare(param, grad, m, v, n, beta1, beta2, eps, wd, grad_mult);
  }
  void add_scaled(float* y, float a, const float* x, size_t n) const override {
    in_.add_scaled(y, a, x, n);
  }
  void sums_of_squares(const float* const* xs, const size_t* ns, int k, double* out, SumsTo to,
                       DType dt) const override {
    in_.sums_of_squares(xs, ns, k, out, to, dt);
  }
  void scale(float* x, float a, size_t n) const override { in_.scale(x, a, n); }
  void fill(float* x, float v, size_t n) const override { in_.fill(x, v, n); }
  void add_inplace(float* y, const float* x, size_t n) const override { in_.add_inplace(y, x, n); }
  void copy(float* dst, const float* src, size_t n) const override { in_.copy(dst, src, n); }
  void narrow(DType dt, const float* src, void* dst, size_t n) const override {
    in_.narrow(dt, src, dst, n);
  }
  void widen(DType dt, const void* src, float* dst, size_t n) const override {
    in_.widen(dt, src, dst, n);
  }
  void add_widened(DType dt, const void* src, float* dst, size_t n) const override {
    in_.add_widened(dt, src, dst, n);
  }
  void round_to(DType dt, float* x, size_t n) const override { in_.round_to(dt, x, n); }
  void round_copy(DType dt, float* dst, const float* src, size_t n,
                  uint16_t* dst16) const override {
    in_.round_copy(dt, dst, src, n, dst16);
  }

 protected:
  const Ops& in_;
};

}  // namespace sw
