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
// Pipeline parallelism: a pipeline segment keeps these per micro-batch in flight (slot = the
// action's micro), and each chunk's boundary buffers: its output to send, the dy received for
// it, the dx of its input to send (the input received is input(slot, its first position)).
// Zero bubble: a Backward with Action::defer runs through DeferredWeightGrads (its linear
// layers' weight gradients recorded), a BackwardWeight runs what was recorded.
#pragma once
#include <memory>
#include <vector>

#include "core/alloc.h"
#include "models/unit.h"
#include "sharding/component.h"
#include "sharding/deferred_wgrad.h"
#include "sharding/model_context.h"

namespace sw {

class Activations final : public Component {
 public:
  Activations(const ModelContext& ctx, UnitList& units, size_t positions);
  const char* name() const override { return "activations"; }
  bool run(SegmentRun& s, int i) override;
  void begin(SegmentRun& s) override;

  // The kept activations of position p (activation offload moves them between tiers; slot:
  // a pipeline's micro-batch).
  Buffer& input(size_t p, size_t slot = 0) { return slot_(slot).acts[p]; }
  Saved& saved(size_t p, size_t slot = 0) { return slot_(slot).saved[p]; }
  size_t positions() const { return positions_; }
  // Pipeline: chunk c's boundary buffers for micro-batch `slot` (allocated with n floats when
  // empty): what its last forward wrote for the next stage, the dy received for its last
  // position, the dx of its first one for the previous stage.
  enum class Edge : uint8_t { ActsOut, GradIn, GradOut };
  Buffer& edge(Edge e, size_t slot, size_t chunk, size_t n = 0);
  // Deferred weight gradients (zero bubble) still held, bytes.
  int64_t deferred_bytes() const { return wgrad_ ? wgrad_->pending_bytes() : 0; }
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
  // Before position q's backward: refills its Saved from the kept input.
  void rebuild(SegmentRun& s, size_t q, size_t slot);
  UnitCtx ctx_for(FlatUnit& fu, const Batch& batch, size_t pos, bool training, size_t slot);
  CheckpointMode checkpoint(const Model& m, size_t p, size_t slot);

  struct Slot {
    std::vector<Buffer> acts;
    std::vector<Saved> saved;
    std::vector<CheckpointMode> recompute;
    std::vector<Buffer> edges[3];  // per chunk, per Edge
  };
  Slot& slot_(size_t s);
  static size_t slot_of(const Action& a) { return a.chunk >= 0 ? static_cast<size_t>(a.micro) : 0; }
  const ModelContext& ctx_;
  UnitList& units_;
  size_t positions_ = 0;
  std::vector<Slot> slots_;
  std::unique_ptr<DeferredWeightGrads> wgrad_;  // made on the first deferred backward
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
