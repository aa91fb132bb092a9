// Pipeline parallelism composed with FSDP (and tensor parallelism), run by ctest through
// `mpirun -np N` (label mpi). Every rank runs every TEST_CASE in the same order with CHECK only.
//
// Parity: W ranks as P pipeline ranks x D data-parallel x t tensor (pipeline outermost: ranks
// [s D t, (s + 1) D t) hold stage s; inside, tensor innermost) train a small GPT-2 / Llama for
// 8 steps of M micro-batches; every rank also trains the whole model alone on the same rows
// (micro-batch D*B, M accumulation steps). Losses, gradient norms and every parameter a stage
// holds (GPT-2's tied embedding on the first and the last stage both) must agree within fp32
// summation-order noise, for every schedule (GPipe, 1F1B, Interleaved1F1B with 2 stages per
// rank, InterleavedZeroBubble), with checkpointing and bf16.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "core/alloc.h"
#include "core/env.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "sharding/comm/group.h"
#include "sharding/pipeline_schedule.h"
#include "sharding/sharded_model.h"
#include "sharding/wrap.h"
#include "tests/common/mpi_test_util.h"

using namespace sw;

namespace {

using swtest::Corpus;
using swtest::cpu;
using swtest::sum_doubles;
using swtest::world;

ModelConfig small(const std::string& type) {
  ModelConfig c = swtest::tiny_config(type, 6);  // 8 positions: 4 ranks x 2 virtual stages
  c.n_head = 4;
  if (type == "llama") c.n_kv_head = 2;
  return c;
}

struct Opts {
  ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
  PipeSchedule schedule = PipeSchedule::OneFOneB;
  int chunks = 1;  // stages per pipeline rank
  int accum = 4;   // micro-batches
  DType dtype = DType::F32;
  int steps = 8;
};

struct RunResult {
  std::vector<double> losses, norms;
  std::map<std::string, std::vector<float>> params;  // this rank's (logical slices)
  std::map<std::string, ParamSpec> specs;
  size_t act_peak = 0;
};

// P pipeline ranks x D data x t tensor over world_g; P = t = 1 with a local group: the
// one-rank reference (plain micro-steps).
RunResult train(GroupPtr world_g, int P, int t, const ModelConfig& mc, int B, const Opts& o) {
  const int W = world_g->size(), r = world_g->rank(), T = mc.seq_len;
  const int per_stage = W / P, D = per_stage / t;
  const int prank = r / per_stage, rs = r % per_stage, d = rs / t;
  GroupPtr stage = P > 1 ? world_g->split(prank, r) : world_g;
  GroupPtr tensor = t > 1 ? stage->split(d, rs) : nullptr;
  GroupPtr data = t > 1 ? (D > 1 ? stage->split(rs % t, rs) : make_local_group()) : stage;
  GroupPtr pipe = P > 1 ? world_g->split(rs, prank) : nullptr;
  Model whole = build_model(mc, TensorSlice{rs % t, t});
  Model m;
  if (P > 1) {
    const int S = P * o.chunks;
    const std::vector<int> bounds =
        balance_stages(std::vector<double>(whole.schedule.size(), 1.0), S);
    m = stage_model(std::move(whole), bounds, P, o.chunks, prank);
  } else {
    m = std::move(whole);
  }
  ShardingPolicy pol = o.pol;
  pol.mixed_precision.param_dtype = o.dtype;
  ShardedModel sm(m, cpu(), 4242, data, pol, tensor,
                  PipeSetup{pipe, static_cast<int>(o.schedule)});
  Corpus corpus(mc.vocab_size);
  const size_t n = size_t(B) * T;
  std::vector<std::vector<int32_t>> in(size_t(o.accum), std::vector<int32_t>(n)),
      tg(size_t(o.accum), std::vector<int32_t>(n));
  std::vector<Batch> batches;
  for (int k = 0; k < o.accum; ++k) batches.push_back({in[size_t(k)].data(), tg[size_t(k)].data(), B, T});
  AdamWParams ap;
  ap.weight_decay = 0.1f;
  RunResult res;
  MemTracker::global().reset_peaks();
  for (int s = 0; s < o.steps; ++s) {
    sm.zero_grads();
    double loss = 0;
    for (int k = 0; k < o.accum; ++k)
      corpus.fill(s, (int64_t{k} * D + d) * B, B, T, in[size_t(k)].data(), tg[size_t(k)].data());
    if (P > 1) {
      sm.pipeline_step(batches, std::vector<float>(size_t(o.accum), 1.f / float(o.accum)));
      for (double l : sm.step_losses()) loss += l;
    } else {
      for (int k = 0; k < o.accum; ++k)
        loss += sm.forward_backward(batches[size_t(k)], 1.f / float(o.accum), k + 1 == o.accum);
    }
    res.losses.push_back(sum_doubles(*data, loss) / (D * o.accum));
    const double norm = sm.grad_norm();
    res.norms.push_back(norm);
    const float mult = static_cast<float>(std::min(1.0, 1.0 / (norm + 1e-6)));
    sm.optimizer_step(ap, 3e-3f, mult, s + 1);
  }
  res.act_peak = MemTracker::global().peak(Mem::Activations);
  sm.for_each_param([&](const ParamSpec& s, const float* p) {
    res.params[s.name].assign(p, p + numel(s.shape));
    res.specs[s.name] = s;
  });
  return res;
}

const RunResult& reference(const std::string& type, int global_B, const Opts& o) {
  static std::map<std::string, RunResult> cache;
  const std::string key = type + "/" + std::to_string(global_B) + "/" + std::to_string(o.accum) +
                          "/" + dtype_name(o.dtype) + "/" +
                          std::to_string(int(o.pol.activation_checkpointing.mode));
  auto it = cache.find(key);
  if (it == cache.end()) {
    Opts one = o;
    one.pol = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
    one.pol.activation_checkpointing = o.pol.activation_checkpointing;
    it = cache.emplace(key, train(make_local_group(), 1, 1, small(type), global_B, one)).first;
  }
  return it->second;
}

void check_close(const RunResult& a, const RunResult& ref, const std::string& what, double tol,
                 double param_tol) {
  INFO(what << " (rank " << world()->rank() << ")");
  REQUIRE(a.losses.size() == ref.losses.size());
  double worst_loss = 0, worst_norm = 0, worst_param = 0;
  std::string worst_name;
  for (size_t i = 0; i < a.losses.size(); ++i) {
    worst_loss = std::max(worst_loss, std::fabs(a.losses[i] - ref.losses[i]) / std::fabs(ref.losses[i]));
    worst_norm = std::max(worst_norm, std::fabs(a.norms[i] - ref.norms[i]) / std::fabs(ref.norms[i]));
  }
  size_t compared = 0;
  for (const auto& [name, local] : a.params) {
    auto it = ref.params.find(name);
    CHECK(it != ref.params.end());
    if (it == ref.params.end()) continue;
    const ParamSpec& sp = a.specs.at(name);
    for (size_t i = 0; i < local.size(); ++i) {
      const int64_t li = sp.split.logical_index(int64_t(i), sp.shape);
      if (li >= int64_t(it->second.size())) break;
      const double e = std::fabs(double(local[i]) - it->second[size_t(li)]) /
                       (1.0 + std::fabs(it->second[size_t(li)]));
      if (e > worst_param) worst_param = e, worst_name = name;
      ++compared;
    }
  }
  CHECK(compared > 0);
  INFO("worst relative loss error " << worst_loss << ", grad norm " << worst_norm
                                    << ", parameter " << worst_param << " (" << worst_name << ")");
  CHECK(worst_loss < tol);
  CHECK(worst_norm < 10 * tol);
  CHECK(worst_param < param_tol);
  if (env_flag("SHARDWISE_TEST_PARITY_VERBOSE") && world()->rank() == 0)
    std::printf("%-60s loss %.2e  norm %.2e  param %.2e %s\n", what.c_str(), worst_loss,
                worst_norm, worst_param, worst_name.c_str());
}

struct Variant {
  const char* name;
  CheckpointMode ac;
  DType dt;
  double tol, param_tol;
};

// Every schedule at P stages (t tensor, the rest data-parallel with `pol`), GPT-2 and Llama.
void parity(int P, int t, ShardingPolicy pol, const std::string& tag,
            const std::vector<Variant>& variants) {
  const GroupPtr g = world();
  const int W = g->size(), B = 2, D = W / P / t;
  REQUIRE(W % (P * t) == 0);
  struct Sched {
    PipeSchedule s;
    int chunks;
  };
  const Sched scheds[] = {{PipeSchedule::GPipe, 1},
                          {PipeSchedule::OneFOneB, 1},
                          {PipeSchedule::Interleaved1F1B, 2},
                          {PipeSchedule::InterleavedZeroBubble, 2}};
  for (const std::string type : {"gpt2", "llama"}) {
    const ModelConfig mc = small(type);
    for (const Variant& v : variants)
      for (const Sched& sc : scheds) {
        Opts o;
        o.pol = pol;
        o.pol.activation_checkpointing.mode = v.ac;
        o.dtype = v.dt;
        o.schedule = sc.s;
        o.chunks = sc.chunks;
        const RunResult a = train(g, P, t, mc, B, o);
        const RunResult& ref = reference(type, D * B, o);
        check_close(a, ref,
                    tag + " " + type + " " + pipe_schedule_name(sc.s) + " " + v.name, v.tol,
                    v.param_tol);
      }
  }
}

// (bf16: both runs round the products' operands alike; the pipeline adds the tied weight's two
// gradients after their reductions instead of in one buffer: a looser bound, as tensor
// parallelism's test explains.)
const std::vector<Variant> kAll = {{"fp32", CheckpointMode::Off, DType::F32, 1e-5, 3e-4},
                                   {"checkpoint full", CheckpointMode::Full, DType::F32, 1e-5, 3e-4},
                                   {"bf16", CheckpointMode::Off, DType::BF16, 2e-3, 4e-2}};
const std::vector<Variant> kFp32 = {{"fp32", CheckpointMode::Off, DType::F32, 1e-5, 3e-4}};

}  // namespace

TEST_CASE("2 stages alone: every schedule", "[pp2]") {
  parity(2, 1, ShardingPolicy::for_strategy(ShardingStrategy::FullShard), "pp2", kAll);
}

TEST_CASE("4 stages alone, and 2 stages with FULL_SHARD inside", "[pp4]") {
  const int W = world()->size();
  parity(W, 1, ShardingPolicy::for_strategy(ShardingStrategy::FullShard), "pp4", kAll);
  parity(2, 1, ShardingPolicy::for_strategy(ShardingStrategy::FullShard), "pp2 x fsdp2", kFp32);
}

TEST_CASE("2 stages x FULL_SHARD 2 x tensor 2", "[pp2_tp2]") {
  parity(2, 2, ShardingPolicy::for_strategy(ShardingStrategy::FullShard), "pp2 x fsdp2 x tp2",
         kFp32);
}

// The executor runs exactly the pipeline segment's actions (the steady state's plan, recorded at
// the second step): every action once, of the planned kind; zero bubble defers every chunk's
// weight gradients (a BackwardWeight per micro-batch and chunk, after Backwards marked defer).
TEST_CASE("the executor runs the pipeline plan's actions", "[pp2]") {
  const GroupPtr g = world();
  const int P = g->size(), B = 2, M = 4;
  const int prank = g->rank();
  for (const PipeSchedule sched : {PipeSchedule::GPipe, PipeSchedule::OneFOneB,
                                   PipeSchedule::Interleaved1F1B,
                                   PipeSchedule::InterleavedZeroBubble}) {
    const int V = pipe_schedule_interleaved(sched) ? 2 : 1;
    const ModelConfig mc = small("gpt2");
    Model whole = build_model(mc);
    const std::vector<int> bounds =
        balance_stages(std::vector<double>(whole.schedule.size(), 1.0), P * V);
    Model m = stage_model(std::move(whole), bounds, P, V, prank);
    ShardedModel sm(m, cpu(), 7, make_local_group(),
                    ShardingPolicy::for_strategy(ShardingStrategy::FullShard), nullptr,
                    PipeSetup{g, static_cast<int>(sched)});
    Corpus corpus(mc.vocab_size);
    const int T = mc.seq_len;
    std::vector<std::vector<int32_t>> in(M, std::vector<int32_t>(size_t(B) * T)), tg = in;
    std::vector<Batch> batches;
    for (int k = 0; k < M; ++k) {
      corpus.fill(0, int64_t{k} * B, B, T, in[size_t(k)].data(), tg[size_t(k)].data());
      batches.push_back({in[size_t(k)].data(), tg[size_t(k)].data(), B, T});
    }
    AdamWParams ap;
    StepRecorder rec;
    for (int s = 0; s < 2; ++s) {
      sm.zero_grads();
      if (s == 1) sm.set_recorder(&rec);
      sm.pipeline_step(batches, std::vector<float>(M, 1.f / M));
      sm.set_recorder(nullptr);
      sm.optimizer_step(ap, 1e-3f, 1.f, s + 1);
    }
    const StepPlan plan = sm.step_plan(B, T, M);
    REQUIRE(!plan.segments.empty());
    const Segment& seg = plan.segments[0];
    CHECK(seg.kind == SegmentKind::Pipeline);
    std::vector<int> seen(size_t(seg.end - seg.begin), 0);
    for (const ActionRecord& r : rec.records) {
      if (r.action < 0) continue;
      REQUIRE(r.action < seg.end - seg.begin);
      ++seen[size_t(r.action)];
      CHECK(r.kind == plan.actions[size_t(seg.begin + r.action)].kind);
    }
    int deferred = 0, weights = 0, p2p = 0;
    for (int i = seg.begin; i < seg.end; ++i) {
      const Action& a = plan.actions[size_t(i)];
      INFO(pipe_schedule_name(sched) << " rank " << prank << " action " << i << " "
                                     << action_kind_name(a.kind));
      // (waits for nothing left by a gather already in flight are not recorded)
      if (a.kind != ActionKind::WaitGather && a.kind != ActionKind::Gather)
        CHECK(seen[size_t(i - seg.begin)] == 1);
      deferred += a.kind == ActionKind::Backward && a.defer;
      weights += a.kind == ActionKind::BackwardWeight;
      p2p += a.queue == Queue::P2P;
    }
    // Each micro-batch crosses each of this rank's chunk boundaries once each way.
    int edges = 0;
    for (int c = 0; c < V; ++c) {
      const int st = c * P + prank;
      edges += (st > 0) + (st + 1 < P * V);
    }
    CHECK(p2p == 2 * M * edges + (prank == 0 || prank == P - 1 ? 1 : 0));  // + sync_shared
    if (sched == PipeSchedule::InterleavedZeroBubble) {
      CHECK(weights == M * V);
      CHECK(deferred > 0);
    } else {
      CHECK(weights == 0);
      CHECK(deferred == 0);
    }
  }
}

TEST_CASE("4 stages x FULL_SHARD 2, and 4 stages x tensor 2", "[pp4_8]") {
  parity(4, 1, ShardingPolicy::for_strategy(ShardingStrategy::FullShard), "pp4 x fsdp2", kFp32);
  parity(4, 2, ShardingPolicy::for_strategy(ShardingStrategy::FullShard), "pp4 x tp2", kFp32);
}
