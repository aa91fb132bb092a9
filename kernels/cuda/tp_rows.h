// The per-element arithmetic of the vocabulary-parallel cross-entropy's CUDA kernels
// (tp_kernels.cu), as functions both nvcc and a plain C++ compiler build: the kernels call
// them on the device and tests/cuda/test_tp_twin.cpp runs the same code on the host (its
// model of the kernels' reductions around them) against the CPU's Ops, on every machine.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define SW_TP_HD __host__ __device__ __forceinline__
#else
#define SW_TP_HD inline
#endif

namespace sw::cuda::tp {

SW_TP_HD bool in_shard(int32_t tok, int64_t v_lo, int V) {
  return int64_t(tok) >= v_lo && int64_t(tok) < v_lo + V;
}

// One thread's step of the online maximum and sum of exponentials over W more logits x: the
// running sum is rescaled when the maximum grows (lmhead_xent's xent_rows_k).
template <int W>
SW_TP_HD void online_step(float& mx, float& sum, const float (&x)[W]) {
  float m = x[0];
  for (int k = 1; k < W; ++k) m = fmaxf(m, x[k]);
  const float nm = fmaxf(mx, m);
  if (nm == -INFINITY) return;  // all -inf so far: they add 0 (and -inf - -inf is NaN)
  float s = 0.f;
  for (int k = 0; k < W; ++k) s += expf(x[k] - nm);
  sum = sum * expf(mx - nm) + s;  // (mx = -inf first: expf(-inf) = 0, and sum is 0)
  mx = nm;
}
// A thread's sum rescaled to the row's maximum rmx, before the block's sum (a thread without
// logits holds mx = -inf, sum 0: it adds 0).
SW_TP_HD float rescaled(float mx, float sum, float rmx) {
  return mx == -INFINITY ? 0.f : sum * expf(mx - rmx);
}

// Row n of the combine over t ranks' stats (rank k's at stats + k * stride, {m, s, tl} per
// row), the CPU's formulas (kernels/cpu/tp_kernels.cpp): M = max m_k, the denominator in
// double in rank order, lse = M + log(S) in float; loss 0 for an ignored row.
SW_TP_HD void combine_row(const float* stats, size_t stride, int t, int n, int32_t target,
                          float* lse, float* loss) {
  float M = -INFINITY;
  for (int k = 0; k < t; ++k) {
    const float m = stats[k * stride + static_cast<size_t>(n) * 3];
    M = M < m ? m : M;  // std::max's choice
  }
  double S = 0.0;
  float tl = 0.f;
  for (int k = 0; k < t; ++k) {
    const float* st = stats + k * stride + static_cast<size_t>(n) * 3;
    if (st[1] > 0.f) S += double(st[1]) * exp(double(st[0]) - double(M));
    tl += st[2];
  }
  const float l = M + logf(static_cast<float>(S));
  lse[n] = l;
  loss[n] = target < 0 ? 0.f : l - tl;
}

// The gradient of one logit: grad_scale * exp(logit - lse), less grad_scale at the target (the
// CPU's two steps and roundings).
SW_TP_HD float shard_grad(float logit, float lse, float grad_scale, bool target) {
  const float g = grad_scale * expf(logit - lse);
  return target ? g - grad_scale : g;
}

}  // namespace sw::cuda::tp
