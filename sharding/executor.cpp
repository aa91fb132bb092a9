#include "sharding/executor.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "core/alloc.h"
#include "core/env.h"
#include "core/error.h"

namespace sw {

Executor::Executor(ActionRecords& records, int rank) : records_(records) {
  if (const auto v = env_int("SHARDWISE_EXEC_DELAY_US")) {
    delay_us_ = static_cast<int>(*v);
    delay_state_ = 0x9E3779B97F4A7C15ULL ^ static_cast<uint64_t>(rank);
  }
}

void Executor::own(Component& c, std::initializer_list<ActionKind> kinds) {
  for (ActionKind k : kinds) {
    Component*& o = owner_[static_cast<size_t>(k)];
    SW_CHECK(o == nullptr, std::string("executor: ") + action_kind_name(k) + " owned by both " +
                               o->name() + " and " + c.name());
    o = &c;
  }
  if (std::find(components_.begin(), components_.end(), &c) == components_.end())
    components_.push_back(&c);
}

void Executor::check_owned() const {
  for (size_t k = 0; k < owner_.size(); ++k)
    SW_CHECK(owner_[k] != nullptr, std::string("the executor has no owner for ") +
                                       action_kind_name(static_cast<ActionKind>(k)));
}

void Executor::run(Model& model, const StepPlan& plan, RunArgs& args) {
  SegmentRun s{model, plan, args};
  records_.begin_segment();
  for (Component* c : components_) c->begin(s);
  for (int i = 0; i < static_cast<int>(plan.actions.size()); ++i) {
    if (delay_us_ > 0) {  // tests: expose a missing wait by perturbing every queue's timing
      delay_state_ = delay_state_ * 6364136223846793005ULL + 1442695040888963407ULL;
      std::this_thread::sleep_for(std::chrono::microseconds(
          static_cast<int64_t>((delay_state_ >> 33) % static_cast<uint64_t>(delay_us_ + 1))));
    }
    MemTracker::set_action(i);  // the allocators' event log attributes memory to it
    const Action& a = s.action(i);
    Component* c = owner_[static_cast<size_t>(a.kind)];  // every kind has one (check_owned)
    ActionRecords::Bracket timed = records_.open(plan, i);
    s.t0 = records_.now();
    s.current = i;
    if (c->run(s, i) && records_.on()) records_.add(plan, i, s.t0, trace_clock());
    records_.close(timed, i);
  }
  MemTracker::set_action(-1);
  for (Component* c : components_) c->end(s);
}

}  // namespace sw
