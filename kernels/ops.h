// The one dispatch header: every op the models use, forward and backward side by side.
// A backend (kernels/cpu, kernels/cuda) implements Ops; models call ops_for(device).
// Kernels know nothing of sharding, units or configs.
//
// Conventions (llm.c style):
//  * row-major; activations are (N, C) with N = B*T rows unless stated;
//  * Linear weights use PyTorch's nn.Linear layout (OC, C): y = x W^T + b;
//  * every backward ACCUMULATES (+=) into every gradient it writes, parameter and input
//    gradients alike; callers zero buffers that must start at zero (or use the *_set forms,
//    which write the input gradient instead);
//  * nullable pointers are marked "may be null";
//  * results are deterministic for a fixed thread count (static partitioning, fixed-order
//    reductions): two identical runs give bit-identical numbers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/device.h"
#include "core/dtype.h"
#include "core/stream.h"

namespace sw {

class Buffer;  // core/alloc.h

// A matrix product's operand (the *_lp forms below): fp32 values, or the Ops' compute()
// precision's 16-bit values as `narrow` writes them, or both. Made implicitly from either
// pointer. Both set (a mixed-precision unit's weights: its rounded fp32 compute copy and the
// 16-bit copy beside it, sharding/unit_state.h) means the same values twice: f32 holds
// exactly widen(lp), and a backend reads whichever form it reads faster (CUDA the 16-bit one,
// which cuBLAS takes as it is; the CPU the fp32 one, which its kernels pack from).
struct Operand {
  const float* f32 = nullptr;
  const uint16_t* lp = nullptr;
  Operand(std::nullptr_t) {}
  Operand(const float* p) : f32(p) {}
  Operand(const uint16_t* p) : lp(p) {}
  Operand(const float* p, const uint16_t* p16) : f32(p), lp(p16) {}
  // The operand k values further on (a column block of a packed matrix).
  Operand at(size_t k) const { return {f32 ? f32 + k : nullptr, lp ? lp + k : nullptr}; }
};

// A parameter gradient a backward op produces: added into (+=, the default, and what a plain
// float* converts to), or, with `write`, written (=): the op writes every value and never reads
// the old ones, which may be garbage (NaN included). The engine hands a unit `write` where the
// gradient buffer is still unwritten this step (UnitCtx::grad_out): the first writer then
// saves the zeroing pass and the read of the zeros (a GEMM's beta = 0). Either way the values
// are those of a zeroed buffer added into (a zero may carry the other sign).
struct GradOut {
  float* p = nullptr;
  bool write = false;
  GradOut(std::nullptr_t) {}
  GradOut(float* q) : p(q) {}
  GradOut(float* q, bool w) : p(q), write(w && q) {}
  explicit operator bool() const { return p != nullptr; }
  float beta() const { return write ? 0.f : 1.f; }  // as a GEMM's C scale
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual Device device() const = 0;
  // The stream these ops run on (core/stream.h): the calling thread on the CPU; a CUDA
  // backend returns its compute stream, which the step executor makes wait for gathers.
  virtual Stream& stream() const { return host_stream(); }
  // The precision of the matrix products (ops_for(device, compute)); F32 for fp32 Ops.
  virtual DType compute() const { return DType::F32; }

  // ---- GEMM: C = alpha * op(A) @ op(B) + beta * C, row-major, op = transpose if flag set.
  // A is (M,K) (or (K,M) when ta), B is (K,N) (or (N,K) when tb), C is (M,N).
  virtual void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                    const float* B, int ldb, float beta, float* C, int ldc) const = 0;

  // ---- Linear: out(N,OC) = inp(N,C) @ w(OC,C)^T + b(OC) [b may be null].
  virtual void linear_forward(float* out, const float* inp, const float* w, const float* b, int N,
                              int C, int OC) const = 0;
  // dinp(N,C) += dout @ w;  dw(OC,C) += dout^T @ inp;  db(OC) += colsum(dout).
  // dinp, db may be null.
  virtual void linear_backward(float* dinp, float* dw, float* db, const float* dout,
                               const float* inp, const float* w, int N, int C, int OC) const = 0;

  // ---- Embedding: out(B,T,C) = wte[tokens[b,t]] + wpe[t] [wpe may be null].
  // Token ids must be < V (checked by the data loader, not here).
  virtual void embedding_forward(float* out, const int32_t* tokens, const float* wte,
                                 const float* wpe, int B, int T, int C) const = 0;
  virtual void embedding_backward(float* dwte, float* dwpe, const float* dout,
                                  const int32_t* tokens, int B, int T, int C) const = 0;

  // ---- LayerNorm over the last dim (eps 1e-5). mean, rstd: (N) saved for backward.
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                 const float* w, const float* b, int N, int C) const = 0;
  virtual void layernorm_backward(float* dinp, float* dw, float* db, const float* dout,
                                  const float* inp, const float* w, const float* mean,
                                  const float* rstd, int N, int C) const = 0;

  // ---- RMSNorm: out = inp * rstd * w, rstd = 1/sqrt(mean(inp^2) + eps).
  virtual void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N,
                               int C, float eps) const = 0;
  virtual void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp,
                                const float* w, const float* rstd, int N, int C) const = 0;

  // ---- Fused residual + norm (a block's "x2 = x + proj; h = norm(x2)"): res(N,C) = a + b, then
  // out = layernorm_forward / rmsnorm_forward of res, in one pass over the rows. res may alias
  // a or b (not out). Results are bit-identical to residual_forward followed by the norm.
  virtual void residual_layernorm_forward(float* res, float* out, float* mean, float* rstd,
                                          const float* a, const float* b, const float* w,
                                          const float* bias, int N, int C) const = 0;
  virtual void residual_rmsnorm_forward(float* res, float* out, float* rstd, const float* a,
                                        const float* b, const float* w, int N, int C,
                                        float eps) const = 0;

  // ---- GELU, tanh approximation (GPT-2's "gelu_new"), elementwise over n values.
  virtual void gelu_forward(float* out, const float* inp, size_t n) const = 0;
  virtual void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) const = 0;

  // ---- SwiGLU: gu is (N, 2F) with rows [gate | up]; out(N,F) = silu(gate) * up.
  virtual void swiglu_forward(float* out, const float* gu, int N, int F) const = 0;
  virtual void swiglu_backward(float* dgu, const float* dout, const float* gu, int N,
                               int F) const = 0;

  // ---- Residual: out = a + b (out may alias a or b).
  virtual void residual_forward(float* out, const float* a, const float* b, size_t n) const = 0;

  // ---- RoPE (Hugging Face rotate_half convention: dim i pairs with i + hd/2), applied in place
  // to the q and k heads of a packed qkv buffer (B, T, (H + 2*KVH) * hd) laid out
  // [q heads | k heads | v heads]; v is untouched. Position of row (b,t) is t.
  virtual void rope_forward(float* qkv, int B, int T, int H, int KVH, int hd,
                            float theta) const = 0;
  // Inverse rotation applied in place to dqkv (the gradient of the rotated q and k).
  virtual void rope_backward(float* dqkv, int B, int T, int H, int KVH, int hd,
                             float theta) const = 0;

  // ---- Causal self-attention with grouped-query heads (KVH divides H; KVH == H is MHA).
  // qkv: (B, T, (H + 2*KVH) * hd) as above; out: (B, T, H*hd);
  // lse: (B, H, T) log-sum-exp of each softmax row, saved for backward.
  // Scale 1/sqrt(hd). Never materialises more than a tile of the (T, T) score matrix per thread.
  virtual void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int H,
                                 int KVH, int hd) const = 0;
  virtual void attention_backward(float* dqkv, const float* dout, const float* qkv,
                                  const float* out, const float* lse, int B, int T, int H,
                                  int KVH, int hd) const = 0;

  // ---- Fused LM head + softmax cross-entropy (logits are never stored in full).
  // For each row n: logits = x[n] @ w^T (V), loss[n] = logsumexp(logits) - logits[targets[n]].
  // Rows with targets[n] < 0 are ignored (loss 0, no gradient).
  // If dx/dw are non-null the gradient of (grad_scale * sum_n loss[n]) is accumulated at the
  // same time: dx(N,C) += ..., dw(V,C) += .... Returns sum_n loss[n] (as double).
  // w is fp32, or (BF16 / F16 Ops) 16-bit, or both (a unit's weight with its 16-bit copy, as
  // the products take it): the products round it to the compute precision either way.
  virtual double lmhead_xent(float* loss, float* dx, float* dw, const float* x, Operand w,
                             const int32_t* targets, int N, int C, int V,
                             float grad_scale) const = 0;
  // The same, but sum_n loss[n] is ADDED to *total, one double in this backend's memory, on
  // the stream: the host reads nothing (the engine reads a step's losses once, with the
  // gradient norm). The default adds lmhead_xent's result, so it suits backends whose memory
  // the host can touch; device backends override it.
  virtual void lmhead_xent_into(double* total, float* loss, float* dx, float* dw, const float* x,
                                Operand w, const int32_t* targets, int N, int C, int V,
                                float grad_scale) const {
    *total += lmhead_xent(loss, dx, dw, x, w, targets, N, C, V, grad_scale);
  }

  // ---- First-writer forms of the backward ops whose input gradient a block writes into a
  // fresh buffer (an MLP's dh and dgu, attention's dqkv): dinp / dgu / dqkv are WRITTEN (=),
  // not accumulated, and their old contents are never read (they may be garbage, NaN
  // included); parameter gradients (dw, db) still accumulate. Each gives the values of zeroing
  // that buffer and calling the accumulating op (a zero may carry the other sign), which is
  // what these defaults do; backends override them to save the zeroing pass and the read of
  // the old values.
  // linear_backward_set and its _lp forms take dw, db as GradOuts (written where `write`).
  virtual void linear_backward_set(float* dinp, GradOut dw, GradOut db, const float* dout,
                                   const float* inp, const float* w, int N, int C,
                                   int OC) const {
    if (dinp) fill(dinp, 0.f, static_cast<size_t>(N) * static_cast<size_t>(C));
    zero_written(dw, static_cast<size_t>(OC) * static_cast<size_t>(C));
    zero_written(db, static_cast<size_t>(OC));
    linear_backward(dinp, dw.p, db.p, dout, inp, w, N, C, OC);
  }
  virtual void gelu_backward_set(float* dinp, const float* inp, const float* dout,
                                 size_t n) const {
    fill(dinp, 0.f, n);
    gelu_backward(dinp, inp, dout, n);
  }
  virtual void swiglu_backward_set(float* dgu, const float* dout, const float* gu, int N,
                                   int F) const {
    fill(dgu, 0.f, 2 * static_cast<size_t>(N) * static_cast<size_t>(F));
    swiglu_backward(dgu, dout, gu, N, F);
  }
  virtual void attention_backward_set(float* dqkv, const float* dout, const float* qkv,
                                      const float* out, const float* lse, int B, int T, int H,
                                      int KVH, int hd) const {
    fill(dqkv, 0.f, static_cast<size_t>(B) * static_cast<size_t>(T) *
                        static_cast<size_t>(H + 2 * KVH) * static_cast<size_t>(hd));
    attention_backward(dqkv, dout, qkv, out, lse, B, T, H, KVH, hd);
  }

  // ---- Matrix-product operands kept in the compute precision (BF16 / F16 Ops only; F32 Ops
  // refuse these). `*16` buffers hold compute()'s 16-bit values as `narrow` writes them. The
  // producers write narrow(op) in one pass; the products take an Operand, fp32 or 16-bit,
  // instead of narrowing an fp32 one on each call. Since the BF16 / F16 products round their
  // operands to exactly these values, the results are those of the fp32 ops bit for bit:
  //   swiglu_forward_lp(o16, ...)   == narrow(swiglu_forward(...));  gelu_forward_lp likewise;
  //     gu (GELU's inp) may be 16-bit (read as widen(gu16): a product's output kept in the
  //     compute precision, linear_forward_lp16), as in swiglu_backward_lp_set and
  //     gelu_backward_lp_set;
  //   rmsnorm_forward_lp(o16, ...)  == narrow of rmsnorm_forward's out (rstd the same); the
  //     residual and LayerNorm forms likewise;
  //   swiglu_backward_lp_set(d16, ...) == narrow(swiglu_backward_set(...));
  //   gelu_backward_lp_set(d, d16, ...) writes gelu_backward_set(d, ...) and d16 = narrow(d):
  //     both forms of a gradient (d16 may be null; d may be null where d16 is not: then only
  //     the 16-bit form, as GPT-2's fc product takes it, its bias gradient summing the
  //     widened values);
  //     in both, and in attention_backward_lp_set, dout may be 16-bit (read as widen(dout16):
  //     a product's input gradient kept in the compute precision, linear_backward_lp16_set);
  //   rope_backward_lp(d16, dqkv, ...) == narrow(rope_backward(widen(dqkv), ...)), dqkv fp32
  //     or 16-bit (only read; a 16-bit dqkv may be d16 itself: rotated in place);
  //   linear_forward_lp(out, narrow(x), narrow(w), ...) == linear_forward(out, x, w, ...);
  //   linear_forward_lp16(o16, ...) == narrow(linear_forward_lp(out, ...)): the product's
  //     output in the compute precision (as PyTorch's autocast keeps a linear's output), for
  //     outputs only element-wise ops read (the SwiGLU's gate and up, GPT-2's fc output);
  //   linear_backward_lp_set(..., narrow(dy), narrow(x), narrow(w), ...)
  //     == linear_backward_set(..., widen(narrow(dy)), x, w, ...) (db, a sum and not a
  //     product, sums the widened 16-bit dout; given both forms it sums the fp32 one, as
  //     linear_backward_set(..., dy, ...)); any of x, w, dy may also stay fp32 (the products
  //     round it as they read it);
  //   linear_backward_lp16_set(dinp16, ...) == narrow of linear_backward_lp_set(dinp, ...)'s
  //     dinp (dw, db the same): the input gradient in the compute precision (as autocast's
  //     backward gives a linear's), for gradients only an element-wise op or attention reads
  //     (the SwiGLU's and GELU's dout, attention's dout);
  //   gemm_lp(..., narrow(A), ..., narrow(B), ...) == gemm(..., A, ..., B, ...);
  //   rope_forward_lp(q16, qkv, ...) == narrow(rope_forward(widen(qkv), ...)), qkv fp32 or
  //     16-bit (only read; a 16-bit qkv may be q16 itself: the Llama's qkv product kept 16-bit,
  //     as autocast keeps a linear's output, rotated in place);
  //   attention_forward_lp(o16, lse, q16, ...) == narrow of attention_forward(o, lse, widen(q16), ...)'s o;
  //   attention_backward_lp_set(dqkv, dqkv16, dout, q16, o16, lse, ...)
  //     == attention_backward_set(dqkv, dout, widen(q16), widen(o16), lse, ...): the output as
  //     the products see it (its row dot products with dout use these values); with dqkv16
  //     (may be null), also narrow(dqkv) there (cuDNN computes dqkv 16-bit: its own values);
  //     dqkv may be null where dqkv16 is not: then only narrow(dqkv) is written (the Llama's
  //     dqkv, which the 16-bit inverse rotation reads).
  // The defaults go through fp32 copies in device scratch (a Buffer per call); backends
  // override them.
  virtual void swiglu_forward_lp(uint16_t* out16, Operand gu, int N, int F) const;
  virtual void gelu_forward_lp(uint16_t* out16, Operand inp, size_t n) const;
  virtual void rmsnorm_forward_lp(uint16_t* out16, float* rstd, const float* inp, const float* w,
                                  int N, int C, float eps) const;
  virtual void residual_rmsnorm_forward_lp(float* res, uint16_t* out16, float* rstd,
                                           const float* a, const float* b, const float* w, int N,
                                           int C, float eps) const;
  virtual void layernorm_forward_lp(uint16_t* out16, float* mean, float* rstd, const float* inp,
                                    const float* w, const float* b, int N, int C) const;
  virtual void residual_layernorm_forward_lp(float* res, uint16_t* out16, float* mean,
                                             float* rstd, const float* a, const float* b,
                                             const float* w, const float* bias, int N,
                                             int C) const;
  virtual void swiglu_backward_lp_set(uint16_t* dgu16, Operand dout, Operand gu, int N,
                                      int F) const;
  virtual void gelu_backward_lp_set(float* dinp, uint16_t* dinp16, Operand inp, Operand dout,
                                    size_t n) const;
  // dqkv16 (B, T, (H + 2*KVH) * hd) = narrow of the inverse rotation of dqkv (q and k heads;
  // v heads narrowed as they are); dqkv (fp32 or 16-bit) is only read. No overlap, except a
  // 16-bit dqkv that is dqkv16 exactly (in place).
  virtual void rope_backward_lp(uint16_t* dqkv16, Operand dqkv, int B, int T, int H, int KVH,
                                int hd, float theta) const;
  virtual void linear_forward_lp(float* out, Operand inp, Operand w, const float* b, int N, int C,
                                 int OC) const;
  // embedding_forward_lp(out, tokens, narrow(wte), ...) == embedding_forward(out, tokens,
  // widen(narrow(wte)), ...): the rows read from the 16-bit copy and widened (a mixed-precision
  // unit's fp32 compute copy holds exactly those values, so a unit keeping its embedding 16-bit
  // only, ParamSpec::products_only, computes the same bits); wte fp32 is embedding_forward.
  // V: the table's rows (the default widens all of them into device scratch; backends gather).
  virtual void embedding_forward_lp(float* out, const int32_t* tokens, Operand wte,
                                    const float* wpe, int B, int T, int C, int V) const;
  virtual void linear_forward_lp16(uint16_t* out16, Operand inp, Operand w, const float* b, int N,
                                   int C, int OC) const;
  virtual void linear_backward_lp_set(float* dinp, GradOut dw, GradOut db, Operand dout,
                                      Operand inp, Operand w, int N, int C, int OC) const;
  virtual void linear_backward_lp16_set(uint16_t* dinp16, GradOut dw, GradOut db, Operand dout,
                                        Operand inp, Operand w, int N, int C, int OC) const;
  virtual void gemm_lp(bool ta, bool tb, int M, int N, int K, float alpha, Operand A, int lda,
                       Operand B, int ldb, float beta, float* C, int ldc) const;
  virtual void rope_forward_lp(uint16_t* qkv16, Operand qkv, int B, int T, int H, int KVH,
                               int hd, float theta) const;
  virtual void attention_forward_lp(uint16_t* out16, float* lse, const uint16_t* qkv16, int B,
                                    int T, int H, int KVH, int hd) const;
  virtual void attention_backward_lp_set(float* dqkv, uint16_t* dqkv16, Operand dout,
                                         const uint16_t* qkv16, const uint16_t* out16,
                                         const float* lse, int B, int T, int H, int KVH,
                                         int hd) const;
  // A product with the residual stream added (a block's "y = x + proj(h)"): out(N,OC) =
  // inp @ w^T + b + res, b may be null, res (N,OC) fp32 and not overlapping out; inp and w
  // Operands as in linear_forward_lp (fp32 ones on F32 Ops). The values of the product
  // followed by residual_forward(out, out, res) up to the product's summation order: a device
  // adds res in the product's epilogue (CUDA: cuBLASLt with beta = 1 and C = res), where the
  // output was written, read back and written again. The default is that pair.
  virtual void linear_forward_residual(float* out, Operand inp, Operand w, const float* b,
                                       const float* res, int N, int C, int OC) const;
  // True where linear_forward_residual adds res in the product itself (CUDA with 16-bit
  // products; the simulated device, for the engine's tests): the models then take it, and a
  // plain norm after it, instead of the product and the fused residual + norm pass (the CPU's
  // choice: one pass over the rows, and its products write fp32 anyway).
  virtual bool fuses_product_residual() const { return false; }
  // The residual stream's gradient in both forms: layernorm_backward / rmsnorm_backward adding
  // into dinp, then dinp16 = narrow(dinp) of the sums (all N x C values; dinp16 overlaps
  // nothing), in the same pass on a device. The products after it read the 16-bit form (an
  // Operand with both) instead of narrowing the fp32 one. The defaults are the op, then narrow.
  virtual void layernorm_backward_lp(float* dinp, uint16_t* dinp16, float* dw, float* db,
                                     const float* dout, const float* inp, const float* w,
                                     const float* mean, const float* rstd, int N, int C) const;
  virtual void rmsnorm_backward_lp(float* dinp, uint16_t* dinp16, float* dw, const float* dout,
                                   const float* inp, const float* w, const float* rstd, int N,
                                   int C) const;

  // ---- AdamW (decoupled weight decay, bias-corrected; step counts from 1), on n elements.
  // param -= lr * (mhat / (sqrt(vhat) + eps) + wd * param), with grad multiplied by grad_mult
  // first (for clipping and gradient-accumulation averaging).
  virtual void adamw(float* param, const float* grad, float* m, float* v, size_t n, float lr,
                     float beta1, float beta2, float eps, float wd, int step,
                     float grad_mult) const = 0;
  // adamw, then the updated values' compute copies in the same pass (a one-rank unit keeping
  // its parameters 16-bit: sharding/unit_state.h): param16 = narrow(dt, param), and param32
  // (null for weights that have no fp32 compute copy) = its widening, as round_copy_lp writes
  // them. grad_dt other than F32: the gradient is read as round_to(grad_dt, grad) (not
  // written), the values of rounding it first. The default rounds a copy of it, calls adamw,
  // then round_copy_lp / narrow.
  virtual void adamw_copies(float* param, const float* grad, float* m, float* v, size_t n,
                            float lr, float beta1, float beta2, float eps, float wd, int step,
                            float grad_mult, DType dt, float* param32, uint16_t* param16,
                            DType grad_dt) const;
  // True where adamw_copies and sum_squares_rounded_into round the gradients they read as they
  // go: a one-rank unit then leaves rounding its gradients to reduce_dtype to those readers
  // instead of a pass of its own (FlatUnit::round_grads). CUDA; the simulated device, for the
  // engine's tests.
  virtual bool rounds_grads_on_read() const { return false; }
  // True where a product given an Operand with both forms reads the 16-bit one (CUDA; the
  // simulated device, for the engine's tests): the engine then keeps the residual stream's
  // gradient in both forms from unit to unit in backward (UnitCtx::grad16), so that the
  // products reading it do not narrow it each call. The CPU reads the fp32 form (its kernels
  // pack from it), so a 16-bit copy beside it would be a pass for nothing.
  virtual bool prefers_lp_operands() const { return false; }

  // ---- Utilities.
  virtual double sum_squares(const float* x, size_t n) const = 0;  // fixed-order, deterministic
  // out[i] = sum_squares(xs[i], ns[i]) for i < k (out: host memory), each bit for bit as
  // sum_squares gives it; a device backend reads all k results back at once (one host
  // synchronisation instead of k). The default calls sum_squares k times.
  virtual void sum_squares_each(const float* const* xs, const size_t* ns, int k,
                                double* out) const {
    for (int i = 0; i < k; ++i) out[i] = sum_squares(xs[i], ns[i]);
  }
  // The same k sums written to `out`: k doubles in this backend's memory, on the stream, with
  // nothing read on the host (the engine reads them with the step's losses). The default
  // suits backends whose memory the host can touch; device backends override it.
  virtual void sum_squares_into(const float* const* xs, const size_t* ns, int k,
                                double* out) const {
    sum_squares_each(xs, ns, k, out);
  }
  // sum_squares_into of the values round_to(dt, xs[i]) (xs only read), bit for bit: the norm
  // of gradients a one-rank unit has yet to round (rounds_grads_on_read). The default rounds
  // a copy of each (device scratch).
  virtual void sum_squares_rounded_into(DType dt, const float* const* xs, const size_t* ns,
                                        int k, double* out) const;
  virtual void scale(float* x, float a, size_t n) const = 0;
  virtual void fill(float* x, float v, size_t n) const = 0;
  virtual void add_inplace(float* y, const float* x, size_t n) const = 0;  // y += x
  virtual void copy(float* dst, const float* src, size_t n) const = 0;

  // ---- Precision conversions of the gather and reduce paths (mixed precision), on n values.
  // dt is F32, BF16 or F16; 16-bit values are raw uint16_t (round to nearest even, NaN stays
  // NaN, fp16 overflow becomes +-inf); F32 is a copy. The buffers must not overlap, except
  // dst == src exactly: then the n narrow values end up at the front of the buffer (narrow)
  // or the n narrow values at its front become n floats (widen).
  virtual void narrow(DType dt, const float* src, void* dst, size_t n) const = 0;
  virtual void widen(DType dt, const void* src, float* dst, size_t n) const = 0;
  virtual void add_widened(DType dt, const void* src, float* dst, size_t n) const = 0;  // dst +=
  virtual void round_to(DType dt, float* x, size_t n) const = 0;  // x = widen(narrow(x))
  // dst = widen(narrow(src)) in one pass (a mixed-precision unit's parameters from its master
  // copy: 8 bytes a value where copy + round_to move 16); dst == src is round_to, any other
  // overlap is not allowed. The default is copy + round_to (the same bits).
  virtual void round_copy(DType dt, float* dst, const float* src, size_t n) const {
    if (dst != src) copy(dst, src, n);
    round_to(dt, dst, n);
  }
  // round_copy that also writes dst16 = narrow(src) (dt BF16 / F16): a mixed-precision unit's
  // compute copy and its 16-bit copy from the master, which is read once. dst16 overlaps
  // neither. The default is round_copy + narrow (the same bits).
  virtual void round_copy_lp(DType dt, float* dst, uint16_t* dst16, const float* src,
                             size_t n) const;

 protected:
  // The *_lp forms' guard: throws sw::Error naming `op` where compute() is F32.
  void require_lowp(const char* op) const;
  // A written (GradOut::write) gradient of n values zeroed, for a default that then adds into
  // it: the values the op's contract gives.
  void zero_written(GradOut g, size_t n) const {
    if (g.write) fill(g.p, 0.f, n);
  }
  // An Operand of r rows with leading dimension ld and c columns (r > 0, c > 0) as fp32: its
  // own fp32 pointer where it has one, else its 16-bit values widened into `tmp` (made here,
  // device scratch).
  const float* operand_f32(Operand x, size_t r, size_t ld, size_t c, Buffer& tmp) const;
};

// ---- The scratch a backend's kernels keep for themselves (tracked as Mem::Workspace, outside
// the units' declared Saved / Scratch): the fused LM head's logits chunk, 16-bit operand
// copies, attention's scratch, cuBLAS's workspace. Each backend declares it for a described
// training step, so that the planner asks instead of knowing any backend's internals. The
// declarations are plain C++ built into every build (kernels/cpu/workspace.cpp,
// kernels/cuda/workspace.cpp), so a CUDA run is planned on a machine without a GPU or a build
// without CUDA; whatever a declaration depends on besides the shapes (CUDA's attention path,
// SHARDWISE_CUDA_ATTENTION) it reads itself.

// A training step's shapes, as the kernels see them.
struct StepShape {
  int B = 1, T = 1;  // micro-batch and sequence length (N = B*T rows)
  int d_model = 0, n_head = 1;
  int n_kv_head = 0;  // 0: n_head (GPT-2 always)
  int d_ff = 0;       // 0: 4 * d_model
  int vocab = 0;
  bool llama = false;  // Llama blocks (RMSNorm, SwiGLU, RoPE, grouped kv heads); else GPT-2
  DType compute = DType::F32;  // the matrix products' precision (param_dtype)
  int threads = 1;             // the CPU backend's OpenMP threads per rank (kernels/threads.h)
};
// What a backend declares: `bytes` its kernels keep through the step (grow-only scratch, after
// the first step), `backward_transient` more that a block's backward holds only while one of
// its op calls runs (the planner counts it at the blocks' backward actions), and a phrase for
// plan output saying what they are made of. Estimates where the backend's library does not
// say (cuDNN's workspace off a GPU).
struct WorkspaceDecl {
  int64_t bytes = 0;
  int64_t backward_transient = 0;
  std::string what;
};
using WorkspaceFn = WorkspaceDecl (*)(const StepShape&);
// The declaration of the backend of `kind` (the CPU's and CUDA's are built in; a kind nobody
// declared for has none: 0 bytes).
WorkspaceDecl kernel_workspace(DeviceKind kind, const StepShape& s);
// Another backend (e.g. a test device) declares its own; null removes it (built-ins return).
void register_workspace(DeviceKind kind, WorkspaceFn fn);

// The Ops of a device; throws sw::Error if this build has no backend for it.
const Ops& ops_for(Device device);
// The Ops of a device computing in `compute` precision (mixed precision). Every pointer stays
// float*: activations, parameters and gradients are fp32 in memory; F32 is ops_for(device).
// BF16 / F16: matrix products (gemm, linear_*, attention_*, lmhead_xent) round their operands
// to bf16 / fp16 (values that overflow fp16 become +-inf, so a too-large loss scale shows up
// as non-finite gradients) and accumulate in fp32; element-wise ops, norms and AdamW stay
// fp32. On the CPU, BF16 uses AVX512-BF16 instructions when the CPU has them (detected at run
// time) and an exact-rounding fallback otherwise.
const Ops& ops_for(Device device, DType compute);

// The device a name means: "cpu"; "cuda" or "sim": the device this process's registered
// backend of that kind serves; "cuda:N". Throws sw::Error naming the value when this build has
// no such backend.
Device device_from_name(const std::string& name);

// Backends register themselves (kernels/cuda does so when built), once per compute precision
// they implement; ops_for(device, compute) refuses a precision nobody registered.
void register_ops(DeviceKind kind, const Ops* ops);  // fp32
void register_ops(DeviceKind kind, DType compute, const Ops* ops);

}  // namespace sw
