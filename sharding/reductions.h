// The owner of the gradient reductions (the plan's reduce queue): reduce_scatter (a unit's
// gradients over the shard group, averaged), all_reduce (HYBRID: the reduced block over the
// replicas, issued right behind its reduce-scatter to start once that completes; NO_SHARD: a
// bucket once its last member's backward is done), round_grads (one rank: the gradients rounded
// to reduce_dtype where N ranks would narrow them) and wait_reduce (the compute queue completes
// the listed reductions in issue order, accumulating the reduced gradients, which frees the
// transient ones: memory follows the plan exactly; the end of backward completes all).
//
// Its state: the reductions issued and not completed (the queue) and, NO_SHARD with replicas,
// the bucket buffer holding every unit's gradients (the plan's bucket ranges). Gradients whose
// shard is off the device (host or NVMe, OffloadedState) are accumulated there.
#pragma once
#include <array>
#include <deque>

#include "core/alloc.h"
#include "sharding/action_records.h"
#include "sharding/component.h"
#include "sharding/model_context.h"

namespace sw {

class OffloadedState;

// Compressed collectives (policy.quantized, sharding/policy.h CommQuantization): fills c.quant,
// c.quant_weights, c.qshard and c.qrep from the policy and the groups (S, R, shard, rep set),
// per mesh dimension: scope "replicate" quantises HYBRID's replica dimension only, otherwise
// the one data-parallel group; "all" both. Collective over the groups it makes transports for
// (PeerComms). Fails naming the key where the combination is not supported (a device, tensor
// or pipeline parallelism).
void setup_quantized(ModelContext& c);

class Reductions final : public Component {
 public:
  // Makes the bucket buffer (zeroed) where the plan has buckets.
  Reductions(const ModelContext& ctx, UnitList& units, ActionRecords& records,
             OffloadedState& state);
  ~Reductions() override { quiesce(); }
  const char* name() const override { return "reductions"; }
  bool run(SegmentRun& s, int i) override;

  // NO_SHARD with replicas: unit u's region of the bucket buffer (its gradients), else null.
  float* bucket_region(int u);
  // Completes reductions in issue order up to plan action `through` (-1: all).
  void complete(int through);
  // Reduces every gradient not reduced yet (reduce_once without a last micro-step, units outside
  // the schedule) and completes every reduction.
  void sync_grads();
  // Waits for every reduction in flight (errors swallowed) and forgets them: teardown, or a
  // step abandoned.
  void quiesce() noexcept;
  // Unit u's residual k (0: its reduced block's, 1: its reduced chunk's) of the quantised
  // replica all-reduce, or null when ctx.qrep is not set or (create false) not made yet;
  // create: made, zeroed (a checkpoint load's target).
  float* quant_residual(int u, int k, bool create);
  int64_t quant_residual_size(int u, int k) const;

 private:
  struct Pending {
    int action = -1;  // in the plan being run (-1: sync_grads', outside any plan)
    ActionKind kind = ActionKind::ReduceScatter;
    int unit = -1, bucket = -1;
    bool finishes = true;  // its completion finishes the unit's reduction (accumulates)
    int seq = -1;          // ActionRecord::issued (with a recorder)
    int64_t bytes = 0;
    double t_issue = 0;
    Work work;
  };
  void issue_bucket(int b, int action);
  // HYBRID's all-reduce of a unit's reduced block (r), behind its reduce-scatter: the newest
  // pending reduction. It starts once that has completed (Group::issue_all_reduce_after; the
  // host does not wait), so every rank issues both groups' collectives in plan order whatever
  // its timing, as NCCL requires of communicators that run at once.
  void issue_follow_up(FlatUnit& fu, Pending& r);
  void reduce_now(FlatUnit& fu);  // sync_grads' reductions, outside any plan
  void finish(const Pending& done);
  // Whether wait_reduce i ends the micro-step's backward (only io write-back follows it).
  static bool ends_backward(const StepPlan& plan, int i);

  const ModelContext& ctx_;
  UnitList& units_;
  ActionRecords& records_;
  OffloadedState& state_;
  Buffer bucket_buf_;
  std::vector<int64_t> bucket_at_;  // per unit: its region's offset in the bucket buffer, or -1
  // ctx.qrep: per unit, the residuals of its quantised replica all-reduce (Mem::Grads):
  // [0] its reduced block's (shard_size), [1] its reduced chunk's (quant_ar_chunk).
  std::vector<std::array<Buffer, 2>> qerr_;
  std::deque<Pending> pending_;
};

}  // namespace sw
