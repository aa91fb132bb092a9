// The host tier's compute (ZeRO-Offload): on a device, the AdamW of state kept in host memory
// (offload_optimizer cpu, or moments staged from NVMe; offload_param cpu puts the master and
// gradient shards there too) runs here, on the CPU, on a thread of its own, while the device
// goes on with the step. Jobs run one at a time in posting order; each post returns the job's
// completion Event, which carries its failure to whoever synchronizes.
//
// An update's master and gradient, where they are on the device, come down to host staging on
// the copy stream after the compute stream's work at posting (what produced the gradients);
// a job issues its own copies and the next posted update's, so those run while it computes
// (at most two updates' staging exist at once: StepPlan::host_update_staging). An updated
// device master goes back up before the job ends.
//
// Environment (tests and comparisons): SHARDWISE_HOST_UPDATE_DELAY_US=N sleeps N us before
// each job, so that a reader that did not wait for its update sees stale values;
// SHARDWISE_HOST_UPDATE_ASYNC=0 asks callers to wait for each update where they post it
// (synchronous()).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "core/device.h"
#include "core/worker.h"

namespace sw {

class Ops;

// The optimizer over floats [lo, hi) of one unit's shard, run on the host.
struct HostUpdate {
  int unit = -1;  // for its span
  // Where the part's master and gradient are (device memory where *_on_device).
  float* master = nullptr;
  bool master_on_device = false;
  const float* grad = nullptr;
  bool grad_on_device = false;
  float *m = nullptr, *v = nullptr;  // host memory, indexed by Piece::off
  size_t n = 0;                      // floats of the part
  struct Piece {
    size_t off, poff, n;  // into m / v, into the part, floats
    float wd;
    float coeff = 1.f;  // LARS's trust ratio; Lamb's multiplier of u (UpdateArgs::coeff)
  };
  std::vector<Piece> pieces;
  // 0 AdamW, 1 SGD, 2 LARS (sgd with coeff), 3 Lamb (param -= coeff * grad, grad holding u)
  int type = 0;
  float lr = 0, beta1 = 0, beta2 = 0, eps = 0, grad_mult = 1;
  float momentum = 0, dampening = 0;
  bool nesterov = false;
  int step = 0;
};

// A job's interval on the host updater's thread (trace_now() seconds), for the profiler.
struct HostSpan {
  int unit = -1;
  int64_t bytes = 0;
  double t_begin = 0, t_end = 0;
};

class HostUpdater {
 public:
  // `device`: the Ops whose device holds what the jobs copy (its stream orders the copies).
  explicit HostUpdater(const Ops& device);
  ~HostUpdater();  // runs what was posted, then joins

  // Posts the update; `record`: keep its span for take_spans().
  std::shared_ptr<Event> update(const HostUpdate& u, bool record);
  // Posts any job (a reduced gradient block added into a host shard).
  std::shared_ptr<Event> post(std::function<void()> job);
  // SHARDWISE_HOST_UPDATE_ASYNC=0: callers wait for each job where they post it.
  bool synchronous() const { return sync_; }
  // Tests: while held, no job starts.
  void hold(bool on);
  // Seconds the thread has spent in updates (copies waited for, AdamW, the copy back).
  double seconds() const { return double(busy_ns_->load()) * 1e-9; }
  // The spans of the recorded jobs finished since the last call.
  std::vector<HostSpan> take_spans();

 private:
  struct CopyDown;
  struct CopyQueue;
  struct Spans;
  HostWorker& worker();  // made on first use

  const Ops& dev_;
  const bool sync_;
  int delay_us_ = 0;
  std::shared_ptr<std::atomic<int64_t>> busy_ns_;
  std::shared_ptr<CopyQueue> copies_;
  std::shared_ptr<Spans> spans_;
  std::unique_ptr<HostWorker> worker_;  // last: joined (its jobs run out) first
};

}  // namespace sw
