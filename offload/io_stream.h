// The offload store's io queue (the plan's fetch / evict actions, sharding/step_plan.h): reads and
// writes of files, each returning its completion as an Event (core/stream.h), run by the
// asynchronous I/O engine (offload/aio.h: io_uring, or a pread/pwrite thread pool).
//
// Hazard tracking instead of order: an operation is handed to the engine only once every
// earlier-enqueued operation that conflicts with it has completed; operations that do not
// conflict run at once, up to the engine's queue depth. Two operations conflict when
//   - they touch the same file (same device and inode, whichever descriptor) at overlapping
//     byte ranges and at least one of them writes the file, or
//   - their memory buffers overlap and at least one of them writes memory (a read from the
//     file writes its buffer).
// So a read enqueued after a write of the same memory or file range sees the write done, and a
// buffer handed to a write can be refilled by a read enqueued after it, without waiting.
// A failed operation fails its event; the operations that depended on it still run (or fail),
// and every event completes.
//
// SHARDWISE_IO_FAIL_AFTER=N[:errno] (tests) fails every operation after the first N enqueued
// with errno (default EIO, 5; 28 is ENOSPC); SHARDWISE_IO_UNCACHED=1 (benchmarks) writes back
// and drops the written pages from the page cache (what O_DIRECT pieces never enter).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/stream.h"
#include "offload/aio.h"

namespace sw {

class IoEvent final : public Event {
 public:
  bool query() override;
  // Waits; throws sw::Error("io: <file>: <read|write> of N bytes at offset O: <errno text>").
  void synchronize() override;
  double started_at() const { return t_start_; }  // trace_now() seconds, once complete
  double done_at() const { return t_done_; }

 private:
  friend class IoStream;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::string error_;
  double t_start_ = 0, t_done_ = 0;
};
using IoEventPtr = std::shared_ptr<IoEvent>;

class IoStream {
 public:
  // The engine's settings (the train config's "aio" block; the defaults otherwise). Throws
  // sw::Error when aio.backend forces io_uring and the kernel refuses it.
  explicit IoStream(const AioConfig& cfg = {});
  ~IoStream();  // finishes what is queued
  IoStream(const IoStream&) = delete;
  IoStream& operator=(const IoStream&) = delete;

  // `path` names the file in errors. buf must stay valid until the event completes.
  // `after` (may be null): the operation is handed to the engine only once after->query() is
  // true, as well as its hazards being clear; the dispatcher polls it (every ~50 us while any
  // operation waits so), so the caller never waits for it. E.g. a device-to-host copy that
  // fills a write's buffer: the write follows the copy without the host synchronising.
  IoEventPtr read(int fd, const std::string& path, void* buf, size_t bytes, int64_t offset,
                  std::shared_ptr<Event> after = nullptr);
  IoEventPtr write(int fd, const std::string& path, const void* buf, size_t bytes, int64_t offset,
                   std::shared_ptr<Event> after = nullptr);

  // Operations on f.fd() (its buffered descriptor) go through f from now on: pieces whose
  // buffer, offset and length are 4096-aligned use its O_DIRECT descriptor, the rest the
  // buffered one. f must stay open until detach(f.fd()) or this stream's end.
  void attach(const AioFile& f);
  void detach(int fd);
  // Waits until every operation enqueued so far has completed (never throws).
  void drain();

  const char* backend_name() const { return aio_->backend_name(); }  // "io_uring" | "threads"
  const std::string& fallback_reason() const { return aio_->fallback_reason(); }

  // Tests: while held, operations whose hazards are clear wait instead of being handed to
  // the engine; release hands them over together. stats(): operations enqueued and the most
  // that were with the engine at once.
  void hold(bool on);
  struct Stats {
    int64_t ops = 0, peak_in_flight = 0;
  };
  Stats stats();

 private:
  struct Op {
    int64_t seq = 0;  // enqueue order
    bool write = false;
    int fd = -1;
    const AioFile* file = nullptr;  // attached: O_DIRECT for aligned pieces
    std::string path;
    char* buf = nullptr;
    size_t bytes = 0;
    int64_t offset = 0;
    uint64_t dev = 0, ino = 0;  // the file's identity (fstat; fd itself when that fails)
    bool injected = false;      // SHARDWISE_IO_FAIL_AFTER
    int deps = 0;               // earlier conflicting operations not completed, and `after`
    std::shared_ptr<Event> after;  // while not done: in gated_
    std::vector<Op*> dependents;
    AioStatus status;  // set on completion
    IoEventPtr ev;
    std::list<Op>::iterator self;
  };
  static bool conflicts(const Op& a, const Op& b);
  IoEventPtr enqueue(bool write, int fd, const std::string& path, void* buf, size_t bytes,
                     int64_t offset, std::shared_ptr<Event> after);
  void poll_gated(std::unique_lock<std::mutex>& l);  // releases the ops whose `after` is done
  void start_locked(Op* op);  // counts op as handed to the engine
  void submit(Op* op);        // hands op to the engine (mu_ not held)
  void completed(Op* op, const AioStatus& s);  // from the engine's threads
  void dispatch();                              // the dispatcher thread

  std::unique_ptr<AioHandle> aio_;
  std::mutex mu_;
  std::condition_variable cv_;       // completions, ready operations, stop
  std::condition_variable idle_cv_;  // ops_ empty
  std::list<Op> ops_;                // not completed, in enqueue order
  std::vector<Op*> ready_;           // hazards clear, not handed over yet (hold, or released)
  std::vector<Op*> done_;            // completed by the engine, not yet finished here
  std::vector<Op*> gated_;           // waiting for their `after` event
  std::unordered_map<int, const AioFile*> files_;
  int64_t seq_ = 0, in_flight_ = 0, peak_ = 0;
  bool hold_ = false, stop_ = false;
  // SHARDWISE_IO_FAIL_AFTER=N[:errno]: operations after the first N fail with fail_errno_.
  int64_t fail_after_ = -1;
  int fail_errno_ = 5;
  // SHARDWISE_IO_UNCACHED=1: written pages are written back and dropped, so the next read
  // comes from the disk, as when the offloaded state is larger than the page cache.
  bool uncached_ = false;
  std::thread thread_;
};

}  // namespace sw
