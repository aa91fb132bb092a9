// Collectives on device buffers: the registry of native device groups (NCCL registers one) and
// the staged group that runs a host group's collectives through host staging buffers
// (group.h, "Collectives on device memory").
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "sharding/comm/group.h"
#include "sharding/comm/work.h"

namespace sw {

namespace {

DeviceGroupFactory g_factories[static_cast<size_t>(DeviceKind::Count)] = {};

// One staged collective: what the worker copies in, runs on the host group and copies out.
struct Job {
  Collective c;  // the caller's (device pointers)
  std::shared_ptr<detail::WorkState> state;
  bool timed = false;  // issued while stream_timing(): stamped on the group's thread
};

class StagedGroup final : public Group {
 public:
  StagedGroup(GroupPtr host, Device dev)
      : host_(std::move(host)), dev_(dev), stats_(std::make_shared<detail::StatsBlock>()) {
    worker_ = std::thread([this] { run(); });
  }
  ~StagedGroup() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const char* backend() const override { return "staged"; }

  std::shared_ptr<Group> split(int color, int key) override {
    drain();  // the split is a collective on host_: nothing of ours may be behind it
    GroupPtr h = host_->split(color, key);
    return h ? std::make_shared<StagedGroup>(std::move(h), dev_) : nullptr;
  }

  Work issue(const Collective& c) override {
    auto s = std::make_shared<detail::WorkState>();
    s->stats = stats_;
    {
      std::lock_guard<std::mutex> l(mu_);
      s->seq = ++seq_;
      queue_.push_back(Job{c, s, stream_timing()});
    }
    cv_.notify_all();
    return Work(std::move(s));
  }

  void set_options(const CommOptions& o) override { host_->set_options(o); }
  CommOptions options() const override { return host_->options(); }
  CommStats stats() const override {
    CommStats s = stats_->get();
    s.comm_s = host_->stats().comm_s;  // the network's share; ours adds the copies below
    s.comm_s += copy_s_.load();
    return s;
  }
  void reset_stats() override {
    stats_->reset();
    host_->reset_stats();
    copy_s_.store(0);
  }

 private:
  // Waits until every collective issued so far has completed.
  void drain() {
    std::unique_lock<std::mutex> l(mu_);
    idle_cv_.wait(l, [&] { return queue_.empty() && !busy_; });
  }

  void run() {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, nothing left
        job = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
      }
      std::string err;
      try {  // another group's collective it must follow (Collective::after)
        job.c.after.wait_done();
      } catch (const std::exception& e) {
        err = "comm: " + describe(job.c) + " after a collective that failed (" + e.what() + ")";
      }
      job.state->t_start = trace_now();
      try {
        if (!err.empty()) throw Error(err);
        execute(job.c);
      } catch (const std::exception& e) {
        err = e.what();
      }
      const double t_end = trace_now(), dt = t_end - job.state->t_start;
      stats_->add_op(detail::collective_bytes(job.c, size()), dt);
      if (job.timed) {  // this thread is the group's stream: its host clock stamps
        job.state->timed_begin = std::make_shared<StampedEvent>(job.state->t_start);
        job.state->timed_end = std::make_shared<StampedEvent>(t_end);
        job.state->stream = "staged comm";
      }
      job.state->complete(std::move(err));
      {
        std::lock_guard<std::mutex> l(mu_);
        busy_ = false;
      }
      idle_cv_.notify_all();
    }
  }

  // The staging copies (device -> host before the collective, back after it), timed.
  void copy(void* dst, Device dd, const void* src, Device sd, size_t bytes) {
    const double t0 = trace_now();
    copy_bytes(dst, dd, src, sd, bytes);
    copy_s_.store(copy_s_.load() + (trace_now() - t0));
  }
  void in(void* host, const void* dev, size_t bytes) { copy(host, Device::cpu(), dev, dev_, bytes); }
  void out(void* dev, const void* host, size_t bytes) { copy(dev, dev_, host, Device::cpu(), bytes); }

  void execute(const Collective& c) {
    const size_t es = dtype_size(c.dtype), n = static_cast<size_t>(c.count) * es;
    const size_t P = static_cast<size_t>(size()), r = static_cast<size_t>(rank());
    auto staging = [](size_t bytes) { return Buffer(bytes, Mem::Communication, Device::cpu(), Tier::Host); };
    switch (c.kind) {
      case CollKind::AllGather: {
        // Stage this rank's block in place in the full output: the host group gathers in place.
        Buffer b = staging(n * P);
        char* h = b.as<char>();
        in(h + r * n, c.send, n);
        host_->all_gather(h + r * n, h, c.count, c.dtype, c.algo);
        out(c.recv, h, n * P);
        return;
      }
      case CollKind::ReduceScatter: {
        Buffer b = staging(n * P + n);
        char* h = b.as<char>();
        in(h, c.send, n * P);
        host_->reduce_scatter(h, h + n * P, c.count, c.op, c.dtype, c.algo);
        out(c.recv, h + n * P, n);
        return;
      }
      case CollKind::AllReduce: {
        Buffer b = staging(n);
        in(b.data(), c.send, n);
        host_->all_reduce(b.data(), b.data(), c.count, c.op, c.dtype, c.algo);
        out(c.recv, b.data(), n);
        return;
      }
      case CollKind::Broadcast: {
        Buffer b = staging(n);
        if (rank() == c.root) in(b.data(), c.recv, n);
        host_->broadcast(b.data(), c.count, c.root, c.dtype);
        if (rank() != c.root) out(c.recv, b.data(), n);
        return;
      }
      case CollKind::Barrier:
        host_->barrier();
        return;
      case CollKind::Split:
        fail("comm", "staged group: split is not a queued collective");
    }
  }

  GroupPtr host_;
  Device dev_;
  std::shared_ptr<detail::StatsBlock> stats_;
  std::atomic<double> copy_s_{0};
  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<Job> queue_;
  bool stop_ = false, busy_ = false;
  uint64_t seq_ = 0;
  std::thread worker_;
};

}  // namespace

void register_device_group_factory(DeviceKind kind, DeviceGroupFactory f) {
  SW_CHECK(kind != DeviceKind::CPU && kind != DeviceKind::Count, "CPU groups are built in");
  g_factories[static_cast<size_t>(kind)] = f;
}

const char* device_comm_name(DeviceComm m) {
  switch (m) {
    case DeviceComm::Auto: return "auto";
    case DeviceComm::Native: return "native";
    case DeviceComm::Staged: return "staged";
  }
  return "?";
}

DeviceComm device_comm_from_name(const std::string& s) {
  if (s == "auto") return DeviceComm::Auto;
  if (s == "native") return DeviceComm::Native;
  if (s == "staged") return DeviceComm::Staged;
  fail("comm", "device communication '" + s + "' is not one of auto, native, staged");
}

GroupPtr make_staged_group(GroupPtr host, Device dev) {
  SW_CHECK(host != nullptr, "make_staged_group: no host group");
  // A communicator of its own: the staging thread issues on it while the caller's thread may
  // issue host collectives on `host` (issue order across threads would differ between ranks).
  GroupPtr own = host->split(0, host->rank());
  return std::make_shared<StagedGroup>(std::move(own), dev);
}

GroupPtr device_group(const GroupPtr& host, Device dev, DeviceComm mode) {
  if (dev.is_cpu()) return host;
  const DeviceGroupFactory f = g_factories[static_cast<size_t>(dev.kind)];
  if (mode != DeviceComm::Staged) {
    if (!f && mode == DeviceComm::Native)
      fail("comm", "no native collectives for device " + dev.str() + " in this build");
    if (f) {
      GroupPtr g = f(*host, dev);
      if (g) return g;
      if (mode == DeviceComm::Native)
        fail("comm", "the native collectives cannot serve device " + dev.str() +
                         " on every rank (ranks sharing a device?)");
    }
  }
  return make_staged_group(host, dev);
}

}  // namespace sw
