// The io queue (offload/io_stream.h) on the async I/O engine, for each backend (io_uring where
// the kernel allows it, threads): hazards (a read after a write of the same file range sees it
// with many operations in flight, writes to one range land in order, a buffer handed to a
// write is refilled by a later read only once the write has read it), disjoint operations
// handed to the engine together, O_DIRECT through an attached AioFile, failures (injected
// ENOSPC / EIO, end of file, a bad descriptor) that complete every event, and a destructor
// that finishes what is queued.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "offload/aio.h"
#include "offload/io_stream.h"
#include "tests/common/temp_dir.h"

using namespace sw;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

using swtest::TempDir;

std::vector<unsigned char> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

struct Backend {
  const char* name;
  AioConfig cfg;
};

// threads with 4 workers (several operations really run at once), and io_uring if allowed.
std::vector<Backend> backends() {
  std::vector<Backend> out;
  AioConfig t;
  t.backend = AioBackend::Threads;
  t.intra_op_parallelism = 4;
  out.push_back({"threads", t});
  AioConfig u;
  u.backend = AioBackend::IoUring;
  try {
    IoStream probe(u);
    out.push_back({"io_uring", u});
  } catch (const Error& e) {
    WARN("io_uring unavailable here, only the thread backend is tested: " << e.what());
  }
  return out;
}

std::string error_of(const IoEventPtr& ev) {
  try {
    ev->synchronize();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Sets an environment variable for one scope.
struct ScopedEnv {
  std::string name;
  ScopedEnv(const char* n, const char* v) : name(n) { ::setenv(n, v, 1); }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

}  // namespace

TEST_CASE("io_stream: a read after a write of the same range sees it, many in flight", "[io]") {
  TempDir dir("io_raw");
  for (const Backend& b : backends())
    for (const bool direct : {false, true}) {
      INFO(b.name << (direct ? " O_DIRECT file" : " plain fd"));
      const size_t chunk = direct ? 64 * 1024 : 10007;  // O_DIRECT-aligned, or odd
      const int n = 48;
      AioFile f = AioFile::create(dir.file("raw.bin"), 0, direct);
      IoStream io(b.cfg);
      if (direct) io.attach(f);
      std::vector<StagingBuffer> a, a2, r, r2;
      for (int k = 0; k < n; ++k) {
        a.push_back(aligned_staging(chunk));
        a2.push_back(aligned_staging(chunk));
        r.push_back(aligned_staging(chunk));
        r2.push_back(aligned_staging(chunk));
        auto x = random_bytes(chunk, uint64_t(k)), y = random_bytes(chunk, uint64_t(k + 1000));
        std::memcpy(a.back().data(), x.data(), chunk);
        std::memcpy(a2.back().data(), y.data(), chunk);
      }
      std::vector<IoEventPtr> w1, rd1, w2, rd2;
      // Per chunk: write, read back, overwrite, read back; nothing waits until the end. Held
      // while enqueueing, so that every chunk's first write is handed over at once.
      io.hold(true);
      for (int k = 0; k < n; ++k) {
        const int64_t off = int64_t(k) * int64_t(chunk);
        w1.push_back(io.write(f.fd(), f.path(), a[k].data(), chunk, off));
        rd1.push_back(io.read(f.fd(), f.path(), r[k].data(), chunk, off));
        w2.push_back(io.write(f.fd(), f.path(), a2[k].data(), chunk, off));
        rd2.push_back(io.read(f.fd(), f.path(), r2[k].data(), chunk, off));
      }
      io.hold(false);
      for (int k = 0; k < n; ++k) {
        rd2[k]->synchronize();
        rd1[k]->synchronize();
        w1[k]->synchronize();
        w2[k]->synchronize();
        CHECK(std::memcmp(r[k].data(), a[k].data(), chunk) == 0);
        CHECK(std::memcmp(r2[k].data(), a2[k].data(), chunk) == 0);
        CHECK(rd1[k]->started_at() >= w1[k]->done_at());
        CHECK(w2[k]->started_at() >= rd1[k]->done_at());  // write after read of the file range
        CHECK(rd2[k]->started_at() >= w2[k]->done_at());
      }
      CHECK(io.stats().ops == 4 * n);
      CHECK(io.stats().peak_in_flight >= n);  // the chunks' chains ran side by side
    }
}

TEST_CASE("io_stream: disjoint operations go to the engine together, conflicting ones in order",
          "[io]") {
  TempDir dir("io_overlap");
  for (const Backend& b : backends()) {
    INFO(b.name);
    const size_t chunk = 256 * 1024;
    const int n = 16;
    AioFile f = AioFile::create(dir.file("o.bin"), 0, true);
    std::vector<StagingBuffer> bufs;
    for (int k = 0; k < n; ++k) {
      bufs.push_back(aligned_staging(chunk));
      std::memset(bufs.back().data(), k + 1, chunk);
    }
    {  // disjoint: all n handed over at once when released
      IoStream io(b.cfg);
      io.attach(f);
      io.hold(true);
      std::vector<IoEventPtr> ev;
      for (int k = 0; k < n; ++k)
        ev.push_back(io.write(f.fd(), f.path(), bufs[k].data(), chunk, int64_t(k) * int64_t(chunk)));
      for (auto& e : ev) CHECK(!e->query());
      io.hold(false);
      for (auto& e : ev) e->synchronize();
      CHECK(io.stats().peak_in_flight == n);
      for (int k = 0; k < n; ++k) {  // and each landed where it should
        std::vector<unsigned char> back(chunk);
        REQUIRE(::pread(f.fd(), back.data(), chunk, off_t(k) * off_t(chunk)) == ssize_t(chunk));
        CHECK(back == std::vector<unsigned char>(chunk, static_cast<unsigned char>(k + 1)));
      }
    }
    {  // the same range n times (write after write): one at a time, the last one wins
      IoStream io(b.cfg);
      io.attach(f);
      io.hold(true);
      std::vector<IoEventPtr> ev;
      for (int k = 0; k < n; ++k) ev.push_back(io.write(f.fd(), f.path(), bufs[k].data(), chunk, 0));
      io.hold(false);
      for (auto& e : ev) e->synchronize();
      CHECK(io.stats().peak_in_flight == 1);
      for (int k = 1; k < n; ++k) CHECK(ev[k]->started_at() >= ev[k - 1]->done_at());
      std::vector<unsigned char> back(chunk);
      REQUIRE(::pread(f.fd(), back.data(), chunk, 0) == ssize_t(chunk));
      CHECK(back == std::vector<unsigned char>(chunk, static_cast<unsigned char>(n)));
    }
    {  // reads of one range into distinct buffers never conflict
      IoStream io(b.cfg);
      io.hold(true);
      std::vector<IoEventPtr> ev;
      for (int k = 0; k < n; ++k) ev.push_back(io.read(f.fd(), f.path(), bufs[k].data(), chunk, 0));
      io.hold(false);
      for (auto& e : ev) e->synchronize();
      CHECK(io.stats().peak_in_flight == n);
    }
  }
}

TEST_CASE("io_stream: a buffer handed to a write is refilled by a later read only after it",
          "[io]") {
  TempDir dir("io_war");
  for (const Backend& b : backends()) {
    INFO(b.name);
    const size_t chunk = 1 << 20;
    const int slots = 3, rounds = 24;
    AioFile f = AioFile::create(dir.file("war.bin"), 0, true);
    // The file's second half holds what the reads bring in.
    std::vector<std::vector<unsigned char>> src;
    for (int k = 0; k < rounds; ++k) {
      src.push_back(random_bytes(chunk, uint64_t(100 + k)));
      REQUIRE(::pwrite(f.fd(), src.back().data(), chunk, off_t(rounds + k) * off_t(chunk)) ==
              ssize_t(chunk));
    }
    IoStream io(b.cfg);
    io.attach(f);
    std::vector<StagingBuffer> slot;
    for (int s = 0; s < slots; ++s) slot.push_back(aligned_staging(chunk));
    for (int s = 0; s < slots; ++s) std::memset(slot[s].data(), 0, chunk);
    // Round k: write slot k%3 to chunk k (what it holds: round k-3's read, or zeros), then read
    // chunk rounds+k into the same slot. The optimizer's staging ring does the same.
    std::vector<IoEventPtr> writes, reads;
    io.hold(true);
    for (int k = 0; k < rounds; ++k) {
      StagingBuffer& s = slot[size_t(k % slots)];
      writes.push_back(io.write(f.fd(), f.path(), s.data(), chunk, off_t(k) * off_t(chunk)));
      reads.push_back(io.read(f.fd(), f.path(), s.data(), chunk, off_t(rounds + k) * off_t(chunk)));
      if (k == slots) io.hold(false);  // the rest are enqueued while the first ones run
    }
    for (int k = 0; k < rounds; ++k) {
      reads[k]->synchronize();
      writes[k]->synchronize();
      CHECK(reads[k]->started_at() >= writes[k]->done_at());
      if (k >= slots) CHECK(writes[k]->started_at() >= reads[k - slots]->done_at());
    }
    for (int k = 0; k < rounds; ++k) {
      std::vector<unsigned char> back(chunk);
      REQUIRE(::pread(f.fd(), back.data(), chunk, off_t(k) * off_t(chunk)) == ssize_t(chunk));
      INFO("chunk " << k);
      if (k < slots) CHECK(back == std::vector<unsigned char>(chunk, 0));
      else CHECK(back == src[size_t(k - slots)]);
    }
    for (int s = 0; s < slots; ++s)
      CHECK(std::memcmp(slot[s].data(), src[size_t(rounds - slots + s)].data(), chunk) == 0);
  }
}

TEST_CASE("io_stream: an operation with an `after` event starts only once it is done", "[io]") {
  // What the executor does with a device's activations: a write whose buffer a device-to-host
  // copy fills. The caller does not wait; the write waits for the event (here a flag set after
  // the buffer is filled), an unrelated write goes on meanwhile, a later read of the same range
  // sees the gated write, and an event whose query fails lets its operation go.
  struct Flag final : Event {
    std::atomic<bool> done{false};
    bool fail = false;
    bool query() override {
      if (fail) throw Error("copy failed");
      return done.load();
    }
    void synchronize() override {
      while (!query()) std::this_thread::yield();
    }
  };
  TempDir dir("io_after");
  for (const Backend& b : backends()) {
    INFO(b.name);
    const size_t n = 64 << 10;
    AioFile f = AioFile::create(dir.file("after.bin"), 0, true);
    IoStream io(b.cfg);
    io.attach(f);
    StagingBuffer buf = aligned_staging(n), other = aligned_staging(n), back = aligned_staging(n);
    std::memset(buf.data(), 0, n);
    const std::vector<unsigned char> want = random_bytes(n, 7), free_bytes = random_bytes(n, 8);
    std::memcpy(other.data(), free_bytes.data(), n);
    auto flag = std::make_shared<Flag>();
    IoEventPtr gated = io.write(f.fd(), f.path(), buf.data(), n, 0, flag);
    IoEventPtr free_write = io.write(f.fd(), f.path(), other.data(), n, off_t(n));
    IoEventPtr read_back = io.read(f.fd(), f.path(), back.data(), n, 0);
    free_write->synchronize();  // not behind the gated one
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK_FALSE(gated->query());
    CHECK_FALSE(read_back->query());  // a hazard of the gated write
    std::memcpy(buf.data(), want.data(), n);  // the "copy" lands, then its event completes
    flag->done = true;
    read_back->synchronize();
    CHECK(gated->query());
    CHECK(std::memcmp(back.data(), want.data(), n) == 0);
    auto failing = std::make_shared<Flag>();
    failing->fail = true;
    io.write(f.fd(), f.path(), other.data(), n, off_t(2 * n), failing)->synchronize();
    // Gated behind an event that never completes on its own: the stream still drains once set.
    auto late = std::make_shared<Flag>();
    IoEventPtr last = io.write(f.fd(), f.path(), other.data(), n, off_t(3 * n), late);
    std::thread setter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      late->done = true;
    });
    io.drain();
    setter.join();
    CHECK(last->query());
  }
}

TEST_CASE("io_stream: failures complete every event with one line, and dependents still run",
          "[io]") {
  TempDir dir("io_err");
  for (const Backend& b : backends()) {
    INFO(b.name);
    const size_t chunk = 8192;
    const std::string path = dir.file("e.bin");
    AioFile f = AioFile::create(path, 0, true);
    std::vector<unsigned char> x(chunk, 7);
    SECTION("SHARDWISE_IO_FAIL_AFTER=N:28 injects ENOSPC after N operations") {
      ScopedEnv env("SHARDWISE_IO_FAIL_AFTER", "3:28");
      IoStream io(b.cfg);
      io.attach(f);
      std::vector<IoEventPtr> ev;
      for (int k = 0; k < 8; ++k)  // chunks 0, 1, 0, 1, ...: each depends on the one before
        ev.push_back(io.write(f.fd(), f.path(), x.data(), chunk, int64_t(k % 2) * int64_t(chunk)));
      for (int k = 0; k < 8; ++k) {
        INFO("op " << k);
        const std::string e = error_of(ev[k]);
        if (k < 3) {
          CHECK(e.empty());
        } else {
          CHECK(e == "io: " + path + ": write of 8192 bytes at offset " +
                         std::to_string((k % 2) * chunk) + ": No space left on device");
        }
      }
    }
    SECTION("SHARDWISE_IO_FAIL_AFTER=N is EIO") {
      ScopedEnv env("SHARDWISE_IO_FAIL_AFTER", "0");
      IoStream io(b.cfg);
      CHECK_THAT(error_of(io.write(f.fd(), f.path(), x.data(), chunk, 4096)),
                 Contains("write of 8192 bytes at offset 4096: Input/output error"));
    }
    SECTION("a read past the end of the file; a bad descriptor; the operations after them run") {
      IoStream io(b.cfg);
      io.attach(f);
      std::vector<unsigned char> r(chunk);
      IoEventPtr w = io.write(f.fd(), f.path(), x.data(), chunk, 0);
      IoEventPtr eof = io.read(f.fd(), f.path(), r.data(), chunk, int64_t(chunk) * 4);
      const int ro = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      REQUIRE(ro >= 0);
      IoEventPtr bad = io.write(ro, path, x.data(), chunk, 0);  // EBADF
      IoEventPtr after = io.read(ro, path, r.data(), chunk, 0);  // waits for both (same range)
      CHECK_THAT(error_of(eof), Contains("io: " + path + ": read of 8192 bytes at offset 32768: "
                                         "unexpected end of file"));
      CHECK_THAT(error_of(bad), Contains("io: " + path + ": write of 8192 bytes at offset 0: "
                                         "Bad file descriptor"));
      CHECK(error_of(after).empty());
      CHECK(error_of(w).empty());
      CHECK(r == x);
      CHECK(after->started_at() >= bad->done_at());
      ::close(ro);
    }
  }
}

TEST_CASE("io_stream: the destructor finishes what is queued", "[io]") {
  TempDir dir("io_dtor");
  for (const Backend& b : backends()) {
    INFO(b.name);
    const size_t chunk = 128 * 1024;
    const int n = 32;
    AioFile f = AioFile::create(dir.file("d.bin"), 0, true);
    std::vector<StagingBuffer> bufs;
    for (int k = 0; k < n; ++k) {
      bufs.push_back(aligned_staging(chunk));
      std::memset(bufs.back().data(), 3 * k + 1, chunk);
    }
    std::vector<IoEventPtr> ev;
    {
      IoStream io(b.cfg);
      io.attach(f);
      io.hold(true);  // still held at the end: the destructor releases them
      for (int k = 0; k < n; ++k)
        ev.push_back(io.write(f.fd(), f.path(), bufs[k].data(), chunk, int64_t(k) * int64_t(chunk)));
    }
    for (int k = 0; k < n; ++k) {
      CHECK(ev[k]->query());
      std::vector<unsigned char> back(chunk);
      REQUIRE(::pread(f.fd(), back.data(), chunk, off_t(k) * off_t(chunk)) == ssize_t(chunk));
      CHECK(back == std::vector<unsigned char>(chunk, static_cast<unsigned char>(3 * k + 1)));
    }
  }
}
