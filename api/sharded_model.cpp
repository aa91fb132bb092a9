// The public facade shardwise/sharded_model.h over the engine's ShardedModel
// (sharding/sharded_model.h) and its checkpoints (checkpoint/sharded_checkpoint.h).
#include "shardwise/sharded_model.h"

#include <cmath>

#include "checkpoint/sharded_checkpoint.h"
#include "kernels/threads.h"
#include "shardwise/error.h"
#include "sharding/comm/group.h"
#include "sharding/policy.h"
#include "sharding/sharded_model.h"

namespace sw::api {

namespace {

OptimizerParams optimizer_of(const ShardedOptions& o) {
  // (optimizer_type_from_name takes only the names the config reader has checked)
  const std::string& n = o.optimizer;
  if (n != "AdamW" && n != "Adam" && n != "SGD" && n != "LARS" && n != "Lamb")
    fail("sharded_model", "ShardedOptions: optimizer: unknown '" + n +
                              "' (AdamW, SGD, LARS or Lamb)");
  OptimizerParams p;
  p.type = optimizer_type_from_name(n);
  p.lr = o.lr;
  p.weight_decay = o.weight_decay;
  p.beta1 = o.beta1;
  p.beta2 = o.beta2;
  p.eps = o.eps;
  p.momentum = o.momentum;
  return p;
}

ShardingPolicy policy_of(const ShardedOptions& o, int world) {
  ShardingPolicy p = ShardingPolicy::for_strategy(strategy_from_name(o.strategy));
  if (p.strategy == ShardingStrategy::HybridShard)
    fail("sharded_model", "ShardedOptions: strategy: HYBRID_SHARD is not offered here (it needs "
                          "shard groups); use FULL_SHARD, SHARD_GRAD_OP, SHARD_OPTIMIZER or "
                          "NO_SHARD, or the Trainer (shardwise/trainer.h)");
  p.release_grads = o.release_grads;
  validate(p, world);
  return p;
}

}  // namespace

struct ShardedModel::Impl {
  Model* model = nullptr;
  ShardedOptions opt;
  OptimizerParams optimizer;
  ShardingPolicy policy;
  const Ops* ops = nullptr;
  GroupPtr group;
  std::unique_ptr<sw::ShardedModel> sm;
  int step = 0;
  void build() {
    sm.reset();
    sm = std::make_unique<sw::ShardedModel>(*model, *ops, opt.seed, group, policy);
  }
};

ShardedModel::ShardedModel(Model& model, const ShardedOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.opt = options;
  m.optimizer = optimizer_of(options);
  if (!(options.lr > 0) || !std::isfinite(options.lr))
    fail("sharded_model", "ShardedOptions: lr: must be a positive number");
  if (!(options.clip_grad_norm >= 0))
    fail("sharded_model", "ShardedOptions: clip_grad_norm: must be >= 0 (0: no clipping)");
  m.group = options.use_mpi_world ? world_group() : make_local_group();
  if (options.threads >= 0) set_num_threads(options.threads);
  m.model = &model;
  m.policy = policy_of(options, m.group->size());
  m.ops = &ops_for(device_from_name(options.device));
  m.build();
}

ShardedModel::~ShardedModel() = default;

StepResult ShardedModel::train_step(const Batch& batch, float lr) {
  Impl& m = *impl_;
  m.sm->zero_grads();
  const double loss = m.sm->forward_backward(batch, 1.f);
  const double norm = m.sm->grad_norm();
  const float clip = m.opt.clip_grad_norm;
  const float mult = clip > 0 && norm > clip ? static_cast<float>(clip / norm) : 1.f;
  ++m.step;
  m.sm->optimizer_step(m.optimizer, lr < 0 ? m.opt.lr : lr, mult, m.step);
  StepResult r;
  r.step = m.step;
  r.loss = sum_over_ranks(*m.group, loss) / m.group->size();
  r.grad_norm = norm;
  return r;
}

double ShardedModel::eval_loss(const Batch& batch) {
  return sum_over_ranks(*impl_->group, impl_->sm->eval_loss(batch)) / impl_->group->size();
}

void ShardedModel::save(const std::string& dir) {
  TrainState st;
  st.step = impl_->step;
  st.optimizer_steps = impl_->step;
  st.seed = impl_->opt.seed;
  save_checkpoint(*impl_->sm, st, dir);
}

void ShardedModel::load(const std::string& dir) {
  // Into a model built afresh, as a resumed run loads: state the steps so far left behind
  // (gathered parameters, offload staging) is not carried into the loaded one.
  const std::string step_dir = resolve_checkpoint_dir(dir);
  impl_->build();
  const TrainState st = load_checkpoint(*impl_->sm, step_dir);
  impl_->step = static_cast<int>(st.optimizer_steps);
}

void ShardedModel::for_each_param(
    const std::function<void(const std::string&, const float*, int64_t)>& fn) const {
  impl_->sm->for_each_param(
      [&](const ParamSpec& s, const float* p) { fn(s.name, p, numel(s.shape)); });
}

int64_t ShardedModel::num_params() const { return impl_->sm->num_params(); }
int ShardedModel::step() const { return impl_->step; }
int ShardedModel::rank() const { return impl_->group->rank(); }
int ShardedModel::world() const { return impl_->group->size(); }

}  // namespace sw::api
