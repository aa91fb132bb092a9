// The owner of the compute actions on the residual stream: forward (a schedule position's call),
// drop_saved (activation checkpointing frees what its policy drops), recompute (rebuilds it
// before the backward) and backward. Its state is the activations a step keeps:
//   input(p)   the input x of position p's call (B*T*d floats, Mem::Activations; empty for
//              position 0, whose embedding ignores x), written by forward p - 1
//   saved(p)   what position p's call keeps for its backward (models/unit.h Saved)
//   the modes backward must rebuild each Saved with (Off: forward's was kept)
//   the call's Scratch, reserved as large as the plan says
//   two ping-pong (B*T*d) buffers kept across steps: backward's dy / dx (dy of one call is
//   dx of the next) and inference's residual stream; and, where the Ops read 16-bit operands,
//   backward's residual gradient in the compute precision (UnitCtx::grad16)
// and, within a segment, the chain from one call to the next (forward's x, backward's dy).
#pragma once
#include <vector>

#include "core/alloc.h"
#include "models/unit.h"
#include "sharding/component.h"
#include "sharding/model_context.h"

namespace sw {

class Activations final : public Component {
 public:
  Activations(const ModelContext& ctx, UnitList& units, size_t positions);
  const char* name() const override { return "activations"; }
  bool run(SegmentRun& s, int i) override;
  void begin(SegmentRun& s) override;

  // The kept activations of position p (activation offload moves them between tiers).
  Buffer& input(size_t p) { return acts_[p]; }
  Saved& saved(size_t p) { return saved_[p]; }
  size_t positions() const { return acts_.size(); }
  // The step's temporaries come from memory reserved once, as large as the plan says.
  void reserve_scratch(size_t bytes) { scratch_.reserve(bytes); }
  // The ping-pong buffers (and the 16-bit residual gradient) for n floats of residual stream.
  // Tensor parallelism: what the units' calls get as UnitCtx::tensor (null: none).
  void set_tensor(TensorComm* t) { tensor_ = t; }
  void ensure_pingpong(size_t n);
  // Frees every position's input and Saved and forgets what was to be rebuilt (a step's end).
  void free_all();

 private:
  TensorComm* tensor_ = nullptr;
  void forward(SegmentRun& s, const Action& a);
  void backward(SegmentRun& s, const Action& a);
  // After position p's training forward: frees what the policy drops of its Saved and returns
  // how backward must rebuild it (Off: nothing dropped).
  CheckpointMode checkpoint(const Model& m, size_t p);
  // Before position q's backward: refills its Saved from the kept input.
  void rebuild(SegmentRun& s, size_t q);
  UnitCtx ctx_for(FlatUnit& fu, const Batch& batch, size_t pos, bool training);

  const ModelContext& ctx_;
  UnitList& units_;
  std::vector<Buffer> acts_;
  std::vector<Saved> saved_;
  std::vector<CheckpointMode> recompute_;
  Scratch scratch_;
  Buffer dbuf_[2];
  Buffer grad16_;
  // The chain within a segment.
  const float* x_ = nullptr;   // forward: the input of the next call
  const float* dy_ = nullptr;  // backward: dy of the next call
  bool dy16_ = false;          // backward: grad16_ holds narrow(dy) (UnitCtx::grad16)
  int cur_ = 0;                // backward: the ping-pong buffer the next dx goes to
};

}  // namespace sw
