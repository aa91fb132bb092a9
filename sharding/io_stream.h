// The step plan's io queue on the CPU backend (sharding/step_plan.h, Fetch / Evict): one thread
// that runs reads and writes of a file in the order they were enqueued, each returning its
// completion as an Event (core/stream.h). Because the queue is in order, a read enqueued after a
// write of the same memory sees it done. Offload's staging and NVMe files use it; the
// asynchronous I/O engine (io_uring, issue 10) replaces the loop body, not the interface.
// SHARDWISE_IO_FAIL_AFTER=N (tests) fails every operation after the first N with EIO;
// SHARDWISE_IO_UNCACHED=1 (benchmarks) drops written pages from the page cache.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "core/stream.h"

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
  IoStream();
  ~IoStream();  // finishes what is queued
  IoStream(const IoStream&) = delete;
  IoStream& operator=(const IoStream&) = delete;
  // `path` names the file in errors. buf must stay valid until the event completes.
  IoEventPtr read(int fd, const std::string& path, void* buf, size_t bytes, int64_t offset);
  IoEventPtr write(int fd, const std::string& path, const void* buf, size_t bytes, int64_t offset);

 private:
  struct Op {
    bool write;
    int fd;
    std::string path;
    void* buf;
    size_t bytes;
    int64_t offset;
    IoEventPtr ev;
  };
  IoEventPtr enqueue(Op op);
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> q_;
  bool stop_ = false;
  // Tests: SHARDWISE_IO_FAIL_AFTER=N makes every operation after the first N fail with EIO.
  int64_t fail_after_ = -1, ops_ = 0;
  // Benchmarks: SHARDWISE_IO_UNCACHED=1 writes back and drops the pages of every write, so the
  // next read comes from the disk, as when the offloaded state is larger than the page cache.
  bool uncached_ = false;
  std::thread thread_;
};

}  // namespace sw
