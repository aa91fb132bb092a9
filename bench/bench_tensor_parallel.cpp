// Tensor (+ sequence) parallelism's figures per rank on a GPT-2 shape (issue 36): memory peaks
// per category, the bytes each group moves per step against two counts, and the step time.
//
//   mpirun -np W bench_tensor_parallel [--tensor t] [--T 1024] [--B 1] [--steps 2]
//                                       [--threads 1] [--data data/fortunes_train.bin]
//                                       [--settle 2] [--d 768] [--layers 12] [--heads 12]
//                                       [--vocab 50304]
//
// The W ranks form the trainer's mesh (engine/trainer.cpp): tensor groups of t consecutive
// ranks, data groups of the ranks with the same r % t, FULL_SHARD over the data group (t = 1:
// FULL_SHARD over the world). Each data-parallel rank trains B rows of T tokens from --data
// (engine/data.h's train_batch, seed 1337, as `shardwise train` draws them); AdamW, clipping 1.
//
// Per rank it prints:
//   memory   MemTracker's peaks over the steps (reset after construction): the total tracked
//            peak (what metrics.jsonl's peak_mem_bytes reports) and each category's own peak.
//   bytes    per step (one figure per step), measured: Group::stats().bytes of the tensor
//            group and of the data group (nccl-tests' "size": an all-gather's whole output, a
//            reduce-scatter's whole input, an all-reduce's buffer); against
//              plan     the sum of Action::bytes of ShardedModel::step_plan(B, T, 1) by queue
//                       (tensor: the tensor queue; data: gather + reduce queues)
//              formula  this file's own count from the shapes (tensor_formula / data_formula
//                       below), independent of the plan.
//   time     each step's wall time (the first step includes first-touch faults).
// A collective counts its bytes when it completes, and the optimizer's prefetch of the next
// step's first unit (150 MB for GPT-2's embedding/head at t = 1) can still be running when the
// step returns; so after each timed step the bench waits --settle seconds (default 2) before
// reading the stats, and each step's bytes are those of its own collectives (the first step's
// include the first unit's gather, which later steps get from the previous optimizer).
// Output: one JSON object per rank, one line each (for bench/tp_figures.sh).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/alloc.h"
#include "engine/clock.h"
#include "engine/data.h"
#include "kernels/ops.h"
#include "kernels/threads.h"
#include "models/model.h"
#include "sharding/comm/group.h"
#include "sharding/sharded_model.h"
#include "sharding/step_plan.h"
#include "sharding/wrap.h"

using namespace sw;

namespace {

// Tensor group bytes per step, GPT-2 (models/tensor_units.cpp's splits), N = B T rows, C
// d_model, fp32 (4 bytes), t the tensor degree:
//   each block, forward: 2 row gathers + 2 row reduce-scatters of (N, C);
//               backward: 4 gathers (dy and the kept norm output, twice) + 2 scatters
//   embedding:  forward 1 scatter, backward 1 gather of (N, C)
//   LM head:    forward 1 gather of (N, C), 1 all-gather of the row stats (t, N, 3), 1 scatter
//               of dh (N, C); backward nothing (dh was made in the forward call)
//   replicated gradients summed over the group once per step (an all-reduce each):
//               per block 2 norms' weight and bias + 2 row-parallel biases = 6 C,
//               positions (seq_len, C) + the final norm 2 C
double tensor_formula(const ModelConfig& m, int B, int T, int t) {
  if (t == 1) return 0;
  const double NC4 = double(B) * T * m.d_model * 4, C = m.d_model;
  const double blocks = m.n_layer * (4 + 6) * NC4;
  const double embed = 2 * NC4;
  const double head = 2 * NC4 + double(t) * B * T * 3 * 4;
  const double replicated = (m.n_layer * 6 * C + double(m.seq_len) * C + 2 * C) * 4;
  return blocks + embed + head + replicated;
}

// Data group bytes per step, FULL_SHARD over D ranks, fp32, one unit per block plus the
// embedding/head unit, each unit's (local, tensor-sliced) bytes padded to D x 16 floats: a
// block's parameters are all-gathered in the forward and again in the backward and its
// gradients reduce-scattered once (3 x); the tied embedding/head unit runs first and last
// (num_calls 2), so it stays gathered from its first forward call to its last backward call:
// one gather, one reduce-scatter (2 x). D = 1: nothing crosses ranks (0).
double data_formula(const Model& model, int D) {
  if (D == 1) return 0;
  double total = 0;
  for (const auto& u : model.units) {
    int64_t n = 0;
    for (const ParamSpec& p : u->params()) n += numel(p.shape);
    const int64_t q = int64_t{D} * 16;
    total += (u->num_calls() > 1 ? 2.0 : 3.0) * double((n + q - 1) / q * q) * 4;
  }
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  ModelConfig mc;
  mc.type = "gpt2";
  mc.d_model = 768;
  mc.n_layer = 12;
  mc.n_head = 12;
  mc.vocab_size = 50304;
  mc.seq_len = 1024;
  int B = 1, steps = 2, threads = 1, t = 1;
  double settle = 2;
  std::string data = "data/fortunes_train.bin";
  for (int i = 1; i < argc; ++i) {
    auto arg = [&](const char* name) { return std::strcmp(argv[i], name) == 0 && i + 1 < argc; };
    if (arg("--tensor"))
      t = std::atoi(argv[++i]);
    else if (arg("--T"))
      mc.seq_len = std::atoi(argv[++i]);
    else if (arg("--B"))
      B = std::atoi(argv[++i]);
    else if (arg("--steps"))
      steps = std::atoi(argv[++i]);
    else if (arg("--threads"))
      threads = std::atoi(argv[++i]);
    else if (arg("--settle"))
      settle = std::atof(argv[++i]);
    else if (arg("--data"))
      data = argv[++i];
    else if (arg("--d"))
      mc.d_model = std::atoi(argv[++i]);
    else if (arg("--layers"))
      mc.n_layer = std::atoi(argv[++i]);
    else if (arg("--heads"))
      mc.n_head = std::atoi(argv[++i]);
    else if (arg("--vocab"))
      mc.vocab_size = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "bench_tensor_parallel: unknown or incomplete option '%s'\n", argv[i]);
      return 2;
    }
  }
  const GroupPtr world = world_group();
  const int W = world->size(), r = world->rank(), T = mc.seq_len;
  if (t < 1 || W % t != 0) {
    std::fprintf(stderr, "bench_tensor_parallel: --tensor %d does not divide %d ranks\n", t, W);
    return 2;
  }
  const int D = W / t, d = r / t;
  set_num_threads(threads);
  const Ops& ops = ops_for(Device::cpu(), DType::F32);

  // The trainer's mesh: tensor groups of consecutive ranks, data groups split from the world.
  GroupPtr tensor = t > 1 ? world->split(d, r) : nullptr;
  GroupPtr dgroup = t > 1 ? (D > 1 ? world->split(r % t, r) : make_local_group()) : world;
  Model model = build_model(mc, TensorSlice{r % t, t});
  wrap_blocks(model, 1);
  const ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
  ShardedModel sm(model, ops, 1337, dgroup, pol, tensor);

  // What the plan says each queue moves in one step.
  double plan_tensor = 0, plan_data = 0;
  for (const Action& a : sm.step_plan(B, T, 1).actions) {
    if (a.queue == Queue::Tensor) plan_tensor += double(a.bytes);
    if (a.queue == Queue::Gather || a.queue == Queue::Reduce) plan_data += double(a.bytes);
  }
  const double f_tensor = tensor_formula(mc, B, T, t), f_data = data_formula(model, D);

  Corpus corpus(data, mc.vocab_size, T);
  std::vector<int32_t> in(size_t(B) * T), tg(size_t(B) * T);
  const Batch batch{in.data(), tg.data(), B, T};
  AdamWParams ap;
  ap.weight_decay = 0.1f;
  MemTracker& mt = MemTracker::global();
  mt.reset_peaks();
  std::vector<double> step_s, tensor_b, data_b;
  double loss = 0;
  if (tensor) tensor->reset_stats();
  dgroup->reset_stats();
  for (int s = 0; s < steps; ++s) {
    train_batch(corpus, 1337, s, int64_t{D} * B, int64_t{d} * B, B, T, in.data(), tg.data());
    world->barrier();
    const auto t0 = Clock::now();
    sm.zero_grads();
    loss = sm.forward_backward(batch, 1.f);
    const double norm = sm.grad_norm();
    sm.optimizer_step(ap, 6e-4f, norm > 1.0 ? float(1.0 / norm) : 1.f, s + 1);
    step_s.push_back(seconds_since(t0));
    std::this_thread::sleep_for(std::chrono::duration<double>(settle));
    tensor_b.push_back(tensor ? tensor->stats().bytes : 0.0);
    data_b.push_back(dgroup->stats().bytes);
    if (tensor) tensor->reset_stats();
    dgroup->reset_stats();
  }

  // One JSON line per rank, printed in rank order.
  char line[2048];
  std::string cats;
  for (int m = 0; m < int(Mem::Count); ++m) {
    const Mem c = static_cast<Mem>(m);
    cats += std::string(m ? ", " : "") + "\"" + mem_name(c) + "\": " + std::to_string(mt.peak(c));
  }
  std::string times, tb, db;
  for (size_t s = 0; s < step_s.size(); ++s) {
    times += (s ? ", " : "") + std::to_string(step_s[s]);
    tb += (s ? ", " : "") + std::to_string(int64_t(tensor_b[s]));
    db += (s ? ", " : "") + std::to_string(int64_t(data_b[s]));
  }
  std::snprintf(line, sizeof line,
                "{\"rank\": %d, \"world\": %d, \"tensor\": %d, \"data\": %d, \"B\": %d, \"T\": %d, "
                "\"threads\": %d, \"loss\": %.6f, \"peak_total\": %zu, \"peak\": {%s}, "
                "\"tensor_bytes\": [%s], \"tensor_plan\": %.0f, \"tensor_formula\": %.0f, "
                "\"data_bytes\": [%s], \"data_plan\": %.0f, \"data_formula\": %.0f, "
                "\"data_group\": \"%s\", \"step_s\": [%s]}",
                r, W, t, D, B, T, threads, loss, mt.total_peak(), cats.c_str(),
                tb.c_str(), plan_tensor, f_tensor, db.c_str(), plan_data, f_data,
                dgroup->backend(), times.c_str());
  for (int k = 0; k < W; ++k) {
    world->barrier();
    if (k == r) {
      std::printf("%s\n", line);
      std::fflush(stdout);
    }
  }
  world->barrier();
  return 0;
}
