// Parameter and gradient access outside the step (sharded_model.h): export (for_each_param,
// for_each_grad), full copies (gather_full_params) and set_param. Each waits for what is in
// flight on the unit it touches and applies deferred updates first.
#include <cstring>
#include <vector>

#include "core/error.h"
#include "sharding/sharded_model_impl.h"

namespace sw {

// ---- Parameter access ------------------------------------------------------------------------

namespace {

// Collective: unit fu's master shards (or reduced gradient shards) of every rank gathered into a
// buffer of its padded floats on the device (Mem::Communication), the file's shard staged first
// for NVMe parameters.
Buffer gathered(ShardedModel::Impl& I, FlatUnit& fu, bool grads) {
  Buffer b(static_cast<size_t>(fu.layout().padded) * sizeof(float), Mem::Communication,
           I.ctx.device());
  if (fu.params_on_nvme()) I.state.stage_whole(fu, grads);
  if (grads)
    fu.gather_grads_into(b.f32());
  else
    fu.gather_params_into(b.f32());
  if (fu.params_on_nvme()) I.state.unstage_whole(fu, false);
  return b;
}

// fn per parameter of fu over `base` (its padded values): where the host can read them, `base`
// itself on the CPU, else a copy (after the compute stream's work on it).
void each_param(const Ops& ops, const FlatUnit& fu, const float* base,
                const std::function<void(const ParamSpec&, const float*)>& fn) {
  std::vector<float> host;
  if (!ops.device().is_cpu()) {
    host.resize(static_cast<size_t>(fu.layout().padded));
    copy_bytes(host.data(), Device::cpu(), base, ops.device(), host.size() * sizeof(float));
    base = host.data();
  }
  for (size_t s = 0; s < fu.layout().specs.size(); ++s)
    fn(fu.layout().specs[s], base + fu.layout().entries[s].offset);
}


// Tensor parallelism: fn per parameter of fu as a logical tensor. A split parameter's parts are
// all-gathered over the tensor group (every rank's part has the same shape) and put in place
// with each tensor rank's split (Impl::tensor_splits); replicated ones are this rank's own.
void each_logical_param(ShardedModel::Impl& I, const FlatUnit& fu, const float* base,
                        const std::function<void(const ParamSpec&, const float*)>& fn) {
  Group& tg = *I.ctx.tensor_host;  // (host buffers: the parts are copied from a device first)
  const int t = tg.size();
  std::vector<float> all, logical, host;
  if (!I.ctx.ops->device().is_cpu()) {
    host.resize(static_cast<size_t>(fu.layout().padded));
    copy_bytes(host.data(), Device::cpu(), base, I.ctx.ops->device(), host.size() * sizeof(float));
    base = host.data();
  }
  for (size_t s = 0; s < fu.layout().specs.size(); ++s) {
    const ParamSpec& sp = fu.layout().specs[s];
    const float* mine = base + fu.layout().entries[s].offset;
    if (!sp.split.split()) {
      fn(sp, mine);
      continue;
    }
    const int64_t n = numel(sp.shape);
    all.resize(static_cast<size_t>(n * t));
    tg.all_gather(mine, all.data(), n);
    logical.assign(static_cast<size_t>(numel(sp.split.logical)), 0.f);
    const std::vector<TensorSplit>& splits = I.tensor_splits(sp.name);
    for (int j = 0; j < t; ++j)
      for (int64_t i = 0; i < n; ++i)
        logical[size_t(splits[size_t(j)].logical_index(i, sp.shape))] = all[size_t(j * n + i)];
    ParamSpec ls = sp;
    ls.shape = sp.split.logical;
    ls.split = TensorSplit{};
    fn(ls, logical.data());
  }
}
}  // namespace

void ShardedModel::for_each_param(
    const std::function<void(const ParamSpec&, const float* data)>& fn) const {
  Impl& I = *impl_;
  I.flush_deferred(model_);
  if (I.summon_held && I.summon_rank0_only && rank() != 0)
    fail("sharded_model", "for_each_param on rank " + std::to_string(rank()) +
                              " while gather_full_params(rank0_only) holds the copy on rank 0");
  for (size_t u = 0; u < I.units.size(); ++u) {
    FlatUnit& fu = *I.units[u];
    const float* base;
    Buffer tmp;
    if (I.summon_held) {
      base = I.summoned[u].f32();
    } else if (fu.persistent() && !fu.split_master()) {
      fu.wait_unshard();
      base = fu.full();
    } else {
      tmp = gathered(I, fu, false);
      base = tmp.f32();
    }
    if (I.ctx.tensor_host)
      each_logical_param(I, fu, base, fn);
    else
      each_param(*I.ctx.ops, fu, base, fn);
  }
}

void ShardedModel::for_each_grad(
    const std::function<void(const ParamSpec&, const float* grad)>& fn) const {
  Impl& I = *impl_;
  I.flush_deferred(model_);
  I.reductions.sync_grads();
  for (auto& up : I.units) {
    FlatUnit& fu = *up;
    Buffer tmp;
    const float* base = fu.grad_shard();
    if (fu.kind() != FlatUnit::Kind::Whole) {
      tmp = gathered(I, fu, true);
      base = tmp.f32();
    }
    each_param(*I.ctx.ops, fu, base, fn);
  }
}

void ShardedModel::gather_full_params(bool rank0_only) {
  Impl& I = *impl_;
  I.flush_deferred(model_);
  release_full_params();
  I.summoned.resize(I.units.size());
  for (size_t u = 0; u < I.units.size(); ++u) {
    Buffer b = gathered(I, *I.units[u], false);
    if (!rank0_only || rank() == 0) I.summoned[u] = std::move(b);
  }
  I.summon_held = true;
  I.summon_rank0_only = rank0_only;
}

void ShardedModel::release_full_params() {
  impl_->summoned.clear();
  impl_->summon_held = false;
}

bool ShardedModel::holds_param(const std::string& name) const {
  const Impl& I = *impl_;
  auto it = I.by_name.find(name);
  if (it == I.by_name.end()) fail("sharded_model", "no parameter named '" + name + "'");
  const FlatUnit& fu = *I.units[static_cast<size_t>(it->second.first)];
  // Whole and FullReplicated units keep the full buffer on every rank (set_param's full copy).
  if (fu.kind() != FlatUnit::Kind::Sharded) return true;
  const FlatEntry& e = fu.layout().entries[static_cast<size_t>(it->second.second)];
  return !intersect(fu.shard_range(), {e.offset, e.offset + e.numel}).empty();
}

void ShardedModel::set_param(const std::string& name, const float* data, int64_t n) {
  Impl& I = *impl_;
  I.flush_deferred(model_);
  auto it = I.by_name.find(name);
  if (it == I.by_name.end()) fail("sharded_model", "no parameter named '" + name + "'");
  FlatUnit& fu = *I.units[static_cast<size_t>(it->second.first)];
  const size_t s = static_cast<size_t>(it->second.second);
  const FlatEntry& e = fu.layout().entries[s];
  // Tensor parallelism: the logical tensor is given; this rank keeps its part.
  std::vector<float> part;
  if (const ParamSpec& sp = fu.layout().specs[s]; sp.split.split()) {
    if (n != numel(sp.split.logical))
      fail("sharded_model", "parameter '" + name + "' has " +
                                std::to_string(numel(sp.split.logical)) + " elements " +
                                shape_str(sp.split.logical) + ", got " + std::to_string(n));
    part.resize(static_cast<size_t>(e.numel));
    for (int64_t i = 0; i < e.numel; ++i)
      part[size_t(i)] = data[sp.split.logical_index(i, sp.shape)];
    data = part.data();
    n = e.numel;
  }
  if (n != e.numel)
    fail("sharded_model", "parameter '" + name + "' has " + std::to_string(e.numel) + " elements " +
                              shape_str(fu.layout().specs[s].shape) + ", got " + std::to_string(n));
  release_full_params();
  Buffer up;  // the values on the device, for a non-CPU one
  const float* host_data = data;
  if (!I.ctx.ops->device().is_cpu()) {
    up = Buffer(static_cast<size_t>(n) * sizeof(float), Mem::Workspace, I.ctx.ops->device());
    copy_bytes(up.data(), up.device(), data, Device::cpu(), up.bytes());
    data = up.f32();
  }
  if (fu.persistent()) fu.wait_unshard();
  if (fu.kind() == FlatUnit::Kind::Sharded && fu.holds_gathered()) {  // a prefetch goes stale
    fu.wait_unshard();
    fu.reshard();
  }
  // The full copy, where this rank holds one (it contains the master slice for stage 1, or is
  // the rounded compute copy with a split master).
  if (fu.full() && fu.sharded_state() == ShardedState::Unsharded) {
    if (fu.split_master())
      fu.write_compute(e.offset, n, data);
    else
      I.ctx.ops->copy(fu.full() + e.offset, data, static_cast<size_t>(n));
  }
  if (fu.kind() == FlatUnit::Kind::Sharded || fu.split_master()) {
    const Range shard = fu.shard_range();
    const Range r = intersect(shard, {e.offset, e.offset + e.numel});
    if (!r.empty()) {
      if (fu.params_on_nvme()) I.state.stage_whole(fu, false);
      if (fu.master_device() == I.ctx.ops->device())
        I.ctx.ops->copy(fu.master() + (r.lo - shard.lo), data + (r.lo - e.offset),
                    static_cast<size_t>(r.hi - r.lo));
      else  // offloaded shards on the host: from the caller's host data
        std::memcpy(fu.master() + (r.lo - shard.lo), host_data + (r.lo - e.offset),
                    static_cast<size_t>(r.hi - r.lo) * sizeof(float));
      if (fu.params_on_nvme()) I.state.unstage_whole(fu, true);
    }
  }
}

}  // namespace sw

