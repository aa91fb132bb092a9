// CUDA kernels of tensor parallelism (kernels/cuda/tp_kernels.cu): the vocabulary-parallel
// embedding, positions of a run of rows, and the row passes of the vocabulary-parallel
// cross-entropy. The products and the chunking are CudaOps' (cuda_ops.cu). Included by .cu files.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace sw::cuda {

// out(N,C) = wte[tokens[n] - v_lo] for tokens in [v_lo, v_lo + V), else 0; the table fp32
// (wte) or 16-bit (wte16, dt 1 bf16, 2 f16).
void vocab_embedding_forward(cudaStream_t s, float* out, const int32_t* tokens, const float* wte,
                             const uint16_t* wte16, int dt, int64_t v_lo, int N, int C, int V);
// dwte(V,C) += dout[n] at row tokens[n] - v_lo (tokens in range), each element in row order.
void vocab_embedding_backward(cudaStream_t s, float* dwte, const float* dout,
                              const int32_t* tokens, int64_t v_lo, int N, int C, int V);
// out[i] += wpe[(row_lo + i) % T], rows i of C floats.
void position_forward(cudaStream_t s, float* out, const float* wpe, int64_t row_lo, int rows,
                      int T, int C);
// dwpe[(row_lo + i) % T] += dout[i], each element in row order i.
void position_backward(cudaStream_t s, float* dwpe, const float* dout, int64_t row_lo, int rows,
                       int T, int C);
// One chunk of nc rows of logits (nc, V): stats(nc, 3) = {max, sum exp(logit - max), the
// target's logit where targets[r] - v_lo is in [0, V), else 0}.
void xent_shard_stats_rows(cudaStream_t s, float* stats, const float* logits,
                           const int32_t* targets, int64_t v_lo, int nc, int V);
// Every rank's stats (t, N, 3) combined per row into lse and loss (kernels/ops.h), then
// sum_n loss[n] added to *total (device, a fixed order).
void xent_shard_combine(cudaStream_t s, double* total, float* lse, float* loss,
                        const float* stats, const int32_t* targets, int t, int N);
// One chunk's logits turned in place into g = grad_scale * (exp(logit - lse) - onehot) (rows
// with targets < 0: 0); with d16, written narrowed there (dt) and the fp32 row left as it was.
void xent_shard_grad_rows(cudaStream_t s, float* logits, const float* lse, const int32_t* targets,
                          int64_t v_lo, int nc, int V, float grad_scale, uint16_t* d16, int dt);

}  // namespace sw::cuda
