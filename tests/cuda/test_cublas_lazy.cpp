// cuBLAS and cuBLASLt are loaded when the CUDA backend first needs them (kernels/cuda/
// cublas_lazy.h), not by the dynamic linker at start: a process that runs only CPU ops never
// maps them (libcublasLt's static constructors alone make a process ~210 MB resident). Runs
// on any machine with the toolkit's libraries, GPU or not (label unit).
#include <catch2/catch.hpp>

#include <cublasLt.h>

#include <fstream>
#include <string>
#include <vector>

#include "kernels/cuda/cublas_lazy.h"
#include "kernels/ops.h"

namespace {

// Whether a file whose name contains `name` is mapped into this process.
bool mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find(name) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("cuBLAS is not loaded by a process that runs CPU ops, and loads on first use") {
  // A CPU rank's work: products in fp32 and bf16.
  const int M = 64, N = 48, K = 32;
  std::vector<float> A(size_t(M) * K, 0.5f), B(size_t(K) * N, 0.25f), C(size_t(M) * N);
  for (sw::DType dt : {sw::DType::F32, sw::DType::BF16}) {
    const sw::Ops& ops = sw::ops_for(sw::Device::cpu(), dt);
    ops.gemm(false, false, M, N, K, 1.f, A.data(), K, B.data(), N, 0.f, C.data(), N);
    CHECK(C[0] == 0.5f * 0.25f * K);
  }
  CHECK_FALSE(mapped("libcublas"));
  CHECK_FALSE(sw::cuda::cublas_loaded());

  const sw::cuda::CublasApi& api = sw::cuda::cublas_api();
  CHECK(sw::cuda::cublas_loaded());
  CHECK(mapped("libcublasLt.so"));
  CHECK(mapped("libcublas.so"));
  // Every entry point bound.
  const std::vector<const void*> entries = {
      reinterpret_cast<const void*>(api.Create),
      reinterpret_cast<const void*>(api.SetStream),
      reinterpret_cast<const void*>(api.SetMathMode),
      reinterpret_cast<const void*>(api.SetWorkspace),
      reinterpret_cast<const void*>(api.GemmEx),
      reinterpret_cast<const void*>(api.GemmStridedBatchedEx),
      reinterpret_cast<const void*>(api.Sgeam),
      reinterpret_cast<const void*>(api.LtGetVersion),
      reinterpret_cast<const void*>(api.LtCreate),
      reinterpret_cast<const void*>(api.LtMatmul),
      reinterpret_cast<const void*>(api.LtMatmulAlgoGetHeuristic),
      reinterpret_cast<const void*>(api.LtMatmulDescCreate),
      reinterpret_cast<const void*>(api.LtMatmulDescDestroy),
      reinterpret_cast<const void*>(api.LtMatmulDescSetAttribute),
      reinterpret_cast<const void*>(api.LtMatmulPreferenceCreate),
      reinterpret_cast<const void*>(api.LtMatmulPreferenceDestroy),
      reinterpret_cast<const void*>(api.LtMatmulPreferenceSetAttribute),
      reinterpret_cast<const void*>(api.LtMatrixLayoutCreate),
      reinterpret_cast<const void*>(api.LtMatrixLayoutDestroy)};
  for (size_t i = 0; i < entries.size(); ++i) {
    INFO("entry " << i);
    CHECK(entries[i] != nullptr);
  }
  // The library loaded is the one the headers describe (a call that needs no GPU).
  CHECK(api.LtGetVersion() / 10000 == CUBLAS_VER_MAJOR);
  // Loaded once: the same table.
  CHECK(&sw::cuda::cublas_api() == &api);
}
