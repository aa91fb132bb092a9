// Plan construction of activation offload (activation_checkpointing.offload; sharding/
// plan_builder.h): what a call keeps for its backward (its input and what checkpointing left of
// its Saved) is evicted right after its forward and fetched back before its backward, for
// every call but the first, the loss and the one before it (backward needs those at once).
// Where the copies complete later than their action (to the file, or the host tier on a
// device's copy streams), an evicted call's bytes are freed at a wait_acts after the next
// call's forward, and fetches are issued one call ahead, to overlap the backward of the call
// after; the CPU's copies to the host tier are done at issue.
#pragma once
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "sharding/step_plan.h"

namespace sw {

class PlanBuilder;

class ActivationIoPlan {
 public:
  explicit ActivationIoPlan(PlanBuilder& b) : b_(b) {}
  // Each micro-step fills the activation file from its start.
  void begin_micro_step();
  // After position p's training forward (and its checkpointing drop): its evict.
  void after_forward(int p, int u);
  // Before anything else of position p after its forward (at action fwd_at): waits for the
  // evicts issued before it, freeing their bytes.
  void wait_evicted(int p, int u, int fwd_at);
  void end_forward();  // waits for what is left
  // Before position q's backward call (its parameters gathered): its fetch (and the next
  // call's, ahead) and the wait for its own.
  void before_backward(int q, int u);

 private:
  bool offloads(int p) const;
  bool nvme() const;
  bool async() const;  // copies that complete later than their action
  int64_t kept_bytes(int p) const;
  void fetch(int q);

  PlanBuilder& b_;
  std::vector<std::pair<int, int64_t>> evicts_;  // not yet waited for: (action, bytes)
  std::map<int, int> fetch_at_;                  // per position: its fetch in this micro-step
  int64_t file_ = 0;  // bytes this micro-step writes to the file
};

}  // namespace sw
