// Runs a Model over flat, sharded parameters. Owns, per unit: the fp32 master shard, the
// gathered parameter buffer, gradient buffers and AdamW moments (all tracked by category).
// With world size 1 (this file's first form) the shard is the whole flat buffer and the
// gather/reduce steps are no-ops; the sharding issue adds the communication group, strategies
// and prefetch behind the same interface.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/model.h"
#include "sharding/flat_param.h"

namespace sw {

struct AdamWParams {
  float lr = 3e-4f;
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.1f;
};

class ShardedModel {
 public:
  // Initialises every parameter from (seed, its global name, element index) only.
  ShardedModel(Model& model, const Ops& ops, uint64_t seed);
  ~ShardedModel();

  Model& model() { return model_; }

  // One micro-batch forward and backward; gradients ACCUMULATE across calls until
  // zero_grads(). d(loss) is scaled by grad_scale / (tokens counted). Returns the mean loss.
  double forward_backward(const Batch& batch, float grad_scale = 1.f);
  // Forward only; returns the mean loss.
  double eval_loss(const Batch& batch);
  // Forward only; writes (B, V) logits of each sequence's last position.
  void logits_last(const Batch& batch, float* logits);

  double grad_norm() const;  // global L2 norm of the accumulated gradients
  void zero_grads();
  // AdamW on every parameter; grads multiplied by grad_mult first (clipping). step from 1.
  void optimizer_step(const AdamWParams& p, float lr, float grad_mult, int step);

  // Full (gathered) parameters, one call per ParamSpec in unit order.
  void for_each_param(const std::function<void(const ParamSpec&, const float* data)>& fn) const;
  // Accumulated gradients, same order and shapes as for_each_param.
  void for_each_grad(const std::function<void(const ParamSpec&, const float* grad)>& fn) const;
  // Overwrites a parameter by global name (throws sw::Error if unknown or size differs).
  void set_param(const std::string& name, const float* data, int64_t n);

  int64_t num_params() const;

 private:
  struct Impl;
  Model& model_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sw
