#include "sharding/updates.h"

#include "core/error.h"
#include "sharding/offloaded_state.h"
#include "sharding/unit_state.h"

namespace sw {

Updates::Updates(const ModelContext& ctx, UnitList& units, OffloadedState& state)
    : ctx_(ctx), units_(units), state_(state) {
  for (size_t u = 0; u < ctx.plan_in.units.size(); ++u)
    defers_.push_back(unit_defers(ctx.plan_in, static_cast<int>(u)));
  zero_after_.assign(ctx.plan_in.units.size(), false);
}

bool Updates::run(SegmentRun& s, int i) {
  const Action& a = s.action(i);
  SW_CHECK(a.kind == ActionKind::OptimizerUpdate && s.args.update,
           std::string("optimizer updates: cannot run ") + action_kind_name(a.kind));
  FlatUnit& fu = *units_[static_cast<size_t>(a.unit)];
  const int64_t hi = a.hi < 0 ? fu.shard_size() : a.hi;
  update(fu, *s.args.update, a.lo, hi);
  // A deferred update's gradients, kept past zero_grads for it: zeroed after its last piece.
  if (hi == fu.shard_size() && zero_after_[size_t(a.unit)]) {
    fu.zero_grads();
    zero_after_[size_t(a.unit)] = false;
  }
  return true;
}

void Updates::zero_grads() {
  for (auto& fu : units_)
    if (deferred_ && defers_[size_t(fu->index())])
      zero_after_[size_t(fu->index())] = true;
    else
      fu->zero_grads();
}

// AdamW on floats [lo, hi) of this rank's slice (the whole slice unless NVMe streams it in
// pieces); the unit's once-per-update work comes with the piece that ends the slice.
void Updates::update(FlatUnit& fu, const UpdateArgs& a, int64_t lo, int64_t hi) {
  // Stage 1: a previous regather must be complete (it reads this rank's slice). Sharded: a
  // gather prefetched after a previous update reads the master and is stale after this one.
  if (fu.kind() == FlatUnit::Kind::FullReplicated) fu.wait_unshard();
  if (fu.kind() == FlatUnit::Kind::Sharded && fu.holds_gathered()) {
    fu.wait_unshard();
    fu.reshard();
  }
  const Ops& ops = *ctx_.ops;
  if (fu.moments_on_host()) {
    state_.update_on_host(fu, a, lo, hi);
    return;
  }
  if (fu.moments_on_nvme() && !ops.device().is_cpu()) {
    // Moments on NVMe with a device: the piece staged on the host is updated there like
    // offload_optimizer cpu, and waited for here, since its evict writes the staging next.
    state_.update_on_host(fu, a, lo, hi);
    fu.settle();
    return;
  }
  const AdamWParams& p = a.adam;
  const Range shard = fu.shard_range();
  const Range part{shard.lo + lo, shard.lo + hi};
  float* master = fu.master() + lo;
  // A one-rank unit keeping its parameters 16-bit, its master beside them on the device: the
  // update writes the compute copies as it goes (Ops::adamw_copies; the alignment gaps keep the
  // zeros finish_init wrote), so no regather reads the master again; it also reads gradients
  // whose rounding to reduce_dtype is pending rounded (FlatUnit::round_grads).
  uint16_t* p16 = fu.kind() == FlatUnit::Kind::Whole && fu.split_master() &&
                          fu.master_device() == ops.device()
                      ? fu.full16()
                      : nullptr;
  DType grad_dt = DType::F32;
  const float* grad = (p16 ? fu.grad_shard_rounding(&grad_dt) : fu.grad_shard()) + lo;
  for (size_t s = 0; s < fu.layout().specs.size(); ++s) {
    const FlatEntry& e = fu.layout().entries[s];
    const Range r = intersect(part, {e.offset, e.offset + e.numel});
    if (r.empty()) continue;
    const size_t off = static_cast<size_t>(r.lo - shard.lo);  // into the shard
    const size_t poff = static_cast<size_t>(r.lo - part.lo);  // into this part
    const float wd = fu.layout().specs[s].weight_decay ? p.weight_decay : 0.f;
    const size_t n = static_cast<size_t>(r.hi - r.lo);
    if (p16) {
      const size_t in = static_cast<size_t>(r.lo - e.offset);  // into the parameter
      float* c32 = fu.params()[s] ? fu.params()[s] + in : nullptr;  // (none: a product weight)
      ops.adamw_copies(master + poff, grad + poff, fu.adam_m() + off, fu.adam_v() + off, n, a.lr,
                       p.beta1, p.beta2, p.eps, wd, a.step, a.grad_mult, fu.param_dtype(), c32,
                       p16 + r.lo, grad_dt);
    } else {
      ops.adamw(master + poff, grad + poff, fu.adam_m() + off, fu.adam_v() + off, n, a.lr,
                p.beta1, p.beta2, p.eps, wd, a.step, a.grad_mult);
    }
  }
  // A split fp32 master with one rank re-rounds the compute copy (no communication); stage 1's
  // all-gather of the updated slices is the plan's regather action.
  if (fu.kind() == FlatUnit::Kind::Whole && hi == fu.shard_size() && !p16) fu.issue_regather();
}

}  // namespace sw
