// CPU kernels of tensor parallelism (kernels/cpu/tp_kernels.h).
//
// Embedding: the lookups and their backward follow embedding.cpp (rows in parallel forward;
// backward split over the channels, every thread walking all rows in order over its own
// 16-float column range, so each element is summed in row order whatever the thread count).
//
// Cross-entropy over a vocabulary shard, as lmhead.cpp's fused head but in two passes, each
// over chunks of at most lmhead_chunk_rows(N, V) rows, never holding the (N, V) logits:
//   stats:    logits_c = h_c @ w^T; per row (OpenMP): max, sum of exp(logit - max) (the same
//             blocked float sums as lmhead_xent), the target's logit where this shard has it;
//   backward: logits_c again; per row g = grad_scale * (exp(logit - lse) - onehot) in place;
//             dh_c += g @ w; dw += g^T @ h_c.
// So the shard runs the forward product twice (once per pass) where lmhead_xent runs it once:
// four products against three. The products go through lmhead_xent's path (plain sgemm in
// fp32; in BF16 / F16 gemm_lowp on the originals where its kernels round while packing, else
// sgemm on copies of w and h rounded once per call and g rounded in the row pass), so a 16-bit
// Ops rounds the operands as lmhead_xent does.
#include "kernels/cpu/tp_kernels.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/alloc.h"
#include "core/error.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/cpu_kernels.h"

namespace sw::cpu {

namespace {

constexpr size_t kParallelMin = size_t{1} << 14;  // elements (embedding.cpp's threshold)
constexpr int kSumBlock = 1 << 20;                // logits per float partial sum (lmhead.cpp)

bool in_shard(int32_t tok, int64_t v_lo, int V) {
  return int64_t(tok) >= v_lo && int64_t(tok) < v_lo + V;
}

// Adds row src(rows, C) into dst rows dst_row(i) (negative: skipped), each element in row
// order: threads split the channels on 16-float boundaries (embedding_backward's scheme).
template <class RowOf>
void add_rows_by_columns(float* dst, const float* src, int rows, int C, RowOf dst_row) {
#pragma omp parallel if (parallel : static_cast<size_t>(rows) * C >= kParallelMin)
  {
    const int nt = omp_get_num_threads(), th = omp_get_thread_num();
    const int lines = (C + 15) / 16;
    const int c0 = std::min(C, lines * th / nt * 16);
    const int c1 = std::min(C, lines * (th + 1) / nt * 16);
    if (c1 > c0) {
      for (int i = 0; i < rows; ++i) {
        const int64_t r = dst_row(i);
        if (r < 0) continue;
        const float* d = src + static_cast<size_t>(i) * C;
        float* e = dst + static_cast<size_t>(r) * C;
#pragma omp simd
        for (int c = c0; c < c1; ++c) e[c] += d[c];
      }
    }
  }
}

// The products of the two xent passes, as lmhead_xent runs them: the operands w (V x C) and h
// (N x C) rounded once per call into copies where the path does not round while packing.
struct ShardProducts {
  DType compute;
  bool lowp, packs_round;
  const float* w;
  const float* h;
  ShardProducts(DType c, const float* w0, const float* h0, int N, int C, int V)
      : compute(c), lowp(c != DType::F32), w(w0), h(h0) {
    detail::blas_select_core();
    packs_round = lowp && lowp_auto_path(compute) != LowpPath::Emulated;
    if (lowp && !packs_round) {
      thread_local Buffer wbuf, hbuf;
      float* wp = detail::grow_workspace(wbuf, (size_t)V * C);
      float* hp = detail::grow_workspace(hbuf, (size_t)N * C);
      round_to(compute, wp, w0, (size_t)V * C);
      round_to(compute, hp, h0, (size_t)N * C);
      w = wp, h = hp;
    }
  }
  // Whether the row pass must round g itself (emulated products).
  bool rounds_rows() const { return lowp && !packs_round; }
  void mm(bool ta, bool tb, int M, int Nn, int K, const float* A, int lda, const float* B,
          int ldb, float beta, float* Cm, int ldc) const {
    if (packs_round)
      gemm_lowp(compute, ta, tb, M, Nn, K, 1.f, A, lda, B, ldb, beta, Cm, ldc);
    else
      detail::sgemm(ta, tb, M, Nn, K, 1.f, A, lda, B, ldb, beta, Cm, ldc);
  }
};

// The logits chunk both passes use, kept between calls (a fresh buffer of tens of MB is
// page-faulted on every call; lmhead.cpp); tracked as Mem::Workspace.
float* logits_chunk(size_t floats) {
  thread_local Buffer buf;
  return detail::grow_workspace(buf, floats);
}

}  // namespace

void vocab_embedding_forward(float* out, const int32_t* tokens, const float* wte,
                             const uint16_t* wte16, DType dt, int64_t v_lo, int N, int C, int V) {
#pragma omp parallel for schedule(static) if (parallel : static_cast<size_t>(N) * C >= kParallelMin)
  for (int n = 0; n < N; ++n) {
    float* o = out + static_cast<size_t>(n) * C;
    if (!in_shard(tokens[n], v_lo, V)) {
      std::memset(o, 0, static_cast<size_t>(C) * sizeof(float));
      continue;
    }
    const size_t row = static_cast<size_t>(int64_t(tokens[n]) - v_lo) * C;
    if (wte) {
      std::memcpy(o, wte + row, static_cast<size_t>(C) * sizeof(float));
    } else {
      const uint16_t* e = wte16 + row;
      for (int i = 0; i < C; ++i) o[i] = dt == DType::BF16 ? bf16_to_f32(e[i]) : f16_to_f32(e[i]);
    }
  }
}

void vocab_embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int64_t v_lo,
                              int N, int C, int V) {
  add_rows_by_columns(dwte, dout, N, C, [&](int n) -> int64_t {
    return in_shard(tokens[n], v_lo, V) ? int64_t(tokens[n]) - v_lo : -1;
  });
}

void position_forward(float* out, const float* wpe, int64_t row_lo, int rows, int T, int C) {
#pragma omp parallel for schedule(static) if (parallel : static_cast<size_t>(rows) * C >= kParallelMin)
  for (int i = 0; i < rows; ++i) {
    float* o = out + static_cast<size_t>(i) * C;
    const float* p = wpe + static_cast<size_t>((row_lo + i) % T) * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] += p[c];
  }
}

void position_backward(float* dwpe, const float* dout, int64_t row_lo, int rows, int T, int C) {
  add_rows_by_columns(dwpe, dout, rows, C, [&](int i) -> int64_t { return (row_lo + i) % T; });
}

size_t xent_shard_chunk_floats(int N, int V) {
  return N > 0 && V > 0 ? (size_t)lmhead_chunk_rows(N, V) * V : 0;
}

void xent_shard_stats(float* stats, const float* h, const float* w, const int32_t* targets,
                      int64_t v_lo, int N, int C, int V, DType compute) {
  SW_CHECK(N >= 0 && C > 0 && V > 0, "xent_shard_stats: bad shape");
  if (N == 0) return;
  const int chunk = lmhead_chunk_rows(N, V);
  float* logits = logits_chunk((size_t)chunk * V);
  const ShardProducts pr(compute, w, h, N, C, V);
  for (int n0 = 0; n0 < N; n0 += chunk) {
    const int nc = std::min(chunk, N - n0);
    pr.mm(false, true, nc, V, C, pr.h + (size_t)n0 * C, C, pr.w, C, 0.f, logits, V);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < nc; ++r) {
      const float* row = logits + (size_t)r * V;
      const float mx = detail::row_max(row, V);
      // lmhead_xent's sum: float within blocks of kSumBlock logits, the blocks in double.
      double block_sums = 0.0;
      for (int v0 = 0, v1; v0 < V; v0 = v1) {
        v1 = V - v0 > kSumBlock ? v0 + kSumBlock : V;
        float s = 0.f;
#pragma omp simd reduction(+ : s)
        for (int v = v0; v < v1; ++v) s += detail::exp_approx(row[v] - mx);
        block_sums += s;
      }
      const int32_t t = targets[n0 + r];
      float* st = stats + (size_t)(n0 + r) * 3;
      st[0] = mx;
      st[1] = static_cast<float>(block_sums);
      st[2] = in_shard(t, v_lo, V) ? row[int64_t(t) - v_lo] : 0.f;
    }
  }
}

double xent_shard_combine(float* lse, float* loss, const float* stats, const int32_t* targets,
                          int t, int N) {
  SW_CHECK(t >= 1 && N >= 0, "xent_shard_combine: bad shape");
  const size_t rank_stride = (size_t)N * 3;
#pragma omp parallel for schedule(static) if (parallel : static_cast<size_t>(N) * t >= kParallelMin)
  for (int n = 0; n < N; ++n) {
    float M = -std::numeric_limits<float>::infinity();
    for (int k = 0; k < t; ++k) M = std::max(M, stats[k * rank_stride + (size_t)n * 3]);
    // The denominator in double, in rank order; then, as lmhead_xent, lse = max + log(sum) in
    // float (one shard: exp(0) = 1, so the bits of lmhead_xent's loss).
    double S = 0.0;
    float tl = 0.f;
    for (int k = 0; k < t; ++k) {
      const float* st = stats + k * rank_stride + (size_t)n * 3;
      if (st[1] > 0.f) S += double(st[1]) * std::exp(double(st[0]) - double(M));
      tl += st[2];
    }
    const float l = M + std::log(static_cast<float>(S));
    lse[n] = l;
    loss[n] = targets[n] < 0 ? 0.f : l - tl;
  }
  double total = 0.0;
  for (int n = 0; n < N; ++n) total += loss[n];
  return total;
}

void xent_shard_backward(float* dh, float* dw, float dw_beta, const float* h, const float* w,
                         const float* lse, const int32_t* targets, int64_t v_lo, int N, int C,
                         int V, float grad_scale, DType compute) {
  SW_CHECK(N >= 0 && C > 0 && V > 0, "xent_shard_backward: bad shape");
  if (!dh && !dw) return;
  if (N == 0) {
    if (dw && dw_beta == 0.f) std::memset(dw, 0, sizeof(float) * (size_t)V * C);  // written
    return;
  }
  const int chunk = lmhead_chunk_rows(N, V);
  float* logits = logits_chunk((size_t)chunk * V);
  const ShardProducts pr(compute, w, h, N, C, V);
  for (int n0 = 0; n0 < N; n0 += chunk) {
    const int nc = std::min(chunk, N - n0);
    const float* hc = pr.h + (size_t)n0 * C;
    pr.mm(false, true, nc, V, C, hc, C, pr.w, C, 0.f, logits, V);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < nc; ++r) {
      float* row = logits + (size_t)r * V;
      const int32_t t = targets[n0 + r];
      if (t < 0) {
        std::memset(row, 0, sizeof(float) * V);
        continue;
      }
      const float l = lse[n0 + r];
#pragma omp simd
      for (int v = 0; v < V; ++v) row[v] = grad_scale * detail::exp_approx(row[v] - l);
      if (in_shard(t, v_lo, V)) row[int64_t(t) - v_lo] -= grad_scale;
      if (pr.rounds_rows()) round_to(compute, row, row, V);  // else the kernel rounds
    }
    if (dh) pr.mm(false, false, nc, C, V, logits, V, pr.w, C, 1.f, dh + (size_t)n0 * C, C);
    if (dw) pr.mm(true, false, V, C, nc, logits, V, hc, C, n0 == 0 ? dw_beta : 1.f, dw, C);
  }
}

}  // namespace sw::cpu
