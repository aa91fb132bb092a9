#include "core/device_cache.h"

#include <algorithm>

#include "core/env.h"
#include "core/error.h"

namespace sw {

namespace {
constexpr size_t kSmallMax = size_t{1} << 20;  // up to here: 512 B classes, exact match
constexpr size_t kSmallStep = 512;
constexpr size_t kLargeStep = size_t{2} << 20;
}  // namespace

size_t device_block_size(size_t bytes) {
  if (bytes == 0) return 0;
  const size_t g = bytes <= kSmallMax ? kSmallStep : kLargeStep;
  return (bytes + g - 1) / g * g;
}

bool device_caching_from_env() { return env_switch("SHARDWISE_CUDA_CACHING"); }

DeviceCache::DeviceCache(DeviceApi api, int device, bool caching, MemTracker* tracker)
    : api_(api), device_(device), caching_(caching), tracker_(tracker) {
  SW_CHECK(api.raw_alloc && api.raw_free && api.event_create && api.event_record &&
               api.event_query && api.event_destroy,
           "DeviceCache: every DeviceApi function is required");
  st_.caching = caching;
}

DeviceCache::~DeviceCache() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = blocks_.begin(); it != blocks_.end();) {
    Block& b = it->second;
    if (b.state == State::InUse) {
      ++it;
      continue;
    }
    for (void* e : b.events) api_.event_destroy(device_, e);
    api_.raw_free(device_, it->first);
    if (tracker_) tracker_->note_reserved(-static_cast<int64_t>(b.size));
    by_addr_.erase(reinterpret_cast<uintptr_t>(it->first));
    it = blocks_.erase(it);
  }
  for (void* e : events_) api_.event_destroy(device_, e);
}

void* DeviceCache::raw_alloc(size_t size) {
  void* p = api_.raw_alloc(device_, size);
  if (!p) return nullptr;
  ++st_.raw_allocs;
  st_.reserved += size;
  st_.peak_reserved = std::max(st_.peak_reserved, st_.reserved);
  if (tracker_) tracker_->note_reserved(static_cast<int64_t>(size));
  return p;
}

void DeviceCache::raw_free(void* p, size_t size) {
  by_addr_.erase(reinterpret_cast<uintptr_t>(p));
  api_.raw_free(device_, p);
  ++st_.raw_frees;
  st_.reserved -= size;
  if (tracker_) tracker_->note_reserved(-static_cast<int64_t>(size));
}

void* DeviceCache::get_event() {
  if (!events_.empty()) {
    void* e = events_.back();
    events_.pop_back();
    return e;
  }
  ++st_.events_created;
  return api_.event_create(device_);
}

// Moves every pending block whose events have all completed to its stream's free list.
void DeviceCache::process_events() {
  size_t kept = 0;
  for (void* p : pending_) {
    Block& b = blocks_.at(p);
    const bool done = std::all_of(b.events.begin(), b.events.end(),
                                  [&](void* e) { return api_.event_query(device_, e); });
    if (!done) {
      pending_[kept++] = p;
      continue;
    }
    events_.insert(events_.end(), b.events.begin(), b.events.end());
    b.events.clear();
    b.state = State::Cached;
    free_[key(b.stream, b.size)].push_back(p);
    st_.pending -= b.size;
    st_.cached += b.size;
  }
  pending_.resize(kept);
}

void* DeviceCache::take_cached(size_t size, void* stream) {
  const size_t limit = size <= kSmallMax ? size : size + size / 4;
  const uintptr_t s = reinterpret_cast<uintptr_t>(stream);
  for (auto it = free_.lower_bound(key(stream, size));
       it != free_.end() && it->first.first == s && it->first.second <= limit; ++it) {
    if (it->second.empty()) continue;
    void* p = it->second.back();
    it->second.pop_back();
    st_.cached -= it->first.second;
    return p;
  }
  return nullptr;
}

void DeviceCache::release_free_blocks() {
  for (auto& [k, ptrs] : free_) {
    for (void* p : ptrs) {
      raw_free(p, k.second);
      st_.cached -= k.second;
      blocks_.erase(p);
    }
    ptrs.clear();
  }
}

void* DeviceCache::allocate(size_t bytes, void* stream) {
  if (bytes == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  const size_t size = caching_ ? device_block_size(bytes) : bytes;
  void* p = nullptr;
  if (caching_) {
    process_events();
    p = take_cached(size, stream);
    if (p) ++st_.hits;
  }
  if (!p) {
    p = raw_alloc(size);
    if (!p && caching_) {
      ++st_.oom_retries;
      process_events();
      release_free_blocks();
      p = raw_alloc(size);
    }
    if (!p) return nullptr;
    Block& fresh = blocks_[p];
    by_addr_[reinterpret_cast<uintptr_t>(p)] = size;
    fresh.size = size;
    fresh.stream = stream;
  }
  Block& b = blocks_.at(p);
  b.state = State::InUse;
  b.requested = bytes;
  ++st_.allocs;
  st_.allocated += bytes;
  st_.in_use += b.size;
  return p;
}

void DeviceCache::free(void* p) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = blocks_.find(p);
  SW_CHECK(it != blocks_.end() && it->second.state == State::InUse,
           "DeviceCache::free: a pointer that is not an allocated block (double free?)");
  Block& b = it->second;
  st_.allocated -= b.requested;
  st_.in_use -= b.size;
  b.requested = 0;
  if (!caching_) {
    const size_t size = b.size;
    blocks_.erase(it);
    raw_free(p, size);
    return;
  }
  if (b.streams.empty()) {
    b.state = State::Cached;
    free_[key(b.stream, b.size)].push_back(p);
    st_.cached += b.size;
    return;
  }
  for (void* s : b.streams) {
    void* e = get_event();
    b.events.push_back(e);
    api_.event_record(device_, e, s);
  }
  b.streams.clear();
  b.state = State::Pending;
  pending_.push_back(p);
  st_.pending += b.size;
}

void DeviceCache::record_stream(void* p, void* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = blocks_.find(p);
  if (it == blocks_.end()) {  // inside a block: the block starting at or below p
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    auto b = by_addr_.upper_bound(a);
    if (b != by_addr_.begin() && a < (--b)->first + b->second)
      it = blocks_.find(reinterpret_cast<void*>(b->first));
  }
  SW_CHECK(it != blocks_.end() && it->second.state == State::InUse,
           "DeviceCache::record_stream: a pointer that is not inside an allocated block");
  Block& b = it->second;
  if (!caching_ || stream == b.stream) return;
  if (std::find(b.streams.begin(), b.streams.end(), stream) == b.streams.end())
    b.streams.push_back(stream);
}

void DeviceCache::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  process_events();
  release_free_blocks();
}

DeviceCacheStats DeviceCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return st_;
}

}  // namespace sw
