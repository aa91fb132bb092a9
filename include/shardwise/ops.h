/// The one dispatch header: every op the models use, forward and backward side by side. @file
/// A backend (kernels/cpu, kernels/cuda) implements Ops; models call ops_for(device).
/// Kernels know nothing of sharding, units or configs.
///
/// Conventions (llm.c style):
///  * row-major; activations are (N, C) with N = B*T rows unless stated;
///  * Linear weights use PyTorch's nn.Linear layout (OC, C): y = x W^T + b;
///  * each op has one forward and one backward entry. What a buffer holds and whether it is
///    read, written or added into is said by its type: an Operand is read (fp32, 16-bit or
///    both), an Out is written (=), a GradIn / GradOut gradient is added into (+=, what a
///    plain float* converts to) or, where asked, written; callers zero buffers that must start
///    at zero before adding;
///  * 16-bit forms hold compute()'s values (BF16 / F16 Ops only; F32 Ops refuse them) as
///    `narrow` writes them. A 16-bit input gives the bits of the fp32 op on its widened
///    values, a 16-bit output is narrow() of the fp32 op's output, a written gradient the
///    values of zeroing and adding (a zero may carry the other sign): bit for bit on each
///    backend. The forms each op takes are listed with it; any other combination is refused
///    (sw::Error naming the op);
///  * nullable pointers are marked "may be null";
///  * results are deterministic for a fixed thread count (static partitioning, fixed-order
///    reductions): two identical runs give bit-identical numbers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <math.h>
#include <string>

#include "shardwise/device.h"
#include "shardwise/dtype.h"
#include "shardwise/stream.h"

namespace sw {

class Buffer;  ///< core/alloc.h

/// RoPE's frequencies: base theta, and optionally Llama 3.1's "llama3" scaling (transformers'
/// _compute_llama3_parameters): with wavelength w = 2*pi / f of the plain frequency f, pairs
/// with w above original_max_pos / low_freq_factor are slowed by `factor`, those below
/// original_max_pos / high_freq_factor kept, those between blended smoothly. Made implicitly
/// from a plain theta.
struct RopeSpec {
  float theta = 10000.f;
  bool llama3 = false;
  float factor = 8.f, low_freq_factor = 1.f, high_freq_factor = 4.f;
  int original_max_pos = 8192;
  RopeSpec() = default;
  RopeSpec(float th) : theta(th) {}  ///< NOLINT: plain RoPE
  bool same(const RopeSpec& o) const {
    return theta == o.theta && llama3 == o.llama3 && factor == o.factor &&
           low_freq_factor == o.low_freq_factor && high_freq_factor == o.high_freq_factor &&
           original_max_pos == o.original_max_pos;
  }
};

#if defined(__CUDACC__)
#define SW_ROPE_HD __host__ __device__
#else
#define SW_ROPE_HD
#endif
/// The inverse frequency of pair i (< hd/2) of a head of hd dims, as transformers computes it in
/// fp32: 1 / theta^(float(2i)/hd) (pow in double, rounded to float), then the llama3 scaling in
/// double rounded once. The CPU table (kernels/cpu/rope.cpp) and CUDA's (kernels/cuda) both
/// call this one function.
SW_ROPE_HD inline float rope_inv_freq(const RopeSpec& r, int i, int hd) {
  const float expo = static_cast<float>(2 * i) / static_cast<float>(hd);
  const float f = 1.f / static_cast<float>(::pow(static_cast<double>(r.theta), double(expo)));
  if (!r.llama3) return f;
  const double pi = 3.14159265358979323846;
  const double wavelen = 2 * pi / double(f), old_len = double(r.original_max_pos);
  const double low_wl = old_len / r.low_freq_factor, high_wl = old_len / r.high_freq_factor;
  if (wavelen < high_wl) return f;
  if (wavelen > low_wl) return static_cast<float>(double(f) / r.factor);
  const double smooth =
      (old_len / wavelen - r.low_freq_factor) / (double(r.high_freq_factor) - r.low_freq_factor);
  return static_cast<float>((1 - smooth) * double(f) / r.factor + smooth * double(f));
}
#undef SW_ROPE_HD

/// An op's input: fp32 values, or compute()'s 16-bit values, or both. Made implicitly from
/// either pointer. Both set (a mixed-precision unit's weights: its rounded fp32 compute copy and
/// the 16-bit copy beside it, sharding/unit_state.h; the residual stream's gradient kept in
/// both forms) means the same values twice: f32 holds exactly widen(lp), and a backend reads
/// whichever form it reads faster (CUDA the 16-bit one, which cuBLAS takes as it is; the CPU
/// the fp32 one, which its kernels pack from).
struct Operand {
  const float* f32 = nullptr;
  const uint16_t* lp = nullptr;
  Operand(std::nullptr_t) {}
  Operand(const float* p) : f32(p) {}
  Operand(const uint16_t* p) : lp(p) {}
  Operand(const float* p, const uint16_t* p16) : f32(p), lp(p16) {}
  /// The operand k values further on (a column block of a packed matrix).
  Operand at(size_t k) const { return {f32 ? f32 + k : nullptr, lp ? lp + k : nullptr}; }
  bool has_lp() const { return lp != nullptr; }
};

/// An op's output, written (=; the old contents are never read): fp32 values, or compute()'s
/// 16-bit values alone (an output kept in the compute precision, as PyTorch's autocast keeps a
/// linear's, for readers that take it so). Made implicitly from either pointer.
struct Out {
  float* f32 = nullptr;
  uint16_t* lp = nullptr;
  Out(std::nullptr_t) {}
  Out(float* p) : f32(p) {}
  Out(uint16_t* p) : lp(p) {}
  explicit operator bool() const { return f32 || lp; }
};

/// An input gradient a backward op produces: fp32 added into (+=: the default, and what a plain
/// float* converts to), or written (=, set(): every value written, the old ones never read,
/// which may be garbage, NaN included; the values of zeroing and adding). A 16-bit form (lp) is
/// written with narrow() of the fp32 result: beside the fp32 one (both forms, for readers of
/// either), or alone (written only: the fp32 values are never stored).
struct GradIn {
  float* f32 = nullptr;
  uint16_t* lp = nullptr;
  bool write = false;
  GradIn(std::nullptr_t) {}
  GradIn(float* p) : f32(p) {}
  /// Added into (fp32), with narrow() of the sums written to p16 (may be null).
  static GradIn add(float* p, uint16_t* p16) { return GradIn(p, p16, false); }
  /// Written: fp32, 16-bit, or both (either may be null).
  static GradIn set(float* p, uint16_t* p16 = nullptr) { return GradIn(p, p16, true); }
  explicit operator bool() const { return f32 || lp; }
  bool has_lp() const { return lp != nullptr; }

 private:
  GradIn(float* p, uint16_t* p16, bool w) : f32(p), lp(p16), write(w) {}
};

/// A parameter gradient a backward op produces: added into (+=, the default, and what a plain
/// float* converts to), or, with `write`, written (=): the op writes every value and never reads
/// the old ones, which may be garbage (NaN included). The engine hands a unit `write` where the
/// gradient buffer is still unwritten this step (UnitCtx::grad_out): the first writer then
/// saves the zeroing pass and the read of the zeros (a GEMM's beta = 0). Either way the values
/// are those of a zeroed buffer added into (a zero may carry the other sign).
struct GradOut {
  float* p = nullptr;
  bool write = false;
  GradOut(std::nullptr_t) {}
  GradOut(float* q) : p(q) {}
  GradOut(float* q, bool w) : p(q), write(w && q) {}
  explicit operator bool() const { return p != nullptr; }
  float beta() const { return write ? 0.f : 1.f; }  ///< as a GEMM's C scale
};

/// A norm's input: x (made implicitly from the pointer), or residual(res, a, b): the sum a + b
/// of a block's "x2 = x + proj; h = norm(x2)", written to res (which may alias a or b, not the
/// norm's output) and normalised in the same pass over the rows, with the bits of
/// residual_forward followed by the norm.
struct NormIn {
  const float* a = nullptr;
  const float* b = nullptr;  ///< null: no residual sum
  float* res = nullptr;
  NormIn(const float* x) : a(x) {}
  static NormIn residual(float* res, const float* a, const float* b) { return NormIn(res, a, b); }

 private:
  NormIn(float* r, const float* x, const float* y) : a(x), b(y), res(r) {}
};

/// The compute copies AdamW writes of the values it updates (adamw's `copies`): none (dt F32),
/// or (dt BF16 / F16) param16 = narrow(dt, param) and param32 (may be null: weights without an
/// fp32 compute copy) its widening, as round_copy writes them (a one-rank unit keeping its
/// parameters 16-bit: sharding/unit_state.h). grad_dt other than F32: the gradient is read as
/// round_to(grad_dt, grad) (not written), the values of rounding it first.
struct AdamWCopies {
  DType dt = DType::F32;
  float* param32 = nullptr;
  uint16_t* param16 = nullptr;
  DType grad_dt = DType::F32;
};

/// Where sums_of_squares writes its k results.
enum class SumsTo : unsigned char {
  Host,    ///< host memory: a device backend reads all k back at once (one synchronisation)
  Device,  ///< k doubles in this backend's memory, on the stream; the host reads nothing
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual Device device() const = 0;
  /// The stream these ops run on (core/stream.h): the calling thread on the CPU; a CUDA
  /// backend returns its compute stream, which the step executor makes wait for gathers.
  virtual Stream& stream() const { return host_stream(); }
  /// The precision of the matrix products (ops_for(device, compute)); F32 for fp32 Ops.
  virtual DType compute() const { return DType::F32; }

  /// ---- GEMM: C = alpha * op(A) @ op(B) + beta * C, row-major, op = transpose if flag set.
  /// A is (M,K) (or (K,M) when ta), B is (K,N) (or (N,K) when tb), C is (M,N); lda, ldb count
  /// values of the form given. A, B: any forms.
  virtual void gemm(bool ta, bool tb, int M, int N, int K, float alpha, Operand A, int lda,
                    Operand B, int ldb, float beta, float* C, int ldc) const = 0;

  /// ---- Linear: out(N,OC) = inp(N,C) @ w(OC,C)^T + b(OC) + res(N,OC) [b, res may be null].
  /// inp, w: any forms. out: fp32, or 16-bit (= narrow of the fp32 output, rounded once: a
  /// product's output only element-wise ops read, the SwiGLU's gate|up, GPT-2's fc output; the
  /// CPU's oneDNN bf16 path rounds in the product, an fp32-subnormal value to a signed zero).
  /// res (the residual stream, a block's "y = x + proj(h)") only with an fp32 out, which it
  /// does not overlap: the values of the product followed by residual_forward(out, out, res) up
  /// to the product's summation order where the backend adds res in the product itself
  /// (fuses_product_residual: CUDA's cuBLASLt epilogue, beta = 1 and C = res).
  virtual void linear_forward(Out out, Operand inp, Operand w, const float* b, const float* res,
                              int N, int C, int OC) const = 0;
  /// dinp(N,C) (+)= dout @ w;  dw(OC,C) (+)= dout^T @ inp;  db(OC) (+)= colsum(dout).
  /// dinp, dw, db may be null. dout, inp, w: any forms; db, a sum and not a product, sums
  /// dout's fp32 form where it has one, else its widened 16-bit values. dinp: fp32 added into
  /// or written, or 16-bit alone (written: an input gradient only an element-wise op or
  /// attention reads, as autocast's backward gives a linear's; rounded as a 16-bit out).
  virtual void linear_backward(GradIn dinp, GradOut dw, GradOut db, Operand dout, Operand inp,
                               Operand w, int N, int C, int OC) const = 0;

  /// ---- Embedding: out(B,T,C) = wte[tokens[b,t]] + wpe[t] [wpe may be null]; wte (V, C): any
  /// form (a unit keeping its table 16-bit only reads those rows widened, ParamSpec::
  /// products_only). Token ids must be < V (checked by the data loader, not here).
  virtual void embedding_forward(float* out, const int32_t* tokens, Operand wte, const float* wpe,
                                 int B, int T, int C, int V) const = 0;
  virtual void embedding_backward(float* dwte, float* dwpe, const float* dout,
                                  const int32_t* tokens, int B, int T, int C) const = 0;

  /// ---- LayerNorm over the last dim (eps 1e-5). mean, rstd: (N) saved for backward. inp:
  /// x, or NormIn::residual (the fused residual + norm). out: fp32 or 16-bit.
  virtual void layernorm_forward(Out out, float* mean, float* rstd, NormIn inp, const float* w,
                                 const float* b, int N, int C) const = 0;
  /// dinp is added into (fp32; never written), and where it has a 16-bit form (BF16 / F16 Ops)
  /// that is written with narrow() of the sums (all N x C values, in the same pass on a device: the residual stream's
  /// gradient in both forms, which the products after it read). dw, db += (db may be null).
  virtual void layernorm_backward(GradIn dinp, float* dw, float* db, const float* dout,
                                  const float* inp, const float* w, const float* mean,
                                  const float* rstd, int N, int C) const = 0;

  /// ---- RMSNorm: out = inp * rstd * w, rstd = 1/sqrt(mean(inp^2) + eps). Forms as LayerNorm's.
  virtual void rmsnorm_forward(Out out, float* rstd, NormIn inp, const float* w, int N, int C,
                               float eps) const = 0;
  virtual void rmsnorm_backward(GradIn dinp, float* dw, const float* dout, const float* inp,
                                const float* w, const float* rstd, int N, int C) const = 0;

  /// ---- GELU, tanh approximation (GPT-2's "gelu_new"), elementwise over n values.
  /// out fp32 from an fp32 inp; or 16-bit from inp of any form.
  virtual void gelu_forward(Out out, Operand inp, size_t n) const = 0;
  /// All fp32: dinp added into or written. 16-bit anywhere (inp, dout, dinp): dinp written,
  /// fp32, 16-bit or both (GPT-2's fc product takes the 16-bit form alone, its bias gradient
  /// summing the widened values).
  virtual void gelu_backward(GradIn dinp, Operand inp, Operand dout, size_t n) const = 0;

  /// ---- SwiGLU: gu is (N, 2F) with rows [gate | up]; out(N,F) = silu(gate) * up.
  /// out fp32 from an fp32 gu; or 16-bit from gu of any form.
  virtual void swiglu_forward(Out out, Operand gu, int N, int F) const = 0;
  /// All fp32: dgu added into or written. 16-bit anywhere (dout, gu, dgu): dgu written,
  /// 16-bit alone (the Llama's, which its gate|up product reads).
  virtual void swiglu_backward(GradIn dgu, Operand dout, Operand gu, int N, int F) const = 0;

  /// ---- Residual: out = a + b (out may alias a or b).
  virtual void residual_forward(float* out, const float* a, const float* b, size_t n) const = 0;

  /// ---- RoPE (Hugging Face rotate_half convention: dim i pairs with i + hd/2) of the q and k
  /// heads of a packed qkv buffer (B, T, (H + 2*KVH) * hd) laid out [q heads | k heads | v
  /// heads]; v is copied as it is. Position of row (b,t) is t. out fp32: in place, qkv that
  /// same fp32 buffer; out 16-bit: qkv of any form, only read (a 16-bit qkv may be out itself:
  /// the Llama's qkv product kept 16-bit, rotated in place), = narrow of the fp32 rotation of
  /// widen(qkv).
  virtual void rope_forward(Out out, Operand qkv, int B, int T, int H, int KVH, int hd,
                            const RopeSpec& rope) const = 0;
  /// The inverse rotation of dqkv (the gradient of the rotated q and k), forms as rope_forward.
  virtual void rope_backward(Out out, Operand dqkv, int B, int T, int H, int KVH, int hd,
                             const RopeSpec& rope) const = 0;

  /// ---- Causal self-attention with grouped-query heads (KVH divides H; KVH == H is MHA).
  /// qkv: (B, T, (H + 2*KVH) * hd) as above; out: (B, T, H*hd);
  /// lse: (B, H, T) log-sum-exp of each softmax row, saved for backward.
  /// Scale 1/sqrt(hd). Never materialises more than a tile of the (T, T) score matrix per thread.
  /// out and qkv both fp32 or both 16-bit (out = narrow of the fp32 op's on widen(qkv)).
  virtual void attention_forward(Out out, float* lse, Operand qkv, int B, int T, int H, int KVH,
                                 int hd) const = 0;
  /// qkv, out, dout fp32: dqkv fp32, added into or written. qkv and out 16-bit (dout either
  /// form): the fp32 op on widen(qkv), widen(out) (the output as the products saw it: the row
  /// dot products with dout use these values), dqkv written, fp32, 16-bit or both (cuDNN
  /// computes dqkv 16-bit: its own values; the Llama's, which the 16-bit inverse rotation reads).
  virtual void attention_backward(GradIn dqkv, Operand dout, Operand qkv, Operand out,
                                  const float* lse, int B, int T, int H, int KVH,
                                  int hd) const = 0;

  /// ---- Fused LM head + softmax cross-entropy (logits are never stored in full).
  /// For each row n: logits = x[n] @ w^T (V), loss[n] = logsumexp(logits) - logits[targets[n]].
  /// Rows with targets[n] < 0 are ignored (loss 0, no gradient).
  /// If dx/dw are non-null the gradient of (grad_scale * sum_n loss[n]) is accumulated at the
  /// same time: dx(N,C) += ..., dw(V,C) += .... Returns sum_n loss[n] (as double).
  /// w: any form (the products round it to the compute precision either way).
  virtual double lmhead_xent(float* loss, float* dx, float* dw, const float* x, Operand w,
                             const int32_t* targets, int N, int C, int V,
                             float grad_scale) const = 0;
  /// The same, but sum_n loss[n] is ADDED to *total, one double in this backend's memory, on
  /// the stream: the host reads nothing (the engine reads a step's losses once, with the
  /// gradient norm). The default adds lmhead_xent's result, so it suits backends whose memory
  /// the host can touch; device backends override it.
  virtual void lmhead_xent_into(double* total, float* loss, float* dx, float* dw, const float* x,
                                Operand w, const int32_t* targets, int N, int C, int V,
                                float grad_scale) const {
    *total += lmhead_xent(loss, dx, dw, x, w, targets, N, C, V, grad_scale);
  }

  /// ---- Tensor parallelism: a vocabulary-parallel embedding and LM head (this rank holds rows
  /// [v_lo, v_lo + V) of the (V_total, C) table), and positions of a run of rows. The default
  /// refuses (unsupported_tp): a backend that has not implemented them cannot run tensor
  /// parallel units.
  /// out(N,C) = wte[tokens[n] - v_lo] for tokens in [v_lo, v_lo + V), 0 for the others.
  /// wte: any form (products_only, as embedding_forward).
  virtual void vocab_embedding_forward(float* out, const int32_t* tokens, Operand wte,
                                       int64_t v_lo, int N, int C, int V) const {
    (void)out, (void)tokens, (void)wte, (void)v_lo, (void)N, (void)C, (void)V;
    unsupported_tp("vocab_embedding_forward");
  }
  /// dwte(V,C) += dout[n] at row tokens[n] - v_lo, for tokens in range (in row order n, as
  /// embedding_backward adds: deterministic).
  virtual void vocab_embedding_backward(float* dwte, const float* dout, const int32_t* tokens,
                                        int64_t v_lo, int N, int C, int V) const {
    (void)dwte, (void)dout, (void)tokens, (void)v_lo, (void)N, (void)C, (void)V;
    unsupported_tp("vocab_embedding_backward");
  }
  /// Rows [row_lo, row_lo + rows) of a flattened (B, T) batch: out[i] += wpe[(row_lo + i) % T].
  virtual void position_forward(float* out, const float* wpe, int64_t row_lo, int rows, int T,
                                int C) const {
    (void)out, (void)wpe, (void)row_lo, (void)rows, (void)T, (void)C;
    unsupported_tp("position_forward");
  }
  /// dwpe[(row_lo + i) % T] += dout[i] (in row order i).
  virtual void position_backward(float* dwpe, const float* dout, int64_t row_lo, int rows, int T,
                                 int C) const {
    (void)dwpe, (void)dout, (void)row_lo, (void)rows, (void)T, (void)C;
    unsupported_tp("position_backward");
  }
  /// Vocabulary-parallel cross-entropy, never storing the (N, V) logits (chunked as
  /// lmhead_xent). logits = h @ w^T over this rank's V rows of the head.
  /// Pass 1: stats(N,3) per row: {m, s, tl}: m = max logits, s = sum exp(logits - m), tl = the
  /// target's logit when targets[n] is in [v_lo, v_lo + V), else 0.
  virtual void xent_shard_stats(float* stats, const float* h, Operand w, const int32_t* targets,
                                int64_t v_lo, int N, int C, int V) const {
    (void)stats, (void)h, (void)w, (void)targets, (void)v_lo, (void)N, (void)C, (void)V;
    unsupported_tp("xent_shard_stats");
  }
  /// Every rank's stats (t, N, 3) in rank order, combined the same way on every rank:
  /// M = max_k m_k, lse[n] = M + log(sum_k s_k exp(m_k - M)) (sums in rank order),
  /// loss[n] = lse[n] - sum_k tl_k; rows with targets[n] < 0: loss 0 (lse still written).
  /// Adds sum_n loss[n] to *total, a double in this backend's memory (no host read).
  virtual void xent_shard_combine(double* total, float* lse, float* loss, const float* stats,
                                  const int32_t* targets, int t, int N) const {
    (void)total, (void)lse, (void)loss, (void)stats, (void)targets, (void)t, (void)N;
    unsupported_tp("xent_shard_combine");
  }
  /// The gradient of grad_scale * sum_n loss[n] through this rank's columns:
  /// g = grad_scale * (exp(logits - lse[n]) - [v == targets[n]]) (0 for targets[n] < 0);
  /// dh(N,C) += g @ w (fp32, added into); dw(V,C) += g^T @ h (GradOut: written or added).
  virtual void xent_shard_backward(float* dh, GradOut dw, const float* h, Operand w,
                                   const float* lse, const int32_t* targets, int64_t v_lo, int N,
                                   int C, int V, float grad_scale) const {
    (void)dh, (void)dw, (void)h, (void)w, (void)lse, (void)targets, (void)v_lo, (void)N, (void)C,
        (void)V, (void)grad_scale;
    unsupported_tp("xent_shard_backward");
  }

  /// True where linear_forward adds res in the product itself (CUDA with 16-bit products; the
  /// simulated device, for the engine's tests): the models then take it, and a plain norm after
  /// it, instead of the product and the fused residual + norm pass (the CPU's choice: one pass
  /// over the rows, and its products write fp32 anyway).
  virtual bool fuses_product_residual() const { return false; }

  /// ---- AdamW (decoupled weight decay, bias-corrected; step counts from 1), on n elements.
  /// param -= lr * (mhat / (sqrt(vhat) + eps) + wd * param), with grad multiplied by grad_mult
  /// first (for clipping and gradient-accumulation averaging); with copies (AdamWCopies), the
  /// updated values' compute copies in the same pass.
  virtual void adamw(float* param, const float* grad, float* m, float* v, size_t n, float lr,
                     float beta1, float beta2, float eps, float wd, int step, float grad_mult,
                     const AdamWCopies& copies = {}) const = 0;
  /// ---- SGD, LARS and Lamb (sharding/sharded_model.h OptimizerParams has the formulas), on n
  /// elements, grad multiplied by grad_mult first. sgd: d = scale * (g + wd * param); with
  /// momentum, m = d at step 1 (torch's clone), else momentum * m + (1 - dampening) * d; d =
  /// nesterov ? d + momentum * m : m; param -= lr * d (scale: LARS's trust ratio, else 1).
  virtual void sgd(float* param, const float* grad, float* m, size_t n, float lr, float momentum,
                   float dampening, bool nesterov, float wd, float scale, int step,
                   float grad_mult) const = 0;
  /// Lamb's first half: m, v updated as Adam's (no bias correction) and grad overwritten with
  /// the update u = m / (sqrt(v) + eps) + wd * param; the second is add_scaled(param, -s, u)
  /// once the tensor's norms give s.
  virtual void lamb_prepare(const float* param, float* grad, float* m, float* v, size_t n,
                            float beta1, float beta2, float eps, float wd,
                            float grad_mult) const = 0;
  /// y += a * x
  virtual void add_scaled(float* y, float a, const float* x, size_t n) const = 0;
  /// adamw with copies {dt (BF16 / F16), param32, param16, grad_dt}.
  void adamw_copies(float* param, const float* grad, float* m, float* v, size_t n, float lr,
                    float beta1, float beta2, float eps, float wd, int step, float grad_mult,
                    DType dt, float* param32, uint16_t* param16, DType grad_dt) const;
  /// True where adamw's copies and sum_squares_rounded_into round the gradients they read to dt
  /// (BF16 / F16) as they go: a one-rank unit then leaves rounding its gradients to
  /// reduce_dtype to those readers instead of a pass of its own (FlatUnit::round_grads). CUDA;
  /// the CPU for BF16; the simulated device, for the engine's tests.
  virtual bool rounds_grads_on_read(DType /*dt*/) const { return false; }
  /// True where a product given an Operand with both forms reads the 16-bit one (CUDA; the
  /// simulated device, for the engine's tests): the engine then keeps the residual stream's
  /// gradient in both forms from unit to unit in backward (UnitCtx::grad16), so that the
  /// products reading it do not narrow it each call. The CPU reads the fp32 form (its kernels
  /// pack from it), so a 16-bit copy beside it would be a pass for nothing.
  virtual bool prefers_lp_operands() const { return false; }

  /// ---- Sums of squares: out[i] = sum of the squares of round_to(dt, xs[i]) (dt F32: xs[i]
  /// as it is; xs only read) over its ns[i] values, for i < k, in double, each in a fixed order
  /// (deterministic, and the same bits whatever k, `to` and the other buffers), into host or
  /// this backend's memory (SumsTo).
  virtual void sums_of_squares(const float* const* xs, const size_t* ns, int k, double* out,
                               SumsTo to, DType dt = DType::F32) const = 0;
  /// The forms the engine calls: one buffer's sum read on the host; k of them read at once; k
  /// into this backend's memory (read with the step's losses); the same of the values
  /// round_to(dt, xs[i]) (the norm of gradients a one-rank unit has yet to round,
  /// rounds_grads_on_read).
  double sum_squares(const float* x, size_t n) const;
  void sum_squares_each(const float* const* xs, const size_t* ns, int k, double* out) const {
    sums_of_squares(xs, ns, k, out, SumsTo::Host);
  }
  void sum_squares_into(const float* const* xs, const size_t* ns, int k, double* out) const {
    sums_of_squares(xs, ns, k, out, SumsTo::Device);
  }
  void sum_squares_rounded_into(DType dt, const float* const* xs, const size_t* ns, int k,
                                double* out) const {
    sums_of_squares(xs, ns, k, out, SumsTo::Device, dt);
  }

  /// ---- Utilities.
  virtual void scale(float* x, float a, size_t n) const = 0;
  virtual void fill(float* x, float v, size_t n) const = 0;
  virtual void add_inplace(float* y, const float* x, size_t n) const = 0;  ///< y += x
  virtual void copy(float* dst, const float* src, size_t n) const = 0;

  /// ---- Precision conversions of the gather and reduce paths (mixed precision), on n values.
  /// dt is F32, BF16 or F16; 16-bit values are raw uint16_t (round to nearest even, NaN stays
  /// NaN, fp16 overflow becomes +-inf); F32 is a copy. The buffers must not overlap, except
  /// dst == src exactly: then the n narrow values end up at the front of the buffer (narrow)
  /// or the n narrow values at its front become n floats (widen).
  virtual void narrow(DType dt, const float* src, void* dst, size_t n) const = 0;
  virtual void widen(DType dt, const void* src, float* dst, size_t n) const = 0;
  virtual void add_widened(DType dt, const void* src, float* dst, size_t n) const = 0;  ///< dst +=
  virtual void round_to(DType dt, float* x, size_t n) const = 0;  ///< x = widen(narrow(x))
  /// dst = widen(narrow(src)) in one pass (a mixed-precision unit's parameters from its master
  /// copy: 8 bytes a value where copy + round_to move 16); dst == src is round_to, any other
  /// overlap is not allowed. With dst16 (dt BF16 / F16; may be null), also dst16 = narrow(src):
  /// the unit's compute copy and its 16-bit copy from the master, read once (dst16 overlaps
  /// neither). The default is copy + round_to (+ narrow): the same bits.
  virtual void round_copy(DType dt, float* dst, const float* src, size_t n,
                          uint16_t* dst16 = nullptr) const;
  void round_copy_lp(DType dt, float* dst, uint16_t* dst16, const float* src, size_t n) const;

 protected:
  /// Guards of the 16-bit forms: throws sw::Error naming `op` where compute() is F32.
  void require_lowp(const char* op) const;
  /// Throws sw::Error "op: <what> is not a form this op takes (kernels/ops.h)".
  [[noreturn]] static void refuse(const char* op, const char* what);
  /// Throws sw::Error "<op>: tensor parallelism is not implemented on the <device> backend".
  [[noreturn]] void unsupported_tp(const char* op) const;
  /// An Operand of r rows with leading dimension ld and c columns (r > 0, c > 0) as fp32: its
  /// own fp32 pointer where it has one, else its 16-bit values widened into `tmp` (made here,
  /// device scratch).
  const float* operand_f32(Operand x, size_t r, size_t ld, size_t c, Buffer& tmp) const;
  /// adamw with copies through fp32 ops: the gradient rounded into device scratch where
  /// copies.grad_dt asks, adamw, then round_copy (or narrow, without param32).
  void adamw_through_copies(float* param, const float* grad, float* m, float* v, size_t n,
                            float lr, float beta1, float beta2, float eps, float wd, int step,
                            float grad_mult, const AdamWCopies& copies) const;
  /// Attention's 16-bit forms through this Ops' fp32 form (CUDA's paths other than cuDNN's; a
  /// test's emulation of another backend): the 16-bit inputs widened into device scratch, the
  /// fp32 form called (the virtual: an fp32 out, dqkv fp32 and written), a 16-bit output
  /// narrowed from its fp32 values in device scratch.
  void attention_forward_through_f32(Out out, float* lse, Operand qkv, int B, int T, int H,
                                     int KVH, int hd) const;
  void attention_backward_through_f32(GradIn dqkv, Operand dout, Operand qkv, Operand out,
                                      const float* lse, int B, int T, int H, int KVH,
                                      int hd) const;
  /// sums_of_squares with dt other than F32 through copies: each buffer rounded into device
  /// scratch (round_copy), then summed as it is (SumsTo::Device).
  void sums_rounded_through_copies(DType dt, const float* const* xs, const size_t* ns, int k,
                                   double* out) const;
};

/// ---- The scratch a backend's kernels keep for themselves (tracked as Mem::Workspace, outside
/// the units' declared Saved / Scratch): the fused LM head's logits chunk, 16-bit operand
/// copies, attention's scratch, cuBLAS's workspace. Each backend declares it for a described
/// training step, so that the planner asks instead of knowing any backend's internals. The
/// declarations are plain C++ built into every build (kernels/cpu/workspace.cpp,
/// kernels/cuda/workspace.cpp), so a CUDA run is planned on a machine without a GPU or a build
/// without CUDA; whatever a declaration depends on besides the shapes (CUDA's attention path,
/// SHARDWISE_CUDA_ATTENTION) it reads itself.

/// A training step's shapes, as the kernels see them.
struct StepShape {
  int B = 1, T = 1;  ///< micro-batch and sequence length (N = B*T rows)
  int d_model = 0, n_head = 1;
  int n_kv_head = 0;  ///< 0: n_head (GPT-2 always)
  int d_ff = 0;       ///< 0: 4 * d_model
  int vocab = 0;
  bool llama = false;  ///< Llama blocks (RMSNorm, SwiGLU, RoPE, grouped kv heads); else GPT-2
  DType compute = DType::F32;  ///< the matrix products' precision (param_dtype)
  int threads = 1;             ///< the CPU backend's OpenMP threads per rank (kernels/threads.h)
  bool fp8 = false;  ///< the blocks' linears in fp8 (kernels/fp8_ops.h Fp8Ops; compute BF16)
};
/// What a backend declares: `bytes` its kernels keep through the step (grow-only scratch, after
/// the first step), `backward_transient` more that a block's backward holds only while one of
/// its op calls runs (the planner counts it at the blocks' backward actions), and a phrase for
/// plan output saying what they are made of. Estimates where the backend's library does not
/// say (cuDNN's workspace off a GPU).
struct WorkspaceDecl {
  int64_t bytes = 0;
  int64_t backward_transient = 0;
  std::string what;
};
using WorkspaceFn = WorkspaceDecl (*)(const StepShape&);
/// The declaration of the backend of `kind` (the CPU's and CUDA's are built in; a kind nobody
/// declared for has none: 0 bytes).
WorkspaceDecl kernel_workspace(DeviceKind kind, const StepShape& s);
/// Another backend (e.g. a test device) declares its own; null removes it (built-ins return).
void register_workspace(DeviceKind kind, WorkspaceFn fn);

/// The Ops of a device; throws sw::Error if this build has no backend for it.
const Ops& ops_for(Device device);
/// The Ops of a device computing in `compute` precision (mixed precision). Every pointer stays
/// float*: activations, parameters and gradients are fp32 in memory; F32 is ops_for(device).
/// BF16 / F16: matrix products (gemm, linear_*, attention_*, lmhead_xent) round their operands
/// to bf16 / fp16 (values that overflow fp16 become +-inf, so a too-large loss scale shows up
/// as non-finite gradients) and accumulate in fp32; element-wise ops, norms and AdamW stay
/// fp32. On the CPU, BF16 uses AVX512-BF16 instructions when the CPU has them (detected at run
/// time) and an exact-rounding fallback otherwise.
const Ops& ops_for(Device device, DType compute);

/// Whether the matrix products of ops_for(device, compute) read 16-bit weights in place (so a
/// unit keeping a 16-bit copy of its weights saves a narrowing per product): devices in BF16 /
/// F16; the CPU in BF16 where its products run on oneDNN (AVX-512), not on its own kernels,
/// which round fp32 while packing.
bool products_read_weights16(Device device, DType compute);

/// The device a name means: "cpu"; "cuda" or "sim": the device this process's registered
/// backend of that kind serves; "cuda:N". Throws sw::Error naming the value when this build has
/// no such backend.
Device device_from_name(const std::string& name);

/// Backends register themselves (kernels/cuda does so when built), once per compute precision
/// they implement; ops_for(device, compute) refuses a precision nobody registered.
void register_ops(DeviceKind kind, const Ops* ops);  ///< fp32
void register_ops(DeviceKind kind, DType compute, const Ops* ops);

}  // namespace sw
// ---- Reference documentation (Doxygen): the members above without a comment of their own.

/// @var sw::RopeSpec::theta
/// The base of the frequencies.

/// @var sw::RopeSpec::llama3
/// Llama 3.1's scaling on.

/// @var sw::RopeSpec::factor
/// llama3: the factor slow frequencies are divided by.

/// @var sw::RopeSpec::low_freq_factor
/// llama3: low_freq_factor.

/// @var sw::RopeSpec::high_freq_factor
/// llama3: high_freq_factor.

/// @var sw::RopeSpec::original_max_pos
/// llama3: original_max_position_embeddings.

/// @fn sw::RopeSpec::same(const RopeSpec& o) const
/// True when both give the same frequencies.

/// @var sw::Operand::f32
/// The fp32 values (may be null).

/// @var sw::Operand::lp
/// The 16-bit values (may be null).

/// @fn sw::Operand::Operand(std::nullptr_t)
/// No operand.

/// @fn sw::Operand::Operand(const float* p)
/// fp32 values.

/// @fn sw::Operand::Operand(const uint16_t* p)
/// 16-bit values alone.

/// @fn sw::Operand::Operand(const float* p, const uint16_t* p16)
/// The same values in both forms.

/// @fn sw::Operand::has_lp() const
/// True when a 16-bit form is given.

/// @var sw::Out::f32
/// fp32 output (or null).

/// @var sw::Out::lp
/// 16-bit output (or null).

/// @fn sw::Out::Out(std::nullptr_t)
/// No output.

/// @fn sw::Out::Out(float* p)
/// fp32 output.

/// @fn sw::Out::Out(uint16_t* p)
/// 16-bit output.

/// @fn sw::Out::operator bool() const
/// True when an output is given.

/// @var sw::GradIn::f32
/// The fp32 gradient (or null).

/// @var sw::GradIn::lp
/// Its 16-bit form (or null).

/// @var sw::GradIn::write
/// Written (=) rather than added into (+=).

/// @fn sw::GradIn::GradIn(std::nullptr_t)
/// No gradient wanted.

/// @fn sw::GradIn::GradIn(float* p)
/// fp32, added into.

/// @fn sw::GradIn::operator bool() const
/// True when a gradient is wanted.

/// @fn sw::GradIn::has_lp() const
/// True when a 16-bit form is given.

/// @var sw::GradOut::p
/// The gradient buffer (or null).

/// @var sw::GradOut::write
/// Written (=) rather than added into (+=).

/// @fn sw::GradOut::GradOut(std::nullptr_t)
/// No gradient wanted.

/// @fn sw::GradOut::GradOut(float* q)
/// Added into.

/// @fn sw::GradOut::GradOut(float* q, bool w)
/// Written when `w` (and q is not null), else added into.

/// @fn sw::GradOut::operator bool() const
/// True when a gradient is wanted.

/// @var sw::NormIn::a
/// The input, or the residual sum's first term.

/// @var sw::NormIn::res
/// Where the residual sum is written (null: no sum).

/// @fn sw::NormIn::NormIn(const float* x)
/// The plain input x.

/// @fn sw::NormIn::residual(float* res, const float* a, const float* b)
/// The sum a + b, written to res, then normalised.

/// @var sw::AdamWCopies::dt
/// The copies' precision (F32: none).

/// @var sw::AdamWCopies::param32
/// fp32 compute copy = widen(param16) (may be null).

/// @var sw::AdamWCopies::param16
/// 16-bit copy = narrow(dt, param).

/// @var sw::AdamWCopies::grad_dt
/// The precision the gradient is read in (rounded on read).

/// @class sw::Ops
/// The kernels of one backend and compute precision (ops_for): what units call in forward and
/// backward, and what the engine calls for optimizers, norms and precision conversions.

/// @fn sw::Ops::device() const
/// The device these ops run on.

/// @fn sw::Ops::embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C) const
/// dwte[tokens] += dout, dwpe += dout summed over the batch (dwpe may be null).

/// @fn sw::Ops::rmsnorm_backward(GradIn dinp, float* dw, const float* dout, const float* inp, const float* w, const float* rstd, int N, int C) const
/// dinp (added into, as layernorm_backward's) and dw (+=) of rmsnorm_forward.

/// @fn sw::Ops::sum_squares_each(const float* const* xs, const size_t* ns, int k, double* out) const
/// k sums of squares, read on the host (SumsTo::Host).

/// @fn sw::Ops::sum_squares_into(const float* const* xs, const size_t* ns, int k, double* out) const
/// k sums of squares into this backend's memory (SumsTo::Device).

/// @fn sw::Ops::sum_squares_rounded_into(DType dt, const float* const* xs, const size_t* ns, int k, double* out) const
/// sum_squares_into of round_to(dt, xs[i]).

/// @fn sw::Ops::fill(float* x, float v, size_t n) const
/// x[i] = v.

/// @fn sw::Ops::copy(float* dst, const float* src, size_t n) const
/// dst = src (no overlap).

/// @fn sw::Ops::widen(DType dt, const void* src, float* dst, size_t n) const
/// dst = the n values of type dt at src, as floats.

/// @fn sw::Ops::round_copy_lp(DType dt, float* dst, uint16_t* dst16, const float* src, size_t n) const
/// round_copy with dst16 (argument order of the 16-bit copies).

/// @fn sw::Ops::attention_backward_through_f32(GradIn dqkv, Operand dout, Operand qkv, Operand out, const float* lse, int B, int T, int H, int KVH, int hd) const
/// attention_backward through the fp32 form (see attention_forward_through_f32).

/// @var sw::StepShape::B
/// Sequences per micro-batch.

/// @var sw::StepShape::d_model
/// Width of the residual stream.

/// @var sw::StepShape::n_head
/// Attention heads.

/// @var sw::StepShape::vocab
/// Vocabulary size.

/// @var sw::WorkspaceDecl::bytes
/// Bytes kept through the step.

/// @var sw::WorkspaceDecl::backward_transient
/// Bytes more held during one backward op call.

/// @var sw::WorkspaceDecl::what
/// What they are made of, for plan output.

/// @typedef sw::WorkspaceFn
/// A backend's workspace declaration (register_workspace).

/// @fn sw::register_ops(DeviceKind kind, DType compute, const Ops* ops)
/// Registers the Ops of devices of `kind` computing in `compute`.
