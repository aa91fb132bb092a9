#include "sharding/tensor_parallel.h"

#include <string>

#include "core/error.h"
#include "sharding/unit_state.h"

namespace sw {

namespace {
bool in_call(ActionKind k) {
  return k == ActionKind::TpGatherRows || k == ActionKind::TpScatterRows ||
         k == ActionKind::TpAllGather;
}
}  // namespace

void TensorParallel::begin(SegmentRun& s) {
  seg_ = &s;
  planned_.clear();
  next_ = 0;
  done_.assign(s.plan.actions.size(), 0);
  for (size_t i = 0; i < s.plan.actions.size(); ++i)
    if (in_call(s.plan.actions[i].kind)) planned_.push_back(static_cast<int>(i));
}

void TensorParallel::end(SegmentRun& s) {
  SW_CHECK(next_ == planned_.size(),
           "tensor parallel: the plan lists " + std::to_string(planned_.size()) +
               " in-call collectives, the units ran " + std::to_string(next_) + " (segment of " +
               std::to_string(s.plan.actions.size()) + " actions)");
  seg_ = nullptr;
}

int TensorParallel::take(TensorOp op, int64_t bytes) {
  SW_CHECK(seg_ != nullptr, "tensor parallel: a unit asked for a collective outside a plan");
  SW_CHECK(next_ < planned_.size(),
           std::string("tensor parallel: a unit asked for ") + tensor_op_name(op) +
               " beyond the collectives its declaration lists (Unit::declare_tensor_comm)");
  const int i = planned_[next_++];
  const Action& a = seg_->action(i);
  SW_CHECK(a.kind == tensor_action_kind(op) && a.bytes == bytes && a.inside == seg_->current,
           std::string("tensor parallel: unit ") + seg_->plan.unit_names[size_t(a.unit)] +
               " asked for " + tensor_op_name(op) + " of " + std::to_string(bytes) +
               " bytes in action " + std::to_string(seg_->current) + "; its declaration (action " +
               std::to_string(i) + ") says " + action_kind_name(a.kind) + " of " +
               std::to_string(a.bytes) + " bytes in action " + std::to_string(a.inside));
  return i;
}

void TensorParallel::gather(TensorOp op, void* full, const void* mine, size_t bytes) {
  const int i = take(op, static_cast<int64_t>(bytes) * size());
  const double t0 = records_.now();
  // (bytes: whole 32-bit words where they can be, else 16-bit ones; the gather adds nothing)
  Work w = bytes % 4 == 0
               ? ctx_.tensor->issue_all_gather(mine, full, static_cast<int64_t>(bytes / 4), DType::F32)
               : ctx_.tensor->issue_all_gather(mine, full, static_cast<int64_t>(bytes / 2), DType::BF16);
  w.wait();
  record(i, t0, w);
}

void TensorParallel::scatter(float* mine, const float* full, size_t n) {
  const int i = take(TensorOp::ScatterRows, static_cast<int64_t>(n) * 4 * size());
  const double t0 = records_.now();
  Work w = ctx_.tensor->issue_reduce_scatter(full, mine, static_cast<int64_t>(n), ReduceOp::Sum,
                                             DType::F32);
  w.wait();
  record(i, t0, w);
}

// Action i done: its record (the host's times; where timed, its collective's stream's interval).
void TensorParallel::record(int i, double t0, const Work& w) {
  if (records_.on()) records_.device_span(records_.add(seg_->plan, i, t0, trace_clock()),
                                          std::make_shared<Work>(w));
  done_[size_t(i)] = 1;
}

void TensorParallel::reduce_grads(int u) { sum_replicated(u); }

std::vector<Work> TensorParallel::sum_replicated(int u) {
  FlatUnit& fu = *units_[size_t(u)];
  float* g = fu.grad_full();
  std::vector<Work> done;
  for (const auto& r : fu.layout().replicated_runs()) {
    done.push_back(
        ctx_.tensor->issue_all_reduce(g + r.first, g + r.first, r.second - r.first, ReduceOp::Sum));
    done.back().wait();
  }
  return done;
}

bool TensorParallel::run(SegmentRun& s, int i) {
  const Action& a = s.action(i);
  if (in_call(a.kind)) {
    SW_CHECK(done_[size_t(i)], std::string("tensor parallel: ") + action_kind_name(a.kind) +
                                   " (action " + std::to_string(i) + ") of unit " +
                                   s.plan.unit_names[size_t(a.unit)] +
                                   " was not asked for by its call");
    return false;  // recorded when it ran
  }
  SW_CHECK(a.kind == ActionKind::TpReduceGrads,
           std::string("tensor parallel: not an action of theirs: ") + action_kind_name(a.kind));
  const std::vector<Work> done = sum_replicated(a.unit);
  if (records_.on()) {  // the host's times; where timed, its collectives' stream's interval
    const ActionRecord& r = records_.add(s.plan, i, s.t0, trace_clock());
    for (const Work& w : done) records_.device_span(r, std::make_shared<Work>(w));
  }
  return false;
}

}  // namespace sw
