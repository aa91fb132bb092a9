// Plan construction of the NVMe state (offload_optimizer / offload_param device nvme;
// sharding/plan_builder.h), as OffloadedState runs it:
//   optimizer pieces  a streamed unit's update (moments, or master and gradients, in the file)
//                     goes in pieces of at most piece_floats of its shard through the staging
//                     buffers: the first buffers - 1 are read ahead, and after piece k's update it
//                     is written back and piece k + buffers - 1 read into the buffer piece k - 1
//                     left (its write was queued before, and the io queue orders them). The last
//                     micro-step reads the optimizer's first pieces of moments ahead (carried
//                     reads), which the optimizer adopts.
//   deferred updates  (OptimizerOffload::defer_update) the first micro-step runs the deferred
//                     units' pieces in its forward, each unit's just before its first gather or
//                     use; the step's last micro-step then issues its carried reads.
//   gathers           an NVMe master is fetched into one of the parameter staging buffers ahead
//                     of its gather, as far ahead as the buffers allow (a pass over the finished
//                     plan: add_param_fetches).
//   reductions        a reduction accumulates into a gradient staging buffer, read first unless
//                     the gradients are zero, and written back after it; the micro-step ends
//                     with the writes done.
#pragma once
#include <cstdint>
#include <map>
#include <vector>

#include "sharding/step_plan.h"

namespace sw {

class PlanBuilder;

class StateIoPlan {
 public:
  explicit StateIoPlan(PlanBuilder& b) : b_(b) {}
  // The staging buffers' figures of `in` (staging_slots / bytes, param and grad slots, their
  // persistent bytes), once plan.shard_bytes holds the largest NVMe shard.
  static void size_staging(const PlanInput& in, StepPlan& plan);

  // ---- Micro-steps
  // Its start: the deferred updates' first reads (micro-step 0 with updates pending), or the
  // carried reads (the step's last).
  void begin_micro_step(int micro, bool last);
  // Before unit u's first gather or use: the deferred updates of units up to u.
  void update_through(int u);
  // A reduce-scatter of unit u (action rs) of NVMe parameters: its staging buffer and the read.
  void stage_reduction(int u, int rs);
  // After the wait_reduce at action wi that completed the reductions `done`: their write-backs.
  void write_back(const std::vector<int>& done, int wi);
  void end_backward();  // the micro-step ends with the gradients in the file

  // ---- The optimizer segment (flush: the deferred units' updates alone)
  bool deferred(int u) const { return unit_defers(b_in(), u); }
  void begin_optimizer(bool flush);
  void update_pieces(int u);  // unit u's pieces, when it is streamed
  void end_optimizer();       // masters written back before the next gathers read them

  // ---- The finished plan: each NVMe master fetched ahead of its gather.
  void add_param_fetches();

 private:
  struct Piece {
    int unit;
    int64_t lo, hi;  // floats of the unit's shard
  };
  enum class Which : uint8_t { All, Kept, Deferred };  // Kept: updates not deferred
  static std::vector<Piece> pieces(const PlanInput& in, Which w);
  static bool streamed(const PlanInput& in, int u);
  static uint8_t piece_io(const PlanInput& in, int u, bool fetch);
  static int64_t io_floats(uint8_t io);
  const PlanInput& b_in() const;
  int buffers() const;
  Action& add_piece_fetch(const std::vector<Piece>& ps, int k);
  int carried_pieces(const std::vector<Piece>& ps) const;
  bool any_deferred() const;
  void issue_carried_reads(const std::vector<int>& evicts);
  void begin_deferred();
  void deferred_fetch(int k, bool adopt);
  void optimizer_fetch(int k);

  PlanBuilder& b_;
  // Gradient staging: the buffers' round robin, the evict that last used each, and the evicts
  // the micro-step's end waits for.
  int next_gslot_ = 0;
  std::map<int, int> gslot_evict_;
  std::vector<int> grad_evicts_;
  // Deferred updates being planned into a micro-step's forward: the pieces, the next to
  // update, each piece's fetch and evict; last_: the step's last micro-step (it issues the
  // carried reads).
  bool last_ = false, dactive_ = false;
  std::vector<Piece> dpieces_;
  int dnext_ = 0;
  std::vector<int> dfetch_at_, devict_at_;
  // The optimizer segment being planned: its pieces, the next to update, those carried in, each
  // piece's fetch and evict, and the evicts waited for at its end.
  std::vector<Piece> opieces_;
  int onext_ = 0, ocarried_ = 0;
  std::vector<int> ofetch_at_, oevict_at_, oevict_wait_;
};

}  // namespace sw
