// Causal self-attention with grouped-query heads, FlashAttention-style on the CPU.
//
// qkv: (B, T, R) with R = (H + 2*KVH) * hd, each row laid out [q heads | k heads | v heads];
// query head h reads kv head g = h / (H / KVH). out: (B, T, H*hd). lse: (B, H, T).
//
// Forward: one task per (b, h, query tile of BQ rows). Keys are visited in tiles of BK columns
// up to the tile's last row (tiles wholly above the diagonal are skipped) with an online
// softmax (running max m, running sum l, output rescaled when m grows), so a thread holds one
// BQ x BK score tile, never a (T, T) matrix. Tasks are independent, so any schedule gives the
// same bits.
//
// Backward: one task per (b, h). D = rowsum(dout * out) first; then for each key tile j, for
// each query tile i that can see it: S = scale Q_i K_j^T, P = exp(S - lse_i) (causal mask),
// dV_j += P^T dO_i, dP = dO_i V_j^T, dS = scale * P * (dP - D_i), dQ_i += dS K_j,
// dK_j += dS^T Q_i. dQ rows of head h belong to this task only. With MHA the task also owns
// its dK/dV columns and accumulates straight into dqkv; with GQA several query heads share a
// kv head, so each task writes its partial dK/dV into a per-(b,h) scratch, and a second pass
// adds the partials into dqkv in fixed head order (no races, bit-identical reruns).
//
// The tile products are small sgemm calls; inside our parallel regions OpenBLAS's OpenMP
// build runs them single-threaded.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
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
using detail::sgemm;

void check_shapes(int B, int T, int H, int KVH, int hd) {
  SW_CHECK(B >= 0 && T >= 0 && H > 0 && KVH > 0 && hd > 0, "attention: bad shape");
  SW_CHECK(H % KVH == 0, "attention: KVH must divide H");
}

}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int H, int KVH,
                       int hd) {
  check_shapes(B, T, H, KVH, hd);
  if (B == 0 || T == 0) return;
  detail::blas_select_core();
  const int R = (H + 2 * KVH) * hd, CO = H * hd, rep = H / KVH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int nqt = (T + kFwdBQ - 1) / kFwdBQ;
  const int ntasks = B * H * nqt;
  const float ninf = -std::numeric_limits<float>::infinity();

#pragma omp parallel
  {
    std::vector<float> S((size_t)kFwdBQ * kFwdBK);
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
        const int j1 = std::min(i1, j0 + kFwdBK), nk = j1 - j0;
        sgemm(false, true, nq, nk, hd, scale, Q, R, K + (size_t)j0 * R, R, 0.f, S.data(), nk);
        for (int r = 0; r < nq; ++r) {
          float* row = S.data() + (size_t)r * nk;
          const int nv = std::clamp(i0 + r - j0 + 1, 0, nk);  // keys j <= i are visible
          for (int c = nv; c < nk; ++c) row[c] = 0.f;
          if (nv == 0) continue;
          float mx = ninf;
#pragma omp simd reduction(max : mx)
          for (int c = 0; c < nv; ++c) mx = std::max(mx, row[c]);
          const float mnew = std::max(m[r], mx);
          float sum = 0.f;
#pragma omp simd reduction(+ : sum)
          for (int c = 0; c < nv; ++c) {
            const float p = exp_approx(row[c] - mnew);
            row[c] = p;
            sum += p;
          }
          if (j0 > 0 && mnew > m[r]) {  // rescale what earlier key tiles accumulated
            const float alpha = exp_approx(m[r] - mnew);
            float* o = O + (size_t)r * CO;
            for (int c = 0; c < hd; ++c) o[c] *= alpha;
            l[r] *= alpha;
          }
          l[r] += sum;
          m[r] = mnew;
        }
        // O (+)= P V_j; the first key tile overwrites (out is an output, not accumulated).
        sgemm(false, false, nq, hd, nk, 1.f, S.data(), nk, V + (size_t)j0 * R, R,
              j0 == 0 ? 0.f : 1.f, O, CO);
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
                        const float* lse, int B, int T, int H, int KVH, int hd) {
  check_shapes(B, T, H, KVH, hd);
  if (B == 0 || T == 0) return;
  detail::blas_select_core();
  const int R = (H + 2 * KVH) * hd, CO = H * hd, rep = H / KVH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const bool gqa = rep > 1;
  // GQA partials: per (b, h), dK then dV, each (T, hd).
  Buffer scratch;
  if (gqa) scratch = Buffer(sizeof(float) * (size_t)B * H * 2 * T * hd, Mem::Workspace);
  float* part = scratch.f32();

#pragma omp parallel
  {
    std::vector<float> P((size_t)kBwdBQ * kBwdBK), dS((size_t)kBwdBQ * kBwdBK);
    std::vector<float> D(T);
#pragma omp for schedule(dynamic, 1)
    for (int bh = 0; bh < B * H; ++bh) {
      const int b = bh / H, h = bh % H, g = h / rep;
      const size_t base = (size_t)b * T * R;
      const float* Q = qkv + base + (size_t)h * hd;
      const float* K = qkv + base + (size_t)(H + g) * hd;
      const float* V = qkv + base + (size_t)(H + KVH + g) * hd;
      float* dQ = dqkv + base + (size_t)h * hd;
      const float* O = out + (size_t)b * T * CO + (size_t)h * hd;
      const float* dO = dout + (size_t)b * T * CO + (size_t)h * hd;
      const float* L = lse + (size_t)bh * T;
      float *dK, *dV;
      int ldkv;
      if (gqa) {
        dK = part + (size_t)bh * 2 * T * hd;
        dV = dK + (size_t)T * hd;
        ldkv = hd;
      } else {
        dK = dqkv + base + (size_t)(H + g) * hd;
        dV = dqkv + base + (size_t)(H + KVH + g) * hd;
        ldkv = R;
      }
      for (int i = 0; i < T; ++i) {
        const float* o = O + (size_t)i * CO;
        const float* d = dO + (size_t)i * CO;
        float s = 0.f;
#pragma omp simd reduction(+ : s)
        for (int c = 0; c < hd; ++c) s += o[c] * d[c];
        D[i] = s;
      }

      for (int j0 = 0; j0 < T; j0 += kBwdBK) {
        const int j1 = std::min(T, j0 + kBwdBK), nk = j1 - j0;
        const float* Kj = K + (size_t)j0 * R;
        const float* Vj = V + (size_t)j0 * R;
        float* dKj = dK + (size_t)j0 * ldkv;
        float* dVj = dV + (size_t)j0 * ldkv;
        bool first = true;
        for (int i0 = (j0 / kBwdBQ) * kBwdBQ; i0 < T; i0 += kBwdBQ) {
          const int i1 = std::min(T, i0 + kBwdBQ), nq = i1 - i0;
          if (i1 <= j0) continue;  // every row of this query tile is above the key tile
          const float* Qi = Q + (size_t)i0 * R;
          const float* dOi = dO + (size_t)i0 * CO;
          sgemm(false, true, nq, nk, hd, scale, Qi, R, Kj, R, 0.f, P.data(), nk);
          sgemm(false, true, nq, nk, hd, 1.f, dOi, CO, Vj, R, 0.f, dS.data(), nk);
          for (int r = 0; r < nq; ++r) {
            float* p = P.data() + (size_t)r * nk;
            float* ds = dS.data() + (size_t)r * nk;
            const int nv = std::clamp(i0 + r - j0 + 1, 0, nk);
            const float li = L[i0 + r], di = D[i0 + r];
#pragma omp simd
            for (int c = 0; c < nv; ++c) {
              const float pv = exp_approx(p[c] - li);
              p[c] = pv;
              ds[c] = scale * pv * (ds[c] - di);
            }
            for (int c = nv; c < nk; ++c) p[c] = 0.f, ds[c] = 0.f;
          }
          // With GQA the scratch starts undefined: the first contribution overwrites it.
          const float beta = (gqa && first) ? 0.f : 1.f;
          first = false;
          sgemm(true, false, nk, hd, nq, 1.f, P.data(), nk, dOi, CO, beta, dVj, ldkv);
          sgemm(true, false, nk, hd, nq, 1.f, dS.data(), nk, Qi, R, beta, dKj, ldkv);
          sgemm(false, false, nq, hd, nk, 1.f, dS.data(), nk, Kj, R, 1.f, dQ + (size_t)i0 * R, R);
        }
      }
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
