/// Tracked memory. Every byte Shardwise allocates for tensors goes through Buffer, which @file
/// counts logical bytes in use per category, per tier (MemTracker::of), current and peak (the
/// peak of the sum, not the sum of peaks). The profiler and the memory planner read these.
///
/// Host memory comes from a caching allocator (one pool per tier, modelled on PyTorch's CUDA
/// caching allocator): freed blocks go to size-bucketed free lists and are reused; they are
/// never returned to the OS while the run lives (release_cached() does it on request). Sizes
/// are rounded so that the same sequence of requests each step reuses the same blocks:
///   <= 1 MiB: 4 classes per power of two (64 B minimum), exact class match, malloc'd;
///   >  1 MiB: multiples of 128 KiB (< 32 MiB) or 2 MiB, best fit within +25%, mmap'd.
/// So the steady state of a training step allocates nothing from the OS and takes no page
/// faults. MemTracker::reserved() is the pool's bytes (in use + cached) for that tier.
/// SHARDWISE_CACHING_ALLOCATOR=0 or set_caching(false) turns caching off (plain
/// aligned_alloc/free per buffer, for debugging with ASan/valgrind).
///
/// Budget: set_budget(bytes) on a tracker makes an allocation that would take its current
/// total past it throw sw::Error("memory: budget of ... exceeded: requesting ... for <cat>;
/// in use: params ..., ...") before anything is allocated.
///
/// Event log (cheap enough to stay on): enable_log(true, capacity) preallocates a ring of
/// MemEvents; each add/sub appends one (time on trace_now()'s clock, the current action tag,
/// category, signed bytes) without allocating; when full the oldest are overwritten and
/// counted in log_dropped(). The action tag is process-wide (set_action): the step executor
/// sets it before each action, so allocations on any thread during that action (communication,
/// OpenMP workers) are attributed to it.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "shardwise/device.h"

namespace sw {

class Event;  ///< core/stream.h

enum class Mem : uint8_t {
  Params,
  Grads,
  Optimizer,
  Activations,
  Communication,
  Workspace,
  Checkpoint,  ///< the async checkpoint snapshot (host copy of this rank's share)
  Count
};
const char* mem_name(Mem m);  ///< "params", "grads", ..., "checkpoint"

/// Where memory lives. On the CPU backend Device and Host are the same RAM; the Host tier keeps
/// state outside the device's budget (offload). Nvme counts bytes staged for / held in files.
enum class Tier : uint8_t { Device, Host, Nvme, Count };
const char* tier_name(Tier t);  ///< "device", "host", "nvme"

struct MemEvent {
  double t_s;      ///< trace_now() when it happened (core/clock.h)
  int32_t action;  ///< MemTracker::action() at the time; -1: none
  Mem cat;
  int64_t delta;  ///< bytes, + allocated, - freed
};

class MemTracker {
 public:
  MemTracker();
  ~MemTracker();
  MemTracker(const MemTracker&) = delete;
  MemTracker& operator=(const MemTracker&) = delete;

  static MemTracker& global();  ///< = of(Tier::Device)
  static MemTracker& of(Tier t);
  static double now();  ///< = trace_now(): the clock of MemEvent::t_s
  /// The cause tag recorded in events (process-wide; -1 = none).
  static void set_action(int32_t a);
  static int32_t action();

  /// Adds bytes in use; throws sw::Error (and counts nothing) past the budget.
  void add(Mem m, size_t bytes);
  void sub(Mem m, size_t bytes);
  size_t current(Mem m) const { return cur_[idx(m)].load(std::memory_order_relaxed); }
  size_t peak(Mem m) const { return peak_[idx(m)].load(std::memory_order_relaxed); }
  size_t total_current() const { return total_.load(std::memory_order_relaxed); }
  size_t total_peak() const { return total_peak_.load(std::memory_order_relaxed); }
  void reset_peaks();  ///< peaks := current values (reserved's too)

  /// Bytes the allocator holds for this tier (blocks in use, rounded, plus cached free ones).
  size_t reserved() const { return reserved_.load(std::memory_order_relaxed); }
  size_t reserved_peak() const { return reserved_peak_.load(std::memory_order_relaxed); }
  void note_reserved(int64_t delta);  ///< called by the allocator

  void set_budget(size_t bytes);  ///< 0 = none
  size_t budget() const { return budget_.load(std::memory_order_relaxed); }

  void enable_log(bool on, size_t capacity = size_t{1} << 16);
  std::vector<MemEvent> take_log();  ///< events in order; clears the log
  size_t log_dropped() const;        ///< events overwritten since the last take_log

 private:
  static size_t idx(Mem m) { return static_cast<size_t>(m); }
  static constexpr size_t N = static_cast<size_t>(Mem::Count);
  void record(Mem m, int64_t delta);
  [[noreturn]] void over_budget(Mem m, size_t bytes, size_t budget) const;
  std::atomic<size_t> cur_[N]{}, peak_[N]{};
  std::atomic<size_t> total_{0}, total_peak_{0};
  std::atomic<size_t> reserved_{0}, reserved_peak_{0};
  std::atomic<size_t> budget_{0};
  std::atomic<bool> log_on_{false};
  struct Log;
  Log* log_;
};

/// The caching host allocator (see the top of this file).
void set_caching(bool on);  ///< off: later buffers use aligned_alloc/free; cached blocks stay
bool caching();  ///< initially: unless SHARDWISE_CACHING_ALLOCATOR is switched off
/// Returns every cached free block of every tier to the OS, and empties the registered device
/// allocator's cache (DeviceAllocator::release_cached) too.
void release_cached();
size_t cached_bytes();  ///< free bytes held by the host pools (all tiers; device caches not included)
/// The block size the caching allocator serves a request of `bytes` with (the rounding in the
/// comment at the top); the planner's RSS prediction adds it up over the plan's buffers.
size_t alloc_block_size(size_t bytes);

/// Pinned (page-locked) host memory for the offload tiers and every host side of an
/// asynchronous copy. A device backend registers how it pins (the CUDA backend:
/// cudaHostRegister / cudaHostUnregister, registered once the process uses its GPU). From then
/// on every block the host pool obtains from the OS for Tier::Host, of any size, is mapped on
/// its own (page-aligned; a small class takes whole pages, at least 4 KiB, where malloc would
/// share them) and pinned once; it stays pinned while the pool keeps it and is unpinned before
/// it goes back to the OS. Not pinned: other tiers, Buffer::fresh (its point is that untouched
/// pages stay out of the resident set; pinning faults them all in), buffers made while caching
/// is off, and blocks obtained before the registration. pin returns false when it could not
/// pin; the block is then used unpinned. A copy from or into pageable memory is synchronous on
/// CUDA (cudaMemcpyAsync waits for the stream), so the engine stages such copies in Tier::Host.
struct HostPinning {
  bool (*pin)(void* p, size_t bytes) = nullptr;
  void (*unpin)(void* p, size_t bytes) = nullptr;
};
void register_host_pinning(HostPinning h);  ///< {} unregisters (blocks pinned so far stay so)
bool host_pinned(const void* p);  ///< p: a Buffer's data(); true when its block was pinned
size_t host_pinned_bytes();       ///< bytes of the blocks pinned now

/// Device allocators register here (the CPU one is built in); core never includes CUDA. The
/// CUDA backend registers a DeviceCache (core/device_cache.h) per device.
enum class CopyDir : unsigned char { HostToDevice, DeviceToHost, DeviceToDevice };
struct DeviceAllocator {
  /// Every member has an initializer, so the registry (a static array) is constant-initialized
  /// and a backend registering from another static initialiser is never overwritten.
  void* (*alloc)(size_t bytes, int device_index) = nullptr;  ///< nullptr when out of memory
  void (*free)(void* p, int device_index) = nullptr;
  void (*release_cached)() = nullptr;  ///< cached device memory back; called by release_cached()
  /// Copies bytes, ordered after the work enqueued on the device's compute stream so far, and
  /// returns once it is complete (the host may read dst / reuse src). Needed by copy_bytes.
  void (*copy)(void* dst, const void* src, size_t bytes, CopyDir dir, int device_index) = nullptr;
  /// Enqueues the copy on the device's copy stream for its direction and returns its
  /// completion at once (copy_bytes_async). It starts after `after` has completed, or, when
  /// `after` is null, after the work enqueued on the compute stream so far. Optional: without
  /// it copy_bytes_async waits for `after` and calls `copy`.
  std::shared_ptr<Event> (*copy_async)(void* dst, const void* src, size_t bytes, CopyDir dir,
                                       int device_index, Event* after) = nullptr;
};
void register_device_allocator(DeviceKind kind, DeviceAllocator a);
/// The one way host code moves bytes in or out of device memory (Buffers of a non-CPU device):
/// a memcpy when both sides are on the CPU, the device's registered copy otherwise (see
/// DeviceAllocator::copy for the ordering). Copies between two different devices are refused.
void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes);
/// The asynchronous copy (docs/ARCHITECTURE.md, "Copy streams"): returns the copy's completion
/// at once. The copy starts after `after` has completed; with `after` null, after the work
/// enqueued on the device's compute stream so far (what produced src, what last read dst).
/// Until the event has completed, nothing may read or write dst, write src, or free either
/// (device memory: once the compute stream has waited for the event, work enqueued on it
/// after the wait may). Between two host buffers: a memcpy once `after` completed, and a
/// completed event. Copies run in issue order per direction and device.
std::shared_ptr<Event> copy_bytes_async(void* dst, Device dst_dev, const void* src, Device src_dev,
                                        size_t bytes, Event* after = nullptr);

/// An owning, 64-byte-aligned, tracked allocation. Move-only. Contents are uninitialised
/// unless zero() is called (a reused block holds whatever its last user left).
class Buffer {
 public:
  Buffer() = default;
  Buffer(size_t bytes, Mem category, Device device = Device::cpu(), Tier tier = Tier::Device);
  /// Host memory of its own (page-aligned, mapped for this buffer and unmapped when released),
  /// never a block the cache held: pages nobody writes stay out of the resident set. For
  /// buffers that live as long as a model and may be partly used (offload staging sized for
  /// the largest unit). Device memory: as the constructor.
  static Buffer fresh(size_t bytes, Mem category, Device device = Device::cpu(),
                      Tier tier = Tier::Device);
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
  Tier tier() const { return tier_; }
  bool empty() const { return ptr_ == nullptr; }
  void zero();     ///< CPU buffers only
  void release();  ///< gives the memory back (to the pool) now; the Buffer becomes empty

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  size_t block_ = 0;  ///< the allocator's block size (host; 0 for device memory)
  Mem cat_ = Mem::Workspace;
  Tier tier_ = Tier::Device;
  uint8_t origin_ = 0;  ///< host: how the block was obtained (see alloc.cpp)
  Device dev_{};
};

}  // namespace sw
// ---- Reference documentation (Doxygen): the members above without a comment of their own.

/// @struct sw::MemEvent
/// One allocation or free in a MemTracker's log (enable_log).

/// @var sw::MemEvent::cat
/// The memory category of the bytes.

/// @class sw::MemTracker
/// Bytes in use per memory category of one tier (MemTracker::of), their peaks, an optional
/// budget and an optional log of events. Thread-safe.

/// @fn sw::MemTracker::of(Tier t)
/// The tracker of tier `t`.

/// @fn sw::MemTracker::action()
/// The cause tag set_action set (-1: none).

/// @fn sw::MemTracker::sub(Mem m, size_t bytes)
/// Removes bytes in use.

/// @fn sw::MemTracker::current(Mem m) const
/// Bytes of category `m` in use now.

/// @fn sw::MemTracker::peak(Mem m) const
/// The most bytes of category `m` in use at once since reset_peaks().

/// @fn sw::MemTracker::total_current() const
/// Bytes in use now, all categories.

/// @fn sw::MemTracker::total_peak() const
/// The most bytes in use at once, all categories, since reset_peaks().

/// @fn sw::MemTracker::reserved_peak() const
/// The most bytes reserved() held at once.

/// @fn sw::MemTracker::budget() const
/// The budget set_budget set (0: none).

/// @fn sw::MemTracker::enable_log(bool on, size_t capacity)
/// Starts (or stops) recording a MemEvent per add and sub, keeping the last `capacity`.

/// @var sw::HostPinning::pin
/// Pins `bytes` at `p`; false when it could not.

/// @var sw::HostPinning::unpin
/// Unpins what pin pinned.

/// @struct sw::DeviceAllocator
/// The memory hooks a device backend registers (register_device_allocator).

/// @var sw::DeviceAllocator::free
/// Frees what alloc returned.

/// @fn sw::register_device_allocator(DeviceKind kind, DeviceAllocator a)
/// Registers the allocator of devices of `kind` (a backend does so at program start).

/// @fn sw::Buffer::Buffer(size_t bytes, Mem category, Device device, Tier tier)
/// Allocates `bytes` (uninitialised) of `category` on `device` in `tier`; throws sw::Error
/// past the tier's budget or when the device is out of memory.

/// @fn sw::Buffer::Buffer(Buffer&& o) noexcept
/// Takes over o's memory; o becomes empty.

/// @fn sw::Buffer::operator=(Buffer&& o) noexcept
/// Releases this buffer's memory and takes over o's; o becomes empty.

/// @fn sw::Buffer::data() const
/// The memory (null when empty).

/// @fn sw::Buffer::as() const
/// The memory as T*.

/// @fn sw::Buffer::f32() const
/// The memory as float*.

/// @fn sw::Buffer::bytes() const
/// Its size in bytes.

/// @fn sw::Buffer::category() const
/// The memory category it is counted under.

/// @fn sw::Buffer::device() const
/// The device its memory is on.

/// @fn sw::Buffer::tier() const
/// The tier its memory is counted in.

/// @fn sw::Buffer::empty() const
/// True when it holds no memory.
