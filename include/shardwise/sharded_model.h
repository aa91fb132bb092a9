/// @file
/// @brief A Model of your own, sharded over the ranks of `mpirun` and trained step by step.
///
/// The engine's sharded model holds the parameters, gradients and optimizer state of a
/// Model (shardwise/model.h) and shards them over the job's ranks with one of the FSDP /
/// ZeRO strategies. This facade exposes the part a training loop of your own needs:
///
/// @code
///   sw::Model model = make_my_model();            // Units of your own, or sw::build_model
///   sw::api::ShardedOptions opt;                  // FULL_SHARD over every rank of mpirun
///   opt.lr = 3e-3f;
///   sw::api::ShardedModel sm(model, opt);
///   for (int s = 1; s <= 100; ++s) {
///     sw::Batch b = next_batch(sm.rank(), sm.world());   // this rank's share of the batch
///     sw::api::StepResult r = sm.train_step(b);
///   }
///   sm.save("ckpt/step_100");                     // a sharded checkpoint directory
/// @endcode
///
/// Collective: with several ranks, every rank constructs the object and makes the same calls
/// in the same order with batches of the same shape. Errors in what you pass (an unknown
/// strategy, a unit that declares a parameter name twice, a checkpoint of another model)
/// throw sw::Error (shardwise/error.h) with one line naming the key, unit or parameter.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "shardwise/model.h"

namespace sw::api {

/// How a ShardedModel shards and updates the model.
struct ShardedOptions {
  /// Sharding strategy: FULL_SHARD (ZeRO-3), SHARD_GRAD_OP (ZeRO-2), SHARD_OPTIMIZER (ZeRO-1),
  /// NO_SHARD (DDP) or HYBRID_SHARD, as the config key parallelism.strategy spells them.
  std::string strategy = "FULL_SHARD";
  /// Device the model runs on: "cpu", or "cuda" / "cuda:N" in a build with the CUDA backend
  /// (link Shardwise::cuda too).
  std::string device = "cpu";
  /// Seed of the parameters' initialisation (identical on every rank).
  uint64_t seed = 42;
  /// Use the ranks of `mpirun` (MPI_COMM_WORLD) when launched under it; false: this process
  /// alone, even under mpirun.
  bool use_mpi_world = true;
  /// CPU threads per rank for the kernels and BLAS (one OpenMP pool): -1 leaves OpenMP's
  /// setting (OMP_NUM_THREADS) as it is, 0 divides this node's cores among its ranks, n > 0
  /// asks for n.
  int threads = -1;
  /// Optimizer: "AdamW", "SGD", "LARS" or "Lamb", with its hyper-parameters.
  std::string optimizer = "AdamW";
  float lr = 3e-4f;            ///< learning rate of every step (train_step's lr overrides it)
  float weight_decay = 0.0f;   ///< decoupled weight decay (parameters with weight_decay = true)
  float beta1 = 0.9f;          ///< AdamW, Lamb: first moment's decay
  float beta2 = 0.95f;         ///< AdamW, Lamb: second moment's decay
  float eps = 1e-8f;           ///< AdamW, Lamb, LARS: denominator term
  float momentum = 0.0f;       ///< SGD, LARS
  /// Gradients are scaled down to this global L2 norm when above it (0: no clipping).
  float clip_grad_norm = 1.0f;
  /// Free each unit's gradients once its update has read them, so none are held between
  /// steps (PyTorch's zero_grad(set_to_none=True)); the config key release_grads.
  bool release_grads = false;
};

/// What one training step did (identical on every rank).
struct StepResult {
  int step = 0;           ///< optimizer steps done, this one included
  double loss = 0;        ///< mean loss over the ranks' batches
  double grad_norm = 0;   ///< global L2 norm of the gradients, before clipping
};

/// Your Model, sharded and trained. Holds a reference to the Model: keep it alive and do not
/// change its units while this object lives.
class ShardedModel {
 public:
  /// Shards `model` over the ranks (see ShardedOptions::use_mpi_world) and initialises its
  /// parameters from each ParamSpec's Init. Throws sw::Error naming the option, unit or
  /// parameter that is wrong.
  explicit ShardedModel(Model& model, const ShardedOptions& options = {});
  ~ShardedModel();
  ShardedModel(const ShardedModel&) = delete;
  ShardedModel& operator=(const ShardedModel&) = delete;

  /// Collective. One optimizer step on this rank's batch (each rank passes its own share):
  /// forward, backward, gradient reduction, clipping and the optimizer's update. `lr` < 0:
  /// ShardedOptions::lr. The batch's memory is read during the call only.
  StepResult train_step(const Batch& batch, float lr = -1.0f);
  /// Collective. The mean loss of `batch` over every rank's, forward only.
  double eval_loss(const Batch& batch);

  /// Collective. Writes a sharded checkpoint (parameters, optimizer state, step) into the
  /// directory `dir` (created; replaced only once the new one is complete).
  void save(const std::string& dir);
  /// Collective. Loads a checkpoint written by save() (at any number of ranks or strategy)
  /// and continues from its step. Throws sw::Error naming the file and tensor that is missing,
  /// corrupt, or of another shape.
  void load(const std::string& dir);

  /// Collective. Each parameter in full, by name, in unit order (gathered one unit at a time).
  void for_each_param(const std::function<void(const std::string& name, const float* data,
                                               int64_t numel)>& fn) const;

  int64_t num_params() const;  ///< parameters of the model (tied ones counted once)
  int step() const;            ///< optimizer steps done (loaded ones included)
  int rank() const;            ///< this process's rank among the model's ranks
  int world() const;           ///< how many ranks share the model

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sw::api
