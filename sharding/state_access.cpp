// Checkpoint access to a ShardedModel's flat state (sharded_model.h, "Checkpoint access"):
// which ranges a rank owns and holds, and copies in and out of them.
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/alloc.h"
#include "core/error.h"
#include "sharding/sharded_model_impl.h"

namespace sw {

namespace {

FlatRange clip_used(Range r, int64_t used) { return {std::min(r.lo, used), std::min(r.hi, used)}; }

}  // namespace

int ShardedModel::num_units() const { return static_cast<int>(impl_->units.size()); }

std::vector<ParamSpec> ShardedModel::logical_specs(int u) const {
  std::vector<ParamSpec> v = unit_layout(u).specs;
  for (ParamSpec& s : v)
    if (s.split.split()) {
      s.shape = s.split.logical;
      s.split = TensorSplit{};
    }
  return v;
}

const FlatLayout& ShardedModel::unit_layout(int u) const {
  SW_CHECK(u >= 0 && u < num_units(), "unit index out of range");
  return impl_->units[static_cast<size_t>(u)]->layout();
}

std::string ShardedModel::unit_name(int u) const {
  SW_CHECK(u >= 0 && u < num_units(), "unit index out of range");
  return impl_->units[static_cast<size_t>(u)]->unit()->name();
}

FlatRange ShardedModel::owned_range(int u) const {
  const Impl& I = *impl_;
  const FlatUnit& fu = *I.units[static_cast<size_t>(u)];
  const FlatRange s = clip_used(fu.shard_range(), fu.layout().used);
  // Replica q of R holding this shard writes the q-th of R even parts.
  const int64_t q = I.ctx.world->rank() / I.ctx.S, R = I.ctx.R, n = s.size();
  return {s.lo + n * q / R, s.lo + n * (q + 1) / R};
}

FlatRange ShardedModel::held_range(int u, StateKind k) const {
  const FlatUnit& fu = *impl_->units[static_cast<size_t>(u)];
  const int64_t used = fu.layout().used;
  if (fu.kind() == FlatUnit::Kind::Whole ||
      (fu.kind() == FlatUnit::Kind::FullReplicated && k == StateKind::Master))
    return {0, used};
  return clip_used(fu.shard_range(), used);
}

namespace {

// Pointer to flat index `lo` of kind k's storage (index-shifted so [held] is addressable).
float* state_base(FlatUnit& fu, ShardedModel::StateKind k) {
  const Range sh = fu.shard_range();
  switch (k) {
    case ShardedModel::StateKind::Master:
      // Whole and stage 1 keep the full buffer (the master is a view into it), unless mixed
      // precision split the fp32 master off (the full buffer is then the rounded compute copy).
      return fu.kind() == FlatUnit::Kind::Sharded || fu.split_master() ? fu.master() - sh.lo
                                                                       : fu.full();
    case ShardedModel::StateKind::ExpAvg:
      return fu.adam_m() - (fu.kind() == FlatUnit::Kind::Whole ? 0 : sh.lo);
    case ShardedModel::StateKind::ExpAvgSq:
      return fu.adam_v() - (fu.kind() == FlatUnit::Kind::Whole ? 0 : sh.lo);
  }
  return nullptr;
}

// Where kind k's storage of the unit is (state_base's buffer): the device, or the host for what
// offload keeps there while the model is on a device (moments; master shards).
Device state_device(const FlatUnit& fu, ShardedModel::StateKind k, Device dev) {
  switch (k) {
    case ShardedModel::StateKind::Master:
      return fu.kind() == FlatUnit::Kind::Sharded || fu.split_master() ? fu.master_device() : dev;
    case ShardedModel::StateKind::ExpAvg:
    case ShardedModel::StateKind::ExpAvgSq:
      return fu.moments_on_host() ? Device::cpu() : dev;
  }
  return dev;
}

}  // namespace


bool ShardedModel::state_on_device() const { return impl_->ctx.on_device(); }

// Where floats r of kind k are, after the waits a reader needs: host memory on the CPU (in
// place, or an NVMe tier's read buffer), device memory otherwise (not to be dereferenced by
// the host: read_state copies it out with copy_bytes).
const float* ShardedModel::state_source(int u, StateKind k, FlatRange r) const {
  Impl& I = *impl_;
  I.flush_deferred(model_);
  FlatUnit& fu = *I.units[static_cast<size_t>(u)];
  const FlatRange h = held_range(u, k);
  SW_CHECK(r.lo >= h.lo && r.hi <= h.hi, "state_view outside the held range");
  // NVMe state: read from the file into a reused buffer, valid until the next such read.
  const int64_t s0 = fu.shard_range().lo;
  if (fu.moments_on_nvme() && k != StateKind::Master)
    return I.state.read_moments(fu, k == StateKind::ExpAvgSq, r.lo - s0, r.hi - s0);
  if (fu.params_on_nvme() && k == StateKind::Master)
    return I.state.read_master(u, r.lo - s0, r.hi - s0);
  // Stage 1: the slices of other ranks arrive with the regather issued after the update.
  if (!r.empty() && fu.kind() == FlatUnit::Kind::FullReplicated && k == StateKind::Master)
    fu.wait_unshard();
  // A split fp32 master exists for this rank's shard only (what owned_range asks for).
  if (!r.empty() && fu.split_master() && k == StateKind::Master) {
    const Range sh = fu.shard_range();
    SW_CHECK(r.lo >= sh.lo && r.hi <= sh.hi, "state_view: the fp32 master outside the shard");
  }
  return state_base(fu, k) + r.lo;
}

const float* ShardedModel::state_view(int u, StateKind k, FlatRange r) const {
  if (state_on_device())
    fail("sharded_model", "state_view: the state is in " + impl_->ctx.device().str() +
                              " memory, which the host cannot read in place; copy it out with "
                              "read_state");
  return state_source(u, k, r);
}

void ShardedModel::read_state(int u, StateKind k, FlatRange r, float* dst) const {
  if (r.empty()) return;
  const float* src = state_source(u, k, r);
  // On the CPU a memcpy; from a device, one copy ordered after the device's queued work (the
  // optimizer's last update of this state).
  const FlatUnit& fu = *impl_->units[static_cast<size_t>(u)];
  const bool master = k == StateKind::Master;
  const Device where = (master && fu.params_on_nvme()) || (!master && fu.moments_on_nvme())
                           ? Device::cpu()  // staged from the file through host memory
                           : state_device(fu, k, impl_->ctx.device());
  copy_bytes(dst, Device::cpu(), src, where, static_cast<size_t>(r.size()) * sizeof(float));
}

void ShardedModel::write_state(int u, StateKind k, FlatRange r, const float* src) {
  Impl& I = *impl_;
  I.flush_deferred(model_);
  FlatUnit& fu = *I.units[static_cast<size_t>(u)];
  const FlatRange h = held_range(u, k);
  SW_CHECK(r.lo >= h.lo && r.hi <= h.hi, "write_state outside the held range");
  if (r.empty()) return;
  if (k == StateKind::Master) {
    release_full_params();
    if (fu.persistent()) fu.wait_unshard();  // a regather in flight would overwrite the data
    if (fu.kind() == FlatUnit::Kind::Sharded && fu.holds_gathered()) {  // stale after this
      fu.wait_unshard();
      fu.reshard();
    }
  }
  const int64_t s0 = fu.shard_range().lo;
  if (fu.params_on_nvme() && k == StateKind::Master)
    return I.state.write_master(u, r.lo - s0, r.hi - s0, src);
  if (fu.moments_on_nvme() && k != StateKind::Master)
    return I.state.write_moments(fu, k == StateKind::ExpAvgSq, r.lo - s0, r.hi - s0, src);
  // Host floats into the state: a memcpy on the CPU, an upload (copy_bytes, complete on return,
  // ordered after the device's queued work) into device memory.
  const Device dev = I.ctx.device();
  auto put_on = [&](Device d, float* dst, const float* from, int64_t n) {
    copy_bytes(dst, d, from, Device::cpu(), static_cast<size_t>(n) * sizeof(float));
  };
  auto put = [&](float* dst, const float* from, int64_t n) { put_on(dev, dst, from, n); };
  if (k == StateKind::Master && fu.split_master()) {
    // Mixed precision with a persistent full buffer: the fp32 master takes the part inside
    // this rank's shard, the compute copy the rounding of all of it (an Op: where it lives).
    const Range sh = fu.shard_range();
    const Range in = intersect({r.lo, r.hi}, sh);
    if (!in.empty())
      put_on(fu.master_device(), fu.master() + (in.lo - sh.lo), src + (in.lo - r.lo),
             in.hi - in.lo);
    if (dev.is_cpu()) {
      fu.write_compute(r.lo, r.size(), src);
    } else {  // uploaded first: the fp32 buffer may be compact (FlatUnit::f32_floats)
      Buffer up(static_cast<size_t>(r.size()) * sizeof(float), Mem::Workspace, dev);
      put(up.f32(), src, r.size());
      fu.write_compute(r.lo, r.size(), up.f32());
    }
    return;
  }
  put_on(state_device(fu, k, dev), state_base(fu, k) + r.lo, src, r.size());
}

}  // namespace sw
