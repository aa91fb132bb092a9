// The CUDA backend's kernel workspace for a described training step (kernels/ops.h
// kernel_workspace). Plain C++ with no CUDA header, built into sw_kernels in every build
// (kernels/CMakeLists.txt), so that a CUDA run is planned where no GPU or CUDA toolkit is:
// `shardwise plan --hardware h100.json` on a laptop.
//
// What it counts: CudaOps' grow-only scratch slots (cuda_ops.cu) after a step, each at its
// largest request plus the quarter a slot adds when it grows, and cuBLAS's workspace; the
// attention path's scratch for the path SHARDWISE_CUDA_ATTENTION chooses (attention_path.h,
// read here as cuda_ops.cu reads it). Small slots (norm partials, row sums) are left out.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cuda/attention_mm.h"
#include "kernels/cuda/attention_path.h"
#include "kernels/cuda/workspace.h"
#include "kernels/ops.h"

namespace sw::cuda {

WorkspaceDecl declared_workspace(const StepShape& s) {
  const int64_t V = s.vocab, C = s.d_model, N = int64_t(s.B) * s.T;
  const int64_t H = std::max(1, s.n_head), hd = C / H;
  const int64_t KVH = s.n_kv_head > 0 ? s.n_kv_head : H;
  const bool llama = s.llama;
  const int64_t F = s.d_ff > 0 ? s.d_ff : 4 * C;
  const int64_t qkv = (H + 2 * KVH) * hd;
  const int B = s.B, T = s.T;
  const DType compute = s.compute;
  // The linears' largest weight (llama: gate+up, 2F x C; gpt2: qkv or fc).
  const int64_t weight = llama ? 2 * F * C : std::max(qkv, F) * C;
  // The LM head: logits chunks (workspace.h). Tensor parallelism's shard cross-entropy
  // (xent_shard_*) takes the same slots (Logits, Lowp0..2) at its shard's V <= vocab: no more.
  const int64_t chunk = lmhead_chunk_rows(N, V);
  std::vector<int64_t> slot{chunk * V * 4};  // Logits
  std::string what = "CudaOps' scratch: the LM head's logits chunk";
  if (compute != DType::F32) {
    // The blocks hand their products 16-bit inputs (models/unit.h's ProductIn), Llama its
    // gradients too (dgu, dqkv) and GPT-2 its biased products' gradients in both forms (dfch,
    // dqkv), and backward keeps the residual-stream gradient's 16-bit form beside it
    // (UnitCtx::grad16, in the plan's workspace): what is still narrowed per call is the LM
    // head's x, N x C.
    slot.push_back(2 * N * C);  // Lowp0: x or an fp32 dout
    // Lowp1: a weight given fp32 only. On a device every unit's weights come with their
    // 16-bit copy (MixedPrecisionPolicy::weights16), the LM head's included, so none is
    // narrowed in the engine's step; the linears' largest is kept for an fp32-weight call.
    slot.push_back(2 * weight);
    slot.push_back(2 * chunk * V);  // Lowp2: the LM head's dlogits
    const int64_t Z = int64_t(B) * H, ZK = int64_t(B) * KVH, Th = int64_t(T) * hd;
    AttentionPath path = attention_path_from_env(true);
    if (path == AttentionPath::Cudnn && hd % 8 != 0)
      path = AttentionPath::Cublas;  // cuDNN refuses the shape and the cuBLAS path runs
    what += std::string(", 16-bit operand copies, ") + attention_path_name(path) +
            " attention's scratch (SHARDWISE_CUDA_ATTENTION)";
    switch (path) {
      case AttentionPath::Cudnn:
        // attention_cudnn.h: the models hand cuDNN 16-bit qkv, O and dO (attention's 16-bit
        // forms, dO a product's 16-bit input gradient: no AttnPack) and a 16-bit dqkv buffer
        // of their own (no AttnS; the fp32-operand ops would use both), so only cuDNN's
        // workspace (AttnP). cuDNN says the workspace only on a GPU: 30.5 bytes per element of
        // Q (its deterministic backward's), fitted to the tracked peaks of the two benchmark
        // runs on an H200 (2026-11-27: 1.3B Llama, GPT-2 124M; the first guess, an fp32 dQ
        // accumulator of 4 bytes, was 0.55 and 0.42 GB short).
        slot.push_back(61 * Z * Th / 2);
        break;
      case AttentionPath::Cublas: {
        // attention_mm.h's own chunking: Z query heads, ZK kv heads; chunks within 256 MiB of
        // scores (cuda_ops.cu kAttnChunkBytes).
        const int64_t ld = attn_mm::ld_scores(T), tiles = (T + attn_mm::kTile - 1) / attn_mm::kTile;
        const size_t budget = size_t{256} << 20;
        const int64_t nqf = attn_mm::chunk_rows(size_t(Z), T, 6, size_t(tiles * (4 * hd + 4) + 8),
                                                budget, 0);
        const int64_t nqb = attn_mm::chunk_rows(size_t(Z), T, 12, 0, budget, 0);
        slot.push_back(2 * (2 * Z + 2 * ZK) * Th);                                // AttnPack
        slot.push_back(4 * std::max(Z * nqf * ld, 2 * Z * nqb * ld));             // AttnS
        slot.push_back(2 * std::max(Z * nqf * ld, 2 * Z * nqb * ld));             // AttnP
        slot.push_back(4 * std::max(Z * nqf * (tiles * (hd + 1) + 2),             // AttnAcc
                                    Z * T + (Z + 2 * ZK) * Th));
        break;
      }
      case AttentionPath::Flash:
        slot.push_back(4 * Z * T);  // attention.cu's backward's D (Attn)
        break;
    }
  } else {
    slot.push_back(4 * int64_t(B) * H * T);  // fp32: attention.cu's backward's D (Attn)
    what += ", the flash-kernel attention's row sums";
  }
  if (llama) slot.push_back(4 * int64_t(T) * hd);  // RoPE's (cos, sin) table (Rope)
  int64_t b = 0;
  for (int64_t x : slot) b += x + x / 4;
  // GPT-2's fc product is kept 16-bit with its fp32 bias added first, and cuBLASLt refuses an
  // fp32 bias with a 16-bit D (cuBLAS 13.1 on an H100 and an H200, 2026-11-28: status 7 for
  // every shape): the default path then writes the fp32 product to a transient buffer of N x F
  // floats and narrows it. Not a slot (no slack), but alive at the forward's peak: the tracked
  // peaks were 127 MB (cuDNN attention) and 254 MB (cuBLAS) above the plan without it.
  if (!llama && compute != DType::F32 && !s.fp8) {
    b += 4 * N * F;
    what += ", GPT-2's fp32 fc product before narrowing";
  }
  if (s.fp8 && compute == DType::BF16) {
    // FP8 linears (kernels/fp8_ops.cpp over fp8.cu): the blocks' products quantise into
    // fp8.cu's grow-only slots, one byte a value, each kept at its largest request plus a
    // quarter and 256 bytes: 0 x or dout, 1 w or w^T, 2 dout^T, 3 x^T, 4 (GPT-2's biased
    // products with a 16-bit output) the fp32 product before the bias, 5 the scale pairs. Read
    // from the code, not yet checked against a GPU's tracked peak.
    const int64_t Fo = llama ? 2 * F : F, in = std::max(C, F), oc = std::max({qkv, C, Fo});
    const int64_t r[6] = {N * std::max(in, oc), C * std::max({qkv, F, Fo}), N * oc, N * in,
                          llama ? 0 : 4 * N * std::max(qkv, F), 48};
    for (int64_t x : r)
      if (x > 0) b += x + x / 4 + 256;
    what += ", fp8 copies of the linears' operands";
  }
  WorkspaceDecl d;
  d.bytes = b + static_cast<int64_t>(kCublasWorkspace);
  d.what = what + ", cuBLAS's workspace";
  return d;
}

}  // namespace sw::cuda
