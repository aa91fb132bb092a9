// A host thread that runs jobs one at a time, in the order they were posted; each post returns
// the job's completion as an Event (core/stream.h), which carries the job's failure (an
// exception's text) to whoever synchronizes. The host-tier optimizer (ShardedModel on a device
// with offload_optimizer cpu) runs its per-unit AdamW here while the calling thread goes on
// with the device's work.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "core/stream.h"

namespace sw {

class HostWorker {
 public:
  // `on_start` runs first on the new thread (the kernels' thread count, say).
  explicit HostWorker(std::function<void()> on_start = {});
  ~HostWorker();  // runs what was posted, then joins
  HostWorker(const HostWorker&) = delete;
  HostWorker& operator=(const HostWorker&) = delete;

  std::shared_ptr<Event> post(std::function<void()> job);
  // Waits until every job posted so far has run (never throws).
  void drain();
  // Tests: while held, no job starts; release with false.
  void hold(bool on);
  int64_t pending() const;  // posted, not finished

 private:
  struct Job {
    std::function<void()> fn;
    std::shared_ptr<HostEvent> done;
  };
  void loop(std::function<void()> on_start);
  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<Job> jobs_;
  int64_t running_ = 0;
  bool hold_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace sw
