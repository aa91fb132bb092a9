#include "sharding/comm/reduce.h"

#include <algorithm>
#include <cstring>

namespace sw::comm {

namespace {

inline float load(const uint16_t* p, int64_t i, DType dt) {
  return dt == DType::BF16 ? bf16_to_f32(p[i]) : f16_to_f32(p[i]);
}
inline uint16_t store(float v, DType dt) { return dt == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v); }

inline float combine(float a, float b, ReduceOp op) {
  return op == ReduceOp::Max ? std::max(a, b) : a + b;
}

}  // namespace

void reduce2(void* dst, const void* a, const void* b, int64_t n, DType dt, ReduceOp op) {
  if (dt == DType::F32) {
    float* d = static_cast<float*>(dst);
    const float* x = static_cast<const float*>(a);
    const float* y = static_cast<const float*>(b);
    if (op == ReduceOp::Max) {
#pragma omp simd
      for (int64_t i = 0; i < n; i++) d[i] = std::max(x[i], y[i]);
    } else {
#pragma omp simd
      for (int64_t i = 0; i < n; i++) d[i] = x[i] + y[i];
    }
    return;
  }
  uint16_t* d = static_cast<uint16_t*>(dst);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  for (int64_t i = 0; i < n; i++) d[i] = store(combine(load(x, i, dt), load(y, i, dt), op), dt);
}

void reduce_n(void* dst, const void* const* src, int k, int64_t n, DType dt, ReduceOp op) {
  if (k == 1) {
    if (dst != src[0]) std::memmove(dst, src[0], static_cast<size_t>(n) * dtype_size(dt));
    return;
  }
  // Tiles keep an fp32 accumulator in registers/L1; each element is read from every source
  // before dst is written, so dst may alias a source.
  constexpr int64_t T = 256;
  float acc[T];
  for (int64_t i0 = 0; i0 < n; i0 += T) {
    const int64_t m = std::min(T, n - i0);
    if (dt == DType::F32) {
      const float* s0 = static_cast<const float*>(src[0]) + i0;
      for (int64_t i = 0; i < m; i++) acc[i] = s0[i];
      for (int j = 1; j < k; j++) {
        const float* s = static_cast<const float*>(src[j]) + i0;
        if (op == ReduceOp::Max) {
#pragma omp simd
          for (int64_t i = 0; i < m; i++) acc[i] = std::max(acc[i], s[i]);
        } else {
#pragma omp simd
          for (int64_t i = 0; i < m; i++) acc[i] = acc[i] + s[i];
        }
      }
      std::memcpy(static_cast<float*>(dst) + i0, acc, static_cast<size_t>(m) * 4);
    } else {
      // 16-bit payloads: round after every add, exactly as a chain of reduce2 calls would.
      const uint16_t* s0 = static_cast<const uint16_t*>(src[0]) + i0;
      for (int64_t i = 0; i < m; i++) acc[i] = load(s0, i, dt);
      for (int j = 1; j < k; j++) {
        const uint16_t* s = static_cast<const uint16_t*>(src[j]) + i0;
        for (int64_t i = 0; i < m; i++) {
          const uint16_t r = store(combine(acc[i], load(s, i, dt), op), dt);
          acc[i] = load(&r, 0, dt);
        }
      }
      uint16_t* d = static_cast<uint16_t*>(dst) + i0;
      for (int64_t i = 0; i < m; i++) d[i] = store(acc[i], dt);
    }
  }
}

void divide(void* x, int64_t n, DType dt, float d) {
  if (dt == DType::F32) {
    float* p = static_cast<float*>(x);
#pragma omp simd
    for (int64_t i = 0; i < n; i++) p[i] = p[i] / d;
    return;
  }
  uint16_t* p = static_cast<uint16_t*>(x);
  for (int64_t i = 0; i < n; i++) p[i] = store(load(p, i, dt) / d, dt);
}

}  // namespace sw::comm
