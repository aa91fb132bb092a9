// CUDA runtime pieces of the backend: device memory for core's Buffer (registered at load
// time), device discovery, host<->device copies.
//
// Device memory: one DeviceCache (core/device_cache.h) per device, created on first use and
// never destroyed (buffers owned by statics are freed after ordinary statics are gone), given
// cudaMalloc/cudaFree/cudaEvent* below. Buffers carry no stream, so every Buffer allocates on
// the legacy default stream (nullptr): the compute stream of cuda_ops.cu is created blocking,
// so its work and the legacy stream's (plain cudaMemcpy) are ordered with each other in issue
// order, and a block freed after use on either is safe to reuse on either. Any other stream
// that touches a buffer (the executor's gather, reduce and copy streams, when they exist)
// must call cuda_record_stream(ptr, stream) before the buffer is freed.
// SHARDWISE_CUDA_CACHING=0: plain cudaMalloc/cudaFree per buffer (for compute-sanitizer).
#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>

#include "core/alloc.h"
#include "core/device_cache.h"
#include "core/error.h"
#include "kernels/cuda/cuda_runtime.h"

namespace sw {

namespace {

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    fail("cuda", std::string(what) + " failed: " + cudaGetErrorString(e));
}

// Makes `device` current for the scope and restores the previous current device after.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    int cur = -1;
    cuda_check(cudaGetDevice(&cur), "cudaGetDevice");
    if (cur == device) return;
    cuda_check(cudaSetDevice(device), "cudaSetDevice");
    prev_ = cur;
  }
  ~DeviceScope() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = -1;
};

// ---- The raw device API of the caches.
void* raw_alloc(int device, size_t bytes) {
  DeviceScope scope(device);
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear it, or the next kernel launch check would report it
    return nullptr;
  }
  cuda_check(e, "cudaMalloc");
  return p;
}

// Errors ignored: at exit the runtime may already be unloading.
void raw_free(int device, void* p) {
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess) return;
  if (cur != device && cudaSetDevice(device) != cudaSuccess) return;
  cudaFree(p);
  if (cur != device) cudaSetDevice(cur);
}

void* event_create(int device) {
  DeviceScope scope(device);
  cudaEvent_t e = nullptr;
  cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  return e;
}

void event_record(int device, void* event, void* stream) {
  DeviceScope scope(device);
  const cudaError_t e =
      cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream));
  if (e != cudaErrorCudartUnloading) cuda_check(e, "cudaEventRecord");  // freed at exit: no-op
}

bool event_query(int, void* event) {
  const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (e == cudaErrorNotReady) return false;
  if (e != cudaErrorCudartUnloading) cuda_check(e, "cudaEventQuery");
  return true;
}

void event_destroy(int, void* event) { cudaEventDestroy(static_cast<cudaEvent_t>(event)); }

constexpr DeviceApi kCudaApi{raw_alloc, raw_free, event_create, event_record, event_query,
                             event_destroy};

// ---- One cache per device, created on first use, never destroyed.
constexpr int kMaxDevices = 64;
std::atomic<DeviceCache*> g_caches[kMaxDevices];
std::mutex g_caches_mu;

DeviceCache& cache_for(int device) {
  SW_CHECK(device >= 0 && device < kMaxDevices, "CUDA device index out of range");
  DeviceCache* c = g_caches[device].load(std::memory_order_acquire);
  if (c) return *c;
  std::lock_guard<std::mutex> lock(g_caches_mu);
  c = g_caches[device].load(std::memory_order_relaxed);
  if (!c) {
    c = new DeviceCache(kCudaApi, device, device_caching_from_env(),
                        &MemTracker::of(Tier::Device));
    g_caches[device].store(c, std::memory_order_release);
  }
  return *c;
}

// The allocation stream of every Buffer (see the top of this file).
void* const kBufferStream = nullptr;

void* device_alloc(size_t bytes, int device) {
  return cache_for(device).allocate(bytes, kBufferStream);
}

void device_free(void* p, int device) { cache_for(device).free(p); }

void device_release_cached() {
  for (auto& c : g_caches)
    if (DeviceCache* d = c.load(std::memory_order_acquire)) d->empty_cache();
}

struct Registrar {
  Registrar() {
    register_device_allocator(DeviceKind::CUDA,
                              {device_alloc, device_free, device_release_cached});
  }
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

void cuda_record_stream(const void* ptr, void* stream, int device) {
  cache_for(device).record_stream(const_cast<void*>(ptr), stream);
}

DeviceCacheStats cuda_cache_stats(int device) { return cache_for(device).stats(); }

}  // namespace sw
