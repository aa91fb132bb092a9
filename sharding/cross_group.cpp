#include "sharding/cross_group.h"

#include <cstring>

#include "core/error.h"
#include "sharding/unit_state.h"

namespace sw {

CrossGroup::CrossGroup(const ModelContext& ctx, UnitList& units) : ctx_(ctx), units_(units) {}

void CrossGroup::start_round() {
  if (!on()) return;
  const size_t U = units_.size();
  if (anchor_.size() != U) {
    anchor_.resize(U), mom_.resize(U), delta_.resize(U), delta16_.resize(U), works_.resize(U);
    for (size_t u = 0; u < U; ++u) {
      const size_t n = static_cast<size_t>(units_[u]->shard_size());
      anchor_[u] = Buffer(n * sizeof(float), Mem::Optimizer, Device::cpu());
      mom_[u] = Buffer(n * sizeof(float), Mem::Optimizer, Device::cpu());
      std::memset(mom_[u].data(), 0, n * sizeof(float));
    }
  }
  for (size_t u = 0; u < U; ++u) {
    FlatUnit& fu = *units_[u];
    std::memcpy(anchor_[u].data(), fu.master(), static_cast<size_t>(fu.shard_size()) * sizeof(float));
  }
}

void CrossGroup::reset_momentum() {
  for (Buffer& b : mom_) std::memset(b.data(), 0, b.bytes());
}

void CrossGroup::quiesce() noexcept {
  for (Work& w : works_) {
    try {
      w.wait_done();
    } catch (...) {
    }
  }
}

bool CrossGroup::run(SegmentRun& s, int i) {
  const Action& a = s.action(i);
  SW_CHECK(on() && s.args.outer, "cross_group: an outer step without replica groups");
  if (anchor_.empty()) start_round();
  switch (a.kind) {
    case ActionKind::OuterReduce:
      reduce(s, a);
      return true;
    case ActionKind::OuterUpdate:
      update(s, a);
      return true;
    default:
      SW_CHECK(false, std::string("cross_group: not an action of theirs: ") +
                          action_kind_name(a.kind));
  }
  return true;
}

// The pseudo-gradient start - master, averaged over the replica groups (in the wire dtype).
void CrossGroup::reduce(SegmentRun& s, const Action& a) {
  const size_t u = static_cast<size_t>(a.unit);
  FlatUnit& fu = *units_[u];
  const size_t n = static_cast<size_t>(fu.shard_size());
  delta_[u] = Buffer(n * sizeof(float), Mem::Communication, Device::cpu());
  float* d = delta_[u].f32();
  const float* x0 = anchor_[u].f32();
  const float* x = fu.master();
#pragma omp parallel for schedule(static) if (n >= (size_t{1} << 16))
  for (size_t j = 0; j < n; ++j) d[j] = x0[j] - x[j];
  const DType dt = s.args.outer->dtype;
  if (dt == DType::F32) {
    works_[u] = ctx_.cross->issue_all_reduce(d, d, static_cast<int64_t>(n), ReduceOp::Avg);
  } else {
    delta16_[u] = Buffer(n * sizeof(uint16_t), Mem::Communication, Device::cpu());
    ctx_.ops->narrow(dt, d, delta16_[u].data(), n);
    works_[u] = ctx_.cross->issue_all_reduce(delta16_[u].data(), delta16_[u].data(),
                                             static_cast<int64_t>(n), ReduceOp::Avg, dt);
  }
}

// SGD with momentum on the round's start (torch.optim.SGD: buf = momentum buf + g; Nesterov:
// g + momentum buf, else buf), then the replica's master := the result.
void CrossGroup::update(SegmentRun& s, const Action& a) {
  const size_t u = static_cast<size_t>(a.unit);
  FlatUnit& fu = *units_[u];
  const size_t n = static_cast<size_t>(fu.shard_size());
  works_[u].wait();
  float* d = delta_[u].f32();
  const OuterArgs& o = *s.args.outer;
  if (o.dtype != DType::F32) {
    ctx_.ops->widen(o.dtype, delta16_[u].data(), d, n);
    delta16_[u].release();
  }
  float* x0 = anchor_[u].f32();
  float* v = mom_[u].f32();
  float* x = fu.master();
  const float lr = o.lr, mu = o.momentum;
  const bool nesterov = o.nesterov && mu != 0.f;
#pragma omp parallel for schedule(static) if (n >= (size_t{1} << 16))
  for (size_t j = 0; j < n; ++j) {
    float g = d[j];
    if (mu != 0.f) {
      v[j] = mu * v[j] + g;
      g = nesterov ? g + mu * v[j] : v[j];
    }
    x0[j] = x0[j] - lr * g;
    x[j] = x0[j];
  }
  delta_[u].release();
  // A whole unit's compute copy is re-rounded from its master (a sharded unit gathers afresh).
  if (fu.kind() == FlatUnit::Kind::Whole) fu.issue_regather();
}

}  // namespace sw
