#include "core/alloc.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "core/error.h"

namespace sw {

const char* mem_name(Mem m) {
  static const char* names[] = {"params",        "grads",    "optimizer", "activations",
                                "communication", "workspace"};
  return m < Mem::Count ? names[static_cast<size_t>(m)] : "?";
}

MemTracker& MemTracker::global() {
  static MemTracker t;
  return t;
}

static void raise_peak(std::atomic<size_t>& peak, size_t v) {
  size_t p = peak.load(std::memory_order_relaxed);
  while (v > p && !peak.compare_exchange_weak(p, v, std::memory_order_relaxed)) {
  }
}

void MemTracker::add(Mem m, size_t bytes) {
  raise_peak(peak_[idx(m)], cur_[idx(m)].fetch_add(bytes, std::memory_order_relaxed) + bytes);
  raise_peak(total_peak_, total_.fetch_add(bytes, std::memory_order_relaxed) + bytes);
}

void MemTracker::sub(Mem m, size_t bytes) {
  cur_[idx(m)].fetch_sub(bytes, std::memory_order_relaxed);
  total_.fetch_sub(bytes, std::memory_order_relaxed);
}

void MemTracker::reset_peaks() {
  for (size_t i = 0; i < N; ++i) peak_[i].store(cur_[i].load());
  total_peak_.store(total_.load());
}

namespace {
DeviceAllocator g_cuda{nullptr, nullptr};
}

void register_device_allocator(DeviceKind kind, DeviceAllocator a) {
  SW_CHECK(kind != DeviceKind::CPU, "the CPU allocator is built in");
  g_cuda = a;
}

Buffer::Buffer(size_t bytes, Mem category, Device device) : bytes_(bytes), cat_(category), dev_(device) {
  if (bytes == 0) return;
  if (device.is_cpu()) {
    const size_t rounded = (bytes + 63) / 64 * 64;
    ptr_ = std::aligned_alloc(64, rounded);
    if (!ptr_)
      fail("memory", "out of host memory allocating " + std::to_string(bytes) + " bytes for " +
                         mem_name(category));
  } else {
    if (!g_cuda.alloc) fail("memory", "no allocator for device " + device.str() + " in this build");
    ptr_ = g_cuda.alloc(bytes, device.index);
  }
  MemTracker::global().add(cat_, bytes_);
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    cat_ = o.cat_;
    dev_ = o.dev_;
  }
  return *this;
}

void Buffer::zero() {
  SW_CHECK(dev_.is_cpu() || !ptr_, "Buffer::zero on a device buffer");
  if (ptr_) std::memset(ptr_, 0, bytes_);
}

void Buffer::release() {
  if (!ptr_) return;
  if (dev_.is_cpu())
    std::free(ptr_);
  else
    g_cuda.free(ptr_, dev_.index);
  MemTracker::global().sub(cat_, bytes_);
  ptr_ = nullptr;
  bytes_ = 0;
}

}  // namespace sw
