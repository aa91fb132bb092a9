// Plan construction (internal to sharding/; step_plan.h's entry points use it): a symbolic walk
// of the schedule over each unit's state (sharded, gather in flight, unsharded), making the
// decisions the executor's components then act on (prefetch depth and max_live_units,
// reshard_after_forward, the tied unit kept from its first call to its last, accumulation
// modes, buckets, HYBRID's two-level reduction, checkpointing, the optimizer's prefetch of the
// next step) and writing each one down as an action.
//
// The walk (PlanBuilder, plan_builder.cpp) plans the parameter, compute, reduction and update
// actions. Each offload family plans its own actions at fixed points of the walk, with state of
// its own, as its executor component runs them:
//   ActivationIoPlan  plan_activation_io.*  evict_acts after a forward call, fetch_acts ahead of
//                                           its backward, the wait_acts that free or need them
//   TensorPlan        plan_tensor.*         tensor parallelism: each call's collectives after
//                                           it, replicated gradients summed before reductions
//   StateIoPlan       plan_state_io.*       NVMe state: the optimizer's pieces (read ahead,
//                                           written behind, carried across segments), deferred
//                                           updates, NVMe masters fetched ahead of their gathers,
//                                           gradients staged around their reductions
// The memory a plan starts from (persistent and reserved bytes) is plan_memory.cpp's.
// A new family is a part like these, called by the walk where its actions belong.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "sharding/plan_activation_io.h"
#include "sharding/plan_state_io.h"
#include "sharding/pipeline_schedule.h"
#include "sharding/plan_tensor.h"
#include "sharding/step_plan.h"

namespace sw {

class PlanBuilder {
 public:
  explicit PlanBuilder(const PlanInput& in);

  // Segments, appended in order.
  void micro_step(int micro, bool reduce, bool last);
  void eval();
  // Pipeline parallelism (in.pipelined()): every micro-batch's chunks in the schedule's order
  // (training), or one forward through this rank's chunks (eval).
  void pipeline(bool training);
  // Local SGD: the outer step of the units marked (a gather in flight, stale after it, is
  // waited for and freed first).
  void outer(const std::vector<bool>& units, double outer_bytes, OuterPhase phase);
  // flush: only the deferred units' updates (plan_flush); otherwise every update not deferred.
  void optimizer(bool flush = false);
  StepPlan take();
  // The units whose gather is in flight now (what the optimizer leaves for the next step).
  std::vector<bool> in_flight() const;

  // ---- For the families' parts ---------------------------------------------------------------
  const PlanInput& in() const { return in_; }
  StepPlan& plan() { return plan_; }
  int last_index() const { return static_cast<int>(plan_.actions.size()) - 1; }
  Action& add(ActionKind k, Queue q, int unit = -1, int pos = -1);
  // What checkpointing dropped of position p's Saved after its forward (Off: nothing, or
  // already rebuilt for its backward).
  CheckpointMode dropped(int p) const { return recompute_[size_t(micro_)][size_t(p)]; }
  const CallMemory* call_mem(int pos) const {
    return pos < static_cast<int>(in_.calls.size()) ? &in_.calls[size_t(pos)] : nullptr;
  }
  int64_t act_bytes() const { return int64_t{4} * in_.B * in_.T * in_.d_model; }
  // A unit about to be updated: a gather that read its master before (a prefetch carried into
  // the segment, or issued in it) is stale after the update, so it is waited for and freed.
  void drop_stale_gather(int u);

 private:
  enum class St : uint8_t { Sharded, InFlight, Unsharded };
  DType pdt() const { return in_.policy.mixed_precision.param_dtype; }
  DType rdt() const { return in_.policy.mixed_precision.reduce_dtype; }
  int64_t fbytes(int u) const { return in_.units[size_t(u)].padded * 4; }
  // release_grads: what unit u's step allocates and its update frees (a Whole unit's
  // gradients, a Sharded unit's reduced shard).
  int64_t released_bytes(int u) const {
    return in_.kind == UnitKind::Whole ? fbytes(u) : fbytes(u) / in_.S;
  }
  int64_t params_bytes(int u) const;
  int live() const;
  void issue(int u);
  void prefetch(int pos, int depth, int dir);
  void wait(int u);
  void free(int u);
  void ensure_grads(Action& a, int u);
  CheckpointMode checkpoint_mode(int p) const;
  // Positions [lo, hi) (the whole schedule, or a pipeline chunk's); `wait_all`: the end of the
  // backward completes every reduction.
  void forward(bool training, int lo, int hi);
  void backward(bool reduce, int lo, int hi, bool wait_all, bool defer = false);
  CheckpointMode& recompute(int p);
  // Pipeline: issue the receive op `op` needs (once); the chunk's positions.
  void pipe_recv(const PipeOp& op);
  int pipe_stage_last(int chunk) const;
  // wait_reduce for the oldest n reductions in flight: their completion (observed here) frees
  // the transient gradients they reduced.
  void wait_reductions(size_t n);
  void reduce_unit(int u);

  const PlanInput& in_;
  StepPlan plan_;
  std::vector<St> st_;
  std::vector<int> gather_at_;  // per unit: its gather in flight (-1: none)
  std::vector<bool> has_grads_;
  std::vector<std::vector<CheckpointMode>> recompute_;  // [micro][position]
  int lo_ = 0, hi_ = 0;
  int chunk_ = -1;  // pipeline: the chunk being planned  // the positions being walked (prefetch stays inside)
  // Pipeline: per (micro, chunk) and direction (0 acts, 1 grads), the receive issued (-1: none).
  std::vector<int> recv_at_[2];
  std::vector<int> pending_sends_, older_sends_;
  std::vector<int> ready_;  // NO_SHARD: per bucket, members whose backward is done
  struct Reduction {
    int at;          // its last action
    int64_t freed;   // the transient gradients its completion frees
    int unit;        // -1: a NO_SHARD bucket's
  };
  std::vector<Reduction> inflight_;  // reductions issued, not yet waited for
  // release_grads (releases_grads): per unit, its step's gradient storage is allocated (a
  // Whole unit's: has_grads_; a sharded unit's reduced shard: here).
  std::vector<bool> shard_grads_;
  int micro_ = 0;
  bool last_ = true;  // the micro-step being planned is the step's last
  ActivationIoPlan acts_io_;
  StateIoPlan state_io_;
  TensorPlan tensor_;
};

// The memory every plan of `in` starts from: persistent model state per tier, the NVMe files'
// bytes and staging, the step's reserved workspace (plan_memory.cpp).
void plan_memory(const PlanInput& in, StepPlan& plan);
// `plan` with, on a device, the host updater's staging: two offloaded updates' master and
// gradient copies at most (plan_memory.cpp).
StepPlan with_updater_staging(StepPlan plan, const PlanInput& in);

}  // namespace sw
