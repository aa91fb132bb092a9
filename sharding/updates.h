// The owner of the optimizer updates: optimizer_update (AdamW on floats [lo, hi) of a unit's
// fp32 master shard: the whole shard, or a piece NVMe streams through staging). Where the
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
  AdamWParams adam;
  float lr = 0.f, grad_mult = 1.f;
  int step = 0;
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
