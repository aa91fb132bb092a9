// Which attention the CUDA Ops run in bf16 / fp16 compute (fp32 compute always runs the
// flash-style kernels of attention.cu): SHARDWISE_CUDA_ATTENTION = cudnn (the default: cuDNN's
// fused attention, attention_cudnn.h, where the build has it and cuDNN takes the shape; else
// the cuBLAS path), cublas (attention_mm.h over cuBLAS) or flash (attention.cu). cuDNN's is the
// default since the first H200 run (2026-11-27): 1.41x the cuBLAS path's tokens/s on the 1.3B
// Llama and 1.53x on GPT-2 124M, within the same tolerances.
// Plain C++: cuda_ops.cu chooses with it and the backend's workspace declaration
// (workspace.cpp, which the planner asks) counts the chosen path's scratch.
#pragma once
#include <cstdlib>
#include <string>

#include "core/env.h"
#include "core/error.h"

namespace sw::cuda {

enum class AttentionPath { Cublas, Cudnn, Flash };

inline const char* attention_path_name(AttentionPath p) {
  return p == AttentionPath::Cudnn ? "cuDNN" : p == AttentionPath::Cublas ? "cuBLAS" : "flash-kernel";
}

// Read at each call (tests switch paths between cases); an unknown value is an error naming it.
inline AttentionPath attention_path_from_env(bool lowp) {
  if (!lowp) return AttentionPath::Flash;
  const std::string v = env_text("SHARDWISE_CUDA_ATTENTION").value_or("cudnn");
  if (v == "cudnn") return AttentionPath::Cudnn;
  if (v == "cublas") return AttentionPath::Cublas;
  if (v == "flash") return AttentionPath::Flash;
  fail("cuda", "SHARDWISE_CUDA_ATTENTION: '" + v + "' is not one of cublas, cudnn, flash");
}

}  // namespace sw::cuda
