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
//    rounded once, all of a call's operands in one parallel region;
//  * onednn (BF16, AVX-512): gemm_onednn.cpp, dense bf16 copies of the operands, then
//    oneDNN's bf16 matmul (fp32 output). On this path the 16-bit ops' products, whose operands
//    are bf16 already, run own vdpbf16ps kernels where those apply (gemm_bf16_16,
//    gemm_bf16_tn.cpp), unless SHARDWISE_LOWP_PATH=onednn asks for oneDNN throughout.
// Auto: BF16 runs onednn where vdpbf16ps is faster than FMA (choose_native: AMD's CPUs, where
// it measures 2x FMA's flops on Zen 4 and Zen 5; ~0.5x on the 4th-generation Xeon these kernels
// were developed on, where one vdpbf16ps issues at a quarter of the FMA's rate, so bf16 cannot
// beat fp32 there; a rule, not a timing, so every process of a job sums alike), else fused
// where AVX-512 exists, else emulated. SHARDWISE_LOWP_PATH=native|fused|emulated|onednn
// overrides Auto; =tuned picks per shape between the own kernel and onednn by timing both on
// the first call (shape_choice: faster, but two processes may choose differently and so differ
// in summation order). Tests and the bench force one path per call.
//
// F16 has no native path: x86 has no fp16 dot product with fp32 accumulation below AMX-FP16,
// so fp16 compute brings no speed on the CPU; it exists for the fp16 mixed-precision mode
// (values beyond fp16's range become +-inf, which is how the loss scaler detects overflow).
#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/env.h"
#include "core/error.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/cpu_kernels.h"

namespace sw::cpu {

namespace {

bool hw_avx512_bf16() {
  static const bool has = [] {
    __builtin_cpu_init();
#if defined(__clang__) && __clang_major__ < 16  // clang 14 knows no "avx512bf16": CPUID.(7,1).EAX[5]
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool bf16 = __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));
#else
    const bool bf16 = __builtin_cpu_supports("avx512bf16");
#endif
    return bf16 && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  }();
  return has;
}

bool hw_f16c() {
  static const bool has = [] {
    __builtin_cpu_init();
#if defined(__clang__) && __clang_major__ < 16  // nor "f16c": CPUID.1.ECX[29]
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
#else
    const bool f16c = __builtin_cpu_supports("f16c");
#endif
    return f16c && __builtin_cpu_supports("avx2");
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
  const std::string e = env_text("SHARDWISE_LOWP_PATH").value_or("");
  if (!e.empty() && e != "native" && e != "fused" && e != "emulated" && e != "onednn" &&
      e != "tuned")
    fail("kernels",
         "SHARDWISE_LOWP_PATH must be native, fused, emulated, onednn or tuned, not '" + e + "'");
  return e;
}

// Whether vdpbf16ps outruns FMA, by the CPU's vendor and never by a timing: every process of a
// job, a resumed one included, must take the same path, or their sums differ in the last bits
// (a per-process measurement near its threshold, or taken on a loaded machine, could flip). The
// rule is what the measurement (detail::dpbf16_flop_ratio, vdpbf16ps against FMA flops) gives
// on the CPUs with AVX512-BF16 measured: 2.0 on AMD's Zen 4 and Zen 5 (a vdpbf16ps does twice an
// FMA's flops at the FMA's issue rate), ~0.5 on Intel's 4th-generation Xeon (a quarter of the
// FMA's issue rate); other CPUs are not measured. SHARDWISE_LOWP_VERBOSE prints both.
bool choose_native() {
  if (!hw_avx512_bf16()) return false;
  const std::string e = env_path();
  if (!e.empty() && e != "tuned") return e == "native" || e == "onednn";
  __builtin_cpu_init();
  const bool native = __builtin_cpu_is("amd");
  if (env_flag("SHARDWISE_LOWP_VERBOSE"))
    std::fprintf(stderr,
                 "[kernels] bf16 products: %s by vendor (vdpbf16ps/FMA flops measured %.2fx)\n",
                 native ? "vdpbf16ps" : "FMA", detail::dpbf16_flop_ratio());
  return native;
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

// A matrix to round: src(rows, cols; stride ld) -> a dense copy in workspace `slot`. With
// src16 (t's 16-bit values, stride ld) instead of src, the copy is those values widened: they
// are rounded already.
struct RoundJob {
  const float* src;
  int rows, cols, ld;
  const float* out = nullptr;
  const uint16_t* src16 = nullptr;
};

void widen_row(DType t, float* d, const uint16_t* s, int n) {
  if (t == DType::BF16) {
    for (int c = 0; c < n; ++c) d[c] = std::bit_cast<float>(uint32_t{s[c]} << 16);
  } else {
    for (int c = 0; c < n; ++c) d[c] = f16_to_f32(s[c]);
  }
}

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
    if (jobs[j].src16)
      widen_row(t, dst[j] + (size_t)i * jobs[j].cols, jobs[j].src16 + (size_t)i * jobs[j].ld,
                jobs[j].cols);
    else
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
  if (path == LowpPath::OneDnn) {
    SW_CHECK(t == DType::BF16, "gemm: the oneDNN path is bf16 only");
    SW_CHECK(hw_avx512(), "gemm: the oneDNN path needs AVX-512");
  }
  return path;
}

// Auto's per-shape choice between the process's best own kernel (`base`, Native or Fused) and
// oneDNN: measured on the first call of each (M, N, K, transposes), cached for the process.
// Both candidates run on the call's own operands into a scratch copy of C (beta applies to
// the copy), once to warm up (oneDNN builds its primitive, pages are touched), then
// alternately; the faster minimum wins. Later calls cost one hash lookup under a mutex.
struct ShapeKey {
  int M, N, K;
  bool ta, tb;
  bool operator==(const ShapeKey&) const = default;
};
struct ShapeHash {
  size_t operator()(const ShapeKey& k) const {
    return ((size_t)k.M * 1000003u + (size_t)k.N) * 1000003u + (size_t)k.K * 4 + k.ta * 2 + k.tb;
  }
};
struct ShapeChoice {
  LowpPath path;
  double t_base, t_onednn;  // best measured seconds
  LowpPath base;            // the own kernel timed (Native or Fused)
};
std::mutex g_shape_mu;
std::unordered_map<ShapeKey, ShapeChoice, ShapeHash> g_shape_choice;

void run_path(LowpPath p, bool ta, bool tb, int M, int N, int K, float alpha, const float* A,
              int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  if (p == LowpPath::Native)
    detail::gemm_bf16_avx512(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else if (p == LowpPath::Fused)
    detail::gemm_lowp_fma_avx512(false, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else
    detail::gemm_bf16_onednn(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

LowpPath shape_choice(LowpPath base, bool ta, bool tb, int M, int N, int K, float alpha,
                      const float* A, int lda, const float* B, int ldb, float beta,
                      const float* C, int ldc) {
  const ShapeKey key{M, N, K, ta, tb};
  {
    std::lock_guard<std::mutex> lock(g_shape_mu);
    auto it = g_shape_choice.find(key);
    if (it != g_shape_choice.end()) return it->second.path;
  }
  if (omp_in_parallel()) return base;  // one thread of a team: not a representative timing
  const size_t n = (size_t)(M - 1) * ldc + N;  // C's extent
  std::vector<float> scratch(n);
  auto once = [&](LowpPath p) {
    if (beta != 0.f) std::memcpy(scratch.data(), C, n * sizeof(float));
    const double t0 = omp_get_wtime();
    run_path(p, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, scratch.data(), ldc);
    return omp_get_wtime() - t0;
  };
  const double w = once(base);
  once(LowpPath::OneDnn);
  const int reps = w > 0.1 ? 2 : w > 0.01 ? 3 : 5;
  double tb_ = 1e30, td = 1e30;
  for (int r = 0; r < reps; ++r) {
    tb_ = std::min(tb_, once(base));
    td = std::min(td, once(LowpPath::OneDnn));
  }
  const ShapeChoice c{td < tb_ ? LowpPath::OneDnn : base, tb_, td, base};
  if (env_flag("SHARDWISE_LOWP_VERBOSE"))
    std::fprintf(stderr, "[kernels] bf16 gemm M%d N%d K%d ta%d tb%d: %s %.3f ms, onednn %.3f ms -> %s\n",
                 M, N, K, (int)ta, (int)tb, base == LowpPath::Native ? "native" : "fused",
                 tb_ * 1e3, td * 1e3, c.path == LowpPath::OneDnn ? "onednn" : "own kernel");
  std::lock_guard<std::mutex> lock(g_shape_mu);
  return g_shape_choice.emplace(key, c).first->second.path;
}

}  // namespace

int64_t lowp_pack_bytes(const std::vector<Own16Call>& calls, int threads) {
  namespace lp = detail::lowp_pack;
  // Per team thread t, the largest B block it packed (words; 0: it never ran a slab).
  std::vector<size_t> b_words(size_t(std::max(1, threads)), 0);
  for (const Own16Call& c : calls) {
    if (c.M <= 0 || c.N <= 0 || c.K <= 0) continue;  // (gemm_lowp returns before the kernel)
    // gemm_bf16_avx512.cpp run(): the team, one slab per thread (rows when M >= N, else
    // columns, in whole tiles); slab(): an empty slab packs nothing.
    const int T = 2.0 * c.M * c.N * c.K < lp::kMinWork ? 1 : std::max(1, threads);
    const bool by_rows = c.M >= c.N;
    const int unit = by_rows ? lp::kMR : lp::kNR, extent = by_rows ? c.M : c.N;
    const int per = ((extent + unit - 1) / unit + T - 1) / T;
    for (int t = 0; t < T; ++t) {
      const int a = std::min(extent, t * per * unit), b = std::min(extent, (t + 1) * per * unit);
      if (b <= a) continue;
      const int cols = by_rows ? c.N : b - a;
      const size_t nc = size_t(std::min(lp::kNC, (cols + lp::kNR - 1) / lp::kNR * lp::kNR));
      b_words[size_t(t)] = std::max(b_words[size_t(t)], nc * lp::kUnitsMax);
    }
  }
  int64_t bytes = 0;
  for (size_t w : b_words)
    if (w > 0) bytes += 4 * int64_t(w + size_t(lp::kMC) * lp::kUnitsMax);
  return bytes;
}

bool cpu_has_avx512_bf16() { return hw_avx512_bf16(); }
bool cpu_has_avx512() { return hw_avx512(); }

bool detail::lowp_onednn_forced() {
  static const bool forced = hw_avx512() && env_path() == "onednn";
  return forced;
}

LowpPath lowp_auto_path(DType t) {
  // Without native: fused where AVX-512 exists unless SHARDWISE_LOWP_PATH=emulated.
  static const LowpPath fma_or_emulated =
      hw_avx512() && env_path() != "emulated" ? LowpPath::Fused : LowpPath::Emulated;
  static const bool onednn = hw_avx512() && env_path() == "onednn";
  static const bool forced_native = env_path() == "native";
  if (t == DType::BF16 && onednn) return LowpPath::OneDnn;
  // Where bf16 dot products are fast, oneDNN's matmul: over GPT-2 124M's products it ran at
  // 1.2x our native kernel on the EPYC (bench_gemm_bf16), and a rule that does not depend on a
  // timing keeps two runs of a job (a resumed one) bit-identical. SHARDWISE_LOWP_PATH=native keeps
  // ours; =tuned times both per shape (faster, not reproducible across processes).
  if (t == DType::BF16 && bf16_native()) return forced_native ? LowpPath::Native : LowpPath::OneDnn;
  return fma_or_emulated;
}

bool lowp_per_shape(DType t) {
  static const bool on = hw_avx512() && env_path() == "tuned";
  return on && t == DType::BF16;
}

LowpPath lowp_shape_choice(bool ta, bool tb, int M, int N, int K, double* t_own,
                           double* t_onednn, LowpPath* own_path) {
  std::lock_guard<std::mutex> lock(g_shape_mu);
  auto it = g_shape_choice.find(ShapeKey{M, N, K, ta, tb});
  if (it == g_shape_choice.end()) return LowpPath::Auto;
  if (t_own) *t_own = it->second.t_base;
  if (t_onednn) *t_onednn = it->second.t_onednn;
  if (own_path) *own_path = it->second.base;
  return it->second.path;
}

LowpPath lowp_own_path(DType t) {
  if (t == DType::BF16 && bf16_native()) return LowpPath::Native;
  return hw_avx512() ? LowpPath::Fused : LowpPath::Emulated;
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
  const bool per_shape = path == LowpPath::Auto && lowp_per_shape(t);
  // (per shape: the own kernel against oneDNN; Auto's path itself is oneDNN where bf16 runs
  // vdpbf16ps, which timed against itself chose nothing)
  path = per_shape ? lowp_own_path(t) : resolve(t, path);
  if (per_shape)
    path = shape_choice(path, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  if (path == LowpPath::OneDnn)
    return detail::gemm_bf16_onednn(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
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

namespace {
// A 16-bit operand as fp32 for the paths that pack from fp32 (native, fused, the per-shape
// choice): widened into this thread's grow-only scratch `slot` (0: a gradient, 1: an input,
// 2: a weight).
const float* widened16(DType t, const uint16_t* x16, size_t n, int slot) {
  thread_local Buffer buf[3];
  float* d = detail::grow_workspace(buf[slot], n);
  widen(t, x16, d, n);
  return d;
}
// This thread's grow-only bf16 scratch for an fp32 operand narrowed once for the two products
// that read it (dout in linear_backward), by narrowed16 or narrowed16_colsum.
uint16_t* narrowed16_scratch(size_t n) {
  thread_local Buffer buf;
  return reinterpret_cast<uint16_t*>(detail::grow_workspace(buf, (n + 1) / 2));
}
const uint16_t* narrowed16(DType t, const float* x, size_t n) {
  uint16_t* d = narrowed16_scratch(n);
  narrow(t, x, d, n);
  return d;
}
// narrowed16 (bf16) and, in the same pass over x, db (+)= x's column sums: linear_backward's
// sums of the fp32 dout, the same bits (column_sums), without a second read of dout.
const uint16_t* narrowed16_colsum(const float* x, int N, int OC, float* db, bool db_write) {
  uint16_t* d = narrowed16_scratch((size_t)N * OC);
  detail::column_sums(db, x, N, OC, db_write, [](float v) { return v; },
                      [d](const float* row, size_t at, int w) {
#pragma omp simd
                        for (int c = 0; c < w; ++c) d[at + c] = detail::bf16_round(row[c]);
                      });
  return d;
}
size_t extent(int r, int c) { return size_t(r > 0 ? r : 0) * size_t(c > 0 ? c : 0); }
bool onednn_path(DType t) { return lowp_onednn(t); }
// db (+)= colsum(dout) read from dout's bf16 values: linear_backward's column sums on the values
// widened as they are read, so the same bits without widening dout into scratch first.
void colsum_bf16(float* db, const uint16_t* d16, int N, int OC, bool db_write) {
  detail::column_sums(db, d16, N, OC, db_write,
                      [](uint16_t v) { return std::bit_cast<float>(uint32_t{v} << 16); });
}
}  // namespace

bool lowp_onednn(DType t) {
  return t == DType::BF16 && !lowp_per_shape(t) && lowp_auto_path(t) == LowpPath::OneDnn;
}

void linear_forward_lowp(DType t, float* out, const float* inp, const float* w, const float* b,
                         int N, int C, int OC) {
  linear_forward_lowp16(t, out, inp, nullptr, w, nullptr, b, N, C, OC);
}

void linear_forward_lowp16(DType t, float* out, const float* inp, const uint16_t* inp16,
                           const float* w, const uint16_t* w16, const float* b, int N, int C,
                           int OC) {
  if (t == DType::F32) return linear_forward(out, inp, w, b, N, C, OC);
  if (N <= 0 || OC <= 0) return;
  if (onednn_path(t) && C > 0)  // the 16-bit forms read in place; the bias added in the product
    return detail::gemm_bf16_16(false, true, N, OC, C, 1.f, inp, inp16, C, w, w16, C, 0.f,
                                    out, OC, b, nullptr);
  if (b) detail::broadcast_rows(out, b, N, OC);
  if (C <= 0) {
    if (!b) std::memset(out, 0, sizeof(float) * (size_t)N * OC);
    return;
  }
  if (!w) w = widened16(t, w16, extent(OC, C), 2);
  if (!inp && lowp_auto_path(t) == LowpPath::Emulated) {  // widened in the rounding pass
    detail::blas_select_core();
    RoundJob jobs[2] = {{nullptr, N, C, C, nullptr, inp16}, {w, OC, C, C}};
    round_jobs(t, jobs, 2);
    detail::sgemm(false, true, N, OC, C, 1.f, jobs[0].out, C, jobs[1].out, C, b ? 1.f : 0.f, out,
                  OC);
    return;
  }
  if (!inp) inp = widened16(t, inp16, extent(N, C), 1);
  gemm_lowp(t, false, true, N, OC, C, 1.f, inp, C, w, C, b ? 1.f : 0.f, out, OC);
}

bool linear_forward_lowp16_to16(DType t, uint16_t* out16, const float* inp, const uint16_t* inp16,
                                const float* w, const uint16_t* w16, const float* b, int N, int C,
                                int OC) {
  if (!onednn_path(t) || N <= 0 || OC <= 0 || C <= 0) return false;
  detail::gemm_bf16_16(false, true, N, OC, C, 1.f, inp, inp16, C, w, w16, C, 0.f, nullptr,
                           OC, b, out16);
  return true;
}

bool linear_backward_lowp16_to16(DType t, uint16_t* dinp16, float* dw, float* db,
                                 const float* dout, const uint16_t* dout16, const float* inp,
                                 const uint16_t* inp16, const float* w, const uint16_t* w16,
                                 int N, int C, int OC, float dw_beta, bool db_write) {
  if (!onednn_path(t) || N <= 0 || OC <= 0 || C <= 0) return false;
  // An fp32-only dout narrowed once for both products, db's column sums taken in that pass.
  const bool db_fused = !dout16 && dw && db;
  const uint16_t* d16 = dout16     ? dout16
                        : db_fused ? narrowed16_colsum(dout, N, OC, db, db_write)
                        : dw       ? narrowed16(t, dout, extent(N, OC))
                                   : nullptr;
  detail::gemm_bf16_16(false, false, N, C, OC, 1.f, dout, d16, OC, w, w16, C, 0.f, nullptr, C,
                           nullptr, dinp16);
  // dW and db as linear_backward_lowp16 forms them.
  if (dw || (db && !db_fused))
    linear_backward_lowp16(t, nullptr, dw, db_fused ? nullptr : db, dout, d16 ? d16 : dout16,
                           inp, inp16, w, w16, N, C, OC, 0.f, dw_beta, db_write);
  return true;
}

void linear_backward_lowp(DType t, float* dinp, float* dw, float* db, const float* dout,
                          const float* inp, const float* w, int N, int C, int OC,
                          float dinp_beta, float dw_beta, bool db_write) {
  linear_backward_lowp16(t, dinp, dw, db, dout, nullptr, inp, nullptr, w, nullptr, N, C, OC,
                         dinp_beta, dw_beta, db_write);
}

void linear_backward_lowp16(DType t, float* dinp, float* dw, float* db, const float* dout,
                            const uint16_t* dout16, const float* inp, const uint16_t* inp16,
                            const float* w, const uint16_t* w16, int N, int C, int OC,
                            float dinp_beta, float dw_beta, bool db_write) {
  if (t == DType::F32)
    return linear_backward(dinp, dw, db, dout, inp, w, N, C, OC, dinp_beta, dw_beta, db_write);
  if (!dinp && !dw && db && N > 0 && OC > 0 && (dout || dout16)) {
    // db alone (Fp8Ops's bias gradients): a column sum of dout, nothing widened
    if (dout)
      linear_backward(nullptr, nullptr, db, dout, nullptr, nullptr, N, C, OC, 1.f, 1.f, db_write);
    else
      colsum_bf16(db, dout16, N, OC, db_write);
    return;
  }
  if (onednn_path(t) && N > 0 && OC > 0 && C > 0 && (dinp || dw)) {
    // The 16-bit forms read in place; an fp32-only dout that feeds both products narrowed once
    // (db's column sums taken in that pass).
    const bool db_fused = !dout16 && dinp && dw && db;
    const uint16_t* d16 = dout16         ? dout16
                          : db_fused     ? narrowed16_colsum(dout, N, OC, db, db_write)
                          : dinp && dw   ? narrowed16(t, dout, extent(N, OC))
                                         : nullptr;
    if (dinp)
      detail::gemm_bf16_16(false, false, N, C, OC, 1.f, dout, d16, OC, w, w16, C, dinp_beta,
                               dinp, C);
    // db from a bf16-only dout: its column sums taken as the own weight-gradient kernel packs
    // dout (the same bits as colsum_bf16), where that kernel runs.
    const bool db_in_dw = dw && db && !db_fused && !dout && dout16 &&
                          detail::gemm_bf16_16_dw_db(OC, C, N, dout16, OC, inp16, C, dw_beta, dw,
                                                     C, db, db_write);
    if (dw && !db_in_dw)
      detail::gemm_bf16_16(true, false, OC, C, N, 1.f, dout, d16, OC, inp, inp16, C, dw_beta,
                               dw, C);
    if (db && !db_fused && !db_in_dw) {  // a sum: fp32 (the fp32 op's sums, or from bf16)
      if (dout)
        linear_backward(nullptr, nullptr, db, dout, inp, w, N, C, OC, 1.f, 1.f, db_write);
      else
        colsum_bf16(db, dout16, N, OC, db_write);
    }
    return;
  }
  if (!w && w16) w = widened16(t, w16, extent(OC, C), 2);
  if (dout) dout16 = nullptr;  // (the fp32 forms where given)
  if (inp) inp16 = nullptr;
  const bool emulated = lowp_auto_path(t) == LowpPath::Emulated;
  // The paths that round while packing read fp32: 16-bit operands widened first (dout also
  // where db, an fp32 column sum of its values, is asked for).
  if (!emulated || N <= 0 || OC <= 0 || C <= 0 || (db && dout16)) {
    if (dout16) dout = widened16(t, dout16, extent(N, OC), 0), dout16 = nullptr;
    if (inp16) inp = widened16(t, inp16, extent(N, C), 1), inp16 = nullptr;
  }
  if (N <= 0 || OC <= 0)  // dinp = dinp_beta * dinp; written dw, db zeros
    return linear_backward(dinp, dw, db, dout, inp, w, N, C, OC, dinp_beta, dw_beta, db_write);
  if ((dinp || dw) && C > 0) {
    if (!emulated) {  // these round while packing
      if (dinp) gemm_lowp(t, false, false, N, C, OC, 1.f, dout, OC, w, C, dinp_beta, dinp, C);
      if (dw) gemm_lowp(t, true, false, OC, C, N, 1.f, dout, OC, inp, C, dw_beta, dw, C);
    } else {
      // dout feeds both products: rounded once; all three operands in one pass (16-bit ones
      // widened in it).
      detail::blas_select_core();
      RoundJob jobs[3] = {{dout, N, OC, OC, nullptr, dout16}, {w, OC, C, C},
                          {inp, N, C, C, nullptr, inp16}};
      int nj = 1;
      if (dinp) jobs[nj++] = jobs[1];
      if (dw) jobs[nj++] = jobs[2];
      round_jobs(t, jobs, nj);
      const float* rd = jobs[0].out;
      if (dinp)
        detail::sgemm(false, false, N, C, OC, 1.f, rd, OC, jobs[1].out, C, dinp_beta, dinp, C);
      if (dw)
        detail::sgemm(true, false, OC, C, N, 1.f, rd, OC, jobs[nj - 1].out, C, dw_beta, dw, C);
    }
  }
  // The bias gradient is a sum, not a product: fp32 (the fp32 op's code).
  if (db) linear_backward(nullptr, nullptr, db, dout, inp, w, N, C, OC, 1.f, 1.f, db_write);
}

}  // namespace sw::cpu
