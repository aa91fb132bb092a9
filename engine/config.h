// A training run's configuration, read from JSON with DeepSpeed's key names where the meaning
// is the same (train_micro_batch_size_per_gpu, gradient_accumulation_steps, optimizer{type,
// params}, scheduler{type, params}, gradient_clipping, bf16/fp16, zero_optimization) and FSDP's
// where DeepSpeed has none. Every key is validated: unknown keys (with the closest valid key
// suggested), wrong types and out-of-range values throw sw::Error naming the file and key path.
//
// Every key is declared once (engine/config_schema.cpp: type, range or choices, default, one
// line of description, the TrainConfig field it sets). The files that act on the declaration:
//   config_values.cpp    a key's kind, range or choices, and the message a value outside gets
//   config_text.cpp      JSON text with positions, --set overrides, messages and suggestions
//   config_reader.cpp    JSON -> TrainConfig through the declaration, plus the rules of reading
//                        (aliases, "auto", forms of their own, keys that exclude each other)
//   config_validate.cpp  the checks every TrainConfig passes, read or built in code
//   config_writer.cpp    TrainConfig -> the resolved JSON through the declaration
//   config_markdown.cpp  README.md's key table and the declaration as data
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/loss_scaler.h"
#include "models/model.h"
#include "sharding/policy.h"

namespace sw {

struct OptimizerConfig {
  std::string type = "AdamW";  // optimizer.type
  float lr = 3e-4f;            // optimizer.params.lr
  float beta1 = 0.9f, beta2 = 0.95f;  // optimizer.params.betas
  float eps = 1e-8f;                  // optimizer.params.eps
  float weight_decay = 0.1f;          // optimizer.params.weight_decay (0 but for AdamW)
  // SGD / LARS (torch.optim.SGD's names; LARS: LARC's / timm's trust_coefficient), Lamb
  // (DeepSpeed's FusedLamb); sharding/sharded_model.h OptimizerParams has the formulas.
  float momentum = 0.f, dampening = 0.f;  // optimizer.params.momentum, .dampening
  bool nesterov = false;                  // optimizer.params.nesterov
  float trust_coefficient = 1e-3f;        // optimizer.params.trust_coefficient
  float max_coeff = 10.f, min_coeff = 0.01f;  // optimizer.params.max_coeff, .min_coeff
  bool bias_correction = true;                // optimizer.params.bias_correction
};

struct SchedulerConfig {
  std::string type = "WarmupCosineLR";  // scheduler.type: WarmupCosineLR | WarmupLR | Constant
  int warmup_num_steps = 0;             // scheduler.params.warmup_num_steps
  int total_num_steps = 0;              // scheduler.params.total_num_steps (0 = train_steps)
  float warmup_min_ratio = 0.f;         // lr at step 0 = lr * warmup_min_ratio
  float cos_min_ratio = 0.1f;           // lr at the end = lr * cos_min_ratio
  std::string warmup_type = "linear";   // scheduler.params.warmup_type: linear | log (DeepSpeed's)
};

// checkpoint block: sharded checkpoints of the run (engine/checkpointer.h, docs/ARCHITECTURE.md).
struct CheckpointConfig {
  std::string dir;       // checkpoint.dir: "" in code = <run_dir>/checkpoints (resolved on parse)
  int every_steps = 0;   // checkpoint.every_steps: save after every N optimizer steps (0 = off)
  // checkpoint.keep_last: complete checkpoints kept (0 = all). 3 by default: a full save holds
  // 12 bytes of model state per parameter, so keeping every one fills disks on long runs,
  // while 3 survive a checkpoint found bad after the fact.
  int keep_last = 3;
  // checkpoint.async: write in a background thread while training continues (the snapshot is
  // copied synchronously). Off by default, as in DeepSpeed and PyTorch DCP: the snapshot then
  // lives alongside a training step's activations (a higher peak), the writer competes with the
  // training threads for cores, and its errors surface a few steps later.
  bool async = false;
  // checkpoint.save_final: also save after the last step when every_steps > 0 (set
  // every_steps = train_steps for only a final checkpoint). A failed final save is an error.
  bool save_final = true;
  // checkpoint.resume: "" = start fresh; "auto" = resume from <dir>/latest when it exists
  // (else start fresh); otherwise a step directory or a checkpoint directory holding `latest`
  // (must exist). `shardwise train --resume X` sets it.
  std::string resume;
  // checkpoint.init_from: a safetensors file of weights (as `shardwise train` or `ckpt export`
  // write), an index, or a Hugging Face model directory (its config.json is then the model
  // block, config_reader.cpp merge_hf_model) to start from instead of the random init;
  // optimizer state starts fresh, step 0. Not together with resume. `shardwise train
  // --init-from FILE|DIR` sets it.
  std::string init_from;
  // checkpoint.export_shard_bytes: the largest weights file of the end-of-run Hugging Face
  // export (<run_dir>/hf/, checkpoint/hf_export.h); transformers' max_shard_size, 5 GB.
  int64_t export_shard_bytes = 5'000'000'000;
};

// profile block: record steps with the profiler (engine/profiler.h; `shardwise profile` sets it).
// Each rank writes trace_rank<r>.json, memory_rank<r>.svg and peaks_rank<r>.json into `out`.
struct ProfileConfig {
  bool enabled = false;  // profile.enabled
  int start_step = 1;    // profile.start_step: first recorded optimizer step (1-based)
  int num_steps = 1;     // profile.num_steps: steps recorded (all within train_steps)
  std::string out;       // profile.out: "" in code = <run_dir>/profile (resolved on parse)
};

// parallelism block (torchtitan's key names): the device mesh. W ranks = D data-parallel x t
// tensor, tensor innermost: rank r is tensor rank r % t of the tensor group r / t (ranks
// [d t, d t + t), consecutive, so a tensor group stays on one host) and data rank r / t of the
// data group of the ranks with the same r % t; D = W / t. The sharding strategy shards over
// the data group; the ranks of a tensor group read the same rows.
struct ParallelismConfig {
  int tensor = 1;    // parallelism.tensor_parallel_degree
  int pipeline = 1;  // parallelism.pipeline_parallel_degree
  std::string schedule = "1F1B";  // parallelism.pipeline_parallel_schedule (torchtitan's names)
  int virtual_stages = 0;  // parallelism.pipeline_parallel_virtual_stages (0: 2 interleaved, else 1)
  // parallelism.pipeline_parallel_split_points: the schedule position each stage after the
  // first starts at (empty: balanced by the time model)
  std::vector<int> split_points;
  int stages_per_rank() const {
    return virtual_stages > 0 ? virtual_stages
                              : (schedule == "Interleaved1F1B" || schedule == "InterleavedZeroBubble") ? 2 : 1;
  }
  // The data-parallel size of a world of `world` ranks (0 when t does not divide it).
  int data_size(int world) const {
    return world % (tensor * pipeline) == 0 ? world / (tensor * pipeline) : 0;
  }
};

// local_sgd: DiLoCo / local SGD / federated averaging across the replica groups of HYBRID_SHARD
// (or NO_SHARD's ranks): each trains sync_every inner steps apart, then the outer step
// (sharding/cross_group.h).
struct LocalSgdConfig {
  int sync_every = 0;  // local_sgd.sync_every: inner steps per round (0: off)
  int fragments = 1;   // local_sgd.fragments: streaming DiLoCo's fragments, synced in turn
  std::string outer_type = "SGD";                // local_sgd.outer_optimizer.type
  float outer_lr = 0.7f, outer_momentum = 0.9f;  // local_sgd.outer_optimizer.params
  bool outer_nesterov = true;
  std::string outer_dtype = "fp32";  // local_sgd.outer_dtype: the pseudo-gradient's wire type
  int sync_delay = 0;        // local_sgd.fragment_sync_delay: inner steps a reduce is in flight
  float update_alpha = 0.f;  // local_sgd.fragment_update_alpha
  bool on() const { return sync_every > 0; }
};

struct TrainConfig {
  std::string source;  // the config file's path (for messages)
  ModelConfig model;   // model.{type, vocab_size, n_layer, n_head, n_kv_head, d_model, d_ff, seq_len, ...}
  std::string train_data, val_data;  // data.train, data.val (val optional)
  std::string tokenizer;             // data.tokenizer ("" = bytes; engine/tokenizer.h)
  int micro_batch = 8;               // train_micro_batch_size_per_gpu (per data-parallel rank)
  int grad_accum = 1;                // gradient_accumulation_steps
  int train_steps = 100;             // train_steps
  uint64_t seed = 1337;              // seed
  std::string run_dir = "runs/default";  // run_dir
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  float grad_clip = 1.0f;      // gradient_clipping (0 = off)
  int eval_every_steps = 0;    // eval_every_steps (0 = only at the end when val data exists)
  int eval_batches = 8;        // eval_batches
  int log_every_steps = 1;     // log_every_steps (metrics.jsonl gets every step)
  int threads = 0;             // threads per rank (0 = cores / local ranks)
  // device: "cpu", "cuda" (this rank's GPU), "cuda:N", or "sim" (the tests' simulated
  // accelerator, tests/common/sim_device.h); sharding.device_comm is the `device_comm` key.
  std::string device = "cpu";
  // Sharding. zero_optimization.stage and sharding_strategy (FSDP's names, see
  // sharding/policy.h) say the same thing; when both are given they must agree. zero_stage is
  // the stage of the resolved strategy (HYBRID_SHARD: 3). A TrainConfig built in code may set
  // either: a sharding.strategy other than FULL_SHARD wins, else zero_stage picks the strategy.
  int zero_stage = 3;          // zero_optimization.stage
  // sharding_strategy, shard_group_size, reshard_after_forward, forward_prefetch,
  // backward_prefetch (units ahead; true = 1, false = 0), max_live_units,
  // gradient_accumulation_mode ("reduce_each_micro_step" | "reduce_once"; the default
  // depends on the strategy), activation_checkpointing ("off" | "full" | "selective", or
  // {"mode", "every": k} / {"mode", "units": [unit indices]}).
  ShardingPolicy sharding;
  // Mixed precision: bf16.enabled / fp16.enabled (at most one), which set
  // sharding.mixed_precision (param_dtype = that type, reduce_dtype = param_dtype, unless the
  // `mixed_precision` block says otherwise: "fp32" | "bf16" | "fp16"). fp16 adds loss scaling
  // (fp16.loss_scale, initial_scale_power, loss_scale_window, hysteresis,
  // consecutive_hysteresis, min_loss_scale: engine/loss_scaler.h).
  bool bf16 = false, fp16 = false;
  LossScalerConfig loss_scaler;
  int blocks_per_unit = 1;     // blocks_per_unit: consecutive transformer blocks per FSDP unit
  double comm_timeout_s = 0;   // comm_timeout_s: watchdog limit (0 = SHARDWISE_COMM_TIMEOUT_S or 300)
  bool comm_debug = false;     // comm_debug: check that all ranks issue the same collectives
  // memory_budget: bytes per rank (device tier) that tracked allocations may hold, a number
  // or a string such as "12GiB" / "1.5GB" / "8e9" (core/bytes.h parse_budget_bytes, the
  // parser `shardwise plan --memory-budget` uses too); 0 = no budget. Past it an
  // allocation fails with one line naming the category, the bytes and the use by category.
  size_t memory_budget = 0;
  // "auto" (blocks_per_unit, activation_checkpointing, zero_optimization.offload_optimizer.
  // device, zero_optimization.offload_param.device): train() chooses them with the planner's
  // search within memory_budget (required) before the model is built, and logs the plan.
  struct AutoPlan {
    bool blocks = false, checkpointing = false, offload_optimizer = false, offload_param = false;
    bool tensor = false;    // parallelism.tensor_parallel_degree
    bool pipeline = false;  // parallelism.pipeline_parallel_degree
    bool any() const {
      return blocks || checkpointing || offload_optimizer || offload_param || tensor || pipeline;
    }
  } autoplan;
  LocalSgdConfig local_sgd;
  ParallelismConfig parallelism;  // parallelism.{tensor_parallel_degree, pipeline_parallel_degree}
  CheckpointConfig checkpoint;  // checkpoint.{dir, every_steps, keep_last, async, save_final,
                                // resume, init_from}
  ProfileConfig profile;        // profile.{enabled, start_step, num_steps, out}
  std::string resolved_json;   // the config after defaults and overrides, pretty-printed
  // Messages for the user that are not errors: one line listing the keys present that are
  // accepted for DeepSpeed compatibility but have no effect yet. train() prints them to stderr.
  std::vector<std::string> notes;
};

// Reads `path`, applies `overrides` ("a.b.c=value", value parsed as JSON, else as a string),
// validates. Throws sw::Error("config: <path>: <key path>: <problem>"). world_size: the ranks
// the run has (train_batch_size and shard_group_size depend on it); 0 = what the launcher says.
TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides = {},
                        int world_size = 0);
// load_config for a command that reads the weights `weights` (sample, eval): where they are a
// Hugging Face directory with a config.json, that is the model block, as for
// checkpoint.init_from (the config's own model keys override it; shape keys must agree), and
// checkpoint.resume and init_from are set aside.
TrainConfig load_config_for_weights(const std::string& path, std::vector<std::string> overrides,
                                    const std::string& weights);
// Same from a JSON text (source names it in messages).
TrainConfig parse_config(const std::string& json_text, const std::string& source,
                         const std::vector<std::string>& overrides = {}, int world_size = 0);

// A TrainConfig built in code, made ready for train() without a trip through JSON: the short
// forms code may use are resolved (zero_stage alone selects its strategy with that strategy's
// defaults; bf16 / fp16 alone imply the mixed-precision policy; an empty checkpoint.dir or
// profile.out lies under run_dir; an empty source becomes "TrainConfig"), then every check a
// config file gets runs: the declared ranges and choices of the fields that apply, the rules
// between keys and the sharding policy's own (sharding/policy.h validate). Throws the same
// one-line sw::Error a file would get, naming cfg.source. The reader runs the same checks
// once it has read a file; world_size as for load_config.
void validate_config(TrainConfig& cfg, int world_size = 0);

// `cfg` as JSON (every declared key with its effective value, defaults included; null for a
// key that does not apply to the run) that parse_config reads back to the same values; for a
// parsed config, resolved_json also keeps the compatibility-only keys.
std::string config_json(const TrainConfig& cfg);

// The Markdown key table that README.md holds between its config-keys markers
// (tools/config_table prints it; scripts/gen_config_table.sh rewrites README.md).
std::string config_keys_markdown();
// The declaration as a JSON array, one object per key: key, kind, default (null when derived),
// derived (the default in words), compat, alias, auto_ok, doc, and min/max, range or choices
// where declared. For tests and tools.
std::string config_declaration_json();

}  // namespace sw
