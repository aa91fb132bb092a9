// The plans a ShardedModel runs, built from its PlanInput (sharding/step_plan.h) and kept: the
// optimizer segment and the deferred updates' flush (shape-independent, built once), and a
// micro-step's or an eval forward's per batch shape and starting state (which units' gathers
// are in flight, whether deferred updates are pending). Sampling asks for a new sequence length
// every token, so at most kMaxPlans are kept.
#pragma once
#include <map>
#include <tuple>
#include <vector>

#include "sharding/model_context.h"

namespace sw {

class PlanCache {
 public:
  explicit PlanCache(const ModelContext& ctx);

  // A pipeline segment's (kind Pipeline, micro_batches of B x T), a micro-step's plan (kind MicroStep: reduce, last, pending as plan_micro_step and
  // PlanInput::pending say) or an eval forward's (kind Eval) for this batch shape, starting from
  // the units whose gathers are in flight or held now. *built: whether it was made just now.
  const StepPlan& get(const Model& model, const UnitList& units, int B, int T, SegmentKind kind,
                      bool reduce, bool last, bool pending, bool* built, int micro_batches = 1);
  const StepPlan& optimizer() const { return opt_; }
  const StepPlan& flush() const { return flush_; }  // empty when no update is deferred

 private:
  static constexpr size_t kMaxPlans = 64;
  using Key = std::tuple<SegmentKind, bool, bool, bool, int, int, int, std::vector<bool>>;
  const ModelContext& ctx_;
  std::map<Key, StepPlan> plans_;
  StepPlan opt_, flush_;
};

}  // namespace sw
