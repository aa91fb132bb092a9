// The planner for pipeline parallelism (planner/pipeline.h): zero bubble's deferred copies
// against the sizes deferred_wgrad.h states for the built-in blocks, the joint simulation's
// bubble against (P-1)/(M+P-1) on equal stages, and the sends' buffers kept until the peer can
// have received them. The per-stage peaks against measured runs: planner_pipeline_peaks_mpi.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "models/model.h"
#include "planner/hardware.h"
#include "planner/pipeline.h"
#include "planner/search.h"
#include "sharding/pipeline_schedule.h"
#include "sharding/wrap.h"

using namespace sw;

namespace {

// Blocks that dominate everything else (a 16-token vocabulary, element-wise and optimizer work
// free, a free link): equal stages of two blocks each, the embedding and the loss negligible.
PlanSetup equal_stages(PipeSchedule sch, int P, int M) {
  PlanSetup s;
  s.model.type = "gpt2";
  s.model.vocab_size = 16;
  s.model.n_layer = 2 * P;
  s.model.n_head = 4;
  s.model.d_model = 256;
  s.model.seq_len = 64;
  s.policy.strategy = ShardingStrategy::FullShard;
  s.world = P;
  s.pipeline = P;
  s.pipe_chunks = pipe_schedule_interleaved(sch) ? 2 : 1;
  s.pipe_schedule = static_cast<int>(sch);
  s.micro_batch = 2;
  s.accum = M;
  // positions: embedding, 2P blocks, loss; stage r = blocks 2r, 2r+1 (the embedding with the
  // first, the loss with the last)
  for (int r = 1; r < P * s.pipe_chunks; ++r) s.split_points.push_back(1 + r * 2 * P / (P * s.pipe_chunks));
  return s;
}

HardwareProfile fast_everything_but_products() {
  HardwareProfile hw;
  hw.name = "products only";
  hw.gemm_f32 = 1e9;
  hw.attention_f32 = 1e9;
  hw.elementwise_bps = 1e30;
  hw.optimizer_fps = 1e30;
  hw.has_collectives = true;
  hw.all_gather = hw.reduce_scatter = hw.all_reduce = {0, 1e30, {}};
  hw.p2p_latency_s = 0, hw.p2p_bps = 1e30;
  hw.disk_read_bps = hw.disk_write_bps = 1e9;
  return hw;
}

}  // namespace

TEST_CASE("pipeline plan: zero bubble's deferred copies are each block's linear layers' dout and inp") {
  const int B = 2, T = 48;  // (above the 32 rows measured: the scaling is checked too)
  ModelConfig mc;
  mc.vocab_size = 64, mc.n_layer = 2, mc.n_head = 4, mc.d_model = 64, mc.seq_len = T;
  SECTION("GPT-2: 16 N C floats a block (deferred_wgrad.h), none for the embedding and the loss") {
    Model m = build_model(mc);
    const std::vector<int64_t> d = measure_deferred(m, B, T, DType::F32);
    REQUIRE(d.size() == m.schedule.size());
    const int64_t N = B * T, C = mc.d_model;
    CHECK(d.front() == 0);
    CHECK(d.back() == 0);
    for (size_t p = 1; p + 1 < d.size(); ++p) CHECK(d[p] == 16 * N * C * 4);
  }
  SECTION("Llama: packed q|k|v and gate|up each one product (dout q|k|v o gate|up down; inp C C C F)") {
    mc.type = "llama";
    mc.n_kv_head = 2;
    Model m = build_model(mc);
    const std::vector<int64_t> d = measure_deferred(m, B, T, DType::F32);
    const int64_t N = B * T, C = mc.d_model, hd = C / mc.n_head;
    const int64_t QKV = (mc.n_head + 2 * mc.n_kv_head) * hd, F = 192;  // ceil(8 C / 3) to 64
    const int64_t floats = N * ((QKV + C + 2 * F + C) + (C + C + C + F));
    for (size_t p = 1; p + 1 < d.size(); ++p) CHECK(d[p] == floats * 4);
  }
}

TEST_CASE("pipeline plan: the stages simulated together show 1F1B's bubble (P-1)/(M+P-1) on equal stages") {
  const HardwareProfile hw = fast_everything_but_products();
  for (int P : {2, 4})
    for (int M : {4, 8}) {
      const PipelinePrediction p = predict_pipeline(equal_stages(PipeSchedule::OneFOneB, P, M), &hw);
      REQUIRE(p.timed);
      const double theory = double(P - 1) / double(M + P - 1);
      INFO("P " << P << " M " << M << " bubble " << p.time.bubble << " theory " << theory);
      CHECK(p.time.theory_bubble == Approx(theory));
      CHECK(std::abs(p.time.bubble - theory) < 0.01);
      // GPipe's is the same on equal stages; zero bubble's W's fill most of it.
      const PipelinePrediction g = predict_pipeline(equal_stages(PipeSchedule::GPipe, P, M), &hw);
      CHECK(std::abs(g.time.bubble - theory) < 0.01);
      if (M % P == 0) {
        const PipelinePrediction z =
            predict_pipeline(equal_stages(PipeSchedule::InterleavedZeroBubble, P, M), &hw);
        const PipelinePrediction i =
            predict_pipeline(equal_stages(PipeSchedule::Interleaved1F1B, P, M), &hw);
        INFO("interleaved " << i.time.bubble << " zero bubble " << z.time.bubble);
        CHECK(z.time.bubble < i.time.bubble);
        CHECK(i.time.bubble < p.time.bubble);
      }
    }
}

TEST_CASE("pipeline plan: a slow link adds its time to every hop of the critical path") {
  HardwareProfile hw = fast_everything_but_products();
  const PlanSetup s = equal_stages(PipeSchedule::OneFOneB, 2, 4);
  const PipelinePrediction fast = predict_pipeline(s, &hw);
  hw.p2p_latency_s = 0.01;  // far above a block's products
  const PipelinePrediction slow = predict_pipeline(s, &hw);
  // 1F1B at P = 2: a forward hop and a backward hop on the critical path, and one more of each
  // per micro-batch the last stage waits for: at least 2 hops' latency more per step.
  CHECK(slow.time.step_s > fast.time.step_s + 2 * 0.01);
  CHECK(slow.time.bubble > fast.time.bubble);
}

TEST_CASE("pipeline plan: GPipe's first stage's sends: freed once complete, or kept until a gradient comes back") {
  const int P = 2, M = 4;
  PlanSetup s = equal_stages(PipeSchedule::GPipe, P, M);
  HardwareProfile hw = fast_everything_but_products();
  const PipelinePrediction p = predict_pipeline(s, &hw);
  // The same stage's plan alone (sends freed at the wait after the next op).
  Model whole = build_model(s.model);
  wrap_blocks(whole, 1);
  Model st = stage_model(std::move(whole), p.bounds, P, 1, 0);
  PlanInput in = make_plan_input(st, s.policy, 1);
  in.pipe.schedule = s.pipe_schedule;
  in.B = s.micro_batch, in.T = s.model.seq_len, in.accum = M;
  declare_calls(in, st);
  const PlanPeak alone = replay_peak_alloc_first(plan_step(in));
  const int64_t act = int64_t{4} * in.B * in.T * s.model.d_model;
  // The plan alone peaks at the last forward: M Saved, that forward's output and the previous
  // one's send (freed at the wait after it). On a fast link every send completes before that
  // wait: the prediction is the plan's.
  CHECK(p.stages[0].peak.total == alone.total);
  // The bound: the peer sends nothing back before its first gradient, so no send is known
  // complete before that gradient's receive: M Saved, M sends and the gradient, M - 1 buffers
  // more.
  REQUIRE(p.device_max.size() == size_t(P));
  CHECK(p.device_max[0] - p.stages[0].device == (M - 1) * act);
  // A link slower than the forwards: the sends complete only after the last forward ran, so
  // the prediction keeps them too (and never exceeds the bound).
  hw.p2p_latency_s = 1.0;
  const PipelinePrediction slow = predict_pipeline(s, &hw);
  CHECK(slow.stages[0].peak.total - alone.total >= (M - 2) * act);
  for (int r = 0; r < P; ++r) CHECK(slow.stages[size_t(r)].device <= slow.device_max[size_t(r)]);
}

TEST_CASE("pipeline plan: stage bounds from split points are checked") {
  PlanSetup s = equal_stages(PipeSchedule::Interleaved1F1B, 2, 4);  // 4 stages, 6 positions
  s.split_points = {3, 2, 5};
  CHECK_THROWS_WITH(predict_pipeline(s, nullptr),
                    Catch::Contains("pipeline_parallel_split_points: position 2 is not after 3"));
  s.split_points = {3};
  CHECK_THROWS_WITH(predict_pipeline(s, nullptr), Catch::Contains("1 points for 4 stages (need 3)"));
  s.split_points = {};
  s.model.n_layer = 1;  // 3 positions, 4 stages
  CHECK_THROWS_WITH(predict_pipeline(s, nullptr), Catch::Contains("4 stages need as many"));
}

TEST_CASE("pipeline plan: the search under a budget chooses the fastest plan whose largest stage fits") {
  PlanSetup base = equal_stages(PipeSchedule::OneFOneB, 4, 4);
  base.model.vocab_size = 512;
  const HardwareProfile hw = fast_everything_but_products();
  SECTION("no budget to speak of: the fastest of all, within the noise") {
    const PipelineSearch r = search_pipeline(base, int64_t{1} << 40, hw);
    REQUIRE(r.best >= 0);
    double fastest = 1e30;
    for (const PipelineEvaluated& e : r.evaluated) fastest = std::min(fastest, e.step_s);
    CHECK(r.evaluated[size_t(r.best)].step_s <= fastest * (1 + kStepTimeNoise));
    // every kind of candidate was tried: no pipeline, every schedule at 2 and 4 stages
    int kinds[5][4] = {};
    for (const PipelineEvaluated& e : r.evaluated) ++kinds[e.c.pipeline][e.c.pipeline > 1 ? e.c.schedule : 0];
    CHECK(kinds[1][0] > 0);
    for (int P : {2, 4})
      for (int s = 0; s < 4; ++s) CHECK(kinds[P][s] > 0);
  }
  SECTION("a budget only pipelines fit: the choice has stages, and its predicted stages fit") {
    const PipelineSearch all = search_pipeline(base, int64_t{1} << 40, hw);
    int64_t no_pipe = INT64_MAX, piped = INT64_MAX;
    for (const PipelineEvaluated& e : all.evaluated)
      (e.c.pipeline == 1 ? no_pipe : piped) = std::min(e.c.pipeline == 1 ? no_pipe : piped, e.device);
    REQUIRE(piped < no_pipe);
    const int64_t budget = static_cast<int64_t>(double(piped + no_pipe) / 2 / 0.98);
    const PipelineSearch r = search_pipeline(base, budget, hw);
    REQUIRE(r.best >= 0);
    const PipelineEvaluated& b = r.evaluated[size_t(r.best)];
    CHECK(b.c.pipeline > 1);
    CHECK(r.chosen.pipeline == b.c.pipeline);
    CHECK(r.chosen.micro_batch * r.chosen.accum * r.chosen.data_world() ==
          base.micro_batch * base.accum * base.data_world());  // the global batch kept
    const PipelinePrediction p = predict_pipeline(r.chosen, &hw);
    for (const PlanPrediction& st : p.stages) CHECK(double(st.device) <= double(budget) * 0.98);
  }
  SECTION("a budget nothing fits: no choice") {
    CHECK(search_pipeline(base, 1 << 20, hw).best == -1);
  }
}
