// NcclGroup: a Group on CUDA device memory through NCCL (see nccl_group.h for the contract).
// Compiled, never run on a GPU: everything here follows the CUDA and NCCL documentation and
// is unverified until tests/cuda's NCCL tests run on a machine with GPUs.
#include "sharding/comm/nccl/nccl_group.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/alloc.h"
#include "core/env.h"
#include "core/error.h"
#include "kernels/cuda/cuda_kernels.cuh"
#include "kernels/cuda/cuda_runtime.h"
#include "sharding/comm/work.h"

namespace sw {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string fmt_s(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", s);
  return b;
}

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("comm", std::string("nccl group: ") + what + " failed: " + cudaGetErrorString(e));
}

// Backs off from yielding to sleeping up to 1 ms, so a long wait costs little CPU and a short
// one little latency.
class Backoff {
 public:
  void pause() {
    if (n_ < 64) {
      ++n_;
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(us_));
    us_ = std::min(us_ * 2, 1000);
  }

 private:
  int n_ = 0, us_ = 20;
};

ncclDataType_t nccl_type(DType dt) {
  switch (dt) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
  }
  fail("comm", "nccl group: unsupported dtype");
}

// Avg sums, then divides the result by the group's size on the communication stream
// (cuda::divide): NCCL's ncclAvg multiplies each input by 1/size rounded to the element type
// first, which is not Sum / size() (group.h) where the size is not a power of two (bf16 at
// three ranks: 0.33398 for 1/3), and the MPI groups divide the sum.
ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclSum;
    case ReduceOp::Max: return ncclMax;
  }
  fail("comm", "nccl group: unsupported reduce op");
}

// The communicator, shared by the group and the events of its Works (an event may outlive the
// group). Any thread waiting on a Work may abort it, so every use of `comm` takes `mu` and
// checks `aborted` first (ncclCommAbort frees it); the lock is held for single NCCL calls,
// never across a wait.
struct NcclComm {
  ncclComm_t comm = nullptr;
  int rank = 0, size = 1, device = 0;
  std::mutex mu;
  std::atomic<bool> aborted{false};

  std::string where() const {
    return "on rank " + std::to_string(rank) + " of " + std::to_string(size) + " (cuda:" +
           std::to_string(device) + ")";
  }

  void abort() {
    std::lock_guard<std::mutex> l(mu);
    if (aborted.exchange(true) || !comm) return;
    ncclCommAbort(comm);  // makes the kernels of pending collectives return; frees the comm
  }

  // Calls f(comm) under the lock; returns `if_aborted` without calling it once aborted.
  template <class F>
  ncclResult_t call(F&& f, ncclResult_t if_aborted = ncclInvalidUsage) {
    std::lock_guard<std::mutex> l(mu);
    if (aborted.load()) return if_aborted;
    return f(comm);
  }

  // ncclSuccess / ncclInProgress while healthy, else the error (ncclInvalidUsage once aborted);
  // `detail` gets NCCL's last error text.
  ncclResult_t async_state(std::string* detail) {
    return call([&](ncclComm_t c) {
      ncclResult_t r = ncclSuccess;
      const ncclResult_t q = ncclCommGetAsyncError(c, &r);
      if (q != ncclSuccess) r = q;
      if (r != ncclSuccess && r != ncclInProgress && detail) {
        const char* last = ncclGetLastError(c);
        if (last && *last) *detail = last;
      }
      return r;
    });
  }

  std::string describe_error(ncclResult_t r, const std::string& detail) const {
    if (aborted.load() && r == ncclInvalidUsage)
      return "the communicator was aborted (an earlier failure or time-out)";
    return std::string(ncclGetErrorString(r)) + (detail.empty() ? "" : " (" + detail + ")");
  }

  // After a call that returned `r`: throws on an error; on ncclInProgress (a non-blocking
  // communicator) polls until the operation has settled, aborting after timeout_s.
  void settle(ncclResult_t r, const std::string& what, double timeout_s) {
    const auto t0 = Clock::now();
    Backoff b;
    for (;;) {
      if (r == ncclSuccess) return;
      std::string detail;
      if (r == ncclInProgress) r = async_state(&detail);
      if (r == ncclSuccess) return;
      if (r != ncclInProgress) {
        const std::string msg = describe_error(r, detail);
        abort();
        fail("comm", "nccl " + what + " failed " + where() + ": " + msg);
      }
      if (seconds_since(t0) > timeout_s) {
        abort();
        fail("comm", "nccl " + what + " timed out after " + fmt_s(timeout_s) + "s " + where() +
                         " (a peer not reached?); the communicator was aborted");
      }
      b.pause();
    }
  }

  // Orderly teardown once nothing is pending (the group waited for its last collective).
  ~NcclComm() {
    if (aborted.load() || !comm) return;
    ncclResult_t r = ncclCommFinalize(comm);
    if (r == ncclInProgress) {
      const auto t0 = Clock::now();
      Backoff b;
      ncclResult_t s = ncclInProgress;
      while (s == ncclInProgress && seconds_since(t0) < 10) {
        if (ncclCommGetAsyncError(comm, &s) != ncclSuccess) break;
        if (s == ncclInProgress) b.pause();
      }
      r = s;
    }
    if (r == ncclSuccess)
      ncclCommDestroy(comm);
    else
      ncclCommAbort(comm);
  }
};

// The event a NCCL Work hands out: a CudaEvent whose host wait never blocks forever.
class NcclEvent final : public CudaEvent {
 public:
  NcclEvent(int device, std::shared_ptr<NcclComm> comm, std::string what, double timeout_s,
            bool timed = false)
      : CudaEvent(device, timed), comm_(std::move(comm)), what_(std::move(what)), timeout_s_(timeout_s) {}

  // Not complete once the communicator was aborted (its kernels returned early): nothing may
  // go on with the result; synchronize names the failure.
  bool query() override { return !comm_->aborted.load() && CudaEvent::query(); }

  void synchronize() override {
    const auto t0 = Clock::now();
    Backoff b;
    for (;;) {
      const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event_));
      // An abort (another Work's failure or time-out) makes pending collectives' kernels
      // return early, so their events complete with the data unfinished: a completed event on
      // an aborted communicator is a failure too (conservatively: also one that had finished
      // just before the abort; the step is lost either way).
      if (e == cudaSuccess && comm_->aborted.load())
        fail("comm", "nccl " + what_ + " " + comm_->where() +
                         ": the communicator was aborted (an earlier failure or time-out) "
                         "before this collective was waited for; its result is not valid");
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady)
        fail("comm", "nccl " + what_ + " failed " + comm_->where() + ": " + cudaGetErrorString(e));
      std::string detail;
      const ncclResult_t r = comm_->async_state(&detail);
      if (r != ncclSuccess && r != ncclInProgress) {
        const std::string msg = comm_->describe_error(r, detail);
        comm_->abort();
        fail("comm", "nccl " + what_ + " failed " + comm_->where() + ": " + msg);
      }
      if (seconds_since(t0) > timeout_s_) {
        comm_->abort();
        fail("comm", "nccl " + what_ + " timed out after " + fmt_s(timeout_s_) + "s " +
                         comm_->where() + " (a peer not reached?); the communicator was aborted");
      }
      b.pause();
    }
  }

 private:
  std::shared_ptr<NcclComm> comm_;
  std::string what_;
  double timeout_s_;
};

uint64_t fnv1a(const char* s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; ++s) h = (h ^ static_cast<uint8_t>(*s)) * 1099511628211ull;
  return h;
}

// This rank's identity for `dev` (never throws: a failure is status 0 or -1).
GpuIdentity my_identity(Device dev) {
  GpuIdentity id;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  id.host_hash = fnv1a(host);
  try {
    if (dev.kind != DeviceKind::CUDA || cuda_device_count() == 0) return id;
    if (dev.index != cuda_current_device()) {
      id.status = -1;
      return id;
    }
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, dev.index) != cudaSuccess ||
        cudaDeviceGetPCIBusId(id.bus_id, sizeof id.bus_id, dev.index) != cudaSuccess) {
      cudaGetLastError();
      return id;
    }
    static_assert(sizeof prop.uuid.bytes == sizeof id.uuid);
    std::memcpy(id.uuid, prop.uuid.bytes, sizeof id.uuid);
    id.status = 1;
  } catch (const std::exception&) {  // e.g. a bad SHARDWISE_CUDA_DEVICE
    id.status = 0;
  }
  return id;
}

class NcclGroup final : public Group {
 public:
  NcclGroup(GroupPtr host, Device dev, std::shared_ptr<NcclComm> comm, CommOptions opts)
      : host_(std::move(host)), dev_(dev), comm_(std::move(comm)), opts_(opts),
        stats_(std::make_shared<detail::StatsBlock>()) {
    cuda_use_device(dev_.index);
    int lo = 0, hi = 0;  // numerically lower is higher priority
    cuda_ok(cudaDeviceGetStreamPriorityRange(&lo, &hi), "cudaDeviceGetStreamPriorityRange");
    cuda_ok(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, hi),
            "cudaStreamCreateWithPriority");
    cuda_ok(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
    // Zeroed on the legacy stream (a reused block's earlier users there and on the compute
    // stream are ordered before it); the group's stream touches it only after an event of
    // the compute stream, which is ordered after the legacy stream.
    scratch_ = Buffer(sizeof(float), Mem::Communication, dev_);
    cuda_ok(cudaMemset(scratch_.data(), 0, sizeof(float)), "cudaMemset");
    timeout_s_.store(opts_.timeout_s);
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclGroup() override {
    {
      std::lock_guard<std::mutex> l(wmu_);
      stop_ = true;
    }
    wcv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    // Let the last collective finish (bounded by the timeout; a failure aborts the
    // communicator) before the stream, the scratch and the communicator go.
    try {
      if (last_ && !comm_->aborted.load()) last_->synchronize();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "shardwise: %s\n", e.what());
    }
    if (!comm_->aborted.load()) cudaStreamSynchronize(stream_);
    last_.reset();
    scratch_.release();
    comm_.reset();  // finalized here unless a Work still holds it
    cudaEventDestroy(ready_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return comm_->rank; }
  int size() const override { return comm_->size; }
  const char* backend() const override { return "nccl"; }

  std::shared_ptr<Group> split(int color, int key) override;

  Work issue(const Collective& c) override {
    if (c.kind == CollKind::Split) fail("comm", "nccl group: split is not a queued collective");
    if (comm_->aborted.load())
      fail("comm", "nccl " + describe(c) + " " + comm_->where() +
                       ": the communicator was aborted (an earlier failure or time-out)");
    cuda_use_device(dev_.index);
    const uint64_t seq = ++seq_;
    const std::string what = describe(c) + " #" + std::to_string(seq);
    // Inputs written by the compute stream are ready: the comm stream waits for its work so
    // far (the host does not).
    cuda_ok(cudaEventRecord(ready_, static_cast<cudaStream_t>(cuda_compute_stream(dev_.index))),
            "cudaEventRecord (compute stream)");
    cuda_ok(cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent");
    // Another group's collective it follows (Collective::after): its event, on the device; a
    // collective of a host group (none in the engine's pairings), on the host.
    if (void* h = c.after.native_handle())
      cuda_ok(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(h), 0),
              "cudaStreamWaitEvent (after)");
    else
      c.after.wait_done();
    // The profiler's device interval (stream_timing()): timed events on this stream around it.
    const bool timed = stream_timing();
    std::shared_ptr<CudaEvent> begin;
    if (timed) {
      begin = std::make_shared<CudaEvent>(dev_.index, true);
      begin->record(stream_);
    }

    const size_t n = static_cast<size_t>(c.count);
    const ncclDataType_t t = nccl_type(c.dtype);
    const ncclRedOp_t op = nccl_op(c.op);
    const ncclResult_t r = comm_->call([&](ncclComm_t comm) -> ncclResult_t {
      if (c.kind == CollKind::Barrier)
        return ncclAllReduce(scratch_.data(), scratch_.data(), 1, ncclFloat32, ncclSum, comm,
                             stream_);
      if (n == 0) return ncclSuccess;
      switch (c.kind) {
        case CollKind::AllGather: return ncclAllGather(c.send, c.recv, n, t, comm, stream_);
        case CollKind::ReduceScatter:
          return ncclReduceScatter(c.send, c.recv, n, t, op, comm, stream_);
        case CollKind::AllReduce: return ncclAllReduce(c.send, c.recv, n, t, op, comm, stream_);
        case CollKind::Broadcast:
          return ncclBroadcast(c.send, c.recv, n, t, c.root, comm, stream_);
        default: return ncclSuccess;
      }
    });
    comm_->settle(r, what, opts_.timeout_s);
    // The caching allocator must not hand these blocks out again before the collective ran
    // (recorded before anything below may throw).
    if (n > 0 && c.kind != CollKind::Barrier) {
      if (c.send) cuda_record_stream(c.send, stream_, dev_.index);
      if (c.recv && c.recv != c.send) cuda_record_stream(c.recv, stream_, dev_.index);
    }
    if (c.op == ReduceOp::Avg && n > 0 && size() > 1 &&
        (c.kind == CollKind::ReduceScatter || c.kind == CollKind::AllReduce)) {
      cuda::divide(stream_, static_cast<int>(c.dtype), c.recv, static_cast<float>(size()), n);
    }

    auto ev = std::make_shared<NcclEvent>(dev_.index, comm_, what, opts_.timeout_s, timed);
    ev->record(stream_);
    if (watching_.load()) {
      std::lock_guard<std::mutex> l(wmu_);
      pending_.push_back({ev, Clock::now(), what});
    }
    last_ = ev;

    auto s = std::make_shared<detail::WorkState>();
    s->seq = seq;
    s->stats = stats_;
    if (timed) {
      s->timed_begin = std::move(begin);
      s->timed_end = ev;
      s->stream = "nccl";
    }
    s->native = std::move(ev);  // done stays false: Work uses the event
    stats_->add_op(detail::collective_bytes(c, size()), 0.0);
    return Work(std::move(s));
  }

  void set_options(const CommOptions& o) override {
    opts_ = o;
    timeout_s_.store(o.timeout_s);
  }
  CommOptions options() const override { return opts_; }
  CommStats stats() const override { return stats_->get(); }
  void reset_stats() override { stats_->reset(); }

 private:
  GroupPtr host_;  // the same ranks on the host (this group's own copy): split, creation
  Device dev_;
  std::shared_ptr<NcclComm> comm_;
  CommOptions opts_;
  std::shared_ptr<detail::StatsBlock> stats_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;  // recorded on the compute stream before each collective
  Buffer scratch_;               // the barrier's float
  std::shared_ptr<NcclEvent> last_;
  uint64_t seq_ = 0;

  // The watchdog. The compute stream may wait for a collective on the device (a gather's
  // event, Stream::wait_event), where no host wait with a time-out runs, and the host then
  // blocks in a plain CUDA synchronisation: a peer that died would hang this rank for good. A
  // thread per group looks at the collectives in flight every 100 ms; one not complete
  // timeout_s after it was issued, or an asynchronous NCCL error, aborts the communicator
  // (the pending kernels then return), says so on stderr, and the next wait on a Work or the
  // next collective names the failure (NcclEvent::synchronize, NcclComm::call).
  struct Watched {
    std::weak_ptr<NcclEvent> ev;
    Clock::time_point issued;
    std::string what;
  };
  std::mutex wmu_;
  std::condition_variable wcv_;
  std::deque<Watched> pending_;  // in issue order: one stream completes them in order
  bool stop_ = false;
  std::atomic<double> timeout_s_{0.0};
  std::atomic<bool> watching_{true};  // false where the watchdog could not start
  std::thread watchdog_;

  void watch() {
    try {
      cuda_use_device(dev_.index);
    } catch (const std::exception&) {
      watching_.store(false);  // (the group's own calls report a device that cannot be used)
      return;
    }
    std::unique_lock<std::mutex> l(wmu_);
    while (!stop_) {
      wcv_.wait_for(l, std::chrono::milliseconds(100));
      if (stop_ || comm_->aborted.load()) continue;
      while (!pending_.empty()) {  // drop what has completed (or whose Work is gone)
        std::shared_ptr<NcclEvent> ev = pending_.front().ev.lock();
        if (ev && cudaEventQuery(static_cast<cudaEvent_t>(ev->native_handle())) ==
                      cudaErrorNotReady)
          break;
        pending_.pop_front();
      }
      cudaGetLastError();  // (a query's error is the waiting thread's to report)
      if (pending_.empty()) continue;
      const Watched w = pending_.front();
      // NCCL's calls (and an abort, which may take seconds) without wmu_: issue() goes on.
      l.unlock();
      try {
        std::string why, detail;
        const ncclResult_t r = comm_->async_state(&detail);
        if (r != ncclSuccess && r != ncclInProgress)
          why = "failed: " + comm_->describe_error(r, detail);
        else if (seconds_since(w.issued) > timeout_s_.load())
          why = "did not complete within " + fmt_s(timeout_s_.load()) +
                "s of its issue (a peer not reached?)";
        if (!why.empty()) {
          std::fprintf(stderr,
                       "shardwise: nccl %s %s %s; the watchdog aborted the communicator\n",
                       w.what.c_str(), comm_->where().c_str(), why.c_str());
          comm_->abort();
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "shardwise: nccl watchdog: %s\n", e.what());
      }
      l.lock();
      if (comm_->aborted.load()) pending_.clear();
    }
  }
};

bool blocking_from_env() { return env_flag("SHARDWISE_NCCL_BLOCKING"); }

// Collective over `host` (owned by the new group); nullptr on every rank when refused.
GroupPtr create(GroupPtr host, Device dev) {
  const int P = host->size(), R = host->rank();
  const CommOptions opts = host->options();

  // 1. Who is where: the same gathered table, so the same decision, on every rank.
  std::vector<GpuIdentity> ids(static_cast<size_t>(P));
  ids[static_cast<size_t>(R)] = my_identity(dev);
  constexpr int64_t kWords = sizeof(GpuIdentity) / 4;
  host->all_gather(&ids[static_cast<size_t>(R)], ids.data(), kWords, DType::F32);
  const std::string refusal = nccl_refusal(ids);
  if (!refusal.empty()) {
    if (env_flag("SHARDWISE_NCCL_VERBOSE"))
      std::fprintf(stderr, "shardwise: rank %d: no NCCL group: %s\n", R, refusal.c_str());
    return nullptr;
  }

  // 2. Rank 0's unique id (and whether it got one) to everyone.
  struct IdMsg {
    ncclUniqueId id;
    int32_t ok;
  } msg{};
  static_assert(sizeof(IdMsg) % 4 == 0, "the id travels as f32 words");
  std::string err;
  if (R == 0) {
    const ncclResult_t r = ncclGetUniqueId(&msg.id);
    msg.ok = r == ncclSuccess;
    if (!msg.ok) err = ncclGetErrorString(r);
  }
  host->broadcast(&msg, sizeof msg / 4, 0, DType::F32);
  if (!msg.ok)
    fail("comm", "nccl group: ncclGetUniqueId failed on rank 0" + (err.empty() ? "" : ": " + err));

  // 3. The communicator.
  cuda_use_device(dev.index);
  auto comm = std::make_shared<NcclComm>();
  comm->rank = R, comm->size = P, comm->device = dev.index;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = blocking_from_env() ? 1 : 0;
  const ncclResult_t r = ncclCommInitRankConfig(&comm->comm, P, msg.id, R, &cfg);
  comm->settle(r, "ncclCommInitRank", opts.timeout_s);
  return std::make_shared<NcclGroup>(std::move(host), dev, std::move(comm), opts);
}

std::shared_ptr<Group> NcclGroup::split(int color, int key) {
  GroupPtr h = host_->split(color, key);
  if (!h) return nullptr;
  GroupPtr g = create(std::move(h), dev_);
  if (!g) fail("comm", "nccl group: split(" + std::to_string(color) + ") could not make a NCCL group");
  return g;
}

struct Registrar {
  Registrar() { register_device_group_factory(DeviceKind::CUDA, make_nccl_group); }
} registrar;

}  // namespace

GroupPtr make_nccl_group(Group& host, Device dev) {
  // A copy of the host group that the NCCL group owns (split and its own bookkeeping); the
  // split is itself collective over `host`, like everything that follows.
  GroupPtr own = host.split(0, host.rank());
  return create(std::move(own), dev);
}

}  // namespace sw
