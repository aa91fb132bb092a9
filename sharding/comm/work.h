// Completion state shared by a Work handle and the backend that runs the collective
// (internal to sharding/comm).
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "sharding/comm/group.h"

namespace sw::detail {

struct StatsBlock {
  mutable std::mutex mu;
  CommStats s;
  void add_op(double bytes, double seconds) {
    std::lock_guard<std::mutex> l(mu);
    s.ops++;
    s.bytes += bytes;
    s.comm_s += seconds;
  }
  void add_exposed(double seconds) {
    std::lock_guard<std::mutex> l(mu);
    s.exposed_s += seconds;
  }
  CommStats get() const {
    std::lock_guard<std::mutex> l(mu);
    return s;
  }
  void reset() {
    std::lock_guard<std::mutex> l(mu);
    s = CommStats{};
  }
};

struct WorkState {
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> done{false};
  std::string error;  // non-empty: the collective failed
  uint64_t seq = 0;
  std::shared_ptr<StatsBlock> stats;
  // When the backend started and finished executing it (steady clock, seconds; 0 = unknown).
  double t_start = 0, t_done = 0;
  // A backend that runs collectives on a device stream (NCCL) leaves `done` false and sets
  // this: the device event recorded after the collective. Work::test queries it, Work::wait
  // synchronises on it (the host blocks), and Work::native_handle hands it to a device stream
  // (which waits without blocking the host). Errors surface through its synchronize().
  std::shared_ptr<Event> native;
  // Issued while stream_timing(): the timed events around it on the stream that ran it (NCCL's
  // stream; a staged group's thread: stamped events), set before it completes (Work::timed_span).
  std::shared_ptr<Event> timed_begin, timed_end;
  const char* stream = nullptr;

  void complete(std::string err) {
    {
      std::lock_guard<std::mutex> l(mu);
      error = std::move(err);
      t_done = std::chrono::duration<double>(
                   std::chrono::steady_clock::now().time_since_epoch()).count();
      if (t_start == 0) t_start = t_done;
      done.store(true, std::memory_order_release);
    }
    cv.notify_all();
  }
};

// nccl-tests "size" of a collective in bytes (AG: output, RS: input, AR/BC: the buffer).
double collective_bytes(const Collective& c, int world);

}  // namespace sw::detail
