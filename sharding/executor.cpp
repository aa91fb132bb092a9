// The executor: runs a StepPlan's actions in order (sharding/step_plan.h). On the CPU backend
// the compute queue is this thread, the gather and reduce queues are the groups' communication
// threads (one ordered sequence of collectives per group), and an event is a collective's Work:
// a WaitGather blocks on the Gather's Work; reductions complete in queue order at the
// WaitReduce actions that list them (where their transient gradients are freed, so memory
// follows the plan exactly), and HYBRID's all-reduce of a unit's reduced block is issued right
// behind its reduce-scatter, to start once that has completed (Collective::after). A CUDA build
// maps the same queues to streams and the waits to cudaStreamWaitEvent (docs/ARCHITECTURE.md).
//
// The plan is a prediction made from declared sizes; the executor still checks the state it
// acts on (a gather already in flight is not issued twice, a checkpoint drops what the Saved
// really holds), so a plan built for a state the model is not in (the first step has no
// prefetch from a previous optimizer) stays correct.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "core/rng.h"
#include "sharding/sharded_model_impl.h"

namespace sw {

void ShardedModel::Impl::ensure_pingpong(size_t n) {
  for (Buffer& b : dbuf)
    if (b.bytes() < n * sizeof(float)) b = Buffer(n * sizeof(float), Mem::Workspace, ops->device());
  if (compute_ops->prefers_lp_operands() && compute_ops->compute() != DType::F32 &&
      grad16.bytes() < n * sizeof(uint16_t))
    grad16 = Buffer(n * sizeof(uint16_t), Mem::Workspace, ops->device());
}

void ShardedModel::Impl::free_activations() {
  settle_act_copies();
  for (Buffer& a : acts) a.release();
  for (Saved& s : saved) s.clear();
  std::fill(recompute.begin(), recompute.end(), CheckpointMode::Off);
}

// ---- Plans -----------------------------------------------------------------------------------

const StepPlan& ShardedModel::Impl::plan_for(const Model& model, const Batch& batch,
                                             SegmentKind kind, bool reduce, bool last,
                                             bool pending) {
  std::string key = std::to_string(static_cast<int>(kind)) + (reduce ? "r" : "n") +
                    (last ? "l" : "") + (pending ? "p" : "") + ":" +
                    std::to_string(batch.B) + "x" + std::to_string(batch.T) + ":";
  std::vector<bool> carried(units.size());
  for (size_t u = 0; u < units.size(); ++u) {
    carried[u] = units[u]->gather_in_flight() || units[u]->holds_gathered();
    key += carried[u] ? '1' : '0';
  }
  auto it = plans.find(key);
  if (it != plans.end()) return it->second;
  // Sampling asks for a new sequence length every token: keep the cache bounded.
  if (plans.size() >= 64) plans.clear();
  PlanInput in = plan_in;
  in.B = batch.B, in.T = batch.T;
  declare_calls(in, model);
  in.carried = std::move(carried);
  in.pending = pending;
  StepPlan p = kind == SegmentKind::Eval ? plan_eval(in) : plan_micro_step(in, 0, reduce, last);
  // The step's temporaries come from memory reserved once, as large as the plan says.
  if (p.activations_known) scratch.reserve(static_cast<size_t>(p.scratch));
  return plans.emplace(std::move(key), std::move(p)).first->second;
}

// ---- Running ---------------------------------------------------------------------------------

void ShardedModel::Impl::take_host_spans() {
  std::lock_guard<std::mutex> l(host_spans->mu);
  if (recorder)
    for (ActionRecord& r : host_spans->done) {
      r.segment = recorder->segments - 1;
      recorder->records.push_back(r);
    }
  host_spans->done.clear();
}

void ShardedModel::Impl::run(Model& model, const StepPlan& plan, ExecState& st) {
  if (recorder) ++recorder->segments;
  take_host_spans();
  // The previous optimizer's write-backs are done (long since, normally) before this one
  // reads the moments again; an io error of theirs stops the run here.
  if (nvme && !plan.segments.empty() && plan.segments[0].kind == SegmentKind::Optimizer)
    nvme->settle_writes();
  if (nvme) nvme->ev.assign(plan.actions.size(), nullptr);
  if (pnvme) {
    pnvme->ev.clear();
    pnvme->ev.resize(plan.actions.size());
  }
  if (policy.activation_checkpointing.offload_nvme) {
    if (!anvme) reserve_acts(0);
    anvme->ev.clear();
    anvme->reading.clear();
    anvme->ev.resize(plan.actions.size());
    anvme->next = 0;
  }
  for (int i = 0; i < static_cast<int>(plan.actions.size()); ++i) {
    if (exec_delay_us > 0) {  // tests: expose a missing wait by perturbing every queue's timing
      delay_state = delay_state * 6364136223846793005ULL + 1442695040888963407ULL;
      std::this_thread::sleep_for(std::chrono::microseconds(
          static_cast<int64_t>((delay_state >> 33) % static_cast<uint64_t>(exec_delay_us + 1))));
    }
    MemTracker::set_action(i);  // the allocators' event log attributes memory to it
    run_action(model, plan, i, st);
  }
  MemTracker::set_action(-1);
  // Every activation copy's WaitIo is in the segment that issued it; the host buffers the
  // last fetches read go once those copies are complete.
  SW_CHECK(act_copies.empty(), "plan: an activation copy without its wait");
  release_copied(true);
  take_host_spans();
}

void ShardedModel::Impl::release_copied(bool wait) {
  size_t k = 0;
  for (size_t j = 0; j < copied_host.size(); ++j) {
    auto& [ev, buf] = copied_host[j];
    if (wait) ev->synchronize();
    if (wait || ev->query()) {
      buf.release();
    } else {
      if (k != j) copied_host[k] = std::move(copied_host[j]);
      ++k;
    }
  }
  copied_host.resize(k);
}

void ShardedModel::Impl::settle_act_copies() noexcept {
  for (auto& [i, c] : act_copies)
    for (auto& e : c.ev) {
      try {
        e->synchronize();
      } catch (...) {
      }
    }
  act_copies.clear();
  for (auto& [ev, buf] : copied_host) {
    try {
      ev->synchronize();
    } catch (...) {
    }
  }
  copied_host.clear();
}

void ShardedModel::Impl::record(const StepPlan& plan, int i, double t0, double t1) {
  const Action& a = plan.actions[static_cast<size_t>(i)];
  ActionRecord r;
  r.action = i;
  r.segment = recorder->segments - 1;
  r.kind = a.kind;
  r.queue = a.queue;
  r.unit = a.unit;
  r.call = a.call;
  r.micro = a.micro;
  r.bytes = a.bytes;
  r.t_begin = t0;
  r.t_end = t1;
  recorder->records.push_back(r);
}

void ShardedModel::Impl::run_action(Model& model, const StepPlan& plan, int i, ExecState& st) {
  if (!recorder || !device_times || plan.actions[size_t(i)].queue != Queue::Compute)
    return run_action_body(model, plan, i, st);
  Stream& s = ops->stream();
  if (!device_ref) {  // ties the device's clock to the host's: the host waits once
    std::shared_ptr<Event> ref = s.record_timed();
    ref->synchronize();
    device_ref_host = trace_clock();
    device_ref = std::move(ref);  // (set only once the tie holds)
  }
  std::shared_ptr<Event> begin = s.record_timed();
  const size_t n0 = recorder->records.size();
  run_action_body(model, plan, i, st);
  std::shared_ptr<Event> end = s.record_timed();
  for (size_t r = n0; r < recorder->records.size(); ++r) {
    const ActionRecord& rec = recorder->records[r];
    if (rec.action == i && rec.queue == Queue::Compute)
      device_spans.push_back({r, rec.action, rec.segment, begin, end});
  }
}

void ShardedModel::Impl::settle_device_times() {
  // Taken first, so a failure below leaves nothing half-settled behind: a record whose events
  // cannot be timed keeps its host times, and the error goes on to the caller.
  std::vector<DeviceSpan> spans;
  spans.swap(device_spans);
  std::shared_ptr<Event> ref = std::move(device_ref);  // (leaves device_ref empty)
  if (!recorder || !ref) return;
  for (const DeviceSpan& d : spans) {
    if (d.record >= recorder->records.size()) continue;
    ActionRecord& r = recorder->records[d.record];
    if (r.action != d.action || r.segment != d.segment) continue;
    const double b = d.begin->elapsed_since(*ref), e = d.end->elapsed_since(*ref);
    r.t_begin = device_ref_host + b;
    r.t_end = device_ref_host + e;
  }
}

void ShardedModel::Impl::run_action_body(Model& model, const StepPlan& plan, int i, ExecState& st) {
  const Action& a = plan.actions[static_cast<size_t>(i)];
  const double t0 = recorder ? trace_clock() : 0;
  FlatUnit* fu = a.unit >= 0 ? units[static_cast<size_t>(a.unit)].get() : nullptr;
  const Batch& batch = *st.batch;
  const size_t P = model.schedule.size();
  const size_t p = a.pos >= 0 ? static_cast<size_t>(a.pos) : 0;
  switch (a.kind) {
    case ActionKind::Gather: {
      const bool was = fu->gather_in_flight() || fu->sharded_state() == ShardedState::Unsharded;
      int slot = -1;  // the NVMe staging slot its master shard was read into
      if (fu->params_on_nvme() && !was) {  // its master shard, read by the Fetch it waits for
        int f = -1;
        for (int w : a.waits)
          if (plan.actions[size_t(w)].kind == ActionKind::Fetch) f = w;
        SW_CHECK(f >= 0, "plan: the gather of unit '" + fu->unit()->name() +
                             "' (parameters on NVMe) has no fetch");
        wait_io(plan, f);
        slot = plan.actions[size_t(f)].slot;
        fu->stage_master(pnvme->pslots[size_t(slot)].f32());
      }
      issue(*fu);
      if (fu->params_on_nvme()) fu->stage_master(nullptr);  // the gather copied it out
      // On a device that copy is an upload; the slot's next read waits for it.
      if (slot >= 0) pnvme->pbusy[size_t(slot)] = fu->upload_event();
      if (recorder && !was) {  // the collective's execution interval is filled in at its wait
        record(plan, i, t0, t0);
        recorder->records.back().t_end = -1;
      }
      return;
    }
    case ActionKind::WaitGather:
    case ActionKind::Regather: {
      if (a.kind == ActionKind::Regather) {
        fu->issue_regather();
        if (recorder) record(plan, i, t0, trace_clock());
        return;
      }
      fu->wait_unshard();
      if (recorder) {
        const double t1 = trace_clock();
        // The Gather's record gets the collective's real execution interval.
        const Work& w = fu->gather_work();
        for (auto r = recorder->records.rbegin(); r != recorder->records.rend(); ++r)
          if (r->kind == ActionKind::Gather && r->unit == a.unit && r->t_end < 0) {
            if (w.started_at() > 0) r->t_begin = std::max(r->t_begin, w.started_at());
            r->t_end = w.done_at() > 0 ? w.done_at() : t1;
            break;
          }
        record(plan, i, t0, t1);
      }
      return;
    }
    case ActionKind::Forward: {
      const int pos = a.pos;
      if (st.training) fu->to_forward();
      // The loss call may compute the head's gradients during forward (models/unit.h): its
      // unit gets its gradient buffer now (backward starts with it anyway).
      if (st.training && p + 1 == P) fu->ensure_grads();
      float* y = nullptr;  // the last call (the loss) writes no y
      const size_t n = static_cast<size_t>(batch.B) * batch.T * model.d_model();
      if (p + 1 < P) {
        if (st.training) {
          Buffer& next = acts[p + 1];
          if (next.bytes() != n * sizeof(float))
            next = Buffer(n * sizeof(float), Mem::Activations, ops->device());
          y = next.f32();
        } else {
          y = dbuf[p % 2].f32();
        }
      }
      UnitCtx ctx = ctx_for(*fu, batch, pos, st.training);
      if (st.training)  // (a loss call's fused head produces gradients in forward)
        fu->open_grads(ctx);
      else
        ctx.grads = &fu->grads();
      ctx.grad_scale = st.scale;
      ctx.logits = st.logits;
      ctx.loss_total = st.loss_total;
      scratch.reset();
      fu->unit()->forward(ctx, model.schedule[p].call, st.x, y);
      st.loss_sum += ctx.loss_sum;
      st.loss_count += ctx.loss_count;
      if (!st.training) saved[p].clear();
      st.x = y;
      break;
    }
    case ActionKind::DropSaved:
      recompute[p] = checkpoint(model, p);
      break;
    case ActionKind::Recompute:
      if (recompute[p] != CheckpointMode::Off) {
        rebuild(model, batch, p, st.scale);
        recompute[p] = CheckpointMode::Off;
      }
      break;
    case ActionKind::Backward: {
      fu->to_pre_backward();
      fu->ensure_grads();
      // A unit whose backward takes dx == dy (Unit::backward_in_place) writes its dx over its
      // dy, the other ping-pong buffer (dbuf[cur ^ 1] holds every dy but the loss call's none).
      const bool in_place = p > 0 && st.dy != nullptr && fu->unit()->backward_in_place();
      float* dx = p > 0 ? dbuf[in_place ? st.cur ^ 1 : st.cur].f32() : nullptr;
      SW_CHECK(!in_place || dx == st.dy, "backward in place: dy is not the other ping-pong buffer");
      UnitCtx ctx = ctx_for(*fu, batch, a.pos, true);
      fu->open_grads(ctx);
      ctx.grad_scale = st.scale;
      if (!grad16.empty()) {
        ctx.grad16 = static_cast<uint16_t*>(grad16.data());
        ctx.dy16 = st.dy16 && st.dy != nullptr;
      }
      scratch.reset();
      fu->unit()->backward(ctx, model.schedule[p].call, p > 0 ? acts[p].f32() : nullptr, st.dy, dx);
      st.dy16 = ctx.dx16 && dx != nullptr;
      fu->mark_dirty();
      acts[p].release();  // this call's activations are no longer needed
      saved[p].clear();
      if (a.pos == fu->first_pos) fu->to_post_backward();  // the unit's last backward call
      st.dy = dx;
      if (!in_place) st.cur ^= 1;
      break;
    }
    case ActionKind::Free:
      fu->reshard();
      break;
    case ActionKind::ReduceScatter: {
      if (fu->params_on_nvme()) {  // the staging buffer its completion accumulates into
        IoEventPtr& busy = pnvme->gbusy[size_t(a.slot)];
        if (busy) busy->synchronize();  // the previous unit's gradients left it
        busy = nullptr;
        fu->stage_grad(pnvme->gslots[size_t(a.slot)].f32());
      }
      PendingReduction r;
      r.action = i, r.kind = a.kind, r.unit = a.unit, r.t_issue = t0;
      r.finishes = R == 1;
      r.bytes = a.bytes;
      r.seq = next_seq();
      r.work = fu->issue_reduce_scatter(R);
      pending.push_back(std::move(r));
      return;  // recorded when it is completed (WaitReduce)
    }
    case ActionKind::AllReduce: {
      if (a.bucket >= 0) {
        issue_bucket(a.bucket, i);
      } else {  // HYBRID: the replica all-reduce, behind its reduce-scatter
        PendingReduction r;
        r.action = i, r.kind = a.kind, r.unit = a.unit, r.bytes = a.bytes;
        issue_follow_up(*fu, r);
      }
      return;
    }
    case ActionKind::RoundGrads:
      fu->round_grads();  // where N ranks would narrow them to reduce_dtype
      fu->reduced_in_place();
      break;
    case ActionKind::WaitReduce:
      if (ends_backward(plan, i)) {
        sync_grads();  // the end of backward: everything, units outside the schedule included
      } else {
        int through = -1;
        for (int w : a.waits) through = std::max(through, w);
        complete_reductions(through);
      }
      break;
    case ActionKind::OptimizerUpdate: {
      const int64_t hi = a.hi < 0 ? fu->shard_size() : a.hi;
      update_unit(*fu, st, a.lo, hi);
      // A deferred update's gradients, kept past zero_grads for it: zeroed after its last piece.
      if (hi == fu->shard_size() && size_t(a.unit) < zero_after_update.size() &&
          zero_after_update[size_t(a.unit)]) {
        fu->zero_grads();
        zero_after_update[size_t(a.unit)] = false;
      }
      break;
    }
    case ActionKind::Fetch:
    case ActionKind::Evict:
      if (a.pos >= 0 && anvme) {  // activation offload to the file
        run_act_io(plan, i);
        return;
      }
      if (a.pos >= 0) {  // activation offload: copies between tiers (a device's copy streams)
        const Tier t = a.kind == ActionKind::Evict ? Tier::Host : Tier::Device;
        const Device dev = t == Tier::Device ? ops->device() : Device::cpu();
        CopiesInFlight& c = act_copies[i];
        saved[p].move_to(t, ops->device(), c.ev, c.from);
        Buffer& x = acts[p];
        if (!x.empty() && x.tier() != t) {
          Buffer nb(x.bytes(), Mem::Activations, dev, t);
          c.ev.push_back(copy_bytes_async(nb.data(), dev, x.data(), x.device(), x.bytes()));
          c.from.push_back(std::move(x));
          x = std::move(nb);
        }
        // The CPU's copies are memcpys, done now, and its plan frees what they read here; a
        // device's WaitIo waits for them.
        if (!plan_in.on_device) act_copies.erase(i);
        break;
      }
      // NVMe state; recorded when a consumer (WaitIo, Gather, a reduction) sees it complete.
      // A staging buffer is reused only after the io that last used it (the plan's waits).
      for (int w : a.waits)
        if (plan.actions[size_t(w)].queue == Queue::IO) wait_io(plan, w, false);
      if (a.carry && a.kind == ActionKind::Fetch) {
        const int c = run_carried(plan, i);
        if (c == 1) break;  // left in flight: recorded at issue (nothing here waits for it)
        if (c == 2) return;  // adopted: recorded when its WaitIo sees it
      }
      run_io(plan, i, *fu);
      if (a.carry && a.kind == ActionKind::Evict) {  // left in flight past the segment
        nvme->pending_writes.push_back(nvme->ev[size_t(i)]);
        break;  // recorded at issue: no WaitIo of this segment sees it
      }
      return;
    case ActionKind::WaitIo:
      for (int w : a.waits) {
        const Action& io = plan.actions[size_t(w)];
        if (io.pos >= 0 && anvme) {  // activation offload to the file
          double t0 = 1e300, t1 = 0;
          for (IoEventPtr& e : anvme->ev[size_t(w)]) {
            ops->stream().wait_event(*e);
            t0 = std::min(t0, e->started_at());
            t1 = std::max(t1, e->done_at());
          }
          if (io.kind == ActionKind::Evict) anvme->writing[size_t(io.pos)].clear();  // freed
          if (auto rd = anvme->reading.find(w); rd != anvme->reading.end()) {
            for (auto& [h, d] : rd->second) {  // read into host memory: up to the device
              auto ev = copy_bytes_async(d->data(), d->device(), h.data(), Device::cpu(), h.bytes());
              ops->stream().wait_event(*ev);
              copied_host.emplace_back(std::move(ev), std::move(h));
            }
            anvme->reading.erase(rd);
            release_copied(false);
          }
          if (recorder && !anvme->ev[size_t(w)].empty()) {
            record(plan, w, t0, t1);
            recorder->records.back().queue = Queue::IO;
          }
          anvme->ev[size_t(w)].clear();
          continue;
        }
        if (io.pos >= 0 && plan_in.on_device) {  // copy streams: the copies of action w
          auto it = act_copies.find(w);
          if (it == act_copies.end()) continue;
          CopiesInFlight& c = it->second;
          for (size_t k = 0; k < c.ev.size(); ++k) {
            ops->stream().wait_event(*c.ev[k]);  // device: no host wait on a GPU
            if (!c.from[k].device().is_cpu() || c.ev[k]->query())
              c.from[k].release();  // device memory: reused after the wait, in stream order
            else
              copied_host.emplace_back(c.ev[k], std::move(c.from[k]));
          }
          act_copies.erase(it);
          release_copied(false);
          continue;
        }
        if (io.pos >= 0) continue;  // activation copies ran at issue
        wait_io(plan, w);
        if (io.kind == ActionKind::Fetch && io.lo < io.hi) {  // an optimizer piece: staged for
          // its update, indexed like the whole shard (update_unit adds the offset in the
          // shard); valid for [lo, hi) only, until the piece's Evict.
          FlatUnit& f = *units[size_t(io.unit)];
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
      break;
    case ActionKind::Count:
      SW_CHECK(false, std::string("the executor cannot run ") + action_kind_name(a.kind) +
                          " in this segment");
  }
  if (recorder) record(plan, i, t0, trace_clock());
}

// ---- NVMe io ---------------------------------------------------------------------------------

bool ShardedModel::Impl::ends_backward(const StepPlan& plan, int i) {
  // The last WaitReduce of a micro-step: only the gradients' write-back may follow it.
  for (size_t j = static_cast<size_t>(i) + 1; j < plan.actions.size(); ++j) {
    const ActionKind k = plan.actions[j].kind;
    if (k != ActionKind::Evict && k != ActionKind::WaitIo) return false;
  }
  return true;
}

void ShardedModel::Impl::wait_io(const StepPlan& plan, int w, bool rec) {
  double t0 = 1e300, t1 = 0;
  auto one = [&](IoEventPtr& e) {
    if (!e) return;
    ops->stream().wait_event(*e);
    t0 = std::min(t0, e->started_at());
    t1 = std::max(t1, e->done_at());
    if (rec) e = nullptr;  // observed (and recorded) once
  };
  bool any = false;
  if (nvme && size_t(w) < nvme->ev.size()) {
    any |= nvme->ev[size_t(w)] != nullptr;
    one(nvme->ev[size_t(w)]);
  }
  if (pnvme && size_t(w) < pnvme->ev.size()) {
    any |= !pnvme->ev[size_t(w)].empty();
    for (IoEventPtr& e : pnvme->ev[size_t(w)]) one(e);
    if (rec) pnvme->ev[size_t(w)].clear();
  }
  if (rec && any && recorder) {
    record(plan, w, t0, t1);
    recorder->records.back().queue = Queue::IO;
  }
}

// A carried optimizer read (Action::carry): issued into its slot and kept past the segment
// (nothing to do when the slot already holds that read); or, with Action::adopt, adopted as
// this fetch's read. Returns 1 (issued or already pending), 2 (adopted) or 0 (to adopt, but
// no such read is pending: the caller reads now).
int ShardedModel::Impl::run_carried(const StepPlan& plan, int i) {
  const Action& a = plan.actions[size_t(i)];
  SW_CHECK(nvme && a.io == kIoMoments, "plan: a carried fetch that is not of NVMe moments");
  if (nvme->carried.size() < nvme->slots.size()) nvme->carried.resize(nvme->slots.size());
  NvmeMoments::Carried& c = nvme->carried[size_t(a.slot)];
  const bool same = c.ev && c.unit == a.unit && c.lo == a.lo && c.hi == a.hi;
  if (a.adopt) {
    if (!same) {
      if (c.ev) ops->stream().wait_event(*c.ev);
      c = {};
      return 0;
    }
    nvme->ev[size_t(i)] = std::move(c.ev);  // observed (and recorded) by its WaitIo
    c = {};
    return 2;
  }
  if (!same) {
    if (c.ev) ops->stream().wait_event(*c.ev);  // the slot's previous read
    run_io(plan, i, *units[size_t(a.unit)]);
    c = {a.unit, a.lo, a.hi, std::move(nvme->ev[size_t(i)])};
  }
  return 1;
}

void NvmeMoments::settle_writes() {
  std::vector<IoEventPtr> w;
  w.swap(pending_writes);
  for (IoEventPtr& e : w) e->synchronize();
}

void NvmeMoments::drop_carried() {
  for (Carried& c : carried)
    if (c.ev) c.ev->synchronize();
  carried.assign(carried.size(), Carried{});
}

void ShardedModel::Impl::run_io(const StepPlan& plan, int i, FlatUnit& fu) {
  const Action& a = plan.actions[size_t(i)];
  const bool fetch = a.kind == ActionKind::Fetch;
  const size_t u = static_cast<size_t>(a.unit);
  const int64_t Sh = fu.shard_size();
  auto xfer = [&](IoStream& io, int fd, const std::string& path, float* buf, int64_t n,
                  int64_t off, std::shared_ptr<Event> after = nullptr) {
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    return fetch ? io.read(fd, path, buf, bytes, off, std::move(after))
                 : io.write(fd, path, buf, bytes, off, std::move(after));
  };
  if (a.lo >= a.hi) {  // a whole shard: a gather's master, or a reduction's gradients
    SW_CHECK(pnvme && pnvme->moff[u] >= 0, "io action on a unit whose parameters are not on NVMe");
    NvmeParams& pv = *pnvme;
    if (a.io == kIoMaster) {  // into a slot a gather may still be uploading from
      pv.ev[size_t(i)].push_back(xfer(*pv.io, pv.fd, pv.path, pv.pslots[size_t(a.slot)].f32(), Sh,
                                      pv.moff[u], std::move(pv.pbusy[size_t(a.slot)])));
    } else if (fetch) {  // only what was accumulated before is read; zeros are not
      if (!fu.grads_zero()) {
        pv.gfetch[u] = xfer(*pv.io, pv.fd, pv.path, pv.gslots[size_t(a.slot)].f32(), Sh, pv.goff[u]);
        pv.ev[size_t(i)].push_back(pv.gfetch[u]);
      }
    } else {
      IoEventPtr e = xfer(*pv.io, pv.fd, pv.path, pv.gslots[size_t(a.slot)].f32(), Sh, pv.goff[u]);
      pv.gbusy[size_t(a.slot)] = e;
      pv.ev[size_t(i)].push_back(e);
      fu.stage_grad(nullptr);
    }
    return;
  }
  // An optimizer piece [lo, hi): m then v (the moments file holds them so), master, gradients.
  float* q = opt_slot(a.slot);
  const int64_t n = a.hi - a.lo;
  if (a.io & kIoMoments) {
    SW_CHECK(nvme && nvme->offset[u] >= 0, "io action on a unit whose moments are not on NVMe");
    const int64_t off = nvme->offset[u] + 2 * a.lo * int64_t(sizeof(float));
    nvme->ev[size_t(i)] = xfer(nvme->io, nvme->fd, nvme->path, q, 2 * n, off);
    if (!fetch) fu.stage_moments(nullptr, nullptr);
    q += 2 * n;
  }
  if (a.io & kIoMaster) {
    NvmeParams& pv = *pnvme;
    const int64_t lo = a.lo * int64_t(sizeof(float));
    pv.ev[size_t(i)].push_back(xfer(*pv.io, pv.fd, pv.path, q, n, pv.moff[u] + lo));
    if (fetch) {
      if (!fu.grads_zero())
        pv.ev[size_t(i)].push_back(xfer(*pv.io, pv.fd, pv.path, q + n, n, pv.goff[u] + lo));
      else
        ops_for(Device::cpu()).fill(q + n, 0.f, static_cast<size_t>(n));  // host staging
    } else {
      fu.stage_master(nullptr);
      fu.stage_grad(nullptr);
    }
  }
}

void ShardedModel::Impl::run_act_io(const StepPlan& plan, int i) {
  const Action& a = plan.actions[size_t(i)];
  NvmeActs& A = *anvme;
  const size_t p = static_cast<size_t>(a.pos);
  if (A.off.size() < acts.size()) {
    A.off.resize(acts.size(), 0);
    A.act_bytes.resize(acts.size(), 0);
    A.writing.resize(acts.size());
  }
  std::vector<IoEventPtr>& evs = A.ev[size_t(i)];
  if (a.kind == ActionKind::Evict) {
    std::vector<Buffer> bufs;
    A.act_bytes[p] = acts[p].bytes();
    if (!acts[p].empty()) bufs.push_back(std::move(acts[p]));
    acts[p] = Buffer();
    for (Buffer& b : saved[p].detach()) bufs.push_back(std::move(b));
    int64_t total = 0;
    for (const Buffer& b : bufs) total += static_cast<int64_t>(b.bytes());
    A.off[p] = A.next;
    A.next = (A.next + total + 4095) / 4096 * 4096;
    reserve_acts(A.next);
    int64_t off = A.off[p];
    const size_t n = bufs.size();
    for (size_t k = 0; k < n; ++k) {
      const Buffer* from = &bufs[k];
      std::shared_ptr<Event> filled;
      if (!from->device().is_cpu()) {
        // A device buffer is written from a pinned host copy made on the download copy stream
        // (after the compute stream's work so far); the io stream starts the write once that
        // copy is done, so the host never waits for the device here. Both buffers are kept
        // until the write is done (the WaitIo below), where the plan frees the device bytes.
        Buffer h(from->bytes(), Mem::Activations, Device::cpu(), Tier::Host);
        filled = copy_bytes_async(h.data(), Device::cpu(), from->data(), from->device(),
                                  from->bytes());
        bufs.push_back(std::move(h));
        from = &bufs.back();
      }
      evs.push_back(A.io.write(A.fd, A.path, from->data(), from->bytes(), off, std::move(filled)));
      off += static_cast<int64_t>(from->bytes());
    }
    A.writing[p] = std::move(bufs);
    return;
  }
  std::vector<Buffer*> bufs;
  if (A.act_bytes[p] > 0) {
    acts[p] = Buffer(A.act_bytes[p], Mem::Activations, ops->device());
    bufs.push_back(&acts[p]);
  }
  for (Buffer* b : saved[p].reattach()) bufs.push_back(b);
  int64_t off = A.off[p];
  for (Buffer* b : bufs) {
    void* into = b->data();
    if (!b->device().is_cpu()) {  // read into host memory, uploaded at the WaitIo
      A.reading[i].emplace_back(Buffer(b->bytes(), Mem::Activations, Device::cpu(), Tier::Host), b);
      into = A.reading[i].back().first.data();
    }
    evs.push_back(A.io.read(A.fd, A.path, into, b->bytes(), off));
    off += static_cast<int64_t>(b->bytes());
  }
}

float* ShardedModel::Impl::opt_slot(int slot) {
  return nvme ? nvme->slots[size_t(slot)].f32() : pnvme->opt_slots[size_t(slot)].f32();
}

// ---- Reductions ------------------------------------------------------------------------------

void ShardedModel::Impl::issue_bucket(int bi, int action) {
  const PlanBucket& b = plan_in.buckets[static_cast<size_t>(bi)];
  float* p = bucket_buf.f32() + b.lo;
  const DType rdt = policy.mixed_precision.reduce_dtype;
  ReduceOp op = ReduceOp::Avg;
  if (rdt != DType::F32) {  // divide, then sum in 16 bits (FlatUnit::issue_reduce_scatter)
    ops->scale(p, 1.f / static_cast<float>(R), static_cast<size_t>(b.hi - b.lo));
    ops->narrow(rdt, p, p, static_cast<size_t>(b.hi - b.lo));  // at the front of the range
    op = ReduceOp::Sum;
  }
  PendingReduction r;
  r.action = action, r.kind = ActionKind::AllReduce, r.bucket = bi;
  r.bytes = (b.hi - b.lo) * static_cast<int64_t>(dtype_size(rdt));
  r.t_issue = recorder ? trace_clock() : 0;
  r.seq = next_seq();
  r.work = rep->issue_all_reduce(p, p, b.hi - b.lo, op, rdt);
  pending.push_back(std::move(r));
}

void ShardedModel::Impl::issue_follow_up(FlatUnit& fu, PendingReduction& r) {
  // The newest pending reduction is the unit's reduce-scatter (the plan issues the two back to
  // back); the all-reduce starts on the replica group once it has completed, without the host
  // waiting (Collective::after), so both groups' collectives go out in plan order on every rank.
  SW_CHECK(!pending.empty() && pending.back().kind == ActionKind::ReduceScatter &&
               pending.back().unit == r.unit,
           "executor: HYBRID's all-reduce of unit '" + fu.unit()->name() +
               "' does not follow its reduce-scatter");
  void* blk = fu.reduced_block();
  r.t_issue = recorder ? trace_clock() : 0;
  r.seq = next_seq();
  r.work = rep->issue_all_reduce_after(
      pending.back().work, blk, blk, fu.shard_size(),
      fu.reduce_dtype() == DType::F32 ? ReduceOp::Avg : ReduceOp::Sum,  // divided before
      fu.reduce_dtype());
  pending.push_back(std::move(r));
}

void ShardedModel::Impl::complete_reductions(int through) {
  while (!pending.empty() && (through < 0 || pending.front().action <= through)) {
    PendingReduction done = std::move(pending.front());
    pending.pop_front();
    done.work.wait();
    if (done.bucket >= 0) {
      const PlanBucket& b = plan_in.buckets[static_cast<size_t>(done.bucket)];
      float* p = bucket_buf.f32() + b.lo;
      ops->widen(policy.mixed_precision.reduce_dtype, p, p, static_cast<size_t>(b.hi - b.lo));
      for (int u : b.members) units[static_cast<size_t>(u)]->reduced_in_place();
    } else if (done.finishes) {
      FlatUnit& f = *units[static_cast<size_t>(done.unit)];
      if (!f.params_on_nvme() && f.grad_device() != ops->device()) {
        accumulate_on_host(f);
      } else if (!f.params_on_nvme()) {
        f.accumulate_reduced();
      } else if (!f.grad_shard()) {  // outside the plan
        accumulate_nvme(f);
      } else {  // into the staging buffer the plan gave it; its Evict writes it back
        IoEventPtr& rd = pnvme->gfetch[static_cast<size_t>(done.unit)];
        if (rd) rd->synchronize();
        rd = nullptr;
        f.accumulate_reduced();
        pnvme->sumsq[static_cast<size_t>(done.unit)] =
            ops_for(Device::cpu()).sum_squares(f.grad_shard(), static_cast<size_t>(f.shard_size()));
      }
    }
    if (recorder && done.action >= 0) {
      ActionRecord rec;
      rec.action = done.action;
      rec.segment = recorder->segments - 1;
      rec.kind = done.kind;
      rec.queue = Queue::Reduce;
      rec.unit = done.unit;
      rec.bucket = done.bucket;
      rec.bytes = done.bytes;
      rec.t_begin = done.work.started_at() > 0 ? done.work.started_at() : done.t_issue;
      rec.t_end = done.work.done_at() > 0 ? done.work.done_at() : trace_clock();
      rec.issued = done.seq;
      recorder->records.push_back(rec);
    }
  }
}

void ShardedModel::Impl::reduce_unit_now(FlatUnit& fu) {
  switch (fu.kind()) {
    case FlatUnit::Kind::Sharded:
    case FlatUnit::Kind::FullReplicated: {
      PendingReduction r;
      r.kind = ActionKind::ReduceScatter, r.unit = fu.index();
      r.finishes = R == 1;
      r.seq = next_seq();
      r.work = fu.issue_reduce_scatter(R);
      pending.push_back(std::move(r));
      if (R > 1) {
        PendingReduction ar;
        ar.kind = ActionKind::AllReduce, ar.unit = fu.index();
        issue_follow_up(fu, ar);
      }
      break;
    }
    case FlatUnit::Kind::Whole:
      if (R == 1) {
        fu.round_grads();
        fu.reduced_in_place();
      } else {
        issue_bucket(plan_in.units[static_cast<size_t>(fu.index())].bucket, -1);
      }
      break;
  }
}

void ShardedModel::Impl::sync_grads() {
  complete_reductions(-1);
  std::vector<FlatUnit*> order;
  for (auto& u : units) order.push_back(u.get());
  std::stable_sort(order.begin(), order.end(),
                   [](FlatUnit* a, FlatUnit* b) { return a->first_pos > b->first_pos; });
  std::vector<bool> bucket_done(plan_in.buckets.size());
  for (FlatUnit* fu : order) {
    if (!fu->grads_dirty()) continue;
    if (fu->kind() == FlatUnit::Kind::Whole && R > 1) {
      const int b = plan_in.units[static_cast<size_t>(fu->index())].bucket;
      if (bucket_done[static_cast<size_t>(b)]) continue;
      bucket_done[static_cast<size_t>(b)] = true;
    }
    reduce_unit_now(*fu);
  }
  complete_reductions(-1);
}

void ShardedModel::Impl::quiesce() noexcept {
  for (PendingReduction& p : pending) {
    try {
      p.work.wait();
    } catch (...) {
    }
  }
  pending.clear();
  settle_act_copies();
  for (auto& ring : batch_ring)
    for (Upload& up : ring) {
      try {
        if (up.done) up.done->synchronize();
      } catch (...) {
      }
      up.done = nullptr;
    }
  for (auto& u : units) u->quiesce();
}

void ShardedModel::Impl::abandon_step() {
  quiesce();
  free_activations();
  for (auto& u : units) {
    u->reshard();
    u->to_idle();
  }
}

// ---- Activation checkpointing ----------------------------------------------------------------

// After the training forward of position p: frees what the policy drops of its Saved and
// returns how backward must rebuild it (Off: nothing dropped). The loss call (the last
// position) is never checkpointed: its forward may already have produced gradients.
CheckpointMode ShardedModel::Impl::checkpoint(const Model& m, size_t p) {
  if (p + 1 == m.schedule.size()) return CheckpointMode::Off;
  const int u = m.schedule[p].unit;
  CheckpointMode mode = policy.activation_checkpointing.mode_for(u);
  if (mode == CheckpointMode::Selective && !m.units[static_cast<size_t>(u)]->selective_recompute())
    mode = CheckpointMode::Full;
  Saved& s = saved[p];
  switch (mode) {
    case CheckpointMode::Off:
      break;
    case CheckpointMode::Full:
      if (s.bytes() == 0) return CheckpointMode::Off;
      s.clear();
      break;
    case CheckpointMode::Selective:
      if (s.drop_cheap() == 0) return CheckpointMode::Off;
      break;
  }
  return mode;
}

// Before the backward of position q (parameters gathered): refills the call's Saved from its
// kept input, with the same parameters and batch as forward and no gradient buffers. Full:
// forward runs again (its output goes to scratch and is dropped); Selective: the unit's
// recompute_cheap rebuilds the buffers it dropped.
void ShardedModel::Impl::rebuild(Model& model, const Batch& batch, size_t q, float scale) {
  FlatUnit& fu = unit_at(model, q);
  UnitCtx ctx = ctx_for(fu, batch, static_cast<int>(q), true);  // (no gradient buffers)
  ctx.grad_scale = scale;
  scratch.reset();
  const int call = model.schedule[q].call;
  const float* x = q > 0 ? acts[q].f32() : nullptr;
  if (recompute[q] == CheckpointMode::Selective) {
    fu.unit()->recompute_cheap(ctx, call, x);
    return;
  }
  float* y = scratch.f32(static_cast<size_t>(batch.B) * batch.T * model.d_model());
  Scratch::Hold keep_y(scratch);  // forward's own scratch comes on top of y (ActivationDecl)
  fu.unit()->forward(ctx, call, x, y);
}

UnitCtx ShardedModel::Impl::ctx_for(FlatUnit& fu, const Batch& batch, int pos, bool training) {
  UnitCtx ctx;
  ctx.ops = compute_ops;
  ctx.batch = &batch;
  ctx.params = &fu.params();
  ctx.params16 = fu.params16();
  ctx.saved = &saved[static_cast<size_t>(pos)];
  ctx.scratch = &scratch;
  ctx.training = training;
  return ctx;
}

}  // namespace sw
