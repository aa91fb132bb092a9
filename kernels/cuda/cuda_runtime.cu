// CUDA runtime pieces of the backend: device memory for core's Buffer (registered at load
// time), device discovery. Kernels for kernels/ops.h arrive with the CUDA issue; until then
// ops_for(Device::cuda(i)) reports that this build has no CUDA ops, rather than pretending.
#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "core/alloc.h"
#include "core/error.h"
#include "kernels/cuda/cuda_runtime.h"

namespace sw {

namespace {

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    fail("cuda", std::string(what) + " failed: " + cudaGetErrorString(e));
}

void* device_alloc(size_t bytes, int device) {
  cuda_check(cudaSetDevice(device), "cudaSetDevice");
  void* p = nullptr;
  cuda_check(cudaMalloc(&p, bytes), "cudaMalloc");
  return p;
}

void device_free(void* p, int device) {
  cudaSetDevice(device);
  cudaFree(p);
}

struct Registrar {
  Registrar() { register_device_allocator(DeviceKind::CUDA, {device_alloc, device_free}); }
} registrar;

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

void cuda_copy_to_device(void* dst, const void* src, size_t bytes) {
  cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}

void cuda_copy_to_host(void* dst, const void* src, size_t bytes) {
  cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}

}  // namespace sw
