// LayerNorm / RMSNorm (and their fused residual forms) on the GPU, plus deterministic column
// sums.
//
// Forward: one warp per row. Lane j takes columns j, j + 32, ...; row sums use warp_sum's fixed
// butterfly. LayerNorm takes two passes for the variance (no E[x^2] - E[x]^2 cancellation), as
// the CPU does. The fused residual forms write res = a + b and sum the same values in the same
// lane order as the plain kernel summing res afterwards, so fused == unfused bit for bit (res
// may alias a or b: each lane reads a[i], b[i] before it writes res[i], and only that lane
// touches column i of the row).
//
// Backward: dinp is per row (one warp per row). dw / db are sums over rows: the rows are cut
// into row blocks whose size depends only on N; thread c of a column block sums its column over
// one row block (in row order) into a partials buffer, and a second kernel adds the partials
// of each column in row-block order into dw / db. No atomics: the same bits on every run.
#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.cuh"

namespace sw::cuda {

namespace {

constexpr float kLayerNormEps = 1e-5f;
constexpr int kRowThreads = 256;  // 8 warps = 8 rows per block
constexpr int kColThreads = 128;  // columns per column block

struct RowBlocks {
  int rows;   // rows per block
  int count;  // number of blocks
};
RowBlocks row_blocks(int N) {
  const int rows = std::max(32, (N + 255) / 256);
  return {rows, (N + rows - 1) / rows};
}

// LN: layernorm (bias may be null), else rmsnorm. RES: x = a + b is written to res first.
template <bool LN, bool RES>
__global__ void norm_forward_k(float* res, float* out, float* mean, float* rstd, const float* a,
                               const float* b, const float* w, const float* bias, int N, int C,
                               float eps) {
  const int row = (blockIdx.x * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;
  const size_t off = static_cast<size_t>(row) * C;
  const float* x;
  float s = 0.f;
  if (RES) {
    for (int i = lane; i < C; i += kWarp) {
      const float v = a[off + i] + b[off + i];
      res[off + i] = v;
      s += LN ? v : v * v;
    }
    x = res + off;
  } else {
    x = a + off;
    for (int i = lane; i < C; i += kWarp) s += LN ? x[i] : x[i] * x[i];
  }
  s = warp_sum(s);
  float* o = out + off;
  if (LN) {
    const float m = s / C;
    float v = 0.f;
    for (int i = lane; i < C; i += kWarp) v += (x[i] - m) * (x[i] - m);
    v = warp_sum(v);
    const float r = 1.f / sqrtf(v / C + kLayerNormEps);
    for (int i = lane; i < C; i += kWarp) {
      const float y = (x[i] - m) * r * w[i];
      o[i] = bias ? y + bias[i] : y;
    }
    if (lane == 0) {
      if (mean) mean[row] = m;
      if (rstd) rstd[row] = r;
    }
  } else {
    const float r = 1.f / sqrtf(s / C + eps);
    for (int i = lane; i < C; i += kWarp) o[i] = x[i] * r * w[i];
    if (lane == 0 && rstd) rstd[row] = r;
  }
}

// dinp rows. LayerNorm: dinp += r (w g - mean(w g) - xhat mean(w g xhat)).
// RMSNorm (mean == null): dinp += r (w g - x r^2 mean(w g x)).
template <bool LN>
__global__ void norm_backward_rows_k(float* dinp, const float* dout, const float* inp,
                                     const float* w, const float* mean, const float* rstd, int N,
                                     int C) {
  const int row = (blockIdx.x * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;
  const size_t off = static_cast<size_t>(row) * C;
  const float* x = inp + off;
  const float* g = dout + off;
  float* dx = dinp + off;
  const float r = rstd[row];
  if (LN) {
    const float m = mean[row];
    float swg = 0.f, swgx = 0.f;
    for (int i = lane; i < C; i += kWarp) {
      const float xh = (x[i] - m) * r;
      const float wg = w[i] * g[i];
      swg += wg;
      swgx += wg * xh;
    }
    const float mean_wg = warp_sum(swg) / C, mean_wgx = warp_sum(swgx) / C;
    for (int i = lane; i < C; i += kWarp) {
      const float xh = (x[i] - m) * r;
      dx[i] += r * (w[i] * g[i] - mean_wg - xh * mean_wgx);
    }
  } else {
    float acc = 0.f;
    for (int i = lane; i < C; i += kWarp) acc += w[i] * g[i] * x[i];
    const float k = r * r * warp_sum(acc) / C;
    for (int i = lane; i < C; i += kWarp) dx[i] += r * (w[i] * g[i] - x[i] * k);
  }
}

// Column partials over one row block (blockIdx.y). MODE 0: p0 = sum g (plain column sum);
// 1 (LayerNorm): p0 = sum g xhat, p1 = sum g; 2 (RMSNorm): p0 = sum g x r.
// part layout: [p0 of block 0..count-1 (C each)] then [p1 of blocks 0..count-1].
template <int MODE>
__global__ void col_partials_k(float* part, const float* dout, const float* inp,
                               const float* mean, const float* rstd, int N, int C, int rows,
                               int count) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int blk = blockIdx.y;
  if (c >= C) return;
  const int n0 = blk * rows, n1 = min(N, n0 + rows);
  float p0 = 0.f, p1 = 0.f;
  for (int n = n0; n < n1; ++n) {
    const size_t i = static_cast<size_t>(n) * C + c;
    const float g = dout[i];
    if (MODE == 0) {
      p0 += g;
    } else if (MODE == 1) {
      p0 += g * ((inp[i] - mean[n]) * rstd[n]);
      p1 += g;
    } else {
      p0 += g * inp[i] * rstd[n];
    }
  }
  part[static_cast<size_t>(blk) * C + c] = p0;
  if (MODE == 1) part[static_cast<size_t>(count + blk) * C + c] = p1;
}

// out[c] += sum over blocks in order of part[b * C + c].
__global__ void col_reduce_k(float* out, const float* part, int C, int count) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float acc = 0.f;
  for (int b = 0; b < count; ++b) acc += part[static_cast<size_t>(b) * C + c];
  out[c] += acc;
}

unsigned row_grid(int N) { return static_cast<unsigned>((N + kRowThreads / kWarp - 1) / (kRowThreads / kWarp)); }

template <int MODE>
void column_sums(cudaStream_t s, float* out0, float* out1, const float* dout, const float* inp,
                 const float* mean, const float* rstd, int N, int C, float* ws) {
  const RowBlocks rb = row_blocks(N);
  const unsigned cblocks = static_cast<unsigned>((C + kColThreads - 1) / kColThreads);
  col_partials_k<MODE><<<dim3(cblocks, rb.count), kColThreads, 0, s>>>(ws, dout, inp, mean, rstd,
                                                                        N, C, rb.rows, rb.count);
  SW_CUDA_LAUNCHED();
  if (out0) {
    col_reduce_k<<<cblocks, kColThreads, 0, s>>>(out0, ws, C, rb.count);
    SW_CUDA_LAUNCHED();
  }
  if (MODE == 1 && out1) {
    col_reduce_k<<<cblocks, kColThreads, 0, s>>>(out1, ws + static_cast<size_t>(rb.count) * C, C,
                                                 rb.count);
    SW_CUDA_LAUNCHED();
  }
}

}  // namespace

size_t colsum_ws(int N, int C) {
  return 2 * static_cast<size_t>(row_blocks(std::max(N, 1)).count) * static_cast<size_t>(C);
}

void colsum_accumulate(cudaStream_t s, float* db, const float* dout, int N, int C, float* ws) {
  if (N <= 0 || C <= 0) return;
  column_sums<0>(s, db, nullptr, dout, nullptr, nullptr, nullptr, N, C, ws);
}

void layernorm_forward(cudaStream_t s, float* res, float* out, float* mean, float* rstd,
                       const float* inp, const float* b_res, const float* w, const float* bias,
                       int N, int C) {
  if (N <= 0 || C <= 0) return;
  if (res)
    norm_forward_k<true, true><<<row_grid(N), kRowThreads, 0, s>>>(res, out, mean, rstd, inp,
                                                                   b_res, w, bias, N, C, 0.f);
  else
    norm_forward_k<true, false><<<row_grid(N), kRowThreads, 0, s>>>(nullptr, out, mean, rstd, inp,
                                                                    nullptr, w, bias, N, C, 0.f);
  SW_CUDA_LAUNCHED();
}

void rmsnorm_forward(cudaStream_t s, float* res, float* out, float* rstd, const float* inp,
                     const float* b_res, const float* w, int N, int C, float eps) {
  if (N <= 0 || C <= 0) return;
  if (res)
    norm_forward_k<false, true><<<row_grid(N), kRowThreads, 0, s>>>(
        res, out, nullptr, rstd, inp, b_res, w, nullptr, N, C, eps);
  else
    norm_forward_k<false, false><<<row_grid(N), kRowThreads, 0, s>>>(
        nullptr, out, nullptr, rstd, inp, nullptr, w, nullptr, N, C, eps);
  SW_CUDA_LAUNCHED();
}

void layernorm_backward(cudaStream_t s, float* dinp, float* dw, float* db, const float* dout,
                        const float* inp, const float* w, const float* mean, const float* rstd,
                        int N, int C, float* ws) {
  if (N <= 0 || C <= 0) return;
  if (dinp) {
    norm_backward_rows_k<true><<<row_grid(N), kRowThreads, 0, s>>>(dinp, dout, inp, w, mean, rstd,
                                                                   N, C);
    SW_CUDA_LAUNCHED();
  }
  if (dw || db) column_sums<1>(s, dw, db, dout, inp, mean, rstd, N, C, ws);
}

void rmsnorm_backward(cudaStream_t s, float* dinp, float* dw, const float* dout,
                      const float* inp, const float* w, const float* rstd, int N, int C,
                      float* ws) {
  if (N <= 0 || C <= 0) return;
  if (dinp) {
    norm_backward_rows_k<false><<<row_grid(N), kRowThreads, 0, s>>>(dinp, dout, inp, w, nullptr,
                                                                    rstd, N, C);
    SW_CUDA_LAUNCHED();
  }
  if (dw) column_sums<2>(s, dw, nullptr, dout, inp, nullptr, rstd, N, C, ws);
}

}  // namespace sw::cuda
