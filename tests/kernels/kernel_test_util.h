// Shared by the kernel tests (test_kernels_b.cpp, test_bf16.cpp): random vectors, bit
// equality, a double-precision GEMM reference with its sum of magnitudes, and REPORT.
#pragma once
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/env.h"
#include "tests/common/gradcheck.h"

// SHARDWISE_TEST_VERBOSE=1 prints the measured errors (used to set the tolerances).
#define REPORT(msg)                                \
  do {                                             \
    INFO(msg);                                     \
    if (sw::env_flag("SHARDWISE_TEST_VERBOSE")) WARN(msg); \
  } while (0)

namespace swtest {

using Vec = std::vector<float>;
using DVec = std::vector<double>;
constexpr double kU = 1.0 / (1 << 24);  // fp32 unit roundoff

inline Vec randv(size_t n, uint64_t seed, float stddev = 1.f) {
  Vec v(n);
  randn(v, seed, stddev);
  return v;
}

inline bool same_bits(const Vec& a, const Vec& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// C = alpha op(A) op(B) + beta C0 in double; sabs = |alpha| sum |ab| + |beta c0| per element.
// Both are M x ldc, zero past column N.
inline void gemm_ref(bool ta, bool tb, int M, int N, int K, float alpha, const Vec& A, int lda,
                     const Vec& B, int ldb, float beta, const Vec& C0, int ldc, DVec& C,
                     DVec& sabs) {
  C.assign((size_t)M * ldc, 0.0);
  sabs.assign((size_t)M * ldc, 0.0);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = 0, sa = 0;
      for (int k = 0; k < K; ++k) {
        const double a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
        const double b = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
        s += a * b;
        sa += std::fabs(a * b);
      }
      const double c0 = C0[(size_t)i * ldc + j];
      C[(size_t)i * ldc + j] = alpha * s + beta * c0;
      sabs[(size_t)i * ldc + j] = std::fabs(alpha) * sa + std::fabs(beta * c0);
    }
}

}  // namespace swtest
