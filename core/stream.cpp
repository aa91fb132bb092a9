#include "core/stream.h"

#include <atomic>

#include "core/clock.h"
#include "core/error.h"

namespace sw {

HostStream& host_stream() {
  static HostStream s;
  return s;
}

bool HostEvent::query() {
  std::lock_guard<std::mutex> l(mu_);
  return done_;
}

void HostEvent::synchronize() {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return done_; });
  if (!error_.empty()) throw Error(error_);
}

void HostEvent::complete(std::string error) {
  {
    std::lock_guard<std::mutex> l(mu_);
    done_ = true;
    error_ = std::move(error);
  }
  cv_.notify_all();
}

std::shared_ptr<Event> completed_event() {
  static const std::shared_ptr<Event> e = [] {
    auto h = std::make_shared<HostEvent>();
    h->complete();
    return std::shared_ptr<Event>(h);
  }();
  return e;
}

std::shared_ptr<Event> Stream::record() { return completed_event(); }

std::shared_ptr<Event> Stream::record_timed() { return std::make_shared<StampedEvent>(); }

double Event::elapsed_since(Event&) {
  throw Error("stream: an event not made by Stream::record_timed() has no time");
}

namespace {
std::atomic<int> g_stream_timing{0};
}
void hold_stream_timing(bool on) { g_stream_timing.fetch_add(on ? 1 : -1); }
bool stream_timing() { return g_stream_timing.load(std::memory_order_relaxed) > 0; }

StampedEvent::StampedEvent() : at_(trace_now()) {}

double StampedEvent::elapsed_since(Event& ref) {
  auto* r = dynamic_cast<StampedEvent*>(&ref);  // a caller's mistake: thrown, as Event promises
  if (!r) fail("stream", "a stamped event timed against an event of another kind");
  return at_ - r->at_;
}

}  // namespace sw
