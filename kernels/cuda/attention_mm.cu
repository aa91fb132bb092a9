// The row kernels of the tensor-core attention path (bf16 / fp16 compute): the orchestration,
// layouts and rounding points are kernels/cuda/attention_mm.h's, which the host twin in
// tests/cuda/test_attention_mm.cpp follows formula for formula; the products are cuBLAS calls
// (CudaOps' backend in cuda_ops.cu). Only fp32 summation orders (inside cuBLAS, the block
// reductions) and expf against the CPU's polynomial exp differ from the CPU's attention.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/attention_mm.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.cuh"

namespace sw::cuda {

namespace {

using attn_mm::kTile;

// dst[(b*nh + h)*T + t][d] = round(src[(b*T + t)*ld + col0 + h*hd + d])
__global__ void pack_k(int dt, const float* src, int T, int ld, int col0, int nh, int hd,
                       uint16_t* dst, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const int d = static_cast<int>(i % hd);
    const size_t r = i / hd;  // (b*nh + h)*T + t
    const int t = static_cast<int>(r % T);
    const size_t bh = r / T;
    const int h = static_cast<int>(bh % nh);
    const size_t b = bh / nh;
    dst[i] = to_half_d(dt, src[(b * T + t) * ld + col0 + size_t(h) * hd + d]);
  }
}

// One block per (head z, row i of the chunk): the forward's softmax over 256-key tiles.
__global__ void softmax_fwd_k(int dt, const float* S, uint16_t* P, float* alpha, float* ml,
                              int nq, int ldS, int kend, int q0, int tiles, float scale) {
  __shared__ float scratch[32];
  const size_t row = blockIdx.x;  // z*nq + i
  const int i = static_cast<int>(row % nq);
  const int vis = min(q0 + i + 1, kend);  // keys 0..vis-1 are visible
  const float* s = S + row * ldS;
  uint16_t* p = P + row * ldS;
  float* a = alpha + row * tiles;
  float m = -INFINITY, l = 0.f;
  for (int t = 0; t < tiles; ++t) {
    const int j0 = t * kTile, j1 = min(kend, j0 + kTile), nv = max(0, min(vis, j1) - j0);
    float alpha_t = 1.f;
    if (nv > 0) {
      float mx = -INFINITY;
      for (int j = threadIdx.x; j < nv; j += blockDim.x) mx = fmaxf(mx, s[j0 + j]);
      mx = block_max(mx, scratch);
      const float mnew = fmaxf(m, mx * scale);
      float sum = 0.f;
      for (int j = threadIdx.x; j < j1 - j0; j += blockDim.x) {
        float v = 0.f;
        if (j < nv) {
          v = expf(s[j0 + j] * scale - mnew);
          sum += v;
        }
        p[j0 + j] = to_half_d(dt, v);
      }
      sum = block_sum(sum, scratch);
      if (t > 0 && mnew > m) {
        alpha_t = expf(m - mnew);
        l *= alpha_t;
      }
      l += sum;
      m = mnew;
    } else {
      for (int j = threadIdx.x; j < j1 - j0; j += blockDim.x) p[j0 + j] = 0;
    }
    if (threadIdx.x == 0) a[t] = alpha_t;
  }
  for (int j = kend + threadIdx.x; j < ldS; j += blockDim.x) p[j] = 0;  // the padding
  if (threadIdx.x == 0) ml[2 * row] = m, ml[2 * row + 1] = l;
}

// One block per (head z, row i): out = (the tiles' products through the rescale recurrence)
// / l, and lse = m + log(l).
__global__ void combine_k(const float* Ot, const float* alpha, const float* ml, float* out,
                          float* lse, int nq, int hd, int tiles, int T, int H, int q0,
                          size_t zrows) {
  const size_t row = blockIdx.x;  // z*nq + i
  const int i = static_cast<int>(row % nq);
  const size_t z = row / nq;  // b*H + h
  const int h = static_cast<int>(z % H);
  const size_t b = z / H;
  const float* a = alpha + row * tiles;
  const float m = ml[2 * row], l = ml[2 * row + 1];
  const float inv = 1.0f / l;
  float* o = out + (b * T + q0 + i) * size_t(H) * hd + size_t(h) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float acc = Ot[row * hd + d];
    for (int t = 1; t < tiles; ++t) acc = acc * a[t] + Ot[(t * zrows + row) * hd + d];
    o[d] = acc * inv;
  }
  if (threadIdx.x == 0) lse[z * T + q0 + i] = m + logf(l);
}

// One block per (head z, row i): P = exp(scale s - lse) on the visible keys, dS = scale P
// (dP - D) from the fp32 P; both rounded (zeros elsewhere).
__global__ void softmax_bwd_k(int dt, const float* S, const float* dP, uint16_t* P, uint16_t* dS,
                              const float* lse, const float* D, int nq, int ldS, int kend, int q0,
                              int T, float scale) {
  const size_t row = blockIdx.x;
  const int i = static_cast<int>(row % nq);
  const size_t z = row / nq;
  const int vis = min(q0 + i + 1, kend);
  const float li = lse[z * T + q0 + i], di = D[z * T + q0 + i];
  const size_t off = row * ldS;
  for (int j = threadIdx.x; j < ldS; j += blockDim.x) {
    float p = 0.f, ds = 0.f;
    if (j < vis) {
      p = expf(S[off + j] * scale - li);
      ds = scale * p * (dP[off + j] - di);
    }
    P[off + j] = to_half_d(dt, p);
    dS[off + j] = to_half_d(dt, ds);
  }
}

// dqkv(b, t, :) += [dQn heads | dKn heads | dVn heads] (the op accumulates, as the CPU's).
__global__ void unpack_grads_k(const float* dQn, const float* dKn, const float* dVn, float* dqkv,
                               int T, int H, int KVH, int hd, size_t n) {
  const int R = (H + 2 * KVH) * hd;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(i % R);
    const size_t bt = i / R;
    const int t = static_cast<int>(bt % T);
    const size_t b = bt / T;
    const int head = c / hd, d = c % hd;
    float v;
    if (head < H)
      v = dQn[((b * H + head) * T + t) * hd + d];
    else if (head < H + KVH)
      v = dKn[((b * KVH + (head - H)) * T + t) * hd + d];
    else
      v = dVn[((b * KVH + (head - H - KVH)) * T + t) * hd + d];
    dqkv[i] += v;
  }
}

}  // namespace

void attn_pack(cudaStream_t s, int dt, const float* src, int B, int T, int ld, int col0, int nh,
               int hd, uint16_t* dst) {
  const size_t n = size_t(B) * nh * T * hd;
  if (n == 0) return;
  pack_k<<<grid_for(n, 256), 256, 0, s>>>(dt, src, T, ld, col0, nh, hd, dst, n);
  SW_CUDA_LAUNCHED();
}

void attn_softmax_fwd(cudaStream_t s, int dt, const float* S, uint16_t* P, float* alpha,
                      float* ml, size_t rows, int nq, int ldS, int kend, int q0, int tiles,
                      float scale) {
  if (rows == 0) return;
  softmax_fwd_k<<<static_cast<unsigned>(rows), 256, 0, s>>>(dt, S, P, alpha, ml, nq, ldS, kend,
                                                            q0, tiles, scale);
  SW_CUDA_LAUNCHED();
}

void attn_combine(cudaStream_t s, const float* Ot, const float* alpha, const float* ml,
                  float* out, float* lse, size_t rows, int nq, int hd, int tiles, int T, int H,
                  int q0) {
  if (rows == 0) return;
  combine_k<<<static_cast<unsigned>(rows), 128, 0, s>>>(Ot, alpha, ml, out, lse, nq, hd, tiles,
                                                        T, H, q0, rows);
  SW_CUDA_LAUNCHED();
}

void attn_softmax_bwd(cudaStream_t s, int dt, const float* S, const float* dP, uint16_t* P,
                      uint16_t* dS, const float* lse, const float* D, size_t rows, int nq,
                      int ldS, int kend, int q0, int T, float scale) {
  if (rows == 0) return;
  softmax_bwd_k<<<static_cast<unsigned>(rows), 256, 0, s>>>(dt, S, dP, P, dS, lse, D, nq, ldS,
                                                            kend, q0, T, scale);
  SW_CUDA_LAUNCHED();
}

void attn_unpack_grads(cudaStream_t s, const float* dQn, const float* dKn, const float* dVn,
                       float* dqkv, int B, int T, int H, int KVH, int hd) {
  const size_t n = size_t(B) * T * (H + 2 * KVH) * hd;
  if (n == 0) return;
  unpack_grads_k<<<grid_for(n, 256), 256, 0, s>>>(dQn, dKn, dVn, dqkv, T, H, KVH, hd, n);
  SW_CUDA_LAUNCHED();
}

}  // namespace sw::cuda
