// Token (+ position) embedding lookup and its backward.
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/cpu_kernels.h"

namespace sw::cpu {

namespace {
constexpr size_t kParallelMin = size_t{1} << 14;  // elements
}

// out(B,T,C) = wte[tokens[b,t]] + wpe[t]; wpe may be null.
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int B, int T, int C) {
  const int BT = B * T;
#pragma omp parallel for schedule(static) if (parallel : static_cast<size_t>(BT) * C >= kParallelMin)
  for (int n = 0; n < BT; ++n) {
    float* o = out + static_cast<size_t>(n) * C;
    const float* e = wte + static_cast<size_t>(tokens[n]) * C;
    if (wpe) {
      const float* p = wpe + static_cast<size_t>(n % T) * C;
#pragma omp simd
      for (int i = 0; i < C; ++i) o[i] = e[i] + p[i];
    } else {
      std::memcpy(o, e, static_cast<size_t>(C) * sizeof(float));
    }
  }
}

// The same from a 16-bit table (dt BF16 / F16): each row widened, then + wpe as above.
void embedding_forward_lp(DType dt, float* out, const int32_t* tokens, const uint16_t* wte16,
                          const float* wpe, int B, int T, int C) {
  const int BT = B * T;
#pragma omp parallel for schedule(static) if (parallel : static_cast<size_t>(BT) * C >= kParallelMin)
  for (int n = 0; n < BT; ++n) {
    float* o = out + static_cast<size_t>(n) * C;
    const uint16_t* e = wte16 + static_cast<size_t>(tokens[n]) * C;
    const float* p = wpe ? wpe + static_cast<size_t>(n % T) * C : nullptr;
    for (int i = 0; i < C; ++i) {
      const float v = dt == DType::BF16 ? bf16_to_f32(e[i]) : f16_to_f32(e[i]);
      o[i] = p ? v + p[i] : v;
    }
  }
}

// dwte[tokens[b,t]] += dout[b,t];  dwpe[t] += dout[b,t] (dwpe may be null).
// Repeated tokens make rows of dwte collide, so threads split the channel dimension instead of
// the rows: every thread walks all B*T rows in order over its own column range (cut on 16-float
// cache-line boundaries). No two threads ever touch the same float or cache line, and each
// element is summed in row order, so the result is independent of the thread count.
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                        int T, int C) {
  const int BT = B * T;
#pragma omp parallel if (parallel : static_cast<size_t>(BT) * C >= kParallelMin)
  {
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int lines = (C + 15) / 16;
    const int c0 = std::min(C, lines * t / nt * 16);
    const int c1 = std::min(C, lines * (t + 1) / nt * 16);
    if (c1 > c0) {
      for (int n = 0; n < BT; ++n) {
        const float* d = dout + static_cast<size_t>(n) * C;
        float* e = dwte + static_cast<size_t>(tokens[n]) * C;
#pragma omp simd
        for (int i = c0; i < c1; ++i) e[i] += d[i];
        if (dwpe) {
          float* p = dwpe + static_cast<size_t>(n % T) * C;
#pragma omp simd
          for (int i = c0; i < c1; ++i) p[i] += d[i];
        }
      }
    }
  }
}

}  // namespace sw::cpu
