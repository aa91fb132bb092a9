// FP8 linears (issue 39, point 3), in the style of torchtitan's float8 "tensorwise" recipe and
// Transformer Engine: an Ops decorator over a backend's bf16 Ops. Every op is forwarded to the
// wrapped Ops but the two Linear ones:
//
//   forward   y = x W^T: x and W quantised to E4M3, fp32 accumulation, bias added in fp32; the
//             output fp32 or the compute dtype's 16-bit as the Out form asks (kernels/ops.h);
//   backward  dout quantised to E5M2; dinp = dout W (E5M2 x E4M3), dW = dout^T x (E5M2 x E4M3);
//             db from dout's unquantised values (the wrapped Ops' own column sums).
//
// Scaling is per tensor. "current" (the default): scale = fp8_max / amax over the whole tensor
// as the op sees it (amax 0 or not finite: scale 1; amax below 1e-12 counts as 1e-12, as
// torchao's amax_to_scale clamps it). "delayed": the scale comes from the largest amax of the
// last `amax_history` calls of the same call site (the current amax is recorded after the scale
// is taken; a site's first call uses its current amax; every forward call records, so a
// recomputed forward or a micro-step counts as a call). A call site is keyed by the weight's
// pointer and the shape (C, OC): a unit whose gathered buffers are freed and gathered again
// (FULL_SHARD) may hand a buffer to another unit of the same shape, which then shares the
// history. That is a heuristic of the delayed recipe, never a correctness issue: values beyond
// fp8_max saturate.
//
// Quantisation: x * scale in fp32, rounded to the format by round to nearest even, saturating to
// +-fp8_max (inf included; torch's x.clamp(-max, max).to(torch.float8_*)), subnormals of the
// format kept, NaN kept (it propagates through the product as in bf16). round_fp8 below is the
// host definition both backends follow.
//
// Backends supply the primitives as Fp8Kernels (registered per device kind; the CPU's is built
// in): the CPU twin stores each quantised value as the bf16 holding it (every E4M3 / E5M2 value
// is a bf16 value) and multiplies with the oneDNN bf16 GEMM: products of fp8 values are exact in
// fp32, so it emulates an fp8 GEMM with fp32 accumulation up to the summation order. CUDA
// (kernels/cuda/fp8.cu): one byte a value and cuBLASLt's fp8 matmul. The quantised copies are
// backend scratch (Mem::Workspace) that the backends' workspace declarations do not count.
//
// The LM head (lmhead_xent), attention and the norms stay in the wrapped Ops' bf16 / fp32. The
// inference path's last-position logits, which the models compute with linear_forward, go fp8:
// this decorator cannot tell that call from a block's product (a B-row product sampling reads).
// No fp8 all-gather: units gather their bf16 weights as before.
#pragma once
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "kernels/ops.h"

namespace sw {

enum class Fp8Format : uint8_t { E4M3, E5M2 };  ///< torch.float8_e4m3fn, torch.float8_e5m2

/// The largest finite value of the format: 448 (E4M3), 57344 (E5M2).
constexpr float fp8_max(Fp8Format f) { return f == Fp8Format::E4M3 ? 448.f : 57344.f; }

/// v rounded to the format (round to nearest even; beyond +-fp8_max, infinities included:
/// +-fp8_max; NaN: NaN), as a float (exact).
float round_fp8(float v, Fp8Format f);

/// The per-tensor scale of a tensor whose largest magnitude is amax: fp8_max / max(amax, 1e-12)
/// in fp32; 1 where amax is 0, negative, NaN or infinite.
inline float fp8_scale(float amax, Fp8Format f) {
  if (!(amax > 0.f) || !std::isfinite(amax)) return 1.f;
  return fp8_max(f) / (amax < 1e-12f ? 1e-12f : amax);
}

/// The fp8 block of the config (engine/config_schema.cpp "fp8").
struct Fp8Recipe {
  bool delayed = false;   ///< "delayed" (else "current")
  int amax_history = 16;  ///< delayed: amaxes kept per tensor of a call site
};

/// A backend's fp8 primitives. Every pointer is in the backend's memory (host for the CPU, the
/// device for CUDA) and every call runs on the backend's stream (no host synchronisation):
/// scales live in that memory as float pairs s = {scale, 1 / scale}.
class Fp8Kernels {
 public:
  virtual ~Fp8Kernels() = default;
  /// Bytes of one quantised value (the CPU twin: 2, the bf16 holding it; CUDA: 1).
  virtual size_t elem_bytes() const = 0;
  /// *amax = max |x| over n values (x's fp32 form where it has one, else its widened bf16
  /// values); NaNs are skipped.
  virtual void amax(float* amax, Operand x, size_t n) const = 0;
  /// s[0] = fp8_scale(max(amaxes[0..count)), f), s[1] = 1 / s[0].
  virtual void scales(float* s, const float* amaxes, int count, Fp8Format f) const = 0;
  /// q = round_fp8(x * s[0], f) of the (rows, cols) row-major x, written (rows, cols), or with
  /// `transpose` (cols, rows).
  virtual void quantize(void* q, Fp8Format f, const float* s, Operand x, int rows, int cols,
                        bool transpose) const = 0;
  /// D(M, N) = (sa[1] * sb[1]) * A(M, K) B(N, K)^T + bias(N) + beta * Cin(M, N): A and B
  /// quantised (both K-major, row stride K), fp32 accumulation; bias, Cin may be null (Cin may
  /// be D's fp32 form: D += ...); D fp32 (row stride N) or bf16 (narrowed once).
  virtual void gemm(int M, int N, int K, const void* A, Fp8Format fa, const float* sa,
                    const void* B, Fp8Format fb, const float* sb, const float* bias,
                    const float* Cin, float beta, Out D) const = 0;
  /// At least `bytes` of grow-only scratch in slot (< kSlots); contents undefined.
  static constexpr int kSlots = 6;
  virtual void* scratch(int slot, size_t bytes) const = 0;
  /// n floats of the backend's memory, owned by the caller's object (amax histories); zeroed.
  virtual std::shared_ptr<float> alloc_floats(size_t n) const = 0;
  /// Whether gemm takes these sizes (cuBLASLt's fp8 matmul: multiples of 16); where not, the
  /// decorator runs the wrapped Ops' bf16 product for that call.
  virtual bool takes(int M, int N, int K) const {
    (void)M, (void)N, (void)K;
    return true;
  }
};

/// The CPU twin (kernels/cpu/fp8.cpp).
const Fp8Kernels& cpu_fp8_kernels();
/// Backends other than the CPU register theirs (kernels/cuda/fp8.cu); null where none did.
void register_fp8_kernels(DeviceKind kind, const Fp8Kernels* k);
const Fp8Kernels* fp8_kernels(DeviceKind kind);

/// The decorator. `inner` must compute in BF16 (sw::Error otherwise) and outlive it.
class Fp8Ops final : public Ops {
 public:
  Fp8Ops(const Ops& inner, const Fp8Recipe& recipe);
  const Ops& inner() const { return in_; }
  const Fp8Recipe& recipe() const { return recipe_; }

  void linear_forward(Out out, Operand inp, Operand w, const float* b, const float* res, int N,
                      int C, int OC) const override;
  void linear_backward(GradIn dinp, GradOut dw, GradOut db, Operand dout, Operand inp, Operand w,
                       int N, int C, int OC) const override;

  // ---- Everything else: the wrapped Ops.
  Device device() const override { return in_.device(); }
  Stream& stream() const override { return in_.stream(); }
  DType compute() const override { return in_.compute(); }
  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, Operand A, int lda, Operand B,
            int ldb, float beta, float* C, int ldc) const override {
    in_.gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void embedding_forward(float* out, const int32_t* tokens, Operand wte, const float* wpe, int B,
                         int T, int C, int V) const override {
    in_.embedding_forward(out, tokens, wte, wpe, B, T, C, V);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                          int T, int C) const override {
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
  void rmsnorm_backward(GradIn dinp, float* dw, const float* dout, const float* inp, const float* w,
                        const float* rstd, int N, int C) const override {
    in_.rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
  }
  void gelu_forward(Out out, Operand inp, size_t n) const override {
    in_.gelu_forward(out, inp, n);
  }
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
                     const int32_t* targets, int N, int C, int V, float grad_scale) const override {
    return in_.lmhead_xent(loss, dx, dw, x, w, targets, N, C, V, grad_scale);
  }
  void lmhead_xent_into(double* total, float* loss, float* dx, float* dw, const float* x, Operand w,
                        const int32_t* targets, int N, int C, int V,
                        float grad_scale) const override {
    in_.lmhead_xent_into(total, loss, dx, dw, x, w, targets, N, C, V, grad_scale);
  }
  void vocab_embedding_forward(float* out, const int32_t* tokens, Operand wte, int64_t v_lo, int N,
                               int C, int V) const override {
    in_.vocab_embedding_forward(out, tokens, wte, v_lo, N, C, V);
  }
  void vocab_embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int64_t v_lo,
                                int N, int C, int V) const override {
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
  bool fuses_product_residual() const override { return in_.fuses_product_residual(); }
  void adamw(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1,
             float beta2, float eps, float wd, int step, float grad_mult,
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
  bool rounds_grads_on_read() const override { return in_.rounds_grads_on_read(); }
  bool prefers_lp_operands() const override { return in_.prefers_lp_operands(); }
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

 private:
  // Delayed scaling: the amax histories of a call site (x, w, dout), in the backend's memory.
  struct Site {
    std::shared_ptr<float> hist[3];
    int pos[3] = {0, 0, 0};
    bool started[3] = {false, false, false};
  };
  // The scale pair of tensor `role` (0 x, 1 w, 2 dout) of the call site (w, C, OC) into s, the
  // amax at s[2]: current: its amax now; delayed: from the site's history (record: this call's
  // amax is recorded after: the forward's x and w and the backward's dout; the backward's x and
  // w reuse the histories as they stand).
  void scale_of(float* s, int role, Fp8Format f, Operand x, size_t n, const void* wkey, int C,
                int OC, bool record) const;

  const Ops& in_;
  const Fp8Kernels& k_;
  Fp8Recipe recipe_;
  mutable std::mutex mu_;
  mutable std::map<std::tuple<const void*, int, int>, Site> sites_;
};

/// An Fp8Ops over `inner` (shared: the ShardedModel keeps it with its context).
std::shared_ptr<const Ops> make_fp8_ops(const Ops& inner, const Fp8Recipe& recipe);

}  // namespace sw
