// The executor: runs a StepPlan's actions in order (sharding/step_plan.h), each by the one
// component that owns its kind (sharding/component.h). On the CPU backend the compute queue is
// this thread, the gather and reduce queues are the groups' communication threads (one ordered
// sequence of collectives per group) and the io queue the offload store's (offload/io_stream.h);
// an event is a collective's Work or an io's IoEvent. A CUDA build maps the same queues to
// streams and the waits to cudaStreamWaitEvent (docs/ARCHITECTURE.md, "Queues").
//
// The plan is a prediction made from declared sizes; the components still check the state they
// act on (a gather already in flight is not issued twice, a checkpoint drops what the Saved
// really holds), so a plan built for a state the model is not in (the first step has no prefetch
// from a previous optimizer) stays correct.
//
// SHARDWISE_EXEC_DELAY_US=N (tests): a random sleep of up to N us before each action, so that a
// missing wait shows up as a wrong result.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "sharding/action_records.h"
#include "sharding/component.h"

namespace sw {

class Executor {
 public:
  Executor(ActionRecords& records, int rank);

  // `c` owns `kinds`: every action of those kinds is run by c. A kind has one owner (checked).
  void own(Component& c, std::initializer_list<ActionKind> kinds);
  // Throws naming the first kind no component owns (called once the owners are registered, so a
  // new kind without an owner fails when the first model is built, not when a plan first uses it).
  void check_owned() const;
  // Runs every action of `plan` in order: begin() of every component, the actions, end().
  void run(Model& model, const StepPlan& plan, RunArgs& args);

 private:
  ActionRecords& records_;
  std::array<Component*, static_cast<size_t>(ActionKind::Count)> owner_{};
  std::vector<Component*> components_;  // in the order they were given
  int delay_us_ = 0;
  uint64_t delay_state_ = 0;
};

}  // namespace sw
