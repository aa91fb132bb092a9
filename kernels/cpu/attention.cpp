// Causal self-attention with grouped-query heads, FlashAttention-style on the CPU.
//
// qkv: (B, T, R) with R = (H + 2*KVH) * hd, each row laid out [q heads | k heads | v heads];
// query head h reads kv head g = h / (H / KVH). out: (B, T, H*hd). lse: (B, H, T).
//
// Forward: one task per (b, h, query tile of kFwdBQ rows). Keys are visited in tiles of kFwdBK
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
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <utility>
#include <vector>

#include "core/alloc.h"
#include "core/error.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/cpu_kernels.h"

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

void check_shapes(int B, int T, int H, int KVH, int hd) {
  SW_CHECK(B >= 0 && T >= 0 && H > 0 && KVH > 0 && hd > 0, "attention: bad shape");
  SW_CHECK(H % KVH == 0, "attention: KVH must divide H");
}

}  // namespace

size_t attention_tile_floats(int T, int hd) {
  return std::max(fwd_tile_floats(hd), bwd_tile_floats(T, hd));
}

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int H, int KVH,
                       int hd, DType compute, const uint16_t* qkv16) {
  check_shapes(B, T, H, KVH, hd);
  if (B == 0 || T == 0) return;
  const int R = (H + 2 * KVH) * hd, CO = H * hd, rep = H / KVH;
  const bool lowp = compute != DType::F32;
  SW_CHECK(lowp || !qkv16, "attention: 16-bit qkv needs BF16 / F16 compute");
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
        for (int r = 0; r < nq; ++r) {
          float* row = S + (size_t)r * ldp;
          const int nv = std::clamp(i0 + r - j0 + 1, 0, nk);  // keys j <= i are visible
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
          if (j0 > 0 && mnew > m[r]) {  // rescale what earlier key tiles accumulated
            const float alpha = exp_approx(m[r] - mnew);
            float* o = O + (size_t)r * CO;
            for (int c = 0; c < hd; ++c) o[c] *= alpha;
            l[r] *= alpha;
          }
          l[r] += sum;
          m[r] = mnew;
          if (lowp) round_to(compute, row, row, nv16);  // P's operand copy for P V
        }
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
  if (lowp) qkv = rounded_qkv(compute, qkv, (size_t)B * T * R, qkv16);
  if (out16) out = widened_out(compute, out16, (size_t)B * T * CO);
  if (dout16) dout = widened_out(compute, dout16, (size_t)B * T * CO, 1);
  const int hd16 = round16(hd), ldh = padded_ld(hd);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float ninf = -std::numeric_limits<float>::infinity();
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
          for (int r = 0; r < nq; ++r) {
            float* p = P + (size_t)r * ldk;
            float* ds = dS + (size_t)r * ldk;
            const int nv = std::clamp(i0 + r - j0 + 1, 0, nk), nv16 = round16(nv);
            const float li = L[i0 + r], di = D[i0 + r];
            // As in the forward: -inf up to the vector boundary gives P = 0 and dS = 0 there
            // (dP is finite in those columns: the product covered them).
            for (int c = nv; c < nv16; ++c) p[c] = ninf;
            for (int c = 0; c < nv16; c += 16) {
              const V16 pv = exp_v16(vload(p + c) * scale - li);
              vstore(p + c, pv);
              vstore(ds + c, scale * pv * (vload(ds + c) - di));
            }
            for (int c = nv16; c < nk16; c += 16) vstore(p + c, V16{}), vstore(ds + c, V16{});
            if (lowp) {  // operands of the products below; dS was formed from fp32 P
              round_to(compute, p, p, nv16);
              round_to(compute, ds, ds, nv16);
            }
          }
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

    if (gqa) {
      // dK/dV of kv head g += partials of its query heads, in head order.
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
  }
}

}  // namespace sw::cpu
