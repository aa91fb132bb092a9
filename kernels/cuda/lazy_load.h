// CUDA toolkit libraries loaded when the backend first needs them rather than by the dynamic
// linker at program start: cuBLAS / cuBLASLt (every product) and NVRTC (only cuDNN frontend
// engines compiled at run time, which the backend's graphs do not select).
//
// Why: libcublasLt runs ~6,500 static constructors when it is loaded, which fill ~200 MB of its
// data: a process that links it is 212 MB resident (and ~70 ms older) before main(), whether or
// not it ever uses a GPU (a CPU rank of `shardwise train`: 262 MB at start, 50 MB without).
// Loading libnvrtc costs another 27 MB. So the executables link neither. The backend calls cuBLAS
// through the pointers below, resolved with dlopen / dlsym on the first call of cublas_api()
// (the first CUDA Ops' device set-up); the cuDNN frontend's calls of nvrtc* resolve to
// definitions in lazy_load.cpp that load libnvrtc on their first call. A CPU-only process
// loads neither.
//
// The pointers have the headers' own types (decltype of the declared functions, after
// cublas_v2.h's renaming macros, e.g. cublasCreate -> cublasCreate_v2), and are looked up by
// those exported names, so a call through them is the call the headers declare.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>

#include <string>

namespace sw::cuda {

// The exported forms of the two products C++ overloads (cublas_api.h adds inline ones taking a
// cudaDataType compute type): the cublasComputeType_t ones, which the backend calls.
using CublasGemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                                        int, int, int, const void*, const void*, cudaDataType,
                                        int, const void*, cudaDataType, int, const void*, void*,
                                        cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
using CublasGemmStridedBatchedEx = cublasStatus_t (*)(
    cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*, const void*,
    cudaDataType, int, long long, const void*, cudaDataType, int, long long, const void*, void*,
    cudaDataType, int, long long, int, cublasComputeType_t, cublasGemmAlgo_t);

struct CublasApi {
  decltype(&cublasCreate) Create;
  decltype(&cublasSetStream) SetStream;
  decltype(&cublasSetMathMode) SetMathMode;
  decltype(&cublasSetWorkspace) SetWorkspace;
  CublasGemmEx GemmEx;
  CublasGemmStridedBatchedEx GemmStridedBatchedEx;
  decltype(&cublasSgeam) Sgeam;
  decltype(&cublasLtGetVersion) LtGetVersion;
  decltype(&cublasLtCreate) LtCreate;
  decltype(&cublasLtMatmul) LtMatmul;
  decltype(&cublasLtMatmulAlgoGetHeuristic) LtMatmulAlgoGetHeuristic;
  decltype(&cublasLtMatmulDescCreate) LtMatmulDescCreate;
  decltype(&cublasLtMatmulDescDestroy) LtMatmulDescDestroy;
  decltype(&cublasLtMatmulDescSetAttribute) LtMatmulDescSetAttribute;
  decltype(&cublasLtMatmulPreferenceCreate) LtMatmulPreferenceCreate;
  decltype(&cublasLtMatmulPreferenceDestroy) LtMatmulPreferenceDestroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) LtMatmulPreferenceSetAttribute;
  decltype(&cublasLtMatrixLayoutCreate) LtMatrixLayoutCreate;
  decltype(&cublasLtMatrixLayoutDestroy) LtMatrixLayoutDestroy;
};

// The entry points, libcublasLt.so.<major> and libcublas.so.<major> (the headers' major
// version) loaded on the first call: by the dynamic linker's search (the executable's RUNPATH,
// LD_LIBRARY_PATH, the system's), else from the folder libcudart was loaded from. sw::Error
// naming the library or symbol and dlerror()'s reason where that fails. Thread-safe.
const CublasApi& cublas_api();
// Whether cublas_api() has loaded them in this process (the test that a CPU-only run does
// not).
bool cublas_loaded();

// Whether libnvrtc.so.<major> (CUDA's major version) is loaded in this process: by an nvrtc*
// call or nvrtc_preload(). Only where cuDNN's fused attention is built (SW_HAVE_CUDNN_SDPA); the
// definitions of the frontend's nvrtc* entry points then come from lazy_load.cpp, and a failure
// to load the library is an sw::Error naming it.
bool nvrtc_loaded();
// Loads libnvrtc (RTLD_GLOBAL) if it is not yet: "" once it is, else why not (each call retries).
// cuDNN's own run-time compiled engines (its SDPA among them) open libnvrtc by its soname,
// which then finds this copy: attention_cudnn.cpp calls it before building a graph, so those
// engines see the library a linked one gave them, found the same way.
std::string nvrtc_preload();

}  // namespace sw::cuda
