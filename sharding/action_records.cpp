#include "sharding/action_records.h"

#include <algorithm>

#include "core/env.h"
#include "core/error.h"
#include "sharding/comm/group.h"

namespace sw {

ActionRecords::~ActionRecords() {
  if (timing_held_) hold_stream_timing(false);
}

void ActionRecords::attach(StepRecorder* recorder) {
  settle_device_times();
  rec_ = recorder;
  if (recorder) {
    device_times_ = stream_.native_handle() != nullptr || env_flag("SHARDWISE_PROFILE_DEVICE_TIMES");
  }
  const bool hold = recorder && device_times_;  // the collectives and copies timed meanwhile
  if (hold != timing_held_) hold_stream_timing(hold);
  timing_held_ = hold;
}

double ActionRecords::now() const { return rec_ ? trace_clock() : 0; }

void ActionRecords::begin_segment() {
  if (rec_) ++rec_->segments;
}

ActionRecord& ActionRecords::add(const StepPlan& plan, int i, double t0, double t1) {
  return add(plan, i, t0, t1, plan.actions[static_cast<size_t>(i)].queue);
}

ActionRecord& ActionRecords::add(const StepPlan& plan, int i, double t0, double t1, Queue queue) {
  const Action& a = plan.actions[static_cast<size_t>(i)];
  ActionRecord r;
  r.action = i;
  r.kind = a.kind;
  r.queue = queue;
  r.unit = a.unit;
  r.call = a.call;
  r.micro = a.micro;
  r.chunk = a.chunk;
  r.bytes = a.bytes;
  r.t_begin = t0;
  r.t_end = t1;
  push(r);
  return rec_->records.back();
}

ActionRecord& ActionRecords::push(ActionRecord r) {
  r.segment = rec_->segments - 1;
  rec_->records.push_back(r);
  return rec_->records.back();
}

void ActionRecords::device_span(const ActionRecord& r, std::shared_ptr<Event> e) {
  if (!rec_ || !device_times_ || !e) return;
  tie();  // (its events are read at the settle: a host-run stream sets them when it runs)
  const size_t i = static_cast<size_t>(&r - rec_->records.data());
  SW_CHECK(i < rec_->records.size(), "action records: a device span of no current record");
  spans_.push_back({i, r.action, r.segment, nullptr, std::move(e)});
}

void ActionRecords::tie() {
  if (ref_) return;
  std::shared_ptr<Event> ref = stream_.record_timed();  // the host waits once
  ref->synchronize();
  ref_host_ = trace_clock();
  ref_ = std::move(ref);  // (set only once the tie holds)
}

ActionRecord* ActionRecords::open_gather(int unit) {
  for (auto r = rec_->records.rbegin(); r != rec_->records.rend(); ++r)
    if (r->kind == ActionKind::Gather && r->unit == unit && r->t_end < 0) return &*r;
  return nullptr;
}

void ActionRecords::take_host(std::vector<HostSpan> spans) {
  if (!rec_) return;
  for (const HostSpan& h : spans) {
    ActionRecord r;
    r.kind = ActionKind::OptimizerUpdate;
    r.queue = Queue::Host;
    r.unit = h.unit;
    r.bytes = h.bytes;
    r.t_begin = h.t_begin;
    r.t_end = h.t_end;
    push(r);
  }
}

ActionRecords::Bracket ActionRecords::open(const StepPlan& plan, int i) {
  Bracket b;
  if (!rec_ || !device_times_ || plan.actions[size_t(i)].queue != Queue::Compute) return b;
  tie();  // ties the device's clock to the host's
  b.begin = stream_.record_timed();
  b.first = rec_->records.size();
  return b;
}

void ActionRecords::close(Bracket& b, int i) {
  if (!b.begin) return;
  std::shared_ptr<Event> end = stream_.record_timed();
  for (size_t r = b.first; r < rec_->records.size(); ++r) {
    const ActionRecord& rec = rec_->records[r];
    if (rec.action == i && rec.queue == Queue::Compute)
      spans_.push_back({r, rec.action, rec.segment, b.begin, end});
  }
}

void ActionRecords::settle_device_times() {
  // Taken first, so a failure below leaves nothing half-settled behind: a record whose events
  // cannot be timed keeps its host times, and the error goes on to the caller.
  std::vector<DeviceSpan> spans;
  spans.swap(spans_);
  std::shared_ptr<Event> ref = std::move(ref_);  // (leaves ref_ empty)
  if (!rec_ || spans.empty()) return;
  // A host-run stream's stamped event is on the host's clock; a device's, through the tie.
  auto at = [&](Event& e) {
    if (auto* h = dynamic_cast<StampedEvent*>(&e)) return h->at();
    SW_CHECK(ref != nullptr, "action records: a device span without the clock tie");
    return ref_host_ + e.elapsed_since(*ref);
  };
  std::vector<char> settled(rec_->records.size(), 0);  // by an earlier span (a union)
  for (const DeviceSpan& d : spans) {
    if (d.record >= rec_->records.size()) continue;
    ActionRecord& r = rec_->records[d.record];
    if (r.action != d.action || r.segment != d.segment) continue;
    Event::TimedSpan t{d.begin.get(), d.end.get(), stream_.name()};  // a compute bracket
    if (!d.begin) {  // an event whose work ran on a stream of its own
      // A group's thread sets a collective's span once it ran it: waited for (not counted as
      // the caller's exposed communication). Timing any other span waits for its events.
      if (auto* w = dynamic_cast<Work*>(d.end.get())) w->wait_done();
      t = d.end->timed_span();
      if (!t.begin || !t.end) continue;  // not timed: the host's times stay
    }
    const double b = at(*t.begin), e = at(*t.end);
    if (settled[d.record]) {
      r.t_begin = std::min(r.t_begin, b);
      r.t_end = std::max(r.t_end, e);
      continue;
    }
    settled[d.record] = 1;
    r.host_begin = r.t_begin;
    r.host_end = r.t_end;
    r.t_begin = b;
    r.t_end = e;
    r.stream = t.stream;
  }
}

}  // namespace sw
