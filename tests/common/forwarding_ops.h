// An Ops that forwards every op to another (tests): derive and override the ops a test
// changes (a deliberately broken op, an emulation of another backend's arithmetic). The ops
// with defaults in terms of others (sum_squares_each, sum_squares_into, lmhead_xent_into, the
// backward *_set forms, the *_lp forms) keep them, so they reach an override of the op they are made of;
// sum_squares_* and lmhead_xent_into need host memory.
#pragma once
#include "kernels/ops.h"

namespace swtest {

class ForwardingOps : public sw::Ops {
 public:
  explicit ForwardingOps(const sw::Ops& base) : base_(base) {}
  sw::Device device() const override { return base_.device(); }
  sw::Stream& stream() const override { return base_.stream(); }
  sw::DType compute() const override { return base_.compute(); }
  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc) const override {
    base_.gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void linear_forward(float* out, const float* inp, const float* w, const float* b, int N, int C, int OC) const override {
    base_.linear_forward(out, inp, w, b, N, C, OC);
  }
  void linear_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w, int N, int C, int OC) const override {
    base_.linear_backward(dinp, dw, db, dout, inp, w, N, C, OC);
  }
  void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C) const override {
    base_.embedding_forward(out, tokens, wte, wpe, B, T, C);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C) const override {
    base_.embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int N, int C) const override {
    base_.layernorm_forward(out, mean, rstd, inp, w, b, N, C);
  }
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w, const float* mean, const float* rstd, int N, int C) const override {
    base_.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C, float eps) const override {
    base_.rmsnorm_forward(out, rstd, inp, w, N, C, eps);
  }
  void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w, const float* rstd, int N, int C) const override {
    base_.rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
  }
  void residual_layernorm_forward(float* res, float* out, float* mean, float* rstd, const float* a, const float* b, const float* w, const float* bias, int N, int C) const override {
    base_.residual_layernorm_forward(res, out, mean, rstd, a, b, w, bias, N, C);
  }
  void residual_rmsnorm_forward(float* res, float* out, float* rstd, const float* a, const float* b, const float* w, int N, int C, float eps) const override {
    base_.residual_rmsnorm_forward(res, out, rstd, a, b, w, N, C, eps);
  }
  void gelu_forward(float* out, const float* inp, size_t n) const override {
    base_.gelu_forward(out, inp, n);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) const override {
    base_.gelu_backward(dinp, inp, dout, n);
  }
  void swiglu_forward(float* out, const float* gu, int N, int F) const override {
    base_.swiglu_forward(out, gu, N, F);
  }
  void swiglu_backward(float* dgu, const float* dout, const float* gu, int N, int F) const override {
    base_.swiglu_backward(dgu, dout, gu, N, F);
  }
  void residual_forward(float* out, const float* a, const float* b, size_t n) const override {
    base_.residual_forward(out, a, b, n);
  }
  void rope_forward(float* qkv, int B, int T, int H, int KVH, int hd, float theta) const override {
    base_.rope_forward(qkv, B, T, H, KVH, hd, theta);
  }
  void rope_backward(float* dqkv, int B, int T, int H, int KVH, int hd, float theta) const override {
    base_.rope_backward(dqkv, B, T, H, KVH, hd, theta);
  }
  void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int H, int KVH, int hd) const override {
    base_.attention_forward(out, lse, qkv, B, T, H, KVH, hd);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int B, int T, int H, int KVH, int hd) const override {
    base_.attention_backward(dqkv, dout, qkv, out, lse, B, T, H, KVH, hd);
  }
  double lmhead_xent(float* loss, float* dx, float* dw, const float* x, sw::Operand w, const int32_t* targets, int N, int C, int V, float grad_scale) const override {
    return base_.lmhead_xent(loss, dx, dw, x, w, targets, N, C, V, grad_scale);
  }
  void adamw(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1, float beta2, float eps, float wd, int step, float grad_mult) const override {
    base_.adamw(param, grad, m, v, n, lr, beta1, beta2, eps, wd, step, grad_mult);
  }
  double sum_squares(const float* x, size_t n) const override {
    return base_.sum_squares(x, n);
  }
  void scale(float* x, float a, size_t n) const override {
    base_.scale(x, a, n);
  }
  void fill(float* x, float v, size_t n) const override {
    base_.fill(x, v, n);
  }
  void add_inplace(float* y, const float* x, size_t n) const override {
    base_.add_inplace(y, x, n);
  }
  void copy(float* dst, const float* src, size_t n) const override {
    base_.copy(dst, src, n);
  }
  void narrow(sw::DType dt, const float* src, void* dst, size_t n) const override {
    base_.narrow(dt, src, dst, n);
  }
  void widen(sw::DType dt, const void* src, float* dst, size_t n) const override {
    base_.widen(dt, src, dst, n);
  }
  void add_widened(sw::DType dt, const void* src, float* dst, size_t n) const override {
    base_.add_widened(dt, src, dst, n);
  }
  void round_to(sw::DType dt, float* x, size_t n) const override {
    base_.round_to(dt, x, n);
  }

 protected:
  const sw::Ops& base_;
};

}  // namespace swtest
