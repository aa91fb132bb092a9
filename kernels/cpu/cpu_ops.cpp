// The CPU backend: forwards every Ops method to its sw::cpu functions, one case per form the
// op takes (kernels/ops.h).
#include <algorithm>

#include "core/alloc.h"
#include "core/error.h"
#include "kernels/cpu/attention_bf16.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/tp_kernels.h"
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
// The 16-bit pointer of an operand the kernels take in one form: null where it has an fp32
// one (the CPU reads that: its kernels pack from fp32).
const uint16_t* lp_only(Operand x) { return x.f32 ? nullptr : x.lp; }

// compute_ is the precision of the matrix products (gemm, linear, attention, LM head); every
// other op is fp32 whatever it is.
class CpuOps final : public Ops {
 public:
  explicit CpuOps(DType compute) : compute_(compute) {}
  Device device() const override { return Device::cpu(); }
  DType compute() const override { return compute_; }

  // 16-bit operands (only where the other form is missing) widened into device scratch: the
  // kernels round fp32 operands to the same values as they pack them.
  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, Operand A, int lda, Operand B,
            int ldb, float beta, float* C, int ldc) const override {
    if (!A.has_lp() && !B.has_lp())
      return cpu::gemm_lowp(compute_, ta, tb, M, N, K, alpha, A.f32, lda, B.f32, ldb, beta, C,
                            ldc);
    require_lowp("gemm");
    Buffer ta_, tb_;
    const size_t ar = size_t(ta ? K : M), ac = size_t(ta ? M : K);
    const size_t br = size_t(tb ? N : K), bc = size_t(tb ? K : N);
    cpu::gemm_lowp(compute_, ta, tb, M, N, K, alpha, operand_f32(A, ar, size_t(lda), ac, ta_),
                   lda, operand_f32(B, br, size_t(ldb), bc, tb_), ldb, beta, C, ldc);
  }

  // Each operand in every form it has (a unit's weights come with both): the kernel reads the
  // one its path reads fastest (cpu_kernels.h linear_forward_lowp16). A 16-bit output: the
  // product's own bf16 output on the oneDNN path, else the fp32 product in this thread's output
  // scratch, narrowed. The residual:
  // residual_forward after the product (the CPU fuses it into the norm after instead).
  void linear_forward(Out out, Operand inp, Operand w, const float* b, const float* res, int N,
                      int C, int OC) const override {
    if (out.lp) {
      if (out.f32 || res) refuse("linear_forward", "a 16-bit out with an fp32 one or res");
      require_lowp("linear_forward");
      if (cpu::linear_forward_lowp16_to16(compute_, out.lp, inp.f32, inp.lp, w.f32, w.lp, b, N, C,
                                          OC))
        return;  // (oneDNN's bf16 output)
      const size_t no = extent(N, OC);
      float* o = out_scratch(no);
      product(o, inp, w, b, N, C, OC);
      return cpu::narrow(compute_, o, out.lp, no);
    }
    if (inp.has_lp() || w.has_lp()) require_lowp("linear_forward");
    product(out.f32, inp, w, b, N, C, OC);
    if (res) cpu::residual_forward(out.f32, out.f32, res, extent(N, OC));
  }
  void linear_backward(GradIn dinp, GradOut dw, GradOut db, Operand dout, Operand inp, Operand w,
                       int N, int C, int OC) const override {
    if (dinp.lp && (dinp.f32 || !dinp.write))
      refuse("linear_backward", "dinp 16-bit beside fp32 or added into");
    const bool lp = dout.has_lp() || inp.has_lp() || w.has_lp() || dinp.lp;
    if (lp) require_lowp("linear_backward");
    // dinp 16-bit alone: written by the product where the path can (oneDNN's bf16 output), else
    // its fp32 values in this thread's output scratch, narrowed.
    if (dinp.lp && cpu::linear_backward_lowp16_to16(compute_, dinp.lp, dw.p, db.p, dout.f32,
                                                    dout.lp, inp.f32, inp.lp, w.f32, w.lp, N, C,
                                                    OC, dw.beta(), db.write))
      return;
    const size_t ni = extent(N, C);
    float* d = dinp.lp ? out_scratch(ni) : dinp.f32;
    // Every form each operand has: the kernel reads the one its path reads fastest (oneDNN the
    // 16-bit one, in place; the others fp32). (The weight is read for dinp only.)
    cpu::linear_backward_lowp16(compute_, d, dw.p, db.p, dout.f32, dout.lp, inp.f32, inp.lp,
                                w.f32, w.lp, N, C, OC, dinp.write || dinp.lp ? 0.f : 1.f,
                                dw.beta(), db.write);
    if (dinp.lp) cpu::narrow(compute_, d, dinp.lp, ni);
  }

  // The fp32 table where given, else the 16-bit rows widened.
  void embedding_forward(float* out, const int32_t* tokens, Operand wte, const float* wpe, int B,
                         int T, int C, int /*V*/) const override {
    if (wte.f32) return cpu::embedding_forward(out, tokens, wte.f32, wpe, B, T, C);
    require_lowp("embedding_forward");
    cpu::embedding_forward_lp(compute_, out, tokens, wte.lp, wpe, B, T, C);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                          int B, int T, int C) const override {
    cpu::embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
  }

  // The norms' 16-bit outputs: the fp32 kernels with only the store narrowed (norm.cpp).
  void layernorm_forward(Out out, float* mean, float* rstd, NormIn inp, const float* w,
                         const float* b, int N, int C) const override {
    if (out.lp) {
      require_lowp("layernorm_forward");
      if (inp.b)
        return cpu::residual_layernorm_forward_lp(compute_, inp.res, out.lp, mean, rstd, inp.a,
                                                  inp.b, w, b, N, C);
      return cpu::layernorm_forward_lp(compute_, out.lp, mean, rstd, inp.a, w, b, N, C);
    }
    if (inp.b)
      return cpu::residual_layernorm_forward(inp.res, out.f32, mean, rstd, inp.a, inp.b, w, b, N,
                                             C);
    cpu::layernorm_forward(out.f32, mean, rstd, inp.a, w, b, N, C);
  }
  // The residual gradient's 16-bit form: the fp32 op, then narrow.
  void layernorm_backward(GradIn dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, int N,
                          int C) const override {
    norm_dinp("layernorm_backward", dinp);
    cpu::layernorm_backward(dinp.f32, dw, db, dout, inp, w, mean, rstd, N, C, dinp.lp, compute_);
  }
  void rmsnorm_forward(Out out, float* rstd, NormIn inp, const float* w, int N, int C,
                       float eps) const override {
    if (out.lp) {
      require_lowp("rmsnorm_forward");
      if (inp.b)
        return cpu::residual_rmsnorm_forward_lp(compute_, inp.res, out.lp, rstd, inp.a, inp.b, w,
                                                N, C, eps);
      return cpu::rmsnorm_forward_lp(compute_, out.lp, rstd, inp.a, w, N, C, eps);
    }
    if (inp.b)
      return cpu::residual_rmsnorm_forward(inp.res, out.f32, rstd, inp.a, inp.b, w, N, C, eps);
    cpu::rmsnorm_forward(out.f32, rstd, inp.a, w, N, C, eps);
  }
  void rmsnorm_backward(GradIn dinp, float* dw, const float* dout, const float* inp,
                        const float* w, const float* rstd, int N, int C) const override {
    norm_dinp("rmsnorm_backward", dinp);
    cpu::rmsnorm_backward(dinp.f32, dw, dout, inp, w, rstd, N, C, dinp.lp, compute_);
  }

  void gelu_forward(Out out, Operand inp, size_t n) const override {
    if (out.lp) {
      require_lowp("gelu_forward");
      if (inp.f32) return cpu::gelu_forward_lp(compute_, out.lp, inp.f32, n);
      return cpu::gelu_forward_lp(compute_, out.lp, inp.lp, n);
    }
    if (!inp.f32 && n) refuse("gelu_forward", "an fp32 out from a 16-bit inp");
    cpu::gelu_forward(out.f32, inp.f32, n);
  }
  void gelu_backward(GradIn dinp, Operand inp, Operand dout, size_t n) const override {
    if (!dinp.lp && !inp.has_lp() && !dout.has_lp())
      return cpu::gelu_backward(dinp.f32, inp.f32, dout.f32, n, dinp.write);
    require_lowp("gelu_backward");
    if (!dinp.write || !dinp) refuse("gelu_backward", "16-bit forms without dinp written");
    if (!dinp.f32)  // the 16-bit form alone: narrowed as it is written
      return cpu::gelu_backward_lp_set(compute_, dinp.lp, inp.f32, lp_only(inp), dout.f32,
                                       lp_only(dout), n);
    cpu::gelu_backward_set(compute_, dinp.f32, inp.f32, lp_only(inp), dout.f32, lp_only(dout), n);
    if (dinp.lp) narrow(compute_, dinp.f32, dinp.lp, n);
  }
  void swiglu_forward(Out out, Operand gu, int N, int F) const override {
    if (out.lp) {
      require_lowp("swiglu_forward");
      if (gu.f32) return cpu::swiglu_forward_lp(compute_, out.lp, gu.f32, N, F);
      return cpu::swiglu_forward_lp(compute_, out.lp, gu.lp, N, F);
    }
    if (!gu.f32 && N && F) refuse("swiglu_forward", "an fp32 out from a 16-bit gu");
    cpu::swiglu_forward(out.f32, gu.f32, N, F);
  }
  void swiglu_backward(GradIn dgu, Operand dout, Operand gu, int N, int F) const override {
    if (!dgu.lp && !dout.has_lp() && !gu.has_lp())
      return cpu::swiglu_backward(dgu.f32, dout.f32, gu.f32, N, F, dgu.write);
    require_lowp("swiglu_backward");
    if (!dgu.write || dgu.f32 || !dgu.lp)
      refuse("swiglu_backward", "16-bit forms with dgu other than 16-bit and written");
    cpu::swiglu_backward_lp_set(compute_, dgu.lp, dout.f32, lp_only(dout), gu.f32, lp_only(gu),
                                N, F);
  }
  void residual_forward(float* out, const float* a, const float* b, size_t n) const override {
    cpu::residual_forward(out, a, b, n);
  }

  void rope_forward(Out out, Operand qkv, int B, int T, int H, int KVH, int hd,
                    const RopeSpec& spec) const override {
    if (!out.lp) {
      rope_in_place("rope_forward", out, qkv);
      return cpu::rope_forward(out.f32, B, T, H, KVH, hd, spec);
    }
    require_lowp("rope_forward");
    if (qkv.f32) return cpu::rope_forward_lp(compute_, out.lp, qkv.f32, B, T, H, KVH, hd, spec);
    cpu::rope_forward_lp(compute_, out.lp, qkv.lp, B, T, H, KVH, hd, spec);
  }
  void rope_backward(Out out, Operand dqkv, int B, int T, int H, int KVH, int hd,
                     const RopeSpec& spec) const override {
    if (!out.lp) {
      rope_in_place("rope_backward", out, dqkv);
      return cpu::rope_backward(out.f32, B, T, H, KVH, hd, spec);
    }
    require_lowp("rope_backward");
    if (dqkv.f32)
      return cpu::rope_backward_lp(compute_, out.lp, dqkv.f32, B, T, H, KVH, hd, spec);
    cpu::rope_backward_lp(compute_, out.lp, dqkv.lp, B, T, H, KVH, hd, spec);
  }

  // 16-bit: the fp32 output in this thread's output scratch, narrowed.
  void attention_forward(Out out, float* lse, Operand qkv, int B, int T, int H, int KVH,
                         int hd) const override {
    if (!out.lp && !qkv.has_lp())
      return cpu::attention_forward(out.f32, lse, qkv.f32, B, T, H, KVH, hd, compute_);
    require_lowp("attention_forward");
    if (!out.lp || !qkv.lp) refuse("attention_forward", "one of out and qkv 16-bit");
    if (cpu::attention_bf16_writes16(compute_, H, KVH, false))  // (narrowed as it is written)
      return cpu::attention_forward_bf16_out(out.lp, lse, qkv.lp, B, T, H, KVH, hd);
    const size_t no = extent(B * T, H * hd);
    float* o = out_scratch(no);
    cpu::attention_forward(o, lse, nullptr, B, T, H, KVH, hd, compute_, qkv.lp);
    cpu::narrow(compute_, o, out.lp, no);
  }
  // 16-bit: without an fp32 dqkv, its values in this thread's output scratch, narrowed.
  void attention_backward(GradIn dqkv, Operand dout, Operand qkv, Operand out, const float* lse,
                          int B, int T, int H, int KVH, int hd) const override {
    if (!qkv.has_lp() && !out.has_lp() && !dout.has_lp() && !dqkv.lp)
      return cpu::attention_backward(dqkv.f32, dout.f32, qkv.f32, out.f32, lse, B, T, H, KVH, hd,
                                     compute_, dqkv.write);
    require_lowp("attention_backward");
    attention_lp_forms(dqkv, qkv, out);
    if (!dqkv.f32 && cpu::attention_bf16_writes16(compute_, H, KVH, true))
      return cpu::attention_backward_bf16_out(dqkv.lp, dout.f32, lp_only(dout), qkv.lp, out.lp,
                                              lse, B, T, H, KVH, hd);
    const size_t nq = extent(B * T, (H + 2 * KVH) * hd);
    float* d = dqkv.f32 ? dqkv.f32 : out_scratch(nq);
    cpu::attention_backward(d, dout.f32, nullptr, nullptr, lse, B, T, H, KVH, hd, compute_, true,
                            qkv.lp, out.lp, lp_only(dout));
    if (dqkv.lp) cpu::narrow(compute_, d, dqkv.lp, nq);
  }

  // The weight as fp32 where it has that form (a 16-bit one alone, as the simulated device
  // hands a products-only LM head, widened first).
  double lmhead_xent(float* loss, float* dx, float* dw, const float* x, Operand w,
                     const int32_t* targets, int N, int C, int V,
                     float grad_scale) const override {
    // The oneDNN path reads the bf16 form alone: a 16-bit-only w is not widened for it.
    Buffer tw;
    const bool lp_alone = !w.f32 && w.lp && cpu::lowp_onednn(compute_);
    return cpu::lmhead_xent(loss, dx, dw, x, lp_alone ? nullptr : weight_f32(w, V, C, tw),
                            targets, N, C, V, grad_scale, compute_, w.lp);
  }
  // Tensor parallelism (kernels/cpu/tp_kernels.cpp). The table and the head's weight as fp32
  // where given, else widened (the table's rows as embedding_forward widens them).
  void vocab_embedding_forward(float* out, const int32_t* tokens, Operand wte, int64_t v_lo,
                               int N, int C, int V) const override {
    if (!wte.f32 && wte.lp) require_lowp("vocab_embedding_forward");
    cpu::vocab_embedding_forward(out, tokens, wte.f32, wte.f32 ? nullptr : wte.lp, compute_, v_lo,
                                 N, C, V);
  }
  void vocab_embedding_backward(float* dwte, const float* dout, const int32_t* tokens,
                                int64_t v_lo, int N, int C, int V) const override {
    cpu::vocab_embedding_backward(dwte, dout, tokens, v_lo, N, C, V);
  }
  void position_forward(float* out, const float* wpe, int64_t row_lo, int rows, int T,
                        int C) const override {
    cpu::position_forward(out, wpe, row_lo, rows, T, C);
  }
  void position_backward(float* dwpe, const float* dout, int64_t row_lo, int rows, int T,
                         int C) const override {
    cpu::position_backward(dwpe, dout, row_lo, rows, T, C);
  }
  void xent_shard_stats(float* stats, const float* h, Operand w, const int32_t* targets,
                        int64_t v_lo, int N, int C, int V) const override {
    Buffer tw;
    cpu::xent_shard_stats(stats, h, weight_f32(w, V, C, tw), targets, v_lo, N, C, V, compute_);
  }
  void xent_shard_combine(double* total, float* lse, float* loss, const float* stats,
                          const int32_t* targets, int t, int N) const override {
    *total += cpu::xent_shard_combine(lse, loss, stats, targets, t, N);
  }
  void xent_shard_backward(float* dh, GradOut dw, const float* h, Operand w, const float* lse,
                           const int32_t* targets, int64_t v_lo, int N, int C, int V,
                           float grad_scale) const override {
    Buffer tw;
    cpu::xent_shard_backward(dh, dw.p, dw.beta(), h, weight_f32(w, V, C, tw), lse,
                             targets, v_lo, N, C, V, grad_scale, compute_);
  }
  // The copies: a 16-bit one alone in AdamW's pass, others through the fp32 ops
  // (Ops::adamw_through_copies).
  void adamw(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1,
             float beta2, float eps, float wd, int step, float grad_mult,
             const AdamWCopies& copies = {}) const override {
    if (copies.dt != DType::F32 && copies.param16 && !copies.param32 &&
        (copies.grad_dt == DType::F32 || copies.grad_dt == DType::BF16))
      // the 16-bit copy alone: written in the same pass (gradients rounded as they are read)
      return cpu::adamw16(param, grad, m, v, n, lr, beta1, beta2, eps, wd, step, grad_mult,
                          copies.dt, copies.param16, copies.grad_dt);
    if (copies.dt != DType::F32)
      return adamw_through_copies(param, grad, m, v, n, lr, beta1, beta2, eps, wd, step,
                                  grad_mult, copies);
    cpu::adamw(param, grad, m, v, n, lr, beta1, beta2, eps, wd, step, grad_mult);
  }
  void sgd(float* param, const float* grad, float* m, size_t n, float lr, float momentum,
           float dampening, bool nesterov, float wd, float scale, int step,
           float grad_mult) const override {
    cpu::sgd(param, grad, m, n, lr, momentum, dampening, nesterov, wd, scale, step, grad_mult);
  }
  void lamb_prepare(const float* param, float* grad, float* m, float* v, size_t n, float beta1,
                    float beta2, float eps, float wd, float grad_mult) const override {
    cpu::lamb_prepare(param, grad, m, v, n, beta1, beta2, eps, wd, grad_mult);
  }
  void add_scaled(float* y, float a, const float* x, size_t n) const override {
    cpu::add_scaled(y, a, x, n);
  }
  // Host memory either way; values rounded to bf16 as they are read, to fp16 through copies
  // (Ops::sums_rounded_through_copies).
  void sums_of_squares(const float* const* xs, const size_t* ns, int k, double* out,
                       SumsTo /*to*/, DType dt = DType::F32) const override {
    if (dt == DType::BF16) {
      for (int i = 0; i < k; ++i) out[i] = cpu::sum_squares_bf16(xs[i], ns[i]);
      return;
    }
    if (dt != DType::F32) return sums_rounded_through_copies(dt, xs, ns, k, out);
    for (int i = 0; i < k; ++i) out[i] = cpu::sum_squares(xs[i], ns[i]);
  }
  // A one-rank unit's gradients rounded to bf16 by their readers (AdamW's pass and the norm's
  // sums, above), not in a pass of their own (~1.5 ms of the small bf16 model's step). fp16
  // keeps the pass (rounding on read would go through copies here).
  bool rounds_grads_on_read(DType dt) const override { return dt == DType::BF16; }
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
  void round_copy(DType dt, float* dst, const float* src, size_t n,
                  uint16_t* dst16 = nullptr) const override {
    if (!dst16) return cpu::round_copy(dt, dst, src, n);
    SW_CHECK(dt != DType::F32, "round_copy: a 16-bit copy needs a 16-bit dtype");
    cpu::round_copy_lp(dt, dst, dst16, src, n);
  }

 private:
  // A product in fp32 (out), its operands in every form they have (as linear_backward).
  void product(float* out, Operand inp, Operand w, const float* b, int N, int C, int OC) const {
    cpu::linear_forward_lowp16(compute_, out, inp.f32, inp.lp, w.f32, w.lp, b, N, C, OC);
  }
  // A linear's (OC, C) weight as fp32 (operand_f32; empty shapes read nothing).
  const float* weight_f32(Operand w, int OC, int C, Buffer& t) const {
    return operand_f32(w, size_t(std::max(OC, 0)), size_t(std::max(C, 0)),
                       size_t(std::max(C, 0)), t);
  }
  // The norms' dinp: fp32 added into, a 16-bit form beside it (BF16 / F16) written.
  void norm_dinp(const char* op, GradIn dinp) const {
    if (!dinp.f32 || dinp.write) refuse(op, "dinp other than fp32 added into");
    if (dinp.lp) require_lowp(op);
  }
  // rope's fp32 form: in place.
  static void rope_in_place(const char* op, Out out, Operand in) {
    if (in.lp || in.f32 != out.f32) refuse(op, "an fp32 out other than the fp32 input itself");
  }
  // attention's backward 16-bit form: qkv and out 16-bit, dqkv written.
  static void attention_lp_forms(GradIn dqkv, Operand qkv, Operand out) {
    if (!qkv.lp || !out.lp) refuse("attention_backward", "16-bit forms without 16-bit qkv and out");
    if (!dqkv.write || !dqkv) refuse("attention_backward", "16-bit forms with dqkv added into");
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
