// Pipeline schedules as data (issue 37): which ops each pipeline rank runs, in what order; a
// simulator that checks a set of orders is dependency-safe and measures its bubble; and the
// partition of consecutive units into balanced stages. Pure C++: no MPI, no model. The plan
// builder turns a rank's order into plan actions (compute, sends and receives).
//
// Stages and ranks. P pipeline ranks each hold V chunks ("virtual stages"); rank r's chunk c
// is global stage g = c * P + r (Megatron's interleaving: rank r holds stages r, r+P, ...).
// Activations flow g -> g+1, gradients g+1 -> g; the last stage P*V-1 computes the loss.
//
// Schedules (torchtitan's names), for M micro-batches, on rank r:
//   GPipe                  all M forwards, then all M backwards (V = 1). Peak in flight: M.
//   1F1B                   PipeDream-flush: a warm-up of min(P - r - 1, M) forwards, then one
//                          forward / one backward, then the cool-down backwards (V = 1). Peak
//                          in flight: min(P - r, M). Bubble (f = 1, b = 2, no comm) equals
//                          GPipe's: (P-1)/(M+P-1).
//   Interleaved1F1B        Megatron's interleaved schedule over V chunks: M*V forward and
//                          backward ops; micro-batches in groups of P (M % P == 0 required
//                          when V > 1), forwards visit chunks 0..V-1 per group, backwards
//                          V-1..0; warm-up min((P - r - 1) * 2 + (V - 1) * P, M*V) forwards.
//                          Bubble (P-1)/(V*M+P-1). V = 1 gives exactly the 1F1B order.
//   InterleavedZeroBubble  ZB-H1-like: the Interleaved1F1B order (1F1B's for V = 1) with each
//                          Backward split into BackwardInput (I, dx only; on the critical
//                          path) and BackwardWeight (W, the weight gradients), the W's delayed
//                          to fill what would be bubble. The F/I order is the interleaved F/B
//                          order, so activations in flight (F done, I not) are the same per
//                          rank. W's are placed by a greedy run of all ranks on unit costs
//                          (f = i = w = 1, no comm): a free rank runs its next F/I when that is
//                          ready, else its oldest pending W; and a W before a forward that
//                          would make the rank's live micro-batches (F done, W not) exceed the
//                          largest interleaved peak in flight over the ranks (rank 0's): ZB-H1's
//                          rule, the pipeline's peak memory stays 1F1B's while later stages
//                          keep W's longer. Every W after its I; all W done by the end. Bubble
//                          (f = i = w = 1, no comm, M >= P): (P-1)/(3*V*M+P-1), a third of
//                          Interleaved1F1B's idle time.
//
// Errors: user mistakes throw sw::Error ("config: ..." for the schedule name, "pipeline: ..."
// naming the bad value and the config key it comes from otherwise).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace sw {

enum class PipeSchedule : uint8_t { GPipe, OneFOneB, Interleaved1F1B, InterleavedZeroBubble };

// torchtitan's names: "GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble". Unknown:
// sw::Error("config: parallelism.pipeline_parallel_schedule: unknown schedule 'x' (choose
// GPipe, 1F1B, Interleaved1F1B, InterleavedZeroBubble)").
PipeSchedule pipe_schedule_from_name(const std::string& s);
const char* pipe_schedule_name(PipeSchedule s);
// Takes V > 1 virtual stages (chunks) per rank: Interleaved1F1B, InterleavedZeroBubble.
bool pipe_schedule_interleaved(PipeSchedule s);
// Splits Backward into BackwardInput + BackwardWeight: InterleavedZeroBubble.
bool pipe_schedule_splits_backward(PipeSchedule s);

// Forward; Backward (input and weight gradients together); BackwardInput (I: dx only) and
// BackwardWeight (W: the weight gradients of an earlier I of the same micro and chunk).
enum class PipeOpKind : uint8_t { Forward, Backward, BackwardInput, BackwardWeight };
struct PipeOp {
  PipeOpKind kind;
  int micro;  // 0..M-1
  int chunk;  // 0..V-1 on this rank
  bool operator==(const PipeOp& o) const {
    return kind == o.kind && micro == o.micro && chunk == o.chunk;
  }
};
// "F", "B", "I", "W"; and "F(m3,c1)" for an op (for messages and printed orders).
const char* pipe_op_kind_name(PipeOpKind k);
std::string pipe_op_str(const PipeOp& op);

// Global stage of rank r's chunk c with P ranks (see the top of this file).
inline int pipe_stage(int P, int rank, int chunk) { return chunk * P + rank; }

// The order rank `rank` of P runs for M micro-batches with V chunks per rank (V must be 1
// unless interleaved; interleaved with V == 1 is the 1F1B order, split for the zero-bubble
// one). Each (micro, chunk) has exactly one Forward and one Backward, or one BackwardInput and
// one BackwardWeight. Throws sw::Error naming the bad value (P, V, M, rank, or M % P != 0 for
// an interleaved schedule with V > 1).
std::vector<PipeOp> pipe_order(PipeSchedule s, int P, int V, int M, int rank);

// Most micro-batches whose Forward ran but whose Backward / BackwardInput has not (per chunk,
// summed) at any point of the order: what activation memory scales with.
int pipe_peak_in_flight(const std::vector<PipeOp>& order);
// Most BackwardWeight pending (BackwardInput ran, BackwardWeight not) at any point: the
// inputs and output gradients kept for W.
int pipe_peak_weight_pending(const std::vector<PipeOp>& order);

// Op costs in the simulator: b is a Backward's; i and w are the split backward's halves. comm
// is added on every activation / gradient that crosses ranks (not between chunks of one rank).
struct PipeCosts {
  double f = 1, b = 2, i = 1, w = 1, comm = 0;
};
struct PipeSim {
  bool ok = true;
  std::string problem;  // one line: a malformed order, or a deadlock naming rank, op, and what
                        // it waits for
  double makespan = 0;
  std::vector<double> busy;  // per rank: compute time
  double bubble = 0;         // 1 - sum(busy) / (P * makespan)
  std::vector<std::vector<std::pair<double, double>>> spans;  // per rank, per op: [start, end]
};
// Runs every rank's order (orders[r], r = 0..P-1) with the dependencies: F(m,g) after
// F(m,g-1) (+comm); the last stage's B/I(m) after its F(m); B/I(m,g) after B/I(m,g+1) (+comm)
// and F(m,g); W(m,g) after I(m,g). Each rank runs its ops strictly in its order, one at a
// time, each as early as its dependencies allow. M is 1 + the largest micro seen; every rank
// must hold every (micro, chunk) once as above, else ok = false with the problem. Throws
// sw::Error for P < 1, V < 1, orders.size() != P or a negative cost.
PipeSim simulate_pipe(const std::vector<std::vector<PipeOp>>& orders, int P, int V,
                      const PipeCosts& c);

// Stages of consecutive positions: boundaries b[0] = 0 < b[1] < ... < b[stages] = n minimising
// the largest stage sum (exact DP; of the optimal partitions, the one whose stages take as many
// positions as they can, front first). Every stage non-empty.
// Throws sw::Error when n < stages (naming both), stages < 1, or a cost is negative or NaN.
std::vector<int> balance_stages(const std::vector<double>& cost, int stages);

}  // namespace sw
