// The step plan (sharding/step_plan.h) as data, without running a model: per strategy, the
// sequence of gathers and frees against a hand-written expectation; max_live_units; waits
// point backwards at the right actions; every category's bytes return to zero over a step;
// and, at one rank, the executor's record of a real step is exactly the plan's action list.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "core/alloc.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "sharding/sharded_model.h"
#include "sharding/step_plan.h"
#include "sharding/wrap.h"
#include "tests/common/mpi_test_util.h"
#include "tests/common/plan_util.h"

using namespace sw;

namespace {

ModelConfig tiny(const std::string& type, int layers) { return swtest::tiny_config(type, layers); }

PlanInput input(const Model& m, ShardingPolicy p, int world, int accum = 1, int B = 2) {
  PlanInput in = make_plan_input(m, p, world);
  in.B = B, in.T = m.config.seq_len, in.accum = accum;
  declare_calls(in, m);
  return in;
}

// "G name", "F name" (free), "W name" (wait) of the gathers / frees / waits, in plan order.
std::vector<std::string> gathers_and_frees(const StepPlan& p, bool waits = false) {
  std::vector<std::string> out;
  for (const Action& a : p.actions) {
    const std::string u = a.unit >= 0 ? p.unit_names[size_t(a.unit)] : "";
    if (a.kind == ActionKind::Gather) out.push_back("G " + u);
    if (a.kind == ActionKind::Free) out.push_back("F " + u);
    if (waits && a.kind == ActionKind::WaitGather) out.push_back("W " + u);
  }
  return out;
}

// Structural invariants every plan must satisfy.
void check_invariants(const StepPlan& p) {
  for (size_t i = 0; i < p.actions.size(); ++i) {
    const Action& a = p.actions[i];
    for (int w : a.waits) {
      INFO("action " << i << " " << action_kind_name(a.kind) << " waits for " << w);
      CHECK(w >= 0);
      CHECK(w < static_cast<int>(i));
      const Action& b = p.actions[size_t(w)];
      if (a.kind == ActionKind::WaitGather) {
        CHECK((b.kind == ActionKind::Gather || b.kind == ActionKind::Regather));
        CHECK(b.unit == a.unit);
      }
      if (a.kind == ActionKind::WaitReduce)
        CHECK((b.kind == ActionKind::ReduceScatter || b.kind == ActionKind::AllReduce));
    }
    // Queues: collectives of parameters on the gather queue, of gradients on the reduce queue.
    if (a.kind == ActionKind::Gather || a.kind == ActionKind::Regather) CHECK(a.queue == Queue::Gather);
    if (a.kind == ActionKind::ReduceScatter || a.kind == ActionKind::AllReduce)
      CHECK(a.queue == Queue::Reduce);
  }
}

// Replays the plan's memory deltas: no category below zero, and (for a whole steady-state
// step) back to what it started with. Returns the peak per category.
MemDeltas replay(const StepPlan& p, bool expect_zero_end) {
  const swtest::Replay r = swtest::replay(p);
  CHECK(!r.negative);
  // The library's replay (`shardwise plan`): each category's own peak is the test replay's on
  // top of what is persistent and reserved; the total peak is the sum of the categories at
  // that moment, at least every category's own peak there and at most the sum of own peaks.
  const PlanPeak pk = replay_peak(p);
  CHECK(!pk.negative);
  int64_t sum = 0, own = 0;
  for (size_t c = 0; c < r.peak.size(); ++c) {
    CHECK(pk.category_peak[c] == r.peak[c] + p.persistent[c] + p.reserved[c]);
    CHECK(pk.at_peak[c] <= pk.category_peak[c]);
    sum += pk.at_peak[c];
    own += pk.category_peak[c];
  }
  CHECK(sum == pk.total);
  CHECK(pk.total <= own);
  if (expect_zero_end)
    for (size_t c = 0; c < r.end.size(); ++c) {
      INFO("category " << mem_name(static_cast<Mem>(c)) << " ends at " << r.end[c]);
      CHECK(r.end[c] == p.initial[c]);
    }
  return r.peak;
}

}  // namespace

TEST_CASE("FULL_SHARD plan: gathers and frees of a tiny GPT-2, by hand", "[plan]") {
  Model m = build_model(tiny("gpt2", 2));  // units: embed_head, h.0, h.1
  ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
  const StepPlan p = plan_step(input(m, pol, 2));
  check_invariants(p);
  // Forward: the tied unit was prefetched by the previous optimizer step; h.0 is prefetched
  // while embed computes, h.1 while h.0 computes; blocks are freed after forward; the tied unit
  // stays. Backward: h.1 is gathered while the head's loss call runs backward, h.0 while h.1
  // runs; each freed after its backward. The optimizer prefetches the tied unit again.
  const std::vector<std::string> expect = {"G h.0",  "G h.1", "F h.0", "F h.1", "G h.1",
                                           "G h.0",  "F h.1", "F h.0", "F embed_head",
                                           "G embed_head"};
  CHECK(gathers_and_frees(p) == expect);
  // Each unit's gradients are reduce-scattered once, after its last backward call.
  int rs = 0;
  for (const Action& a : p.actions) rs += a.kind == ActionKind::ReduceScatter;
  CHECK(rs == 3);
  replay(p, true);
}

TEST_CASE("fp8.all_gather plans a Linear weight's value at one byte", "[plan]") {
  Model m = build_model(tiny("gpt2", 2));
  ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
  pol.mixed_precision.param_dtype = pol.mixed_precision.reduce_dtype = DType::BF16;
  pol.mixed_precision.fp8 = true;
  const StepPlan bf16 = plan_step(input(m, pol, 2));
  pol.mixed_precision.fp8_all_gather = true;
  const StepPlan fp8 = plan_step(input(m, pol, 2));
  REQUIRE(bf16.actions.size() == fp8.actions.size());  // the same plan, fewer bytes
  int blocks = 0;
  for (size_t i = 0; i < fp8.actions.size(); ++i) {
    const Action& a = fp8.actions[i];
    CHECK(a.kind == bf16.actions[i].kind);
    if (a.kind != ActionKind::Gather) {
      CHECK(a.bytes == bf16.actions[i].bytes);
      continue;
    }
    int64_t linear = 0;
    for (const ParamSpec& ps : m.units[size_t(a.unit)]->params())
      linear += ps.linear ? numel(ps.shape) : 0;
    CHECK(a.bytes == bf16.actions[i].bytes - linear);
    blocks += linear > 0;
  }
  CHECK(blocks >= 4);  // h.0 and h.1, gathered for forward and for backward
}

TEST_CASE("SHARD_GRAD_OP plan keeps forward's parameters until backward", "[plan]") {
  Model m = build_model(tiny("llama", 2));  // embed, h.0, h.1, head
  ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::ShardGradOp);
  const StepPlan p = plan_step(input(m, pol, 4));
  check_invariants(p);
  const std::vector<std::string> expect = {
      "G layers.0", "G layers.1", "G head",                 // forward prefetches, nothing freed
      "F head", "F layers.1", "F layers.0", "F embed",      // each after its backward
      "G embed"};                                   // the optimizer's prefetch
  CHECK(gathers_and_frees(p) == expect);
  replay(p, true);
}

TEST_CASE("max_live_units caps prefetching: prefetch depth bounds the rest", "[plan]") {
  for (const std::string type : {"gpt2", "llama"}) {
    Model m = build_model(tiny(type, 4));
    for (int cap : {0, 1, 2, 3})
      for (int depth : {1, 2, 4}) {
        ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
        pol.forward_prefetch = pol.backward_prefetch = depth;
        pol.max_live_units = cap;
        const StepPlan p = plan_step(input(m, pol, 2));
        check_invariants(p);
        replay(p, true);
        INFO(type << " cap " << cap << " depth " << depth);
        // A unit needed now is gathered even above the cap; GPT-2's tied unit stays gathered.
        const int needed = type == "gpt2" ? 2 : 1;
        const int bound = cap == 0 ? depth + needed : std::max(cap, needed);
        CHECK(p.peak_gathered_units() <= bound);
        if (cap == 0 && depth == 4) CHECK(p.peak_gathered_units() == 5);
      }
  }
}

TEST_CASE("Accumulation modes: reduce each micro-step, or once", "[plan]") {
  Model m = build_model(tiny("gpt2", 2));
  for (GradAccumMode mode : {GradAccumMode::ReduceEachMicroStep, GradAccumMode::ReduceOnce}) {
    ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
    pol.accum = mode;
    const StepPlan p = plan_step(input(m, pol, 2, /*accum=*/3));
    check_invariants(p);
    replay(p, true);
    REQUIRE(p.segments.size() == 4);  // 3 micro-steps + the optimizer
    for (int k = 0; k < 3; ++k) {
      const Segment& s = p.segments[size_t(k)];
      int rs = 0;
      for (int i = s.begin; i < s.end; ++i) rs += p.actions[size_t(i)].kind == ActionKind::ReduceScatter;
      const bool reduces = mode == GradAccumMode::ReduceEachMicroStep || k == 2;
      CHECK(s.reduce == reduces);
      CHECK(rs == (reduces ? 3 : 0));
    }
  }
}

TEST_CASE("NO_SHARD buckets and HYBRID's two-level reduction", "[plan]") {
  Model m = build_model(tiny("llama", 4));
  {
    ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::NoShard);
    pol.bucket_bytes = 40000;  // a few units per bucket
    const PlanInput in = input(m, pol, 3);
    REQUIRE(in.buckets.size() > 1);
    const StepPlan p = plan_step(in);
    check_invariants(p);
    replay(p, true);
    int ar = 0;
    for (size_t i = 0; i < p.actions.size(); ++i) {
      const Action& a = p.actions[i];
      if (a.kind == ActionKind::Gather) FAIL("NO_SHARD gathers nothing");
      if (a.kind != ActionKind::AllReduce) continue;
      ++ar;
      // Issued right after the backward of the bucket's last member.
      const PlanBucket& b = in.buckets[size_t(a.bucket)];
      const Action* prev = &p.actions[i - 1];
      CHECK(prev->unit == b.members.back());
      CHECK(a.bytes == (b.hi - b.lo) * 4);
    }
    CHECK(ar == static_cast<int>(in.buckets.size()));
  }
  {
    ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::HybridShard);
    pol.shard_group_size = 2;
    const StepPlan p = plan_step(input(m, pol, 4));
    CHECK(p.S == 2);
    CHECK(p.R == 2);
    check_invariants(p);
    replay(p, true);
    for (size_t i = 0; i < p.actions.size(); ++i) {
      const Action& a = p.actions[i];
      if (a.kind != ActionKind::AllReduce) continue;
      REQUIRE(a.waits.size() == 1);
      const Action& rs = p.actions[size_t(a.waits[0])];
      CHECK(rs.kind == ActionKind::ReduceScatter);
      CHECK(rs.unit == a.unit);
      CHECK(a.bytes * 2 == rs.bytes);  // the reduced block is 1/S of the buffer
    }
  }
}

TEST_CASE("Stage 1 regathers after the update: the next step waits for it", "[plan]") {
  Model m = build_model(tiny("gpt2", 2));
  const StepPlan p = plan_step(input(m, ShardingPolicy::for_strategy(ShardingStrategy::ShardOptimizer), 2));
  check_invariants(p);
  replay(p, true);
  CHECK(gathers_and_frees(p).empty());
  std::vector<std::string> regathers, waits;
  for (const Action& a : p.actions) {
    if (a.kind == ActionKind::Regather) regathers.push_back(p.unit_names[size_t(a.unit)]);
    if (a.kind == ActionKind::WaitGather) waits.push_back(p.unit_names[size_t(a.unit)]);
  }
  CHECK(regathers == std::vector<std::string>{"embed_head", "h.0", "h.1"});
  CHECK(waits == std::vector<std::string>{"embed_head", "h.0", "h.1"});  // in forward order
}

TEST_CASE("Activation checkpointing: drops after forward, recomputes before backward", "[plan]") {
  for (CheckpointMode mode : {CheckpointMode::Full, CheckpointMode::Selective}) {
    Model m = build_model(tiny("gpt2", 2));
    ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
    pol.activation_checkpointing.mode = mode;
    const StepPlan p = plan_step(input(m, pol, 2));
    check_invariants(p);
    const MemDeltas peak = replay(p, true);
    ShardingPolicy off = pol;
    off.activation_checkpointing.mode = CheckpointMode::Off;
    const MemDeltas peak_off = replay(plan_step(input(m, off, 2)), true);
    const size_t A = static_cast<size_t>(Mem::Activations);
    CHECK(peak[A] < peak_off[A]);
    // Each block is dropped once and recomputed once, right before its backward.
    std::map<int, int> drops;
    for (size_t i = 0; i < p.actions.size(); ++i) {
      const Action& a = p.actions[i];
      if (a.kind == ActionKind::DropSaved) {
        CHECK(a.mode == mode);
        ++drops[a.pos];
      }
      if (a.kind == ActionKind::Recompute) {
        CHECK(drops[a.pos] == 1);
        CHECK(p.actions[i + 1].kind == ActionKind::Backward);
        CHECK(p.actions[i + 1].pos == a.pos);
        CHECK(a.mem[A] == -[&] {  // what it rebuilds is what was dropped
          for (const Action& d : p.actions)
            if (d.kind == ActionKind::DropSaved && d.pos == a.pos) return d.mem[A];
          return int64_t{0};
        }());
      }
    }
    CHECK(drops.size() == 2);  // the two blocks; the embedding saves nothing, the loss is exempt
  }
}

TEST_CASE("Activation offload with accumulation: every micro-step fetches what it evicts", "[plan]") {
  // A whole step's plan (what `shardwise plan` replays) of several micro-steps: each one evicts
  // and fetches back the same calls, and the replay never goes below zero. (Until the plan
  // builder was split, the later micro-steps waited for the first one's fetches instead.)
  for (const char* tier : {"cpu", "nvme"})
    for (int world : {1, 2}) {
      Model m = build_model(tiny("gpt2", 4));
      ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
      pol.activation_checkpointing.offload_cpu = std::string(tier) == "cpu";
      pol.activation_checkpointing.offload_nvme = !pol.activation_checkpointing.offload_cpu;
      pol.activation_checkpointing.nvme_path = "/nonexistent";  // (a plan makes no files)
      const StepPlan plan = plan_step(input(m, pol, world, 3));
      INFO(tier << " offload, world " << world);
      check_invariants(plan);
      replay(plan, true);
      int micro_steps = 0;
      for (const Segment& sg : plan.segments) {
        if (sg.kind != SegmentKind::MicroStep) continue;
        ++micro_steps;
        std::vector<int> evicted, fetched;
        for (int i = sg.begin; i < sg.end; ++i) {
          const Action& a = plan.actions[size_t(i)];
          if (a.kind == ActionKind::EvictActs) evicted.push_back(a.pos);
          if (a.kind == ActionKind::FetchActs) fetched.push_back(a.pos);
          if (a.kind == ActionKind::WaitActs)
            for (int w : a.waits) CHECK((w >= sg.begin && w < i));  // its own micro-step's
        }
        std::sort(fetched.begin(), fetched.end());
        CHECK(evicted.size() == m.schedule.size() - 3);
        CHECK(fetched == evicted);
      }
      CHECK(micro_steps == 3);
    }
}

TEST_CASE("The executor runs exactly the plan (one rank, a recorder attached)", "[plan]") {
  for (CheckpointMode mode : {CheckpointMode::Off, CheckpointMode::Full, CheckpointMode::Selective})
    for (int bpu : {1, 2})
    for (bool offload : {false, true}) {
      Model m = build_model(tiny("llama", 4));
      wrap_blocks(m, bpu);
      ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
      pol.activation_checkpointing.mode = mode;
      pol.activation_checkpointing.offload_cpu = offload;
      ShardedModel sm(m, ops_for(Device::cpu()), 7, make_local_group(), pol);
      const int B = 2, T = 16;
      std::vector<int32_t> tok(static_cast<size_t>(B) * T, 5);
      const Batch batch{tok.data(), tok.data(), B, T};
      sm.forward_backward(batch);  // warm-up: buffers grow once
      const StepPlan plan = sm.step_plan(B, T, 1);
      StepRecorder rec;
      sm.set_recorder(&rec);
      MemTracker::global().reset_peaks();
      const size_t a0 = MemTracker::global().current(Mem::Activations);
      sm.forward_backward(batch);
      sm.optimizer_step(AdamWParams{}, 1e-3f, 1.f, 1);
      sm.set_recorder(nullptr);
      INFO("checkpointing " << checkpoint_mode_name(mode) << ", blocks_per_unit " << bpu
                            << (offload ? ", activations offloaded" : ""));
      int evicts = 0;
      for (const Action& a : plan.actions) evicts += a.kind == ActionKind::EvictActs && a.pos >= 0;
      CHECK(evicts == (offload ? static_cast<int>(m.schedule.size()) - 3 : 0));
      // Same actions in the same order (records are numbered within the segment that ran them:
      // the micro-step, then the optimizer).
      CHECK(swtest::executed_actions(rec) == swtest::planned_actions(plan));
      for (const ActionRecord& r : rec.records) CHECK(r.t_end >= r.t_begin);
      // The plan's activation peak is the measured one.
      const size_t Ai = static_cast<size_t>(Mem::Activations);
      const MemDeltas peak = replay(plan, true);
      CHECK(static_cast<int64_t>(MemTracker::global().peak(Mem::Activations) - a0) == peak[Ai]);
    }
}

TEST_CASE("recorder: the compute actions' device times replace their host times", "[plan]") {
  // On a GPU each recorded compute-queue action is bracketed by timed events on the compute
  // stream and settle_recorder() writes the device's interval into its record. On the CPU the
  // path runs with SHARDWISE_PROFILE_DEVICE_TIMES=1 over the host stream's stamped events,
  // taken just before and just after the action's own host times: so each settled interval
  // holds the host's (to the clock tie's slack), the other queues' records are untouched, and
  // without the variable nothing changes.
  for (const bool forced : {false, true}) {
    if (forced)
      setenv("SHARDWISE_PROFILE_DEVICE_TIMES", "1", 1);
    else
      unsetenv("SHARDWISE_PROFILE_DEVICE_TIMES");
    Model m = build_model(tiny("gpt2", 2));
    ShardedModel sm(m, ops_for(Device::cpu()), 7, make_local_group(),
                    ShardingPolicy::for_strategy(ShardingStrategy::FullShard));
    const int B = 2, T = 16;
    std::vector<int32_t> tok(static_cast<size_t>(B) * T, 5);
    const Batch batch{tok.data(), tok.data(), B, T};
    sm.forward_backward(batch);
    StepRecorder rec;
    sm.set_recorder(&rec);
    sm.forward_backward(batch);
    sm.optimizer_step(AdamWParams{}, 1e-3f, 1.f, 1);
    const std::vector<ActionRecord> host = rec.records;
    sm.settle_recorder();
    REQUIRE(rec.records.size() == host.size());
    int compute = 0, moved = 0;
    for (size_t i = 0; i < host.size(); ++i) {
      const ActionRecord &h = host[i], &d = rec.records[i];
      INFO("record " << i << " (" << action_kind_name(h.kind) << "), forced " << forced);
      if (h.queue != Queue::Compute || !forced) {
        CHECK(d.t_begin == h.t_begin);
        CHECK(d.t_end == h.t_end);
        continue;
      }
      ++compute;
      moved += d.t_begin != h.t_begin || d.t_end != h.t_end;
      CHECK(d.t_begin <= h.t_begin + 1e-3);
      CHECK(d.t_end >= h.t_end);
      CHECK(d.t_end - d.t_begin < h.t_end - h.t_begin + 1e-2);
    }
    if (forced) {
      CHECK(compute > 10);
      CHECK(moved == compute);
    }
    // Records taken (cleared) before the settle: the spans no longer match and are skipped.
    sm.forward_backward(batch);
    rec.records.clear();
    sm.settle_recorder();
    CHECK(rec.records.empty());
    sm.set_recorder(nullptr);
  }
  unsetenv("SHARDWISE_PROFILE_DEVICE_TIMES");
}

TEST_CASE("plan str() lists every action with its queue", "[plan]") {
  Model m = build_model(tiny("gpt2", 2));
  const StepPlan p = plan_step(input(m, ShardingPolicy::for_strategy(ShardingStrategy::FullShard), 2));
  const std::string s = p.str();
  CHECK(s.find("reduce   reduce_scatter   h.1") != std::string::npos);
  CHECK(s.find("gather   gather           h.0") != std::string::npos);
  CHECK(s.find("-- optimizer") != std::string::npos);
  size_t lines = 0;
  for (char c : s) lines += c == '\n';
  CHECK(lines >= p.actions.size());
}

// Tensor parallelism: each call's declared collectives follow its compute action on the tensor
// queue (forward: a block's 2 gathers and 2 scatters, the embedding's scatter, the loss's gather,
// statistics and scatter; backward: 4 gathers and 2 scatters; a selective recompute none, a full
// one the forward's), and each unit's replicated gradients are summed over the tensor group
// right before its data-parallel reduction (whole units: in the last micro-step only).
TEST_CASE("Tensor parallel plan: in-call collectives and replicated gradients, by hand", "[plan]") {
  ModelConfig mc = tiny("gpt2", 2);
  mc.n_head = 4;
  const int t = 2, B = 2, T = mc.seq_len, C = mc.d_model;
  const int64_t NC4 = int64_t{B} * T * C * 4;
  for (const int world : {1, 2}) {
    for (CheckpointMode ck : {CheckpointMode::Off, CheckpointMode::Selective, CheckpointMode::Full}) {
      const Model m = build_model(mc, TensorSlice{1, t});
      ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
      pol.activation_checkpointing.mode = ck;
      PlanInput in = make_plan_input(m, pol, world);
      in.B = B, in.T = T, in.accum = 2;
      declare_calls(in, m);
      CHECK(in.tensor == t);
      CHECK(in.d_model == C / t);  // the residual stream: this rank's rows
      const StepPlan plan = plan_step(in);
      INFO("world " << world << " checkpointing " << checkpoint_mode_name(ck));
      const int P = static_cast<int>(in.schedule.size());
      std::map<std::string, int> reduce_grads;  // per micro-step and unit
      for (size_t i = 0; i < plan.actions.size(); ++i) {
        const Action& a = plan.actions[i];
        if (a.queue == Queue::Tensor) CHECK(a.kind >= ActionKind::TpGatherRows);
        if (a.kind == ActionKind::TpReduceGrads) {
          reduce_grads[std::to_string(a.micro) + "/" + std::to_string(a.unit)]++;
          CHECK(a.bytes > 0);
          // its reduction follows (sharded units)
          if (world > 1) {
            bool found = false;
            for (size_t j = i + 1; j < plan.actions.size() && !found; ++j)
              found = plan.actions[j].kind == ActionKind::ReduceScatter &&
                      plan.actions[j].unit == a.unit;
            CHECK(found);
          }
        }
        const bool compute_call = a.kind == ActionKind::Forward || a.kind == ActionKind::Backward ||
                                  a.kind == ActionKind::Recompute;
        if (!compute_call) continue;
        std::vector<ActionKind> got;
        for (size_t j = i + 1; j < plan.actions.size() && plan.actions[j].inside == int(i); ++j) {
          got.push_back(plan.actions[j].kind);
          CHECK(plan.actions[j].queue == Queue::Tensor);
          CHECK(plan.actions[j].waits == std::vector<int>{int(i)});
          if (plan.actions[j].kind != ActionKind::TpAllGather) CHECK(plan.actions[j].bytes == NC4);
        }
        using K = ActionKind;
        const K G = K::TpGatherRows, S = K::TpScatterRows, A = K::TpAllGather;
        const bool block = a.pos > 0 && a.pos + 1 < P;
        std::vector<K> want;
        const bool fwd = a.kind == K::Forward || (a.kind == K::Recompute && a.mode == CheckpointMode::Full);
        if (block) want = fwd ? std::vector<K>{G, S, G, S}
                          : a.kind == K::Backward ? std::vector<K>{G, G, S, G, G, S}
                                                  : std::vector<K>{};
        else if (a.pos == 0) want = a.kind == K::Forward ? std::vector<K>{S} : std::vector<K>{G};
        else want = a.kind == K::Forward ? std::vector<K>{G, A, S} : std::vector<K>{};
        INFO(action_kind_name(a.kind) << " pos " << a.pos);
        CHECK(got == want);
      }
      // Sharded units: every micro-step reduces (reduce_each_micro_step); whole units: once.
      for (int u = 0; u < static_cast<int>(in.units.size()); ++u)
        for (int k = 0; k < 2; ++k)
          CHECK(reduce_grads[std::to_string(k) + "/" + std::to_string(u)] ==
                (world > 1 || k == 1 ? 1 : 0));
      CHECK_FALSE(replay_peak(plan).negative);
    }
  }
}

TEST_CASE("release_grads: the gradients live from the backward to the update, as planned", "[plan]") {
  // One rank (Whole units), two micro-steps: the plan holds no gradients between steps, makes
  // each unit's at its first backward (the fused head's at its loss forward) and frees them at
  // its update; the executor's tracked Mem::Grads follows it, and the weights are those of
  // persistent gradients bit for bit.
  for (DType dt : {DType::F32, DType::BF16}) {
    std::vector<std::vector<float>> weights;
    for (bool release : {false, true}) {
      Model m = build_model(tiny("llama", 3));
      ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
      pol.release_grads = release;
      pol.mixed_precision.param_dtype = pol.mixed_precision.reduce_dtype = dt;
      const size_t g0 = MemTracker::global().current(Mem::Grads);  // (before the model's)
      ShardedModel sm(m, ops_for(Device::cpu()), 7, make_local_group(), pol);
      const int B = 2, T = 16;
      std::vector<int32_t> tok(static_cast<size_t>(B) * T);
      for (size_t i = 0; i < tok.size(); ++i) tok[i] = static_cast<int32_t>((i * 7 + 3) % 50);
      const Batch batch{tok.data(), tok.data() + 1, B, T - 1};
      const StepPlan plan = sm.step_plan(B, T - 1, 2);
      INFO((release ? "released" : "persistent") << " gradients, " << dtype_name(dt));
      const size_t Gi = static_cast<size_t>(Mem::Grads);
      const MemDeltas peak = replay(plan, true);
      for (int step = 1; step <= 3; ++step) {
        MemTracker::global().reset_peaks();
        sm.micro_step(batch, 0.5f, false);
        sm.micro_step(batch, 0.5f, true);
        sm.optimizer_step(AdamWParams{}, 1e-2f, 1.f, step);
        const auto held = [&] {
          return static_cast<int64_t>(MemTracker::global().current(Mem::Grads) - g0);
        };
        // The update itself freed them (where the plan frees them), and the norm read between
        // the update and the next backward neither makes them again nor sees anything.
        CHECK(held() == (release ? 0 : plan.persistent[Gi]));
        if (release) {
          CHECK(sm.grad_norm() == 0.0);
          CHECK(held() == 0);
        }
        sm.zero_grads();
        // Between steps: none held (released), or all (persistent: the plan's persistent).
        CHECK(held() == (release ? 0 : plan.persistent[Gi]));
        CHECK((plan.persistent[Gi] == 0 || !release));
        // The step's tracked peak is the plan's.
        CHECK(static_cast<int64_t>(MemTracker::global().peak(Mem::Grads) - g0) ==
              peak[Gi] + plan.persistent[Gi]);
      }
      if (release) {
        int64_t made = 0, freed = 0;
        for (const Action& a : plan.actions) {
          if (a.mem[Gi] > 0) {
            made += a.mem[Gi];
            CHECK((a.kind == ActionKind::Backward || a.kind == ActionKind::Forward));
          }
          if (a.mem[Gi] < 0) {
            freed -= a.mem[Gi];
            CHECK(a.kind == ActionKind::OptimizerUpdate);
          }
        }
        CHECK(made > 0);
        CHECK(made == freed);
      }
      std::vector<float> w;
      sm.for_each_param([&](const ParamSpec& ps, const float* d) {
        w.insert(w.end(), d, d + numel(ps.shape));
      });
      weights.push_back(std::move(w));
    }
    CHECK(weights[0] == weights[1]);
  }
}
