// Tracked memory. Every byte Shardwise allocates for tensors goes through Buffer, which
// counts current and peak bytes per category and in total (the peak of the sum, not the sum
// of peaks). The profiler and the memory planner read these counters.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "core/device.h"

namespace sw {

enum class Mem : uint8_t { Params, Grads, Optimizer, Activations, Communication, Workspace, Count };
const char* mem_name(Mem m);  // "params", "grads", ...

class MemTracker {
 public:
  static MemTracker& global();
  void add(Mem m, size_t bytes);
  void sub(Mem m, size_t bytes);
  size_t current(Mem m) const { return cur_[idx(m)].load(std::memory_order_relaxed); }
  size_t peak(Mem m) const { return peak_[idx(m)].load(std::memory_order_relaxed); }
  size_t total_current() const { return total_.load(std::memory_order_relaxed); }
  size_t total_peak() const { return total_peak_.load(std::memory_order_relaxed); }
  void reset_peaks();  // peaks := current values

 private:
  static size_t idx(Mem m) { return static_cast<size_t>(m); }
  static constexpr size_t N = static_cast<size_t>(Mem::Count);
  std::atomic<size_t> cur_[N]{}, peak_[N]{};
  std::atomic<size_t> total_{0}, total_peak_{0};
};

// Device allocators register here (the CPU one is built in); core never includes CUDA.
struct DeviceAllocator {
  void* (*alloc)(size_t bytes, int device_index);
  void (*free)(void* p, int device_index);
};
void register_device_allocator(DeviceKind kind, DeviceAllocator a);

// An owning, 64-byte-aligned, tracked allocation. Move-only. Contents are uninitialised
// unless zero() is called.
class Buffer {
 public:
  Buffer() = default;
  Buffer(size_t bytes, Mem category, Device device = Device::cpu());
  ~Buffer() { release(); }
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return ptr_; }
  template <class T>
  T* as() const { return static_cast<T*>(ptr_); }
  float* f32() const { return static_cast<float*>(ptr_); }
  size_t bytes() const { return bytes_; }
  Mem category() const { return cat_; }
  Device device() const { return dev_; }
  bool empty() const { return ptr_ == nullptr; }
  void zero();     // CPU buffers only
  void release();  // frees now; the Buffer becomes empty

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  Mem cat_ = Mem::Workspace;
  Device dev_{};
};

}  // namespace sw
