// CPU kernels of tensor parallelism (kernels/ops.h "Tensor parallelism"): a vocabulary-parallel
// embedding and LM head (this rank holds rows [v_lo, v_lo + V) of the (V_total, C) table) and
// positions of a run of rows. Plain functions the CPU Ops forward to (kernels/cpu/cpu_ops.cpp);
// semantics as the Ops methods. Deterministic for a fixed thread count.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace sw::cpu {

// out(N,C) = wte[tokens[n] - v_lo] in range, else 0. The table fp32 (wte) or, where that is
// null, 16-bit in dt (wte16, widened): the bits embedding_forward(_lp) writes for those rows.
void vocab_embedding_forward(float* out, const int32_t* tokens, const float* wte,
                             const uint16_t* wte16, DType dt, int64_t v_lo, int N, int C, int V);
// dwte(V,C) += dout[n] at row tokens[n] - v_lo for tokens in range, each element in row order.
void vocab_embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int64_t v_lo,
                              int N, int C, int V);
// out[i] += wpe[(row_lo + i) % T] for i < rows.
void position_forward(float* out, const float* wpe, int64_t row_lo, int rows, int T, int C);
// dwpe[(row_lo + i) % T] += dout[i], each element in row order i.
void position_backward(float* dwpe, const float* dout, int64_t row_lo, int rows, int T, int C);

// stats(N,3) = {max, sum exp(logit - max), target logit or 0} of logits = h @ w^T over this
// rank's V rows, in chunks of rows (lmhead_chunk_rows); compute BF16 / F16: the product's
// operands rounded as lmhead_xent rounds them.
void xent_shard_stats(float* stats, const float* h, const float* w, const int32_t* targets,
                      int64_t v_lo, int N, int C, int V, DType compute = DType::F32);
// lse, loss from every rank's stats (t, N, 3) (Ops::xent_shard_combine); returns sum_n loss[n]
// in double, in row order (lmhead_xent's sum).
double xent_shard_combine(float* lse, float* loss, const float* stats, const int32_t* targets,
                          int t, int N);
// dh(N,C) += g @ w (dh may be null); dw(V,C) = dw_beta * dw + g^T @ h (dw may be null; beta 0:
// written, its old values never read); g = grad_scale * (exp(logit - lse) - onehot(target)).
void xent_shard_backward(float* dh, float* dw, float dw_beta, const float* h, const float* w,
                         const float* lse, const int32_t* targets, int64_t v_lo, int N, int C,
                         int V, float grad_scale, DType compute = DType::F32);
// Floats of the logits chunk the two xent_shard passes keep (one thread-local buffer).
size_t xent_shard_chunk_floats(int N, int V);

}  // namespace sw::cpu
