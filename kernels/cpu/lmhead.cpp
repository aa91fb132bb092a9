// Fused LM head + softmax cross-entropy.
//
// Rows are processed in chunks of at most kChunk rows; for each chunk:
//   logits(nc, V) = x_chunk(nc, C) @ w(V, C)^T                       (sgemm, all threads)
//   per row: max, sum of exp, lse, loss = lse - logit[target]          (OpenMP over rows)
//   with gradients, the chunk is turned in place into
//   dlogits = grad_scale * (softmax - onehot(target))                  (same pass)
//   dx_chunk += dlogits @ w ;  dw += dlogits^T @ x_chunk               (sgemm, all threads)
// so at most kChunk x V logits exist at a time. Ignored rows (target < 0) get loss 0 and a
// zero dlogits row. Per-row losses are fp32; the returned sum is taken over rows in order, in
// double. Results are bit-identical run to run for a fixed thread count (OpenBLAS partitions
// its GEMMs over M and N only, and every row is reduced by one thread).
//
// Chunk size: every chunk streams w (V x C) twice and dw once in and out, so the memory
// traffic per chunk is ~4*V*C floats against 6*nc*V*C flops; larger chunks raise the
// arithmetic intensity (and the K dimension of the dw GEMM) at the cost of nc*V*4 bytes of
// workspace (kept per thread between calls, see below; tracked as Mem::Workspace).
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

// Rows per chunk: kChunk, fewer when kChunk x V floats would exceed kChunkBytes (large
// vocabularies), never fewer than 64. Measured (GPT-2 124M head, N = 1024, C = 768,
// V = 50257, 1 thread, CPU time, fwd+bwd against the three unchunked sgemm calls): 64 rows 60%,
// 128 rows 65%, 256 rows 84-90%, 512 rows 89-98% (and 8% less time than 256 in a side-by-side
// run), 1024 rows 88%. Small chunks lose to OpenBLAS's packing (w is packed for every chunk,
// cost ~1/rows) and to memory traffic (each chunk streams w twice and dw in and out: 616 MB
// per chunk here). At V = 50257, 512 rows is 103 MB of logits.
constexpr int kChunk = 512;
// Logits per float partial sum of the softmax denominator (see the row pass).
constexpr int kSumBlock = 1 << 20;
constexpr size_t kChunkBytes = size_t(128) << 20;

int lmhead_chunk_rows(int N, int V) {
  const int by_bytes = (int)std::min<size_t>(kChunk, kChunkBytes / (sizeof(float) * (size_t)V));
  return std::min(N, std::max(64, by_bytes / 16 * 16));
}

double lmhead_xent(float* loss, float* dx, float* dw, const float* x, const float* w,
                   const int32_t* targets, int N, int C, int V, float grad_scale,
                   DType compute, const uint16_t* w16) {
  SW_CHECK(N >= 0 && C > 0 && V > 0, "lmhead_xent: bad shape");
  if (N == 0) return 0.0;
  detail::blas_select_core();
  const bool grad = dx != nullptr || dw != nullptr;
  const int chunk = lmhead_chunk_rows(N, V);
  // The logits chunk lives in a per-thread buffer kept between calls: a fresh 50-100 MB
  // allocation is mmap'ed by glibc and page-faulted (and zeroed by the kernel) on every call,
  // which cost ~2-3% of the LM head's time. It is tracked as Mem::Workspace.
  thread_local Buffer buf;
  float* logits = detail::grow_workspace(buf, (size_t)chunk * V);
  // Reduced precision (compute BF16 / F16): the products take rounded operands. Emulated
  // (rounded copies + sgemm, see gemm_bf16.cpp), w and x are rounded once per call and
  // dlogits in place in the row pass, so no product pays for rounding; the native and fused
  // kernels round while packing and get the originals.
  const bool lowp = compute != DType::F32;
  const LowpPath path = lowp ? lowp_auto_path(compute) : LowpPath::Emulated;
  const bool packs_round = lowp && path != LowpPath::Emulated;  // the kernel rounds
  // oneDNN: w, x and dlogits handed over in bf16 (issue 39: the fp32 forms were converted on
  // one thread at each of the three products of every chunk, w twice and dlogits twice per
  // chunk, ~5% of the small bf16 model's step with the other thread idle).
  const bool bf16_ops = lowp && lowp_onednn(compute);
  thread_local Buffer wbuf, xbuf, w16buf, x16buf, l16buf;
  const uint16_t* x16 = nullptr;
  uint16_t* l16 = nullptr;  // dlogits of the chunk in bf16 (written in the row pass)
  if (bf16_ops) {
    auto bf16_buf = [](Buffer& b, size_t n) {
      return reinterpret_cast<uint16_t*>(detail::grow_workspace(b, (n + 1) / 2));
    };
    if (!w16) {
      uint16_t* wp = bf16_buf(w16buf, (size_t)V * C);
      narrow(compute, w, wp, (size_t)V * C);
      w16 = wp;
    }
    uint16_t* xp = bf16_buf(x16buf, (size_t)N * C);
    narrow(compute, x, xp, (size_t)N * C);
    x16 = xp;
    if (grad) l16 = bf16_buf(l16buf, (size_t)chunk * V);
  }
  const float* wr = w;
  const float* xr = x;
  if (lowp && !packs_round) {
    float* wp = detail::grow_workspace(wbuf, (size_t)V * C);
    float* xp = detail::grow_workspace(xbuf, (size_t)N * C);
    round_to(compute, wp, w, (size_t)V * C);
    round_to(compute, xp, x, (size_t)N * C);
    wr = wp, xr = xp;
  }
  auto mm = [packs_round, compute](bool ta, bool tb, int M, int Nn, int K, const float* A,
                                    int lda, const float* B, int ldb, float beta, float* Cm,
                                    int ldc) {
    if (packs_round)
      gemm_lowp(compute, ta, tb, M, Nn, K, 1.f, A, lda, B, ldb, beta, Cm, ldc);  // Auto: per shape
    else
      detail::sgemm(ta, tb, M, Nn, K, 1.f, A, lda, B, ldb, beta, Cm, ldc);
  };

  double total = 0.0;
  thread_local Buffer rlbuf;  // per-row losses of a chunk
  // w's packed forms (x w^T, dlogits w) made once for all chunks by the own bf16 kernels.
  const detail::ReusePackedB reuse_w;
  float* rl = detail::grow_workspace(rlbuf, (size_t)chunk);

  for (int n0 = 0; n0 < N; n0 += chunk) {
    const int nc = std::min(chunk, N - n0);
    const float* xc = xr + (size_t)n0 * C;
    if (bf16_ops)
      detail::gemm_bf16_16(false, true, nc, V, C, 1.f, nullptr, x16 + (size_t)n0 * C, C,
                               nullptr, w16, C, 0.f, logits, V);
    else
      mm(false, true, nc, V, C, xc, C, wr, C, 0.f, logits, V);

#pragma omp parallel for schedule(static)
    for (int r = 0; r < nc; ++r) {
      float* row = logits + (size_t)r * V;
      const int t = targets[n0 + r];
      SW_CHECK(t < V, "lmhead_xent: target id >= vocabulary size");
      if (t < 0) {
        rl[r] = 0.f;
        if (grad) std::memset(row, 0, sizeof(float) * V);
        if (l16) std::memset(l16 + (size_t)r * V, 0, sizeof(uint16_t) * V);
        continue;
      }
      const float mx = detail::row_max(row, V);
      const float lt = row[t];
      // The sum of exp(logit - max): in float within blocks of kSumBlock logits (vectorised;
      // one block, as before, up to 2^20), the blocks added in double. One float accumulator
      // stops growing at 2^24 terms near 1 (a scalar build's reduction over a vocabulary past
      // 16M ids).
      double block_sums = 0.0;
      for (int v0 = 0, v1; v0 < V; v0 = v1) {  // (v0 + kSumBlock may pass INT_MAX)
        v1 = V - v0 > kSumBlock ? v0 + kSumBlock : V;
        float s = 0.f;
        if (grad) {
          // Keep exp(logit - max) in place; it becomes grad_scale * softmax below.
#pragma omp simd reduction(+ : s)
          for (int v = v0; v < v1; ++v) {
            const float e = detail::exp_approx(row[v] - mx);
            row[v] = e;
            s += e;
          }
        } else {
#pragma omp simd reduction(+ : s)
          for (int v = v0; v < v1; ++v) s += detail::exp_approx(row[v] - mx);
        }
        block_sums += s;
      }
      const float sum = static_cast<float>(block_sums);
      rl[r] = mx + std::log(sum) - lt;
      if (grad) {
        // dlogits = grad_scale * softmax - grad_scale * onehot(target)
        const float k = grad_scale / sum;
        if (l16) {  // (the products read only these: written straight from the scaled values)
          uint16_t* o = l16 + (size_t)r * V;
#pragma omp simd
          for (int v = 0; v < V; ++v) o[v] = detail::bf16_round(row[v] * k);
          o[t] = detail::bf16_round(row[t] * k - grad_scale);
          continue;
        }
#pragma omp simd
        for (int v = 0; v < V; ++v) row[v] *= k;
        row[t] -= grad_scale;
        if (lowp && !packs_round) round_to(compute, row, row, V);  // else the kernel rounds
      }
    }
    for (int r = 0; r < nc; ++r) {
      if (loss) loss[n0 + r] = rl[r];
      total += rl[r];
    }
    if (bf16_ops) {
      if (dx)
        detail::gemm_bf16_16(false, false, nc, C, V, 1.f, nullptr, l16, V, nullptr, w16, C,
                                 1.f, dx + (size_t)n0 * C, C);
      if (dw)
        detail::gemm_bf16_16(true, false, V, C, nc, 1.f, nullptr, l16, V, nullptr,
                                 x16 + (size_t)n0 * C, C, 1.f, dw, C);
      continue;
    }
    if (dx)
      mm(false, false, nc, C, V, logits, V, wr, C, 1.f, dx + (size_t)n0 * C, C);
    if (dw) mm(true, false, V, C, nc, logits, V, xc, C, 1.f, dw, C);
  }
  return total;
}

}  // namespace sw::cpu
