// ShardedModel: construction (groups, flat units, initialisation), the public calls that run
// the step plan's segments through the executor, and parameter access. The other concepts
// live in their own files (sharding/sharded_model_impl.h lists them).
#include "sharding/sharded_model.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "sharding/sharded_model_impl.h"

namespace sw {

// ---- Construction and initialisation ---------------------------------------------------------

ShardedModel::ShardedModel(Model& model, const Ops& ops, uint64_t seed)
    : ShardedModel(model, ops, seed, make_local_group(),
                   ShardingPolicy::for_strategy(ShardingStrategy::FullShard)) {}

ShardedModel::ShardedModel(Model& model, const Ops& ops, uint64_t seed, GroupPtr group,
                           const ShardingPolicy& policy)
    : model_(model), impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.ops = &ops;
  I.policy = policy;
  const MixedPrecisionPolicy& mp = policy.mixed_precision;
  for (DType d : {mp.param_dtype, mp.reduce_dtype})
    if (d != DType::F32 && d != DType::BF16 && d != DType::F16)
      fail("sharding", "mixed precision: unsupported dtype");
  I.compute_ops = mp.param_dtype == DType::F32 ? &ops : &ops_for(ops.device(), mp.param_dtype);
  if (!group) fail("sharding", "no communication group given");
  if (model.units.empty()) fail("sharded_model", "the model has no units");
  if (model.schedule.empty()) fail("sharded_model", "the model's schedule is empty");
  if (policy.forward_prefetch < 0 || policy.backward_prefetch < 0 || policy.max_live_units < 0)
    fail("sharding", "prefetch depths and max_live_units must be >= 0");
  const OptimizerOffload& oo = policy.offload_optimizer;
  if (!(oo.ratio >= 0 && oo.ratio <= 1))
    fail("sharding", "offload_optimizer.ratio must be in [0, 1]");
  if (oo.device == OffloadDevice::Nvme && oo.nvme_path.empty())
    fail("offload", "zero_optimization.offload_optimizer.nvme_path: required with device 'nvme'");
  if (policy.offload_param.device == OffloadDevice::Nvme) {
    if (policy.offload_param.nvme_path.empty())
      fail("offload", "zero_optimization.offload_param.nvme_path: required with device 'nvme'");
    if (policy.strategy != ShardingStrategy::FullShard &&
        policy.strategy != ShardingStrategy::ShardGradOp &&
        policy.strategy != ShardingStrategy::HybridShard)
      fail("offload", std::string("zero_optimization.offload_param.device 'nvme' needs "
                                  "FULL_SHARD, SHARD_GRAD_OP or HYBRID_SHARD, not ") +
                          strategy_name(policy.strategy));
  }
  const ActivationCheckpointing& ac = policy.activation_checkpointing;
  if (ac.every < 1)
    fail("sharding", "activation_checkpointing.every must be >= 1, got " + std::to_string(ac.every));
  for (int u : ac.units)
    if (u < 0 || u >= static_cast<int>(model.units.size()))
      fail("sharding", "activation_checkpointing.units names unit " + std::to_string(u) +
                           "; the model has units 0.." + std::to_string(model.units.size() - 1));

  // Groups, flat sizes, buckets: the plan's view of the model is the one construction uses.
  // The host group: the device groups of the unit buffers are made from it below.
  const std::string gb = group->backend();
  if (gb != "local" && gb != "mpi")
    fail("sharding", "ShardedModel needs the host group (local or mpi), got a '" + gb +
                         "' group: it makes the device groups for " + ops.device().str() + " itself");
  I.world = group;
  I.W = group->size();
  const int rank = group->rank();
  I.plan_in = make_plan_input(model, policy, I.W);
  I.plan_in.on_device = !ops.device().is_cpu();
  I.plan_in.compute = I.compute_ops->compute();
  I.S = I.plan_in.S;
  I.R = I.plan_in.R;
  if (I.S == I.W) {
    I.shard = group;
  } else if (I.S == 1) {
    I.shard = make_local_group();
  } else {
    // Shard groups: consecutive ranks (within a node under the usual rank placement);
    // replicate groups: the ranks with the same position in each shard group.
    I.shard = group->split(rank / I.S, rank);
  }
  if (I.R > 1) I.rep = I.S == 1 ? group : group->split(rank % I.S, rank);
  I.shard_host = I.shard;
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
    I.shard = device_group(I.shard, dev, policy.device_comm);
    if (I.rep) I.rep = device_group(I.rep, dev, policy.device_comm);
  }

  const size_t U = model.units.size();
  const FlatUnit::Kind kind = I.plan_in.kind == UnitKind::Whole ? FlatUnit::Kind::Whole
                              : I.plan_in.kind == UnitKind::FullReplicated
                                  ? FlatUnit::Kind::FullReplicated
                                  : FlatUnit::Kind::Sharded;
  // NO_SHARD with replicas: every unit's gradients in one buffer, cut into the plan's buckets.
  std::vector<int64_t> region(U, -1);
  if (!I.plan_in.buckets.empty()) {
    for (const PlanBucket& b : I.plan_in.buckets) {
      int64_t off = b.lo;
      for (int u : b.members) {
        region[size_t(u)] = off;
        off += I.plan_in.units[size_t(u)].padded;
      }
    }
    const int64_t total = I.plan_in.buckets.back().hi;
    I.bucket_buf = Buffer(static_cast<size_t>(total) * sizeof(float), Mem::Grads, ops.device());
    ops.fill(I.bucket_buf.f32(), 0.f, static_cast<size_t>(total));
  }

  I.units.reserve(U);
  for (size_t u = 0; u < U; ++u) {
    float* bucket_grads = region[u] >= 0 ? I.bucket_buf.f32() + region[u] : nullptr;
    const Tier opt_tier =
        !policy.offload_optimizer.offloaded(static_cast<int>(u), static_cast<int>(U))
            ? Tier::Device
        : policy.offload_optimizer.device == OffloadDevice::Nvme ? Tier::Nvme
                                                                 : Tier::Host;
    // (NVMe parameters: units kept out of the file by max_in_cpu are on the host tier.)
    const Tier param_tier = I.plan_in.units[u].params_nvme ? Tier::Nvme
                            : I.plan_in.units[u].params_offloaded ? Tier::Host
                                                                  : Tier::Device;
    I.units.push_back(std::make_unique<FlatUnit>(model.units[u].get(), static_cast<int>(u), kind,
                                                 I.shard.get(), ops, bucket_grads, mp, opt_tier,
                                                 param_tier));
    FlatUnit& fu = *I.units.back();
    fu.first_pos = I.plan_in.units[u].first_pos;
    fu.last_pos = I.plan_in.units[u].last_pos;
    const FlatLayout& L = fu.layout();
    for (size_t s = 0; s < L.specs.size(); ++s)
      if (!I.by_name
               .emplace(L.specs[s].name, std::make_pair(static_cast<int>(u), static_cast<int>(s)))
               .second)
        fail("sharded_model", "parameter name '" + L.specs[s].name + "' is declared twice");
  }
  I.acts.resize(model.schedule.size());
  I.saved.resize(model.schedule.size());
  for (Saved& sv : I.saved) sv.set_device(ops.device());
  I.scratch.set_device(ops.device());
  I.recompute.assign(model.schedule.size(), CheckpointMode::Off);
  I.opt_plan = plan_optimizer(I.plan_in);
  I.flush_plan = plan_flush(I.plan_in);
  I.zero_after_update.assign(I.units.size(), false);
  for (size_t u = 0; u < I.units.size(); ++u)
    I.defers.push_back(unit_defers(I.plan_in, static_cast<int>(u)));
  I.setup_nvme(rank);  // its staging buffers are the optimizer plan's
  I.setup_nvme_params(rank);
  I.rank = rank;
  if (ac.offload_nvme && ac.nvme_path.empty())
    fail("offload", "activation_checkpointing.nvme_path: required with offload 'nvme'");
  if (const char* v = std::getenv("SHARDWISE_HOST_UPDATE_DELAY_US"))
    I.host_update_delay_us = std::max(0, std::atoi(v));
  if (const char* v = std::getenv("SHARDWISE_EXEC_DELAY_US")) {
    I.exec_delay_us = std::max(0, std::atoi(v));
    I.delay_state = 0x9E3779B97F4A7C15ULL ^ static_cast<uint64_t>(rank);
  }

  // Element i of parameter s: a pure function of (seed, s.name, i), so any rank can produce
  // exactly its slice. Sharded units write the intersection of each parameter with this
  // rank's shard into the master; persistent ones write the whole full buffer. Alignment gaps
  // and padding stay zero.
  for (auto& up : I.units) {
    FlatUnit& fu = *up;
    const bool whole = fu.persistent();
    if (fu.params_on_nvme()) I.stage_whole(fu, false);
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
#pragma omp parallel for schedule(static) if (r.hi - r.lo >= (int64_t{1} << 16))
          for (int64_t j = lo; j < r.hi; ++j)
            out[j - lo] = rng_normal(seed, stream, static_cast<uint64_t>(j - off)) * sd;
          if (!dst_dev.is_cpu())
            copy_bytes(dst + r.lo, dst_dev, host.data(), Device::cpu(), host.size() * sizeof(float));
          break;
        }
      }
    }
    fu.finish_init();  // a split master takes its slice; the compute copy is rounded
    if (fu.params_on_nvme()) I.unstage_whole(fu, true);
  }
}

ShardedModel::~ShardedModel() = default;

int64_t ShardedModel::num_params() const {
  int64_t n = 0;
  for (const auto& fu : impl_->units)
    for (const FlatEntry& e : fu->layout().entries) n += e.numel;
  return n;
}

int ShardedModel::rank() const { return impl_->world->rank(); }
int ShardedModel::world() const { return impl_->W; }
bool ShardedModel::state_on_nvme() const { return impl_->nvme || impl_->pnvme; }

ShardedModel::StagingResidency ShardedModel::staging_residency() const {
  StagingResidency r;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec;
  auto add = [&](const void* data, size_t bytes) {
    if (!data || bytes == 0) return;
    const uintptr_t lo = reinterpret_cast<uintptr_t>(data) / page * page;
    const uintptr_t hi = (reinterpret_cast<uintptr_t>(data) + bytes + page - 1) / page * page;
    r.bytes += static_cast<int64_t>(hi - lo);
    vec.assign((hi - lo) / page, 0);
    SW_CHECK(::mincore(reinterpret_cast<void*>(lo), hi - lo, vec.data()) == 0, "mincore failed");
    for (unsigned char v : vec) r.resident += (v & 1) ? static_cast<int64_t>(page) : 0;
  };
  if (impl_->nvme)
    for (const StagingBuffer& b : impl_->nvme->slots) add(b.data(), b.bytes());
  if (impl_->pnvme) {
    for (const auto* v : {&impl_->pnvme->pslots, &impl_->pnvme->gslots, &impl_->pnvme->opt_slots})
      for (const Buffer& b : *v)
        if (b.device().is_cpu()) add(b.data(), b.bytes());
  }
  return r;
}
const ShardingPolicy& ShardedModel::policy() const { return impl_->policy; }
int ShardedModel::peak_gathered_units() const { return impl_->peak_live; }
Group& ShardedModel::group() const { return *impl_->world; }

CommStats ShardedModel::comm_stats() const {
  CommStats t;
  std::vector<Group*> seen;
  for (Group* g : {impl_->world.get(), impl_->shard.get(), impl_->rep.get()}) {
    if (!g || std::find(seen.begin(), seen.end(), g) != seen.end()) continue;
    seen.push_back(g);
    const CommStats s = g->stats();
    t.ops += s.ops, t.bytes += s.bytes, t.comm_s += s.comm_s, t.exposed_s += s.exposed_s;
  }
  return t;
}

void ShardedModel::reset_comm_stats() {
  for (Group* g : {impl_->world.get(), impl_->shard.get(), impl_->rep.get()})
    if (g) g->reset_stats();
}

// ---- Execution -------------------------------------------------------------------------------

const Batch& ShardedModel::Impl::on_device(const Batch& b) {
  if (ops->device().is_cpu()) return b;
  const size_t n = static_cast<size_t>(b.B) * static_cast<size_t>(b.T) * sizeof(int32_t);
  // Through host copies of its own (Tier::Host: pinned once a GPU registered pinning), on the
  // copy stream, which the compute stream waits for: the caller's arrays are free at return
  // and the device's queue is not drained. A host copy is written again kBatchRing batches
  // later, once its upload is done (only then may the host wait). The kept device buffers are
  // overwritten only after the compute stream's work so far (which read them last).
  const int r = batch_next;
  batch_next = (batch_next + 1) % kBatchRing;
  auto upload = [&](int k, Buffer& buf, const int32_t* src) -> const int32_t* {
    if (!src) return nullptr;
    Upload& up = batch_ring[k][r];
    if (up.done && !up.done->query()) up.done->synchronize();
    if (up.host.bytes() < n)
      up.host = Buffer(n, Mem::Activations, Device::cpu(), Tier::Host);
    std::memcpy(up.host.data(), src, n);
    if (buf.bytes() < n) buf = Buffer(n, Mem::Activations, ops->device());
    up.done = copy_bytes_async(buf.data(), buf.device(), up.host.data(), Device::cpu(), n);
    ops->stream().wait_event(*up.done);
    return buf.as<int32_t>();
  };
  dev_batch = b;
  dev_batch.counted = count_targets(b);
  dev_batch.tokens = upload(0, batch_tokens, b.tokens);
  dev_batch.targets = upload(1, batch_targets, b.targets);
  return dev_batch;
}

double* ShardedModel::Impl::sum_at(int i) {
  if (sums.empty())
    sums = Buffer(sizeof(double) * (2 * kLossSlots + units.size()), Mem::Workspace, ops->device());
  return sums.as<double>() + i;
}

std::vector<double> ShardedModel::Impl::read_sums(int k) {
  std::vector<double> h(static_cast<size_t>(kLossSlots + k));
  copy_bytes(h.data(), Device::cpu(), sum_at(0), ops->device(), h.size() * sizeof(double));
  const size_t first = losses.size() - static_cast<size_t>(unread);
  for (int i = 0; i < unread; ++i) losses[first + static_cast<size_t>(i)].sum += h[size_t(i)];
  unread = 0;
  return std::vector<double>(h.begin() + kLossSlots, h.end());
}

void ShardedModel::Impl::read_evals() {
  if (eval_pending.empty()) return;
  std::vector<double> h(eval_pending.size());
  copy_bytes(h.data(), Device::cpu(), eval_at(0), ops->device(), h.size() * sizeof(double));
  for (size_t i = 0; i < h.size(); ++i) {
    const StepLoss& p = eval_pending[i];
    eval_done.push_back(p.count > 0 ? (p.sum + h[i]) / static_cast<double>(p.count) : 0.0);
  }
  eval_pending.clear();
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
  // A full set of unread losses is read now (one synchronisation per kLossSlots micro-steps).
  if (I.unread == Impl::kLossSlots) I.read_sums(0);
  ExecState st;
  st.batch = &I.on_device(batch);
  const int64_t counted = count_targets(*st.batch);  // counted once (a device batch keeps it)
  // d(mean loss) = d(sum of token losses) / counted.
  st.scale = counted > 0 ? grad_scale / static_cast<float>(counted) : 0.f;
  st.loss_total = I.sum_at(I.unread);
  I.ops->fill(reinterpret_cast<float*>(st.loss_total), 0.f, 2);  // a double's zero bits
  const bool reduce = last_micro_step || I.policy.accum == GradAccumMode::ReduceEachMicroStep;
  // The last optimizer step's deferred updates run in this forward, each before its unit's
  // first use (OptimizerOffload::defer_update).
  const bool pending = I.deferred.has_value();
  if (pending) I.set_deferred(st);
  try {
    I.complete_reductions(-1);  // nothing should be in flight; a no-op normally
    I.peak_live = I.live_units();
    I.ensure_pingpong(static_cast<size_t>(batch.B) * batch.T * model_.d_model());
    I.run(model_, I.plan_for(model_, batch, SegmentKind::MicroStep, reduce, last_micro_step,
                             pending), st);
    I.deferred.reset();
  } catch (...) {
    // Some deferred updates may have run: applying them again later would be wrong, and the
    // step is lost anyway (the caller stops or restores a checkpoint).
    I.deferred.reset();
    I.abandon_step();
    throw;
  }
  I.free_activations();
  for (auto& u : I.units) u->to_idle();
  if (counted > 0 && st.loss_count == 0)
    fail("sharded_model", "no call of the model's schedule reported a loss");
  I.losses.push_back({st.loss_sum, st.loss_count});
  ++I.unread;
}

std::vector<double> ShardedModel::step_losses() {
  Impl& I = *impl_;
  if (I.unread > 0) I.read_sums(0);
  std::vector<double> out;
  out.reserve(I.losses.size());
  for (const Impl::StepLoss& l : I.losses)
    out.push_back(l.count > 0 ? l.sum / static_cast<double>(l.count) : 0.0);
  I.losses.clear();
  return out;
}

double ShardedModel::forward_backward(const Batch& batch, float grad_scale, bool last_micro_step) {
  micro_step(batch, grad_scale, last_micro_step);
  return step_losses().back();
}

namespace {
// Forward only (eval_loss, logits_last).
// Forward only: with `logits`, the last positions' logits copied out; else the loss summed
// into *loss_slot (a double of ops' device, zeroed here, not read).
ExecState run_forward(ShardedModel::Impl& I, Model& model, const Batch& batch, float* logits,
                      double* loss_slot) {
  I.flush_deferred(model);
  ExecState st;
  st.batch = &I.on_device(batch);
  st.training = false;
  st.logits = logits;
  if (!logits) {
    st.loss_total = loss_slot;
    I.ops->fill(reinterpret_cast<float*>(st.loss_total), 0.f, 2);
  }
  Buffer dev_logits;  // (B, V) on a non-CPU device, copied out at the end
  const size_t nlogits = static_cast<size_t>(batch.B) * static_cast<size_t>(model.config.vocab_size);
  if (logits && !I.ops->device().is_cpu()) {
    dev_logits = Buffer(nlogits * sizeof(float), Mem::Activations, I.ops->device());
    st.logits = dev_logits.f32();
  }
  try {
    I.ensure_pingpong(static_cast<size_t>(batch.B) * batch.T * model.d_model());
    I.run(model, I.plan_for(model, batch, SegmentKind::Eval, false, false), st);
  } catch (...) {
    I.abandon_step();
    throw;
  }
  if (!dev_logits.empty())
    copy_bytes(logits, Device::cpu(), dev_logits.data(), dev_logits.device(), dev_logits.bytes());
  return st;
}
}  // namespace

void ShardedModel::eval_step(const Batch& batch) {
  check_batch(batch, true);
  Impl& I = *impl_;
  // A full set of unread losses is read now (one synchronisation per kLossSlots batches).
  if (I.eval_pending.size() == size_t(Impl::kLossSlots)) I.read_evals();
  const ExecState st =
      run_forward(I, model_, batch, nullptr, I.eval_at(static_cast<int>(I.eval_pending.size())));
  if (count_targets(batch) > 0 && st.loss_count == 0)
    fail("sharded_model", "no call of the model's schedule reported a loss");
  I.eval_pending.push_back({st.loss_sum, st.loss_count});
}

std::vector<double> ShardedModel::eval_losses() {
  impl_->read_evals();
  return std::exchange(impl_->eval_done, {});
}

double ShardedModel::eval_loss(const Batch& batch) {
  eval_step(batch);
  return eval_losses().back();
}

void ShardedModel::logits_last(const Batch& batch, float* logits) {
  check_batch(batch, false);
  SW_CHECK(logits != nullptr, "logits_last needs an output buffer");
  run_forward(*impl_, model_, batch, logits, nullptr);
}

StepPlan ShardedModel::step_plan(int B, int T, int accum) const {
  PlanInput in = impl_->plan_in;
  in.B = B, in.T = T, in.accum = accum;
  declare_calls(in, model_);
  return plan_step(in);
}

void ShardedModel::prepare_offload(int B, int T) {
  Impl& I = *impl_;
  if (!I.policy.activation_checkpointing.offload_nvme) return;
  PlanInput in = I.plan_in;
  in.B = B, in.T = T;
  declare_calls(in, model_);
  int64_t end = 0;  // as the executor lays positions out: each from a 4096-byte boundary
  for (const Action& a : plan_micro_step(in, 0, true, false).actions)
    if (a.kind == ActionKind::Evict && a.pos >= 0) end = (end + a.bytes + 4095) / 4096 * 4096;
  I.reserve_acts(end);
}

StepPlan ShardedModel::eval_plan(int B, int T) const {
  PlanInput in = impl_->plan_in;
  in.B = B, in.T = T;
  declare_calls(in, model_);
  return plan_eval(in);
}

void ShardedModel::set_recorder(StepRecorder* recorder) {
  impl_->settle_device_times();
  impl_->recorder = recorder;
  if (recorder) {
    const char* force = std::getenv("SHARDWISE_PROFILE_DEVICE_TIMES");
    impl_->device_times = impl_->ops->stream().native_handle() != nullptr ||
                          (force && std::string(force) == "1");
  }
}

void ShardedModel::settle_recorder() { impl_->settle_device_times(); }

// ---- Parameter access ------------------------------------------------------------------------

namespace {
// n floats of a unit buffer where the host can read them: `p` itself on the CPU, else a copy in
// `host` (after the compute stream's work on it).
const float* on_host(const Ops& ops, const float* p, int64_t n, std::vector<float>& host) {
  if (ops.device().is_cpu()) return p;
  host.resize(static_cast<size_t>(n));
  copy_bytes(host.data(), Device::cpu(), p, ops.device(), host.size() * sizeof(float));
  return host.data();
}
}  // namespace

void ShardedModel::for_each_param(
    const std::function<void(const ParamSpec&, const float* data)>& fn) const {
  Impl& I = *impl_;
  I.flush_deferred(model_);
  if (I.summon_held && I.summon_rank0_only && rank() != 0)
    fail("sharded_model", "for_each_param on rank " + std::to_string(rank()) +
                              " while gather_full_params(rank0_only) holds the copy on rank 0");
  for (size_t u = 0; u < I.units.size(); ++u) {
    FlatUnit& fu = *I.units[u];
    const float* base;
    Buffer tmp;
    if (I.summon_held) {
      base = I.summoned[u].f32();
    } else if (fu.persistent() && !fu.split_master()) {
      fu.wait_unshard();
      base = fu.full();
    } else {
      tmp = Buffer(static_cast<size_t>(fu.layout().padded) * sizeof(float), Mem::Communication,
                   I.ops->device());
      if (fu.params_on_nvme()) I.stage_whole(fu, false);
      fu.gather_params_into(tmp.f32());
      if (fu.params_on_nvme()) I.unstage_whole(fu, false);
      base = tmp.f32();
    }
    std::vector<float> host;
    base = on_host(*I.ops, base, fu.layout().padded, host);
    for (size_t s = 0; s < fu.layout().specs.size(); ++s)
      fn(fu.layout().specs[s], base + fu.layout().entries[s].offset);
  }
}

void ShardedModel::for_each_grad(
    const std::function<void(const ParamSpec&, const float* grad)>& fn) const {
  Impl& I = *impl_;
  I.flush_deferred(model_);
  I.sync_grads();
  for (auto& up : I.units) {
    FlatUnit& fu = *up;
    Buffer tmp;
    const float* base = fu.grad_shard();
    if (fu.kind() != FlatUnit::Kind::Whole) {
      tmp = Buffer(static_cast<size_t>(fu.layout().padded) * sizeof(float), Mem::Communication,
                   I.ops->device());
      if (fu.params_on_nvme()) I.stage_whole(fu, true);
      fu.gather_grads_into(tmp.f32());
      if (fu.params_on_nvme()) I.unstage_whole(fu, false);
      base = tmp.f32();
    }
    std::vector<float> host;
    base = on_host(*I.ops, base, fu.layout().padded, host);
    for (size_t s = 0; s < fu.layout().specs.size(); ++s)
      fn(fu.layout().specs[s], base + fu.layout().entries[s].offset);
  }
}

void ShardedModel::gather_full_params(bool rank0_only) {
  Impl& I = *impl_;
  I.flush_deferred(model_);
  release_full_params();
  I.summoned.resize(I.units.size());
  for (size_t u = 0; u < I.units.size(); ++u) {
    FlatUnit& fu = *I.units[u];
    Buffer b(static_cast<size_t>(fu.layout().padded) * sizeof(float), Mem::Communication,
             I.ops->device());
    if (fu.params_on_nvme()) I.stage_whole(fu, false);
    fu.gather_params_into(b.f32());
    if (fu.params_on_nvme()) I.unstage_whole(fu, false);
    if (!rank0_only || rank() == 0) I.summoned[u] = std::move(b);
  }
  I.summon_held = true;
  I.summon_rank0_only = rank0_only;
}

void ShardedModel::release_full_params() {
  impl_->summoned.clear();
  impl_->summon_held = false;
}

void ShardedModel::set_param(const std::string& name, const float* data, int64_t n) {
  Impl& I = *impl_;
  I.flush_deferred(model_);
  auto it = I.by_name.find(name);
  if (it == I.by_name.end()) fail("sharded_model", "no parameter named '" + name + "'");
  FlatUnit& fu = *I.units[static_cast<size_t>(it->second.first)];
  const size_t s = static_cast<size_t>(it->second.second);
  const FlatEntry& e = fu.layout().entries[s];
  if (n != e.numel)
    fail("sharded_model", "parameter '" + name + "' has " + std::to_string(e.numel) + " elements " +
                              shape_str(fu.layout().specs[s].shape) + ", got " + std::to_string(n));
  release_full_params();
  Buffer up;  // the values on the device, for a non-CPU one
  const float* host_data = data;
  if (!I.ops->device().is_cpu()) {
    up = Buffer(static_cast<size_t>(n) * sizeof(float), Mem::Workspace, I.ops->device());
    copy_bytes(up.data(), up.device(), data, Device::cpu(), up.bytes());
    data = up.f32();
  }
  if (fu.persistent()) fu.wait_unshard();
  if (fu.kind() == FlatUnit::Kind::Sharded && fu.holds_gathered()) {  // a prefetch goes stale
    fu.wait_unshard();
    fu.reshard();
  }
  // The full copy, where this rank holds one (it contains the master slice for stage 1, or is
  // the rounded compute copy with a split master).
  if (fu.full() && fu.sharded_state() == ShardedState::Unsharded) {
    if (fu.split_master())
      fu.write_compute(e.offset, n, data);
    else
      I.ops->copy(fu.full() + e.offset, data, static_cast<size_t>(n));
  }
  if (fu.kind() == FlatUnit::Kind::Sharded || fu.split_master()) {
    const Range shard = fu.shard_range();
    const Range r = intersect(shard, {e.offset, e.offset + e.numel});
    if (!r.empty()) {
      if (fu.params_on_nvme()) I.stage_whole(fu, false);
      if (fu.master_device() == I.ops->device())
        I.ops->copy(fu.master() + (r.lo - shard.lo), data + (r.lo - e.offset),
                    static_cast<size_t>(r.hi - r.lo));
      else  // offloaded shards on the host: from the caller's host data
        std::memcpy(fu.master() + (r.lo - shard.lo), host_data + (r.lo - e.offset),
                    static_cast<size_t>(r.hi - r.lo) * sizeof(float));
      if (fu.params_on_nvme()) I.unstage_whole(fu, true);
    }
  }
}

}  // namespace sw

