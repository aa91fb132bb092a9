// The launchers behind the CUDA Ops (kernels/cuda/cuda_ops.cu), one per kernel family, with the
// same argument order and the same += conventions as kernels/ops.h. Every launcher enqueues on
// `s` and returns without synchronising. Scratch memory ("ws", device floats) is supplied by the
// caller; each launcher says how much it needs.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/ops.h"  // RopeSpec

namespace sw::cuda {

// ---- elementwise.cu
void embedding_forward(cudaStream_t s, float* out, const int32_t* tokens, const float* wte,
                       const float* wpe, int B, int T, int C);
// The same lookup from a 16-bit table (dt 1 bf16, 2 f16; Ops::embedding_forward's 16-bit table).
void embedding_forward16(cudaStream_t s, int dt, float* out, const int32_t* tokens,
                         const uint16_t* wte16, const float* wpe, int B, int T, int C);
void embedding_backward(cudaStream_t s, float* dwte, float* dwpe, const float* dout,
                        const int32_t* tokens, int B, int T, int C);
void gelu_forward(cudaStream_t s, float* out, const float* inp, size_t n);
// set: the input gradient is written (0 + g: the bits += gives on zeros), its old contents never
// read (the Ops' written gradients, GradIn::set); else accumulated. With d16, the result also
// narrowed there (dt).
void gelu_backward(cudaStream_t s, float* dinp, const float* inp, const float* dout, size_t n,
                   bool set = false, uint16_t* d16 = nullptr, int dt = 0);
void swiglu_forward(cudaStream_t s, float* out, const float* gu, int N, int F);
// narrow(dt, swiglu_forward / gelu_forward) in one pass (the Ops' 16-bit outputs; dt 1 bf16, 2
// f16).
void swiglu_forward_lp(cudaStream_t s, int dt, uint16_t* out16, const float* gu, int N, int F);
// The same from gu held in dt (read as widened; Ops::linear_forward's 16-bit output).
void swiglu_forward_lp(cudaStream_t s, int dt, uint16_t* out16, const uint16_t* gu, int N, int F);
void gelu_forward_lp(cudaStream_t s, int dt, uint16_t* out16, const float* inp, size_t n);
// The same from inp held in dt (read as widened; Ops::linear_forward's 16-bit output).
void gelu_forward_lp(cudaStream_t s, int dt, uint16_t* out16, const uint16_t* inp, size_t n);
// gelu_backward with set, inp and dout each fp32 (the float pointer) or held in dt (the 16-bit
// one; the other null); with d16, the result also narrowed there (then dinp may be null).
void gelu_backward_set(cudaStream_t s, int dt, float* dinp, const float* inp,
                       const uint16_t* inp16, const float* dout, const uint16_t* dout16,
                       size_t n, uint16_t* d16);
void swiglu_backward(cudaStream_t s, float* dgu, const float* dout, const float* gu, int N, int F,
                     bool set = false);
// narrow(dt, swiglu_backward with set) in one pass (Ops::swiglu_backward's 16-bit dgu), dout and gu
// each fp32 or held in dt (as gelu_backward_set).
void swiglu_backward_lp_set(cudaStream_t s, int dt, uint16_t* dgu16, const float* dout,
                            const uint16_t* dout16, const float* gu, const uint16_t* gu16, int N,
                            int F);
void residual_forward(cudaStream_t s, float* out, const float* a, const float* b, size_t n);
// RoPE: the (cos, sin) table of (T, hd / 2) angle pairs (2 T hd/2 floats, 16-byte aligned for
// the two-pair kernel), then the rotation of q and k by it (sign -1: the inverse rotation).
void rope_table(cudaStream_t s, float* tab, int T, int hd, const RopeSpec& rope);
void rope_apply(cudaStream_t s, float* qkv, const float* tab, int B, int T, int H, int KVH,
                int hd, float sign);
// Narrowed: dst16 = narrow(dt, rope_apply of a copy of src), the v heads narrowed as they are;
// src is only read (Ops::rope_forward with a 16-bit out, sign 1; rope_backward, sign -1). An fp32
// src and
// dst16 must not overlap.
void rope_apply_lp(cudaStream_t s, int dt, uint16_t* dst16, const float* src, const float* tab,
                   int B, int T, int H, int KVH, int hd, float sign);
// The same from src held in dt (widened as read); src may be dst16 itself (in place).
void rope_apply_lp(cudaStream_t s, int dt, uint16_t* dst16, const uint16_t* src,
                   const float* tab, int B, int T, int H, int KVH, int hd, float sign);
// With p16: the updated values also narrowed there (dt 1 bf16, 2 f16) and, with p32, widened
// back there (Ops::adamw's copies). gdt (0: none): the gradient read rounded to that type.
void adamw(cudaStream_t s, float* param, const float* grad, float* m, float* v, size_t n,
           float lr, float beta1, float beta2, float eps, float wd, int step, float grad_mult,
           int dt = 0, float* p32 = nullptr, uint16_t* p16 = nullptr, int gdt = 0);
// optimizers.cu: Ops::sgd, lamb_prepare, add_scaled.
void sgd(cudaStream_t s, float* param, const float* grad, float* m, size_t n, float lr,
         float momentum, float dampening, bool nesterov, float wd, float scale, int step,
         float grad_mult);
void lamb_prepare(cudaStream_t s, const float* param, float* grad, float* m, float* v, size_t n,
                  float beta1, float beta2, float eps, float wd, float grad_mult);
void add_scaled(cudaStream_t s, float* y, float a, const float* x, size_t n);
void scale(cudaStream_t s, float* x, float a, size_t n);
void fill(cudaStream_t s, float* x, float v, size_t n);
// x = x / d in place, n values: fp32 (dt 0) or dt's 16-bit values (1 bf16, 2 f16), widened,
// divided and rounded back, as the MPI groups' averages (sharding/comm/reduce.cpp's divide).
void divide(cudaStream_t s, int dt, void* x, float d, size_t n);
void add_inplace(cudaStream_t s, float* y, const float* x, size_t n);
// Precision conversions (Ops::narrow / widen / add_widened / round_to); dt: 1 = bf16, 2 = f16
// (core/dtype.h's DType values), out of place only (the Ops stage in-place calls).
void narrow(cudaStream_t s, int dt, const float* src, uint16_t* dst, size_t n);
// dst(rows, cols), dense = narrow(src(rows, cols; row stride ld)): the operand copies of the
// bf16 / fp16 matrix products (cuda::narrow itself when ld == cols).
void narrow_rows(cudaStream_t s, int dt, const float* src, size_t ld, size_t rows, size_t cols,
                 uint16_t* dst);
void widen(cudaStream_t s, int dt, const uint16_t* src, float* dst, size_t n);
void add_widened(cudaStream_t s, int dt, const uint16_t* src, float* dst, size_t n);
void round_to(cudaStream_t s, int dt, float* x, size_t n);
// dst = round(src); with dst16, also dst16 = narrow(src) (the same pass).
void round_copy(cudaStream_t s, int dt, float* dst, const float* src, size_t n,
                uint16_t* dst16 = nullptr);
void add_bias_rows(cudaStream_t s, float* out, const float* b, int N, int OC);  // out[n] = b
// Fixed-order sum of squares in double: *result (device) = sum x^2. ws: sum_squares_ws(n).
// dt (1 bf16, 2 f16; 0 none): of x's values rounded to that type (x only read).
size_t sum_squares_ws(size_t n);  // doubles
void sum_squares(cudaStream_t s, double* result, const float* x, size_t n, double* ws,
                 int dt = 0);
// *result (device) = sum_{i<n} x[i] in double, in a fixed order (one block); with
// `accumulate`, *result += that sum.
void sum_rows(cudaStream_t s, double* result, const float* x, int n, bool accumulate);

// ---- norm.cu (all dw/db sums: per-row-block partials, then a fixed-order reduction)
// Column sums db(C) += sum_n dout[n] (linear's bias gradient). ws: colsum_ws(N, C) floats.
size_t colsum_ws(int N, int C);
void colsum_accumulate(cudaStream_t s, float* db, const float* dout, int N, int C, float* ws);
// The same of a 16-bit dout (dt), widened as read: the bits colsum_accumulate gives on
// widen(dout). ws: colsum_ws(N, C) floats.
void colsum_accumulate16(cudaStream_t s, int dt, float* db, const uint16_t* dout, int N, int C,
                         float* ws);
// res may be null (plain norm) or a + b (fused residual; res may alias a or b). With out16 (out
// then unused): the output narrowed to dt (1 bf16, 2 f16) as cuda::narrow rounds it, in the
// same pass, bit for bit narrow(out) (the Ops' norms with a 16-bit out); mean, rstd and res
// unchanged.
void layernorm_forward(cudaStream_t s, float* res, float* out, float* mean, float* rstd,
                       const float* inp, const float* b_res, const float* w, const float* bias,
                       int N, int C, uint16_t* out16 = nullptr, int dt = 0);
void rmsnorm_forward(cudaStream_t s, float* res, float* out, float* rstd, const float* inp,
                     const float* b_res, const float* w, int N, int C, float eps,
                     uint16_t* out16 = nullptr, int dt = 0);
// With dinp16 (dinp given): the sums added into dinp also narrowed to dt into dinp16, in the
// same pass, bit for bit narrow(dinp) after the op (the Ops' norm backwards with a 16-bit dinp
// beside the fp32 one).
void layernorm_backward(cudaStream_t s, float* dinp, float* dw, float* db, const float* dout,
                        const float* inp, const float* w, const float* mean, const float* rstd,
                        int N, int C, float* ws, uint16_t* dinp16 = nullptr, int dt = 0);
void rmsnorm_backward(cudaStream_t s, float* dinp, float* dw, const float* dout,
                      const float* inp, const float* w, const float* rstd, int N, int C,
                      float* ws, uint16_t* dinp16 = nullptr, int dt = 0);

// ---- attention.cu (flash-style; hd <= kMaxHeadDim). dt: 0 = fp32; 1 = bf16, 2 = f16 compute
// (the products' operands rounded where kernels/cpu/attention.cpp rounds them, fp32
// accumulation; see attention.cu).
constexpr int kMaxHeadDim = 256;
void attention_forward(cudaStream_t s, float* out, float* lse, const float* qkv, int B, int T,
                       int H, int KVH, int hd, int dt = 0);
// D (B, H, T) = rowsum(dout * out) over each head's hd values, fp32 (one warp per row); the
// backward's first kernel, also used by the cuBLAS path (attention_mm.cu).
void attention_rowdot(cudaStream_t s, float* D, const float* dout, const float* out, int B, int T,
                      int H, int hd);
// ws: B*H*T floats (D = rowsum(dout * out)).
void attention_backward(cudaStream_t s, float* dqkv, const float* dout, const float* qkv,
                        const float* out, const float* lse, int B, int T, int H, int KVH, int hd,
                        float* ws, int dt = 0);

// ---- attention_mm.cu: the row kernels of the tensor-core attention path (bf16 / fp16; the
// products are cuBLAS calls in cuda_ops.cu; layouts at the top of attention_mm.cu).
// dst(B*nh, T, hd) 16-bit = src rows (B*T, row stride ld), columns col0 + h*hd + d, rounded.
void attn_pack(cudaStream_t s, int dt, const float* src, int B, int T, int ld, int col0, int nh,
               int hd, uint16_t* dst);
// rows = B*H*nq: per row, the 256-key softmax tiles of kernels/cpu/attention.cpp's forward; P
// 16-bit (zeros past the visible keys), alpha (rows, tiles), ml (rows, 2) = m, l.
void attn_softmax_fwd(cudaStream_t s, int dt, const float* S, uint16_t* P, float* alpha,
                      float* ml, size_t rows, int nq, int ldS, int kend, int q0, int tiles,
                      float scale);
// out rows q0.. (B, T, H*hd) and lse from the tiles' products Ot (tiles, rows, hd).
void attn_combine(cudaStream_t s, const float* Ot, const float* alpha, const float* ml,
                  float* out, float* lse, size_t rows, int nq, int hd, int tiles, int T, int H,
                  int q0);
// P = exp(scale S - lse), dS = scale P (dP - D) on the visible keys, both rounded to 16 bits.
void attn_softmax_bwd(cudaStream_t s, int dt, const float* S, const float* dP, uint16_t* P,
                      uint16_t* dS, const float* lse, const float* D, size_t rows, int nq,
                      int ldS, int kend, int q0, int T, float scale);
// dqkv (B, T, R) += the per-head dQn (B*H, T, hd), dKn and dVn (B*KVH, T, hd).
void attn_unpack_grads(cudaStream_t s, const float* dQn, const float* dKn, const float* dVn,
                       float* dqkv, int B, int T, int H, int KVH, int hd);

// ---- lmhead.cu: one chunk of rows. logits (nc, V) holds x_c @ w^T on entry; per row: loss
// (lse - logit[target], 0 for target < 0) into rl[r]; with grad, the row becomes
// grad_scale * (softmax - onehot(target)) (zero for ignored rows); with d16 (nc, V) the
// gradient goes there instead, narrowed to dt as narrow() does, and logits keep the products.
void xent_rows(cudaStream_t s, float* logits, float* rl, const int32_t* targets, int nc, int V,
               bool grad, float grad_scale, uint16_t* d16 = nullptr, int dt = 0);

}  // namespace sw::cuda
