// The io queue on the asynchronous I/O engine (see io_stream.h). Who does what:
//   enqueue (the caller): records the operation's hazards against every earlier one not yet
//     completed; hands it to the engine at once when there are none.
//   the engine's threads: call completed(), which only records the status and wakes
//     the dispatcher (they may hold the engine's lock: no call back into it from there).
//   the dispatcher thread: finishes completed operations (SHARDWISE_IO_UNCACHED's write-back,
//     the event), releases the operations that waited for them, and hands those over.
// Lock order: the engine's lock, then mu_; nothing calls the engine while holding mu_.
#include "offload/io_stream.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "core/clock.h"
#include "core/env.h"
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

IoStream::IoStream(const AioConfig& cfg) : aio_(std::make_unique<AioHandle>(cfg)) {
  if (const auto v = env_text("SHARDWISE_IO_FAIL_AFTER")) {
    char* end = nullptr;
    fail_after_ = std::strtoll(v->c_str(), &end, 10);
    if (end && *end == ':') fail_errno_ = std::atoi(end + 1);
    if (fail_errno_ <= 0) fail_errno_ = EIO;
  }
  uncached_ = env_flag("SHARDWISE_IO_UNCACHED");
  thread_ = std::thread([this] { dispatch(); });
}

IoStream::~IoStream() {
  {
    std::lock_guard<std::mutex> l(mu_);
    hold_ = false;
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();  // returns once every operation has completed
  aio_.reset();    // its threads have returned from every callback
}

IoEventPtr IoStream::read(int fd, const std::string& path, void* buf, size_t bytes,
                          int64_t offset, std::shared_ptr<Event> after) {
  return enqueue(false, fd, path, buf, bytes, offset, std::move(after));
}

IoEventPtr IoStream::write(int fd, const std::string& path, const void* buf, size_t bytes,
                           int64_t offset, std::shared_ptr<Event> after) {
  return enqueue(true, fd, path, const_cast<void*>(buf), bytes, offset, std::move(after));
}

namespace {
// An `after` event that reports done, or fails, lets its operation go (a failed copy's error
// surfaces where that copy is waited for, or in what the write then wrote).
bool event_done(Event& e) {
  try {
    return e.query();
  } catch (...) {
    return true;
  }
}
}  // namespace

void IoStream::attach(const AioFile& f) {
  std::lock_guard<std::mutex> l(mu_);
  files_[f.fd()] = &f;
}

void IoStream::detach(int fd) {
  std::lock_guard<std::mutex> l(mu_);
  files_.erase(fd);
}

void IoStream::drain() {
  std::unique_lock<std::mutex> l(mu_);
  hold_ = false;
  cv_.notify_all();
  idle_cv_.wait(l, [&] { return ops_.empty(); });
}

void IoStream::hold(bool on) {
  {
    std::lock_guard<std::mutex> l(mu_);
    hold_ = on;
  }
  cv_.notify_all();
}

IoStream::Stats IoStream::stats() {
  std::lock_guard<std::mutex> l(mu_);
  return {seq_, peak_};
}

bool IoStream::conflicts(const Op& a, const Op& b) {
  if (a.bytes == 0 || b.bytes == 0) return false;
  // A read from the file writes memory; a write to the file only reads it.
  const bool mem = (!a.write || !b.write) && a.buf < b.buf + b.bytes && b.buf < a.buf + a.bytes;
  const bool file = (a.write || b.write) && a.dev == b.dev && a.ino == b.ino &&
                    a.offset < b.offset + int64_t(b.bytes) && b.offset < a.offset + int64_t(a.bytes);
  return mem || file;
}

IoEventPtr IoStream::enqueue(bool write, int fd, const std::string& path, void* buf, size_t bytes,
                             int64_t offset, std::shared_ptr<Event> after) {
  Op o;
  if (after && !event_done(*after)) o.after = std::move(after);
  o.write = write;
  o.fd = fd;
  o.path = path;
  o.buf = static_cast<char*>(buf);
  o.bytes = bytes;
  o.offset = offset;
  struct stat st {};
  if (::fstat(fd, &st) == 0) {
    o.dev = uint64_t(st.st_dev), o.ino = uint64_t(st.st_ino);
  } else {  // the engine reports the bad descriptor; order by the descriptor meanwhile
    o.dev = UINT64_MAX, o.ino = uint64_t(uint32_t(fd));
  }
  o.ev = std::make_shared<IoEvent>();
  IoEventPtr ev = o.ev;
  Op* op = nullptr;
  bool go = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    o.seq = seq_++;
    o.injected = fail_after_ >= 0 && o.seq >= fail_after_;
    if (auto it = files_.find(fd); it != files_.end()) o.file = it->second;
    ops_.push_back(std::move(o));
    op = &ops_.back();
    op->self = std::prev(ops_.end());
    for (auto it = ops_.begin(); it != op->self; ++it)
      if (conflicts(*it, *op)) {
        it->dependents.push_back(op);
        ++op->deps;
      }
    if (op->after) {
      ++op->deps;
      gated_.push_back(op);
      cv_.notify_all();  // the dispatcher starts polling
    }
    if (op->deps == 0) {
      if (hold_) {
        ready_.push_back(op);
      } else {
        start_locked(op);
        go = true;
      }
    }
  }
  if (go) submit(op);
  return ev;
}

void IoStream::start_locked(Op* op) {
  op->ev->t_start_ = trace_now();  // read by others only once the event is done
  peak_ = std::max(peak_, ++in_flight_);
}

void IoStream::submit(Op* op) {
  if (op->injected) {
    AioStatus s;
    s.err = fail_errno_;
    s.offset = uint64_t(op->offset);
    completed(op, s);
    return;
  }
  AioDone done = [this, op](const AioStatus& s) { completed(op, s); };
  try {
    if (op->file) {
      if (op->write) aio_->write(*op->file, op->buf, op->bytes, off_t(op->offset), std::move(done));
      else aio_->read(*op->file, op->buf, op->bytes, off_t(op->offset), std::move(done));
    } else {
      if (op->write)
        aio_->write(op->fd, op->buf, op->bytes, off_t(op->offset), op->path, std::move(done));
      else
        aio_->read(op->fd, op->buf, op->bytes, off_t(op->offset), op->path, std::move(done));
    }
  } catch (const Error&) {  // refused before it started (a negative offset, a null buffer)
    AioStatus s;
    s.err = EINVAL;
    s.offset = uint64_t(op->offset);
    completed(op, s);
  }
}

void IoStream::completed(Op* op, const AioStatus& s) {
  std::lock_guard<std::mutex> l(mu_);  // notify under the lock: the stream may end right after
  op->status = s;
  done_.push_back(op);
  cv_.notify_all();
}

void IoStream::poll_gated(std::unique_lock<std::mutex>& l) {
  if (gated_.empty()) return;
  std::vector<Op*> g = gated_;  // only the dispatcher removes from gated_ or finishes ops
  l.unlock();
  std::vector<Op*> go;
  for (Op* o : g)
    if (event_done(*o->after)) go.push_back(o);
  l.lock();
  for (Op* o : go) {
    gated_.erase(std::find(gated_.begin(), gated_.end(), o));
    o->after.reset();
    if (--o->deps == 0) ready_.push_back(o);
  }
}

void IoStream::dispatch() {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    auto woken = [&] {
      return !done_.empty() || (!hold_ && !ready_.empty()) || (stop_ && ops_.empty());
    };
    if (gated_.empty())  // (an enqueued gated operation wakes it to start polling)
      cv_.wait(l, [&] { return woken() || !gated_.empty(); });
    else
      cv_.wait_for(l, std::chrono::microseconds(50), woken);
    poll_gated(l);
    if (done_.empty() && ready_.empty() && stop_ && ops_.empty()) return;
    std::vector<Op*> finished;
    finished.swap(done_);
    if (uncached_) {
      l.unlock();
      for (Op* o : finished)
        if (o->write && o->status.ok()) {
          ::sync_file_range(o->fd, o->offset, off_t(o->bytes),
                            SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                                SYNC_FILE_RANGE_WAIT_AFTER);
          ::posix_fadvise(o->fd, o->offset, off_t(o->bytes), POSIX_FADV_DONTNEED);
        }
      l.lock();
    }
    for (Op* o : finished) {
      std::string err;
      if (!o->status.ok()) {
        err = "io: " + o->path + ": " + (o->write ? "write" : "read") + " of " +
              std::to_string(o->bytes) + " bytes at offset " + std::to_string(o->status.offset) +
              ": " + (o->status.eof ? std::string("unexpected end of file")
                                    : std::string(std::strerror(o->status.err)));
      }
      IoEventPtr ev = o->ev;
      {
        std::lock_guard<std::mutex> el(ev->mu_);
        ev->error_ = std::move(err);
        ev->t_done_ = trace_now();
        ev->done_ = true;
      }
      ev->cv_.notify_all();
      for (Op* d : o->dependents)
        if (--d->deps == 0) ready_.push_back(d);
      --in_flight_;
      ops_.erase(o->self);
    }
    if (ops_.empty()) idle_cv_.notify_all();
    if (hold_ || ready_.empty()) continue;
    std::vector<Op*> go;
    go.swap(ready_);
    std::sort(go.begin(), go.end(), [](const Op* a, const Op* b) { return a->seq < b->seq; });
    for (Op* o : go) start_locked(o);
    l.unlock();
    for (Op* o : go) submit(o);
    l.lock();
  }
}

}  // namespace sw
