// The CPU twin of the fp8 primitives (kernels/fp8_ops.h Fp8Kernels): exact fp8 values, an
// emulated fp8 GEMM. A quantised value is stored as the bf16 that holds it (every E4M3 / E5M2
// value is a bf16 value), so the product runs on a bf16 matmul reading the operands in place
// (detail::gemm_bf16_16: own vdpbf16ps kernels or oneDNN; AVX-512 CPUs) or, elsewhere, OpenBLAS's sgemm on their
// widened values: a product of two fp8 values has at most 8 significant bits, exact in fp32,
// so either is an fp8 GEMM with fp32 accumulation up to the summation order. Scratch is
// per thread (grow-only, tracked as Mem::Workspace).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

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

constexpr float pow2(int e) { return e >= 0 ? float(1ull << e) : 1.f / float(1ull << -e); }

// round_fp8 (kernels/fp8_ops.cpp) without branches, so that the loops below vectorise; the same
// values bit for bit (test_fp8 runs both over PyTorch's fixture): the normal range rounded on
// the bits, the format's subnormals by fp32 addition of a constant whose last place is their
// quantum, then saturation and NaN selected. Returns the bf16 bits of the result (exact).
template <int MB, int EMIN>
inline uint16_t q8(float v, float mx) {
  const float a = std::fabs(v);
  uint32_t u;
  std::memcpy(&u, &a, 4);
  constexpr int sh = 23 - MB;
  u = (u + ((1u << (sh - 1)) - 1) + ((u >> sh) & 1u)) & ~((1u << sh) - 1);
  float rn;
  std::memcpy(&rn, &u, 4);
  constexpr float big = pow2(EMIN - MB + 23), min_normal = pow2(EMIN);
  const float rs = (a + big) - big;
  float r = a < mx ? (a < min_normal ? rs : rn) : mx;
  r = std::copysign(r, v);
  uint32_t o;
  std::memcpy(&o, &r, 4);
  uint32_t vb;
  std::memcpy(&vb, &v, 4);
  // NaN: f32_to_bf16's quiet NaN of the input
  return (vb & 0x7fffffffu) > 0x7f800000u ? static_cast<uint16_t>((vb >> 16) | 0x40)
                                          : static_cast<uint16_t>(o >> 16);
}

// dst[i] = q8(src[i] * sc) over n values of one contiguous run.
template <int MB, int EMIN, class T>
inline void quant_run(uint16_t* dst, const T* src, size_t n, float sc, float mx) {
#pragma omp simd
  for (size_t i = 0; i < n; ++i) {
    float v;
    if constexpr (std::is_same_v<T, float>)
      v = src[i];
    else
      v = bf16_to_f32(src[i]);
    dst[i] = q8<MB, EMIN>(v * sc, mx);
  }
}

template <class T>
inline void quant_rows(Fp8Format f, uint16_t* dst, const T* src, size_t n, float sc) {
  if (f == Fp8Format::E4M3)
    quant_run<3, -6>(dst, src, n, sc, 448.f);
  else
    quant_run<2, -14>(dst, src, n, sc, 57344.f);
}

class CpuFp8 final : public Fp8Kernels {
 public:
  size_t elem_bytes() const override { return 2; }

  void amax(float* out, Operand x, size_t n) const override {
    SW_CHECK(x.f32 || x.lp, "fp8 amax: no operand");
    float m = 0.f;
    if (x.f32) {
      const float* p = x.f32;
#pragma omp parallel for simd schedule(static) reduction(max : m) if (par(n))
      for (size_t i = 0; i < n; ++i) {
        const float a = std::fabs(p[i]);
        m = a > m ? a : m;  // (NaN compares false: skipped)
      }
    } else {
      const uint16_t* p = x.lp;
#pragma omp parallel for simd schedule(static) reduction(max : m) if (par(n))
      for (size_t i = 0; i < n; ++i) {
        const float a = std::fabs(bf16_to_f32(p[i]));
        m = a > m ? a : m;
      }
    }
    *out = m;
  }

  void scales(float* s, const float* amaxes, int count, Fp8Format f, bool pow2) const override {
    float m = 0.f;
    for (int i = 0; i < count; ++i) m = std::max(m, amaxes[i]);
    s[0] = fp8_scale(m, f, pow2);
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
      for (int r = 0; r < rows; ++r) {
        const size_t i = size_t(r) * cols;
        if (x.f32)
          quant_rows(f, o + i, x.f32 + i, size_t(cols), sc);
        else
          quant_rows(f, o + i, x.lp + i, size_t(cols), sc);
      }
      return;
    }
    // (cols, rows): tiles of kT rows quantised into a row-major tile, then written transposed.
    constexpr int kT = 32;
    const int tr = (rows + kT - 1) / kT, tc = (cols + kT - 1) / kT;
#pragma omp parallel for schedule(static) if (par(n))
    for (int t = 0; t < tr * tc; ++t) {
      const int r0 = (t / tc) * kT, c0 = (t % tc) * kT;
      const int nr = std::min(rows, r0 + kT) - r0, nc = std::min(cols, c0 + kT) - c0;
      uint16_t tile[kT * kT];
      for (int r = 0; r < nr; ++r) {
        const size_t i = size_t(r0 + r) * cols + c0;
        if (x.f32)
          quant_rows(f, tile + r * kT, x.f32 + i, size_t(nc), sc);
        else
          quant_rows(f, tile + r * kT, x.lp + i, size_t(nc), sc);
      }
      for (int c = 0; c < nc; ++c)
        for (int r = 0; r < nr; ++r) o[size_t(c0 + c) * rows + r0 + r] = tile[r * kT + c];
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
    // The product with alpha 1 into scratch, then the scales, bias and Cin in one pass: oneDNN
    // keys its primitives by alpha (its output scale), and the scales change every call.
    thread_local Buffer tmp_buf;
    float* acc = detail::grow_workspace(tmp_buf, size_t(M) * N);
    product(M, N, K, a16, b16, acc);
    const size_t n = size_t(M) * N;
#pragma omp parallel for schedule(static) if (par(n))
    for (int r = 0; r < M; ++r) {
      const size_t o = size_t(r) * N;
#pragma omp simd
      for (int c = 0; c < N; ++c) {
        float v = alpha * acc[o + c];
        if (bias) v += bias[c];
        if (Cin) v += beta * Cin[o + c];
        if (D.f32)
          D.f32[o + c] = v;
        else
          D.lp[o + c] = f32_to_bf16(v);
      }
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
  // C(M, N) = A(M, K) B(N, K)^T from the bf16-held fp8 values.
  static void product(int M, int N, int K, const uint16_t* a16, const uint16_t* b16, float* C) {
    if (cpu_has_avx512()) {
      detail::gemm_bf16_16(false, true, M, N, K, 1.f, nullptr, a16, K, nullptr, b16, K, 0.f, C,
                               N);
      return;
    }
    thread_local Buffer wa, wb;
    float* af = detail::grow_workspace(wa, size_t(M) * K);
    float* bf = detail::grow_workspace(wb, size_t(N) * K);
    for (size_t i = 0; i < size_t(M) * K; ++i) af[i] = bf16_to_f32(a16[i]);
    for (size_t i = 0; i < size_t(N) * K; ++i) bf[i] = bf16_to_f32(b16[i]);
    detail::sgemm(false, true, M, N, K, 1.f, af, K, bf, K, 0.f, C, N);
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
