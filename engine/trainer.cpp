// The training loop (world size 1 for now; the sharding issue adds ranks behind ShardedModel).
//
// Per optimizer step s (0-based):
//   zero grads; for k in 0..accum-1: rows (k*world + rank)*B .. +B of step s (engine/data.h)
//   -> forward_backward(batch, 1/accum)
//   (so the accumulated gradient is that of the mean loss over the step's micro-batches);
//   clip factor min(1, clip / (norm + 1e-6)); lr = lr_at(s); AdamW step s + 1;
//   metrics line; validation on eval steps.
#include "engine/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "checkpoint/export.h"
#include "core/alloc.h"
#include "core/error.h"
#include "engine/data.h"
#include "engine/metrics.h"
#include "engine/schedule.h"
#include "kernels/ops.h"
#include "kernels/threads.h"
#include "models/model.h"
#include "sharding/sharded_model.h"

namespace sw {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

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

[[noreturn]] void non_finite(const char* what, double v, int step, const std::string& detail) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  fail("train", std::string("non-finite ") + what + " (" + buf + ") at step " +
                    std::to_string(step) + detail +
                    "; stopping (lower optimizer.params.lr or set gradient_clipping; files already "
                    "written in run_dir are kept, the weights of this run are not exported)");
}

}  // namespace

TrainSummary train(const TrainConfig& cfg_in, const TrainOptions& opts) {
  // A TrainConfig built in code gets the same validation as one read from a file.
  const std::string source = cfg_in.source.empty() ? "TrainConfig" : cfg_in.source;
  TrainConfig cfg = parse_config(config_json(cfg_in), source);
  cfg.resolved_json = cfg_in.resolved_json.empty() ? config_json(cfg_in) : cfg_in.resolved_json;
  for (const std::string& n : cfg_in.notes) std::fprintf(stderr, "%s\n", n.c_str());
  if (cfg.train_data.empty())
    fail("config", source +
                       ": data.train: required for training (an llm.c-format token file, see "
                       "`shardwise data prepare`)");

  set_num_threads(cfg.threads);
  prepare_run_dir(cfg.run_dir);
  const fs::path run_dir(cfg.run_dir);
  write_text((run_dir / "config.json").string(), cfg.resolved_json);

  const int B = cfg.micro_batch, T = cfg.model.seq_len, accum = cfg.grad_accum;
  const int V = cfg.model.vocab_size;
  const TokenFile train_data(cfg.train_data, V, int64_t{T} + 1);
  std::unique_ptr<TokenFile> val_data;
  if (!cfg.val_data.empty())
    val_data = std::make_unique<TokenFile>(cfg.val_data, V, int64_t{T} + 1);

  MemTracker::global().reset_peaks();  // peak_mem_bytes is this run's peak
  Model model = build_model(cfg.model);
  ShardedModel sm(model, ops_for(Device::cpu()), cfg.seed);

  MetricsLog metrics((run_dir / "metrics.jsonl").string());
  Progress progress(cfg.train_steps, cfg.log_every_steps, opts.progress);

  std::vector<int32_t> inputs(static_cast<size_t>(B) * T), targets(static_cast<size_t>(B) * T);
  const Batch batch{inputs.data(), targets.data(), B, T};
  AdamWParams adam;
  adam.lr = cfg.optimizer.lr;
  adam.beta1 = cfg.optimizer.beta1;
  adam.beta2 = cfg.optimizer.beta2;
  adam.eps = cfg.optimizer.eps;
  adam.weight_decay = cfg.optimizer.weight_decay;
  const int world = 1;
  const double tokens_per_step = static_cast<double>(B) * T * accum * world;

  auto evaluate = [&](int step) {
    double sum = 0;
    for (int i = 0; i < cfg.eval_batches; ++i) {
      eval_batch(*val_data, i, cfg.eval_batches, B, T, inputs.data(), targets.data());
      const double l = sm.eval_loss(batch);
      if (!std::isfinite(l))
        non_finite("validation loss", l, step, " (eval batch " + std::to_string(i) + ")");
      sum += l;
    }
    return sum / cfg.eval_batches;
  };

  TrainSummary summary;
  summary.unigram_entropy = train_data.unigram_entropy();
  double timed_s = 0, timed_tokens = 0;  // steps after the first
  const auto t_start = Clock::now();
  for (int s = 0; s < cfg.train_steps; ++s) {
    const auto t0 = Clock::now();
    sm.zero_grads();
    double loss = 0;
    for (int k = 0; k < accum; ++k) {
      const int rank = 0;
      train_batch(train_data, cfg.seed, s, (int64_t{k} * world + rank) * B, B, T, inputs.data(),
                  targets.data());
      const double l = sm.forward_backward(batch, 1.0f / static_cast<float>(accum));
      if (!std::isfinite(l)) {
        StepMetrics m;
        m.step = s + 1, m.loss = l, m.lr = lr_at(cfg.optimizer, cfg.scheduler, cfg.train_steps, s);
        m.grad_norm = NAN, m.peak_mem_bytes = MemTracker::global().total_peak();
        metrics.write(m);
        progress.finish();
        non_finite("loss", l, s + 1, accum > 1 ? " (micro-step " + std::to_string(k) + ")" : "");
      }
      loss += l;
    }
    loss /= accum;
    const double norm = sm.grad_norm();
    const float lr = lr_at(cfg.optimizer, cfg.scheduler, cfg.train_steps, s);
    if (!std::isfinite(norm)) {
      StepMetrics m;
      m.step = s + 1, m.loss = loss, m.lr = lr, m.grad_norm = norm;
      m.peak_mem_bytes = MemTracker::global().total_peak();
      metrics.write(m);
      progress.finish();
      non_finite("gradient norm", norm, s + 1, "");
    }
    const float mult =
        cfg.grad_clip > 0 ? static_cast<float>(std::min(1.0, cfg.grad_clip / (norm + 1e-6))) : 1.f;
    sm.optimizer_step(adam, lr, mult, s + 1);
    const double dt = seconds_since(t0);

    StepMetrics m;
    m.step = s + 1;
    m.loss = loss;
    m.lr = lr;
    m.grad_norm = norm;
    m.step_time_s = dt;
    m.tokens_per_s = dt > 0 ? tokens_per_step / dt : 0;
    const bool last = s + 1 == cfg.train_steps;
    if (val_data && (last || (cfg.eval_every_steps > 0 && (s + 1) % cfg.eval_every_steps == 0))) {
      m.val_loss = evaluate(s + 1);
      m.has_val = true;
      summary.last_val_loss = m.val_loss;
    }
    m.peak_mem_bytes = MemTracker::global().total_peak();
    metrics.write(m);
    progress.update(m, seconds_since(t_start));

    if (s > 0) timed_s += dt, timed_tokens += tokens_per_step;
    if (cfg.train_steps == 1) timed_s = dt, timed_tokens = tokens_per_step;
    summary.steps = s + 1;
    summary.last_loss = loss;
  }
  progress.finish();
  summary.tokens_per_s = timed_s > 0 ? timed_tokens / timed_s : 0;

  if (opts.export_weights) {
    summary.weights_path = (run_dir / "model.safetensors").string();
    export_hf_safetensors(sm, summary.weights_path);
  }
  return summary;
}

}  // namespace sw
