// Fixed scratch of the CUDA backend that its workspace declaration counts
// (kernels/cuda/workspace.cpp) as well as the backend allocates (kernels/cuda/cuda_ops.cu).
// Plain C++.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace sw::cuda {

// cuBLAS's workspace, set on the Ops' handle (cublasSetWorkspace): NVIDIA's recommendation for
// Hopper (4 MiB for earlier GPUs; the larger size on every GPU keeps one figure).
constexpr size_t kCublasWorkspace = size_t{32} << 20;

// The LM head's row chunks (CudaOps' xent): at most kLmheadChunkRows rows of N, fewer where a
// chunk's fp32 logits would pass kLmheadChunkBytes. Each chunk's weight-gradient product adds
// into the fp32 V x C gradient (beta 1: read and written once a chunk), so at 1024 rows that
// traffic was about as long as the product's arithmetic (GPT-2 124M: 309 MB against 79
// GFLOP a chunk, 16 chunks a step); 4096 rows cut it by four for 0.6 to 0.9 GB more scratch
// on the benchmark's runs (estimate; bench_cuda_gemm times 1024-, 2048- and 4096-row chunks).
constexpr int64_t kLmheadChunkRows = 4096;
constexpr size_t kLmheadChunkBytes = size_t{1} << 30;
inline int64_t lmhead_chunk_rows(int64_t N, int64_t V) {
  const int64_t by_bytes = static_cast<int64_t>(kLmheadChunkBytes / (sizeof(float) * size_t(V)));
  return std::min(N, std::max<int64_t>(1, std::min(kLmheadChunkRows, by_bytes)));
}

}  // namespace sw::cuda
