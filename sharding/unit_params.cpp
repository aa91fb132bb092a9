#include "sharding/unit_params.h"

#include <algorithm>

#include "core/error.h"
#include "sharding/offloaded_state.h"
#include "sharding/unit_state.h"

namespace sw {

int UnitParams::live_units() const {
  int n = 0;
  for (const auto& u : units_) n += u->holds_gathered();
  return n;
}

bool UnitParams::run(SegmentRun& s, int i) {
  const Action& a = s.action(i);
  FlatUnit& fu = *units_[static_cast<size_t>(a.unit)];
  switch (a.kind) {
    case ActionKind::Gather: {
      const bool was = fu.gather_in_flight() || fu.sharded_state() == ShardedState::Unsharded;
      // NVMe parameters: the master shard, read by the fetch the gather waits for.
      const int slot = fu.params_on_nvme() && !was ? state_.stage_gather(s, i, fu) : -1;
      fu.issue_unshard();
      peak_ = std::max(peak_, live_units());
      if (fu.params_on_nvme()) {
        fu.stage_master(nullptr);  // the gather copied it out
        // On a device that copy is an upload; the slot's next read waits for it.
        if (slot >= 0) state_.gathered_from(slot, fu.upload_event());
      }
      // The collective's execution interval is filled in where it is waited for.
      if (records_.on() && !was) records_.add(s.plan, i, s.t0, s.t0).t_end = -1;
      return false;
    }
    case ActionKind::WaitGather: {
      fu.wait_unshard();
      if (records_.on()) {
        const double t1 = trace_clock();
        // The Gather's record gets the collective's real execution interval.
        const Work& w = fu.gather_work();
        if (ActionRecord* r = records_.open_gather(a.unit)) {
          if (w.started_at() > 0) r->t_begin = std::max(r->t_begin, w.started_at());
          r->t_end = w.done_at() > 0 ? w.done_at() : t1;
          records_.device_span(*r, std::make_shared<Work>(w));  // its stream's, where timed
        }
        records_.add(s.plan, i, s.t0, t1);
      }
      return false;
    }
    case ActionKind::Free:
      fu.reshard();
      return true;
    case ActionKind::Regather:
      fu.issue_regather();
      if (records_.on()) {  // the host's issue; where timed, its collective's stream's interval
        const ActionRecord& r = records_.add(s.plan, i, s.t0, trace_clock());
        if (fu.gather_in_flight()) records_.device_span(r, std::make_shared<Work>(fu.gather_work()));
      }
      return false;
    default:
      SW_CHECK(false, std::string("unit parameters: not an action of theirs: ") +
                          action_kind_name(a.kind));
  }
  return false;
}

}  // namespace sw
