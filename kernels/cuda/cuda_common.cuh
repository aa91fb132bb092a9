// Shared by the CUDA kernels of kernels/ops.h: error checks, launch sizes, and the fixed-order
// warp / block reductions every deterministic kernel here is built on. Included by .cu files
// only (it needs the CUDA headers).
//
// Determinism: a reduction's order depends only on the launch shape, which depends only on the
// problem size, never on timing. No kernel here uses floating-point atomics.
#pragma once
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace sw::cuda {

// Throw sw::Error("cuda: <what> failed at file:line: <reason>") (kernels/cuda/cuda_ops.cu).
void check(cudaError_t e, const char* what, const char* file, int line);
void check(cublasStatus_t s, const char* what, const char* file, int line);

#define SW_CUDA_CHECK(x) ::sw::cuda::check((x), #x, __FILE__, __LINE__)
// After a <<<...>>> launch: reports a bad launch configuration at once (asynchronous kernel
// faults surface at the next synchronising call).
#define SW_CUDA_LAUNCHED() ::sw::cuda::check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

constexpr int kWarp = 32;

// ---- Precision conversions: the host's bit formulas (core/dtype.h f32_to_bf16: round to
// nearest even, NaN made quiet; fp16 through the IEEE round-to-nearest-even intrinsic, as
// core/dtype.cpp rounds: overflow gives +-inf, subnormals kept), so device and host agree bit
// for bit. dt / DT: 1 = bf16, 2 = f16 (core/dtype.h's DType values); 0 = fp32 (no rounding).
__device__ __forceinline__ uint16_t f32_to_bf16_d(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
__device__ __forceinline__ float bf16_to_f32_d(uint16_t h) {
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
}
__device__ __forceinline__ uint16_t to_half_d(int dt, float f) {
  return dt == 1 ? f32_to_bf16_d(f) : __half_as_ushort(__float2half_rn(f));
}
__device__ __forceinline__ float from_half_d(int dt, uint16_t h) {
  return dt == 1 ? bf16_to_f32_d(h) : __half2float(__ushort_as_half(h));
}
// x rounded to the compute precision DT and widened back (the CPU's round_to, one value);
// DT = 0 returns x untouched, so an fp32 instantiation computes exactly what it did without it.
template <int DT>
__device__ __forceinline__ float round_d(float x) {
  if constexpr (DT == 1) return bf16_to_f32_d(f32_to_bf16_d(x));
  else if constexpr (DT == 2) return __half2float(__float2half_rn(x));
  else return x;
}

// Blocks of `threads` covering n items, capped for grid-stride loops.
inline unsigned grid_for(size_t n, int threads, size_t cap = 65535u * 8) {
  size_t g = (n + threads - 1) / threads;
  if (g < 1) g = 1;
  return static_cast<unsigned>(g < cap ? g : cap);
}

// Butterfly sums: lanes i and i^o add the same two values (a + b == b + a exactly), so after
// every stage the pair holds identical bits and every lane ends with the same total.
template <class T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024): warp sums, then warp 0 sums
// the per-warp totals in a fixed tree. `scratch` holds 32 T in shared memory. Every thread gets
// the total. Must be reached by all threads of the block.
template <class T>
__device__ T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int nwarps = blockDim.x / kWarp;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T t = lane < nwarps ? scratch[lane] : T(0);
  if (warp == 0) {
    t = warp_sum(t);
    if (lane == 0) scratch[0] = t;
  }
  __syncthreads();
  return scratch[0];
}

__device__ inline float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int nwarps = blockDim.x / kWarp;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < nwarps ? scratch[lane] : -INFINITY;
  if (warp == 0) {
    t = warp_max(t);
    if (lane == 0) scratch[0] = t;
  }
  __syncthreads();
  return scratch[0];
}

}  // namespace sw::cuda
