// Host-side entry points of the CUDA backend (no CUDA headers here): device selection, device
// memory, copies, the compute stream and CUDA events (core/stream.h's Event on a cudaEvent_t).
// Run on an H100 and an H200 (docs/ARCHITECTURE.md, "The CUDA backend").
#pragma once
#include <cstddef>
#include <memory>

#include "core/device_cache.h"
#include "core/stream.h"

namespace sw {

int cuda_device_count();  // 0 when no driver or no GPU

// ---- Device selection. One device per process: launch_env().local_rank % the GPUs visible,
// or SHARDWISE_CUDA_DEVICE=N. Chosen once, on first call (cudaGetDeviceCount is the only
// driver call it makes; with no GPU it answers 0 and nothing else happens). The first call
// that finds a GPU also registers host pinning (core/alloc.h HostPinning), so a process that
// never asks for its CUDA device never pins or creates a CUDA context.
int cuda_current_device();
// The choice itself, a pure function: `override_env` is SHARDWISE_CUDA_DEVICE's text (null or
// empty: unset). count == 0 gives 0. Throws sw::Error("cuda: SHARDWISE_CUDA_DEVICE=...") for
// a value that is not a device index below count.
int cuda_pick_device(int local_rank, int count, const char* override_env);

void cuda_copy_to_device(void* dst, const void* src, size_t bytes);
void cuda_copy_to_host(void* dst, const void* src, size_t bytes);
// The caching device allocator behind Buffer (cuda_runtime.cu; core/device_cache.h).
// Work on `stream` (a cudaStream_t) uses the device memory at ptr (anywhere inside a Buffer):
// freeing that buffer then makes its reuse wait for that work. Needed for any stream but the
// compute stream. The stream must outlive the buffer: the free records an event on it.
void cuda_record_stream(const void* ptr, void* stream, int device = 0);
DeviceCacheStats cuda_cache_stats(int device = 0);

// The compute stream of `device` (a cudaStream_t; the stream of ops_for(Device::cuda(device)),
// created on first use). Blocking: ordered with the legacy default stream.
void* cuda_compute_stream(int device);

// A core Event on a cudaEvent_t created with cudaEventDisableTiming on `device`.
// query: cudaEventQuery (never blocks; a failed event counts as complete and its error is
// thrown by synchronize); synchronize: cudaEventSynchronize, errors as sw::Error("cuda: ...");
// native_handle: the cudaEvent_t, so a CUDA stream waits for it without blocking the host.
class CudaEvent : public Event {
 public:
  // timed: made with timing (elapsed_since; cudaEventElapsedTime), else cudaEventDisableTiming.
  explicit CudaEvent(int device, bool timed = false);
  ~CudaEvent() override;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  void record(void* stream);  // cudaEventRecord on a cudaStream_t of this event's device
  bool query() override;
  void synchronize() override;
  void* native_handle() const override { return event_; }
  // cudaEventElapsedTime(ref, this) after both completed; both must be timed events.
  double elapsed_since(Event& ref) override;
  int device() const { return device_; }

 protected:
  void* event_ = nullptr;
  int device_ = 0;
  bool timed_ = false;
};

// A new CudaEvent recorded now on `stream` (a cudaStream_t of `device`).
std::shared_ptr<CudaEvent> cuda_record_event(void* stream, int device);

// Makes `device` the calling thread's current device (cudaSetDevice when it is not already;
// never switched back: a process uses one device, and switching back to device 0 would create
// a context there).
void cuda_use_device(int device);
}  // namespace sw
