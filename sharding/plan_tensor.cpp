#include "sharding/plan_tensor.h"

#include "sharding/plan_builder.h"

namespace sw {

void TensorPlan::inside(int at, int p, Unit::Pass pass) {
  const CallMemory* cm = b_.call_mem(p);
  if (!cm || b_.in().tensor <= 1) return;
  const Action host = b_.plan().actions[size_t(at)];
  for (const TensorColl& c : cm->tensor[size_t(pass)]) {
    Action& a = b_.add(tensor_action_kind(c.op), Queue::Tensor, host.unit, p);
    a.bytes = c.bytes;
    a.inside = at;
    a.waits.push_back(at);
  }
}

void TensorPlan::reduce_grads(int u, int after) {
  const PlanUnit& pu = b_.in().units[size_t(u)];
  if (b_.in().tensor <= 1 || pu.tp_replicated == 0) return;
  Action& a = b_.add(ActionKind::TpReduceGrads, Queue::Tensor, u);
  a.bytes = pu.tp_replicated * 4;
  a.waits.push_back(after);
}

}  // namespace sw
