// An Ops that forwards every op to another (tests): derive and override the ops a test
// changes (a deliberately broken op, an emulation of another backend's arithmetic); an
// override sees every form of its op (kernels/ops.h). lmhead_xent_into and round_copy keep
// Ops' defaults (in terms of lmhead_xent, and copy / round_to / narrow), so they reach an
// override of the op they are made of; lmhead_xent_into then needs host memory.
#pragma once
#include "kernels/ops.h"

namespace swtest {

class ForwardingOps : public sw::Ops {
 public:
  explicit ForwardingOps(const sw::Ops& base) : base_(base) {}
  sw::Device device() const override { return base_.device(); }
  sw::Stream& stream() const override { return base_.stream(); }
  sw::DType compute() const override { return base_.compute(); }
  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, sw::Operand A, int lda, sw::Operand B, int ldb, float beta, float* C, int ldc) const override {
    base_.gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void linear_forward(sw::Out out, sw::Operand inp, sw::Operand w, const float* b, const float* res, int N, int C, int OC) const override {
    base_.linear_forward(out, inp, w, b, res, N, C, OC);
  }
  void linear_backward(sw::GradIn dinp, sw::GradOut dw, sw::GradOut db, sw::Operand dout, sw::Operand inp, sw::Operand w, int N, int C, int OC) const override {
    base_.linear_backward(dinp, dw, db, dout, inp, w, N, C, OC);
  }
  void embedding_forward(float* out, const int32_t* tokens, sw::Operand wte, const float* wpe, int B, int T, int C, int V) const override {
    base_.embedding_forward(out, tokens, wte, wpe, B, T, C, V);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C) const override {
    base_.embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
  }
  void layernorm_forward(sw::Out out, float* mean, float* rstd, sw::NormIn inp, const float* w, const float* b, int N, int C) const override {
    base_.layernorm_forward(out, mean, rstd, inp, w, b, N, C);
  }
  void layernorm_backward(sw::GradIn dinp, float* dw, float* db, const float* dout, const float* inp, const float* w, const float* mean, const float* rstd, int N, int C) const override {
    base_.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  void rmsnorm_forward(sw::Out out, float* rstd, sw::NormIn inp, const float* w, int N, int C, float eps) const override {
    base_.rmsnorm_forward(out, rstd, inp, w, N, C, eps);
  }
  void rmsnorm_backward(sw::GradIn dinp, float* dw, const float* dout, const float* inp, const float* w, const float* rstd, int N, int C) const override {
    base_.rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
  }
  void gelu_forward(sw::Out out, sw::Operand inp, size_t n) const override {
    base_.gelu_forward(out, inp, n);
  }
  void gelu_backward(sw::GradIn dinp, sw::Operand inp, sw::Operand dout, size_t n) const override {
    base_.gelu_backward(dinp, inp, dout, n);
  }
  void swiglu_forward(sw::Out out, sw::Operand gu, int N, int F) const override {
    base_.swiglu_forward(out, gu, N, F);
  }
  void swiglu_backward(sw::GradIn dgu, sw::Operand dout, sw::Operand gu, int N, int F) const override {
    base_.swiglu_backward(dgu, dout, gu, N, F);
  }
  void residual_forward(float* out, const float* a, const float* b, size_t n) const override {
    base_.residual_forward(out, a, b, n);
  }
  void rope_forward(sw::Out out, sw::Operand qkv, int B, int T, int H, int KVH, int hd, const sw::RopeSpec& spec) const override {
    base_.rope_forward(out, qkv, B, T, H, KVH, hd, spec);
  }
  void rope_backward(sw::Out out, sw::Operand dqkv, int B, int T, int H, int KVH, int hd, const sw::RopeSpec& spec) const override {
    base_.rope_backward(out, dqkv, B, T, H, KVH, hd, spec);
  }
  void attention_forward(sw::Out out, float* lse, sw::Operand qkv, int B, int T, int H, int KVH, int hd) const override {
    base_.attention_forward(out, lse, qkv, B, T, H, KVH, hd);
  }
  void attention_backward(sw::GradIn dqkv, sw::Operand dout, sw::Operand qkv, sw::Operand out, const float* lse, int B, int T, int H, int KVH, int hd) const override {
    base_.attention_backward(dqkv, dout, qkv, out, lse, B, T, H, KVH, hd);
  }
  double lmhead_xent(float* loss, float* dx, float* dw, const float* x, sw::Operand w, const int32_t* targets, int N, int C, int V, float grad_scale) const override {
    return base_.lmhead_xent(loss, dx, dw, x, w, targets, N, C, V, grad_scale);
  }
  void vocab_embedding_forward(float* out, const int32_t* tokens, sw::Operand wte, int64_t v_lo, int N, int C, int V) const override {
    base_.vocab_embedding_forward(out, tokens, wte, v_lo, N, C, V);
  }
  void vocab_embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int64_t v_lo, int N, int C, int V) const override {
    base_.vocab_embedding_backward(dwte, dout, tokens, v_lo, N, C, V);
  }
  void position_forward(float* out, const float* wpe, int64_t row_lo, int rows, int T, int C) const override {
    base_.position_forward(out, wpe, row_lo, rows, T, C);
  }
  void position_backward(float* dwpe, const float* dout, int64_t row_lo, int rows, int T, int C) const override {
    base_.position_backward(dwpe, dout, row_lo, rows, T, C);
  }
  void xent_shard_stats(float* stats, const float* h, sw::Operand w, const int32_t* targets, int64_t v_lo, int N, int C, int V) const override {
    base_.xent_shard_stats(stats, h, w, targets, v_lo, N, C, V);
  }
  void xent_shard_combine(double* total, float* lse, float* loss, const float* stats, const int32_t* targets, int t, int N) const override {
    base_.xent_shard_combine(total, lse, loss, stats, targets, t, N);
  }
  void xent_shard_backward(float* dh, sw::GradOut dw, const float* h, sw::Operand w, const float* lse, const int32_t* targets, int64_t v_lo, int N, int C, int V, float grad_scale) const override {
    base_.xent_shard_backward(dh, dw, h, w, lse, targets, v_lo, N, C, V, grad_scale);
  }
  void adamw(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1, float beta2, float eps, float wd, int step, float grad_mult, const sw::AdamWCopies& copies = {}) const override {
    base_.adamw(param, grad, m, v, n, lr, beta1, beta2, eps, wd, step, grad_mult, copies);
  }
  void sgd(float* param, const float* grad, float* m, size_t n, float lr, float momentum, float dampening, bool nesterov, float wd, float scale, int step, float grad_mult) const override {
    base_.sgd(param, grad, m, n, lr, momentum, dampening, nesterov, wd, scale, step, grad_mult);
  }
  void lamb_prepare(const float* param, float* grad, float* m, float* v, size_t n, float beta1, float beta2, float eps, float wd, float grad_mult) const override {
    base_.lamb_prepare(param, grad, m, v, n, beta1, beta2, eps, wd, grad_mult);
  }
  void add_scaled(float* y, float a, const float* x, size_t n) const override { base_.add_scaled(y, a, x, n); }
  void sums_of_squares(const float* const* xs, const size_t* ns, int k, double* out, sw::SumsTo to, sw::DType dt = sw::DType::F32) const override {
    base_.sums_of_squares(xs, ns, k, out, to, dt);
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
