// Causal self-attention with grouped-query heads, FlashAttention-style on the CPU.
//
// qkv: (B, T, R) with R = (H + 2*KVH) * hd, each row laid out [q heads | k heads | v heads];
// query head h reads kv head g = h / (H / KVH). out: (B, T, H*hd). lse: (B, H, T).
//
// Forward: one task per (b, h, query tile of kFwdBQ rows) (on the native bf16 path one per
// (b, h), its keys packed once for its query tiles). Keys are visited in tiles of kFwdBK
// columns up to the tile's last row (tiles wholly above the diagonal are skipped) with an
// online softmax (running max m, running sum l, output rescaled when m grows), so a thread
// holds one kFwdBQ x kFwdBK score tile, never a (T, T) matrix. Tasks are independent, so any
// schedule gives the same bits.
//
// Backward: one task per (b, h). D = rowsum(dout * out) first; then for each key tile j, for
// each query tile i that can see it: S = Q_i K_j^T, P = exp(scale S - lse_i) (causal mask),
// dV_j += P^T dO_i, dP = dO_i V_j^T, dS = scale * P * (dP - D_i), dQ_i += dS K_j,
// dK_j += dS^T Q_i. dQ rows of head h belong to this task only. With MHA the task also owns
// its dK/dV columns and accumulates straight into dqkv; with GQA several query heads share a
// kv head, so each task writes its partial dK/dV into a per-(b,h) scratch, and a second pass
// adds the partials into dqkv in fixed head order (no races, bit-identical reruns).
//
// Tile products use the register-blocked microkernel below rather than sgemm: at hd = 64 the
// tiles are too small for OpenBLAS (packing and call overhead: ~35% of its large-GEMM rate in
// our measurements, against ~45-60% for the whole kernel here, softmax included), and a
// hand-written loop can skip the masked half of the diagonal tiles at 6-row x 16-column
// granularity. K (and in the backward V) tiles are transposed once per key tile (hd x keys) so
// every product has the form "broadcast a scalar, FMA a 16-float row". The backward also copies
// Q, dO (per head) and the K tile into buffers with padded rows and accumulates dQ, dK, dV
// locally: qkv's row stride (e.g. 2304 floats) maps consecutive rows to a few L1 sets, which
// costs the microkernel up to 40% when it streams such rows many times; the forward streams
// them once or twice and measured no gain from copying.
//
// BF16 compute on a CPU with AVX512-BF16 (attention_bf16_native()) runs every tile product on
// vdpbf16ps instead (the *_dp functions, compiled for that ISA by target attributes): bf16
// pairs along the reduction index, fp32 accumulation. A operands whose reduction index is
// contiguous (Q, dO rows: bf16 copies; P, dS: rounded as the softmax forms them) are read as
// 32-bit pair words and broadcast; B operands are packed pair-interleaved (per reduction pair,
// 16 columns x 2 bf16 = one zmm): K^T, V^T by a 32-bit transpose of the bf16 rows, V, K, dO,
// Q by interleaving row pairs; P^T, dS^T as A operands are that row-pair interleave read with
// sa = 1, sk = ld. Odd lengths and causal bounds round to whole pairs whose extra term is an
// exact zero (a masked P / dS or zero padding). 16-bit qkv / out / dout are read in place
// (fp32 ones rounded once, f32_to_bf16 bit for bit); softmax, lse, D and the accumulators
// stay fp32; the output and (MHA) dqkv can be written 16-bit straight from the fp32 tiles
// (attention_bf16_writes16: narrow()'s bits, no fp32 copy); fp32, fp16 and other CPUs take
// the FMA path. Same task split: results are
// bit-identical run to run and for any thread count (test_bf16 checks 1 vs 2 threads).
// Measured (bench_kernels_b --bf16-attention, B 8, T 256, H 6, hd 64, Zen 5): the products
// take ~1/2.1 of the FMA microkernel's time (perf samples); the whole kernel runs ~1.5x
// faster on one core (CPU time; ~2.3x forward, ~1.7x backward on two, wall); softmax, packing
// and the memory passes (D, dqkv) are now more than half of its time.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <utility>
#include <vector>

#include "core/alloc.h"
#include "core/error.h"
#include "kernels/cpu/attention_bf16.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/cpu_kernels.h"

// GCC 12 warns about the undefined first operand inside its own AVX-512 shift intrinsics.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace sw::cpu {

namespace {

constexpr int kFwdBQ = 64;   // forward query rows per task
constexpr int kFwdBK = 256;  // forward key columns per score tile
constexpr int kBwdBQ = 64;   // backward query tile
constexpr int kBwdBK = 64;   // backward key tile

using detail::exp_approx;

// ---- Microkernel --------------------------------------------------------------------------
using detail::exp_v16;
using detail::hmax;
using detail::hsum;
using detail::I16;
using detail::V16;
using detail::vload;
using detail::vmax;
using detail::vsplat;
using detail::vstore;

constexpr int kMR = 6;  // rows per register block (6 rows x 4 vectors = 24 accumulators)

// C(i, 0:16*NV) (+)= sum_{k<K} A[i*sa + k*sk] * B[k*ldb + 0:16*NV], for i < MR.
template <int MR, int NV>
inline void ukernel(int K, const float* A, ptrdiff_t sa, ptrdiff_t sk, const float* B,
                    ptrdiff_t ldb, float* C, ptrdiff_t ldc, bool acc) {
  V16 c[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) c[i][v] = V16{};
  for (int k = 0; k < K; ++k) {
    V16 b[NV];
    for (int v = 0; v < NV; ++v) b[v] = vload(B + k * ldb + 16 * v);
    for (int i = 0; i < MR; ++i) {
      const float a = A[i * sa + k * sk];
      for (int v = 0; v < NV; ++v) c[i][v] += a * b[v];
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) {
      float* p = C + i * ldc + 16 * v;
      vstore(p, acc ? vload(p) + c[i][v] : c[i][v]);
    }
}

template <int MR>
inline void ukernel_nv(int nv, int K, const float* A, ptrdiff_t sa, ptrdiff_t sk, const float* B,
                       ptrdiff_t ldb, float* C, ptrdiff_t ldc, bool acc) {
  switch (nv) {
    case 4: ukernel<MR, 4>(K, A, sa, sk, B, ldb, C, ldc, acc); break;
    case 3: ukernel<MR, 3>(K, A, sa, sk, B, ldb, C, ldc, acc); break;
    case 2: ukernel<MR, 2>(K, A, sa, sk, B, ldb, C, ldc, acc); break;
    default: ukernel<MR, 1>(K, A, sa, sk, B, ldb, C, ldc, acc); break;
  }
}

inline void ukernel_dispatch(int mr, int nv, int K, const float* A, ptrdiff_t sa, ptrdiff_t sk,
                             const float* B, ptrdiff_t ldb, float* C, ptrdiff_t ldc, bool acc) {
  switch (mr) {
    case 6: ukernel_nv<6>(nv, K, A, sa, sk, B, ldb, C, ldc, acc); break;
    case 5: ukernel_nv<5>(nv, K, A, sa, sk, B, ldb, C, ldc, acc); break;
    case 4: ukernel_nv<4>(nv, K, A, sa, sk, B, ldb, C, ldc, acc); break;
    case 3: ukernel_nv<3>(nv, K, A, sa, sk, B, ldb, C, ldc, acc); break;
    case 2: ukernel_nv<2>(nv, K, A, sa, sk, B, ldb, C, ldc, acc); break;
    default: ukernel_nv<1>(nv, K, A, sa, sk, B, ldb, C, ldc, acc); break;
  }
}

// Which part of a causal tile a product needs, for a row block [i, i+mr) of the output:
//   kAll:      everything;
//   kColsUpTo: output columns < i + mr + d (score tiles: key c visible from row r iff c <= r + d);
//   kKUpTo:    reduction index k < i + mr + d (P V, dS K: keys beyond the row are masked);
//   kKFrom:    k >= i - d (P^T dO, dS^T Q: query rows before the key are masked).
// Columns not computed are left untouched; masked terms that are computed are exact zeros.
enum class Causal { kAll, kColsUpTo, kKUpTo, kKFrom };

// C(M, W) (+)= sum_k A(i, k) B(k, 0:W) with A(i, k) = A[i*sa + k*sk]. The last W % 16 columns
// (only when hd is not a multiple of 16) use a scalar loop.
void mm(int M, int W, int K, const float* A, ptrdiff_t sa, ptrdiff_t sk, const float* B,
        ptrdiff_t ldb, float* C, ptrdiff_t ldc, bool acc, Causal cz = Causal::kAll, int d = 0) {
  const int W16 = W / 16 * 16;
  for (int j = 0; j < W; j += 64) {
    for (int i = 0; i < M; i += kMR) {
      const int mr = std::min(kMR, M - i);
      int k0 = 0, k1 = K, w1 = std::min(W, j + 64);
      if (cz == Causal::kColsUpTo) w1 = std::min(w1, i + mr + d);
      if (cz == Causal::kKUpTo) k1 = std::clamp(i + mr + d, 0, K);
      if (cz == Causal::kKFrom) k0 = std::clamp(i - d, 0, K);
      if (w1 <= j) continue;
      const float* a = A + i * sa + k0 * sk;
      const float* b = B + (ptrdiff_t)k0 * ldb;
      float* c = C + i * ldc;
      const int wv = std::min(w1, W16);  // vector part [j, wv), rounded up within W16
      if (wv > j)
        ukernel_dispatch(mr, (wv - j + 15) / 16, k1 - k0, a, sa, sk, b + j, ldb, c + j, ldc, acc);
      for (int col = std::max(j, W16); col < w1; ++col)
        for (int r = 0; r < mr; ++r) {
          float s = 0.f;
          for (int k = 0; k < k1 - k0; ++k) s += a[r * sa + k * sk] * b[(ptrdiff_t)k * ldb + col];
          c[r * ldc + col] = acc ? c[r * ldc + col] + s : s;
        }
    }
  }
}

#if defined(__clang__)
// clang (the fuzz build) has no __builtin_shuffle: the same two shuffles with constant indices.
template <int b, int... c>
inline void transpose_pair(V16& x, V16& y, std::integer_sequence<int, c...>) {
  const V16 u = x, w = y;
  x = __builtin_shufflevector(u, w, ((c & b) == 0 ? c : 16 + c - b)...);
  y = __builtin_shufflevector(u, w, ((c & b) == 0 ? c + b : 16 + c)...);
}
#endif

// One stage of a 16x16 in-register transpose: swaps the off-diagonal b x b blocks of each
// 2b x 2b block (rows i and i + b exchange their halves). Stages b = 8, 4, 2, 1 transpose.
template <int b>
inline void transpose_stage(V16* r) {
// clang-format off
#define SW_LO(c) (((c) & b) == 0 ? (c) : 16 + (c) - b)
#define SW_HI(c) (((c) & b) == 0 ? (c) + b : 16 + (c))
  // clang-format on
  constexpr I16 lo = {SW_LO(0),  SW_LO(1),  SW_LO(2),  SW_LO(3), SW_LO(4),  SW_LO(5),
                      SW_LO(6),  SW_LO(7),  SW_LO(8),  SW_LO(9), SW_LO(10), SW_LO(11),
                      SW_LO(12), SW_LO(13), SW_LO(14), SW_LO(15)};
  constexpr I16 hi = {SW_HI(0),  SW_HI(1),  SW_HI(2),  SW_HI(3), SW_HI(4),  SW_HI(5),
                      SW_HI(6),  SW_HI(7),  SW_HI(8),  SW_HI(9), SW_HI(10), SW_HI(11),
                      SW_HI(12), SW_HI(13), SW_HI(14), SW_HI(15)};
#undef SW_LO
#undef SW_HI
  for (int i = 0; i < 16; ++i)
    if ((i & b) == 0) {
#if defined(__clang__)
      (void)lo, (void)hi;
      transpose_pair<b>(r[i], r[i + b], std::make_integer_sequence<int, 16>{});
#else
      const V16 x = r[i], y = r[i + b];
      r[i] = __builtin_shuffle(x, y, lo);
      r[i + b] = __builtin_shuffle(x, y, hi);
#endif
    }
}

// dst(hd, ldd) = src(n, hd; row stride lds)^T with columns n..round16(n)-1 zeroed. 16x16
// blocks in registers; the edges (n or hd not multiples of 16) element by element.
void pack_transposed(float* dst, int ldd, const float* src, ptrdiff_t lds, int n, int hd) {
  const int n16 = n / 16 * 16, hd16 = hd / 16 * 16;
  for (int j = 0; j < n16; j += 16) {
    for (int c = 0; c < hd16; c += 16) {
      V16 r[16];
      for (int i = 0; i < 16; ++i) r[i] = vload(src + (j + i) * lds + c);
      transpose_stage<8>(r);
      transpose_stage<4>(r);
      transpose_stage<2>(r);
      transpose_stage<1>(r);
      for (int i = 0; i < 16; ++i) vstore(dst + (ptrdiff_t)(c + i) * ldd + j, r[i]);
    }
    for (int c = hd16; c < hd; ++c)
      for (int i = j; i < j + 16; ++i) dst[(ptrdiff_t)c * ldd + i] = src[i * lds + c];
  }
  for (int c = 0; c < hd; ++c) {
    float* d = dst + (ptrdiff_t)c * ldd;
    for (int j = n16; j < n; ++j) d[j] = src[j * lds + c];
    for (int j = n; j < (n + 15) / 16 * 16; ++j) d[j] = 0.f;
  }
}

// dst(n, ldd) = src(n, hd; row stride lds), columns hd..round16(hd)-1 zeroed.
void pack_rows(float* dst, int ldd, const float* src, ptrdiff_t lds, int n, int hd) {
  const int hd16 = (hd + 15) / 16 * 16;
  for (int i = 0; i < n; ++i) {
    float* d = dst + (ptrdiff_t)i * ldd;
    std::memcpy(d, src + i * lds, sizeof(float) * hd);
    for (int c = hd; c < hd16; ++c) d[c] = 0.f;
  }
}

inline int round16(int n) { return (n + 15) / 16 * 16; }

// Leading dimension for a packed buffer of rows n floats wide: a multiple of 16 floats that
// is an odd number of 64-byte lines, so consecutive rows fall in different L1 sets. (qkv's own
// row stride, e.g. 2304 floats, maps every row to the same few sets and halves the kernel's
// speed; that is why operands are packed at all.)
inline int padded_ld(int n) {
  const int n16 = round16(n);
  return (n16 / 16) % 2 == 0 ? n16 + 16 : n16;
}

// The forward's online softmax over one score tile S (nq x ldp, unscaled Q K^T; key c visible
// from row r iff c <= r + d): S becomes P = exp(scale S - m_new) with exact zeros in the masked
// and padding columns, the running max m and sum l are updated, and rows of O (ldo, hd wide)
// are rescaled where m grew (rescale: earlier key tiles accumulated into O). P is rounded to
// round_t (BF16 / F16: the operand of P V; F32: left as is).
inline void softmax_tile(float* S, int ldp, int nq, int nk, int d, bool rescale, float scale,
                         float* m, float* l, float* O, ptrdiff_t ldo, int hd, DType round_t) {
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int r = 0; r < nq; ++r) {
    float* row = S + (size_t)r * ldp;
    const int nv = std::clamp(r + d + 1, 0, nk);  // keys j <= i are visible
    const int nv16 = round16(nv);
    for (int c = nv16; c < ldp; c += 16) vstore(row + c, V16{});
    if (nv == 0) continue;
    // Masked columns up to the next multiple of 16 become -inf, so exp gives exact zeros
    // and every loop below runs on whole vectors.
    for (int c = nv; c < nv16; ++c) row[c] = ninf;
    V16 vm = vsplat(ninf);
    for (int c = 0; c < nv16; c += 16) vm = vmax(vm, vload(row + c));
    const float mnew = std::max(m[r], hmax(vm) * scale);
    V16 vs{};
    for (int c = 0; c < nv16; c += 16) {
      const V16 p = exp_v16(vload(row + c) * scale - mnew);
      vstore(row + c, p);
      vs += p;
    }
    const float sum = hsum(vs);
    if (rescale && mnew > m[r]) {  // rescale what earlier key tiles accumulated
      const float alpha = exp_approx(m[r] - mnew);
      float* o = O + (size_t)r * ldo;
      for (int c = 0; c < hd; ++c) o[c] *= alpha;
      l[r] *= alpha;
    }
    l[r] += sum;
    m[r] = mnew;
    if (round_t != DType::F32) round_to(round_t, row, row, nv16);  // P's operand for P V
  }
}

// The backward's P and dS for one (query tile, key tile) pair: P (nq x ldk) holds Q K^T and
// dS dO V^T on entry (unscaled; key c visible from row r iff c <= r + d); on return
// P = exp(scale S - lse) and dS = scale * P * (dP - D), exact zeros where masked, up to nk16
// columns. Both rounded to round_t unless F32 (the products' operands; dS formed from fp32 P).
inline void p_ds_tile(float* P, float* dS, int ldk, int nq, int nk, int d, float scale,
                      const float* L, const float* D, DType round_t) {
  const float ninf = -std::numeric_limits<float>::infinity();
  const int nk16 = round16(nk);
  for (int r = 0; r < nq; ++r) {
    float* p = P + (size_t)r * ldk;
    float* ds = dS + (size_t)r * ldk;
    const int nv = std::clamp(r + d + 1, 0, nk), nv16 = round16(nv);
    const float li = L[r], di = D[r];
    // As in the forward: -inf up to the vector boundary gives P = 0 and dS = 0 there
    // (dP is finite in those columns: the product covered them).
    for (int c = nv; c < nv16; ++c) p[c] = ninf;
    for (int c = 0; c < nv16; c += 16) {
      const V16 pv = exp_v16(vload(p + c) * scale - li);
      vstore(p + c, pv);
      vstore(ds + c, scale * pv * (vload(ds + c) - di));
    }
    for (int c = nv16; c < nk16; c += 16) vstore(p + c, V16{}), vstore(ds + c, V16{});
    if (round_t != DType::F32) {
      round_to(round_t, p, p, nv16);
      round_to(round_t, ds, ds, nv16);
    }
  }
}

// Reduced-precision compute: qkv rounded to bf16 / fp16 once per call (Q, K and V are operands
// of every tile product) into a per-thread workspace kept between calls (a fresh buffer of this
// size would be page-faulted on every call); P, dS and dO are rounded where they are formed.
// qkv rounded to t, or (qkv16) t's 16-bit values widened: the same floats either way.
const float* rounded_qkv(DType t, const float* qkv, size_t n, const uint16_t* qkv16 = nullptr) {
  thread_local Buffer buf;
  float* r = detail::grow_workspace(buf, n);
  if (qkv16)
    widen(t, qkv16, r, n);
  else
    round_to(t, r, qkv, n);
  return r;
}
// The output and its gradient widened from 16 bits (attention_backward's out16, dout16), each
// in a thread-local buffer of its own (slot 0, 1).
const float* widened_out(DType t, const uint16_t* out16, size_t n, int slot = 0) {
  thread_local Buffer buf[2];
  float* r = detail::grow_workspace(buf[slot], n);
  widen(t, out16, r, n);
  return r;
}

// Per-thread tile scratch of the parallel regions below: a tracked Mem::Workspace buffer per
// OpenMP thread, grown once and kept between calls (no allocation in the steady state).
// Zeroed on every call, as the std::vectors it replaced were, so nothing read from padding
// changes. carve() hands out 64-byte-aligned slices of it.
struct TileScratch {
  float* base;
  size_t at = 0;
  float* carve(size_t floats) {
    float* p = base + at;
    at += (floats + 15) / 16 * 16;
    return p;
  }
};
float* tile_workspace(size_t floats) {
  thread_local Buffer buf;
  float* p = detail::grow_workspace(buf, floats);
  std::memset(p, 0, floats * sizeof(float));
  return p;
}
size_t tile_floats(std::initializer_list<size_t> sizes) {
  size_t n = 0;
  for (size_t s : sizes) n += (s + 15) / 16 * 16;
  return n;
}

// The forward's tile: one score tile and the key tile transposed.
size_t fwd_tile_floats(int hd) {
  return tile_floats({(size_t)kFwdBQ * kFwdBK, (size_t)hd * kFwdBK});
}
// The backward's: Q, dO and the dQ accumulator of one head (T rows each), the current key
// tile transposed (K^T, V^T) and as rows (K), its dK/dV accumulators, two score tiles, a row.
size_t bwd_tile_floats(int T, int hd) {
  const size_t ldh = (size_t)padded_ld(hd), ldk = (size_t)padded_ld(kBwdBK);
  const size_t nT = (size_t)T * ldh, nK = (size_t)hd * ldk, nB = (size_t)kBwdBK * ldh,
               nP = (size_t)kBwdBQ * ldk;
  return tile_floats({nT, nT, nT, nK, nK, nB, nB, nB, nP, nP, (size_t)T});
}

// n rows of hd values from src (row stride lds) into dst (row stride ldd): copied, written
// (0 + x: the bits += gives on zeros) or added.
enum class Store { Copy, Set, Add };
inline void store_rows(float* dst, ptrdiff_t ldd, const float* src, ptrdiff_t lds, int n, int hd,
                       Store how) {
  for (int j = 0; j < n; ++j) {
    const float* s = src + j * lds;
    float* t = dst + j * ldd;
    if (how == Store::Copy) {
      std::memcpy(t, s, sizeof(float) * hd);
    } else if (how == Store::Set) {
#pragma omp simd
      for (int c = 0; c < hd; ++c) t[c] = 0.f + s[c];
    } else {
#pragma omp simd
      for (int c = 0; c < hd; ++c) t[c] += s[c];
    }
  }
}

// The same written 16-bit (Store::Set's values narrowed to bf16: narrow() of what the fp32 store
// would hold).
inline void store_rows_bf16(uint16_t* dst, ptrdiff_t ldd, const float* src, ptrdiff_t lds, int n,
                            int hd) {
  for (int j = 0; j < n; ++j) {
    const float* s = src + j * lds;
    uint16_t* t = dst + j * ldd;
#pragma omp simd
    for (int c = 0; c < hd; ++c) t[c] = detail::bf16_round(0.f + s[c]);
  }
}

// Grouped attention's second backward pass (call inside a parallel region; an omp for):
// dK/dV of kv head g (=)+= the partials of its query heads, in head order.
void add_gqa_partials(float* dqkv, const float* part, int B, int T, int H, int KVH, int hd,
                      bool set) {
  const int R = (H + 2 * KVH) * hd, rep = H / KVH;
#pragma omp for schedule(static)
  for (int bt = 0; bt < B * T; ++bt) {
    const int b = bt / T, t = bt % T;
    float* row = dqkv + (size_t)bt * R;
    for (int g = 0; g < KVH; ++g) {
      float* dk = row + (size_t)(H + g) * hd;
      float* dv = row + (size_t)(H + KVH + g) * hd;
      if (set) std::fill(dk, dk + hd, 0.f), std::fill(dv, dv + hd, 0.f);
      for (int hh = g * rep; hh < (g + 1) * rep; ++hh) {
        const float* pk = part + ((size_t)(b * H + hh) * 2 * T + t) * hd;
        const float* pv = pk + (size_t)T * hd;
#pragma omp simd
        for (int c = 0; c < hd; ++c) dk[c] += pk[c], dv[c] += pv[c];
      }
    }
  }
}

// ---- Native bf16 path: AVX512-BF16 (vdpbf16ps) tile products ------------------------------
// The intrinsic code (SW_DPBF16: the microkernel, packing, rounding stores) is compiled for
// that ISA by target attributes whatever -march says and runs only where cpu_has_avx512_bf16()
// (attention_bf16_native()); it takes and returns no vectors by value, so the plain code around
// it (tasks, softmax: V16 code as in the FMA path) calls it across the attribute.
#define SW_DPBF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

bool g_native_allowed = true;  // set_attention_bf16_native (tests force the FMA path)

SW_DPBF16 inline __m512i splat32(uint32_t x) { return _mm512_set1_epi32((int)x); }
SW_DPBF16 inline __mmask16 first_n(int n) {
  return n >= 16 ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}
// fp32 -> bf16 rounded to nearest even (f32_to_bf16's arithmetic: subnormals kept, NaN made
// quiet), the bf16 in the high half of each 32-bit lane.
SW_DPBF16 inline __m512i bf16_hi(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), splat32(1));
  const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, splat32(0x7fff)));
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, splat32(0x7fffffffu)), splat32(0x7f800000u));
  return _mm512_mask_or_epi32(r, nan, u, splat32(0x00400000u));
}
// 32 consecutive fp32 (x[0:16], x[16:32]) -> 16 words [bf16(x[2q]) | bf16(x[2q+1]) << 16].
SW_DPBF16 inline __m512i pairs_along(__m512 lo, __m512 hi) {
  const __m512i idx = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37,
                                       35, 33, 31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7,
                                       5, 3, 1);
  return _mm512_permutex2var_epi16(bf16_hi(lo), idx, bf16_hi(hi));
}

// C(i, 0:16*NV) (+)= sum_{p<KP} A-pair(i, p) . B-pair(p, 0:16*NV), i < MR: A's pair words at
// A[i*sa + p*sk], B's at B[p*ldb + lane], vdpbf16ps adds both products of a pair into fp32.
template <int MR, int NV>
SW_DPBF16 inline void ukernel_dp(int KP, const uint32_t* A, ptrdiff_t sa, ptrdiff_t sk,
                                 const uint32_t* B, ptrdiff_t ldb, float* C, ptrdiff_t ldc,
                                 bool acc) {
  __m512 c[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) c[i][v] = _mm512_setzero_ps();
  for (int k = 0; k < KP; ++k) {
    __m512bh b[NV];
    for (int v = 0; v < NV; ++v) b[v] = (__m512bh)_mm512_loadu_si512(B + k * ldb + 16 * v);
    for (int i = 0; i < MR; ++i) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32((int)A[i * sa + k * sk]);
      for (int v = 0; v < NV; ++v) c[i][v] = _mm512_dpbf16_ps(c[i][v], a, b[v]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) {
      float* p = C + i * ldc + 16 * v;
      _mm512_storeu_ps(p, acc ? _mm512_add_ps(_mm512_loadu_ps(p), c[i][v]) : c[i][v]);
    }
}

template <int MR>
SW_DPBF16 inline void ukernel_dp_nv(int nv, int KP, const uint32_t* A, ptrdiff_t sa, ptrdiff_t sk,
                                    const uint32_t* B, ptrdiff_t ldb, float* C, ptrdiff_t ldc,
                                    bool acc) {
  switch (nv) {
    case 4: ukernel_dp<MR, 4>(KP, A, sa, sk, B, ldb, C, ldc, acc); break;
    case 3: ukernel_dp<MR, 3>(KP, A, sa, sk, B, ldb, C, ldc, acc); break;
    case 2: ukernel_dp<MR, 2>(KP, A, sa, sk, B, ldb, C, ldc, acc); break;
    default: ukernel_dp<MR, 1>(KP, A, sa, sk, B, ldb, C, ldc, acc); break;
  }
}

// mm's contract on pair-packed bf16 operands: C(M, W) (+)= sum_{k<K} A(i, k) B(k, 0:W), K in
// elements, A's pair word p (elements 2p, 2p+1) of row i at A[i*sa + p*sk], B's pair row p at
// B + p*ldb. W is a multiple of 16 (B's padding columns are zeros). Causal bounds as in mm,
// rounded out to whole pairs: the extra element of a pair is a masked term (an exact zero in
// the A operand) or the zero padding of an odd K.
SW_DPBF16 void mm_dp(int M, int W, int K, const uint32_t* A, ptrdiff_t sa, ptrdiff_t sk,
                     const uint32_t* B, ptrdiff_t ldb, float* C, ptrdiff_t ldc, bool acc,
                     Causal cz = Causal::kAll, int d = 0) {
  for (int j = 0; j < W; j += 64) {
    for (int i = 0; i < M; i += kMR) {
      const int mr = std::min(kMR, M - i);
      int k0 = 0, k1 = K, w1 = std::min(W, j + 64);
      if (cz == Causal::kColsUpTo) w1 = std::min(w1, i + mr + d);
      if (cz == Causal::kKUpTo) k1 = std::clamp(i + mr + d, 0, K);
      if (cz == Causal::kKFrom) k0 = std::clamp(i - d, 0, K);
      if (w1 <= j) continue;
      const int p0 = k0 / 2, p1 = std::max(p0, (k1 + 1) / 2), nv = (w1 - j + 15) / 16;
      const uint32_t* a = A + i * sa + p0 * sk;
      const uint32_t* b = B + (ptrdiff_t)p0 * ldb + j;
      float* c = C + i * ldc + j;
      switch (mr) {
        case 6: ukernel_dp_nv<6>(nv, p1 - p0, a, sa, sk, b, ldb, c, ldc, acc); break;
        case 5: ukernel_dp_nv<5>(nv, p1 - p0, a, sa, sk, b, ldb, c, ldc, acc); break;
        case 4: ukernel_dp_nv<4>(nv, p1 - p0, a, sa, sk, b, ldb, c, ldc, acc); break;
        case 3: ukernel_dp_nv<3>(nv, p1 - p0, a, sa, sk, b, ldb, c, ldc, acc); break;
        case 2: ukernel_dp_nv<2>(nv, p1 - p0, a, sa, sk, b, ldb, c, ldc, acc); break;
        default: ukernel_dp_nv<1>(nv, p1 - p0, a, sa, sk, b, ldb, c, ldc, acc); break;
      }
    }
  }
}

// Stores of rounded values as pair words, from fp32 in memory (the functions that form the
// values are plain code: no vector crosses the target attribute by value).
// o[0:16] = [bf16(a[lane]) | bf16(b[lane]) << 16]: two rows' values at one column.
SW_DPBF16 inline void store_pair_rows(uint32_t* o, const float* a, const float* b) {
  _mm512_storeu_si512(o, _mm512_or_si512(
                             _mm512_srli_epi32(bf16_hi(_mm512_loadu_ps(a)), 16),
                             _mm512_and_si512(bf16_hi(_mm512_loadu_ps(b)), splat32(0xffff0000u))));
}
// o[0:nw] = pairs along x[0:2*nw] (nw = 16 or 8).
SW_DPBF16 inline void store_pairs_along(uint32_t* o, const float* x, int nw) {
  const __m512i v = pairs_along(_mm512_loadu_ps(x), _mm512_loadu_ps(x + 16));
  if (nw == 16)
    _mm512_storeu_si512(o, v);
  else
    _mm512_mask_storeu_epi32(o, (__mmask16)0xff, v);
}
// min(n, 16) lanes of x, -inf past n (exp gives exact zeros there); reads 16 floats.
inline V16 visible16(const float* x, int n) {
  const V16 v = vload(x);
  if (n >= 16) return v;
  constexpr I16 iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  return iota < n ? v : vsplat(-std::numeric_limits<float>::infinity());
}

// softmax_tile for the native path: P goes straight into its pair words along the keys
// (Pw, row stride ldpw; words nv..ldp/2 of each row zero), no fp32 copy.
void softmax_pack_dp(const float* S, int ldp, int nq, int nk, int d, bool rescale,
                               float scale, float* m, float* l, float* O, ptrdiff_t ldo, int hd,
                               uint32_t* Pw, int ldpw) {
  for (int r = 0; r < nq; ++r) {
    const float* row = S + (size_t)r * ldp;
    uint32_t* o = Pw + (size_t)r * ldpw;
    const int nv = std::clamp(r + d + 1, 0, nk), nv16 = round16(nv);
    int w = 0;  // pair words written
    if (nv > 0) {
      V16 vm = vsplat(-std::numeric_limits<float>::infinity());
      for (int c = 0; c < nv16; c += 16) vm = vmax(vm, visible16(row + c, nv - c));
      const float mnew = std::max(m[r], hmax(vm) * scale);
      V16 vs{};
      for (int c = 0; c < nv16; c += 32) {
        V16 p[2];
        p[0] = exp_v16(visible16(row + c, nv - c) * scale - mnew);
        p[1] = c + 16 < nv16 ? exp_v16(visible16(row + c + 16, nv - c - 16) * scale - mnew)
                             : V16{};
        vs += p[0];
        vs += p[1];
        store_pairs_along(o + c / 2, reinterpret_cast<const float*>(p), 16);
        w = c / 2 + 16;
      }
      const float sum = hsum(vs);
      if (rescale && mnew > m[r]) {  // rescale what earlier key tiles accumulated
        const float alpha = exp_approx(m[r] - mnew);
        float* x = O + (size_t)r * ldo;
        for (int c = 0; c < hd; ++c) x[c] *= alpha;
        l[r] *= alpha;
      }
      l[r] += sum;
      m[r] = mnew;
    }
    for (; w < ldp / 2; ++w) o[w] = 0;
  }
}

// p_ds_tile for the native path: P and dS formed from the products in P and dS (nq x ldk, up
// to nk16 columns) and written only as the operands the products take: P's and dS's row
// pairs (Pr, dSr: row stride ldr; (nq+1)/2 rows, the missing row of an odd nq zero) and dS's
// pair words along the keys (dSw, row stride ldsw, nk16/2 words).
void p_ds_pack_dp(const float* P, const float* dS, int ldk, int nq, int nk, int d,
                            float scale, const float* L, const float* D, uint32_t* Pr,
                            uint32_t* dSr, int ldr, uint32_t* dSw, int ldsw) {
  const int nk16 = round16(nk);
  for (int rp = 0; rp < (nq + 1) / 2; ++rp) {
    int nv[2];
    for (int x = 0; x < 2; ++x)
      nv[x] = 2 * rp + x < nq ? std::clamp(2 * rp + x + d + 1, 0, nk) : 0;
    for (int c = 0; c < nk16; c += 32) {
      V16 ds[2][2] = {};  // [row][half]
      for (int h = 0; h < 2 && c + 16 * h < nk16; ++h) {
        const int cc = c + 16 * h;
        V16 pv[2] = {};
        for (int x = 0; x < 2; ++x) {
          const int r = 2 * rp + x;
          if (cc >= nv[x]) continue;
          pv[x] = exp_v16(visible16(P + (size_t)r * ldk + cc, nv[x] - cc) * scale - L[r]);
          ds[x][h] = scale * pv[x] * (vload(dS + (size_t)r * ldk + cc) - D[r]);
        }
        store_pair_rows(Pr + (size_t)rp * ldr + cc, reinterpret_cast<const float*>(&pv[0]),
                        reinterpret_cast<const float*>(&pv[1]));
        store_pair_rows(dSr + (size_t)rp * ldr + cc, reinterpret_cast<const float*>(&ds[0][h]),
                        reinterpret_cast<const float*>(&ds[1][h]));
      }
      for (int x = 0; x < 2 && 2 * rp + x < nq; ++x)
        store_pairs_along(dSw + (size_t)(2 * rp + x) * ldsw + c / 2,
                          reinterpret_cast<const float*>(ds[x]), c + 32 <= nk16 ? 16 : 8);
    }
  }
}

// Pair word of bf16 row x (hd elements): elements e, e+1 (zero past hd).
inline uint32_t word_of(const uint16_t* x, int e, int hd) {
  return (uint32_t)x[e] | (e + 1 < hd ? (uint32_t)x[e + 1] << 16 : 0u);
}

// B operand "K^T": dst[p*ldd + j] = pair p of bf16 row j of src (n rows of hd; row stride lds
// elements), p < (hd+1)/2; columns n..round16(n)-1 zeroed. With hd even and rows on 4-byte
// boundaries that is a transpose of 32-bit words (16x16 blocks in registers).
void pack_pairs_t(uint32_t* dst, int ldd, const uint16_t* src, ptrdiff_t lds, int n,
                            int hd) {
  const int hp = (hd + 1) / 2, n16 = n / 16 * 16;
  int jv = 0;
  if (hd % 2 == 0 && lds % 2 == 0 && reinterpret_cast<uintptr_t>(src) % 4 == 0) {
    const ptrdiff_t lw = lds / 2;  // row stride in words
    const int hp16 = hp / 16 * 16;
    for (int j = 0; j < n16; j += 16)
      for (int c = 0; c < hp16; c += 16) {
        V16 r[16];  // the words as floats: shuffles move bits unchanged
        for (int i = 0; i < 16; ++i)
          r[i] = vload(reinterpret_cast<const float*>(src) + (j + i) * lw + c);
        transpose_stage<8>(r);
        transpose_stage<4>(r);
        transpose_stage<2>(r);
        transpose_stage<1>(r);
        for (int i = 0; i < 16; ++i)
          vstore(reinterpret_cast<float*>(dst + (ptrdiff_t)(c + i) * ldd + j), r[i]);
      }
    for (int p = hp16; p < hp; ++p)
      for (int j = 0; j < n16; ++j) dst[(ptrdiff_t)p * ldd + j] = word_of(src + j * lds, 2 * p, hd);
    jv = n16;
  }
  for (int p = 0; p < hp; ++p) {
    uint32_t* o = dst + (ptrdiff_t)p * ldd;
    for (int j = jv; j < n; ++j) o[j] = word_of(src + j * lds, 2 * p, hd);
    for (int j = n; j < round16(n); ++j) o[j] = 0;
  }
}

// B operand (or, read with sa = 1 and sk = ldd, the A operand of a transposed product) as a
// "row-pair interleave": dst[p*ldd + c] = [src(2p, c) | src(2p+1, c) << 16] for c < w, rows
// p < (n+1)/2 (a missing row 2p+1 is zero), columns w..round16(w)-1 zeroed. From bf16 rows.
SW_DPBF16 void pack_row_pairs(uint32_t* dst, int ldd, const uint16_t* src, ptrdiff_t lds, int n,
                              int w) {
  for (int p = 0; p < (n + 1) / 2; ++p) {
    const uint16_t* r0 = src + 2 * p * lds;
    const bool two = 2 * p + 1 < n;
    uint32_t* o = dst + (ptrdiff_t)p * ldd;
    for (int c = 0; c < w; c += 16) {
      const __mmask16 m = first_n(w - c);
      const __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, r0 + c));
      const __m512i hi =
          two ? _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, r0 + lds + c)),
                                  16)
              : _mm512_setzero_si512();
      _mm512_storeu_si512(o + c, _mm512_or_si512(lo, hi));
    }
  }
}
// n bf16 rows of hd from src (stride lds) into dst (stride ldd elements, even), an odd hd's
// pair completed with a zero: the A operand of products reducing along hd (Q, dO), as words.
void copy_rows16(uint16_t* dst, int ldd, const uint16_t* src, ptrdiff_t lds, int n, int hd) {
  for (int r = 0; r < n; ++r) {
    std::memcpy(dst + (ptrdiff_t)r * ldd, src + r * lds, sizeof(uint16_t) * hd);
    if (hd % 2) dst[(ptrdiff_t)r * ldd + hd] = 0;
  }
}
// The same from fp32 rows, rounded (f32_to_bf16, bit for bit).
void round_rows16(uint16_t* dst, int ldd, const float* src, ptrdiff_t lds, int n, int hd) {
  for (int r = 0; r < n; ++r) {
    detail::to_bf16_rows(dst + (ptrdiff_t)r * ldd, src + r * lds, 1, hd, lds);
    if (hd % 2) dst[(ptrdiff_t)r * ldd + hd] = 0;
  }
}
// min(n, 16) values as 16 fp32 lanes (zeros past n): fp32, or bf16 widened.
inline V16 lanes16(const float* x, int n) {
  if (n >= 16) return vload(x);
  V16 v{};
  for (int i = 0; i < n; ++i) v[i] = x[i];
  return v;
}
inline V16 lanes16(const uint16_t* x, int n) {
  typedef uint16_t U16 __attribute__((vector_size(32), aligned(2), may_alias));
  typedef uint32_t U32 __attribute__((vector_size(64)));
  U32 v{};
  if (n >= 16)
    v = __builtin_convertvector(*reinterpret_cast<const U16*>(x), U32);
  else
    for (int i = 0; i < n; ++i) v[i] = x[i];
  return (V16)(v << 16);
}

// qkv in bf16: the caller's qkv16, or fp32 qkv rounded once per call into a per-thread buffer
// kept between calls (as rounded_qkv: (n + 1) / 2 floats).
const uint16_t* bf16_qkv(const float* qkv, size_t rows, int R, const uint16_t* qkv16) {
  if (qkv16) return qkv16;
  thread_local Buffer buf;
  uint16_t* r = reinterpret_cast<uint16_t*>(detail::grow_workspace(buf, (rows * R + 1) / 2));
  detail::to_bf16_rows(r, qkv, (int)rows, R, R);
  return r;
}

// Leading dimensions (in 32-bit words or floats) of the native path's tile buffers.
struct DpLd {
  int hp;   // pairs along hd
  int ldq;  // A operand rows along hd (Q, dO): words; 2*ldq bf16
  int ldh;  // rows hd wide (fp32 accumulators, row-pair packed B operands)
};
inline DpLd dp_ld(int hd) {
  const int hp = (hd + 1) / 2;
  return {hp, padded_ld(hp), padded_ld(hd)};
}
// The forward's scratch: S (scores, then P in fp32), a head's K^T pairs and V row pairs (all
// T keys), P's pairs along the keys, the Q tile (bf16) and the output accumulator.
size_t fwd_dp_tile_floats(int T, int hd) {
  const DpLd L = dp_ld(hd);
  return tile_floats({(size_t)kFwdBQ * kFwdBK, (size_t)L.hp * padded_ld(T),
                      (size_t)(T + 1) / 2 * L.ldh, (size_t)kFwdBQ * padded_ld(kFwdBK / 2),
                      (size_t)kFwdBQ * L.ldq, (size_t)kFwdBQ * L.ldh});
}
// The backward's: Q and dO of one head as bf16 rows (A operands) and as row pairs (B
// operands), the dQ accumulator; the key tile's K^T and V^T pairs, K's row pairs, dK/dV
// accumulators; P and dS (fp32), their row pairs, dS's pairs along the keys; D.
size_t bwd_dp_tile_floats(int T, int hd) {
  const DpLd L = dp_ld(hd);
  const size_t ldk = (size_t)padded_ld(kBwdBK), Tp = (size_t)(T + 1) / 2;
  const size_t nA = (size_t)T * L.ldq, nR = Tp * L.ldh, nQ = (size_t)T * L.ldh,
               nKT = (size_t)L.hp * ldk, nKr = (size_t)kBwdBK / 2 * L.ldh,
               nB = (size_t)kBwdBK * L.ldh, nP = (size_t)kBwdBQ * ldk,
               nPr = (size_t)kBwdBQ / 2 * ldk, nSw = (size_t)kBwdBQ * padded_ld(kBwdBK / 2);
  return tile_floats({nA, nA, nR, nR, nQ, nKT, nKT, nKr, nB, nB, nP, nP, nPr, nPr, nSw, (size_t)T});
}

struct FwdDp {
  float* S;
  uint32_t* KT;  // the head's keys' pairs, transposed (row stride padded_ld(T) words)
  uint32_t* Vr;  // the head's values as row pairs
  uint32_t* Pw;
  uint16_t* Qa;
  float* Ot;
};

// One forward task's query tile [i0, i1) of (b, h) on the native path, the head's K^T and V
// packed in w already.
void forward_tile_dp(const FwdDp& w, float* out, uint16_t* out16, float* lse,
                     const uint16_t* q16, int b, int h, int i0, int i1, int T, int H, int KVH,
                     int hd) {
  const int R = (H + 2 * KVH) * hd, CO = H * hd, nq = i1 - i0;
  const DpLd L = dp_ld(hd);
  const int ldkt = padded_ld(T), ldpw = padded_ld(kFwdBK / 2), hd16 = round16(hd);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  copy_rows16(w.Qa, 2 * L.ldq, q16 + ((size_t)b * T + i0) * R + (size_t)h * hd, R, nq, hd);
  const uint32_t* Qw = reinterpret_cast<const uint32_t*>(w.Qa);
  float m[kFwdBQ], l[kFwdBQ];
  for (int r = 0; r < nq; ++r) m[r] = -std::numeric_limits<float>::infinity(), l[r] = 0.f;
  for (int j0 = 0; j0 < i1; j0 += kFwdBK) {  // (j0 even: V's row pairs of the tile at j0 / 2)
    const int j1 = std::min(i1, j0 + kFwdBK), nk = j1 - j0, ldp = round16(nk);
    mm_dp(nq, ldp, hd, Qw, L.ldq, 1, w.KT + j0, ldkt, w.S, ldp, false, Causal::kColsUpTo,
          i0 - j0);
    softmax_pack_dp(w.S, ldp, nq, nk, i0 - j0, j0 > 0, scale, m, l, w.Ot, L.ldh, hd, w.Pw, ldpw);
    // Ot (+)= P V_j; the first key tile overwrites.
    mm_dp(nq, hd16, nk, w.Pw, ldpw, 1, w.Vr + (size_t)(j0 / 2) * L.ldh, L.ldh, w.Ot, L.ldh,
          j0 > 0, Causal::kKUpTo, i0 - j0);
  }
  float* Ls = lse + ((size_t)b * H + h) * T + i0;
  for (int r = 0; r < nq; ++r) {
    const float inv = 1.0f / l[r];
    const float* ot = w.Ot + (size_t)r * L.ldh;
    const size_t at = ((size_t)b * T + i0 + r) * CO + (size_t)h * hd;
    if (out16) {  // narrow() of the fp32 output
      uint16_t* o = out16 + at;
#pragma omp simd
      for (int c = 0; c < hd; ++c) o[c] = detail::bf16_round(ot[c] * inv);
    } else {
      float* o = out + at;
      for (int c = 0; c < hd; ++c) o[c] = ot[c] * inv;
    }
    Ls[r] = m[r] + std::log(l[r]);
  }
}

void attention_forward_dp(float* out, uint16_t* out16, float* lse, const float* qkv,
                          const uint16_t* qkv16, int B, int T, int H, int KVH, int hd) {
  const int R = (H + 2 * KVH) * hd;
  const uint16_t* q16 = bf16_qkv(qkv, (size_t)B * T, R, qkv16);
  const int nqt = (T + kFwdBQ - 1) / kFwdBQ, ntasks = B * H;
  const DpLd L = dp_ld(hd);
#pragma omp parallel
  {
    TileScratch ws{tile_workspace(fwd_dp_tile_floats(T, hd))};
    FwdDp w;
    w.S = ws.carve((size_t)kFwdBQ * kFwdBK);
    w.KT = reinterpret_cast<uint32_t*>(ws.carve((size_t)L.hp * padded_ld(T)));
    w.Vr = reinterpret_cast<uint32_t*>(ws.carve((size_t)(T + 1) / 2 * L.ldh));
    w.Pw = reinterpret_cast<uint32_t*>(ws.carve((size_t)kFwdBQ * padded_ld(kFwdBK / 2)));
    w.Qa = reinterpret_cast<uint16_t*>(ws.carve((size_t)kFwdBQ * L.ldq));
    w.Ot = ws.carve((size_t)kFwdBQ * L.ldh);
    // One task per head: its keys and values packed once, then its query tiles (the tiles
    // as tasks repacked each tile's visible keys: 2.5 packings of a head at T 256, ~20% of
    // this kernel's time). Each tile's result is schedule-independent.
#pragma omp for schedule(dynamic, 1)
    for (int bh = 0; bh < ntasks; ++bh) {
      const int b = bh / H, h = bh % H, g = h / (H / KVH);
      const uint16_t* K = q16 + (size_t)b * T * R + (size_t)(H + g) * hd;
      pack_pairs_t(w.KT, padded_ld(T), K, R, T, hd);
      pack_row_pairs(w.Vr, L.ldh, K + (size_t)KVH * hd, R, T, hd);
      for (int qt = nqt - 1; qt >= 0; --qt) {
        const int i0 = qt * kFwdBQ, i1 = std::min(T, i0 + kFwdBQ);
        forward_tile_dp(w, out, out16, lse, q16, b, h, i0, i1, T, H, KVH, hd);
      }
    }
  }
}

struct BwdDp {
  uint16_t* Qa;
  uint16_t* dOa;
  uint32_t* Qr;
  uint32_t* dOr;
  float* dQ;
  uint32_t* KT;
  uint32_t* VT;
  uint32_t* Kr;
  float* dK;
  float* dV;
  float* P;
  float* dS;
  uint32_t* Pr;
  uint32_t* dSr;
  uint32_t* dSw;
  float* D;
};

// One backward task (b, h) on the native path: dQ into dqkv, dK/dV into dqkv (MHA) or into
// this head's partials (GQA).
void backward_task_dp(const BwdDp& w, float* dqkv, uint16_t* dqkv16, float* part,
                      const float* dout,
                                const uint16_t* dout16, const uint16_t* q16, const float* out,
                                const uint16_t* out16, const float* lse, int b, int h, int T,
                                int H, int KVH, int hd, bool set) {
  const int R = (H + 2 * KVH) * hd, CO = H * hd, rep = H / KVH, g = h / rep, bh = b * H + h;
  const bool gqa = rep > 1;
  const DpLd L = dp_ld(hd);
  const int ldk = padded_ld(kBwdBK), ldsw = padded_ld(kBwdBK / 2), hd16 = round16(hd);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const size_t base = (size_t)b * T * R, obase = (size_t)b * T * CO + (size_t)h * hd;
  const uint16_t* K = q16 + base + (size_t)(H + g) * hd;
  const uint16_t* V = q16 + base + (size_t)(H + KVH + g) * hd;
  const float* Ls = lse + (size_t)bh * T;
  const int lda = 2 * L.ldq;  // bf16 elements per A-operand row
  copy_rows16(w.Qa, lda, q16 + base + (size_t)h * hd, R, T, hd);
  if (dout16)
    copy_rows16(w.dOa, lda, dout16 + obase, CO, T, hd);
  else
    round_rows16(w.dOa, lda, dout + obase, CO, T, hd);
  pack_row_pairs(w.Qr, L.ldh, w.Qa, lda, T, hd);
  pack_row_pairs(w.dOr, L.ldh, w.dOa, lda, T, hd);
  std::fill(w.dQ, w.dQ + (size_t)T * L.ldh, 0.f);
  // D = rowsum(dout * out) in fp32 from the fp32 (or the 16-bit, widened) values: the same
  // 16-lane sum whichever form each has (one summation order, so the same bits).
  // (The output's rows are first read here, from memory: asked for 8 rows ahead, ~4% of the
  // backward at B 8, T 256, hd 64.)
  const char* o_bytes = out16 ? reinterpret_cast<const char*>(out16 + obase)
                              : reinterpret_cast<const char*>(out + obase);
  const size_t o_elem = out16 ? sizeof(uint16_t) : sizeof(float);
  for (int i = 0; i < T; ++i) {
    const size_t at = obase + (size_t)i * CO;
    if (i + 8 < T)
      for (size_t o = 0; o < hd * o_elem; o += 64)
        __builtin_prefetch(o_bytes + ((size_t)(i + 8) * CO) * o_elem + o, 0, 3);
    V16 acc{};
    for (int c = 0; c < hd; c += 16)
      acc += (out16 ? lanes16(out16 + at + c, hd - c) : lanes16(out + at + c, hd - c)) *
             (dout16 ? lanes16(dout16 + at + c, hd - c) : lanes16(dout + at + c, hd - c));
    w.D[i] = hsum(acc);
  }
  const uint32_t* Qw = reinterpret_cast<const uint32_t*>(w.Qa);
  const uint32_t* dOw = reinterpret_cast<const uint32_t*>(w.dOa);

  for (int j0 = 0; j0 < T; j0 += kBwdBK) {
    const int j1 = std::min(T, j0 + kBwdBK), nk = j1 - j0, nk16 = round16(nk);
    pack_pairs_t(w.KT, ldk, K + (size_t)j0 * R, R, nk, hd);
    pack_pairs_t(w.VT, ldk, V + (size_t)j0 * R, R, nk, hd);
    pack_row_pairs(w.Kr, L.ldh, K + (size_t)j0 * R, R, nk, hd);
    bool first = true;
    for (int i0 = (j0 / kBwdBQ) * kBwdBQ; i0 < T; i0 += kBwdBQ) {
      const int i1 = std::min(T, i0 + kBwdBQ), nq = i1 - i0, d = i0 - j0;
      if (i1 <= j0) continue;
      mm_dp(nq, nk16, hd, Qw + (size_t)i0 * L.ldq, L.ldq, 1, w.KT, ldk, w.P, ldk, false,
            Causal::kColsUpTo, d);
      mm_dp(nq, nk16, hd, dOw + (size_t)i0 * L.ldq, L.ldq, 1, w.VT, ldk, w.dS, ldk, false,
            Causal::kColsUpTo, d);
      p_ds_pack_dp(w.P, w.dS, ldk, nq, nk, d, scale, Ls + i0, w.D + i0, w.Pr, w.dSr, ldk, w.dSw,
                   ldsw);
      // dV_j (+)= P^T dO_i ; dK_j (+)= dS^T Q_i (A(j, r) = P(r, j): row pairs read with
      // sa = 1, sk = ldk); i0 is even, so the query tile's pair rows start at i0 / 2.
      const uint32_t* dOr = w.dOr + (size_t)(i0 / 2) * L.ldh;
      const uint32_t* Qr = w.Qr + (size_t)(i0 / 2) * L.ldh;
      mm_dp(nk, hd16, nq, w.Pr, 1, ldk, dOr, L.ldh, w.dV, L.ldh, !first, Causal::kKFrom, d);
      mm_dp(nk, hd16, nq, w.dSr, 1, ldk, Qr, L.ldh, w.dK, L.ldh, !first, Causal::kKFrom, d);
      first = false;
      // dQ_i += dS K_j
      mm_dp(nq, hd16, nk, w.dSw, ldsw, 1, w.Kr, L.ldh, w.dQ + (size_t)i0 * L.ldh, L.ldh, true,
            Causal::kKUpTo, d);
    }
    if (dqkv16) {  // (MHA, written: see attention_bf16_writes16)
      uint16_t* k16 = dqkv16 + base + (size_t)j0 * R + (size_t)(H + g) * hd;
      store_rows_bf16(k16, R, w.dK, L.ldh, nk, hd);
      store_rows_bf16(k16 + (size_t)KVH * hd, R, w.dV, L.ldh, nk, hd);
      continue;
    }
    float* dK = gqa ? part + ((size_t)bh * 2 * T + j0) * hd
                    : dqkv + base + (size_t)j0 * R + (size_t)(H + g) * hd;
    float* dV =
        gqa ? dK + (size_t)T * hd : dqkv + base + (size_t)j0 * R + (size_t)(H + KVH + g) * hd;
    const Store how = gqa ? Store::Copy : set ? Store::Set : Store::Add;
    store_rows(dK, gqa ? hd : R, w.dK, L.ldh, nk, hd, how);
    store_rows(dV, gqa ? hd : R, w.dV, L.ldh, nk, hd, how);
  }
  if (dqkv16)
    store_rows_bf16(dqkv16 + base + (size_t)h * hd, R, w.dQ, L.ldh, T, hd);
  else
    store_rows(dqkv + base + (size_t)h * hd, R, w.dQ, L.ldh, T, hd,
               set ? Store::Set : Store::Add);
}

void attention_backward_dp(float* dqkv, uint16_t* dqkv16, const float* dout, const float* qkv,
                           const float* out,
                           const float* lse, int B, int T, int H, int KVH, int hd, bool set,
                           const uint16_t* qkv16, const uint16_t* out16,
                           const uint16_t* dout16) {
  const int R = (H + 2 * KVH) * hd;
  const uint16_t* q16 = bf16_qkv(qkv, (size_t)B * T, R, qkv16);
  const bool gqa = H > KVH;
  Buffer scratch;
  if (gqa) scratch = Buffer(sizeof(float) * (size_t)B * H * 2 * T * hd, Mem::Workspace);
  float* part = scratch.f32();
  const DpLd L = dp_ld(hd);
  const size_t ldk = (size_t)padded_ld(kBwdBK), Tp = (size_t)(T + 1) / 2;
#pragma omp parallel
  {
    TileScratch ws{tile_workspace(bwd_dp_tile_floats(T, hd))};
    auto words = [&](size_t n) { return reinterpret_cast<uint32_t*>(ws.carve(n)); };
    BwdDp w;
    w.Qa = reinterpret_cast<uint16_t*>(ws.carve((size_t)T * L.ldq));
    w.dOa = reinterpret_cast<uint16_t*>(ws.carve((size_t)T * L.ldq));
    w.Qr = words(Tp * L.ldh);
    w.dOr = words(Tp * L.ldh);
    w.dQ = ws.carve((size_t)T * L.ldh);
    w.KT = words((size_t)L.hp * ldk);
    w.VT = words((size_t)L.hp * ldk);
    w.Kr = words((size_t)kBwdBK / 2 * L.ldh);
    w.dK = ws.carve((size_t)kBwdBK * L.ldh);
    w.dV = ws.carve((size_t)kBwdBK * L.ldh);
    w.P = ws.carve((size_t)kBwdBQ * ldk);
    w.dS = ws.carve((size_t)kBwdBQ * ldk);
    w.Pr = words((size_t)kBwdBQ / 2 * ldk);
    w.dSr = words((size_t)kBwdBQ / 2 * ldk);
    w.dSw = words((size_t)kBwdBQ * padded_ld(kBwdBK / 2));
    w.D = ws.carve((size_t)T);
#pragma omp for schedule(dynamic, 1)
    for (int bh = 0; bh < B * H; ++bh)
      backward_task_dp(w, dqkv, dqkv16, part, dout, dout16, q16, out, out16, lse, bh / H, bh % H, T, H,
                       KVH, hd, set);
    if (gqa) add_gqa_partials(dqkv, part, B, T, H, KVH, hd, set);
  }
}

void check_shapes(int B, int T, int H, int KVH, int hd) {
  SW_CHECK(B >= 0 && T >= 0 && H > 0 && KVH > 0 && hd > 0, "attention: bad shape");
  SW_CHECK(H % KVH == 0, "attention: KVH must divide H");
}

}  // namespace

bool attention_bf16_native() { return g_native_allowed && cpu_has_avx512_bf16(); }
void set_attention_bf16_native(bool allowed) { g_native_allowed = allowed; }

bool attention_bf16_writes16(DType compute, int H, int KVH, bool backward) {
  return compute == DType::BF16 && attention_bf16_native() && (!backward || H == KVH);
}

void attention_forward_bf16_out(uint16_t* out16, float* lse, const uint16_t* qkv16, int B, int T,
                                int H, int KVH, int hd) {
  check_shapes(B, T, H, KVH, hd);
  SW_CHECK(attention_bf16_writes16(DType::BF16, H, KVH, false),
           "attention: a 16-bit output written by the kernel needs the native bf16 path");
  if (B == 0 || T == 0) return;
  attention_forward_dp(nullptr, out16, lse, nullptr, qkv16, B, T, H, KVH, hd);
}

void attention_backward_bf16_out(uint16_t* dqkv16, const float* dout, const uint16_t* dout16,
                                 const uint16_t* qkv16, const uint16_t* out16, const float* lse,
                                 int B, int T, int H, int KVH, int hd) {
  check_shapes(B, T, H, KVH, hd);
  SW_CHECK(attention_bf16_writes16(DType::BF16, H, KVH, true),
           "attention: a 16-bit dqkv written by the kernel needs the native bf16 path and MHA");
  if (B == 0 || T == 0) return;
  attention_backward_dp(nullptr, dqkv16, dout, nullptr, nullptr, lse, B, T, H, KVH, hd, true,
                        qkv16, out16, dout16);
}

size_t attention_tile_floats(int T, int hd, DType compute) {
  if (compute == DType::BF16 && attention_bf16_native())
    return std::max(fwd_dp_tile_floats(T, hd), bwd_dp_tile_floats(T, hd));
  return std::max(fwd_tile_floats(hd), bwd_tile_floats(T, hd));
}
size_t attention_tile_floats(int T, int hd) { return attention_tile_floats(T, hd, DType::F32); }

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int H, int KVH,
                       int hd, DType compute, const uint16_t* qkv16) {
  check_shapes(B, T, H, KVH, hd);
  if (B == 0 || T == 0) return;
  const int R = (H + 2 * KVH) * hd, CO = H * hd, rep = H / KVH;
  const bool lowp = compute != DType::F32;
  SW_CHECK(lowp || !qkv16, "attention: 16-bit qkv needs BF16 / F16 compute");
  if (compute == DType::BF16 && attention_bf16_native())
    return attention_forward_dp(out, nullptr, lse, qkv, qkv16, B, T, H, KVH, hd);
  if (lowp) qkv = rounded_qkv(compute, qkv, (size_t)B * T * R, qkv16);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int nqt = (T + kFwdBQ - 1) / kFwdBQ;
  const int ntasks = B * H * nqt;
  const float ninf = -std::numeric_limits<float>::infinity();

#pragma omp parallel
  {
    const size_t nS = (size_t)kFwdBQ * kFwdBK, nKT = (size_t)hd * kFwdBK;
    TileScratch ws{tile_workspace(fwd_tile_floats(hd))};
    float* S = ws.carve(nS);
    float* KT = ws.carve(nKT);
    float m[kFwdBQ], l[kFwdBQ];
    // Heaviest tiles (last query rows, most keys) first: better balance under dynamic
    // scheduling. Each task's result does not depend on which thread runs it.
#pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < ntasks; ++task) {
      const int qt = nqt - 1 - task / (B * H);
      const int bh = task % (B * H), b = bh / H, h = bh % H, g = h / rep;
      const int i0 = qt * kFwdBQ, i1 = std::min(T, i0 + kFwdBQ), nq = i1 - i0;
      const float* Q = qkv + ((size_t)b * T + i0) * R + (size_t)h * hd;
      const float* K = qkv + (size_t)b * T * R + (size_t)(H + g) * hd;
      const float* V = qkv + (size_t)b * T * R + (size_t)(H + KVH + g) * hd;
      float* O = out + ((size_t)b * T + i0) * CO + (size_t)h * hd;
      for (int r = 0; r < nq; ++r) m[r] = ninf, l[r] = 0.f;

      for (int j0 = 0; j0 < i1; j0 += kFwdBK) {
        const int j1 = std::min(i1, j0 + kFwdBK), nk = j1 - j0, ldp = round16(nk);
        pack_transposed(KT, ldp, K + (size_t)j0 * R, R, nk, hd);
        // S = Q K^T (unscaled), only the columns each row block can see.
        mm(nq, ldp, hd, Q, R, 1, KT, ldp, S, ldp, false, Causal::kColsUpTo, i0 - j0);
        softmax_tile(S, ldp, nq, nk, i0 - j0, j0 > 0, scale, m, l, O, CO, hd,
                     lowp ? compute : DType::F32);
        // O (+)= P V_j; the first key tile overwrites (out is an output, not accumulated).
        mm(nq, hd, nk, S, ldp, 1, V + (size_t)j0 * R, R, O, CO, j0 > 0, Causal::kKUpTo,
           i0 - j0);
      }
      float* L = lse + ((size_t)b * H + h) * T + i0;
      for (int r = 0; r < nq; ++r) {
        const float inv = 1.0f / l[r];
        float* o = O + (size_t)r * CO;
        for (int c = 0; c < hd; ++c) o[c] *= inv;
        L[r] = m[r] + std::log(l[r]);
      }
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int H, int KVH, int hd,
                        DType compute, bool set, const uint16_t* qkv16, const uint16_t* out16,
                        const uint16_t* dout16) {
  check_shapes(B, T, H, KVH, hd);
  if (B == 0 || T == 0) return;
  const int R = (H + 2 * KVH) * hd, CO = H * hd, rep = H / KVH;
  const bool lowp = compute != DType::F32;
  SW_CHECK(lowp || (!qkv16 && !out16 && !dout16),
           "attention: 16-bit qkv / out / dout need BF16 / F16 compute");
  if (compute == DType::BF16 && attention_bf16_native())
    return attention_backward_dp(dqkv, nullptr, dout, qkv, out, lse, B, T, H, KVH, hd, set, qkv16,
                                 out16, dout16);
  if (lowp) qkv = rounded_qkv(compute, qkv, (size_t)B * T * R, qkv16);
  if (out16) out = widened_out(compute, out16, (size_t)B * T * CO);
  if (dout16) dout = widened_out(compute, dout16, (size_t)B * T * CO, 1);
  const int hd16 = round16(hd), ldh = padded_ld(hd);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const bool gqa = rep > 1;
  // GQA partials: per (b, h), dK then dV, each (T, hd).
  Buffer scratch;
  if (gqa) scratch = Buffer(sizeof(float) * (size_t)B * H * 2 * T * hd, Mem::Workspace);
  float* part = scratch.f32();
  const int ldk = padded_ld(kBwdBK);

#pragma omp parallel
  {
    // Per thread: Q, dO and the dQ accumulator of one head (T rows each), the current key
    // tile transposed (K^T, V^T) and as rows (K), its dK/dV accumulators, two score tiles.
    const size_t nT = (size_t)T * ldh, nK = (size_t)hd * ldk, nB = (size_t)kBwdBK * ldh,
                 nP = (size_t)kBwdBQ * ldk;
    TileScratch ws{tile_workspace(bwd_tile_floats(T, hd))};
    float* Qp = ws.carve(nT);
    float* dOp = ws.carve(nT);
    float* dQp = ws.carve(nT);
    float* KT = ws.carve(nK);
    float* VT = ws.carve(nK);
    float* Kp = ws.carve(nB);
    float* dKp = ws.carve(nB);
    float* dVp = ws.carve(nB);
    float* P = ws.carve(nP);
    float* dS = ws.carve(nP);
    float* D = ws.carve(T);
#pragma omp for schedule(dynamic, 1)
    for (int bh = 0; bh < B * H; ++bh) {
      const int b = bh / H, h = bh % H, g = h / rep;
      const size_t base = (size_t)b * T * R;
      const float* K = qkv + base + (size_t)(H + g) * hd;
      const float* V = qkv + base + (size_t)(H + KVH + g) * hd;
      const float* O = out + (size_t)b * T * CO + (size_t)h * hd;
      const float* dO = dout + (size_t)b * T * CO + (size_t)h * hd;
      const float* L = lse + (size_t)bh * T;
      pack_rows(Qp, ldh, qkv + base + (size_t)h * hd, R, T, hd);
      pack_rows(dOp, ldh, dO, CO, T, hd);
      std::fill(dQp, dQp + nT, 0.f);
      for (int i = 0; i < T; ++i) {
        const float* o = O + (size_t)i * CO;
        const float* d = dOp + (size_t)i * ldh;
        float s = 0.f;
#pragma omp simd reduction(+ : s)
        for (int c = 0; c < hd; ++c) s += o[c] * d[c];
        D[i] = s;
      }
      if (lowp) round_to(compute, dOp, dOp, (size_t)T * ldh);  // after D (fp32)

      for (int j0 = 0; j0 < T; j0 += kBwdBK) {
        const int j1 = std::min(T, j0 + kBwdBK), nk = j1 - j0, nk16 = round16(nk);
        pack_transposed(KT, ldk, K + (size_t)j0 * R, R, nk, hd);
        pack_transposed(VT, ldk, V + (size_t)j0 * R, R, nk, hd);
        pack_rows(Kp, ldh, K + (size_t)j0 * R, R, nk, hd);
        bool first = true;
        for (int i0 = (j0 / kBwdBQ) * kBwdBQ; i0 < T; i0 += kBwdBQ) {
          const int i1 = std::min(T, i0 + kBwdBQ), nq = i1 - i0, d = i0 - j0;
          if (i1 <= j0) continue;  // every row of this query tile is above the key tile
          const float* Qi = Qp + (size_t)i0 * ldh;
          const float* dOi = dOp + (size_t)i0 * ldh;
          mm(nq, nk16, hd, Qi, ldh, 1, KT, ldk, P, ldk, false, Causal::kColsUpTo, d);
          mm(nq, nk16, hd, dOi, ldh, 1, VT, ldk, dS, ldk, false, Causal::kColsUpTo,
             d);
          p_ds_tile(P, dS, ldk, nq, nk, d, scale, L + i0, D + i0, lowp ? compute : DType::F32);
          // dV_j (nk, hd) (+)= P^T dO_i ; dK_j (+)= dS^T Q_i : A(j, r) = P[r*ldk + j]. The
          // first query tile initialises the accumulators (rows it cannot see get zeros).
          mm(nk, hd16, nq, P, 1, ldk, dOi, ldh, dVp, ldh, !first, Causal::kKFrom, d);
          mm(nk, hd16, nq, dS, 1, ldk, Qi, ldh, dKp, ldh, !first, Causal::kKFrom, d);
          first = false;
          // dQ_i (nq, hd) += dS K_j
          mm(nq, hd16, nk, dS, ldk, 1, Kp, ldh, dQp + (size_t)i0 * ldh, ldh,
             true, Causal::kKUpTo, d);
        }
        // Key tile done: dK/dV += (MHA) or scratch = (GQA) its accumulators.
        float* dK = gqa ? part + ((size_t)bh * 2 * T + j0) * hd
                        : dqkv + base + (size_t)j0 * R + (size_t)(H + g) * hd;
        float* dV =
            gqa ? dK + (size_t)T * hd : dqkv + base + (size_t)j0 * R + (size_t)(H + KVH + g) * hd;
        const Store how = gqa ? Store::Copy : set ? Store::Set : Store::Add;
        store_rows(dK, gqa ? hd : R, dKp, ldh, nk, hd, how);
        store_rows(dV, gqa ? hd : R, dVp, ldh, nk, hd, how);
      }
      store_rows(dqkv + base + (size_t)h * hd, R, dQp, ldh, T, hd, set ? Store::Set : Store::Add);
    }

    if (gqa) add_gqa_partials(dqkv, part, B, T, H, KVH, hd, set);
  }
}

}  // namespace sw::cpu
