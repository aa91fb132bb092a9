// The bf16 products of the 16-bit ops on AVX512-BF16 (cpu_internal.h gemm_bf16_16), both
// operands bf16, fp32 accumulation, two kernels:
//
// gemm_bf16_tn16_avx512, the weight gradient: C(fp32, M x N) = alpha * A^T B + beta * C, A bf16
// (K x M, row stride lda), B bf16 (K x N, row stride ldb). K is the long side here (a step's
// tokens); A is the output gradient dout, B the layer's input x, both row-major as the ops that
// produce them write them. Why a kernel of our own for this case: vdpbf16ps multiplies pairs of
// bf16 along the reduction, so both operands are packed "K-pair interleaved" (word = [row 2p,
// row 2p+1] of one column). With K the row index of both operands that is an interleave of two
// rows: a streaming pass, no transpose. oneDNN (Debian's 2.7) treats the transposed A as a
// strided source and ran this product 10-15% slower than a row-major one (a standalone matmul,
// bench/results/bf16_small_2026-11-29.md).
//
// This file is compiled with -mavx512f -mavx512bw -mavx512vl -mavx512bf16 (kernels/CMakeLists);
// nothing here may run unless cpu_has_avx512_bf16() said yes.
//
// Blocking: B is packed once, by all threads together, in blocks of kKP pairs; threads take
// blocks of kMC rows of C dynamically (or, when N > M, each owns a slab of C's columns) and
// pack their own A block by block. The
// microkernel keeps an 8 x 48 fp32 tile of C in 24 zmm registers over a whole K block: per
// pair it loads 3 vectors of the B panel (L2) and broadcasts 8 words of the A panel (L1).
// Summation order: per C element, pairs in order within a block, blocks in order, whatever
// the thread count: results are bit-identical run to run and across thread counts.
//
// gemm_bf16_n16_avx512, the forward and input-gradient products: C = alpha * A op(B) + bias +
// beta * C (or a bf16 C16), A (M x K) read in place: a row's pairs are its 32-bit words, so A
// needs no packing. B is packed by all threads together (rows interleaved, or 16 x 16 register
// transposes for B^T). Threads take work items (64 rows x a group of panels whose packed B stays
// in L2) dynamically and run them one 8-row tile at a time (its rows stay in L1 across the
// group's panels); the same 8 x 48 tile and epilogue, with the bias and the rounding to bf16 in
// it. Same summation-order guarantee.
#include <immintrin.h>
#include <omp.h>

// GCC 12 warns about the undefined first operand inside its own AVX-512 intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <utility>

#include "kernels/cpu/avx512_pack.h"
#include "kernels/cpu/cpu_internal.h"

namespace sw::cpu::detail {

namespace {

constexpr int kMR = 8;                // rows of C per tile (A words broadcast per pair)
constexpr int kNV = 3;                // zmm vectors per tile row
constexpr int kNR = own16::kNR;       // columns of C per tile
constexpr int kKP = own16::kKP;       // reduction pairs per block (1024 reduction indices)
constexpr int kMC = own16::kMC;       // rows per A block (multiple of kMR)
constexpr int kTailRows = 2 * kMR;    // rows per block or work item at the end of a product
static_assert(kNR == 16 * kNV && kMC % kMR == 0 && kMC % 16 == 0, "the tile and the blocks");

// A packing buffer of `words` 32-bit words in b: grow-only (callers keep b thread_local), tracked
// as Mem::Workspace (cpu_kernels.h own16_pack_bytes replays their sizes for the planner).
inline uint32_t* pack_words(Buffer& b, size_t words) {
  return reinterpret_cast<uint32_t*>(grow_workspace(b, words));
}

// 16 words [lo = r0[c], hi = r1[c]] for c < 16 (lanes >= n zero; r1 null: hi zero).
inline __m512i interleave16(const uint16_t* r0, const uint16_t* r1, __mmask16 m) {
  const __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, r0));
  if (!r1) return lo;
  const __m512i hi = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, r1));
  return _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
}

// Thread t's of nth panels [j0, j1) of C's N columns (whole panels).
std::pair<int, int> panels_of(int t, int nth, int N) {
  const int npan = (N + kNR - 1) / kNR, per = (npan + nth - 1) / nth;
  return {std::min(npan, t * per), std::min(npan, (t + 1) * per)};
}

// Rows [0, M) cut into the spans the threads take dynamically: `rows` rows each, the last
// min(M, 2 x threads x rows) in kTailRows spans, so that the thread done first waits for a
// short one at most (a 64-row block of a weight gradient is ~0.4 ms, the one wait a call).
struct RowSpans {
  int M, rows, head, nhead, count;
  RowSpans(int M_, int rows_, int threads)
      : M(M_), rows(rows_), head(M_ - std::min(M_, 2 * threads * rows_)),
        nhead((head + rows_ - 1) / rows_),
        count(nhead + (M_ - head + kTailRows - 1) / kTailRows) {}
  // Span b's rows [first, second).
  std::pair<int, int> operator[](int b) const {
    if (b < nhead) return {b * rows, std::min(head, (b + 1) * rows)};
    const int r0 = head + (b - nhead) * kTailRows;
    return {r0, std::min(M, r0 + kTailRows)};
  }
};

struct Epilogue {
  float alpha, beta;    // beta applies on the first K block only
  const float* bias;    // added on the first K block (null: none)
  uint16_t* C16;        // bf16 output (one K block only), row stride ldc
};

// The cache lines of `rows` rows of `bytes` bytes each, `ld` bytes apart from p: a tile's
// destination in C, asked for before its products (a C that has left the caches, such as the LM
// head's dw accumulated across its chunks, otherwise costs a demand miss per line after them),
// with the intent to write them (prefetchw: the store then finds each line owned; the LM head's
// dw 1.5-3% faster than a read prefetch, the other products unchanged).
inline void prefetch_rows(const void* p, ptrdiff_t ld, int rows, int bytes) {
  for (int i = 0; i < rows; ++i) {
    const char* row = static_cast<const char*>(p) + i * ld;
    for (int off = 0; off < bytes; off += 64) _mm_prefetch(row + off, _MM_HINT_ET0);
    _mm_prefetch(row + bytes - 1, _MM_HINT_ET0);  // (a row that does not start on a line)
  }
}

// Pairs ahead that the tn kernel's A packing asks for: its rows are a block's 64 columns of
// K rows lda apart (the LM head's dw: 128 bytes every 16 KB), a pattern the hardware
// prefetchers do not follow, so each pair's lines were demand misses. Measured (a block's four
// weight-gradient products and the LM head's dw, in-process A/B, 2 threads): 4 pairs ahead
// 1-8% faster per product, the LM head's dw 4-6%; 2 about as 4; 8 and 16 less.
constexpr int kPackAhead = 4;

// C[0:mr, col:col+nr] of the tile's rows at C / C16 from its accumulators: on the first K
// block alpha * c + bias + beta * C (or its bf16, rounded as f32_to_bf16, into C16); on a
// later one C + alpha * c.
__attribute__((always_inline)) inline void store_tile(__m512 (&c)[kMR][kNV], float* C,
                                                    uint16_t* C16, ptrdiff_t ldc, int mr, int nr,
                                                    int col, const Epilogue& e, bool first) {
  const __m512 va = _mm512_set1_ps(e.alpha), vb = _mm512_set1_ps(e.beta);
  // Constant trip counts, unrolled, with the bounds as guards: every c[i][v] is then a fixed
  // register (variable bounds made GCC keep the tile in a stack array, spilled after the
  // product loop and zeroed there before it: ~4% of the kernel's time).
#pragma GCC unroll 8
  for (int i = 0; i < kMR; ++i) {
    if (i >= mr) continue;
#pragma GCC unroll 3
    for (int v = 0; v < kNV; ++v) {
      if (16 * v >= nr) continue;
      const __mmask16 m = first_n(nr - 16 * v);
      __m512 r = _mm512_mul_ps(va, c[i][v]);
      if (first && e.bias) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(m, e.bias + col + 16 * v));
      if (C16) {  // one K block: first
        _mm512_mask_cvtepi32_storeu_epi16(C16 + i * ldc + col + 16 * v, m,
                                          _mm512_srli_epi32(round_hi(r), 16));
        continue;
      }
      float* dst = C + i * ldc + col + 16 * v;
      if (!first)
        r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(m, dst));
      else if (e.beta != 0.f)
        r = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m, dst), r);
      _mm512_mask_storeu_ps(dst, m, r);
    }
  }
}

// The C tile at C (row stride ldc, rows < mr, columns < nr) from packed panels over kp pairs
// (a: kMR words per pair; b: kNR words per pair), stored as store_tile does.
void ukernel(int kp, const uint32_t* __restrict a, const uint32_t* __restrict b, float* C,
             ptrdiff_t ldc, int mr, int nr, const Epilogue& e, bool first) {
  prefetch_rows(C, ldc * 4, mr, nr * 4);
  __m512 c[kMR][kNV];
  for (int i = 0; i < kMR; ++i)
    for (int v = 0; v < kNV; ++v) c[i][v] = _mm512_setzero_ps();
  dp_panels<kMR, kNV>(c, kp, a, b);
  store_tile(c, C, nullptr, ldc, mr, nr, 0, e, first);
}

}  // namespace

void gemm_bf16_tn16_avx512(int M, int N, int K, float alpha, const uint16_t* A, int lda,
                           const uint16_t* B, int ldb, float beta, float* C, int ldc, float* db,
                           bool db_write) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0 || alpha == 0.f) {  // (db: the sums are taken only where the products run)
    if (db && db_write) std::fill(db, db + M, 0.f);
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        float& c = C[(size_t)i * ldc + j];
        c = beta == 0.f ? 0.f : beta * c;
      }
    return;
  }
  const int Kp = (K + 1) / 2;                      // reduction pairs
  const int nblk = (Kp + kKP - 1) / kKP;           // K blocks
  const int npan = (N + kNR - 1) / kNR;            // B panels
  const size_t Npad = (size_t)npan * kNR;
  static thread_local Buffer bbuf;  // the caller's thread owns the packed B
  uint32_t* Bp = pack_words(bbuf, (size_t)Kp * Npad);
  const int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  const double work = 2.0 * M * N * K;
  const int T = work < own16::kMinWork ? 1 : nt;
  const bool by_rows = M >= N;
#pragma omp parallel num_threads(T) if (T > 1)
  {
    const int t = omp_get_thread_num(), nth = omp_get_num_threads();
    // Pack B: pair P of block kb = P / kKP lies at Bp + kb*kKP*Npad + panel*kNR*kpb + p*kNR.
#pragma omp for schedule(static)
    for (int P = 0; P < Kp; ++P) {
      const int kb = P / kKP, p = P % kKP, kpb = std::min(kKP, Kp - kb * kKP);
      const uint16_t* r0 = B + (size_t)(2 * P) * ldb;
      const uint16_t* r1 = 2 * P + 1 < K ? r0 + ldb : nullptr;
      uint32_t* blk = Bp + (size_t)kb * kKP * Npad + (size_t)p * kNR;
      for (int j = 0; j < npan; ++j) {
        uint32_t* d = blk + (size_t)j * kNR * kpb;
        for (int v = 0; v < kNV; ++v) {
          const int col = j * kNR + 16 * v;
          const __mmask16 m = first_n(N - col);
          _mm512_store_si512(d + 16 * v, interleave16(r0 + col, r1 ? r1 + col : nullptr, m));
        }
      }
    }  // (implicit barrier)
    const Epilogue e{alpha, beta, nullptr, nullptr};
    thread_local Buffer abuf;
    uint32_t* Ap = pack_words(abuf, (size_t)kMC * kKP);
    // C's rows [ic, ic + mc) at panels [j0, j1): A's rows packed block by block, then the tiles.
    // sums (db): also A's column sums over [ic, ic + mc), row by row in order as they are packed
    // (column_sums' order and fp32 adds: the same bits), into db.
    auto rows_block = [&](int ic, int mc, int j0, int j1, bool sums) {
      __m512 cs[kMC / 16];
      for (__m512& v : cs) v = _mm512_setzero_ps();
      const __m512i hi16 = _mm512_set1_epi32(int(0xffff0000u));
      for (int kb = 0; kb < nblk; ++kb) {
        const int kpb = std::min(kKP, Kp - kb * kKP);
        // Pack A rows [ic, ic+mc) over this block: panel q (rows ic + 8q ..) at q*kMR*kpb.
        for (int p = 0; p < kpb; ++p) {
          const int P = kb * kKP + p;
          const uint16_t* r0 = A + (size_t)(2 * P) * lda + ic;
          const uint16_t* r1 = 2 * P + 1 < K ? r0 + lda : nullptr;
          if (2 * (P + kPackAhead) + 1 < K) {  // both rows of pair P + kPackAhead
            const char* q = reinterpret_cast<const char*>(r0 + (size_t)(2 * kPackAhead) * lda);
            for (const char* row : {q, q + (size_t)2 * lda}) {
              for (int off = 0; off < 2 * mc; off += 64) _mm_prefetch(row + off, _MM_HINT_T0);
              _mm_prefetch(row + 2 * mc - 1, _MM_HINT_T0);  // (a row not starting on a line)
            }
          }
          for (int r = 0; r < mc; r += 16) {
            const __m512i w = interleave16(r0 + r, r1 ? r1 + r : nullptr, first_n(mc - r));
            if (sums) {  // row 2P's values, then row 2P + 1's (where there is one)
              __m512& v = cs[r / 16];
              v = _mm512_add_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
              if (r1) v = _mm512_add_ps(v, _mm512_castsi512_ps(_mm512_and_si512(w, hi16)));
            }
            uint32_t* d = Ap + (size_t)(r / kMR) * kMR * kpb + (size_t)p * kMR;
            _mm256_store_si256(reinterpret_cast<__m256i*>(d), _mm512_castsi512_si256(w));
            if (r + kMR < mc)
              _mm256_store_si256(reinterpret_cast<__m256i*>(d + (size_t)kMR * kpb),
                                 _mm512_extracti64x4_epi64(w, 1));
          }
        }
        // Row tiles outer: a tile's A panel (kMR words a pair) stays in L1 across the panels
        // of B, which stream from L2 either way (the LM head's dw 1-3% faster than panels
        // outer, 12% in a slow spell; the block's weight gradients unchanged).
        const uint32_t* bb = Bp + (size_t)kb * kKP * Npad;
        for (int ir = 0; ir < mc; ir += kMR)
          for (int j = j0; j < j1; ++j) {
            const int col = j * kNR, nr = std::min(kNR, N - col);
            ukernel(kpb, Ap + (size_t)(ir / kMR) * kMR * kpb, bb + (size_t)j * kNR * kpb,
                    C + (size_t)(ic + ir) * ldc + col, ldc, std::min(kMR, mc - ir), nr, e,
                    kb == 0);
          }
      }
      if (sums)
        for (int r = 0; r < mc; r += 16) {
          const __mmask16 m = first_n(mc - r);
          float* d = db + ic + r;
          const __m512 v = cs[r / 16];
          _mm512_mask_storeu_ps(d, m, db_write ? v : _mm512_add_ps(_mm512_maskz_loadu_ps(m, d), v));
        }
    };
    if (by_rows) {
      // Row blocks handed out dynamically (a static half each left one thread waiting at the
      // region's end: the two vCPUs do not run at one speed), short ones last (RowSpans). Sums
      // do not depend on the thread or the blocks.
      const RowSpans spans(M, kMC, nth);
#pragma omp for schedule(dynamic, 1) nowait
      for (int b = 0; b < spans.count; ++b) {
        const auto [r0, r1] = spans[b];
        rows_block(r0, r1 - r0, 0, npan, db != nullptr);
      }
    } else {  // this thread's panels, all rows (every thread packs all of A; thread 0 sums)
      const auto [j0, j1] = panels_of(t, nth, N);
      for (int ic = 0; ic < M; ic += kMC)
        rows_block(ic, std::min(kMC, M - ic), j0, j1, db != nullptr && t == 0);
    }
  }
}


namespace {

// A bf16 pair read as one 32-bit word from 16-bit storage (may alias it).
typedef uint32_t __attribute__((may_alias)) Word;

constexpr int kKPn = own16::kKPn;  // pairs per block for A read in place (a whole K up to 2048)
constexpr int kGroupBytes = 512 << 10;  // packed B visited per 8-row tile (half of L2)

// The C tile over kp pairs with A's rows read in place: row i's pair p is the 32-bit word
// a[i][p] (the bf16 pair at A + row*lda + 2*(k0/2 + p)); b: kNR words per pair. Stored at
// columns [col, col + nr) as store_tile does.
void ukernel_direct(int kp, const Word* const* a, const uint32_t* __restrict b, float* C,
                    uint16_t* C16, ptrdiff_t ldc, int mr, int nr, int col, const Epilogue& e,
                    bool first) {
  if (C16)
    prefetch_rows(C16 + col, ldc * 2, mr, nr * 2);
  else
    prefetch_rows(C + col, ldc * 4, mr, nr * 4);
  __m512 c[kMR][kNV];
  for (int i = 0; i < kMR; ++i)
    for (int v = 0; v < kNV; ++v) c[i][v] = _mm512_setzero_ps();
  const Word *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3], *a4 = a[4], *a5 = a[5],
             *a6 = a[6], *a7 = a[7];
  for (int p = 0; p < kp; ++p) {
    __m512bh bv[kNV];
    for (int v = 0; v < kNV; ++v) bv[v] = (__m512bh)_mm512_load_si512(b + 16 * v);
    const uint32_t w[kMR] = {a0[p], a1[p], a2[p], a3[p], a4[p], a5[p], a6[p], a7[p]};
    for (int i = 0; i < kMR; ++i) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32((int)w[i]);
      for (int v = 0; v < kNV; ++v) c[i][v] = _mm512_dpbf16_ps(c[i][v], av, bv[v]);
    }
    b += kNR;
  }
  store_tile(c, C, C16, ldc, mr, nr, col, e, first);
}

}  // namespace

namespace {

// The packed B of gemm_bf16_n16_avx512: one buffer per thread outside a ReusePackedB scope;
// inside one, the last two B operands' packed forms, kept while the scope lives.
thread_local int g_reuse_depth = 0;
// A B whose packed form is larger is not kept (packed per call, as outside a scope): two slots
// of at most this per thread, tracked like the per-call buffer (the small model's LM head: 6.3
// MB each; GPT-2's, 77 MB, is not kept and its chunks run oneDNN).
constexpr size_t kReuseMaxBytes = own16::kReuseMaxBytes;
struct PackedB {
  Buffer buf;
  const uint16_t* B = nullptr;
  bool tb = false;
  int N = 0, K = 0, ldb = 0;
  unsigned long use = 0;  // last use (least recently used slot is refilled)
};
thread_local PackedB g_packed[2];
thread_local unsigned long g_uses = 0;

// The buffer for B's packed form (words), and whether it holds that form already.
uint32_t* packed_b_slot(const uint16_t* B, bool tb, int N, int K, int ldb, size_t words,
                        bool* packed) {
  *packed = false;
  if (g_reuse_depth == 0 || !reuse_packed_b(N, K)) {
    g_packed[0].B = nullptr;
    return pack_words(g_packed[0].buf, words);
  }
  for (PackedB& s : g_packed)
    if (s.B == B && s.tb == tb && s.N == N && s.K == K && s.ldb == ldb) {
      s.use = ++g_uses;
      *packed = true;
      return pack_words(s.buf, words);
    }
  PackedB& s = g_packed[0].use <= g_packed[1].use ? g_packed[0] : g_packed[1];
  s.B = B, s.tb = tb, s.N = N, s.K = K, s.ldb = ldb, s.use = ++g_uses;
  return pack_words(s.buf, words);
}

}  // namespace

ReusePackedB::ReusePackedB() { ++g_reuse_depth; }
ReusePackedB::~ReusePackedB() {
  if (--g_reuse_depth == 0)
    for (PackedB& s : g_packed) s.B = nullptr;
}
bool reuse_packed_b(int N, int K) {
  const size_t bytes = size_t((K + 1) / 2) * size_t((N + kNR - 1) / kNR * kNR) * 4;
  return g_reuse_depth > 0 && bytes <= kReuseMaxBytes;
}

bool gemm_bf16_n16_avx512(bool tb, int M, int N, int K, float alpha, const uint16_t* A, int lda,
                          const uint16_t* B, int ldb, float beta, float* C, int ldc,
                          const float* bias, uint16_t* C16) {
  if (M <= 0 || N <= 0) return true;
  // A's rows are read as 32-bit pairs in place: K and lda even, A 4-byte aligned.
  if (K <= 0 || (K & 1) || (lda & 1) || (reinterpret_cast<uintptr_t>(A) & 3)) return false;
  if (tb && ((ldb & 1) || (reinterpret_cast<uintptr_t>(B) & 3))) return false;
  const int Kp = K / 2, nblk = (Kp + kKPn - 1) / kKPn;
  if (C16 && nblk > 1) return false;  // a bf16 output is written once
  const int npan = (N + kNR - 1) / kNR;
  const size_t Npad = (size_t)npan * kNR;
  bool packed = false;  // B found packed already (a ReusePackedB scope)
  uint32_t* Bp = packed_b_slot(B, tb, N, K, ldb, (size_t)Kp * Npad, &packed);
  const int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  const int T = 2.0 * M * N * K < own16::kMinWork ? 1 : nt;
  const Epilogue e{alpha, beta, bias, C16};
  const Word* Aw = reinterpret_cast<const Word*>(A);
  const ptrdiff_t ldaw = lda / 2;
#pragma omp parallel num_threads(T) if (T > 1)
  {
    // Pack B: pair P of block kb at Bp + kb*kKPn*Npad + panel*kNR*kpb + p*kNR.
    // (Nothing to pack where `packed`: kept from an earlier call in a ReusePackedB scope.)
    if (!packed && tb) {  // B(k, n) = B[n*ldb + k]: the pair is one 32-bit word of row n
      // 16 rows x 16 pairs at a time, transposed in registers; one panel's rows per thread
      // at a time (kKPn is a multiple of 16: a run of 16 pairs lies in one block).
      const Word* Bw = reinterpret_cast<const Word*>(B);
      const ptrdiff_t ldbw = ldb / 2;
#pragma omp for schedule(static)
      for (int j = 0; j < npan; ++j)
        for (int v = 0; v < kNV; ++v) {
          const int n0 = j * kNR + 16 * v, rows = std::clamp(N - n0, 0, 16);
          for (int P0 = 0; P0 < Kp; P0 += 16) {
            const int kb = P0 / kKPn, p0 = P0 % kKPn, kpb = std::min(kKPn, Kp - kb * kKPn);
            const int np = std::min(16, Kp - P0);
            const __mmask16 m = first_n(np);
            __m512i r[16];
            for (int l = 0; l < 16; ++l)
              r[l] = l < rows ? _mm512_maskz_loadu_epi32(m, Bw + (size_t)(n0 + l) * ldbw + P0)
                              : _mm512_setzero_si512();
            transpose16(r);
            uint32_t* d = Bp + (size_t)kb * kKPn * Npad + (size_t)j * kNR * kpb + 16 * v;
            for (int q = 0; q < np; ++q) _mm512_store_si512(d + (size_t)(p0 + q) * kNR, r[q]);
          }
        }
    } else if (!packed) {  // B(k, n) = B[k*ldb + n]: two rows interleaved
#pragma omp for schedule(static)
      for (int P = 0; P < Kp; ++P) {
        const int kb = P / kKPn, p = P % kKPn, kpb = std::min(kKPn, Kp - kb * kKPn);
        const uint16_t* r0 = B + (size_t)(2 * P) * ldb;
        uint32_t* blk = Bp + (size_t)kb * kKPn * Npad + (size_t)p * kNR;
        for (int j = 0; j < npan; ++j)
          for (int v = 0; v < kNV; ++v) {
            const int col = j * kNR + 16 * v;
            _mm512_store_si512(blk + (size_t)j * kNR * kpb + 16 * v,
                               interleave16(r0 + col, r0 + ldb + col, first_n(N - col)));
          }
      }
    }  // (implicit barrier)
    // Panels in groups whose packed B (one K block) stays in L2 while every 8-row tile of an
    // item passes over it; a tile's A rows stay in L1 across the group's panels.
    const int group = std::max(1, kGroupBytes / (std::min(kKPn, Kp) * kNR * 4));
    // Work items (a panel group x kRowsItem rows, group-major) handed out dynamically: a static
    // half each left one thread waiting for the other at the region's end for ~4% of the
    // kernel's time in the small model's step (the two vCPUs do not run at one speed). Which
    // thread computes a tile does not change its sums.
    // The last group's rows in RowSpans (short items last), the others' in kRowsItem rows.
    constexpr int kRowsItem = 8 * kMR;
    const int ngroups = (npan + group - 1) / group, nrow_items = (M + kRowsItem - 1) / kRowsItem;
    const RowSpans last(M, kRowsItem, omp_get_num_threads());
    const int before = (ngroups - 1) * nrow_items;  // the other groups' items
#pragma omp for schedule(dynamic, 1) nowait
    for (int item = 0; item < before + last.count; ++item) {
      const int jg = (item < before ? item / nrow_items : ngroups - 1) * group;
      const int r = item % nrow_items * kRowsItem;
      const auto [m0, m1] = item < before ? std::pair<int, int>{r, std::min(M, r + kRowsItem)}
                                          : last[item - before];
      const int jend = std::min(npan, jg + group);
      for (int ir = m0; ir < m1; ir += kMR) {  // one 8-row tile
        const int mr = std::min(kMR, m1 - ir);
        for (int kb = 0; kb < nblk; ++kb) {
          const int kpb = std::min(kKPn, Kp - kb * kKPn);
          const uint32_t* bb = Bp + (size_t)kb * kKPn * Npad;
          const Word* ar[kMR];
          for (int i = 0; i < kMR; ++i)  // rows past the tile's end repeat its last row
            ar[i] = Aw + (size_t)(ir + std::min(i, mr - 1)) * ldaw + (size_t)kb * kKPn;
          const size_t row = (size_t)ir * ldc;
          for (int j = jg; j < jend; ++j)
            ukernel_direct(kpb, ar, bb + (size_t)j * kNR * kpb, C ? C + row : nullptr,
                           C16 ? C16 + row : nullptr, ldc, mr, std::min(kNR, N - j * kNR),
                           j * kNR, e, kb == 0);
        }
      }
    }
  }
  return true;
}

}  // namespace sw::cpu::detail
