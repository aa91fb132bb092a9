// The async I/O engine (offload/aio.h): round trips on each backend, O_DIRECT and buffered,
// the Event interface, failures (injected, end of file, ENOSPC, EFBIG) and config errors.
#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "offload/aio.h"
#include "tests/common/temp_dir.h"

using namespace sw;
namespace fs = std::filesystem;

namespace {

using swtest::TempDir;

void fill_random(void* p, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto* b = static_cast<unsigned char*>(p);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(b + i, &v, 8);
  }
  for (; i < n; ++i) b[i] = static_cast<unsigned char>(rng());
}

bool uring_available() {
  AioHandle h;  // auto
  return std::string(h.backend_name()) == "io_uring";
}

std::vector<AioBackend> backends() {
  std::vector<AioBackend> b{AioBackend::Threads};
  if (uring_available()) b.push_back(AioBackend::IoUring);
  else WARN("io_uring unavailable here: only the thread backend is tested");
  return b;
}

// Splits [0, n) into requests of uneven sizes (a few bytes to several blocks).
std::vector<std::pair<size_t, size_t>> uneven_chunks(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t pos = 0; pos < n;) {
    size_t len = 1 + rng() % (300 * 1024);
    if (rng() % 4 == 0) len = (len + kAioAlign - 1) / kAioAlign * kAioAlign;  // some aligned
    len = std::min(len, n - pos);
    out.emplace_back(pos, len);
    pos += len;
  }
  return out;
}

std::string error_of(AioRequest& r) {
  try {
    r.synchronize();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("aio: round trip of random data on each backend, O_DIRECT and buffered", "[aio]") {
  TempDir dir("aio_roundtrip");
  const size_t n = 5 * 1024 * 1024 + 12345;  // not a multiple of the block size
  for (AioBackend be : backends()) {
    for (bool direct : {true, false}) {
      AioConfig cfg;
      cfg.backend = be;
      cfg.block_size = 64 * 1024;
      cfg.queue_depth = 4;
      cfg.intra_op_parallelism = 3;
      AioHandle h(cfg);
      CAPTURE(h.backend_name(), direct);
      REQUIRE(std::string(h.backend_name()) == aio_backend_name(be));
      const std::string path = dir.file(std::string("f_") + aio_backend_name(be) + (direct ? "_d" : "_b"));
      StagingBuffer src = aligned_staging(n), dst = aligned_staging(n);
      REQUIRE(reinterpret_cast<uintptr_t>(src.data()) % kAioAlign == 0);
      REQUIRE(src.capacity() % kAioAlign == 0);
      fill_random(src.data(), n, 42);
      {
        AioFile f = AioFile::create(path, n, direct);
        CAPTURE(f.io_mode());
        CHECK(f.direct() == direct);  // the build tree's disk accepts O_DIRECT
        // One big request (aligned head on O_DIRECT, unaligned tail buffered), then the same
        // bytes again as many uneven requests all in flight at once.
        AioRequest w = h.write(f, src.data(), n, 0);
        w.synchronize();
        CHECK(w.query());
        std::vector<AioRequest> rs;
        for (auto [pos, len] : uneven_chunks(n, 7)) rs.push_back(h.write(f, src.as<char>() + pos, len, off_t(pos)));
        CHECK(rs.size() > 30);
        for (auto& r : rs) r.synchronize();
        rs.clear();
        std::memset(dst.data(), 0, n);
        for (auto [pos, len] : uneven_chunks(n, 8)) rs.push_back(h.read(f, dst.as<char>() + pos, len, off_t(pos)));
        for (auto& r : rs) r.synchronize();
        CHECK(std::memcmp(src.data(), dst.data(), n) == 0);
        std::memset(dst.data(), 0, n);
        AioRequest r = h.read(f, dst.data(), n, 0);
        r.synchronize();
        CHECK(std::memcmp(src.data(), dst.data(), n) == 0);
      }
      // A raw descriptor and an unaligned buffer and offset.
      const int fd = ::open(path.c_str(), O_RDWR);
      REQUIRE(fd >= 0);
      std::vector<char> odd(200001);
      AioRequest r = h.read(fd, odd.data() + 1, odd.size() - 1, 777, path);
      r.synchronize();
      CHECK(std::memcmp(odd.data() + 1, src.as<char>() + 777, odd.size() - 1) == 0);
      ::close(fd);
    }
  }
}

TEST_CASE("aio: the completion is an Event: query false while in flight, then true", "[aio]") {
  TempDir dir("aio_event");
  for (AioBackend be : backends()) {
    AioConfig cfg;
    cfg.backend = be;
    cfg.block_size = 256 * 1024;
    cfg.queue_depth = 2;
    AioHandle h(cfg);
    CAPTURE(h.backend_name());
    const size_t n = 64u << 20;
    StagingBuffer buf = aligned_staging(n);
    fill_random(buf.data(), n, 1);
    AioFile f = AioFile::create(dir.file("ev"), 0, true, /*temp=*/true);
    AioRequest w = h.write(f, buf.data(), n, 0);
    Event& e = w;  // used through the interface the executor sees
    CHECK_FALSE(e.query());  // 256 pieces of 256 KiB cannot all be done yet
    e.synchronize();
    CHECK(e.query());
    e.synchronize();  // again: returns at once
    CHECK(w.bytes() == n);
    AioRequest empty = h.read(f, buf.data(), 0, 0);
    CHECK(empty.query());
    const std::string path = f.path();
    f.close();
    CHECK_FALSE(fs::exists(path));  // a temp file is removed at close
  }
}

TEST_CASE("aio: an injected failure gives one line naming the file, offset and errno", "[aio]") {
  TempDir dir("aio_inject");
  for (AioBackend be : backends()) {
    AioConfig cfg;
    cfg.backend = be;
    cfg.block_size = 1 << 20;
    cfg.fail_after_bytes = (3u << 20) + 5;
    cfg.fail_errno = EIO;
    AioHandle h(cfg);
    CAPTURE(h.backend_name());
    const size_t n = 8u << 20;
    StagingBuffer buf = aligned_staging(n);
    AioFile f = AioFile::create(dir.file("inj"), n, true);
    AioRequest w = h.write(f, buf.data(), n, 0);
    const std::string msg = error_of(w);
    CHECK(w.query());
    CHECK(msg == "aio: " + f.path() + ": (injected) write of 1048576 bytes at offset 3145733 failed: "
                 "Input/output error (errno 5)");
    CHECK(msg.find('\n') == std::string::npos);
    CHECK(error_of(w) == msg);  // synchronize throws again
    h.wait_all();
  }
}

TEST_CASE("aio: reading past the end of the file fails naming the offset", "[aio]") {
  TempDir dir("aio_eof");
  for (AioBackend be : backends()) {
    for (bool direct : {true, false}) {
      AioConfig cfg;
      cfg.backend = be;
      AioHandle h(cfg);
      CAPTURE(h.backend_name(), direct);
      const std::string path = dir.file("short");
      {
        AioFile w = AioFile::create(path, 0, false);
        std::vector<char> data(10000, 'x');
        h.write(w, data.data(), data.size(), 0).synchronize();
      }
      AioFile f = AioFile::open(path, false, direct);
      StagingBuffer buf = aligned_staging(16384);
      AioRequest r = h.read(f, buf.data(), 16384, 0);
      const std::string msg = error_of(r);
      CHECK(msg == "aio: " + path + ": read at offset 10000 hit the end of the file (6384 bytes short)");
      CHECK(std::string(buf.as<char>(), 10000) == std::string(10000, 'x'));
    }
  }
}

namespace {
// Writes 2 MiB through each backend where only 1 MiB fits; returns the error lines.
std::vector<std::string> write_too_much(const std::string& path) {
  std::vector<std::string> out;
  for (AioBackend be : backends()) {
    AioConfig cfg;
    cfg.backend = be;
    cfg.block_size = 256 * 1024;
    AioHandle h(cfg);
    const size_t n = 2u << 20;
    StagingBuffer buf = aligned_staging(n);
    AioFile f = AioFile::create(path, 0, false, /*temp=*/true);
    AioRequest w = h.write(f, buf.data(), n, 0);
    out.push_back(error_of(w));
  }
  return out;
}
}  // namespace

TEST_CASE("aio: ENOSPC on a full filesystem names the file, offset and errno", "[aio]") {
  TempDir dir("aio_enospc");
  const std::string mnt = dir.file("mnt");
  fs::create_directories(mnt);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=1m") != 0) {
    WARN("cannot mount a tmpfs here (" << std::strerror(errno) << "): ENOSPC is not tested; "
                                                                  "EFBIG (RLIMIT_FSIZE) is");
    return;
  }
  struct Unmount {
    std::string m;
    ~Unmount() { ::umount(m.c_str()); }
  } unmount{mnt};
  const std::string path = mnt + "/full";
  for (const std::string& msg : write_too_much(path)) {
    CAPTURE(msg);
    CHECK(msg.rfind("aio: " + path + ": write of ", 0) == 0);
    CHECK(msg.find(" at offset ") != std::string::npos);
    CHECK(msg.find("No space left on device (errno 28)") != std::string::npos);
    CHECK(msg.find('\n') == std::string::npos);
  }
  // Reserving more than fits fails at once, naming the file.
  try {
    AioFile::create(mnt + "/big", 4u << 20);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) == "aio: " + mnt + "/big: cannot reserve 4194304 bytes (4.0 MiB): "
                                   "No space left on device (errno 28)");
  }
  CHECK_FALSE(fs::exists(mnt + "/big"));
}

TEST_CASE("aio: EFBIG past RLIMIT_FSIZE names the file, offset and errno", "[aio]") {
  TempDir dir("aio_efbig");
  const std::string path = dir.file("big");
  rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  rlimit lim = old;
  lim.rlim_cur = 1u << 20;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &lim) == 0);
  std::vector<std::string> msgs;
  try {
    msgs = write_too_much(path);
  } catch (...) {
    ::setrlimit(RLIMIT_FSIZE, &old);
    throw;
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  for (const std::string& msg : msgs) {
    CAPTURE(msg);
    CHECK(msg.rfind("aio: " + path + ": write of ", 0) == 0);
    CHECK(msg.find(" at offset 1048576 ") != std::string::npos);
    CHECK(msg.find("File too large (errno 27)") != std::string::npos);
  }
}

TEST_CASE("aio: config from JSON, and errors naming the key", "[aio]") {
  using nlohmann::json;
  AioConfig c = AioConfig::from_json(json::parse(R"({"block_size": "2MiB", "queue_depth": 16,
      "thread_count": 4, "single_submit": true, "overlap_events": false, "backend": "threads",
      "o_direct": false})"), "aio");
  CHECK(c.block_size == (2u << 20));
  CHECK(c.queue_depth == 16);
  CHECK(c.intra_op_parallelism == 4);
  CHECK(c.single_submit);
  CHECK_FALSE(c.overlap_events);
  CHECK(c.backend == AioBackend::Threads);
  CHECK_FALSE(c.o_direct);
  AioConfig d = AioConfig::from_json(json::object(), "aio");
  CHECK(d.block_size == (1u << 20));
  CHECK(d.queue_depth == 8);
  CHECK(d.backend == AioBackend::Auto);
  CHECK(d.o_direct);

  auto err = [](const char* text) {
    try {
      AioConfig::from_json(json::parse(text), "aio");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(err(R"({"queue_deph": 4})") ==
        "aio: aio: unknown key 'queue_deph' (valid keys: block_size, queue_depth, "
        "intra_op_parallelism, thread_count, single_submit, overlap_events, backend, o_direct)");
  CHECK(err(R"({"queue_depth": 0})") == "aio: aio.queue_depth: expected an integer in [1, 4096], got 0");
  CHECK(err(R"({"block_size": 1000})") ==
        "aio: aio.block_size: expected a positive multiple of 4096 bytes (an integer or \"1MiB\") "
        "up to 1GiB, got 1000");
  CHECK(err(R"({"block_size": "lots"})").rfind("aio: aio.block_size: expected", 0) == 0);
  CHECK(err(R"({"backend": "libaio"})") ==
        "aio: aio.backend: expected \"auto\", \"io_uring\" or \"threads\", got \"libaio\"");
  CHECK(err(R"({"single_submit": 1})") == "aio: aio.single_submit: expected true or false, got 1");
  CHECK(err(R"({"intra_op_parallelism": 2, "thread_count": 3})") ==
        "aio: aio.thread_count: 3 contradicts aio.intra_op_parallelism = 2 (thread_count is an "
        "alias of intra_op_parallelism)");
  CHECK(err("[1]") == "aio: aio: expected an object, got [1]");
}

TEST_CASE("aio: without io_uring, auto falls back to threads and a forced io_uring fails", "[aio]") {
  ::setenv("SHARDWISE_AIO_DISABLE_URING", "1", 1);
  struct Unset {
    ~Unset() { ::unsetenv("SHARDWISE_AIO_DISABLE_URING"); }
  } unset;
  AioHandle h;
  CHECK(std::string(h.backend_name()) == "threads");
  CHECK(h.fallback_reason() == "io_uring_queue_init: Function not implemented (errno 38)");
  AioConfig cfg;
  cfg.backend = AioBackend::IoUring;
  try {
    AioHandle forced(cfg);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) ==
          "aio: backend 'io_uring' is forced (aio.backend) but unavailable: io_uring_queue_init: "
          "Function not implemented (errno 38)");
  }
}

TEST_CASE("aio: the handle's destructor waits for requests in flight", "[aio]") {
  TempDir dir("aio_dtor");
  const size_t n = 16u << 20;
  StagingBuffer buf = aligned_staging(n);
  fill_random(buf.data(), n, 3);
  AioFile f = AioFile::create(dir.file("d"), n, true);
  std::vector<AioRequest> rs;
  {
    AioConfig cfg;
    cfg.block_size = 128 * 1024;
    AioHandle h(cfg);
    for (size_t pos = 0; pos < n; pos += 1u << 20) rs.push_back(h.write(f, buf.as<char>() + pos, 1u << 20, off_t(pos)));
  }
  for (auto& r : rs) CHECK(r.query());
  StagingBuffer back = aligned_staging(n);
  AioHandle h;
  h.read(f, back.data(), n, 0).synchronize();
  CHECK(std::memcmp(buf.data(), back.data(), n) == 0);
}
