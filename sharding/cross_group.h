// The owner of local SGD / DiLoCo's outer step (sharding/step_plan.h outer_reduce, outer_update):
// replica groups train apart for a round of H inner steps (each with its own sharded inner
// optimizer, no gradient reduction across them); then per unit the pseudo-gradient, the round's
// start minus the replica's master now, is averaged over the replica groups (ctx.cross, the ranks
// holding the same shard in every replica), the outer optimizer (SGD with momentum, Nesterov:
// DiLoCo's; FedAvg is lr 1 without momentum) moves the round's start with it, and every
// replica's master becomes the result, the next round's start. Streaming (fragments > 1): the
// units in fragments, one fragment's outer step at a time in turn; with a sync delay the reduce
// is issued at the fragment's turn and its update lands inner steps later (the reduction crosses
// the link meanwhile), mixed with what the replica learnt in between (OuterArgs::alpha).
//
// State: per unit the round's start (`anchor`) and the outer momentum, fp32 shards beside the
// master (Mem::Optimizer); the pseudo-gradient of each reduce in flight; quantised pseudo-
// gradients: the error-feedback residuals of both stages of the quantised all-reduce.
#pragma once
#include <future>
#include <string>
#include <vector>

#include "core/alloc.h"
#include "sharding/comm/group.h"
#include "sharding/comm/p2p.h"
#include "sharding/component.h"
#include "sharding/model_context.h"
#include "sharding/policy.h"

namespace sw {

class CrossGroup final : public Component {
 public:
  CrossGroup(const ModelContext& ctx, UnitList& units);
  ~CrossGroup() override;
  const char* name() const override { return "cross_group"; }
  bool run(SegmentRun& s, int i) override;
  bool on() const { return ctx_.cross != nullptr; }
  // The round starts now: every unit's start := its master (after initialisation, a resume or
  // an import); the outer momentum is kept.
  void start_round();
  // Checkpoint access: named fp32 host buffers (unit u's round start "outer.u<u>.anchor" and
  // momentum "outer.u<u>.momentum"; a reduce in flight's pseudo-gradient "outer.u<u>.delta";
  // quantised: the residuals "outer.u<u>.qerr1|qerr2"). create: makes the round's buffers (and,
  // with `residuals`, the residuals, zeroed) if they do not exist yet, for a load to write into. A restored
  // in-flight delta is taken as reduced (its update waits for nothing).
  struct Named {
    std::string name;
    float* data;
    int64_t n;
  };
  std::vector<Named> state(bool create, bool residuals = false);
  float* restore_delta(int u);  // unit u's reduced pseudo-gradient, to load (now in flight)
  bool restored = false;  // set by a checkpoint load that held the round's state
  void quiesce() noexcept;

 private:
  void ensure();
  void ensure_residuals(size_t u);
  void reduce(SegmentRun& s, const Action& a);
  void update(SegmentRun& s, const Action& a);
  void wait_reduced(size_t u, const OuterArgs& o);
  const ModelContext& ctx_;
  UnitList& units_;
  std::vector<Buffer> anchor_, mom_, delta_, delta16_, qerr1_, qerr2_;
  std::vector<Work> works_;
  std::vector<std::shared_future<void>> qdone_;  // quantised reduces, chained in unit order
  std::shared_future<void> qlast_;
  std::vector<uint8_t> flight_;  // per unit: 1 = reduce issued, 2 = reduced (restored)
  PeerCommPtr qpeers_;           // quantised pseudo-gradients' transport (made at first use)
};

}  // namespace sw
