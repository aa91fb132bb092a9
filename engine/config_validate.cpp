// The checks every TrainConfig passes (config_schema.h check_config): one read from a file gets
// them as the reader's last step, one built in code through validate_config (train() runs it),
// so a config is checked where it is made and train() needs no trip through JSON. The rules of
// writing a key (aliases, forms of their own, keys a file may not give together) are the
// reader's (config_reader.cpp).
#include <algorithm>
#include <utility>

#include "core/error.h"
#include "core/launch.h"
#include "engine/config.h"
#include "engine/config_schema.h"
#include "engine/config_text.h"

namespace sw {
namespace config {

namespace {

// The declared range or choices of every field whose key applies to this config.
void check_fields(const TrainConfig& cfg, const Ctx& c) {
  for_each_key(schema(), "", [&](const Node& n, const std::string& path) {
    const Binding& b = n.bind;
    if (!b.write || !b.checked || (b.applies && !b.applies(cfg))) return;
    check_value(n, b.write(cfg), path, c);
  });
}

void check_precision(const TrainConfig& cfg, const Ctx& c) {
  if (cfg.bf16 && cfg.fp16)
    c.bad("fp16.enabled",
          "bf16.enabled and fp16.enabled are both true; enable at most one of them");
  const MixedPrecisionPolicy& mp = cfg.sharding.mixed_precision;
  for (const auto& [key, d] : {std::pair{"mixed_precision.param_dtype", mp.param_dtype},
                               std::pair{"mixed_precision.reduce_dtype", mp.reduce_dtype}})
    if (d == DType::F16 && !cfg.fp16)
      c.bad(key, "fp16 needs loss scaling: set fp16.enabled to true (or use bf16)");
}

void check_schedule(const TrainConfig& cfg, const Ctx& c) {
  const SchedulerConfig& s = cfg.scheduler;
  const int total = s.total_num_steps > 0 ? s.total_num_steps : cfg.train_steps;
  if (s.type == "WarmupCosineLR" && s.warmup_num_steps > total)
    c.bad("scheduler.params.warmup_num_steps",
          "must be <= total_num_steps (" + std::to_string(total) +
              (s.total_num_steps > 0 ? "" : ", from train_steps") + "), got " +
              std::to_string(s.warmup_num_steps));
}

void check_model(const ModelConfig& m, const Ctx& c) {
  if (m.d_model % m.n_head)
    c.bad("model.d_model", "must be a multiple of model.n_head (" + std::to_string(m.n_head) +
                               "), got " + std::to_string(m.d_model));
  if (m.n_kv_head > 0 && m.n_head % m.n_kv_head)
    c.bad("model.n_kv_head", "must divide model.n_head (" + std::to_string(m.n_head) + "), got " +
                                 std::to_string(m.n_kv_head));
  if (m.type == "gpt2" && m.n_kv_head > 0 && m.n_kv_head != m.n_head)
    c.bad("model.n_kv_head",
          "gpt2 has no grouped-query attention: leave it 0 or equal to model.n_head");
}

// The device mesh against the model: each tensor rank holds 1/t of the heads, the MLP's hidden
// width and the vocabulary, and (sequence parallelism) 1/t of the B*T rows between the blocks
// (seq_len divisible keeps every row block whole). Llama's KV heads are split where t divides
// them and replicated where they divide t. The world size is train()'s check (the reader may
// run without the launcher).
void check_mesh(const TrainConfig& cfg, const Ctx& c) {
  const ParallelismConfig& p = cfg.parallelism;
  if (p.pipeline > 1) {
    const int S = p.pipeline * p.stages_per_rank();
    const bool interleaved = p.schedule == "Interleaved1F1B" || p.schedule == "InterleavedZeroBubble";
    if (!interleaved && p.stages_per_rank() > 1)
      c.bad("parallelism.pipeline_parallel_virtual_stages",
            "more than one stage per rank needs an interleaved schedule (Interleaved1F1B, "
            "InterleavedZeroBubble), not " + p.schedule);
    if (!p.split_points.empty() && static_cast<int>(p.split_points.size()) != S - 1)
      c.bad("parallelism.pipeline_parallel_split_points",
            std::to_string(S) + " stages need " + std::to_string(S - 1) + " split points, got " +
                std::to_string(p.split_points.size()));
    if (interleaved && p.stages_per_rank() > 1 && cfg.grad_accum % p.pipeline != 0)
      c.bad("gradient_accumulation_steps",
            "an interleaved schedule runs micro-batches in groups of the pipeline degree (" +
                std::to_string(p.pipeline) + "), got " + std::to_string(cfg.grad_accum));
  }
  if (const LocalSgdConfig& l = cfg.local_sgd; l.on()) {
    const ShardingStrategy st = cfg.sharding.strategy;
    if (st != ShardingStrategy::HybridShard && st != ShardingStrategy::NoShard)
      c.bad("local_sgd.sync_every",
            "replica groups train apart: needs sharding_strategy HYBRID_SHARD (replicas of "
            "shard_group_size ranks) or NO_SHARD (every rank a replica), not " +
                std::string(strategy_name(st)));
    if (l.sync_every % l.fragments != 0)
      c.bad("local_sgd.fragments", std::to_string(l.fragments) + " does not divide sync_every (" +
                                       std::to_string(l.sync_every) + ")");
    else if (l.sync_delay >= l.sync_every / l.fragments)
      c.bad("local_sgd.fragment_sync_delay",
            std::to_string(l.sync_delay) + " must be below sync_every / fragments (" +
                std::to_string(l.sync_every / l.fragments) + "): a fragment's update lands before its next reduce");
  }
  const int t = p.tensor;
  if (t <= 1) return;
  const ModelConfig& m = cfg.model;
  const std::string key = "parallelism.tensor_parallel_degree";
  const std::string deg = std::to_string(t) + " does not divide ";
  auto need = [&](long long v, const std::string& what, const std::string& why,
                  const char* note = "") {
    if (v % t) c.bad(key, deg + what + " (" + std::to_string(v) + note + "): " + why);
  };
  need(m.n_head, "model.n_head", "each tensor rank holds whole attention heads");
  if (m.type == "llama") {
    const int kv = m.n_kv_head > 0 ? m.n_kv_head : m.n_head;
    if (kv % t && t % kv)
      c.bad(key, std::to_string(t) + " and model.n_kv_head (" + std::to_string(kv) +
                     ") must divide one another: KV heads are split over the tensor ranks "
                     "or replicated on them");
  }
  // d_ff after its default (models/model.cpp): gpt2 4 d_model, llama 8/3 d_model rounded up to
  // a multiple of 64.
  const long long d = m.d_model;
  const long long ff = m.d_ff > 0         ? m.d_ff
                       : m.type == "gpt2" ? 4 * d
                                          : ((8 * d + 2) / 3 + 63) / 64 * 64;
  need(ff, "model.d_ff", "each tensor rank holds a slice of the MLP's hidden width",
       m.d_ff > 0 ? "" : ", its default");
  need(m.vocab_size, "model.vocab_size",
       "the embedding and the LM head are split by vocabulary");
  need(m.seq_len, "model.seq_len",
       "sequence parallelism splits each sequence's positions over the tensor ranks");
}

// The units the model will have (activation_checkpointing.units index them).
int unit_count(const TrainConfig& cfg) {
  const ModelConfig& m = cfg.model;
  const int bpu = std::max(1, cfg.blocks_per_unit);
  return (m.type == "llama" && !m.tied() ? 2 : 1) + (m.n_layer + bpu - 1) / bpu;
}

// The sharding policy's own rules (sharding/policy.h), as this config's error.
// world: the data-parallel size the policy shards over (0: not known).
void check_policy(const TrainConfig& cfg, int world, const Ctx& c) {
  try {
    validate(cfg.sharding, world, unit_count(cfg));
  } catch (const Error& e) {  // "sharding: <key>: <problem>"
    std::string m = std::string(e.what()).substr(std::string("sharding: ").size());
    const std::string ws = "the world size (";
    if (const size_t at = m.find(ws); cfg.parallelism.tensor > 1 && at != std::string::npos)
      m.replace(at, ws.size(), "the data-parallel size (world size / tensor degree = ");
    const size_t colon = m.find(": ");
    if (colon == std::string::npos) throw;
    c.bad(m.substr(0, colon), m.substr(colon + 2));
  }
}

// The io engine's rule beyond the declared range, which AioConfig::from_json applies to a file's
// aio block (offload/aio.h).
void check_aio(const AioConfig& a, const Ctx& c) {
  if (a.block_size % 4096 != 0)
    c.bad("aio.block_size", "expected a positive multiple of 4096 bytes (an integer or \"1MiB\") "
                            "up to 1GiB, got " + std::to_string(a.block_size));
}

// "auto" keys are chosen within memory_budget.
void check_auto(const TrainConfig& cfg, const Ctx& c) {
  const TrainConfig::AutoPlan& a = cfg.autoplan;
  if (!a.any() || cfg.memory_budget != 0) return;
  c.bad("memory_budget", std::string("required by \"auto\" in ") +
                             (a.blocks                ? "blocks_per_unit"
                              : a.checkpointing       ? "activation_checkpointing"
                              : a.offload_optimizer   ? "zero_optimization.offload_optimizer.device"
                              : a.offload_param       ? "zero_optimization.offload_param.device"
                              : a.tensor              ? "parallelism.tensor_parallel_degree"
                                                      : "parallelism.pipeline_parallel_degree") +
                             " (the planner chooses within it)");
}

void check_run(const TrainConfig& cfg, const Ctx& c) {
  if (cfg.run_dir.empty()) c.bad("run_dir", "must not be empty");
  const std::string& d = cfg.device;
  if (d != "cpu" && d != "cuda" && d != "sim" &&
      !(d.rfind("cuda:", 0) == 0 && d.size() > 5 &&
        d.find_first_not_of("0123456789", 5) == std::string::npos))
    c.bad("device", "'" + d + "' is not cpu, cuda or cuda:N");
  const CheckpointConfig& k = cfg.checkpoint;
  if (!k.resume.empty() && !k.init_from.empty())
    c.bad("checkpoint.init_from",
          "conflicts with checkpoint.resume ('" + k.resume +
              "'): a resumed run takes its weights from the checkpoint; give only one");
  // The recorded steps must lie in [1, train_steps] (checked when enabled, so a disabled block
  // does not get in the way of a shorter run).
  const ProfileConfig& pf = cfg.profile;
  if (pf.enabled && pf.start_step > cfg.train_steps)
    c.bad("profile.start_step", "must be <= train_steps (" + std::to_string(cfg.train_steps) +
                                    "), got " + std::to_string(pf.start_step));
  if (pf.enabled && (long long)pf.start_step + pf.num_steps - 1 > cfg.train_steps)
    c.bad("profile.num_steps",
          std::to_string(pf.num_steps) + " steps from profile.start_step " +
              std::to_string(pf.start_step) + " end at step " +
              std::to_string((long long)pf.start_step + pf.num_steps - 1) +
              ", beyond train_steps (" + std::to_string(cfg.train_steps) + ")");
}

}  // namespace

void check_global_batch(long long mb, long long ga, int world, const std::string& key,
                        const Ctx& c) {
  // Rows per optimizer step are counted in int64 and must stay far from overflow: at most
  // 2^31 - 1 rows.
  if (static_cast<__int128>(mb) * ga * world > IMAX)
    c.bad(key, "train_micro_batch_size_per_gpu (" + std::to_string(mb) +
                   ") * gradient_accumulation_steps (" + std::to_string(ga) + ") * world size (" +
                   std::to_string(world) + ") rows per step is more than " +
                   std::to_string(IMAX));
}

void check_config(const TrainConfig& cfg, int world, const Ctx& c) {
  // The batch and the sharding policy are over the data-parallel ranks (world / tensor degree;
  // a world the degree does not divide is train()'s error).
  const int data_world = cfg.parallelism.data_size(world);
  check_fields(cfg, c);
  check_precision(cfg, c);
  check_global_batch(cfg.micro_batch, cfg.grad_accum, std::max(1, data_world),
                     "train_micro_batch_size_per_gpu", c);
  check_schedule(cfg, c);
  check_model(cfg.model, c);
  check_mesh(cfg, c);
  check_policy(cfg, data_world, c);
  check_aio(cfg.sharding.aio, c);
  check_auto(cfg, c);
  check_run(cfg, c);
}

void resolve_code_forms(TrainConfig& cfg) {
  // zero_stage alone (the strategy left at its default) selects the stage's strategy, with
  // that strategy's defaults.
  ShardingPolicy& sp = cfg.sharding;
  if (sp.strategy == ShardingStrategy::FullShard && cfg.zero_stage != 3) {
    const ShardingPolicy d = ShardingPolicy::for_strategy(strategy_from_stage(cfg.zero_stage));
    sp.strategy = d.strategy;
    sp.reshard_after_forward = d.reshard_after_forward;
    sp.accum = d.accum;
  }
  cfg.zero_stage = stage_of(sp.strategy);
  // bf16 / fp16 alone (the policy left at fp32) imply the policy.
  MixedPrecisionPolicy& mp = sp.mixed_precision;
  if (!mp.enabled() && (cfg.bf16 || cfg.fp16))
    mp.param_dtype = mp.reduce_dtype = cfg.bf16 ? DType::BF16 : DType::F16;
  if (cfg.checkpoint.dir.empty()) cfg.checkpoint.dir = default_checkpoint_dir(cfg.run_dir);
  if (cfg.profile.out.empty()) cfg.profile.out = default_profile_dir(cfg.run_dir);
}

}  // namespace config

void validate_config(TrainConfig& cfg, int world_size) {
  if (cfg.source.empty()) cfg.source = "TrainConfig";
  config::Ctx c;
  c.source = cfg.source;
  // The stage is checked before it selects a strategy.
  if (cfg.sharding.strategy == ShardingStrategy::FullShard)
    config::check_value(config::decl("zero_optimization.stage"), cfg.zero_stage,
                        "zero_optimization.stage", c);
  config::resolve_code_forms(cfg);
  config::check_config(cfg, world_size > 0 ? world_size : launch_env().world_size, c);
}

}  // namespace sw
