#include "offload/host_updater.h"

#include <chrono>
#include <deque>
#include <thread>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/env.h"
#include "kernels/ops.h"
#include "kernels/threads.h"

namespace sw {

// One update's master and gradient copies down to the host. `mark`: the compute stream's work
// when the update was posted; the copies start after it, into host staging from the Tier::Host
// pool (pinned once a GPU registered pinning). Issued by the updater thread: by the update's own
// job, or by the job before it, so that they run while that one computes.
struct HostUpdater::CopyDown {
  std::mutex mu;
  bool issued = false;
  std::shared_ptr<Event> mark;
  Device dev;
  float* master = nullptr;  // on the device when copy_master, else on the host
  const float* grad = nullptr;
  bool copy_master = false, copy_grad = false;
  size_t n = 0;
  Buffer stage;
  std::shared_ptr<Event> got_master, got_grad;
  float* hmaster = nullptr;  // the host master updated in place: staging or the master itself
  const float* hgrad = nullptr;
  void issue() {
    std::lock_guard<std::mutex> l(mu);
    if (issued) return;
    issued = true;
    const Device cpu = Device::cpu();
    const size_t nb = n * sizeof(float);
    hmaster = master;
    hgrad = grad;
    if (!copy_master && !copy_grad) return;
    stage = Buffer((copy_master + copy_grad) * nb, Mem::Optimizer, cpu, Tier::Host);
    float* q = stage.f32();
    if (copy_master) {
      got_master = copy_bytes_async(q, cpu, master, dev, nb, mark.get());
      hmaster = q;
      q += n;
    }
    if (copy_grad) {
      got_grad = copy_bytes_async(q, cpu, grad, dev, nb, mark.get());
      hgrad = q;
    }
  }
};

// The posted updates whose jobs have not started, in posting order.
struct HostUpdater::CopyQueue {
  std::mutex mu;
  std::deque<std::shared_ptr<CopyDown>> q;
};

struct HostUpdater::Spans {
  std::mutex mu;
  std::vector<HostSpan> done;
};

HostUpdater::HostUpdater(const Ops& device)
    : dev_(device),
      sync_(!env_switch("SHARDWISE_HOST_UPDATE_ASYNC")),
      busy_ns_(std::make_shared<std::atomic<int64_t>>(0)),
      copies_(std::make_shared<CopyQueue>()),
      spans_(std::make_shared<Spans>()) {
  if (const auto v = env_int("SHARDWISE_HOST_UPDATE_DELAY_US")) delay_us_ = static_cast<int>(*v);
}

HostUpdater::~HostUpdater() = default;

HostWorker& HostUpdater::worker() {
  if (!worker_) worker_ = std::make_unique<HostWorker>([t = num_threads()] { set_num_threads(t); });
  return *worker_;
}

void HostUpdater::hold(bool on) { worker().hold(on); }

std::shared_ptr<Event> HostUpdater::post(std::function<void()> job) {
  return worker().post(std::move(job));
}

std::vector<HostSpan> HostUpdater::take_spans() {
  std::lock_guard<std::mutex> l(spans_->mu);
  return std::exchange(spans_->done, {});
}

std::shared_ptr<Event> HostUpdater::update(const HostUpdate& u, bool record) {
  auto down = std::make_shared<CopyDown>();
  down->dev = dev_.device();
  down->copy_master = u.master_on_device;
  down->copy_grad = u.grad_on_device;
  down->n = u.n;
  down->master = u.master;
  down->grad = u.grad;
  down->mark = dev_.stream().record();
  {
    std::lock_guard<std::mutex> l(copies_->mu);
    copies_->q.push_back(down);
  }
  const Device dev = dev_.device();
  const Ops& cpu_ops = ops_for(Device::cpu());
  HostSpan span;
  span.unit = u.unit;
  span.bytes = static_cast<int64_t>(u.n * sizeof(float));
  std::shared_ptr<Spans> spans = record ? spans_ : nullptr;
  auto job = [=, queue = copies_, busy = busy_ns_, delay_us = delay_us_, &cpu_ops]() mutable {
    std::shared_ptr<CopyDown> next;
    {
      std::lock_guard<std::mutex> l(queue->mu);
      if (!queue->q.empty() && queue->q.front() == down) queue->q.pop_front();
      if (!queue->q.empty()) next = queue->q.front();
    }
    if (delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
    const auto t0 = std::chrono::steady_clock::now();
    if (spans) span.t_begin = trace_now();
    down->issue();
    if (next) next->issue();  // its copies run while this update computes
    if (down->got_master) down->got_master->synchronize();
    if (down->got_grad) down->got_grad->synchronize();
    for (const HostUpdate::Piece& pc : u.pieces) {
      float* hp = down->hmaster + pc.poff;
      const float* hg = down->hgrad + pc.poff;
      if (u.type == 0)
        cpu_ops.adamw(hp, hg, u.m + pc.off, u.v + pc.off, pc.n, u.lr, u.beta1, u.beta2, u.eps,
                      pc.wd, u.step, u.grad_mult);
      else if (u.type == 3)
        cpu_ops.add_scaled(hp, -pc.coeff, hg, pc.n);
      else
        cpu_ops.sgd(hp, hg, u.m + pc.off, pc.n, u.lr, u.momentum, u.dampening, u.nesterov, pc.wd,
                    pc.coeff, u.step, u.grad_mult);
    }
    // Nothing on the device touches the master until the unit settles: no wait for its work.
    if (down->copy_master)
      copy_bytes_async(u.master, dev, down->hmaster, Device::cpu(), u.n * sizeof(float),
                       completed_event().get())
          ->synchronize();
    down->stage = Buffer();  // back to the pool, on the worker
    *busy += std::chrono::duration_cast<std::chrono::nanoseconds>(
                 std::chrono::steady_clock::now() - t0)
                 .count();
    if (spans) {
      span.t_end = trace_now();
      std::lock_guard<std::mutex> l(spans->mu);
      spans->done.push_back(span);
    }
  };
  return worker().post(std::move(job));
}

}  // namespace sw
