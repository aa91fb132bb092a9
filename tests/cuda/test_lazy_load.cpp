// cuBLAS, cuBLASLt and NVRTC are loaded when the CUDA backend first needs them (kernels/cuda/
// lazy_load.h), not by the dynamic linker at start: a process that runs only CPU ops never
// maps them (libcublasLt's static constructors alone make a process ~210 MB resident). Runs
// on any machine with the toolkit's libraries, GPU or not (label unit): NVRTC compiles without
// a device.
#include <catch2/catch.hpp>

#include <cublasLt.h>
#ifdef SW_HAVE_CUDNN_SDPA
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nvrtc.h>
#endif

#include <fstream>
#include <string>
#include <vector>

#include "kernels/cuda/lazy_load.h"
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
  CHECK_FALSE(mapped("libnvrtc"));
  CHECK_FALSE(sw::cuda::nvrtc_loaded());

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

#ifdef SW_HAVE_CUDNN_SDPA
// The entry points the cuDNN frontend's headers call (its engines compiled at run time) are
// lazy_load.cpp's: the first call loads libnvrtc, each forwards to the library's own. A kernel
// compiled to a cubin for sm_90 and a program that does not compile, through them.
TEST_CASE("NVRTC is loaded by the first nvrtc call, which compiles through the library") {
  CHECK_FALSE(mapped("libnvrtc"));
  CHECK_FALSE(sw::cuda::nvrtc_loaded());
  auto compile = [](const char* src, std::string& log, std::vector<char>& cubin) {
    nvrtcProgram prog = nullptr;
    REQUIRE(nvrtcCreateProgram(&prog, src, "lazy.cu", 0, nullptr, nullptr) == NVRTC_SUCCESS);
    const char* opts[] = {"-arch=sm_90"};
    const nvrtcResult r = nvrtcCompileProgram(prog, 1, opts);
    size_t n = 0;
    REQUIRE(nvrtcGetProgramLogSize(prog, &n) == NVRTC_SUCCESS);
    log.assign(n, '\0');
    REQUIRE(nvrtcGetProgramLog(prog, log.data()) == NVRTC_SUCCESS);
    if (r == NVRTC_SUCCESS) {
      REQUIRE(nvrtcGetCUBINSize(prog, &n) == NVRTC_SUCCESS);
      cubin.assign(n, 0);
      REQUIRE(nvrtcGetCUBIN(prog, cubin.data()) == NVRTC_SUCCESS);
    }
    REQUIRE(nvrtcDestroyProgram(&prog) == NVRTC_SUCCESS);
    CHECK(prog == nullptr);
    return r;
  };
  std::string log;
  std::vector<char> cubin;
  const char* axpy =
      "extern \"C\" __global__ void axpy(float a, const float* x, float* y, int n) {\n"
      "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
      "  if (i < n) y[i] += a * x[i];\n"
      "}\n";
  CHECK(compile(axpy, log, cubin) == NVRTC_SUCCESS);
  CHECK(sw::cuda::nvrtc_loaded());
  CHECK(mapped("libnvrtc.so"));
  // An ELF image naming the kernel.
  REQUIRE(cubin.size() > 64);
  CHECK(std::string(cubin.data() + 1, 3) == "ELF");
  CHECK(std::string(cubin.begin(), cubin.end()).find("axpy") != std::string::npos);

  // A compile error comes back as the library reports it, with its log.
  cubin.clear();
  CHECK(compile("__global__ void broken() { undeclared_name = 1; }\n", log, cubin) ==
        NVRTC_ERROR_COMPILATION);
  CHECK(log.find("undeclared_name") != std::string::npos);
  CHECK(cubin.empty());

  // What cuDNN's run-time compiled engines do: open the library by its soname, which finds the
  // copy loaded here (attention_cudnn.cpp preloads it before building a graph).
  CHECK(sw::cuda::nvrtc_preload().empty());
  const std::string soname = "libnvrtc.so." + std::to_string(CUDART_VERSION / 1000);
  void* h = dlopen(soname.c_str(), RTLD_NOW | RTLD_NOLOAD);
  CHECK(h != nullptr);
  if (h) dlclose(h);
}
#endif
