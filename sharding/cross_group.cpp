#include "sharding/cross_group.h"

#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "sharding/comm/quantize.h"
#include "sharding/unit_state.h"

namespace sw {

namespace {
constexpr int64_t kOuterQuantBlock = 256;  // values per scale of a quantised pseudo-gradient
size_t fbytes(int64_t n) { return static_cast<size_t>(n) * sizeof(float); }
}  // namespace

CrossGroup::CrossGroup(const ModelContext& ctx, UnitList& units) : ctx_(ctx), units_(units) {}

CrossGroup::~CrossGroup() { quiesce(); }

void CrossGroup::ensure() {
  const size_t U = units_.size();
  if (anchor_.size() == U) return;
  anchor_.resize(U), mom_.resize(U), delta_.resize(U), delta16_.resize(U), works_.resize(U);
  qerr1_.resize(U), qerr2_.resize(U), qdone_.resize(U), flight_.assign(U, 0);
  for (size_t u = 0; u < U; ++u) {
    const int64_t n = units_[u]->shard_size();
    anchor_[u] = Buffer(fbytes(n), Mem::Optimizer, Device::cpu());
    mom_[u] = Buffer(fbytes(n), Mem::Optimizer, Device::cpu());
    std::memset(mom_[u].data(), 0, fbytes(n));
  }
}

void CrossGroup::start_round() {
  if (!on()) return;
  ensure();
  for (size_t u = 0; u < units_.size(); ++u) {
    FlatUnit& fu = *units_[u];
    std::memcpy(anchor_[u].data(), fu.master(), fbytes(fu.shard_size()));
  }
}

void CrossGroup::quiesce() noexcept {
  for (Work& w : works_) {
    try {
      w.wait_done();
    } catch (...) {
    }
  }
  try {
    if (qlast_.valid()) qlast_.wait();
  } catch (...) {
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

// The pseudo-gradient start - master, averaged over the replica groups (in the wire dtype, or
// block-quantised with error feedback on a thread of its own, the units' reduces in order).
void CrossGroup::reduce(SegmentRun& s, const Action& a) {
  const size_t u = static_cast<size_t>(a.unit);
  SW_CHECK(flight_[u] == 0, "cross_group: unit " + std::to_string(u) +
                                "'s outer reduce issued twice before its update");
  FlatUnit& fu = *units_[u];
  const int64_t n = fu.shard_size();
  delta_[u] = Buffer(fbytes(n), Mem::Communication, Device::cpu());
  float* d = delta_[u].f32();
  const float* x0 = anchor_[u].f32();
  const float* x = fu.master();
#pragma omp parallel for schedule(static) if (n >= (int64_t{1} << 16))
  for (int64_t j = 0; j < n; ++j) d[j] = x0[j] - x[j];
  flight_[u] = 1;
  const OuterArgs& o = *s.args.outer;
  if (o.bits != 0) {
    const int R = ctx_.cross->size();
    if (!qpeers_) qpeers_ = make_peer_comm(*ctx_.cross, "outer-quantised");
    ensure_residuals(u);
    QuantSpec q;
    q.bits = o.bits;
    q.block = kOuterQuantBlock;
    PeerComm* pc = qpeers_.get();
    float *e1 = qerr1_[u].f32(), *e2 = qerr2_[u].f32();
    std::shared_future<void> prev = qlast_;
    qlast_ = std::async(std::launch::async, [pc, d, n, e1, e2, q, R, prev] {
               if (prev.valid()) prev.get();
               quantized_all_reduce(*pc, d, n, e1, e2, q, 1.f / static_cast<float>(R), 17);
             }).share();
    qdone_[u] = qlast_;
    return;
  }
  if (o.dtype == DType::F32) {
    works_[u] = ctx_.cross->issue_all_reduce(d, d, n, ReduceOp::Avg);
  } else {
    delta16_[u] = Buffer(static_cast<size_t>(n) * sizeof(uint16_t), Mem::Communication, Device::cpu());
    ctx_.ops->narrow(o.dtype, d, delta16_[u].data(), static_cast<size_t>(n));
    works_[u] = ctx_.cross->issue_all_reduce(delta16_[u].data(), delta16_[u].data(), n,
                                             ReduceOp::Avg, o.dtype);
  }
}

// Unit u's averaged pseudo-gradient in delta_[u] (fp32); flight_ 2 from then on.
void CrossGroup::wait_reduced(size_t u, const OuterArgs& o) {
  if (flight_[u] == 2) return;
  SW_CHECK(flight_[u] == 1, "cross_group: unit " + std::to_string(u) +
                                "'s outer update without its reduce");
  const size_t n = static_cast<size_t>(units_[u]->shard_size());
  if (qdone_[u].valid()) {
    qdone_[u].get();
    qdone_[u] = {};
  } else {
    works_[u].wait();
    if (!delta16_[u].empty()) {
      ctx_.ops->widen(o.dtype, delta16_[u].data(), delta_[u].f32(), n);
      delta16_[u].release();
    }
  }
  flight_[u] = 2;
}

// SGD with momentum on the round's start (torch.optim.SGD: buf = momentum buf + g; Nesterov:
// g + momentum buf, else buf), then the replica's master := the result (alpha > 0: mixed with
// the master as it is now, which a delayed update finds inner steps ahead).
void CrossGroup::update(SegmentRun& s, const Action& a) {
  const size_t u = static_cast<size_t>(a.unit);
  FlatUnit& fu = *units_[u];
  const size_t n = static_cast<size_t>(fu.shard_size());
  const OuterArgs& o = *s.args.outer;
  wait_reduced(u, o);
  const float* d = delta_[u].f32();
  float* x0 = anchor_[u].f32();
  float* v = mom_[u].f32();
  float* x = fu.master();
  const float lr = o.lr, mu = o.momentum, al = o.alpha;
  const bool nesterov = o.nesterov && mu != 0.f;
#pragma omp parallel for schedule(static) if (n >= (size_t{1} << 16))
  for (size_t j = 0; j < n; ++j) {
    float g = d[j];
    if (mu != 0.f) {
      v[j] = mu * v[j] + g;
      g = nesterov ? g + mu * v[j] : v[j];
    }
    x0[j] = x0[j] - lr * g;
    x[j] = al == 0.f ? x0[j] : al * x[j] + (1.f - al) * x0[j];
  }
  // (alpha > 0: the round's start stays the outer result, as Streaming DiLoCo keeps its global
  // parameters; each replica carries its share of the local steps into the next round.)
  delta_[u].release();
  flight_[u] = 0;
  // A whole unit's compute copy is re-rounded from its master (a sharded unit gathers afresh).
  if (fu.kind() == FlatUnit::Kind::Whole) fu.issue_regather();
}

float* CrossGroup::restore_delta(int u) {
  ensure();
  const size_t i = static_cast<size_t>(u);
  delta_[i] = Buffer(fbytes(units_[i]->shard_size()), Mem::Communication, Device::cpu());
  flight_[i] = 2;
  return delta_[i].f32();
}

// Unit u's error-feedback residuals of the quantised all-reduce (zeroed when made).
void CrossGroup::ensure_residuals(size_t u) {
  if (!qerr1_[u].empty()) return;
  const int64_t n = units_[u]->shard_size();
  qerr1_[u] = Buffer(fbytes(n), Mem::Optimizer, Device::cpu());
  qerr2_[u] = Buffer(fbytes(quant_ar_chunk(n, ctx_.cross->size())), Mem::Optimizer, Device::cpu());
  qerr1_[u].zero(), qerr2_[u].zero();
}

std::vector<CrossGroup::Named> CrossGroup::state(bool create, bool residuals) {
  std::vector<Named> out;
  if (!on()) return out;
  if (create) ensure();
  if (anchor_.empty()) return out;
  OuterArgs o;  // (a bf16 reduce in flight is widened with its own dtype below)
  for (size_t u = 0; u < units_.size(); ++u) {
    const int64_t n = units_[u]->shard_size();
    const std::string p = "outer.u" + std::to_string(u) + ".";
    out.push_back({p + "anchor", anchor_[u].f32(), n});
    out.push_back({p + "momentum", mom_[u].f32(), n});
    if (flight_[u] == 1) {
      o.dtype = delta16_[u].empty() ? DType::F32 : DType::BF16;
      wait_reduced(u, o);
    }
    if (flight_[u] == 2) out.push_back({p + "delta", delta_[u].f32(), n});
    if (create && residuals) ensure_residuals(u);
    if (!qerr1_[u].empty()) {
      out.push_back({p + "qerr1", qerr1_[u].f32(), n});
      out.push_back({p + "qerr2", qerr2_[u].f32(),
                     static_cast<int64_t>(qerr2_[u].bytes() / sizeof(float))});
    }
  }
  return out;
}

}  // namespace sw
