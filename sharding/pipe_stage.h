// The owner of pipeline parallelism's actions (sharding/step_plan.h): the sends and receives
// of a micro-batch's activations and their gradients between stages (recv_acts, send_acts,
// recv_grads, send_grads on the p2p queue, over the pipe group's point-to-point transport,
// sharding/comm/p2p.h), the waits for them (wait_p2p), and sync_shared: a unit held by two
// pipeline ranks (GPT-2's tied embedding and head, on the first and the last stage) has its
// reduced gradients summed between them, so both apply the same update.
//
// Stage g = chunk * P + rank (Model::stage). A chunk's input comes from stage g - 1 (rank
// (g - 1) mod P) and its output goes to g + 1; gradients the other way. A message's tag names
// its direction, the receiving stage and the micro-batch, so sends and receives match whatever
// else is in flight. Buffers are the Activations' (its edge buffers and the chunk's first
// input); a send's buffer is freed at the wait_p2p that lists it, or where it is later seen
// complete: sends never block a stage (its peer may post the receive only after this stage's
// next message), the segment's end waits for the last ones.
//
// State: the Work of each p2p action issued in the running segment.
#pragma once
#include <unordered_map>
#include <vector>

#include "sharding/action_records.h"
#include "sharding/activations.h"
#include "sharding/comm/p2p.h"
#include "sharding/component.h"
#include "sharding/model_context.h"

namespace sw {

class PipeStage final : public Component {
 public:
  PipeStage(const ModelContext& ctx, UnitList& units, Activations& acts, ActionRecords& records);
  const char* name() const override { return "pipe_stage"; }
  bool run(SegmentRun& s, int i) override;
  void begin(SegmentRun& s) override;
  void end(SegmentRun& s) override;
  // Waits for everything issued (an abandoned step).
  void quiesce() noexcept;
  CommStats stats() const;
  void reset_stats();

 private:
  struct Issued {
    Work work;
    double t_issue = 0;
  };
  int tag(int dir, int stage, int micro) const;
  void issue(SegmentRun& s, int i);
  void wait(SegmentRun& s, int j);
  void finish(SegmentRun& s, int j);  // j's Work waited for, recorded, a send's buffer freed
  void sync_shared(SegmentRun& s, int i);

  const ModelContext& ctx_;
  UnitList& units_;
  Activations& acts_;
  ActionRecords& records_;
  std::unordered_map<int, Issued> issued_;  // by action index, this segment
  std::vector<int> lingering_;              // sends past their wait_p2p, still in flight
};

}  // namespace sw
