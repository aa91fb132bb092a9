/// The execution context a step plan runs in (docs/ARCHITECTURE.md, "Execution context"): a @file
/// Stream is an ordered queue of work; an Event marks a point in one stream's work that another
/// stream, or the host, can wait for. Ops run on their device's compute stream
/// (Ops::stream()); a communication Group is itself a stream (its collectives run in issue
/// order) and every collective it issues returns its completion event (sharding/comm/group.h's
/// Work). The executor makes the compute stream wait for a gather's event before the unit runs,
/// and the host waits only where a value must be read on it.
///
/// CPU backend: the compute stream is the calling thread (work runs when enqueued), so waiting
/// for an event blocks that thread; a Group's communication thread is its stream.
/// CUDA backend (kernels/cuda/cuda_runtime.h; run on an H100 and an H200): Stream wraps a
/// cudaStream_t, Event a cudaEvent_t recorded on it (CudaEvent); Stream::wait_event is
/// cudaStreamWaitEvent for an event with a native handle (the host does not block) and
/// Event::synchronize for any other; Event::synchronize is cudaEventSynchronize; a NCCL Group
/// (sharding/comm/nccl/) enqueues on its own stream and records an event after each collective.
#pragma once
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

namespace sw {

class Event {
 public:
  virtual ~Event() = default;
  /// True once everything the event marks has completed (never blocks).
  virtual bool query() = 0;
  /// The host waits until it has; throws the failure of the work it marks, if any.
  virtual void synchronize() = 0;
  /// The device backend's own event behind this one (a cudaEvent_t on CUDA), or null when the
  /// work it marks runs on the host (a CPU communication thread). A device stream waits for a
  /// native event without blocking the host, and for any other event by blocking it.
  virtual void* native_handle() const { return nullptr; }
  /// Seconds from `ref` to this event, both from one stream's record_timed(): from when the
  /// work before `ref` had completed to when the work before this one had (the device's own
  /// clock on a GPU). Waits for both. An event made otherwise throws sw::Error.
  virtual double elapsed_since(Event& ref);
  /// The profiler's device interval of the work this event marks, where that work ran on a
  /// stream of its own (a collective on its group's stream, an asynchronous copy on a copy
  /// stream) and was issued while timing was asked for (stream_timing()): the timed events
  /// recorded on that stream just before and just after it (owned by this event, valid while
  /// it lives) and the stream's name. Empty otherwise (the default).
  struct TimedSpan {
    Event* begin = nullptr;        ///< timed event recorded on the stream just before the work
    Event* end = nullptr;          ///< and just after it
    const char* stream = nullptr;  ///< the stream's name ("nccl", "copy d2h", ...)
  };
  /// This event's TimedSpan (see above); the default: none.
  virtual TimedSpan timed_span() { return {}; }
};

/// While held (counted: one hold per attached profiler recorder), the backends give the
/// collectives and asynchronous copies they issue a TimedSpan (Event::timed_span).
void hold_stream_timing(bool on);
/// Whether a hold_stream_timing(true) is in force (backends ask before timing their work).
bool stream_timing();

class Stream {
 public:
  virtual ~Stream() = default;
  virtual const char* name() const = 0;
  /// Work enqueued on this stream after this call starts only once `e` has completed.
  virtual void wait_event(Event& e) = 0;
  /// The host waits for everything enqueued on this stream so far.
  virtual void synchronize() = 0;
  /// An event that completes once everything enqueued on this stream so far has; another
  /// thread or stream can wait for it later (the host updater's copies, say). The default is a
  /// completed event: a host stream's work runs as it is enqueued.
  virtual std::shared_ptr<Event> record();
  /// An event like record()'s that can also be timed (Event::elapsed_since): the profiler's
  /// timeline of the work a device ran (the host only issued it). The default: a completed
  /// event stamped with the host's clock now (StampedEvent), as a host stream's work has run
  /// by the time it is enqueued.
  virtual std::shared_ptr<Event> record_timed();
  /// The device backend's own stream (a cudaStream_t on CUDA), or null for the host stream.
  virtual void* native_handle() const { return nullptr; }
};

/// The CPU's compute stream: the calling thread. Work runs as it is enqueued, so wait_event
/// blocks until the event completes and synchronize has nothing to wait for.
class HostStream final : public Stream {
 public:
  const char* name() const override { return "host"; }
  void wait_event(Event& e) override { e.synchronize(); }
  void synchronize() override {}
};
HostStream& host_stream();

/// An event a host thread completes (a job of a worker thread: the host optimizer's update of
/// one unit). complete() once; synchronize() then throws sw::Error(error) when one was given.
class HostEvent final : public Event {
 public:
  bool query() override;
  void synchronize() override;
  void complete(std::string error = {});

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::string error_;
};

/// An event that has already completed (what an asynchronous copy between host buffers
/// returns: it ran at once).
std::shared_ptr<Event> completed_event();

/// A completed event stamped with core/clock.h's trace_now() when made: Stream::record_timed()
/// of a host stream. elapsed_since another StampedEvent is the
/// difference of their stamps.
class StampedEvent final : public Event {
 public:
  StampedEvent();
  /// Stamped with a time taken earlier (trace_now()'s clock).
  explicit StampedEvent(double at) : at_(at) {}
  bool query() override { return true; }
  void synchronize() override {}
  double elapsed_since(Event& ref) override;
  /// The stamp (trace_now()'s clock).
  double at() const { return at_; }

 private:
  double at_;
};

}  // namespace sw
// ---- Reference documentation (Doxygen): the members above without a comment of their own.

/// @class sw::Event
/// A point in a Stream's work (Stream::record): query it, wait for it, or make another stream
/// wait for it.

/// @class sw::Stream
/// An ordered queue of work (a device's compute or copy stream, or the calling thread).

/// @fn sw::Stream::name() const
/// Its name in traces ("host", "compute", ...).

/// @fn sw::HostStream::name() const
/// "host".

/// @fn sw::host_stream()
/// The host stream (one per process).

/// @fn sw::HostEvent::complete(std::string error)
/// Marks the event complete; a non-empty `error` makes synchronize() throw it.
