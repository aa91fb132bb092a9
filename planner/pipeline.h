// Pipeline parallelism in the planner (issue 37; docs/ARCHITECTURE.md, "The planner"). A
// pipelined run's ranks do not share one plan: pipeline rank r runs stage_model(whole, bounds,
// P, V, r)'s plan (plan_step of a pipelined PlanInput: the schedule's ops with their sends and
// receives, then the optimizer), so each stage is planned and replayed on its own:
//
//   memory  each stage's plan replayed as predict_plan replays one (allocations first, the
//           kernel workspace the backend declares for what the stage runs: no LM head's logits
//           chunk off the last stage), activations in flight as the schedule keeps them (1F1B:
//           min(P - r, M) micro-batches on rank r), and under zero bubble the copies of dout and
//           inp each deferred backward keeps until its BackwardWeight (CallMemory::deferred,
//           measured once per kind of call by measure_deferred), a chunk's first backward's dx
//           made while its input is held, and each send's buffer freed at the first wait_p2p
//           after it completes by the stages' simulated times (sends never block: the buffer
//           outlives the plan's free when the peer posts its receive late; without a profile a
//           nominal machine's times order them). device_max: every send kept until a message
//           the peer sent after posting its receive arrives (the latest a stage can be sure);
//   time    every stage's plan simulated together (predict_step_time with `arrive`): a receive
//           is done when the neighbour's matching send has run and crossed the link
//           (HardwareProfile::p2p_seconds), the tied unit's sync_shared starts when both its
//           holders reach it; repeated until no time moves, so the bubble is what the stages'
//           plans, costs and sends make it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "planner/search.h"

namespace sw {

// Stage bounds (S = pipeline x chunks stages + 1 global positions) of `whole` (a tensor rank's
// model after wrap_blocks): stages of consecutive positions balanced by the time model's flops
// per position (forward + backward of a B x T micro-batch; sharding/pipeline_schedule.h
// balance_stages). Throws sw::Error when the model has fewer positions than stages.
std::vector<int> balanced_stage_bounds(const Model& whole, int B, int T, int stages);
// s.split_points when given (checked: increasing, inside the schedule), else the balanced ones.
std::vector<int> stage_bounds(const Model& whole, const PlanSetup& s);

// Zero bubble: per schedule position of `model`, the bytes DeferredWeightGrads keeps from the
// position's deferred backward until its weight gradients run (its copies of each linear
// layer's dout and inp), for a B x T micro-batch in `compute` precision. Measured: one forward
// and one deferred backward of each kind of call (units with the same parameter shapes share
// it) on the CPU at B = 1 and T' = min(T, 32) rows, scaled by B T / T' (the copies are rows).
// The embedding and the loss calls keep none (their gradients are immediate).
std::vector<int64_t> measure_deferred(const Model& model, int B, int T, DType compute);

struct PipelineTime {
  double step_s = 0;       // the slowest pipeline rank's step (its StepTime::step_s)
  double pipeline_s = 0;   // the pipeline segment: from the first action to the last rank's end
  double bubble = 0;       // 1 - (compute busy in the pipeline segment, summed) / (P pipeline_s)
  double theory_bubble = 0;  // (P-1)/(V M + P-1); zero bubble (P-1)/(3 V M + P-1) (unit costs)
  int iterations = 0;      // rounds of the joint simulation until no time moved
};

struct PipelinePrediction {
  std::vector<int> bounds;              // S + 1 global positions (S = P x V stages)
  std::vector<PlanPrediction> stages;   // per pipeline rank: its plan, memory, time
  // Per pipeline rank: the device peak with every send kept until a message the peer sent after
  // posting its receive has arrived (the latest the stage can be sure the send completed: a
  // bound where the peer's progress is slow; stages[r].device frees each send where the
  // stages' simulated times say it completes).
  std::vector<int64_t> device_max;
  bool timed = false;
  PipelineTime time;
};

// Plans every pipeline rank of s (s.pipeline > 1) as its stage runs; with hw, their time
// together. Units that do not declare their activation sizes: sw::Error (undeclared_message).
// linger false: the plans only, as the executor runs them (no figures; `plan-dump`).
PipelinePrediction predict_pipeline(const PlanSetup& s, const HardwareProfile* hw,
                                    bool linger = true);

// The pipeline's dimensions searched under a memory budget (plan --memory-budget on a config
// with pipeline_parallel_degree > 1): the stage count P (1: no pipeline; P divides the ranks
// over tensor, P x V stages fit the model's positions), the schedule (V = 2 for the
// interleaved ones, whose micro-batch count must be a multiple of P) and the micro-batch size
// and count (the global batch kept: micro_batch x count x data-parallel ranks), split points
// balanced. Each is predicted (predict_pipeline, predict_plan for P = 1); it fits when its
// largest stage's device peak <= budget x (1 - margin). Chosen: the fastest that fits (a
// smaller peak breaks ties within 1%).
struct PipelineCandidate {
  int pipeline = 1, chunks = 1, schedule = 1, micro_batch = 1, accum = 1;
  std::string describe() const;  // "pp=4 1F1B mb=2x8", "pp=1 mb=4x4"
};
struct PipelineEvaluated {
  PipelineCandidate c;
  int64_t device = 0;  // the largest stage's device peak
  int stage = 0;       // the pipeline rank it is on
  double step_s = 0, bubble = 0;
  bool fits = false;
};
struct PipelineSearch {
  std::vector<PipelineEvaluated> evaluated;  // every candidate, in the order tried
  int best = -1;                             // index of the chosen one (-1: none fits)
  PlanSetup chosen;                          // its setup
};
PipelineSearch search_pipeline(const PlanSetup& base, int64_t budget, const HardwareProfile& hw,
                               double margin = 0.02);

// The joint simulation alone: stage r's plan, input and time inputs; fills each stage's
// StepTime (`times`) and returns the pipeline's figures.
PipelineTime simulate_pipeline(const std::vector<const StepPlan*>& plans,
                               const std::vector<const PlanInput*>& inputs,
                               const std::vector<const TimeInputs*>& tis,
                               const HardwareProfile& hw, std::vector<StepTime>& times);

}  // namespace sw
