#include "core/worker.h"

#include <exception>
#include <string>

namespace sw {

HostWorker::HostWorker(std::function<void()> on_start)
    : thread_([this, f = std::move(on_start)]() mutable { loop(std::move(f)); }) {}

HostWorker::~HostWorker() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    hold_ = false;
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_ptr<Event> HostWorker::post(std::function<void()> job) {
  auto done = std::make_shared<HostEvent>();
  {
    std::lock_guard<std::mutex> l(mu_);
    jobs_.push_back({std::move(job), done});
  }
  cv_.notify_all();
  return done;
}

void HostWorker::drain() {
  std::unique_lock<std::mutex> l(mu_);
  idle_cv_.wait(l, [&] { return jobs_.empty() && running_ == 0; });
}

void HostWorker::hold(bool on) {
  {
    std::lock_guard<std::mutex> l(mu_);
    hold_ = on;
  }
  cv_.notify_all();
}

int64_t HostWorker::pending() const {
  std::lock_guard<std::mutex> l(mu_);
  return static_cast<int64_t>(jobs_.size()) + running_;
}

void HostWorker::loop(std::function<void()> on_start) {
  if (on_start) on_start();
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    cv_.wait(l, [&] { return (!jobs_.empty() && !hold_) || (stop_ && jobs_.empty()); });
    if (jobs_.empty()) return;  // stopping
    Job j = std::move(jobs_.front());
    jobs_.pop_front();
    ++running_;
    l.unlock();
    std::string error;
    try {
      j.fn();
    } catch (const std::exception& e) {
      error = e.what();
      if (error.empty()) error = "host job failed";
    } catch (...) {
      error = "host job failed";
    }
    j.fn = nullptr;  // what it captured goes now, on this thread
    j.done->complete(std::move(error));
    l.lock();
    --running_;
    if (jobs_.empty() && running_ == 0) idle_cv_.notify_all();
  }
}

}  // namespace sw
