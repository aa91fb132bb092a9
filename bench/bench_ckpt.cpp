// Activation checkpointing: peak activation memory and step time of off / selective / full,
// side by side in one run, on the GPT-2 124M shape (d 768, 12 layers, 12 heads, vocab 50257,
// T 256, micro-batch 4) and the small config (d 384, 6 layers, 6 heads, vocab 8192, T 256,
// micro-batch 8), one rank.
//
//   bench_ckpt [--shape all|124m|small] [--model gpt2|llama] [--steps 2] [--rounds 2]
//              [--threads 2]
//
// Rounds alternate the modes (off, selective, full, off, ...) so that a noisy (shared) machine
// hurts them alike; each mode's time is the median of its timed steps (one warm-up step per
// model built). "peak act" is MemTracker's peak of Mem::Activations during a forward_backward
// (the unit inputs the engine keeps plus the units' Saved); "inputs" is the part the unit
// inputs take, (schedule positions - 1) * B*T*d * 4 bytes. "step cpu s": CPU time of the
// process per step (see cpu_seconds). Ratios are against off.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/alloc.h"
#include "core/rng.h"
#include "kernels/ops.h"
#include "kernels/threads.h"
#include "models/model.h"
#include "sharding/comm/group.h"
#include "sharding/sharded_model.h"

using namespace sw;
using Clock = std::chrono::steady_clock;

namespace {

struct BenchShape {
  const char* name;
  int d, layers, heads, vocab, T, B;
};

// CPU seconds of the whole process (all threads): on a shared, oversubscribed machine this
// tracks the work done better than wall time (run with OMP_WAIT_POLICY=PASSIVE so that idle
// OpenMP threads do not spin).
double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

struct Result {
  std::vector<double> fb_s, step_s, step_cpu_s;
  size_t peak_act = 0, peak_total = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string which = "all", type = "gpt2";
  int steps = 2, rounds = 2, threads = 2;
  for (int i = 1; i < argc; ++i) {
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_ckpt: %s needs a value\n", argv[i]);
        std::exit(2);
      }
      return argv[++i];
    };
    if (!std::strcmp(argv[i], "--shape")) which = next();
    else if (!std::strcmp(argv[i], "--model")) type = next();
    else if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(next());
    else if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(next());
    else if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(next());
    else {
      std::fprintf(stderr, "bench_ckpt: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  set_num_threads(threads);
  const Ops& ops = ops_for(Device::cpu());
  const std::vector<BenchShape> shapes = {{"124m", 768, 12, 12, 50257, 256, 4},
                                     {"small", 384, 6, 6, 8192, 256, 8}};
  const CheckpointMode modes[3] = {CheckpointMode::Off, CheckpointMode::Selective,
                                   CheckpointMode::Full};
  std::printf("bench_ckpt: %s, 1 rank x %d threads, %d rounds x %d timed steps per mode\n",
              type.c_str(), num_threads(), rounds, steps);
  for (const BenchShape& s : shapes) {
    if (which != "all" && which != s.name) continue;
    ModelConfig mc;
    mc.type = type;
    mc.d_model = s.d;
    mc.n_layer = s.layers;
    mc.n_head = s.heads;
    mc.vocab_size = s.vocab;
    mc.seq_len = s.T;
    const size_t N = size_t(s.B) * s.T;
    std::vector<int32_t> tokens(N), targets(N);
    Rng rng(7);
    for (size_t i = 0; i < N; ++i) {
      tokens[i] = static_cast<int32_t>(rng.below(uint64_t(s.vocab)));
      targets[i] = static_cast<int32_t>(rng.below(uint64_t(s.vocab)));
    }
    const Batch batch{tokens.data(), targets.data(), s.B, s.T};
    Result res[3];
    size_t positions = 0;
    for (int r = 0; r < rounds; ++r)
      for (int m = 0; m < 3; ++m) {
        Model model = build_model(mc);
        positions = model.schedule.size();
        ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
        pol.activation_checkpointing.mode = modes[m];
        ShardedModel sm(model, ops, 1234, make_local_group(), pol);
        MemTracker& mt = MemTracker::global();
        for (int k = 0; k <= steps; ++k) {  // k = 0: warm-up
          sm.zero_grads();
          const size_t act0 = mt.current(Mem::Activations), tot0 = mt.total_current();
          mt.reset_peaks();
          const double c0 = cpu_seconds();
          const auto t0 = Clock::now();
          sm.forward_backward(batch);
          const auto t1 = Clock::now();
          res[m].peak_act = std::max(res[m].peak_act, mt.peak(Mem::Activations) - act0);
          res[m].peak_total = std::max(res[m].peak_total, mt.total_peak() - tot0);
          sm.optimizer_step(AdamWParams{}, 1e-4f, 1.f, k + 1);
          const auto t2 = Clock::now();
          const double c2 = cpu_seconds();
          if (k == 0) continue;
          res[m].step_cpu_s.push_back(c2 - c0);
          res[m].fb_s.push_back(std::chrono::duration<double>(t1 - t0).count());
          res[m].step_s.push_back(std::chrono::duration<double>(t2 - t0).count());
        }
      }
    const double inputs = double(positions - 1) * double(N) * s.d * 4;
    std::printf("\n%s: d=%d layers=%d heads=%d vocab=%d T=%d B=%d; unit inputs %.1f MiB\n",
                s.name, s.d, s.layers, s.heads, s.vocab, s.T, s.B, inputs / (1 << 20));
    std::printf("  %-10s %13s %7s %17s %7s %10s %7s %8s %7s %9s %10s %7s\n", "mode",
                "peak act MiB", "x off", "act - inputs MiB", "x off", "fwd+bwd s", "x off",
                "step s", "x off", "tokens/s", "step cpu s", "x off");
    const double a0 = double(res[0].peak_act), f0 = median(res[0].fb_s),
                 t0 = median(res[0].step_s), u0 = median(res[0].step_cpu_s);
    for (int m = 0; m < 3; ++m) {
      const double a = double(res[m].peak_act), f = median(res[m].fb_s), t = median(res[m].step_s);
      const double u = median(res[m].step_cpu_s);
      std::printf("  %-10s %13.1f %7.3f %17.1f %7.3f %10.3f %7.3f %8.3f %7.3f %9.1f %10.3f %7.3f\n",
                  checkpoint_mode_name(modes[m]), a / (1 << 20), a / a0,
                  (a - inputs) / (1 << 20), (a - inputs) / (a0 - inputs), f, f / f0, t, t / t0,
                  double(N) / t, u, u / u0);
    }
  }
  return 0;
}
