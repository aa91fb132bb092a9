// Elementwise kernels: GELU (tanh form), SwiGLU, residual add and the small vector utilities.
// All are memory-bound streams: one `omp parallel for simd schedule(static)` each, with an
// `if (parallel : ...)` clause so that tiny vectors do not pay for waking the thread pool (the
// `parallel :` modifier matters: a plain `if` also applies to `simd` and turns off vectorisation
// whenever it is false). Every element is computed independently, so results do not depend on
// the thread count at all; sum_squares reduces fixed-size chunks and then the chunk sums in
// order, so it is thread-count independent too.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/cpu_kernels.h"

namespace sw::cpu {

namespace {

// Below this many elements a stream runs on the calling thread (a parallel region costs a few
// microseconds; 32K floats is ~128 KiB, roughly that long to stream).
constexpr size_t kParallelMin = size_t{1} << 15;

// Branch-free clamp (NaN passes through) written as bit selects. Plain ternaries let GCC's jump
// threading specialise everything downstream for the clamped constants, and the vectoriser then
// evaluates each specialised copy under a mask (4 divisions per vector instead of 1);
// std::min/max bind references to the bounds, which `omp simd` cannot privatise.
inline float clampf(float x, float lo, float hi) {
  const int32_t below = -static_cast<int32_t>(x < lo), above = -static_cast<int32_t>(x > hi);
  int32_t xi = std::bit_cast<int32_t>(x);
  xi = (xi & ~below) | (std::bit_cast<int32_t>(lo) & below);
  xi = (xi & ~above) | (std::bit_cast<int32_t>(hi) & above);
  return std::bit_cast<float>(xi);
}

// e^x for x clamped to [-80, 80] (e^80 ~ 5.5e34: every result and every product the callers
// form with it stays a normal float, so no denormal slow paths). Range reduction
// x = k*ln2 + r with |r| <= ln2/2 (ln2 split in two for an exact k*ln2_hi), a degree-7 Taylor
// polynomial for e^r (truncation < 1e-8 relative), and 2^k assembled in the exponent bits.
// Relative error ~2 ulp. Plain arithmetic only, so `omp simd` loops vectorise it.
inline float exp_clamped(float x) {
  x = clampf(x, -80.f, 80.f);
  constexpr float kShift = 12582912.f;  // 1.5 * 2^23: x*log2e + kShift rounds to an integer
  const float t = x * 1.44269504088896341f + kShift;
  const float k = t - kShift;
  const int32_t ki = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kShift);
  float r = x - k * 0.693145751953125f;  // ln2, high 16 bits: k*hi is exact
  r = r - k * 1.428606820309417232e-6f;  // ln2 - hi
  float p = 1.f / 5040.f;
  p = p * r + 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  return p * std::bit_cast<float>((ki + 127) << 23);
}

constexpr float kSqrt2OverPi = 0.79788456080286535588f;
constexpr float kGeluA = 0.044715f;

using detail::bf16_round;
using detail::to_kind;

// An op's output element: the float itself, or (T = uint16_t: the Ops' 16-bit outputs) the
// float narrowed to kind K, as narrow() would write it.
template <class T, int K>
inline T out_value(float v) {
  if constexpr (std::is_same_v<T, float>)
    return v;
  else
    return to_kind<K>(v);
}

// An op's input element: the float itself, or a 16-bit value (In = uint16_t) of kind K
// (1 bf16, 2 fp16) widened, as widen() reads it. K is a template argument so the loops keep
// one conversion each (bf16's a shift, which vectorises).
template <int K, class In>
inline float in_value(In v) {
  if constexpr (std::is_same_v<In, float>)
    return v;
  else if constexpr (K == 1)
    return bf16_to_f32(v);
  else
    return f16_to_f32(v);
}

// Calls f with whichever of an input's two forms is given: the fp32 pointer, else the 16-bit one.
template <class F>
void with_form(const float* f32, const uint16_t* h, F&& f) {
  if (f32)
    f(f32);
  else
    f(h);
}

// Calls f with dt's in_value kind (1 bf16, 2 fp16) as a compile-time constant.
template <class F>
void with_kind(DType dt, F&& f) {
  if (dt == DType::BF16)
    f(std::integral_constant<int, 1>{});
  else
    f(std::integral_constant<int, 2>{});
}

}  // namespace

// GELU, tanh approximation: y = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
// Since 0.5 (1 + tanh(u)) = sigmoid(2u) = 1 / (1 + e^{-2u}), we evaluate y = x / (1 + e^{-2u}):
// the same function, without tanh's cancellation near 1 + tanh(u) = 0 (large negative x).
// u is formed from x clamped to [-10, 10]: beyond that e^{-2u} is saturated by exp_clamped
// anyway, and x^3 cannot overflow.
// inp fp32, or 16-bit of kind K (in_value).
// K: the kind of the 16-bit input and output (0 when both are fp32).
template <class T, int K = 0, class In = float>
void gelu_forward_t(T* out, const In* inp, size_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) {
    const float x = in_value<K>(inp[i]);
    const float xc = clampf(x, -10.f, 10.f);
    const float u = kSqrt2OverPi * xc * (1.f + kGeluA * xc * xc);
    out[i] = out_value<T, K>(x / (1.f + exp_clamped(-2.f * u)));
  }
}
void gelu_forward(float* out, const float* inp, size_t n) { gelu_forward_t(out, inp, n); }
void gelu_forward_lp(DType dt, uint16_t* out, const float* inp, size_t n) {
  with_kind(dt, [&](auto k) { gelu_forward_t<uint16_t, decltype(k)::value>(out, inp, n); });
}

// dy/dx = s + x * 2u' * s (1 - s), with s = sigmoid(2u), 1 - s = e s (e = e^{-2u}) and
// u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2).  dinp += dout * dy/dx. Outside [-10, 10] the
// second term is below 1e-30, so x is clamped there (no overflow to inf * 0).
// Set: dinp = 0 + g (the value += gives on zeros, -0 included), dinp never read.
// inp fp32, or 16-bit of kind K (in_value).
// dout likewise (D). T = uint16_t: dinp written 16-bit, narrow of the fp32 values (Set only).
template <bool Set, int K = 0, class In = float, class D = float, class T = float>
void gelu_backward_t(T* dinp, const In* inp, const D* dout, size_t n) {
  static_assert(Set || std::is_same_v<T, float>, "a 16-bit dinp is written, not added into");
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) {
    const float x = clampf(in_value<K>(inp[i]), -10.f, 10.f);
    const float x2 = x * x;
    const float u = kSqrt2OverPi * x * (1.f + kGeluA * x2);
    const float du = kSqrt2OverPi * (1.f + 3.f * kGeluA * x2);
    const float e = exp_clamped(-2.f * u);
    const float s = 1.f / (1.f + e);
    const float one_minus_s = e * s;
    const float g = in_value<K>(dout[i]) * (s + 2.f * x * du * one_minus_s * s);
    if constexpr (std::is_same_v<T, float>)
      dinp[i] = (Set ? 0.f : dinp[i]) + g;
    else
      dinp[i] = out_value<T, K>(0.f + g);
  }
}

namespace {

// GELU of a 16-bit input by table. A 16-bit input has 65536 values, so its GELU and GELU's
// derivative are two tables of 65536 entries each, filled once per kind by the fp32 loops
// above on every widened value: the forward's 16-bit output is the table entry itself, the
// backward's dout * dy/dx multiplies the tabled derivative (the parenthesised factor of
// gelu_backward_t, dout = 1 giving it exactly). Same bits as the loops (test_bf16 checks every
// input), at a fraction of their time: a lookup instead of exp, a division and the clamps
// (~15 ms of the small bf16 model's 0.55 s step on Zen 4 before). Tables: 256 KiB + 256 KiB
// per kind (the forward's as 32-bit words, which the vector loop gathers), built on first use.
struct GeluTables {
  std::vector<uint32_t> y;  // the 16-bit output of gelu(x)
  std::vector<float> dydx;  // the derivative factor, fp32
};

template <int K>
const GeluTables& gelu_tables() {
  static const GeluTables t = [] {
    constexpr size_t kN = size_t{1} << 16;
    std::vector<uint16_t> x16(kN);
    for (size_t i = 0; i < kN; ++i) x16[i] = static_cast<uint16_t>(i);
    std::vector<uint16_t> y16(kN);
    gelu_forward_t<uint16_t, K>(y16.data(), x16.data(), kN);
    const std::vector<uint16_t> one(kN, K == 1 ? uint16_t{0x3f80} : uint16_t{0x3c00});  // 1.0
    GeluTables g{std::vector<uint32_t>(y16.begin(), y16.end()), std::vector<float>(kN)};
    gelu_backward_t<true, K>(g.dydx.data(), x16.data(), one.data(), kN);
    return g;
  }();
  return t;
}

template <int K>
void gelu_forward_table(uint16_t* out, const uint16_t* inp, size_t n) {
  const uint32_t* y = gelu_tables<K>().y.data();
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint16_t>(y[inp[i]]);
}

// gelu_backward_t<true>'s output for a 16-bit inp: 0 + dout * dy/dx (T fp32 or 16-bit).
template <int K, class D, class T>
void gelu_backward_table(T* dinp, const uint16_t* inp, const D* dout, size_t n) {
  const float* dydx = gelu_tables<K>().dydx.data();
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) {
    const float g = in_value<K>(dout[i]) * dydx[inp[i]];
    if constexpr (std::is_same_v<T, float>)
      dinp[i] = 0.f + g;
    else
      dinp[i] = out_value<T, K>(0.f + g);
  }
}

}  // namespace

void gelu_forward_lp(DType dt, uint16_t* out, const uint16_t* inp, size_t n) {
  with_kind(dt, [&](auto k) { gelu_forward_table<decltype(k)::value>(out, inp, n); });
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n, bool set) {
  if (set)
    gelu_backward_t<true>(dinp, inp, dout, n);
  else
    gelu_backward_t<false>(dinp, inp, dout, n);
}
// inp 16-bit (inp null): the derivative by table.
template <class T>
void gelu_backward_set_t(DType dt, T* dinp, const float* inp, const uint16_t* inp16,
                         const float* dout, const uint16_t* dout16, size_t n) {
  with_kind(dt, [&](auto k) {
    constexpr int K = decltype(k)::value;
    with_form(dout, dout16, [&](auto d) {
      if (inp)
        gelu_backward_t<true, K>(dinp, inp, d, n);
      else
        gelu_backward_table<K>(dinp, inp16, d, n);
    });
  });
}

void gelu_backward_set(DType dt, float* dinp, const float* inp, const uint16_t* inp16,
                       const float* dout, const uint16_t* dout16, size_t n) {
  gelu_backward_set_t(dt, dinp, inp, inp16, dout, dout16, n);
}

void gelu_backward_lp_set(DType dt, uint16_t* dinp, const float* inp, const uint16_t* inp16,
                          const float* dout, const uint16_t* dout16, size_t n) {
  gelu_backward_set_t(dt, dinp, inp, inp16, dout, dout16, n);
}

// out(N,F) = silu(gate) * up, gu rows [gate (F) | up (F)]; silu(g) = g / (1 + e^{-g}).
// gu fp32, or 16-bit of kind K (in_value).
template <class T, int K = 0, class In = float>
void swiglu_forward_t(T* out, const In* gu, int N, int F) {
  const size_t F2 = 2 * static_cast<size_t>(F);
#pragma omp parallel for schedule(static) if (parallel : static_cast<size_t>(N) * F >= kParallelMin)
  for (int n = 0; n < N; ++n) {
    const In* gr = gu + n * F2;
    const In* ur = gr + F;
    T* o = out + static_cast<size_t>(n) * F;
#pragma omp simd
    for (int i = 0; i < F; ++i) {
      const float g = in_value<K>(gr[i]), up = in_value<K>(ur[i]);
      o[i] = out_value<T, K>(g / (1.f + exp_clamped(-g)) * up);
    }
  }
}
void swiglu_forward(float* out, const float* gu, int N, int F) {
  swiglu_forward_t(out, gu, N, F);
}
void swiglu_forward_lp(DType dt, uint16_t* out, const float* gu, int N, int F) {
  with_kind(dt, [&](auto k) { swiglu_forward_t<uint16_t, decltype(k)::value>(out, gu, N, F); });
}
void swiglu_forward_lp(DType dt, uint16_t* out, const uint16_t* gu, int N, int F) {
  with_kind(dt, [&](auto k) { swiglu_forward_t<uint16_t, decltype(k)::value>(out, gu, N, F); });
}

// d up += dout * silu(g);  d gate += dout * up * silu'(g), silu'(g) = s (1 + g (1 - s)).
// Set: written as 0 + g, the old values never read; T = uint16_t (with Set): narrowed to dt.
// gu fp32, or 16-bit of kind K (in_value); dout likewise (D).
template <bool Set, class T, int K = 0, class In = float, class D = float>
void swiglu_backward_t(T* dgu, const D* dout, const In* gu, int N, int F) {
  const size_t F2 = 2 * static_cast<size_t>(F);
#pragma omp parallel for schedule(static) if (parallel : static_cast<size_t>(N) * F >= kParallelMin)
  for (int n = 0; n < N; ++n) {
    const In* gr = gu + n * F2;
    const In* ur = gr + F;
    T* dg = dgu + n * F2;
    T* dup = dg + F;
    const D* d = dout + static_cast<size_t>(n) * F;
#pragma omp simd
    for (int i = 0; i < F; ++i) {
      const float g = in_value<K>(gr[i]), up = in_value<K>(ur[i]), di = in_value<K>(d[i]);
      const float e = exp_clamped(-g);
      const float s = 1.f / (1.f + e);
      const float one_minus_s = e * s;
      const float gup = di * g * s;
      const float ggate = di * up * s * (1.f + g * one_minus_s);
      if constexpr (std::is_same_v<T, float>) {
        dup[i] = (Set ? 0.f : dup[i]) + gup;
        dg[i] = (Set ? 0.f : dg[i]) + ggate;
      } else {
        static_assert(Set, "the 16-bit form writes, it cannot accumulate");
        dup[i] = to_kind<K>(0.f + gup);
        dg[i] = to_kind<K>(0.f + ggate);
      }
    }
  }
}

void swiglu_backward(float* dgu, const float* dout, const float* gu, int N, int F, bool set) {
  if (set)
    swiglu_backward_t<true>(dgu, dout, gu, N, F);
  else
    swiglu_backward_t<false>(dgu, dout, gu, N, F);
}
void swiglu_backward_lp_set(DType dt, uint16_t* dgu, const float* dout, const uint16_t* dout16,
                            const float* gu, const uint16_t* gu16, int N, int F) {
  with_kind(dt, [&](auto k) {
    with_form(gu, gu16, [&](auto g) {
      with_form(dout, dout16, [&](auto d) {
        swiglu_backward_t<true, uint16_t, decltype(k)::value>(dgu, d, g, N, F);
      });
    });
  });
}

// out = a + b; out may alias a or b (same index only: no loop-carried dependence, so `simd`
// is valid).
void residual_forward(float* out, const float* a, const float* b, size_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

namespace {
// Sum of squares in double. The vector is cut into fixed chunks of kChunk elements; each chunk
// is summed (vectorised, in double), then the chunk sums are added in index order. The result
// depends only on n and the data, not on the thread count. R: each value rounded to bf16 as it
// is read (round_to's values).
template <bool R>
double sum_squares_t(const float* x, size_t n) {
  constexpr size_t kChunk = size_t{1} << 16;
  const size_t nchunks = (n + kChunk - 1) / kChunk;
  if (nchunks <= 1) {
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (size_t i = 0; i < n; ++i) {
      const double v = R ? detail::bf16_rounded(x[i]) : x[i];
      s += v * v;
    }
    return s;
  }
  thread_local std::vector<double> partial;  // grows only; one slot per chunk
  if (partial.size() < nchunks) partial.resize(nchunks);
  double* part = partial.data();
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < nchunks; ++c) {
    const size_t i0 = c * kChunk, i1 = std::min(n, i0 + kChunk);
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (size_t i = i0; i < i1; ++i) {
      const double v = R ? detail::bf16_rounded(x[i]) : x[i];
      s += v * v;
    }
    part[c] = s;
  }
  double s = 0;
  for (size_t c = 0; c < nchunks; ++c) s += part[c];
  return s;
}
}  // namespace

double sum_squares(const float* x, size_t n) { return sum_squares_t<false>(x, n); }
double sum_squares_bf16(const float* x, size_t n) { return sum_squares_t<true>(x, n); }

void scale(float* x, float a, size_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) x[i] *= a;
}

void fill(float* x, float v, size_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) x[i] = v;
}

void add_inplace(float* y, const float* x, size_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) y[i] += x[i];
}

// dst and src must not overlap (dst == src is a no-op).
void copy(float* dst, const float* src, size_t n) {
  if (dst == src || n == 0) return;
  if (n < kParallelMin) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
#pragma omp parallel
  {
    const size_t nt = static_cast<size_t>(omp_get_num_threads());
    const size_t t = static_cast<size_t>(omp_get_thread_num());
    // Split on 16-float (64-byte) boundaries so no two threads write one cache line.
    const size_t lines = (n + 15) / 16;
    const size_t i0 = std::min(n, lines * t / nt * 16), i1 = std::min(n, lines * (t + 1) / nt * 16);
    if (i1 > i0) std::memcpy(dst + i0, src + i0, (i1 - i0) * sizeof(float));
  }
}

}  // namespace sw::cpu

namespace sw::cpu {

// ---- Precision conversions (Ops::narrow, widen, add_widened, round_to) ----------------------

// Out of place: every element is independent, so the thread split does not change a bit. In
// place the values move through bytes (a buffer holds floats and 16-bit values at once):
// narrowing walks forward (value i lands at byte 2i, at or before byte 4i it was read from),
// widening backward (value i is read at byte 2i before float i, bytes 4i..4i+3, is written).
// The loops take the kind (1 bf16, 2 fp16) as a template argument (with_kind): bf16's loops
// then vectorise, where a DType tested per element kept them scalar (issue 39).
void narrow(DType dt, const float* src, void* dst, size_t n) {
  if (dt == DType::F32) {
    if (dst != src && n) std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  with_kind(dt, [&](auto k) {
    constexpr int K = decltype(k)::value;
    if (static_cast<const void*>(src) == dst) {
      unsigned char* b = static_cast<unsigned char*>(dst);
      for (size_t i = 0; i < n; ++i) {
        float f;
        std::memcpy(&f, b + 4 * i, 4);
        const uint16_t h = to_kind<K>(f);
        std::memcpy(b + 2 * i, &h, 2);
      }
      return;
    }
    uint16_t* d = static_cast<uint16_t*>(dst);
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMin)
    for (size_t i = 0; i < n; ++i) d[i] = to_kind<K>(src[i]);
  });
}

void widen(DType dt, const void* src, float* dst, size_t n) {
  if (dt == DType::F32) {
    if (dst != src && n) std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  with_kind(dt, [&](auto k) {
    constexpr int K = decltype(k)::value;
    if (src == static_cast<const void*>(dst)) {
      unsigned char* b = reinterpret_cast<unsigned char*>(dst);
      for (size_t i = n; i-- > 0;) {
        uint16_t h;
        std::memcpy(&h, b + 2 * i, 2);
        const float f = in_value<K>(h);
        std::memcpy(b + 4 * i, &f, 4);
      }
      return;
    }
    const uint16_t* s = static_cast<const uint16_t*>(src);
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMin)
    for (size_t i = 0; i < n; ++i) dst[i] = in_value<K>(s[i]);
  });
}

void add_widened(DType dt, const void* src, float* dst, size_t n) {
  if (dt == DType::F32) {
    add_inplace(dst, static_cast<const float*>(src), n);
    return;
  }
  const uint16_t* s = static_cast<const uint16_t*>(src);
  with_kind(dt, [&](auto k) {
    constexpr int K = decltype(k)::value;
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMin)
    for (size_t i = 0; i < n; ++i) dst[i] += in_value<K>(s[i]);
  });
}

void round_to(DType dt, float* x, size_t n) { round_copy(dt, x, x, n); }

void round_copy(DType dt, float* dst, const float* src, size_t n) {
  if (dt == DType::F32) {
    if (dst != src && n) std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  with_kind(dt, [&](auto k) {
    constexpr int K = decltype(k)::value;
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMin)
    for (size_t i = 0; i < n; ++i) dst[i] = in_value<K>(to_kind<K>(src[i]));
  });
}

void round_copy_lp(DType dt, float* dst, uint16_t* dst16, const float* src, size_t n) {
  with_kind(dt, [&](auto k) {
    constexpr int K = decltype(k)::value;
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMin)
    for (size_t i = 0; i < n; ++i) {
      const uint16_t h = to_kind<K>(src[i]);
      dst16[i] = h;
      dst[i] = in_value<K>(h);
    }
  });
}

}  // namespace sw::cpu
