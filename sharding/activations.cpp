#include "sharding/activations.h"

#include <algorithm>

#include "core/error.h"
#include "sharding/unit_state.h"

namespace sw {

Activations::Activations(const ModelContext& ctx, UnitList& units, size_t positions)
    : ctx_(ctx), units_(units), positions_(positions) {
  slot_(0);
  scratch_.set_device(ctx.device());
}

Activations::Slot& Activations::slot_(size_t s) {
  while (slots_.size() <= s) {
    Slot sl;
    sl.acts.resize(positions_);
    sl.saved.resize(positions_);
    for (Saved& sv : sl.saved) sv.set_device(ctx_.device());
    sl.recompute.assign(positions_, CheckpointMode::Off);
    slots_.push_back(std::move(sl));
  }
  return slots_[s];
}

Buffer& Activations::edge(Edge e, size_t slot, size_t chunk, size_t n) {
  std::vector<Buffer>& v = slot_(slot).edges[static_cast<size_t>(e)];
  if (v.size() <= chunk) v.resize(chunk + 1);
  Buffer& b = v[chunk];
  if (n > 0 && b.bytes() != n * sizeof(float))
    b = Buffer(n * sizeof(float), Mem::Activations, ctx_.device());
  return b;
}

void Activations::ensure_pingpong(size_t n) {
  for (Buffer& b : dbuf_)
    if (b.bytes() < n * sizeof(float)) b = Buffer(n * sizeof(float), Mem::Workspace, ctx_.device());
  const Ops& co = *ctx_.compute_ops;
  if (co.prefers_lp_operands() && co.compute() != DType::F32 && grad16_.bytes() < n * sizeof(uint16_t))
    grad16_ = Buffer(n * sizeof(uint16_t), Mem::Workspace, ctx_.device());
}

void Activations::free_all() {
  for (Slot& sl : slots_) {
    for (Buffer& a : sl.acts) a.release();
    for (Saved& s : sl.saved) s.clear();
    std::fill(sl.recompute.begin(), sl.recompute.end(), CheckpointMode::Off);
    for (auto& v : sl.edges)
      for (Buffer& b : v) b.release();
  }
  if (wgrad_) wgrad_->clear();
}

void Activations::begin(SegmentRun&) {
  x_ = dy_ = nullptr;
  dy16_ = false;
  cur_ = 0;
}

bool Activations::run(SegmentRun& s, int i) {
  const Action& a = s.action(i);
  const size_t p = a.pos >= 0 ? static_cast<size_t>(a.pos) : 0;
  const size_t sl = slot_of(a);
  switch (a.kind) {
    case ActionKind::Forward:
      forward(s, a);
      break;
    case ActionKind::DropSaved:
      slot_(sl).recompute[p] = checkpoint(s.model, p, sl);
      break;
    case ActionKind::Recompute:
      if (slot_(sl).recompute[p] != CheckpointMode::Off) {
        rebuild(s, p, sl);
        slot_(sl).recompute[p] = CheckpointMode::Off;
      }
      break;
    case ActionKind::Backward:
      backward(s, a);
      break;
    case ActionKind::BackwardWeight:
      if (wgrad_) wgrad_->run(static_cast<uint64_t>(a.micro) * 64 + static_cast<uint64_t>(a.chunk));
      break;
    default:
      SW_CHECK(false, std::string("activations: not an action of theirs: ") +
                          action_kind_name(a.kind));
  }
  return true;
}

void Activations::forward(SegmentRun& s, const Action& a) {
  FlatUnit& fu = *units_[static_cast<size_t>(a.unit)];
  const Model& model = s.model;
  const size_t sl = slot_of(a);
  Slot& slot = slot_(sl);
  const Batch& batch = s.args.batch_for(a.micro);
  const bool training = s.args.training;
  const bool piped = a.chunk >= 0;
  const size_t p = static_cast<size_t>(a.pos);
  const bool loss = model.is_loss(p);
  size_t lo = 0, hi = model.schedule.size();
  if (piped) {
    lo = static_cast<size_t>(model.stage.chunk_begin[size_t(a.chunk)]);
    hi = static_cast<size_t>(model.stage.chunk_begin[size_t(a.chunk) + 1]);
    if (p == lo) x_ = model.takes_input(p) ? slot.acts[p].f32() : nullptr;  // as received
  }
  // (Pipeline: the unit's backward of an earlier micro-batch may have finished: a new one.)
  if (piped && fu.training_state() == TrainingState::PostBackward) fu.to_idle();
  if (training) fu.to_forward();
  // The loss call may compute the head's gradients during forward (models/unit.h): its unit
  // gets its gradient buffer now (backward starts with it anyway).
  if (training && loss) fu.ensure_grads();
  float* y = nullptr;  // the last call (the loss) writes no y
  const size_t n = static_cast<size_t>(batch.B) * batch.T * model.residual_width();
  if (!loss) {
    if (piped && p + 1 == hi) {  // to the next stage
      y = edge(Edge::ActsOut, sl, size_t(a.chunk), n).f32();
    } else if (training) {
      Buffer& next = slot.acts[p + 1];
      if (next.bytes() != n * sizeof(float))
        next = Buffer(n * sizeof(float), Mem::Activations, ctx_.device());
      y = next.f32();
    } else {
      y = dbuf_[p % 2].f32();
    }
  }
  UnitCtx ctx = ctx_for(fu, batch, p, training, sl);
  if (training)  // (a loss call's fused head produces gradients in forward)
    fu.open_grads(ctx);
  else
    ctx.grads = &fu.grads();
  const bool per_micro = s.args.batches != nullptr;
  ctx.grad_scale = per_micro ? s.args.scales[size_t(a.micro)] : s.args.scale;
  ctx.logits = s.args.logits;
  ctx.loss_total = per_micro ? s.args.loss_totals[size_t(a.micro)] : s.args.loss_total;
  scratch_.reset();
  fu.unit()->forward(ctx, model.schedule[p].call, x_, y);
  if (per_micro) {
    s.args.loss_sums[size_t(a.micro)] += ctx.loss_sum;
    s.args.loss_counts[size_t(a.micro)] += ctx.loss_count;
  }
  s.args.loss_sum += ctx.loss_sum;
  s.args.loss_count += ctx.loss_count;
  if (!training) {
    slot.saved[p].clear();
    if (piped && p == lo) slot.acts[p].release();  // the received input, read
  }
  x_ = y;
}

void Activations::backward(SegmentRun& s, const Action& a) {
  FlatUnit& fu = *units_[static_cast<size_t>(a.unit)];
  const Model& model = s.model;
  const size_t p = static_cast<size_t>(a.pos);
  const size_t sl = slot_of(a);
  Slot& slot = slot_(sl);
  const bool piped = a.chunk >= 0;
  bool first = false;  // the chunk's first position: its dx goes to the previous stage
  if (piped) {
    const size_t lo = static_cast<size_t>(model.stage.chunk_begin[size_t(a.chunk)]);
    const size_t hi = static_cast<size_t>(model.stage.chunk_begin[size_t(a.chunk) + 1]);
    if (p + 1 == hi) {  // the chunk's last position: dy was received (none for the loss call)
      dy_ = model.is_loss(p) ? nullptr : edge(Edge::GradIn, sl, size_t(a.chunk)).f32();
      dy16_ = false;
      cur_ = 0;
    }
    first = p == lo;
  }
  if (piped && fu.training_state() == TrainingState::PostBackward) {  // another micro-batch's
    fu.to_idle();
    fu.to_forward();
  }
  fu.to_pre_backward();
  fu.ensure_grads();
  const bool takes = model.takes_input(p);
  const Batch& batch = s.args.batch_for(a.micro);
  const size_t n = static_cast<size_t>(batch.B) * batch.T * model.residual_width();
  // A unit whose backward takes dx == dy (Unit::backward_in_place) writes its dx over its dy,
  // the other ping-pong buffer (dbuf_[cur_ ^ 1] holds every dy but the loss call's none, and
  // a received one).
  const bool dy_pingpong = dy_ != nullptr && (dy_ == dbuf_[0].f32() || dy_ == dbuf_[1].f32());
  const bool in_place = takes && !first && dy_pingpong && fu.unit()->backward_in_place();
  float* dx = nullptr;
  if (takes)
    dx = first && piped ? edge(Edge::GradOut, sl, size_t(a.chunk), n).f32()
                        : dbuf_[in_place ? cur_ ^ 1 : cur_].f32();
  SW_CHECK(!in_place || dx == dy_, "backward in place: dy is not the other ping-pong buffer");
  UnitCtx ctx = ctx_for(fu, batch, p, true, sl);
  fu.open_grads(ctx);
  ctx.grad_scale = s.args.batches ? s.args.scales[size_t(a.micro)] : s.args.scale;
  if (!grad16_.empty() && !(first && piped)) {
    ctx.grad16 = static_cast<uint16_t*>(grad16_.data());
    ctx.dy16 = dy16_ && dy_ != nullptr;
  }
  if (a.defer) {  // zero bubble: the linear layers' weight gradients wait for BackwardWeight
    if (!wgrad_) wgrad_ = std::make_unique<DeferredWeightGrads>(*ctx.ops);
    SW_CHECK(&wgrad_->inner() == ctx.ops, "deferred weight gradients: the units' Ops changed");
    wgrad_->begin(static_cast<uint64_t>(a.micro) * 64 + static_cast<uint64_t>(a.chunk));
    ctx.ops = &wgrad_->ops();
  }
  scratch_.reset();
  try {
    fu.unit()->backward(ctx, model.schedule[p].call, takes ? slot.acts[p].f32() : nullptr, dy_, dx);
  } catch (...) {
    if (a.defer) wgrad_->end();
    throw;
  }
  if (a.defer) wgrad_->end();
  dy16_ = ctx.dx16 && dx != nullptr;
  fu.mark_dirty();
  slot.acts[p].release();  // this call's activations are no longer needed
  slot.saved[p].clear();
  if (piped && dy_ != nullptr && !dy_pingpong) edge(Edge::GradIn, sl, size_t(a.chunk)).release();
  if (a.pos == fu.first_pos) fu.to_post_backward();  // the unit's last backward call
  dy_ = dx;
  if (takes && !in_place && !(first && piped)) cur_ ^= 1;
}

// The loss call is never checkpointed: its forward may already have produced gradients.
CheckpointMode Activations::checkpoint(const Model& m, size_t p, size_t slot) {
  if (m.is_loss(p)) return CheckpointMode::Off;
  const int u = m.schedule[p].unit;
  CheckpointMode mode = ctx_.policy.activation_checkpointing.mode_for(u);
  if (mode == CheckpointMode::Selective && !m.units[static_cast<size_t>(u)]->selective_recompute())
    mode = CheckpointMode::Full;
  Saved& sv = slot_(slot).saved[p];
  switch (mode) {
    case CheckpointMode::Off:
      break;
    case CheckpointMode::Full:
      if (sv.bytes() == 0) return CheckpointMode::Off;
      sv.clear();
      break;
    case CheckpointMode::Selective:
      if (sv.drop_cheap() == 0) return CheckpointMode::Off;
      break;
  }
  return mode;
}

// With the parameters gathered, the same parameters and batch as forward and no gradient
// buffers. Full: forward runs again (its output goes to scratch and is dropped); Selective: the
// unit's recompute_cheap rebuilds the buffers it dropped.
void Activations::rebuild(SegmentRun& s, size_t q, size_t sl) {
  Model& model = s.model;
  FlatUnit& fu = *units_[static_cast<size_t>(model.schedule[q].unit)];
  Slot& slot = slot_(sl);
  const Action& a = s.action(s.current);
  const Batch& batch = s.args.batch_for(a.micro);
  UnitCtx ctx = ctx_for(fu, batch, q, true, sl);  // (no gradient buffers)
  ctx.grad_scale = s.args.batches ? s.args.scales[size_t(a.micro)] : s.args.scale;
  scratch_.reset();
  const int call = model.schedule[q].call;
  const float* x = model.takes_input(q) ? slot.acts[q].f32() : nullptr;
  if (slot.recompute[q] == CheckpointMode::Selective) {
    fu.unit()->recompute_cheap(ctx, call, x);
    return;
  }
  float* y = scratch_.f32(static_cast<size_t>(batch.B) * batch.T * model.residual_width());
  Scratch::Hold keep_y(scratch_);  // forward's own scratch comes on top of y (ActivationDecl)
  fu.unit()->forward(ctx, call, x, y);
}

UnitCtx Activations::ctx_for(FlatUnit& fu, const Batch& batch, size_t pos, bool training,
                             size_t sl) {
  UnitCtx ctx;
  ctx.ops = ctx_.compute_ops;
  ctx.batch = &batch;
  ctx.params = &fu.params();
  ctx.params16 = fu.params16();
  ctx.saved = &slot_(sl).saved[pos];
  ctx.scratch = &scratch_;
  ctx.training = training;
  ctx.tensor = tensor_;
  return ctx;
}

}  // namespace sw
