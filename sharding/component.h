// The executor's parts (docs/ARCHITECTURE.md, "Components"). Each family of plan actions has one
// owner, a Component with state of its own, and each action kind exactly one owner: the
// executor (sharding/executor.h) is a dispatch from an action's kind to its owner.
//
//   owner                  kinds                                    file
//   UnitParams             gather, wait_gather, free, regather      unit_params.*
//   Activations            forward, drop_saved, recompute, backward activations.*
//   Reductions             reduce_scatter, all_reduce, round_grads, reductions.*
//                          wait_reduce
//   Updates                optimizer_update                         updates.*
//   OffloadedState         fetch_state, evict_state, wait_state     offloaded_state.*
//   OffloadedActivations   fetch_acts, evict_acts, wait_acts        offloaded_activations.*
//
// A new family (a tensor-parallel collective, a pipeline send, a cross-group sync) is new
// ActionKinds, a Component that owns them, its plan construction, and one line where
// ShardedModel builds its components.
#pragma once
#include <cstdint>
#include <vector>

#include "models/model.h"
#include "sharding/step_plan.h"

namespace sw {

struct UpdateArgs;  // sharding/updates.h
struct OuterArgs;   // sharding/cross_group.h

// What the ShardedModel call running a segment gives it, and what the segment gives back.
struct RunArgs {
  const Batch* batch = nullptr;
  bool training = true;
  float scale = 0.f;              // UnitCtx::grad_scale
  float* logits = nullptr;        // inference: each sequence's last logits go here
  double* loss_total = nullptr;   // UnitCtx::loss_total: a zeroed double of the device
  const UpdateArgs* update = nullptr;  // an optimizer segment's, or deferred updates'
  const OuterArgs* outer = nullptr;    // local SGD's outer step
  // A pipeline segment: per micro-batch its batch, scale, loss double and (out) what its loss
  // call reported on the host (this rank's loss calls only).
  const std::vector<Batch>* batches = nullptr;
  std::vector<float> scales;
  std::vector<double*> loss_totals;
  std::vector<double> loss_sums;
  std::vector<int64_t> loss_counts;
  const Batch& batch_for(int micro) const {
    return batches ? (*batches)[static_cast<size_t>(micro)] : *batch;
  }
  // Out: what the units reported on the host (UnitCtx::loss_sum, loss_count).
  double loss_sum = 0;
  int64_t loss_count = 0;
};

// A segment being run, as every handler sees it.
struct SegmentRun {
  Model& model;
  const StepPlan& plan;
  RunArgs& args;
  double t0 = 0;  // when the current action started (trace_clock(); 0 without a recorder)
  int current = -1;  // the action running now
  const Action& action(int i) const { return plan.actions[static_cast<size_t>(i)]; }
};

class Component {
 public:
  virtual ~Component() = default;
  virtual const char* name() const = 0;
  // Runs plan action i, of a kind this component owns. Returns true for the executor to record
  // it now ([s.t0, now] on its queue); false when the component records it itself where its
  // work is seen complete (a collective at its wait, an io at the wait for it), or it is not
  // recorded (nothing ran).
  virtual bool run(SegmentRun& s, int i) = 0;
  // Before a segment's first action and after its last (in the order components were added).
  virtual void begin(SegmentRun&) {}
  virtual void end(SegmentRun&) {}
};

}  // namespace sw
