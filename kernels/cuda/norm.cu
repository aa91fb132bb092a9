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
// still summed in row order, so their bits are those of the one-column kernel. The row kernels
// take the chunk width W as a template argument: W = 1 (lane j: columns j, j + 32, ..., one
// float each) serves C % 4 != 0. With one float per access a warp kept too few bytes in
// flight: the H200 op times showed the norms at ~2-2.5 TB/s.
//
// 16-bit outputs (the Ops' norms with a 16-bit out): the same kernel instantiated with LP, which
// runs the
// fp32 kernel's arithmetic unchanged and only rounds each output value to dt (cuda::narrow's
// to_half_d) as it stores it, so out16 == narrow(out) bit for bit; mean, rstd and res are the
// fp32 kernel's.
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

// Chunk j of a row: W consecutive floats at p + W j (VEC: one aligned float4 access when W is
// 4; else W float accesses in order).
template <int W, bool VEC>
__device__ __forceinline__ void ld_chunk(const float* p, float (&v)[W]) {
  if constexpr (W == 4 && VEC) {
    const float4 q = *reinterpret_cast<const float4*>(p);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
  } else {
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = p[k];
  }
}
template <int W, bool VEC>
__device__ __forceinline__ void st_chunk(float* p, const float (&v)[W]) {
  if constexpr (W == 4 && VEC) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
#pragma unroll
    for (int k = 0; k < W; ++k) p[k] = v[k];
  }
}
// Chunk j's W outputs: fp32 at p (st_chunk), or (LP) rounded to dt as cuda::narrow rounds them
// at p16, four 16-bit values in one 8-byte store when VEC.
template <int W, bool VEC, bool LP>
__device__ __forceinline__ void st_out(float* p, uint16_t* p16, int dt, const float (&v)[W]) {
  if constexpr (!LP) {
    st_chunk<W, VEC>(p, v);
  } else if constexpr (W == 4 && VEC) {
    *reinterpret_cast<ushort4*>(p16) = make_ushort4(to_half_d(dt, v[0]), to_half_d(dt, v[1]),
                                                    to_half_d(dt, v[2]), to_half_d(dt, v[3]));
  } else {
#pragma unroll
    for (int k = 0; k < W; ++k) p16[k] = to_half_d(dt, v[k]);
  }
}
bool al16(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; }
bool al8(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 8 == 0; }

// LN: layernorm (bias may be null), else rmsnorm. RES: x = a + b is written to res first.
// W: columns per chunk (the file's header); lane j takes chunks j, j + 32, ...
// LP: the output goes to out16 rounded to dt (out unused), else to out; nothing else differs.
template <bool LN, bool RES, bool LP, int W, bool VEC>
__global__ void norm_forward_k(float* res, float* out, uint16_t* out16, int dt, float* mean,
                               float* rstd, const float* a, const float* b, const float* w,
                               const float* bias, int N, int C, float eps) {
  const int row = (blockIdx.x * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;
  const int CW = C / W;
  const size_t off = static_cast<size_t>(row) * C;
  const float* x = RES ? res + off : a + off;
  float s = 0.f;
  for (int j = lane; j < CW; j += kWarp) {
    float v[W];
    if (RES) {
      float vb[W];
      ld_chunk<W, VEC>(a + off + W * j, v);
      ld_chunk<W, VEC>(b + off + W * j, vb);
#pragma unroll
      for (int k = 0; k < W; ++k) v[k] += vb[k];
      st_chunk<W, VEC>(res + off + W * j, v);
    } else {
      ld_chunk<W, VEC>(x + W * j, v);
    }
#pragma unroll
    for (int k = 0; k < W; ++k) s += LN ? v[k] : v[k] * v[k];
  }
  s = warp_sum(s);
  float* o = LP ? nullptr : out + off;
  uint16_t* o16 = LP ? out16 + off : nullptr;
  if (LN) {
    const float m = s / C;
    float var = 0.f;
    for (int j = lane; j < CW; j += kWarp) {
      float t[W];
      ld_chunk<W, VEC>(x + W * j, t);
#pragma unroll
      for (int k = 0; k < W; ++k) var += (t[k] - m) * (t[k] - m);
    }
    var = warp_sum(var);
    const float r = 1.f / sqrtf(var / C + kLayerNormEps);
    for (int j = lane; j < CW; j += kWarp) {
      float t[W], ww[W], bb[W];
      ld_chunk<W, VEC>(x + W * j, t);
      ld_chunk<W, VEC>(w + W * j, ww);
      if (bias) ld_chunk<W, VEC>(bias + W * j, bb);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const float y = (t[k] - m) * r * ww[k];
        t[k] = bias ? y + bb[k] : y;
      }
      st_out<W, VEC, LP>(LP ? nullptr : o + W * j, LP ? o16 + W * j : nullptr, dt, t);
    }
    if (lane == 0) {
      if (mean) mean[row] = m;
      if (rstd) rstd[row] = r;
    }
  } else {
    const float r = 1.f / sqrtf(s / C + eps);
    for (int j = lane; j < CW; j += kWarp) {
      float t[W], ww[W];
      ld_chunk<W, VEC>(x + W * j, t);
      ld_chunk<W, VEC>(w + W * j, ww);
#pragma unroll
      for (int k = 0; k < W; ++k) t[k] = t[k] * r * ww[k];
      st_out<W, VEC, LP>(LP ? nullptr : o + W * j, LP ? o16 + W * j : nullptr, dt, t);
    }
    if (lane == 0 && rstd) rstd[row] = r;
  }
}

// dinp rows. LayerNorm: dinp += r (w g - mean(w g) - xhat mean(w g xhat)).
// RMSNorm (mean == null): dinp += r (w g - x r^2 mean(w g x)). Chunks as norm_forward_k.
// LP: the sums also go to dinp16 rounded to dt as cuda::narrow rounds them (the residual
// gradient's 16-bit form, the Ops' norm backwards with a 16-bit dinp); nothing else differs.
template <bool LN, int W, bool VEC, bool LP>
__global__ void norm_backward_rows_k(float* dinp, uint16_t* dinp16, int dt, const float* dout,
                                     const float* inp, const float* w, const float* mean,
                                     const float* rstd, int N, int C) {
  const int row = (blockIdx.x * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;
  const int CW = C / W;
  const size_t off = static_cast<size_t>(row) * C;
  const float* x = inp + off;
  const float* g = dout + off;
  float* dx = dinp + off;
  const float r = rstd[row];
  const float m = LN ? mean[row] : 0.f;
  float s1 = 0.f, s2 = 0.f;  // LN: sum w g, sum w g xhat; RMS: sum w g x
  for (int j = lane; j < CW; j += kWarp) {
    float t[W], gg[W], ww[W];
    ld_chunk<W, VEC>(x + W * j, t);
    ld_chunk<W, VEC>(g + W * j, gg);
    ld_chunk<W, VEC>(w + W * j, ww);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      if (LN) {
        const float xh = (t[k] - m) * r;
        const float wg = ww[k] * gg[k];
        s1 += wg;
        s2 += wg * xh;
      } else {
        s1 += ww[k] * gg[k] * t[k];
      }
    }
  }
  // LN: mean(w g), mean(w g xhat); RMSNorm: k = r^2 mean(w g x) in a2.
  const float a1 = LN ? warp_sum(s1) / C : 0.f;
  const float a2 = LN ? warp_sum(s2) / C : r * r * warp_sum(s1) / C;
  for (int j = lane; j < CW; j += kWarp) {
    float t[W], gg[W], ww[W], d[W];
    ld_chunk<W, VEC>(x + W * j, t);
    ld_chunk<W, VEC>(g + W * j, gg);
    ld_chunk<W, VEC>(w + W * j, ww);
    ld_chunk<W, VEC>(dx + W * j, d);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      if (LN) {
        const float xh = (t[k] - m) * r;
        d[k] += r * (ww[k] * gg[k] - a1 - xh * a2);
      } else {
        d[k] += r * (ww[k] * gg[k] - t[k] * a2);
      }
    }
    st_chunk<W, VEC>(dx + W * j, d);
    if constexpr (LP) st_out<W, VEC, true>(nullptr, dinp16 + off + W * j, dt, d);
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

// MODE 0's partials of a 16-bit dout (dt), widened as read: col_partials_k's sums in its
// order, so the bits of the column sums of widen(dout). W = 4: four columns a thread (C % 4 ==
// 0, dout 8-byte aligned).
template <int W>
__global__ void col_partials16_k(float* part, const uint16_t* dout, int dt, int N, int C,
                                 int rows) {
  const int c = W * (blockIdx.x * blockDim.x + threadIdx.x);
  const int blk = blockIdx.y;
  if (c >= C) return;
  const int n0 = blk * rows, n1 = min(N, n0 + rows);
  float p[W] = {};
  for (int n = n0; n < n1; ++n) {
    const size_t i = static_cast<size_t>(n) * C + c;
    if constexpr (W == 4) {
      const ushort4 h = *reinterpret_cast<const ushort4*>(dout + i);
      p[0] += from_half_d(dt, h.x), p[1] += from_half_d(dt, h.y);
      p[2] += from_half_d(dt, h.z), p[3] += from_half_d(dt, h.w);
    } else {
      p[0] += from_half_d(dt, dout[i]);
    }
  }
  for (int k = 0; k < W; ++k) part[static_cast<size_t>(blk) * C + c + k] = p[k];
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

// W = 4 where C % 4 == 0 (VEC when every pointer is 16-byte aligned, out16 8-byte aligned),
// else W = 1.
template <bool LN, bool RES, bool LP>
void norm_forward_t(cudaStream_t s, float* res, float* out, uint16_t* out16, int dt, float* mean,
                    float* rstd, const float* a, const float* b, const float* w,
                    const float* bias, int N, int C, float eps) {
  const unsigned g = row_grid(N);
  if (C % 4 != 0)
    norm_forward_k<LN, RES, LP, 1, false><<<g, kRowThreads, 0, s>>>(
        res, out, out16, dt, mean, rstd, a, b, w, bias, N, C, eps);
  else if (al16(res) && al16(out) && al8(out16) && al16(a) && al16(b) && al16(w) && al16(bias))
    norm_forward_k<LN, RES, LP, 4, true><<<g, kRowThreads, 0, s>>>(
        res, out, out16, dt, mean, rstd, a, b, w, bias, N, C, eps);
  else
    norm_forward_k<LN, RES, LP, 4, false><<<g, kRowThreads, 0, s>>>(
        res, out, out16, dt, mean, rstd, a, b, w, bias, N, C, eps);
  SW_CUDA_LAUNCHED();
}
// out16 set: the 16-bit form (out unused), else out.
template <bool LN, bool RES>
void norm_forward(cudaStream_t s, float* res, float* out, uint16_t* out16, int dt, float* mean,
                  float* rstd, const float* a, const float* b, const float* w, const float* bias,
                  int N, int C, float eps) {
  if (N <= 0 || C <= 0) return;
  if (out16)
    norm_forward_t<LN, RES, true>(s, res, nullptr, out16, dt, mean, rstd, a, b, w, bias, N, C,
                                  eps);
  else
    norm_forward_t<LN, RES, false>(s, res, out, nullptr, 0, mean, rstd, a, b, w, bias, N, C, eps);
}
template <bool LN, bool LP>
void norm_backward_rows_t(cudaStream_t s, float* dinp, uint16_t* dinp16, int dt,
                          const float* dout, const float* inp, const float* w, const float* mean,
                          const float* rstd, int N, int C) {
  const unsigned g = row_grid(N);
  if (C % 4 != 0)
    norm_backward_rows_k<LN, 1, false, LP><<<g, kRowThreads, 0, s>>>(dinp, dinp16, dt, dout, inp,
                                                                     w, mean, rstd, N, C);
  else if (al16(dinp) && al16(dout) && al16(inp) && al16(w) && al8(dinp16))
    norm_backward_rows_k<LN, 4, true, LP><<<g, kRowThreads, 0, s>>>(dinp, dinp16, dt, dout, inp,
                                                                    w, mean, rstd, N, C);
  else
    norm_backward_rows_k<LN, 4, false, LP><<<g, kRowThreads, 0, s>>>(dinp, dinp16, dt, dout, inp,
                                                                     w, mean, rstd, N, C);
  SW_CUDA_LAUNCHED();
}
template <bool LN>
void norm_backward_rows(cudaStream_t s, float* dinp, uint16_t* dinp16, int dt, const float* dout,
                        const float* inp, const float* w, const float* mean, const float* rstd,
                        int N, int C) {
  if (dinp16)
    norm_backward_rows_t<LN, true>(s, dinp, dinp16, dt, dout, inp, w, mean, rstd, N, C);
  else
    norm_backward_rows_t<LN, false>(s, dinp, nullptr, 0, dout, inp, w, mean, rstd, N, C);
}

}  // namespace

size_t colsum_ws(int N, int C) {
  return 2 * static_cast<size_t>(row_blocks(std::max(N, 1)).count) * static_cast<size_t>(C);
}

void colsum_accumulate(cudaStream_t s, float* db, const float* dout, int N, int C, float* ws) {
  if (N <= 0 || C <= 0) return;
  column_sums<0>(s, db, nullptr, dout, nullptr, nullptr, nullptr, N, C, ws);
}

void colsum_accumulate16(cudaStream_t s, int dt, float* db, const uint16_t* dout, int N, int C,
                         float* ws) {
  if (N <= 0 || C <= 0) return;
  const RowBlocks rb = row_blocks(N);
  const unsigned cblocks = static_cast<unsigned>((C + kColThreads - 1) / kColThreads);
  if (C % 4 == 0 && reinterpret_cast<uintptr_t>(dout) % 8 == 0) {
    const unsigned cb4 = static_cast<unsigned>((C / 4 + kColThreads - 1) / kColThreads);
    col_partials16_k<4><<<dim3(cb4, rb.count), kColThreads, 0, s>>>(ws, dout, dt, N, C, rb.rows);
  } else {
    col_partials16_k<1><<<dim3(cblocks, rb.count), kColThreads, 0, s>>>(ws, dout, dt, N, C,
                                                                         rb.rows);
  }
  SW_CUDA_LAUNCHED();
  col_reduce_k<<<cblocks, kColThreads, 0, s>>>(db, ws, C, rb.count);
  SW_CUDA_LAUNCHED();
}

void layernorm_forward(cudaStream_t s, float* res, float* out, float* mean, float* rstd,
                       const float* inp, const float* b_res, const float* w, const float* bias,
                       int N, int C, uint16_t* out16, int dt) {
  if (res)
    norm_forward<true, true>(s, res, out, out16, dt, mean, rstd, inp, b_res, w, bias, N, C, 0.f);
  else
    norm_forward<true, false>(s, nullptr, out, out16, dt, mean, rstd, inp, nullptr, w, bias, N,
                              C, 0.f);
}

void rmsnorm_forward(cudaStream_t s, float* res, float* out, float* rstd, const float* inp,
                     const float* b_res, const float* w, int N, int C, float eps,
                     uint16_t* out16, int dt) {
  if (res)
    norm_forward<false, true>(s, res, out, out16, dt, nullptr, rstd, inp, b_res, w, nullptr, N,
                              C, eps);
  else
    norm_forward<false, false>(s, nullptr, out, out16, dt, nullptr, rstd, inp, nullptr, w,
                               nullptr, N, C, eps);
}

void layernorm_backward(cudaStream_t s, float* dinp, float* dw, float* db, const float* dout,
                        const float* inp, const float* w, const float* mean, const float* rstd,
                        int N, int C, float* ws, uint16_t* dinp16, int dt) {
  if (N <= 0 || C <= 0) return;
  if (dinp) norm_backward_rows<true>(s, dinp, dinp16, dt, dout, inp, w, mean, rstd, N, C);
  if (dw || db) column_sums<1>(s, dw, db, dout, inp, mean, rstd, N, C, ws);
}

void rmsnorm_backward(cudaStream_t s, float* dinp, float* dw, const float* dout,
                      const float* inp, const float* w, const float* rstd, int N, int C,
                      float* ws, uint16_t* dinp16, int dt) {
  if (N <= 0 || C <= 0) return;
  if (dinp) norm_backward_rows<false>(s, dinp, dinp16, dt, dout, inp, w, nullptr, rstd, N, C);
  if (dw) column_sums<2>(s, dw, nullptr, dout, inp, nullptr, rstd, N, C, ws);
}

}  // namespace sw::cuda
