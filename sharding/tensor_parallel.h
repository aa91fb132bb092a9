// The owner of the tensor-parallel actions (docs/ARCHITECTURE.md, "Tensor parallelism"):
// tp_gather_rows, tp_scatter_rows and tp_all_gather, which a tensor-parallel call asks for
// while it runs (it is the TensorComm its UnitCtx carries), and tp_reduce_grads, a unit's
// replicated gradients summed over the tensor group before its data-parallel reduction.
//
// The plan lists each call's collectives after its compute action (Action::inside); when the
// unit asks for one, this component takes the next listed one, checks it is the one the unit
// declared for that action (op and bytes), runs it on the tensor group and records it on the
// tensor queue. The executor reaching that action then finds it done. A unit asking for a
// collective the plan does not list, or one the unit did not ask for, is an internal error
// (the declaration and the unit disagree).
#pragma once
#include <vector>

#include "sharding/action_records.h"
#include "sharding/component.h"
#include "sharding/model_context.h"

namespace sw {

class TensorParallel final : public Component, public TensorComm {
 public:
  TensorParallel(const ModelContext& ctx, UnitList& units, ActionRecords& records)
      : ctx_(ctx), units_(units), records_(records) {}
  const char* name() const override { return "tensor parallel"; }
  bool run(SegmentRun& s, int i) override;
  void begin(SegmentRun& s) override;
  void end(SegmentRun& s) override;
  // What units get as UnitCtx::tensor: null without a tensor group.
  TensorComm* comm() { return ctx_.tensor ? this : nullptr; }

  // TensorComm
  int rank() const override { return ctx_.tensor->rank(); }
  int size() const override { return ctx_.tensor->size(); }
  void gather(TensorOp op, void* full, const void* mine, size_t bytes) override;
  void scatter(float* mine, const float* full, size_t n) override;

  // Sums unit u's replicated gradients over the tensor group (outside a plan too: the same
  // call the tp_reduce_grads action makes).
  void reduce_grads(int u);

 private:
  // The next planned collective for the running action; checks it is `op` of `bytes`.
  int take(TensorOp op, int64_t bytes);
  void record(int i, double t0, const Work& w);  // action i done (its collective: w)
  std::vector<Work> sum_replicated(int u);        // reduce_grads' all-reduces, each waited
  const ModelContext& ctx_;
  UnitList& units_;
  ActionRecords& records_;
  SegmentRun* seg_ = nullptr;
  std::vector<int> planned_;   // indices of the segment's in-call tensor actions, in order
  std::vector<uint8_t> done_;  // by action index
  size_t next_ = 0;
};

}  // namespace sw
