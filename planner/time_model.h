// The planner's time model (docs/ARCHITECTURE.md, "The planner"): the StepPlan the engine
// executes, replayed with a duration per action from a hardware profile, on queues that run
// concurrently and wait for what the plan says they wait for.
//
// Durations:
//   forward / backward / recompute   the call's operations: GEMMs 2*m*n*k flops at the
//                                    profile's rate for that shape, causal attention, the
//                                    fused LM head, element-wise passes by bytes
//   optimizer_update                 floats of the shard (or piece) / AdamW floats per second
//   gather / regather / reduce_scatter / all_reduce
//                                    latency + bus bytes / busbw (ring: bytes*(n-1)/n,
//                                    all-reduce twice that)
//   fetch / evict                    bytes / disk bandwidth (NVMe); activation offload to the
//                                    host tier: bytes / memcpy bandwidth, on the compute queue
//                                    (the CPU backend copies at issue); with a host link in
//                                    the profile (a GPU machine) over the link, on the io queue
//   waits, drop_saved, free          0
// The simulation walks the actions in plan order, which is the order the host issues them:
// a compute action starts when the previous compute action ended and every action it waits
// for has finished; an action of another queue starts when it is issued (the host's time at
// that point of the list), its queue is free and what it waits for has finished. Host idle
// time is attributed to the queue of the awaited action that finished last: gather/reduce →
// exposed communication, io → exposed I/O. The gathers the plan starts with in flight (the
// previous step's optimizer prefetch) complete when the previous step's trailing gathers do
// (a second pass). Per step the trainer adds the gradient-norm pass over the gradient shards
// and two small collectives (loss and norm).
#pragma once
#include <string>
#include <vector>

#include "models/model.h"
#include "planner/hardware.h"
#include "sharding/step_plan.h"

namespace sw {

// One operation of a call.
struct CostOp {
  enum Kind : uint8_t { Gemm, Attention, LmHead, Elementwise } kind = Gemm;
  int64_t m = 0, n = 0, k = 0;  // Gemm: op(A) (m, k) x op(B) (k, n)
  bool ta = false, tb = false;  // Gemm: transposes, as Ops::gemm takes them
  double flops = 0;             // Gemm, Attention, LmHead
  double bytes = 0;             // Elementwise
};

// The operations of one schedule position's call, per phase.
struct CallCost {
  std::vector<CostOp> fwd;        // training forward (the loss call: with its gradients)
  std::vector<CostOp> bwd;        // backward
  std::vector<CostOp> recompute;  // a full recompute (the forward without gradients)
  std::vector<CostOp> bwd_weight;  // of bwd, the weight-gradient products (zero bubble's W)
  double cheap_bytes = 0;         // selective recompute: element-wise bytes of the cheap part
};

struct TimeInputs {
  std::vector<CallCost> calls;  // per schedule position
  DType compute = DType::F32;   // the matrix products' precision (param_dtype)
  bool act_offload_nvme = false;
  int64_t grad_shard_floats = 0;  // all units' gradient shards (the norm pass)
  // Hosts the W ranks sit on (consecutive ranks per host, equally many): a group spanning
  // several is costed with the algorithm Auto picks there (sharding/comm/group.h
  // comm_algo_seconds) over the profile's across_hosts link.
  int hosts = 1;
  int replicas = 1;  // local SGD: the replica groups an outer reduce averages over
};

// The operations of every schedule position of `model` (after wrap_blocks) for batch B x T.
// The first position is the embedding, the last the loss (fused LM head over vocab_size; a
// pipeline stage's: Model::takes_input, is_loss);
// other positions: every 2-D parameter is a linear layer, plus causal attention per block
// (a parameter named *.attn.c_attn.weight or *.self_attn.q_proj.weight marks one).
// `calls` (plan_input's declared memory) gives element-wise bytes; may be empty.
TimeInputs time_inputs(const Model& model, const PlanInput& in);

// Seconds one action takes (its own queue's time).
double action_seconds(const Action& a, const StepPlan& plan, const PlanInput& in,
                      const TimeInputs& ti, const HardwareProfile& hw);

struct StepTime {
  double step_s = 0;         // compute_s + exposed_comm_s + exposed_io_s + exposed_p2p_s
  double compute_s = 0;      // busy time of the compute queue (incl. the trainer's norm pass)
  double exposed_comm_s = 0; // compute idle, waiting for gathers and reductions
  double exposed_io_s = 0;   // compute idle, waiting for the io queue
  double exposed_p2p_s = 0;  // pipeline: compute idle, waiting for a neighbour stage (bubble)
  double comm_s = 0;         // busy time of the communication queues
  double io_s = 0;           // busy time of the io queue
  double flops = 0;          // model flops of the step (forward+backward+recompute)
  std::vector<double> begin, end;  // per action of the plan: when it ran (seconds from the start)
};

// Fails (sw::Error "hardware: ...") when the plan communicates and hw has no collectives.
// Pipeline plans: a send (p2p queue) takes hw.p2p_seconds(bytes); `arrive` (per action, may be
// null) says when a receive's data has arrived (the neighbour's send done) and when a
// sync_shared's peer starts it; a receive ends at the later of its issue and that, a
// sync_shared starts then (planner/pipeline.h simulates the stages together with it).
StepTime predict_step_time(const StepPlan& plan, const PlanInput& in, const TimeInputs& ti,
                           const HardwareProfile& hw, const std::vector<double>* arrive = nullptr);

}  // namespace sw
