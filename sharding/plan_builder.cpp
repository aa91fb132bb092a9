#include "sharding/plan_builder.h"

#include <algorithm>

namespace sw {

namespace {
constexpr size_t kComm = static_cast<size_t>(Mem::Communication);
constexpr size_t kAct = static_cast<size_t>(Mem::Activations);
}  // namespace

PlanBuilder::PlanBuilder(const PlanInput& in)
    : in_(in), acts_io_(*this), state_io_(*this), tensor_(*this) {
  const size_t U = in.units.size();
  st_.assign(U, St::Unsharded);
  gather_at_.assign(U, -1);
  has_grads_.assign(U, in.kind != UnitKind::Sharded);
  if (in.kind == UnitKind::Sharded) st_.assign(U, St::Sharded);
  for (size_t u = 0; u < U && u < in.carried.size(); ++u)
    if (in.carried[u] && in.kind != UnitKind::Whole) {
      st_[u] = St::InFlight;
      if (in.kind == UnitKind::Sharded) {
        plan_.initial[kComm] += params_bytes(int(u));
        ++plan_.initial_gathered;
      }
    }
  recompute_.assign(in.schedule.size(), CheckpointMode::Off);
  ready_.assign(in.buckets.size(), 0);
  plan_.W = in.W, plan_.S = in.S, plan_.R = in.R, plan_.kind = in.kind;
  plan_.tensor = in.tensor;
  for (const PlanUnit& u : in.units) plan_.unit_names.push_back(u.name);
  plan_.activations_known = !in.calls.empty();
  for (const CallMemory& c : in.calls) plan_.activations_known &= c.known;
  plan_memory(in, plan_);
}

StepPlan PlanBuilder::take() {
  state_io_.add_param_fetches();
  return std::move(plan_);
}

std::vector<bool> PlanBuilder::in_flight() const {
  std::vector<bool> f(st_.size());
  for (size_t u = 0; u < st_.size(); ++u) f[u] = st_[u] == St::InFlight;
  return f;
}

// ---- Segments --------------------------------------------------------------------------------

void PlanBuilder::micro_step(int micro, bool reduce, bool last) {
  micro_ = micro;
  last_ = last;
  acts_io_.begin_micro_step();
  const int b = static_cast<int>(plan_.actions.size());
  state_io_.begin_micro_step(micro, last);
  forward(true);
  state_io_.update_through(static_cast<int>(in_.units.size()));  // units the schedule never uses
  backward(reduce);
  plan_.segments.push_back({SegmentKind::MicroStep, micro, reduce, b,
                            static_cast<int>(plan_.actions.size())});
}

void PlanBuilder::eval() {
  const int b = static_cast<int>(plan_.actions.size());
  forward(false);
  plan_.segments.push_back({SegmentKind::Eval, 0, false, b, static_cast<int>(plan_.actions.size())});
}

void PlanBuilder::optimizer(bool flush) {
  micro_ = in_.accum - 1;
  const int b = static_cast<int>(plan_.actions.size());
  state_io_.begin_optimizer(flush);
  for (size_t u = 0; u < in_.units.size(); ++u) {
    const int ui = static_cast<int>(u);
    // Deferred: updated by the next forward (or a flush), gathered after that.
    if (state_io_.deferred(ui) != flush) continue;
    if (in_.kind == UnitKind::FullReplicated) wait(ui);  // a previous regather
    drop_stale_gather(ui);
    const PlanUnit& pu = in_.units[u];
    if (!pu.optimizer_nvme && !pu.params_nvme) add(ActionKind::OptimizerUpdate, Queue::Compute, ui);
    state_io_.update_pieces(ui);  // (streamed: its pieces through the staging)
    if (in_.kind == UnitKind::FullReplicated) {
      Action& a = add(ActionKind::Regather, Queue::Gather, ui);
      a.bytes = pu.padded * static_cast<int64_t>(dtype_size(pdt()));
      st_[u] = St::InFlight;
      gather_at_[u] = last_index();
    }
    // The units the next forward starts with are gathered while later updates run, within
    // max_live_units (the next forward counts them as live). Not NVMe parameters: the
    // micro-step fetches them ahead of its own gathers.
    if (!flush && in_.kind == UnitKind::Sharded && pu.first_pos >= 0 && !pu.params_nvme &&
        pu.first_pos < in_.policy.forward_prefetch &&
        (in_.policy.max_live_units == 0 || live() < in_.policy.max_live_units))
      issue(ui);
  }
  state_io_.end_optimizer();
  plan_.segments.push_back({SegmentKind::Optimizer, micro_, false, b,
                            static_cast<int>(plan_.actions.size())});
}

// ---- Units' parameters -----------------------------------------------------------------------

// A unit's gathered parameters: the fp32 full buffer and, where units keep one, the 16-bit copy
// beside it (FlatUnit, MixedPrecisionPolicy::weights16), the fp32 one then compact.
int64_t PlanBuilder::params_bytes(int u) const {
  return full_params_bytes(in_.units[size_t(u)],
                           in_.policy.mixed_precision.weights16(in_.on_device));
}

Action& PlanBuilder::add(ActionKind k, Queue q, int unit, int pos) {
  Action a;
  a.kind = k;
  a.queue = q;
  a.unit = unit;
  a.pos = pos;
  if (pos >= 0) a.call = in_.schedule[size_t(pos)].call;
  a.micro = micro_;
  plan_.actions.push_back(std::move(a));
  return plan_.actions.back();
}

int PlanBuilder::live() const {
  int n = 0;
  if (in_.kind == UnitKind::Sharded)
    for (St s : st_) n += s != St::Sharded;
  return n;
}

// FlatUnit::issue_unshard: a Sharded unit allocates its full buffer and gathers into it.
void PlanBuilder::issue(int u) {
  if (st_[size_t(u)] != St::Sharded) return;
  Action& a = add(ActionKind::Gather, Queue::Gather, u);
  a.bytes = in_.units[size_t(u)].padded * static_cast<int64_t>(dtype_size(pdt()));
  a.mem[kComm] = params_bytes(u);
  st_[size_t(u)] = St::InFlight;
  gather_at_[size_t(u)] = last_index();
}

void PlanBuilder::prefetch(int pos, int depth, int dir) {
  const int P = static_cast<int>(in_.schedule.size());
  for (int k = 1; k <= depth; ++k) {
    const int p = pos + dir * k;
    if (p < 0 || p >= P) break;
    const int u = in_.schedule[size_t(p)].unit;
    if (st_[size_t(u)] != St::Sharded) continue;
    if (in_.policy.max_live_units > 0 && live() >= in_.policy.max_live_units) break;
    state_io_.update_through(u);  // a deferred update before the gather reads the master
    issue(u);
  }
}

void PlanBuilder::wait(int u) {
  if (st_[size_t(u)] == St::Unsharded) return;
  issue(u);
  Action& a = add(ActionKind::WaitGather, Queue::Compute, u);
  if (gather_at_[size_t(u)] >= 0) a.waits.push_back(gather_at_[size_t(u)]);
  st_[size_t(u)] = St::Unsharded;
}

void PlanBuilder::free(int u) {
  if (in_.kind != UnitKind::Sharded || st_[size_t(u)] == St::Sharded) return;
  Action& a = add(ActionKind::Free, Queue::Compute, u);
  a.mem[kComm] = -params_bytes(u);
  st_[size_t(u)] = St::Sharded;
  gather_at_[size_t(u)] = -1;
}

void PlanBuilder::drop_stale_gather(int u) {
  if (in_.kind != UnitKind::Sharded || st_[size_t(u)] == St::Sharded) return;
  wait(u);
  free(u);
}

// FlatUnit::ensure_grads: a Sharded unit's unsharded gradients are transient.
void PlanBuilder::ensure_grads(Action& a, int u) {
  if (has_grads_[size_t(u)]) return;
  a.mem[kComm] += fbytes(u);
  has_grads_[size_t(u)] = true;
}

// ---- Forward and backward --------------------------------------------------------------------

CheckpointMode PlanBuilder::checkpoint_mode(int p) const {
  const int P = static_cast<int>(in_.schedule.size());
  if (p + 1 == P) return CheckpointMode::Off;  // the loss call
  const int u = in_.schedule[size_t(p)].unit;
  CheckpointMode m = in_.policy.activation_checkpointing.mode_for(u);
  if (m == CheckpointMode::Selective && !in_.units[size_t(u)].selective) m = CheckpointMode::Full;
  const CallMemory* cm = call_mem(p);
  if (cm && cm->known) {  // nothing to drop: nothing to rebuild
    if (m == CheckpointMode::Full && cm->saved == 0) m = CheckpointMode::Off;
    if (m == CheckpointMode::Selective && cm->saved_cheap == 0) m = CheckpointMode::Off;
  }
  return m;
}

void PlanBuilder::forward(bool training) {
  const int P = static_cast<int>(in_.schedule.size());
  for (int p = 0; p < P; ++p) {
    const int u = in_.schedule[size_t(p)].unit;
    const PlanUnit& pu = in_.units[size_t(u)];
    state_io_.update_through(u);  // a deferred update before the unit's first gather or use
    issue(u);
    prefetch(p, in_.policy.forward_prefetch, +1);
    wait(u);
    add(ActionKind::Forward, Queue::Compute, u, p);
    const int fwd_at = last_index();
    tensor_.inside(fwd_at, p, training ? Unit::Pass::Forward : Unit::Pass::Eval);
    Action& a = plan_.actions[size_t(fwd_at)];  // (after the tensor actions were added)
    const CallMemory* cm = call_mem(p);
    if (!training && cm) a.transient[kAct] = cm->saved_eval;
    if (training) {
      if (p + 1 == P) ensure_grads(a, u);  // the loss call may produce the head's gradients
      if (p + 1 < P) a.mem[kAct] += act_bytes();
      if (cm) a.mem[kAct] += cm->saved;
      const CheckpointMode m = checkpoint_mode(p);
      if (m != CheckpointMode::Off) {
        Action& d = add(ActionKind::DropSaved, Queue::Compute, u, p);
        d.mode = m;
        if (cm) d.mem[kAct] = -(m == CheckpointMode::Full ? cm->saved : cm->saved_cheap);
        recompute_[size_t(p)] = m;
      }
      acts_io_.after_forward(p, u);  // what backward needs, to the host tier or a file
    }
    acts_io_.wait_evicted(p, u, fwd_at);
    if (p == pu.last_pos &&
        (!training || (in_.policy.reshard_after_forward && pu.last_pos + 1 != P)))
      free(u);
  }
  acts_io_.end_forward();
}

void PlanBuilder::backward(bool reduce) {
  const int P = static_cast<int>(in_.schedule.size());
  for (int q = P - 1; q >= 0; --q) {
    const int u = in_.schedule[size_t(q)].unit;
    const PlanUnit& pu = in_.units[size_t(u)];
    const CallMemory* cm = call_mem(q);
    issue(u);
    prefetch(q, in_.policy.backward_prefetch, -1);
    wait(u);
    acts_io_.before_backward(q, u);
    if (recompute_[size_t(q)] != CheckpointMode::Off) {
      Action& r = add(ActionKind::Recompute, Queue::Compute, u, q);
      r.mode = recompute_[size_t(q)];
      if (cm) r.mem[kAct] = r.mode == CheckpointMode::Full ? cm->saved : cm->saved_cheap;
      tensor_.inside(last_index(), q,
                     r.mode == CheckpointMode::Full ? Unit::Pass::Forward : Unit::Pass::Recompute);
      recompute_[size_t(q)] = CheckpointMode::Off;
    }
    // At most one reduction in flight when a unit's transient gradients are allocated: the
    // older ones are completed first (their gradients freed), which bounds the memory.
    if (!has_grads_[size_t(u)] && inflight_.size() > 1) wait_reductions(inflight_.size() - 1);
    Action& a = add(ActionKind::Backward, Queue::Compute, u, q);
    ensure_grads(a, u);
    if (q > 0) a.mem[kAct] -= act_bytes();
    if (cm) a.mem[kAct] -= cm->saved;
    const int bwd_at = last_index();
    tensor_.inside(bwd_at, q, Unit::Pass::Backward);
    if (q == pu.first_pos) {  // the unit's last backward call
      free(u);
      if (reduce) {
        // (Whole units accumulate their gradients in place over the micro-steps: summed over
        // the tensor group once, in the last; the others' are fresh each micro-step.)
        if (in_.kind != UnitKind::Whole || last_) tensor_.reduce_grads(u, bwd_at);
        reduce_unit(u);
      }
    }
  }
  if (reduce) wait_reductions(inflight_.size());
  state_io_.end_backward();  // (NVMe parameters: the gradients are in the file)
}

// ---- Reductions ------------------------------------------------------------------------------

void PlanBuilder::wait_reductions(size_t n) {
  Action& w = add(ActionKind::WaitReduce, Queue::Compute);
  std::vector<int> done;
  for (size_t k = 0; k < n; ++k) {
    w.waits.push_back(inflight_[k].first);
    w.mem[kComm] -= inflight_[k].second;
    done.push_back(inflight_[k].first);
  }
  inflight_.erase(inflight_.begin(), inflight_.begin() + static_cast<std::ptrdiff_t>(n));
  state_io_.write_back(done, last_index());
}

void PlanBuilder::reduce_unit(int u) {
  const PlanUnit& pu = in_.units[size_t(u)];
  const int64_t rb = static_cast<int64_t>(dtype_size(rdt()));
  switch (in_.kind) {
    case UnitKind::Sharded:
    case UnitKind::FullReplicated: {
      Action& rs = add(ActionKind::ReduceScatter, Queue::Reduce, u);
      rs.bytes = pu.padded * rb;
      int last = last_index();
      state_io_.stage_reduction(u, last);
      if (in_.R > 1) {
        Action& ar = add(ActionKind::AllReduce, Queue::Reduce, u);
        ar.bytes = pu.padded / in_.S * rb;
        ar.waits.push_back(last);
        last = last_index();
      }
      int64_t freed = 0;
      if (in_.kind == UnitKind::Sharded) {  // completion frees the transient gradients
        freed = fbytes(u);
        has_grads_[size_t(u)] = false;
      }
      inflight_.emplace_back(last, freed);
      break;
    }
    case UnitKind::Whole:
      if (in_.R == 1) {
        add(ActionKind::RoundGrads, Queue::Compute, u);
      } else {
        const int b = pu.bucket;
        const PlanBucket& bk = in_.buckets[size_t(b)];
        if (++ready_[size_t(b)] == static_cast<int>(bk.members.size())) {
          Action& ar = add(ActionKind::AllReduce, Queue::Reduce);
          ar.bucket = b;
          ar.bytes = (bk.hi - bk.lo) * rb;
          ready_[size_t(b)] = 0;
          inflight_.emplace_back(last_index(), 0);
        }
      }
      break;
  }
}

}  // namespace sw
