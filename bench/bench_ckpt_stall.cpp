// The training stall per checkpoint save, with async saving off and on, side by side
// (engine/checkpointer.h). One process, one rank, a GPT-2 shape (default: 124M, T=64, B=1).
//
//   bench_ckpt_stall [--d 768] [--layers 12] [--heads 12] [--vocab 50257] [--T 64] [--B 1]
//                    [--saves 3] [--every 2] [--threads 2] [--dir DIR]
//
// For each mode (sync; async; async with Checkpointer::reserve() called when the checkpointer
// is made): train `every` steps, save, repeat `saves` times, then `every` more steps (after
// one warm-up step). Cached host memory is returned to the OS before each mode, so the first
// async snapshot copies into fresh memory as in a new run.
// Columns:
//   stall/save   time the training thread spent in Checkpointer calls per save (sync: write
//                straight from the model's memory + fsync + commit; async: snapshot copy + the
//                commit at a later step, plus waiting for the previous write when it outlasts
//                `every` steps)
//   step         mean training step time with no background write in flight
//   step+bg      async only: the mean step time while a background write was in flight (the
//                writer competes with the training threads for cores and memory bandwidth)
//   cost/save    stall/save + (steps overlapped) * (step+bg - baseline step): the wall time a
//                save costs the run in total
//   first, later the stall of save() for the first save and the median of the later ones (the
//                first async snapshot pays the page faults of its fresh memory unless reserve()
//                faulted it in beforehand)
// The snapshot bytes and the write bandwidth of the sync save are printed too. Run on an
// otherwise idle machine; figures taken while other jobs run are noise.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/sharded_checkpoint.h"
#include "core/alloc.h"
#include "core/rng.h"
#include "engine/checkpointer.h"
#include "engine/clock.h"
#include "kernels/ops.h"
#include "kernels/threads.h"
#include "models/model.h"
#include "sharding/comm/group.h"
#include "sharding/sharded_model.h"

using namespace sw;
namespace fs = std::filesystem;

struct Result {
  double stall_per_save = 0, step_s = 0, step_bg_s = 0, cost_per_save = 0;
  double in_save = 0, in_commit = 0;  // stall split: save() calls vs poll()/finish() calls
  int bg_steps = 0;
  std::vector<double> save_stalls;  // each save() call's stall, in order
};

int main(int argc, char** argv) {
  int d = 768, layers = 12, heads = 12, vocab = 50257, T = 64, B = 1, saves = 3, every = 2;
  int threads = 2;
  std::string dir = (fs::temp_directory_path() / "sw_bench_ckpt_stall").string();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const char* v = argv[i + 1];
    if (a == "--d")
      d = std::atoi(v);
    else if (a == "--layers")
      layers = std::atoi(v);
    else if (a == "--heads")
      heads = std::atoi(v);
    else if (a == "--vocab")
      vocab = std::atoi(v);
    else if (a == "--T")
      T = std::atoi(v);
    else if (a == "--B")
      B = std::atoi(v);
    else if (a == "--saves")
      saves = std::atoi(v);
    else if (a == "--every")
      every = std::atoi(v);
    else if (a == "--threads")
      threads = std::atoi(v);
    else if (a == "--dir")
      dir = v;
    else {
      std::fprintf(stderr, "bench_ckpt_stall: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  set_num_threads(threads);
  ModelConfig mc;
  mc.type = "gpt2";
  mc.vocab_size = vocab, mc.n_layer = layers, mc.n_head = heads, mc.d_model = d, mc.seq_len = T;
  Model model = build_model(mc);
  ShardedModel sm(model, ops_for(Device::cpu()), 1);
  const GroupPtr g = make_local_group();
  std::vector<int32_t> tok(size_t(B) * T), tgt(size_t(B) * T);
  for (size_t i = 0; i < tok.size(); ++i)
    tok[i] = int32_t(rng_bits(1, 0, i) % vocab), tgt[i] = int32_t(rng_bits(2, 0, i) % vocab);
  const Batch batch{tok.data(), tgt.data(), B, T};
  AdamWParams adam;
  int step = 0;
  auto train_step = [&] {
    const auto t0 = Clock::now();
    sm.zero_grads();
    sm.forward_backward(batch, 1.f);
    sm.optimizer_step(adam, 1e-4f, 1.f, ++step);
    return seconds_since(t0);
  };
  train_step();  // warm-up
  std::printf(
      "bench_ckpt_stall: gpt2 d=%d layers=%d vocab=%d T=%d B=%d (%.1fM params), "
      "%d saves every %d steps, threads=%d, dir %s\n",
      d, layers, vocab, T, B, sm.num_params() / 1e6, saves, every, threads, dir.c_str());
  {  // one in-memory snapshot on its own (async saving's floor): fresh memory, then reused
    TrainState st;
    release_cached();
    auto t0 = Clock::now();
    SnapshotPtr snap = snapshot_checkpoint(sm, st);
    const double fresh = seconds_since(t0);
    t0 = Clock::now();
    snap = snapshot_checkpoint(sm, st, std::move(snap));
    const double reused = seconds_since(t0);
    std::printf("snapshot %.1f MB: %.3f s into fresh memory (%.2f GB/s), %.3f s reused (%.2f GB/s)\n",
                snapshot_bytes(*snap) / 1e6, fresh, snapshot_bytes(*snap) / 1e9 / fresh, reused,
                snapshot_bytes(*snap) / 1e9 / reused);
  }
  double snap_bytes = 0, sync_write_s = 0;
  Result res[3];
  const char* names[3] = {"sync", "async", "async+reserve"};
  for (int mode = 0; mode < 3; ++mode) {
    const bool async = mode >= 1;
    fs::remove_all(dir);
    release_cached();  // fresh memory for this mode's first snapshot, as in a new run
    Checkpointer ck(dir, 2, async, *g);
    if (mode == 2) ck.reserve(sm);
    Result& r = res[mode];
    double stall = 0, plain = 0, bg = 0;
    int last_saved = 0;
    int n_plain = 0, n_bg = 0;
    for (int s = 0; s <= saves; ++s) {  // every save is followed by `every` steps
      for (int k = 0; k < every; ++k) {
        const CkptEvents ev = ck.poll();
        const bool in_flight = ck.pending();  // (the writer may finish during the step)
        stall += ev.stall_s;
        r.in_commit += ev.stall_s;
        const double dt = train_step();
        if (in_flight)
          bg += dt, ++n_bg;
        else
          plain += dt, ++n_plain;
      }
      if (s == saves) break;
      TrainState st;
      st.step = last_saved = step;
      const auto t0 = Clock::now();
      const CkptEvents ev = ck.save(sm, st);
      stall += ev.stall_s;
      r.in_save += ev.stall_s;
      r.save_stalls.push_back(ev.stall_s);
      if (!async) sync_write_s += seconds_since(t0);
      if (ev.failed >= 0) {
        std::fprintf(stderr, "bench_ckpt_stall: save failed: %s\n", ev.error.c_str());
        return 1;
      }
    }
    const double fin = ck.finish().stall_s;
    stall += fin;
    r.in_commit += fin;
    if (!async) {
      snap_bytes = 0;
      for (const auto& e :
           fs::recursive_directory_iterator(fs::path(dir) / ("step_" + std::to_string(last_saved))))
        if (e.is_regular_file()) snap_bytes += double(e.file_size());
    }
    r.stall_per_save = stall / saves;
    r.step_s = n_plain ? plain / n_plain : 0;
    r.step_bg_s = n_bg ? bg / n_bg : 0;
    r.bg_steps = n_bg;
    r.cost_per_save = r.stall_per_save;
  }
  // Baseline step time: async mode's steps with no writer in flight, else sync mode's.
  const double base = res[1].step_s > 0 ? res[1].step_s : res[0].step_s;
  for (int mode = 1; mode < 3; ++mode)
    if (res[mode].bg_steps > 0)
      res[mode].cost_per_save += (res[mode].step_bg_s - base) * res[mode].bg_steps / saves;
  std::printf(
      "checkpoint bytes %.1f MB; sync save %.2f s each (%.0f MB/s incl. fsync and "
      "commit)\n",
      snap_bytes / 1e6, sync_write_s / saves, snap_bytes / 1e6 / (sync_write_s / saves));
  std::printf("%-14s %12s %10s %10s %12s %10s %10s\n", "mode", "stall/save", "step", "step+bg",
              "cost/save", "first", "later");
  for (int mode = 0; mode < 3; ++mode) {
    const Result& r = res[mode];
    char bgs[32] = "-";
    if (mode >= 1 && r.bg_steps > 0) std::snprintf(bgs, sizeof bgs, "%.3f s", r.step_bg_s);
    std::vector<double> later(r.save_stalls.begin() + (r.save_stalls.empty() ? 0 : 1), r.save_stalls.end());
    std::sort(later.begin(), later.end());
    std::printf("%-14s %10.3f s %8.3f s %10s %10.3f s %8.3f s %8.3f s\n", names[mode],
                r.stall_per_save, r.step_s, bgs, r.cost_per_save,
                r.save_stalls.empty() ? 0.0 : r.save_stalls[0], later.empty() ? 0.0 : later[later.size() / 2]);
  }
  std::printf(
      "async stall split per save: %.3f s in save() (snapshot, and any wait for the previous "
      "write), %.3f s in poll()/finish() (commit: metadata, fsync, rename, latest)\n",
      res[1].in_save / saves, res[1].in_commit / saves);
  std::printf("async/sync stall ratio %.3f; cost ratio %.3f\n",
              res[1].stall_per_save / res[0].stall_per_save,
              res[1].cost_per_save / res[0].cost_per_save);
  fs::remove_all(dir);
  return 0;
}
