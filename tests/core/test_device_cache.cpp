// The stream-ordered caching device allocator (core/device_cache.h) on a fake device: host
// malloc for device memory (with a capacity, to run out of), streams as small integers, events
// that complete when the test says the stream has finished the work enqueued so far.
// Each TEST_CASE runs in its own process (catch_discover_tests), so global state is fresh.
#include <catch2/catch.hpp>

#include <cstdlib>

#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/alloc.h"
#include "core/device_cache.h"
#include "core/error.h"

using namespace sw;

namespace {

// The fake device. One per process; every function locks its mutex (the threaded test calls
// them from several threads, under the cache's own mutex).
struct Fake {
  std::mutex mu;
  size_t capacity = size_t{1} << 40;  // bytes the device may hand out
  size_t used = 0;
  std::map<void*, size_t> live;  // raw allocations
  uint64_t alloc_calls = 0, failed = 0, frees = 0;
  // Per stream: work enqueued (each event record is one point) and work finished.
  std::map<void*, uint64_t> issued, finished;
  struct Ev {
    void* stream = nullptr;
    uint64_t point = 0;
  };
  int events_live = 0;

  // Everything enqueued on `s` so far has run.
  void finish(void* s) {
    std::lock_guard<std::mutex> lock(mu);
    finished[s] = issued[s];
  }
};

Fake& fake() {
  static Fake f;
  return f;
}

void* fake_alloc(int, size_t bytes) {
  Fake& f = fake();
  std::lock_guard<std::mutex> lock(f.mu);
  ++f.alloc_calls;
  if (f.used + bytes > f.capacity) return ++f.failed, nullptr;
  void* p = std::malloc(bytes);
  f.used += bytes;
  f.live[p] = bytes;
  return p;
}

void fake_free(int, void* p) {
  Fake& f = fake();
  std::lock_guard<std::mutex> lock(f.mu);
  auto it = f.live.find(p);
  if (it == f.live.end()) std::abort();  // not a raw allocation: the cache is broken
  f.used -= it->second;
  f.live.erase(it);
  ++f.frees;
  std::free(p);
}

void* fake_event_create(int) {
  std::lock_guard<std::mutex> lock(fake().mu);
  ++fake().events_live;
  return new Fake::Ev;
}

void fake_event_record(int, void* e, void* stream) {
  Fake& f = fake();
  std::lock_guard<std::mutex> lock(f.mu);
  auto* ev = static_cast<Fake::Ev*>(e);
  ev->stream = stream;
  ev->point = ++f.issued[stream];
}

bool fake_event_query(int, void* e) {
  Fake& f = fake();
  std::lock_guard<std::mutex> lock(f.mu);
  auto* ev = static_cast<Fake::Ev*>(e);
  return f.finished[ev->stream] >= ev->point;
}

void fake_event_destroy(int, void* e) {
  std::lock_guard<std::mutex> lock(fake().mu);
  --fake().events_live;
  delete static_cast<Fake::Ev*>(e);
}

constexpr DeviceApi kFakeApi{fake_alloc, fake_free, fake_event_create, fake_event_record,
                             fake_event_query, fake_event_destroy};

void* stream(int i) { return reinterpret_cast<void*>(static_cast<uintptr_t>(0x1000 + i)); }

constexpr size_t KiB = size_t{1} << 10, MiB = size_t{1} << 20;

}  // namespace

TEST_CASE("device_block_size: 512 B classes up to 1 MiB, then 2 MiB multiples") {
  CHECK(device_block_size(0) == 0);
  CHECK(device_block_size(1) == 512);
  CHECK(device_block_size(512) == 512);
  CHECK(device_block_size(513) == 1024);
  CHECK(device_block_size(MiB) == MiB);
  CHECK(device_block_size(MiB + 1) == 2 * MiB);
  CHECK(device_block_size(2 * MiB) == 2 * MiB);
  CHECK(device_block_size(5 * MiB + 7) == 6 * MiB);
}

TEST_CASE("device cache: the steady state makes no raw allocation after warm-up") {
  MemTracker t;
  DeviceCache c(kFakeApi, 0, true, &t);
  // A step's worth of requests of mixed sizes, some alive at once, freed in another order.
  const std::vector<size_t> sizes = {100, 4000, 4000, 70000, 3 * MiB + 5, 40 * MiB, 1, 600 * KiB};
  auto step = [&] {
    std::vector<void*> ps;
    for (size_t s : sizes) ps.push_back(c.allocate(s, stream(0)));
    for (void* p : ps) REQUIRE(p != nullptr);
    for (size_t i = ps.size(); i-- > 0;)
      if (i % 2) c.free(ps[i]);
    for (size_t i = 0; i < ps.size(); ++i)
      if (i % 2 == 0) c.free(ps[i]);
  };
  step();  // warm-up
  const DeviceCacheStats w = c.stats();
  CHECK(w.raw_allocs == sizes.size());
  CHECK(w.in_use == 0);
  CHECK(w.allocated == 0);
  CHECK(w.cached == w.reserved);
  for (int i = 0; i < 100; ++i) step();
  const DeviceCacheStats s = c.stats();
  CHECK(s.raw_allocs == w.raw_allocs);  // nothing new from the device
  CHECK(s.raw_frees == 0);
  CHECK(s.reserved == w.reserved);
  CHECK(s.hits == 100 * sizes.size());
  CHECK(s.allocs == 101 * sizes.size());
  CHECK(fake().alloc_calls == sizes.size());
  CHECK(t.reserved() == s.reserved);
}

TEST_CASE("device cache: stats and reserved bytes are exact") {
  MemTracker t;
  DeviceCache c(kFakeApi, 0, true, &t);
  void* a = c.allocate(100, stream(0));         // 512 B block
  void* b = c.allocate(MiB + 1, stream(0));     // 2 MiB block
  void* d = c.allocate(700 * KiB, stream(1));   // 700 KiB block
  DeviceCacheStats s = c.stats();
  CHECK(s.allocated == 100 + MiB + 1 + 700 * KiB);
  CHECK(s.in_use == 512 + 2 * MiB + 700 * KiB);
  CHECK(s.reserved == s.in_use);
  CHECK(s.cached == 0);
  CHECK(s.pending == 0);
  CHECK(s.raw_allocs == 3);
  CHECK(s.hits == 0);
  CHECK(t.reserved() == s.reserved);
  CHECK(t.reserved_peak() == s.reserved);
  CHECK(fake().used == s.reserved);
  c.free(b);
  s = c.stats();
  CHECK(s.allocated == 100 + 700 * KiB);
  CHECK(s.in_use == 512 + 700 * KiB);
  CHECK(s.cached == 2 * MiB);
  CHECK(s.reserved == 512 + 2 * MiB + 700 * KiB);
  CHECK(t.reserved() == s.reserved);
  c.free(a);
  c.free(d);
  c.empty_cache();
  s = c.stats();
  CHECK(s.reserved == 0);
  CHECK(s.cached == 0);
  CHECK(s.raw_frees == 3);
  CHECK(s.peak_reserved == 512 + 2 * MiB + 700 * KiB);
  CHECK(t.reserved() == 0);
  CHECK(fake().used == 0);
  CHECK(c.allocate(0, stream(0)) == nullptr);
  c.free(nullptr);  // nothing
}

TEST_CASE("device cache: a block freed on a stream is reused at once on that stream only") {
  DeviceCache c(kFakeApi, 0, true, nullptr);
  void* p = c.allocate(10 * KiB, stream(0));
  c.free(p);
  CHECK(c.allocate(10 * KiB, stream(0)) == p);  // same stream: immediately
  c.free(p);
  void* q = c.allocate(10 * KiB, stream(1));  // another stream never takes it without events
  CHECK(q != p);
  CHECK(c.stats().raw_allocs == 2);
  CHECK(fake().events_live == 0);  // no record_stream, no events
  c.free(q);
}

TEST_CASE("device cache: a block recorded on another stream waits for that stream's event") {
  DeviceCache c(kFakeApi, 0, true, nullptr);
  void* p = c.allocate(3 * MiB, stream(0));
  c.record_stream(p, stream(1));  // a copy stream reads it
  c.record_stream(p, stream(1));  // named twice: one event
  c.record_stream(p, stream(0));  // its own stream: nothing to wait for
  c.free(p);
  DeviceCacheStats s = c.stats();
  CHECK(s.pending == 4 * MiB);
  CHECK(s.cached == 0);
  CHECK(s.events_created == 1);
  void* q = c.allocate(3 * MiB, stream(0));  // the copy has not run: p is not reused
  CHECK(q != p);
  c.free(q);
  fake().finish(stream(1));  // now it has
  void* r1 = c.allocate(3 * MiB, stream(0));
  void* r2 = c.allocate(3 * MiB, stream(0));
  CHECK(std::set<void*>{r1, r2} == std::set<void*>{p, q});
  s = c.stats();
  CHECK(s.pending == 0);
  CHECK(s.raw_allocs == 2);
  c.free(r1);
  c.free(r2);

  // Two other streams: reusable only when both have finished. The event is reused.
  void* a = c.allocate(1000, stream(0));
  c.record_stream(a, stream(1));
  c.record_stream(a, stream(2));
  c.free(a);
  fake().finish(stream(2));
  void* b = c.allocate(1000, stream(0));
  CHECK(b != a);
  fake().finish(stream(1));
  void* e = c.allocate(1000, stream(0));
  CHECK(e == a);
  CHECK(c.stats().events_created == 2);  // one kept from before, one more for the second stream
  c.free(b);
  c.free(e);
  // empty_cache releases a pending block whose events completed, keeps one whose did not.
  void* x = c.allocate(1000, stream(0));
  void* y = c.allocate(1000, stream(0));
  c.record_stream(x, stream(1));
  c.record_stream(y, stream(2));
  c.free(x);
  c.free(y);
  fake().finish(stream(1));
  c.empty_cache();
  s = c.stats();
  CHECK(s.pending == 1024);
  CHECK(s.cached == 0);
  CHECK(s.reserved == 1024);
  fake().finish(stream(2));
  c.empty_cache();
  CHECK(c.stats().reserved == 0);
  CHECK(fake().used == 0);
}

// A collective works on a shard of a flat buffer: record_stream takes any address inside an
// allocated block (one outside every block is an internal error: SW_CHECK).
TEST_CASE("device cache: record_stream with a pointer inside a block waits for that block") {
  DeviceCache c(kFakeApi, 0, true, nullptr);
  void* p = c.allocate(3 * MiB, stream(0));
  void* other = c.allocate(1000, stream(0));
  c.record_stream(static_cast<char*>(p) + 2 * MiB, stream(1));
  c.record_stream(static_cast<char*>(p) + 3 * MiB - 1, stream(1));  // the last byte requested
  c.free(p);
  CHECK(c.stats().pending == 4 * MiB);
  void* q = c.allocate(3 * MiB, stream(0));
  CHECK(q != p);  // not reused before stream 1 finished
  fake().finish(stream(1));
  c.empty_cache();
  CHECK(c.stats().pending == 0);
  c.free(q);
  c.free(other);
}

TEST_CASE("device cache: different size classes never share a block") {
  DeviceCache c(kFakeApi, 0, true, nullptr);
  void* small = c.allocate(512, stream(0));
  void* mid = c.allocate(1024, stream(0));
  void* large = c.allocate(4 * MiB, stream(0));
  c.free(small);
  c.free(mid);
  c.free(large);
  // Small classes match exactly: 513 B needs a 1 KiB block (gets mid), 100 B a 512 B block.
  CHECK(c.allocate(513, stream(0)) == mid);
  CHECK(c.allocate(100, stream(0)) == small);
  // A small request never takes a large block, even when nothing else is free.
  void* s2 = c.allocate(800 * KiB, stream(0));
  CHECK(s2 != large);
  // Large: best fit up to 25% above the request's block (4 MiB serves 3.5 MiB, not 2 MiB).
  void* l2 = c.allocate(MiB + 1, stream(0));  // 2 MiB block: 4 MiB is more than 25% larger
  CHECK(l2 != large);
  void* l3 = c.allocate(3 * MiB + 512 * KiB, stream(0));  // 4 MiB block of its own class
  CHECK(l3 == large);
  CHECK(c.stats().raw_allocs == 5);
  c.free(mid);
  c.free(small);
  c.free(s2);
  c.free(l2);
  c.free(l3);
}

TEST_CASE("device cache: out of device memory frees the cache and retries once") {
  MemTracker t;
  DeviceCache c(kFakeApi, 0, true, &t);
  fake().capacity = 8 * MiB;
  void* a = c.allocate(2 * MiB, stream(0));
  void* b = c.allocate(2 * MiB, stream(1));
  void* d = c.allocate(1000, stream(0));
  c.free(a);
  c.free(b);  // 4 MiB cached, but on the wrong streams or size for what follows
  void* big = c.allocate(6 * MiB, stream(2));
  REQUIRE(big != nullptr);
  DeviceCacheStats s = c.stats();
  CHECK(s.oom_retries == 1);
  CHECK(s.raw_frees == 2);
  CHECK(s.cached == 0);
  CHECK(s.reserved == 6 * MiB + 1024);
  CHECK(t.reserved() == s.reserved);
  // Nothing left to free: the request fails and the cache stays consistent.
  CHECK(c.allocate(4 * MiB, stream(0)) == nullptr);
  s = c.stats();
  CHECK(s.oom_retries == 2);
  CHECK(s.reserved == 6 * MiB + 1024);
  CHECK(s.in_use == s.reserved);
  // A pending block (its event not done) is not freed for the retry.
  c.record_stream(big, stream(3));
  c.free(big);
  CHECK(c.allocate(4 * MiB, stream(2)) == nullptr);
  CHECK(c.stats().pending == 6 * MiB);
  fake().finish(stream(3));
  void* again = c.allocate(4 * MiB, stream(0));  // the 6 MiB block is on stream 2: freed, retried
  CHECK(again != nullptr);
  CHECK(c.stats().reserved == 4 * MiB + 1024);
  c.free(again);
  c.free(d);
}

TEST_CASE("device cache: SHARDWISE_CUDA_CACHING=0 turns caching off") {
  CHECK(device_caching_from_env());
  setenv("SHARDWISE_CUDA_CACHING", "1", 1);
  CHECK(device_caching_from_env());
  setenv("SHARDWISE_CUDA_CACHING", "0", 1);
  REQUIRE_FALSE(device_caching_from_env());
  MemTracker t;
  DeviceCache c(kFakeApi, 0, device_caching_from_env(), &t);
  CHECK_FALSE(c.stats().caching);
  for (int i = 0; i < 10; ++i) {
    void* p = c.allocate(1000, stream(0));
    CHECK(t.reserved() == 1000);  // exactly the request, not a class
    c.record_stream(p, stream(1));  // ignored: the raw free orders itself
    c.free(p);
    CHECK(t.reserved() == 0);
  }
  const DeviceCacheStats s = c.stats();
  CHECK(s.raw_allocs == 10);
  CHECK(s.raw_frees == 10);
  CHECK(s.hits == 0);
  CHECK(s.events_created == 0);
  setenv("SHARDWISE_CUDA_CACHING", "off", 1);
  CHECK_FALSE(device_caching_from_env());
}

TEST_CASE("device cache: threads allocating, recording and freeing at once stay consistent") {
  MemTracker t;
  DeviceCache c(kFakeApi, 0, true, &t);
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};  // Catch's assertions are not thread-safe: count, check after
  std::thread finisher([&] {  // the device: streams 1 and 2 keep finishing their work
    while (!stop.load()) {
      fake().finish(stream(1));
      fake().finish(stream(2));
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> ts;
  for (int k = 0; k < 4; ++k)
    ts.emplace_back([&, k] {
      for (int i = 0; i < 300; ++i) {
        const size_t bytes = (i % 3 == 0) ? 3 * MiB : static_cast<size_t>(1000 * (1 + i % 5));
        void* p = c.allocate(bytes, stream(0));
        if (!p) {
          ++failures;
          continue;
        }
        if (i % 4 == k) c.record_stream(p, stream(1 + i % 2));
        c.free(p);
        if (i % 50 == 49) (void)c.stats();
      }
    });
  for (auto& th : ts) th.join();
  stop = true;
  finisher.join();
  fake().finish(stream(1));
  fake().finish(stream(2));
  c.empty_cache();
  const DeviceCacheStats s = c.stats();
  CHECK(failures == 0);
  CHECK(s.allocs == 1200);
  CHECK(s.in_use == 0);
  CHECK(s.allocated == 0);
  CHECK(s.reserved == 0);
  CHECK(s.raw_allocs == s.raw_frees);
  CHECK(t.reserved() == 0);
  CHECK(fake().used == 0);
}

// Buffer on a "cuda" device through a registered DeviceCache: the tracker counts the request by
// category, the cache's blocks as reserved, the budget refuses before the cache is asked, and
// core's release_cached() empties the device cache.
namespace {
DeviceCache* g_cache = nullptr;
void* buf_alloc(size_t bytes, int) { return g_cache->allocate(bytes, nullptr); }
void buf_free(void* p, int) { g_cache->free(p); }
void buf_release() { g_cache->empty_cache(); }
}  // namespace

TEST_CASE("device cache behind Buffer: categories, reserved, budget and release_cached") {
  MemTracker& dev = MemTracker::of(Tier::Device);
  DeviceCache c(kFakeApi, 0, true, &dev);
  g_cache = &c;
  register_device_allocator(DeviceKind::CUDA, {buf_alloc, buf_free, buf_release});
  const size_t r0 = dev.reserved();
  {
    Buffer a(1000, Mem::Params, Device::cuda(0));
    Buffer g(3 * MiB, Mem::Grads, Device::cuda(0));
    CHECK(dev.current(Mem::Params) == 1000);
    CHECK(dev.current(Mem::Grads) == 3 * MiB);
    CHECK(dev.reserved() == r0 + 1024 + 4 * MiB);
    CHECK(c.stats().allocated == 1000 + 3 * MiB);
  }
  CHECK(dev.current(Mem::Params) == 0);
  CHECK(dev.current(Mem::Grads) == 0);
  CHECK(dev.reserved() == r0 + 1024 + 4 * MiB);  // cached, still reserved
  for (int i = 0; i < 100; ++i) {
    Buffer a(1000, Mem::Activations, Device::cuda(0));
    Buffer g(3 * MiB, Mem::Workspace, Device::cuda(0));
  }
  CHECK(c.stats().raw_allocs == 2);
  dev.set_budget(2 * MiB);
  CHECK_THROWS_WITH(Buffer(3 * MiB, Mem::Params, Device::cuda(0)),
                    Catch::Contains("budget") && Catch::Contains("params"));
  CHECK(c.stats().allocs == 202);  // the cache was not asked
  dev.set_budget(0);
  fake().capacity = 0;  // the device is full: Buffer reports it, counting nothing
  CHECK_THROWS_WITH(Buffer(8 * MiB, Mem::Params, Device::cuda(0)),
                    Catch::Contains("out of memory on cuda:0"));
  CHECK(dev.current(Mem::Params) == 0);
  CHECK(c.stats().reserved == 0);  // the retry emptied the cache
  fake().capacity = size_t{1} << 40;
  { Buffer a(1000, Mem::Params, Device::cuda(0)); }
  CHECK(c.stats().cached == 1024);
  release_cached();
  CHECK(c.stats().reserved == 0);
  CHECK(dev.reserved() == r0);
  register_device_allocator(DeviceKind::CUDA, {nullptr, nullptr, nullptr});
  g_cache = nullptr;
}
