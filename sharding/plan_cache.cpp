#include "sharding/plan_cache.h"

#include "sharding/unit_state.h"

namespace sw {

PlanCache::PlanCache(const ModelContext& ctx)
    : ctx_(ctx), opt_(plan_optimizer(ctx.plan_in)), flush_(plan_flush(ctx.plan_in)) {}

const StepPlan& PlanCache::get(const Model& model, const UnitList& units, int B, int T,
                               SegmentKind kind, bool reduce, bool last, bool pending,
                               bool* built, int micro_batches) {
  std::vector<bool> carried(units.size());
  for (size_t u = 0; u < units.size(); ++u)
    carried[u] = units[u]->gather_in_flight() || units[u]->holds_gathered();
  Key key{kind, reduce, last, pending, B, T, micro_batches, carried};
  *built = false;
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  if (plans_.size() >= kMaxPlans) plans_.clear();
  PlanInput in = ctx_.plan_in;
  in.B = B, in.T = T;
  declare_calls(in, model);
  in.carried = std::move(carried);
  in.pending = pending;
  in.accum = micro_batches;
  StepPlan p = kind == SegmentKind::Eval       ? plan_eval(in)
               : kind == SegmentKind::Pipeline ? plan_pipeline(in)
                                               : plan_micro_step(in, 0, reduce, last);
  *built = true;
  return plans_.emplace(std::move(key), std::move(p)).first->second;
}

}  // namespace sw
