// Plan construction: a symbolic walk of the schedule over each unit's state (sharded, gather in
// flight, unsharded), making the same decisions the engine used to take inline (prefetch depth
// and max_live_units, reshard_after_forward, the tied unit kept from its first call to its
// last, accumulation modes, buckets, HYBRID's two-level reduction, checkpointing, the
// optimizer's prefetch of the next step) and writing each one down as an action.
#include "sharding/step_plan.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>

#include "core/clock.h"
#include "core/error.h"
#include "sharding/flat_param.h"

namespace sw {

const char* queue_name(Queue q) {
  static const char* n[] = {"compute", "gather", "reduce", "io", "host"};
  return q < Queue::Count ? n[static_cast<size_t>(q)] : "?";
}

const char* action_kind_name(ActionKind k) {
  static const char* n[] = {"gather",      "wait_gather", "forward",        "drop_saved",
                            "recompute",   "backward",    "free",           "reduce_scatter",
                            "all_reduce",  "round_grads", "wait_reduce",    "optimizer_update",
                            "regather",    "fetch",       "evict",          "wait_io"};
  return k < ActionKind::Count ? n[static_cast<size_t>(k)] : "?";
}

double trace_clock() { return trace_now(); }

PlanInput make_plan_input(const Model& model, const ShardingPolicy& policy, int world) {
  PlanInput in;
  in.policy = policy;
  in.compute = policy.mixed_precision.param_dtype;
  in.W = world;
  switch (policy.strategy) {
    case ShardingStrategy::NoShard:
      in.S = 1;
      break;
    case ShardingStrategy::HybridShard:
      in.S = policy.shard_group_size > 0 ? policy.shard_group_size : world;
      if (in.S < 1 || world % in.S != 0)
        fail("sharding", "shard_group_size (" + std::to_string(in.S) +
                             ") must divide the world size (" + std::to_string(world) + ")");
      break;
    default:
      in.S = world;
  }
  in.R = world / in.S;
  // NVMe parameters need the sharded path (a gather from staging) even with one rank.
  const bool nvme_params = policy.offload_param.device == OffloadDevice::Nvme &&
                           policy.strategy != ShardingStrategy::NoShard &&
                           policy.strategy != ShardingStrategy::ShardOptimizer && in.R == 1;
  in.kind = in.S == 1 && !nvme_params                              ? UnitKind::Whole
            : policy.strategy == ShardingStrategy::ShardOptimizer ? UnitKind::FullReplicated
                                                                  : UnitKind::Sharded;
  in.schedule = model.schedule;
  in.d_model = model.d_model();
  const size_t U = model.units.size();
  in.units.resize(U);
  for (size_t u = 0; u < U; ++u) {
    PlanUnit& pu = in.units[u];
    pu.name = model.units[u]->name();
    const FlatLayout L = FlatLayout::build(model.units[u]->params(), in.S);
    pu.padded = L.padded;
    pu.lp_only = L.lp_only();
    pu.selective = model.units[u]->selective_recompute();
    pu.optimizer_offloaded =
        policy.offload_optimizer.offloaded(static_cast<int>(u), static_cast<int>(U));
    pu.params_offloaded = policy.offload_param.device != OffloadDevice::None;
    pu.optimizer_nvme =
        pu.optimizer_offloaded && policy.offload_optimizer.device == OffloadDevice::Nvme;
  }
  // NVMe parameters: all units' shards, but the first ones that fit in max_in_cpu elements
  // (those stay on the host tier).
  std::vector<int64_t> shard_floats(U);
  for (size_t u = 0; u < U; ++u) shard_floats[u] = in.units[u].padded / in.S;
  for (size_t u = 0; u < U; ++u)
    in.units[u].params_nvme = in.kind == UnitKind::Sharded &&
                              policy.offload_param.on_nvme(static_cast<int>(u), shard_floats);
  for (size_t p = 0; p < model.schedule.size(); ++p) {
    const Call& c = model.schedule[p];
    if (c.unit < 0 || c.unit >= static_cast<int>(U))
      fail("sharded_model", "schedule entry " + std::to_string(p) + " names unit " +
                                std::to_string(c.unit) + " of " + std::to_string(U));
    const Unit* unit = model.units[static_cast<size_t>(c.unit)].get();
    if (c.call < 0 || c.call >= unit->num_calls())
      fail("sharded_model", "schedule entry " + std::to_string(p) + " runs call " +
                                std::to_string(c.call) + " of unit '" + unit->name() +
                                "', which has " + std::to_string(unit->num_calls()));
    PlanUnit& pu = in.units[static_cast<size_t>(c.unit)];
    if (pu.first_pos < 0) pu.first_pos = static_cast<int>(p);
    pu.last_pos = static_cast<int>(p);
  }
  // NO_SHARD buckets: units in backward-completion order (descending first position), cut
  // once a bucket reaches bucket_bytes.
  if (in.kind == UnitKind::Whole && in.R > 1) {
    std::vector<int> order(U);
    for (size_t u = 0; u < U; ++u) order[u] = static_cast<int>(u);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return in.units[size_t(a)].first_pos > in.units[size_t(b)].first_pos;
    });
    int64_t off = 0;
    for (int u : order) {
      if (in.buckets.empty() ||
          (in.buckets.back().hi - in.buckets.back().lo) * 4 >= policy.bucket_bytes)
        in.buckets.push_back({off, off, {}});
      PlanBucket& b = in.buckets.back();
      off += in.units[size_t(u)].padded;
      b.hi = off;
      b.members.push_back(u);
      in.units[size_t(u)].bucket = static_cast<int>(in.buckets.size() - 1);
    }
  }
  return in;
}

void declare_calls(PlanInput& in, const Model& model) {
  in.calls.assign(in.schedule.size(), CallMemory{});
  const BatchShape shape{in.B, in.T, in.compute};
  const int64_t y = static_cast<int64_t>(
      Scratch::bytes_for(static_cast<size_t>(in.B) * in.T * model.d_model()));
  for (size_t p = 0; p < in.schedule.size(); ++p) {
    const Call& c = in.schedule[p];
    const ActivationDecl d = model.units[size_t(c.unit)]->declare_activations(c.call, shape);
    CallMemory& m = in.calls[p];
    m.known = d.known;
    if (!d.known) continue;
    m.saved = static_cast<int64_t>(d.saved);
    m.saved_cheap = static_cast<int64_t>(d.saved_cheap);
    m.saved_eval = static_cast<int64_t>(std::max(d.saved_eval, d.saved_logits));
    m.scratch = static_cast<int64_t>(std::max(
        {d.scratch_fwd, d.scratch_bwd, d.scratch_recompute, d.scratch_eval, d.scratch_logits}));
    m.scratch = std::max(m.scratch, y + static_cast<int64_t>(d.scratch_fwd));  // full recompute
  }
}

// OptimizerOffload::defer_update: unit u's update runs in the next step's first forward
// (moments alone on NVMe: its master stays in memory for the gather to read right after).
bool unit_defers(const PlanInput& in, int u) {
  const PlanUnit& pu = in.units[size_t(u)];
  if (!in.policy.offload_optimizer.defer_update || in.kind == UnitKind::FullReplicated ||
      !pu.optimizer_nvme)
    return false;
  // Not beside NVMe parameters: their updates stream through the same staging buffers at the
  // step's end, where the deferred units' carried reads wait.
  for (const PlanUnit& v : in.units)
    if (v.params_nvme) return false;
  return true;
}

// On a device, the host updater's staging (update_on_host): two offloaded updates' master and
// gradient copies at most.
StepPlan with_updater_staging(StepPlan plan, const PlanInput& in) {
  if (!in.on_device) return plan;
  int64_t most = 0;
  for (const Action& a : plan.actions) {
    if (a.kind != ActionKind::OptimizerUpdate || a.unit < 0) continue;
    const PlanUnit& u = in.units[static_cast<size_t>(a.unit)];
    if (!(u.optimizer_offloaded || u.optimizer_nvme) || u.params_offloaded || u.params_nvme)
      continue;  // (moments on the device, or the master and gradients already on the host)
    most = std::max(most, a.hi >= 0 ? a.hi - a.lo : u.padded / in.S);
  }
  plan.host_update_staging = 2 * 2 * int64_t{sizeof(float)} * most;
  return plan;
}

int64_t full_params_bytes(const PlanUnit& u, bool w16) {
  return w16 ? (u.padded - u.lp_only) * 4 + u.padded * 2 : u.padded * 4;
}

namespace {

constexpr size_t kComm = static_cast<size_t>(Mem::Communication);
constexpr size_t kAct = static_cast<size_t>(Mem::Activations);

// The symbolic state of a walk over the schedule.
class Builder {
 public:
  explicit Builder(const PlanInput& in) : in_(in) {
    const size_t U = in.units.size();
    st_.assign(U, St::Unsharded);
    gather_at_.assign(U, -1);
    has_grads_.assign(U, in.kind != UnitKind::Sharded);
    if (in.kind == UnitKind::Sharded) st_.assign(U, St::Sharded);
    for (size_t u = 0; u < U && u < in.carried.size(); ++u)
      if (in.carried[u] && in.kind != UnitKind::Whole) {
        st_[u] = St::InFlight;
        if (in.kind == UnitKind::Sharded) {
          plan_.initial[kComm] += params_bytes(int(u));
          ++plan_.initial_gathered;
        }
      }
    recompute_.assign(in.schedule.size(), CheckpointMode::Off);
    ready_.assign(in.buckets.size(), 0);
    plan_.W = in.W, plan_.S = in.S, plan_.R = in.R, plan_.kind = in.kind;
    for (const PlanUnit& u : in.units) plan_.unit_names.push_back(u.name);
    plan_.activations_known = !in.calls.empty();
    for (const CallMemory& c : in.calls) plan_.activations_known &= c.known;
    fill_persistent();
  }

  StepPlan take() {
    add_param_fetches();
    return std::move(plan_);
  }
  std::vector<bool> in_flight() const {
    std::vector<bool> f(st_.size());
    for (size_t u = 0; u < st_.size(); ++u) f[u] = st_[u] == St::InFlight;
    return f;
  }

  void micro_step(int micro, bool reduce, bool last) {
    micro_ = micro;
    plan_.nvme_bytes -= act_file_;  // micro-steps reuse the activation file from its start
    act_file_ = 0;
    const int b = static_cast<int>(plan_.actions.size());
    last_ = last;
    // The step's last micro-step reads the next updates' first pieces (moments only: nothing
    // this segment writes) into their staging buffers, idle until then, so that the reads
    // overlap the forward and backward instead of starting the optimizer's wait. With
    // deferred updates pending, the first micro-step runs them in its forward (and the
    // last one issues those reads once the staging buffers are free again).
    if (in_.pending && micro == 0 && any_deferred())
      begin_deferred();
    else if (last)
      issue_carried_reads({});
    forward(true);
    update_through(static_cast<int>(in_.units.size()));  // units the schedule never uses
    backward(reduce);
    plan_.segments.push_back({SegmentKind::MicroStep, micro, reduce, b,
                              static_cast<int>(plan_.actions.size())});
  }

  void eval() {
    const int b = static_cast<int>(plan_.actions.size());
    forward(false);
    plan_.segments.push_back(
        {SegmentKind::Eval, 0, false, b, static_cast<int>(plan_.actions.size())});
  }

  // flush: only the deferred units' updates (plan_flush); otherwise every update that is not
  // deferred.
  void optimizer(bool flush = false) {
    micro_ = in_.accum - 1;
    const int b = static_cast<int>(plan_.actions.size());
    const bool defer = any_deferred();
    // NVMe moments stream in pieces of at most piece_floats of a unit's shard (m then v)
    // through `bc` staging buffers: the first bc - 1 pieces are read ahead; after piece k's
    // update it is written back and piece k + bc - 1 read into the buffer piece k - 1 left (its
    // write was queued before it, and the io queue runs in order).
    // The first carried_pieces() were read by the last micro-step (Action::carry).
    const std::vector<Piece> pieces =
        nvme_pieces(flush ? Which::Deferred : defer ? Which::Kept : Which::All);
    const int np = static_cast<int>(pieces.size());
    const int bc = opt_buffers();
    const int carried = !defer || flush ? carried_pieces(pieces) : 0;
    std::vector<int> fetch_at(pieces.size(), -1), evict_at, evict_wait;
    auto fetch = [&](int k) {
      Action& a = add_piece_fetch(pieces, k);
      if (k < carried) a.carry = a.adopt = true, a.bytes = 0;
      if (k >= bc) a.waits.push_back(evict_at[size_t(k - bc)]);
      fetch_at[size_t(k)] = static_cast<int>(plan_.actions.size()) - 1;
    };
    for (int k = 0; k < std::min(bc - 1, np); ++k) fetch(k);
    int next = 0;  // the next piece to update
    for (size_t u = 0; u < in_.units.size(); ++u) {
      const int ui = static_cast<int>(u);
      // Deferred: updated by the next forward (or a flush), gathered after that.
      if (deferred(ui) != flush) continue;
      if (in_.kind == UnitKind::FullReplicated) wait(ui);  // a previous regather
      if (in_.kind == UnitKind::Sharded && st_[u] != St::Sharded) {  // a stale prefetch
        wait(ui);
        free(ui);
      }
      if (!streamed(ui)) add(ActionKind::OptimizerUpdate, Queue::Compute, ui);
      for (; next < np && pieces[size_t(next)].unit == ui; ++next) {
        const int k = next;
        const Piece& pc = pieces[size_t(k)];
        add(ActionKind::WaitIo, Queue::Compute, ui).waits.push_back(fetch_at[size_t(k)]);
        Action& up = add(ActionKind::OptimizerUpdate, Queue::Compute, ui);
        up.lo = pc.lo, up.hi = pc.hi;
        Action& e = add(ActionKind::Evict, Queue::IO, ui);
        e.slot = k % bc;
        e.lo = pc.lo, e.hi = pc.hi;
        e.io = piece_io(ui, false);
        e.bytes = io_floats(e.io) * (pc.hi - pc.lo) * 4;
        // Moments only: the write may finish during the next step (Action::carry); nothing
        // before the next optimizer reads them, and the io queue orders any read of the same
        // range or buffer after it. A master written back is read by the next gathers: waited.
        e.carry = e.io == kIoMoments;
        evict_at.push_back(static_cast<int>(plan_.actions.size()) - 1);
        if (!e.carry) evict_wait.push_back(evict_at.back());
        if (k + bc - 1 < np) fetch(k + bc - 1);
      }
      if (in_.kind == UnitKind::FullReplicated) {
        Action& a = add(ActionKind::Regather, Queue::Gather, ui);
        a.bytes = in_.units[u].padded * static_cast<int64_t>(dtype_size(pdt()));
        st_[u] = St::InFlight;
        gather_at_[u] = static_cast<int>(plan_.actions.size()) - 1;
      }
      // The units the next forward starts with are gathered while later updates run, within
      // max_live_units (the next forward counts them as live). Not NVMe parameters: the
      // micro-step fetches them ahead of its own gathers.
      const PlanUnit& pu = in_.units[u];
      if (!flush && in_.kind == UnitKind::Sharded && pu.first_pos >= 0 && !pu.params_nvme &&
          pu.first_pos < in_.policy.forward_prefetch &&
          (in_.policy.max_live_units == 0 || live() < in_.policy.max_live_units))
        issue(ui);
    }
    if (!evict_wait.empty()) {  // masters written back before the next gathers read them
      Action& w = add(ActionKind::WaitIo, Queue::Compute);
      w.waits = evict_wait;
    }
    plan_.segments.push_back({SegmentKind::Optimizer, micro_, false, b,
                              static_cast<int>(plan_.actions.size())});
  }

 private:
  enum class St : uint8_t { Sharded, InFlight, Unsharded };

  // NVMe parameters: each segment's gathers of such units read their master shard into one of
  // param_slots staging buffers first. The gather copies the shard out at issue, so a buffer is
  // free again right after its Gather: gather g of the segment uses buffer g % param_slots and
  // its Fetch is inserted right after gather g - param_slots (at the segment's start for the
  // first param_slots), as far ahead as the buffers allow.
  void add_param_fetches() {
    if (plan_.param_slots == 0) return;
    const int n = plan_.param_slots;
    std::vector<Action> out;
    std::vector<int> remap(plan_.actions.size(), -1);
    std::vector<int> fetch_of;  // per gather of the segment: the new index of its Fetch
    std::vector<int> gather_pos;  // old indices of the segment's gathers
    auto fetch = [&](int g) {
      const Action& ga = plan_.actions[size_t(gather_pos[size_t(g)])];
      Action f;
      f.kind = ActionKind::Fetch;
      f.queue = Queue::IO;
      f.unit = ga.unit;
      f.micro = ga.micro;
      f.slot = g % n;
      f.io = kIoMaster;
      f.bytes = in_.units[size_t(ga.unit)].padded / in_.S * 4;
      if (g >= n) f.waits.push_back(remap[size_t(gather_pos[size_t(g - n)])]);
      fetch_of[size_t(g)] = static_cast<int>(out.size());
      out.push_back(std::move(f));
    };
    for (Segment& sg : plan_.segments) {
      gather_pos.clear();
      for (int i = sg.begin; i < sg.end; ++i) {
        const Action& a = plan_.actions[size_t(i)];
        if (a.kind == ActionKind::Gather && in_.units[size_t(a.unit)].params_nvme)
          gather_pos.push_back(i);
      }
      fetch_of.assign(gather_pos.size(), -1);
      const int begin = static_cast<int>(out.size());
      const int G = static_cast<int>(gather_pos.size());
      for (int g = 0; g < std::min(n, G); ++g) fetch(g);
      int g = 0;
      for (int i = sg.begin; i < sg.end; ++i) {
        Action a = plan_.actions[size_t(i)];
        for (int& w : a.waits) w = remap[size_t(w)];
        const bool is_gather = g < G && gather_pos[size_t(g)] == i;
        if (is_gather) a.waits.push_back(fetch_of[size_t(g)]);
        remap[size_t(i)] = static_cast<int>(out.size());
        out.push_back(std::move(a));
        if (is_gather) {
          if (g + n < G) fetch(g + n);
          ++g;
        }
      }
      sg.begin = begin;
      sg.end = static_cast<int>(out.size());
    }
    plan_.actions = std::move(out);
  }

  // NVMe optimizer offload: the pieces of at most piece_floats of each offloaded unit's shard,
  // in unit order, that the optimizer segment streams.
  struct Piece {
    int unit;
    int64_t lo, hi;  // floats of the unit's shard
  };
  enum class Which : uint8_t { All, Kept, Deferred };  // Kept: updates not deferred
  std::vector<Piece> nvme_pieces(Which w = Which::All) const {
    std::vector<Piece> pieces;
    const int64_t C = in_.policy.offload_optimizer.piece();
    for (size_t u = 0; u < in_.units.size(); ++u)
      if (streamed(static_cast<int>(u)) &&
          (w == Which::All || (w == Which::Deferred) == deferred(static_cast<int>(u))))
        for (int64_t lo = 0, sh = in_.units[u].padded / in_.S; lo < sh; lo += C)
          pieces.push_back({static_cast<int>(u), lo, std::min(sh, lo + C)});
    return pieces;
  }

  int opt_buffers() const { return std::max(2, in_.policy.offload_optimizer.buffer_count); }
  // The Fetch of optimizer piece k into staging buffer k % opt_buffers().
  Action& add_piece_fetch(const std::vector<Piece>& pieces, int k) {
    const Piece& pc = pieces[size_t(k)];
    Action& a = add(ActionKind::Fetch, Queue::IO, pc.unit);
    a.slot = k % opt_buffers();
    a.lo = pc.lo, a.hi = pc.hi;
    a.io = piece_io(pc.unit, true);
    a.bytes = io_floats(a.io) * (pc.hi - pc.lo) * 4;
    return a;
  }
  // The optimizer's leading pieces that the last micro-step reads ahead: those read before
  // its first update (opt_buffers() - 1 at most), while they are moments only. A piece with
  // NVMe parameters also reads the gradients that backward is still writing.
  int carried_pieces(const std::vector<Piece>& pieces) const {
    int n = 0;
    while (n < std::min<int>(opt_buffers() - 1, static_cast<int>(pieces.size())) &&
           piece_io(pieces[size_t(n)].unit, true) == kIoMoments)
      ++n;
    return n;
  }

  bool deferred(int u) const { return unit_defers(in_, u); }
  bool any_deferred() const {
    for (size_t u = 0; u < in_.units.size(); ++u)
      if (deferred(static_cast<int>(u))) return true;
    return false;
  }

  // The reads the last micro-step leaves in flight (Action::carry) for the next segment that
  // updates: the first pieces of the deferred units when any defer, else of all streamed
  // ones. `evicts`: the Evict that last used each staging buffer in this segment, by piece.
  void issue_carried_reads(const std::vector<int>& evicts) {
    const std::vector<Piece> pieces = nvme_pieces(any_deferred() ? Which::Deferred : Which::All);
    const int bc = opt_buffers();
    for (int k = 0; k < carried_pieces(pieces); ++k) {
      Action& a = add_piece_fetch(pieces, k);
      a.carry = true;
      for (int j = static_cast<int>(evicts.size()) - 1; j >= 0; --j)
        if (j % bc == k % bc) {
          a.waits.push_back(evicts[size_t(j)]);
          break;
        }
    }
  }

  // Deferred updates in the first micro-step: the pieces stream through the staging buffers
  // as in the optimizer (read bc - 1 ahead, adopt the carried reads), each unit's pieces
  // updated by update_through just before its first gather or forward.
  void begin_deferred() {
    dpieces_ = nvme_pieces(Which::Deferred);
    dnext_ = 0;
    devict_at_.clear();
    dfetch_at_.assign(dpieces_.size(), -1);
    dactive_ = true;
    const int carried = carried_pieces(dpieces_);
    for (int k = 0; k < std::min<int>(opt_buffers() - 1, static_cast<int>(dpieces_.size())); ++k)
      deferred_fetch(k, k < carried);
  }
  void deferred_fetch(int k, bool adopt) {
    Action& a = add_piece_fetch(dpieces_, k);
    if (adopt) a.carry = a.adopt = true, a.bytes = 0;
    if (k >= opt_buffers()) a.waits.push_back(devict_at_[size_t(k - opt_buffers())]);
    dfetch_at_[size_t(k)] = static_cast<int>(plan_.actions.size()) - 1;
  }
  // Runs the pending updates of units 0 .. u (pieces are in unit order); after the last one,
  // the last micro-step issues its carried reads into the freed staging buffers.
  void update_through(int u) {
    if (!dactive_) return;
    const int np = static_cast<int>(dpieces_.size()), bc = opt_buffers();
    while (dnext_ < np && dpieces_[size_t(dnext_)].unit <= u) {
      const int k = dnext_++;
      const Piece pc = dpieces_[size_t(k)];
      // A gather carried from an earlier segment read the master before this update: stale.
      if (pc.lo == 0 && in_.kind == UnitKind::Sharded && st_[size_t(pc.unit)] != St::Sharded) {
        wait(pc.unit);
        free(pc.unit);
      }
      add(ActionKind::WaitIo, Queue::Compute, pc.unit).waits.push_back(dfetch_at_[size_t(k)]);
      Action& up = add(ActionKind::OptimizerUpdate, Queue::Compute, pc.unit);
      up.lo = pc.lo, up.hi = pc.hi;
      Action& e = add(ActionKind::Evict, Queue::IO, pc.unit);
      e.slot = k % bc;
      e.lo = pc.lo, e.hi = pc.hi;
      e.io = kIoMoments;
      e.bytes = io_floats(e.io) * (pc.hi - pc.lo) * 4;
      e.carry = true;  // as the optimizer's: settled before the next update reads them
      devict_at_.push_back(static_cast<int>(plan_.actions.size()) - 1);
      if (k + bc - 1 < np) deferred_fetch(k + bc - 1, false);
    }
    if (dnext_ == np) {
      dactive_ = false;
      if (last_) issue_carried_reads(devict_at_);
    }
  }

  // Units whose update streams through the optimizer's staging (moments or master on NVMe).
  bool streamed(int u) const {
    return in_.units[size_t(u)].optimizer_nvme || in_.units[size_t(u)].params_nvme;
  }
  // What an optimizer piece of unit u reads (fetch) or writes back (evict).
  uint8_t piece_io(int u, bool fetch) const {
    const PlanUnit& pu = in_.units[size_t(u)];
    return static_cast<uint8_t>((pu.optimizer_nvme ? kIoMoments : 0) |
                                (pu.params_nvme ? kIoMaster | (fetch ? kIoGrads : 0) : 0));
  }
  static int64_t io_floats(uint8_t io) {  // floats per element of a piece
    return ((io & kIoMoments) ? 2 : 0) + ((io & kIoMaster) ? 1 : 0) + ((io & kIoGrads) ? 1 : 0);
  }

  DType pdt() const { return in_.policy.mixed_precision.param_dtype; }
  DType rdt() const { return in_.policy.mixed_precision.reduce_dtype; }
  int64_t act_bytes() const { return int64_t{4} * in_.B * in_.T * in_.d_model; }
  int64_t fbytes(int u) const { return in_.units[size_t(u)].padded * 4; }
  // A unit's gathered parameters: the fp32 full buffer and, where units keep one, the 16-bit
  // copy beside it (FlatUnit, MixedPrecisionPolicy::weights16), the fp32 one then compact.
  bool w16() const { return in_.policy.mixed_precision.weights16(in_.on_device); }
  int64_t params_bytes(int u) const { return full_params_bytes(in_.units[size_t(u)], w16()); }
  const CallMemory* call_mem(int pos) const {
    return pos < static_cast<int>(in_.calls.size()) ? &in_.calls[size_t(pos)] : nullptr;
  }

  Action& add(ActionKind k, Queue q, int unit = -1, int pos = -1) {
    Action a;
    a.kind = k;
    a.queue = q;
    a.unit = unit;
    a.pos = pos;
    if (pos >= 0) a.call = in_.schedule[size_t(pos)].call;
    a.micro = micro_;
    plan_.actions.push_back(std::move(a));
    return plan_.actions.back();
  }

  int live() const {
    int n = 0;
    if (in_.kind == UnitKind::Sharded)
      for (St s : st_) n += s != St::Sharded;
    return n;
  }

  // FlatUnit::issue_unshard: a Sharded unit allocates its full buffer and gathers into it.
  void issue(int u) {
    if (st_[size_t(u)] != St::Sharded) return;
    Action& a = add(ActionKind::Gather, Queue::Gather, u);
    a.bytes = in_.units[size_t(u)].padded * static_cast<int64_t>(dtype_size(pdt()));
    a.mem[kComm] = params_bytes(u);
    st_[size_t(u)] = St::InFlight;
    gather_at_[size_t(u)] = static_cast<int>(plan_.actions.size()) - 1;
  }

  void prefetch(int pos, int depth, int dir) {
    const int P = static_cast<int>(in_.schedule.size());
    for (int k = 1; k <= depth; ++k) {
      const int p = pos + dir * k;
      if (p < 0 || p >= P) break;
      const int u = in_.schedule[size_t(p)].unit;
      if (st_[size_t(u)] != St::Sharded) continue;
      if (in_.policy.max_live_units > 0 && live() >= in_.policy.max_live_units) break;
      update_through(u);  // a deferred update before the gather reads the master
      issue(u);
    }
  }

  void wait(int u) {
    if (st_[size_t(u)] == St::Unsharded) return;
    issue(u);
    Action& a = add(ActionKind::WaitGather, Queue::Compute, u);
    if (gather_at_[size_t(u)] >= 0) a.waits.push_back(gather_at_[size_t(u)]);
    st_[size_t(u)] = St::Unsharded;
  }

  void free(int u) {
    if (in_.kind != UnitKind::Sharded || st_[size_t(u)] == St::Sharded) return;
    Action& a = add(ActionKind::Free, Queue::Compute, u);
    a.mem[kComm] = -params_bytes(u);
    st_[size_t(u)] = St::Sharded;
    gather_at_[size_t(u)] = -1;
  }

  // FlatUnit::ensure_grads: a Sharded unit's unsharded gradients are transient.
  void ensure_grads(Action& a, int u) {
    if (has_grads_[size_t(u)]) return;
    a.mem[kComm] += fbytes(u);
    has_grads_[size_t(u)] = true;
  }

  bool nvme_acts() const { return in_.policy.activation_checkpointing.offload_nvme; }
  // Activation offload whose copies complete later than their action: to the file, or to the
  // host tier on a device (copy streams). Evicted bytes are freed once the copy is observed
  // done, after the next call's forward; reads are issued one call ahead of their backward.
  bool async_acts() const { return nvme_acts() || in_.on_device; }
  void fetch_acts(int q) {
    Action& f = add(ActionKind::Fetch, Queue::IO, in_.schedule[size_t(q)].unit, q);
    f.bytes = kept_bytes(q);
    f.mem[kAct] = f.bytes;
    act_fetch_at_[q] = static_cast<int>(plan_.actions.size()) - 1;
  }

  // Activation offload: every call but the first, the loss and the one before it.
  bool offloads_activations(int p) const {
    const int P = static_cast<int>(in_.schedule.size());
    return in_.policy.activation_checkpointing.offloads() && p >= 1 && p + 2 < P;
  }
  // What position p keeps for its backward after its forward: its input and what checkpointing
  // left of its Saved.
  int64_t kept_bytes(int p) const {
    int64_t b = p > 0 ? act_bytes() : 0;
    if (const CallMemory* cm = call_mem(p)) {
      const CheckpointMode m = recompute_[size_t(p)];
      b += m == CheckpointMode::Full        ? 0
           : m == CheckpointMode::Selective ? cm->saved - cm->saved_cheap
                                            : cm->saved;
    }
    return b;
  }

  CheckpointMode checkpoint_mode(int p) const {
    const int P = static_cast<int>(in_.schedule.size());
    if (p + 1 == P) return CheckpointMode::Off;  // the loss call
    const int u = in_.schedule[size_t(p)].unit;
    CheckpointMode m = in_.policy.activation_checkpointing.mode_for(u);
    if (m == CheckpointMode::Selective && !in_.units[size_t(u)].selective) m = CheckpointMode::Full;
    const CallMemory* cm = call_mem(p);
    if (cm && cm->known) {  // nothing to drop: nothing to rebuild
      if (m == CheckpointMode::Full && cm->saved == 0) m = CheckpointMode::Off;
      if (m == CheckpointMode::Selective && cm->saved_cheap == 0) m = CheckpointMode::Off;
    }
    return m;
  }

  void forward(bool training) {
    const int P = static_cast<int>(in_.schedule.size());
    for (int p = 0; p < P; ++p) {
      const int u = in_.schedule[size_t(p)].unit;
      const PlanUnit& pu = in_.units[size_t(u)];
      update_through(u);  // a deferred update before the unit's first gather or use
      issue(u);
      prefetch(p, in_.policy.forward_prefetch, +1);
      wait(u);
      Action& a = add(ActionKind::Forward, Queue::Compute, u, p);
      const int fwd_at = static_cast<int>(plan_.actions.size()) - 1;
      const CallMemory* cm = call_mem(p);
      if (!training && cm) a.transient[kAct] = cm->saved_eval;
      if (training) {
        if (p + 1 == P) ensure_grads(a, u);  // the loss call may produce the head's gradients
        if (p + 1 < P) a.mem[kAct] += act_bytes();
        if (cm) a.mem[kAct] += cm->saved;
        const CheckpointMode m = checkpoint_mode(p);
        if (m != CheckpointMode::Off) {
          Action& d = add(ActionKind::DropSaved, Queue::Compute, u, p);
          d.mode = m;
          if (cm) d.mem[kAct] = -(m == CheckpointMode::Full ? cm->saved : cm->saved_cheap);
          recompute_[size_t(p)] = m;
        }
        if (offloads_activations(p)) {  // what backward needs, to the host tier or a file
          Action& e = add(ActionKind::Evict, Queue::IO, u, p);
          e.bytes = kept_bytes(p);
          if (async_acts()) {  // freed once copied: observed after the next call's forward
            act_evicts_.emplace_back(static_cast<int>(plan_.actions.size()) - 1, e.bytes);
            if (nvme_acts()) {
              act_file_ += e.bytes;
              plan_.nvme_bytes += e.bytes;  // (one micro-step's: each starts at the file's start)
            }
          } else {
            e.mem[kAct] = -e.bytes;
          }
        }
      }
      // NVMe: the writes issued before this call's forward are complete by now.
      while (async_acts() && !act_evicts_.empty() && act_evicts_.front().first < fwd_at) {
        Action& w = add(ActionKind::WaitIo, Queue::Compute, u, p);
        w.waits.push_back(act_evicts_.front().first);
        w.mem[kAct] = -act_evicts_.front().second;
        act_evicts_.erase(act_evicts_.begin());
      }
      if (p == pu.last_pos && (!training || (in_.policy.reshard_after_forward && pu.last_pos + 1 != P)))
        free(u);
    }
    for (const auto& [ei, bytes] : act_evicts_) {  // (none left with two calls after the last)
      Action& w = add(ActionKind::WaitIo, Queue::Compute);
      w.waits.push_back(ei);
      w.mem[kAct] = -bytes;
    }
    act_evicts_.clear();
  }

  void backward(bool reduce) {
    const int P = static_cast<int>(in_.schedule.size());
    for (int q = P - 1; q >= 0; --q) {
      const int u = in_.schedule[size_t(q)].unit;
      const PlanUnit& pu = in_.units[size_t(u)];
      const CallMemory* cm = call_mem(q);
      issue(u);
      prefetch(q, in_.policy.backward_prefetch, -1);
      wait(u);
      // Back from the host tier (the CPU copies at issue) or the file / a device's copy stream:
      // those are issued one call ahead, so that they overlap the backward of the call after.
      if (offloads_activations(q) && act_fetch_at_.count(q) == 0) fetch_acts(q);
      if (async_acts() && q >= 1 && offloads_activations(q - 1)) fetch_acts(q - 1);
      if (offloads_activations(q))
        add(ActionKind::WaitIo, Queue::Compute, u, q).waits.push_back(act_fetch_at_[q]);
      if (recompute_[size_t(q)] != CheckpointMode::Off) {
        Action& r = add(ActionKind::Recompute, Queue::Compute, u, q);
        r.mode = recompute_[size_t(q)];
        if (cm) r.mem[kAct] = r.mode == CheckpointMode::Full ? cm->saved : cm->saved_cheap;
        recompute_[size_t(q)] = CheckpointMode::Off;
      }
      // At most one reduction in flight when a unit's transient gradients are allocated: the
      // older ones are completed first (their gradients freed), which bounds the memory.
      if (!has_grads_[size_t(u)] && inflight_.size() > 1) wait_reductions(inflight_.size() - 1);
      Action& a = add(ActionKind::Backward, Queue::Compute, u, q);
      ensure_grads(a, u);
      if (q > 0) a.mem[kAct] -= act_bytes();
      if (cm) a.mem[kAct] -= cm->saved;
      if (q == pu.first_pos) {  // the unit's last backward call
        free(u);
        if (reduce) reduce_unit(u);
      }
    }
    if (reduce) wait_reductions(inflight_.size());
    if (!grad_evicts_.empty()) {  // the gradients are in the file when the micro-step ends
      Action& w = add(ActionKind::WaitIo, Queue::Compute);
      w.waits = grad_evicts_;
      grad_evicts_.clear();
      gslot_evict_.clear();
    }
  }

  // WaitReduce for the oldest n reductions in flight: their completion (observed here) frees
  // the transient gradients they reduced.
  void wait_reductions(size_t n) {
    Action& w = add(ActionKind::WaitReduce, Queue::Compute);
    std::vector<int> done;
    for (size_t k = 0; k < n; ++k) {
      w.waits.push_back(inflight_[k].first);
      w.mem[kComm] -= inflight_[k].second;
      done.push_back(inflight_[k].first);
    }
    inflight_.erase(inflight_.begin(), inflight_.begin() + static_cast<std::ptrdiff_t>(n));
    const int wi = static_cast<int>(plan_.actions.size()) - 1;
    for (int last : done) {  // NVMe parameters: the accumulated gradients go back to the file
      const int u = plan_.actions[size_t(last)].unit;
      if (u < 0 || !in_.units[size_t(u)].params_nvme) continue;
      int rs = last;
      while (plan_.actions[size_t(rs)].kind != ActionKind::ReduceScatter) --rs;
      Action& e = add(ActionKind::Evict, Queue::IO, u);
      e.slot = plan_.actions[size_t(rs)].slot;
      e.io = kIoGrads;
      e.bytes = in_.units[size_t(u)].padded / in_.S * 4;
      e.waits.push_back(wi);
      const int ei = static_cast<int>(plan_.actions.size()) - 1;
      gslot_evict_[e.slot] = ei;
      grad_evicts_.push_back(ei);
    }
  }

  void reduce_unit(int u) {
    const PlanUnit& pu = in_.units[size_t(u)];
    const int64_t rb = static_cast<int64_t>(dtype_size(rdt()));
    switch (in_.kind) {
      case UnitKind::Sharded:
      case UnitKind::FullReplicated: {
        Action& rs = add(ActionKind::ReduceScatter, Queue::Reduce, u);
        rs.bytes = pu.padded * rb;
        int last = static_cast<int>(plan_.actions.size()) - 1;
        if (pu.params_nvme) {  // accumulates into a staging buffer, read first unless zero
          const int slot = next_gslot_++ % std::max(1, plan_.grad_slots);
          rs.slot = slot;  // (add() below may move the actions)
          Action& f = add(ActionKind::Fetch, Queue::IO, u);
          f.slot = slot;
          f.io = kIoGrads;
          f.bytes = pu.padded / in_.S * 4;
          if (gslot_evict_.count(f.slot)) f.waits.push_back(gslot_evict_[f.slot]);
        }
        if (in_.R > 1) {
          Action& ar = add(ActionKind::AllReduce, Queue::Reduce, u);
          ar.bytes = pu.padded / in_.S * rb;
          ar.waits.push_back(last);
          last = static_cast<int>(plan_.actions.size()) - 1;
        }
        int64_t freed = 0;
        if (in_.kind == UnitKind::Sharded) {  // completion frees the transient gradients
          freed = fbytes(u);
          has_grads_[size_t(u)] = false;
        }
        inflight_.emplace_back(last, freed);
        break;
      }
      case UnitKind::Whole:
        if (in_.R == 1) {
          add(ActionKind::RoundGrads, Queue::Compute, u);
        } else {
          const int b = pu.bucket;
          const PlanBucket& bk = in_.buckets[size_t(b)];
          if (++ready_[size_t(b)] == static_cast<int>(bk.members.size())) {
            Action& ar = add(ActionKind::AllReduce, Queue::Reduce);
            ar.bucket = b;
            ar.bytes = (bk.hi - bk.lo) * rb;
            ready_[size_t(b)] = 0;
            inflight_.emplace_back(static_cast<int>(plan_.actions.size()) - 1, 0);
          }
        }
        break;
    }
  }

  void fill_persistent() {
    auto add_p = [&](Mem m, int64_t bytes) { plan_.persistent[static_cast<size_t>(m)] += bytes; };
    const bool mp = pdt() != DType::F32;
    int64_t max_scratch = 0;
    for (const CallMemory& c : in_.calls) max_scratch = std::max(max_scratch, c.scratch);
    for (const PlanUnit& u : in_.units) {
      const int64_t full = u.padded * 4, shard = full / in_.S;
      // Offloaded parameters: the master (and reduced gradient) shard on the host tier.
      auto add_m = [&](Mem m, int64_t bytes) {
        if (u.params_offloaded)
          plan_.persistent_host[static_cast<size_t>(m)] += bytes;
        else
          add_p(m, bytes);
      };
      const bool split = mp || u.params_offloaded;
      // the persistent full parameters (kinds B and C): the fp32 buffer and its 16-bit copy
      const int64_t fullp = full_params_bytes(u, w16());
      switch (in_.kind) {
        case UnitKind::Sharded:
          if (u.params_nvme) {  // in the file; staged through the buffers counted below
            plan_.shard_bytes = std::max(plan_.shard_bytes, shard);
            break;
          }
          add_m(Mem::Params, shard);
          add_m(Mem::Grads, shard);
          break;
        case UnitKind::FullReplicated:
          add_p(Mem::Params, fullp);
          if (split) add_m(Mem::Params, shard);
          add_p(Mem::Grads, full);
          add_m(Mem::Grads, shard);
          break;
        case UnitKind::Whole:
          add_p(Mem::Params, fullp);
          if (split) add_m(Mem::Params, full);
          add_p(Mem::Grads, full);  // its own buffer or its region of the bucket buffer
          break;
      }
      if (u.params_nvme) plan_.nvme_bytes += 2 * shard;
      if (u.optimizer_nvme)
        plan_.nvme_bytes += 2 * shard;  // in the file; staged through the buffers below
      else if (u.optimizer_offloaded)
        plan_.persistent_host[static_cast<size_t>(Mem::Optimizer)] += 2 * shard;
      else
        add_p(Mem::Optimizer, 2 * shard);
    }
    {  // NVMe staging buffers (persistent, Optimizer): min(buffer_count, pieces) of the largest
      const std::vector<Piece> pieces = nvme_pieces();
      int64_t largest = 0;
      for (const Piece& pc : pieces) largest = std::max(largest, pc.hi - pc.lo);
      const int64_t bc = std::max(2, in_.policy.offload_optimizer.buffer_count);
      int64_t per = 0;  // floats per element: the most any unit's piece moves
      for (size_t u = 0; u < in_.units.size(); ++u)
        if (streamed(static_cast<int>(u))) per = std::max(per, io_floats(piece_io(int(u), true)));
      plan_.staging_slots = static_cast<int>(std::min<int64_t>(int64_t(pieces.size()), bc));
      plan_.staging_bytes = per * largest * 4;
      (in_.on_device ? plan_.persistent_host : plan_.persistent)[static_cast<size_t>(Mem::Optimizer)] +=
          plan_.staging_slots * plan_.staging_bytes;
    }
    if (plan_.shard_bytes > 0) {  // NVMe parameters: gather and gradient staging
      plan_.param_slots = std::max(2, in_.policy.offload_param.buffer_count);
      plan_.grad_slots = 3;  // one reduction completing, one in flight, one unit in backward
      MemDeltas& tier = in_.on_device ? plan_.persistent_host : plan_.persistent;  // (host memory)
      tier[static_cast<size_t>(Mem::Params)] += plan_.param_slots * plan_.shard_bytes;
      tier[static_cast<size_t>(Mem::Grads)] += plan_.grad_slots * plan_.shard_bytes;
    }
    plan_.scratch = max_scratch;
    // The two ping-pong buffers (backward's dy and dx), and on a device with 16-bit products
    // backward's residual gradient in the compute precision (Impl::grad16, UnitCtx::grad16).
    const bool grad16 = in_.on_device && in_.compute != DType::F32;
    // The step's device-side sums (ShardedModel::Impl::sums, made at the first micro-step or
    // evaluation and kept): a double per loss slot of the micro-steps and of the evaluations
    // (Impl::kLossSlots = 64 each) and per unit for the gradient norm.
    constexpr int64_t kLossSlots = 64;
    const int64_t sums = 8 * (2 * kLossSlots + static_cast<int64_t>(in_.units.size()));
    plan_.reserved[static_cast<size_t>(Mem::Workspace)] =
        max_scratch + 2 * act_bytes() + (grad16 ? act_bytes() / 2 : 0) + sums;
  }

  const PlanInput& in_;
  StepPlan plan_;
  std::vector<St> st_;
  std::vector<int> gather_at_;
  std::vector<bool> has_grads_;
  std::vector<CheckpointMode> recompute_;
  std::vector<int> ready_;
  std::vector<std::pair<int, int64_t>> inflight_;  // reductions: (last action, bytes freed)
  int micro_ = 0;
  // NVMe parameters: the gradient staging buffers' round robin, the Evict that last used
  // each, and the evicts the micro-step's end waits for.
  int next_gslot_ = 0;
  // Activation offload to NVMe: evicts whose completion (freeing) is not observed yet, and
  // the fetch of each position.
  std::vector<std::pair<int, int64_t>> act_evicts_;
  std::map<int, int> act_fetch_at_;
  int64_t act_file_ = 0;  // activation bytes the current micro-step wrote to the file
  // Deferred updates being planned into a micro-step's forward (begin_deferred): the
  // pieces, the next to update, each piece's Fetch and Evict; last_: the step's last
  // micro-step (it issues the carried reads).
  bool last_ = false, dactive_ = false;
  std::vector<Piece> dpieces_;
  int dnext_ = 0;
  std::vector<int> dfetch_at_, devict_at_;
  std::map<int, int> gslot_evict_;
  std::vector<int> grad_evicts_;
};

}  // namespace

std::vector<bool> optimizer_prefetched(const PlanInput& in) {
  PlanInput none = in;
  none.carried.clear();
  Builder b(none);
  b.optimizer();
  return b.in_flight();
}

StepPlan plan_micro_step(const PlanInput& in, int micro, bool reduce, bool last) {
  Builder b(in);
  b.micro_step(micro, reduce, last);
  return b.take();
}

StepPlan plan_optimizer(const PlanInput& in) {
  PlanInput none = in;
  none.carried.clear();
  Builder b(none);
  b.optimizer();
  return with_updater_staging(b.take(), in);
}

bool defers_update(const PlanInput& in) {
  for (size_t u = 0; u < in.units.size(); ++u)
    if (unit_defers(in, static_cast<int>(u))) return true;
  return false;
}

StepPlan plan_flush(const PlanInput& in) {
  PlanInput none = in;
  none.carried.clear();
  Builder b(none);
  b.optimizer(true);
  return b.take();
}

StepPlan plan_eval(const PlanInput& in) {
  Builder b(in);
  b.eval();
  return b.take();
}

StepPlan plan_step(const PlanInput& in) {
  PlanInput steady = in;
  if (steady.carried.empty()) steady.carried = optimizer_prefetched(in);
  steady.pending = defers_update(in);  // the previous step's deferred updates
  Builder b(steady);
  const bool each = in.policy.accum == GradAccumMode::ReduceEachMicroStep;
  for (int k = 0; k < in.accum; ++k) b.micro_step(k, each || k + 1 == in.accum, k + 1 == in.accum);
  b.optimizer();
  return with_updater_staging(b.take(), in);
}

int64_t host_bytes(const StepPlan& plan) {
  int64_t h = plan.host_update_staging;
  for (int64_t b : plan.persistent_host) h += b;
  return h;
}

PlanPeak replay_peak(const StepPlan& plan) {
  PlanPeak r;
  MemDeltas cur = plan.initial;
  auto total_with = [&](const MemDeltas& d, const MemDeltas* extra) {
    int64_t t = 0;
    for (size_t c = 0; c < d.size(); ++c)
      t += d[c] + plan.persistent[c] + plan.reserved[c] + (extra ? (*extra)[c] : 0);
    return t;
  };
  auto note = [&](int i, const MemDeltas* transient) {
    const int64_t t = total_with(cur, transient);
    for (size_t c = 0; c < cur.size(); ++c)
      r.category_peak[c] = std::max(r.category_peak[c], cur[c] + plan.persistent[c] +
                                                            plan.reserved[c] +
                                                            (transient ? (*transient)[c] : 0));
    if (t > r.total || r.action == -1) {
      r.total = t;
      r.action = i;
      for (size_t c = 0; c < cur.size(); ++c)
        r.at_peak[c] = cur[c] + plan.persistent[c] + plan.reserved[c] +
                       (transient ? (*transient)[c] : 0);
    }
  };
  note(-1, nullptr);
  for (size_t i = 0; i < plan.actions.size(); ++i) {
    const Action& a = plan.actions[i];
    for (size_t c = 0; c < cur.size(); ++c) {
      cur[c] += a.mem[c];
      r.negative |= cur[c] < 0;
    }
    note(static_cast<int>(i), &a.transient);
  }
  return r;
}

int StepPlan::peak_gathered_units() const {
  if (kind != UnitKind::Sharded) return 0;
  int live = initial_gathered, peak = initial_gathered;
  for (const Action& a : actions) {
    if (a.kind == ActionKind::Gather) peak = std::max(peak, ++live);
    if (a.kind == ActionKind::Free) --live;
  }
  return peak;
}

namespace {
std::string mib(int64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.2f MiB", static_cast<double>(b) / (1 << 20));
  return buf;
}
}  // namespace

std::string StepPlan::str() const {
  static const char* kinds[] = {"FULL_SHARDED", "FULL_REPLICATED", "WHOLE"};
  std::string s = "step plan: world " + std::to_string(W) + " (shard group " + std::to_string(S) +
                  " x " + std::to_string(R) + " replicas), units " +
                  kinds[static_cast<size_t>(kind)] + ", " + std::to_string(actions.size()) +
                  " actions, at most " + std::to_string(peak_gathered_units()) +
                  " units gathered at once\n";
  if (!activations_known) s += "  (activation sizes not declared by every unit: not counted)\n";
  s += "  persistent:";
  for (size_t c = 0; c < persistent.size(); ++c)
    if (persistent[c]) s += std::string(" ") + mem_name(static_cast<Mem>(c)) + " " + mib(persistent[c]).substr(1);
  bool host = false;
  for (int64_t b : persistent_host) host |= b != 0;
  if (host) {
    s += "; on the host tier:";
    for (size_t c = 0; c < persistent_host.size(); ++c)
      if (persistent_host[c])
        s += std::string(" ") + mem_name(static_cast<Mem>(c)) + " " + mib(persistent_host[c]).substr(1);
  }
  if (host_update_staging) s += "; host updater staging " + mib(host_update_staging).substr(1);
  s += "; reserved:";
  for (size_t c = 0; c < reserved.size(); ++c)
    if (reserved[c]) s += std::string(" ") + mem_name(static_cast<Mem>(c)) + " " + mib(reserved[c]).substr(1);
  s += "\n";
  static const char* seg[] = {"micro-step", "optimizer", "eval"};
  size_t next_seg = 0;
  for (size_t i = 0; i < actions.size(); ++i) {
    while (next_seg < segments.size() && segments[next_seg].begin == static_cast<int>(i)) {
      const Segment& g = segments[next_seg++];
      s += std::string("-- ") + seg[static_cast<size_t>(g.kind)];
      if (g.kind == SegmentKind::MicroStep) {  // (appended piece by piece: GCC 12's -Wrestrict
        s += ' ';                               // misfires on " " + std::to_string here)
        s += std::to_string(g.micro);
        s += g.reduce ? " (reduces gradients)" : " (accumulates locally)";
      }
      s += "\n";
    }
    const Action& a = actions[i];
    char head[64];
    std::snprintf(head, sizeof head, "%5zu %-8s %-16s", i, queue_name(a.queue), action_kind_name(a.kind));
    s += head;
    if (a.unit >= 0) s += " " + unit_names[size_t(a.unit)];
    if (a.bucket >= 0) s += " bucket " + std::to_string(a.bucket);
    if (a.pos >= 0) s += " pos " + std::to_string(a.pos) + " call " + std::to_string(a.call);
    if (a.mode != CheckpointMode::Off)
      s += a.mode == CheckpointMode::Full ? " (full)" : " (selective)";
    if (a.io) {
      std::string parts;
      if (a.io & kIoMoments) parts += "moments";
      if (a.io & kIoMaster) parts += std::string(parts.empty() ? "" : "+") + "master";
      if (a.io & kIoGrads) parts += std::string(parts.empty() ? "" : "+") + "grads";
      s += " [" + parts + (a.slot >= 0 ? " slot " + std::to_string(a.slot) : "") +
           (a.adopt ? ", adopted" : a.carry ? ", carried" : "") + "]";
    }
    if (a.bytes) s += " moves " + mib(a.bytes).substr(1);
    for (size_t c = 0; c < a.mem.size(); ++c)
      if (a.mem[c]) s += std::string(" ") + mem_name(static_cast<Mem>(c)) + " " + mib(a.mem[c]);
    if (!a.waits.empty()) {
      s += " waits";
      for (int w : a.waits) {
        s += ' ';
        s += std::to_string(w);
      }
    }
    s += "\n";
  }
  return s;
}

}  // namespace sw
