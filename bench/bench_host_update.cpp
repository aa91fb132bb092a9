// The host optimizer beside the device (offload_optimizer cpu on a device): how much of the
// CPU's AdamW the step hides behind the device's work, on the simulated accelerator
// (tests/common/sim_device.h), whose arithmetic is the CPU's. One core is the "device" (the
// calling thread computes with 1 thread), the other the host updater thread, so the two can
// overlap as a GPU and the host's cores do.
//
//   bench_host_update [--d 256] [--layers 8] [--heads 4] [--vocab 8192] [--T 16] [--B 1]
//                     [--steps 5] [--rounds 4]
//
// Two models train side by side, alternating rounds of `steps` steps: one with the updates on
// the host updater thread (the default), one with each update waited for where it is issued
// (SHARDWISE_HOST_UPDATE_ASYNC=0, the synchronous split). The synchronous model's step is
// also split into forward (timed as an eval forward), backward and optimizer. Limit: the next
// forward needs each unit's update and the updates need the whole backward (clipping reads the
// global norm), so a step takes at least backward + max(forward, optimizer) + the rest (norm,
// zeroing); the synchronous split takes backward + forward + optimizer + the rest. Prints
// medians, the share of the possible gain the host updater reached, and the updates' own time
// on the updater thread alone and beside the device's work (ShardedModel::host_update_seconds).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/rng.h"
#include "kernels/ops.h"
#include "kernels/threads.h"
#include "models/model.h"
#include "sharding/comm/group.h"
#include "sharding/sharded_model.h"

using namespace sw;
using Clock = std::chrono::steady_clock;

namespace {
double secs(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  int d = 256, layers = 8, heads = 4, vocab = 8192, T = 16, B = 1, steps = 5, rounds = 4;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (k == "--d") d = v;
    else if (k == "--layers") layers = v;
    else if (k == "--heads") heads = v;
    else if (k == "--vocab") vocab = v;
    else if (k == "--T") T = v;
    else if (k == "--B") B = v;
    else if (k == "--steps") steps = v;
    else if (k == "--rounds") rounds = v;
    else {
      std::fprintf(stderr, "bench_host_update: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  setenv("SHARDWISE_SIM_GUARD", "0", 0);  // no mprotect per op: the CPU's speed (sim_device.h)
  set_num_threads(1);  // the "device": one core; the host updater inherits 1 thread
  ModelConfig mc;
  mc.type = "gpt2";
  mc.d_model = d;
  mc.n_layer = layers;
  mc.n_head = heads;
  mc.vocab_size = vocab;
  mc.seq_len = T;
  ShardingPolicy pol = ShardingPolicy::for_strategy(ShardingStrategy::FullShard);
  pol.offload_optimizer.device = OffloadDevice::Cpu;
  const Ops& sim = ops_for(Device::sim(0));
  std::vector<int32_t> tok(size_t(B) * T), tgt(size_t(B) * T);
  Rng r(5);
  for (auto& t : tok) t = static_cast<int32_t>(r.below(uint64_t(vocab)));
  for (auto& t : tgt) t = static_cast<int32_t>(r.below(uint64_t(vocab)));
  const Batch batch{tok.data(), tgt.data(), B, T};

  Model m_async = build_model(mc), m_sync = build_model(mc);
  unsetenv("SHARDWISE_HOST_UPDATE_ASYNC");
  ShardedModel a(m_async, sim, 1, make_local_group(), pol);
  setenv("SHARDWISE_HOST_UPDATE_ASYNC", "0", 1);
  ShardedModel s(m_sync, sim, 1, make_local_group(), pol);
  unsetenv("SHARDWISE_HOST_UPDATE_ASYNC");
  AdamWParams ap;
  int step_a = 0, step_s = 0;
  std::vector<double> t_async, t_sync, t_fb, t_opt, t_fwd;
  double loss_a = 0, loss_s = 0;
  for (int round = 0; round <= rounds; ++round) {  // round 0 warms up
    {
      const auto t0 = Clock::now();
      for (int k = 0; k < steps; ++k) {
        a.zero_grads();
        loss_a = a.forward_backward(batch);
        const double n = a.grad_norm();
        a.optimizer_step(ap, 1e-3f, n > 1 ? float(1 / n) : 1.f, ++step_a);
      }
      a.grad_norm();  // waits for the last updates (it reads every gradient shard)
      if (round > 0) t_async.push_back(secs(t0, Clock::now()) / steps);
    }
    {
      double fb = 0, opt = 0;
      const auto t0 = Clock::now();
      for (int k = 0; k < steps; ++k) {
        const auto f0 = Clock::now();
        s.zero_grads();
        loss_s = s.forward_backward(batch);
        const double n = s.grad_norm();
        const auto o0 = Clock::now();
        s.optimizer_step(ap, 1e-3f, n > 1 ? float(1 / n) : 1.f, ++step_s);
        const auto o1 = Clock::now();
        fb += secs(f0, o0);
        opt += secs(o0, o1);
      }
      if (round > 0) {
        t_sync.push_back(secs(t0, Clock::now()) / steps);
        t_fb.push_back(fb / steps);
        t_opt.push_back(opt / steps);
        const auto e0 = Clock::now();
        for (int k = 0; k < steps; ++k) s.eval_loss(batch);
        t_fwd.push_back(secs(e0, Clock::now()) / steps);
      }
    }
  }
  const double ta = median(t_async), ts = median(t_sync), fb = median(t_fb), op = median(t_opt);
  // The updates' own time on the updater thread, per step: alone (the synchronous model's,
  // where nothing else runs meanwhile) and beside the device's work.
  const double job_s = s.host_update_seconds() / step_s, job_a = a.host_update_seconds() / step_a;
  const double fwd = std::min(median(t_fwd), fb), bwd = fb - fwd, rest = std::max(0.0, ts - fb - op);
  // The next forward needs each unit's update, the update needs the whole backward (clipping
  // uses the global norm): a step takes at least backward + max(forward, optimizer) + the rest.
  const double limit = bwd + std::max(fwd, op) + rest;
  std::printf("bench_host_update: GPT-2 d=%d layers=%d vocab=%d, B=%d T=%d, %lld parameters, "
              "sim device (1 core) + host updater (1 core)\n",
              d, layers, vocab, B, T, static_cast<long long>(a.num_params()));
  std::printf("  synchronous split: forward %.2f ms (eval), backward %.2f ms, optimizer %.2f ms, "
              "rest %.2f ms\n", fwd * 1e3, bwd * 1e3, op * 1e3, rest * 1e3);
  std::printf("  step: synchronous %.2f ms, host updater %.2f ms, limit %.2f ms "
              "(backward + max(forward, optimizer) + rest)\n", ts * 1e3, ta * 1e3, limit * 1e3);
  std::printf("  async/sync %.3f, limit/sync %.3f, share of the possible gain reached %.0f%%\n",
              ta / ts, limit / ts, ts > limit ? 100.0 * (ts - ta) / (ts - limit) : 0.0);
  std::printf("  the updates' own time per step: %.2f ms alone, %.2f ms beside the device's work "
              "(x%.2f)\n", job_s * 1e3, job_a * 1e3,
              job_a / job_s);
  std::printf("  losses equal: %s (%.6f, %.6f)\n", loss_a == loss_s ? "yes" : "NO", loss_a, loss_s);
  return loss_a == loss_s ? 0 : 1;
}
