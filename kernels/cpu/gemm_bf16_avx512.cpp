// BF16 GEMM on AVX512-BF16 (vdpbf16ps): C(fp32) = alpha * op(A) @ op(B) + beta * C with A and
// B given as fp32 and rounded to bf16 (round-to-nearest-even, exactly core/dtype.h f32_to_bf16)
// while they are packed, fp32 accumulation.
//
// This file is compiled with -mavx512f -mavx512bw -mavx512vl -mavx512bf16 (kernels/CMakeLists);
// nothing here may run unless cpu_has_avx512_bf16() said yes (gemm_bf16.cpp checks).
//
// Layout: vdpbf16ps multiplies pairs of bf16 in each 32-bit lane and adds both products into
// the fp32 lane. Operands are therefore packed "K-pair interleaved": a panel of W rows (of
// op(A)) or columns (of op(B)) over a block of kc reduction indices holds, for each pair
// p = k/2, W 32-bit words [lo = bf16(x[.,2p]), hi = bf16(x[.,2p+1])] (an odd kc is padded with
// a zero). The microkernel keeps an MR x NR fp32 tile of C in 24 zmm registers; per pair it
// loads NR/16 vectors of the B panel and broadcasts MR words of the A panel.
//
// Blocking (BLIS order): for each block of K, a B block (all of the thread's columns, at most
// kNC) is packed, then A in blocks of kMC rows (kept in L2 while all B panels pass over it;
// each B micro-panel stays in L1/L2 across the A panels).
//
// The same blocking also serves the "fused" FMA variant (panels of fp32 values rounded while
// packing, fp32 FMA microkernel) for CPUs where vdpbf16ps is slower than FMA. Measured on the
// development machine (Xeon with AVX512-BF16, 2 cores, shared): one vdpbf16ps issues every
// ~2 cycles against two FMAs per cycle, so the vdpbf16ps kernel runs at ~0.5x sgemm (oneDNN
// 2.6's bf16 matmul at ~0.55x) and the fused kernel at ~0.9x sgemm.
//
// Threads: C is split into one contiguous slab per thread (rows when M >= N, else columns;
// aligned to the microkernel tile). Each C element is produced by one thread with the same
// K blocking and summation order whatever the split, so results are bit-identical run to run
// and do not depend on the thread count. Each thread packs what its slab needs (the other
// operand is packed by every thread; packing is O(MK + KN) against O(MNK) flops).
#include <immintrin.h>
#include <omp.h>

// GCC 12 warns about the undefined first operand inside its own AVX-512 shift intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/avx512_pack.h"

namespace sw::cpu::detail {

namespace {

constexpr int kMR = lowp_pack::kMR;  // rows of C per microkernel tile
constexpr int kNV = 4;                // zmm vectors per tile row
constexpr int kNR = 16 * kNV;         // columns of C per tile
// Reduction indices per block: 192 for vdpbf16ps (96 pair words per lane, a 24 KiB B
// micro-panel), 256 for FMA (one fp32 word per index; 128 and 384 measured no better, within
// the noise of a shared machine).
constexpr int kKCdp = 192, kKCfma = 256;
constexpr int kUnitsMax = lowp_pack::kUnitsMax;  // words per lane per block, the larger of the two
constexpr int kMC = lowp_pack::kMC;  // rows per A block (multiple of kMR)
constexpr int kNC = lowp_pack::kNC;  // columns per B block (multiple of kNR)
static_assert(kNR == lowp_pack::kNR && kKCfma <= kUnitsMax && (kKCdp + 1) / 2 <= kUnitsMax,
              "the replay's blocking (cpu_internal.h lowp_pack)");

inline __m512i splat(uint32_t x) { return _mm512_set1_epi32((int)x); }

// Lane i = [lo = bf16(a[i]), hi = bf16(b[i])].
inline __m512i pair(__m512 a, __m512 b) {
  return _mm512_or_si512(_mm512_srli_epi32(round_hi(a), 16),
                         _mm512_and_si512(round_hi(b), splat(0xffff0000u)));
}

// 32 consecutive fp32 (lo = x[0:16], hi = x[16:32]) -> 16 words [bf16(x[2q]), bf16(x[2q+1])].
inline __m512i pairs_of_run(__m512 lo, __m512 hi) {
  const __m512i idx = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37,
                                       35, 33, 31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7,
                                       5, 3, 1);
  return _mm512_permutex2var_epi16(round_hi(lo), idx, round_hi(hi));
}

// Panel of W lanes (W = kMR or kNR) over kc reduction indices from a source whose reduction
// index is contiguous: element (lane l, k) = src[l*ld + k], lanes l < nl valid (others zero).
// dst[p*W + l] = pair(k = 2p, 2p + 1), p < (kc+1)/2.
template <int W>
void pack_kcontig(uint32_t* dst, const float* src, ptrdiff_t ld, int nl, int kc) {
  const int kp = (kc + 1) / 2;
  for (int g = 0; g < W; g += 16) {
    const int lanes = std::min(16, W - g), valid = std::clamp(nl - g, 0, 16);
    const __mmask16 smask = first_n(lanes);
    for (int p0 = 0; p0 < kp; p0 += 16) {
      const int k0 = 2 * p0, kn = std::min(32, kc - k0);
      const __mmask16 m0 = first_n(kn), m1 = first_n(std::max(0, kn - 16));
      __m512i r[16];
      for (int l = 0; l < 16; ++l) {
        if (l < valid) {
          const float* s = src + (ptrdiff_t)(g + l) * ld + k0;
          r[l] = pairs_of_run(_mm512_maskz_loadu_ps(m0, s), _mm512_maskz_loadu_ps(m1, s + 16));
        } else {
          r[l] = _mm512_setzero_si512();
        }
      }
      transpose16(r);
      const int np = std::min(16, kp - p0);
      for (int p = 0; p < np; ++p)
        _mm512_mask_storeu_epi32(dst + (size_t)(p0 + p) * W + g, smask, r[p]);
    }
  }
}

// Same panel from a source whose lane index is contiguous: element (lane l, k) = src[k*ld + l].
template <int W>
void pack_kstrided(uint32_t* dst, const float* src, ptrdiff_t ld, int nl, int kc) {
  const int kp = (kc + 1) / 2;
  for (int p = 0; p < kp; ++p) {
    const float* s0 = src + (ptrdiff_t)(2 * p) * ld;
    const float* s1 = s0 + ld;
    const bool has1 = 2 * p + 1 < kc;
    for (int g = 0; g < W; g += 16) {
      const int lanes = std::min(16, W - g), valid = std::clamp(nl - g, 0, 16);
      const __mmask16 lm = first_n(valid);
      const __m512 a = _mm512_maskz_loadu_ps(lm, s0 + g);
      const __m512 b = has1 ? _mm512_maskz_loadu_ps(lm, s1 + g) : _mm512_setzero_ps();
      _mm512_mask_storeu_epi32(dst + (size_t)p * W + g, first_n(lanes), pair(a, b));
    }
  }
}

// ---- FMA variant ("fused"): the panels hold fp32 values already rounded to bf16 / fp16, one
// word per reduction index; the microkernel is a plain fp32 FMA kernel. Same products, same
// fp32 accumulation, no separate rounding pass: for CPUs where vdpbf16ps is slower than FMA.
enum class Kind { Dp, FmaBf16, FmaF16 };

template <Kind k>
inline __m512 round_ps(__m512 x) {
  if constexpr (k == Kind::FmaF16)
    return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  else
    return _mm512_castsi512_ps(_mm512_and_si512(round_hi(x), splat(0xffff0000u)));
}

// Panel of W lanes over kc indices, dst[k*W + l] = round(x(l, k)); x(l, k) = src[l*ld + k].
template <int W, Kind k>
void pack_kcontig_f(uint32_t* dst, const float* src, ptrdiff_t ld, int nl, int kc) {
  for (int g = 0; g < W; g += 16) {
    const int lanes = std::min(16, W - g), valid = std::clamp(nl - g, 0, 16);
    const __mmask16 smask = first_n(lanes);
    for (int k0 = 0; k0 < kc; k0 += 16) {
      const __mmask16 m = first_n(kc - k0);
      __m512i r[16];
      for (int l = 0; l < 16; ++l)
        r[l] = l < valid ? _mm512_castps_si512(round_ps<k>(
                               _mm512_maskz_loadu_ps(m, src + (ptrdiff_t)(g + l) * ld + k0)))
                         : _mm512_setzero_si512();
      transpose16(r);
      const int nk = std::min(16, kc - k0);
      for (int q = 0; q < nk; ++q)
        _mm512_mask_storeu_epi32(dst + (size_t)(k0 + q) * W + g, smask, r[q]);
    }
  }
}

// Same panel with x(l, k) = src[k*ld + l].
template <int W, Kind k>
void pack_kstrided_f(uint32_t* dst, const float* src, ptrdiff_t ld, int nl, int kc) {
  for (int q = 0; q < kc; ++q)
    for (int g = 0; g < W; g += 16) {
      const int lanes = std::min(16, W - g), valid = std::clamp(nl - g, 0, 16);
      const __m512 x = _mm512_maskz_loadu_ps(first_n(valid), src + (ptrdiff_t)q * ld + g);
      _mm512_mask_storeu_epi32(dst + (size_t)q * W + g, first_n(lanes),
                               _mm512_castps_si512(round_ps<k>(x)));
    }
}


// C tile += alpha * c (rows < mr, columns < nr).
__attribute__((always_inline)) inline void store_tile(__m512 (&c)[kMR][kNV], float* C,
                                                    ptrdiff_t ldc, int mr, int nr, float alpha) {
  const __m512 va = _mm512_set1_ps(alpha);
  if (nr == kNR) {
    for (int i = 0; i < mr; ++i) {
      float* row = C + i * ldc;
      for (int v = 0; v < kNV; ++v)
        _mm512_storeu_ps(row + 16 * v,
                         _mm512_fmadd_ps(va, c[i][v], _mm512_loadu_ps(row + 16 * v)));
    }
  } else {
    for (int i = 0; i < mr; ++i) {
      float* row = C + i * ldc;
      for (int v = 0; v < kNV && 16 * v < nr; ++v) {
        const __mmask16 m = first_n(nr - 16 * v);
        _mm512_mask_storeu_ps(row + 16 * v, m,
                              _mm512_fmadd_ps(va, c[i][v], _mm512_maskz_loadu_ps(m, row + 16 * v)));
      }
    }
  }
}

// C[0:mr, 0:nr] += alpha * (A panel)(B panel) over kp indices (FMA variant).
void ukernel_fma(int kp, const uint32_t* __restrict a, const uint32_t* __restrict b, float* C,
                 ptrdiff_t ldc, int mr, int nr, float alpha) {
  __m512 c[kMR][kNV];
  for (int i = 0; i < kMR; ++i)
    for (int v = 0; v < kNV; ++v) c[i][v] = _mm512_setzero_ps();
  const float* af = reinterpret_cast<const float*>(a);
  const float* bf = reinterpret_cast<const float*>(b);
  for (int p = 0; p < kp; ++p) {
    __m512 bv[kNV];
    for (int v = 0; v < kNV; ++v) bv[v] = _mm512_load_ps(bf + 16 * v);
    for (int i = 0; i < kMR; ++i) {
      const __m512 av = _mm512_set1_ps(af[i]);
      for (int v = 0; v < kNV; ++v) c[i][v] = _mm512_fmadd_ps(av, bv[v], c[i][v]);
    }
    af += kMR;
    bf += kNR;
  }
  store_tile(c, C, ldc, mr, nr, alpha);
}

// C[0:mr, 0:nr] += alpha * (A panel)(B panel) over kp pairs; a: kMR words per pair, b: kNR.
void ukernel(int kp, const uint32_t* __restrict a, const uint32_t* __restrict b, float* C,
             ptrdiff_t ldc, int mr, int nr, float alpha) {
  __m512 c[kMR][kNV];
  for (int i = 0; i < kMR; ++i)
    for (int v = 0; v < kNV; ++v) c[i][v] = _mm512_setzero_ps();
  dp_panels<kMR, kNV>(c, kp, a, b);
  store_tile(c, C, ldc, mr, nr, alpha);
}

// One thread's slab: rows [m0, m1), columns [n0, n1) of C.
template <Kind kind>
void slab(bool ta, bool tb, int m0, int m1, int n0, int n1, int K, float alpha, const float* A,
          int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  if (m1 <= m0 || n1 <= n0) return;
  for (int i = m0; i < m1; ++i) {
    float* row = C + (size_t)i * ldc;
    if (beta == 0.f)
      std::fill(row + n0, row + n1, 0.f);
    else if (beta != 1.f)
      for (int j = n0; j < n1; ++j) row[j] *= beta;
  }
  if (K <= 0 || alpha == 0.f) return;
  constexpr bool dp = kind == Kind::Dp;
  constexpr int KC = dp ? kKCdp : kKCfma;
  // Grow-only per thread, tracked as Mem::Workspace (lowp_pack_bytes replays their sizes).
  thread_local Buffer abuf, bbuf;
  const int ncmax = std::min(kNC, (n1 - n0 + kNR - 1) / kNR * kNR);
  uint32_t* Bp = reinterpret_cast<uint32_t*>(grow_workspace(bbuf, (size_t)ncmax * kUnitsMax));
  uint32_t* Ap = reinterpret_cast<uint32_t*>(grow_workspace(abuf, (size_t)kMC * kUnitsMax));
  for (int jc = n0; jc < n1; jc += kNC) {
    const int nc = std::min(kNC, n1 - jc);
    for (int pc = 0; pc < K; pc += KC) {
      const int kc = std::min(KC, K - pc), kp = dp ? (kc + 1) / 2 : kc;
      for (int jr = 0; jr < nc; jr += kNR) {
        uint32_t* d = Bp + (size_t)jr * kp;
        const int nl = std::min(kNR, nc - jr);
        if constexpr (dp) {
          if (tb)
            pack_kcontig<kNR>(d, B + (size_t)(jc + jr) * ldb + pc, ldb, nl, kc);
          else
            pack_kstrided<kNR>(d, B + (size_t)pc * ldb + jc + jr, ldb, nl, kc);
        } else {
          if (tb)
            pack_kcontig_f<kNR, kind>(d, B + (size_t)(jc + jr) * ldb + pc, ldb, nl, kc);
          else
            pack_kstrided_f<kNR, kind>(d, B + (size_t)pc * ldb + jc + jr, ldb, nl, kc);
        }
      }
      for (int ic = m0; ic < m1; ic += kMC) {
        const int mc = std::min(kMC, m1 - ic);
        for (int ir = 0; ir < mc; ir += kMR) {
          uint32_t* d = Ap + (size_t)ir * kp;
          const int nl = std::min(kMR, mc - ir);
          if constexpr (dp) {
            if (ta)
              pack_kstrided<kMR>(d, A + (size_t)pc * lda + ic + ir, lda, nl, kc);
            else
              pack_kcontig<kMR>(d, A + (size_t)(ic + ir) * lda + pc, lda, nl, kc);
          } else {
            if (ta)
              pack_kstrided_f<kMR, kind>(d, A + (size_t)pc * lda + ic + ir, lda, nl, kc);
            else
              pack_kcontig_f<kMR, kind>(d, A + (size_t)(ic + ir) * lda + pc, lda, nl, kc);
          }
        }
        for (int jr = 0; jr < nc; jr += kNR) {
          const int nr = std::min(kNR, nc - jr);
          for (int ir = 0; ir < mc; ir += kMR)
            (dp ? ukernel : ukernel_fma)(kp, Ap + (size_t)ir * kp, Bp + (size_t)jr * kp,
                    C + (size_t)(ic + ir) * ldc + jc + jr, ldc, std::min(kMR, mc - ir), nr,
                    alpha);
        }
      }
    }
  }
}

// Seconds per n rounds of 8 independent chains of one instruction kind (fma or dpbf16).
__attribute__((noinline)) double time_chains(bool dp, long n, float* sink) {
  __m512 c[8];
  for (int i = 0; i < 8; ++i) c[i] = _mm512_set1_ps(1e-3f * (float)i);
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1.0001f);
  const __m512bh ah = (__m512bh)_mm512_set1_epi32(0x3f803f80), bh = ah;  // (1.0, 1.0)
  const auto t0 = omp_get_wtime();
  if (dp) {
    for (long k = 0; k < n; ++k)
      for (int i = 0; i < 8; ++i) c[i] = _mm512_dpbf16_ps(c[i], ah, bh);
  } else {
    for (long k = 0; k < n; ++k)
      for (int i = 0; i < 8; ++i) c[i] = _mm512_fmadd_ps(c[i], a, b);
  }
  const double dt = omp_get_wtime() - t0;
  __m512 s = c[0];
  for (int i = 1; i < 8; ++i) s = _mm512_add_ps(s, c[i]);
  *sink += _mm512_reduce_add_ps(s);
  return dt;
}

}  // namespace

double dpbf16_flop_ratio() {
  // Each vdpbf16ps does 2 multiply-adds per lane, each FMA one. Minimum of several alternating
  // repetitions, so a time slice lost to another process does not decide the answer.
  constexpr long n = 20000;
  float sink = 0;
  double best_dp = 1e9, best_fma = 1e9;
  for (int r = 0; r < 7; ++r) {
    best_fma = std::min(best_fma, time_chains(false, n, &sink));
    best_dp = std::min(best_dp, time_chains(true, n, &sink));
  }
  if (sink == 12345.f) best_dp *= 1.0000001;  // keeps the sums alive
  return 2.0 * best_fma / best_dp;
}

namespace {

template <Kind kind>
void run(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
         const float* B, int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  const int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  const double work = 2.0 * M * N * std::max(K, 1);
  const int T = work < lowp_pack::kMinWork ? 1 : nt;
  const bool by_rows = M >= N;
  const int unit = by_rows ? kMR : kNR, extent = by_rows ? M : N;
  const int units = (extent + unit - 1) / unit;
#pragma omp parallel num_threads(T) if (T > 1)
  {
    const int t = omp_get_thread_num(), nth = omp_get_num_threads();
    const int per = (units + nth - 1) / nth;
    const int a = std::min(extent, t * per * unit), b = std::min(extent, (t + 1) * per * unit);
    if (by_rows)
      slab<kind>(ta, tb, a, b, 0, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    else
      slab<kind>(ta, tb, 0, M, a, b, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
}

}  // namespace

void to_bf16_rows(uint16_t* dst, const float* src, int rows, int cols, ptrdiff_t ld) {
  for (int r = 0; r < rows; ++r) {
    const float* s = src + (ptrdiff_t)r * ld;
    uint16_t* d = dst + (size_t)r * cols;
    int c = 0;
    for (; c + 32 <= cols; c += 32)
      _mm512_storeu_si512(d + c, pairs_of_run(_mm512_loadu_ps(s + c), _mm512_loadu_ps(s + c + 16)));
    for (; c < cols; c += 16) {
      const __mmask16 m = first_n(cols - c);
      _mm512_mask_cvtepi32_storeu_epi16(
          d + c, m, _mm512_srli_epi32(round_hi(_mm512_maskz_loadu_ps(m, s + c)), 16));
    }
  }
}

void gemm_bf16_avx512(bool ta, bool tb, int M, int N, int K, float alpha, const float* A,
                      int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  run<Kind::Dp>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_lowp_fma_avx512(bool f16, bool ta, bool tb, int M, int N, int K, float alpha,
                          const float* A, int lda, const float* B, int ldb, float beta, float* C,
                          int ldc) {
  if (f16)
    run<Kind::FmaF16>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else
    run<Kind::FmaBf16>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace sw::cpu::detail
