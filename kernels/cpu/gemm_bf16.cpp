// Reduced-precision matrix products: bf16 / fp16 operands, fp32 accumulation (see cpu_kernels.h).
//
// Three ways to compute the same thing (products of rounded operands are exact in fp32, so
// they differ only in the fp32 summation order):
//  * native (BF16 only): gemm_bf16_avx512.cpp, AVX512-BF16 vdpbf16ps microkernels on K-pair
//    interleaved bf16 panels, rounding while packing;
//  * fused (AVX-512F/BW): same blocking, panels of fp32 values rounded while packing, fp32
//    FMA microkernels: no extra pass over the operands;
//  * emulated (any CPU): operands rounded into fp32 copies, then OpenBLAS sgemm. One extra
//    pass over the operands; an operand used by two products (dout in linear_backward) is
//    rounded once, all of a call's operands in one parallel region.
// Auto: BF16 runs native only where vdpbf16ps is faster than FMA (dpbf16_flop_ratio() > 1.2,
// measured once per process; on the 4th-generation Xeon these kernels were developed on it
// delivers ~0.5x: one vdpbf16ps issues at a quarter of the FMA's rate, so bf16 cannot beat
// fp32 there), else fused where AVX-512 exists, else emulated. SW_LOWP_PATH=native|fused|
// emulated overrides Auto; tests and the bench force one path per call.
//
// F16 has no native path: x86 has no fp16 dot product with fp32 accumulation below AMX-FP16,
// so fp16 compute brings no speed on the CPU; it exists for the fp16 mixed-precision mode
// (values beyond fp16's range become +-inf, which is how the loss scaler detects overflow).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/cpu_kernels.h"

namespace sw::cpu {

namespace {

bool hw_avx512_bf16() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
  }();
  return has;
}

bool hw_f16c() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx2");
  }();
  return has;
}

bool hw_avx512() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  }();
  return has;
}

std::string env_path() {
  const char* env = std::getenv("SW_LOWP_PATH");
  const std::string e = env ? env : "";
  if (!e.empty() && e != "native" && e != "fused" && e != "emulated")
    fail("kernels", "SW_LOWP_PATH must be native, fused or emulated, not '" + e + "'");
  return e;
}

bool choose_native() {
  if (!hw_avx512_bf16()) return false;
  const std::string e = env_path();
  if (!e.empty()) return e == "native";
  return detail::dpbf16_flop_ratio() > 1.2;
}

inline float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// fp32 -> fp16 -> fp32 with F16C (IEEE round to nearest even: overflow -> inf, subnormals kept;
// the same values as f32_to_f16, NaN payloads aside).
__attribute__((target("avx2,f16c"))) void round_f16_f16c(float* dst, const float* src, int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = f16_to_f32(f32_to_f16(src[i]));
}

// f32_to_bf16's arithmetic on 16 lanes (GCC vector extensions: one AVX-512 register, or two
// AVX2 / four SSE registers), result widened back to fp32.
typedef uint32_t U16 __attribute__((vector_size(64), aligned(4), may_alias));

void round_row(DType t, float* d, const float* s, int n) {
  if (t == DType::BF16) {
    int c = 0;
    for (; c + 16 <= n; c += 16) {
      const U16 u = *reinterpret_cast<const U16*>(s + c);
      const U16 r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
      const U16 nan = (U16)((u & 0x7fffffffu) > 0x7f800000u);  // all ones where NaN
      *reinterpret_cast<U16*>(d + c) = (nan & ((u | 0x00400000u) & 0xffff0000u)) | (~nan & r);
    }
    for (; c < n; ++c) d[c] = round_bf16(s[c]);
  } else if (hw_f16c()) {
    round_f16_f16c(d, s, n);
  } else {
    for (int c = 0; c < n; ++c) d[c] = f16_to_f32(f32_to_f16(s[c]));
  }
}

// Per-thread workspaces for the rounded copies (kept between calls: the operands of a model's
// GEMMs are tens of MB, and fresh mmap'ed buffers are page-faulted on every call).
float* workspace(int slot, size_t floats) {
  thread_local Buffer buf[3];
  return detail::grow_workspace(buf[slot], floats);
}

// A matrix to round: src(rows, cols; stride ld) -> a dense copy in workspace `slot`.
struct RoundJob {
  const float* src;
  int rows, cols, ld;
  const float* out = nullptr;
};

// Rounds up to three matrices in ONE parallel region (static split of all their rows): every
// fork/join is a point where both threads must be running, which costs far more than the
// rounding itself when the cores are shared.
void round_jobs(DType t, RoundJob* jobs, int njobs) {
  float* dst[3];
  long total = 0, first[4];
  for (int j = 0; j < njobs; ++j) {
    dst[j] = workspace(j, (size_t)jobs[j].rows * jobs[j].cols);
    jobs[j].out = dst[j];
    first[j] = total;
    total += jobs[j].rows;
  }
  first[njobs] = total;
  size_t elems = 0;
  for (int j = 0; j < njobs; ++j) elems += (size_t)jobs[j].rows * jobs[j].cols;
#pragma omp parallel for schedule(static) if (elems >= (1u << 15) && !omp_in_parallel())
  for (long r = 0; r < total; ++r) {
    int j = 0;
    while (r >= first[j + 1]) ++j;
    const long i = r - first[j];
    round_row(t, dst[j] + (size_t)i * jobs[j].cols, jobs[j].src + (size_t)i * jobs[j].ld,
              jobs[j].cols);
  }
}

// The path a call takes: Auto resolved, forced paths checked against the CPU.
LowpPath resolve(DType t, LowpPath path) {
  if (path == LowpPath::Auto) return lowp_auto_path(t);
  if (path == LowpPath::Native) {
    SW_CHECK(t == DType::BF16, "gemm: no native path for fp16 on the CPU");
    SW_CHECK(hw_avx512_bf16(), "gemm: this CPU has no AVX512-BF16");
  }
  if (path == LowpPath::Fused) SW_CHECK(hw_avx512(), "gemm: this CPU has no AVX-512");
  return path;
}

}  // namespace

bool cpu_has_avx512_bf16() { return hw_avx512_bf16(); }
bool cpu_has_avx512() { return hw_avx512(); }

LowpPath lowp_auto_path(DType t) {
  // Without native: fused where AVX-512 exists unless SW_LOWP_PATH=emulated.
  static const LowpPath fma_or_emulated =
      hw_avx512() && env_path() != "emulated" ? LowpPath::Fused : LowpPath::Emulated;
  if (t == DType::BF16 && bf16_native()) return LowpPath::Native;
  return fma_or_emulated;
}

bool bf16_native() {
  static const bool native = choose_native();
  return native;
}

void round_to(DType t, float* dst, const float* src, size_t n) {
  if (t == DType::F32) {
    if (dst != src) std::memmove(dst, src, n * sizeof(float));
    return;
  }
  constexpr size_t kBlock = 4096;
  const long nb = (long)((n + kBlock - 1) / kBlock);
  auto block = [&](long b) {
    const size_t i0 = (size_t)b * kBlock, m = std::min(kBlock, n - i0);
    round_row(t, dst + i0, src + i0, (int)m);
  };
  // Small or nested calls (attention and the LM head round rows from inside their own
  // parallel loops) run here without opening a parallel region.
  if (n < (1u << 15) || omp_in_parallel()) {
    for (long b = 0; b < nb; ++b) block(b);
    return;
  }
#pragma omp parallel for schedule(static)
  for (long b = 0; b < nb; ++b) block(b);
}

void gemm_lowp(DType t, bool ta, bool tb, int M, int N, int K, float alpha, const float* A,
               int lda, const float* B, int ldb, float beta, float* C, int ldc, LowpPath path) {
  if (t == DType::F32) return gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  if (M <= 0 || N <= 0) return;
  SW_CHECK(lda >= (ta ? M : (K > 0 ? K : 1)) && ldb >= (tb ? (K > 0 ? K : 1) : N) && ldc >= N,
           "gemm: leading dimension smaller than the row width");
  if (K <= 0) return gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);  // C = beta C
  detail::blas_select_core();
  path = resolve(t, path);
  if (path == LowpPath::Native)
    return detail::gemm_bf16_avx512(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  if (path == LowpPath::Fused)
    return detail::gemm_lowp_fma_avx512(t == DType::F16, ta, tb, M, N, K, alpha, A, lda, B, ldb,
                                        beta, C, ldc);
  const int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
  RoundJob jobs[2] = {{A, ar, ac, lda}, {B, br, bc, ldb}};
  round_jobs(t, jobs, 2);
  detail::sgemm(ta, tb, M, N, K, alpha, jobs[0].out, ac, jobs[1].out, bc, beta, C, ldc);
}

void linear_forward_lowp(DType t, float* out, const float* inp, const float* w, const float* b,
                         int N, int C, int OC) {
  if (t == DType::F32) return linear_forward(out, inp, w, b, N, C, OC);
  if (N <= 0 || OC <= 0) return;
  if (b) detail::broadcast_rows(out, b, N, OC);
  if (C <= 0) {
    if (!b) std::memset(out, 0, sizeof(float) * (size_t)N * OC);
    return;
  }
  gemm_lowp(t, false, true, N, OC, C, 1.f, inp, C, w, C, b ? 1.f : 0.f, out, OC);
}

void linear_backward_lowp(DType t, float* dinp, float* dw, float* db, const float* dout,
                          const float* inp, const float* w, int N, int C, int OC) {
  if (t == DType::F32) return linear_backward(dinp, dw, db, dout, inp, w, N, C, OC);
  if (N <= 0 || OC <= 0) return;
  if ((dinp || dw) && C > 0) {
    if (lowp_auto_path(t) != LowpPath::Emulated) {  // these round while packing
      if (dinp) gemm_lowp(t, false, false, N, C, OC, 1.f, dout, OC, w, C, 1.f, dinp, C);
      if (dw) gemm_lowp(t, true, false, OC, C, N, 1.f, dout, OC, inp, C, 1.f, dw, C);
    } else {
      // dout feeds both products: rounded once; all three operands in one pass.
      detail::blas_select_core();
      RoundJob jobs[3] = {{dout, N, OC, OC}, {w, OC, C, C}, {inp, N, C, C}};
      int nj = 1;
      if (dinp) jobs[nj++] = jobs[1];
      if (dw) jobs[nj++] = jobs[2];
      round_jobs(t, jobs, nj);
      const float* rd = jobs[0].out;
      if (dinp) detail::sgemm(false, false, N, C, OC, 1.f, rd, OC, jobs[1].out, C, 1.f, dinp, C);
      if (dw)
        detail::sgemm(true, false, OC, C, N, 1.f, rd, OC, jobs[nj - 1].out, C, 1.f, dw, C);
    }
  }
  // The bias gradient is a sum, not a product: fp32 (the fp32 op's code).
  if (db) linear_backward(nullptr, nullptr, db, dout, inp, w, N, C, OC);
}

}  // namespace sw::cpu
