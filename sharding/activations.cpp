#include "sharding/activations.h"

#include <algorithm>

#include "core/error.h"
#include "sharding/unit_state.h"

namespace sw {

Activations::Activations(const ModelContext& ctx, UnitList& units, size_t positions)
    : ctx_(ctx), units_(units), acts_(positions), saved_(positions),
      recompute_(positions, CheckpointMode::Off) {
  for (Saved& sv : saved_) sv.set_device(ctx.device());
  scratch_.set_device(ctx.device());
}

void Activations::ensure_pingpong(size_t n) {
  for (Buffer& b : dbuf_)
    if (b.bytes() < n * sizeof(float)) b = Buffer(n * sizeof(float), Mem::Workspace, ctx_.device());
  const Ops& co = *ctx_.compute_ops;
  if (co.prefers_lp_operands() && co.compute() != DType::F32 && grad16_.bytes() < n * sizeof(uint16_t))
    grad16_ = Buffer(n * sizeof(uint16_t), Mem::Workspace, ctx_.device());
}

void Activations::free_all() {
  for (Buffer& a : acts_) a.release();
  for (Saved& s : saved_) s.clear();
  std::fill(recompute_.begin(), recompute_.end(), CheckpointMode::Off);
}

void Activations::begin(SegmentRun&) {
  x_ = dy_ = nullptr;
  dy16_ = false;
  cur_ = 0;
}

bool Activations::run(SegmentRun& s, int i) {
  const Action& a = s.action(i);
  const size_t p = a.pos >= 0 ? static_cast<size_t>(a.pos) : 0;
  switch (a.kind) {
    case ActionKind::Forward:
      forward(s, a);
      break;
    case ActionKind::DropSaved:
      recompute_[p] = checkpoint(s.model, p);
      break;
    case ActionKind::Recompute:
      if (recompute_[p] != CheckpointMode::Off) {
        rebuild(s, p);
        recompute_[p] = CheckpointMode::Off;
      }
      break;
    case ActionKind::Backward:
      backward(s, a);
      break;
    default:
      SW_CHECK(false, std::string("activations: not an action of theirs: ") +
                          action_kind_name(a.kind));
  }
  return true;
}

void Activations::forward(SegmentRun& s, const Action& a) {
  FlatUnit& fu = *units_[static_cast<size_t>(a.unit)];
  const Batch& batch = *s.args.batch;
  const bool training = s.args.training;
  const size_t P = s.model.schedule.size(), p = static_cast<size_t>(a.pos);
  if (training) fu.to_forward();
  // The loss call may compute the head's gradients during forward (models/unit.h): its unit
  // gets its gradient buffer now (backward starts with it anyway).
  if (training && p + 1 == P) fu.ensure_grads();
  float* y = nullptr;  // the last call (the loss) writes no y
  const size_t n = static_cast<size_t>(batch.B) * batch.T * s.model.residual_width();
  if (p + 1 < P) {
    if (training) {
      Buffer& next = acts_[p + 1];
      if (next.bytes() != n * sizeof(float))
        next = Buffer(n * sizeof(float), Mem::Activations, ctx_.device());
      y = next.f32();
    } else {
      y = dbuf_[p % 2].f32();
    }
  }
  UnitCtx ctx = ctx_for(fu, batch, p, training);
  if (training)  // (a loss call's fused head produces gradients in forward)
    fu.open_grads(ctx);
  else
    ctx.grads = &fu.grads();
  ctx.grad_scale = s.args.scale;
  ctx.logits = s.args.logits;
  ctx.loss_total = s.args.loss_total;
  scratch_.reset();
  fu.unit()->forward(ctx, s.model.schedule[p].call, x_, y);
  s.args.loss_sum += ctx.loss_sum;
  s.args.loss_count += ctx.loss_count;
  if (!training) saved_[p].clear();
  x_ = y;
}

void Activations::backward(SegmentRun& s, const Action& a) {
  FlatUnit& fu = *units_[static_cast<size_t>(a.unit)];
  const size_t p = static_cast<size_t>(a.pos);
  fu.to_pre_backward();
  fu.ensure_grads();
  // A unit whose backward takes dx == dy (Unit::backward_in_place) writes its dx over its dy,
  // the other ping-pong buffer (dbuf_[cur_ ^ 1] holds every dy but the loss call's none).
  const bool in_place = p > 0 && dy_ != nullptr && fu.unit()->backward_in_place();
  float* dx = p > 0 ? dbuf_[in_place ? cur_ ^ 1 : cur_].f32() : nullptr;
  SW_CHECK(!in_place || dx == dy_, "backward in place: dy is not the other ping-pong buffer");
  UnitCtx ctx = ctx_for(fu, *s.args.batch, p, true);
  fu.open_grads(ctx);
  ctx.grad_scale = s.args.scale;
  if (!grad16_.empty()) {
    ctx.grad16 = static_cast<uint16_t*>(grad16_.data());
    ctx.dy16 = dy16_ && dy_ != nullptr;
  }
  scratch_.reset();
  fu.unit()->backward(ctx, s.model.schedule[p].call, p > 0 ? acts_[p].f32() : nullptr, dy_, dx);
  dy16_ = ctx.dx16 && dx != nullptr;
  fu.mark_dirty();
  acts_[p].release();  // this call's activations are no longer needed
  saved_[p].clear();
  if (a.pos == fu.first_pos) fu.to_post_backward();  // the unit's last backward call
  dy_ = dx;
  if (!in_place) cur_ ^= 1;
}

// The loss call (the last position) is never checkpointed: its forward may already have
// produced gradients.
CheckpointMode Activations::checkpoint(const Model& m, size_t p) {
  if (p + 1 == m.schedule.size()) return CheckpointMode::Off;
  const int u = m.schedule[p].unit;
  CheckpointMode mode = ctx_.policy.activation_checkpointing.mode_for(u);
  if (mode == CheckpointMode::Selective && !m.units[static_cast<size_t>(u)]->selective_recompute())
    mode = CheckpointMode::Full;
  Saved& sv = saved_[p];
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
void Activations::rebuild(SegmentRun& s, size_t q) {
  Model& model = s.model;
  FlatUnit& fu = *units_[static_cast<size_t>(model.schedule[q].unit)];
  const Batch& batch = *s.args.batch;
  UnitCtx ctx = ctx_for(fu, batch, q, true);  // (no gradient buffers)
  ctx.grad_scale = s.args.scale;
  scratch_.reset();
  const int call = model.schedule[q].call;
  const float* x = q > 0 ? acts_[q].f32() : nullptr;
  if (recompute_[q] == CheckpointMode::Selective) {
    fu.unit()->recompute_cheap(ctx, call, x);
    return;
  }
  float* y = scratch_.f32(static_cast<size_t>(batch.B) * batch.T * model.residual_width());
  Scratch::Hold keep_y(scratch_);  // forward's own scratch comes on top of y (ActivationDecl)
  fu.unit()->forward(ctx, call, x, y);
}

UnitCtx Activations::ctx_for(FlatUnit& fu, const Batch& batch, size_t pos, bool training) {
  UnitCtx ctx;
  ctx.ops = ctx_.compute_ops;
  ctx.batch = &batch;
  ctx.params = &fu.params();
  ctx.params16 = fu.params16();
  ctx.saved = &saved_[pos];
  ctx.scratch = &scratch_;
  ctx.training = training;
  ctx.tensor = tensor_;
  return ctx;
}

}  // namespace sw
