// The caching host allocator, MemTracker per tier (reserved, budget, event log), parse_bytes.
// Each TEST_CASE runs in its own process (catch_discover_tests), so global state is fresh.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/alloc.h"
#include "core/bytes.h"
#include "core/clock.h"
#include "core/error.h"

using namespace sw;

TEST_CASE("The pool reuses blocks: the same sizes get the same pointers back") {
  REQUIRE(caching());
  const std::vector<size_t> sizes = {100, 4096, 70000, size_t{3} << 20, size_t{40} << 20, 1};
  std::vector<void*> first;
  {
    std::vector<Buffer> bufs;
    for (size_t s : sizes) bufs.emplace_back(s, Mem::Activations);
    for (auto& b : bufs) {
      first.push_back(b.data());
      CHECK(reinterpret_cast<uintptr_t>(b.data()) % 64 == 0);
    }
  }
  const size_t reserved = MemTracker::global().reserved();
  CHECK(cached_bytes() == reserved);  // everything is free and kept
  for (int step = 0; step < 3; ++step) {
    std::vector<Buffer> bufs;
    for (size_t s : sizes) bufs.emplace_back(s, Mem::Activations);
    std::set<void*> got, want(first.begin(), first.end());
    for (auto& b : bufs) got.insert(b.data());
    CHECK(got == want);  // same blocks (within a size class the order may differ)
    CHECK(MemTracker::global().reserved() == reserved);  // nothing new from the OS
  }
  // A slightly different large size within the rounding reuses the block too.
  void* p40 = first[4];
  {
    Buffer b((size_t{40} << 20) - 12345, Mem::Grads);
    CHECK(b.data() == p40);
  }
  release_cached();
  CHECK(cached_bytes() == 0);
  CHECK(MemTracker::global().reserved() == 0);
}

TEST_CASE("MemTracker counts current, peak and reserved per category and tier") {
  MemTracker& dev = MemTracker::of(Tier::Device);
  MemTracker& host = MemTracker::of(Tier::Host);
  CHECK(&dev == &MemTracker::global());
  CHECK(&host != &dev);
  CHECK(std::string(tier_name(Tier::Nvme)) == "nvme");
  CHECK(std::string(mem_name(Mem::Checkpoint)) == "checkpoint");
  const size_t d0 = dev.total_current(), h0 = host.total_current();
  {
    Buffer a(1000, Mem::Optimizer, Device::cpu(), Tier::Host);
    Buffer b(5000, Mem::Checkpoint);
    CHECK(a.tier() == Tier::Host);
    CHECK(host.current(Mem::Optimizer) == 1000);
    CHECK(host.total_current() == h0 + 1000);
    CHECK(dev.current(Mem::Checkpoint) == 5000);
    CHECK(dev.total_current() == d0 + 5000);
    CHECK(host.reserved() >= 1000);
    CHECK(dev.reserved() >= 5000);
    CHECK(dev.peak(Mem::Checkpoint) == 5000);
  }
  CHECK(host.total_current() == h0);
  CHECK(dev.current(Mem::Checkpoint) == 0);
  CHECK(dev.peak(Mem::Checkpoint) == 5000);
  CHECK(host.reserved() >= 1000);  // cached, still reserved
  release_cached();
  CHECK(host.reserved() == 0);
  dev.reset_peaks();
  CHECK(dev.peak(Mem::Checkpoint) == 0);
}

TEST_CASE("Caching can be turned off: buffers then go straight back to the OS") {
  set_caching(false);
  {
    Buffer a(size_t{3} << 20, Mem::Workspace);
    CHECK(MemTracker::global().reserved() >= (size_t{3} << 20));
  }
  CHECK(cached_bytes() == 0);
  CHECK(MemTracker::global().reserved() == 0);
  set_caching(true);
  { Buffer a(size_t{3} << 20, Mem::Workspace); }
  CHECK(cached_bytes() > 0);
  set_caching(false);  // blocks allocated while caching are returned when freed
  { Buffer a(size_t{3} << 20, Mem::Workspace); }  // plain allocation; the cached block stays
  release_cached();
  CHECK(MemTracker::global().reserved() == 0);
  set_caching(true);
}

TEST_CASE("A budget refuses an allocation past it with one line naming category and bytes") {
  MemTracker& t = MemTracker::global();
  Buffer params(size_t{3} << 20, Mem::Params);
  t.set_budget(size_t{8} << 20);
  {
    Buffer ok(size_t{4} << 20, Mem::Activations);  // 7 MiB in use: fine
    try {
      Buffer too_much(size_t{2} << 20, Mem::Activations);
      FAIL("no error");
    } catch (const Error& e) {
      const std::string msg = e.what();
      CHECK(msg ==
            "memory: budget of 8.0 MiB exceeded: requesting 2.0 MiB for activations; in use: "
            "params 3.0 MiB, grads 0 B, optimizer 0 B, activations 4.0 MiB, communication 0 B, "
            "workspace 0 B, checkpoint 0 B");
      CHECK(msg.find('\n') == std::string::npos);
    }
    CHECK(t.current(Mem::Activations) == (size_t{4} << 20));  // the refused one counts nothing
    CHECK(t.total_current() == (size_t{7} << 20));
  }
  Buffer fits(size_t{5} << 20, Mem::Activations);  // 8 MiB exactly: allowed
  CHECK(t.total_current() == (size_t{8} << 20));
  t.set_budget(0);
  Buffer more(size_t{64} << 20, Mem::Grads);  // no budget
  CHECK(t.budget() == 0);
  // The Host tier has its own budget; its message says so.
  MemTracker::of(Tier::Host).set_budget(1000);
  CHECK_THROWS_WITH(Buffer(2000, Mem::Optimizer, Device::cpu(), Tier::Host),
                    Catch::StartsWith("memory: host budget of 1000 B exceeded: requesting "
                                      "2.0 KiB for optimizer"));
}

TEST_CASE("The event log records action tag, category and delta: take_log clears it") {
  MemTracker& t = MemTracker::global();
  t.enable_log(true, 4);
  const double t0 = MemTracker::now();
  CHECK(MemTracker::action() == -1);
  MemTracker::set_action(7);
  {
    Buffer a(100, Mem::Grads);
    MemTracker::set_action(8);
    Buffer b(200, Mem::Communication);
  }  // b freed, then a (both under action 8)
  MemTracker::set_action(-1);
  const std::vector<MemEvent> log = t.take_log();
  REQUIRE(log.size() == 4);
  CHECK((log[0].action == 7 && log[0].cat == Mem::Grads && log[0].delta == 100));
  CHECK((log[1].action == 8 && log[1].cat == Mem::Communication && log[1].delta == 200));
  CHECK((log[2].action == 8 && log[2].cat == Mem::Communication && log[2].delta == -200));
  CHECK((log[3].action == 8 && log[3].cat == Mem::Grads && log[3].delta == -100));
  CHECK(log[0].t_s >= t0);
  CHECK(log[3].t_s >= log[0].t_s);
  CHECK(log[3].t_s <= trace_now());
  CHECK(t.take_log().empty());
  // A full ring keeps the newest events and counts the dropped ones.
  for (int i = 0; i < 6; ++i) Buffer x(64 * (i + 1), Mem::Workspace);  // 12 events
  CHECK(t.log_dropped() == 8);
  const std::vector<MemEvent> last = t.take_log();
  REQUIRE(last.size() == 4);
  CHECK(last[2].delta == 384);
  CHECK(last[3].delta == -384);
  t.enable_log(false);
  { Buffer x(64, Mem::Workspace); }
  CHECK(t.take_log().empty());
}

TEST_CASE("Several threads allocating and freeing keep the counters and the pool consistent") {
  MemTracker& t = MemTracker::global();
  t.enable_log(true, 1 << 12);
  const size_t tot0 = t.total_current();
  std::vector<std::thread> threads;
  for (int th = 0; th < 6; ++th)
    threads.emplace_back([th] {
      std::vector<Buffer> live;
      for (int i = 0; i < 2000; ++i) {
        const size_t s = (i * 7919 + th * 104729) % 5 == 0 ? (size_t{1} << 20) + 4096 * i % 3000000
                                                          : 64 + (i * 31 + th) % 20000;
        live.emplace_back(s, static_cast<Mem>((i + th) % static_cast<int>(Mem::Count)));
        std::memset(live.back().data(), th, 64);
        if (live.size() > 8) live.erase(live.begin());
      }
    });
  for (auto& th : threads) th.join();
  CHECK(t.total_current() == tot0);
  for (int m = 0; m < static_cast<int>(Mem::Count); ++m) CHECK(t.current(static_cast<Mem>(m)) == 0);
  CHECK(cached_bytes() == t.reserved());
  release_cached();
  CHECK(t.reserved() == 0);
}

namespace {
std::vector<std::pair<void*, size_t>> g_pins, g_unpins;
bool g_pin_ok = true;
bool fake_pin(void* p, size_t n) {
  g_pins.emplace_back(p, n);
  return g_pin_ok;
}
void fake_unpin(void* p, size_t n) { g_unpins.emplace_back(p, n); }
}  // namespace

// core/alloc.h HostPinning: Tier::Host blocks are pinned once when obtained from the OS (a
// small class on whole pages of its own), stay pinned while cached and reused, and are
// unpinned before they go back to the OS; other tiers, fresh buffers and a failed pin stay
// unpinned.
TEST_CASE("Host pinning: Tier::Host blocks pinned once, unpinned before the OS gets them") {
  REQUIRE(caching());
  MemTracker::of(Tier::Host).set_budget(0);  // (independent of the cases before it, when run in
  release_cached();                          // one process: nothing cached from before pinning)
  CHECK_FALSE(host_pinned(nullptr));
  register_host_pinning({fake_pin, fake_unpin});
  void* first = nullptr;
  for (int i = 0; i < 3; ++i) {  // the cached block is reused: pinned once
    Buffer b(size_t{3} << 20, Mem::Optimizer, Device::cpu(), Tier::Host);
    CHECK(host_pinned(b.data()));
    if (i == 0) first = b.data();
    CHECK(b.data() == first);
  }
  REQUIRE(g_pins.size() == 1);
  CHECK(g_pins[0].first == first);
  CHECK(g_pins[0].second == alloc_block_size(size_t{3} << 20));
  CHECK(host_pinned_bytes() == g_pins[0].second);
  void* small_at = nullptr;
  for (int i = 0; i < 2; ++i) {  // small: its own page, pinned once, reused from the cache
    Buffer small(1000, Mem::Optimizer, Device::cpu(), Tier::Host);
    Buffer dev(size_t{3} << 20, Mem::Optimizer, Device::cpu(), Tier::Device);
    Buffer tiny(100, Mem::Optimizer, Device::cpu(), Tier::Device);
    Buffer fresh = Buffer::fresh(size_t{3} << 20, Mem::Optimizer, Device::cpu(), Tier::Host);
    CHECK(host_pinned(small.data()));
    CHECK(reinterpret_cast<uintptr_t>(small.data()) % 4096 == 0);
    std::memset(small.data(), 2, small.bytes());
    if (i == 0) small_at = small.data();
    CHECK(small.data() == small_at);
    CHECK_FALSE(host_pinned(dev.data()));
    CHECK_FALSE(host_pinned(tiny.data()));
    CHECK_FALSE(host_pinned(fresh.data()));
  }
  REQUIRE(g_pins.size() == 2);
  CHECK(g_pins[1] == std::make_pair(small_at, size_t{4096}));
  CHECK(host_pinned_bytes() == g_pins[0].second + 4096);
  CHECK(g_unpins.empty());
  release_cached();
  REQUIRE(g_unpins.size() == 2);
  CHECK(std::count(g_unpins.begin(), g_unpins.end(), g_pins[0]) == 1);
  CHECK(std::count(g_unpins.begin(), g_unpins.end(), g_pins[1]) == 1);
  CHECK(host_pinned_bytes() == 0);
  CHECK_FALSE(host_pinned(first));

  g_pin_ok = false;  // the backend could not pin: the block is used unpinned
  {
    Buffer b(size_t{5} << 20, Mem::Optimizer, Device::cpu(), Tier::Host);
    CHECK_FALSE(host_pinned(b.data()));
    std::memset(b.data(), 1, b.bytes());
  }
  release_cached();
  CHECK(g_unpins.size() == 2);  // never pinned: never unpinned
  register_host_pinning({});
}

TEST_CASE("parse_bytes accepts bytes and binary/decimal units and rejects the rest") {
  CHECK(parse_bytes("123") == 123);
  CHECK(parse_bytes("0") == 0);
  CHECK(parse_bytes("12GiB") == (size_t{12} << 30));
  CHECK(parse_bytes("12 gib") == (size_t{12} << 30));
  CHECK(parse_bytes("512MiB") == (size_t{512} << 20));
  CHECK(parse_bytes("1.5GB") == 1500000000);
  CHECK(parse_bytes("800KiB") == 800 * 1024);
  CHECK(parse_bytes("800kb") == 800000);
  CHECK(parse_bytes("2TB") == 2000000000000ull);
  CHECK(parse_bytes("1.5KiB") == 1536);
  CHECK(parse_bytes("64B") == 64);
  for (const char* bad : {"", "12 gigs", "-5", "-1GiB", "GiB", "1.5", "12  GiB", "1e9", "0x10",
                          "99999999999999999999", "20000000TiB", "12GiB "}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_bytes(bad), Error);
  }
  CHECK_THROWS_WITH(parse_bytes("12 gigs"), Catch::Contains("'12 gigs'"));
  CHECK(format_bytes(512) == "512 B");
  CHECK(format_bytes(size_t{12} << 30) == "12.0 GiB");
  CHECK(format_bytes(size_t{3} << 19) == "1.5 MiB");
}
