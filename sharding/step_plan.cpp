// The step plan (step_plan.h): names, what plans are built from (make_plan_input,
// declare_calls), the entry points that build them (plan construction itself is
// sharding/plan_builder.h's), the replay of a plan's memory and its listing.
#include "sharding/step_plan.h"

#include <algorithm>
#include <cstdio>

#include "core/clock.h"
#include "core/error.h"
#include "sharding/flat_param.h"
#include "sharding/plan_builder.h"

namespace sw {

const char* queue_name(Queue q) {
  static const char* n[] = {"compute", "gather", "reduce", "io", "host", "tensor", "p2p", "cross"};
  return q < Queue::Count ? n[static_cast<size_t>(q)] : "?";
}

const char* action_kind_name(ActionKind k) {
  static const char* n[] = {"gather",      "wait_gather", "forward",     "drop_saved",
                            "recompute",   "backward",    "free",        "reduce_scatter",
                            "all_reduce",  "round_grads", "wait_reduce", "optimizer_update",
                            "regather",    "fetch_state", "evict_state", "wait_state",
                            "fetch_acts",  "evict_acts",  "wait_acts", "tp_gather_rows",
                            "tp_scatter_rows", "tp_all_gather", "tp_reduce_grads",
                            "recv_acts",   "send_acts",   "recv_grads",  "send_grads",
                            "wait_p2p",    "backward_weight", "sync_shared", "outer_reduce",
                            "outer_update"};
  return k < ActionKind::Count ? n[static_cast<size_t>(k)] : "?";
}

ActionKind tensor_action_kind(TensorOp op) {
  switch (op) {
    case TensorOp::GatherRows: return ActionKind::TpGatherRows;
    case TensorOp::ScatterRows: return ActionKind::TpScatterRows;
    case TensorOp::AllGather: return ActionKind::TpAllGather;
  }
  return ActionKind::TpAllGather;
}

double trace_clock() { return trace_now(); }

bool releases_grads(const PlanInput& in, int u) {
  const PlanUnit& pu = in.units[static_cast<size_t>(u)];
  if (!in.policy.release_grads || pu.optimizer_offloaded || pu.params_offloaded ||
      pu.params_nvme)
    return false;
  return in.kind == UnitKind::Sharded || (in.kind == UnitKind::Whole && pu.bucket < 0);
}

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
  for (size_t p = 0; p < model.schedule.size(); ++p) {
    in.takes_input.push_back(model.takes_input(p));
    in.is_loss.push_back(model.is_loss(p));
  }
  if (model.stage.split()) {
    const StageView& st = model.stage;
    in.pipe.size = st.size, in.pipe.rank = st.rank, in.pipe.chunks = st.chunks;
    in.pipe.chunk_begin = st.chunk_begin;
    for (int c = 0; c < st.chunks; ++c) in.pipe.first_stage_of_chunk.push_back(st.stage_of_chunk(c) == 0);
    in.pipe.shared = st.shared;
  }
  in.d_model = model.residual_width();
  in.tensor = model.tensor.size;
  const size_t U = model.units.size();
  in.units.resize(U);
  for (size_t u = 0; u < U; ++u) {
    PlanUnit& pu = in.units[u];
    pu.name = model.units[u]->name();
    const FlatLayout L = FlatLayout::build(model.units[u]->params(), in.S);
    pu.padded = L.padded;
    pu.lp_only = L.lp_only();
    for (const ParamSpec& ps : L.specs) pu.linear += ps.linear ? numel(ps.shape) : 0;
    for (const auto& r : L.replicated_runs()) pu.tp_replicated += r.second - r.first;
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
      Scratch::bytes_for(static_cast<size_t>(in.B) * in.T * model.residual_width()));
  for (size_t p = 0; p < in.schedule.size(); ++p) {
    const Call& c = in.schedule[p];
    const ActivationDecl d = model.units[size_t(c.unit)]->declare_activations(c.call, shape);
    CallMemory& m = in.calls[p];
    for (int k = 0; k < 5; ++k)
      m.tensor[size_t(k)] = model.units[size_t(c.unit)]->declare_tensor_comm(
          c.call, static_cast<Unit::Pass>(k), shape);
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

std::vector<bool> optimizer_prefetched(const PlanInput& in) {
  PlanInput none = in;
  none.carried.clear();
  PlanBuilder b(none);
  b.optimizer();
  return b.in_flight();
}

StepPlan plan_micro_step(const PlanInput& in, int micro, bool reduce, bool last) {
  PlanBuilder b(in);
  b.micro_step(micro, reduce, last);
  return b.take();
}

StepPlan plan_optimizer(const PlanInput& in) {
  PlanInput none = in;
  none.carried.clear();
  PlanBuilder b(none);
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
  PlanBuilder b(none);
  b.optimizer(true);
  return b.take();
}

StepPlan plan_eval(const PlanInput& in) {
  PlanBuilder b(in);
  if (in.pipelined())
    b.pipeline(false);
  else
    b.eval();
  return b.take();
}

StepPlan plan_pipeline(const PlanInput& in) {
  PlanBuilder b(in);
  b.pipeline(true);
  return b.take();
}

StepPlan plan_outer(const PlanInput& in, const std::vector<bool>& units, double outer_bytes,
                    OuterPhase phase) {
  PlanBuilder b(in);  // (in.carried: gathers in flight, stale once their unit is updated)
  b.outer(units, outer_bytes, phase);
  return b.take();
}

StepPlan plan_pipeline_step(const PlanInput& in) {
  PlanInput steady = in;
  if (steady.carried.empty()) steady.carried = optimizer_prefetched(in);
  PlanBuilder b(steady);
  b.pipeline(true);
  b.optimizer();
  return with_updater_staging(b.take(), in);
}

StepPlan plan_step(const PlanInput& in) {
  if (in.pipelined()) return plan_pipeline_step(in);
  PlanInput steady = in;
  if (steady.carried.empty()) steady.carried = optimizer_prefetched(in);
  steady.pending = defers_update(in);  // the previous step's deferred updates
  PlanBuilder b(steady);
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
                  " x " + std::to_string(R) + " replicas" +
                  (tensor > 1 ? "; tensor " + std::to_string(tensor) + " per data rank" : "") +
                  "), units " +
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
  static const char* seg[] = {"micro-step", "optimizer", "eval", "pipeline"};
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
    if (a.inside >= 0) s += " in " + std::to_string(a.inside);
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
