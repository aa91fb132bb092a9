// GEMM and Linear on OpenBLAS (OpenMP build: BLAS threads are our OpenMP threads; a call made
// from inside one of our parallel regions runs single-threaded).
#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/cpu_kernels.h"

// OpenBLAS DYNAMIC_ARCH internals used to re-select the kernel set (weak: absent from builds
// without DYNAMIC_ARCH, in which case nothing is re-selected).
extern "C" {
__attribute__((weak)) void gotoblas_dynamic_init(void);
__attribute__((weak)) void gotoblas_dynamic_quit(void);
}

namespace sw::cpu {

namespace detail {

namespace {

bool in_list(const std::string& s, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (s == n) return true;
  return false;
}

const char* select_core_once() {
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  if ((env && *env) || !gotoblas_dynamic_init || !gotoblas_dynamic_quit)
    return openblas_get_corename();
  const bool env_set = env != nullptr;  // set but empty: restored as such below
  const std::string core = openblas_get_corename();
  __builtin_cpu_init();
  const bool intel = __builtin_cpu_is("intel");
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const char* want = nullptr;
  if (intel && avx512 && !in_list(core, {"SkylakeX", "Cooperlake", "SapphireRapids"}))
    want = "SkylakeX";
  else if (avx2 && !in_list(core, {"Haswell", "SkylakeX", "Cooperlake", "SapphireRapids", "Zen",
                                   "Excavator"}))
    want = "Haswell";
  if (!want) return openblas_get_corename();
  // OpenBLAS reads OPENBLAS_CORETYPE when it (re)initialises its kernel table; restore the
  // environment afterwards so child processes see what the user set.
  setenv("OPENBLAS_CORETYPE", want, 1);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  if (env_set)
    setenv("OPENBLAS_CORETYPE", "", 1);
  else
    unsetenv("OPENBLAS_CORETYPE");
  return openblas_get_corename();
}

// Runs before main (and before any kernel could call BLAS); blas_select_core() below makes
// the same guarantee for code that runs during static initialisation.
[[maybe_unused]] const char* g_core_at_start = blas_select_core();

}  // namespace

const char* blas_select_core() {
  static const char* name = select_core_once();
  return name;
}

}  // namespace detail

void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  SW_CHECK(lda >= (ta ? M : (K > 0 ? K : 1)) && ldb >= (tb ? (K > 0 ? K : 1) : N) && ldc >= N,
           "gemm: leading dimension smaller than the row width");
  detail::blas_select_core();
  if (K <= 0) {  // C = beta * C (BLAS semantics), without relying on the library's corner case
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j)
        C[(size_t)i * ldc + j] = beta == 0.f ? 0.f : beta * C[(size_t)i * ldc + j];
    return;
  }
  detail::sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// out(N,OC) = inp(N,C) @ w(OC,C)^T + b. The bias is broadcast into out first and the GEMM runs
// with beta = 1: OpenBLAS would otherwise make its own pass to zero C for beta = 0, so the
// bias costs nothing extra.
void linear_forward(float* out, const float* inp, const float* w, const float* b, int N, int C,
                    int OC) {
  if (N <= 0 || OC <= 0) return;
  detail::blas_select_core();
  if (b) detail::broadcast_rows(out, b, N, OC);
  if (C <= 0) {
    if (!b) std::memset(out, 0, sizeof(float) * (size_t)N * OC);
    return;
  }
  detail::sgemm(false, true, N, OC, C, 1.f, inp, C, w, C, b ? 1.f : 0.f, out, OC);
}

// dinp(N,C) += dout(N,OC) @ w(OC,C); dw(OC,C) += dout^T @ inp; db(OC) += colsum(dout).
void linear_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                     const float* w, int N, int C, int OC, float dinp_beta, float dw_beta,
                     bool db_write) {
  if (N <= 0) {  // no rows: the written parameter gradients are zeros
    if (dw && dw_beta == 0.f && OC > 0 && C > 0) fill(dw, 0.f, static_cast<size_t>(OC) * C);
    if (db && db_write && OC > 0) fill(db, 0.f, static_cast<size_t>(OC));
    return;
  }
  if (OC <= 0) {  // an empty product: dinp = dinp_beta * dinp
    if (dinp && dinp_beta == 0.f && C > 0) fill(dinp, 0.f, static_cast<size_t>(N) * C);
    return;
  }
  detail::blas_select_core();
  if (dinp && C > 0)
    detail::sgemm(false, false, N, C, OC, 1.f, dout, OC, w, C, dinp_beta, dinp, C);
  if (dw && C > 0) detail::sgemm(true, false, OC, C, N, 1.f, dout, OC, inp, C, dw_beta, dw, C);
  if (db) {
    detail::column_sums(db, dout, N, OC, db_write, [](float v) { return v; });
  }
}

}  // namespace sw::cpu
