// A 16 x 16 transpose of 32-bit words held in 16 zmm registers (AVX-512F), for the kernels'
// packing passes. Include only from files compiled with -mavx512f (kernels/CMakeLists).
#pragma once

#include <immintrin.h>

namespace sw::cpu::detail {

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

}  // namespace sw::cpu::detail
