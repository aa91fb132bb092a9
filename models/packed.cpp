#include "models/packed.h"

#include <algorithm>

namespace sw {

namespace {
// N ones, for the per-matrix path's bias broadcasts and sums (a workspace on ops' device).
Buffer ones(const Ops& ops, int N) {
  Buffer b(size_t(std::max(N, 1)) * sizeof(float), Mem::Workspace, ops.device());
  ops.fill(b.f32(), 1.f, size_t(std::max(N, 0)));
  return b;
}

}  // namespace

// out(N,OC) = x @ [W_0; W_1; ...]^T (+ [b_0 | b_1 | ...]); x fp32 or 16-bit (a ProductIn's
// operand).
void packed_forward(const Ops& ops, float* out, Operand x, const Packed& pk, int N, int C) {
  const int OC = pk.total();
  if (pk.weights_contiguous(C) && pk.biases_contiguous()) {
    ops.linear_forward(out, x, pk.w[0], pk.b[0], nullptr, N, C, OC);
    return;
  }
  Buffer one;
  if (pk.b[0]) one = ones(ops, N);
  for (int i = 0, off = 0; i < pk.n; off += pk.oc[i], ++i) {
    float beta = 0.f;
    if (pk.b[i]) {  // out block = ones (N,1) @ b_i (1,oc_i)
      ops.gemm(false, false, N, pk.oc[i], 1, 1.f, one.f32(), 1, pk.b[i], pk.oc[i], 0.f,
               out + off, OC);
      beta = 1.f;
    }
    ops.gemm(false, true, N, pk.oc[i], C, 1.f, x, C, pk.w[i], C, beta, out + off, OC);
  }
}

// The same into a ProductIn: 16-bit straight from the product with 16-bit products (one
// GEMM where the weights are contiguous; else the fp32 products in a workspace, narrowed).
void packed_forward_to(const Ops& ops, ProductIn out, Operand x, const Packed& pk, int N, int C) {
  if (!out.lp) return packed_forward(ops, out.f32, x, pk, N, C);
  const int OC = pk.total();
  if (pk.weights_contiguous(C) && pk.biases_contiguous())
    return ops.linear_forward(out.lp, x, pk.w[0], pk.b[0], nullptr, N, C, OC);
  const size_t n = size_t(std::max(N, 0)) * size_t(std::max(OC, 0));
  Buffer t(std::max<size_t>(n, 1) * sizeof(float), Mem::Workspace, ops.device());
  packed_forward(ops, t.f32(), x, pk, N, C);
  ops.narrow(ops.compute(), t.f32(), out.lp, n);
}

// dx(N,C) = dout @ [W_0; W_1; ...] (dx's old contents never read);  dW_i += dout[:, block i]^T @ x
// and db_i += colsum(dout[:, block i]) (= where written). dout and x fp32 or 16-bit.
void packed_backward_set(const Ops& ops, float* dx, Operand dout, Operand x, const Packed& pk,
                         int N, int C) {
  const int OC = pk.total();
  const float* dwp[3] = {};
  const float* dbp[3] = {};
  bool same = true;  // every gradient written, or every one added into
  for (int i = 0; i < pk.n; ++i) {
    dwp[i] = pk.dw[i].p, dbp[i] = pk.db[i].p;
    same = same && pk.dw[i].write == pk.dw[0].write && pk.db[i].write == pk.db[0].write;
  }
  if (pk.weights_contiguous(C) && pk.contiguous(dwp, C) &&
      (!dbp[0] || pk.contiguous(dbp, 1)) && same) {
    ops.linear_backward(GradIn::set(dx), pk.dw[0], pk.db[0], dout, x, pk.w[0], N, C, OC);
    return;
  }
  Buffer one;
  if (pk.db[0]) one = ones(ops, N);
  for (int i = 0, off = 0; i < pk.n; off += pk.oc[i], ++i) {
    const Operand d = dout.at(size_t(off));
    ops.gemm(false, false, N, C, pk.oc[i], 1.f, d, OC, pk.w[i], C, i ? 1.f : 0.f, dx, C);
    ops.gemm(true, false, pk.oc[i], C, N, 1.f, d, OC, x, C, pk.dw[i].beta(), pk.dw[i].p, C);
    if (pk.db[i])  // db_i (1,oc_i) = ones (1,N) @ dout block (N,oc_i)
      ops.gemm(false, false, 1, pk.oc[i], N, 1.f, one.f32(), N, d, OC, pk.db[i].beta(),
               pk.db[i].p, pk.oc[i]);
  }
}

}  // namespace sw
