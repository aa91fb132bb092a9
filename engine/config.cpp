// JSON config: one declaration of every accepted key (schema(): type, range or allowed
// strings, default, description), validation with suggestions, --set overrides, defaults, the
// resolved (re-loadable) config, and README.md's key table (config_keys_markdown).
//
// Passes, in order:
//   1. parse the text (line:column on syntax errors; duplicate keys are errors);
//   2. apply --set overrides (the key path must exist in the schema);
//   3. walk the JSON against the schema: unknown keys (with the nearest valid key suggested)
//      and wrong types throw; null is "not set"; keys accepted only for DeepSpeed
//      compatibility become notes;
//   4. read values into TrainConfig with the declared defaults and range checks (messages name
//      key path and range); the rules between keys (conflicts, derived defaults) are code;
//   5. write the resolved config: the input with every declared key set to its effective value
//      (null where it does not apply to the run; aliases resolved into their keys).
//
// DeepSpeed compatibility decisions (see docs/ARCHITECTURE.md):
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
//     1 without a launcher); all three must agree.
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
#include "engine/config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

#include "core/bytes.h"
#include "core/error.h"
#include "core/json_depth.h"
#include "core/launch.h"

namespace sw {
namespace {

using json = nlohmann::json;

// ---- Schema: the one declaration of every key -------------------------------------------------
//
// Each key is declared once, below: its type, range (or allowed strings), default, and one line
// for README's key table. The validation pass, the defaults and ranges read_config applies, the
// resolved config (every declared key with its effective value) and README.md's table
// (config_keys_markdown, tools/config_table, scripts/gen_config_table.sh) all come from it.

enum class Kind { Obj, Int, Num, Bool, Str, Betas, Any };

std::string num_str(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}
std::string num_str(float v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

constexpr double kInf = INFINITY;
constexpr long long IMAX = INT32_MAX;  // an integer range up to it reads ">= lo"

// Range for numbers: lo/hi with open or closed ends.
struct Range {
  double lo, hi;
  bool lo_open, hi_open;
  std::string str() const {
    if (std::isinf(hi)) return std::string(lo_open ? "> " : ">= ") + num_str(lo);
    return std::string(lo_open ? "(" : "[") + num_str(lo) + ", " + num_str(hi) +
           (hi_open ? ")" : "]");
  }
  bool ok(double x) const {
    return std::isfinite(x) && (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
  }
};
constexpr Range kPositive{0, kInf, true, false};     // > 0
constexpr Range kNonNegative{0, kInf, false, false};  // >= 0
constexpr Range kUnit{0, 1, false, false};            // [0, 1]

struct Node {
  std::string name;
  Kind kind = Kind::Any;
  std::vector<Node> kids;  // Kind::Obj (and Kind::Any values that may be objects)
  bool compat = false;     // accepted for DeepSpeed compatibility; no effect yet (a note)
  bool auto_ok = false;    // accepts Hugging Face's "auto"
  // Another spelling of a key that is declared too (the resolved config writes that one).
  bool alias = false;
  long long lo = 0, hi = IMAX;          // Kind::Int (and integer Kind::Any values)
  Range range{-kInf, kInf, false, false};  // Kind::Num; Kind::Betas: each element
  std::vector<std::string> choices;     // Kind::Str: the accepted strings (empty: any)
  json def;              // the default; null when there is none or it is derived (below)
  std::string derived;   // the default in words when def is null
  std::string accepts;   // Kind::Any: the accepted values in words
  std::string doc;       // one line for README's key table
  const Node* kid(const std::string& k) const {
    for (const Node& n : kids)
      if (n.name == k) return &n;
    return nullptr;
  }
};

Node obj(const char* name, std::vector<Node> kids) {
  Node n;
  n.name = name;
  n.kind = Kind::Obj;
  n.kids = std::move(kids);
  return n;
}
Node key(const char* name, Kind k, json def, const char* doc) {
  Node n;
  n.name = name;
  n.kind = k;
  n.def = std::move(def);
  n.doc = doc;
  return n;
}
// Integer in [lo, hi] (hi = IMAX: no upper bound).
Node integer(const char* name, long long def, long long lo, long long hi, const char* doc) {
  Node n = key(name, Kind::Int, def, doc);
  n.lo = lo, n.hi = hi;
  return n;
}
Node number(const char* name, double def, Range r, const char* doc) {
  Node n = key(name, Kind::Num, def, doc);
  n.range = r;
  return n;
}
Node boolean(const char* name, bool def, const char* doc) {
  return key(name, Kind::Bool, def, doc);
}
Node string(const char* name, const char* def, std::vector<std::string> choices,
            const char* doc) {
  Node n = key(name, Kind::Str, def, doc);
  n.choices = std::move(choices);
  return n;
}
// Kind::Any: several JSON types (checked when read); `accepts` says which, for the table.
Node any(const char* name, json def, const char* accepts, const char* doc) {
  Node n = key(name, Kind::Any, std::move(def), doc);
  n.accepts = accepts;
  return n;
}
// The default is computed from other keys (or there is none): said in words.
Node derived(Node n, const char* words) {
  n.def = nullptr;
  n.derived = words;
  return n;
}
Node auto_ok(Node n) {
  n.auto_ok = true;
  return n;
}
Node alias(Node n) {
  n.alias = true;
  return n;
}
Node compat(Node n) {  // marks a node (and everything below it) as compatibility-only
  n.compat = true;
  for (Node& k : n.kids) k = compat(std::move(k));
  return n;
}
// DeepSpeed's knobs with no effect here (numeric ones: Hugging Face configs often say "auto").
Node cnum(const char* name) {
  return compat(auto_ok(key(name, Kind::Num, nullptr, "")));
}
Node cbool(const char* name) {
  return compat(key(name, Kind::Bool, nullptr, ""));
}
Node cstr(const char* name) {
  return compat(key(name, Kind::Str, nullptr, ""));
}
Node cany(const char* name) {
  return compat(key(name, Kind::Any, nullptr, ""));
}

const Node& schema() {
  static const Node root = [] {
    const std::vector<std::string> devices = {"none", "cpu", "nvme"};
    const std::vector<std::string> dtypes = {"fp32", "bf16", "fp16"};
    Node offload_opt = obj(
        "offload_optimizer",
        {string("device", "none", devices,
                "`cpu`: AdamW's moments (8 bytes per parameter / shard group) live in host memory "
                "outside the device's `memory_budget` (on the CPU backend the update reads them "
                "in place); `nvme`: in `<nvme_path>/rank_<r>/optimizer.bin` (checked for room "
                "before training, removed at a clean exit), read ahead of and written behind the "
                "update; `\"auto\"`: the planner chooses within `memory_budget`. Training, "
                "checkpoints and resume are bit-identical"),
         number("ratio", 1.0, kUnit, "the fraction of the units offloaded, the first ones"),
         string("nvme_path", "", {}, "`nvme`: the directory (required with it)"),
         integer("buffer_count", 4, 2, 1 << 20, "`nvme`: staging buffers of the update"),
         boolean("defer_update", true,
                 "`nvme`: each offloaded unit's update runs at the start of the next step's "
                 "first forward, just before the unit is first used, so its moments' reads and "
                 "write-backs overlap forward compute (evaluation, checkpoints and export apply "
                 "it first; bit-identical either way). Not with `offload_param` `nvme` or "
                 "SHARD_OPTIMIZER, which update at the step's end"),
         cbool("pin_memory")});
    for (const char* k : {"pipeline_read", "pipeline_write", "fast_init"})
      offload_opt.kids.push_back(cbool(k));
    Node offload_par = obj(
        "offload_param",
        {string("device", "none", devices,
                "`cpu`: every unit's fp32 master shard and reduced gradient shard live in host "
                "memory outside the device's `memory_budget` (FULL_SHARD / SHARD_GRAD_OP then "
                "keep no parameters on the device between uses; stages 0/1 and one rank keep "
                "their compute copy there and the master on the host); `nvme` (FULL_SHARD, "
                "SHARD_GRAD_OP, HYBRID_SHARD): both shards live in "
                "`<nvme_path>/rank_<r>/params.bin`, each gather's master shard is read ahead "
                "into a staging buffer, gradients are accumulated in staging and written back "
                "after each reduction, and the optimizer streams them in pieces; `\"auto\"`: the "
                "planner chooses within `memory_budget`. Bit-identical training and resume"),
         string("nvme_path", "", {}, "`nvme`: the directory (required with it)"),
         integer("buffer_count", 5, 2, 1 << 20,
                 "`nvme`: staging buffers for gathers (each one unit's shard)"),
         cbool("pin_memory"), cnum("buffer_size"),
         auto_ok(number("max_in_cpu", 0, {0, 1e15, false, false},
                        "`nvme`: the first units whose shards fit in this many elements per rank "
                        "stay on the host tier instead (partial offload; DeepSpeed's default is "
                        "1e9)"))});

    Node zero = obj("zero_optimization",
                    {integer("stage", 3, 0, 3,
                             "3 FULL_SHARD, 2 SHARD_GRAD_OP, 1 SHARD_OPTIMIZER, 0 NO_SHARD; must "
                             "agree with `sharding_strategy` when both are given")});
    for (const char* k :
         {"allgather_partitions", "overlap_comm", "reduce_scatter", "contiguous_gradients",
          "round_robin_gradients", "elastic_checkpoint", "ignore_unused_parameters",
          "load_from_fp32_weights", "cpu_offload", "stage3_gather_16bit_weights_on_model_save",
          "stage3_gather_fp16_weights_on_model_save", "zero_quantized_weights",
          "zero_quantized_gradients", "mics_hierarchical_params_gather",
          "use_multi_rank_bucket_allreduce", "memory_efficient_linear"})
      zero.kids.push_back(cbool(k));
    for (const char* k :
         {"allgather_bucket_size", "reduce_bucket_size", "sub_group_size",
          "stage3_max_live_parameters", "stage3_max_reuse_distance", "stage3_prefetch_bucket_size",
          "stage3_param_persistence_threshold", "zero_hpz_partition_size", "mics_shard_size"})
      zero.kids.push_back(cnum(k));
    zero.kids.push_back(offload_opt);
    zero.kids.push_back(offload_par);

    Node fp16 = obj(
        "fp16",
        {boolean("enabled", false,
                 "fp16 mixed precision (as bf16) with DeepSpeed's loss scaling; an overflowing "
                 "step is skipped (`overflow`, `skipped_steps`, `loss_scale` in metrics.jsonl)"),
         cbool("auto_cast"),
         number("loss_scale", 0, kNonNegative, "0 = dynamic loss scaling, else a static scale"),
         integer("initial_scale_power", 16, 0, 120, "dynamic: the scale starts at 2^this"),
         integer("loss_scale_window", 1000, 1, IMAX,
                 "dynamic: the scale doubles after this many steps without overflow"),
         integer("hysteresis", 2, 1, IMAX,
                 "dynamic: overflows tolerated before the scale is halved"),
         boolean("consecutive_hysteresis", false,
                 "dynamic: restore `hysteresis` after every good step (not only at a doubling)"),
         number("min_loss_scale", 1, kPositive,
                "dynamic: the scale's floor (an overflow there stops the run)")});
    Node bf16 = obj("bf16", {boolean("enabled", false,
                                     "bf16 mixed precision: fp32 master weights and AdamW state; "
                                     "parameters all-gathered and computed in bf16, gradients "
                                     "reduced in it (at most one of bf16 / fp16)"),
                             cbool("immediate_grad_update")});

    // activation_checkpointing: "off" | "full" | "selective", or an object with mode, every,
    // units, offload, nvme_path (ours) and DeepSpeed's keys (compatibility only). Kind::Any
    // with kids: an object value is validated against the kids, the rest is checked when read.
    Node act = any(
        "activation_checkpointing", "off", "`off` | `full` | `selective`, an object or `\"auto\"`",
        "`full`: a unit keeps only its input and recomputes its forward in backward; "
        "`selective`: it keeps matmul and attention outputs and recomputes norms and "
        "activations; an object selects units and offload (keys below); `\"auto\"`: the planner "
        "chooses within `memory_budget`. Gradients are bit-identical to no checkpointing");
    act.choices = {"off", "full", "selective"};  // the string form
    act.kids = {
        string("mode", "off", {"off", "full", "selective"},
               "the mode of the selected units (required with `every` or `units`)"),
        integer("every", 1, 1, IMAX, "every k-th unit is checkpointed, counting from 0"),
        derived(any("units", nullptr, "an array of unit indices",
                    "exactly these units (indices after `blocks_per_unit`); not with `every`"),
                "unset (`every` selects)"),
        string("offload", "none", devices,
               "`cpu`: what each call keeps for backward moves to host memory after its forward "
               "and back before its backward; `nvme`: to `<nvme_path>/rank_<r>/activations.bin`, "
               "read back one call ahead of its backward (with or without a mode)"),
        derived(string("nvme_path", "", {}, "offload `nvme`: the directory"),
                "zero_optimization's offload `nvme_path`"),
        cbool("partition_activations"),
        cbool("cpu_checkpointing"),
        cbool("contiguous_memory_optimization"),
        cnum("number_checkpoints"),
        cbool("synchronize_checkpoint_boundary"),
        cbool("profile")};

    const char* prefetch_accepts = "an integer in [0, 1024], or true (1) / false (0)";
    Node fwd_prefetch =
        any("forward_prefetch", 1, prefetch_accepts, "units ahead whose all-gathers forward issues");
    Node bwd_prefetch = any("backward_prefetch", 1, prefetch_accepts,
                            "units behind whose all-gathers backward issues");
    for (Node* n : {&fwd_prefetch, &bwd_prefetch}) n->lo = 0, n->hi = 1024;
    Node blocks = any("blocks_per_unit", 1, "an integer ≥ 1 or `\"auto\"`",
                      "consecutive transformer blocks per FSDP unit; `\"auto\"`: the planner "
                      "chooses within `memory_budget`");
    blocks.lo = 1;
    Node seed = integer("seed", 1337, 0, IMAX, "random seed (initialisation and data order)");
    seed.accepts = "an integer in [0, 2^64)";

    return obj(
        "",
        {
            obj("model",
                {string("type", "gpt2", {"gpt2", "llama"},
                        "`gpt2` (learned positions, LayerNorm, GELU, tied embedding/head) or "
                        "`llama` (RMSNorm, RoPE, SwiGLU, grouped-query attention, untied head)"),
                 integer("vocab_size", 256, 1, 65536, "tokens (uint16 in the data files)"),
                 integer("n_layer", 4, 1, IMAX, "transformer blocks"),
                 integer("n_head", 4, 1, IMAX, "attention heads (must divide `d_model`)"),
                 integer("n_kv_head", 0, 0, IMAX,
                         "llama: key/value heads of grouped-query attention (0 = `n_head`; must "
                         "divide it)"),
                 integer("d_model", 128, 1, IMAX, "the model width"),
                 integer("d_ff", 0, 0, IMAX,
                         "the MLP's hidden width (0 = gpt2: 4 d_model; llama: 8/3 d_model "
                         "rounded up to a multiple of 64)"),
                 integer("seq_len", 128, 1, IMAX,
                         "the context length (gpt2: the position table's size)"),
                 number("rope_theta", 10000, kPositive, "llama: RoPE's base"),
                 number("norm_eps", 1e-5, kPositive, "LayerNorm / RMSNorm epsilon"),
                 boolean("tie_embeddings", true,
                         "gpt2: the LM head shares the embedding (llama: always untied; the "
                         "resolved config leaves it null)")}),
            obj("data", {string("train", "", {},
                                "the training token file (llm.c `.bin`); required by `train`"),
                         string("val", "", {}, "the validation token file (\"\" = none)")}),
            auto_ok(integer("train_micro_batch_size_per_gpu", 8, 1, IMAX,
                            "rows per rank per micro-step")),
            auto_ok(integer("gradient_accumulation_steps", 1, 1, IMAX,
                            "micro-steps per optimizer step")),
            auto_ok(derived(integer("train_batch_size", 0, 1, IMAX,
                                    "rows per optimizer step over all ranks: any two of the "
                                    "three batch keys determine the third (as in DeepSpeed); "
                                    "the resolved config leaves it null (it depends on the "
                                    "world size)"),
                            "micro batch × accumulation steps × world size")),
            integer("train_steps", 100, 1, IMAX, "optimizer steps"),
            seed,
            string("run_dir", "runs/default", {},
                   "where metrics.jsonl, config.json (this config, resolved) and "
                   "model.safetensors go; not empty"),
            integer("eval_every_steps", 0, 0, IMAX,
                    "validation every N steps (0 = only at the end, when `data.val` is set)"),
            integer("eval_batches", 8, 1, IMAX, "batches per validation"),
            integer("log_every_steps", 1, 1, IMAX,
                    "a console line every N steps (metrics.jsonl gets every step)"),
            integer("threads", 0, 0, 4096, "threads per rank (0 = cores / local ranks)"),
            string("device", "cpu", {},
                   "where the model lives and computes: `cpu`, `cuda` (this rank's GPU: local "
                   "rank modulo the GPUs, or `SHARDWISE_CUDA_DEVICE`) or `cuda:N`; a build "
                   "without the CUDA backend refuses `cuda`"),
            string("device_comm", "auto", {"auto", "native", "staged"},
                   "how a device's unit buffers reach the peers: `native` (NCCL), `staged` (MPI "
                   "through host staging buffers: several ranks per GPU), `auto` (native where "
                   "every rank has a GPU of its own)"),
            obj("optimizer",
                {string("type", "AdamW", {"AdamW", "Adam"},
                        "`Adam` is DeepSpeed's Adam with `adam_w_mode` true: AdamW"),
                 obj("params",
                     {number("lr", 3e-4, kPositive, "the peak learning rate"),
                      [] {
                        Node b = key("betas", Kind::Betas, json::array({0.9, 0.95}),
                                     "AdamW's moment decay rates [beta1, beta2]");
                        b.range = {0, 1, false, true};
                        return b;
                      }(),
                      number("eps", 1e-8, kPositive, "AdamW's epsilon"),
                      number("weight_decay", 0.1, kNonNegative, "decoupled weight decay"),
                      boolean("adam_w_mode", true,
                              "must be true: L2 regularisation (false) is not implemented"),
                      cbool("torch_adam"), cbool("fused"), cbool("bias_correction"),
                      cbool("amsgrad")})}),
            obj("scheduler",
                {string("type", "WarmupCosineLR", {"WarmupCosineLR", "WarmupLR", "Constant"},
                        "the learning-rate schedule (DeepSpeed's formulas, engine/schedule.h); "
                        "parameters of another type are errors"),
                 obj("params",
                     {integer("warmup_num_steps", 0, 0, IMAX,
                              "steps of warm-up from `lr * warmup_min_ratio` to `lr`"),
                      integer("total_num_steps", 0, 0, IMAX,
                              "WarmupCosineLR: steps of the whole schedule (0 = `train_steps`)"),
                      number("warmup_min_ratio", 0, kUnit, "the lr at step 0 = `lr *` this"),
                      number("cos_min_ratio", 0.1, kUnit,
                             "WarmupCosineLR: the lr at the end = `lr *` this"),
                      string("warmup_type", "linear", {"linear", "log"},
                             "the warm-up curve (DeepSpeed's default is `log`)"),
                      alias(derived(number("warmup_min_lr", 0, kNonNegative,
                                           "WarmupLR: the lr at step 0 (at most the peak), "
                                           "another way to give `warmup_min_ratio`"),
                                    "unset")),
                      alias(derived(number("warmup_max_lr", 0, kPositive,
                                           "WarmupLR: the peak lr, another way to give "
                                           "`optimizer.params.lr` (give only one)"),
                                    "unset")),
                      cnum("last_batch_iteration")})}),
            number("gradient_clipping", 1.0, kNonNegative, "global-norm clipping (0 = off)"),
            bf16,
            fp16,
            obj("mixed_precision",
                {derived(string("param_dtype", "", dtypes,
                                "parameters are all-gathered and computed in it (fp16 needs "
                                "`fp16.enabled`)"),
                         "the enabled block's type, else `fp32`"),
                 derived(string("reduce_dtype", "", dtypes, "gradients are reduced in it"),
                         "`param_dtype`")}),
            zero,
            derived(string("sharding_strategy", "",
                           {"FULL_SHARD", "SHARD_GRAD_OP", "SHARD_OPTIMIZER", "NO_SHARD",
                            "HYBRID_SHARD"},
                           "FSDP's name for the strategy; HYBRID_SHARD is FULL_SHARD within "
                           "groups of `shard_group_size` ranks, all-reduced across the groups"),
                    "from `zero_optimization.stage`"),
            integer("shard_group_size", 0, 0, IMAX,
                    "HYBRID_SHARD only: ranks per shard group, dividing the world size (0 = the "
                    "whole world)"),
            derived(boolean("reshard_after_forward", true,
                            "free a unit's gathered parameters after forward and gather again "
                            "for backward (FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD only)"),
                    "true, SHARD_GRAD_OP: false"),
            fwd_prefetch,
            bwd_prefetch,
            integer("max_live_units", 0, 0, IMAX,
                    "cap on units gathered at once, prefetches included (0 = none)"),
            blocks,
            derived(string("gradient_accumulation_mode", "",
                           {"reduce_each_micro_step", "reduce_once"},
                           "`reduce_each_micro_step` (low memory) or `reduce_once` (less "
                           "communication)"),
                    "`reduce_each_micro_step`; stages 0 and 1: `reduce_once`"),
            act,
            any("memory_budget", 0, "bytes, or a size such as `\"12GiB\"`, `\"1.5GB\"`",
                "tracked memory per rank (0 = none); an allocation past it stops the run with "
                "one line naming the category, the bytes requested and the use by category"),
            number("comm_timeout_s", 0, kNonNegative,
                   "the watchdog's limit per collective, seconds (0 = "
                   "`SHARDWISE_COMM_TIMEOUT_S` or 300)"),
            boolean("comm_debug", false, "check that all ranks issue the same collectives"),
            obj("checkpoint",
                {derived(string("dir", "", {}, "where sharded checkpoints go (`step_N`, `latest`)"),
                         "`<run_dir>/checkpoints`"),
                 integer("every_steps", 0, 0, IMAX,
                         "save a checkpoint every N optimizer steps (0 = off)"),
                 integer("keep_last", 3, 0, IMAX, "complete checkpoints kept (0 = all)"),
                 boolean("async", false, "write in a background thread while training goes on"),
                 boolean("save_final", true, "also save after the last step when `every_steps` > 0"),
                 string("resume", "", {},
                        "`\"\"`: start fresh; `auto`: resume from `<dir>/latest` when it exists; "
                        "else a step directory or a checkpoint directory holding `latest` (what "
                        "`--resume` sets)"),
                 string("init_from", "", {},
                        "a safetensors file of weights to start from, optimizer state fresh "
                        "(what `--init-from` sets; not with `resume`)")}),
            obj("profile",
                {boolean("enabled", false,
                         "record steps with the profiler and write the profile after the last"),
                 integer("start_step", 1, 1, IMAX,
                         "the first recorded optimizer step (1-based, within `train_steps`)"),
                 integer("num_steps", 1, 1, IMAX, "steps recorded (within `train_steps`)"),
                 derived(string("out", "", {},
                                "where each rank writes its profile files (checked writable on "
                                "every rank before the first step)"),
                         "`<run_dir>/profile`")}),
            // DeepSpeed's aio block plus backend and o_direct, for the io queue NVMe offload
            // runs on. AioConfig::from_json (offload/aio.cpp) reads and checks it; the ranges
            // declared here are what it enforces (tests/engine/test_config_schema.cpp).
            obj("aio",
                {[] {
                   Node n = any("block_size", 1 << 20,
                                "bytes (a multiple of 4096 up to 1GiB) or a size such as "
                                "`\"1MiB\"`",
                                "DeepSpeed's `aio` block, for the io queue NVMe offload runs "
                                "on: bytes per request piece");
                   n.lo = 4096, n.hi = 1 << 30;
                   return n;
                 }(),
                 integer("queue_depth", 8, 1, 4096, "pieces in flight (io_uring)"),
                 integer("intra_op_parallelism", 1, 1, 256, "pread/pwrite threads (threads backend)"),
                 alias(derived(integer("thread_count", 1, 1, 256,
                                       "another name of `intra_op_parallelism`"),
                               "unset")),
                 boolean("single_submit", false, "io_uring: one submit per piece"),
                 boolean("overlap_events", true, "io_uring: refill the ring on each completion"),
                 string("backend", "auto", {"auto", "io_uring", "threads"},
                        "`auto`: io_uring, or pread/pwrite threads where the kernel refuses "
                        "io_uring; `io_uring`: an error if refused"),
                 boolean("o_direct", true,
                         "aligned pieces bypass the page cache where the filesystem allows it")}),
            compat(obj("amp", {cbool("enabled"), cstr("opt_level")})),
            cnum("steps_per_print"),
            cbool("wall_clock_breakdown"),
            cbool("prescale_gradients"),
            cnum("gradient_predivide_factor"),
            cstr("communication_data_type"),
            cbool("zero_allow_untested_optimizer"),
            cbool("zero_force_ds_cpu_optimizer"),
            cbool("sparse_gradients"),
            cbool("dump_state"),
            cany("tensorboard"),
            cany("wandb"),
            cany("csv_monitor"),
            cany("comms_logger"),
            cany("flops_profiler"),
        });
  }();
  return root;
}

// The declared node at a dotted key path (a programming error when there is none).
const Node& decl(const std::string& path) {
  const Node* n = &schema();
  std::stringstream ss(path);
  std::string k;
  while (std::getline(ss, k, '.')) {
    n = n->kid(k);
    if (!n) throw std::logic_error("config: no declared key " + path);
  }
  return *n;
}

// ---- Messages --------------------------------------------------------------------------------

std::string join_path(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

// Optimal string alignment distance (Levenshtein plus adjacent transpositions).
size_t edit_distance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i)
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost =
          std::tolower((unsigned char)a[i - 1]) == std::tolower((unsigned char)b[j - 1]) ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[n][m];
}

// Every full key path in the schema whose last component is `key` (for keys put at the wrong
// level, e.g. a top-level "lr").
void find_key(const Node& n, const std::string& path, const std::string& key,
              std::vector<std::string>& out) {
  for (const Node& k : n.kids) {
    const std::string p = join_path(path, k.name);
    if (k.name == key) out.push_back(p);
    if (k.kind == Kind::Obj) find_key(k, p, key, out);
  }
}

[[noreturn]] void unknown_key(const std::string& source, const Node& level,
                              const std::string& parent, const std::string& key,
                              const std::string& origin) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const Node& k : level.kids) {
    const size_t d = edit_distance(key, k.name);
    if (d < best_d) best_d = d, best = k.name;
  }
  std::string msg = source + ": unknown key '" + join_path(parent, key) + "'" + origin;
  const size_t limit = std::max<size_t>(2, key.size() / 3);
  std::vector<std::string> elsewhere;
  find_key(schema(), "", key, elsewhere);
  if (!best.empty() && best_d <= limit) {
    msg += " (did you mean '" + join_path(parent, best) + "'?)";
  } else if (!elsewhere.empty()) {
    msg += " (did you mean '" + elsewhere.front() + "'?)";
  } else {
    msg += " (valid keys here: ";
    for (size_t i = 0; i < level.kids.size(); ++i) msg += (i ? ", " : "") + level.kids[i].name;
    msg += ")";
  }
  fail("config", msg);
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Obj:
      return "an object";
    case Kind::Int:
      return "an integer";
    case Kind::Num:
      return "a number";
    case Kind::Bool:
      return "true or false";
    case Kind::Str:
      return "a string";
    case Kind::Betas:
      return "an array of two numbers [beta1, beta2]";
    case Kind::Any:
      return "any value";
  }
  return "?";
}

std::string describe(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  switch (v.type()) {
    case json::value_t::string:
      return "string " + s;
    case json::value_t::boolean:
      return "boolean " + s;
    case json::value_t::null:
      return "null";
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "array " + s;
    default:
      return "number " + s;
  }
}

bool is_auto(const json& v) {
  return v.is_string() && v.get<std::string>() == "auto";
}

bool kind_matches(Kind k, const json& v) {
  switch (k) {
    case Kind::Obj:
      return v.is_object();
    case Kind::Int:
      if (v.is_number_integer()) return true;
      if (v.is_number_float()) {  // 1e4 is an integer written in float syntax
        const double d = v.get<double>();
        return std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.2e18;
      }
      return false;
    case Kind::Num:
      return v.is_number();
    case Kind::Bool:
      return v.is_boolean();
    case Kind::Str:
      return v.is_string();
    case Kind::Betas:
      return v.is_array() && v.size() == 2 && v[0].is_number() && v[1].is_number();
    case Kind::Any:
      return true;
  }
  return false;
}

// ---- Parsing ---------------------------------------------------------------------------------

// Syntax errors with line:column; duplicate keys rejected (JSON allows them, nlohmann keeps the
// last one silently, which hides mistakes).
json parse_text(const std::string& text, const std::string& source) {
  // nlohmann builds any depth, but copying, comparing or dumping the value recurses once per
  // level: a config nested 10,000 deep must be refused before it is parsed.
  if (const size_t at = json_depth_exceeded(text); at != std::string::npos) {
    const std::string pos = json_position(text, at);  // "line L, column C"
    fail("config", source + ":" + pos.substr(5, pos.find(',') - 5) + ":" +
                       pos.substr(pos.rfind(' ') + 1) + ": nested deeper than " +
                       std::to_string(kJsonMaxDepth) + " levels");
  }
  std::vector<std::set<std::string>> seen;  // keys of each open object
  std::vector<std::string> keys;            // key path of the open objects
  std::string last_key, dup;
  auto cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    (void)depth;
    switch (ev) {
      case json::parse_event_t::object_start:
        keys.push_back(last_key);
        seen.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!seen.empty()) seen.pop_back();
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::array_start:
        keys.push_back(last_key);
        seen.emplace_back();
        break;
      case json::parse_event_t::array_end:
        if (!seen.empty()) seen.pop_back();
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key: {
        last_key = parsed.get<std::string>();
        if (!seen.empty() && !seen.back().insert(last_key).second && dup.empty()) {
          std::string p;
          for (size_t i = 1; i < keys.size(); ++i) p = join_path(p, keys[i]);
          dup = join_path(p, last_key);
        }
        break;
      }
      default:
        break;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text, cb);
  } catch (const json::parse_error& e) {
    // Position from the byte offset; the reason is nlohmann's text after the position.
    size_t line = 1, col = 1;
    const size_t end = std::min<size_t>(e.byte > 0 ? e.byte - 1 : 0, text.size());
    for (size_t i = 0; i < end; ++i) {
      if (text[i] == '\n')
        ++line, col = 1;
      else
        ++col;
    }
    std::string why = e.what();
    const size_t p = why.find(": ", why.find("column"));
    if (p != std::string::npos)
      why = why.substr(p + 2);
    else if (why.find(']') != std::string::npos)
      why = why.substr(why.find(']') + 2);
    fail("config", source + ":" + std::to_string(line) + ":" + std::to_string(col) +
                       ": invalid JSON: " + why);
  } catch (const json::exception& e) {  // out_of_range: a number beyond double (1e400)
    std::string why = e.what();
    if (why.find(']') != std::string::npos) why = why.substr(why.find(']') + 2);
    fail("config", source + ": invalid JSON: " + why);
  }
  if (!dup.empty()) fail("config", source + ": duplicate key '" + dup + "'");
  if (!j.is_object())
    fail("config", source + ": the top level must be a JSON object, got " + describe(j));
  return j;
}

// "a.b.c=value": the value parsed as JSON if it parses, else taken as a string.
void apply_override(json& root, const std::string& ov, const std::string& source,
                    std::map<std::string, std::string>& origins) {
  const size_t eq = ov.find('=');
  if (eq == std::string::npos || eq == 0)
    fail("config",
         source + ": --set '" + ov + "': expected KEY=VALUE, e.g. optimizer.params.lr=1e-3");
  try {  // keys and string values end up in the resolved config, which must dump as JSON
    (void)json(ov).dump();
  } catch (const json::type_error&) {
    fail("config", source + ": --set " +
                       json(ov).dump(-1, ' ', false, json::error_handler_t::replace) +
                       ": not valid UTF-8");
  }
  const std::string path = ov.substr(0, eq), text = ov.substr(eq + 1);
  std::vector<std::string> parts;
  {
    std::stringstream ss(path);
    std::string p;
    while (std::getline(ss, p, '.')) parts.push_back(p);
    if (path.back() == '.') parts.push_back("");
  }
  const std::string origin = " (from --set " + ov + ")";
  const Node* level = &schema();
  json* cur = &root;
  std::string sofar;
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string& k = parts[i];
    if (k.empty())
      fail("config", source + ": --set '" + ov + "': empty component in key path '" + path + "'");
    const Node* n = level->kind == Kind::Obj ? level->kid(k) : nullptr;
    if (level->kind == Kind::Obj && !n) unknown_key(source, *level, sofar, k, origin);
    if (level->kind != Kind::Obj && level->kind != Kind::Any)
      fail("config", source + ": --set '" + ov + "': '" + sofar + "' is " + kind_name(level->kind) +
                         ", it has no key '" + k + "'");
    sofar = join_path(sofar, k);
    if (!cur->is_object())
      fail("config", source + ": --set '" + ov + "': cannot set '" + sofar +
                         "' because its parent is " + describe(*cur) + ", not an object");
    if (i + 1 < parts.size()) {
      json& next = (*cur)[k];
      if (next.is_null()) next = json::object();  // creates intermediate objects
      cur = &next;
      if (n) level = n;
    } else {
      if (json_depth_exceeded(text) != std::string::npos)
        fail("config", source + ": --set '" + sofar + "': the value is nested deeper than " +
                           std::to_string(kJsonMaxDepth) + " levels");
      json v;
      try {
        v = json::parse(text);
      } catch (const json::parse_error&) {
        v = text;
      } catch (const json::exception&) {  // out_of_range: a number beyond double (1e400)
        fail("config", source + ": --set '" + sofar + "': the number " + text +
                           " is out of range");
      }
      (*cur)[k] = v;
      origins[sofar] = origin;
    }
  }
}

struct Ctx {
  std::string source;
  std::map<std::string, std::string> origins;  // key path -> " (from --set ...)"
  std::vector<std::string> notes;
  std::string origin(const std::string& path) const {
    for (const auto& [k, o] : origins)  // an override of the key or of an enclosing object
      if (path == k || path.rfind(k + ".", 0) == 0) return o;
    return "";
  }
  [[noreturn]] void bad(const std::string& path, const std::string& problem) const {
    fail("config", source + ": " + path + ": " + problem + origin(path));
  }
};

void validate(const json& j, const Node& n, const std::string& path, Ctx& c,
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
    if (k->compat && !n.compat) compat_keys.push_back(p);  // the top-most compatibility key
    if (k->kind == Kind::Obj || (k->kind == Kind::Any && !k->kids.empty() && v.is_object()))
      validate(v, *k, p, c, compat_keys);
  }
}

// ---- Reading values with range checks --------------------------------------------------------

const json* at(const json& root, const std::string& path) {
  const json* cur = &root;
  std::stringstream ss(path);
  std::string k;
  while (std::getline(ss, k, '.')) {
    if (!cur->is_object()) return nullptr;
    auto it = cur->find(k);
    if (it == cur->end()) return nullptr;
    cur = &*it;
  }
  return cur;
}
// The value at path is "auto" (train() resolves TrainConfig::autoplan keys with the planner).
bool auto_at(const json& root, const std::string& path) {
  const json* v = at(root, path);
  return v && is_auto(*v);
}

bool has(const json& root, const std::string& path) {
  const json* v = at(root, path);
  return v && !v->is_null() && !is_auto(*v);
}


// Values are read with the range (or allowed strings) and the default declared for their key
// in schema(). The *_or forms take the default from the caller: for keys whose default is
// derived from other keys (declared null, described in words).

// The declared default of `path` (one with a derived default has none to give).
const json& declared_default(const std::string& path) {
  const Node& n = decl(path);
  if (n.def.is_null()) throw std::logic_error("config: " + path + " has a derived default");
  return n.def;
}

long long get_int_or(const json& root, const std::string& path, long long def, const Ctx& c) {
  if (!has(root, path)) return def;
  const Node& n = decl(path);
  const long long lo = n.lo, hi = n.hi;
  const json& v = *at(root, path);
  long long x;
  if (v.is_number_unsigned() && v.get<unsigned long long>() > (unsigned long long)LLONG_MAX)
    x = LLONG_MAX;
  else
    x = v.is_number_float() ? (long long)v.get<double>() : v.get<long long>();
  if (x < lo || x > hi) {
    std::string range = hi >= INT32_MAX
                            ? ">= " + std::to_string(lo)
                            : "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    c.bad(path, "must be " + range + " (got " + v.dump() + ")");
  }
  return x;
}
long long get_int(const json& root, const std::string& path, const Ctx& c) {
  return get_int_or(root, path, declared_default(path).get<long long>(), c);
}

double check_num(double x, const std::string& path, Range r, const Ctx& c) {
  if (!r.ok(x)) c.bad(path, "must be " + r.str() + " (got " + num_str(x) + ")");
  return x;
}
// A number within `r` (a range that depends on other keys, within the declared one).
double get_num_in(const json& root, const std::string& path, double def, Range r, const Ctx& c) {
  if (!has(root, path)) return def;
  return check_num(at(root, path)->get<double>(), path, r, c);
}
double get_num_or(const json& root, const std::string& path, double def, const Ctx& c) {
  return get_num_in(root, path, def, decl(path).range, c);
}
double get_num(const json& root, const std::string& path, const Ctx& c) {
  return get_num_or(root, path, declared_default(path).get<double>(), c);
}
// A float field: the range must still hold after rounding to float (1e300 would become inf,
// 1e-50 zero, a beta of 0.9999999999 exactly 1).
float to_float(double x, const std::string& path, Range r, const Ctx& c) {
  const float f = static_cast<float>(x);
  if (!r.ok(static_cast<double>(f)))
    c.bad(path, "must be " + r.str() + " as a 32-bit float (got " + num_str(x) + ", which is " +
                    num_str(f) + " as a float)");
  return f;
}
float get_float(const json& root, const std::string& path, const Ctx& c) {
  const Range r = decl(path).range;
  if (!has(root, path)) return static_cast<float>(declared_default(path).get<double>());
  return to_float(get_num_in(root, path, 0, r, c), path, r, c);
}
std::string get_str_or(const json& root, const std::string& path, const std::string& def,
                       const Ctx& c) {
  if (!has(root, path)) return def;
  const std::vector<std::string>& choices = decl(path).choices;
  std::string s = at(root, path)->get<std::string>();
  if (!choices.empty() && std::find(choices.begin(), choices.end(), s) == choices.end()) {
    std::string list;
    for (size_t i = 0; i < choices.size(); ++i) list += (i ? ", " : "") + choices[i];
    c.bad(path, "'" + s + "' is not one of " + list);
  }
  return s;
}
std::string get_str(const json& root, const std::string& path, const Ctx& c) {
  return get_str_or(root, path, declared_default(path).get<std::string>(), c);
}
bool get_bool_or(const json& root, const std::string& path, bool def) {
  return has(root, path) ? at(root, path)->get<bool>() : def;
}
bool get_bool(const json& root, const std::string& path) {
  return get_bool_or(root, path, declared_default(path).get<bool>());
}

// A float written back as the shortest decimal that reads back as the same float.
json fjson(float f) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, f);
  return json::parse(std::string(buf, r.ptr));
}

void set_path(json& root, const std::string& path, json v) {
  json* cur = &root;
  std::stringstream ss(path);
  std::string k;
  std::vector<std::string> parts;
  while (std::getline(ss, k, '.')) parts.push_back(k);
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    json& next = (*cur)[parts[i]];
    if (!next.is_object()) next = json::object();
    cur = &next;
  }
  (*cur)[parts.back()] = std::move(v);
}
void erase_path(json& root, const std::string& path) {
  const size_t dot = path.rfind('.');
  json* parent =
      dot == std::string::npos ? &root : const_cast<json*>(at(root, path.substr(0, dot)));
  if (parent && parent->is_object())
    parent->erase(path.substr(dot == std::string::npos ? 0 : dot + 1));
}

// mixed_precision's dtype names.
const char* precision_name(DType d) {
  return d == DType::BF16 ? "bf16" : d == DType::F16 ? "fp16" : "fp32";
}
DType precision_from_name(const std::string& s) {
  return s == "bf16" ? DType::BF16 : s == "fp16" ? DType::F16 : DType::F32;
}

std::string default_checkpoint_dir(const std::string& run_dir) {
  return (std::filesystem::path(run_dir) / "checkpoints").string();
}
std::string default_profile_dir(const std::string& run_dir) {
  return (std::filesystem::path(run_dir) / "profile").string();
}

// Writes every declared key of `cfg` into `r` with its effective value (other keys of r, the
// compatibility-only ones, are kept). A key that does not apply to this run (a parameter of
// another scheduler type, shard_group_size without HYBRID_SHARD, ...) is null: not set.
// Aliases (another spelling of a declared key) are removed. tests/engine/
// test_config_schema.cpp checks that every declared key is written.
void write_resolved(json& r, const TrainConfig& cfg) {
  const OptimizerConfig& o = cfg.optimizer;
  const SchedulerConfig& s = cfg.scheduler;
  const ModelConfig& m = cfg.model;
  // Any two of the three batch keys give the third with the world size: the resolved config
  // keeps micro batch and accumulation, so that it also reads at another world size.
  set_path(r, "train_batch_size", nullptr);
  set_path(r, "train_micro_batch_size_per_gpu", cfg.micro_batch);
  set_path(r, "gradient_accumulation_steps", cfg.grad_accum);
  set_path(r, "optimizer.type", o.type);
  set_path(r, "optimizer.params.lr", fjson(o.lr));
  set_path(r, "optimizer.params.betas", json::array({fjson(o.beta1), fjson(o.beta2)}));
  set_path(r, "optimizer.params.eps", fjson(o.eps));
  set_path(r, "optimizer.params.weight_decay", fjson(o.weight_decay));
  set_path(r, "optimizer.params.adam_w_mode", true);
  set_path(r, "scheduler.type", s.type);
  erase_path(r, "scheduler.params.warmup_min_lr");  // aliases, now in lr / warmup_min_ratio
  erase_path(r, "scheduler.params.warmup_max_lr");
  const bool warmup = s.type != "Constant", cosine = s.type == "WarmupCosineLR";
  set_path(r, "scheduler.params.warmup_num_steps", warmup ? json(s.warmup_num_steps) : json());
  set_path(r, "scheduler.params.warmup_min_ratio", warmup ? fjson(s.warmup_min_ratio) : json());
  set_path(r, "scheduler.params.warmup_type", warmup ? json(s.warmup_type) : json());
  set_path(r, "scheduler.params.total_num_steps", cosine ? json(s.total_num_steps) : json());
  set_path(r, "scheduler.params.cos_min_ratio", cosine ? fjson(s.cos_min_ratio) : json());
  set_path(r, "gradient_clipping", fjson(cfg.grad_clip));
  set_path(r, "model.type", m.type);
  set_path(r, "model.vocab_size", m.vocab_size);
  set_path(r, "model.n_layer", m.n_layer);
  set_path(r, "model.n_head", m.n_head);
  set_path(r, "model.n_kv_head", m.n_kv_head);
  set_path(r, "model.d_model", m.d_model);
  set_path(r, "model.d_ff", m.d_ff);
  set_path(r, "model.seq_len", m.seq_len);
  set_path(r, "model.rope_theta", fjson(m.rope_theta));
  set_path(r, "model.norm_eps", fjson(m.norm_eps));
  set_path(r, "model.tie_embeddings", m.type == "gpt2" ? json(m.tie_embeddings) : json());
  set_path(r, "data.train", cfg.train_data);
  set_path(r, "data.val", cfg.val_data);
  set_path(r, "train_steps", cfg.train_steps);
  set_path(r, "seed", cfg.seed);
  set_path(r, "run_dir", cfg.run_dir);
  set_path(r, "eval_every_steps", cfg.eval_every_steps);
  set_path(r, "eval_batches", cfg.eval_batches);
  set_path(r, "log_every_steps", cfg.log_every_steps);
  set_path(r, "threads", cfg.threads);
  set_path(r, "device", cfg.device);
  set_path(r, "device_comm", device_comm_name(cfg.sharding.device_comm));
  // A TrainConfig built in code may set either zero_stage or sharding.strategy: a strategy
  // other than the default wins; otherwise zero_stage picks it (with that strategy's defaults).
  ShardingPolicy sp = cfg.sharding;
  if (sp.strategy == ShardingStrategy::FullShard && cfg.zero_stage != 3) {
    const ShardingPolicy d = ShardingPolicy::for_strategy(strategy_from_stage(cfg.zero_stage));
    sp.strategy = d.strategy;
    sp.reshard_after_forward = d.reshard_after_forward;
    sp.accum = d.accum;
  }
  set_path(r, "zero_optimization.stage", stage_of(sp.strategy));
  set_path(r, "sharding_strategy", strategy_name(sp.strategy));
  const bool sharded_params = sp.strategy == ShardingStrategy::FullShard ||
                              sp.strategy == ShardingStrategy::ShardGradOp ||
                              sp.strategy == ShardingStrategy::HybridShard;
  set_path(r, "shard_group_size",
           sp.strategy == ShardingStrategy::HybridShard ? json(sp.shard_group_size) : json());
  set_path(r, "reshard_after_forward", sharded_params ? json(sp.reshard_after_forward) : json());
  set_path(r, "forward_prefetch", sp.forward_prefetch);
  set_path(r, "backward_prefetch", sp.backward_prefetch);
  set_path(r, "max_live_units", sp.max_live_units);
  set_path(r, "gradient_accumulation_mode", accum_mode_name(sp.accum));
  set_path(r, "zero_optimization.offload_optimizer.device",
           cfg.autoplan.offload_optimizer ? "auto" : offload_device_name(sp.offload_optimizer.device));
  set_path(r, "zero_optimization.offload_optimizer.ratio", sp.offload_optimizer.ratio);
  set_path(r, "zero_optimization.offload_optimizer.nvme_path", sp.offload_optimizer.nvme_path);
  set_path(r, "zero_optimization.offload_optimizer.buffer_count",
           sp.offload_optimizer.buffer_count);
  set_path(r, "zero_optimization.offload_optimizer.defer_update",
           sp.offload_optimizer.defer_update);
  set_path(r, "zero_optimization.offload_param.device",
           cfg.autoplan.offload_param ? "auto" : offload_device_name(sp.offload_param.device));
  set_path(r, "zero_optimization.offload_param.nvme_path", sp.offload_param.nvme_path);
  set_path(r, "zero_optimization.offload_param.buffer_count", sp.offload_param.buffer_count);
  set_path(r, "zero_optimization.offload_param.max_in_cpu", sp.offload_param.max_in_cpu);
  const AioConfig& aio = sp.aio;
  set_path(r, "aio.block_size", aio.block_size);
  set_path(r, "aio.queue_depth", aio.queue_depth);
  set_path(r, "aio.intra_op_parallelism", aio.intra_op_parallelism);
  erase_path(r, "aio.thread_count");  // an alias, now resolved
  set_path(r, "aio.single_submit", aio.single_submit);
  set_path(r, "aio.overlap_events", aio.overlap_events);
  set_path(r, "aio.backend", aio_backend_name(aio.backend));
  set_path(r, "aio.o_direct", aio.o_direct);
  set_path(r, "bf16.enabled", cfg.bf16);
  set_path(r, "fp16.enabled", cfg.fp16);
  const LossScalerConfig& ls = cfg.loss_scaler;
  set_path(r, "fp16.loss_scale", ls.loss_scale);
  set_path(r, "fp16.initial_scale_power", ls.initial_scale_power);
  set_path(r, "fp16.loss_scale_window", ls.loss_scale_window);
  set_path(r, "fp16.hysteresis", ls.hysteresis);
  set_path(r, "fp16.consecutive_hysteresis", ls.consecutive_hysteresis);
  set_path(r, "fp16.min_loss_scale", ls.min_loss_scale);
  // A TrainConfig built in code may set only bf16 / fp16: the policy they imply.
  MixedPrecisionPolicy mp = sp.mixed_precision;
  if (!mp.enabled() && (cfg.bf16 || cfg.fp16))
    mp.param_dtype = mp.reduce_dtype = cfg.bf16 ? DType::BF16 : DType::F16;
  set_path(r, "mixed_precision.param_dtype", precision_name(mp.param_dtype));
  set_path(r, "mixed_precision.reduce_dtype", precision_name(mp.reduce_dtype));
  if (cfg.autoplan.blocks)
    set_path(r, "blocks_per_unit", "auto");
  else
    set_path(r, "blocks_per_unit", cfg.blocks_per_unit);
  // activation_checkpointing: "auto", else the object with every key (an object given in the
  // input keeps its DeepSpeed keys).
  const ActivationCheckpointing& ac = sp.activation_checkpointing;
  const json* acj = at(r, "activation_checkpointing");
  if (cfg.autoplan.checkpointing) {
    set_path(r, "activation_checkpointing", "auto");
  } else {
    if (!(acj && acj->is_object())) set_path(r, "activation_checkpointing", json::object());
    set_path(r, "activation_checkpointing.mode", checkpoint_mode_name(ac.mode));
    set_path(r, "activation_checkpointing.every", ac.units.empty() ? json(ac.every) : json());
    set_path(r, "activation_checkpointing.units", ac.units.empty() ? json() : json(ac.units));
    set_path(r, "activation_checkpointing.offload",
             ac.offload_cpu ? "cpu" : ac.offload_nvme ? "nvme" : "none");
    set_path(r, "activation_checkpointing.nvme_path", ac.nvme_path);
  }
  set_path(r, "comm_timeout_s", cfg.comm_timeout_s);
  set_path(r, "comm_debug", cfg.comm_debug);
  set_path(r, "memory_budget", static_cast<uint64_t>(cfg.memory_budget));
  const CheckpointConfig& k = cfg.checkpoint;
  set_path(r, "checkpoint.dir", k.dir.empty() ? default_checkpoint_dir(cfg.run_dir) : k.dir);
  set_path(r, "checkpoint.every_steps", k.every_steps);
  set_path(r, "checkpoint.keep_last", k.keep_last);
  set_path(r, "checkpoint.async", k.async);
  set_path(r, "checkpoint.save_final", k.save_final);
  set_path(r, "checkpoint.resume", k.resume);
  set_path(r, "checkpoint.init_from", k.init_from);
  const ProfileConfig& pf = cfg.profile;
  set_path(r, "profile.enabled", pf.enabled);
  set_path(r, "profile.start_step", pf.start_step);
  set_path(r, "profile.num_steps", pf.num_steps);
  set_path(r, "profile.out", pf.out.empty() ? default_profile_dir(cfg.run_dir) : pf.out);
}

// memory_budget: a byte count (a whole number >= 0) or a string with a unit ("12GiB").
size_t get_bytes(const json& root, const std::string& path, const Ctx& c) {
  if (!has(root, path)) return declared_default(path).get<size_t>();
  const json& v = *at(root, path);
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer())
    c.bad(path, "must be >= 0 (got " + v.dump() + ")");
  if (v.is_number_float()) {
    const double x = v.get<double>();
    if (!(x >= 0 && x < 18446744073709551616.0 && x == std::floor(x)))
      c.bad(path, "expected a whole number of bytes >= 0 or a size such as \"12GiB\" (got " +
                      v.dump() + ")");
    return static_cast<size_t>(x);
  }
  if (!v.is_string())
    c.bad(path, "expected a number of bytes or a size such as \"12GiB\", got " + describe(v));
  try {
    return parse_bytes(v.get<std::string>());
  } catch (const Error& e) {
    std::string msg = e.what();
    if (msg.rfind("bytes: ", 0) == 0) msg = msg.substr(7);
    c.bad(path, msg);
  }
}

// forward_prefetch / backward_prefetch: a unit count >= 0, or true (1) / false (0).
int get_prefetch(const json& root, const std::string& path, const Ctx& c) {
  const int def = declared_default(path).get<int>();
  if (!has(root, path)) return def;
  const json& v = *at(root, path);
  if (v.is_boolean()) return v.get<bool>() ? 1 : 0;
  if (!kind_matches(Kind::Int, v))
    c.bad(path, "expected true, false or a number of units >= 0, got " + describe(v));
  return (int)get_int_or(root, path, def, c);
}

// activation_checkpointing: "off" | "full" | "selective", or {"mode": ..., "every": k} or
// {"mode": ..., "units": [i, ...]} (unit indices in the model's unit order after
// blocks_per_unit; checked against the unit count the model will have).
void read_activation_checkpointing(const json& j, TrainConfig& cfg, const Ctx& c) {
  const std::string key = "activation_checkpointing";
  cfg.autoplan.checkpointing = auto_at(j, key);  // "auto": chosen by the planner
  if (!has(j, key)) return;
  ActivationCheckpointing& ac = cfg.sharding.activation_checkpointing;
  const json& v = *at(j, key);
  if (v.is_string()) {
    ac.mode = checkpoint_mode_from_name(get_str(j, key, c));  // the declared modes
    return;
  }
  if (!v.is_object())
    c.bad(key, "expected \"off\", \"full\", \"selective\" or an object {\"mode\", \"every\" or "
               "\"units\"}, got " + describe(v));
  if (has(j, key + ".offload")) {
    const std::string o = get_str(j, key + ".offload", c);
    ac.offload_cpu = o == "cpu";
    ac.offload_nvme = o == "nvme";
    // The file's directory: its own key, else the parameters' or the optimizer's nvme_path.
    const ShardingPolicy& sp = cfg.sharding;
    ac.nvme_path = get_str_or(j, key + ".nvme_path",
                           !sp.offload_param.nvme_path.empty() ? sp.offload_param.nvme_path
                                                               : sp.offload_optimizer.nvme_path,
                           c);
    if (ac.offload_nvme && ac.nvme_path.empty())
      c.bad(key + ".nvme_path", "required with offload 'nvme' (a directory on a local disk; "
                                "zero_optimization's offload nvme_path is used when set)");
  }
  const bool every = has(j, key + ".every"), units = has(j, key + ".units");
  if (!has(j, key + ".mode")) {
    if (ac.offloads() && !every && !units) return;  // offload without checkpointing
    if (every || units) c.bad(key + ".mode", "is required when every or units is given");
    return;  // DeepSpeed's keys only: no effect (noted)
  }
  ac.mode = checkpoint_mode_from_name(get_str(j, key + ".mode", c));
  if (every && units) c.bad(key + ".units", "conflicts with " + key + ".every; give only one");
  ac.every = (int)get_int(j, key + ".every", c);
  if (!units) return;
  const json& u = *at(j, key + ".units");
  if (!u.is_array() || u.empty())
    c.bad(key + ".units", "expected a non-empty array of unit indices, got " + describe(u));
  const ModelConfig& m = cfg.model;
  const int bpu = std::max(1, cfg.blocks_per_unit);
  const int64_t n_units = (m.type == "llama" ? 2 : 1) + (int64_t{m.n_layer} + bpu - 1) / bpu;
  for (size_t i = 0; i < u.size(); ++i) {
    const std::string p = key + ".units[" + std::to_string(i) + "]";
    if (!kind_matches(Kind::Int, u[i])) c.bad(p, "expected a unit index, got " + describe(u[i]));
    const long long x = u[i].is_number_float() ? (long long)u[i].get<double>() : u[i].get<long long>();
    if (x < 0 || x >= n_units)
      c.bad(p, "must be in [0, " + std::to_string(n_units - 1) + "]: the model has " +
                   std::to_string(n_units) + " units (got " + std::to_string(x) + ")");
    if (std::find(ac.units.begin(), ac.units.end(), (int)x) != ac.units.end())
      c.bad(p, "unit " + std::to_string(x) + " is listed twice");
    ac.units.push_back((int)x);
  }
}

TrainConfig read_config(json j, const std::string& source,
                        const std::vector<std::string>& overrides, int world_size) {
  Ctx c;
  c.source = source;
  for (const std::string& ov : overrides) apply_override(j, ov, source, c.origins);
  std::vector<std::string> compat_keys;
  validate(j, schema(), "", c, compat_keys);
  if (!compat_keys.empty()) {
    std::string note =
        "config: note: " + source + ": accepted for DeepSpeed compatibility, no effect yet: ";
    for (size_t i = 0; i < compat_keys.size(); ++i) note += (i ? ", " : "") + compat_keys[i];
    c.notes.push_back(note);
  }

  TrainConfig cfg;
  cfg.source = source;
  cfg.notes = c.notes;
  const long long IMAX = INT32_MAX;

  // Mixed precision (the policy goes into cfg.sharding once the strategy has set it).
  cfg.bf16 = get_bool(j, "bf16.enabled");
  cfg.fp16 = get_bool(j, "fp16.enabled");
  if (cfg.bf16 && cfg.fp16)
    c.bad("fp16.enabled",
          "bf16.enabled and fp16.enabled are both true; enable at most one of them");
  MixedPrecisionPolicy mp;
  mp.param_dtype = cfg.bf16 ? DType::BF16 : cfg.fp16 ? DType::F16 : DType::F32;
  if (has(j, "mixed_precision.param_dtype"))
    mp.param_dtype = precision_from_name(
        get_str_or(j, "mixed_precision.param_dtype", "", c));
  mp.reduce_dtype = mp.param_dtype;
  if (has(j, "mixed_precision.reduce_dtype"))
    mp.reduce_dtype = precision_from_name(
        get_str_or(j, "mixed_precision.reduce_dtype", "", c));
  for (const char* k : {"param_dtype", "reduce_dtype"}) {
    const DType d = std::string(k) == "param_dtype" ? mp.param_dtype : mp.reduce_dtype;
    if (d == DType::F16 && !cfg.fp16)
      c.bad(std::string("mixed_precision.") + k,
            "fp16 needs loss scaling: set fp16.enabled to true (or use bf16)");
  }
  LossScalerConfig& ls = cfg.loss_scaler;
  ls.loss_scale = get_num(j, "fp16.loss_scale", c);
  ls.initial_scale_power =
      (int)get_int(j, "fp16.initial_scale_power", c);
  ls.loss_scale_window =
      (int)get_int(j, "fp16.loss_scale_window", c);
  ls.hysteresis = (int)get_int(j, "fp16.hysteresis", c);
  ls.consecutive_hysteresis =
      get_bool(j, "fp16.consecutive_hysteresis");
  ls.min_loss_scale =
      get_num(j, "fp16.min_loss_scale", c);

  // Batch sizes: any two of the three determine the third.
  // The launcher's world size (without initialising MPI), unless the caller plans for another.
  const int world = world_size > 0 ? world_size : launch_env().world_size;
  const bool has_tbs = has(j, "train_batch_size"),
             has_mb = has(j, "train_micro_batch_size_per_gpu"),
             has_ga = has(j, "gradient_accumulation_steps");
  long long tbs = get_int_or(j, "train_batch_size", 0, c);
  long long mb = get_int(j, "train_micro_batch_size_per_gpu", c);
  long long ga = get_int(j, "gradient_accumulation_steps", c);
  // The global batch (rows per optimizer step) is counted in int64 and must stay far from
  // overflow: at most 2^31 - 1 rows.
  if (static_cast<__int128>(mb) * ga * world > IMAX)
    c.bad(has_mb ? "train_micro_batch_size_per_gpu" : "gradient_accumulation_steps",
          "train_micro_batch_size_per_gpu (" + std::to_string(mb) +
              ") * gradient_accumulation_steps (" + std::to_string(ga) + ") * world size (" +
              std::to_string(world) + ") rows per step is more than " + std::to_string(IMAX));
  if (has_tbs) {
    if (has_mb && !has_ga) {
      if (tbs % (mb * world))
        c.bad("train_batch_size",
              std::to_string(tbs) + " is not a multiple of train_micro_batch_size_per_gpu (" +
                  std::to_string(mb) + ") * world size (" + std::to_string(world) + ")");
      ga = tbs / (mb * world);
    } else if (!has_mb && has_ga) {
      if (tbs % (ga * world))
        c.bad("train_batch_size",
              std::to_string(tbs) + " is not a multiple of gradient_accumulation_steps (" +
                  std::to_string(ga) + ") * world size (" + std::to_string(world) + ")");
      mb = tbs / (ga * world);
    } else if (!has_mb && !has_ga) {
      if (tbs % world) c.bad("train_batch_size", "must be a multiple of the world size");
      mb = tbs / world, ga = 1;
    } else if (tbs != mb * ga * world) {
      c.bad("train_batch_size",
            "must equal train_micro_batch_size_per_gpu * gradient_accumulation_steps * world size "
            "= " +
                std::to_string(mb) + " * " + std::to_string(ga) + " * " + std::to_string(world) +
                " = " + std::to_string(mb * ga * world) + " (got " + std::to_string(tbs) + ")");
    }
  }
  cfg.micro_batch = (int)mb;
  cfg.grad_accum = (int)ga;

  // Optimizer.
  OptimizerConfig& o = cfg.optimizer;
  o.type = get_str(j, "optimizer.type", c);
  if (has(j, "optimizer.params.adam_w_mode") && !get_bool(j, "optimizer.params.adam_w_mode"))
    c.bad("optimizer.params.adam_w_mode",
          "only decoupled weight decay (AdamW, adam_w_mode true) is implemented");
  o.lr = get_float(j, "optimizer.params.lr", c);
  if (has(j, "optimizer.params.betas")) {
    const json& b = *at(j, "optimizer.params.betas");
    o.beta1 =
        to_float(check_num(b[0].get<double>(), "optimizer.params.betas[0]", {0, 1, false, true}, c),
                 "optimizer.params.betas[0]", {0, 1, false, true}, c);
    o.beta2 =
        to_float(check_num(b[1].get<double>(), "optimizer.params.betas[1]", {0, 1, false, true}, c),
                 "optimizer.params.betas[1]", {0, 1, false, true}, c);
  }
  o.eps = get_float(j, "optimizer.params.eps", c);
  o.weight_decay = get_float(j, "optimizer.params.weight_decay", c);

  // Training length first: the scheduler's total defaults to it.
  cfg.train_steps = (int)get_int(j, "train_steps", c);

  // Scheduler.
  SchedulerConfig& s = cfg.scheduler;
  s.type = get_str(j, "scheduler.type", c);
  const std::map<std::string, std::vector<std::string>> sched_keys = {
      {"WarmupCosineLR",
       {"warmup_num_steps", "total_num_steps", "warmup_min_ratio", "cos_min_ratio", "warmup_type",
        "last_batch_iteration"}},
      {"WarmupLR",
       {"warmup_num_steps", "warmup_min_ratio", "warmup_type", "warmup_min_lr", "warmup_max_lr",
        "last_batch_iteration"}},
      {"Constant", {}}};
  if (const json* p = at(j, "scheduler.params"); p && p->is_object())
    for (auto it = p->begin(); it != p->end(); ++it) {
      if (it.value().is_null()) continue;  // not set
      const auto& ok = sched_keys.at(s.type);
      if (std::find(ok.begin(), ok.end(), it.key()) == ok.end())
        c.bad("scheduler.params." + it.key(), "not a parameter of scheduler type " + s.type);
    }
  s.warmup_num_steps =
      (int)get_int(j, "scheduler.params.warmup_num_steps", c);
  s.total_num_steps =
      (int)get_int(j, "scheduler.params.total_num_steps", c);
  s.warmup_min_ratio = get_float(j, "scheduler.params.warmup_min_ratio", c);
  s.cos_min_ratio =
      get_float(j, "scheduler.params.cos_min_ratio", c);
  s.warmup_type = get_str(j, "scheduler.params.warmup_type", c);
  if (has(j, "scheduler.params.warmup_max_lr")) {
    const double mx = get_num_or(j, "scheduler.params.warmup_max_lr", 0, c);
    if (has(j, "optimizer.params.lr") && std::fabs(mx - o.lr) > 1e-6 * mx)
      c.bad("scheduler.params.warmup_max_lr",
            "is the peak learning rate and conflicts with optimizer.params.lr (" + num_str(mx) +
                " vs " + num_str(o.lr) + "); give only one");
    o.lr = to_float(mx, "scheduler.params.warmup_max_lr", decl("scheduler.params.warmup_max_lr").range, c);
  }
  if (has(j, "scheduler.params.warmup_min_lr")) {
    const double mn = get_num_in(j, "scheduler.params.warmup_min_lr", 0, {0, o.lr, false, false}, c);
    if (has(j, "scheduler.params.warmup_min_ratio"))
      c.bad("scheduler.params.warmup_min_lr",
            "conflicts with scheduler.params.warmup_min_ratio; give only one");
    s.warmup_min_ratio = (float)(mn / o.lr);
  }
  const int total = s.total_num_steps > 0 ? s.total_num_steps : cfg.train_steps;
  if (s.type == "WarmupCosineLR" && s.warmup_num_steps > total)
    c.bad("scheduler.params.warmup_num_steps",
          "must be <= total_num_steps (" + std::to_string(total) +
              (s.total_num_steps > 0 ? "" : ", from train_steps") + "), got " +
              std::to_string(s.warmup_num_steps));

  cfg.grad_clip = get_float(j, "gradient_clipping", c);
  cfg.zero_stage = (int)get_int(j, "zero_optimization.stage", c);

  // Sharding strategy and its options.
  ShardingStrategy strat = strategy_from_stage(cfg.zero_stage);
  if (has(j, "sharding_strategy")) {
    const std::string name =
        get_str_or(j, "sharding_strategy", "", c);
    const ShardingStrategy s2 = strategy_from_name(name);
    if (has(j, "zero_optimization.stage") && stage_of(s2) != cfg.zero_stage)
      c.bad("sharding_strategy", "'" + name + "' is ZeRO stage " + std::to_string(stage_of(s2)) +
                                     " but zero_optimization.stage is " +
                                     std::to_string(cfg.zero_stage) +
                                     "; give one of them, or make them agree");
    strat = s2;
  }
  cfg.zero_stage = stage_of(strat);
  ShardingPolicy& sp = cfg.sharding;
  sp = ShardingPolicy::for_strategy(strat);
  const bool sharded_params = strat == ShardingStrategy::FullShard ||
                              strat == ShardingStrategy::ShardGradOp ||
                              strat == ShardingStrategy::HybridShard;
  if (has(j, "shard_group_size") && strat != ShardingStrategy::HybridShard)
    c.bad("shard_group_size", std::string("is only used by HYBRID_SHARD (the strategy is ") +
                                  strategy_name(strat) + ")");
  sp.shard_group_size = (int)get_int(j, "shard_group_size", c);
  if (sp.shard_group_size > 0 && world % sp.shard_group_size != 0)
    c.bad("shard_group_size", "must divide the world size (" + std::to_string(world) +
                                  "), got " + std::to_string(sp.shard_group_size));
  if (has(j, "reshard_after_forward")) {
    if (!sharded_params)
      c.bad("reshard_after_forward",
            std::string("only applies to FULL_SHARD, SHARD_GRAD_OP and HYBRID_SHARD (") +
                strategy_name(strat) + " keeps full parameters on every rank)");
    sp.reshard_after_forward = get_bool_or(j, "reshard_after_forward", sp.reshard_after_forward);
  }
  sp.forward_prefetch = get_prefetch(j, "forward_prefetch", c);
  sp.backward_prefetch = get_prefetch(j, "backward_prefetch", c);
  sp.max_live_units = (int)get_int(j, "max_live_units", c);
  if (has(j, "gradient_accumulation_mode"))
    sp.accum = accum_mode_from_name(get_str_or(j, "gradient_accumulation_mode", "", c));
  sp.mixed_precision = mp;
  {
    const std::string key = "zero_optimization.offload_optimizer.device";
    const std::string dev = get_str(j, key, c);
    cfg.autoplan.offload_optimizer = auto_at(j, key);
    sp.offload_optimizer.device = dev == "cpu"    ? OffloadDevice::Cpu
                                  : dev == "nvme" ? OffloadDevice::Nvme
                                                  : OffloadDevice::None;
    const std::string pkey_path = "zero_optimization.offload_optimizer.nvme_path";
    sp.offload_optimizer.nvme_path = get_str(j, pkey_path, c);
    if (dev == "nvme" && sp.offload_optimizer.nvme_path.empty())
      c.bad(pkey_path, "required with device 'nvme' (a directory on a local disk)");
    sp.offload_optimizer.buffer_count = (int)get_int(j, "zero_optimization.offload_optimizer.buffer_count", c);
    sp.offload_optimizer.ratio = get_num(j, "zero_optimization.offload_optimizer.ratio", c);
    sp.offload_optimizer.defer_update =
        get_bool(j, "zero_optimization.offload_optimizer.defer_update");
    const std::string pkey = "zero_optimization.offload_param.device";
    const std::string pdev = get_str(j, pkey, c);
    cfg.autoplan.offload_param = auto_at(j, pkey);
    sp.offload_param.device = pdev == "cpu"    ? OffloadDevice::Cpu
                              : pdev == "nvme" ? OffloadDevice::Nvme
                                               : OffloadDevice::None;
    const std::string ppath = "zero_optimization.offload_param.nvme_path";
    sp.offload_param.nvme_path = get_str(j, ppath, c);
    if (pdev == "nvme" && sp.offload_param.nvme_path.empty())
      c.bad(ppath, "required with device 'nvme' (a directory on a local disk)");
    sp.offload_param.buffer_count =
        (int)get_int(j, "zero_optimization.offload_param.buffer_count", c);
    // DeepSpeed's default is 1e9; here absent means 0: every unit in the file.
    sp.offload_param.max_in_cpu =
        static_cast<int64_t>(get_num(j, "zero_optimization.offload_param.max_in_cpu", c));
    if (pdev == "nvme" && sp.strategy != ShardingStrategy::FullShard &&
        sp.strategy != ShardingStrategy::ShardGradOp &&
        sp.strategy != ShardingStrategy::HybridShard)
      c.bad(pkey, std::string("'nvme' needs a strategy that shards parameters (FULL_SHARD, "
                              "SHARD_GRAD_OP or HYBRID_SHARD), not ") +
                      strategy_name(sp.strategy));
  }
  if (const json* a = at(j, "aio")) {
    json given = *a;  // without the keys that are not set (null)
    for (auto it = a->begin(); it != a->end(); ++it)
      if (it.value().is_null()) given.erase(it.key());
    try {
      sp.aio = AioConfig::from_json(given, "aio");
    } catch (const Error& e) {  // "aio: aio.<key>: <problem>": the config's one line
      const std::string m = std::string(e.what()).substr(5);
      const size_t colon = m.find(": ");
      if (colon == std::string::npos) c.bad("aio", m);
      c.bad(m.substr(0, colon), m.substr(colon + 2));
    }
  }
  // "auto" (has() reads it as absent, DeepSpeed's meaning): the planner chooses.
  cfg.autoplan.blocks = auto_at(j, "blocks_per_unit");
  cfg.blocks_per_unit = (int)get_int(j, "blocks_per_unit", c);
  cfg.comm_timeout_s =
      get_num(j, "comm_timeout_s", c);
  cfg.comm_debug = get_bool(j, "comm_debug");
  cfg.memory_budget = get_bytes(j, "memory_budget", c);

  // Model.
  ModelConfig& m = cfg.model;
  m.type = get_str(j, "model.type", c);
  m.vocab_size =
      (int)get_int(j, "model.vocab_size", c);  // tokens are uint16
  m.n_layer = (int)get_int(j, "model.n_layer", c);
  m.n_head = (int)get_int(j, "model.n_head", c);
  m.n_kv_head = (int)get_int(j, "model.n_kv_head", c);
  m.d_model = (int)get_int(j, "model.d_model", c);
  m.d_ff = (int)get_int(j, "model.d_ff", c);
  m.seq_len = (int)get_int(j, "model.seq_len", c);
  m.rope_theta = get_float(j, "model.rope_theta", c);
  m.norm_eps = get_float(j, "model.norm_eps", c);
  m.tie_embeddings = get_bool(j, "model.tie_embeddings");
  if (m.d_model % m.n_head)
    c.bad("model.d_model", "must be a multiple of model.n_head (" + std::to_string(m.n_head) +
                               "), got " + std::to_string(m.d_model));
  if (m.n_kv_head > 0 && m.n_head % m.n_kv_head)
    c.bad("model.n_kv_head", "must divide model.n_head (" + std::to_string(m.n_head) + "), got " +
                                 std::to_string(m.n_kv_head));
  if (m.type == "gpt2" && m.n_kv_head > 0 && m.n_kv_head != m.n_head)
    c.bad("model.n_kv_head",
          "gpt2 has no grouped-query attention: leave it 0 or equal to model.n_head");
  if (m.type == "llama" && has(j, "model.tie_embeddings") && m.tie_embeddings)
    c.bad("model.tie_embeddings", "is supported for gpt2 only");

  read_activation_checkpointing(j, cfg, c);
  if (cfg.autoplan.any() && cfg.memory_budget == 0)
    c.bad("memory_budget", std::string("required by \"auto\" in ") +
                               (cfg.autoplan.blocks          ? "blocks_per_unit"
                                : cfg.autoplan.checkpointing ? "activation_checkpointing"
                                : cfg.autoplan.offload_optimizer
                                    ? "zero_optimization.offload_optimizer.device"
                                    : "zero_optimization.offload_param.device") +
                               " (the planner chooses within it)");

  // Data and run.
  cfg.train_data = get_str(j, "data.train", c);
  cfg.val_data = get_str(j, "data.val", c);
  cfg.seed = declared_default("seed").get<uint64_t>();
  if (has(j, "seed")) {
    const json& v = *at(j, "seed");
    if ((v.is_number_integer() && !v.is_number_unsigned() && v.get<long long>() < 0) ||
        (v.is_number_float() && !(v.get<double>() >= 0)))
      c.bad("seed", "must be >= 0 (got " + v.dump() + ")");
    cfg.seed = v.is_number_float() ? (uint64_t)v.get<double>() : v.get<uint64_t>();
  }
  cfg.run_dir = get_str(j, "run_dir", c);
  if (cfg.run_dir.empty()) c.bad("run_dir", "must not be empty");
  cfg.eval_every_steps = (int)get_int(j, "eval_every_steps", c);
  cfg.eval_batches = (int)get_int(j, "eval_batches", c);
  cfg.log_every_steps = (int)get_int(j, "log_every_steps", c);
  cfg.threads = (int)get_int(j, "threads", c);
  cfg.device = get_str(j, "device", c);
  if (cfg.device != "cpu" && cfg.device != "cuda" && cfg.device != "sim" &&
      !(cfg.device.rfind("cuda:", 0) == 0 && cfg.device.size() > 5 &&
        cfg.device.find_first_not_of("0123456789", 5) == std::string::npos))
    c.bad("device", "'" + cfg.device + "' is not cpu, cuda or cuda:N");
  cfg.sharding.device_comm = device_comm_from_name(get_str(j, "device_comm", c));

  // Checkpoints.
  CheckpointConfig& k = cfg.checkpoint;
  k.dir = get_str_or(j, "checkpoint.dir", "", c);
  if (has(j, "checkpoint.dir") && k.dir.empty()) c.bad("checkpoint.dir", "must not be empty");
  if (k.dir.empty()) k.dir = default_checkpoint_dir(cfg.run_dir);
  k.every_steps = (int)get_int(j, "checkpoint.every_steps", c);
  k.keep_last = (int)get_int(j, "checkpoint.keep_last", c);
  k.async = get_bool(j, "checkpoint.async");
  k.save_final = get_bool(j, "checkpoint.save_final");
  if (const json* v = at(j, "checkpoint.resume"); v && v->is_string())  // "auto" included
    k.resume = v->get<std::string>();
  k.init_from = get_str(j, "checkpoint.init_from", c);
  if (!k.resume.empty() && !k.init_from.empty())
    c.bad("checkpoint.init_from",
          "conflicts with checkpoint.resume ('" + k.resume +
              "'): a resumed run takes its weights from the checkpoint; give only one");

  // Profiling: the recorded steps must lie in [1, train_steps] (checked when enabled, so a
  // disabled block does not get in the way of a shorter run).
  ProfileConfig& pf = cfg.profile;
  pf.enabled = get_bool(j, "profile.enabled");
  pf.start_step = (int)get_int(j, "profile.start_step", c);
  pf.num_steps = (int)get_int(j, "profile.num_steps", c);
  pf.out = get_str_or(j, "profile.out", "", c);
  if (has(j, "profile.out") && pf.out.empty()) c.bad("profile.out", "must not be empty");
  if (pf.out.empty()) pf.out = default_profile_dir(cfg.run_dir);
  if (pf.enabled && pf.start_step > cfg.train_steps)
    c.bad("profile.start_step", "must be <= train_steps (" + std::to_string(cfg.train_steps) +
                                    "), got " + std::to_string(pf.start_step));
  if (pf.enabled && (long long)pf.start_step + pf.num_steps - 1 > cfg.train_steps)
    c.bad("profile.num_steps",
          std::to_string(pf.num_steps) + " steps from profile.start_step " +
              std::to_string(pf.start_step) + " end at step " +
              std::to_string((long long)pf.start_step + pf.num_steps - 1) +
              ", beyond train_steps (" + std::to_string(cfg.train_steps) + ")");

  // Resolved config: the input (compatibility keys kept as given) with every effective key set
  // to its final value; parse_config(resolved_json) gives the same TrainConfig.
  json r = j;
  write_resolved(r, cfg);
  cfg.resolved_json = r.dump(2) + "\n";
  return cfg;
}

// ---- The key table (README.md) and the declaration as data (tests) ---------------------------

// A table cell: a pipe would end the cell.
std::string cell(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '|') out += '\\';
    out += ch;
  }
  return out;
}

std::string type_text(const Node& n) {
  std::string t;
  switch (n.kind) {
    case Kind::Int:
      t = !n.accepts.empty() ? n.accepts
          : n.hi >= IMAX     ? "integer ≥ " + std::to_string(n.lo)
                             : "integer in [" + std::to_string(n.lo) + ", " +
                               std::to_string(n.hi) + "]";
      break;
    case Kind::Num:
      t = std::isinf(n.range.hi) ? "number " + n.range.str() : "number in " + n.range.str();
      if (t.find(">= ") != std::string::npos) t.replace(t.find(">= "), 3, "≥ ");
      break;
    case Kind::Bool:
      t = "true / false";
      break;
    case Kind::Str:
      if (n.choices.empty()) t = "string";
      for (size_t i = 0; i < n.choices.size(); ++i) t += (i ? " | `" : "`") + n.choices[i] + "`";
      break;
    case Kind::Betas:
      t = "[beta1, beta2], each in " + n.range.str();
      break;
    case Kind::Any:
    case Kind::Obj:
      t = n.accepts;
      break;
  }
  if (n.auto_ok) t += " or `\"auto\"`";
  return t;
}

std::string default_text(const Node& n) {
  if (n.def.is_null()) return n.derived;
  if (n.def.is_string())
    return n.def.get<std::string>().empty() ? "`\"\"`" : "`" + n.def.get<std::string>() + "`";
  if (n.def.is_number_float()) return "`" + num_str(n.def.get<double>()) + "`";  // 1, not 1.0
  if (n.def.is_array()) {  // betas
    std::string t = "`[";
    for (size_t i = 0; i < n.def.size(); ++i) t += (i ? ", " : "") + n.def[i].dump();
    return t + "]`";
  }
  return "`" + n.def.dump() + "`";
}

// Rows for the declared keys under `n` (compatibility-only ones gathered into `compat_keys`,
// one entry per parent object).
void table_rows(const Node& n, const std::string& path, std::string& out,
                std::vector<std::string>& compat_keys) {
  std::vector<std::string> here;
  for (const Node& k : n.kids) {
    const std::string p = join_path(path, k.name);
    if (k.compat) {
      here.push_back(k.name);
      continue;
    }
    if (k.kind != Kind::Obj)
      out += "| `" + p + "` | " + cell(type_text(k)) + " | " + cell(default_text(k)) + " | " +
             cell(k.doc) + " |\n";
    table_rows(k, p, out, compat_keys);
  }
  if (path.empty()) {
    for (const std::string& k : here) compat_keys.push_back("`" + k + "`");
  } else if (here.size() == 1) {
    compat_keys.push_back("`" + path + "." + here[0] + "`");
  } else if (!here.empty()) {
    std::string g = "`" + path + ".{";
    for (size_t i = 0; i < here.size(); ++i) g += (i ? ", " : "") + here[i];
    compat_keys.push_back(g + "}`");
  }
}

void declaration_rows(const Node& n, const std::string& path, json& out) {
  for (const Node& k : n.kids) {
    const std::string p = join_path(path, k.name);
    if (k.kind != Kind::Obj) {
      json row = {{"key", p},         {"kind", kind_name(k.kind)}, {"default", k.def},
                  {"derived", k.derived}, {"compat", k.compat},    {"alias", k.alias},
                  {"auto_ok", k.auto_ok}, {"doc", k.doc}};
      if (k.kind == Kind::Int || (k.kind == Kind::Any && (k.lo != 0 || k.hi != IMAX)))
        row["min"] = k.lo, row["max"] = k.hi;
      if (k.kind == Kind::Num || k.kind == Kind::Betas)
        row["range"] = {k.range.lo_open ? "(" : "[", std::isinf(k.range.lo) ? json() : json(k.range.lo),
                        std::isinf(k.range.hi) ? json() : json(k.range.hi), k.range.hi_open ? ")" : "]"};
      if (!k.choices.empty()) row["choices"] = k.choices;
      out.push_back(row);
    }
    declaration_rows(k, p, out);
  }
}

}  // namespace

std::string config_keys_markdown() {
  std::string out =
      "| key | type | default | meaning |\n"
      "| --- | --- | --- | --- |\n";
  std::vector<std::string> compat_keys;
  table_rows(schema(), "", out, compat_keys);
  out += "\nAccepted for DeepSpeed compatibility with no effect yet (type-checked, kept in the "
         "resolved config, listed in one note when a run starts):";
  for (size_t i = 0; i < compat_keys.size(); ++i) out += (i ? ", " : " ") + compat_keys[i];
  out += ".\n";
  return out;
}

std::string config_declaration_json() {
  json rows = json::array();
  declaration_rows(schema(), "", rows);
  return rows.dump(1) + "\n";
}

std::string config_json(const TrainConfig& cfg) {
  json r = json::object();
  write_resolved(r, cfg);
  return r.dump(2) + "\n";
}

TrainConfig parse_config(const std::string& json_text, const std::string& source,
                         const std::vector<std::string>& overrides, int world_size) {
  return read_config(parse_text(json_text, source), source, overrides, world_size);
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
