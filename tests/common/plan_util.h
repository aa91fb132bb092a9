// Test helpers for step plans (sharding/step_plan.h): what the executor ran, in plan order, and
// a replay of a plan's memory deltas.
#pragma once
#include <algorithm>
#include <string>
#include <vector>

#include "sharding/step_plan.h"

namespace swtest {

// "kind unit" per action: of a plan, and of a recorder's records sorted into plan order (per
// segment by action index; a reduction is recorded when it completes, out of order).
inline std::vector<std::string> planned_actions(const sw::StepPlan& p) {
  std::vector<std::string> out;
  for (const sw::Action& a : p.actions)
    out.push_back(std::string(sw::action_kind_name(a.kind)) + " " + std::to_string(a.unit));
  return out;
}
inline std::vector<std::string> executed_actions(const sw::StepRecorder& rec) {
  std::vector<sw::ActionRecord> recs;
  for (const sw::ActionRecord& r : rec.records)  // (host updater jobs are no plan action)
    if (r.queue != sw::Queue::Host) recs.push_back(r);
  std::stable_sort(recs.begin(), recs.end(), [](const sw::ActionRecord& x, const sw::ActionRecord& y) {
    return x.segment != y.segment ? x.segment < y.segment : x.action < y.action;
  });
  std::vector<std::string> out;
  for (const sw::ActionRecord& r : recs)
    out.push_back(std::string(sw::action_kind_name(r.kind)) + " " + std::to_string(r.unit));
  return out;
}

// The running bytes per category over the plan, from what it starts with: the peak (counting
// each action's transient bytes) and the end.
struct Replay {
  sw::MemDeltas peak{}, end{};
  bool negative = false;  // some category went below zero
};
inline Replay replay(const sw::StepPlan& p) {
  Replay r;
  r.end = r.peak = p.initial;
  for (const sw::Action& a : p.actions)
    for (size_t c = 0; c < r.end.size(); ++c) {
      r.end[c] += a.mem[c];
      r.negative |= r.end[c] < 0;
      r.peak[c] = std::max(r.peak[c], r.end[c] + a.transient[c]);
    }
  return r;
}

}  // namespace swtest
