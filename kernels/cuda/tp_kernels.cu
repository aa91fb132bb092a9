// CUDA kernels of tensor parallelism (tp_kernels.cuh), the twins of kernels/cpu/tp_kernels.cpp
// with expf in place of the CPU's polynomial exp (as elementwise.cu).
//
// Determinism without float atomics: every output element has one owner thread (or one block,
// for a row's statistics), which adds its contributions in a fixed order: the embedding's and
// the positions' backward walk the rows in order, as the CPU's add_rows_by_columns does, so
// their sums are the CPU's bit for bit. The cross-entropy's row passes follow lmhead_xent's
// (elementwise.cu xent_rows_k): one block per row, one pass for the maximum and the sum of
// exponentials (online), block_max / block_sum's fixed trees; the combine is one thread per
// row over the ranks in order, its denominator in double as on the CPU, and the loss total
// goes through sum_rows (a fixed order, added into the device double: no host read).
// The row passes' per-element arithmetic is tp_rows.h's, which tests/cuda/test_tp_twin.cpp
// runs on the host against the CPU's Ops.
#include <cmath>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.cuh"
#include "kernels/cuda/tp_kernels.cuh"
#include "kernels/cuda/tp_rows.h"

namespace sw::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kRowThreads = 512;  // one block per row of logits (as xent_rows)
constexpr int kBuckets = 32;      // the embedding backward's row buckets (elementwise.cu)

using tp::in_shard;
__device__ __forceinline__ float table_value(const float* t, size_t i, int) { return t[i]; }
__device__ __forceinline__ float table_value(const uint16_t* t, size_t i, int dt) {
  return from_half_d(dt, t[i]);
}

template <class Tab>
__global__ void vocab_embedding_forward_k(float* out, const int32_t* tokens, const Tab* wte,
                                          int dt, int64_t v_lo, int C, int V, size_t total) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
       i += size_t(gridDim.x) * blockDim.x) {
    const size_t n = i / C;
    const int c = static_cast<int>(i % C);
    const int32_t t = tokens[n];
    out[i] = in_shard(t, v_lo, V)
                 ? table_value(wte, static_cast<size_t>(int64_t(t) - v_lo) * C + c, dt)
                 : 0.f;
  }
}

// Thread (c, bucket) walks all N rows in order and adds those whose local row falls in its
// bucket (local row % kBuckets) at column c: one owner per element of dwte, row order.
__global__ void vocab_embedding_backward_k(float* dwte, const float* dout, const int32_t* tokens,
                                           int64_t v_lo, int N, int C, int V) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int bucket = blockIdx.y;
  __shared__ int32_t loc[kThreads];  // each row's local row, -1 outside the shard
  for (int n0 = 0; n0 < N; n0 += kThreads) {
    const int cnt = min(kThreads, N - n0);
    __syncthreads();
    if (threadIdx.x < cnt) {
      const int32_t t = tokens[n0 + threadIdx.x];
      loc[threadIdx.x] = in_shard(t, v_lo, V) ? static_cast<int32_t>(int64_t(t) - v_lo) : -1;
    }
    __syncthreads();
    if (c < C) {
      for (int r = 0; r < cnt; ++r) {
        const int32_t l = loc[r];
        if (l < 0 || l % kBuckets != bucket) continue;
        dwte[static_cast<size_t>(l) * C + c] += dout[static_cast<size_t>(n0 + r) * C + c];
      }
    }
  }
}

__global__ void position_forward_k(float* out, const float* wpe, int64_t r0, int T, int C,
                                   size_t total) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
       i += size_t(gridDim.x) * blockDim.x) {
    const size_t row = i / C;
    const int c = static_cast<int>(i % C);
    const int64_t p = (r0 + static_cast<int64_t>(row)) % T;
    out[i] += wpe[static_cast<size_t>(p) * C + c];
  }
}

// Thread (p, c) of dwpe(T, C) adds dout[i] for the rows i with (row_lo + i) % T == p, i in
// increasing order (r0 = row_lo % T).
__global__ void position_backward_k(float* dwpe, const float* dout, int r0, int rows, int T,
                                    int C) {
  const size_t total = static_cast<size_t>(T) * C;
  for (size_t e = blockIdx.x * size_t(blockDim.x) + threadIdx.x; e < total;
       e += size_t(gridDim.x) * blockDim.x) {
    const int p = static_cast<int>(e / C), c = static_cast<int>(e % C);
    int i = p - r0;
    if (i < 0) i += T;
    if (i >= rows) continue;
    float acc = dwpe[e];
    for (; i < rows; i += T) acc += dout[static_cast<size_t>(i) * C + c];
    dwpe[e] = acc;
  }
}

template <int W>
__device__ __forceinline__ void load_row(const float* p, float (&x)[W]) {
  if constexpr (W == 4) {
    const float4 q = *reinterpret_cast<const float4*>(p);
    x[0] = q.x, x[1] = q.y, x[2] = q.z, x[3] = q.w;
  } else {
    x[0] = *p;
  }
}

// One block per row: max and sum of exponentials in one online pass (xent_rows_k's), and the
// target's logit where this shard holds it. W = 4: four consecutive logits per access (V a
// multiple of 4, rows 16-byte aligned); both orders fixed.
template <int W>
__global__ void xent_shard_stats_k(float* stats, const float* logits, const int32_t* targets,
                                   int64_t v_lo, int V) {
  __shared__ float fscratch[32];
  const int r = blockIdx.x;
  const float* row = logits + static_cast<size_t>(r) * V;
  const int v0 = W * threadIdx.x, step = W * blockDim.x;
  float x[W];
  float mx = -INFINITY, sum = 0.f;
  for (int v = v0; v < V; v += step) {
    load_row<W>(row + v, x);
    tp::online_step<W>(mx, sum, x);
  }
  const float rmx = block_max(mx, fscratch);
  sum = block_sum(tp::rescaled(mx, sum, rmx), fscratch);
  if (threadIdx.x == 0) {
    const int32_t t = targets[r];
    float* st = stats + static_cast<size_t>(r) * 3;
    st[0] = rmx;
    st[1] = sum;
    st[2] = in_shard(t, v_lo, V) ? row[int64_t(t) - v_lo] : 0.f;
  }
}

// One thread per row over the t ranks in order (kernels/cpu/tp_kernels.cpp's formulas).
__global__ void xent_shard_combine_k(float* lse, float* loss, const float* stats,
                                     const int32_t* targets, int t, int N) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n < N) tp::combine_row(stats, static_cast<size_t>(N) * 3, t, n, targets[n], lse, loss);
}

// Block r, threads over the row's columns: g = grad_scale * exp(logit - lse) less grad_scale
// at the target (the CPU's two steps, the same two roundings), 0 for an ignored row.
template <int W>
__global__ void xent_shard_grad_k(float* logits, const float* lse, const int32_t* targets,
                                  int64_t v_lo, int V, float grad_scale, uint16_t* d16, int dt) {
  const int r = blockIdx.x;
  float* row = logits + static_cast<size_t>(r) * V;
  uint16_t* row16 = d16 ? d16 + static_cast<size_t>(r) * V : nullptr;
  const int32_t t = targets[r];
  const float l = lse[r];
  const int64_t tv = t >= 0 && in_shard(t, v_lo, V) ? int64_t(t) - v_lo : -1;
  for (int v = W * threadIdx.x; v < V; v += W * blockDim.x) {
    float g[W];
    if (t < 0) {
      for (int k = 0; k < W; ++k) g[k] = 0.f;
    } else {
      load_row<W>(row + v, g);
      for (int k = 0; k < W; ++k) g[k] = tp::shard_grad(g[k], l, grad_scale, v + k == tv);
    }
    if (row16) {
      for (int k = 0; k < W; ++k) row16[v + k] = to_half_d(dt, g[k]);
    } else if constexpr (W == 4) {
      *reinterpret_cast<float4*>(row + v) = make_float4(g[0], g[1], g[2], g[3]);
    } else {
      row[v] = g[0];
    }
  }
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void vocab_embedding_forward(cudaStream_t s, float* out, const int32_t* tokens, const float* wte,
                             const uint16_t* wte16, int dt, int64_t v_lo, int N, int C, int V) {
  const size_t total = static_cast<size_t>(N) * C;
  if (total == 0) return;
  if (wte)
    vocab_embedding_forward_k<float><<<grid_for(total, kThreads), kThreads, 0, s>>>(
        out, tokens, wte, 0, v_lo, C, V, total);
  else
    vocab_embedding_forward_k<uint16_t><<<grid_for(total, kThreads), kThreads, 0, s>>>(
        out, tokens, wte16, dt, v_lo, C, V, total);
  SW_CUDA_LAUNCHED();
}

void vocab_embedding_backward(cudaStream_t s, float* dwte, const float* dout,
                              const int32_t* tokens, int64_t v_lo, int N, int C, int V) {
  if (N <= 0 || C <= 0 || V <= 0) return;
  const dim3 grid((C + kThreads - 1) / kThreads, kBuckets);
  vocab_embedding_backward_k<<<grid, kThreads, 0, s>>>(dwte, dout, tokens, v_lo, N, C, V);
  SW_CUDA_LAUNCHED();
}

void position_forward(cudaStream_t s, float* out, const float* wpe, int64_t row_lo, int rows,
                      int T, int C) {
  const size_t total = static_cast<size_t>(rows) * C;
  if (total == 0) return;
  position_forward_k<<<grid_for(total, kThreads), kThreads, 0, s>>>(out, wpe, row_lo % T, T, C,
                                                                    total);
  SW_CUDA_LAUNCHED();
}

void position_backward(cudaStream_t s, float* dwpe, const float* dout, int64_t row_lo, int rows,
                       int T, int C) {
  const size_t total = static_cast<size_t>(T) * C;
  if (rows <= 0 || total == 0) return;
  position_backward_k<<<grid_for(total, kThreads), kThreads, 0, s>>>(
      dwpe, dout, static_cast<int>(row_lo % T), rows, T, C);
  SW_CUDA_LAUNCHED();
}

void xent_shard_stats_rows(cudaStream_t s, float* stats, const float* logits,
                           const int32_t* targets, int64_t v_lo, int nc, int V) {
  if (nc <= 0) return;
  if (V % 4 == 0 && aligned16(logits))
    xent_shard_stats_k<4><<<nc, kRowThreads, 0, s>>>(stats, logits, targets, v_lo, V);
  else
    xent_shard_stats_k<1><<<nc, kRowThreads, 0, s>>>(stats, logits, targets, v_lo, V);
  SW_CUDA_LAUNCHED();
}

void xent_shard_combine(cudaStream_t s, double* total, float* lse, float* loss,
                        const float* stats, const int32_t* targets, int t, int N) {
  if (N <= 0) return;
  xent_shard_combine_k<<<(N + kThreads - 1) / kThreads, kThreads, 0, s>>>(lse, loss, stats,
                                                                          targets, t, N);
  SW_CUDA_LAUNCHED();
  sum_rows(s, total, loss, N, true);
}

void xent_shard_grad_rows(cudaStream_t s, float* logits, const float* lse, const int32_t* targets,
                          int64_t v_lo, int nc, int V, float grad_scale, uint16_t* d16, int dt) {
  if (nc <= 0) return;
  if (V % 4 == 0 && aligned16(logits))
    xent_shard_grad_k<4><<<nc, kThreads, 0, s>>>(logits, lse, targets, v_lo, V, grad_scale, d16,
                                                 dt);
  else
    xent_shard_grad_k<1><<<nc, kThreads, 0, s>>>(logits, lse, targets, v_lo, V, grad_scale, d16,
                                                 dt);
  SW_CUDA_LAUNCHED();
}

}  // namespace sw::cuda
