// Several weight matrices applied as one packed linear (models/llama.cpp's q|k|v and gate|up;
// the tensor-parallel units' local slices of them).
#pragma once
#include <cstdint>

#include "core/alloc.h"
#include "kernels/ops.h"
#include "models/unit.h"

namespace sw {

// ---- Packed linear ---------------------------------------------------------------------------
// Several (oc_i, C) weight matrices declared one after another, with optional biases (oc_i)
// (Qwen2's q, k, v); their outputs are written side by side into rows of width OC = sum oc_i:
// out(N,OC) = [x W_0^T + b_0 | x W_1^T + b_1 | ...]. When the matrices and the biases (and, for
// backward, their gradients) are contiguous in memory this is one linear op; otherwise one GEMM
// per matrix, a bias broadcast as a rank-1 product (ones (N) x b_i) under it.
struct Packed {
  // fp32, with a 16-bit copy where the unit has one; 16-bit only where the unit keeps no fp32
  // compute copy of product weights (ParamSpec::products_only)
  Operand w[3] = {nullptr, nullptr, nullptr};
  GradOut dw[3] = {nullptr, nullptr, nullptr};  // backward's (UnitCtx::grad_out)
  const float* b[3] = {nullptr, nullptr, nullptr};  // biases (all or none)
  GradOut db[3] = {nullptr, nullptr, nullptr};
  int oc[3];
  int n = 0;
  int total() const {
    int t = 0;
    for (int i = 0; i < n; ++i) t += oc[i];
    return t;
  }
  template <class Ptr>
  bool contiguous(Ptr const* p, int C) const {
    for (int i = 1; i < n; ++i)
      if (p[i] != p[i - 1] + static_cast<int64_t>(oc[i - 1]) * C) return false;
    return true;
  }
  bool biases_contiguous() const { return !b[0] || contiguous(b, 1); }
  // The weights one after another, in each form they have (a form absent from all of them
  // does not count).
  bool weights_contiguous(int C) const {
    const float* f[3] = {};
    const uint16_t* h[3] = {};
    for (int i = 0; i < n; ++i) f[i] = w[i].f32, h[i] = w[i].lp;
    return (!f[0] || contiguous(f, C)) && (!h[0] || contiguous(h, C));
  }
};

// out(N,OC) = x @ [W_0; W_1; ...]^T (+ [b_0 | b_1 | ...]); x fp32 or 16-bit.
void packed_forward(const Ops& ops, float* out, Operand x, const Packed& pk, int N, int C);
// The same into a ProductIn (16-bit straight from the product with 16-bit products).
void packed_forward_to(const Ops& ops, ProductIn out, Operand x, const Packed& pk, int N, int C);
// dx(N,C) = dout @ [W_0; W_1; ...] (written);  dW_i += dout[:, block i]^T @ x, db_i += colsum
// (= where written). dout and x fp32 or 16-bit.
void packed_backward_set(const Ops& ops, float* dx, Operand dout, Operand x, const Packed& pk,
                         int N, int C);

}  // namespace sw
