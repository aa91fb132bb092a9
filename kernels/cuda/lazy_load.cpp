// lazy_load.h: cuBLAS / cuBLASLt and NVRTC resolved with dlopen on first use.
#include "kernels/cuda/lazy_load.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <atomic>
#include <string>

#ifdef SW_HAVE_CUDNN_SDPA
#include <nvrtc.h>
#endif

#include "core/error.h"

namespace sw::cuda {

namespace {

#define SW_CUBLAS_STR2(x) #x
#define SW_CUBLAS_STR(x) SW_CUBLAS_STR2(x)  // (after macro expansion: cublasCreate_v2, ...)

std::atomic<bool> g_loaded{false};

// The folder libcudart came from (it is linked, so already loaded), with a trailing '/'.
std::string cudart_dir() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<const void*>(&cudaGetDeviceCount), &info) || !info.dli_fname)
    return {};
  const std::string f = info.dli_fname;
  const size_t slash = f.rfind('/');
  return slash == std::string::npos ? std::string() : f.substr(0, slash + 1);
}

void* open_lib(const std::string& name, const char* purpose) {
  if (void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_GLOBAL)) return h;
  const char* e = dlerror();
  std::string why = e ? e : "not found";
  const std::string dir = cudart_dir();
  if (!dir.empty()) {
    if (void* h = dlopen((dir + name).c_str(), RTLD_NOW | RTLD_GLOBAL)) return h;
    if (const char* e2 = dlerror()) why += "; " + std::string(e2);
  }
  throw Error("cuda: cannot load " + name + " (" + purpose + "; searched the " +
              "library path" + (dir.empty() ? std::string() : " and " + dir) + "): " + why);
}

template <class F>
void bind(F& f, void* lib, const char* lib_name, const char* sym) {
  dlerror();
  void* p = dlsym(lib, sym);
  if (!p) {
    const char* why = dlerror();
    throw Error(std::string("cuda: ") + lib_name + " has no " + sym + ": " + (why ? why : "null"));
  }
  f = reinterpret_cast<F>(p);
}

CublasApi load() {
  const std::string major = std::to_string(CUBLAS_VER_MAJOR);
  const std::string lt_name = "libcublasLt.so." + major, blas_name = "libcublas.so." + major;
  void* lt = open_lib(lt_name, "the CUDA backend's products");
  void* blas = open_lib(blas_name, "the CUDA backend's products");
  CublasApi a{};
#define SW_BIND(lib, field, fn) bind(a.field, lib, lib##_name.c_str(), SW_CUBLAS_STR(fn))
  SW_BIND(blas, Create, cublasCreate);
  SW_BIND(blas, SetStream, cublasSetStream);
  SW_BIND(blas, SetMathMode, cublasSetMathMode);
  SW_BIND(blas, SetWorkspace, cublasSetWorkspace);
  SW_BIND(blas, GemmEx, cublasGemmEx);
  SW_BIND(blas, GemmStridedBatchedEx, cublasGemmStridedBatchedEx);
  SW_BIND(blas, Sgeam, cublasSgeam);
  SW_BIND(lt, LtGetVersion, cublasLtGetVersion);
  SW_BIND(lt, LtCreate, cublasLtCreate);
  SW_BIND(lt, LtMatmul, cublasLtMatmul);
  SW_BIND(lt, LtMatmulAlgoGetHeuristic, cublasLtMatmulAlgoGetHeuristic);
  SW_BIND(lt, LtMatmulDescCreate, cublasLtMatmulDescCreate);
  SW_BIND(lt, LtMatmulDescDestroy, cublasLtMatmulDescDestroy);
  SW_BIND(lt, LtMatmulDescSetAttribute, cublasLtMatmulDescSetAttribute);
  SW_BIND(lt, LtMatmulPreferenceCreate, cublasLtMatmulPreferenceCreate);
  SW_BIND(lt, LtMatmulPreferenceDestroy, cublasLtMatmulPreferenceDestroy);
  SW_BIND(lt, LtMatmulPreferenceSetAttribute, cublasLtMatmulPreferenceSetAttribute);
  SW_BIND(lt, LtMatrixLayoutCreate, cublasLtMatrixLayoutCreate);
  SW_BIND(lt, LtMatrixLayoutDestroy, cublasLtMatrixLayoutDestroy);
#undef SW_BIND
  return a;  // (the libraries stay loaded for the process)
}

}  // namespace

const CublasApi& cublas_api() {
  static const CublasApi api = [] {
    CublasApi a = load();
    g_loaded.store(true);
    return a;
  }();
  return api;
}

bool cublas_loaded() { return g_loaded.load(); }

#ifdef SW_HAVE_CUDNN_SDPA
namespace {

std::atomic<bool> g_nvrtc_loaded{false};

struct NvrtcApi {
  decltype(&nvrtcCreateProgram) CreateProgram;
  decltype(&nvrtcDestroyProgram) DestroyProgram;
  decltype(&nvrtcCompileProgram) CompileProgram;
  decltype(&nvrtcGetCUBINSize) GetCUBINSize;
  decltype(&nvrtcGetCUBIN) GetCUBIN;
  decltype(&nvrtcGetProgramLogSize) GetProgramLogSize;
  decltype(&nvrtcGetProgramLog) GetProgramLog;
};

const NvrtcApi& nvrtc() {
  static const NvrtcApi api = [] {
    // (libnvrtc's soname follows CUDA's major version: libnvrtc.so.13 for CUDA 13.x.)
    const std::string name = "libnvrtc.so." + std::to_string(CUDART_VERSION / 1000);
    void* lib = open_lib(name, "cuDNN's run-time compiled engines");
    NvrtcApi a{};
    const char* n = name.c_str();
    bind(a.CreateProgram, lib, n, "nvrtcCreateProgram");
    bind(a.DestroyProgram, lib, n, "nvrtcDestroyProgram");
    bind(a.CompileProgram, lib, n, "nvrtcCompileProgram");
    bind(a.GetCUBINSize, lib, n, "nvrtcGetCUBINSize");
    bind(a.GetCUBIN, lib, n, "nvrtcGetCUBIN");
    bind(a.GetProgramLogSize, lib, n, "nvrtcGetProgramLogSize");
    bind(a.GetProgramLog, lib, n, "nvrtcGetProgramLog");
    g_nvrtc_loaded.store(true);
    return a;
  }();
  return api;
}

}  // namespace

bool nvrtc_loaded() { return g_nvrtc_loaded.load(); }

std::string nvrtc_preload() {
  try {
    nvrtc();
    return "";
  } catch (const std::exception& e) {  // (a static whose initialiser threw is tried again)
    return e.what();
  }
}
#else
bool nvrtc_loaded() { return false; }
std::string nvrtc_preload() { return "this build has no cuDNN attention"; }
#endif

}  // namespace sw::cuda

#ifdef SW_HAVE_CUDNN_SDPA
// The NVRTC entry points the cuDNN frontend's headers call (the ones the executables would
// otherwise import from libnvrtc), each forwarding to the library's own, loaded on first call.
extern "C" {
nvrtcResult nvrtcCreateProgram(nvrtcProgram* prog, const char* src, const char* name,
                               int numHeaders, const char* const* headers,
                               const char* const* includeNames) {
  return sw::cuda::nvrtc().CreateProgram(prog, src, name, numHeaders, headers, includeNames);
}
nvrtcResult nvrtcDestroyProgram(nvrtcProgram* prog) {
  return sw::cuda::nvrtc().DestroyProgram(prog);
}
nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int numOptions, const char* const* options) {
  return sw::cuda::nvrtc().CompileProgram(prog, numOptions, options);
}
nvrtcResult nvrtcGetCUBINSize(nvrtcProgram prog, size_t* cubinSizeRet) {
  return sw::cuda::nvrtc().GetCUBINSize(prog, cubinSizeRet);
}
nvrtcResult nvrtcGetCUBIN(nvrtcProgram prog, char* cubin) {
  return sw::cuda::nvrtc().GetCUBIN(prog, cubin);
}
nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram prog, size_t* logSizeRet) {
  return sw::cuda::nvrtc().GetProgramLogSize(prog, logSizeRet);
}
nvrtcResult nvrtcGetProgramLog(nvrtcProgram prog, char* log) {
  return sw::cuda::nvrtc().GetProgramLog(prog, log);
}
}
#endif
