// Config parsing: defaults, DeepSpeed keys, and a test for every kind of user mistake, each
// checking that the message names the file and the key (or the override).
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/config.h"
#include "engine_test_util.h"

using namespace sw;
using Catch::Matchers::Contains;

namespace {
using enginetest::error_of;
using enginetest::parse;
}  // namespace

TEST_CASE("config: empty object gives the documented defaults") {
  const TrainConfig c = parse("{}");
  const TrainConfig d;  // the struct's defaults
  CHECK(c.micro_batch == d.micro_batch);
  CHECK(c.grad_accum == d.grad_accum);
  CHECK(c.train_steps == d.train_steps);
  CHECK(c.optimizer.lr == d.optimizer.lr);
  CHECK(c.scheduler.type == "WarmupCosineLR");
  CHECK(c.zero_stage == 3);
  CHECK(c.model.type == "gpt2");
  CHECK(c.source == "cfg.json");
  CHECK(c.notes.empty());
}

TEST_CASE("config: DeepSpeed-style config lands in the right fields") {
  const TrainConfig c = parse(R"({
    "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "train_batch_size": 8,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.8, 0.99], "eps": 1e-6, "weight_decay": 0.01}},
    "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 5, "total_num_steps": 50,
                  "warmup_min_ratio": 0.1, "cos_min_ratio": 0.2}},
    "gradient_clipping": 0.5, "bf16": {"enabled": false}, "fp16": {"enabled": false},
    "zero_optimization": {"stage": 2},
    "model": {"type": "llama", "vocab_size": 512, "n_layer": 2, "n_head": 4, "n_kv_head": 2, "d_model": 64,
              "d_ff": 160, "seq_len": 32, "rope_theta": 500000, "norm_eps": 1e-6, "tie_embeddings": false},
    "data": {"train": "a.bin", "val": "b.bin"}, "train_steps": 50, "seed": 7, "run_dir": "runs/x",
    "eval_every_steps": 10, "eval_batches": 3, "log_every_steps": 5, "threads": 2})");
  CHECK(c.micro_batch == 4);
  CHECK(c.grad_accum == 2);
  CHECK(c.optimizer.lr == 1e-3f);
  CHECK(c.optimizer.beta1 == 0.8f);
  CHECK(c.optimizer.beta2 == 0.99f);
  CHECK(c.optimizer.eps == 1e-6f);
  CHECK(c.optimizer.weight_decay == 0.01f);
  CHECK(c.scheduler.warmup_num_steps == 5);
  CHECK(c.scheduler.total_num_steps == 50);
  CHECK(c.scheduler.warmup_min_ratio == 0.1f);
  CHECK(c.scheduler.cos_min_ratio == 0.2f);
  CHECK(c.grad_clip == 0.5f);
  CHECK(c.zero_stage == 2);
  CHECK(c.model.type == "llama");
  CHECK(c.model.vocab_size == 512);
  CHECK(c.model.n_kv_head == 2);
  CHECK(c.model.d_ff == 160);
  CHECK(c.model.rope_theta == 500000.f);
  CHECK(c.model.norm_eps == 1e-6f);
  CHECK(!c.model.tied());
  CHECK(c.train_data == "a.bin");
  CHECK(c.val_data == "b.bin");
  CHECK(c.seed == 7);
  CHECK(c.run_dir == "runs/x");
  CHECK(c.eval_every_steps == 10);
  CHECK(c.eval_batches == 3);
  CHECK(c.log_every_steps == 5);
  CHECK(c.threads == 2);
}

TEST_CASE("config: resolved_json re-loads to the same config") {
  const TrainConfig a = parse(R"({"optimizer": {"params": {"eps": 1e-7}}, "train_steps": 20,
                                  "zero_optimization": {"stage": 1, "overlap_comm": true},
                                  "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.002, "warmup_min_lr": 0.0002, "warmup_num_steps": 3}},
                                  "train_batch_size": 16, "train_micro_batch_size_per_gpu": 4})");
  CHECK(a.optimizer.lr == 0.002f);  // WarmupLR's warmup_max_lr is the peak lr
  CHECK(a.scheduler.warmup_min_ratio == Approx(0.1f));
  CHECK(a.grad_accum == 4);
  const TrainConfig b = parse_config(a.resolved_json, "resolved.json");
  CHECK(b.resolved_json == a.resolved_json);
  CHECK(b.optimizer.lr == a.optimizer.lr);
  CHECK(b.scheduler.warmup_min_ratio == a.scheduler.warmup_min_ratio);
  CHECK(b.grad_accum == 4);
  CHECK(b.micro_batch == 4);
  CHECK_THAT(a.resolved_json, Contains("\"overlap_comm\": true"));  // compatibility keys kept
  CHECK_THAT(a.resolved_json, Contains("\"n_layer\": 4"));          // defaults filled
}

TEST_CASE("config: unknown key names the path and suggests the nearest valid key") {
  CHECK(error_of(R"({"optimizer": {"parms": {"lr": 1e-3}}})") ==
        "config: cfg.json: unknown key 'optimizer.parms' (did you mean 'optimizer.params'?)");
  CHECK(error_of(R"({"train_setps": 3})") ==
        "config: cfg.json: unknown key 'train_setps' (did you mean 'train_steps'?)");
  // A key at the wrong level: suggest where it belongs.
  CHECK(error_of(R"({"lr": 0.1})") ==
        "config: cfg.json: unknown key 'lr' (did you mean 'optimizer.params.lr'?)");
  // Nothing close: list what is valid there.
  const std::string e = error_of(R"({"data": {"xyzzy_quux": "a"}})");
  CHECK_THAT(e, Contains("unknown key 'data.xyzzy_quux'"));
  CHECK_THAT(e, Contains("valid keys here: train, val"));
  CHECK_THAT(error_of(R"({"zero_optimization": {"offload_optimizer": {"devic": "cpu"}}})"),
             Contains("'zero_optimization.offload_optimizer.devic' (did you mean "
                      "'zero_optimization.offload_optimizer.device'?)"));
}

TEST_CASE("config: wrong type names the key and the expected type") {
  CHECK(error_of(R"({"optimizer": {"params": {"lr": "fast"}}})") ==
        "config: cfg.json: optimizer.params.lr: expected a number, got string \"fast\"");
  CHECK_THAT(error_of(R"({"train_steps": 2.5})"),
             Contains("train_steps: expected an integer, got number 2.5"));
  CHECK_THAT(error_of(R"({"optimizer": {"params": {"betas": [0.9]}}})"),
             Contains("optimizer.params.betas: expected an array of two numbers"));
  CHECK_THAT(error_of(R"({"model": 3})"), Contains("model: expected an object, got number 3"));
  CHECK_THAT(error_of(R"({"bf16": {"enabled": "yes"}})"),
             Contains("bf16.enabled: expected true or false"));
  CHECK_THAT(error_of(R"({"data": {"train": 5}})"), Contains("data.train: expected a string"));
  CHECK_THAT(error_of(R"({"seed": -1})"), Contains("seed: must be >= 0"));
  CHECK(parse(R"({"train_steps": 1e3})").train_steps == 1000);  // integral floats are integers
}

TEST_CASE("config: out-of-range values name the key and the range") {
  CHECK(error_of(R"({"optimizer": {"params": {"lr": 0}}})") ==
        "config: cfg.json: optimizer.params.lr: must be > 0 (got 0)");
  CHECK_THAT(error_of(R"({"optimizer": {"params": {"lr": -1e-3}}})"),
             Contains("optimizer.params.lr: must be > 0"));
  CHECK_THAT(error_of(R"({"optimizer": {"params": {"betas": [0.9, 1.0]}}})"),
             Contains("optimizer.params.betas[1]: must be [0, 1) (got 1)"));
  CHECK_THAT(error_of(R"({"optimizer": {"params": {"betas": [-0.1, 0.9]}}})"),
             Contains("optimizer.params.betas[0]: must be [0, 1)"));
  CHECK_THAT(error_of(R"({"zero_optimization": {"stage": 4}})"),
             Contains("zero_optimization.stage: must be in [0, 3] (got 4)"));
  CHECK_THAT(error_of(R"({"model": {"seq_len": 0}})"),
             Contains("model.seq_len: must be >= 1 (got 0)"));
  CHECK_THAT(error_of(R"({"model": {"vocab_size": 2147483648}})"),
             Contains("model.vocab_size: must be <= 2147483647 (got 2147483648)"));
  CHECK_THAT(error_of(R"({"model": {"vocab_size": 0}})"),
             Contains("model.vocab_size: must be >= 1 (got 0)"));
  CHECK_THAT(error_of(R"({"train_micro_batch_size_per_gpu": 0})"),
             Contains("train_micro_batch_size_per_gpu: must be >= 1"));
  CHECK_THAT(error_of(R"({"gradient_accumulation_steps": -2})"),
             Contains("gradient_accumulation_steps: must be >= 1"));
  CHECK_THAT(error_of(R"({"optimizer": {"params": {"eps": 0}}})"),
             Contains("optimizer.params.eps: must be > 0"));
  CHECK_THAT(error_of(R"({"scheduler": {"params": {"cos_min_ratio": 1.5}}})"),
             Contains("scheduler.params.cos_min_ratio: must be [0, 1] (got 1.5)"));
  CHECK_THAT(error_of(R"({"scheduler": {"params": {"warmup_num_steps": 20}}, "train_steps": 10})"),
             Contains("scheduler.params.warmup_num_steps: must be <= total_num_steps (10"));
  CHECK_THAT(error_of(R"({"model": {"d_model": 100, "n_head": 3}})"),
             Contains("model.d_model: must be a multiple of model.n_head"));
  CHECK_THAT(error_of(R"({"optimizer": {"type": "Adagrad"}})"),
             Contains("optimizer.type: 'Adagrad' is not one of AdamW, Adam, SGD, LARS, Lamb"));
  CHECK_THAT(
      error_of(R"({"scheduler": {"type": "OneCycle"}})"),
      Contains("scheduler.type: 'OneCycle' is not one of WarmupCosineLR, WarmupLR, Constant"));
  CHECK_THAT(error_of(R"({"run_dir": ""})"), Contains("run_dir: must not be empty"));
}

TEST_CASE("config: batch sizes follow DeepSpeed's two-of-three rule") {
  CHECK(parse(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 8})").grad_accum == 4);
  CHECK(parse(R"({"train_batch_size": 32, "gradient_accumulation_steps": 2})").micro_batch == 16);
  CHECK(parse(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": "auto",
                  "gradient_accumulation_steps": "auto"})")
            .micro_batch == 32);
  CHECK(
      error_of(
          R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2})") ==
      "config: cfg.json: train_batch_size: must equal train_micro_batch_size_per_gpu * "
      "gradient_accumulation_steps * world size = 8 * 2 * 1 = 16 (got 30)");
  CHECK_THAT(
      error_of(R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 8})"),
      Contains("train_batch_size: 30 is not a multiple of train_micro_batch_size_per_gpu (8)"));
}

TEST_CASE("config: bf16 / fp16 / mixed_precision select the policy and loss scaling") {
  const TrainConfig d = parse("{}");
  CHECK(!d.bf16);
  CHECK(!d.fp16);
  CHECK(!d.sharding.mixed_precision.enabled());
  const TrainConfig b = parse(R"({"bf16": {"enabled": true}})");
  CHECK(b.bf16);
  CHECK(b.sharding.mixed_precision.param_dtype == DType::BF16);
  CHECK(b.sharding.mixed_precision.reduce_dtype == DType::BF16);
  // reduce_dtype follows param_dtype unless given; the block overrides what bf16 implies.
  const TrainConfig b2 = parse(R"({"bf16": {"enabled": true},
                                   "mixed_precision": {"reduce_dtype": "fp32"}})");
  CHECK(b2.sharding.mixed_precision.param_dtype == DType::BF16);
  CHECK(b2.sharding.mixed_precision.reduce_dtype == DType::F32);
  const TrainConfig p = parse(R"({"mixed_precision": {"param_dtype": "bf16"}})");
  CHECK(p.sharding.mixed_precision.reduce_dtype == DType::BF16);
  CHECK(!p.bf16);
  // fp16 with DeepSpeed's loss-scaling keys and defaults.
  const TrainConfig f = parse(R"({"fp16": {"enabled": true}})");
  CHECK(f.fp16);
  CHECK(f.sharding.mixed_precision.param_dtype == DType::F16);
  CHECK(f.loss_scaler.loss_scale == 0);
  CHECK(f.loss_scaler.initial_scale_power == 16);
  CHECK(f.loss_scaler.loss_scale_window == 1000);
  CHECK(f.loss_scaler.hysteresis == 2);
  CHECK(f.loss_scaler.min_loss_scale == 1);
  const TrainConfig f2 = parse(R"({"fp16": {"enabled": true, "loss_scale": 128,
      "initial_scale_power": 12, "loss_scale_window": 50, "hysteresis": 3, "min_loss_scale": 0.25,
      "consecutive_hysteresis": true}})");
  CHECK(f2.loss_scaler.loss_scale == 128);
  CHECK(f2.loss_scaler.initial_scale_power == 12);
  CHECK(f2.loss_scaler.loss_scale_window == 50);
  CHECK(f2.loss_scaler.hysteresis == 3);
  CHECK(f2.loss_scaler.min_loss_scale == 0.25);
  CHECK(f2.loss_scaler.consecutive_hysteresis);
  // The resolved config reads back to the same values.
  for (const TrainConfig* c : {&b2, &f2}) {
    const TrainConfig r = parse_config(c->resolved_json, "r");
    CHECK(r.resolved_json == c->resolved_json);
    CHECK(r.sharding.mixed_precision.param_dtype == c->sharding.mixed_precision.param_dtype);
    CHECK(r.sharding.mixed_precision.reduce_dtype == c->sharding.mixed_precision.reduce_dtype);
    CHECK(r.loss_scaler.hysteresis == c->loss_scaler.hysteresis);
  }
  // Mistakes.
  CHECK_THAT(error_of(R"({"bf16": {"enabled": true}, "fp16": {"enabled": true}})"),
             Contains("cfg.json: fp16.enabled: bf16.enabled and fp16.enabled are both true"));
  CHECK_THAT(error_of(R"({"mixed_precision": {"param_dtype": "fp16"}})"),
             Contains("cfg.json: mixed_precision.param_dtype: fp16 needs loss scaling"));
  CHECK_THAT(error_of(R"({"mixed_precision": {"param_dtype": "half"}})"),
             Contains("mixed_precision.param_dtype: 'half' is not one of fp32, bf16, fp16"));
  CHECK_THAT(error_of(R"({"mixed_precision": {"reduce_dtyp": "bf16"}})"),
             Contains("did you mean 'mixed_precision.reduce_dtype'"));
  CHECK_THAT(error_of(R"({"fp16": {"enabled": true, "hysteresis": 0}})"),
             Contains("fp16.hysteresis: must be >= 1"));
  CHECK_THAT(error_of(R"({"fp16": {"enabled": true, "min_loss_scale": 0}})"),
             Contains("fp16.min_loss_scale: must be > 0"));
}

TEST_CASE("config: DeepSpeed keys without effect are accepted and reported as one note") {
  const TrainConfig c = parse(
      R"({"zero_optimization": {"stage": 3, "overlap_comm": true, "reduce_bucket_size": "auto",
      "contiguous_gradients": true, "offload_optimizer": {"device": "cpu", "pin_memory": true}},
      "steps_per_print": 10, "wall_clock_breakdown": false})");
  REQUIRE(c.notes.size() == 1);
  CHECK_THAT(c.notes[0], Contains("zero_optimization.overlap_comm"));
  CHECK_THAT(c.notes[0], Contains("zero_optimization.offload_optimizer"));
  CHECK_THAT(c.notes[0], Contains("steps_per_print"));
  // Adam is DeepSpeed's Adam, which is AdamW by default; L2-mode Adam is refused.
  CHECK(
      parse(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": true}}})").optimizer.type ==
      "Adam");
  CHECK_THAT(error_of(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})"),
             Contains("optimizer.params.adam_w_mode: only decoupled weight decay"));
  // A parameter of another schedule.
  CHECK_THAT(
      error_of(R"({"scheduler": {"type": "WarmupLR", "params": {"cos_min_ratio": 0.1}}})"),
      Contains("scheduler.params.cos_min_ratio: not a parameter of scheduler type WarmupLR"));
  CHECK_THAT(
      error_of(
          R"({"optimizer": {"params": {"lr": 1e-3}}, "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 2e-3}}})"),
      Contains("scheduler.params.warmup_max_lr: is the peak learning rate and conflicts with "
               "optimizer.params.lr (0.002 vs 0.001)"));
}

TEST_CASE("config: syntax errors give file:line:column and duplicates or non-objects are refused") {
  CHECK_THAT(error_of("{\n  \"train_steps\": 1,\n}"),
             Contains("config: cfg.json:3:1: invalid JSON: syntax error"));
  CHECK_THAT(error_of(""), Contains("config: cfg.json:1:1: invalid JSON"));
  CHECK(error_of(R"({"optimizer": {"params": {"lr": 1, "lr": 2}}})") ==
        "config: cfg.json: duplicate key 'optimizer.params.lr'");
  CHECK_THAT(error_of("[1, 2]"), Contains("cfg.json: the top level must be a JSON object"));
}

TEST_CASE("config: missing or unreadable files are named") {
  const std::string missing = "/nonexistent-dir/cfg.json";
  CHECK_THROWS_WITH(load_config(missing),
                    Contains("config: /nonexistent-dir/cfg.json: cannot open"));
  const auto dir = std::filesystem::temp_directory_path();
  CHECK_THROWS_WITH(load_config(dir.string()), Contains(dir.string() + ": is a directory"));
  const auto p = dir / "sw_test_config_bad.json";
  { std::ofstream(p) << "{\"model\": {\"n_layer\": }}"; }
  CHECK_THROWS_WITH(load_config(p.string()), Contains(p.string() + ":1:23: invalid JSON"));
  { std::ofstream(p) << "{\"train_steps\": 7}"; }
  CHECK(load_config(p.string()).train_steps == 7);
  std::filesystem::remove(p);
}

TEST_CASE("config: --set overrides keys and creates objects and parses JSON or takes strings") {
  const TrainConfig c =
      parse(R"({"optimizer": {"params": {"lr": 1e-3}}})",
            {"optimizer.params.lr=2e-3", "scheduler.params.warmup_num_steps=4",
             "run_dir=runs/with spaces", "optimizer.params.betas=[0.5,0.6]", "model.type=llama"});
  CHECK(c.optimizer.lr == 2e-3f);
  CHECK(c.scheduler.warmup_num_steps == 4);
  CHECK(c.run_dir == "runs/with spaces");
  CHECK(c.optimizer.beta1 == 0.5f);
  CHECK(c.model.type == "llama");
  CHECK_THAT(c.resolved_json, Contains("\"run_dir\": \"runs/with spaces\""));
}

TEST_CASE("config: bad overrides are named") {
  CHECK(error_of("{}", {"optimizer.parms.lr=1"}) ==
        "config: cfg.json: unknown key 'optimizer.parms' (from --set optimizer.parms.lr=1) "
        "(did you mean 'optimizer.params'?)");
  CHECK_THAT(error_of("{}", {"lr"}), Contains("--set 'lr': expected KEY=VALUE"));
  CHECK_THAT(error_of("{}", {"optimizer..lr=1"}), Contains("empty component"));
  CHECK(error_of("{}", {"optimizer.params.lr=fast"}) ==
        "config: cfg.json: optimizer.params.lr: expected a number, got string \"fast\" "
        "(from --set optimizer.params.lr=fast)");
  CHECK_THAT(error_of("{}", {"data.train=3"}),
             Contains("data.train: expected a string, got number 3 (from --set data.train=3)"));
  CHECK_THAT(error_of("{}", {"optimizer.params.lr.x=1"}),
             Contains("'optimizer.params.lr' is a number, it has no key 'x'"));
  CHECK_THAT(error_of(R"({"optimizer": 5})", {"optimizer.type=Adam"}),
             Contains("cannot set 'optimizer.type' because its parent is number 5"));
  CHECK_THAT(error_of("{}", {"zero_optimization.stage=7"}),
             Contains("zero_optimization.stage: must be in [0, 3] (got 7) (from --set "
                      "zero_optimization.stage=7)"));
}

TEST_CASE("config: config_json round-trips programmatic and llama configs") {
  TrainConfig c;
  c.model.type = "llama";
  c.model.tie_embeddings = false;
  c.model.n_kv_head = 2;
  c.optimizer.lr = 1.7e-4f;
  c.scheduler.type = "Constant";
  c.seed = 18446744073709551615ull;
  c.checkpoint.every_steps = 7;
  c.checkpoint.keep_last = 0;
  c.checkpoint.async = true;
  c.checkpoint.save_final = false;
  c.checkpoint.resume = "auto";
  const TrainConfig b = parse_config(config_json(c), "x");
  CHECK(b.checkpoint.dir == "runs/default/checkpoints");  // "" in code: the default
  CHECK(b.checkpoint.every_steps == 7);
  CHECK(b.checkpoint.keep_last == 0);
  CHECK(b.checkpoint.async);
  CHECK(!b.checkpoint.save_final);
  CHECK(b.checkpoint.resume == "auto");
  CHECK(b.model.type == "llama");
  CHECK(b.model.n_kv_head == 2);
  CHECK(b.optimizer.lr == 1.7e-4f);
  CHECK(b.scheduler.type == "Constant");
  CHECK(b.seed == c.seed);
  CHECK(config_json(b) == config_json(c));
  // Mixed precision set in code: bf16 alone implies the policy; fp16 keeps its scaler keys.
  TrainConfig m;
  m.bf16 = true;
  CHECK(parse_config(config_json(m), "x").sharding.mixed_precision.param_dtype == DType::BF16);
  m.bf16 = false, m.fp16 = true;
  m.loss_scaler.initial_scale_power = 9;
  const TrainConfig mf = parse_config(config_json(m), "x");
  CHECK(mf.sharding.mixed_precision.reduce_dtype == DType::F16);
  CHECK(mf.loss_scaler.initial_scale_power == 9);
  CHECK(config_json(mf) == config_json(m));
  const TrainConfig l = parse(R"({"model": {"type": "llama"}})");
  CHECK(parse_config(l.resolved_json, "r").resolved_json == l.resolved_json);
}

TEST_CASE("config: sharding keys select the strategy and its options") {
  const TrainConfig d = parse("{}");
  CHECK(d.sharding.strategy == ShardingStrategy::FullShard);
  CHECK(d.sharding.reshard_after_forward);
  CHECK(d.sharding.accum == GradAccumMode::ReduceEachMicroStep);
  CHECK(d.blocks_per_unit == 1);
  // Stages map to strategies, with the strategy's defaults.
  const TrainConfig s0 = parse(R"({"zero_optimization": {"stage": 0}})");
  CHECK(s0.sharding.strategy == ShardingStrategy::NoShard);
  CHECK(s0.sharding.accum == GradAccumMode::ReduceOnce);
  const TrainConfig s2 = parse(R"({"zero_optimization": {"stage": 2}})");
  CHECK(s2.sharding.strategy == ShardingStrategy::ShardGradOp);
  CHECK(!s2.sharding.reshard_after_forward);
  CHECK(parse(R"({"zero_optimization": {"stage": 1}})").sharding.strategy ==
        ShardingStrategy::ShardOptimizer);
  // FSDP names; the stage follows.
  const TrainConfig h = parse(R"({"sharding_strategy": "HYBRID_SHARD", "shard_group_size": 1,
                                  "forward_prefetch": false, "backward_prefetch": 2,
                                  "max_live_units": 3, "blocks_per_unit": 4,
                                  "gradient_accumulation_mode": "reduce_once",
                                  "comm_timeout_s": 12.5, "comm_debug": true,
                                  "reshard_after_forward": false})");
  CHECK(h.sharding.strategy == ShardingStrategy::HybridShard);
  CHECK(h.zero_stage == 3);
  CHECK(h.sharding.shard_group_size == 1);
  CHECK(h.sharding.forward_prefetch == 0);
  CHECK(h.sharding.backward_prefetch == 2);
  CHECK(h.sharding.max_live_units == 3);
  CHECK(h.blocks_per_unit == 4);
  CHECK(h.sharding.accum == GradAccumMode::ReduceOnce);
  CHECK(h.comm_timeout_s == 12.5);
  CHECK(h.comm_debug);
  CHECK(!h.sharding.reshard_after_forward);
  CHECK(parse(R"({"forward_prefetch": true})").sharding.forward_prefetch == 1);
  // Agreeing stage and name are fine.
  CHECK(parse(R"({"zero_optimization": {"stage": 0}, "sharding_strategy": "NO_SHARD"})")
            .sharding.strategy == ShardingStrategy::NoShard);
  // The resolved config re-loads to the same policy.
  const TrainConfig r = parse_config(h.resolved_json, "resolved.json");
  CHECK(r.resolved_json == h.resolved_json);
  CHECK(r.sharding.describe() == h.sharding.describe());
  CHECK(r.blocks_per_unit == 4);
  CHECK(r.comm_debug);
  // Code that sets only zero_stage (or only sharding.strategy) round-trips through config_json.
  TrainConfig c;
  c.zero_stage = 2;
  CHECK(parse_config(config_json(c), "x").sharding.strategy == ShardingStrategy::ShardGradOp);
  CHECK(!parse_config(config_json(c), "x").sharding.reshard_after_forward);
  TrainConfig c2;
  c2.sharding = ShardingPolicy::for_strategy(ShardingStrategy::NoShard);
  CHECK(parse_config(config_json(c2), "x").zero_stage == 0);
}

TEST_CASE("config: memory_budget takes bytes or a size string and round-trips") {
  CHECK(parse("{}").memory_budget == 0);
  CHECK(parse(R"({"memory_budget": 123456})").memory_budget == 123456);
  CHECK(parse(R"({"memory_budget": "12GiB"})").memory_budget == (size_t{12} << 30));
  CHECK(parse(R"({"memory_budget": "1.5 GB"})").memory_budget == 1500000000);
  CHECK(parse(R"({"memory_budget": "800kib"})").memory_budget == 800 * 1024);
  const TrainConfig c = parse(R"({"memory_budget": "512MiB"})");
  const TrainConfig r = parse_config(c.resolved_json, "resolved.json");
  CHECK(r.memory_budget == (size_t{512} << 20));
  CHECK(r.resolved_json == c.resolved_json);
  TrainConfig code;
  code.memory_budget = 777;
  CHECK(parse_config(config_json(code), "x").memory_budget == 777);
  CHECK_THAT(error_of(R"({"memory_budget": "12 gigs"})"),
             Contains("cfg.json: memory_budget: '12 gigs': unknown unit 'gigs'"));
  CHECK_THAT(error_of(R"({"memory_budget": -1})"), Contains("cfg.json: memory_budget: must be >= 0"));
  CHECK_THAT(error_of(R"({"memory_budget": "-1GiB"})"),
             Contains("cfg.json: memory_budget: '-1GiB': a size cannot be negative"));
  CHECK_THAT(error_of(R"({"memory_budget": ""})"), Contains("memory_budget: '': empty size"));
  CHECK_THAT(error_of(R"({"memory_budget": "99999999999TiB"})"), Contains("memory_budget: '99999999999TiB': too large"));
  CHECK_THAT(error_of(R"({"memory_budget": 1.5})"), Contains("memory_budget: expected a whole number"));
  CHECK_THAT(error_of(R"({"memory_budget": true})"), Contains("memory_budget: expected a number of bytes"));
}

TEST_CASE("config: activation_checkpointing.offload") {
  const TrainConfig a = parse(R"({"activation_checkpointing": {"offload": "cpu"}})");
  CHECK(a.sharding.activation_checkpointing.offload_cpu);
  CHECK(a.sharding.activation_checkpointing.mode == CheckpointMode::Off);
  const TrainConfig b = parse(R"({"activation_checkpointing": {"mode": "selective", "offload": "cpu"}})");
  CHECK(b.sharding.activation_checkpointing.offload_cpu);
  CHECK(b.sharding.activation_checkpointing.mode == CheckpointMode::Selective);
  CHECK(parse_config(b.resolved_json, "r.json").sharding.activation_checkpointing.offload_cpu);
  CHECK(!parse(R"({"activation_checkpointing": "full"})").sharding.activation_checkpointing.offload_cpu);
  CHECK_THAT(error_of(R"({"activation_checkpointing": {"offload": "gpu"}})"),
             Contains("activation_checkpointing.offload: 'gpu' is not one of none, cpu, nvme"));
  CHECK_THAT(error_of(R"({"activation_checkpointing": {"offload": "nvme"}})"),
             Contains("activation_checkpointing.nvme_path: required with offload 'nvme'"));
  const TrainConfig an = parse(R"({"activation_checkpointing": {"offload": "nvme", "nvme_path": "/tmp/a"}})");
  CHECK(an.sharding.activation_checkpointing.offload_nvme);
  CHECK(parse_config(an.resolved_json, "r.json").sharding.activation_checkpointing.nvme_path == "/tmp/a");
  // Without its own key it takes the parameters' (or the optimizer's) directory.
  CHECK(parse(R"({"activation_checkpointing": {"offload": "nvme"}, "zero_optimization":
                  {"offload_optimizer": {"device": "nvme", "nvme_path": "/tmp/o"}}})")
            .sharding.activation_checkpointing.nvme_path == "/tmp/o");
}

TEST_CASE("config: zero_optimization.offload_optimizer device and ratio") {
  CHECK(parse("{}").sharding.offload_optimizer.device == OffloadDevice::None);
  const TrainConfig c = parse(
      R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.5,
          "pin_memory": true}}})");
  CHECK(c.sharding.offload_optimizer.device == OffloadDevice::Cpu);
  CHECK(c.sharding.offload_optimizer.ratio == 0.5);
  const TrainConfig r = parse_config(c.resolved_json, "resolved.json");
  CHECK(r.sharding.offload_optimizer.device == OffloadDevice::Cpu);
  CHECK(r.sharding.offload_optimizer.ratio == 0.5);
  CHECK_THAT(error_of(R"({"zero_optimization": {"offload_optimizer": {"device": "gpu"}}})"),
             Contains("zero_optimization.offload_optimizer.device: 'gpu' is not one of none, cpu, nvme"));
  CHECK_THAT(error_of(R"({"zero_optimization": {"offload_optimizer": {"device": "nvme"}}})"),
             Contains("zero_optimization.offload_optimizer.nvme_path: required with device 'nvme'"));
  const TrainConfig nv = parse(R"({"zero_optimization": {"offload_optimizer": {"device": "nvme",
                                   "nvme_path": "/tmp/x", "buffer_count": 3}}})");
  CHECK(nv.sharding.offload_optimizer.device == OffloadDevice::Nvme);
  CHECK(nv.sharding.offload_optimizer.buffer_count == 3);
  CHECK(parse_config(nv.resolved_json, "r.json").sharding.offload_optimizer.nvme_path == "/tmp/x");
  CHECK_THAT(error_of(R"({"zero_optimization": {"offload_optimizer": {"device": "nvme",
                         "nvme_path": "/tmp/x", "buffer_count": 1}}})"),
             Contains("zero_optimization.offload_optimizer.buffer_count: must be"));
  CHECK_THAT(error_of(R"({"zero_optimization": {"offload_optimizer": {"device": "cpu", "ratio": 1.5}}})"),
             Contains("zero_optimization.offload_optimizer.ratio: must be [0, 1]"));
  const TrainConfig p = parse(R"({"zero_optimization": {"offload_param": {"device": "cpu",
                                  "buffer_size": 1e8, "max_in_cpu": 1e9}}})");
  CHECK(p.sharding.offload_param.device == OffloadDevice::Cpu);
  CHECK(parse_config(p.resolved_json, "r.json").sharding.offload_param.device == OffloadDevice::Cpu);
  CHECK_THAT(error_of(R"({"zero_optimization": {"offload_param": {"device": "nvme"}}})"),
             Contains("zero_optimization.offload_param.nvme_path: required with device 'nvme'"));
  const TrainConfig pn = parse(R"({"zero_optimization": {"offload_param": {"device": "nvme",
                                   "nvme_path": "/tmp/p", "buffer_count": 3}}})");
  CHECK(pn.sharding.offload_param.device == OffloadDevice::Nvme);
  CHECK(pn.sharding.offload_param.buffer_count == 3);
  const TrainConfig pr = parse_config(pn.resolved_json, "r.json");
  CHECK(pr.sharding.offload_param.nvme_path == "/tmp/p");
  CHECK(pr.sharding.offload_param.buffer_count == 3);
  CHECK_THAT(error_of(R"({"zero_optimization": {"stage": 1, "offload_param": {"device": "nvme",
                         "nvme_path": "/tmp/p"}}})"),
             Contains("zero_optimization.offload_param.device: 'nvme' needs a strategy that "
                      "shards parameters"));
}

TEST_CASE("config: the aio block (DeepSpeed's keys, backend, o_direct)") {
  const TrainConfig d = parse("{}");
  CHECK(d.sharding.aio.block_size == (size_t{1} << 20));
  CHECK(d.sharding.aio.backend == AioBackend::Auto);
  const TrainConfig c = parse(R"({"aio": {"block_size": "2MiB", "queue_depth": 16,
      "thread_count": 3, "single_submit": true, "overlap_events": false, "backend": "threads",
      "o_direct": false}})");
  const AioConfig& a = c.sharding.aio;
  CHECK(a.block_size == (size_t{2} << 20));
  CHECK(a.queue_depth == 16);
  CHECK(a.intra_op_parallelism == 3);
  CHECK(a.single_submit);
  CHECK(!a.overlap_events);
  CHECK(a.backend == AioBackend::Threads);
  CHECK(!a.o_direct);
  // The resolved config holds every key (thread_count as intra_op_parallelism) and reloads.
  const nlohmann::json rj = nlohmann::json::parse(c.resolved_json);
  CHECK(rj.at("aio").at("block_size") == (size_t{2} << 20));
  CHECK(rj.at("aio").at("intra_op_parallelism") == 3);
  CHECK(rj.at("aio").at("backend") == "threads");
  CHECK(!rj.at("aio").contains("thread_count"));
  const AioConfig& b = parse_config(c.resolved_json, "r.json").sharding.aio;
  CHECK((b.block_size == a.block_size && b.queue_depth == a.queue_depth &&
         b.intra_op_parallelism == 3 && b.single_submit && !b.overlap_events &&
         b.backend == AioBackend::Threads && !b.o_direct));
  // Bad values: one config line naming the key.
  CHECK(error_of(R"({"aio": {"block_size": 1000}})") ==
        "config: cfg.json: aio.block_size: expected a positive multiple of 4096 bytes (an "
        "integer or \"1MiB\") up to 1GiB, got 1000");
  CHECK(error_of(R"({"aio": {"queue_depth": 0}})") ==
        "config: cfg.json: aio.queue_depth: expected an integer in [1, 4096], got 0");
  CHECK(error_of(R"({"aio": {"backend": "libaio"}})") ==
        "config: cfg.json: aio.backend: expected \"auto\", \"io_uring\" or \"threads\", got \"libaio\"");
  CHECK_THAT(error_of(R"({"aio": {"thread_count": 2, "intra_op_parallelism": 3}})"),
             Contains("config: cfg.json: aio.thread_count: 2 contradicts aio.intra_op_parallelism = 3"));
  CHECK_THAT(error_of(R"({"aio": {"o_direct": "yes"}})"),
             Contains("config: cfg.json: aio.o_direct: expected true or false"));
  CHECK_THAT(error_of(R"({"aio": {"queue_deph": 4}})"),
             Contains("unknown key 'aio.queue_deph' (did you mean 'aio.queue_depth'?)"));
}

TEST_CASE("config: sharding mistakes name the key") {
  CHECK_THAT(error_of(R"({"zero_optimization": {"stage": 2}, "sharding_strategy": "FULL_SHARD"})"),
             Contains("cfg.json: sharding_strategy: 'FULL_SHARD' is ZeRO stage 3 but "
                      "zero_optimization.stage is 2"));
  CHECK_THAT(error_of(R"({"sharding_strategy": "FULL"})"),
             Contains("sharding_strategy: 'FULL' is not one of FULL_SHARD, SHARD_GRAD_OP"));
  CHECK_THAT(error_of(R"({"shard_group_size": 2})"),
             Contains("shard_group_size: is only used by HYBRID_SHARD (the strategy is FULL_SHARD)"));
  CHECK_THAT(error_of(R"({"sharding_strategy": "NO_SHARD", "reshard_after_forward": true})"),
             Contains("reshard_after_forward: only applies to FULL_SHARD, SHARD_GRAD_OP and "
                      "HYBRID_SHARD (NO_SHARD keeps full parameters on every rank)"));
  CHECK_THAT(error_of(R"({"sharding_strategy": "HYBRID_SHARD", "shard_group_size": 2})"),
             Contains("shard_group_size: must divide the world size (1), got 2"));
  CHECK_THAT(error_of(R"({"forward_prefetch": "yes"})"),
             Contains("forward_prefetch: expected true, false or a number of units >= 0"));
  CHECK_THAT(error_of(R"({"backward_prefetch": -1})"), Contains("backward_prefetch: must be in [0, 1024]"));
  CHECK_THAT(error_of(R"({"blocks_per_unit": 0})"), Contains("blocks_per_unit: must be >= 1"));
  CHECK_THAT(error_of(R"({"gradient_accumulation_mode": "once"})"),
             Contains("gradient_accumulation_mode: 'once' is not one of reduce_each_micro_step, "
                      "reduce_once"));
  CHECK_THAT(error_of(R"({"comm_timeout_s": -1})"), Contains("comm_timeout_s: must be >= 0"));
  CHECK_THAT(error_of(R"({"sharding_stratgy": "NO_SHARD"})"),
             Contains("did you mean 'sharding_strategy'?"));
}

TEST_CASE("config: the profile block with its range checks and its round trip") {
  const TrainConfig d = parse("{}");
  CHECK(!d.profile.enabled);
  CHECK(d.profile.start_step == 1);
  CHECK(d.profile.num_steps == 1);
  CHECK(d.profile.out == "runs/default/profile");  // <run_dir>/profile
  CHECK(parse(R"({"run_dir": "r/x"})").profile.out == "r/x/profile");

  const TrainConfig p = parse(R"({"train_steps": 10, "profile": {"enabled": true,
      "start_step": 3, "num_steps": 8, "out": "/tmp/prof"}})");
  CHECK(p.profile.enabled);
  CHECK(p.profile.start_step == 3);
  CHECK(p.profile.num_steps == 8);
  CHECK(p.profile.out == "/tmp/prof");
  const TrainConfig r = parse_config(p.resolved_json, "r");
  CHECK(r.profile.enabled);
  CHECK(r.profile.start_step == 3);
  CHECK(r.profile.num_steps == 8);
  CHECK(r.profile.out == "/tmp/prof");
  CHECK(config_json(r) == config_json(p));
  TrainConfig c;  // set in code, out left empty: the default after the round trip
  c.profile.enabled = true, c.profile.start_step = 2, c.profile.num_steps = 4;
  const TrainConfig cr = parse_config(config_json(c), "x");
  CHECK(cr.profile.start_step == 2);
  CHECK(cr.profile.num_steps == 4);
  CHECK(cr.profile.out == "runs/default/profile");

  CHECK(error_of(R"({"profile": {"start_step": 0}})") ==
        "config: cfg.json: profile.start_step: must be >= 1 (got 0)");
  CHECK_THAT(error_of(R"({"profile": {"num_steps": 0}})"),
             Contains("profile.num_steps: must be >= 1 (got 0)"));
  CHECK_THAT(error_of(R"({"profile": {"enabled": 1}})"), Contains("profile.enabled: expected"));
  CHECK_THAT(error_of(R"({"profile": {"out": ""}})"), Contains("profile.out: must not be empty"));
  CHECK_THAT(error_of(R"({"profile": {"stat_step": 2}})"),
             Contains("unknown key 'profile.stat_step' (did you mean 'profile.start_step'?)"));
  CHECK(error_of(R"({"train_steps": 10, "profile": {"enabled": true, "start_step": 11}})") ==
        "config: cfg.json: profile.start_step: must be <= train_steps (10), got 11");
  CHECK(error_of(R"({"train_steps": 10, "profile": {"enabled": true, "start_step": 5,
                    "num_steps": 7}})") ==
        "config: cfg.json: profile.num_steps: 7 steps from profile.start_step 5 end at step 11, "
        "beyond train_steps (10)");
  // A disabled block is not held against a shorter run; --set reaches the keys.
  CHECK(error_of(R"({"train_steps": 10, "profile": {"start_step": 50}})") == "(no error)");
  CHECK_THAT(error_of(R"({"train_steps": 10})", {"profile.enabled=true", "profile.start_step=12"}),
             Contains("profile.start_step: must be <= train_steps (10), got 12"));
}

TEST_CASE("config: optimizer types SGD, LARS and Lamb with their keys (issue 38)") {
  const TrainConfig s = parse(
      R"({"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "nesterov": true}}})");
  CHECK(s.optimizer.type == "SGD");
  CHECK(s.optimizer.momentum == 0.9f);
  CHECK(s.optimizer.nesterov);
  CHECK(s.optimizer.weight_decay == 0.f);  // torch's default, not AdamW's 0.1
  const TrainConfig l = parse(R"({"optimizer": {"type": "Lamb", "params": {"max_coeff": 5}}})");
  CHECK(l.optimizer.beta2 == 0.999f);  // DeepSpeed's Lamb betas
  CHECK(l.optimizer.max_coeff == 5.f);
  CHECK(parse(R"({"optimizer": {"type": "LARS", "params": {"trust_coefficient": 0.02}}})")
            .optimizer.trust_coefficient == 0.02f);
  // The resolved config reads back the same.
  CHECK(parse(s.resolved_json).optimizer.nesterov);
  CHECK(parse(l.resolved_json).optimizer.beta2 == 0.999f);
  // A key of another type, torch's Nesterov rule, NVMe with per-tensor norms: one line each.
  CHECK_THAT(error_of(R"({"optimizer": {"type": "SGD", "params": {"betas": [0.9, 0.99]}}})"),
             Contains("optimizer.params.betas: not a parameter of optimizer type SGD"));
  CHECK_THAT(error_of(R"({"optimizer": {"type": "Lamb", "params": {"momentum": 0.9}}})"),
             Contains("optimizer.params.momentum: not a parameter of optimizer type Lamb"));
  CHECK_THAT(error_of(R"({"optimizer": {"params": {"max_coeff": 2}}})"),
             Contains("optimizer.params.max_coeff: not a parameter of optimizer type AdamW"));
  CHECK_THAT(error_of(R"({"optimizer": {"type": "SGD", "params": {"nesterov": true}}})"),
             Contains("optimizer.params.nesterov: needs momentum > 0 and dampening 0"));
  CHECK_THAT(error_of(R"({"optimizer": {"type": "LARS"}, "zero_optimization": {"stage": 3,
             "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}}})"),
             Contains("optimizer.type: LARS with NVMe offload is not implemented"));
  CHECK_THAT(error_of(R"({"optimizer": {"type": "Sgd"}})"), Contains("optimizer.type"));
}
