// Private helpers shared by the CPU GEMM, attention, LM-head and optimizer kernels (not part of the
// kernel contract; only kernels/cpu/*.cpp include this).
#pragma once
#include <cblas.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/alloc.h"
#include "core/dtype.h"

namespace sw::cpu::detail {

// Makes sure OpenBLAS runs its AVX2/AVX-512 kernels. OpenBLAS 0.3.21 (Debian 12) built with
// DYNAMIC_ARCH does not recognise recent Xeons (e.g. family 6 model 207) and falls back to its
// SSE3 "Prescott" kernels, about 6x slower. When the user has not set OPENBLAS_CORETYPE and the
// detected core is such a generic fallback, this re-selects SkylakeX (AVX-512) or Haswell
// (AVX2) from what the CPU reports. Idempotent and thread-safe; gemm.cpp also runs it at
// program start. Returns OpenBLAS's core name after selection.
const char* blas_select_core();

// Adam's moment update, shared by AdamW (adamw.cpp) and Lamb (optimizers.cpp): for the scaled
// gradient g, m := beta1 m + (1 - beta1) g and v := beta2 v + (1 - beta2) g^2, in float with
// the (1 - beta) coefficients rounded once from double. Inline, so the callers' loops still
// vectorise.
struct AdamMoments {
  float b1, b2, omb1, omb2;
  AdamMoments(float beta1, float beta2)
      : b1(beta1),
        b2(beta2),
        omb1(static_cast<float>(1.0 - beta1)),
        omb2(static_cast<float>(1.0 - beta2)) {}
  void update(float g, float& m, float& v) const {
    const float mi = b1 * m + omb1 * g;
    const float vi = b2 * v + omb2 * g * g;
    m = mi;
    v = vi;
  }
};

// out(N, OC) := b broadcast to every row (the start of a linear layer whose GEMM then adds
// with beta = 1).
inline void broadcast_rows(float* out, const float* b, int N, int OC) {
#pragma omp parallel for schedule(static) if ((size_t)N * OC >= (1u << 16))
  for (int n = 0; n < N; ++n) std::memcpy(out + (size_t)n * OC, b, sizeof(float) * OC);
}

// db (+)= the column sums of x (N x OC, row-major), each value read as fp32 through `load`:
// every column summed over rows 0..N-1 in order by exactly one thread (blocks of 64 columns,
// static schedule), so the result does not depend on the thread count or the block width, nor
// on whether x is fp32 or 16-bit widened as it is read (linear_backward's db, and its bf16
// twin). `also(row, at, w)`, when given, sees each block of each row as it is read (row: w values
// at offset `at` of x; gemm_bf16.cpp's narrowed16_colsum narrows them there). Blocks of 64
// columns: at 256, OC = 384 split 256 / 128 between two threads (OC 1152: 3 / 2 blocks).
struct NoAlso {
  template <class T>
  void operator()(const T*, size_t, int) const {}
};
template <class T, class Load, class Also = NoAlso>
inline void column_sums(float* db, const T* x, int N, int OC, bool db_write, Load load,
                        Also also = {}) {
  constexpr int CB = 64;
  const int nblocks = (OC + CB - 1) / CB;
#pragma omp parallel for schedule(static) if ((size_t)N * OC >= (1u << 16))
  for (int blk = 0; blk < nblocks; ++blk) {
    const int c0 = blk * CB, c1 = c0 + CB < OC ? c0 + CB : OC, w0 = c1 - c0;
    float acc[CB];
    for (int c = 0; c < w0; ++c) acc[c] = 0.f;
    for (int n = 0; n < N; ++n) {
      const T* row = x + (size_t)n * OC + c0;
      also(row, (size_t)n * OC + c0, w0);
#pragma omp simd
      for (int c = 0; c < w0; ++c) acc[c] += load(row[c]);
    }
    if (db_write)
      for (int c = 0; c < w0; ++c) db[c0 + c] = acc[c];
    else
      for (int c = 0; c < w0; ++c) db[c0 + c] += acc[c];
  }
}

// core/dtype.h f32_to_bf16, bit for bit (round to nearest even, NaN made quiet), written
// without its early return so that `omp simd` loops vectorise it (a select per lane).
inline uint16_t bf16_round(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}
// The same rounded value as a float (round_to(BF16)'s value of f), for loops that read fp32
// values rounded as they go.
inline float bf16_rounded(float f) {
  return std::bit_cast<float>(static_cast<uint32_t>(bf16_round(f)) << 16);
}

// A 16-bit value of kind K (1 bf16, 2 fp16), as narrow() writes it. K is a template argument:
// a DType tested per element kept every loop that narrows scalar (f32_to_f16 is a call), GELU's
// 16-bit output included (issue 39: 14% of the small bf16 model's step).
template <int K>
inline uint16_t to_kind(float f) {
  static_assert(K == 1 || K == 2, "a 16-bit kind");
  if constexpr (K == 1)
    return bf16_round(f);
  else
    return f32_to_f16(f);
}

// A workspace of at least `floats` floats in b, reallocated only when it must grow: callers
// keep b (thread_local) between calls, since a fresh buffer of tens of MB is mmap'ed and
// page-faulted on every call. Tracked as Mem::Workspace.
inline float* grow_workspace(Buffer& b, size_t floats) {
  if (b.bytes() < floats * sizeof(float)) {
    b.release();
    b = Buffer(floats * sizeof(float), Mem::Workspace);
  }
  return b.f32();
}

// Row-major C = alpha * op(A) @ op(B) + beta * C (op = transpose when the flag is set).
// From inside an OpenMP parallel region OpenBLAS's OpenMP build runs single-threaded.
inline void sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                  const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// gemm_bf16_avx512.cpp (compiled for AVX512-BF16; call only when the CPU has it): row-major
// C = alpha * op(A) @ op(B) + beta * C with A and B rounded to bf16 as they are packed, fp32
// accumulation; OpenMP over the calling team's threads (one thread inside a parallel region).
void gemm_bf16_avx512(bool ta, bool tb, int M, int N, int K, float alpha, const float* A,
                      int lda, const float* B, int ldb, float beta, float* C, int ldc);
// Same contract on AVX-512F/BW without vdpbf16ps (call only where the CPU has those): operands
// rounded to bf16 (f16 = false) or fp16 (f16 = true) while packed as fp32, fp32 FMA kernels.
void gemm_lowp_fma_avx512(bool f16, bool ta, bool tb, int M, int N, int K, float alpha,
                          const float* A, int lda, const float* B, int ldb, float beta, float* C,
                          int ldc);
// The blocking of gemm_bf16_avx512.cpp (the native and fused kernels), shared with the replay
// of their packing buffers (lowp_pack_bytes), which runs on any CPU: each team thread's packed
// A block (kMC rows) and packed B block (its slab's columns up to kNC, in kNR-column panels),
// both kUnitsMax 32-bit words per row or column.
namespace lowp_pack {
inline constexpr int kMR = 6;           // rows of C per microkernel tile
inline constexpr int kNR = 64;          // columns of C per tile
inline constexpr int kUnitsMax = 256;   // words per packed row or column of a K block
inline constexpr int kMC = 144;         // rows per A block (a multiple of kMR)
inline constexpr int kNC = 4096;        // columns per B block (a multiple of kNR)
inline constexpr double kMinWork = 4e6;  // flops below which a product runs on one thread
}  // namespace lowp_pack
// The own bf16 kernels' blocking (gemm_bf16_tn.cpp), shared with the replay of their packing
// buffers (own16_pack_bytes), which runs on any CPU.
namespace own16 {
inline constexpr int kNR = 48;        // columns of C per tile: B is packed in panels this wide
inline constexpr int kKP = 512;       // tn: reduction pairs per block
inline constexpr int kMC = 64;        // tn: rows of C per A block
inline constexpr int kKPn = 1024;     // n16: reduction pairs per block (A read in place)
inline constexpr int kMinRows = 1024;  // n16 outside a ReusePackedB scope: rows of A at least
inline constexpr double kMinWork = 4e6;  // flops below which a product runs on one thread
// A packed B kept in a ReusePackedB scope: at most this many bytes (two slots per thread).
inline constexpr size_t kReuseMaxBytes = size_t{16} << 20;
inline constexpr size_t panels_pad(int N) { return size_t(N + kNR - 1) / kNR * kNR; }
}  // namespace own16
// gemm_bf16_tn.cpp (AVX512-BF16 only): C(fp32, M x N) = alpha * A^T B + beta * C with A
// (K x M) and B (K x N) bf16, row-major with row strides lda / ldb: the weight gradient
// dout^T x on 16-bit operands. Bit-identical across runs and thread counts. db (M floats, may
// be null): also A's column sums, the bias gradient, taken as A is packed (column_sums' bits:
// fp32, rows in order), written (db_write) or added; with alpha 0 nothing is packed, so none.
void gemm_bf16_tn16_avx512(int M, int N, int K, float alpha, const uint16_t* A, int lda,
                           const uint16_t* B, int ldb, float beta, float* C, int ldc,
                           float* db = nullptr, bool db_write = false);
// The same file: C (M x N) = alpha * A op(B) + bias + beta * C with A (M x K) bf16 row-major
// read in place, B bf16 (K x N, or N x K when tb), an optional fp32 bias row, and either an
// fp32 C or a bf16 C16 (beta 0; rounded as f32_to_bf16). Returns false, doing nothing, where
// it does not apply (K, lda odd or A not 4-byte aligned; tb with ldb odd; C16 with K > 2048).
bool gemm_bf16_n16_avx512(bool tb, int M, int N, int K, float alpha, const uint16_t* A, int lda,
                          const uint16_t* B, int ldb, float beta, float* C, int ldc,
                          const float* bias, uint16_t* C16);
// dst(rows, cols), dense bf16 = f32_to_bf16(src(rows, cols; row stride ld)), bit for bit, on
// the calling thread (AVX-512F/BW; call only where the CPU has those).
void to_bf16_rows(uint16_t* dst, const float* src, int rows, int cols, ptrdiff_t ld);
// gemm_onednn.cpp: the same contract as gemm_bf16_avx512 through oneDNN's bf16 matmul
// (operands converted to dense bf16 copies, fp32 output; AVX-512F/BW only). Primitives are
// kept per (shape, transposes, ldc, alpha, beta, threads) for the process.
void gemm_bf16_onednn(bool ta, bool tb, int M, int N, int K, float alpha, const float* A,
                      int lda, const float* B, int ldb, float beta, float* C, int ldc);
// The same with either operand (or both) given in bf16 already (A16 / B16, non-null: read in
// place with lda / ldb, not converted; A / B are then not read and may be null).
void gemm_bf16_onednn(bool ta, bool tb, int M, int N, int K, float alpha, const float* A,
                      const uint16_t* A16, int lda, const float* B, const uint16_t* B16, int ldb,
                      float beta, float* C, int ldc);
// The same with a bias row and/or a bf16 output, in the matmul itself: bias (N fp32 values, may
// be null) gives C = alpha * acc + bias + beta * C, the bits of C first set to the broadcast
// bias and beta = 1; C16 (non-null: C is then null and beta 0) receives the fp32 result rounded
// to bf16 by oneDNN (round to nearest even; an fp32-subnormal result becomes a signed zero, as
// vcvtneps2bf16 rounds: f32_to_bf16 would keep it).
void gemm_bf16_onednn(bool ta, bool tb, int M, int N, int K, float alpha, const float* A,
                      const uint16_t* A16, int lda, const float* B, const uint16_t* B16, int ldb,
                      float beta, float* C, int ldc, const float* bias, uint16_t* C16);
// True where SHARDWISE_LOWP_PATH=onednn (and the CPU has AVX-512): oneDNN for every product.
bool lowp_onednn_forced();
// The bf16 products of the 16-bit ops (the contract of the overload above): where both
// operands are given in bf16, the CPU has AVX512-BF16 and oneDNN is not forced, Shardwise's
// own kernels (gemm_bf16_tn.cpp: op(A) transposed, or A read in place at >= 1024 rows or in a
// ReusePackedB scope; 1.02-1.06x oneDNN 2.7 over the step's shapes, bench/bench_gemm16);
// otherwise, or where they do not apply, oneDNN. The own kernels round a bf16 output exactly as
// f32_to_bf16 (subnormals kept) and give the same bits whatever the thread count.
void gemm_bf16_16(bool ta, bool tb, int M, int N, int K, float alpha, const float* A,
                  const uint16_t* A16, int lda, const float* B, const uint16_t* B16, int ldb,
                  float beta, float* C, int ldc, const float* bias = nullptr,
                  uint16_t* C16 = nullptr);
// The weight gradient C = dout^T x (A16: dout, K x M; B16: x, K x N; C = beta * C + ...) with
// dout's column sums into db (written where db_write, else added) in the same pass, where the
// own kernel runs it (gemm_bf16_16's conditions); false, having done nothing, elsewhere.
bool gemm_bf16_16_dw_db(int M, int N, int K, const uint16_t* A16, int lda, const uint16_t* B16,
                        int ldb, float beta, float* C, int ldc, float* db, bool db_write);
// While one of these lives on a thread, gemm_bf16_16's own A op(B) kernel keeps the packed
// form of the last two B operands it multiplied by (keyed by pointer, tb, N, K, ldb; packed
// forms up to 16 MiB) and packs such a B again only after the scope: for a caller that
// multiplies by the same unchanged matrix several times (the LM head's weight, once per row
// chunk, forward and dx); the kernel then also runs below its row threshold. B must not change
// while the scope lives. Scopes nest.
struct ReusePackedB {
  ReusePackedB();
  ~ReusePackedB();
  ReusePackedB(const ReusePackedB&) = delete;
  ReusePackedB& operator=(const ReusePackedB&) = delete;
};
bool reuse_packed_b(int N, int K);  // one lives on this thread, and a K x N B's form is kept
// Whether gemm_bf16_16 runs the own kernels on this process (AVX512-BF16, oneDNN not forced).
bool own16_kernels();
// Measured flop rate of vdpbf16ps over that of fp32 FMA on this core (~2 where vdpbf16ps has
// the FMA's throughput; ~0.5 on CPUs that run it at a quarter of the FMA's instruction rate).
// Printed with SHARDWISE_LOWP_VERBOSE; the path itself is chosen by vendor (choose_native).
double dpbf16_flop_ratio();

// exp(x) in fp32, branch-free so loops over it vectorise (AVX-512 / AVX2 with -O3).
// Range reduction x = n*ln2 + r, |r| <= ln2/2, then a degree-7 polynomial for e^r (Cephes
// expf coefficients, relative error ~1e-7, i.e. within 1-2 ulp of std::exp). Returns exactly
// 0 for x < -87.3 (including -inf, used for masked scores); saturates near FLT_MAX above
// 88.7; NaN stays NaN.
inline float exp_approx(float x) {
  const float lo = -87.33654f, hi = 88.72283f;
  const float xc = x < lo ? lo : (x > hi ? hi : x);
  // n = round(x / ln2) via the 1.5*2^23 trick (exact for |n| < 2^22).
  const float shifter = 12582912.0f;
  const float t = xc * 1.44269504088896341f + shifter;
  const float n = t - shifter;
  float r = xc - n * 0.693359375f;  // ln2 split in a high part with few mantissa bits ...
  r = r - n * -2.12194440e-4f;      // ... and the low remainder (Cody-Waite)
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^n: n in [-126, 128]; build it in two halves so n = 128 does not overflow the exponent.
  const int32_t ni = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(shifter);
  const int32_t n1 = ni >> 1, n2 = ni - n1;
  const float s1 = std::bit_cast<float>((n1 + 127) << 23);
  const float s2 = std::bit_cast<float>((n2 + 127) << 23);
  const float y = p * s1 * s2;
  return x < lo ? 0.0f : y;
}

}  // namespace sw::cpu::detail

namespace sw::cpu::detail {

// 16 floats; GCC lowers it to one AVX-512 register (or two AVX2 / four SSE registers).
// Unaligned, may alias float.
typedef float V16 __attribute__((vector_size(64), aligned(4), may_alias));
typedef int32_t I16 __attribute__((vector_size(64), aligned(4), may_alias));
inline V16 vload(const float* p) { return *reinterpret_cast<const V16*>(p); }
inline void vstore(float* p, V16 v) { *reinterpret_cast<V16*>(p) = v; }
inline V16 vsplat(float x) { return V16{} + x; }
inline V16 vmax(V16 a, V16 b) { return a > b ? a : b; }
// Horizontal sum / max as a fixed 4-step tree (halves, quarters, ...): deterministic.
inline V16 swap_halves(V16 v, int step) {
#if defined(__clang__)  // no __builtin_shuffle; __builtin_shufflevector takes constant indices
  switch (step) {
    case 8: return __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    case 4: return __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
    case 2: return __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    default: return __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  }
#else
  constexpr I16 s8 = {8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7};
  constexpr I16 s4 = {4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11};
  constexpr I16 s2 = {2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13};
  constexpr I16 s1 = {1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14};
  return __builtin_shuffle(v, step == 8 ? s8 : step == 4 ? s4 : step == 2 ? s2 : s1);
#endif
}
inline float hsum(V16 v) {
  for (int step : {8, 4, 2, 1}) v += swap_halves(v, step);
  return v[0];
}
inline float hmax(V16 v) {
  for (int step : {8, 4, 2, 1}) v = vmax(v, swap_halves(v, step));
  return v[0];
}

// max(x[0:n]), -inf for n = 0, NaN skipped (as a loop of std::max(m, x[i]) gives), 16 lanes at
// a time: an `omp simd reduction(max)` loop on std::max stays scalar in GCC 12 (one vmaxss
// chain: half of the LM head's row pass). A max is exact in any order.
inline float row_max(const float* x, int n) {
  V16 vm = vsplat(-std::numeric_limits<float>::infinity());
  int i = 0;
  for (; i + 16 <= n; i += 16) vm = vmax(vload(x + i), vm);
  float m = hmax(vm);
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// exp_approx on 16 lanes (same formula, same results lane by lane).
inline V16 exp_v16(V16 x) {
  const V16 lo = vsplat(-87.33654f), hi = vsplat(88.72283f);
  V16 xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  const V16 shifter = vsplat(12582912.0f);
  const V16 t = xc * 1.44269504088896341f + shifter;
  const V16 n = t - shifter;
  V16 r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  V16 p = vsplat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const I16 ni = (I16)t - (I16)shifter;
  const I16 n1 = ni >> 1, n2 = ni - n1;
  const V16 s1 = (V16)((n1 + 127) << 23), s2 = (V16)((n2 + 127) << 23);
  const V16 y = p * s1 * s2;
  return x < lo ? V16{} : y;
}

}  // namespace sw::cpu::detail
