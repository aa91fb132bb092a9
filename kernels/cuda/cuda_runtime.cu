// CUDA runtime pieces of the backend: device selection, device memory for core's Buffer and
// its copies (registered at load time), host pinning for the Tier::Host pool, CUDA events.
// Compiled, never run on a GPU.
//
// Device: one per process, cuda_current_device() (launch_env().local_rank % GPUs visible, or
// SHARDWISE_CUDA_DEVICE), chosen on first use; nothing here calls the driver at static-init
// time. Every entry point makes its device current with cuda_use_device and never switches
// back: a thread's default device is 0, and switching "back" to it would create a CUDA
// context on GPU 0 in every rank's process.
//
// Device memory: one DeviceCache (core/device_cache.h) per device, created on first use and
// never destroyed (buffers owned by statics are freed after ordinary statics are gone), given
// cudaMalloc/cudaFree/cudaEvent* below. Buffers carry no stream, so every Buffer allocates on
// the legacy default stream (nullptr): the compute stream of cuda_ops.cu is created blocking,
// so its work and the legacy stream's (plain cudaMemcpy) are ordered with each other in issue
// order, and a block freed after use on either is safe to reuse on either. Any other stream
// that touches a buffer (a NCCL group's stream, the executor's copy streams when they exist)
// must call cuda_record_stream(ptr, stream) before the buffer is freed (the copy streams below
// do it for every copy).
// SHARDWISE_CUDA_CACHING=0: plain cudaMalloc/cudaFree per buffer (for compute-sanitizer).
//
// Copies (DeviceAllocator::copy, behind copy_bytes): cudaMemcpy on the legacy default stream
// (so after the compute stream's work so far), then a synchronisation of that stream, because
// cudaMemcpy may return before a device-to-device copy, or the DMA of a pageable host-to-device
// copy, has finished; the copy is complete when it returns.
//
// Host pinning (core/alloc.h HostPinning): cudaHostRegister(Portable) / cudaHostUnregister,
// registered by the first cuda_current_device() that finds a GPU. A failed registration is
// cleared (cudaGetLastError) and the block stays pageable.
#include <cuda_runtime.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "core/alloc.h"
#include "core/device_cache.h"
#include "core/env.h"
#include "core/error.h"
#include "core/launch.h"
#include "core/stream.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/ops.h"

namespace sw {

namespace {

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    fail("cuda", std::string(what) + " failed: " + cudaGetErrorString(e));
}

// cuda_use_device without throwing (paths that ignore errors).
bool try_use_device(int device) {
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess) return false;
  return cur == device || cudaSetDevice(device) == cudaSuccess;
}

// ---- The raw device API of the caches.
void* raw_alloc(int device, size_t bytes) {
  cuda_use_device(device);
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
  if (try_use_device(device)) cudaFree(p);
}

void* event_create(int device) {
  cuda_use_device(device);
  cudaEvent_t e = nullptr;
  cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  return e;
}

void event_record(int device, void* event, void* stream) {
  cuda_use_device(device);
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
  (void)cuda_current_device();  // the process uses CUDA: host pinning from now on
  return cache_for(device).allocate(bytes, kBufferStream);
}

void device_free(void* p, int device) { cache_for(device).free(p); }

void device_release_cached() {
  for (auto& c : g_caches)
    if (DeviceCache* d = c.load(std::memory_order_acquire)) d->empty_cache();
}

void device_copy(void* dst, const void* src, size_t bytes, CopyDir dir, int device) {
  if (bytes == 0) return;
  cuda_use_device(device);
  const cudaMemcpyKind kind = dir == CopyDir::HostToDevice   ? cudaMemcpyHostToDevice
                              : dir == CopyDir::DeviceToHost ? cudaMemcpyDeviceToHost
                                                             : cudaMemcpyDeviceToDevice;
  cuda_check(cudaMemcpy(dst, src, bytes, kind), "cudaMemcpy");
  cuda_check(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize (copy)");
}

// ---- Copy streams (DeviceAllocator::copy_async, behind copy_bytes_async): one non-blocking
// stream per direction and device, created on first use and never destroyed, so an upload and
// a download run at once (two copy engines) and neither waits for the compute stream except
// where asked: by default (after == null) the copy stream waits for an event recorded on the
// compute stream now; for a given `after` it waits natively when it has a native handle, else
// the issuing thread waits for it. The device side of the copy is recorded on the copy stream
// (cuda_record_stream), so its block is reused only after the copy even if it is freed first.
// Host memory is pinned where it comes from the Tier::Host pool; a pageable one still copies,
// but cudaMemcpyAsync then stages it through the driver and overlaps nothing.
std::atomic<cudaStream_t> g_copy_streams[kMaxDevices][3];

// A copy's completion event issued while stream_timing(): timed, with the timed event recorded
// on its copy stream just before it (Event::timed_span).
class TimedCopyEvent final : public CudaEvent {
 public:
  TimedCopyEvent(int device, std::shared_ptr<CudaEvent> begin, const char* stream)
      : CudaEvent(device, true), begin_(std::move(begin)), stream_(stream) {}
  TimedSpan timed_span() override { return {begin_.get(), this, stream_}; }

 private:
  std::shared_ptr<CudaEvent> begin_;
  const char* stream_;
};
std::mutex g_copy_streams_mu;

cudaStream_t copy_stream(int device, CopyDir dir) {
  SW_CHECK(device >= 0 && device < kMaxDevices, "cuda: device index out of range");
  std::atomic<cudaStream_t>& slot = g_copy_streams[device][static_cast<int>(dir)];
  if (cudaStream_t s = slot.load(std::memory_order_acquire)) return s;
  std::lock_guard<std::mutex> l(g_copy_streams_mu);
  if (cudaStream_t s = slot.load(std::memory_order_acquire)) return s;
  cudaStream_t s = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate (copy)");
  slot.store(s, std::memory_order_release);
  return s;
}

std::shared_ptr<Event> device_copy_async(void* dst, const void* src, size_t bytes, CopyDir dir,
                                         int device, Event* after) {
  cuda_use_device(device);
  cudaStream_t s = copy_stream(device, dir);
  if (!after) {
    auto mark = cuda_record_event(cuda_compute_stream(device), device);
    cuda_check(cudaStreamWaitEvent(s, static_cast<cudaEvent_t>(mark->native_handle()), 0),
               "cudaStreamWaitEvent (copy)");
  } else if (after->native_handle()) {
    cuda_check(cudaStreamWaitEvent(s, static_cast<cudaEvent_t>(after->native_handle()), 0),
               "cudaStreamWaitEvent (copy)");
  } else {
    after->synchronize();
  }
  const cudaMemcpyKind kind = dir == CopyDir::HostToDevice   ? cudaMemcpyHostToDevice
                              : dir == CopyDir::DeviceToHost ? cudaMemcpyDeviceToHost
                                                             : cudaMemcpyDeviceToDevice;
  // The profiler's device interval (stream_timing()): timed events on the copy stream around it.
  std::shared_ptr<CudaEvent> begin;
  if (stream_timing()) {
    begin = std::make_shared<CudaEvent>(device, true);
    begin->record(s);
  }
  cuda_check(cudaMemcpyAsync(dst, src, bytes, kind, s), "cudaMemcpyAsync");
  if (dir != CopyDir::HostToDevice) cuda_record_stream(src, s, device);
  if (dir != CopyDir::DeviceToHost) cuda_record_stream(dst, s, device);
  if (!begin) return cuda_record_event(s, device);
  static const char* const names[] = {"copy h2d", "copy d2h", "copy d2d"};
  auto end = std::make_shared<TimedCopyEvent>(device, std::move(begin),
                                              names[static_cast<int>(dir)]);
  end->record(s);
  return end;
}

// ---- Host pinning (registered by cuda_current_device once a GPU is found).
std::atomic<int> g_device{-1};  // this process's device, once chosen

bool host_pin(void* p, size_t bytes) {
  const int dev = g_device.load(std::memory_order_acquire);
  if (dev < 0 || !try_use_device(dev)) return false;
  if (cudaHostRegister(p, bytes, cudaHostRegisterPortable) != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it so the next launch check does not report it
    return false;
  }
  return true;
}

void host_unpin(void* p, size_t) {
  if (cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
}

struct Registrar {
  Registrar() {
    register_device_allocator(DeviceKind::CUDA, {device_alloc, device_free, device_release_cached,
                                                 device_copy, device_copy_async});
  }
} registrar;

}  // namespace

void cuda_use_device(int device) {
  int cur = -1;
  const cudaError_t e = cudaGetDevice(&cur);
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
    cudaGetLastError();
    fail("cuda", std::string("no CUDA device is usable by this process (") + cudaGetErrorString(e) +
                     "): device 'cuda' needs a GPU and its driver; use device 'cpu' here");
  }
  cuda_check(e, "cudaGetDevice");
  if (cur != device) cuda_check(cudaSetDevice(device), "cudaSetDevice");
}

int cuda_pick_device(int local_rank, int count, const char* override_env) {
  if (count <= 0) return 0;
  if (override_env && *override_env) {
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(override_env, &end, 10);
    if (errno != 0 || *end != '\0' || v < 0 || v >= count)
      fail("cuda", std::string("SHARDWISE_CUDA_DEVICE=") + override_env +
                       " is not a device index below " + std::to_string(count) +
                       " (the GPUs this process sees)");
    return static_cast<int>(v);
  }
  return (local_rank < 0 ? 0 : local_rank) % count;
}

int cuda_current_device() {
  static std::once_flag once;
  std::call_once(once, [] {
    const int count = cuda_device_count();
    // (the value checked as an integer by core/env, against the GPUs seen by cuda_pick_device)
    const std::optional<int64_t> asked = env_int("SHARDWISE_CUDA_DEVICE");
    const std::string v = asked ? std::to_string(*asked) : std::string();
    const int dev = cuda_pick_device(launch_env().local_rank, count, v.c_str());
    g_device.store(dev, std::memory_order_release);
    if (count > 0) register_host_pinning({host_pin, host_unpin});
  });
  return g_device.load(std::memory_order_acquire);
}

void* cuda_compute_stream(int device) {
  return ops_for(Device::cuda(device)).stream().native_handle();
}

CudaEvent::CudaEvent(int device, bool timed) : device_(device), timed_(timed) {
  cuda_use_device(device);
  cudaEvent_t e = nullptr;
  cuda_check(cudaEventCreateWithFlags(&e, timed ? cudaEventDefault : cudaEventDisableTiming),
             "cudaEventCreate");
  event_ = e;
}

double CudaEvent::elapsed_since(Event& ref) {
  // A caller's mistake, not a broken invariant: sw::Error as Event::elapsed_since promises (the
  // cuda_backend test checks the throw; SW_CHECK aborted the process, on the H200 of issue 39).
  auto* r = dynamic_cast<CudaEvent*>(&ref);
  if (!r || !r->timed_ || !timed_)
    fail("cuda", "an event timed against one made without timing (Stream::record_timed makes "
                 "both)");
  // Any two timed events of one device, whatever streams recorded them (a copy stream's against
  // the compute stream's reference: the profiler's tie); not across devices.
  if (r->device_ != device_)
    fail("cuda", "an event of device " + std::to_string(device_) + " timed against one of device " +
                     std::to_string(r->device_));
  synchronize();
  r->synchronize();
  float ms = 0.f;
  cuda_check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(r->event_),
                                  static_cast<cudaEvent_t>(event_)),
             "cudaEventElapsedTime");
  return static_cast<double>(ms) * 1e-3;
}

// Errors ignored: at exit the runtime may already be unloading; a pending event is released
// by the runtime once its work completes.
CudaEvent::~CudaEvent() {
  if (event_) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
}

void CudaEvent::record(void* stream) {
  cuda_use_device(device_);
  cuda_check(cudaEventRecord(static_cast<cudaEvent_t>(event_), static_cast<cudaStream_t>(stream)),
             "cudaEventRecord");
}

bool CudaEvent::query() {
  return cudaEventQuery(static_cast<cudaEvent_t>(event_)) != cudaErrorNotReady;
}

void CudaEvent::synchronize() {
  cuda_check(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)), "cudaEventSynchronize");
}

std::shared_ptr<CudaEvent> cuda_record_event(void* stream, int device) {
  auto e = std::make_shared<CudaEvent>(device);
  e->record(stream);
  return e;
}

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
