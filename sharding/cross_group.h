// The owner of local SGD / DiLoCo's outer step (sharding/step_plan.h outer_reduce, outer_update):
// replica groups train apart for a round of H inner steps (each with its own sharded inner
// optimizer, no gradient reduction across them); then per unit the pseudo-gradient, the round's
// start minus the replica's master now, is averaged over the replica groups (ctx.cross, the ranks
// holding the same shard in every replica), the outer optimizer (SGD with momentum, Nesterov:
// DiLoCo's; FedAvg is lr 1 without momentum) moves the round's start with it, and every
// replica's master becomes the result, the next round's start. Streaming (fragments > 1): the
// units in fragments, one fragment's outer step at a time in turn.
//
// State: per unit the round's start (`anchor`) and the outer momentum, fp32 shards beside the
// master (Mem::Optimizer), and the pseudo-gradient of each outer_reduce in flight.
#pragma once
#include <vector>

#include "core/alloc.h"
#include "sharding/comm/group.h"
#include "sharding/component.h"
#include "sharding/model_context.h"

namespace sw {

// The outer optimizer: SGD with momentum (torch.optim.SGD's update, Nesterov optional) on the
// pseudo-gradient, which crosses the replica groups in `dtype` (F32 or BF16).
struct OuterArgs {
  float lr = 0.7f, momentum = 0.9f;
  bool nesterov = true;
  DType dtype = DType::F32;
};

class CrossGroup final : public Component {
 public:
  CrossGroup(const ModelContext& ctx, UnitList& units);
  const char* name() const override { return "cross_group"; }
  bool run(SegmentRun& s, int i) override;
  bool on() const { return ctx_.cross != nullptr; }
  // The round starts now: every unit's start := its master (after initialisation, a resume or
  // an import); momentum kept (reset_momentum zeroes it).
  void start_round();
  void reset_momentum();
  // Checkpoint access: unit u's round start / outer momentum shard (host memory on the CPU).
  float* anchor(int u) { return anchor_[size_t(u)].f32(); }
  float* momentum(int u) { return mom_[size_t(u)].f32(); }
  void quiesce() noexcept;

 private:
  void reduce(SegmentRun& s, const Action& a);
  void update(SegmentRun& s, const Action& a);
  const ModelContext& ctx_;
  UnitList& units_;
  std::vector<Buffer> anchor_, mom_, delta_, delta16_;
  std::vector<Work> works_;
};

}  // namespace sw
