// Reading a config: JSON text to TrainConfig through the declaration (config_schema.h).
//
// Passes, in order:
//   1. parse the text (config_text.cpp: line:column on syntax errors; duplicate keys refused);
//   2. apply --set overrides (the key path must be declared);
//   3. walk the JSON against the declaration: unknown keys (with the nearest valid key
//      suggested) and wrong types throw; null is "not set"; keys accepted only for DeepSpeed
//      compatibility become one note;
//   4. read every key bound to a field (Binding::read: the value given, else the declared
//      default, with the declared range checked on the value as written); "auto" reads as not
//      set, as in DeepSpeed ("derive or default"), except where it is a value of its own;
//   5. the rules of reading that only a file has: which keys were given together, aliases,
//      forms of their own (below, each named for its keys);
//   6. check_config (config_validate.cpp): the checks every TrainConfig passes, the same ones a
//      config built in code gets from validate_config;
//   7. the resolved config (config_writer.cpp): the input with every declared key set to its
//      effective value (null where it does not apply to the run; aliases resolved).
//
// DeepSpeed compatibility decisions:
//   * optimizer.type "Adam" is DeepSpeed's Adam, whose default adam_w_mode=true makes it AdamW
//     (decoupled weight decay); adam_w_mode=false (L2 regularisation) is rejected.
//   * WarmupCosineLR / WarmupLR follow DeepSpeed's formulas (engine/schedule.h), including
//     warmup_type linear|log, except that warmup_type defaults to linear here (DeepSpeed: log);
//     WarmupLR's warmup_max_lr / warmup_min_lr are converted to optimizer.params.lr /
//     warmup_min_ratio. Parameters of another schedule type are errors.
//   * DeepSpeed keys with no effect yet (most of zero_optimization, offload_*, monitors, ...)
//     are type-checked, kept in the resolved config and listed in one note; "auto" is accepted
//     for their numeric values.
//   * train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps: any two
//     determine the third with the world size the launcher announces (mpirun/srun environment;
//     1 without a launcher) divided by parallelism.tensor_parallel_degree (the data-parallel
//     size: DeepSpeed's dp_world_size); all three must agree.
//   * zero_optimization.stage and sharding_strategy both select the strategy (3 FULL_SHARD,
//     2 SHARD_GRAD_OP, 1 SHARD_OPTIMIZER, 0 NO_SHARD; HYBRID_SHARD is stage 3 within groups)
//     and must agree when both are given; options that only one strategy family reads
//     (shard_group_size, reshard_after_forward) are errors with the others. Hugging Face's "auto"
//     is accepted for these three and means "derive or default".
//   * bf16.enabled / fp16.enabled select mixed precision (both at once is an error); the
//     `mixed_precision` block (param_dtype, reduce_dtype: "fp32" | "bf16" | "fp16") overrides
//     the dtypes they imply (param_dtype = the enabled block's, reduce_dtype = param_dtype).
//     fp16 anywhere needs fp16.enabled, which brings loss scaling with DeepSpeed's keys
//     (engine/loss_scaler.h); fp16.auto_cast and bf16.immediate_grad_update have no effect.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "checkpoint/hf_import.h"
#include "checkpoint/hf_layout.h"
#include "core/error.h"
#include "core/launch.h"
#include "engine/config.h"
#include "engine/config_schema.h"
#include "engine/config_text.h"

namespace sw {
namespace config {

namespace {

// The key is set: present, not null and not "auto" (DeepSpeed's "derive or default").
bool has(const json& root, const std::string& path) {
  const json* v = at(root, path);
  return v && !v->is_null() && !is_auto(*v);
}
// The value at path is "auto" (train() resolves TrainConfig::autoplan keys with the planner).
bool auto_at(const json& root, const std::string& path) {
  const json* v = at(root, path);
  return v && is_auto(*v);
}
// The value of a declared key the caller knows is set, checked against its declaration.
long long int_at(const json& j, const std::string& path, const Ctx& c) {
  return read_int(decl(path), *at(j, path), path, c);
}
std::string str_at(const json& j, const std::string& path, const Ctx& c) {
  return read_str(decl(path), *at(j, path), path, c);
}

// Pass 3: unknown keys and wrong kinds; the top-most compatibility-only keys are collected.
void check_types(const json& j, const Node& n, const std::string& path, const Ctx& c,
                 std::vector<std::string>& compat_keys) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string p = join_path(path, it.key());
    const Node* k = n.kid(it.key());
    if (!k) unknown_key(c.source, n, path, it.key(), c.origin(p));
    const json& v = it.value();
    // null: not set (the default applies); the resolved config writes it for keys that do not
    // apply to the run (shard_group_size without HYBRID_SHARD, ...).
    if (v.is_null() && k->kind != Kind::Obj) continue;
    if (!(k->auto_ok && is_auto(v)) && !kind_matches(k->kind, v))
      c.bad(p, std::string("expected ") + kind_name(k->kind) + (k->auto_ok ? " or \"auto\"" : "") +
                   ", got " + describe(v));
    if (k->compat && !n.compat) compat_keys.push_back(p);
    if (k->kind == Kind::Obj || (k->kind == Kind::Any && !k->kids.empty() && v.is_object()))
      check_types(v, *k, p, c, compat_keys);
  }
}

// zero_optimization.stage and sharding_strategy say the same thing: the strategy, whose
// defaults the sharding options then start from. Options one strategy family alone reads are
// errors with the others.
void read_strategy(const json& j, TrainConfig& cfg, const Ctx& c) {
  const bool has_stage = has(j, "zero_optimization.stage");
  const int stage = has_stage ? int(int_at(j, "zero_optimization.stage", c)) : 3;
  ShardingStrategy strat = strategy_from_stage(stage);
  if (has(j, "sharding_strategy")) {
    const std::string name = str_at(j, "sharding_strategy", c);
    const ShardingStrategy named = strategy_from_name(name);
    if (has_stage && stage_of(named) != stage)
      c.bad("sharding_strategy", "'" + name + "' is ZeRO stage " +
                                     std::to_string(stage_of(named)) +
                                     " but zero_optimization.stage is " + std::to_string(stage) +
                                     "; give one of them, or make them agree");
    strat = named;
  }
  cfg.zero_stage = stage_of(strat);
  cfg.sharding = ShardingPolicy::for_strategy(strat);
  if (has(j, "shard_group_size") && strat != ShardingStrategy::HybridShard)
    c.bad("shard_group_size", std::string("is only used by HYBRID_SHARD (the strategy is ") +
                                  strategy_name(strat) + ")");
  const bool sharded_params = strat == ShardingStrategy::FullShard ||
                              strat == ShardingStrategy::ShardGradOp ||
                              strat == ShardingStrategy::HybridShard;
  if (has(j, "reshard_after_forward") && !sharded_params)
    c.bad("reshard_after_forward",
          std::string("only applies to FULL_SHARD, SHARD_GRAD_OP and HYBRID_SHARD (") +
              strategy_name(strat) + " keeps full parameters on every rank)");
}

// A schedule type's parameters: those of another type are errors.
void check_schedule_params(const json& j, const Ctx& c) {
  const std::string type = has(j, "scheduler.type")
                               ? str_at(j, "scheduler.type", c)
                               : decl("scheduler.type").def.get<std::string>();
  static const std::map<std::string, std::vector<std::string>> params = {
      {"WarmupCosineLR",
       {"warmup_num_steps", "total_num_steps", "warmup_min_ratio", "cos_min_ratio", "warmup_type",
        "last_batch_iteration"}},
      {"WarmupLR",
       {"warmup_num_steps", "warmup_min_ratio", "warmup_type", "warmup_min_lr", "warmup_max_lr",
        "last_batch_iteration"}},
      {"Constant", {}}};
  const json* p = at(j, "scheduler.params");
  if (!p || !p->is_object()) return;
  const std::vector<std::string>& ok = params.at(type);
  for (auto it = p->begin(); it != p->end(); ++it)
    if (!it.value().is_null() && std::find(ok.begin(), ok.end(), it.key()) == ok.end())
      c.bad("scheduler.params." + it.key(), "not a parameter of scheduler type " + type);
}

// An optimizer type's parameters: those of another type are errors (the compatibility keys
// DeepSpeed's Adam takes are AdamW's).
void check_optimizer_params(const json& j, const Ctx& c) {
  const std::string type = has(j, "optimizer.type") ? str_at(j, "optimizer.type", c)
                                                    : decl("optimizer.type").def.get<std::string>();
  const std::vector<std::string> adam = {"lr",        "betas",      "eps",   "weight_decay",
                                         "adam_w_mode", "torch_adam", "fused", "bias_correction",
                                         "amsgrad"};
  static const std::map<std::string, std::vector<std::string>> params = {
      {"AdamW", adam},
      {"Adam", adam},
      {"SGD", {"lr", "momentum", "dampening", "nesterov", "weight_decay"}},
      {"LARS",
       {"lr", "momentum", "dampening", "nesterov", "weight_decay", "trust_coefficient", "eps"}},
      {"Lamb", {"lr", "betas", "eps", "weight_decay", "max_coeff", "min_coeff", "bias_correction"}}};
  const auto it_t = params.find(type);
  if (it_t == params.end()) return;  // (the type's own check names it)
  const json* p = at(j, "optimizer.params");
  if (!p || !p->is_object()) return;
  for (auto it = p->begin(); it != p->end(); ++it)
    if (!it.value().is_null() &&
        std::find(it_t->second.begin(), it_t->second.end(), it.key()) == it_t->second.end())
      c.bad("optimizer.params." + it.key(), "not a parameter of optimizer type " + type);
}

// After the bound keys: the other types' defaults where their keys are not given (weight decay
// 0 as torch's SGD and DeepSpeed's Lamb; Lamb's betas DeepSpeed's), and torch's rule for
// Nesterov momentum.
void read_optimizer_defaults(const json& j, TrainConfig& cfg, const Ctx& c) {
  OptimizerConfig& o = cfg.optimizer;
  if (o.type == "AdamW" || o.type == "Adam") return;
  if (!has(j, "optimizer.params.weight_decay")) o.weight_decay = 0.f;
  if (o.type == "Lamb" && !has(j, "optimizer.params.betas")) o.beta1 = 0.9f, o.beta2 = 0.999f;
  if (o.nesterov && (o.momentum <= 0.f || o.dampening != 0.f))
    c.bad("optimizer.params.nesterov", "needs momentum > 0 and dampening 0 (torch.optim.SGD's rule)");
  if (o.type == "Lamb" && o.min_coeff > o.max_coeff)
    c.bad("optimizer.params.min_coeff", "is above max_coeff");
  if ((o.type == "LARS" || o.type == "Lamb") &&
      (cfg.sharding.offload_optimizer.device == OffloadDevice::Nvme ||
       cfg.sharding.offload_param.device == OffloadDevice::Nvme))
    c.bad("optimizer.type", o.type + " with NVMe offload is not implemented (its per-tensor norms "
                                     "read each tensor before its update); use cpu offload");
}

// Pass 4: every key bound to a field: the value given, else the declared default (a key with
// a derived default keeps what read_strategy or the struct set).
void read_bound(const json& j, TrainConfig& cfg, const Ctx& c) {
  for_each_key(schema(), "", [&](const Node& n, const std::string& path) {
    if (!n.bind.read) return;
    if (has(j, path))
      n.bind.read(cfg, *at(j, path), n, path, c);
    else if (!n.def.is_null())
      n.bind.read(cfg, n.def, n, path, c);
  });
}

DType precision_from_name(const std::string& s) {
  return s == "bf16" ? DType::BF16 : s == "fp16" ? DType::F16 : DType::F32;
}

// mixed_precision: the dtypes bf16 / fp16 imply (reduce_dtype follows param_dtype) unless
// given.
void read_mixed_precision(const json& j, TrainConfig& cfg, const Ctx& c) {
  MixedPrecisionPolicy mp;
  mp.param_dtype = cfg.bf16 ? DType::BF16 : cfg.fp16 ? DType::F16 : DType::F32;
  if (has(j, "mixed_precision.param_dtype"))
    mp.param_dtype = precision_from_name(str_at(j, "mixed_precision.param_dtype", c));
  mp.reduce_dtype = mp.param_dtype;
  if (has(j, "mixed_precision.reduce_dtype"))
    mp.reduce_dtype = precision_from_name(str_at(j, "mixed_precision.reduce_dtype", c));
  // fp8 (kernels/fp8_ops.h): bf16 products underneath; the delayed recipe's key only with it.
  mp.fp8 = has(j, "fp8.enabled") && at(j, "fp8.enabled")->get<bool>();  // (kind checked)
  mp.fp8_delayed = has(j, "fp8.recipe") && str_at(j, "fp8.recipe", c) == "delayed";
  if (has(j, "fp8.amax_history")) {
    if (!mp.fp8_delayed) c.bad("fp8.amax_history", "is read only with \"recipe\": \"delayed\"");
    mp.fp8_amax_history = static_cast<int>(int_at(j, "fp8.amax_history", c));
  }
  if (has(j, "fp8.round_scales_to_power_of_2"))
    mp.fp8_pow2 = at(j, "fp8.round_scales_to_power_of_2")->get<bool>();
  mp.fp8_all_gather = has(j, "fp8.all_gather") && at(j, "fp8.all_gather")->get<bool>();
  if (mp.fp8_all_gather && !mp.fp8) c.bad("fp8.all_gather", "needs \"enabled\": true");
  if (mp.fp8_all_gather && cfg.parallelism.tensor > 1)
    c.bad("fp8.all_gather", "is not available with tensor parallelism (parallelism."
                            "tensor_parallel_degree > 1)");
  if (mp.fp8_all_gather && mp.fp8_delayed)
    c.bad("fp8.all_gather", "needs \"recipe\": \"current\" (a gathered weight's scale is its "
                            "amax now)");
  if (mp.fp8 && mp.param_dtype != DType::BF16)
    c.bad("fp8.enabled", std::string("needs bf16 mixed precision (\"bf16\": {\"enabled\": "
                                     "true}); param_dtype is ") + dtype_name(mp.param_dtype));
  cfg.sharding.mixed_precision = mp;
}

// Batch sizes: any two of the three determine the third, with the data-parallel size `world`
// (the world size / parallelism.tensor_parallel_degree).
void read_batch(const json& j, TrainConfig& cfg, int world, const Ctx& c) {
  const std::string ws = cfg.parallelism.tensor > 1 ? "data-parallel size" : "world size";
  const bool has_tbs = has(j, "train_batch_size"),
             has_mb = has(j, "train_micro_batch_size_per_gpu"),
             has_ga = has(j, "gradient_accumulation_steps");
  const long long tbs = has_tbs ? int_at(j, "train_batch_size", c) : 0;
  long long mb = cfg.micro_batch, ga = cfg.grad_accum;
  check_global_batch(mb, ga, world,
                     has_mb ? "train_micro_batch_size_per_gpu" : "gradient_accumulation_steps", c);
  if (has_tbs) {
    if (has_mb && !has_ga) {
      if (tbs % (mb * world))
        c.bad("train_batch_size",
              std::to_string(tbs) + " is not a multiple of train_micro_batch_size_per_gpu (" +
                  std::to_string(mb) + ") * " + ws + " (" + std::to_string(world) + ")");
      ga = tbs / (mb * world);
    } else if (!has_mb && has_ga) {
      if (tbs % (ga * world))
        c.bad("train_batch_size",
              std::to_string(tbs) + " is not a multiple of gradient_accumulation_steps (" +
                  std::to_string(ga) + ") * " + ws + " (" + std::to_string(world) + ")");
      mb = tbs / (ga * world);
    } else if (!has_mb && !has_ga) {
      if (tbs % world) c.bad("train_batch_size", "must be a multiple of the " + ws);
      mb = tbs / world, ga = 1;
    } else if (tbs != mb * ga * world) {
      c.bad("train_batch_size",
            "must equal train_micro_batch_size_per_gpu * gradient_accumulation_steps * " + ws +
                " = " +
                std::to_string(mb) + " * " + std::to_string(ga) + " * " + std::to_string(world) +
                " = " + std::to_string(mb * ga * world) + " (got " + std::to_string(tbs) + ")");
    }
  }
  cfg.micro_batch = int(mb);
  cfg.grad_accum = int(ga);
}

// optimizer.params.adam_w_mode false (L2 regularisation) is not implemented; WarmupLR's
// warmup_max_lr / warmup_min_lr are aliases of optimizer.params.lr / warmup_min_ratio.
void read_lr_aliases(const json& j, TrainConfig& cfg, const Ctx& c) {
  if (has(j, "optimizer.params.adam_w_mode") && !at(j, "optimizer.params.adam_w_mode")->get<bool>())
    c.bad("optimizer.params.adam_w_mode",
          "only decoupled weight decay (AdamW, adam_w_mode true) is implemented");
  OptimizerConfig& o = cfg.optimizer;
  const std::string max_lr = "scheduler.params.warmup_max_lr";
  if (has(j, max_lr)) {
    const Node& n = decl(max_lr);
    const double mx = read_num(n, *at(j, max_lr), max_lr, c);
    if (has(j, "optimizer.params.lr") && std::fabs(mx - o.lr) > 1e-6 * mx)
      c.bad(max_lr, "is the peak learning rate and conflicts with optimizer.params.lr (" +
                        num_str(mx) + " vs " + num_str(o.lr) + "); give only one");
    o.lr = to_float(mx, max_lr, n.range, c);
  }
  const std::string min_lr = "scheduler.params.warmup_min_lr";
  if (has(j, min_lr)) {
    const double mn = check_num(at(j, min_lr)->get<double>(), min_lr, {0, o.lr, false, false}, c);
    if (has(j, "scheduler.params.warmup_min_ratio"))
      c.bad(min_lr, "conflicts with scheduler.params.warmup_min_ratio; give only one");
    cfg.scheduler.warmup_min_ratio = static_cast<float>(mn / o.lr);
  }
}

// The aio block is read by the io engine's own config type (offload/aio.h), whose one line
// "aio: aio.<key>: <problem>" becomes the config's.
void read_aio(const json& j, TrainConfig& cfg, const Ctx& c) {
  const json* a = at(j, "aio");
  if (!a) return;
  json given = *a;  // without the keys that are not set (null)
  for (auto it = a->begin(); it != a->end(); ++it)
    if (it.value().is_null()) given.erase(it.key());
  try {
    cfg.sharding.aio = AioConfig::from_json(given, "aio");
  } catch (const Error& e) {
    const std::string m = std::string(e.what()).substr(5);
    const size_t colon = m.find(": ");
    if (colon == std::string::npos) c.bad("aio", m);
    c.bad(m.substr(0, colon), m.substr(colon + 2));
  }
}

// activation_checkpointing: "off" | "full" | "selective", or {"mode": ..., "every": k} or
// {"mode": ..., "units": [i, ...]} (unit indices in the model's unit order after
// blocks_per_unit; check_config checks them against the unit count), with "offload" and its
// "nvme_path" (by default the parameters', else the optimizer's); "auto": the planner chooses.
void read_activation_checkpointing(const json& j, TrainConfig& cfg, const Ctx& c) {
  const std::string key = "activation_checkpointing";
  cfg.autoplan.checkpointing = auto_at(j, key);
  if (!has(j, key)) return;
  ActivationCheckpointing& ac = cfg.sharding.activation_checkpointing;
  const json& v = *at(j, key);
  if (v.is_string()) {
    ac.mode = checkpoint_mode_from_name(str_at(j, key, c));  // the declared modes
    return;
  }
  if (!v.is_object())
    c.bad(key, "expected \"off\", \"full\", \"selective\" or an object {\"mode\", \"every\" or "
               "\"units\"}, got " + describe(v));
  if (has(j, key + ".offload")) {
    const std::string o = str_at(j, key + ".offload", c);
    ac.offload_cpu = o == "cpu";
    ac.offload_nvme = o == "nvme";
    const ShardingPolicy& sp = cfg.sharding;
    ac.nvme_path = has(j, key + ".nvme_path")               ? str_at(j, key + ".nvme_path", c)
                   : !sp.offload_param.nvme_path.empty() ? sp.offload_param.nvme_path
                                                          : sp.offload_optimizer.nvme_path;
  }
  const bool every = has(j, key + ".every"), units = has(j, key + ".units");
  if (!has(j, key + ".mode")) {
    if (every || units) c.bad(key + ".mode", "is required when every or units is given");
    return;  // offload without checkpointing, or DeepSpeed's keys only (noted)
  }
  ac.mode = checkpoint_mode_from_name(str_at(j, key + ".mode", c));
  if (every && units) c.bad(key + ".units", "conflicts with " + key + ".every; give only one");
  ac.every = every ? int(int_at(j, key + ".every", c)) : 1;
  if (!units) return;
  const json& u = *at(j, key + ".units");
  if (!u.is_array() || u.empty())
    c.bad(key + ".units", "expected a non-empty array of unit indices, got " + describe(u));
  for (size_t i = 0; i < u.size(); ++i) {
    if (!kind_matches(Kind::Int, u[i]))
      c.bad(key + ".units[" + std::to_string(i) + "]",
            "expected a unit index, got " + describe(u[i]));
    const long long x = u[i].is_number_float() ? (long long)u[i].get<double>()
                                               : u[i].get<long long>();
    // Beyond int: out of range whatever the model (check_config names the range).
    ac.units.push_back(int(std::clamp<long long>(x, -1, INT32_MAX)));
  }
}

// The rules of the other keys that only a file has: the "auto" values the planner resolves,
// empty directories given, checkpoint.resume's "auto".
void read_run_rules(const json& j, TrainConfig& cfg, const Ctx& c) {
  cfg.autoplan.blocks = auto_at(j, "blocks_per_unit");
  cfg.autoplan.offload_optimizer = auto_at(j, "zero_optimization.offload_optimizer.device");
  cfg.autoplan.offload_param = auto_at(j, "zero_optimization.offload_param.device");
  cfg.autoplan.tensor = auto_at(j, "parallelism.tensor_parallel_degree");
  cfg.autoplan.pipeline = auto_at(j, "parallelism.pipeline_parallel_degree");
  // checkpoint.dir and profile.out: under run_dir unless given, and then not empty.
  CheckpointConfig& k = cfg.checkpoint;
  if (has(j, "checkpoint.dir") && k.dir.empty()) c.bad("checkpoint.dir", "must not be empty");
  if (k.dir.empty()) k.dir = default_checkpoint_dir(cfg.run_dir);
  ProfileConfig& pf = cfg.profile;
  if (has(j, "profile.out") && pf.out.empty()) c.bad("profile.out", "must not be empty");
  if (pf.out.empty()) pf.out = default_profile_dir(cfg.run_dir);
  // "auto" is one of resume's values (resume when there is a checkpoint), not "not set".
  if (const json* v = at(j, "checkpoint.resume"); v && v->is_string())
    k.resume = v->get<std::string>();
}

// checkpoint.init_from naming a Hugging Face directory (config.json beside the weights): its
// config.json is the model block (checkpoint/hf_import.h). Keys the run gives override it, one
// note per disagreement (key, config.json's value, the run's); keys that shape the weights must
// agree (an error naming the key); a sliding window shorter than the resulting seq_len is
// refused.
void merge_hf_model(json& j, std::vector<std::string>& notes, const Ctx& c) {
  const json* from = at(j, "checkpoint.init_from");
  if (!from || !from->is_string() || !is_hf_model_dir(from->get<std::string>())) return;
  const HfConfig hc = read_hf_config(from->get<std::string>());
  const ModelConfig& m = hc.model;
  json imported = json::object();
  const json fields = json::parse(model_config_to_json(m).dump());
  for (auto it = fields.begin(); it != fields.end(); ++it)
    imported[it.key()] = it->is_number_float() ? fjson(it->get<float>()) : *it;
  if (m.type == "gpt2")
    for (const char* k : {"n_kv_head", "rope_theta", "qkv_bias", "rope_scaling"}) imported.erase(k);
  if (m.rope_scaling != "llama3")
    for (const char* k : {"rope_factor", "rope_low_freq_factor", "rope_high_freq_factor",
                          "rope_original_max_pos"})
      imported.erase(k);
  const json* given = at(j, "model");
  json merged = imported;
  if (given && given->is_object())
    for (auto it = given->begin(); it != given->end(); ++it) {
      if (it.value().is_null()) continue;
      if (!imported.contains(it.key())) {
        merged[it.key()] = it.value();
        continue;
      }
      const json& a = imported.at(it.key());
      const json& b = it.value();
      // 0 = the default of n_kv_head (n_head) and d_ff (models/model.cpp): the same as
      // config.json's value when that is what it resolves to.
      if (b == json(0) && (it.key() == "n_kv_head" || it.key() == "d_ff")) {
        const int d = m.d_model;
        const int dff = m.type == "gpt2" ? 4 * d : int(((8LL * d + 2) / 3 + 63) / 64 * 64);
        if (a == json(it.key() == "n_kv_head" ? m.n_head : dff)) continue;
      }
      merged[it.key()] = b;
      const bool same =
          a.is_number() && b.is_number()
              ? static_cast<float>(a.get<double>()) == static_cast<float>(b.get<double>())
              : a == b;
      if (same) continue;
      static const std::set<std::string> shapes = {"type",    "vocab_size", "n_layer",
                                                   "n_head",  "n_kv_head",  "d_model",
                                                   "d_ff",    "tie_embeddings", "qkv_bias"};
      if (shapes.count(it.key()) || (m.type == "gpt2" && it.key() == "seq_len"))
        c.bad("model." + it.key(), b.dump() + " does not fit the weights of " + hc.file +
                                       " (" + a.dump() + ")");
      notes.push_back("config: model." + it.key() + ": " + hc.file + " has " + a.dump() +
                      ", the run's " + b.dump() + " is used");
    }
  j["model"] = merged;
  const json& sl = merged.at("seq_len");
  if (sl.is_number_integer()) check_hf_window(hc, sl.get<int>());
}

TrainConfig read_config(json j, const std::string& source,
                        const std::vector<std::string>& overrides, int world_size) {
  Ctx c;
  c.source = source;
  for (const std::string& ov : overrides) apply_override(j, ov, c);
  c.input = &j;
  std::vector<std::string> hf_notes;
  merge_hf_model(j, hf_notes, c);
  std::vector<std::string> compat_keys;
  check_types(j, schema(), "", c, compat_keys);

  TrainConfig cfg;
  cfg.source = source;
  cfg.notes = hf_notes;
  if (!compat_keys.empty()) {
    std::string note =
        "config: note: " + source + ": accepted for DeepSpeed compatibility, no effect yet: ";
    for (size_t i = 0; i < compat_keys.size(); ++i) note += (i ? ", " : "") + compat_keys[i];
    cfg.notes.push_back(note);
  }
  // The launcher's world size (without initialising MPI), unless the caller plans for another.
  const int world = world_size > 0 ? world_size : launch_env().world_size;

  read_strategy(j, cfg, c);
  check_schedule_params(j, c);
  check_optimizer_params(j, c);
  read_bound(j, cfg, c);
  read_optimizer_defaults(j, cfg, c);
  read_mixed_precision(j, cfg, c);
  // The batch is per data-parallel rank; a world the tensor degree does not divide is train()'s
  // error (the reader may run without the launcher, as for `shardwise plan`).
  read_batch(j, cfg, std::max(1, cfg.parallelism.data_size(world)), c);
  read_lr_aliases(j, cfg, c);
  read_aio(j, cfg, c);
  read_activation_checkpointing(j, cfg, c);
  read_run_rules(j, cfg, c);
  check_config(cfg, world, c);

  // The resolved config: the input (compatibility keys kept as given) with every declared key
  // set to its effective value; parse_config(resolved_json) gives the same TrainConfig.
  json r = j;
  write_resolved(r, cfg);
  cfg.resolved_json = r.dump(2) + "\n";
  return cfg;
}

}  // namespace

}  // namespace config

TrainConfig parse_config(const std::string& json_text, const std::string& source,
                         const std::vector<std::string>& overrides, int world_size) {
  return config::read_config(config::parse_text(json_text, source), source, overrides,
                             world_size);
}

TrainConfig load_config_for_weights(const std::string& path, std::vector<std::string> overrides,
                                    const std::string& weights) {
  std::error_code ec;
  if (!weights.empty() &&
      std::filesystem::is_regular_file(std::filesystem::path(weights) / "config.json", ec)) {
    overrides.push_back("checkpoint.resume=\"\"");
    overrides.push_back("checkpoint.init_from=" + nlohmann::json(weights).dump());
  }
  return load_config(path, overrides);
}

TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides,
                        int world_size) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    fail("config", path + ": is a directory, not a config file");
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("config", path + ": cannot open (" + std::string(std::strerror(errno)) + ")");
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail("config", path + ": cannot read (" + std::string(std::strerror(errno)) + ")");
  return parse_config(ss.str(), path, overrides, world_size);
}

}  // namespace sw
