// Causal grouped-query attention, flash style, fp32. Correctness first: simple warp-per-row
// kernels with tiles in shared memory; no (T, T) matrix ever reaches global memory.
//
// Layout as kernels/ops.h: qkv (B, T, R), R = (H + 2 KVH) hd, rows [q heads | k heads | v heads];
// query head h reads kv head g = h / (H / KVH); out (B, T, H hd); lse (B, H, T), natural log of
// the sum of exp(scale * q.k) over the visible keys; scale = 1 / sqrt(hd).
//
// Lane j of a warp owns dims j, j + 32, ... (at most kMaxDpl = hd / 32 rounded up); dot products
// are warp_sum butterflies (every lane gets identical bits).
//
// Forward: block = kWarps query rows of one (b, h); key/value tiles of kBk rows are staged in
// shared memory; each warp scores the tile against its row, then folds it into the online
// softmax (running max m, sum l, rescaled accumulator).
// Backward, in three kernels, none with atomics:
//   D[b, h, t] = dout . out (one warp per row);
//   dQ: block = kWarps query rows, K/V tiles in shared memory; per key p = exp(scale s - lse),
//       ds = p (dO.v - D), dq += scale ds k; each warp owns its dq row;
//   dK/dV: block = kWarps key rows of one (b, kv head g); for each query head of the group in
//       order, query tiles (Q, dO, lse, D) are staged in shared memory; dv += p dO,
//       dk += scale p (dO.v - D) q. Each warp owns its dk/dv rows, so GQA needs no scratch and
//       the sum over the group's heads has a fixed order.
//
// Reduced-precision compute (DT = 1 bf16, 2 f16; kernels/ops.h ops_for(device, compute)): the
// same kernels, templated on DT, with the operands of every product rounded exactly where
// kernels/cpu/attention.cpp rounds them, accumulation in fp32 (DT = 0 is the fp32 path: round_d
// is the identity there, and every fp32 formula below is kept as it was, so its bits do not
// change):
//   forward:  Q, K, V rounded (the CPU rounds qkv once per call; here at every load);
//             S = Q K^T in fp32; P = exp(scale S - m) in fp32, its sum l taken unrounded, then
//             P rounded for O += P V. The CPU forms P against the running max m of key tiles of
//             kCpuFwdBK keys (its kFwdBK), so a row's m, and with it the value P is rounded at,
//             depends on that tiling: rounding is not scale-invariant (exp(m - m') is not a
//             power of two). The low-precision forward therefore scores a whole kCpuFwdBK-key
//             tile (staged kBk rows at a time), takes its max, and only then forms and rounds
//             P: the same m as the CPU, up to the fp32 summation order of the scores.
//   backward: Q, K, V and dO rounded (D = rowsum(dO * O) stays fp32 from unrounded dO and
//             O); S = Q K^T, dP = dO V^T in fp32; P = exp(scale S - lse) in fp32;
//             dS = (scale * P) * (dP - D) from the fp32 P, then rounded; P rounded for
//             dV += P^T dO; dQ += dS K, dK += dS^T Q with the rounded dS (scale inside dS, as
//             the CPU has it, not applied afterwards as in the fp32 path).
// What remains different from the CPU: fp32 summation orders, and expf against the CPU's
// polynomial exp (both within ~2 ulp). A value that lands within those few fp32 ulps of a
// bf16 / fp16 rounding boundary can round the other way (one 16-bit ulp), which the tests'
// tolerance for CUDA low precision against CPU low precision accounts for.
#include <cmath>
#include <string>

#include "core/error.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.cuh"

namespace sw::cuda {

namespace {

constexpr int kWarps = 8;   // rows per block
constexpr int kBk = 32;     // rows per staged tile
constexpr int kMaxDpl = kMaxHeadDim / kWarp;
constexpr int kCpuFwdBK = 256;  // kernels/cpu/attention.cpp's kFwdBK: keys per softmax max

struct Geo {
  int B, T, H, KVH, hd;
  size_t R;  // qkv row stride (floats)
  __device__ size_t q(int b, int t, int h) const { return (size_t(b) * T + t) * R + size_t(h) * hd; }
  __device__ size_t k(int b, int t, int g) const { return (size_t(b) * T + t) * R + size_t(H + g) * hd; }
  __device__ size_t v(int b, int t, int g) const {
    return (size_t(b) * T + t) * R + size_t(H + KVH + g) * hd;
  }
  __device__ size_t o(int b, int t, int h) const { return (size_t(b) * T + t) * size_t(H) * hd + size_t(h) * hd; }
  __device__ size_t l(int b, int h, int t) const { return (size_t(b) * H + h) * T + t; }
};

// Loads dims lane, lane + 32, ... of a row into registers (zeros past hd), rounded to DT.
template <int DT = 0>
__device__ __forceinline__ void load_row(float (&r)[kMaxDpl], const float* p, int hd, int lane) {
#pragma unroll
  for (int j = 0; j < kMaxDpl; ++j) {
    const int d = lane + j * kWarp;
    r[j] = d < hd ? round_d<DT>(p[d]) : 0.f;
  }
}

__device__ __forceinline__ float dot_row(const float (&r)[kMaxDpl], const float* p, int hd,
                                         int lane) {
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < kMaxDpl; ++j) {
    const int d = lane + j * kWarp;
    if (d < hd) s += r[j] * p[d];
  }
  return warp_sum(s);
}

// Stages rows [r0, r0 + kBk) of a (b, head) slice into shared memory (zeros past T), rounded
// to DT.
template <int DT = 0>
__device__ __forceinline__ void stage(float* dst, const float* qkv, size_t base_row0, size_t R,
                                      int r0, int T, int hd) {
  for (int idx = threadIdx.x; idx < kBk * hd; idx += blockDim.x) {
    const int r = idx / hd, d = idx % hd;
    const int t = r0 + r;
    dst[idx] = t < T ? round_d<DT>(qkv[base_row0 + size_t(t) * R + d]) : 0.f;
  }
}

// A query row's result, by its warp: out = acc / l, and lse = m + log l (lane 0).
__device__ __forceinline__ void store_row(float* out, float* lse, const Geo& g, int b, int t,
                                          int h, int lane, const float (&acc)[kMaxDpl], float m,
                                          float l) {
  const float inv = 1.f / l;
  float* o = out + g.o(b, t, h);
#pragma unroll
  for (int j = 0; j < kMaxDpl; ++j) {
    const int d = lane + j * kWarp;
    if (d < g.hd) o[d] = acc[j] * inv;
  }
  if (lane == 0) lse[g.l(b, h, t)] = m + logf(l);
}

__global__ void attn_fwd_k(float* out, float* lse, const float* qkv, Geo g, float scale) {
  extern __shared__ float sm[];
  float* Ks = sm;                       // (kBk, hd)
  float* Vs = Ks + kBk * g.hd;          // (kBk, hd)
  float* Ps = Vs + kBk * g.hd;          // (kWarps, kBk) scaled scores
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int t0 = blockIdx.x * kWarps, h = blockIdx.y, b = blockIdx.z;
  const int kv = h / (g.H / g.KVH);
  const int t = t0 + warp;
  const bool active = t < g.T;
  float q[kMaxDpl], acc[kMaxDpl];
  if (active) load_row(q, qkv + g.q(b, t, h), g.hd, lane);
#pragma unroll
  for (int j = 0; j < kMaxDpl; ++j) acc[j] = 0.f;
  float m = -INFINITY, l = 0.f;
  const int last = min(g.T - 1, t0 + kWarps - 1);
  const size_t kbase = g.k(b, 0, kv), vbase = g.v(b, 0, kv);
  for (int k0 = 0; k0 <= last; k0 += kBk) {
    __syncthreads();
    stage(Ks, qkv, kbase, g.R, k0, g.T, g.hd);
    stage(Vs, qkv, vbase, g.R, k0, g.T, g.hd);
    __syncthreads();
    const int nk = active ? min(kBk, t - k0 + 1) : 0;
    if (nk <= 0) continue;
    float* P = Ps + warp * kBk;
    float tmax = -INFINITY;
    for (int r = 0; r < nk; ++r) {
      const float sc = dot_row(q, Ks + r * g.hd, g.hd, lane) * scale;
      if (lane == 0) P[r] = sc;
      tmax = fmaxf(tmax, sc);
    }
    __syncwarp();
    const float mnew = fmaxf(m, tmax);
    const float corr = expf(m - mnew);  // 0 on the first tile (m = -inf)
    l *= corr;
#pragma unroll
    for (int j = 0; j < kMaxDpl; ++j) acc[j] *= corr;
    for (int r = 0; r < nk; ++r) {
      const float p = expf(P[r] - mnew);
      l += p;
      const float* vr = Vs + r * g.hd;
#pragma unroll
      for (int j = 0; j < kMaxDpl; ++j) {
        const int d = lane + j * kWarp;
        if (d < g.hd) acc[j] += p * vr[d];
      }
    }
    m = mnew;
    __syncwarp();
  }
  if (!active) return;
  store_row(out, lse, g, b, t, h, lane, acc, m, l);
}

// The low-precision forward (DT = 1, 2). As attn_fwd_k, but per key tile of kCpuFwdBK keys
// (the CPU's softmax tile): pass 1 stages K kBk rows at a time and keeps each warp's unscaled
// scores of the whole tile in shared memory; the row's new max m' = max(m, scale * max s) is
// then the CPU's; pass 2 turns the scores into P = exp(scale s - m') (summed unrounded into l)
// and rounds them; pass 3 stages V and accumulates the rounded P times the rounded V.
template <int DT>
__global__ void attn_fwd_lowp_k(float* out, float* lse, const float* qkv, Geo g, float scale) {
  extern __shared__ float sm[];
  float* KVs = sm;                  // (kBk, hd): a K tile in pass 1, a V tile in pass 3
  float* Ss = KVs + kBk * g.hd;     // (kWarps, kCpuFwdBK): scores, then rounded P
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int t0 = blockIdx.x * kWarps, h = blockIdx.y, b = blockIdx.z;
  const int kv = h / (g.H / g.KVH);
  const int t = t0 + warp;
  const bool active = t < g.T;
  float q[kMaxDpl], acc[kMaxDpl];
  if (active) load_row<DT>(q, qkv + g.q(b, t, h), g.hd, lane);
#pragma unroll
  for (int j = 0; j < kMaxDpl; ++j) acc[j] = 0.f;
  float m = -INFINITY, l = 0.f;
  float* S = Ss + warp * kCpuFwdBK;
  const int last = min(g.T - 1, t0 + kWarps - 1);
  const size_t kbase = g.k(b, 0, kv), vbase = g.v(b, 0, kv);
  for (int j0 = 0; j0 <= last; j0 += kCpuFwdBK) {
    const int j1 = min(last + 1, j0 + kCpuFwdBK);              // block-uniform tile end
    const int nvis = active ? max(0, min(j1, t + 1) - j0) : 0;  // this row's keys in the tile
    float smax = -INFINITY;
    for (int k0 = j0; k0 < j1; k0 += kBk) {
      __syncthreads();
      stage<DT>(KVs, qkv, kbase, g.R, k0, g.T, g.hd);
      __syncthreads();
      const int nk = min(kBk, j0 + nvis - k0);
      for (int r = 0; r < nk; ++r) {
        const float sc = dot_row(q, KVs + r * g.hd, g.hd, lane);  // unscaled, as the CPU's S
        if (lane == 0) S[k0 - j0 + r] = sc;
        smax = fmaxf(smax, sc);
      }
    }
    __syncwarp();
    if (nvis > 0) {  // warp-uniform
      const float mnew = fmaxf(m, smax * scale);
      float sum = 0.f;
      for (int c = lane; c < nvis; c += kWarp) {
        const float p = expf(S[c] * scale - mnew);
        sum += p;
        S[c] = round_d<DT>(p);  // P's operand copy for P V
      }
      sum = warp_sum(sum);
      const float corr = expf(m - mnew);  // 0 on the first tile (m = -inf, acc = l = 0)
      l = l * corr + sum;
#pragma unroll
      for (int j = 0; j < kMaxDpl; ++j) acc[j] *= corr;
      m = mnew;
    }
    __syncwarp();
    for (int k0 = j0; k0 < j1; k0 += kBk) {
      __syncthreads();
      stage<DT>(KVs, qkv, vbase, g.R, k0, g.T, g.hd);
      __syncthreads();
      const int nk = min(kBk, j0 + nvis - k0);
      for (int r = 0; r < nk; ++r) {
        const float p = S[k0 - j0 + r];
        const float* vr = KVs + r * g.hd;
#pragma unroll
        for (int j = 0; j < kMaxDpl; ++j) {
          const int d = lane + j * kWarp;
          if (d < g.hd) acc[j] += p * vr[d];
        }
      }
    }
  }
  if (!active) return;
  store_row(out, lse, g, b, t, h, lane, acc, m, l);
}

// D[b, h, t] = dout . out; one warp per (b, t, h) row.
__global__ void attn_bwd_d_k(float* D, const float* dout, const float* out, Geo g) {
  const size_t row = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= size_t(g.B) * g.T * g.H) return;
  const int h = int(row % g.H);
  const size_t bt = row / g.H;
  const int t = int(bt % g.T), b = int(bt / g.T);
  const float* a = dout + g.o(b, t, h);
  const float* c = out + g.o(b, t, h);
  float s = 0.f;
  for (int d = lane; d < g.hd; d += kWarp) s += a[d] * c[d];
  s = warp_sum(s);
  if (lane == 0) D[g.l(b, h, t)] = s;
}

template <int DT>
__global__ void attn_bwd_dq_k(float* dqkv, const float* dout, const float* qkv, const float* lse,
                              const float* D, Geo g, float scale) {
  extern __shared__ float sm[];
  float* Ks = sm;
  float* Vs = Ks + kBk * g.hd;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int t0 = blockIdx.x * kWarps, h = blockIdx.y, b = blockIdx.z;
  const int kv = h / (g.H / g.KVH);
  const int t = t0 + warp;
  const bool active = t < g.T;
  float q[kMaxDpl], dO[kMaxDpl], dq[kMaxDpl];
  float L = 0.f, Dt = 0.f;
  if (active) {
    load_row<DT>(q, qkv + g.q(b, t, h), g.hd, lane);
    load_row<DT>(dO, dout + g.o(b, t, h), g.hd, lane);
    L = lse[g.l(b, h, t)];
    Dt = D[g.l(b, h, t)];
  }
#pragma unroll
  for (int j = 0; j < kMaxDpl; ++j) dq[j] = 0.f;
  const int last = min(g.T - 1, t0 + kWarps - 1);
  const size_t kbase = g.k(b, 0, kv), vbase = g.v(b, 0, kv);
  for (int k0 = 0; k0 <= last; k0 += kBk) {
    __syncthreads();
    stage<DT>(Ks, qkv, kbase, g.R, k0, g.T, g.hd);
    stage<DT>(Vs, qkv, vbase, g.R, k0, g.T, g.hd);
    __syncthreads();
    const int nk = active ? min(kBk, t - k0 + 1) : 0;
    for (int r = 0; r < nk; ++r) {
      const float* kr = Ks + r * g.hd;
      const float p = expf(dot_row(q, kr, g.hd, lane) * scale - L);
      if constexpr (DT == 0) {
        const float ds = p * (dot_row(dO, Vs + r * g.hd, g.hd, lane) - Dt);
#pragma unroll
        for (int j = 0; j < kMaxDpl; ++j) {
          const int d = lane + j * kWarp;
          if (d < g.hd) dq[j] += scale * ds * kr[d];
        }
      } else {  // dS = (scale P) (dP - D) from the fp32 P, rounded: the CPU's operand of dS K
        const float ds = round_d<DT>(scale * p * (dot_row(dO, Vs + r * g.hd, g.hd, lane) - Dt));
#pragma unroll
        for (int j = 0; j < kMaxDpl; ++j) {
          const int d = lane + j * kWarp;
          if (d < g.hd) dq[j] += ds * kr[d];
        }
      }
    }
  }
  if (!active) return;
  float* o = dqkv + g.q(b, t, h);
#pragma unroll
  for (int j = 0; j < kMaxDpl; ++j) {
    const int d = lane + j * kWarp;
    if (d < g.hd) o[d] += dq[j];
  }
}

template <int DT>
__global__ void attn_bwd_dkv_k(float* dqkv, const float* dout, const float* qkv, const float* lse,
                               const float* D, Geo g, float scale) {
  extern __shared__ float sm[];
  float* Qs = sm;                   // (kBk, hd)
  float* Os = Qs + kBk * g.hd;      // (kBk, hd) dO rows
  float* Ls = Os + kBk * g.hd;      // (kBk) lse
  float* Dsm = Ls + kBk;            // (kBk) D
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int j0 = blockIdx.x * kWarps, kv = blockIdx.y, b = blockIdx.z;
  const int rep = g.H / g.KVH;
  const int j = j0 + warp;  // this warp's key row
  const bool active = j < g.T;
  float k[kMaxDpl], v[kMaxDpl], dk[kMaxDpl], dv[kMaxDpl];
  if (active) {
    load_row<DT>(k, qkv + g.k(b, j, kv), g.hd, lane);
    load_row<DT>(v, qkv + g.v(b, j, kv), g.hd, lane);
  }
#pragma unroll
  for (int i = 0; i < kMaxDpl; ++i) dk[i] = dv[i] = 0.f;
  const size_t orow = size_t(g.H) * g.hd;  // dout row stride
  for (int hi = 0; hi < rep; ++hi) {
    const int h = kv * rep + hi;
    const size_t qbase = g.q(b, 0, h), obase = g.o(b, 0, h);
    for (int q0 = j0; q0 < g.T; q0 += kBk) {
      __syncthreads();
      stage<DT>(Qs, qkv, qbase, g.R, q0, g.T, g.hd);
      stage<DT>(Os, dout, obase, orow, q0, g.T, g.hd);
      for (int r = threadIdx.x; r < kBk; r += blockDim.x) {
        const int t = q0 + r;
        Ls[r] = t < g.T ? lse[g.l(b, h, t)] : 0.f;
        Dsm[r] = t < g.T ? D[g.l(b, h, t)] : 0.f;
      }
      __syncthreads();
      if (!active) continue;
      const int r0 = max(0, j - q0);  // queries t >= j see key j
      const int r1 = min(kBk, g.T - q0);
      for (int r = r0; r < r1; ++r) {
        const float* qr = Qs + r * g.hd;
        const float* orr = Os + r * g.hd;
        const float p = expf(dot_row(k, qr, g.hd, lane) * scale - Ls[r]);
        if constexpr (DT == 0) {
          const float ds = p * (dot_row(v, orr, g.hd, lane) - Dsm[r]);
#pragma unroll
          for (int i = 0; i < kMaxDpl; ++i) {
            const int d = lane + i * kWarp;
            if (d < g.hd) {
              dv[i] += p * orr[d];
              dk[i] += scale * ds * qr[d];
            }
          }
        } else {  // rounded P for P^T dO; rounded dS = (scale P) (dP - D) for dS^T Q
          const float ds = round_d<DT>(scale * p * (dot_row(v, orr, g.hd, lane) - Dsm[r]));
          const float pr = round_d<DT>(p);
#pragma unroll
          for (int i = 0; i < kMaxDpl; ++i) {
            const int d = lane + i * kWarp;
            if (d < g.hd) {
              dv[i] += pr * orr[d];
              dk[i] += ds * qr[d];
            }
          }
        }
      }
    }
  }
  if (!active) return;
  float* pk = dqkv + g.k(b, j, kv);
  float* pv = dqkv + g.v(b, j, kv);
#pragma unroll
  for (int i = 0; i < kMaxDpl; ++i) {
    const int d = lane + i * kWarp;
    if (d < g.hd) {
      pk[d] += dk[i];
      pv[d] += dv[i];
    }
  }
}

Geo make_geo(int B, int T, int H, int KVH, int hd) {
  SW_CHECK(KVH > 0 && H % KVH == 0, "attention: KVH must divide H");
  if (hd <= 0 || hd > kMaxHeadDim)
    fail("kernels", "CUDA attention supports head dims 1.." + std::to_string(kMaxHeadDim) +
                        ", got " + std::to_string(hd));
  return {B, T, H, KVH, hd, static_cast<size_t>(H + 2 * KVH) * hd};
}

// Dynamic shared memory above 48 KiB must be opted into per kernel.
template <class K>
void allow_smem(K kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    SW_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bytes)));
}

template <int DT>
void attention_forward_t(cudaStream_t s, float* out, float* lse, const float* qkv, const Geo& g) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(g.hd));
  const dim3 grid((g.T + kWarps - 1) / kWarps, g.H, g.B);
  if constexpr (DT == 0) {
    const size_t smem = (2 * size_t(kBk) * g.hd + kWarps * kBk) * sizeof(float);
    allow_smem(attn_fwd_k, smem);
    attn_fwd_k<<<grid, kWarps * kWarp, smem, s>>>(out, lse, qkv, g, scale);
  } else {
    const size_t smem = (size_t(kBk) * g.hd + size_t(kWarps) * kCpuFwdBK) * sizeof(float);
    allow_smem(attn_fwd_lowp_k<DT>, smem);
    attn_fwd_lowp_k<DT><<<grid, kWarps * kWarp, smem, s>>>(out, lse, qkv, g, scale);
  }
  SW_CUDA_LAUNCHED();
}

void launch_rowdot(cudaStream_t s, float* D, const float* dout, const float* out, const Geo& g) {
  const size_t rows = size_t(g.B) * g.T * g.H;
  attn_bwd_d_k<<<grid_for(rows * kWarp, 256, 0x7fffffffu), 256, 0, s>>>(D, dout, out, g);
  SW_CUDA_LAUNCHED();
}

template <int DT>
void attention_backward_t(cudaStream_t s, float* dqkv, const float* dout, const float* qkv,
                          const float* out, const float* lse, const Geo& g, float* ws) {
  const int B = g.B, T = g.T, H = g.H, KVH = g.KVH, hd = g.hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  float* D = ws;
  launch_rowdot(s, D, dout, out, g);
  const size_t smem_q = 2 * size_t(kBk) * hd * sizeof(float);
  allow_smem(attn_bwd_dq_k<DT>, smem_q);
  attn_bwd_dq_k<DT><<<dim3((T + kWarps - 1) / kWarps, H, B), kWarps * kWarp, smem_q, s>>>(
      dqkv, dout, qkv, lse, D, g, scale);
  SW_CUDA_LAUNCHED();
  const size_t smem_kv = (2 * size_t(kBk) * hd + 2 * kBk) * sizeof(float);
  allow_smem(attn_bwd_dkv_k<DT>, smem_kv);
  attn_bwd_dkv_k<DT><<<dim3((T + kWarps - 1) / kWarps, KVH, B), kWarps * kWarp, smem_kv, s>>>(
      dqkv, dout, qkv, lse, D, g, scale);
  SW_CUDA_LAUNCHED();
}

void check_dt(int dt) {
  SW_CHECK(dt == 0 || dt == 1 || dt == 2, "attention: compute dtype must be f32, bf16 or f16");
}

}  // namespace

void attention_rowdot(cudaStream_t s, float* D, const float* dout, const float* out, int B, int T,
                      int H, int hd) {
  if (B == 0 || T == 0 || H == 0) return;
  // (any hd: the D kernel strides over it; the kv heads and row stride play no part)
  launch_rowdot(s, D, dout, out, Geo{B, T, H, H, hd, static_cast<size_t>(3 * H) * hd});
}

void attention_forward(cudaStream_t s, float* out, float* lse, const float* qkv, int B, int T,
                       int H, int KVH, int hd, int dt) {
  const Geo g = make_geo(B, T, H, KVH, hd);
  check_dt(dt);
  if (B == 0 || T == 0 || H == 0) return;
  if (dt == 1)
    attention_forward_t<1>(s, out, lse, qkv, g);
  else if (dt == 2)
    attention_forward_t<2>(s, out, lse, qkv, g);
  else
    attention_forward_t<0>(s, out, lse, qkv, g);
}

void attention_backward(cudaStream_t s, float* dqkv, const float* dout, const float* qkv,
                        const float* out, const float* lse, int B, int T, int H, int KVH, int hd,
                        float* ws, int dt) {
  const Geo g = make_geo(B, T, H, KVH, hd);
  check_dt(dt);
  if (B == 0 || T == 0 || H == 0) return;
  if (dt == 1)
    attention_backward_t<1>(s, dqkv, dout, qkv, out, lse, g, ws);
  else if (dt == 2)
    attention_backward_t<2>(s, dqkv, dout, qkv, out, lse, g, ws);
  else
    attention_backward_t<0>(s, dqkv, dout, qkv, out, lse, g, ws);
}

}  // namespace sw::cuda
