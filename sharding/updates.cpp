#include "sharding/updates.h"

#include <algorithm>
#include <cmath>

#include "core/alloc.h"
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
  // release_grads: freed as soon as the update has read them (the plan's OptimizerUpdate
  // frees them; a later zero_grads finds nothing to do).
  if (hi == fu.shard_size() && fu.releases_grads()) fu.zero_grads();
  return true;
}

void Updates::zero_grads() {
  for (auto& fu : units_)
    if (deferred_ && defers_[size_t(fu->index())])
      zero_after_[size_t(fu->index())] = true;
    else
      fu->zero_grads();
}

// The optimizer on floats [lo, hi) of this rank's slice (the whole slice unless NVMe streams it in
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
  const OptimizerParams& p = a.adam;
  const Range shard = fu.shard_range();
  const Range part{shard.lo + lo, shard.lo + hi};
  float* master = fu.master() + lo;
  const bool adamw = p.type == OptimizerType::AdamW;
  // A one-rank unit keeping its parameters 16-bit, its master beside them on the device: the
  // update writes the compute copies as it goes (Ops::adamw_copies; the alignment gaps keep the
  // zeros finish_init wrote), so no regather reads the master again; it also reads gradients
  // whose rounding to reduce_dtype is pending rounded (FlatUnit::round_grads). The other
  // optimizers read them rounded (grad_shard) and re-round the copy after (issue_regather).
  uint16_t* p16 = adamw && fu.kind() == FlatUnit::Kind::Whole && fu.split_master() &&
                          fu.master_device() == ops.device()
                      ? fu.full16()
                      : nullptr;
  DType grad_dt = DType::F32;
  float* grad = (p16 ? const_cast<float*>(fu.grad_shard_rounding(&grad_dt)) : fu.grad_shard()) + lo;
  for (size_t s = 0; s < fu.layout().specs.size(); ++s) {
    const FlatEntry& e = fu.layout().entries[s];
    const Range r = intersect(part, {e.offset, e.offset + e.numel});
    if (r.empty()) continue;
    const size_t off = static_cast<size_t>(r.lo - shard.lo);  // into the shard
    const size_t poff = static_cast<size_t>(r.lo - part.lo);  // into this part
    const bool decays = fu.layout().specs[s].weight_decay;
    const float wd = decays ? p.weight_decay : 0.f;
    const size_t n = static_cast<size_t>(r.hi - r.lo);
    switch (p.type) {
      case OptimizerType::SGD:
        ops.sgd(master + poff, grad + poff, fu.adam_m() + off, n, a.lr, p.momentum, p.dampening,
                p.nesterov, wd, 1.f, a.step, a.grad_mult);
        continue;
      case OptimizerType::LARS:  // (tensors without weight decay: plain SGD, coeff 1)
        ops.sgd(master + poff, grad + poff, fu.adam_m() + off, n, a.lr, p.momentum, p.dampening,
                p.nesterov, wd, a.coeff[size_t(fu.index())][s], a.step, a.grad_mult);
        continue;
      case OptimizerType::Lamb:  // (grad holds u: prepare)
        ops.add_scaled(master + poff, -a.coeff[size_t(fu.index())][s], grad + poff, n);
        continue;
      case OptimizerType::AdamW:
        break;
    }
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

namespace sw {

// Per unit and spec: the sums of squares of the weight (w2) and of the gradient (LARS) or
// Lamb's update (x2) over this rank's slice of the tensor; the groups' sums then give each
// tensor's norms. Lamb's first half runs here (moments, u over the gradient shard); with the
// moments in host memory and the master or gradient on the device, on host copies, u going
// back up into the gradient shard for the host update to read.
void Updates::prepare(UpdateArgs& a) {
  const OptimizerParams& p = a.adam;
  if (!p.per_tensor()) return;
  const bool lamb = p.type == OptimizerType::Lamb;
  const Ops& ops = *ctx_.ops;
  const Ops& cpu_ops = ops_for(Device::cpu());
  std::vector<double> sums;  // (w2, x2) per (unit, spec), in unit and spec order
  std::vector<bool> replicated;  // per (unit, spec): a tensor every tensor rank holds whole
  for (auto& up : units_) {
    FlatUnit& fu = *up;
    if (fu.moments_on_nvme() || fu.params_on_nvme())
      fail("optimizer", std::string("optimizer.type: ") + optimizer_type_name(p.type) +
                            " with NVMe offload (offload_optimizer / offload_param nvme) is not "
                            "implemented; use cpu or none");
    fu.settle();
    const Range shard = fu.shard_range();
    const int64_t Sh = fu.shard_size();
    const bool host = fu.moments_on_host();
    // Where this pass reads: the master and gradient shards as they are, or host copies.
    float* master = fu.master();
    float* grad = fu.grad_shard();
    std::vector<float> hm, hg;
    const bool copy_m = host && lamb && !fu.master_device().is_cpu();
    const bool copy_g = host && lamb && !fu.grad_device().is_cpu();
    if (copy_m) {
      hm.resize(size_t(Sh));
      copy_bytes(hm.data(), Device::cpu(), master, fu.master_device(), hm.size() * sizeof(float));
    }
    if (copy_g) {
      hg.resize(size_t(Sh));
      copy_bytes(hg.data(), Device::cpu(), grad, fu.grad_device(), hg.size() * sizeof(float));
    }
    const float* rm = copy_m ? hm.data() : master;
    float* rg = copy_g ? hg.data() : grad;
    const Ops& o = !host ? ops : lamb ? cpu_ops : fu.ops_on(fu.master_device());
    const Ops& og = !host ? ops : lamb ? cpu_ops : fu.ops_on(fu.grad_device());
    const auto& runs = fu.layout().replicated_runs();
    for (size_t s = 0; s < fu.layout().specs.size(); ++s) {
      const FlatEntry& e = fu.layout().entries[s];
      bool rep = false;
      for (const auto& run : runs) rep = rep || (run.first <= e.offset && e.offset + e.numel <= run.second);
      replicated.push_back(rep);
      const Range r = intersect(shard, {e.offset, e.offset + e.numel});
      double w2 = 0, x2 = 0;
      if (!r.empty()) {
        const size_t off = static_cast<size_t>(r.lo - shard.lo), n = static_cast<size_t>(r.hi - r.lo);
        const bool decays = fu.layout().specs[s].weight_decay;
        if (lamb) {
          o.lamb_prepare(rm + off, rg + off, fu.adam_m() + off, fu.adam_v() + off, n, p.beta1,
                         p.beta2, p.eps, decays ? p.weight_decay : 0.f, a.grad_mult);
          w2 = o.sum_squares(rm + off, n);
          x2 = o.sum_squares(rg + off, n);
        } else if (decays) {  // (LARS leaves the others out)
          w2 = o.sum_squares(rm + off, n);
          x2 = og.sum_squares(rg + off, n) * double(a.grad_mult) * double(a.grad_mult);
        }
      }
      sums.push_back(w2);
      sums.push_back(x2);
    }
    if (copy_g) copy_bytes(grad, fu.grad_device(), hg.data(), Device::cpu(), hg.size() * sizeof(float));
  }
  // Each tensor's sums: over the shard group, then over the tensor group (a replicated tensor
  // counting on tensor rank 0 only), each added in rank order.
  auto over = [&](Group& g) {
    if (g.size() == 1) return;
    std::vector<double> all(sums.size() * size_t(g.size()));
    g.all_gather(sums.data(), all.data(), int64_t(sums.size() * 2), DType::F32);
    for (size_t i = 0; i < sums.size(); ++i) {
      double t = 0;
      for (int k = 0; k < g.size(); ++k) t += all[size_t(k) * sums.size() + i];
      sums[i] = t;
    }
  };
  if (!sums.empty()) over(*ctx_.shard_host);
  if (ctx_.tensor_host && !sums.empty()) {
    if (ctx_.tensor_host->rank() != 0)
      for (size_t i = 0; i < replicated.size(); ++i)
        if (replicated[i]) sums[2 * i] = sums[2 * i + 1] = 0;
    over(*ctx_.tensor_host);
  }
  double step_size = a.lr;
  if (lamb && p.bias_correction)
    step_size *= std::sqrt(1.0 - std::pow(double(p.beta2), a.step)) /
                 (1.0 - std::pow(double(p.beta1), a.step));
  a.coeff.assign(units_.size(), {});
  size_t i = 0;
  for (auto& up : units_) {
    const FlatUnit& fu = *up;
    auto& c = a.coeff[size_t(fu.index())];
    for (size_t s = 0; s < fu.layout().specs.size(); ++s, ++i) {
      const double w = std::sqrt(sums[2 * i]), x = std::sqrt(sums[2 * i + 1]);
      if (lamb) {
        const double r = w > 0 && x > 0 ? std::clamp(w / x, double(p.min_coeff), double(p.max_coeff)) : 1.0;
        c.push_back(static_cast<float>(step_size * r));
      } else {
        const double wd = fu.layout().specs[s].weight_decay ? double(p.weight_decay) : 0.0;
        c.push_back(w > 0 && x > 0 ? static_cast<float>(double(p.trust_coefficient) * w /
                                                        (x + wd * w + double(p.eps)))
                                   : 1.f);
      }
    }
  }
}

}  // namespace sw
