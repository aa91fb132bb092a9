// ShardedModel: construction (groups, flat units, components, initialisation) and the public
// calls that run the step plan's segments through the executor. The other concepts live in
// their own files (sharding/sharded_model_impl.h lists them).
#include "sharding/sharded_model.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/launch.h"
#include "core/rng.h"
#include "kernels/fp8_ops.h"
#include "sharding/sharded_model_impl.h"

namespace sw {

// ---- Construction ----------------------------------------------------------------------------

namespace {

// The plan's view of the model, the policy checked (sharding/policy.h validate), the groups.
ModelContext make_context(const Model& model, const Ops& ops, GroupPtr group,
                          const ShardingPolicy& policy, GroupPtr tensor, const PipeSetup& pipe,
                          GroupPtr replicas) {
  ModelContext c;
  c.ops = &ops;
  c.policy = policy;
  const MixedPrecisionPolicy& mp = policy.mixed_precision;
  if (!group) fail("sharding", "no communication group given");
  if (model.units.empty()) fail("sharded_model", "the model has no units");
  if (model.schedule.empty()) fail("sharded_model", "the model's schedule is empty");

  // Groups, flat sizes, buckets: the plan's view of the model is the one construction uses.
  // The host group: the device groups of the unit buffers are made from it below.
  const std::string gb = group->backend();
  if (gb != "local" && gb != "mpi")
    fail("sharding", "ShardedModel needs the host group (local or mpi), got a '" + gb +
                         "' group: it makes the device groups for " + ops.device().str() + " itself");
  c.world = group;
  // Tensor parallelism: the model is built for one rank of the tensor group.
  if (model.tensor.size > 1) {
    if (!tensor || tensor->size() != model.tensor.size || tensor->rank() != model.tensor.rank)
      fail("sharding", "the model is built for tensor rank " + std::to_string(model.tensor.rank) +
                           " of " + std::to_string(model.tensor.size) +
                           "; the tensor group given is " +
                           (tensor ? "rank " + std::to_string(tensor->rank()) + " of " +
                                         std::to_string(tensor->size())
                                   : std::string("none")));
    if (policy.offload_param.device == OffloadDevice::Nvme)
      fail("offload", "zero_optimization.offload_param 'nvme' with tensor parallelism is not "
                      "implemented yet (the gradient norm reads NVMe gradients whole; use 'cpu')");
    c.tensor = c.tensor_host = std::move(tensor);
  }
  c.W = group->size();
  c.rank = group->rank();
  c.file_rank = c.tensor ? c.rank * c.tensor->size() + c.tensor->rank() : c.rank;
  // Pipeline parallelism: the model is one pipeline rank's stage.
  if (model.stage.split()) {
    const StageView& st = model.stage;
    if (!pipe.group || pipe.group->size() != st.size || pipe.group->rank() != st.rank)
      fail("sharding", "the model is pipeline rank " + std::to_string(st.rank) + "'s stage of " +
                           std::to_string(st.size) + "; the pipe group given is " +
                           (pipe.group ? "rank " + std::to_string(pipe.group->rank()) + " of " +
                                             std::to_string(pipe.group->size())
                                       : std::string("none")));
    // Each gap in one line naming its key (lift a line once it is done).
    const std::string pp = "with parallelism.pipeline_parallel_degree " + std::to_string(st.size);
    if (!ops.device().is_cpu())
      fail("pipeline", "device " + ops.device().str() + " " + pp +
                           " is not implemented yet (the stages' sends go through host memory "
                           "only; use device cpu)");
    if (policy.activation_checkpointing.offloads())
      fail("offload", "activation_checkpointing.offload " + pp + " is not implemented yet");
    if (policy.offload_param.device == OffloadDevice::Nvme ||
        policy.offload_optimizer.device == OffloadDevice::Nvme)
      fail("offload", "zero_optimization offload to nvme " + pp + " is not implemented yet "
                      "(use 'cpu')");
    c.pipe = pipe.group;
    c.p2p = make_peer_comm(*pipe.group, "pipe");
    c.shared = pipe.group->split(st.shared.empty() ? -1 : 0, st.rank);
    const int per_stage = c.W * (c.tensor ? c.tensor->size() : 1);
    c.file_rank += st.rank * per_stage;
  }
  // Local SGD / DiLoCo: this replica's ranks are the world above; files are numbered past the
  // other replicas'.
  if (replicas) {
    if (!ops.device().is_cpu())
      fail("local_sgd", "local_sgd on device " + ops.device().str() + " is not implemented yet "
                        "(the outer step runs on the host; use device cpu)");
    if (policy.offload_param.device == OffloadDevice::Nvme)
      fail("offload", "zero_optimization.offload_param 'nvme' with local_sgd is not implemented "
                      "yet (use 'cpu')");
    const int per_replica = c.W * (c.tensor ? c.tensor->size() : 1) *
                            (model.stage.split() ? model.stage.size : 1);
    c.file_rank += replicas->rank() * per_replica;
    c.cross = std::move(replicas);
  }
  c.plan_in = make_plan_input(model, policy, c.W);
  c.plan_in.pipe.schedule = pipe.schedule;
  // The time model's topology: the launcher's hosts (world / ranks per node), the replicas.
  if (const LaunchEnv env = launch_env(); env.local_size > 0 && env.world_size % env.local_size == 0)
    c.plan_in.hosts = env.world_size / env.local_size;
  if (c.cross) c.plan_in.replicas = c.cross->size();
  // The policy's own checks (sharding/policy.h), as the config reader runs them: a policy built
  // in code is checked the same way.
  validate(policy, c.W, static_cast<int>(model.units.size()));
  c.compute_ops = mp.param_dtype == DType::F32 ? &ops : &ops_for(ops.device(), mp.param_dtype);
  if (mp.fp8) {  // FP8 linears around the bf16 Ops (kernels/fp8_ops.h)
    c.fp8_ops = make_fp8_ops(*c.compute_ops, Fp8Recipe{mp.fp8_delayed, mp.fp8_amax_history,
                                                             mp.fp8_pow2_scales()});
    c.compute_ops = c.fp8_ops.get();
  }
  c.plan_in.on_device = !ops.device().is_cpu();
  c.plan_in.compute = c.compute_ops->compute();
  c.S = c.plan_in.S;
  c.R = c.plan_in.R;
  if (c.S == c.W) {
    c.shard = group;
  } else if (c.S == 1) {
    c.shard = make_local_group();
  } else {
    // Shard groups: consecutive ranks (within a node under the usual rank placement);
    // replicate groups: the ranks with the same position in each shard group.
    c.shard = group->split(c.rank / c.S, c.rank);
  }
  if (c.R > 1) c.rep = c.S == 1 ? group : group->split(c.rank % c.S, c.rank);
  setup_quantized(c);  // compressed collectives per mesh dimension (reductions.h)
  c.shard_host = c.shard;
  const Device dev = ops.device();
  if (!dev.is_cpu()) {
    // Offload with a device: moments on the host or in an NVMe file (staged on the host) are
    // updated on the CPU; so are master and gradient shards on the host or in a file, which
    // therefore need every unit's moments there too.
    if (policy.offload_param.device != OffloadDevice::None &&
        (policy.offload_optimizer.device == OffloadDevice::None || policy.offload_optimizer.ratio < 1))
      fail("offload", std::string("zero_optimization.offload_param '") +
                          offload_device_name(policy.offload_param.device) + "' with device " +
                          dev.str() + " needs offload_optimizer 'cpu' or 'nvme' with ratio 1 (the "
                          "update of a shard on the host runs on the CPU)");
    // Unit buffers' collectives go to device groups (NCCL, or the host group through staging
    // buffers); host scalars keep the host groups.
    c.shard = device_group(c.shard, dev, policy.device_comm);
    if (c.rep) c.rep = device_group(c.rep, dev, policy.device_comm);
    if (c.tensor) c.tensor = device_group(c.tensor_host, dev, policy.device_comm);
  }
  return c;
}

// The gradient norm's per-unit sums: one per unit, or with tensor parallelism one per piece of a
// unit's shard outside its replicated runs (optimizer_step.cpp).
size_t norm_slots(const Model& model) {
  size_t n = 0;
  for (const auto& u : model.units)
    n += 1 + FlatLayout::build(u->params(), 1).replicated_runs().size();
  return n;
}

}  // namespace

ShardedModel::Impl::Impl(Model& model, const Ops& ops, GroupPtr group, const ShardingPolicy& policy,
                         GroupPtr tensor, PipeSetup pipe_setup, GroupPtr replicas)
    : ctx(make_context(model, ops, std::move(group), policy, std::move(tensor), pipe_setup,
                       std::move(replicas))),
      records(ops.stream()),
      losses(ops, model.tensor.size > 1 ? norm_slots(model) : model.units.size()),
      batches(ops),
      plans(ctx),
      state(ctx, units, records),
      reductions(ctx, units, records, state),  // (the bucket buffer, before the units)
      params(units, records, state),
      acts(ctx, units, model.schedule.size()),
      updates(ctx, units, state),
      act_io(ctx, acts, records),
      tp(ctx, units, records),
      pipe(ctx, units, acts, records),
      cross(ctx, units),
      exec(records, ctx.rank) {
  acts.set_tensor(tp.comm());
  exec.own(params, {ActionKind::Gather, ActionKind::WaitGather, ActionKind::Free,
                    ActionKind::Regather});
  exec.own(acts, {ActionKind::Forward, ActionKind::DropSaved, ActionKind::Recompute,
                  ActionKind::Backward, ActionKind::BackwardWeight});
  exec.own(pipe, {ActionKind::RecvActs, ActionKind::SendActs, ActionKind::RecvGrads,
                  ActionKind::SendGrads, ActionKind::WaitP2P, ActionKind::SyncShared});
  exec.own(cross, {ActionKind::OuterReduce, ActionKind::OuterUpdate});
  exec.own(reductions, {ActionKind::ReduceScatter, ActionKind::AllReduce, ActionKind::RoundGrads,
                        ActionKind::WaitReduce});
  exec.own(updates, {ActionKind::OptimizerUpdate});
  exec.own(act_io, {ActionKind::FetchActs, ActionKind::EvictActs, ActionKind::WaitActs});
  exec.own(state, {ActionKind::FetchState, ActionKind::EvictState, ActionKind::WaitState});
  exec.own(tp, {ActionKind::TpGatherRows, ActionKind::TpScatterRows, ActionKind::TpAllGather,
                ActionKind::TpReduceGrads});
  exec.check_owned();
  this->model = &model;

  const size_t U = model.units.size();
  const PlanInput& in = ctx.plan_in;
  const FlatUnit::Kind kind = in.kind == UnitKind::Whole            ? FlatUnit::Kind::Whole
                              : in.kind == UnitKind::FullReplicated ? FlatUnit::Kind::FullReplicated
                                                                    : FlatUnit::Kind::Sharded;
  units.reserve(U);
  for (size_t u = 0; u < U; ++u) {
    const Tier opt_tier = !policy.offload_optimizer.offloaded(static_cast<int>(u), static_cast<int>(U))
                              ? Tier::Device
                          : policy.offload_optimizer.device == OffloadDevice::Nvme ? Tier::Nvme
                                                                                   : Tier::Host;
    // (NVMe parameters: units kept out of the file by max_in_cpu are on the host tier.)
    const Tier param_tier = in.units[u].params_nvme       ? Tier::Nvme
                            : in.units[u].params_offloaded ? Tier::Host
                                                           : Tier::Device;
    units.push_back(std::make_unique<FlatUnit>(model.units[u].get(), static_cast<int>(u), kind,
                                               ctx.shard.get(), ops,
                                               reductions.bucket_region(static_cast<int>(u)),
                                               policy.mixed_precision, opt_tier, param_tier,
                                               releases_grads(in, static_cast<int>(u))));
    FlatUnit& fu = *units.back();
    fu.set_quantized(ctx.quant, ctx.quant_weights, ctx.qshard.get(), ctx.qworker.get());
    fu.first_pos = in.units[u].first_pos;
    fu.last_pos = in.units[u].last_pos;
    const FlatLayout& L = fu.layout();
    for (size_t s = 0; s < L.specs.size(); ++s)
      if (!by_name.emplace(L.specs[s].name, std::make_pair(static_cast<int>(u), static_cast<int>(s)))
               .second)
        fail("sharded_model", "parameter name '" + L.specs[s].name + "' is declared twice");
  }
  state.setup(plans.optimizer());  // its staging buffers are the optimizer plan's
}

ShardedModel::ShardedModel(Model& model, const Ops& ops, uint64_t seed)
    : ShardedModel(model, ops, seed, make_local_group(),
                   ShardingPolicy::for_strategy(ShardingStrategy::FullShard)) {}

ShardedModel::ShardedModel(Model& model, const Ops& ops, uint64_t seed, GroupPtr group,
                           const ShardingPolicy& policy, GroupPtr tensor, PipeSetup pipe,
                           GroupPtr replicas)
    : model_(model),
      impl_(std::make_unique<Impl>(model, ops, std::move(group), policy, std::move(tensor),
                                   std::move(pipe), std::move(replicas))) {
  Impl& I = *impl_;
  // Element i of parameter s: a pure function of (seed, s.name, i), so any rank can produce
  // exactly its slice. Sharded units write the intersection of each parameter with this rank's
  // shard into the master; persistent ones write the whole full buffer. Alignment gaps and
  // padding stay zero.
  for (auto& up : I.units) {
    FlatUnit& fu = *up;
    const bool whole = fu.persistent();
    if (fu.params_on_nvme()) I.state.stage_whole(fu, false);
    const Range dst_range = whole ? Range{0, fu.layout().padded} : fu.shard_range();
    float* dst = (whole ? fu.init_target() : fu.master()) - dst_range.lo;  // by flat offset
    // Where dst is: the device, or the host for offloaded shards (and the CPU's Ops there).
    const Device dst_dev = whole ? ops.device() : fu.master_device();
    const Ops& dops = fu.ops_on(dst_dev);
    for (size_t s = 0; s < fu.layout().specs.size(); ++s) {
      const ParamSpec& spec = fu.layout().specs[s];
      const FlatEntry& e = fu.layout().entries[s];
      const Range r = intersect(dst_range, {e.offset, e.offset + e.numel});
      if (r.empty()) continue;
      switch (spec.init) {
        case Init::Zeros:
          dops.fill(dst + r.lo, 0.f, static_cast<size_t>(r.hi - r.lo));
          break;
        case Init::Ones:
          dops.fill(dst + r.lo, 1.f, static_cast<size_t>(r.hi - r.lo));
          break;
        case Init::Normal: {
          // Drawn on the host and copied where the buffer is (the device's Tier::Device
          // buffers; a CPU run writes in place).
          const uint64_t stream = rng_stream(spec.name.c_str());
          float* out = dst + r.lo;
          std::vector<float> host;
          if (!dst_dev.is_cpu()) {
            host.resize(static_cast<size_t>(r.hi - r.lo));
            out = host.data();
          }
          // Each value a pure function of its index (core/rng.h), so the threads' split does
          // not change them; ~28 ns a value on one core (Box-Muller in double): ~40 s for 1.3B.
          const int64_t lo = r.lo, off = e.offset;
          const float sd = spec.std;
          // (tensor parallelism: the index in the logical tensor this rank holds part of)
          const TensorSplit& sp = spec.split;
          const Shape& shape = spec.shape;
#pragma omp parallel for schedule(static) if (r.hi - r.lo >= (int64_t{1} << 16))
          for (int64_t j = lo; j < r.hi; ++j) {
            const int64_t k = sp.split() ? sp.logical_index(j - off, shape) : j - off;
            out[j - lo] = rng_normal(seed, stream, static_cast<uint64_t>(k)) * sd;
          }
          if (!dst_dev.is_cpu())
            copy_bytes(dst + r.lo, dst_dev, host.data(), Device::cpu(), host.size() * sizeof(float));
          break;
        }
      }
    }
    fu.finish_init();  // a split master takes its slice; the compute copy is rounded
    if (fu.params_on_nvme()) I.state.unstage_whole(fu, true);
  }
  // finish_init freed the padded fp32 buffers compact units are initialised through
  // (init_target: with 16-bit weights, the LM head's 83 MB at vocabulary 50304); the caching
  // allocator would keep them resident for the whole run, and no step asks for them again.
  release_cached();
}

ShardedModel::~ShardedModel() = default;

// ---- Segments --------------------------------------------------------------------------------

void ShardedModel::Impl::micro_step(Model& model, const Batch& batch, RunArgs& args, bool reduce,
                                    bool last) {
  // The last optimizer step's deferred updates run in this forward, each before its unit's
  // first use (OptimizerOffload::defer_update).
  const UpdateArgs* pending = updates.deferred();
  args.update = pending;
  try {
    reductions.complete(-1);  // nothing should be in flight; a no-op normally
    params.reset_peak();
    acts.ensure_pingpong(static_cast<size_t>(batch.B) * batch.T * model.residual_width());
    bool built = false;
    const StepPlan& plan = plans.get(model, units, batch.B, batch.T, SegmentKind::MicroStep,
                                     reduce, last, pending != nullptr, &built);
    // The step's temporaries come from memory reserved once, as large as the plan says.
    if (built && plan.activations_known) acts.reserve_scratch(static_cast<size_t>(plan.scratch));
    exec.run(model, plan, args);
    updates.clear_deferred();
  } catch (...) {
    // Some deferred updates may have run: applying them again later would be wrong, and the
    // step is lost anyway (the caller stops or restores a checkpoint).
    updates.clear_deferred();
    abandon_step();
    throw;
  }
  act_io.settle();
  acts.free_all();
  for (auto& u : units) u->to_idle();
}

void ShardedModel::Impl::pipeline_step(Model& model, RunArgs& args, int B, int T, int M) {
  try {
    reductions.complete(-1);
    params.reset_peak();
    acts.ensure_pingpong(static_cast<size_t>(B) * T * model.residual_width());
    bool built = false;
    const StepPlan& plan =
        plans.get(model, units, B, T, SegmentKind::Pipeline, true, true, false, &built, M);
    if (built && plan.activations_known) acts.reserve_scratch(static_cast<size_t>(plan.scratch));
    exec.run(model, plan, args);
  } catch (...) {
    abandon_step();
    throw;
  }
  acts.free_all();
  for (auto& u : units) u->to_idle();
}

// The loss stage is the whole schedule's last: chunk V - 1 of pipeline rank P - 1.
void ShardedModel::Impl::share_losses(std::vector<double>& sums, std::vector<int64_t>& counts) {
  const size_t n = sums.size();
  std::vector<double> buf(2 * n);
  for (size_t k = 0; k < n; ++k) buf[k] = sums[k], buf[n + k] = static_cast<double>(counts[k]);
  // (doubles moved as raw bytes: a broadcast of 2n doubles as 4n floats)
  ctx.pipe->broadcast(buf.data(), static_cast<int64_t>(4 * n), ctx.pipe->size() - 1);
  for (size_t k = 0; k < n; ++k) sums[k] = buf[k], counts[k] = static_cast<int64_t>(buf[n + k]);
}

RunArgs ShardedModel::Impl::forward_only(Model& model, const Batch& batch, float* logits,
                                         double* loss_slot) {
  flush_deferred(model);
  RunArgs args;
  args.batch = &batches.on_device(batch);
  args.training = false;
  args.logits = logits;
  const Ops& ops = *ctx.ops;
  if (!logits) {
    args.loss_total = loss_slot;
    ops.fill(reinterpret_cast<float*>(args.loss_total), 0.f, 2);
  }
  Buffer dev_logits;  // (B, V) on a non-CPU device, copied out at the end
  const size_t nlogits = static_cast<size_t>(batch.B) * static_cast<size_t>(model.config.vocab_size);
  if (logits && !ops.device().is_cpu()) {
    dev_logits = Buffer(nlogits * sizeof(float), Mem::Activations, ops.device());
    args.logits = dev_logits.f32();
  }
  try {
    acts.ensure_pingpong(static_cast<size_t>(batch.B) * batch.T * model.residual_width());
    bool built = false;
    const StepPlan& plan = plans.get(model, units, batch.B, batch.T, SegmentKind::Eval, false,
                                     false, false, &built);
    if (built && plan.activations_known) acts.reserve_scratch(static_cast<size_t>(plan.scratch));
    exec.run(model, plan, args);
  } catch (...) {
    abandon_step();
    throw;
  }
  if (!dev_logits.empty())
    copy_bytes(logits, Device::cpu(), dev_logits.data(), dev_logits.device(), dev_logits.bytes());
  if (ctx.pipe && logits)  // (the last stage's)
    ctx.pipe->broadcast(logits, static_cast<int64_t>(nlogits), ctx.pipe->size() - 1);
  return args;
}

void ShardedModel::Impl::flush_deferred(Model& model) {
  const UpdateArgs* pending = updates.deferred();
  if (!pending) return;
  RunArgs args;
  Batch none;
  args.batch = &none;
  args.update = pending;
  exec.run(model, plans.flush(), args);  // zeroes the gradients left for after each update
  updates.clear_deferred();
}

void ShardedModel::Impl::quiesce() noexcept {
  pipe.quiesce();
  cross.quiesce();
  reductions.quiesce();
  act_io.settle();
  batches.quiesce();
  for (auto& u : units) u->quiesce();
}

void ShardedModel::Impl::abandon_step() {
  quiesce();
  acts.free_all();
  for (auto& u : units) {
    u->reshard();
    u->to_idle();
  }
}

namespace {

void check_batch(const Batch& b, bool need_targets) {
  if (b.B <= 0 || b.T <= 0)
    fail("sharded_model",
         "batch shape (" + std::to_string(b.B) + ", " + std::to_string(b.T) + ") must be positive");
  if (!b.tokens) fail("sharded_model", "batch has no tokens");
  if (need_targets && !b.targets) fail("sharded_model", "batch has no targets");
}

}  // namespace

void ShardedModel::micro_step(const Batch& batch, float grad_scale, bool last_micro_step) {
  Impl& I = *impl_;
  check_batch(batch, true);
  // A full set of unread losses is read now (one synchronisation per LossSlots::kSlots).
  I.losses.make_room();
  RunArgs args;
  args.batch = &I.batches.on_device(batch);
  const int64_t counted = count_targets(*args.batch);  // counted once (a device batch keeps it)
  // d(mean loss) = d(sum of token losses) / counted.
  args.scale = counted > 0 ? grad_scale / static_cast<float>(counted) : 0.f;
  args.loss_total = I.losses.next_micro();
  I.ctx.ops->fill(reinterpret_cast<float*>(args.loss_total), 0.f, 2);  // a double's zero bits
  const bool reduce = last_micro_step || I.ctx.policy.accum == GradAccumMode::ReduceEachMicroStep;
  I.micro_step(model_, batch, args, reduce, last_micro_step);
  if (counted > 0 && args.loss_count == 0)
    fail("sharded_model", "no call of the model's schedule reported a loss");
  I.losses.add_micro(args.loss_sum, args.loss_count);
}

bool ShardedModel::pipelined() const { return impl_->ctx.pipe != nullptr; }

void ShardedModel::start_round() {
  Impl& I = *impl_;
  if (!I.cross.on()) fail("sharded_model", "start_round needs replica groups (local_sgd)");
  I.flush_deferred(model_);
  I.cross.start_round();
}

void ShardedModel::outer_step(const OuterArgs& outer, int fragment, int fragments,
                              OuterPhase phase) {
  Impl& I = *impl_;
  if (!I.cross.on()) fail("sharded_model", "outer_step needs replica groups (local_sgd)");
  SW_CHECK(fragments >= 1 && fragment >= 0 && fragment < fragments, "outer_step: bad fragment");
  I.flush_deferred(model_);
  const size_t U = I.units.size();
  std::vector<bool> mask(U, false);
  for (size_t u = U * size_t(fragment) / size_t(fragments);
       u < U * size_t(fragment + 1) / size_t(fragments); ++u)
    mask[u] = true;
  PlanInput in = I.ctx.plan_in;
  in.carried.assign(U, false);
  for (size_t u = 0; u < U; ++u)
    in.carried[u] = I.units[u]->gather_in_flight() || I.units[u]->holds_gathered();
  if (outer.bits != 0 && outer.bits != 8 && outer.bits != 4)
    fail("sharded_model", "outer_step: quantised pseudo-gradients of " + std::to_string(outer.bits) +
                              " bits (8 or 4)");
  const double wire = outer.bits != 0 ? outer.bits / 8.0 + 4.0 / 256 : dtype_size(outer.dtype);
  const StepPlan plan = plan_outer(in, mask, wire, phase);
  RunArgs args;
  Batch none;
  args.batch = &none;
  args.outer = &outer;
  try {
    I.exec.run(model_, plan, args);
  } catch (...) {
    I.abandon_step();
    throw;
  }
}

int ShardedModel::replicas() const { return impl_->ctx.cross ? impl_->ctx.cross->size() : 1; }
int ShardedModel::replica() const { return impl_->ctx.cross ? impl_->ctx.cross->rank() : 0; }
bool ShardedModel::round_restored() const { return impl_->cross.restored; }

std::vector<ShardedModel::NamedState> ShardedModel::extra_state() {
  Impl& I = *impl_;
  std::vector<NamedState> out;
  for (const CrossGroup::Named& n : I.cross.state(false))
    out.push_back({n.name, n.data, n.n});
  for (size_t u = 0; u < I.units.size(); ++u) {
    const std::string p = "qgz.u" + std::to_string(u) + ".";
    FlatUnit& fu = *I.units[u];
    if (float* e = fu.quant_residual(false)) out.push_back({p + "shard", e, fu.layout().padded});
    for (int k = 0; k < 2; ++k)
      if (float* e = I.reductions.quant_residual(int(u), k, false))
        out.push_back({p + (k == 0 ? "rep1" : "rep2"), e,
                       I.reductions.quant_residual_size(int(u), k)});
  }
  return out;
}

float* ShardedModel::restore_target(const std::string& name, int64_t n) {
  Impl& I = *impl_;
  // "<outer|qgz>.u<unit>.<what>"
  const size_t dot1 = name.find('.'), dot2 = name.find('.', dot1 + 1);
  if (dot1 == std::string::npos || dot2 == std::string::npos || name.compare(dot1, 2, ".u") != 0)
    return nullptr;
  const std::string kind = name.substr(0, dot1), what = name.substr(dot2 + 1);
  int u = -1;
  try {
    u = std::stoi(name.substr(dot1 + 2, dot2 - dot1 - 2));
  } catch (...) {
    return nullptr;
  }
  if (u < 0 || static_cast<size_t>(u) >= I.units.size()) return nullptr;
  float* dst = nullptr;
  int64_t want = -1;
  if (kind == "outer" && I.cross.on()) {
    if (what == "delta") {
      dst = I.cross.restore_delta(u), want = I.units[size_t(u)]->shard_size();
    } else {
      for (const CrossGroup::Named& c : I.cross.state(true, what.rfind("qerr", 0) == 0))
        if (c.name == name) dst = c.data, want = c.n;
      if (what == "anchor") I.cross.restored = true;
    }
  } else if (kind == "qgz") {
    FlatUnit& fu = *I.units[size_t(u)];
    if (what == "shard" && fu.quantized_grads()) dst = fu.quant_residual(true), want = fu.layout().padded;
    const int k = what == "rep1" ? 0 : what == "rep2" ? 1 : -1;
    if (k >= 0 && (dst = I.reductions.quant_residual(u, k, true)))
      want = I.reductions.quant_residual_size(u, k);
  }
  if (dst == nullptr) return nullptr;
  if (want != n)
    fail("checkpoint", name + ": " + std::to_string(n) + " floats saved, this model holds " +
                           std::to_string(want));
  return dst;
}

void ShardedModel::pipeline_step(const std::vector<Batch>& micro,
                                 const std::vector<float>& grad_scales) {
  Impl& I = *impl_;
  if (!I.ctx.pipe) fail("sharded_model", "pipeline_step needs a pipeline (PipeSetup)");
  const int M = static_cast<int>(micro.size());
  if (M < 1 || grad_scales.size() != micro.size())
    fail("sharded_model", "pipeline_step: " + std::to_string(micro.size()) + " micro-batches and " +
                              std::to_string(grad_scales.size()) + " scales");
  for (const Batch& b : micro) {
    check_batch(b, true);
    if (b.B != micro[0].B || b.T != micro[0].T)
      fail("sharded_model", "pipeline_step: micro-batches of different shapes");
  }
  RunArgs args;
  args.batch = &micro[0];
  args.batches = &micro;
  args.scales.resize(size_t(M));
  args.loss_sums.assign(size_t(M), 0.0);
  args.loss_counts.assign(size_t(M), 0);
  std::vector<Buffer> slots;  // the loss calls' doubles (device memory), read once at the end
  for (int k = 0; k < M; ++k) {
    const int64_t counted = count_targets(micro[size_t(k)]);
    args.scales[size_t(k)] = counted > 0 ? grad_scales[size_t(k)] / static_cast<float>(counted) : 0.f;
    slots.emplace_back(2 * sizeof(double), Mem::Activations, I.ctx.device());
    I.ctx.ops->fill(slots.back().f32(), 0.f, 4);
    args.loss_totals.push_back(reinterpret_cast<double*>(slots.back().data()));
  }
  I.pipeline_step(model_, args, micro[0].B, micro[0].T, M);
  std::vector<double> sums(static_cast<size_t>(M));
  std::vector<int64_t> counts(static_cast<size_t>(M));
  for (int k = 0; k < M; ++k) {
    double dev = 0;
    copy_bytes(&dev, Device::cpu(), slots[size_t(k)].data(), I.ctx.device(), sizeof(double));
    sums[size_t(k)] = args.loss_sums[size_t(k)] + dev;
    counts[size_t(k)] = args.loss_counts[size_t(k)];
  }
  I.share_losses(sums, counts);
  for (int k = 0; k < M; ++k) {
    if (count_targets(micro[size_t(k)]) > 0 && counts[size_t(k)] == 0)
      fail("sharded_model", "no call of the model's schedule reported a loss");
    I.losses.make_room();
    double* slot = I.losses.next_micro();
    I.ctx.ops->fill(reinterpret_cast<float*>(slot), 0.f, 2);
    I.losses.add_micro(sums[size_t(k)], counts[size_t(k)]);
  }
}

std::vector<double> ShardedModel::step_losses() { return impl_->losses.take_micro(); }

double ShardedModel::forward_backward(const Batch& batch, float grad_scale, bool last_micro_step) {
  micro_step(batch, grad_scale, last_micro_step);
  return step_losses().back();
}

void ShardedModel::eval_step(const Batch& batch) {
  check_batch(batch, true);
  Impl& I = *impl_;
  double* slot = I.losses.next_eval();  // (one synchronisation per kSlots batches)
  RunArgs args = I.forward_only(model_, batch, nullptr, slot);
  if (I.ctx.pipe) {  // the last stage's loss, to every rank
    double dev = 0;
    copy_bytes(&dev, Device::cpu(), slot, I.ctx.device(), sizeof(double));
    I.ctx.ops->fill(reinterpret_cast<float*>(slot), 0.f, 2);
    std::vector<double> sums{args.loss_sum + dev};
    std::vector<int64_t> counts{args.loss_count};
    I.share_losses(sums, counts);
    args.loss_sum = sums[0], args.loss_count = counts[0];
  }
  if (count_targets(batch) > 0 && args.loss_count == 0)
    fail("sharded_model", "no call of the model's schedule reported a loss");
  I.losses.add_eval(args.loss_sum, args.loss_count);
}

std::vector<double> ShardedModel::eval_losses() { return impl_->losses.take_eval(); }

double ShardedModel::eval_loss(const Batch& batch) {
  eval_step(batch);
  return eval_losses().back();
}

void ShardedModel::logits_last(const Batch& batch, float* logits) {
  check_batch(batch, false);
  SW_CHECK(logits != nullptr, "logits_last needs an output buffer");
  impl_->forward_only(model_, batch, logits, nullptr);
}

// ---- Plans, records, facts -------------------------------------------------------------------

StepPlan ShardedModel::step_plan(int B, int T, int accum,
                                 const std::vector<int64_t>& deferred) const {
  PlanInput in = impl_->ctx.plan_in;
  in.B = B, in.T = T, in.accum = accum;
  declare_calls(in, model_);
  for (size_t p = 0; p < deferred.size() && p < in.calls.size(); ++p)
    in.calls[p].deferred = deferred[p];
  return plan_step(in);
}

StepPlan ShardedModel::eval_plan(int B, int T) const {
  PlanInput in = impl_->ctx.plan_in;
  in.B = B, in.T = T;
  declare_calls(in, model_);
  return plan_eval(in);
}

void ShardedModel::prepare_offload(int B, int T) {
  Impl& I = *impl_;
  if (!I.ctx.policy.activation_checkpointing.offload_nvme) return;
  PlanInput in = I.ctx.plan_in;
  in.B = B, in.T = T;
  declare_calls(in, model_);
  int64_t end = 0;  // as the file is laid out: each position from a 4096-byte boundary
  for (const Action& a : plan_micro_step(in, 0, true, false).actions)
    if (a.kind == ActionKind::EvictActs) end = (end + a.bytes + 4095) / 4096 * 4096;
  I.act_io.reserve(end);
}

void ShardedModel::set_recorder(StepRecorder* recorder) { impl_->records.attach(recorder); }
void ShardedModel::settle_recorder() { impl_->records.settle_device_times(); }

int64_t ShardedModel::num_params() const {
  int64_t n = 0;
  for (const auto& fu : impl_->units)
    for (const FlatEntry& e : fu->layout().entries) n += e.numel;
  return n;
}

int ShardedModel::rank() const { return impl_->ctx.world->rank(); }
int ShardedModel::world() const { return impl_->ctx.W; }
bool ShardedModel::state_on_nvme() const { return impl_->state.on_nvme(); }
const ShardingPolicy& ShardedModel::policy() const { return impl_->ctx.policy; }
int ShardedModel::peak_gathered_units() const { return impl_->params.peak(); }
Group& ShardedModel::group() const { return *impl_->ctx.world; }
Group* ShardedModel::tensor_group() const { return impl_->ctx.tensor.get(); }

const std::vector<TensorSplit>& ShardedModel::Impl::tensor_splits(const std::string& name) {
  if (splits.empty()) {
    const int t = model->tensor.size;
    for (int j = 0; j < t; ++j) {
      const Model m = build_model(model->config, TensorSlice{j, t});
      for (const auto& u : m.units)
        for (const ParamSpec& p : u->params()) {
          std::vector<TensorSplit>& v = splits[p.name];
          v.resize(size_t(t));
          v[size_t(j)] = p.split;
        }
    }
  }
  auto it = splits.find(name);
  SW_CHECK(it != splits.end(), "tensor parallelism: no split recorded for " + name);
  return it->second;
}

ShardedModel::StagingResidency ShardedModel::staging_residency() const {
  StagingResidency r;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec;
  for (const auto& [data, bytes] : impl_->state.host_staging()) {
    if (!data || bytes == 0) continue;
    const uintptr_t lo = reinterpret_cast<uintptr_t>(data) / page * page;
    const uintptr_t hi = (reinterpret_cast<uintptr_t>(data) + bytes + page - 1) / page * page;
    r.bytes += static_cast<int64_t>(hi - lo);
    vec.assign((hi - lo) / page, 0);
    SW_CHECK(::mincore(reinterpret_cast<void*>(lo), hi - lo, vec.data()) == 0, "mincore failed");
    for (unsigned char v : vec) r.resident += (v & 1) ? static_cast<int64_t>(page) : 0;
  }
  return r;
}

CommStats ShardedModel::comm_stats() const {
  const ModelContext& c = impl_->ctx;
  CommStats t;
  std::vector<Group*> seen;
  for (PeerComm* pc : {c.p2p.get(), c.qshard.get(), c.qrep.get()}) {  // (quantised: qgZ)
    if (!pc) continue;
    const CommStats s = pc->stats();
    t.ops += s.ops, t.bytes += s.bytes, t.comm_s += s.comm_s, t.exposed_s += s.exposed_s;
  }
  for (Group* g : {c.world.get(), c.shard.get(), c.rep.get(), c.tensor.get(), c.pipe.get(),
                   c.shared.get(), c.cross.get()}) {
    if (!g || std::find(seen.begin(), seen.end(), g) != seen.end()) continue;
    seen.push_back(g);
    const CommStats s = g->stats();
    t.ops += s.ops, t.bytes += s.bytes, t.comm_s += s.comm_s, t.exposed_s += s.exposed_s;
  }
  return t;
}

void ShardedModel::reset_comm_stats() {
  const ModelContext& c = impl_->ctx;
  for (Group* g : {c.world.get(), c.shard.get(), c.rep.get(), c.tensor.get(), c.pipe.get(),
                   c.shared.get(), c.cross.get()})
    if (g) g->reset_stats();
  for (PeerComm* pc : {c.p2p.get(), c.qshard.get(), c.qrep.get()})
    if (pc) pc->reset_stats();
}

}  // namespace sw
