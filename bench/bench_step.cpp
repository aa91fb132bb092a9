// Training-step throughput of Shardwise on a GPT-2 or Llama shape, with the sgemm roofline
// measured in the same process. Prints a table and one JSON line (for bench/step.sh, which
// runs PyTorch on the same shapes beside it).
//
//   bench_step [--model gpt2|llama] [--d 768] [--layers 12] [--heads 12] [--kv-heads H]
//              [--vocab 50257] [--T 256] [--B 4] [--steps 5] [--warmup 2] [--threads 2]
//              [--strategy FULL_SHARD|SHARD_GRAD_OP|SHARD_OPTIMIZER|NO_SHARD|HYBRID_SHARD]
//              [--prefetch N] [--max-live N] [--blocks-per-unit N] [--shard-group N]
//              [--compute f32|bf16|f16]
//
// --compute bf16 / fp16 trains in mixed precision as `shardwise train` does with bf16 / fp16
// enabled (MixedPrecisionPolicy::param_dtype: fp32 master weights, compute copies rounded, the
// units computing with ops_for(Device::cpu(), dtype): matrix products on rounded operands with
// fp32 accumulation, see kernels/ops.h; 16-bit weight copies where the products read them,
// MixedPrecisionPolicy::weights16). The sgemm roofline is fp32 sgemm whatever the compute dtype.
//
// Under `mpirun -np N bench_step ...` every rank trains its own micro-batch of B rows with the
// given strategy (world_group()); tokens/s counts all ranks (N*B*T per step). Rank 0 prints;
// the table adds communication (comm_s: time the communication threads ran collectives;
// exposed: time compute waited for them) and, per rank, the model state (params + grads +
// optimizer bytes held between steps), the transient gathered buffers (communication peak)
// and the peak of all tracked memory. cpu_s: rank 0's process CPU time per step (median), the
// work a step costs on a shared machine, where wall time also counts other jobs' turns (run
// with OMP_WAIT_POLICY=PASSIVE so that waiting threads sleep instead of spinning).
//
// Training FLOPs per token = 6 * params + 12 * layers * d_model * T (forward + backward,
// matmuls and attention scores; the PaLM/llm.c convention); roofline fraction = achieved
// FLOP/s over OpenBLAS sgemm FLOP/s at the model's own GEMM shapes.
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/alloc.h"
#include "core/rng.h"
#include "engine/clock.h"
#include "kernels/ops.h"
#include "kernels/threads.h"
#include "models/model.h"
#include "sharding/comm/group.h"
#include "sharding/sharded_model.h"
#include "sharding/wrap.h"

using namespace sw;

// CPU seconds all of this process's threads have run (a step's work where the machine is shared:
// wall time counts the other jobs' turns, this does not; with OMP_WAIT_POLICY=PASSIVE it counts
// no spinning either).
double process_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// sgemm GFLOP/s on the shapes a transformer step uses (N = B*T rows), median of reps.
static double sgemm_gflops(const Ops& ops, int N, int C, int V) {
  struct S {
    int M, Nn, K;
    bool ta, tb;
  };
  const std::vector<S> shapes = {
      {N, 3 * C, C, false, true},                // qkv forward
      {N, 4 * C, C, false, true},                // mlp fc forward
      {N, C, 4 * C, false, true},                // mlp proj forward
      {N, C, 4 * C, false, false},               // dinp of fc
      {4 * C, C, N, true, false},                // dW of fc
      {256, std::min(V, 8192), C, false, true},  // an LM-head chunk
  };
  double flops = 0, secs = 0;
  for (const S& s : shapes) {
    std::vector<float> A(size_t(s.M) * s.K, 0.01f), B(size_t(s.K) * s.Nn, 0.02f),
        Cm(size_t(s.M) * s.Nn, 0.f);
    const int lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.Nn;
    ops.gemm(s.ta, s.tb, s.M, s.Nn, s.K, 1.f, A.data(), lda, B.data(), ldb, 0.f, Cm.data(), s.Nn);
    std::vector<double> t;
    for (int r = 0; r < 5; ++r) {
      auto t0 = Clock::now();
      ops.gemm(s.ta, s.tb, s.M, s.Nn, s.K, 1.f, A.data(), lda, B.data(), ldb, 0.f, Cm.data(), s.Nn);
      t.push_back(seconds_since(t0));
    }
    std::sort(t.begin(), t.end());
    flops += 2.0 * s.M * s.Nn * s.K;
    secs += t[t.size() / 2];
  }
  return flops / secs / 1e9;
}

int main(int argc, char** argv) {
  ModelConfig mc;
  mc.type = "gpt2";
  mc.d_model = 768;
  mc.n_layer = 12;
  mc.n_head = 12;
  mc.vocab_size = 50257;
  mc.seq_len = 256;
  int B = 4, steps = 5, warmup = 2, threads = 2, blocks_per_unit = 1;
  bool sgemm_only = false;
  DType compute = DType::F32;
  const GroupPtr world = world_group();
  const int W = world->size(), rank = world->rank();
  ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
  for (int i = 1; i < argc; ++i) {
    auto arg = [&](const char* name) { return std::strcmp(argv[i], name) == 0 && i + 1 < argc; };
    if (arg("--model"))
      mc.type = argv[++i];
    else if (arg("--d"))
      mc.d_model = std::atoi(argv[++i]);
    else if (arg("--layers"))
      mc.n_layer = std::atoi(argv[++i]);
    else if (arg("--heads"))
      mc.n_head = std::atoi(argv[++i]);
    else if (arg("--kv-heads"))
      mc.n_kv_head = std::atoi(argv[++i]);
    else if (arg("--vocab"))
      mc.vocab_size = std::atoi(argv[++i]);
    else if (arg("--T"))
      mc.seq_len = std::atoi(argv[++i]);
    else if (arg("--B"))
      B = std::atoi(argv[++i]);
    else if (arg("--steps"))
      steps = std::atoi(argv[++i]);
    else if (arg("--warmup"))
      warmup = std::atoi(argv[++i]);
    else if (arg("--threads"))
      threads = std::atoi(argv[++i]);
    else if (arg("--strategy")) {
      const ShardingPolicy keep = pol;
      pol = ShardingPolicy::for_strategy(strategy_from_name(argv[++i]));
      pol.forward_prefetch = keep.forward_prefetch, pol.backward_prefetch = keep.backward_prefetch;
      pol.max_live_units = keep.max_live_units, pol.shard_group_size = keep.shard_group_size;
    } else if (arg("--prefetch"))
      pol.forward_prefetch = pol.backward_prefetch = std::atoi(argv[++i]);
    else if (arg("--max-live"))
      pol.max_live_units = std::atoi(argv[++i]);
    else if (arg("--shard-group"))
      pol.shard_group_size = std::atoi(argv[++i]);
    else if (arg("--compute"))
      compute = dtype_from_name(argv[++i]);
    else if (arg("--blocks-per-unit"))
      blocks_per_unit = std::atoi(argv[++i]);
    else if (std::strcmp(argv[i], "--sgemm-only") == 0)
      sgemm_only = true;
    else {
      std::fprintf(stderr, "bench_step: unknown or incomplete option '%s'\n", argv[i]);
      return 2;
    }
  }
  set_num_threads(threads);
  const Ops& ops = ops_for(Device::cpu());
  pol.mixed_precision.param_dtype = compute;
  const int T = mc.seq_len, N = B * T;

  // Every rank measures sgemm at once (they share the cores as training does); the roofline
  // of the job is the sum.
  auto sum_all = [&](double x) {
    std::vector<double> all(static_cast<size_t>(W));
    world->all_gather(&x, all.data(), 2, DType::F32);
    return all;
  };
  double gemm_rate = 0;
  for (double r : sum_all(sgemm_gflops(ops_for(Device::cpu()), N, mc.d_model, mc.vocab_size)))
    gemm_rate += r;

  if (sgemm_only) {  // the roofline alone, for benchmarks that time `shardwise train`
    Model m = build_model(mc);
    const double P = static_cast<double>(m.num_params());
    if (rank == 0)
      std::printf("{\"sgemm_gflops\": %.3f, \"params\": %.0f, \"flops_per_token\": %.0f}\n",
                  gemm_rate, P, 6.0 * P + 12.0 * mc.n_layer * mc.d_model * T);
    return 0;
  }
  MemTracker& mt = MemTracker::global();
  Model model = build_model(mc);
  wrap_blocks(model, blocks_per_unit);
  ShardedModel sm(model, ops, 1234, world, pol);
  const double P = static_cast<double>(sm.num_params());
  const double flops_per_token = 6.0 * P + 12.0 * mc.n_layer * mc.d_model * T;
  const double model_state =
      double(mt.current(Mem::Params) + mt.current(Mem::Grads) + mt.current(Mem::Optimizer));

  std::vector<int32_t> tokens(N), targets(N);
  Rng rng(7 + static_cast<uint64_t>(rank));
  for (int i = 0; i < N; ++i) {
    tokens[i] = static_cast<int32_t>(rng.below(mc.vocab_size));
    targets[i] = static_cast<int32_t>(rng.below(mc.vocab_size));
  }
  Batch batch{tokens.data(), targets.data(), B, T};
  AdamWParams ap;
  std::vector<double> times, cpu, comm, exposed;
  double loss = 0;
  mt.reset_peaks();
  for (int s = 0; s < warmup + steps; ++s) {
    const CommStats c0 = sm.comm_stats();
    auto t0 = Clock::now();
    const double cpu0 = process_cpu_s();
    sm.zero_grads();
    loss = sm.forward_backward(batch, 1.f);
    const double norm = sm.grad_norm();
    const float mult = norm > 1.0 ? static_cast<float>(1.0 / norm) : 1.f;
    sm.optimizer_step(ap, 1e-4f, mult, s + 1);
    const double dt = seconds_since(t0);
    const CommStats c1 = sm.comm_stats();
    if (s >= warmup) {
      times.push_back(dt);
      cpu.push_back(process_cpu_s() - cpu0);
      comm.push_back(c1.comm_s - c0.comm_s);
      exposed.push_back(c1.exposed_s - c0.exposed_s);
    }
  }
  // A step ends on every rank at about the same time (collectives); rank 0's median is the
  // job's step time.
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double step_s = median(times), cpu_s = median(cpu);
  const double tps = double(W) * N / step_s;
  const double achieved = tps * flops_per_token / 1e9;
  const double comm_s = median(comm), exposed_s = median(exposed);
  const std::vector<double> state_r = sum_all(model_state),
                            peak_r = sum_all(double(mt.total_peak())),
                            commpeak_r = sum_all(double(mt.peak(Mem::Communication)));
  if (rank != 0) return 0;
  std::printf("model      %s d=%d L=%d H=%d V=%d T=%d B=%d params=%.1fM\n", mc.type.c_str(),
              mc.d_model, mc.n_layer, mc.n_head, mc.vocab_size, T, B, P / 1e6);
  std::printf("ranks      %d x %d threads, %s, blocks_per_unit %d, compute %s\n", W, threads,
              W > 1 ? pol.describe().c_str() : "unsharded (one rank)", blocks_per_unit,
              dtype_name(compute));
  std::printf("sgemm      %.1f GFLOP/s (model GEMM shapes, all ranks, same run)\n", gemm_rate);
  std::printf("step       %.3f s median of %d  -> %.1f tokens/s, %.1f GFLOP/s = %.0f%% of sgemm\n",
              step_s, steps, tps, achieved, 100.0 * achieved / gemm_rate);
  std::printf("cpu        %.3f s of process CPU time per step (median; all threads)\n", cpu_s);
  std::printf("comm       %.3f s per step in collectives, %.3f s exposed (%.1f%% of the step)\n",
              comm_s, exposed_s, 100.0 * exposed_s / step_s);
  for (int r = 0; r < W; ++r)
    std::printf("rank %-5d model state %.1f MiB, gathered/comm peak %.1f MiB, peak %.1f MiB\n", r,
                state_r[size_t(r)] / 1048576.0, commpeak_r[size_t(r)] / 1048576.0,
                peak_r[size_t(r)] / 1048576.0);
  std::printf("loss       %.4f (rank 0)\n", loss);
  std::printf(
      "{\"peer\": \"shardwise\", \"compute\": \"%s\", \"ranks\": %d, \"threads\": %d, "
      "\"strategy\": \"%s\", "
      "\"params\": %.0f, \"step_s\": %.6f, \"cpu_s\": %.6f, \"tokens_per_s\": %.3f, \"gflops\": %.3f, "
      "\"sgemm_gflops\": %.3f, \"roofline_frac\": %.4f, \"flops_per_token\": %.0f, "
      "\"comm_s\": %.6f, \"exposed_comm_s\": %.6f, \"model_state_bytes\": %.0f, "
      "\"peak_bytes\": %.0f}\n",
      dtype_name(compute), W, threads, W > 1 ? strategy_name(pol.strategy) : "none", P, step_s, cpu_s, tps, achieved, gemm_rate,
      achieved / gemm_rate, flops_per_token, comm_s, exposed_s, state_r[0], peak_r[0]);
  return 0;
}
