// Fixed scratch of the CUDA backend that the planner counts (planner/search.cpp) as well as
// the backend allocates (kernels/cuda/cuda_ops.cu). Plain C++.
#pragma once
#include <cstddef>

namespace sw::cuda {

// cuBLAS's workspace, set on the Ops' handle (cublasSetWorkspace): NVIDIA's recommendation for
// Hopper (4 MiB for earlier GPUs; the larger size on every GPU keeps one figure).
constexpr size_t kCublasWorkspace = size_t{32} << 20;

}  // namespace sw::cuda
