// The async I/O engine (see aio.h). Both backends share one queue of pieces (`pending`) and
// the completion logic (`finish`); they differ in who runs a piece: a pread/pwrite thread, or
// the kernel through an io_uring whose completions one reaper thread collects.
#include "offload/aio.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "core/bytes.h"
#include "core/env.h"
#include "core/error.h"

namespace sw {

namespace {

std::string errstr(int e) {
  char buf[128];
  const char* s = strerror_r(e, buf, sizeof buf);  // GNU variant
  return std::string(s) + " (errno " + std::to_string(e) + ")";
}

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kAioAlign == 0; }
bool aligned(uint64_t v) { return v % kAioAlign == 0; }

}  // namespace

const char* aio_backend_name(AioBackend b) {
  switch (b) {
    case AioBackend::Auto:
      return "auto";
    case AioBackend::IoUring:
      return "io_uring";
    case AioBackend::Threads:
      return "threads";
  }
  return "?";
}

// ---- Config ---------------------------------------------------------------------------------

AioConfig AioConfig::from_json(const nlohmann::json& j, const std::string& where) {
  static const char* const keys[] = {"block_size",    "queue_depth",    "intra_op_parallelism",
                                     "thread_count",  "single_submit",  "overlap_events",
                                     "backend",       "o_direct"};
  if (!j.is_object()) fail("aio", where + ": expected an object, got " + j.dump());
  AioConfig c;
  auto bad = [&](const std::string& key, const std::string& what, const nlohmann::json& v) {
    fail("aio", where + "." + key + ": expected " + what + ", got " + v.dump());
  };
  auto integer = [&](const std::string& key, const nlohmann::json& v, int64_t lo, int64_t hi) {
    const std::string what = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    if (!v.is_number_integer()) bad(key, what, v);
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(hi)))
      bad(key, what, v);
    return x;
  };
  auto boolean = [&](const std::string& key, const nlohmann::json& v) {
    if (!v.is_boolean()) bad(key, "true or false", v);
    return v.get<bool>();
  };
  std::string threads_key;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    const nlohmann::json& v = it.value();
    if (k == "block_size") {
      const std::string what = "a positive multiple of 4096 bytes (an integer or \"1MiB\")";
      size_t b = 0;
      if (v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() > 0)) {
        b = v.get<uint64_t>();
      } else if (v.is_string()) {
        try {
          b = parse_bytes(v.get<std::string>());
        } catch (const Error&) {
          bad(k, what, v);
        }
      } else {
        bad(k, what, v);
      }
      if (b == 0 || b % kAioAlign != 0 || b > (size_t{1} << 30)) bad(k, what + " up to 1GiB", v);
      c.block_size = b;
    } else if (k == "queue_depth") {
      c.queue_depth = int(integer(k, v, 1, 4096));
    } else if (k == "intra_op_parallelism" || k == "thread_count") {
      const int n = int(integer(k, v, 1, 256));
      if (!threads_key.empty() && n != c.intra_op_parallelism)
        fail("aio", where + "." + k + ": " + std::to_string(n) + " contradicts " + where + "." +
                        threads_key + " = " + std::to_string(c.intra_op_parallelism) +
                        " (thread_count is an alias of intra_op_parallelism)");
      c.intra_op_parallelism = n;
      threads_key = k;
    } else if (k == "single_submit") {
      c.single_submit = boolean(k, v);
    } else if (k == "overlap_events") {
      c.overlap_events = boolean(k, v);
    } else if (k == "o_direct") {
      c.o_direct = boolean(k, v);
    } else if (k == "backend") {
      const std::string s = v.is_string() ? v.get<std::string>() : "";
      if (s == "auto") c.backend = AioBackend::Auto;
      else if (s == "io_uring") c.backend = AioBackend::IoUring;
      else if (s == "threads") c.backend = AioBackend::Threads;
      else bad(k, "\"auto\", \"io_uring\" or \"threads\"", v);
    } else {
      std::string msg = where + ": unknown key '" + k + "' (valid keys: ";
      for (size_t i = 0; i < std::size(keys); ++i) msg += std::string(i ? ", " : "") + keys[i];
      fail("aio", msg + ")");
    }
  }
  return c;
}

// ---- Requests -------------------------------------------------------------------------------

namespace detail {
struct AioOp {
  std::string label;
  bool write = false;
  size_t bytes = 0;
  std::atomic<int64_t> remaining{0};  // pieces not completed
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::string error;  // the first failure, one line
  int err = 0;        // its errno (0 with eof)
  bool eof = false;
  uint64_t err_offset = 0;
  AioDone done;  // called once, when the last piece completes

  void fail(std::string msg, int e, uint64_t at, bool at_eof = false) {
    std::lock_guard<std::mutex> lk(mu);
    if (error.empty()) error = std::move(msg), err = e, err_offset = at, eof = at_eof;
    failed.store(true, std::memory_order_release);
  }
  void piece_done() {
    if (remaining.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    remaining.notify_all();
    if (done) finished();
  }
  void finished() {
    AioStatus s;
    {
      std::lock_guard<std::mutex> lk(mu);
      s.err = err, s.eof = eof, s.offset = err_offset, s.message = error;
    }
    AioDone d = std::move(done);
    d(s);
  }
};
}  // namespace detail

using detail::AioOp;

bool AioRequest::query() {
  return !op_ || op_->remaining.load(std::memory_order_acquire) == 0;
}

void AioRequest::synchronize() {
  if (!op_) return;
  for (int64_t r; (r = op_->remaining.load(std::memory_order_acquire)) != 0;)
    op_->remaining.wait(r, std::memory_order_acquire);
  if (op_->failed.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lk(op_->mu);
    throw Error(op_->error);
  }
}

size_t AioRequest::bytes() const { return op_ ? op_->bytes : 0; }

// ---- The handle -----------------------------------------------------------------------------

namespace {
struct Piece {
  AioOp* op;  // kept alive by the Impl's `live` list until the piece completes
  std::shared_ptr<AioOp> keep;
  int fd;
  int buffered_fd;  // where the rest of a short O_DIRECT transfer goes (unaligned now)
  char* buf;
  size_t len;
  off_t off;
};
}  // namespace

struct AioHandle::Impl {
  AioConfig cfg;
  bool uring = false;
  std::string fallback;
  io_uring ring{};

  std::mutex mu;
  std::condition_variable cv;       // work for threads / inflight for the reaper / stop
  std::condition_variable idle_cv;  // outstanding == 0
  std::deque<Piece> pending;
  size_t outstanding = 0;  // pieces queued or running
  int inflight = 0;        // io_uring: pieces in the ring
  bool stop = false;
  std::atomic<uint64_t> dispatched{0};  // bytes handed to the backend (fault injection)
  std::vector<std::thread> threads;

  ~Impl() {
    {
      std::unique_lock<std::mutex> lk(mu);
      idle_cv.wait(lk, [&] { return outstanding == 0; });
      stop = true;
    }
    cv.notify_all();
    for (auto& t : threads) t.join();
    if (uring) io_uring_queue_exit(&ring);
  }

  // Fault injection: true (and p failed) when p crosses fail_after_bytes.
  bool injected(const Piece& p) {
    if (cfg.fail_after_bytes == UINT64_MAX) return false;
    const uint64_t before = dispatched.fetch_add(p.len, std::memory_order_relaxed);
    if (before + p.len <= cfg.fail_after_bytes) return false;
    const uint64_t at = p.off + (cfg.fail_after_bytes > before ? cfg.fail_after_bytes - before : 0);
    fail_piece(p, cfg.fail_errno, at, "(injected) ");
    return true;
  }

  void fail_piece(const Piece& p, int err, uint64_t at, const char* note = "") {
    p.op->fail("aio: " + p.op->label + ": " + note + (p.op->write ? "write" : "read") + " of " +
                   std::to_string(p.len) + " bytes at offset " + std::to_string(at) +
                   " failed: " + errstr(err),
               err, at);
  }

  // A piece's result: bytes done (>= 0) or -errno. Returns true when the piece is complete
  // (done or failed); false after advancing it past a short transfer (run the rest).
  bool finish(Piece& p, ssize_t res) {
    if (res < 0) {
      fail_piece(p, int(-res), uint64_t(p.off));
      return true;
    }
    if (res == 0) {
      if (p.op->write) {
        fail_piece(p, EIO, uint64_t(p.off), "(no progress) ");
      } else {
        p.op->fail("aio: " + p.op->label + ": read at offset " + std::to_string(p.off) +
                       " hit the end of the file (" + std::to_string(p.len) + " bytes short)",
                   0, uint64_t(p.off), true);
      }
      return true;
    }
    p.buf += res;
    p.off += res;
    p.len -= size_t(res);
    if (p.len > 0) p.fd = p.buffered_fd;
    return p.len == 0;
  }

  // Completes a piece (call with mu held).
  void complete_locked(Piece& p) {
    p.op->piece_done();
    p.keep.reset();
    if (--outstanding == 0) idle_cv.notify_all();
  }

  // ---- threads backend
  void worker() {
    std::unique_lock<std::mutex> lk(mu);
    for (;;) {
      cv.wait(lk, [&] { return stop || !pending.empty(); });
      if (pending.empty()) return;  // stop
      Piece p = std::move(pending.front());
      pending.pop_front();
      lk.unlock();
      if (!p.op->failed.load(std::memory_order_acquire) && !injected(p)) {
        for (;;) {
          ssize_t r = p.op->write ? ::pwrite(p.fd, p.buf, p.len, p.off)
                                  : ::pread(p.fd, p.buf, p.len, p.off);
          if (r < 0 && errno == EINTR) continue;
          if (finish(p, r < 0 ? -errno : r)) break;
        }
      }
      lk.lock();
      complete_locked(p);
    }
  }

  // ---- io_uring backend: fills the ring from `pending` (mu held).
  void submit_locked() {
    if (!cfg.overlap_events && inflight > 0) return;  // refill only once drained
    int queued = 0;
    while (!pending.empty() && inflight < cfg.queue_depth) {
      Piece& front = pending.front();
      if (front.op->failed.load(std::memory_order_acquire) || injected(front)) {
        Piece p = std::move(front);
        pending.pop_front();
        complete_locked(p);
        continue;
      }
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      if (!sqe) break;
      Piece* p = new Piece(std::move(front));
      pending.pop_front();
      if (p->op->write)
        io_uring_prep_write(sqe, p->fd, p->buf, unsigned(p->len), uint64_t(p->off));
      else
        io_uring_prep_read(sqe, p->fd, p->buf, unsigned(p->len), uint64_t(p->off));
      io_uring_sqe_set_data(sqe, p);
      ++inflight;
      if (cfg.single_submit) io_uring_submit(&ring);
      else ++queued;
    }
    // A failed submit (EAGAIN, EBUSY, EINTR) leaves the entries in the ring: the next submit
    // sends them, and the reaper calls submit after every completion.
    if (queued) io_uring_submit(&ring);
    if (inflight > 0) cv.notify_all();
  }

  void reaper() {
    std::vector<std::pair<Piece*, int>> done;
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return stop || inflight > 0; });
        if (inflight == 0) return;  // stop
      }
      io_uring_cqe* cqe = nullptr;
      const int r = io_uring_wait_cqe(&ring, &cqe);
      if (r < 0) {
        if (r == -EINTR || r == -EAGAIN) continue;
        check_failed("io_uring_wait_cqe", __FILE__, __LINE__, errstr(-r));
      }
      done.clear();
      unsigned head, n = 0;
      io_uring_for_each_cqe(&ring, head, cqe) {
        done.emplace_back(static_cast<Piece*>(io_uring_cqe_get_data(cqe)), cqe->res);
        ++n;
      }
      io_uring_cq_advance(&ring, n);
      std::lock_guard<std::mutex> lk(mu);
      for (auto [p, res] : done) {
        --inflight;
        if (finish(*p, res)) {
          complete_locked(*p);
        } else {
          pending.push_front(std::move(*p));  // the rest of a short transfer, first
        }
        delete p;
      }
      submit_locked();
    }
  }

  AioRequest enqueue(int fd, int direct_fd, char* buf, size_t bytes, off_t offset, bool write,
                     std::string label, AioDone done) {
    if (offset < 0) fail("aio", label + ": negative offset " + std::to_string(offset));
    if (bytes > 0 && !buf) fail("aio", label + ": null buffer");
    auto op = std::make_shared<AioOp>();
    op->label = std::move(label);
    op->write = write;
    op->bytes = bytes;
    op->done = std::move(done);
    std::vector<Piece> ps;
    ps.reserve(bytes / cfg.block_size + 2);
    auto add = [&](int f, char* b, size_t n, off_t o) { ps.push_back({op.get(), op, f, fd, b, n, o}); };
    for (size_t pos = 0; pos < bytes;) {
      const size_t len = std::min(cfg.block_size, bytes - pos);
      char* b = buf + pos;
      const off_t o = offset + off_t(pos);
      pos += len;
      if (direct_fd >= 0 && aligned(b) && aligned(uint64_t(o))) {
        const size_t head = len / kAioAlign * kAioAlign;
        if (head > 0) add(direct_fd, b, head, o);
        if (head < len) add(fd, b + head, len - head, o + off_t(head));
      } else {
        add(fd, b, len, o);
      }
    }
    op->remaining.store(int64_t(ps.size()), std::memory_order_release);
    if (ps.empty()) {  // nothing to transfer: complete now
      if (op->done) op->finished();
      return AioRequest(std::move(op));
    }
    {
      std::lock_guard<std::mutex> lk(mu);
      outstanding += ps.size();
      for (auto& p : ps) pending.push_back(std::move(p));
      if (uring) submit_locked();
    }
    if (!uring) cv.notify_all();
    return AioRequest(std::move(op));
  }
};

AioHandle::AioHandle(AioConfig cfg) : impl_(std::make_unique<Impl>()) {
  SW_CHECK(cfg.block_size > 0 && cfg.queue_depth > 0 && cfg.intra_op_parallelism > 0,
           "AioConfig: block_size, queue_depth and intra_op_parallelism must be positive");
  if (const auto f = env_text("SHARDWISE_AIO_FAIL_AFTER")) {
    char* end = nullptr;
    cfg.fail_after_bytes = std::strtoull(f->c_str(), &end, 10);
    if (end && *end == ':') cfg.fail_errno = std::atoi(end + 1);
  }
  Impl& m = *impl_;
  m.cfg = cfg;
  if (cfg.backend != AioBackend::Threads) {
    int r = -ENOSYS;
    if (!env_flag("SHARDWISE_AIO_DISABLE_URING"))
      r = io_uring_queue_init(unsigned(cfg.queue_depth), &m.ring, 0);
    if (r == 0) {
      m.uring = true;
    } else {
      m.fallback = "io_uring_queue_init: " + errstr(-r);
      if (cfg.backend == AioBackend::IoUring)
        fail("aio", "backend 'io_uring' is forced (aio.backend) but unavailable: " + m.fallback);
    }
  } else {
    m.fallback = "threads forced (aio.backend)";
  }
  if (m.uring) {
    m.threads.emplace_back([&m] { m.reaper(); });
  } else {
    for (int i = 0; i < cfg.intra_op_parallelism; ++i) m.threads.emplace_back([&m] { m.worker(); });
  }
}

AioHandle::~AioHandle() = default;

static std::string fd_label(int fd, const std::string& label) {
  return label.empty() ? "fd " + std::to_string(fd) : label;
}

AioRequest AioHandle::read(int fd, void* buf, size_t bytes, off_t offset, const std::string& label,
                           AioDone done) {
  return impl_->enqueue(fd, -1, static_cast<char*>(buf), bytes, offset, false, fd_label(fd, label),
                        std::move(done));
}
AioRequest AioHandle::write(int fd, const void* buf, size_t bytes, off_t offset,
                            const std::string& label, AioDone done) {
  return impl_->enqueue(fd, -1, static_cast<char*>(const_cast<void*>(buf)), bytes, offset, true,
                        fd_label(fd, label), std::move(done));
}
AioRequest AioHandle::read(const AioFile& f, void* buf, size_t bytes, off_t offset, AioDone done) {
  if (!f.is_open()) fail("aio", "read from a closed AioFile");
  return impl_->enqueue(f.fd(), f.direct_fd(), static_cast<char*>(buf), bytes, offset, false,
                        f.path(), std::move(done));
}
AioRequest AioHandle::write(const AioFile& f, const void* buf, size_t bytes, off_t offset,
                            AioDone done) {
  if (!f.is_open()) fail("aio", "write to a closed AioFile");
  return impl_->enqueue(f.fd(), f.direct_fd(), static_cast<char*>(const_cast<void*>(buf)), bytes,
                        offset, true, f.path(), std::move(done));
}

void AioHandle::wait_all() {
  std::unique_lock<std::mutex> lk(impl_->mu);
  impl_->idle_cv.wait(lk, [&] { return impl_->outstanding == 0; });
}

const char* AioHandle::backend_name() const { return impl_->uring ? "io_uring" : "threads"; }
const std::string& AioHandle::fallback_reason() const { return impl_->fallback; }
const AioConfig& AioHandle::config() const { return impl_->cfg; }

// ---- Files and staging buffers --------------------------------------------------------------

AioFile& AioFile::operator=(AioFile&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = std::exchange(o.fd_, -1);
    direct_fd_ = std::exchange(o.direct_fd_, -1);
    temp_ = std::exchange(o.temp_, false);
    path_ = std::move(o.path_);
    mode_ = std::move(o.mode_);
  }
  return *this;
}

void AioFile::close() {
  if (direct_fd_ >= 0) ::close(direct_fd_);
  if (fd_ >= 0) ::close(fd_);
  if (fd_ >= 0 && temp_) ::unlink(path_.c_str());
  fd_ = direct_fd_ = -1;
  temp_ = false;
}

static void open_direct(AioFile& f, int& direct_fd, std::string& mode, int flags, bool want) {
  if (!want) {
    mode = "buffered (O_DIRECT not asked for)";
    return;
  }
  direct_fd = ::open(f.path().c_str(), flags | O_DIRECT | O_CLOEXEC);
  mode = direct_fd >= 0 ? "O_DIRECT" : "buffered (O_DIRECT refused: " + errstr(errno) + ")";
}

AioFile AioFile::open(const std::string& path, bool writable, bool o_direct) {
  AioFile f;
  f.path_ = path;
  const int flags = writable ? O_RDWR : O_RDONLY;
  f.fd_ = ::open(path.c_str(), flags | O_CLOEXEC);
  if (f.fd_ < 0) fail("aio", path + ": cannot open: " + errstr(errno));
  open_direct(f, f.direct_fd_, f.mode_, flags, o_direct);
  return f;
}

AioFile AioFile::create(const std::string& path, uint64_t size, bool o_direct, bool temp) {
  AioFile f;
  f.path_ = path;
  f.fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f.fd_ < 0) fail("aio", path + ": cannot create: " + errstr(errno));
  f.temp_ = temp;
  if (size > 0) {
    int r = ::fallocate(f.fd_, 0, 0, off_t(size));
    if (r != 0 && (errno == EOPNOTSUPP || errno == ENOSYS)) r = ::ftruncate(f.fd_, off_t(size));
    if (r != 0) {
      const int e = errno;
      ::close(f.fd_);
      f.fd_ = -1;
      ::unlink(path.c_str());
      fail("aio", path + ": cannot reserve " + std::to_string(size) + " bytes (" +
                      format_bytes(size) + "): " + errstr(e));
    }
  }
  open_direct(f, f.direct_fd_, f.mode_, O_RDWR, o_direct);
  return f;
}

StagingBuffer aligned_staging(size_t bytes, Mem cat, Tier tier, bool round_up, bool fresh) {
  StagingBuffer s;
  s.bytes_ = bytes;
  s.cap_ = round_up ? (bytes + kAioAlign - 1) / kAioAlign * kAioAlign : bytes;
  if (s.cap_ == 0) return s;
  s.buf_ = fresh ? Buffer::fresh(s.cap_, cat, Device::cpu(), tier) : Buffer(s.cap_, cat, Device::cpu(), tier);
  if (!aligned(s.buf_.data())) {  // small blocks come 64-byte aligned: take a page more
    s.buf_ = Buffer(s.cap_ + kAioAlign, cat, Device::cpu(), tier);
    s.off_ = kAioAlign - reinterpret_cast<uintptr_t>(s.buf_.data()) % kAioAlign;
  }
  return s;
}

}  // namespace sw
