// The CPU twin of the fp8 primitives (kernels/fp8_ops.h Fp8Kernels): exact fp8 values, an
// emulated fp8 GEMM. A quantised value is stored as the bf16 that holds it (every E4M3 / E5M2
// value is a bf16 value), so the product runs on oneDNN's bf16 matmul reading the operands in
// place (detail::gemm_bf16_onednn; AVX-512 CPUs) or, elsewhere, OpenBLAS's sgemm on their
// widened values: a product of two fp8 values has at most 8 significant bits, exact in fp32,
// so either is an fp8 GEMM with fp32 accumulation up to the summation order. Scratch is
// per thread (grow-only, tracked as Mem::Workspace).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/fp8_ops.h"

namespace sw::cpu {

namespace {

// Parallel over rows only for large tensors and outside another parallel region.
bool par(size_t n) { return n >= (size_t{1} << 16) && !omp_in_parallel(); }

inline float load(Operand x, size_t i) { return x.f32 ? x.f32[i] : bf16_to_f32(x.lp[i]); }

class CpuFp8 final : public Fp8Kernels {
 public:
  size_t elem_bytes() const override { return 2; }

  void amax(float* out, Operand x, size_t n) const override {
    SW_CHECK(x.f32 || x.lp, "fp8 amax: no operand");
    float m = 0.f;
#pragma omp parallel for schedule(static) reduction(max : m) if (par(n))
    for (size_t i = 0; i < n; ++i) {
      const float a = std::fabs(load(x, i));
      if (a > m) m = a;  // (NaN compares false: skipped)
    }
    *out = m;
  }

  void scales(float* s, const float* amaxes, int count, Fp8Format f) const override {
    float m = 0.f;
    for (int i = 0; i < count; ++i) m = std::max(m, amaxes[i]);
    s[0] = fp8_scale(m, f);
    s[1] = 1.f / s[0];
  }

  void quantize(void* q, Fp8Format f, const float* s, Operand x, int rows, int cols,
                bool transpose) const override {
    SW_CHECK(x.f32 || x.lp, "fp8 quantize: no operand");
    uint16_t* o = static_cast<uint16_t*>(q);
    const float sc = s[0];
    const size_t n = size_t(rows) * cols;
    if (!transpose) {
#pragma omp parallel for schedule(static) if (par(n))
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) {
          const size_t i = size_t(r) * cols + c;
          o[i] = f32_to_bf16(round_fp8(load(x, i) * sc, f));
        }
      return;
    }
    // (cols, rows): 32 x 32 tiles.
    constexpr int kT = 32;
    const int tr = (rows + kT - 1) / kT, tc = (cols + kT - 1) / kT;
#pragma omp parallel for schedule(static) if (par(n))
    for (int t = 0; t < tr * tc; ++t) {
      const int r0 = (t / tc) * kT, c0 = (t % tc) * kT;
      const int r1 = std::min(rows, r0 + kT), c1 = std::min(cols, c0 + kT);
      for (int c = c0; c < c1; ++c)
        for (int r = r0; r < r1; ++r)
          o[size_t(c) * rows + r] = f32_to_bf16(round_fp8(load(x, size_t(r) * cols + c) * sc, f));
    }
  }

  void gemm(int M, int N, int K, const void* A, Fp8Format fa, const float* sa, const void* B,
            Fp8Format fb, const float* sb, const float* bias, const float* Cin, float beta,
            Out D) const override {
    (void)fa, (void)fb;
    SW_CHECK(D.f32 || D.lp, "fp8 gemm: no output");
    const float alpha = sa[1] * sb[1];
    const uint16_t* a16 = static_cast<const uint16_t*>(A);
    const uint16_t* b16 = static_cast<const uint16_t*>(B);
    // The product straight into D where nothing else is added but D itself.
    const bool direct = D.f32 && !bias && (!Cin || Cin == D.f32);
    const float beta0 = direct && Cin ? beta : 0.f;
    thread_local Buffer tmp_buf;
    float* acc = direct ? D.f32 : detail::grow_workspace(tmp_buf, size_t(M) * N);
    product(M, N, K, alpha, a16, b16, beta0, acc);
    if (direct) return;
    const size_t n = size_t(M) * N;
#pragma omp parallel for schedule(static) if (par(n))
    for (int r = 0; r < M; ++r)
      for (int c = 0; c < N; ++c) {
        const size_t i = size_t(r) * N + c;
        float v = acc[i];
        if (bias) v += bias[c];
        if (Cin) v += beta * Cin[i];
        if (D.f32)
          D.f32[i] = v;
        else
          D.lp[i] = f32_to_bf16(v);
      }
  }

  void* scratch(int slot, size_t bytes) const override {
    SW_CHECK(slot >= 0 && slot < kSlots, "fp8 scratch: no such slot");
    thread_local Buffer bufs[kSlots];
    return detail::grow_workspace(bufs[slot], (bytes + 3) / 4);
  }

  std::shared_ptr<float> alloc_floats(size_t n) const override {
    float* p = new float[n]();
    return std::shared_ptr<float>(p, [](float* q) { delete[] q; });
  }

 private:
  // C(M, N) = alpha * A(M, K) B(N, K)^T + beta * C from the bf16-held fp8 values.
  static void product(int M, int N, int K, float alpha, const uint16_t* a16, const uint16_t* b16,
                      float beta, float* C) {
    if (cpu_has_avx512()) {
      detail::gemm_bf16_onednn(false, true, M, N, K, alpha, nullptr, a16, K, nullptr, b16, K, beta,
                               C, N);
      return;
    }
    thread_local Buffer wa, wb;
    float* af = detail::grow_workspace(wa, size_t(M) * K);
    float* bf = detail::grow_workspace(wb, size_t(N) * K);
    for (size_t i = 0; i < size_t(M) * K; ++i) af[i] = bf16_to_f32(a16[i]);
    for (size_t i = 0; i < size_t(N) * K; ++i) bf[i] = bf16_to_f32(b16[i]);
    detail::sgemm(false, true, M, N, K, alpha, af, K, bf, K, beta, C, N);
  }
};

}  // namespace

}  // namespace sw::cpu

namespace sw {
const Fp8Kernels& cpu_fp8_kernels() {
  static const cpu::CpuFp8 k;
  return k;
}
}  // namespace sw
