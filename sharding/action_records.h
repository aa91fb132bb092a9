// The executor's records for the profiler (ShardedModel::set_recorder): one ActionRecord per
// action run while a StepRecorder is attached, each on its queue's timeline. Who writes what:
// the executor an action's [begin, end] when it returns (Component::run true), the components
// the actions whose work completes later (a collective when it is waited for, an io when the
// wait for it sees it done), and the host updater's jobs as Queue::Host records (take_host).
//
// The device timeline: on a device stream (or with SHARDWISE_PROFILE_DEVICE_TIMES=1) each
// compute-queue action is bracketed by two timed events on the compute stream
// (Stream::record_timed), and every action whose work ran on a stream of its own (a gather's or
// reduction's collective on NCCL's stream, an activation copy on a copy stream) gets that
// work's timed events (Event::timed_span; the backends make them while the recorder holds
// stream_timing()). settle_device_times() replaces such a record's host times (when the host
// issued it, kept in host_begin/host_end) by the stream's (when it ran there), naming the stream
// (ActionRecord::stream): device_ref_host + seconds since device_ref, an event of the compute
// stream the host waited for once per settle to tie the clocks (a timed event of any stream of
// the device may be timed against it); a host-run stream's stamped events (a staged group's
// thread) are on the host clock already. Settled before the records are read or the recorder
// goes.
#pragma once
#include <memory>
#include <vector>

#include "core/stream.h"
#include "offload/host_updater.h"
#include "sharding/step_plan.h"

namespace sw {

class ActionRecords {
 public:
  explicit ActionRecords(Stream& compute) : stream_(compute) {}
  ~ActionRecords();
  ActionRecords(const ActionRecords&) = delete;
  ActionRecords& operator=(const ActionRecords&) = delete;

  // Settles the device times of the recorder it replaces (which must still exist).
  void attach(StepRecorder* recorder);
  bool on() const { return rec_ != nullptr; }
  double now() const;  // trace_clock() while on, else 0
  // The segment being run (StepRecorder::segments - 1) and its start.
  void begin_segment();
  // A record of plan action i: [t0, t1] on the action's queue (or `queue`).
  ActionRecord& add(const StepPlan& plan, int i, double t0, double t1);
  ActionRecord& add(const StepPlan& plan, int i, double t0, double t1, Queue queue);
  ActionRecord& push(ActionRecord r);  // r's segment set to the current one
  // Record r (one of the current records) ran its work on a stream of its own: its interval
  // there is `e`'s timed span (the union over several calls), settled with the compute
  // actions'. A no-op while device times are off or `e` has no span (issued untimed; a host
  // group's collective, whose record already holds when its thread ran it).
  void device_span(const ActionRecord& r, std::shared_ptr<Event> e);
  // The next reduction's ActionRecord::issued (-1 while off).
  int next_seq() { return rec_ ? rec_->issued++ : -1; }
  // The Gather record of unit u left open at issue (t_end < 0), or null: its collective's
  // interval is filled in where the gather is waited for.
  ActionRecord* open_gather(int unit);
  // The host updater's finished spans, as Queue::Host records of the current segment.
  void take_host(std::vector<HostSpan> spans);

  // Around plan action i: on a device stream with a recorder, timed events on the compute
  // stream before and after it, for settle_device_times() (a no-op otherwise).
  struct Bracket {
    std::shared_ptr<Event> begin;
    size_t first = 0;  // its records from here
  };
  Bracket open(const StepPlan& plan, int i);
  void close(Bracket& b, int i);
  void settle_device_times();

 private:
  struct DeviceSpan {
    size_t record = 0;              // index in rec_->records
    int action = -1, segment = -1;  // that record's (checked: the records may have been taken)
    // A compute bracket: its two timed events on the compute stream. Else (begin null) the
    // event of work on a stream of its own, whose TimedSpan is read at the settle.
    std::shared_ptr<Event> begin, end;
  };
  void tie();  // ref_ and ref_host_, once per settle
  Stream& stream_;
  StepRecorder* rec_ = nullptr;
  bool device_times_ = false;  // set with the recorder
  bool timing_held_ = false;   // hold_stream_timing(true) made while device_times_
  std::vector<DeviceSpan> spans_;
  std::shared_ptr<Event> ref_;
  double ref_host_ = 0;
};

}  // namespace sw
