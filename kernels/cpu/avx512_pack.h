// Pieces the bf16 GEMM kernels share (AVX-512F/BW, and AVX512-BF16 for dp_panels): lane masks,
// fp32 -> bf16 rounding exactly as f32_to_bf16, a 16 x 16 transpose of 32-bit words held in 16
// zmm registers, and the vdpbf16ps loop over packed panels. Include only from files compiled
// with -mavx512f -mavx512bw -mavx512bf16 (kernels/CMakeLists).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace sw::cpu::detail {

// The first n of 16 lanes (n <= 0: none).
inline __mmask16 first_n(int n) {
  return n >= 16 ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

// Round-to-nearest-even fp32 -> bf16 on 16 lanes, the bf16 in the high half of each lane
// (same arithmetic as f32_to_bf16; NaN keeps its sign and payload top bits and is made quiet).
inline __m512i round_hi(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                 _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x00400000));
}

// Transpose of 16 x 16 32-bit words in registers (4 stages of two-source permutes).
template <int b>
inline void tstage(__m512i* r) {
  alignas(64) int lo[16], hi[16];
  for (int c = 0; c < 16; ++c) {
    lo[c] = (c & b) == 0 ? c : 16 + c - b;
    hi[c] = (c & b) == 0 ? c + b : 16 + c;
  }
  const __m512i vlo = _mm512_load_si512(lo), vhi = _mm512_load_si512(hi);
  for (int i = 0; i < 16; ++i)
    if ((i & b) == 0) {
      const __m512i x = r[i], y = r[i + b];
      r[i] = _mm512_permutex2var_epi32(x, vlo, y);
      r[i + b] = _mm512_permutex2var_epi32(x, vhi, y);
    }
}
inline void transpose16(__m512i* r) {
  tstage<8>(r);
  tstage<4>(r);
  tstage<2>(r);
  tstage<1>(r);
}

// c (MR x NV vectors, fp32) += (A panel)(B panel) over kp pairs of K-pair interleaved words:
// a holds MR words per pair (broadcast), b NV * 16 words per pair (64-byte aligned).
template <int MR, int NV>
__attribute__((always_inline)) inline void dp_panels(__m512 (&c)[MR][NV], int kp,
                                                     const uint32_t* __restrict a,
                                                     const uint32_t* __restrict b) {
  for (int p = 0; p < kp; ++p) {
    __m512bh bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_load_si512(b + 16 * v);
    for (int i = 0; i < MR; ++i) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[i]);
      for (int v = 0; v < NV; ++v) c[i][v] = _mm512_dpbf16_ps(c[i][v], av, bv[v]);
    }
    a += MR;
    b += 16 * NV;
  }
}

}  // namespace sw::cpu::detail
