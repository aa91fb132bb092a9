#include "core/alloc.h"

#include <sys/mman.h>

#include <bit>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <unordered_set>

#include "core/bytes.h"
#include "core/clock.h"
#include "core/env.h"
#include "core/error.h"
#include "core/stream.h"

namespace sw {

const char* mem_name(Mem m) {
  static const char* names[] = {"params",        "grads",     "optimizer", "activations",
                                "communication", "workspace", "checkpoint"};
  static_assert(sizeof names / sizeof names[0] == static_cast<size_t>(Mem::Count));
  return m < Mem::Count ? names[static_cast<size_t>(m)] : "?";
}

const char* tier_name(Tier t) {
  static const char* names[] = {"device", "host", "nvme"};
  static_assert(sizeof names / sizeof names[0] == static_cast<size_t>(Tier::Count));
  return t < Tier::Count ? names[static_cast<size_t>(t)] : "?";
}

// ---------------------------------------------------------------------------------------------
// MemTracker

struct MemTracker::Log {
  std::mutex mu;
  std::vector<MemEvent> ring;  // sized once by enable_log
  size_t head = 0, size = 0, dropped = 0;
};

namespace {
std::atomic<int32_t> g_action{-1};

void raise_peak(std::atomic<size_t>& peak, size_t v) {
  size_t p = peak.load(std::memory_order_relaxed);
  while (v > p && !peak.compare_exchange_weak(p, v, std::memory_order_relaxed)) {
  }
}
}  // namespace

MemTracker::MemTracker() : log_(new Log) {}
MemTracker::~MemTracker() { delete log_; }

MemTracker& MemTracker::of(Tier t) {
  // Never destroyed: buffers owned by statics and thread_locals are freed at exit after
  // ordinary statics are gone.
  static MemTracker* trackers = new MemTracker[static_cast<size_t>(Tier::Count)];
  SW_CHECK(t < Tier::Count, "bad memory tier");
  return trackers[static_cast<size_t>(t)];
}

MemTracker& MemTracker::global() { return of(Tier::Device); }

double MemTracker::now() { return trace_now(); }
void MemTracker::set_action(int32_t a) { g_action.store(a, std::memory_order_relaxed); }
int32_t MemTracker::action() { return g_action.load(std::memory_order_relaxed); }

void MemTracker::add(Mem m, size_t bytes) {
  const size_t budget = budget_.load(std::memory_order_relaxed);
  const size_t total = total_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  if (budget != 0 && total > budget) {
    total_.fetch_sub(bytes, std::memory_order_relaxed);
    over_budget(m, bytes, budget);
  }
  raise_peak(total_peak_, total);
  raise_peak(peak_[idx(m)], cur_[idx(m)].fetch_add(bytes, std::memory_order_relaxed) + bytes);
  if (log_on_.load(std::memory_order_relaxed)) record(m, static_cast<int64_t>(bytes));
}

void MemTracker::sub(Mem m, size_t bytes) {
  cur_[idx(m)].fetch_sub(bytes, std::memory_order_relaxed);
  total_.fetch_sub(bytes, std::memory_order_relaxed);
  if (log_on_.load(std::memory_order_relaxed)) record(m, -static_cast<int64_t>(bytes));
}

void MemTracker::over_budget(Mem m, size_t bytes, size_t budget) const {
  std::string use;
  for (size_t i = 0; i < N; ++i) {
    if (i) use += ", ";
    use += std::string(mem_name(static_cast<Mem>(i))) + " " + format_bytes(current(static_cast<Mem>(i)));
  }
  const std::string tier = this == &of(Tier::Device) ? ""
                           : this == &of(Tier::Host) ? "host "
                           : this == &of(Tier::Nvme) ? "nvme "
                                                     : "";
  fail("memory", tier + "budget of " + format_bytes(budget) + " exceeded: requesting " +
                     format_bytes(bytes) + " for " + mem_name(m) + "; in use: " + use);
}

void MemTracker::reset_peaks() {
  for (size_t i = 0; i < N; ++i) peak_[i].store(cur_[i].load());
  total_peak_.store(total_.load());
  reserved_peak_.store(reserved_.load());
}

void MemTracker::note_reserved(int64_t delta) {
  if (delta >= 0)
    raise_peak(reserved_peak_,
               reserved_.fetch_add(static_cast<size_t>(delta), std::memory_order_relaxed) +
                   static_cast<size_t>(delta));
  else
    reserved_.fetch_sub(static_cast<size_t>(-delta), std::memory_order_relaxed);
}

void MemTracker::set_budget(size_t bytes) { budget_.store(bytes, std::memory_order_relaxed); }

void MemTracker::enable_log(bool on, size_t capacity) {
  std::lock_guard<std::mutex> lock(log_->mu);
  if (on) {
    SW_CHECK(capacity > 0, "enable_log: capacity must be positive");
    if (log_->ring.size() != capacity) {
      log_->ring.assign(capacity, MemEvent{0, -1, Mem::Workspace, 0});
      log_->head = log_->size = 0;
    }
  }
  log_on_.store(on, std::memory_order_relaxed);
}

void MemTracker::record(Mem m, int64_t delta) {
  const MemEvent e{trace_now(), g_action.load(std::memory_order_relaxed), m, delta};
  std::lock_guard<std::mutex> lock(log_->mu);
  const size_t cap = log_->ring.size();
  if (cap == 0) return;
  log_->ring[log_->head] = e;
  log_->head = (log_->head + 1) % cap;
  if (log_->size < cap)
    ++log_->size;
  else
    ++log_->dropped;
}

std::vector<MemEvent> MemTracker::take_log() {
  std::lock_guard<std::mutex> lock(log_->mu);
  std::vector<MemEvent> out;
  out.reserve(log_->size);
  const size_t cap = log_->ring.size();
  for (size_t i = 0; i < log_->size; ++i)
    out.push_back(log_->ring[(log_->head + cap - log_->size + i) % cap]);
  log_->size = 0;
  log_->dropped = 0;
  return out;
}

size_t MemTracker::log_dropped() const {
  std::lock_guard<std::mutex> lock(log_->mu);
  return log_->dropped;
}

// ---------------------------------------------------------------------------------------------
// The caching host allocator

namespace {

constexpr size_t kSmallMax = size_t{1} << 20;  // up to here: size classes, malloc'd blocks
enum Origin : uint8_t { kNone = 0, kPlain = 1, kPooled = 2, kFresh = 3 };  // kFresh: Buffer::fresh

// The block size serving a request: 4 classes per power of two (multiples of 64 B) up to
// 1 MiB; above, multiples of 128 KiB below 32 MiB and of 2 MiB from there.
size_t round_size(size_t s) {
  if (s <= 64) return 64;
  if (s <= kSmallMax) {
    const size_t step = std::max<size_t>(std::bit_floor(s - 1) / 4, 64);
    return (s + step - 1) / step * step;
  }
  const size_t g = s < (size_t{32} << 20) ? (size_t{128} << 10) : (size_t{2} << 20);
  return (s + g - 1) / g * g;
}

// Host pinning (core/alloc.h HostPinning). The functions are read under g_pin_mu, so a
// registration never races a pin; the set holds the pinned blocks (each mmap'd on its own), so
// host_pinned and the unpin before an OS free need no other bookkeeping.
std::mutex g_pin_mu;
HostPinning g_pinning;
std::unordered_set<const void*>* g_pinned = new std::unordered_set<const void*>;  // never freed
size_t g_pinned_bytes = 0;

constexpr size_t kPage = 4096;
size_t page_span(size_t block) { return (block + kPage - 1) / kPage * kPage; }

void* os_alloc(size_t block) {
  if (block <= kSmallMax) return std::aligned_alloc(64, block);
  void* p = mmap(nullptr, block, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

// A block from the OS for `tier`. While a backend pins, a Tier::Host block of any size is
// mapped on its own (whole pages: a small class takes at least one) and pinned; where the pin
// fails it is made as any other block, unpinned.
void* os_alloc_for(size_t block, Tier tier) {
  if (tier == Tier::Host) {
    std::lock_guard<std::mutex> lock(g_pin_mu);
    if (g_pinning.pin) {
      const size_t span = page_span(block);
      void* p = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p != MAP_FAILED) {
        if (g_pinning.pin(p, span)) {
          g_pinned->insert(p);
          g_pinned_bytes += span;
          return p;
        }
        munmap(p, span);
      }
    }
  }
  return os_alloc(block);
}

// A pinned block is unpinned and unmapped; any other goes back as os_alloc made it.
void os_free(void* p, size_t block) {
  {
    std::lock_guard<std::mutex> lock(g_pin_mu);
    if (g_pinned->erase(p) != 0) {
      const size_t span = page_span(block);
      g_pinned_bytes -= span;
      if (g_pinning.unpin) g_pinning.unpin(p, span);
      munmap(p, span);
      return;
    }
  }
  if (block <= kSmallMax)
    std::free(p);
  else
    munmap(p, block);
}

struct Pool {
  std::mutex mu;
  // block size -> free blocks of that size. Entries (and the vectors' capacity) are kept once
  // created, so the steady state allocates nothing here either.
  std::map<size_t, std::vector<void*>> free;
  size_t cached = 0;
};

Pool* pools() {
  static Pool* p = new Pool[static_cast<size_t>(Tier::Count)];  // never destroyed (see of())
  return p;
}

std::atomic<bool>& caching_flag() {
  static std::atomic<bool> on{env_switch("SHARDWISE_CACHING_ALLOCATOR")};
  return on;
}

void release_pool(Tier t) {
  Pool& pool = pools()[static_cast<size_t>(t)];
  std::lock_guard<std::mutex> lock(pool.mu);
  size_t freed = 0;
  for (auto& [size, blocks] : pool.free) {
    for (void* p : blocks) os_free(p, size), freed += size;
    blocks.clear();
  }
  pool.cached = 0;
  if (freed) MemTracker::of(t).note_reserved(-static_cast<int64_t>(freed));
}

void* host_alloc(size_t bytes, Tier tier, size_t* block, uint8_t* origin) {
  MemTracker& tr = MemTracker::of(tier);
  if (!caching()) {
    const size_t b = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, b);
    if (p) *block = b, *origin = kPlain, tr.note_reserved(static_cast<int64_t>(b));
    return p;
  }
  const size_t r = round_size(bytes);
  Pool& pool = pools()[static_cast<size_t>(tier)];
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    // Small: exact class. Large: the smallest free block of at least r, within +25%.
    auto it = pool.free.lower_bound(r);
    const size_t limit = r <= kSmallMax ? r : r + r / 4;
    for (; it != pool.free.end() && it->first <= limit; ++it)
      if (!it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        pool.cached -= it->first;
        *block = it->first, *origin = kPooled;
        return p;
      }
  }
  void* p = os_alloc_for(r, tier);
  if (!p) {  // give the cache back to the OS and try once more
    for (size_t t = 0; t < static_cast<size_t>(Tier::Count); ++t) release_pool(static_cast<Tier>(t));
    p = os_alloc_for(r, tier);
  }
  if (p) *block = r, *origin = kPooled, tr.note_reserved(static_cast<int64_t>(r));
  return p;
}

void host_free(void* p, size_t block, uint8_t origin, Tier tier) {
  if (origin == kFresh) {
    munmap(p, block);
    MemTracker::of(tier).note_reserved(-static_cast<int64_t>(block));
    return;
  }
  if (origin == kPooled && caching()) {
    Pool& pool = pools()[static_cast<size_t>(tier)];
    std::lock_guard<std::mutex> lock(pool.mu);
    pool.free[block].push_back(p);
    pool.cached += block;
    return;
  }
  if (origin == kPooled)
    os_free(p, block);
  else
    std::free(p);
  MemTracker::of(tier).note_reserved(-static_cast<int64_t>(block));
}

// One registered allocator per device kind (the CPU's slot stays empty: it is built in).
constinit DeviceAllocator g_dev[static_cast<size_t>(DeviceKind::Count)];
DeviceAllocator& dev_alloc(DeviceKind k) { return g_dev[static_cast<size_t>(k)]; }

[[noreturn]] void out_of_host_memory(size_t bytes, Mem category) {
  fail("memory", "out of host memory allocating " + format_bytes(bytes) + " for " +
                     mem_name(category));
}

}  // namespace

void set_caching(bool on) { caching_flag().store(on); }
bool caching() { return caching_flag().load(std::memory_order_relaxed); }

void release_cached() {
  for (size_t t = 0; t < static_cast<size_t>(Tier::Count); ++t) release_pool(static_cast<Tier>(t));
  for (DeviceAllocator& a : g_dev)
    if (a.release_cached) a.release_cached();
}

size_t alloc_block_size(size_t bytes) { return bytes == 0 ? 0 : round_size(bytes); }

size_t cached_bytes() {
  size_t n = 0;
  for (size_t t = 0; t < static_cast<size_t>(Tier::Count); ++t) {
    Pool& pool = pools()[t];
    std::lock_guard<std::mutex> lock(pool.mu);
    n += pool.cached;
  }
  return n;
}

void register_host_pinning(HostPinning h) {
  std::lock_guard<std::mutex> lock(g_pin_mu);
  g_pinning = h;
}

bool host_pinned(const void* p) {
  std::lock_guard<std::mutex> lock(g_pin_mu);
  return p && g_pinned->count(p) != 0;
}

size_t host_pinned_bytes() {
  std::lock_guard<std::mutex> lock(g_pin_mu);
  return g_pinned_bytes;
}

void register_device_allocator(DeviceKind kind, DeviceAllocator a) {
  SW_CHECK(kind != DeviceKind::CPU && kind != DeviceKind::Count, "the CPU allocator is built in");
  dev_alloc(kind) = a;
}

void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) {
  if (bytes == 0) return;
  if (dst_dev.is_cpu() && src_dev.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  SW_CHECK(dst_dev.is_cpu() || src_dev.is_cpu() || dst_dev == src_dev,
           "copy_bytes between two devices");
  const Device dev = dst_dev.is_cpu() ? src_dev : dst_dev;
  const DeviceAllocator& a = dev_alloc(dev.kind);
  if (!a.copy) fail("memory", "no copy for device " + dev.str() + " in this build");
  const CopyDir dir = src_dev.is_cpu()   ? CopyDir::HostToDevice
                      : dst_dev.is_cpu() ? CopyDir::DeviceToHost
                                         : CopyDir::DeviceToDevice;
  a.copy(dst, src, bytes, dir, dev.index);
}

std::shared_ptr<Event> copy_bytes_async(void* dst, Device dst_dev, const void* src, Device src_dev,
                                        size_t bytes, Event* after) {
  const bool host = dst_dev.is_cpu() && src_dev.is_cpu();
  if (!host) {
    SW_CHECK(dst_dev.is_cpu() || src_dev.is_cpu() || dst_dev == src_dev,
             "copy_bytes_async between two devices");
    const Device dev = dst_dev.is_cpu() ? src_dev : dst_dev;
    const DeviceAllocator& a = dev_alloc(dev.kind);
    if (a.copy_async && bytes > 0) {
      const CopyDir dir = src_dev.is_cpu()   ? CopyDir::HostToDevice
                          : dst_dev.is_cpu() ? CopyDir::DeviceToHost
                                             : CopyDir::DeviceToDevice;
      return a.copy_async(dst, src, bytes, dir, dev.index, after);
    }
  }
  if (after) after->synchronize();
  copy_bytes(dst, dst_dev, src, src_dev, bytes);  // ordered after the compute stream's work
  return completed_event();
}

// ---------------------------------------------------------------------------------------------
// Buffer

Buffer::Buffer(size_t bytes, Mem category, Device device, Tier tier)
    : bytes_(bytes), cat_(category), tier_(tier), dev_(device) {
  if (bytes == 0) return;
  MemTracker& tr = MemTracker::of(tier);
  tr.add(cat_, bytes_);  // throws past the budget, before anything is allocated
  if (device.is_cpu()) {
    ptr_ = host_alloc(bytes, tier, &block_, &origin_);
    if (!ptr_) {
      tr.sub(cat_, bytes_);
      bytes_ = 0;
      out_of_host_memory(bytes, category);
    }
  } else {
    const DeviceAllocator& a = dev_alloc(device.kind);
    try {
      if (a.alloc) ptr_ = a.alloc(bytes, device.index);
    } catch (...) {  // a device error other than out of memory: count nothing
      tr.sub(cat_, bytes_);
      bytes_ = 0;
      throw;
    }
    if (!ptr_) {
      tr.sub(cat_, bytes_);
      bytes_ = 0;
      if (!a.alloc) fail("memory", "no allocator for device " + device.str() + " in this build");
      fail("memory", "out of memory on " + device.str() + " allocating " + format_bytes(bytes) +
                         " for " + mem_name(category));
    }
  }
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    block_ = std::exchange(o.block_, 0);
    origin_ = std::exchange(o.origin_, kNone);
    cat_ = o.cat_;
    tier_ = o.tier_;
    dev_ = o.dev_;
  }
  return *this;
}

void Buffer::zero() {
  SW_CHECK(dev_.is_cpu() || !ptr_, "Buffer::zero on a device buffer");
  if (ptr_) std::memset(ptr_, 0, bytes_);
}

Buffer Buffer::fresh(size_t bytes, Mem category, Device device, Tier tier) {
  if (!device.is_cpu() || bytes == 0) return Buffer(bytes, category, device, tier);
  Buffer b;
  MemTracker& tr = MemTracker::of(tier);
  tr.add(category, bytes);  // throws past the budget, before anything is allocated
  const size_t page = 4096, block = (bytes + page - 1) / page * page;
  void* p = mmap(nullptr, block, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    tr.sub(category, bytes);
    out_of_host_memory(bytes, category);
  }
  tr.note_reserved(static_cast<int64_t>(block));
  b.ptr_ = p, b.bytes_ = bytes, b.block_ = block, b.cat_ = category, b.tier_ = tier;
  b.origin_ = kFresh, b.dev_ = device;
  return b;
}

void Buffer::release() {
  if (!ptr_) return;
  if (dev_.is_cpu())
    host_free(ptr_, block_, origin_, tier_);
  else
    dev_alloc(dev_.kind).free(ptr_, dev_.index);
  MemTracker::of(tier_).sub(cat_, bytes_);
  ptr_ = nullptr;
  bytes_ = 0;
  block_ = 0;
  origin_ = kNone;
}

}  // namespace sw
