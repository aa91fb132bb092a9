// The owner of the optimizer updates: optimizer_update (AdamW, SGD, LARS or Lamb on floats
// [lo, hi) of a unit's fp32 master shard: the whole shard, or a piece NVMe streams through
// staging; LARS and Lamb need whole-tensor norms first: prepare). Where the
// moments are in host memory while the unit computes on a device, the update runs on the host
// updater (OffloadedState). Its state: the deferred updates (OptimizerOffload::defer_update:
// the arguments of the last optimizer step whose deferred units' updates wait for the next
// micro-step's forward, and the units whose gradients zero_grads left for after them).
#pragma once
#include <optional>
#include <vector>

#include "sharding/component.h"
#include "sharding/model_context.h"
#include "sharding/sharded_model.h"

namespace sw {

class OffloadedState;

struct UpdateArgs {
  OptimizerParams adam;
  float lr = 0.f, grad_mult = 1.f;
  int step = 0;
  // LARS and Lamb (Updates::prepare): per unit, per spec, the multiplier of the tensor's update
  // (LARS: the trust ratio; Lamb: lr * bias correction * the clamped ratio, applied to the
  // update u that prepare left in the gradient shard).
  std::vector<std::vector<float>> coeff;
};

class Updates final : public Component {
 public:
  Updates(const ModelContext& ctx, UnitList& units, OffloadedState& state);
  const char* name() const override { return "optimizer updates"; }
  bool run(SegmentRun& s, int i) override;

  // Deferred updates: whether unit u's update is deferred (fixed at construction), the
  // arguments of the step whose deferred updates are pending (null: none).
  bool defers(int u) const { return defers_[size_t(u)]; }
  const UpdateArgs* deferred() const { return deferred_ ? &*deferred_ : nullptr; }
  void defer(const UpdateArgs& a) { deferred_ = a; }
  void clear_deferred() { deferred_.reset(); }
  // LARS and Lamb, before the plan's updates (collective over the shard and tensor groups):
  // each tensor's sums of squares of its weight and of its gradient (LARS) or Lamb's update
  // (Lamb: the moments are updated here and u written over the gradient shard), summed over
  // the groups in rank order, then a.coeff. Refused with NVMe state.
  void prepare(UpdateArgs& a);
  // zero_grads: every unit's gradients, but a deferred update's, which are zeroed right after
  // its last piece.
  void zero_grads();

 private:
  void update(FlatUnit& fu, const UpdateArgs& a, int64_t lo, int64_t hi);

  const ModelContext& ctx_;
  UnitList& units_;
  OffloadedState& state_;
  std::vector<bool> defers_;
  std::optional<UpdateArgs> deferred_;
  std::vector<bool> zero_after_;
};

}  // namespace sw
