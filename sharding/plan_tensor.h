// The tensor-parallel part of plan construction (sharding/plan_builder.h): the collectives a
// tensor-parallel call runs, listed after its compute action (Action::inside) on the tensor
// queue, and each unit's sum of replicated gradients over the tensor group before its
// data-parallel reduction. Run by the TensorParallel component (sharding/tensor_parallel.h).
#pragma once
#include "sharding/step_plan.h"

namespace sw {

class PlanBuilder;

class TensorPlan {
 public:
  explicit TensorPlan(PlanBuilder& b) : b_(b) {}
  // After compute action `at` (position p's forward, recompute or backward in `pass`): its
  // declared collectives, each waited for by that action.
  void inside(int at, int p, Unit::Pass pass);
  // Before unit u's reduction: its replicated gradients summed over the tensor group.
  void reduce_grads(int u, int after);

 private:
  PlanBuilder& b_;
};

}  // namespace sw
