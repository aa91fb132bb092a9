// The owner of the parameter actions: gather (issue a unit's all-gather into its transient full
// buffer), wait_gather (the compute queue waits for it), free (reshard after its last use) and
// regather (stage 1: the updated slices all-gathered in place). The units' state machine
// (sharding/unit_state.h) does each transition; this component calls them where the plan says
// and keeps the peak of units gathered at once. A unit whose master is on NVMe is gathered from
// the staging its fetch read it into (OffloadedState).
#pragma once
#include "sharding/action_records.h"
#include "sharding/component.h"
#include "sharding/model_context.h"

namespace sw {

class OffloadedState;

class UnitParams final : public Component {
 public:
  UnitParams(UnitList& units, ActionRecords& records, OffloadedState& state)
      : units_(units), records_(records), state_(state) {}
  const char* name() const override { return "unit parameters"; }
  bool run(SegmentRun& s, int i) override;

  // Units whose transient gathered parameters are allocated now (in flight included).
  int live_units() const;
  // The most of them at once since reset_peak() (what max_live_units caps).
  int peak() const { return peak_; }
  void reset_peak() { peak_ = live_units(); }

 private:
  UnitList& units_;
  ActionRecords& records_;
  OffloadedState& state_;
  int peak_ = 0;
};

}  // namespace sw
