#include "sharding/plan_builder.h"

#include <algorithm>

#include "sharding/pipeline_schedule.h"

namespace sw {

namespace {
constexpr size_t kComm = static_cast<size_t>(Mem::Communication);
constexpr size_t kAct = static_cast<size_t>(Mem::Activations);
constexpr size_t kGrads = static_cast<size_t>(Mem::Grads);
}  // namespace

PlanBuilder::PlanBuilder(const PlanInput& in)
    : in_(in), acts_io_(*this), state_io_(*this), tensor_(*this) {
  const size_t U = in.units.size();
  st_.assign(U, St::Unsharded);
  gather_at_.assign(U, -1);
  has_grads_.assign(U, in.kind != UnitKind::Sharded);
  shard_grads_.assign(U, false);
  for (size_t u = 0; u < U; ++u)  // released: a Whole unit's buffer is made by its backward
    if (in.kind == UnitKind::Whole && releases_grads(in, int(u))) has_grads_[u] = false;
  if (in.kind == UnitKind::Sharded) st_.assign(U, St::Sharded);
  for (size_t u = 0; u < U && u < in.carried.size(); ++u)
    if (in.carried[u] && in.kind != UnitKind::Whole) {
      st_[u] = St::InFlight;
      if (in.kind == UnitKind::Sharded) {
        plan_.initial[kComm] += params_bytes(int(u));
        ++plan_.initial_gathered;
      }
    }
  recompute_.assign(size_t(std::max(1, in.accum)),
                    std::vector<CheckpointMode>(in.schedule.size(), CheckpointMode::Off));
  hi_ = static_cast<int>(in.schedule.size());
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
  const int P = static_cast<int>(in_.schedule.size());
  forward(true, 0, P);
  state_io_.update_through(static_cast<int>(in_.units.size()));  // units the schedule never uses
  backward(reduce, 0, P, true);
  plan_.segments.push_back({SegmentKind::MicroStep, micro, reduce, b,
                            static_cast<int>(plan_.actions.size())});
}

void PlanBuilder::eval() {
  const int b = static_cast<int>(plan_.actions.size());
  forward(false, 0, static_cast<int>(in_.schedule.size()));
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
    if (!pu.optimizer_nvme && !pu.params_nvme) {
      Action& up = add(ActionKind::OptimizerUpdate, Queue::Compute, ui);
      // release_grads: the update frees what the step allocated (Updates::run).
      if (releases_grads(in_, ui)) {
        std::vector<bool>& made = in_.kind == UnitKind::Whole ? has_grads_ : shard_grads_;
        if (made[u]) up.mem[kGrads] -= released_bytes(ui);
        made[u] = false;
      }
    }
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

// ---- Local SGD's outer step ----------------------------------------------------------------------

void PlanBuilder::outer(const std::vector<bool>& units, double outer_bytes, OuterPhase phase) {
  const int b = static_cast<int>(plan_.actions.size());
  std::vector<int> issued(in_.units.size(), -1);
  const bool reduce = phase != OuterPhase::Update, update = phase != OuterPhase::Reduce;
  for (size_t u = 0; u < in_.units.size(); ++u) {
    if (u >= units.size() || !units[u]) continue;
    if (update) drop_stale_gather(int(u));
    if (!reduce) continue;
    Action& r = add(ActionKind::OuterReduce, Queue::Cross, int(u));
    const int64_t shard = in_.units[u].padded / std::max(1, in_.S);
    r.bytes = static_cast<int64_t>(static_cast<double>(shard) * outer_bytes);
    r.mem[kComm] = shard * 4;
    issued[u] = last_index();
  }
  for (size_t u = 0; u < in_.units.size() && update; ++u) {
    if (u >= units.size() || !units[u]) continue;
    Action& a = add(ActionKind::OuterUpdate, Queue::Compute, int(u));
    if (issued[u] >= 0) a.waits.push_back(issued[u]);
    a.mem[kComm] = -in_.units[u].padded / std::max(1, in_.S) * 4;
  }
  plan_.segments.push_back({SegmentKind::Outer, 0, false, b, static_cast<int>(plan_.actions.size())});
}

// ---- Pipeline ----------------------------------------------------------------------------------

int PlanBuilder::pipe_stage_last(int chunk) const { return in_.pipe.chunk_begin[size_t(chunk) + 1] - 1; }

void PlanBuilder::pipe_recv(const PipeOp& op) {
  const PlanInput::Pipe& pp = in_.pipe;
  const int lo = pp.chunk_begin[size_t(op.chunk)], last = pipe_stage_last(op.chunk);
  int dir = -1;
  if (op.kind == PipeOpKind::Forward && in_.takes_input[size_t(lo)]) dir = 0;
  if ((op.kind == PipeOpKind::Backward || op.kind == PipeOpKind::BackwardInput) &&
      !in_.is_loss[size_t(last)])
    dir = 1;
  if (dir < 0) return;
  int& at = recv_at_[dir][size_t(op.micro * pp.chunks + op.chunk)];
  if (at >= 0) return;
  const int m = micro_, c = chunk_;
  micro_ = op.micro, chunk_ = op.chunk;
  Action& r = add(dir == 0 ? ActionKind::RecvActs : ActionKind::RecvGrads, Queue::P2P);
  r.bytes = act_bytes();
  r.mem[kAct] = act_bytes();
  at = last_index();
  micro_ = m, chunk_ = c;
}

void PlanBuilder::pipeline(bool training) {
  const PlanInput::Pipe& pp = in_.pipe;
  const int V = pp.chunks, M = training ? std::max(1, in_.accum) : 1;
  const int b = static_cast<int>(plan_.actions.size());
  for (auto& r : recv_at_) r.assign(size_t(M * V), -1);
  pending_sends_.clear();
  older_sends_.clear();
  std::vector<PipeOp> order;
  if (training) {
    order = pipe_order(static_cast<PipeSchedule>(pp.schedule), pp.size, V, M, pp.rank);
  } else {
    for (int c = 0; c < V; ++c) order.push_back({PipeOpKind::Forward, 0, c});
  }
  last_ = true;
  auto wait_sends = [&](std::vector<int>& sends) {
    if (sends.empty()) return;
    Action& w = add(ActionKind::WaitP2P, Queue::Compute);
    for (int i : sends) {
      w.waits.push_back(i);
      w.mem[kAct] -= act_bytes();
    }
    sends.clear();
  };
  for (size_t k = 0; k < order.size(); ++k) {
    const PipeOp& op = order[k];
    pipe_recv(op);  // (normally issued during the op before)
    if (k + 1 < order.size()) pipe_recv(order[k + 1]);  // the next op's, ahead
    micro_ = op.micro, chunk_ = op.chunk;
    const int lo = pp.chunk_begin[size_t(op.chunk)], hi = pp.chunk_begin[size_t(op.chunk) + 1];
    const bool last_micro = op.micro + 1 == M;
    switch (op.kind) {
      case PipeOpKind::Forward:
        forward(training, lo, hi);
        if (!in_.is_loss[size_t(hi - 1)]) {
          const int fwd = last_index();
          Action& sa = add(ActionKind::SendActs, Queue::P2P);
          sa.bytes = act_bytes();
          sa.waits.push_back(fwd);
          pending_sends_.push_back(last_index());
        }
        break;
      case PipeOpKind::Backward:
      case PipeOpKind::BackwardInput: {
        const bool defer = op.kind == PipeOpKind::BackwardInput;
        backward(last_micro && !defer, lo, hi, false, defer);
        if (in_.takes_input[size_t(lo)]) {
          const int bwd = last_index();
          Action& sg = add(ActionKind::SendGrads, Queue::P2P);
          sg.bytes = act_bytes();
          sg.waits.push_back(bwd);
          pending_sends_.push_back(last_index());
        }
        break;
      }
      case PipeOpKind::BackwardWeight: {
        Action& bw = add(ActionKind::BackwardWeight, Queue::Compute);
        for (int p = lo; p < hi; ++p)  // the deferred copies, freed
          if (const CallMemory* cm = call_mem(p)) bw.mem[kAct] -= cm->deferred;
        const int w_at = last_index();
        if (last_micro)  // the chunk's units' gradients are complete: reduced now
          for (size_t u = 0; u < in_.units.size(); ++u) {
            const int fp = in_.units[u].first_pos;
            if (fp < lo || fp >= hi) continue;
            if (in_.kind != UnitKind::Whole || last_) tensor_.reduce_grads(int(u), w_at);
            reduce_unit(int(u));
          }
        break;
      }
    }
    // The next op's first unit is gathered while this rank waits for its input (FSDP's
    // prefetch across the ops, within max_live_units).
    if (k + 1 < order.size() && in_.kind == UnitKind::Sharded && in_.policy.forward_prefetch > 0) {
      const PipeOp& nx = order[k + 1];
      if (nx.kind != PipeOpKind::BackwardWeight) {
        const int nlo = pp.chunk_begin[size_t(nx.chunk)], nhi = pp.chunk_begin[size_t(nx.chunk) + 1];
        const int u = in_.schedule[size_t(nx.kind == PipeOpKind::Forward ? nlo : nhi - 1)].unit;
        if (in_.policy.max_live_units == 0 || live() < in_.policy.max_live_units) issue(u);
      }
    }
    wait_sends(older_sends_);  // the sends of the op before this one: done, freed
    older_sends_.swap(pending_sends_);
  }
  wait_sends(older_sends_);
  if (training) {
    wait_reductions(inflight_.size());
    // Units another pipeline rank holds too: their reduced gradients summed with it.
    for (int u : pp.shared) {
      Action& a = add(ActionKind::SyncShared, Queue::P2P, u);
      a.bytes = in_.units[size_t(u)].padded / std::max(1, in_.S) * 4;
    }
  }
  micro_ = 0, chunk_ = -1;
  plan_.segments.push_back({training ? SegmentKind::Pipeline : SegmentKind::Eval, M - 1, training, b,
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
  a.chunk = chunk_;
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
  const PlanUnit& pu = in_.units[size_t(u)];
  a.bytes = pu.padded * static_cast<int64_t>(dtype_size(pdt()));
  // fp8.all_gather (sharding/unit_state.h): a Linear weight's value one byte, not two (the
  // slots' rounding and the amaxes' small all-reduce left out)
  if (in_.policy.mixed_precision.fp8_all_gather && pdt() == DType::BF16) a.bytes -= pu.linear;
  a.mem[kComm] = params_bytes(u);
  st_[size_t(u)] = St::InFlight;
  gather_at_[size_t(u)] = last_index();
}

void PlanBuilder::prefetch(int pos, int depth, int dir) {
  for (int k = 1; k <= depth; ++k) {
    const int p = pos + dir * k;
    if (p < lo_ || p >= hi_) break;
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

// FlatUnit::ensure_grads: a Sharded unit's unsharded gradients are transient; a Whole unit's
// are made here under release_grads (freed by its update).
void PlanBuilder::ensure_grads(Action& a, int u) {
  if (has_grads_[size_t(u)]) return;
  a.mem[in_.kind == UnitKind::Whole ? kGrads : kComm] += fbytes(u);
  has_grads_[size_t(u)] = true;
}

// ---- Forward and backward --------------------------------------------------------------------

CheckpointMode& PlanBuilder::recompute(int p) {
  if (recompute_.size() <= size_t(micro_))
    recompute_.resize(size_t(micro_) + 1,
                      std::vector<CheckpointMode>(in_.schedule.size(), CheckpointMode::Off));
  return recompute_[size_t(micro_)][size_t(p)];
}

CheckpointMode PlanBuilder::checkpoint_mode(int p) const {
  if (in_.is_loss[size_t(p)]) return CheckpointMode::Off;  // the loss call
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

void PlanBuilder::forward(bool training, int lo, int hi) {
  const int P = static_cast<int>(in_.schedule.size());
  const bool piped = in_.pipelined();
  lo_ = lo, hi_ = hi;
  for (int p = lo; p < hi; ++p) {
    const int u = in_.schedule[size_t(p)].unit;
    const PlanUnit& pu = in_.units[size_t(u)];
    state_io_.update_through(u);  // a deferred update before the unit's first gather or use
    issue(u);
    prefetch(p, in_.policy.forward_prefetch, +1);
    wait(u);
    if (piped && p == lo && in_.takes_input[size_t(p)]) {  // its input is received
      Action& w = add(ActionKind::WaitP2P, Queue::Compute);
      const int r = recv_at_[0][size_t(micro_ * in_.pipe.chunks + chunk_)];
      if (r >= 0) w.waits.push_back(r);
    }
    add(ActionKind::Forward, Queue::Compute, u, p);
    const int fwd_at = last_index();
    if (piped && !training) {  // inference: the received input is dropped once read; a
      Action& f = plan_.actions[size_t(fwd_at)];  // chunk's output is kept to be sent
      if (p == lo && in_.takes_input[size_t(p)]) f.mem[kAct] -= act_bytes();
      if (p + 1 == hi && !in_.is_loss[size_t(p)]) f.mem[kAct] += act_bytes();
    }
    tensor_.inside(fwd_at, p, training ? Unit::Pass::Forward : Unit::Pass::Eval);
    Action& a = plan_.actions[size_t(fwd_at)];  // (after the tensor actions were added)
    const CallMemory* cm = call_mem(p);
    if (!training && cm) a.transient[kAct] = cm->saved_eval;
    if (training) {
      const bool loss = in_.is_loss[size_t(p)];
      if (loss) ensure_grads(a, u);  // the loss call may produce the head's gradients
      if (!loss) a.mem[kAct] += act_bytes();  // its output (a pipeline chunk's: to send)
      if (cm) a.mem[kAct] += cm->saved;
      const CheckpointMode m = checkpoint_mode(p);
      if (m != CheckpointMode::Off) {
        Action& d = add(ActionKind::DropSaved, Queue::Compute, u, p);
        d.mode = m;
        if (cm) d.mem[kAct] = -(m == CheckpointMode::Full ? cm->saved : cm->saved_cheap);
        recompute(p) = m;
      }
      if (!piped) acts_io_.after_forward(p, u);  // what backward needs, to the host tier or a file
    }
    if (!piped) acts_io_.wait_evicted(p, u, fwd_at);
    if (p == pu.last_pos &&
        (!training || (in_.policy.reshard_after_forward && pu.last_pos + 1 != P)))
      free(u);
  }
  if (!piped) acts_io_.end_forward();
}

void PlanBuilder::backward(bool reduce, int lo, int hi, bool wait_all, bool defer) {
  const bool piped = in_.pipelined();
  lo_ = lo, hi_ = hi;
  for (int q = hi - 1; q >= lo; --q) {
    const int u = in_.schedule[size_t(q)].unit;
    const PlanUnit& pu = in_.units[size_t(u)];
    const CallMemory* cm = call_mem(q);
    issue(u);
    prefetch(q, in_.policy.backward_prefetch, -1);
    wait(u);
    if (!piped) acts_io_.before_backward(q, u);
    if (recompute(q) != CheckpointMode::Off) {
      Action& r = add(ActionKind::Recompute, Queue::Compute, u, q);
      r.mode = recompute(q);
      if (cm) r.mem[kAct] = r.mode == CheckpointMode::Full ? cm->saved : cm->saved_cheap;
      tensor_.inside(last_index(), q,
                     r.mode == CheckpointMode::Full ? Unit::Pass::Forward : Unit::Pass::Recompute);
      recompute(q) = CheckpointMode::Off;
    }
    // At most one reduction in flight when a unit's transient gradients are allocated: the
    // older ones are completed first (their gradients freed), which bounds the memory.
    if (!has_grads_[size_t(u)] && inflight_.size() > 1) wait_reductions(inflight_.size() - 1);
    const bool dy_received = piped && q == hi - 1 && !in_.is_loss[size_t(q)];
    if (dy_received) {
      Action& w = add(ActionKind::WaitP2P, Queue::Compute);
      const int r = recv_at_[1][size_t(micro_ * in_.pipe.chunks + chunk_)];
      if (r >= 0) w.waits.push_back(r);
    }
    Action& a = add(ActionKind::Backward, Queue::Compute, u, q);
    ensure_grads(a, u);
    a.defer = defer;
    if (defer && cm) a.mem[kAct] += cm->deferred;  // zero bubble: dout and inp kept for W
    if (in_.takes_input[size_t(q)]) a.mem[kAct] -= act_bytes();
    if (cm) a.mem[kAct] -= cm->saved;
    if (dy_received) a.mem[kAct] -= act_bytes();  // the received dy, read
    const int bwd_at = last_index();
    // A chunk's first position's dx goes to the previous stage (a buffer of its own).
    if (piped && q == lo && in_.takes_input[size_t(q)]) plan_.actions[size_t(bwd_at)].mem[kAct] += act_bytes();
    if (defer && cm && cm->deferred > 0) {  // the copies (and dx) exist before Saved, input, dy go
      Action& d = plan_.actions[size_t(bwd_at)];
      const int64_t made = cm->deferred + (piped && q == lo && in_.takes_input[size_t(q)] ? act_bytes() : 0);
      d.transient[kAct] += made - std::max<int64_t>(d.mem[kAct], 0);
    }
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
  if (reduce && wait_all) wait_reductions(inflight_.size());
  if (!piped) state_io_.end_backward();  // (NVMe parameters: the gradients are in the file)
}

// ---- Reductions ------------------------------------------------------------------------------

void PlanBuilder::wait_reductions(size_t n) {
  Action& w = add(ActionKind::WaitReduce, Queue::Compute);
  std::vector<int> done;
  for (size_t k = 0; k < n; ++k) {
    const Reduction& r = inflight_[k];
    w.waits.push_back(r.at);
    w.mem[kComm] -= r.freed;
    done.push_back(r.at);
    // release_grads: the reduced shard it adds into is made by the unit's first one
    // (FlatUnit::accumulate_reduced).
    if (r.unit >= 0 && in_.kind == UnitKind::Sharded && releases_grads(in_, r.unit) &&
        !shard_grads_[size_t(r.unit)]) {
      w.mem[kGrads] += released_bytes(r.unit);
      shard_grads_[size_t(r.unit)] = true;
    }
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
      inflight_.push_back({last, freed, u});
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
          inflight_.push_back({last_index(), 0, -1});
        }
      }
      break;
  }
}

}  // namespace sw
