#include "sharding/io_stream.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/clock.h"
#include "core/error.h"

namespace sw {

bool IoEvent::query() {
  std::lock_guard<std::mutex> l(mu_);
  return done_;
}

void IoEvent::synchronize() {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return done_; });
  if (!error_.empty()) throw Error(error_);
}

IoStream::IoStream() {
  if (const char* v = std::getenv("SHARDWISE_IO_FAIL_AFTER")) fail_after_ = std::atoll(v);
  if (const char* v = std::getenv("SHARDWISE_IO_UNCACHED")) uncached_ = std::atoi(v) != 0;
  thread_ = std::thread([this] { loop(); });
}

IoStream::~IoStream() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

IoEventPtr IoStream::read(int fd, const std::string& path, void* buf, size_t bytes,
                          int64_t offset) {
  return enqueue({false, fd, path, buf, bytes, offset, nullptr});
}

IoEventPtr IoStream::write(int fd, const std::string& path, const void* buf, size_t bytes,
                           int64_t offset) {
  return enqueue({true, fd, path, const_cast<void*>(buf), bytes, offset, nullptr});
}

IoEventPtr IoStream::enqueue(Op op) {
  op.ev = std::make_shared<IoEvent>();
  IoEventPtr ev = op.ev;
  {
    std::lock_guard<std::mutex> l(mu_);
    q_.push_back(std::move(op));
  }
  cv_.notify_one();
  return ev;
}

void IoStream::loop() {
  for (;;) {
    Op op;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || !q_.empty(); });
      if (q_.empty()) return;  // stopping, nothing left
      op = std::move(q_.front());
      q_.pop_front();
    }
    const double t0 = trace_now();
    std::string err;
    auto* p = static_cast<char*>(op.buf);
    size_t done = 0;
    const bool inject = fail_after_ >= 0 && ops_++ >= fail_after_;
    while (done < op.bytes) {
      if (inject) errno = EIO;
      const ssize_t n = inject ? -1 :
          op.write ? ::pwrite(op.fd, p + done, op.bytes - done, op.offset + int64_t(done))
                   : ::pread(op.fd, p + done, op.bytes - done, op.offset + int64_t(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        err = "io: " + op.path + ": " + (op.write ? "write" : "read") + " of " +
              std::to_string(op.bytes) + " bytes at offset " +
              std::to_string(op.offset + int64_t(done)) + ": " +
              (n == 0 ? std::string("unexpected end of file") : std::strerror(errno));
        break;
      }
      done += static_cast<size_t>(n);
    }
    if (uncached_ && op.write && err.empty()) {
      ::sync_file_range(op.fd, op.offset, static_cast<off_t>(op.bytes),
                        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                            SYNC_FILE_RANGE_WAIT_AFTER);
      ::posix_fadvise(op.fd, op.offset, static_cast<off_t>(op.bytes), POSIX_FADV_DONTNEED);
    }
    {
      std::lock_guard<std::mutex> l(op.ev->mu_);
      op.ev->error_ = std::move(err);
      op.ev->t_start_ = t0;
      op.ev->t_done_ = trace_now();
      op.ev->done_ = true;
    }
    op.ev->cv_.notify_all();
  }
}

}  // namespace sw
