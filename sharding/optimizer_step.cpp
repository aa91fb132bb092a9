// The optimizer side of a ShardedModel's public calls: the global gradient norm, zeroing, and
// the optimizer segment of the step plan (AdamW, SGD, LARS or Lamb per unit on the fp32 master
// shard: the Updates component, after its prepare for LARS and Lamb; stage 1 regathers the updated slices; sharded strategies prefetch the next
// forward's first units while later updates run).
#include <cmath>
#include <vector>

#include "core/error.h"
#include "sharding/sharded_model_impl.h"

namespace sw {

double ShardedModel::grad_norm() const {
  Impl& I = *impl_;
  I.flush_deferred(model_);  // (zero_grads left those units' gradients for their update)
  I.reductions.sync_grads();
  // Sum of squares of this rank's reduced gradient shard (alignment gaps and padding are never
  // written, so they stay zero), summed over the shard group; replicas hold equal shards.
  // Per unit, then added in unit order: the device's shards in one call whose sums stay on the
  // device and come back with the unread micro-steps' losses (LossSlots::read_with: the step's
  // one host synchronisation on a GPU), shards on the host with the CPU's Ops.
  // One-rank units whose gradients are still to be rounded to reduce_dtype (FlatUnit::
  // round_grads) are summed rounded as they are read, after the others.
  const Ops& ops = *I.ctx.ops;
  const size_t U = I.units.size();
  std::vector<double> per(U, 0.0);
  std::vector<const float*> xs, xr;
  std::vector<size_t> ns, nr, at, atr;
  DType rdt = DType::F32;
  // Tensor parallelism: replicated parameters (equal on every tensor rank once reduced) count
  // on tensor rank 0 only, so a rank other than 0 sums its shard's split parameters alone.
  const bool skip_rep = I.ctx.tensor && I.ctx.tensor->rank() != 0;
  for (size_t u = 0; u < U; ++u) {
    const FlatUnit& fu = *I.units[u];
    if (fu.grads_released()) continue;  // (zero: not made again to be summed)
    if (skip_rep && !fu.layout().replicated_runs().empty()) {
      SW_CHECK(!fu.params_on_nvme(), "tensor parallelism with NVMe parameters");
      const bool off = fu.grad_device() != ops.device();  // (host shards: summed there)
      DType r = DType::F32;
      const float* g = off ? fu.grad_shard() : fu.grad_shard_rounding(&r);
      const bool round = r != DType::F32;
      if (round) rdt = r;
      const Range sh = fu.shard_range();
      int64_t at_lo = sh.lo;  // the pieces of the shard outside every replicated run
      auto piece = [&](int64_t lo, int64_t hi) {
        if (hi <= lo) return;
        if (off) {
          per[u] += fu.ops_on(fu.grad_device()).sum_squares(g + (lo - sh.lo),
                                                            static_cast<size_t>(hi - lo));
          return;
        }
        (round ? xr : xs).push_back(g + (lo - sh.lo));
        (round ? nr : ns).push_back(static_cast<size_t>(hi - lo));
        (round ? atr : at).push_back(u);
      };
      for (const auto& run : fu.layout().replicated_runs()) {
        piece(at_lo, std::min(run.first, sh.hi));
        at_lo = std::max(at_lo, std::min(run.second, sh.hi));
      }
      piece(at_lo, sh.hi);
      continue;
    }
    if (fu.params_on_nvme()) {  // summed when its last reduction was accumulated
      per[u] = fu.grads_zero() ? 0.0 : I.state.grad_sumsq(fu.index());
    } else if (fu.grad_device() != ops.device()) {
      per[u] = fu.ops_on(fu.grad_device()).sum_squares(fu.grad_shard(),
                                                       static_cast<size_t>(fu.shard_size()));
    } else {
      DType r = DType::F32;
      const float* g = fu.grad_shard_rounding(&r);
      const bool round = r != DType::F32;
      if (round) rdt = r;  // (one reduce_dtype for the model)
      (round ? xr : xs).push_back(g);
      (round ? nr : ns).push_back(static_cast<size_t>(fu.shard_size()));
      (round ? atr : at).push_back(u);
    }
  }
  const int k0 = static_cast<int>(xs.size()), k = k0 + static_cast<int>(xr.size());
  double* sums = I.losses.norm_sums();
  ops.sum_squares_into(xs.data(), ns.data(), k0, sums);
  if (!xr.empty()) ops.sum_squares_rounded_into(rdt, xr.data(), nr.data(), k - k0, sums + k0);
  at.insert(at.end(), atr.begin(), atr.end());
  const std::vector<double> got = I.losses.read_with(k);
  for (size_t i = 0; i < at.size(); ++i) per[at[i]] += got[i];
  // Pipeline parallelism: a unit two pipeline ranks hold (summed gradients, equal on both)
  // counts on the lower one only; then the stages' sums are added.
  const StageView& st = model_.stage;
  for (size_t k = 0; k < st.shared.size(); ++k)
    if (st.shared_peer[k] < st.rank) per[size_t(st.shared[k])] = 0;
  double ss = 0;
  for (double v : per) ss += v;
  ss = sum_over_ranks(*I.ctx.shard_host, ss);
  if (I.ctx.tensor_host) ss = sum_over_ranks(*I.ctx.tensor_host, ss);
  if (I.ctx.pipe) ss = sum_over_ranks(*I.ctx.pipe, ss);
  return std::sqrt(ss);
}

void ShardedModel::zero_grads() {
  Impl& I = *impl_;
  I.reductions.complete(-1);
  I.updates.zero_grads();  // (a deferred update's gradients: right after it)
}

const char* optimizer_type_name(OptimizerType t) {
  switch (t) {
    case OptimizerType::SGD: return "SGD";
    case OptimizerType::LARS: return "LARS";
    case OptimizerType::Lamb: return "Lamb";
    case OptimizerType::AdamW: break;
  }
  return "AdamW";
}

OptimizerType optimizer_type_from_name(const std::string& s) {
  if (s == "SGD") return OptimizerType::SGD;
  if (s == "LARS") return OptimizerType::LARS;
  if (s == "Lamb") return OptimizerType::Lamb;
  SW_CHECK(s == "AdamW" || s == "Adam", "unknown optimizer type " + s);
  return OptimizerType::AdamW;
}

void ShardedModel::optimizer_step(const OptimizerParams& p, float lr, float grad_mult, int step) {
  SW_CHECK(step >= 1, "optimizer steps count from 1");
  Impl& I = *impl_;
  I.flush_deferred(model_);  // two steps without a micro-step between them
  I.reductions.sync_grads();
  UpdateArgs update{p, lr, grad_mult, step, {}};
  I.updates.prepare(update);  // (LARS and Lamb: each tensor's norms)
  RunArgs args;
  Batch none;
  args.batch = &none;
  args.update = &update;
  I.exec.run(model_, I.plans.optimizer(), args);
  // The deferred units' updates wait for the next micro-step's forward (or a flush).
  if (!I.plans.flush().actions.empty()) I.updates.defer(update);
}

int ShardedModel::host_updates_in_flight() const {
  int n = 0;
  for (const auto& fu : impl_->units) n += fu->update_pending() ? 1 : 0;
  return n;
}

double ShardedModel::host_update_seconds() const { return impl_->state.host().seconds(); }

void ShardedModel::hold_host_updates(bool on) { impl_->state.host().hold(on); }

}  // namespace sw
