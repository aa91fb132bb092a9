// The training loop over the ranks of world_group() (one process without mpirun; N ranks
// under `mpirun -np N shardwise train`), each holding a ShardedModel shard as the config's
// sharding policy says.
//
// Per optimizer step s (0-based), on every rank r of W:
//   zero grads; for k in 0..accum-1: rows (k*W + r)*B .. +B of step s (engine/data.h)
//   -> forward_backward(batch, 1/accum, last = k == accum-1)
//   (each rank's gradient is that of its mean loss; ShardedModel averages over ranks, so the
//   result is the gradient of the mean loss over the global batch: N ranks train exactly
//   what one rank with micro-batch N*B would);
//   loss = sum over ranks / (W * accum); clip factor min(1, clip / (norm + 1e-6)) with the
//   global norm; lr = lr_at(a), AdamW step a + 1 with a = optimizer steps applied so far (= s
//   unless fp16 skipped overflowing steps, see below); validation on eval steps over
//   eval_batches * W batches of B rows, split over the ranks (the windows one rank with
//   micro-batch W*B would evaluate).
// Rank 0 alone writes run_dir (config.json, metrics.jsonl, the exported weights) and prints.
//
// Mixed precision: the sharding policy's mixed_precision (from bf16/fp16) makes ShardedModel
// gather and compute in bf16/fp16 and reduce gradients in reduce_dtype; masters and AdamW stay
// fp32. fp16 adds loss scaling (engine/loss_scaler.h): forward_backward gets grad_scale =
// scale / accum; the global gradient norm (reduced identically on every rank) decides
// overflow: non-finite -> the step is skipped (gradients dropped, weights and AdamW state
// untouched) and the scaler lowers the scale; otherwise the gradients are unscaled through
// AdamW's grad_mult (1/scale times the clip factor, which is computed on the unscaled norm).
// As in DeepSpeed (engine._take_model_step), a skipped step consumes its batch but does not
// advance the LR schedule nor AdamW's step count: both count applied steps only.
// Without fp16, a non-finite gradient norm stays an error.
//
// Checkpoints (engine/checkpointer.h): with checkpoint.every_steps = E > 0, a save follows
// every step s+1 that is a multiple of E, and the last step when checkpoint.save_final. The
// saved TrainState holds the step count; the batches (engine/data.h), the LR and AdamW's bias
// correction are functions of the step, and the model state is the checkpoint's, so a run
// resumed at step N computes exactly what the uninterrupted run computed from step N on.
// Async saves are committed at the first step start where every rank's writer is done (one
// tiny all-reduce per step while a save is pending), and before the next save or the end.
// A failed periodic save prints one warning line per failing rank, is recorded in
// metrics.jsonl (ckpt_failed) and training goes on (the previous checkpoint and `latest` are
// unchanged); a failed final save is an error (exit 1) since the run ends without the state
// the user asked for.
//
// Errors with several ranks: an error every rank reaches together (a non-finite loss or
// gradient norm, decided on reduced values) is printed once by rank 0, then every rank ends;
// an error on some ranks only is printed with its rank and the job is aborted (comm_abort),
// so no rank is left waiting in a collective.
#include "engine/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "checkpoint/export.h"
#include "checkpoint/sharded_checkpoint.h"
#include "core/alloc.h"
#include "core/error.h"
#include "engine/clock.h"
#include "engine/checkpointer.h"
#include "engine/data.h"
#include "engine/loss_scaler.h"
#include "engine/metrics.h"
#include "engine/schedule.h"
#include "kernels/ops.h"
#include "kernels/threads.h"
#include "models/model.h"
#include "sharding/comm/group.h"
#include "sharding/sharded_model.h"
#include "sharding/wrap.h"

namespace sw {

namespace fs = std::filesystem;

namespace {

// Creates run_dir if needed and proves it is writable, before any work is done.
void prepare_run_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("train", "run_dir '" + dir + "': cannot create it (" + ec.message() + ")");
  if (!fs::is_directory(dir, ec))
    fail("train", "run_dir '" + dir + "': exists and is not a directory");
  const std::string probe = (fs::path(dir) / ".shardwise-write-test").string();
  FILE* f = std::fopen(probe.c_str(), "w");
  if (!f) fail("train", "run_dir '" + dir + "': not writable (" + std::strerror(errno) + ")");
  std::fclose(f);
  std::remove(probe.c_str());
}

void write_text(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) fail("train", path + ": cannot write (" + std::strerror(errno) + ")");
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok || std::rename(tmp.c_str(), path.c_str()) != 0)
    fail("train", path + ": write failed (" + std::strerror(errno) + ")");
}

// An error that every rank raises at the same point (decided on values reduced over ranks).
struct CollectiveError : Error {
  using Error::Error;
};

[[noreturn]] void non_finite(const char* what, double v, int step, const std::string& detail) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  throw CollectiveError("train: non-finite " + std::string(what) + " (" + buf + ") at step " +
                        std::to_string(step) + detail +
                        "; stopping (lower optimizer.params.lr or set gradient_clipping; files "
                        "already written in run_dir are kept, the weights of this run are not "
                        "exported)");
}

// Sum of one double per rank, in rank order (identical on every rank).
double sum_over_ranks(Group& g, double x) {
  if (g.size() == 1) return x;
  std::vector<double> all(static_cast<size_t>(g.size()));
  g.all_gather(&x, all.data(), 2, DType::F32);  // the 8 bytes, raw
  double s = 0;
  for (double v : all) s += v;
  return s;
}

// Ranks per node as the launcher tells it (HYBRID_SHARD's default shard group); 0 if unknown.
int local_ranks() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (const char* v = std::getenv(var))
      if (std::atoi(v) >= 1) return std::atoi(v);
  return 0;
}

TrainSummary train_ranks(const TrainConfig& cfg, const TrainOptions& opts, Group& world,
                         GroupPtr world_ptr);

}  // namespace

TrainSummary train(const TrainConfig& cfg_in, const TrainOptions& opts) {
  // A TrainConfig built in code gets the same validation as one read from a file.
  const std::string source = cfg_in.source.empty() ? "TrainConfig" : cfg_in.source;
  TrainConfig cfg = parse_config(config_json(cfg_in), source);
  cfg.resolved_json = cfg_in.resolved_json.empty() ? config_json(cfg_in) : cfg_in.resolved_json;
  if (cfg.train_data.empty())
    fail("config", source +
                       ": data.train: required for training (an llm.c-format token file, see "
                       "`shardwise data prepare`)");

  const GroupPtr world = world_group();
  if (world->size() == 1) {
    for (const std::string& n : cfg_in.notes) std::fprintf(stderr, "%s\n", n.c_str());
    return train_ranks(cfg, opts, *world, world);
  }
  try {
    if (world->rank() == 0)
      for (const std::string& n : cfg_in.notes) std::fprintf(stderr, "%s\n", n.c_str());
    return train_ranks(cfg, opts, *world, world);
  } catch (const CollectiveError& e) {
    if (world->rank() == 0) std::fprintf(stderr, "shardwise: error: %s\n", e.what());
    std::fflush(stderr);
    world->barrier();  // rank 0 has printed before anyone ends the job
    comm_abort(1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardwise: error: rank %d: %s\n", world->rank(), e.what());
    std::fflush(stderr);
    comm_abort(1);
  }
}

namespace {

TrainSummary train_ranks(const TrainConfig& cfg, const TrainOptions& opts, Group& world,
                         GroupPtr world_ptr) {
  const int W = world.size(), rank = world.rank();
  const bool lead = rank == 0;  // writes run_dir, prints
  if (cfg.comm_timeout_s > 0) world.set_timeout(cfg.comm_timeout_s);
  if (cfg.comm_debug) world.set_debug(true);

  set_num_threads(cfg.threads);
  const fs::path run_dir(cfg.run_dir);
  if (lead) {
    prepare_run_dir(cfg.run_dir);
    write_text((run_dir / "config.json").string(), cfg.resolved_json);
  }

  const int B = cfg.micro_batch, T = cfg.model.seq_len, accum = cfg.grad_accum;
  const int V = cfg.model.vocab_size;
  const TokenFile train_data(cfg.train_data, V, int64_t{T} + 1);
  std::unique_ptr<TokenFile> val_data;
  if (!cfg.val_data.empty())
    val_data = std::make_unique<TokenFile>(cfg.val_data, V, int64_t{T} + 1);

  TrainSummary summary;
  // memory_budget: checked from the first parameter allocation on, lifted when the run ends.
  struct BudgetScope {
    explicit BudgetScope(size_t b) { MemTracker::global().set_budget(b); }
    ~BudgetScope() { MemTracker::global().set_budget(0); }
  } budget_scope(cfg.memory_budget);
  MemTracker::global().reset_peaks();  // peak_mem_bytes is this run's peak
  Model model = build_model(cfg.model);
  wrap_blocks(model, cfg.blocks_per_unit);
  ShardingPolicy policy = cfg.sharding;
  if (policy.strategy == ShardingStrategy::HybridShard && policy.shard_group_size == 0) {
    const int local = local_ranks();  // FSDP's default: shard within a node
    policy.shard_group_size = local > 0 && W % local == 0 ? local : W;
  }
  ShardedModel sm(model, ops_for(Device::cpu()), cfg.seed, world_ptr, policy);

  LossScaler scaler(cfg.loss_scaler);  // used with fp16 only
  // Optimizer steps applied; the others (s + 1 - applied after step s) were skipped on overflow.
  int applied = 0;

  // Where the run starts: a checkpoint (resume), exported weights (init_from), or the init.
  const CheckpointConfig& ck = cfg.checkpoint;
  int start = 0;
  const std::string resume_dir = resolve_resume(ck.resume, ck.dir);
  if (!resume_dir.empty()) {
    const TrainState st = load_checkpoint(sm, resume_dir);
    if (st.seed != cfg.seed)
      fail("resume", resume_dir + ": saved by a run with seed " + std::to_string(st.seed) +
                         ", this config has seed " + std::to_string(cfg.seed) +
                         " (the data order depends on it; set seed to match)");
    if (st.step > cfg.train_steps)
      fail("resume", resume_dir + ": is at step " + std::to_string(st.step) +
                         ", beyond train_steps (" + std::to_string(cfg.train_steps) + ")");
    if (cfg.fp16 && st.loss_scale > 0) {  // the loss scaler continues where it was
      scaler.scale = st.loss_scale;
      scaler.good_steps = st.scaler_good_steps;
      scaler.hysteresis_left = st.scaler_hysteresis_left;
    }
    start = static_cast<int>(st.step);
    applied = static_cast<int>(st.optimizer_steps);
    summary.resumed_from = resume_dir;
    if (lead)
      std::fprintf(stderr, "shardwise: resumed from %s at step %d\n", resume_dir.c_str(), start);
  } else if (ck.resume == "auto" && lead) {
    std::fprintf(stderr, "shardwise: no checkpoint in %s yet; starting at step 0\n",
                 ck.dir.c_str());
  }
  if (!ck.init_from.empty()) {
    import_safetensors(sm, ck.init_from);
    if (lead) std::fprintf(stderr, "shardwise: initialised from %s\n", ck.init_from.c_str());
  }
  summary.start_step = start;
  std::unique_ptr<Checkpointer> ckpt;
  if (ck.every_steps > 0)
    ckpt = std::make_unique<Checkpointer>(ck.dir, ck.keep_last, ck.async, world);
  auto train_state = [&](int step) {
    TrainState st;
    st.step = step;
    st.seed = cfg.seed;
    st.optimizer_steps = applied;
    if (cfg.fp16) {
      st.loss_scale = scaler.scale;
      st.scaler_good_steps = scaler.good_steps;
      st.scaler_hysteresis_left = scaler.hysteresis_left;
    }
    st.config_json = cfg.resolved_json;
    return st;
  };
  CkptEvents ckpt_since_line;  // checkpoint work not yet reported in metrics.jsonl
  bool ckpt_activity = false;
  auto note_ckpt = [&](const CkptEvents& ev) {
    ckpt_activity = true;
    ckpt_since_line.add(ev);
    summary.ckpt_stall_s += ev.stall_s;
    if (ev.committed >= 0) ++summary.checkpoints_saved, summary.last_checkpoint = ev.committed;
    if (ev.failed >= 0) {
      ++summary.checkpoints_failed;
      if (!ev.error.empty()) {
        std::string who = W > 1 ? "rank " + std::to_string(rank) + ": " : "";
        std::fprintf(stderr,
                     "shardwise: warning: %scheckpoint %s not saved: %s; the previous "
                     "checkpoints and 'latest' are unchanged\n",
                     who.c_str(), Checkpointer::step_name(ev.failed).c_str(), ev.error.c_str());
      }
    }
  };

  std::unique_ptr<MetricsLog> metrics;
  if (lead)
    metrics = std::make_unique<MetricsLog>((run_dir / "metrics.jsonl").string(),
                                           resume_dir.empty() ? -1 : start);
  auto write_metrics = [&](const StepMetrics& m) {
    if (metrics) metrics->write(m);
  };
  Progress progress(cfg.train_steps, cfg.log_every_steps, opts.progress && lead, stderr, -1,
                    start);

  std::vector<int32_t> inputs(static_cast<size_t>(B) * T), targets(static_cast<size_t>(B) * T);
  const Batch batch{inputs.data(), targets.data(), B, T};
  AdamWParams adam;
  adam.lr = cfg.optimizer.lr;
  adam.beta1 = cfg.optimizer.beta1;
  adam.beta2 = cfg.optimizer.beta2;
  adam.eps = cfg.optimizer.eps;
  adam.weight_decay = cfg.optimizer.weight_decay;
  const double tokens_per_step = static_cast<double>(B) * T * accum * W;

  // Validation on eval_batches * W batches of B rows (the same windows one rank with
  // micro-batch W*B evaluates in eval_batches batches); rank r takes batches r, r+W, ...
  auto evaluate = [&](int step) {
    const int n = cfg.eval_batches * W;
    double sum = 0;
    int first_bad = -1;
    for (int i = rank; i < n; i += W) {
      eval_batch(*val_data, i, n, B, T, inputs.data(), targets.data());
      const double l = sm.eval_loss(batch);
      if (!std::isfinite(l) && first_bad < 0) first_bad = i;
      sum += l;
    }
    const double total = sum_over_ranks(world, sum);
    if (!std::isfinite(total))
      non_finite("validation loss", total, step,
                 first_bad >= 0 ? " (eval batch " + std::to_string(first_bad) + ")" : "");
    return total / n;
  };

  summary.unigram_entropy = train_data.unigram_entropy();
  double timed_s = 0, timed_tokens = 0;  // steps after the first
  const auto t_start = Clock::now();
  for (int s = start; s < cfg.train_steps; ++s) {
    if (ckpt && ckpt->pending()) note_ckpt(ckpt->poll());
    const auto t0 = Clock::now();
    const CpuUsage u0 = cpu_usage();
    const CommStats c0 = sm.comm_stats();
    sm.zero_grads();
    double loss = 0;
    int bad_micro = -1;  // first micro-step with a non-finite loss on this rank
    const double loss_scale = cfg.fp16 ? scaler.scale : 1.0;
    for (int k = 0; k < accum; ++k) {
      train_batch(train_data, cfg.seed, s, (int64_t{k} * W + rank) * B, B, T, inputs.data(),
                  targets.data());
      const double l = sm.forward_backward(
          batch, static_cast<float>(loss_scale / static_cast<double>(accum)), k + 1 == accum);
      if (!std::isfinite(l) && bad_micro < 0) bad_micro = k;
      loss += l;
    }
    loss = sum_over_ranks(world, loss) / (static_cast<double>(accum) * W);
    const float lr = lr_at(cfg.optimizer, cfg.scheduler, cfg.train_steps, applied);
    if (!std::isfinite(loss)) {
      StepMetrics m;
      m.step = s + 1, m.loss = loss, m.lr = lr;
      m.grad_norm = NAN, m.peak_mem_bytes = MemTracker::global().total_peak();
      write_metrics(m);
      progress.finish();
      std::string detail;
      if (bad_micro >= 0 && accum > 1) detail += " (micro-step " + std::to_string(bad_micro) + ")";
      non_finite("loss", loss, s + 1, detail);
    }
    const double norm = sm.grad_norm() / loss_scale;  // of the unscaled gradients
    const bool overflow = cfg.fp16 && !std::isfinite(norm);
    if (cfg.fp16) {
      try {
        scaler.update(overflow);
      } catch (const Error& e) {  // decided on the reduced norm: every rank is here
        throw CollectiveError(std::string(e.what()) + " (step " + std::to_string(s + 1) + ")");
      }
    }
    if (!overflow && !std::isfinite(norm)) {
      StepMetrics m;
      m.step = s + 1, m.loss = loss, m.lr = lr, m.grad_norm = norm;
      m.peak_mem_bytes = MemTracker::global().total_peak();
      write_metrics(m);
      progress.finish();
      non_finite("gradient norm", norm, s + 1, "");
    }
    if (overflow) {
      sm.zero_grads();  // the step is skipped: weights and AdamW state stay as they are
    } else {
      const double clip = cfg.grad_clip > 0 ? std::min(1.0, cfg.grad_clip / (norm + 1e-6)) : 1.0;
      sm.optimizer_step(adam, lr, static_cast<float>(clip / loss_scale), applied + 1);
      ++applied;
    }
    const double dt = seconds_since(t0);
    const CpuUsage u1 = cpu_usage();
    const CommStats c1 = sm.comm_stats();

    StepMetrics m;
    m.step = s + 1;
    m.loss = loss;
    m.lr = lr;
    m.grad_norm = norm;
    m.step_time_s = dt;
    m.tokens_per_s = dt > 0 ? tokens_per_step / dt : 0;
    m.comm_s = c1.comm_s - c0.comm_s;
    m.exposed_comm_s = c1.exposed_s - c0.exposed_s;
    m.overflow = overflow;
    m.skipped_steps = s + 1 - applied;
    set_cpu_usage(m, u0, u1);
    if (cfg.fp16) m.loss_scale = loss_scale;
    const bool last = s + 1 == cfg.train_steps;
    if (val_data && (last || (cfg.eval_every_steps > 0 && (s + 1) % cfg.eval_every_steps == 0))) {
      m.val_loss = evaluate(s + 1);
      m.has_val = true;
      summary.last_val_loss = m.val_loss;
    }
    m.peak_mem_bytes = MemTracker::global().total_peak();
    if (ckpt_activity) {
      m.ckpt_stall_s = ckpt_since_line.stall_s;
      m.ckpt_saved = ckpt_since_line.committed;
      m.ckpt_failed = ckpt_since_line.failed;
      ckpt_since_line = CkptEvents{};
      ckpt_activity = false;
    }
    write_metrics(m);
    progress.update(m, seconds_since(t_start));

    if (s > start) timed_s += dt, timed_tokens += tokens_per_step;
    if (cfg.train_steps - start == 1) timed_s = dt, timed_tokens = tokens_per_step;
    summary.steps = s + 1;
    summary.last_loss = loss;
    summary.skipped_steps = m.skipped_steps;
    summary.loss_scale = cfg.fp16 ? scaler.scale : 0;

    // Periodic save (the final one is below, after the loop).
    if (ckpt && !last && (s + 1) % ck.every_steps == 0)
      note_ckpt(ckpt->save(sm, train_state(s + 1)));
  }
  progress.finish();
  if (ckpt) {
    note_ckpt(ckpt->finish());  // a pending async save
    const bool periodic_last = cfg.train_steps % ck.every_steps == 0;
    const bool ran = start < cfg.train_steps;
    if (ran && (ck.save_final || periodic_last)) {
      CkptEvents ev = ckpt->save(sm, train_state(cfg.train_steps));
      ev.add(ckpt->finish());
      const bool failed = ev.failed >= 0;
      const std::string err = ev.error;
      ev.error.clear();  // reported below, as an error rather than a warning
      note_ckpt(ev);
      if (failed) {
        if (rank != 0 && !err.empty())  // rank 0 prints the collective error
          std::fprintf(stderr, "shardwise: error: rank %d: final checkpoint not saved: %s\n", rank,
                       err.c_str());
        throw CollectiveError("train: the final checkpoint " +
                              Checkpointer::step_name(cfg.train_steps) + " was not saved" +
                              (err.empty() ? " (see the ranks' messages)" : ": " + err) +
                              "; the previous checkpoints and 'latest' are unchanged");
      }
    }
  }
  summary.tokens_per_s = timed_s > 0 ? timed_tokens / timed_s : 0;

  if (opts.export_weights) {
    summary.weights_path = (run_dir / "model.safetensors").string();
    sm.gather_full_params(/*rank0_only=*/true);  // collective; then rank 0 writes alone
    if (lead) export_hf_safetensors(sm, summary.weights_path);
    sm.release_full_params();
  }
  return summary;
}

}  // namespace

}  // namespace sw
