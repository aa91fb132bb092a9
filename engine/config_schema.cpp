// The config keys' one declaration (config_schema.h): for each key its JSON kind, range or
// allowed strings, default, one line for README.md's key table, and its binding to the
// TrainConfig field it sets. The reader, the resolved config, validate_config and the key table
// all come from schema(); a key with a form or a rule of its own has its reading in
// config_reader.cpp (named there), and only its declaration here.
#include <algorithm>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <type_traits>

#include "engine/config_schema.h"
#include "engine/config_text.h"

namespace sw::config {

namespace {

// ---- Declaring keys ------------------------------------------------------------------------

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
  n.int_range = true;
  n.lo = lo, n.hi = hi;
  return n;
}
// Kind::Any whose integer values must lie in [lo, hi].
Node ints(Node n, long long lo, long long hi) {
  n.int_range = true;
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

// ---- Binding keys to TrainConfig -------------------------------------------------------

// The field of `obj` reached through the member pointers `ms` (&TrainConfig::model,
// &ModelConfig::n_layer: cfg.model.n_layer).
template <class T, class M>
auto& field(T& obj, M m) {
  return obj.*m;
}
template <class T, class M, class... Ms>
auto& field(T& obj, M m, Ms... ms) {
  return field(obj.*m, ms...);
}

// A key's value as the field's type, checked against the declaration.
template <class F>
F value_as(const Node& n, const json& v, const std::string& path, const Ctx& c) {
  if constexpr (std::is_same_v<F, bool> || std::is_same_v<F, std::optional<bool>>)
    return v.get<bool>();
  else if constexpr (std::is_same_v<F, std::string>)
    return read_str(n, v, path, c);
  else if constexpr (std::is_same_v<F, float>)
    return to_float(read_num(n, v, path, c), path, n.range, c);
  else if constexpr (std::is_floating_point_v<F>)
    return read_num(n, v, path, c);
  else if (n.kind == Kind::Num)  // an integer field of a number key (offload_param.max_in_cpu)
    return static_cast<F>(read_num(n, v, path, c));
  else
    return static_cast<F>(read_int(n, v, path, c));
}

template <class F>
json json_of(const F& x) {
  if constexpr (std::is_same_v<F, float>)
    return fjson(x);
  else if constexpr (std::is_same_v<F, std::optional<bool>>)
    return x ? json(*x) : json();
  else
    return json(x);
}

// The key reads and writes the field at `ms`; the field's type says how (a number within the
// declared range, a string among the choices, ...).
template <class... Ms>
Node to(Node n, Ms... ms) {
  using F = std::remove_cvref_t<decltype(field(std::declval<TrainConfig&>(), ms...))>;
  n.bind.read = [ms...](TrainConfig& c, const json& v, const Node& k, const std::string& p,
                        const Ctx& x) { field(c, ms...) = value_as<F>(k, v, p, x); };
  n.bind.write = [ms...](const TrainConfig& c) { return json_of(field(c, ms...)); };
  return n;
}
// The same for an enum field written as one of the key's choices.
template <class E, class... Ms>
Node named(Node n, const char* (*name)(E), E (*from_name)(const std::string&), Ms... ms) {
  n.bind.read = [=](TrainConfig& c, const json& v, const Node& k, const std::string& p,
                    const Ctx& x) { field(c, ms...) = from_name(read_str(k, v, p, x)); };
  n.bind.write = [=](const TrainConfig& c) { return json(name(field(c, ms...))); };
  return n;
}
// The same with a reader of the key's own form (read_prefetch, ...).
template <class R, class... Ms>
Node via(Node n, R (*read)(const Node&, const json&, const std::string&, const Ctx&),
         Ms... ms) {
  n = to(std::move(n), ms...);
  n.bind.read = [=](TrainConfig& c, const json& v, const Node& k, const std::string& p,
                    const Ctx& x) { field(c, ms...) = read(k, v, p, x); };
  return n;
}
// Read by config_reader.cpp (a rule between keys or a form of its own); written by the binding.
Node read_elsewhere(Node n) {
  n.bind.read = nullptr;
  return n;
}
// What the resolved config shows for the key, instead of the field as it is (an "auto", a
// value derived for code). A key with no read bound is read by config_reader.cpp.
Node writes(Node n, std::function<json(const TrainConfig&)> write) {
  n.bind.write = std::move(write);
  return n;
}
Node applies_when(Node n, std::function<bool(const TrainConfig&)> applies) {
  n.bind.applies = std::move(applies);
  return n;
}
// validate_config leaves the field to its reader's own checks.
Node unchecked(Node n) {
  n.bind.checked = false;
  return n;
}

OffloadDevice offload_device_from_name(const std::string& s) {
  return s == "cpu" ? OffloadDevice::Cpu : s == "nvme" ? OffloadDevice::Nvme : OffloadDevice::None;
}
AioBackend aio_backend_from_name(const std::string& s) {
  return s == "io_uring" ? AioBackend::IoUring : s == "threads" ? AioBackend::Threads
                                                                : AioBackend::Auto;
}

// The strategy families and schedule types that read a key (Binding::applies).
bool sharded_params(const TrainConfig& c) {
  const ShardingStrategy s = c.sharding.strategy;
  return s == ShardingStrategy::FullShard || s == ShardingStrategy::ShardGradOp ||
         s == ShardingStrategy::HybridShard;
}
bool hybrid(const TrainConfig& c) { return c.sharding.strategy == ShardingStrategy::HybridShard; }
bool warmup(const TrainConfig& c) { return c.scheduler.type != "Constant"; }
bool cosine(const TrainConfig& c) { return c.scheduler.type == "WarmupCosineLR"; }
bool llama(const TrainConfig& c) { return c.model.type == "llama"; }
bool llama3(const TrainConfig& c) { return llama(c) && c.model.rope_scaling == "llama3"; }

// optimizer.params.betas: [beta1, beta2], each checked as a float.
void read_betas(TrainConfig& c, const json& v, const Node& n, const std::string& path,
                const Ctx& x) {
  float* out[2] = {&c.optimizer.beta1, &c.optimizer.beta2};
  for (size_t i = 0; i < 2; ++i) {
    const std::string p = path + "[" + std::to_string(i) + "]";
    *out[i] = to_float(check_num(v[i].get<double>(), p, n.range, x), p, n.range, x);
  }
}

// mixed_precision's dtype names.
const char* precision_name(DType d) {
  return d == DType::BF16 ? "bf16" : d == DType::F16 ? "fp16" : "fp32";
}

// ---- The declaration -----------------------------------------------------------------------
//
// Each key once, in the order of README.md's table, one function per block. Its binding:
// to(...) for a field the key sets as written; named(...) for an enum field; via(...) for a
// form of its own; read_elsewhere(...) for keys config_reader.cpp reads (a rule between keys,
// an alias: named there); writes(...) where the resolved config shows something else than the
// field (an "auto", a derived default); applies_when(...) for keys some configs do not read.

const std::vector<std::string> kDevices = {"none", "cpu", "nvme"};
constexpr auto S = &TrainConfig::sharding;

Node model_block() {
  constexpr auto M = &TrainConfig::model;
  return obj(
      "model",
      {to(string("type", "gpt2", {"gpt2", "llama"},
                 "`gpt2` (learned positions, LayerNorm, GELU, tied embedding/head) or "
                 "`llama` (RMSNorm, RoPE, SwiGLU, grouped-query attention; Llama 2 / 3, "
                 "Mistral, Qwen2)"),
          M, &ModelConfig::type),
       to(integer("vocab_size", 256, 1, IMAX,
                  "tokens (ids in the data files: uint16 up to 65,536, int32 above)"),
          M,
          &ModelConfig::vocab_size),
       to(integer("n_layer", 4, 1, IMAX, "transformer blocks"), M, &ModelConfig::n_layer),
       to(integer("n_head", 4, 1, IMAX, "attention heads (must divide `d_model`)"), M,
          &ModelConfig::n_head),
       to(integer("n_kv_head", 0, 0, IMAX,
                  "llama: key/value heads of grouped-query attention (0 = `n_head`; must "
                  "divide it)"),
          M, &ModelConfig::n_kv_head),
       to(integer("d_model", 128, 1, IMAX, "the model width"), M, &ModelConfig::d_model),
       to(integer("d_ff", 0, 0, IMAX,
                  "the MLP's hidden width (0 = gpt2: 4 d_model; llama: 8/3 d_model "
                  "rounded up to a multiple of 64)"),
          M, &ModelConfig::d_ff),
       to(integer("seq_len", 128, 1, IMAX, "the context length (gpt2: the position table's size)"),
          M, &ModelConfig::seq_len),
       to(number("rope_theta", 10000, kPositive, "llama: RoPE's base"), M,
          &ModelConfig::rope_theta),
       to(number("norm_eps", 1e-5, kPositive, "LayerNorm / RMSNorm epsilon"), M,
          &ModelConfig::norm_eps),
       writes(to(derived(boolean("tie_embeddings", true,
                                 "the LM head shares the embedding's weight (Llama 3.2 1B ties "
                                 "them)"),
                         "gpt2: true; llama: false"),
                 M, &ModelConfig::tie_embeddings),
              [](const TrainConfig& c) { return json(c.model.tied()); }),
       applies_when(to(boolean("qkv_bias", false,
                               "llama: biases on the q, k and v projections (Qwen2)"),
                       M, &ModelConfig::qkv_bias),
                    llama),
       applies_when(to(string("rope_scaling", "none", {"none", "llama3"},
                              "llama: RoPE frequency scaling (`llama3`: Llama 3.1+, the "
                              "`rope_*` keys below)"),
                       M, &ModelConfig::rope_scaling),
                    llama),
       applies_when(to(number("rope_factor", 8, kPositive,
                              "llama3 scaling: low frequencies divided by this"),
                       M, &ModelConfig::rope_factor),
                    llama3),
       applies_when(to(number("rope_low_freq_factor", 1, kPositive,
                              "llama3 scaling: wavelengths above original_max_pos / this are "
                              "scaled"),
                       M, &ModelConfig::rope_low_freq_factor),
                    llama3),
       applies_when(to(number("rope_high_freq_factor", 4, kPositive,
                              "llama3 scaling: wavelengths below original_max_pos / this are "
                              "kept"),
                       M, &ModelConfig::rope_high_freq_factor),
                    llama3),
       applies_when(to(integer("rope_original_max_pos", 8192, 1, IMAX,
                               "llama3 scaling: the context length the model was trained at"),
                       M, &ModelConfig::rope_original_max_pos),
                    llama3),
       to(string("hf_architecture", "",
                 {"", "GPT2LMHeadModel", "LlamaForCausalLM", "MistralForCausalLM",
                  "Qwen2ForCausalLM"},
                 "the Hugging Face class the model was imported from or exports as (\"\" = "
                 "the type's own)"),
          M, &ModelConfig::hf_architecture)});
}

Node data_block() {
  return obj("data",
             {to(string("train", "", {},
                        "the training token files (llm.c `.bin`): a file, a directory (its "
                        "`*.bin`, sorted) or a glob; a mask file `X.mask` beside `X.bin` "
                        "excludes targets from the loss; required by `train`"),
                 &TrainConfig::train_data),
              to(string("val", "", {},
                        "the validation token files, as `train` (\"\" = none)"),
                 &TrainConfig::val_data),
              to(string("tokenizer", "", {},
                        "the tokenizer the data was prepared with: a Hugging Face "
                        "`tokenizer.json`, a SentencePiece `.model`, or a directory holding one "
                        "(\"\" = bytes); `sample` encodes and decodes with it, an export "
                        "copies it"),
                 &TrainConfig::tokenizer)});
}

// Batch sizes: any two of the three determine the third (config_reader.cpp read_batch).
std::vector<Node> batch_keys() {
  return {to(auto_ok(integer("train_micro_batch_size_per_gpu", 8, 1, IMAX,
                             "rows per data-parallel rank per micro-step (the ranks of a "
                             "tensor group read the same rows)")),
             &TrainConfig::micro_batch),
          to(auto_ok(integer("gradient_accumulation_steps", 1, 1, IMAX,
                             "micro-steps per optimizer step")),
             &TrainConfig::grad_accum),
          writes(auto_ok(derived(integer("train_batch_size", 0, 1, IMAX,
                                         "rows per optimizer step over all data-parallel ranks: "
                                         "any two of the three batch keys determine the third "
                                         "(as in DeepSpeed); the resolved config leaves it null "
                                         "(it depends on the world size)"),
                                 "micro batch × accumulation steps × data-parallel size "
                                 "(world size / tensor degree)")),
                 [](const TrainConfig&) { return json(); })};
}

// The run's length, seed, directories and threads.
std::vector<Node> run_keys() {
  Node seed = integer("seed", 1337, 0, IMAX, "random seed (initialisation and data order)");
  seed.accepts = "an integer in [0, 2^64)";
  return {
      to(integer("train_steps", 100, 1, IMAX, "optimizer steps"), &TrainConfig::train_steps),
      unchecked(via(seed, read_seed, &TrainConfig::seed)),
      to(string("run_dir", "runs/default", {},
                "where metrics.jsonl, config.json (this config, resolved) and the "
                "Hugging Face export `hf/` go; not empty"),
         &TrainConfig::run_dir),
      to(integer("eval_every_steps", 0, 0, IMAX,
                 "validation every N steps (0 = only at the end, when `data.val` is set)"),
         &TrainConfig::eval_every_steps),
      to(integer("eval_batches", 8, 1, IMAX, "batches per validation"),
         &TrainConfig::eval_batches),
      to(integer("log_every_steps", 1, 1, IMAX,
                 "a console line every N steps (metrics.jsonl gets every step)"),
         &TrainConfig::log_every_steps),
      to(integer("threads", 0, 0, 4096, "threads per rank (0 = cores / local ranks)"),
         &TrainConfig::threads),
      to(string("device", "cpu", {},
                "where the model lives and computes: `cpu`, `cuda` (this rank's GPU: local "
                "rank modulo the GPUs, or `SHARDWISE_CUDA_DEVICE`) or `cuda:N`; a build "
                "without the CUDA backend refuses `cuda`"),
         &TrainConfig::device),
      named(string("device_comm", "auto", {"auto", "native", "staged"},
                   "how a device's unit buffers reach the peers: `native` (NCCL), `staged` (MPI "
                   "through host staging buffers: several ranks per GPU), `auto` (native where "
                   "every rank has a GPU of its own)"),
            device_comm_name, device_comm_from_name, S, &ShardingPolicy::device_comm)};
}

Node optimizer_block() {
  constexpr auto O = &TrainConfig::optimizer;
  Node betas = key("betas", Kind::Betas, json::array({0.9, 0.95}),
                   "AdamW's and Lamb's moment decay rates [beta1, beta2] (Lamb: default "
                   "[0.9, 0.999], DeepSpeed's)");
  betas.range = {0, 1, false, true};
  betas.bind.read = read_betas;
  betas.bind.write = [](const TrainConfig& c) {
    return json::array({fjson(c.optimizer.beta1), fjson(c.optimizer.beta2)});
  };
  // The parameters each type reads (config_reader.cpp check_optimizer_params refuses others).
  auto is = [](std::initializer_list<const char*> ts) {
    std::vector<std::string> v(ts.begin(), ts.end());
    return [v](const TrainConfig& c) {
      return std::find(v.begin(), v.end(), c.optimizer.type) != v.end();
    };
  };
  return obj(
      "optimizer",
      {to(string("type", "AdamW", {"AdamW", "Adam", "SGD", "LARS", "Lamb"},
                 "`Adam` is DeepSpeed's Adam with `adam_w_mode` true: AdamW; `SGD` is "
                 "torch.optim.SGD; `LARS` SGD with LARC's per-tensor trust ratio (biases and "
                 "norms excluded); `Lamb` DeepSpeed's FusedLamb. Parameters of another type "
                 "are errors; each keeps its state in the two moment buffers checkpoints hold"),
          O, &OptimizerConfig::type),
       obj("params",
           {to(number("lr", 3e-4, kPositive, "the peak learning rate"), O, &OptimizerConfig::lr),
            applies_when(betas, is({"AdamW", "Adam", "Lamb"})),
            applies_when(to(number("eps", 1e-8, kPositive,
                                   "AdamW's and Lamb's epsilon; LARS's in the trust ratio"),
                            O, &OptimizerConfig::eps),
                         is({"AdamW", "Adam", "Lamb", "LARS"})),
            to(number("weight_decay", 0.1, kNonNegative,
                      "AdamW: decoupled weight decay; SGD, LARS, Lamb: added to the gradient "
                      "(L2; Lamb: to its update), default 0 for them"),
               O, &OptimizerConfig::weight_decay),
            applies_when(to(number("momentum", 0, kUnit, "SGD, LARS: momentum factor"), O,
                            &OptimizerConfig::momentum),
                         is({"SGD", "LARS"})),
            applies_when(to(number("dampening", 0, kUnit, "SGD, LARS: dampening for momentum"), O,
                            &OptimizerConfig::dampening),
                         is({"SGD", "LARS"})),
            applies_when(to(boolean("nesterov", false,
                                    "SGD, LARS: Nesterov momentum (needs momentum > 0, "
                                    "dampening 0)"),
                            O, &OptimizerConfig::nesterov),
                         is({"SGD", "LARS"})),
            applies_when(to(number("trust_coefficient", 1e-3, kPositive,
                                   "LARS: eta of the trust ratio eta |w| / (|g| + wd |w| + eps)"),
                            O, &OptimizerConfig::trust_coefficient),
                         is({"LARS"})),
            applies_when(to(number("max_coeff", 10, kPositive,
                                   "Lamb: the largest trust ratio |w| / |update|"),
                            O, &OptimizerConfig::max_coeff),
                         is({"Lamb"})),
            applies_when(to(number("min_coeff", 0.01, kPositive,
                                   "Lamb: the smallest trust ratio"),
                            O, &OptimizerConfig::min_coeff),
                         is({"Lamb"})),
            // Only true is implemented (config_reader.cpp refuses false).
            applies_when(writes(boolean("adam_w_mode", true,
                                        "must be true: L2 regularisation (false) is not "
                                        "implemented"),
                                [](const TrainConfig&) { return json(true); }),
                         is({"AdamW", "Adam"})),
            applies_when(to(boolean("bias_correction", true,
                                    "Lamb: the step size lr sqrt(1 - beta2^t) / (1 - beta1^t) "
                                    "(AdamW: accepted, always corrected)"),
                            O, &OptimizerConfig::bias_correction),
                         is({"Lamb"})),
            cbool("torch_adam"), cbool("fused"), cbool("amsgrad")})});
}

// A type's parameters are errors with another type (config_reader.cpp read_scheduler, which
// also resolves the two aliases).
Node scheduler_block() {
  constexpr auto SC = &TrainConfig::scheduler;
  return obj(
      "scheduler",
      {to(string("type", "WarmupCosineLR", {"WarmupCosineLR", "WarmupLR", "Constant"},
                 "the learning-rate schedule (DeepSpeed's formulas, engine/schedule.h); "
                 "parameters of another type are errors"),
          SC, &SchedulerConfig::type),
       obj("params",
           {applies_when(to(integer("warmup_num_steps", 0, 0, IMAX,
                                    "steps of warm-up from `lr * warmup_min_ratio` to `lr`"),
                            SC, &SchedulerConfig::warmup_num_steps),
                         warmup),
            applies_when(to(integer("total_num_steps", 0, 0, IMAX,
                                    "WarmupCosineLR: steps of the whole schedule (0 = "
                                    "`train_steps`)"),
                            SC, &SchedulerConfig::total_num_steps),
                         cosine),
            applies_when(to(number("warmup_min_ratio", 0, kUnit, "the lr at step 0 = `lr *` this"),
                            SC, &SchedulerConfig::warmup_min_ratio),
                         warmup),
            applies_when(to(number("cos_min_ratio", 0.1, kUnit,
                                   "WarmupCosineLR: the lr at the end = `lr *` this"),
                            SC, &SchedulerConfig::cos_min_ratio),
                         cosine),
            applies_when(to(string("warmup_type", "linear", {"linear", "log"},
                                   "the warm-up curve (DeepSpeed's default is `log`)"),
                            SC, &SchedulerConfig::warmup_type),
                         warmup),
            alias(derived(number("warmup_min_lr", 0, kNonNegative,
                                 "WarmupLR: the lr at step 0 (at most the peak), "
                                 "another way to give `warmup_min_ratio`"),
                          "unset")),
            alias(derived(number("warmup_max_lr", 0, kPositive,
                                 "WarmupLR: the peak lr, another way to give "
                                 "`optimizer.params.lr` (give only one)"),
                          "unset")),
            cnum("last_batch_iteration")})});
}

Node bf16_block() {
  return obj("bf16", {to(boolean("enabled", false,
                                 "bf16 mixed precision: fp32 master weights and AdamW state; "
                                 "parameters all-gathered and computed in bf16, gradients "
                                 "reduced in it (at most one of bf16 / fp16)"),
                         &TrainConfig::bf16),
                      cbool("immediate_grad_update")});
}

Node fp16_block() {
  constexpr auto LS = &TrainConfig::loss_scaler;
  return obj(
      "fp16",
      {to(boolean("enabled", false,
                  "fp16 mixed precision (as bf16) with DeepSpeed's loss scaling; an overflowing "
                  "step is skipped (`overflow`, `skipped_steps`, `loss_scale` in metrics.jsonl)"),
          &TrainConfig::fp16),
       cbool("auto_cast"),
       to(number("loss_scale", 0, kNonNegative, "0 = dynamic loss scaling, else a static scale"),
          LS, &LossScalerConfig::loss_scale),
       to(integer("initial_scale_power", 16, 0, 120, "dynamic: the scale starts at 2^this"), LS,
          &LossScalerConfig::initial_scale_power),
       to(integer("loss_scale_window", 1000, 1, IMAX,
                  "dynamic: the scale doubles after this many steps without overflow"),
          LS, &LossScalerConfig::loss_scale_window),
       to(integer("hysteresis", 2, 1, IMAX,
                  "dynamic: overflows tolerated before the scale is halved"),
          LS, &LossScalerConfig::hysteresis),
       to(boolean("consecutive_hysteresis", false,
                  "dynamic: restore `hysteresis` after every good step (not only at a doubling)"),
          LS, &LossScalerConfig::consecutive_hysteresis),
       to(number("min_loss_scale", 1, kPositive,
                 "dynamic: the scale's floor (an overflow there stops the run)"),
          LS, &LossScalerConfig::min_loss_scale)});
}

// The dtypes bf16 / fp16 imply unless given (config_reader.cpp read_mixed_precision).
Node mixed_precision_block() {
  const std::vector<std::string> dtypes = {"fp32", "bf16", "fp16"};
  return obj(
      "mixed_precision",
      {writes(derived(string("param_dtype", "", dtypes,
                             "parameters are all-gathered and computed in it (fp16 needs "
                             "`fp16.enabled`)"),
                      "the enabled block's type, else `fp32`"),
              [](const TrainConfig& c) {
                return json(precision_name(c.sharding.mixed_precision.param_dtype));
              }),
       writes(derived(string("reduce_dtype", "", dtypes, "gradients are reduced in it"),
                      "`param_dtype`"),
              [](const TrainConfig& c) {
                return json(precision_name(c.sharding.mixed_precision.reduce_dtype));
              })});
}

// fp8 (kernels/fp8_ops.h), read by config_reader.cpp read_mixed_precision (its rules: bf16
// needed, amax_history only with the delayed recipe).
Node fp8_block() {
  return obj(
      "fp8",
      {writes(boolean("enabled", false,
                      "FP8 linears (needs bf16): the transformer blocks' Linear products in "
                      "E4M3 (forward) and E5M2 x E4M3 (gradients) with per-tensor scales, fp32 "
                      "accumulation; the LM head, attention and norms stay bf16 / fp32"),
              [](const TrainConfig& c) { return json(c.sharding.mixed_precision.fp8); }),
       writes(string("recipe", "current", {"current", "delayed"},
                     "the scales: `current` (fp8_max / amax of the tensor now) or `delayed` "
                     "(the largest amax of the call site's last `amax_history` calls)"),
              [](const TrainConfig& c) {
                return json(c.sharding.mixed_precision.fp8_delayed ? "delayed" : "current");
              }),
       writes(boolean("round_scales_to_power_of_2", false,
                      "every fp8 scale rounded down to a power of two (exact scaling; "
                      "`all_gather` implies it)"),
              [](const TrainConfig& c) { return json(c.sharding.mixed_precision.fp8_pow2); }),
       writes(boolean("all_gather", false,
                      "sharded units gather their Linear weights as E4M3 bytes with one "
                      "power-of-two scale per tensor, other parameters bf16 (about half the "
                      "bytes; the same steps bit for bit); needs `current`; CPU only for now"),
              [](const TrainConfig& c) {
                return json(c.sharding.mixed_precision.fp8_all_gather);
              }),
       applies_when(writes(integer("amax_history", 16, 1, 1024,
                                   "delayed recipe: amaxes kept per tensor of a call site"),
                           [](const TrainConfig& c) {
                             return json(c.sharding.mixed_precision.fp8_amax_history);
                           }),
                    [](const TrainConfig& c) { return c.sharding.mixed_precision.fp8_delayed; })});
}

Node offload_optimizer_block() {
  constexpr auto OO = &ShardingPolicy::offload_optimizer;
  Node b = obj(
      "offload_optimizer",
      {writes(named(string("device", "none", kDevices,
                           "`cpu`: AdamW's moments (8 bytes per parameter / shard group) live in "
                           "host memory outside the device's `memory_budget` (on the CPU backend "
                           "the update reads them in place); `nvme`: in "
                           "`<nvme_path>/rank_<r>/optimizer.bin` (checked for room before "
                           "training, removed at a clean exit), read ahead of and written behind "
                           "the update; `\"auto\"`: the planner chooses within `memory_budget`. "
                           "Training, checkpoints and resume are bit-identical"),
                    offload_device_name, offload_device_from_name, S, OO,
                    &OptimizerOffload::device),
              [](const TrainConfig& c) {
                return json(c.autoplan.offload_optimizer
                                ? "auto"
                                : offload_device_name(c.sharding.offload_optimizer.device));
              }),
       to(number("ratio", 1.0, kUnit, "the fraction of the units offloaded, the first ones"), S,
          OO, &OptimizerOffload::ratio),
       to(string("nvme_path", "", {}, "`nvme`: the directory (required with it)"), S, OO,
          &OptimizerOffload::nvme_path),
       to(integer("buffer_count", 4, 2, 1 << 20, "`nvme`: staging buffers of the update"), S, OO,
          &OptimizerOffload::buffer_count),
       to(boolean("defer_update", true,
                  "`nvme`: each offloaded unit's update runs at the start of the next step's "
                  "first forward, just before the unit is first used, so its moments' reads and "
                  "write-backs overlap forward compute (evaluation, checkpoints and export apply "
                  "it first; bit-identical either way). Not with `offload_param` `nvme` or "
                  "SHARD_OPTIMIZER, which update at the step's end"),
          S, OO, &OptimizerOffload::defer_update),
       cbool("pin_memory")});
  for (const char* k : {"pipeline_read", "pipeline_write", "fast_init"}) b.kids.push_back(cbool(k));
  return b;
}

Node offload_param_block() {
  constexpr auto OP = &ShardingPolicy::offload_param;
  return obj(
      "offload_param",
      {writes(named(string("device", "none", kDevices,
                           "`cpu`: every unit's fp32 master shard and reduced gradient shard live "
                           "in host memory outside the device's `memory_budget` (FULL_SHARD / "
                           "SHARD_GRAD_OP then keep no parameters on the device between uses; "
                           "stages 0/1 and one rank keep their compute copy there and the master "
                           "on the host); `nvme` (FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD): both "
                           "shards live in `<nvme_path>/rank_<r>/params.bin`, each gather's "
                           "master shard is read ahead into a staging buffer, gradients are "
                           "accumulated in staging and written back after each reduction, and "
                           "the optimizer streams them in pieces; `\"auto\"`: the planner "
                           "chooses within `memory_budget`. Bit-identical training and resume"),
                    offload_device_name, offload_device_from_name, S, OP, &ParamOffload::device),
              [](const TrainConfig& c) {
                return json(c.autoplan.offload_param
                                ? "auto"
                                : offload_device_name(c.sharding.offload_param.device));
              }),
       to(string("nvme_path", "", {}, "`nvme`: the directory (required with it)"), S, OP,
          &ParamOffload::nvme_path),
       to(integer("buffer_count", 5, 2, 1 << 20,
                  "`nvme`: staging buffers for gathers (each one unit's shard)"),
          S, OP, &ParamOffload::buffer_count),
       cbool("pin_memory"), cnum("buffer_size"),
       to(auto_ok(number("max_in_cpu", 0, {0, 1e15, false, false},
                         "`nvme`: the first units whose shards fit in this many elements per "
                         "rank stay on the host tier instead (partial offload; DeepSpeed's "
                         "default is 1e9)")),
          S, OP, &ParamOffload::max_in_cpu)});
}

bool read_quant_scope(const Node& k, const json& v, const std::string& p, const Ctx& c) {
  return read_str(k, v, p, c) == "all";
}

// stage: read together with sharding_strategy (config_reader.cpp read_strategy).
Node zero_block() {
  Node zero = obj("zero_optimization",
                  {writes(integer("stage", 3, 0, 3,
                                  "3 FULL_SHARD, 2 SHARD_GRAD_OP, 1 SHARD_OPTIMIZER, 0 NO_SHARD; "
                                  "must agree with `sharding_strategy` when both are given"),
                          [](const TrainConfig& c) {
                            return json(stage_of(c.sharding.strategy));
                          })});
  for (const char* k :
       {"allgather_partitions", "overlap_comm", "reduce_scatter", "contiguous_gradients",
        "round_robin_gradients", "elastic_checkpoint", "ignore_unused_parameters",
        "load_from_fp32_weights", "cpu_offload", "stage3_gather_16bit_weights_on_model_save",
        "stage3_gather_fp16_weights_on_model_save", "mics_hierarchical_params_gather",
        "use_multi_rank_bucket_allreduce", "memory_efficient_linear"})
    zero.kids.push_back(cbool(k));
  for (const char* k :
       {"allgather_bucket_size", "reduce_bucket_size", "sub_group_size",
        "stage3_max_live_parameters", "stage3_max_reuse_distance", "stage3_prefetch_bucket_size",
        "stage3_param_persistence_threshold", "zero_hpz_partition_size", "mics_shard_size"})
    zero.kids.push_back(cnum(k));
  zero.kids.push_back(offload_optimizer_block());
  zero.kids.push_back(offload_param_block());
  // Compressed collectives (sharding/policy.h CommQuantization, sharding/comm/quantize.h).
  constexpr auto Q = &ShardingPolicy::quantized;
  zero.kids.push_back(to(boolean("zero_quantized_weights", false,
                                 "ZeRO++ qwZ: sharded units all-gather their parameters "
                                 "block-quantised (`quantized_bits`); masters stay exact"),
                         S, Q, &CommQuantization::weights));
  zero.kids.push_back(to(boolean("zero_quantized_gradients", false,
                                 "ZeRO++ qgZ: gradients are reduced with quantised messages "
                                 "(all-to-all reduce-scatter, error feedback); reduce_dtype fp32"),
                         S, Q, &CommQuantization::gradients));
  zero.kids.push_back(to(integer("quantized_bits", 8, 4, 8, "`8` (int8) or `4` (int4)"), S, Q,
                         &CommQuantization::bits));
  zero.kids.push_back(to(integer("quantized_block_size", 256, 1, IMAX,
                                 "values per fp32 scale of the quantised collectives"),
                         S, Q, &CommQuantization::block));
  zero.kids.push_back(
      writes(via(string("quantized_scope", "replicate", {"replicate", "all"},
                        "`replicate`: only what crosses hosts is quantised (HYBRID_SHARD: the "
                        "replica all-reduce; other strategies: their one group); `all`: "
                        "HYBRID's shard group too"),
                 read_quant_scope, S, Q, &CommQuantization::all_dims),
             [](const TrainConfig& c) {
               return json(c.sharding.quantized.all_dims ? "all" : "replicate");
             }));
  return zero;
}

// activation_checkpointing: "off" | "full" | "selective", or an object with mode, every,
// units, offload, nvme_path (ours) and DeepSpeed's keys (compatibility only). Kind::Any with
// kids: an object value is validated against the kids, the rest is checked when read
// (config_reader.cpp read_activation_checkpointing; config_writer.cpp writes it).
Node activation_checkpointing_key() {
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
      string("offload", "none", kDevices,
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
  return act;
}

// sharding_strategy and the strategy's options (read_strategy, read_sharding_rules in
// config_reader.cpp check what applies to which strategy).
std::vector<Node> sharding_keys() {
  const char* prefetch_accepts = "an integer in [0, 1024], or true (1) / false (0)";
  return {
      writes(derived(string("sharding_strategy", "",
                            {"FULL_SHARD", "SHARD_GRAD_OP", "SHARD_OPTIMIZER", "NO_SHARD",
                             "HYBRID_SHARD"},
                            "FSDP's name for the strategy; HYBRID_SHARD is FULL_SHARD within "
                            "groups of `shard_group_size` ranks, all-reduced across the groups"),
                     "from `zero_optimization.stage`"),
             [](const TrainConfig& c) { return json(strategy_name(c.sharding.strategy)); }),
      applies_when(to(integer("shard_group_size", 0, 0, IMAX,
                              "HYBRID_SHARD only: data-parallel ranks per shard group, dividing "
                              "the data-parallel size (world size / tensor degree; 0 = the "
                              "ranks per node / tensor degree where they divide it, else all)"),
                      S, &ShardingPolicy::shard_group_size),
                   hybrid),
      applies_when(to(derived(boolean("reshard_after_forward", true,
                                      "free a unit's gathered parameters after forward and "
                                      "gather again for backward (FULL_SHARD, SHARD_GRAD_OP, "
                                      "HYBRID_SHARD only)"),
                              "true, SHARD_GRAD_OP: false"),
                      S, &ShardingPolicy::reshard_after_forward),
                   sharded_params),
      via(ints(any("forward_prefetch", 1, prefetch_accepts,
                   "units ahead whose all-gathers forward issues"),
               0, 1024),
          read_prefetch, S, &ShardingPolicy::forward_prefetch),
      via(ints(any("backward_prefetch", 1, prefetch_accepts,
                   "units behind whose all-gathers backward issues"),
               0, 1024),
          read_prefetch, S, &ShardingPolicy::backward_prefetch),
      to(boolean("release_grads", false,
                 "free each unit's gradients once its optimizer update has read them and "
                 "allocate them again at its next backward, so none are held between steps "
                 "(PyTorch's `zero_grad(set_to_none=True)`); a unit's own buffer on the "
                 "device only: not NO_SHARD's buckets, stage 1's full gradients, or with "
                 "offloaded parameters or optimizer state"),
         S, &ShardingPolicy::release_grads),
      to(integer("max_live_units", 0, 0, IMAX,
                 "cap on units gathered at once, prefetches included (0 = none)"),
         S, &ShardingPolicy::max_live_units),
      // "auto": TrainConfig::autoplan (config_reader.cpp read_auto_keys); else the integer.
      writes(to(ints(any("blocks_per_unit", 1, "an integer ≥ 1 or `\"auto\"`",
                         "consecutive transformer blocks per FSDP unit; `\"auto\"`: the "
                         "planner chooses within `memory_budget`"),
                     1, IMAX),
                &TrainConfig::blocks_per_unit),
             [](const TrainConfig& c) {
               return c.autoplan.blocks ? json("auto") : json(c.blocks_per_unit);
             }),
      named(derived(string("gradient_accumulation_mode", "",
                           {"reduce_each_micro_step", "reduce_once"},
                           "`reduce_each_micro_step` (low memory) or `reduce_once` (less "
                           "communication)"),
                    "`reduce_each_micro_step`; stages 0 and 1: `reduce_once`"),
            accum_mode_name, accum_mode_from_name, S, &ShardingPolicy::accum),
      activation_checkpointing_key(),
      via(any("memory_budget", 0, "bytes, or a size such as `\"12GiB\"`, `\"1.5GB\"`",
              "tracked memory per rank (0 = none); an allocation past it stops the run with "
              "one line naming the category, the bytes requested and the use by category"),
          read_budget, &TrainConfig::memory_budget),
      to(number("comm_timeout_s", 0, kNonNegative,
                "the watchdog's limit per collective, seconds (0 = "
                "`SHARDWISE_COMM_TIMEOUT_S` or 300)"),
         &TrainConfig::comm_timeout_s),
      to(boolean("comm_debug", false, "check that all ranks issue the same collectives"),
         &TrainConfig::comm_debug)};
}

// The device mesh (config.h ParallelismConfig); config_validate.cpp check_mesh checks the
// degrees against the model, train() against the world size.
Node parallelism_block() {
  constexpr auto P = &TrainConfig::parallelism;
  return obj(
      "parallelism",
      // "auto": TrainConfig::autoplan (config_reader.cpp read_run_rules); else the integer.
      {writes(to(ints(any("tensor_parallel_degree", 1, "an integer ≥ 1 or `\"auto\"`",
                          "ranks of one tensor group (Megatron's tensor + sequence parallelism; "
                          "consecutive ranks, so a group stays on one host): must divide the "
                          "world size, `model.n_head`, `model.d_ff`, `model.vocab_size` and "
                          "`model.seq_len`; the sharding strategy applies across the world "
                          "size / this many data-parallel ranks; `\"auto\"`: the planner "
                          "chooses within `memory_budget`, the global batch kept"),
                      1, IMAX),
                 P, &ParallelismConfig::tensor),
              [](const TrainConfig& c) {
                return c.autoplan.tensor ? json("auto") : json(c.parallelism.tensor);
              }),
       writes(to(ints(any("pipeline_parallel_degree", 1, "an integer ≥ 1 or `\"auto\"`",
                          "pipeline ranks (outermost: ranks [s W/p, (s+1) W/p) run stage s; "
                          "tensor and data-parallel groups inside each); the model's schedule is "
                          "cut into consecutive stages, sends and receives between them; "
                          "`\"auto\"`: the planner chooses the degree, schedule and micro-batch "
                          "size and count within `memory_budget`, the global batch kept"),
                      1, IMAX),
                 P, &ParallelismConfig::pipeline),
              [](const TrainConfig& c) {
                return c.autoplan.pipeline ? json("auto") : json(c.parallelism.pipeline);
              }),
       to(string("pipeline_parallel_schedule", "1F1B",
                 {"GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble"},
                 "the order of micro-batches' forwards and backwards on each pipeline rank "
                 "(torchtitan's names; interleaved: several stages per rank; zero bubble: "
                 "weight gradients deferred into the bubble); the micro-batches are "
                 "`gradient_accumulation_steps`"),
          P, &ParallelismConfig::schedule),
       to(derived(integer("pipeline_parallel_virtual_stages", 0, 0, 64,
                          "stages per pipeline rank (interleaved schedules; 0 = default)"),
                  "2 with an interleaved schedule, else 1"),
          P, &ParallelismConfig::virtual_stages),
       via(any("pipeline_parallel_split_points", json::array(), "an array of integers",
               "the schedule position each stage after the first starts at (position 0 is the "
               "embedding, then each unit's calls in order, the loss last); empty: stages "
               "balanced by the time model's flops per position"),
           read_split_points, P, &ParallelismConfig::split_points)});
}

// dir: "" = <run_dir>/checkpoints; resume: "auto" is one of its values (read_run_rules).
// local_sgd (config.h LocalSgdConfig); torchft's names. config_validate.cpp checks the mesh.
Node local_sgd_block() {
  constexpr auto L = &TrainConfig::local_sgd;
  return obj(
      "local_sgd",
      {to(integer("sync_every", 0, 0, IMAX,
                  "inner steps per round: replica groups (HYBRID_SHARD's, or NO_SHARD's ranks) "
                  "train apart, then average their pseudo-gradients (DiLoCo's H; 0 = off, "
                  "gradients reduced every step)"),
          L, &LocalSgdConfig::sync_every),
       to(integer("fragments", 1, 1, 4096,
                  "streaming DiLoCo: the units in this many fragments of consecutive units, one "
                  "synced every sync_every / fragments steps in turn (1 = all at once)"),
          L, &LocalSgdConfig::fragments),
       obj("outer_optimizer",
           {to(string("type", "SGD", {"SGD"},
                      "the outer optimizer (SGD with momentum; FedAvg: lr 1, momentum 0)"),
               L, &LocalSgdConfig::outer_type),
            obj("params",
                {to(number("lr", 0.7, kPositive, "outer learning rate (DiLoCo: 0.7)"), L,
                    &LocalSgdConfig::outer_lr),
                 to(number("momentum", 0.9, Range{0, 1, false, true}, "outer momentum (DiLoCo: 0.9)"),
                    L, &LocalSgdConfig::outer_momentum),
                 to(boolean("nesterov", true, "Nesterov momentum (DiLoCo: true)"), L,
                    &LocalSgdConfig::outer_nesterov)})}),
       to(integer("fragment_sync_delay", 0, 0, IMAX,
                  "streaming: inner steps between a fragment's reduce and its update (the "
                  "reduction crosses the link meanwhile; < sync_every / fragments; 0 = at once)"),
          L, &LocalSgdConfig::sync_delay),
       to(number("fragment_update_alpha", 0, Range{0, 1, false, true},
                 "streaming: a synced fragment becomes alpha x its local parameters + (1 - alpha) "
                 "x the outer result (0 = the outer result)"),
          L, &LocalSgdConfig::update_alpha),
       to(string("outer_dtype", "fp32", {"fp32", "bf16", "int8", "int4"},
                 "the pseudo-gradient's type across the replica groups (int8 / int4: "
                 "block-quantised, 256 values per scale, with error feedback)"),
          L, &LocalSgdConfig::outer_dtype)});
}

Node checkpoint_block() {
  constexpr auto C = &TrainConfig::checkpoint;
  return obj(
      "checkpoint",
      {writes(to(derived(string("dir", "", {}, "where sharded checkpoints go (`step_N`, `latest`)"),
                         "`<run_dir>/checkpoints`"),
                 C, &CheckpointConfig::dir),
              [](const TrainConfig& c) {
                return json(c.checkpoint.dir.empty() ? default_checkpoint_dir(c.run_dir)
                                                     : c.checkpoint.dir);
              }),
       to(integer("every_steps", 0, 0, IMAX, "save a checkpoint every N optimizer steps (0 = off)"),
          C, &CheckpointConfig::every_steps),
       to(integer("keep_last", 3, 0, IMAX, "complete checkpoints kept (0 = all)"), C,
          &CheckpointConfig::keep_last),
       to(boolean("async", false, "write in a background thread while training goes on"), C,
          &CheckpointConfig::async),
       to(boolean("save_final", true, "also save after the last step when `every_steps` > 0"), C,
          &CheckpointConfig::save_final),
       read_elsewhere(to(string("resume", "", {},
                                "`\"\"`: start fresh; `auto`: resume from `<dir>/latest` when it "
                                "exists; else a step directory or a checkpoint directory holding "
                                "`latest` (what `--resume` sets)"),
                         C, &CheckpointConfig::resume)),
       to(string("init_from", "", {},
                 "a safetensors file of weights to start from, or a Hugging Face model "
                 "directory (its `config.json` is then the model block, keys given here "
                 "override it), optimizer state fresh (what `--init-from` sets; not with "
                 "`resume`)"),
          C, &CheckpointConfig::init_from),
       to(integer("export_shard_bytes", 5'000'000'000LL, 1, 1LL << 50,
                  "the largest weights file of the end-of-run Hugging Face export "
                  "(`<run_dir>/hf/`), as transformers' `max_shard_size` (5 GB)"),
          C, &CheckpointConfig::export_shard_bytes)});
}

Node profile_block() {
  constexpr auto P = &TrainConfig::profile;
  return obj(
      "profile",
      {to(boolean("enabled", false,
                  "record steps with the profiler and write the profile after the last"),
          P, &ProfileConfig::enabled),
       to(integer("start_step", 1, 1, IMAX,
                  "the first recorded optimizer step (1-based, within `train_steps`)"),
          P, &ProfileConfig::start_step),
       to(integer("num_steps", 1, 1, IMAX, "steps recorded (within `train_steps`)"), P,
          &ProfileConfig::num_steps),
       writes(to(derived(string("out", "", {},
                                "where each rank writes its profile files (checked writable on "
                                "every rank before the first step)"),
                         "`<run_dir>/profile`"),
                 P, &ProfileConfig::out),
              [](const TrainConfig& c) {
                return json(c.profile.out.empty() ? default_profile_dir(c.run_dir)
                                                  : c.profile.out);
              })});
}

// DeepSpeed's aio block plus backend and o_direct, for the io queue NVMe offload runs on.
// AioConfig::from_json (offload/aio.cpp) reads and checks it (config_reader.cpp read_aio); the
// ranges declared here are what it enforces (tests/engine/test_config_schema.cpp), and what
// validate_config checks a config built in code against.
Node aio_block() {
  constexpr auto A = &ShardingPolicy::aio;
  return obj(
      "aio",
      {read_elsewhere(to(ints(any("block_size", 1 << 20,
                                  "bytes (a multiple of 4096 up to 1GiB) or a size such as "
                                  "`\"1MiB\"`",
                                  "DeepSpeed's `aio` block, for the io queue NVMe offload runs "
                                  "on: bytes per request piece"),
                              4096, 1 << 30),
                         S, A, &AioConfig::block_size)),
       read_elsewhere(to(integer("queue_depth", 8, 1, 4096, "pieces in flight (io_uring)"), S, A,
                         &AioConfig::queue_depth)),
       read_elsewhere(to(integer("intra_op_parallelism", 1, 1, 256,
                                 "pread/pwrite threads (threads backend)"),
                         S, A, &AioConfig::intra_op_parallelism)),
       alias(derived(integer("thread_count", 1, 1, 256, "another name of `intra_op_parallelism`"),
                     "unset")),
       read_elsewhere(to(boolean("single_submit", false, "io_uring: one submit per piece"), S, A,
                         &AioConfig::single_submit)),
       read_elsewhere(to(boolean("overlap_events", true,
                                 "io_uring: refill the ring on each completion"),
                         S, A, &AioConfig::overlap_events)),
       read_elsewhere(named(string("backend", "auto", {"auto", "io_uring", "threads"},
                                   "`auto`: io_uring, or pread/pwrite threads where the kernel "
                                   "refuses io_uring; `io_uring`: an error if refused"),
                            aio_backend_name, aio_backend_from_name, S, A, &AioConfig::backend)),
       read_elsewhere(to(boolean("o_direct", true,
                                 "aligned pieces bypass the page cache where the filesystem "
                                 "allows it"),
                         S, A, &AioConfig::o_direct))});
}

// DeepSpeed's top-level keys with no effect here.
std::vector<Node> compat_keys() {
  return {compat(obj("amp", {cbool("enabled"), cstr("opt_level")})),
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
          cany("flops_profiler")};
}

}  // namespace

const Node& schema() {
  static const Node root = [] {
    Node r = obj("", {model_block(), data_block()});
    auto add = [&r](std::vector<Node> keys) {
      for (Node& k : keys) r.kids.push_back(std::move(k));
    };
    add(batch_keys());
    add(run_keys());
    add({optimizer_block(), scheduler_block(),
         to(number("gradient_clipping", 1.0, kNonNegative, "global-norm clipping (0 = off)"),
            &TrainConfig::grad_clip),
         bf16_block(), fp16_block(), mixed_precision_block(), fp8_block(), zero_block()});
    add(sharding_keys());
    add({parallelism_block(), local_sgd_block(), checkpoint_block(), profile_block(), aio_block()});
    add(compat_keys());
    return r;
  }();
  return root;
}

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

void for_each_key(const Node& n, const std::string& path,
                  const std::function<void(const Node&, const std::string&)>& fn) {
  for (const Node& k : n.kids) {
    const std::string p = join_path(path, k.name);
    fn(k, p);
    for_each_key(k, p, fn);
  }
}

}  // namespace sw::config
