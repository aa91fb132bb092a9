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
//
// Four columns at a time where C is a multiple of 4 (every model's d_model): lane j of a row
// takes the chunks of four columns j, j + 32, ... (columns 4j..4j+3, then 4(j+32)..) and adds
// each chunk's values in column order. A chunk is one float4 access when every pointer is
// 16-byte aligned, else four float accesses in the same order, so the bits depend on C, never
// on alignment. The column partials take four columns per thread the same way; each column is
// still summed in row order, so their bits are those of the one-column kernel. The one-float
// kernels (lane j: columns j, j + 32, ...) serve C % 4 != 0. With one float per access a warp
// kept too few bytes in flight: the H200 op times showed the norms at ~2-2.5 TB/s.
#include <algorithm>
#include <cstdint>

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

// Chunk k of four floats at p (VEC: one aligned float4 access; else four in order).
template <bool VEC>
__device__ __forceinline__ float4 ld_chunk(const float* p) {
  if (VEC) return *reinterpret_cast<const float4*>(p);
  return make_float4(p[0], p[1], p[2], p[3]);
}
template <bool VEC>
__device__ __forceinline__ void st_chunk(float* p, float4 v) {
  if (VEC) {
    *reinterpret_cast<float4*>(p) = v;
  } else {
    p[0] = v.x, p[1] = v.y, p[2] = v.z, p[3] = v.w;
  }
}
bool al16(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// norm_forward_k over chunks of four columns (C % 4 == 0; the file's header).
template <bool LN, bool RES, bool VEC>
__global__ void norm_forward4_k(float* res, float* out, float* mean, float* rstd, const float* a,
                                const float* b, const float* w, const float* bias, int N, int C,
                                float eps) {
  const int row = (blockIdx.x * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;
  const int C4 = C / 4;
  const size_t off = static_cast<size_t>(row) * C;
  const float* x;
  float s = 0.f;
  if (RES) {
    for (int j = lane; j < C4; j += kWarp) {
      const float4 va = ld_chunk<VEC>(a + off + 4 * j), vb = ld_chunk<VEC>(b + off + 4 * j);
      const float4 v = make_float4(va.x + vb.x, va.y + vb.y, va.z + vb.z, va.w + vb.w);
      st_chunk<VEC>(res + off + 4 * j, v);
      if (LN) {
        s += v.x, s += v.y, s += v.z, s += v.w;
      } else {
        s += v.x * v.x, s += v.y * v.y, s += v.z * v.z, s += v.w * v.w;
      }
    }
    x = res + off;
  } else {
    x = a + off;
    for (int j = lane; j < C4; j += kWarp) {
      const float4 v = ld_chunk<VEC>(x + 4 * j);
      if (LN) {
        s += v.x, s += v.y, s += v.z, s += v.w;
      } else {
        s += v.x * v.x, s += v.y * v.y, s += v.z * v.z, s += v.w * v.w;
      }
    }
  }
  s = warp_sum(s);
  float* o = out + off;
  if (LN) {
    const float m = s / C;
    float v = 0.f;
    for (int j = lane; j < C4; j += kWarp) {
      const float4 t = ld_chunk<VEC>(x + 4 * j);
      v += (t.x - m) * (t.x - m), v += (t.y - m) * (t.y - m);
      v += (t.z - m) * (t.z - m), v += (t.w - m) * (t.w - m);
    }
    v = warp_sum(v);
    const float r = 1.f / sqrtf(v / C + kLayerNormEps);
    for (int j = lane; j < C4; j += kWarp) {
      const float4 t = ld_chunk<VEC>(x + 4 * j), ww = ld_chunk<VEC>(w + 4 * j);
      float4 y = make_float4((t.x - m) * r * ww.x, (t.y - m) * r * ww.y, (t.z - m) * r * ww.z,
                             (t.w - m) * r * ww.w);
      if (bias) {
        const float4 bb = ld_chunk<VEC>(bias + 4 * j);
        y = make_float4(y.x + bb.x, y.y + bb.y, y.z + bb.z, y.w + bb.w);
      }
      st_chunk<VEC>(o + 4 * j, y);
    }
    if (lane == 0) {
      if (mean) mean[row] = m;
      if (rstd) rstd[row] = r;
    }
  } else {
    const float r = 1.f / sqrtf(s / C + eps);
    for (int j = lane; j < C4; j += kWarp) {
      const float4 t = ld_chunk<VEC>(x + 4 * j), ww = ld_chunk<VEC>(w + 4 * j);
      st_chunk<VEC>(o + 4 * j, make_float4(t.x * r * ww.x, t.y * r * ww.y, t.z * r * ww.z,
                                           t.w * r * ww.w));
    }
    if (lane == 0 && rstd) rstd[row] = r;
  }
}

// norm_backward_rows_k over chunks of four columns (C % 4 == 0).
template <bool LN, bool VEC>
__global__ void norm_backward_rows4_k(float* dinp, const float* dout, const float* inp,
                                      const float* w, const float* mean, const float* rstd, int N,
                                      int C) {
  const int row = (blockIdx.x * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;
  const int C4 = C / 4;
  const size_t off = static_cast<size_t>(row) * C;
  const float* x = inp + off;
  const float* g = dout + off;
  float* dx = dinp + off;
  const float r = rstd[row];
  if (LN) {
    const float m = mean[row];
    float swg = 0.f, swgx = 0.f;
    for (int j = lane; j < C4; j += kWarp) {
      const float4 t = ld_chunk<VEC>(x + 4 * j), gg = ld_chunk<VEC>(g + 4 * j),
                   ww = ld_chunk<VEC>(w + 4 * j);
      const float xs[4] = {t.x, t.y, t.z, t.w}, gs[4] = {gg.x, gg.y, gg.z, gg.w},
                  ws[4] = {ww.x, ww.y, ww.z, ww.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float xh = (xs[k] - m) * r;
        const float wg = ws[k] * gs[k];
        swg += wg;
        swgx += wg * xh;
      }
    }
    const float mean_wg = warp_sum(swg) / C, mean_wgx = warp_sum(swgx) / C;
    for (int j = lane; j < C4; j += kWarp) {
      const float4 t = ld_chunk<VEC>(x + 4 * j), gg = ld_chunk<VEC>(g + 4 * j),
                   ww = ld_chunk<VEC>(w + 4 * j);
      float4 d = ld_chunk<VEC>(dx + 4 * j);
      d.x += r * (ww.x * gg.x - mean_wg - ((t.x - m) * r) * mean_wgx);
      d.y += r * (ww.y * gg.y - mean_wg - ((t.y - m) * r) * mean_wgx);
      d.z += r * (ww.z * gg.z - mean_wg - ((t.z - m) * r) * mean_wgx);
      d.w += r * (ww.w * gg.w - mean_wg - ((t.w - m) * r) * mean_wgx);
      st_chunk<VEC>(dx + 4 * j, d);
    }
  } else {
    float acc = 0.f;
    for (int j = lane; j < C4; j += kWarp) {
      const float4 t = ld_chunk<VEC>(x + 4 * j), gg = ld_chunk<VEC>(g + 4 * j),
                   ww = ld_chunk<VEC>(w + 4 * j);
      acc += ww.x * gg.x * t.x, acc += ww.y * gg.y * t.y;
      acc += ww.z * gg.z * t.z, acc += ww.w * gg.w * t.w;
    }
    const float k = r * r * warp_sum(acc) / C;
    for (int j = lane; j < C4; j += kWarp) {
      const float4 t = ld_chunk<VEC>(x + 4 * j), gg = ld_chunk<VEC>(g + 4 * j),
                   ww = ld_chunk<VEC>(w + 4 * j);
      float4 d = ld_chunk<VEC>(dx + 4 * j);
      d.x += r * (ww.x * gg.x - t.x * k);
      d.y += r * (ww.y * gg.y - t.y * k);
      d.z += r * (ww.z * gg.z - t.z * k);
      d.w += r * (ww.w * gg.w - t.w * k);
      st_chunk<VEC>(dx + 4 * j, d);
    }
  }
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

// col_partials_k for four columns per thread (C % 4 == 0, dout and inp 16-byte aligned): each
// column's sum is the same expression in the same row order, so the same bits.
template <int MODE>
__global__ void col_partials4_k(float* part, const float* dout, const float* inp,
                                const float* mean, const float* rstd, int N, int C, int rows,
                                int count) {
  const int c = 4 * (blockIdx.x * blockDim.x + threadIdx.x);
  const int blk = blockIdx.y;
  if (c >= C) return;
  const int n0 = blk * rows, n1 = min(N, n0 + rows);
  float4 p0 = make_float4(0.f, 0.f, 0.f, 0.f), p1 = p0;
  for (int n = n0; n < n1; ++n) {
    const size_t i = static_cast<size_t>(n) * C + c;
    const float4 g = *reinterpret_cast<const float4*>(dout + i);
    if (MODE == 0) {
      p0.x += g.x, p0.y += g.y, p0.z += g.z, p0.w += g.w;
    } else if (MODE == 1) {
      const float4 x = *reinterpret_cast<const float4*>(inp + i);
      const float m = mean[n], r = rstd[n];
      p0.x += g.x * ((x.x - m) * r), p0.y += g.y * ((x.y - m) * r);
      p0.z += g.z * ((x.z - m) * r), p0.w += g.w * ((x.w - m) * r);
      p1.x += g.x, p1.y += g.y, p1.z += g.z, p1.w += g.w;
    } else {
      const float4 x = *reinterpret_cast<const float4*>(inp + i);
      const float r = rstd[n];
      p0.x += g.x * x.x * r, p0.y += g.y * x.y * r, p0.z += g.z * x.z * r, p0.w += g.w * x.w * r;
    }
  }
  *reinterpret_cast<float4*>(part + static_cast<size_t>(blk) * C + c) = p0;
  if (MODE == 1) *reinterpret_cast<float4*>(part + static_cast<size_t>(count + blk) * C + c) = p1;
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
  if (C % 4 == 0 && al16(dout) && al16(inp) && al16(ws)) {
    const unsigned cb4 = static_cast<unsigned>((C / 4 + kColThreads - 1) / kColThreads);
    col_partials4_k<MODE><<<dim3(cb4, rb.count), kColThreads, 0, s>>>(ws, dout, inp, mean, rstd,
                                                                       N, C, rb.rows, rb.count);
  } else {
    col_partials_k<MODE><<<dim3(cblocks, rb.count), kColThreads, 0, s>>>(
        ws, dout, inp, mean, rstd, N, C, rb.rows, rb.count);
  }
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

// The four-column kernels where C % 4 == 0 (VEC when every pointer is 16-byte aligned).
template <bool LN, bool RES>
void norm_forward4(cudaStream_t s, float* res, float* out, float* mean, float* rstd,
                   const float* a, const float* b, const float* w, const float* bias, int N, int C,
                   float eps) {
  const bool vec = al16(res) && al16(out) && al16(a) && al16(b) && al16(w) && al16(bias);
  if (vec)
    norm_forward4_k<LN, RES, true><<<row_grid(N), kRowThreads, 0, s>>>(res, out, mean, rstd, a, b,
                                                                      w, bias, N, C, eps);
  else
    norm_forward4_k<LN, RES, false><<<row_grid(N), kRowThreads, 0, s>>>(res, out, mean, rstd, a,
                                                                       b, w, bias, N, C, eps);
  SW_CUDA_LAUNCHED();
}
template <bool LN>
void norm_backward_rows4(cudaStream_t s, float* dinp, const float* dout, const float* inp,
                         const float* w, const float* mean, const float* rstd, int N, int C) {
  const bool vec = al16(dinp) && al16(dout) && al16(inp) && al16(w);
  if (vec)
    norm_backward_rows4_k<LN, true><<<row_grid(N), kRowThreads, 0, s>>>(dinp, dout, inp, w, mean,
                                                                       rstd, N, C);
  else
    norm_backward_rows4_k<LN, false><<<row_grid(N), kRowThreads, 0, s>>>(dinp, dout, inp, w, mean,
                                                                        rstd, N, C);
  SW_CUDA_LAUNCHED();
}

void layernorm_forward(cudaStream_t s, float* res, float* out, float* mean, float* rstd,
                       const float* inp, const float* b_res, const float* w, const float* bias,
                       int N, int C) {
  if (N <= 0 || C <= 0) return;
  if (C % 4 == 0) {
    if (res)
      norm_forward4<true, true>(s, res, out, mean, rstd, inp, b_res, w, bias, N, C, 0.f);
    else
      norm_forward4<true, false>(s, nullptr, out, mean, rstd, inp, nullptr, w, bias, N, C, 0.f);
    return;
  }
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
  if (C % 4 == 0) {
    if (res)
      norm_forward4<false, true>(s, res, out, nullptr, rstd, inp, b_res, w, nullptr, N, C, eps);
    else
      norm_forward4<false, false>(s, nullptr, out, nullptr, rstd, inp, nullptr, w, nullptr, N, C,
                                  eps);
    return;
  }
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
  if (dinp && C % 4 == 0) {
    norm_backward_rows4<true>(s, dinp, dout, inp, w, mean, rstd, N, C);
  } else if (dinp) {
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
  if (dinp && C % 4 == 0) {
    norm_backward_rows4<false>(s, dinp, dout, inp, w, nullptr, rstd, N, C);
  } else if (dinp) {
    norm_backward_rows_k<false><<<row_grid(N), kRowThreads, 0, s>>>(dinp, dout, inp, w, nullptr,
                                                                    rstd, N, C);
    SW_CUDA_LAUNCHED();
  }
  if (dw) column_sums<2>(s, dw, nullptr, dout, inp, nullptr, rstd, N, C, ws);
}

}  // namespace sw::cuda
