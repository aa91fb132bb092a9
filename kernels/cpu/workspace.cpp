// The CPU backend's kernel workspace for a described training step (kernels/ops.h
// kernel_workspace). Its kernels keep grow-only thread-local buffers between calls (a fresh
// buffer of tens of MB would be page-faulted on every call), tracked as Mem::Workspace: after
// the first step each is as large as the largest call of a step made it, and stays so. The
// declaration is the sum of those final sizes, from the sizes each kernel file states
// (cpu_kernels.h *_floats / lmhead_chunk_rows), for the engine's calls of a GPT-2 or Llama
// step (models/gpt2.cpp, llama.cpp) on the CPU: the calling thread's buffers once, attention's
// tile scratch once per OpenMP thread. Grouped attention's expanded K and V live only inside
// its backward call: a transient (WorkspaceDecl::backward_transient).
// In 16-bit compute the products' scratch depends on the path gemm_lowp takes on this machine
// (cpu_kernels.h LowpPath), which this asks for as the products do. With fp8 linears
// (StepShape::fp8) the blocks' products are fp8.cpp's instead (fp8_scratch below).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu/attention_bf16.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/ops.h"

namespace sw::cpu {

namespace {
// A grow-only buffer of n floats, as grow_workspace sizes it (at least one float).
int64_t floats(int64_t n) { return 4 * std::max<int64_t>(n, 1); }
// n 16-bit values in a float buffer (gemm_onednn.cpp's workspace: (n + 1) / 2 floats).
int64_t halves(int64_t n) { return floats((n + 1) / 2); }

// The fp8 linears (kernels/fp8_ops.cpp Fp8Ops over fp8.cpp's primitives) of the blocks' four
// products, N rows each: inputs of C_in <= in columns, outputs of OC <= oc, weights of OC x C_in
// <= wmax values. fp8.cpp keeps per slot the largest a call asked for, a quantised value in
// 2 bytes: 0 x (forward) or dout (dinp), 1 w or w^T, 2 dout^T (dW), 3 x^T (dW), 5 the scale
// pairs (12 floats; slot 4 unused); its gemm an fp32 result before the scales (N x OC forward,
// N x C_in dinp, OC x C_in dW), and without AVX-512 the operands widened for sgemm.
int64_t fp8_scratch(int64_t N, int64_t in, int64_t oc, int64_t wmax) {
  int64_t b = halves(N * std::max(in, oc)) + halves(wmax) + halves(N * oc) + halves(N * in) +
              floats(12) + floats(std::max({N * oc, N * in, wmax}));
  if (!cpu_has_avx512()) b += floats(N * std::max(in, oc)) + floats(std::max(wmax, N * in));
  return b;
}
// The block's widths declared_workspace derives from a StepShape.
struct Widths {
  int64_t C, V, QKV, F, Fo;  // d_model, vocabulary, q|k|v, d_ff, fc / gate|up output
};

// The products of three steps as the bf16 kernels receive them (Own16Call), for the replays
// of their packing buffers: each block's linears (blocks16: their forward, input-gradient and
// weight-gradient products as gemm_bf16.cpp hands them over; fp8: fp8.cpp's three x B^T
// products of each) and, with lm, the LM head's, chunk by chunk in one ReusePackedB scope per
// step (lmhead.cpp). Which outputs are bf16 matters only past 2048 reduction indices (the own
// kernels): the blocks' bf16 outputs (the qkv and fc / gate|up forward, the attention output's
// and fc-proj / down input gradients) all reduce over d_model.
std::vector<Own16Call> step_calls(const Widths& w, int64_t N, int64_t chunk, bool blocks16,
                                  bool fp8, bool lm) {
  const int64_t C = w.C, V = w.V, F = w.F;
  struct Linear {
    int64_t in, out;
    bool out16, dinp16;  // forward output, input gradient in bf16
  };
  const Linear lin[4] = {{C, w.QKV, true, false},
                         {C, C, false, true},
                         {C, w.Fo, true, false},
                         {F, C, false, true}};
  const int n = int(N);
  std::vector<Own16Call> calls;
  auto add = [&](bool ta, bool tb, int64_t M, int64_t Nn, int64_t K, bool c16, int scope) {
    Own16Call c;
    c.ta = ta, c.tb = tb, c.M = int(M), c.N = int(Nn), c.K = int(K), c.c16 = c16, c.scope = scope;
    calls.push_back(c);
  };
  for (int step = 1; step <= 3; ++step) {
    for (const Linear& l : lin) {
      if (blocks16) add(false, true, n, l.out, l.in, l.out16, 0);
      if (fp8) add(false, true, n, l.out, l.in, false, 0);
    }
    if (lm && V > 0 && C > 0)
      for (int64_t n0 = 0; n0 < N; n0 += chunk) {
        const int64_t nc = std::min(chunk, N - n0);
        add(false, true, nc, V, C, false, step);
        add(false, false, nc, C, V, false, step);
        add(true, false, V, C, nc, false, step);
      }
    for (int i = 3; i >= 0; --i) {
      const Linear& l = lin[i];
      if (blocks16) {
        add(false, false, n, l.in, l.out, l.dinp16, 0);
        add(true, false, l.out, l.in, n, false, 0);
      }
      if (fp8) {
        add(false, true, n, l.in, l.out, false, 0);
        add(false, true, l.out, l.in, n, false, 0);
      }
    }
  }
  return calls;
}
int64_t own16_bytes(const Widths& w, int threads, int64_t N, int64_t chunk, bool blocks16,
                    bool fp8, bool lm) {
  return own16_pack_bytes(step_calls(w, N, chunk, blocks16, fp8, lm), threads);
}
// The native and fused kernels' packing buffers (gemm_bf16_avx512.cpp, replayed by
// lowp_pack_bytes) where gemm_lowp takes those paths: the blocks' three products of each linear
// (blocks) and the LM head's, on fp32 operands (the same shapes as above).
int64_t lowp_native_bytes(const Widths& w, int threads, int64_t N, int64_t chunk, bool blocks) {
  return lowp_pack_bytes(step_calls(w, N, chunk, blocks, false, true), threads);
}
}  // namespace

WorkspaceDecl declared_workspace(const StepShape& s) {
  const int64_t V = s.vocab, C = s.d_model, N = int64_t(s.B) * s.T;
  const int64_t H = std::max(1, s.n_head), hd = C / H;
  const int64_t KVH = s.n_kv_head > 0 ? s.n_kv_head : H;
  const int64_t QKV = (H + 2 * KVH) * hd;
  const int64_t F = s.d_ff > 0 ? s.d_ff : 4 * C;
  const int threads = std::max(1, s.threads);
  WorkspaceDecl d;
  // lmhead.cpp: the logits chunk and its rows' losses.
  const int64_t chunk = lmhead_chunk_rows(int(N), int(V));
  d.bytes = floats(chunk * V) + floats(chunk);
  // attention.cpp: every OpenMP thread's tile scratch (forward and backward share it).
  d.bytes += threads * floats(int64_t(attention_tile_floats(s.T, int(hd), s.compute)));
  // norm.cpp: the backward's dw (and LayerNorm's db) partials over row blocks of N rows.
  d.bytes += floats(int64_t(norm_partial_floats(int(N), int(C), !s.llama)));
  // rope.cpp: the (cos, sin) table.
  if (s.llama) d.bytes += floats(int64_t(rope_table_floats(s.T, int(hd))));
  d.what = "the CPU kernels' kept scratch: the LM head's logits chunk, attention's tiles (" +
           std::to_string(threads) + " thread" + (threads > 1 ? "s" : "") +
           "), norm partials" + (s.llama ? ", RoPE's table" : "");
  // attention.cpp: grouped kv heads expanded for the backward's dK, dV partials (one call).
  if (KVH < H) {
    d.backward_transient = 4 * int64_t(s.B) * H * 2 * s.T * hd;
    d.what += "; in a backward, grouped attention's expanded K and V";
  }
  if (s.compute == DType::F32) return d;

  // 16-bit compute (the blocks' products take 16-bit inputs, models/unit.h ProductIn):
  // attention.cpp: qkv widened, and in the backward the output and its gradient widened
  // (none on the native bf16 path: it reads the 16-bit forms in place).
  if (!(s.compute == DType::BF16 && attention_bf16_native()))
    d.bytes += floats(N * QKV) + 2 * floats(N * C);
  // cpu_ops.cpp's output scratch: an fp32 result before it is narrowed: attention's output
  // (N x C) and dqkv (N x QKV), except where the native bf16 attention writes them 16-bit itself
  // (the output; dqkv with MHA); off the oneDNN path also a product's 16-bit output (GPT-2's fc
  // output N x F, the Llama's gate|up N x 2F) or input gradient (N x C, N x F), which oneDNN
  // writes in bf16 itself.
  const int64_t Fo = s.llama ? 2 * F : F;  // the widest product output of a block
  const Widths w{C, V, QKV, F, Fo};
  const int64_t att_out = attention_bf16_writes16(s.compute, int(H), int(KVH), false) ? 0 : C;
  const int64_t att_dqkv = attention_bf16_writes16(s.compute, int(H), int(KVH), true) ? 0 : QKV;
  const int64_t widest = lowp_onednn(s.compute) || s.fp8 ? std::max(att_out, att_dqkv)
                                                         : std::max({C, Fo, QKV});  // (Llama's qkv)
  if (widest > 0) d.bytes += floats(N * widest);
  const LowpPath path = lowp_auto_path(s.compute);
  const bool tuned = lowp_per_shape(s.compute);
  // The native / fused kernels run where Auto's path is one of them, and with per-shape choice
  // (tuned) on every shape's first call, which times the own kernel against oneDNN.
  const LowpPath own = tuned ? lowp_own_path(s.compute) : path;
  const bool own_packs = own == LowpPath::Native || own == LowpPath::Fused;
  if (s.fp8) {
    // FP8 linears: the blocks' products are fp8.cpp's (fp8_scratch); the LM head's stay bf16.
    d.bytes += fp8_scratch(N, std::max(C, F), std::max({QKV, C, Fo}), C * std::max({QKV, F, Fo}));
    d.what += ", fp8 copies of the linears' operands and their fp32 results";
    if (lowp_onednn(s.compute)) {
      d.bytes += halves(N * C) + halves(chunk * V);  // the LM head's x and dlogits in bf16
    } else if (path == LowpPath::Emulated) {
      d.bytes += floats(V * C) + floats(N * C);  // the LM head's w and x rounded
    } else if (tuned) {  // the LM head's products, per shape on oneDNN's bf16 copies
      d.bytes += halves(chunk * std::max(C, V)) + halves(std::max(V * C, chunk * C));
    }
    if (own_packs) {
      d.bytes += lowp_native_bytes(w, threads, N, chunk, false);
      d.what += ", the native / fused kernels' packed operands (the LM head)";
    }
    // (GPT-2's biases: Fp8Ops takes db from the bf16 Ops, a column sum of dout: no scratch.)
    const bool lm = lowp_onednn(s.compute);  // (the LM head's products on bf16 operands)
    if (const int64_t own = own16_bytes(w, threads, N, chunk, false, true, lm)) {
      d.bytes += own;
      d.what += ", the own bf16 kernels' packed operands";
    }
    return d;
  }
  // The largest first and second operand of a product: forward x w^T (x: N x C or N x F; w:
  // QKV x C, C x C, Fo x C, C x F), backward dout w and dout^T x (dout: N x QKV, N x C,
  // N x Fo), the LM head's x w^T, dlogits w, dlogits^T x (x: chunk x C; w: V x C; dlogits:
  // chunk x V).
  const int64_t max_a = std::max({N * std::max({C, F, Fo, QKV}), chunk * V});
  const int64_t max_b = std::max({QKV * C, Fo * C, F * C, N * std::max(C, F), V * C});
  if (lowp_onednn(s.compute)) {
    // The oneDNN path reads 16-bit operands in place (gemm_bf16.cpp, lmhead.cpp), the weights
    // included (the units keep bf16 copies: MixedPrecisionPolicy::weights16): an fp32-only
    // dout feeding both products (the residual stream's gradient, N x C) narrowed once; the LM
    // head's x (N x C) and a chunk's dlogits (chunk x V) handed over in bf16.
    d.bytes += halves(N * C) + halves(N * C) + halves(chunk * V);
    d.what += ", fp32 results before narrowing, bf16 operand copies (oneDNN)";
    if (const int64_t own = own16_bytes(w, threads, N, chunk, true, false, true)) {
      d.bytes += own;
      d.what += ", the own bf16 kernels' packed operands";
    }
    return d;
  }
  if (path == LowpPath::Emulated) {
    // gemm_bf16.cpp: rounded fp32 copies of the blocks' operands, x or dout, the weight, and
    // a backward's x; the LM head's w and x rounded once per call (its products take them).
    d.bytes += floats(N * std::max({C, F, Fo, QKV})) + floats(std::max({QKV * C, Fo * C, F * C})) +
               floats(N * std::max(C, F));
    d.bytes += floats(V * C) + floats(N * C);
    // GPT-2's biased products with a 16-bit dout (dfch, dqkv) widen it and their x (N x C)
    // first, for the bias sum.
    if (!s.llama) d.bytes += floats(N * std::max(F, QKV)) + floats(N * C);
    d.what += ", 16-bit operand copies and fp32 results before narrowing (emulated products)";
    return d;
  }
  // gemm_bf16.cpp's widened16: 16-bit operands widened for kernels that pack from fp32 (one
  // buffer for douts: GPT-2's dfch, dqkv; the Llama's dgu, dqkv; one for inputs: N x C, N x F).
  d.bytes += floats(N * (s.llama ? std::max(2 * F, QKV) : std::max(F, QKV))) +
             floats(N * std::max(C, F));
  if (path == LowpPath::OneDnn || tuned) {
    // gemm_onednn.cpp: bf16 copies of each product's two operands.
    d.bytes += halves(max_a) + halves(max_b);
  }
  d.what += ", 16-bit operand copies and fp32 results before narrowing";
  if (own_packs) {
    d.bytes += lowp_native_bytes(w, threads, N, chunk, true);
    d.what += ", the native / fused kernels' packed operands";
  }
  return d;
}

}  // namespace sw::cpu
