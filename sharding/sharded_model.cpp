// ShardedModel, world size 1. The structure is the FSDP one (see sharded_model.h): every unit
// owns a flat layout, an fp32 master shard, AdamW moments of that shard, a full gradient
// buffer that backward accumulates into and a reduced gradient shard; the steps where
// communication goes are named (unshard / reshard / reduce_grads) and are called exactly where
// FSDP calls them. At world 1 the shard is the whole flat buffer, so "gathered parameters" and
// "master shard" are the same memory and the reduced gradient shard is the full gradient: the
// three steps only flip states.
#include "sharding/sharded_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>

#include "core/error.h"
#include "core/rng.h"

namespace sw {

namespace {

// Where a unit's parameters are (FSDP2's ShardedState): Sharded = only the master shard is
// valid; Unsharded = the gathered full buffer is valid and may be handed to the unit.
enum class ShardedState : uint8_t { Sharded, Unsharded };

// A half-open float range [lo, hi) inside a unit's flat buffer.
struct Range {
  int64_t lo = 0, hi = 0;
  bool empty() const { return hi <= lo; }
};

Range intersect(Range a, Range b) { return {std::max(a.lo, b.lo), std::min(a.hi, b.hi)}; }

struct FlatUnit {
  Unit* unit = nullptr;
  FlatLayout layout;  // world-sized layout of this unit's parameters
  int rank = 0;

  Buffer master;  // (shard_size) fp32 master shard, Mem::Params; optimizer updates it
  Buffer m, v;    // (shard_size) AdamW moments, Mem::Optimizer
  Buffer grad;    // (padded) full gradient that backward accumulates into, Mem::Grads
  // Views. At world 1: full == master, grad_shard == grad.
  float* full = nullptr;        // (padded) gathered parameters, valid when Unsharded
  float* grad_shard = nullptr;  // (shard_size) reduced gradient of this rank's shard

  // Per ParamSpec: pointers into full / grad, handed to the unit through UnitCtx. (When the
  // gathered buffer is allocated by unshard(), unshard() re-points `params`.)
  std::vector<float*> params, grads;
  ShardedState state = ShardedState::Sharded;
  bool grads_pending = false;  // backward wrote into `grad` since the last reduce_grads()

  // Schedule positions of this unit's first and last calls: forward gathers before the first
  // and may reshard after the last; backward (reverse order) gathers before the last and
  // reduces gradients after the first.
  int first_pos = -1, last_pos = -1;

  Range shard_range() const {
    const int64_t off = layout.shard_offset(rank);
    return {off, off + layout.shard_size()};
  }

  // All-gather: full <- every rank's master shard. World 1: the master is the full buffer.
  void unshard() {
    if (state == ShardedState::Unsharded) return;
    state = ShardedState::Unsharded;
  }
  // Frees (forgets) the gathered buffer. World 1: nothing to free.
  void reshard() {
    if (state == ShardedState::Sharded) return;
    state = ShardedState::Sharded;
  }
  // Reduce-scatter: grad_shard += this rank's slice of the sum over ranks of `grad`.
  // World 1: the full gradient is the shard and accumulates in place.
  void reduce_grads() {
    if (!grads_pending) return;
    grads_pending = false;
  }
};

}  // namespace

struct ShardedModel::Impl {
  const Ops* ops = nullptr;
  int world = 1, rank = 0;
  std::vector<FlatUnit> units;
  // Global parameter name -> (unit, spec index).
  std::unordered_map<std::string, std::pair<int, int>> by_name;

  // Per schedule position: the input activation x of that call (B*T*d floats,
  // Mem::Activations; empty for position 0, whose embedding ignores x) and its Saved.
  std::vector<Buffer> acts;
  std::vector<Saved> saved;
  Scratch scratch;
  // Ping-pong (B*T*d) buffers, kept across steps: backward's dy/dx (dy of one call is dx of
  // the next) and inference's residual stream.
  Buffer dbuf[2];

  void ensure_pingpong(size_t n) {
    for (Buffer& b : dbuf)
      if (b.bytes() < n * sizeof(float))
        b = Buffer(n * sizeof(float), Mem::Workspace, ops->device());
  }

  // Frees the activations and Saved of every call (end of backward, or after an error).
  void free_activations() {
    for (Buffer& a : acts) a.release();
    for (Saved& s : saved) s.clear();
  }

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
      FlatUnit& fu = units[static_cast<size_t>(c.unit)];
      fu.unshard();
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
      fu.unit->forward(ctx, c.call, x, y);
      loss_sum += ctx.loss_sum;
      loss_count += ctx.loss_count;
      if (!training) saved[p].clear();
      // FULL_SHARD frees the gathered parameters after the unit's last forward call
      // (SHARD_GRAD_OP will keep them until backward).
      if (static_cast<int>(p) == fu.last_pos) fu.reshard();
      x = y;
    }
  }

  // After an exception: drop the step's activations and every gathered buffer.
  void abandon_step() {
    free_activations();
    for (FlatUnit& fu : units) fu.reshard();
  }

  UnitCtx ctx_for(FlatUnit& fu, const Batch& batch, int pos, bool training) {
    UnitCtx ctx;
    ctx.ops = ops;
    ctx.batch = &batch;
    ctx.params = &fu.params;
    ctx.grads = &fu.grads;
    ctx.saved = &saved[static_cast<size_t>(pos)];
    ctx.scratch = &scratch;
    ctx.training = training;
    return ctx;
  }
};

// ---- Construction and initialisation ---------------------------------------------------------

ShardedModel::ShardedModel(Model& model, const Ops& ops, uint64_t seed)
    : model_(model), impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.ops = &ops;
  if (model.units.empty()) fail("sharded_model", "the model has no units");
  if (model.schedule.empty()) fail("sharded_model", "the model's schedule is empty");

  I.units.resize(model.units.size());
  for (size_t u = 0; u < model.units.size(); ++u) {
    FlatUnit& fu = I.units[u];
    fu.unit = model.units[u].get();
    fu.rank = I.rank;
    fu.layout = FlatLayout::build(fu.unit->params(), I.world);
    const FlatLayout& L = fu.layout;
    const size_t shard_bytes = static_cast<size_t>(L.shard_size()) * sizeof(float);
    fu.master = Buffer(shard_bytes, Mem::Params, ops.device());
    fu.m = Buffer(shard_bytes, Mem::Optimizer, ops.device());
    fu.v = Buffer(shard_bytes, Mem::Optimizer, ops.device());
    fu.grad = Buffer(static_cast<size_t>(L.padded) * sizeof(float), Mem::Grads, ops.device());
    ops.fill(fu.master.f32(), 0.f, static_cast<size_t>(L.shard_size()));
    ops.fill(fu.m.f32(), 0.f, static_cast<size_t>(L.shard_size()));
    ops.fill(fu.v.f32(), 0.f, static_cast<size_t>(L.shard_size()));
    ops.fill(fu.grad.f32(), 0.f, static_cast<size_t>(L.padded));
    // World 1: the shard is the whole buffer.
    fu.full = fu.master.f32();
    fu.grad_shard = fu.grad.f32();
    for (size_t s = 0; s < L.specs.size(); ++s) {
      const ParamSpec& spec = L.specs[s];
      fu.params.push_back(fu.full + L.entries[s].offset);
      fu.grads.push_back(fu.grad.f32() + L.entries[s].offset);
      if (!I.by_name.emplace(spec.name, std::make_pair(static_cast<int>(u), static_cast<int>(s)))
               .second)
        fail("sharded_model", "parameter name '" + spec.name + "' is declared twice");
    }
  }

  for (size_t p = 0; p < model.schedule.size(); ++p) {
    const Call& c = model.schedule[p];
    if (c.unit < 0 || c.unit >= static_cast<int>(I.units.size()))
      fail("sharded_model", "schedule entry " + std::to_string(p) + " names unit " +
                                std::to_string(c.unit) + " of " + std::to_string(I.units.size()));
    FlatUnit& fu = I.units[static_cast<size_t>(c.unit)];
    if (c.call < 0 || c.call >= fu.unit->num_calls())
      fail("sharded_model", "schedule entry " + std::to_string(p) + " runs call " +
                                std::to_string(c.call) + " of unit '" + fu.unit->name() +
                                "', which has " + std::to_string(fu.unit->num_calls()));
    if (fu.first_pos < 0) fu.first_pos = static_cast<int>(p);
    fu.last_pos = static_cast<int>(p);
  }
  I.acts.resize(model.schedule.size());
  I.saved.resize(model.schedule.size());

  // Element i of parameter s: a pure function of (seed, s.name, i), so any rank can produce
  // exactly its slice. Only the intersection of each parameter with this rank's shard is
  // written; alignment gaps and padding stay zero.
  for (FlatUnit& fu : I.units) {
    const Range shard = fu.shard_range();
    float* dst = fu.master.f32() - shard.lo;  // indexed by flat offset
    for (size_t s = 0; s < fu.layout.specs.size(); ++s) {
      const ParamSpec& spec = fu.layout.specs[s];
      const FlatEntry& e = fu.layout.entries[s];
      const Range r = intersect(shard, {e.offset, e.offset + e.numel});
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
  }
}

ShardedModel::~ShardedModel() = default;

int64_t ShardedModel::num_params() const {
  int64_t n = 0;
  for (const FlatUnit& fu : impl_->units)
    for (const FlatEntry& e : fu.layout.entries) n += e.numel;
  return n;
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

double ShardedModel::forward_backward(const Batch& batch, float grad_scale) {
  Impl& I = *impl_;
  check_batch(batch, true);
  const int64_t counted = count_targets(batch);
  // d(mean loss) = d(sum of token losses) / counted.
  const float scale = counted > 0 ? grad_scale / static_cast<float>(counted) : 0.f;
  const size_t P = model_.schedule.size();

  double loss_sum = 0;
  int64_t loss_count = 0;
  try {
    I.forward(model_, batch, true, scale, nullptr, loss_sum, loss_count);

    // Backward in reverse schedule order. dy of the last (loss) call is null; each call writes
    // dx into the ping-pong buffer the previous call reads as dy.
    const float* dy = nullptr;
    int cur = 0;
    for (size_t q = P; q-- > 0;) {
      const Call& c = model_.schedule[q];
      FlatUnit& fu = I.units[static_cast<size_t>(c.unit)];
      fu.unshard();
      float* dx = q > 0 ? I.dbuf[cur].f32() : nullptr;
      UnitCtx ctx = I.ctx_for(fu, batch, static_cast<int>(q), true);
      ctx.grad_scale = scale;
      I.scratch.reset();
      fu.unit->backward(ctx, c.call, q > 0 ? I.acts[q].f32() : nullptr, dy, dx);
      fu.grads_pending = true;
      // This call's activations are no longer needed.
      I.acts[q].release();
      I.saved[q].clear();
      if (static_cast<int>(q) == fu.first_pos) {  // the unit's last backward call
        fu.reshard();
        fu.reduce_grads();
      }
      dy = dx;
      cur ^= 1;
    }
  } catch (...) {
    I.abandon_step();
    throw;
  }
  I.free_activations();
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
  // Sum of squares of this rank's reduced gradient shard (alignment gaps and padding are never
  // written, so they stay zero); with more ranks the partial sums are all-reduced here.
  double ss = 0;
  for (const FlatUnit& fu : impl_->units)
    ss += impl_->ops->sum_squares(fu.grad_shard, static_cast<size_t>(fu.layout.shard_size()));
  return std::sqrt(ss);
}

void ShardedModel::zero_grads() {
  for (FlatUnit& fu : impl_->units) {
    impl_->ops->fill(fu.grad.f32(), 0.f, static_cast<size_t>(fu.layout.padded));
    fu.grads_pending = false;
  }
}

void ShardedModel::optimizer_step(const AdamWParams& p, float lr, float grad_mult, int step) {
  SW_CHECK(step >= 1, "AdamW steps count from 1");
  const Ops& ops = *impl_->ops;
  for (FlatUnit& fu : impl_->units) {
    fu.reduce_grads();  // no-op unless a backward is still pending
    const Range shard = fu.shard_range();
    for (size_t s = 0; s < fu.layout.specs.size(); ++s) {
      const FlatEntry& e = fu.layout.entries[s];
      const Range r = intersect(shard, {e.offset, e.offset + e.numel});
      if (r.empty()) continue;
      const size_t off = static_cast<size_t>(r.lo - shard.lo);
      const float wd = fu.layout.specs[s].weight_decay ? p.weight_decay : 0.f;
      ops.adamw(fu.master.f32() + off, fu.grad_shard + off, fu.m.f32() + off, fu.v.f32() + off,
                static_cast<size_t>(r.hi - r.lo), lr, p.beta1, p.beta2, p.eps, wd, step, grad_mult);
    }
  }
}

// ---- Parameter access ------------------------------------------------------------------------

void ShardedModel::for_each_param(
    const std::function<void(const ParamSpec&, const float* data)>& fn) const {
  // World 1: the master shard is the full buffer. With more ranks this gathers one unit at a
  // time into a temporary.
  for (const FlatUnit& fu : impl_->units)
    for (size_t s = 0; s < fu.layout.specs.size(); ++s)
      fn(fu.layout.specs[s], fu.master.f32() + fu.layout.entries[s].offset);
}

void ShardedModel::for_each_grad(
    const std::function<void(const ParamSpec&, const float* grad)>& fn) const {
  // World 1: the reduced gradient shard is the full gradient. With more ranks this gathers the
  // reduced shards one unit at a time.
  for (const FlatUnit& fu : impl_->units)
    for (size_t s = 0; s < fu.layout.specs.size(); ++s)
      fn(fu.layout.specs[s], fu.grad_shard + fu.layout.entries[s].offset);
}

void ShardedModel::set_param(const std::string& name, const float* data, int64_t n) {
  auto it = impl_->by_name.find(name);
  if (it == impl_->by_name.end()) fail("sharded_model", "no parameter named '" + name + "'");
  FlatUnit& fu = impl_->units[static_cast<size_t>(it->second.first)];
  const size_t s = static_cast<size_t>(it->second.second);
  const FlatEntry& e = fu.layout.entries[s];
  if (n != e.numel)
    fail("sharded_model", "parameter '" + name + "' has " + std::to_string(e.numel) + " elements " +
                              shape_str(fu.layout.specs[s].shape) + ", got " + std::to_string(n));
  const Range shard = fu.shard_range();
  const Range r = intersect(shard, {e.offset, e.offset + e.numel});
  if (r.empty()) return;
  impl_->ops->copy(fu.master.f32() + (r.lo - shard.lo), data + (r.lo - e.offset),
                   static_cast<size_t>(r.hi - r.lo));
}

}  // namespace sw
