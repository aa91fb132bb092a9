// ShardedModel: the schedule walk, prefetch, reductions and the optimizer over FlatUnits
// (sharding/unit_state.h holds the per-unit state machine and memory roles; sharded_model.h
// the data flow of a step).
//
// Groups: a world group of W ranks is seen as S-rank shard groups times R-rank replicate
// groups (S * R = W). FULL_SHARD / SHARD_GRAD_OP / SHARD_OPTIMIZER: S = W, R = 1. NO_SHARD:
// S = 1, R = W. HYBRID_SHARD: S = shard_group_size (consecutive ranks), R = W / S.
// Parameters are sharded over the shard group; gradients are reduce-scattered (averaged) over
// it, then all-reduced (averaged) over the replicate group. With S = 1 there is nothing to
// scatter: gradients are all-reduced in place, in buckets (DDP).
#include "sharding/sharded_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <unordered_map>

#include "core/error.h"
#include "core/rng.h"
#include "sharding/unit_state.h"

namespace sw {

namespace {

// Sum of one double per rank, added in rank order: identical on every rank, independent of
// timing. (Raw all-gather of the 8 bytes; the reductions of the Group API are fp32.)
double sum_over_ranks(Group& g, double x) {
  if (g.size() == 1) return x;
  std::vector<double> all(static_cast<size_t>(g.size()));
  g.all_gather(&x, all.data(), 2, DType::F32);
  double s = 0;
  for (double v : all) s += v;
  return s;
}

// NO_SHARD: a contiguous range of the bucket buffer holding whole units' gradients.
struct Bucket {
  int64_t lo = 0, hi = 0;  // floats
  int units = 0;           // how many units it holds
  int ready = 0;           // of those, how many finished their backward this micro-step
  bool issued = false;
  std::vector<int> members;
};

// A reduction in flight.
struct Pending {
  enum Kind : uint8_t { UnitReduceScatter, UnitAllReduce, BucketAllReduce } kind;
  int index;  // unit or bucket
  Work work;
};

}  // namespace

struct ShardedModel::Impl {
  const Ops* ops = nullptr;          // utilities and the optimizer (fp32)
  const Ops* compute_ops = nullptr;  // what units run with: ops_for(device, param_dtype)
  ShardingPolicy policy;
  GroupPtr world, shard, rep;  // rep: null when R == 1
  int W = 1, S = 1, R = 1;
  std::vector<std::unique_ptr<FlatUnit>> units;
  // Global parameter name -> (unit, spec index).
  std::unordered_map<std::string, std::pair<int, int>> by_name;

  // S == 1 and R > 1: every unit's gradients in one buffer, in backward-completion order
  // (descending first schedule position), cut into buckets.
  Buffer bucket_buf;
  std::vector<Bucket> buckets;
  std::vector<int> bucket_of;  // per unit
  std::deque<Pending> pending;

  // Per schedule position: the input activation x of that call (B*T*d floats,
  // Mem::Activations; empty for position 0, whose embedding ignores x) and its Saved.
  std::vector<Buffer> acts;
  std::vector<Saved> saved;
  // Per schedule position: how backward must rebuild its Saved (activation checkpointing;
  // Off: forward's Saved was kept).
  std::vector<CheckpointMode> recompute;
  Scratch scratch;
  // Ping-pong (B*T*d) buffers, kept across steps: backward's dy/dx (dy of one call is dx of
  // the next) and inference's residual stream.
  Buffer dbuf[2];

  // gather_full_params: per unit, the gathered parameters (empty on ranks other than 0 with
  // rank0_only).
  std::vector<Buffer> summoned;
  bool summon_held = false, summon_rank0_only = false;

  ~Impl() { quiesce(); }

  FlatUnit& unit_at(const Model& m, size_t pos) {
    return *units[static_cast<size_t>(m.schedule[pos].unit)];
  }

  void ensure_pingpong(size_t n) {
    for (Buffer& b : dbuf)
      if (b.bytes() < n * sizeof(float))
        b = Buffer(n * sizeof(float), Mem::Workspace, ops->device());
  }

  // Frees the activations and Saved of every call (end of backward, or after an error).
  void free_activations() {
    for (Buffer& a : acts) a.release();
    for (Saved& s : saved) s.clear();
    std::fill(recompute.begin(), recompute.end(), CheckpointMode::Off);
  }

  int live_units() const {
    int n = 0;
    for (const auto& u : units) n += u->holds_gathered();
    return n;
  }
  int peak_live = 0;  // peak_gathered_units()
  void issue(FlatUnit& fu) {
    fu.issue_unshard();
    peak_live = std::max(peak_live, live_units());
  }

  // Issues the gathers of the `depth` units after (dir = +1) or before (dir = -1) schedule
  // position `pos`, skipping units already gathered or in flight, within max_live_units.
  void prefetch(const Model& m, int pos, int depth, int dir) {
    const int P = static_cast<int>(m.schedule.size());
    for (int k = 1; k <= depth; ++k) {
      const int p = pos + dir * k;
      if (p < 0 || p >= P) break;
      FlatUnit& fu = unit_at(m, static_cast<size_t>(p));
      if (fu.sharded_state() == ShardedState::Unsharded || fu.gather_in_flight()) continue;
      if (policy.max_live_units > 0 && live_units() >= policy.max_live_units) break;
      issue(fu);
    }
  }

  // ---- Reductions ----------------------------------------------------------------------------

  // The unit finished its backward for this micro-step and its gradients are to be reduced.
  void reduce_unit(FlatUnit& fu) {
    switch (fu.kind()) {
      case FlatUnit::Kind::Sharded:
      case FlatUnit::Kind::FullReplicated:
        pending.push_back({Pending::UnitReduceScatter, fu.index(), fu.issue_reduce_scatter(R)});
        break;
      case FlatUnit::Kind::Whole:
        if (R == 1) {
          fu.round_grads();  // where N ranks would narrow them to reduce_dtype
          fu.reduced_in_place();
        } else {
          Bucket& b = buckets[static_cast<size_t>(bucket_of[static_cast<size_t>(fu.index())])];
          if (++b.ready == b.units) issue_bucket(static_cast<int>(&b - buckets.data()));
        }
        break;
    }
  }

  void issue_bucket(int bi) {
    Bucket& b = buckets[static_cast<size_t>(bi)];
    if (b.issued) return;
    b.issued = true;
    float* p = bucket_buf.f32() + b.lo;
    const DType rdt = policy.mixed_precision.reduce_dtype;
    ReduceOp op = ReduceOp::Avg;
    if (rdt != DType::F32) {  // divide, then sum in 16 bits (FlatUnit::issue_reduce_scatter)
      ops->scale(p, 1.f / static_cast<float>(R), static_cast<size_t>(b.hi - b.lo));
      narrow_in_place(rdt, p, b.hi - b.lo);  // reduce_dtype values at the front of the range
      op = ReduceOp::Sum;
    }
    pending.push_back(
        {Pending::BucketAllReduce, bi, rep->issue_all_reduce(p, p, b.hi - b.lo, op, rdt)});
  }

  // What follows the completion of a reduction (which may issue the next one).
  void advance(const Pending& p) {
    switch (p.kind) {
      case Pending::UnitReduceScatter: {
        FlatUnit& fu = *units[static_cast<size_t>(p.index)];
        if (rep) {
          void* blk = fu.reduced_block();
          pending.push_back({Pending::UnitAllReduce, p.index,
                             rep->issue_all_reduce(blk, blk, fu.shard_size(),
                                                   fu.reduce_dtype() == DType::F32
                                                       ? ReduceOp::Avg
                                                       : ReduceOp::Sum,  // divided before
                                                   fu.reduce_dtype())});
        } else {
          fu.accumulate_reduced();
        }
        break;
      }
      case Pending::UnitAllReduce:
        units[static_cast<size_t>(p.index)]->accumulate_reduced();
        break;
      case Pending::BucketAllReduce: {
        Bucket& b = buckets[static_cast<size_t>(p.index)];
        widen_in_place(policy.mixed_precision.reduce_dtype, bucket_buf.f32() + b.lo, b.hi - b.lo);
        for (int u : b.members) units[static_cast<size_t>(u)]->reduced_in_place();
        b.ready = 0;
        b.issued = false;
        break;
      }
    }
  }

  // Completes reductions in issue order: all of them (block) or those already done. Follow-up
  // all-reduces are issued in that same order on every rank.
  void progress(bool block) {
    while (!pending.empty()) {
      if (!block && !pending.front().work.test()) break;
      Pending p = std::move(pending.front());
      pending.pop_front();
      p.work.wait();
      advance(p);
    }
  }

  // Reduces every gradient not reduced yet (ReduceOnce without a last micro-step, or units
  // outside the schedule) and waits for all reductions.
  void sync_grads() {
    progress(true);
    std::vector<FlatUnit*> order;
    for (auto& u : units) order.push_back(u.get());
    std::stable_sort(order.begin(), order.end(),
                     [](FlatUnit* a, FlatUnit* b) { return a->first_pos > b->first_pos; });
    for (FlatUnit* fu : order) {
      if (!fu->grads_dirty()) continue;
      if (fu->kind() == FlatUnit::Kind::Whole && R > 1)
        issue_bucket(bucket_of[static_cast<size_t>(fu->index())]);
      else
        reduce_unit(*fu);
    }
    progress(true);
    for (Bucket& b : buckets) b.ready = 0;
  }

  // Waits for everything in flight (errors swallowed): teardown and error paths.
  void quiesce() noexcept {
    for (Pending& p : pending) {
      try {
        p.work.wait();
      } catch (...) {
      }
    }
    pending.clear();
    for (Bucket& b : buckets) b.ready = 0, b.issued = false;
    for (auto& u : units) u->quiesce();
  }

  // After an exception: drop the step's activations and every transient buffer.
  void abandon_step() {
    quiesce();
    free_activations();
    for (auto& u : units) {
      u->reshard();
      u->to_idle();
    }
  }

  // ---- Forward ---------------------------------------------------------------------------------

  // Runs the schedule forward. Training: every call's output is kept as the next call's input
  // activation (acts) together with its Saved, for backward. Inference: activations flow
  // through the ping-pong buffers and each call's Saved is cleared right after the call.
  // Adds the loss units' reports to loss_sum / loss_count.
  void forward(Model& model, const Batch& batch, bool training, float grad_scale, float* logits,
               double& loss_sum, int64_t& loss_count) {
    const size_t n = static_cast<size_t>(batch.B) * batch.T * model.d_model();
    const size_t P = model.schedule.size();
    ensure_pingpong(n);
    const float* x = nullptr;  // the first call (an embedding) ignores x
    for (size_t p = 0; p < P; ++p) {
      const Call& c = model.schedule[p];
      FlatUnit& fu = unit_at(model, p);
      if (training) fu.to_forward();
      issue(fu);
      prefetch(model, static_cast<int>(p), policy.forward_prefetch, +1);
      fu.wait_unshard();
      // The loss call may compute the head's gradients during forward (models/unit.h): the
      // last call's unit gets its gradient buffer now (backward starts with it anyway).
      if (training && p + 1 == P) fu.ensure_grads();
      float* y = nullptr;  // the last call (the loss) writes no y
      if (p + 1 < P) {
        if (training) {
          Buffer& next = acts[p + 1];
          if (next.bytes() != n * sizeof(float))
            next = Buffer(n * sizeof(float), Mem::Activations, ops->device());
          y = next.f32();
        } else {
          y = dbuf[p % 2].f32();
        }
      }
      UnitCtx ctx = ctx_for(fu, batch, static_cast<int>(p), training);
      ctx.grad_scale = grad_scale;
      ctx.logits = logits;
      scratch.reset();
      fu.unit()->forward(ctx, c.call, x, y);
      loss_sum += ctx.loss_sum;
      loss_count += ctx.loss_count;
      if (!training) saved[p].clear();
      if (training) recompute[p] = checkpoint(model, p);
      // Reshard after the unit's last forward call: always in inference; in training when the
      // policy says so, except for the unit backward starts with.
      if (static_cast<int>(p) == fu.last_pos &&
          (!training || (policy.reshard_after_forward && fu.last_pos + 1 != static_cast<int>(P))))
        fu.reshard();
      x = y;
    }
  }

  void backward(Model& model, const Batch& batch, float scale, bool reduce_now) {
    const size_t P = model.schedule.size();
    // dy of the last (loss) call is null; each call writes dx into the ping-pong buffer the
    // previous call reads as dy.
    const float* dy = nullptr;
    int cur = 0;
    for (size_t q = P; q-- > 0;) {
      const Call& c = model.schedule[q];
      FlatUnit& fu = unit_at(model, q);
      issue(fu);
      prefetch(model, static_cast<int>(q), policy.backward_prefetch, -1);
      fu.wait_unshard();
      fu.to_pre_backward();
      if (recompute[q] != CheckpointMode::Off) {
        rebuild(model, batch, q, scale);
        recompute[q] = CheckpointMode::Off;
      }
      fu.ensure_grads();
      float* dx = q > 0 ? dbuf[cur].f32() : nullptr;
      UnitCtx ctx = ctx_for(fu, batch, static_cast<int>(q), true);
      ctx.grad_scale = scale;
      scratch.reset();
      fu.unit()->backward(ctx, c.call, q > 0 ? acts[q].f32() : nullptr, dy, dx);
      fu.mark_dirty();
      // This call's activations are no longer needed.
      acts[q].release();
      saved[q].clear();
      if (static_cast<int>(q) == fu.first_pos) {  // the unit's last backward call
        fu.to_post_backward();
        fu.reshard();
        if (reduce_now) reduce_unit(fu);
      }
      progress(false);
      dy = dx;
      cur ^= 1;
    }
  }

  // ---- Activation checkpointing ------------------------------------------------------------

  // After the training forward of position p: frees what the policy drops of its Saved and
  // returns how backward must rebuild it (Off: nothing dropped). The loss call (the last
  // position) is never checkpointed: its forward may already have produced gradients.
  CheckpointMode checkpoint(const Model& m, size_t p) {
    if (p + 1 == m.schedule.size()) return CheckpointMode::Off;
    const int u = m.schedule[p].unit;
    CheckpointMode mode = policy.activation_checkpointing.mode_for(u);
    if (mode == CheckpointMode::Selective && !m.units[static_cast<size_t>(u)]->selective_recompute())
      mode = CheckpointMode::Full;
    Saved& s = saved[p];
    switch (mode) {
      case CheckpointMode::Off:
        break;
      case CheckpointMode::Full:
        if (s.bytes() == 0) return CheckpointMode::Off;
        s.clear();
        break;
      case CheckpointMode::Selective:
        if (s.drop_cheap() == 0) return CheckpointMode::Off;
        break;
    }
    return mode;
  }

  // Before the backward of position q (parameters gathered): refills the call's Saved from its
  // kept input, with the same parameters and batch as forward and no gradient buffers. Full:
  // forward runs again (its output goes to scratch and is dropped); Selective: the unit's
  // recompute_cheap rebuilds the buffers it dropped.
  void rebuild(Model& model, const Batch& batch, size_t q, float scale) {
    FlatUnit& fu = unit_at(model, q);
    UnitCtx ctx = ctx_for(fu, batch, static_cast<int>(q), true);
    ctx.grads = nullptr;
    ctx.grad_scale = scale;
    scratch.reset();
    const int call = model.schedule[q].call;
    const float* x = q > 0 ? acts[q].f32() : nullptr;
    if (recompute[q] == CheckpointMode::Selective) {
      fu.unit()->recompute_cheap(ctx, call, x);
      return;
    }
    float* y = scratch.f32(static_cast<size_t>(batch.B) * batch.T * model.d_model());
    Scratch::Hold keep_y(scratch);  // forward's own scratch comes on top of y (ActivationDecl)
    fu.unit()->forward(ctx, call, x, y);
  }

  UnitCtx ctx_for(FlatUnit& fu, const Batch& batch, int pos, bool training) {
    UnitCtx ctx;
    ctx.ops = compute_ops;
    ctx.batch = &batch;
    ctx.params = &fu.params();
    ctx.grads = &fu.grads();
    ctx.saved = &saved[static_cast<size_t>(pos)];
    ctx.scratch = &scratch;
    ctx.training = training;
    return ctx;
  }
};

// ---- Construction and initialisation ---------------------------------------------------------

ShardedModel::ShardedModel(Model& model, const Ops& ops, uint64_t seed)
    : ShardedModel(model, ops, seed, make_local_group(),
                   ShardingPolicy::for_strategy(ShardingStrategy::FullShard)) {}

ShardedModel::ShardedModel(Model& model, const Ops& ops, uint64_t seed, GroupPtr group,
                           const ShardingPolicy& policy)
    : model_(model), impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.ops = &ops;
  I.policy = policy;
  const MixedPrecisionPolicy& mp = policy.mixed_precision;
  for (DType d : {mp.param_dtype, mp.reduce_dtype})
    if (d != DType::F32 && d != DType::BF16 && d != DType::F16)
      fail("sharding", "mixed precision: unsupported dtype");
  I.compute_ops = mp.param_dtype == DType::F32 ? &ops : &ops_for(ops.device(), mp.param_dtype);
  if (!group) fail("sharding", "no communication group given");
  if (model.units.empty()) fail("sharded_model", "the model has no units");
  if (model.schedule.empty()) fail("sharded_model", "the model's schedule is empty");
  if (policy.forward_prefetch < 0 || policy.backward_prefetch < 0 || policy.max_live_units < 0)
    fail("sharding", "prefetch depths and max_live_units must be >= 0");
  const ActivationCheckpointing& ac = policy.activation_checkpointing;
  if (ac.every < 1)
    fail("sharding", "activation_checkpointing.every must be >= 1, got " + std::to_string(ac.every));
  for (int u : ac.units)
    if (u < 0 || u >= static_cast<int>(model.units.size()))
      fail("sharding", "activation_checkpointing.units names unit " + std::to_string(u) +
                           "; the model has units 0.." + std::to_string(model.units.size() - 1));

  // Groups.
  I.world = group;
  I.W = group->size();
  const int rank = group->rank();
  switch (policy.strategy) {
    case ShardingStrategy::NoShard:
      I.S = 1;
      break;
    case ShardingStrategy::HybridShard: {
      I.S = policy.shard_group_size > 0 ? policy.shard_group_size : I.W;
      if (I.W % I.S != 0)
        fail("sharding", "shard_group_size (" + std::to_string(I.S) +
                             ") must divide the world size (" + std::to_string(I.W) + ")");
      break;
    }
    default:
      I.S = I.W;
  }
  I.R = I.W / I.S;
  if (I.S == I.W) {
    I.shard = group;
  } else if (I.S == 1) {
    I.shard = make_local_group();
  } else {
    // Shard groups: consecutive ranks (within a node under the usual rank placement);
    // replicate groups: the ranks with the same position in each shard group.
    I.shard = group->split(rank / I.S, rank);
  }
  if (I.R > 1) I.rep = I.S == 1 ? group : group->split(rank % I.S, rank);

  // Schedule positions of each unit's first and last calls.
  const size_t U = model.units.size();
  std::vector<int> first(U, -1), last(U, -1);
  for (size_t p = 0; p < model.schedule.size(); ++p) {
    const Call& c = model.schedule[p];
    if (c.unit < 0 || c.unit >= static_cast<int>(U))
      fail("sharded_model", "schedule entry " + std::to_string(p) + " names unit " +
                                std::to_string(c.unit) + " of " + std::to_string(U));
    Unit* u = model.units[static_cast<size_t>(c.unit)].get();
    if (c.call < 0 || c.call >= u->num_calls())
      fail("sharded_model", "schedule entry " + std::to_string(p) + " runs call " +
                                std::to_string(c.call) + " of unit '" + u->name() +
                                "', which has " + std::to_string(u->num_calls()));
    if (first[static_cast<size_t>(c.unit)] < 0)
      first[static_cast<size_t>(c.unit)] = static_cast<int>(p);
    last[static_cast<size_t>(c.unit)] = static_cast<int>(p);
  }

  const FlatUnit::Kind kind = I.S == 1 ? FlatUnit::Kind::Whole
                              : policy.strategy == ShardingStrategy::ShardOptimizer
                                  ? FlatUnit::Kind::FullReplicated
                                  : FlatUnit::Kind::Sharded;

  // NO_SHARD buckets: units in backward-completion order, cut at bucket_bytes.
  std::vector<int64_t> region(U, -1);
  if (kind == FlatUnit::Kind::Whole && I.R > 1) {
    std::vector<int> order(U);
    for (size_t u = 0; u < U; ++u) order[u] = static_cast<int>(u);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return first[size_t(a)] > first[size_t(b)]; });
    int64_t off = 0;
    I.bucket_of.assign(U, -1);
    for (int u : order) {
      const int64_t padded = FlatLayout::build(model.units[size_t(u)]->params(), 1).padded;
      if (I.buckets.empty() ||
          (I.buckets.back().hi - I.buckets.back().lo) * 4 >= policy.bucket_bytes) {
        Bucket b;
        b.lo = b.hi = off;
        I.buckets.push_back(b);
      }
      Bucket& b = I.buckets.back();
      region[size_t(u)] = off;
      off += padded;
      b.hi = off;
      b.units++;
      b.members.push_back(u);
      I.bucket_of[size_t(u)] = static_cast<int>(I.buckets.size() - 1);
    }
    I.bucket_buf = Buffer(static_cast<size_t>(off) * sizeof(float), Mem::Grads, ops.device());
    ops.fill(I.bucket_buf.f32(), 0.f, static_cast<size_t>(off));
  }

  I.units.reserve(U);
  for (size_t u = 0; u < U; ++u) {
    float* bucket_grads = region[u] >= 0 ? I.bucket_buf.f32() + region[u] : nullptr;
    I.units.push_back(std::make_unique<FlatUnit>(model.units[u].get(), static_cast<int>(u), kind,
                                                 I.shard.get(), ops, bucket_grads, mp));
    FlatUnit& fu = *I.units.back();
    fu.first_pos = first[u];
    fu.last_pos = last[u];
    const FlatLayout& L = fu.layout();
    for (size_t s = 0; s < L.specs.size(); ++s)
      if (!I.by_name
               .emplace(L.specs[s].name, std::make_pair(static_cast<int>(u), static_cast<int>(s)))
               .second)
        fail("sharded_model", "parameter name '" + L.specs[s].name + "' is declared twice");
  }
  I.acts.resize(model.schedule.size());
  I.saved.resize(model.schedule.size());
  I.recompute.assign(model.schedule.size(), CheckpointMode::Off);

  // Element i of parameter s: a pure function of (seed, s.name, i), so any rank can produce
  // exactly its slice. Sharded units write the intersection of each parameter with this
  // rank's shard into the master; persistent ones write the whole full buffer. Alignment gaps
  // and padding stay zero.
  for (auto& up : I.units) {
    FlatUnit& fu = *up;
    const bool whole = fu.persistent();
    const Range dst_range = whole ? Range{0, fu.layout().padded} : fu.shard_range();
    float* dst = (whole ? fu.full() : fu.master()) - dst_range.lo;  // indexed by flat offset
    for (size_t s = 0; s < fu.layout().specs.size(); ++s) {
      const ParamSpec& spec = fu.layout().specs[s];
      const FlatEntry& e = fu.layout().entries[s];
      const Range r = intersect(dst_range, {e.offset, e.offset + e.numel});
      if (r.empty()) continue;
      switch (spec.init) {
        case Init::Zeros:
          ops.fill(dst + r.lo, 0.f, static_cast<size_t>(r.hi - r.lo));
          break;
        case Init::Ones:
          ops.fill(dst + r.lo, 1.f, static_cast<size_t>(r.hi - r.lo));
          break;
        case Init::Normal: {
          SW_CHECK(ops.device().is_cpu(), "initialisation writes host memory");
          const uint64_t stream = rng_stream(spec.name.c_str());
          for (int64_t j = r.lo; j < r.hi; ++j)
            dst[j] = rng_normal(seed, stream, static_cast<uint64_t>(j - e.offset)) * spec.std;
          break;
        }
      }
    }
    fu.finish_init();  // a split master takes its slice; the compute copy is rounded
  }
}

ShardedModel::~ShardedModel() = default;

int64_t ShardedModel::num_params() const {
  int64_t n = 0;
  for (const auto& fu : impl_->units)
    for (const FlatEntry& e : fu->layout().entries) n += e.numel;
  return n;
}

int ShardedModel::rank() const { return impl_->world->rank(); }
int ShardedModel::world() const { return impl_->W; }
const ShardingPolicy& ShardedModel::policy() const { return impl_->policy; }
int ShardedModel::peak_gathered_units() const { return impl_->peak_live; }
Group& ShardedModel::group() const { return *impl_->world; }

CommStats ShardedModel::comm_stats() const {
  CommStats t;
  std::vector<Group*> seen;
  for (Group* g : {impl_->world.get(), impl_->shard.get(), impl_->rep.get()}) {
    if (!g || std::find(seen.begin(), seen.end(), g) != seen.end()) continue;
    seen.push_back(g);
    const CommStats s = g->stats();
    t.ops += s.ops, t.bytes += s.bytes, t.comm_s += s.comm_s, t.exposed_s += s.exposed_s;
  }
  return t;
}

void ShardedModel::reset_comm_stats() {
  for (Group* g : {impl_->world.get(), impl_->shard.get(), impl_->rep.get()})
    if (g) g->reset_stats();
}

// ---- Execution -------------------------------------------------------------------------------

namespace {

int64_t count_targets(const Batch& b) {
  int64_t n = 0;
  const int64_t N = static_cast<int64_t>(b.B) * b.T;
  for (int64_t i = 0; i < N; ++i) n += b.targets[i] >= 0;
  return n;
}

void check_batch(const Batch& b, bool need_targets) {
  if (b.B <= 0 || b.T <= 0)
    fail("sharded_model",
         "batch shape (" + std::to_string(b.B) + ", " + std::to_string(b.T) + ") must be positive");
  if (!b.tokens) fail("sharded_model", "batch has no tokens");
  if (need_targets && !b.targets) fail("sharded_model", "batch has no targets");
}

}  // namespace

double ShardedModel::forward_backward(const Batch& batch, float grad_scale, bool last_micro_step) {
  Impl& I = *impl_;
  check_batch(batch, true);
  const int64_t counted = count_targets(batch);
  // d(mean loss) = d(sum of token losses) / counted.
  const float scale = counted > 0 ? grad_scale / static_cast<float>(counted) : 0.f;
  const bool reduce_now = last_micro_step || I.policy.accum == GradAccumMode::ReduceEachMicroStep;

  double loss_sum = 0;
  int64_t loss_count = 0;
  try {
    I.progress(true);  // nothing should be in flight; a no-op normally
    I.peak_live = I.live_units();
    I.forward(model_, batch, true, scale, nullptr, loss_sum, loss_count);
    I.backward(model_, batch, scale, reduce_now);
    if (reduce_now) I.sync_grads();  // also units outside the schedule
  } catch (...) {
    I.abandon_step();
    throw;
  }
  I.free_activations();
  for (auto& u : I.units) u->to_idle();
  if (counted > 0 && loss_count == 0)
    fail("sharded_model", "no call of the model's schedule reported a loss");
  return loss_count > 0 ? loss_sum / static_cast<double>(loss_count) : 0.0;
}

double ShardedModel::eval_loss(const Batch& batch) {
  Impl& I = *impl_;
  check_batch(batch, true);
  double loss_sum = 0;
  int64_t loss_count = 0;
  try {
    I.forward(model_, batch, false, 0.f, nullptr, loss_sum, loss_count);
  } catch (...) {
    I.abandon_step();
    throw;
  }
  if (count_targets(batch) > 0 && loss_count == 0)
    fail("sharded_model", "no call of the model's schedule reported a loss");
  return loss_count > 0 ? loss_sum / static_cast<double>(loss_count) : 0.0;
}

void ShardedModel::logits_last(const Batch& batch, float* logits) {
  Impl& I = *impl_;
  check_batch(batch, false);
  SW_CHECK(logits != nullptr, "logits_last needs an output buffer");
  double loss_sum = 0;
  int64_t loss_count = 0;
  try {
    I.forward(model_, batch, false, 0.f, logits, loss_sum, loss_count);
  } catch (...) {
    I.abandon_step();
    throw;
  }
}

// ---- Gradients and optimizer ----------------------------------------------------------------

double ShardedModel::grad_norm() const {
  Impl& I = *impl_;
  I.sync_grads();
  // Sum of squares of this rank's reduced gradient shard (alignment gaps and padding are never
  // written, so they stay zero), summed over the shard group; replicas hold equal shards.
  double ss = 0;
  for (const auto& fu : I.units)
    ss += I.ops->sum_squares(fu->grad_shard(), static_cast<size_t>(fu->shard_size()));
  return std::sqrt(sum_over_ranks(*I.shard, ss));
}

void ShardedModel::zero_grads() {
  Impl& I = *impl_;
  I.progress(true);
  for (auto& fu : I.units) fu->zero_grads();
  for (Bucket& b : I.buckets) b.ready = 0, b.issued = false;
}

void ShardedModel::optimizer_step(const AdamWParams& p, float lr, float grad_mult, int step) {
  SW_CHECK(step >= 1, "AdamW steps count from 1");
  Impl& I = *impl_;
  I.sync_grads();
  const Ops& ops = *I.ops;
  for (auto& up : I.units) {
    FlatUnit& fu = *up;
    // Stage 1: a previous regather must be complete (it reads this rank's slice). Sharded: a
    // gather prefetched after a previous update reads the master and is stale after this one.
    if (fu.kind() == FlatUnit::Kind::FullReplicated) fu.wait_unshard();
    if (fu.kind() == FlatUnit::Kind::Sharded && fu.holds_gathered()) {
      fu.wait_unshard();
      fu.reshard();
    }
    const Range shard = fu.shard_range();
    for (size_t s = 0; s < fu.layout().specs.size(); ++s) {
      const FlatEntry& e = fu.layout().entries[s];
      const Range r = intersect(shard, {e.offset, e.offset + e.numel});
      if (r.empty()) continue;
      const size_t off = static_cast<size_t>(r.lo - shard.lo);
      const float wd = fu.layout().specs[s].weight_decay ? p.weight_decay : 0.f;
      ops.adamw(fu.master() + off, fu.grad_shard() + off, fu.adam_m() + off, fu.adam_v() + off,
                static_cast<size_t>(r.hi - r.lo), lr, p.beta1, p.beta2, p.eps, wd, step, grad_mult);
    }
    // Stage 1: all-gather the updated slices while the next unit's update runs.
    fu.issue_regather();
    // Sharded: the units the next forward starts with are gathered now, while the following
    // units' updates run (the first gather of a step has no compute before it to hide behind).
    if (fu.kind() == FlatUnit::Kind::Sharded && fu.first_pos >= 0 &&
        fu.first_pos < I.policy.forward_prefetch)
      I.issue(fu);
  }
}

// ---- Parameter access ------------------------------------------------------------------------

void ShardedModel::for_each_param(
    const std::function<void(const ParamSpec&, const float* data)>& fn) const {
  Impl& I = *impl_;
  if (I.summon_held && I.summon_rank0_only && rank() != 0)
    fail("sharded_model", "for_each_param on rank " + std::to_string(rank()) +
                              " while gather_full_params(rank0_only) holds the copy on rank 0");
  for (size_t u = 0; u < I.units.size(); ++u) {
    FlatUnit& fu = *I.units[u];
    const float* base;
    Buffer tmp;
    if (I.summon_held) {
      base = I.summoned[u].f32();
    } else if (fu.persistent() && !fu.split_master()) {
      fu.wait_unshard();
      base = fu.full();
    } else {
      tmp = Buffer(static_cast<size_t>(fu.layout().padded) * sizeof(float), Mem::Communication,
                   I.ops->device());
      fu.gather_params_into(tmp.f32());
      base = tmp.f32();
    }
    for (size_t s = 0; s < fu.layout().specs.size(); ++s)
      fn(fu.layout().specs[s], base + fu.layout().entries[s].offset);
  }
}

void ShardedModel::for_each_grad(
    const std::function<void(const ParamSpec&, const float* grad)>& fn) const {
  Impl& I = *impl_;
  I.sync_grads();
  for (auto& up : I.units) {
    FlatUnit& fu = *up;
    Buffer tmp;
    const float* base = fu.grad_shard();
    if (fu.kind() != FlatUnit::Kind::Whole) {
      tmp = Buffer(static_cast<size_t>(fu.layout().padded) * sizeof(float), Mem::Communication,
                   I.ops->device());
      fu.gather_grads_into(tmp.f32());
      base = tmp.f32();
    }
    for (size_t s = 0; s < fu.layout().specs.size(); ++s)
      fn(fu.layout().specs[s], base + fu.layout().entries[s].offset);
  }
}

void ShardedModel::gather_full_params(bool rank0_only) {
  Impl& I = *impl_;
  release_full_params();
  I.summoned.resize(I.units.size());
  for (size_t u = 0; u < I.units.size(); ++u) {
    FlatUnit& fu = *I.units[u];
    Buffer b(static_cast<size_t>(fu.layout().padded) * sizeof(float), Mem::Communication,
             I.ops->device());
    fu.gather_params_into(b.f32());
    if (!rank0_only || rank() == 0) I.summoned[u] = std::move(b);
  }
  I.summon_held = true;
  I.summon_rank0_only = rank0_only;
}

void ShardedModel::release_full_params() {
  impl_->summoned.clear();
  impl_->summon_held = false;
}

void ShardedModel::set_param(const std::string& name, const float* data, int64_t n) {
  Impl& I = *impl_;
  auto it = I.by_name.find(name);
  if (it == I.by_name.end()) fail("sharded_model", "no parameter named '" + name + "'");
  FlatUnit& fu = *I.units[static_cast<size_t>(it->second.first)];
  const size_t s = static_cast<size_t>(it->second.second);
  const FlatEntry& e = fu.layout().entries[s];
  if (n != e.numel)
    fail("sharded_model", "parameter '" + name + "' has " + std::to_string(e.numel) + " elements " +
                              shape_str(fu.layout().specs[s].shape) + ", got " + std::to_string(n));
  release_full_params();
  if (fu.persistent()) fu.wait_unshard();
  if (fu.kind() == FlatUnit::Kind::Sharded && fu.holds_gathered()) {  // a prefetch goes stale
    fu.wait_unshard();
    fu.reshard();
  }
  // The full copy, where this rank holds one (it contains the master slice for stage 1, or is
  // the rounded compute copy with a split master).
  if (fu.full() && fu.sharded_state() == ShardedState::Unsharded) {
    I.ops->copy(fu.full() + e.offset, data, static_cast<size_t>(n));
    if (fu.split_master()) fu.round_compute(e.offset, n);
  }
  if (fu.kind() == FlatUnit::Kind::Sharded || fu.split_master()) {
    const Range shard = fu.shard_range();
    const Range r = intersect(shard, {e.offset, e.offset + e.numel});
    if (!r.empty())
      I.ops->copy(fu.master() + (r.lo - shard.lo), data + (r.lo - e.offset),
                  static_cast<size_t>(r.hi - r.lo));
  }
}

}  // namespace sw

// ---- Checkpoint access (see sharded_model.h; used by checkpoint/sharded_checkpoint.cpp) ------

namespace sw {

namespace {

FlatRange clip_used(Range r, int64_t used) { return {std::min(r.lo, used), std::min(r.hi, used)}; }

}  // namespace

int ShardedModel::num_units() const { return static_cast<int>(impl_->units.size()); }

const FlatLayout& ShardedModel::unit_layout(int u) const {
  SW_CHECK(u >= 0 && u < num_units(), "unit index out of range");
  return impl_->units[static_cast<size_t>(u)]->layout();
}

std::string ShardedModel::unit_name(int u) const {
  SW_CHECK(u >= 0 && u < num_units(), "unit index out of range");
  return impl_->units[static_cast<size_t>(u)]->unit()->name();
}

FlatRange ShardedModel::owned_range(int u) const {
  const Impl& I = *impl_;
  const FlatUnit& fu = *I.units[static_cast<size_t>(u)];
  const FlatRange s = clip_used(fu.shard_range(), fu.layout().used);
  // Replica q of R holding this shard writes the q-th of R even parts.
  const int64_t q = I.world->rank() / I.S, R = I.R, n = s.size();
  return {s.lo + n * q / R, s.lo + n * (q + 1) / R};
}

FlatRange ShardedModel::held_range(int u, StateKind k) const {
  const FlatUnit& fu = *impl_->units[static_cast<size_t>(u)];
  const int64_t used = fu.layout().used;
  if (fu.kind() == FlatUnit::Kind::Whole ||
      (fu.kind() == FlatUnit::Kind::FullReplicated && k == StateKind::Master))
    return {0, used};
  return clip_used(fu.shard_range(), used);
}

namespace {

// Pointer to flat index `lo` of kind k's storage (index-shifted so [held] is addressable).
float* state_base(FlatUnit& fu, ShardedModel::StateKind k) {
  const Range sh = fu.shard_range();
  switch (k) {
    case ShardedModel::StateKind::Master:
      // Whole and stage 1 keep the full buffer (the master is a view into it), unless mixed
      // precision split the fp32 master off (the full buffer is then the rounded compute copy).
      return fu.kind() == FlatUnit::Kind::Sharded || fu.split_master() ? fu.master() - sh.lo
                                                                       : fu.full();
    case ShardedModel::StateKind::ExpAvg:
      return fu.adam_m() - (fu.kind() == FlatUnit::Kind::Whole ? 0 : sh.lo);
    case ShardedModel::StateKind::ExpAvgSq:
      return fu.adam_v() - (fu.kind() == FlatUnit::Kind::Whole ? 0 : sh.lo);
  }
  return nullptr;
}

}  // namespace

const float* ShardedModel::state_view(int u, StateKind k, FlatRange r) const {
  Impl& I = *impl_;
  SW_CHECK(I.ops->device().is_cpu(), "checkpoint state access reads host memory");
  FlatUnit& fu = *I.units[static_cast<size_t>(u)];
  const FlatRange h = held_range(u, k);
  SW_CHECK(r.lo >= h.lo && r.hi <= h.hi, "state_view outside the held range");
  // Stage 1: the slices of other ranks arrive with the regather issued after the update.
  if (!r.empty() && fu.kind() == FlatUnit::Kind::FullReplicated && k == StateKind::Master)
    fu.wait_unshard();
  // A split fp32 master exists for this rank's shard only (what owned_range asks for).
  if (!r.empty() && fu.split_master() && k == StateKind::Master) {
    const Range sh = fu.shard_range();
    SW_CHECK(r.lo >= sh.lo && r.hi <= sh.hi, "state_view: the fp32 master outside the shard");
  }
  return state_base(fu, k) + r.lo;
}

void ShardedModel::read_state(int u, StateKind k, FlatRange r, float* dst) const {
  if (r.empty()) return;
  std::memcpy(dst, state_view(u, k, r), static_cast<size_t>(r.size()) * sizeof(float));
}

void ShardedModel::write_state(int u, StateKind k, FlatRange r, const float* src) {
  Impl& I = *impl_;
  SW_CHECK(I.ops->device().is_cpu(), "checkpoint state access writes host memory");
  FlatUnit& fu = *I.units[static_cast<size_t>(u)];
  const FlatRange h = held_range(u, k);
  SW_CHECK(r.lo >= h.lo && r.hi <= h.hi, "write_state outside the held range");
  if (r.empty()) return;
  if (k == StateKind::Master) {
    release_full_params();
    if (fu.persistent()) fu.wait_unshard();  // a regather in flight would overwrite the data
    if (fu.kind() == FlatUnit::Kind::Sharded && fu.holds_gathered()) {  // stale after this
      fu.wait_unshard();
      fu.reshard();
    }
  }
  if (k == StateKind::Master && fu.split_master()) {
    // Mixed precision with a persistent full buffer: the fp32 master takes the part inside
    // this rank's shard, the compute copy the rounding of all of it.
    const Range sh = fu.shard_range();
    const Range in = intersect({r.lo, r.hi}, sh);
    if (!in.empty())
      std::memcpy(fu.master() + (in.lo - sh.lo), src + (in.lo - r.lo),
                  static_cast<size_t>(in.hi - in.lo) * sizeof(float));
    std::memcpy(fu.full() + r.lo, src, static_cast<size_t>(r.size()) * sizeof(float));
    fu.round_compute(r.lo, r.size());
    return;
  }
  std::memcpy(state_base(fu, k) + r.lo, src, static_cast<size_t>(r.size()) * sizeof(float));
}

}  // namespace sw
