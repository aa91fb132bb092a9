// LayerNorm and RMSNorm over the last dim of (N, C) rows.
//
// Forward: one parallel loop over rows; each row (a few KiB) stays in L1 for its passes. The
// residual_* variants add the residual stream into the row in the norm's first pass.
// Backward: dinp is per-row; dw/db are sums over rows, computed deterministically. Rows are cut
// into a fixed number of contiguous blocks that depends only on N (never on the thread count);
// each block accumulates its own partial dw/db rows, then the partials are summed block by block
// in index order, columns split across threads. So results are bit-identical for any thread
// count, and the only scratch is one small partials buffer that is reused across calls.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/alloc.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/cpu_kernels.h"

namespace sw::cpu {

namespace {

constexpr float kLayerNormEps = 1e-5f;
constexpr size_t kParallelMin = size_t{1} << 14;  // elements; below this, run on one thread

// Blocking of rows for the dw/db reductions: at most 64 blocks of at least 8 rows.
struct RowBlocks {
  int rows;  // rows per block
  int count;
};
RowBlocks row_blocks(int N) {
  const int count = std::max(1, std::min(64, N / 8));
  const int rows = (N + count - 1) / count;
  return {rows, (N + rows - 1) / rows};
}

// Partial rows are padded to whole 64-byte lines so that blocks written by different threads
// never share a cache line.
size_t padded(int C) { return (static_cast<size_t>(C) + 15) / 16 * 16; }

// Scratch for the per-block partial sums, 64-byte aligned; grows only, owned by the calling
// thread (a tracked Mem::Workspace buffer kept between calls).
float* partials(size_t floats) {
  thread_local Buffer buf;
  return detail::grow_workspace(buf, floats);
}

// out[c] += sum over blocks b (in order) of part[b * stride + c], for c in [0, C), when out is
// not null. Columns are split across the threads of the enclosing parallel region.
void reduce_blocks(float* out, const float* part, size_t stride, int nblocks, int C) {
  constexpr int kCols = 64;
  const int nchunks = (C + kCols - 1) / kCols;
#pragma omp for schedule(static)
  for (int ch = 0; ch < nchunks; ++ch) {
    const int c0 = ch * kCols, nc = std::min(kCols, C - c0);
    float acc[kCols] = {};
    for (int b = 0; b < nblocks; ++b) {
      const float* p = part + b * stride + c0;
#pragma omp simd
      for (int c = 0; c < nc; ++c) acc[c] += p[c];
    }
    if (out) {
#pragma omp simd
      for (int c = 0; c < nc; ++c) out[c0 + c] += acc[c];
    }
  }
}

// A backward's 16-bit form of its row of dinp (the Ops' residual gradient in both forms), written
// while the row is in L1: narrow() of the fp32 sums, bit for bit.
inline void narrow_row(DType dt, uint16_t* d16, const float* d, int C) {
  if (dt == DType::BF16) {
#pragma omp simd
    for (int i = 0; i < C; ++i) d16[i] = detail::to_kind<1>(d[i]);
  } else {
    for (int i = 0; i < C; ++i) d16[i] = detail::to_kind<2>(d[i]);
  }
}

// Row reductions. A single `omp simd reduction` accumulator serialises on the add latency
// (~4 cycles per 16 floats); these keep kLanes = 64 independent partial sums (four vectors),
// fold a tail of < 64 terms into the first lanes, and combine the lanes pairwise. The order is
// fixed, so results are deterministic.
constexpr int kLanes = 64;

inline float lanes_total(float* acc) {
  for (int w = kLanes / 2; w >= 1; w /= 2) {
#pragma omp simd
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  }
  return acc[0];
}

// sum_i f(i) for i in [0, C).
template <class F>
inline float row_sum(int C, const F& f) {
  float acc[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= C; i += kLanes) {
#pragma omp simd
    for (int j = 0; j < kLanes; ++j) acc[j] += f(i + j);
  }
  const int tail = C - i;
#pragma omp simd
  for (int j = 0; j < tail; ++j) acc[j] += f(i + j);
  return lanes_total(acc);
}

// One LayerNorm row given sum(x) (computed by the caller with row_sum, so that the fused
// residual variant below produces the same bits): o = (x - mean) * rstd * w + b [b may be null].
// Two passes for the variance (the row is in L1), so no E[x^2] - E[x]^2 cancellation.
// An output element: the float, or (uint16_t: the Ops' 16-bit outputs) narrowed to dt as
// narrow() writes it.
inline void store(float* o, float v, DType) { *o = v; }
inline void store(uint16_t* o, float v, DType dt) {
  *o = dt == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
}

template <class T>
inline void layernorm_row(T* o, float* mean, float* rstd, const float* x, float sum,
                          const float* w, const float* b, int C, DType dt) {
  const float m = sum / C;
  const float v = row_sum(C, [x, m](int i) { return (x[i] - m) * (x[i] - m); });
  const float r = 1.f / std::sqrt(v / C + kLayerNormEps);
  if (b) {
#pragma omp simd
    for (int i = 0; i < C; ++i) store(o + i, (x[i] - m) * r * w[i] + b[i], dt);
  } else {
#pragma omp simd
    for (int i = 0; i < C; ++i) store(o + i, (x[i] - m) * r * w[i], dt);
  }
  if (mean) *mean = m;
  if (rstd) *rstd = r;
}

// One RMSNorm row given sum(x^2): o = x * rstd * w.
template <class T>
inline void rmsnorm_row(T* o, float* rstd, const float* x, float ss, const float* w, int C,
                        float eps, DType dt) {
  const float r = 1.f / std::sqrt(ss / C + eps);
#pragma omp simd
  for (int i = 0; i < C; ++i) store(o + i, x[i] * r * w[i], dt);
  if (rstd) *rstd = r;
}

// s = a + b for one row, written to res while its sum (residual_row_sum) or sum of squares
// (residual_row_sumsq) is accumulated in row_sum's lane order: the same floats summed in the
// same order as row_sum over res afterwards, so the fused kernels are bit-identical to the
// unfused pair (the build is ISO C++, -ffp-contract=off: no FMA contraction differs either).
inline float residual_row_sum(float* res, const float* a, const float* b, int C) {
  return row_sum(C, [res, a, b](int i) {
    const float s = a[i] + b[i];
    res[i] = s;
    return s;
  });
}
inline float residual_row_sumsq(float* res, const float* a, const float* b, int C) {
  return row_sum(C, [res, a, b](int i) {
    const float s = a[i] + b[i];
    res[i] = s;
    return s * s;
  });
}

}  // namespace

namespace {

template <class T>
void layernorm_forward_t(T* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, int N, int C, DType dt) {
#pragma omp parallel for schedule(static) if (parallel : static_cast<size_t>(N) * C >= kParallelMin)
  for (int n = 0; n < N; ++n) {
    const size_t off = static_cast<size_t>(n) * C;
    const float* x = inp + off;
    layernorm_row(out + off, mean ? mean + n : nullptr, rstd ? rstd + n : nullptr, x,
                  row_sum(C, [x](int i) { return x[i]; }), w, b, C, dt);
  }
}

// Row by row: the residual row is summed while it is written, then normalised while it is
// still in L1.
template <class T>
void residual_layernorm_forward_t(float* res, T* out, float* mean, float* rstd, const float* a,
                                  const float* b, const float* w, const float* bias, int N, int C,
                                  DType dt) {
#pragma omp parallel for schedule(static) if (parallel : static_cast<size_t>(N) * C >= kParallelMin)
  for (int n = 0; n < N; ++n) {
    const size_t off = static_cast<size_t>(n) * C;
    float* r = res + off;
    const float sum = residual_row_sum(r, a + off, b + off, C);
    layernorm_row(out + off, mean ? mean + n : nullptr, rstd ? rstd + n : nullptr, r, sum, w,
                  bias, C, dt);
  }
}

template <class T>
void rmsnorm_forward_t(T* out, float* rstd, const float* inp, const float* w, int N, int C,
                       float eps, DType dt) {
#pragma omp parallel for schedule(static) if (parallel : static_cast<size_t>(N) * C >= kParallelMin)
  for (int n = 0; n < N; ++n) {
    const size_t off = static_cast<size_t>(n) * C;
    const float* x = inp + off;
    rmsnorm_row(out + off, rstd ? rstd + n : nullptr, x,
                row_sum(C, [x](int i) { return x[i] * x[i]; }), w, C, eps, dt);
  }
}

template <class T>
void residual_rmsnorm_forward_t(float* res, T* out, float* rstd, const float* a, const float* b,
                                const float* w, int N, int C, float eps, DType dt) {
#pragma omp parallel for schedule(static) if (parallel : static_cast<size_t>(N) * C >= kParallelMin)
  for (int n = 0; n < N; ++n) {
    const size_t off = static_cast<size_t>(n) * C;
    float* r = res + off;
    const float ss = residual_row_sumsq(r, a + off, b + off, C);
    rmsnorm_row(out + off, rstd ? rstd + n : nullptr, r, ss, w, C, eps, dt);
  }
}

}  // namespace

// out = (inp - mean) * rstd * w + b  [b may be null]; mean, rstd (N) saved for backward (either
// may be null when no backward follows). The *_lp kernels write out narrowed to dt.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, int N, int C) {
  layernorm_forward_t(out, mean, rstd, inp, w, b, N, C, DType::F32);
}
void layernorm_forward_lp(DType dt, uint16_t* out, float* mean, float* rstd, const float* inp,
                          const float* w, const float* b, int N, int C) {
  layernorm_forward_t(out, mean, rstd, inp, w, b, N, C, dt);
}

// res = a + b (res may alias a or b); out = LayerNorm(res).
void residual_layernorm_forward(float* res, float* out, float* mean, float* rstd, const float* a,
                                const float* b, const float* w, const float* bias, int N, int C) {
  residual_layernorm_forward_t(res, out, mean, rstd, a, b, w, bias, N, C, DType::F32);
}
void residual_layernorm_forward_lp(DType dt, float* res, uint16_t* out, float* mean, float* rstd,
                                   const float* a, const float* b, const float* w,
                                   const float* bias, int N, int C) {
  residual_layernorm_forward_t(res, out, mean, rstd, a, b, w, bias, N, C, dt);
}

// out = inp * rstd * w, rstd = 1 / sqrt(mean(inp^2) + eps); rstd (N) may be null.
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                     float eps) {
  rmsnorm_forward_t(out, rstd, inp, w, N, C, eps, DType::F32);
}
void rmsnorm_forward_lp(DType dt, uint16_t* out, float* rstd, const float* inp, const float* w,
                        int N, int C, float eps) {
  rmsnorm_forward_t(out, rstd, inp, w, N, C, eps, dt);
}

// res = a + b (res may alias a or b); out = RMSNorm(res), as residual_layernorm_forward.
void residual_rmsnorm_forward(float* res, float* out, float* rstd, const float* a, const float* b,
                              const float* w, int N, int C, float eps) {
  residual_rmsnorm_forward_t(res, out, rstd, a, b, w, N, C, eps, DType::F32);
}
void residual_rmsnorm_forward_lp(DType dt, float* res, uint16_t* out, float* rstd, const float* a,
                                 const float* b, const float* w, int N, int C, float eps) {
  residual_rmsnorm_forward_t(res, out, rstd, a, b, w, N, C, eps, dt);
}

size_t norm_partial_floats(int N, int C, bool both) {
  if (N <= 0 || C <= 0) return 0;
  return (both ? 2 : 1) * padded(C) * static_cast<size_t>(row_blocks(N).count);
}

// With xhat = (x - mean) * rstd and g = dout:
//   dinp += rstd * (w g - mean(w g) - xhat * mean(w g xhat));  dw += sum_n g xhat;  db += sum_n g.
// Two passes over each row: (1) the two row means plus this block's dw/db partials, (2) dinp.
// db may be null (bias-free LayerNorm).
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int N, int C,
                        uint16_t* dinp16, DType dt) {
  if (N <= 0 || C <= 0) return;
  const RowBlocks rb = row_blocks(N);
  const size_t Cp = padded(C);
  const size_t stride = 2 * Cp;  // block b: [dw partial (Cp) | db partial (Cp)]
  float* part = partials(stride * rb.count);
#pragma omp parallel if (parallel : static_cast<size_t>(N) * C >= kParallelMin)
  {
#pragma omp for schedule(static)
    for (int blk = 0; blk < rb.count; ++blk) {
      float* pdw = part + blk * stride;
      float* pdb = pdw + Cp;
      std::memset(pdw, 0, stride * sizeof(float));
      const int n1 = std::min(N, (blk + 1) * rb.rows);
      for (int n = blk * rb.rows; n < n1; ++n) {
        const float* x = inp + static_cast<size_t>(n) * C;
        const float* g = dout + static_cast<size_t>(n) * C;
        float* dx = dinp + static_cast<size_t>(n) * C;
        const float m = mean[n], r = rstd[n];
        // sum(w g) and sum(w g xhat) with kLanes partial sums each (see row_sum), and the
        // block's dw/db partials in the same pass.
        float acc_wg[kLanes] = {}, acc_wgx[kLanes] = {};
        for (int i0 = 0; i0 < C; i0 += kLanes) {
          const int len = std::min(kLanes, C - i0);
#pragma omp simd
          for (int j = 0; j < len; ++j) {
            const int i = i0 + j;
            const float xh = (x[i] - m) * r;
            const float wg = w[i] * g[i];
            acc_wg[j] += wg;
            acc_wgx[j] += wg * xh;
            pdw[i] += g[i] * xh;
            pdb[i] += g[i];
          }
        }
        const float mean_wg = lanes_total(acc_wg) / C, mean_wgx = lanes_total(acc_wgx) / C;
#pragma omp simd
        for (int i = 0; i < C; ++i) {
          const float xh = (x[i] - m) * r;
          dx[i] += r * (w[i] * g[i] - mean_wg - xh * mean_wgx);
        }
        if (dinp16) narrow_row(dt, dinp16 + static_cast<size_t>(n) * C, dx, C);
      }
    }
    // (implicit barrier: all partials are written)
    reduce_blocks(dw, part, stride, rb.count, C);
    reduce_blocks(db, part + Cp, stride, rb.count, C);
  }
}

// dinp += rstd * (w g - x * rstd^2 * mean(w g x));  dw += sum_n g x rstd.
void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                      const float* rstd, int N, int C, uint16_t* dinp16, DType dt) {
  if (N <= 0 || C <= 0) return;
  const RowBlocks rb = row_blocks(N);
  const size_t stride = padded(C);
  float* part = partials(stride * rb.count);
#pragma omp parallel if (parallel : static_cast<size_t>(N) * C >= kParallelMin)
  {
#pragma omp for schedule(static)
    for (int blk = 0; blk < rb.count; ++blk) {
      float* pdw = part + blk * stride;
      std::memset(pdw, 0, stride * sizeof(float));
      const int n1 = std::min(N, (blk + 1) * rb.rows);
      for (int n = blk * rb.rows; n < n1; ++n) {
        const float* x = inp + static_cast<size_t>(n) * C;
        const float* g = dout + static_cast<size_t>(n) * C;
        float* dx = dinp + static_cast<size_t>(n) * C;
        const float r = rstd[n];
        float acc[kLanes] = {};
        for (int i0 = 0; i0 < C; i0 += kLanes) {
          const int len = std::min(kLanes, C - i0);
#pragma omp simd
          for (int j = 0; j < len; ++j) {
            const int i = i0 + j;
            acc[j] += w[i] * g[i] * x[i];
            pdw[i] += g[i] * x[i] * r;
          }
        }
        const float k = r * r * lanes_total(acc) / C;
#pragma omp simd
        for (int i = 0; i < C; ++i) dx[i] += r * (w[i] * g[i] - x[i] * k);
        if (dinp16) narrow_row(dt, dinp16 + static_cast<size_t>(n) * C, dx, C);
      }
    }
    reduce_blocks(dw, part, stride, rb.count, C);
  }
}

}  // namespace sw::cpu
