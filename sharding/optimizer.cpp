// The optimizer side of a step: the global gradient norm, zeroing, and the optimizer segment of
// the step plan (AdamW per unit on the fp32 master shard; stage 1 regathers the updated slices;
// sharded strategies prefetch the next forward's first units while later updates run).
#include <cmath>

#include "core/error.h"
#include "sharding/sharded_model_impl.h"

namespace sw {

double ShardedModel::grad_norm() const {
  Impl& I = *impl_;
  I.sync_grads();
  // Sum of squares of this rank's reduced gradient shard (alignment gaps and padding are never
  // written, so they stay zero), summed over the shard group; replicas hold equal shards.
  double ss = 0;
  for (const auto& fu : I.units)
    ss += I.ops->sum_squares(fu->grad_shard(), static_cast<size_t>(fu->shard_size()));
  return std::sqrt(sum_over_ranks(*I.shard, ss));
}

void ShardedModel::zero_grads() {
  Impl& I = *impl_;
  I.complete_reductions(-1);
  for (auto& fu : I.units) fu->zero_grads();
}

void ShardedModel::optimizer_step(const AdamWParams& p, float lr, float grad_mult, int step) {
  SW_CHECK(step >= 1, "AdamW steps count from 1");
  Impl& I = *impl_;
  I.sync_grads();
  ExecState st;
  Batch none;
  st.batch = &none;
  st.adam = &p;
  st.lr = lr;
  st.grad_mult = grad_mult;
  st.step = step;
  I.run(model_, I.opt_plan, st);
}

void ShardedModel::Impl::update_unit(FlatUnit& fu, const ExecState& st) {
  // Stage 1: a previous regather must be complete (it reads this rank's slice). Sharded: a
  // gather prefetched after a previous update reads the master and is stale after this one.
  if (fu.kind() == FlatUnit::Kind::FullReplicated) fu.wait_unshard();
  if (fu.kind() == FlatUnit::Kind::Sharded && fu.holds_gathered()) {
    fu.wait_unshard();
    fu.reshard();
  }
  const AdamWParams& p = *st.adam;
  const Range shard = fu.shard_range();
  for (size_t s = 0; s < fu.layout().specs.size(); ++s) {
    const FlatEntry& e = fu.layout().entries[s];
    const Range r = intersect(shard, {e.offset, e.offset + e.numel});
    if (r.empty()) continue;
    const size_t off = static_cast<size_t>(r.lo - shard.lo);
    const float wd = fu.layout().specs[s].weight_decay ? p.weight_decay : 0.f;
    ops->adamw(fu.master() + off, fu.grad_shard() + off, fu.adam_m() + off, fu.adam_v() + off,
               static_cast<size_t>(r.hi - r.lo), st.lr, p.beta1, p.beta2, p.eps, wd, st.step,
               st.grad_mult);
  }
  // A split fp32 master with one rank re-rounds the compute copy (no communication); stage 1's
  // all-gather of the updated slices is the plan's Regather action.
  if (fu.kind() == FlatUnit::Kind::Whole) fu.issue_regather();
}

}  // namespace sw
