#include "sharding/offloaded_state.h"

#include <algorithm>

#include "core/error.h"
#include "sharding/unit_state.h"
#include "sharding/updates.h"

namespace sw {

OffloadedState::OffloadedState(const ModelContext& ctx, UnitList& units, ActionRecords& records)
    : ctx_(ctx), units_(units), records_(records), host_(*ctx.ops) {}

OffloadedState::~OffloadedState() = default;

void OffloadedState::setup(const StepPlan& opt_plan) {
  const ShardingPolicy& policy = ctx_.policy;
  // Host memory on a device: read and written by the files, updated on the host.
  const Tier staging = ctx_.plan_in.on_device ? Tier::Host : Tier::Device;
  std::vector<int64_t> moments(units_.size(), -1), params(units_.size(), -1);
  int64_t largest = 0;
  for (size_t u = 0; u < units_.size(); ++u) {
    if (units_[u]->moments_on_nvme()) moments[u] = units_[u]->shard_size();
    if (units_[u]->params_on_nvme()) {
      params[u] = units_[u]->shard_size();
      largest = std::max(largest, units_[u]->shard_size());
    }
  }
  if (std::any_of(moments.begin(), moments.end(), [](int64_t n) { return n >= 0; }))
    moments_ = std::make_unique<MomentsFile>(policy.aio, policy.offload_optimizer.nvme_path,
                                             ctx_.file_rank, moments, opt_plan.staging_slots,
                                             opt_plan.staging_bytes, staging);
  if (largest == 0) return;
  // The plan's figures (step_plan.cpp fill_persistent) size what is allocated here.
  SW_CHECK(opt_plan.shard_bytes == largest * int64_t(sizeof(float)), "NVMe parameter staging size");
  ParamFile::Staging st;
  st.param_slots = opt_plan.param_slots;
  st.grad_slots = opt_plan.grad_slots;
  st.opt_slots = moments_ ? 0 : opt_plan.staging_slots;  // else the moments' staging serves
  st.shard_bytes = opt_plan.shard_bytes;
  st.opt_slot_bytes = opt_plan.staging_bytes;
  st.tier = staging;
  params_ = std::make_unique<ParamFile>(policy.aio, policy.offload_param.nvme_path, ctx_.file_rank,
                                        params, moments_ ? &moments_->io() : nullptr, st);
}

// ---- Segments --------------------------------------------------------------------------------

void OffloadedState::begin(SegmentRun& s) {
  records_.take_host(host_.take_spans());
  const size_t n = s.plan.actions.size();
  if (moments_) {
    // The previous optimizer's write-backs are done (long since, normally) before this one
    // reads the moments again; an io error of theirs stops the run here.
    if (!s.plan.segments.empty() && s.plan.segments[0].kind == SegmentKind::Optimizer)
      moments_->settle_writes();
    mev_.assign(n, nullptr);
  }
  if (params_) {
    pev_.clear();
    pev_.resize(n);
  }
}

void OffloadedState::end(SegmentRun&) { records_.take_host(host_.take_spans()); }

bool OffloadedState::run(SegmentRun& s, int i) {
  switch (s.action(i).kind) {
    case ActionKind::FetchState:
    case ActionKind::EvictState:
      return fetch_or_evict(s, i);
    case ActionKind::WaitState:
      wait_state(s, i);
      return true;
    default:
      SW_CHECK(false, std::string("offloaded state: not an action of its: ") +
                          action_kind_name(s.action(i).kind));
  }
  return false;
}

// Recorded where a consumer (wait_state, a gather, a reduction) sees it complete. A staging
// buffer is reused only after the io that last used it (the plan's waits).
bool OffloadedState::fetch_or_evict(SegmentRun& s, int i) {
  const Action& a = s.action(i);
  for (int w : a.waits)
    if (s.action(w).queue == Queue::IO) wait_io(s.plan, w, false);
  if (a.carry && a.kind == ActionKind::FetchState) {
    const int c = run_carried(s.plan, i);
    if (c == 1) return true;  // left in flight: recorded at issue (nothing here waits for it)
    if (c == 2) return false;  // adopted: recorded when its wait sees it
  }
  issue_io(s.plan, i, *units_[size_t(a.unit)]);
  if (a.carry && a.kind == ActionKind::EvictState) {  // left in flight past the segment
    moments_->keep_write(mev_[size_t(i)]);
    return true;  // recorded at issue: no wait of this segment sees it
  }
  return false;
}

void OffloadedState::wait_state(SegmentRun& s, int i) {
  for (int w : s.action(i).waits) {
    const Action& io = s.action(w);
    wait_io(s.plan, w);
    if (io.kind == ActionKind::FetchState && io.lo < io.hi) {
      // An optimizer piece: staged for its update, indexed like the whole shard (the update
      // adds the offset in the shard); valid for [lo, hi) only, until the piece's evict.
      FlatUnit& f = *units_[size_t(io.unit)];
      float* q = opt_slot(io.slot);
      const int64_t n = io.hi - io.lo;
      if (io.io & kIoMoments) {
        f.stage_moments(q - io.lo, q + n - io.lo);
        q += 2 * n;
      }
      if (io.io & kIoMaster) {
        f.stage_master(q - io.lo);
        f.stage_grad(q + n - io.lo);
      }
    }
  }
}

void OffloadedState::wait_io(const StepPlan& plan, int w, bool rec) {
  double t0 = 1e300, t1 = 0;
  Stream& compute = ctx_.ops->stream();
  auto one = [&](IoEventPtr& e) {
    if (!e) return;
    compute.wait_event(*e);
    t0 = std::min(t0, e->started_at());
    t1 = std::max(t1, e->done_at());
    if (rec) e = nullptr;  // observed (and recorded) once
  };
  bool any = false;
  if (moments_ && size_t(w) < mev_.size()) {
    any |= mev_[size_t(w)] != nullptr;
    one(mev_[size_t(w)]);
  }
  if (params_ && size_t(w) < pev_.size()) {
    any |= !pev_[size_t(w)].empty();
    for (IoEventPtr& e : pev_[size_t(w)]) one(e);
    if (rec) pev_[size_t(w)].clear();
  }
  if (rec && any && records_.on()) records_.add(plan, w, t0, t1, Queue::IO);
}

int OffloadedState::run_carried(const StepPlan& plan, int i) {
  const Action& a = plan.actions[size_t(i)];
  SW_CHECK(moments_ && a.io == kIoMoments, "plan: a carried fetch that is not of NVMe moments");
  MomentsFile::Carried& c = moments_->carried(a.slot);
  const bool same = c.ev && c.unit == a.unit && c.lo == a.lo && c.hi == a.hi;
  Stream& compute = ctx_.ops->stream();
  if (a.adopt) {
    if (!same) {
      if (c.ev) compute.wait_event(*c.ev);
      c = {};
      return 0;
    }
    mev_[size_t(i)] = std::move(c.ev);  // observed (and recorded) by its wait
    c = {};
    return 2;
  }
  if (!same) {
    if (c.ev) compute.wait_event(*c.ev);  // the slot's previous read
    issue_io(plan, i, *units_[size_t(a.unit)]);
    c = {a.unit, a.lo, a.hi, std::move(mev_[size_t(i)])};
  }
  return 1;
}

float* OffloadedState::opt_slot(int slot) {
  return moments_ ? moments_->slot(slot) : params_->opt_slot(slot);
}

void OffloadedState::issue_io(const StepPlan& plan, int i, FlatUnit& fu) {
  const Action& a = plan.actions[size_t(i)];
  const bool fetch = a.kind == ActionKind::FetchState;
  const int u = a.unit;
  const int64_t Sh = fu.shard_size();
  if (a.lo >= a.hi) {  // a whole shard: a gather's master, or a reduction's gradients
    SW_CHECK(params_ && params_->holds(u), "io action on a unit whose parameters are not on NVMe");
    ParamFile& pv = *params_;
    std::vector<IoEventPtr>& ev = pev_[size_t(i)];
    if (a.io == kIoMaster) {  // into a slot a gather may still be uploading from
      ev.push_back(pv.read(pv.param_slot(a.slot), Sh, pv.master_at(u),
                           std::move(pv.param_busy(a.slot))));
    } else if (fetch) {  // only what was accumulated before is read; zeros are not
      if (!fu.grads_zero()) {
        pv.grad_read(u) = pv.read(pv.grad_slot(a.slot), Sh, pv.grads_at(u));
        ev.push_back(pv.grad_read(u));
      }
    } else {
      IoEventPtr e = pv.write(pv.grad_slot(a.slot), Sh, pv.grads_at(u));
      pv.grad_busy(a.slot) = e;
      ev.push_back(e);
      fu.stage_grad(nullptr);
    }
    return;
  }
  // An optimizer piece [lo, hi): m then v (the moments file holds them so), master, gradients.
  float* q = opt_slot(a.slot);
  const int64_t n = a.hi - a.lo;
  if (a.io & kIoMoments) {
    SW_CHECK(moments_ != nullptr, "io action on a unit whose moments are not on NVMe");
    mev_[size_t(i)] = fetch ? moments_->read_piece(u, a.lo, a.hi, q)
                            : moments_->write_piece(u, a.lo, a.hi, q);
    if (!fetch) fu.stage_moments(nullptr, nullptr);
    q += 2 * n;
  }
  if (a.io & kIoMaster) {
    ParamFile& pv = *params_;
    std::vector<IoEventPtr>& ev = pev_[size_t(i)];
    const int64_t lo = a.lo * int64_t(sizeof(float));
    ev.push_back(fetch ? pv.read(q, n, pv.master_at(u) + lo) : pv.write(q, n, pv.master_at(u) + lo));
    if (fetch) {
      if (!fu.grads_zero())
        ev.push_back(pv.read(q + n, n, pv.grads_at(u) + lo));
      else
        ops_for(Device::cpu()).fill(q + n, 0.f, static_cast<size_t>(n));  // host staging
    } else {
      fu.stage_master(nullptr);
      fu.stage_grad(nullptr);
    }
  }
}

// ---- For the other components ----------------------------------------------------------------

int OffloadedState::stage_gather(SegmentRun& s, int i, FlatUnit& fu) {
  int f = -1;
  for (int w : s.action(i).waits)
    if (s.action(w).kind == ActionKind::FetchState) f = w;
  SW_CHECK(f >= 0, "plan: the gather of unit '" + fu.unit()->name() +
                       "' (parameters on NVMe) has no fetch");
  wait_io(s.plan, f);
  const int slot = s.action(f).slot;
  fu.stage_master(params_->param_slot(slot));
  return slot;
}

void OffloadedState::gathered_from(int slot, std::shared_ptr<Event> upload) {
  params_->param_busy(slot) = std::move(upload);
}

void OffloadedState::stage_reduction(int slot, FlatUnit& fu) {
  IoEventPtr& busy = params_->grad_busy(slot);
  if (busy) busy->synchronize();  // the previous unit's gradients left it
  busy = nullptr;
  fu.stage_grad(params_->grad_slot(slot));
}

bool OffloadedState::keeps_grads(const FlatUnit& fu) const {
  return fu.params_on_nvme() || fu.grad_device() != ctx_.device();
}

void OffloadedState::accumulate(FlatUnit& fu) {
  if (!fu.params_on_nvme()) return accumulate_on_host(fu);
  if (!fu.grad_shard()) return accumulate_nvme(fu);  // outside the plan
  // Into the staging buffer the plan gave it; its evict writes it back.
  IoEventPtr& rd = params_->grad_read(fu.index());
  if (rd) rd->synchronize();
  rd = nullptr;
  fu.accumulate_reduced();
  params_->grad_sumsq(fu.index()) =
      ops_for(Device::cpu()).sum_squares(fu.grad_shard(), static_cast<size_t>(fu.shard_size()));
}

double OffloadedState::grad_sumsq(int u) const {
  return static_cast<const ParamFile&>(*params_).grad_sumsq(u);
}

// FlatUnit::accumulate_reduced for a gradient shard on the host while the unit lives on a
// device (offload_param cpu): the reduced block goes down on the copy stream and the host
// updater adds it, so neither the host nor the device waits for the other here.
void OffloadedState::accumulate_on_host(FlatUnit& fu) {
  const size_t Sh = static_cast<size_t>(fu.shard_size());
  const DType rdt = fu.reduce_dtype();
  const size_t bytes = Sh * dtype_size(rdt);
  float* shard = fu.grad_shard();  // host; waits for this unit's earlier host work
  auto block = std::make_shared<Buffer>(bytes, Mem::Communication, Device::cpu(), Tier::Host);
  // The reduction is complete (its Work was waited for): no need to wait for the compute
  // stream. The compute stream waits for the copy before the unsharded gradients are freed or
  // zeroed (release_reduced, in stream order).
  const Ops& ops = *ctx_.ops;
  auto down = copy_bytes_async(block->data(), Device::cpu(), fu.reduced_block(), ops.device(),
                               bytes, completed_event().get());
  ops.stream().wait_event(*down);
  fu.release_reduced();
  const Ops& cpu_ops = ops_for(Device::cpu());
  fu.set_pending_update(host_.post([=, &cpu_ops] {
                          down->synchronize();
                          FlatUnit::add_block(cpu_ops, shard, block->data(), rdt, Sh);
                        }),
                        false);
  if (host_.synchronous()) fu.settle();
}

// On a device with the moments in host memory (offload_optimizer cpu; offload_param cpu puts
// the master and gradient shards there too): the update runs on the CPU with the CPU's AdamW
// (ZeRO-Offload), on the host updater, over host copies of whichever of this part's master and
// gradient are on the device. The unit is the update's until it settles (FlatUnit::
// set_pending_update): the device meanwhile runs whatever does not touch it, the next step's
// forward of the units updated before it included. Same arithmetic as the device's AdamW where
// that equals the CPU's (the simulated accelerator: bit for bit).
void OffloadedState::update_on_host(FlatUnit& fu, const UpdateArgs& a, int64_t lo, int64_t hi) {
  const OptimizerParams& p = a.adam;
  const Range shard = fu.shard_range();
  const Range part{shard.lo + lo, shard.lo + hi};
  HostUpdate up;
  up.unit = fu.index();
  for (size_t s = 0; s < fu.layout().specs.size(); ++s) {
    const FlatEntry& e = fu.layout().entries[s];
    const Range r = intersect(part, {e.offset, e.offset + e.numel});
    if (r.empty()) continue;
    up.pieces.push_back({static_cast<size_t>(r.lo - shard.lo), static_cast<size_t>(r.lo - part.lo),
                         static_cast<size_t>(r.hi - r.lo),
                         fu.layout().specs[s].weight_decay ? p.weight_decay : 0.f,
                         p.per_tensor() ? a.coeff[size_t(fu.index())][s] : 1.f});
  }
  up.type = static_cast<int>(p.type);  // (HostUpdate's numbering is OptimizerType's)
  up.momentum = p.momentum, up.dampening = p.dampening, up.nesterov = p.nesterov;
  up.master_on_device = !fu.master_device().is_cpu();
  up.grad_on_device = !fu.grad_device().is_cpu();
  up.n = static_cast<size_t>(hi - lo);
  up.master = fu.master() + lo;  // on master_device()
  up.grad = fu.grad_shard() + lo;
  up.m = fu.adam_m();
  up.v = fu.adam_v();
  up.lr = a.lr, up.beta1 = p.beta1, up.beta2 = p.beta2, up.eps = p.eps;
  up.grad_mult = a.grad_mult, up.step = a.step;
  fu.set_pending_update(host_.update(up, records_.on()),
                        fu.kind() == FlatUnit::Kind::Whole && hi == fu.shard_size());
  if (host_.synchronous()) fu.settle();
}

// ---- Outside the plan ------------------------------------------------------------------------

void OffloadedState::stage_whole(FlatUnit& fu, bool grads) {
  ParamFile& pv = *params_;
  const int64_t Sh = fu.shard_size();
  const int u = fu.index();
  float* m = pv.scratch(2 * Sh);
  pv.transfer(m, Sh, pv.master_at(u), false);
  fu.stage_master(m);
  if (grads) {
    if (fu.grads_zero())
      ops_for(Device::cpu()).fill(m + Sh, 0.f, static_cast<size_t>(Sh));
    else
      pv.transfer(m + Sh, Sh, pv.grads_at(u), false);
    fu.stage_grad(m + Sh);
  }
}

void OffloadedState::unstage_whole(FlatUnit& fu, bool write_master) {
  ParamFile& pv = *params_;
  if (write_master) pv.transfer(fu.master(), fu.shard_size(), pv.master_at(fu.index()), true);
  fu.stage_master(nullptr);
  fu.stage_grad(nullptr);
  pv.release_scratch();  // initialisation and exports: not held between steps
}

void OffloadedState::accumulate_nvme(FlatUnit& fu) {
  ParamFile& pv = *params_;
  const int64_t Sh = fu.shard_size();
  const int u = fu.index();
  float* g = pv.scratch(2 * Sh) + Sh;
  if (!fu.grads_zero()) pv.transfer(g, Sh, pv.grads_at(u), false);
  fu.stage_grad(g);
  fu.accumulate_reduced();
  pv.grad_sumsq(u) = ops_for(Device::cpu()).sum_squares(g, static_cast<size_t>(Sh));
  pv.transfer(g, Sh, pv.grads_at(u), true);
  fu.stage_grad(nullptr);
  pv.release_scratch();
}

const float* OffloadedState::read_master(int u, int64_t lo, int64_t hi) {
  ParamFile& pv = *params_;
  float* buf = pv.scratch(hi - lo);
  if (hi > lo) pv.transfer(buf, hi - lo, pv.master_at(u) + lo * int64_t(sizeof(float)), false);
  return buf;
}

void OffloadedState::write_master(int u, int64_t lo, int64_t hi, const float* src) {
  params_->transfer(const_cast<float*>(src), hi - lo,
                    params_->master_at(u) + lo * int64_t(sizeof(float)), true);
}

const float* OffloadedState::read_moments(const FlatUnit& fu, bool second, int64_t lo, int64_t hi) {
  float* buf = moments_->view(hi - lo);
  moments_->transfer(fu.index(), fu.shard_size(), second, lo, hi, buf, false,
                     ctx_.policy.offload_optimizer.piece());
  return buf;
}

void OffloadedState::write_moments(const FlatUnit& fu, bool second, int64_t lo, int64_t hi,
                                   const float* src) {
  moments_->drop_carried();  // reads the last micro-step issued for the optimizer are stale
  moments_->transfer(fu.index(), fu.shard_size(), second, lo, hi, const_cast<float*>(src), true,
                     ctx_.policy.offload_optimizer.piece());
}

std::vector<std::pair<const void*, size_t>> OffloadedState::host_staging() const {
  std::vector<std::pair<const void*, size_t>> out;
  if (moments_)
    for (const StagingBuffer& b : moments_->slots()) out.emplace_back(b.data(), b.bytes());
  if (params_)
    for (const Buffer* b : params_->host_staging()) out.emplace_back(b->data(), b->bytes());
  return out;
}

}  // namespace sw
