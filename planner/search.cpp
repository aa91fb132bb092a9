#include "planner/search.h"

#include <algorithm>
#include <chrono>
#include <cctype>
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <tuple>
#include <vector>

#include "checkpoint/save_memory.h"
#include "core/alloc.h"
#include "core/bytes.h"
#include "core/error.h"
#include "kernels/ops.h"
#include "kernels/threads.h"
#include "models/activation_check.h"
#include "sharding/wrap.h"

namespace sw {

int64_t parse_budget(const std::string& text, const std::string& what) {
  try {  // the budget parser a config's memory_budget reads with too
    const size_t b = parse_budget_bytes(text);
    if (b <= size_t(INT64_MAX)) return static_cast<int64_t>(b);
  } catch (const Error&) {
  }
  fail("plan", what + ": cannot parse '" + text + "' as bytes (e.g. 8GiB, 512MiB, 8e9)");
}

int64_t comm_scratch_bytes(const StepPlan& plan) {
  constexpr int64_t kChunk = 512 << 10, kSlice = 16 * kChunk;  // CommOptions' defaults
  int64_t rs = 0, ar = 0, tp = 0, sh = 0;
  for (const Action& a : plan.actions) {
    if (a.kind == ActionKind::SyncShared) {  // (two ranks)
      sh = std::max(sh, a.bytes * 2 <= 512 * 1024 ? a.bytes * 2
                                                  : 2 * std::min(kSlice, (a.bytes + 1) / 2));
      continue;
    }
    // The tensor group's reductions (the compute thread waits for them, so they may overlap a
    // data-parallel reduction in flight: counted beside those).
    if (a.kind == ActionKind::TpScatterRows && plan.tensor > 1) {
      const int64_t n = plan.tensor;
      tp = std::max(tp, a.bytes <= 16 * 1024 ? 2 * n * kChunk : 2 * std::min(kSlice, a.bytes / n));
      continue;
    }
    if (a.kind == ActionKind::TpReduceGrads && plan.tensor > 1) {
      const int64_t n = plan.tensor;
      tp = std::max(tp, a.bytes * n <= 512 * 1024 ? a.bytes * n
                                                  : 2 * std::min(kSlice, (a.bytes + n - 1) / n));
      continue;
    }
    if (a.kind == ActionKind::ReduceScatter && plan.S > 1) {
      const int64_t n = plan.S;
      rs = std::max(rs, a.bytes <= 16 * 1024 ? 2 * n * kChunk : 2 * std::min(kSlice, a.bytes / n));
    } else if (a.kind == ActionKind::AllReduce && plan.R > 1) {
      const int64_t n = plan.R;
      ar = std::max(ar, a.bytes * n <= 512 * 1024 ? a.bytes * n
                                                  : 2 * std::min(kSlice, (a.bytes + n - 1) / n));
    }
  }
  return (plan.S > 1 && plan.R > 1 ? rs + ar : std::max(rs, ar)) + tp + sh;
}

ModelConfig tensor_local_config(const ModelConfig& mc, int t) {
  if (t <= 1) return mc;
  ModelConfig c = mc;
  const int kv = mc.n_kv_head > 0 ? mc.n_kv_head : mc.n_head;
  c.n_head = mc.n_head / t;
  c.n_kv_head = kv % t == 0 ? kv / t : 1;
  if (c.d_ff > 0) c.d_ff = mc.d_ff / t;
  c.vocab_size = mc.vocab_size / t;
  return c;
}

StepShape step_shape(const ModelConfig& mc, int B, int T, DType compute, int threads,
                     bool fp8) {
  StepShape s;
  s.B = B, s.T = T;
  s.d_model = mc.d_model, s.n_head = mc.n_head, s.vocab = mc.vocab_size;
  s.llama = mc.type == "llama";
  s.n_kv_head = s.llama && mc.n_kv_head > 0 ? mc.n_kv_head : 0;
  s.d_ff = mc.d_ff;
  if (s.llama && s.d_ff == 0) {  // the model's default (models/model.cpp): ceil(8d/3) to 64
    const int64_t f = (8 * static_cast<int64_t>(mc.d_model) + 2) / 3;
    s.d_ff = static_cast<int>((f + 63) / 64 * 64);
  }
  s.compute = compute;
  s.threads = std::max(1, threads);
  s.fp8 = fp8;
  return s;
}

int64_t cuda_workspace_bytes(const ModelConfig& mc, int B, int T, DType compute) {
  return kernel_workspace(DeviceKind::CUDA, step_shape(mc, B, T, compute)).bytes;
}

WorkspaceDecl plan_workspace(const ModelConfig& mc, int B, int T, DType compute, int world,
                             int threads, int64_t comm_scratch, bool on_device, bool fp8) {
  WorkspaceDecl w = kernel_workspace(on_device ? DeviceKind::CUDA : DeviceKind::CPU,
                                     step_shape(mc, B, T, compute, threads, fp8));
  if (world > 1 && comm_scratch > 0) {
    w.bytes += comm_scratch;
    w.what += "; the communication groups' scratch";
  }
  return w;
}

int plan_threads(int threads, int world) { return threads_for(threads, world); }

PlanPeak replay_peak_alloc_first(const StepPlan& plan) {
  return replay_peak_alloc_first(plan, 0, nullptr);
}

PlanPeak replay_peak_alloc_first(const StepPlan& plan, int64_t backward_extra,
                                 bool* extra_at_peak, const std::vector<uint8_t>* block) {
  PlanPeak r;
  int64_t best = 0;  // r.total, plus backward_extra where the peak is at a backward
  bool best_extra = false;
  MemDeltas cur = plan.initial;
  auto note = [&](int i, const MemDeltas& extra, int64_t more) {
    int64_t t = 0;
    MemDeltas at{};
    for (size_t c = 0; c < cur.size(); ++c) {
      at[c] = cur[c] + plan.persistent[c] + plan.reserved[c] + extra[c];
      t += at[c];
      r.category_peak[c] = std::max(r.category_peak[c], at[c]);
    }
    if (t + more > best || r.action == -1)
      best = t + more, best_extra = more > 0, r.total = t, r.action = i, r.at_peak = at;
  };
  note(-1, MemDeltas{}, 0);
  // The blocks' positions: all but the schedule's first (the embedding) and last (the loss).
  int last = 0;
  for (const Action& a : plan.actions) last = std::max(last, a.pos);
  for (size_t i = 0; i < plan.actions.size(); ++i) {
    const Action& a = plan.actions[i];
    MemDeltas up{};  // allocations first, with the action's transient bytes
    for (size_t c = 0; c < cur.size(); ++c) up[c] = std::max<int64_t>(a.mem[c], 0) + a.transient[c];
    const bool is_block = block ? a.pos >= 0 && size_t(a.pos) < block->size() && (*block)[size_t(a.pos)]
                                : a.pos > 0 && a.pos < last;
    note(static_cast<int>(i), up, a.kind == ActionKind::Backward && is_block ? backward_extra : 0);
    for (size_t c = 0; c < cur.size(); ++c) {
      cur[c] += a.mem[c];
      r.negative |= cur[c] < 0;
    }
  }
  if (extra_at_peak) *extra_at_peak = best_extra;
  return r;
}

DevicePeak device_peak(const StepPlan& plan, const ModelConfig& mc, int B, int T,
                       const MixedPrecisionPolicy& mp, int world, int threads, bool on_device,
                       const std::vector<uint8_t>* block) {
  DevicePeak d;
  d.decl = plan_workspace(mc, B, T, mp.param_dtype, world, threads, comm_scratch_bytes(plan),
                          on_device, mp.fp8);
  bool at_backward = false;
  d.plan = replay_peak_alloc_first(plan, d.decl.backward_transient, &at_backward, block);
  d.workspace = d.decl.bytes + (at_backward ? d.decl.backward_transient : 0);
  d.total = d.plan.total + d.workspace;
  return d;
}

namespace {

void resolve_group(ShardingPolicy& p, int world) {
  if (p.strategy == ShardingStrategy::HybridShard && p.shard_group_size == 0)
    p.shard_group_size = world;
}

// The cached parts of evaluating many candidates of one wrap policy.
struct Wrapped {
  Model model;
  std::map<int, std::vector<CallMemory>> calls;  // per micro-batch
  std::map<int, TimeInputs> times;               // per micro-batch (before policy fields)
};

Evaluated evaluate(Wrapped& w, const PlanSetup& s, const Candidate& c, const HardwareProfile& hw) {
  PlanInput in = make_plan_input(w.model, s.policy, s.data_world());
  in.hosts = s.hosts;
  in.on_device = s.on_device;
  in.B = s.micro_batch;
  in.T = s.model.seq_len;
  in.accum = s.accum;
  auto it = w.calls.find(in.B);
  if (it == w.calls.end()) {
    declare_calls(in, w.model);
    it = w.calls.emplace(in.B, in.calls).first;
  }
  in.calls = it->second;
  auto tt = w.times.find(in.B);
  if (tt == w.times.end()) tt = w.times.emplace(in.B, time_inputs(w.model, in)).first;
  TimeInputs ti = tt->second;
  ti.compute = in.policy.mixed_precision.param_dtype;
  ti.act_offload_nvme = in.policy.activation_checkpointing.offload_nvme;
  ti.grad_shard_floats = 0;
  for (const PlanUnit& u : in.units) ti.grad_shard_floats += u.padded / in.S;
  const StepPlan plan = plan_step(in);
  const DevicePeak pk = device_peak(plan, tensor_local_config(s.model, s.tensor), in.B, in.T,
                                    in.policy.mixed_precision, s.world,
                                    plan_threads(s.threads, s.world), s.on_device);
  Evaluated e;
  e.c = c;
  e.workspace = pk.workspace;
  e.device = pk.total;
  e.at_peak = pk.plan.at_peak;
  e.host = host_bytes(plan);
  e.nvme = plan.nvme_bytes;
  e.time = predict_step_time(plan, in, ti, hw);
  return e;
}

}  // namespace

// NVMe staging buffers are sized for the largest unit's shard (parameters: gather g of a
// segment reads its unit's master into buffer g % param_slots; gradients: the buffer each
// reduction's Fetch names) or the largest optimizer piece (piece k in buffer k % slots, its
// floats from the buffer's start). A step repeats the same plan, so a buffer's resident part is
// the largest transfer the plan puts in it, in 4 KiB pages (the buffers are page-aligned).
int64_t untouched_staging_bytes(const StepPlan& plan) {
  std::vector<int64_t> params(size_t(plan.param_slots), 0), grads(size_t(plan.grad_slots), 0),
      pieces(size_t(plan.staging_slots), 0);
  for (const Action& a : plan.actions) {
    if ((a.kind != ActionKind::FetchState && a.kind != ActionKind::EvictState) || a.slot < 0)
      continue;
    std::vector<int64_t>* used = a.hi >= 0            ? &pieces  // an optimizer piece
                                 : a.io == kIoMaster ? &params
                                 : a.io == kIoGrads  ? &grads
                                                     : nullptr;
    if (used && size_t(a.slot) < used->size())
      (*used)[size_t(a.slot)] = std::max((*used)[size_t(a.slot)], a.bytes);
  }
  const int64_t page = 4096;
  auto pages = [&](int64_t b) { return (b + page - 1) / page * page; };
  int64_t untouched = 0;
  for (int64_t b : params) untouched += std::max<int64_t>(0, pages(plan.shard_bytes) - pages(b));
  for (int64_t b : grads) untouched += std::max<int64_t>(0, pages(plan.shard_bytes) - pages(b));
  for (int64_t b : pieces) untouched += std::max<int64_t>(0, pages(plan.staging_bytes) - pages(b));
  return untouched;
}

int64_t default_baseline_rss(int world) {
  return (world > 1 ? int64_t{21} : int64_t{11}) << 20;
}

int64_t checkpoint_file_bytes(const PlanInput& in) {
  int64_t floats = 0;
  // ShardedModel::owned_range: whatever the unit kind, the rank's shard of the S-way split,
  // cut again among the R replicas that hold it: a 1 / (S x R) part.
  for (const PlanUnit& u : in.units) floats += u.padded / std::max(1, in.S * in.R);
  return 3 * 4 * floats;
}

RssPrediction predict_rss(const StepPlan& plan, const PlanInput& in, int64_t device,
                          int64_t host, const PlanSetup& s, const HardwareProfile* hw) {
  RssPrediction r;
  r.data = s.data_bytes;
  if (s.checkpoint_saves)
    r.checkpoint = checkpoint_save_bytes(checkpoint_file_bytes(in), s.checkpoint_async);
  if (in.on_device) {  // device memory is not the process's RSS: the host tier, data, baseline
    r.tracked = host;
    r.baseline_measured = hw && hw->baseline_rss_bytes > 0;
    r.baseline = r.baseline_measured ? static_cast<int64_t>(hw->baseline_rss_bytes)
                                     : default_baseline_rss(in.W);
    r.untouched = untouched_staging_bytes(plan);
    r.total = r.tracked + r.data + r.baseline + r.checkpoint - r.untouched;
    return r;
  }
  r.tracked = device + host;
  auto round_up = [](int64_t b) { return static_cast<int64_t>(alloc_block_size(size_t(b))) - b; };
  const bool mp = in.policy.mixed_precision.param_dtype != DType::F32;
  const bool w16 = in.policy.mixed_precision.weights16(in.on_device);
  int64_t full_bytes = 0, full_rounding = 0;
  for (const PlanUnit& u : in.units) {
    const int64_t full = u.padded * 4, shard = full / std::max(1, in.S);
    // the 16-bit copy and the fp32 compute copy (compact beside it) (FlatUnit)
    const int64_t full16 = w16 ? u.padded * 2 : 0;
    const int64_t full32 = full_params_bytes(u, w16) - full16;
    const bool split = mp || u.params_offloaded;
    switch (in.kind) {  // the persistent buffers fill_persistent (step_plan.cpp) counts
      case UnitKind::Sharded:
        if (!u.params_nvme) r.rounding += 2 * round_up(shard);
        full_bytes += full32 + full16, full_rounding += round_up(full32) + round_up(full16);
        break;
      case UnitKind::FullReplicated:
        r.rounding += round_up(full32) + round_up(full) + round_up(shard) +
                      (split ? round_up(shard) : 0) + round_up(full16);
        break;
      case UnitKind::Whole:
        r.rounding += round_up(full32) + round_up(full) + (split ? round_up(full) : 0) +
                      round_up(full16);
        break;
    }
    if (!u.optimizer_nvme) r.rounding += 2 * round_up(shard);  // AdamW m, v
  }
  // Gathered parameters and gradients in flight: as many full buffers as the peak holds, each
  // rounded as the units' full buffers are on average.
  const PlanPeak pk = replay_peak_alloc_first(plan);
  if (full_bytes > 0)
    r.rounding += static_cast<int64_t>(double(pk.at_peak[size_t(Mem::Communication)]) *
                                       double(full_rounding) / double(full_bytes));
  r.untouched = untouched_staging_bytes(plan);
  r.baseline_measured = hw && hw->baseline_rss_bytes > 0;
  const double measured = mp && hw && hw->baseline_rss_bf16_bytes > 0 ? hw->baseline_rss_bf16_bytes
                          : hw                                        ? hw->baseline_rss_bytes
                                                                      : 0.0;
  r.baseline = r.baseline_measured ? static_cast<int64_t>(measured) : default_baseline_rss(in.W);
  r.total = r.tracked + r.rounding + r.data + r.baseline + r.checkpoint - r.untouched;
  return r;
}

std::vector<UndeclaredCall> undeclared_calls(const Model& model, int B, int T) {
  std::vector<UndeclaredCall> out;
  for (size_t u = 0; u < model.units.size(); ++u)
    for (int c = 0; c < model.units[u]->num_calls(); ++c)
      if (!model.units[u]->declare_activations(c, BatchShape{B, T}).known)
        out.push_back({static_cast<int>(u), c, model.units[u]->name()});
  return out;
}

std::string undeclared_message(const std::vector<UndeclaredCall>& u) {
  if (u.empty()) return "";
  std::string m = "unit '" + u[0].name + "' (call " + std::to_string(u[0].call) + ")";
  if (u.size() > 1) m += " and " + std::to_string(u.size() - 1) + " more call" + (u.size() > 2 ? "s" : "");
  return m + " do" + (u.size() > 1 ? "" : "es") +
         " not declare activation sizes (Unit::declare_activations), so the step's memory "
         "cannot be predicted; declare them (examples/custom_model.cpp), or measure one run of "
         "each such call (--measure-unknown)";
}

namespace {

// A unit whose declarations were measured at one batch shape; everything else is the
// wrapped unit's.
class MeasuredDecl final : public Unit {
 public:
  MeasuredDecl(std::unique_ptr<Unit> u, BatchShape shape, std::vector<ActivationDecl> d)
      : u_(std::move(u)), shape_(shape), decl_(std::move(d)) {}
  std::string name() const override { return u_->name(); }
  std::vector<ParamSpec> params() const override { return u_->params(); }
  int num_calls() const override { return u_->num_calls(); }
  void forward(UnitCtx& ctx, int call, const float* x, float* y) override { u_->forward(ctx, call, x, y); }
  void backward(UnitCtx& ctx, int call, const float* x, const float* dy, float* dx) override {
    u_->backward(ctx, call, x, dy, dx);
  }
  void recompute_cheap(UnitCtx& ctx, int call, const float* x) override { u_->recompute_cheap(ctx, call, x); }
  bool selective_recompute() const override { return u_->selective_recompute(); }
  ActivationDecl declare_activations(int call, BatchShape s) const override {
    const ActivationDecl d = u_->declare_activations(call, s);
    if (d.known || s.B != shape_.B || s.T != shape_.T || call < 0 || size_t(call) >= decl_.size()) return d;
    return decl_[size_t(call)];
  }

 private:
  std::unique_ptr<Unit> u_;
  BatchShape shape_;
  std::vector<ActivationDecl> decl_;
};

}  // namespace

std::vector<UndeclaredCall> measure_undeclared(Model& model, int B, int T) {
  const std::vector<UndeclaredCall> todo = undeclared_calls(model, B, T);
  if (todo.empty()) return todo;
  const int C = model.d_model(), V = std::max(1, model.config.vocab_size);
  std::vector<int32_t> tok(size_t(B) * T), tgt(size_t(B) * T);
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = int32_t(i * 7 % size_t(V)), tgt[i] = int32_t((i * 7 + 3) % size_t(V));
  const Batch batch{tok.data(), tgt.data(), B, T};
  std::vector<float> x(size_t(B) * T * size_t(C));
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.01f * float(i % 97) - 0.4f;
  Scratch scratch;
  std::vector<std::vector<ActivationDecl>> decls(model.units.size());
  for (const UndeclaredCall& u : todo) {
    Unit& unit = *model.units[size_t(u.unit)];
    auto& d = decls[size_t(u.unit)];
    if (d.empty())
      for (int c = 0; c < unit.num_calls(); ++c) d.push_back(unit.declare_activations(c, {B, T}));
    // Where the call runs in the schedule: the first position is the embedding (no input),
    // the last the loss.
    size_t pos = 0;
    for (size_t p = 0; p < model.schedule.size(); ++p)
      if (model.schedule[p].unit == u.unit && model.schedule[p].call == u.call) pos = p;
    size_t n = 0;
    for (const ParamSpec& sp : unit.params()) n += size_t(numel(sp.shape));
    std::vector<float> pm(n, 0.02f), gm(n, 0.f);
    std::vector<float*> ps, gs;
    n = 0;
    for (const ParamSpec& sp : unit.params()) {
      ps.push_back(pm.data() + n), gs.push_back(gm.data() + n);
      n += size_t(numel(sp.shape));
    }
    ActivationProbe pr;
    pr.ops = &ops_for(Device::cpu());
    pr.batch = &batch;
    pr.params = &ps;
    pr.grads = &gs;
    pr.x = pos > 0 ? x.data() : nullptr;
    pr.d_model = C;
    pr.loss_call = pos + 1 == model.schedule.size();
    pr.vocab = V;
    d[size_t(u.call)] = measure_activations(unit, u.call, pr, scratch);
    d[size_t(u.call)].known = true;
  }
  for (size_t u = 0; u < model.units.size(); ++u)
    if (!decls[u].empty())
      model.units[u] = std::make_unique<MeasuredDecl>(std::move(model.units[u]), BatchShape{B, T},
                                                      std::move(decls[u]));
  return todo;
}

PlanPrediction predict_plan(const PlanSetup& s, const HardwareProfile* hw) {
  return predict_plan(build_model(s.model, TensorSlice{0, s.tensor}), s, hw);
}

PlanPrediction predict_plan(Model model, const PlanSetup& s, const HardwareProfile* hw,
                            bool measure_unknown) {
  PlanPrediction r;
  if (measure_unknown)
    r.measured = measure_undeclared(model, s.micro_batch, s.model.seq_len);
  else if (const auto u = undeclared_calls(model, s.micro_batch, s.model.seq_len); !u.empty())
    fail("plan", undeclared_message(u));
  wrap_blocks(model, s.blocks_per_unit);
  ShardingPolicy policy = s.policy;
  resolve_group(policy, s.data_world());
  r.input = make_plan_input(model, policy, s.data_world());
  r.input.hosts = s.hosts;
  r.input.on_device = s.on_device;
  r.input.B = s.micro_batch;
  r.input.T = s.model.seq_len;
  r.input.accum = s.accum;
  declare_calls(r.input, model);
  r.plan = plan_step(r.input);
  const DevicePeak dp = device_peak(r.plan, tensor_local_config(s.model, s.tensor),
                                    s.micro_batch, s.model.seq_len, policy.mixed_precision, s.world,
                                    plan_threads(s.threads, s.world), s.on_device);
  r.peak = dp.plan;
  r.workspace = dp.workspace;
  r.workspace_what = dp.decl.what;
  r.device = dp.total;
  r.host = host_bytes(r.plan);
  r.nvme = r.plan.nvme_bytes;
  r.rss = predict_rss(r.plan, r.input, r.device, r.host, s, hw);
  if (hw) {
    const TimeInputs ti = time_inputs(model, r.input);
    r.time = predict_step_time(r.plan, r.input, ti, *hw);
    r.timed = true;
  }
  return r;
}

std::string Candidate::describe() const {
  std::string d = strategy_name(strategy);
  d += " bpu=" + std::to_string(blocks_per_unit);
  if (strategy == ShardingStrategy::FullShard || strategy == ShardingStrategy::ShardGradOp ||
      strategy == ShardingStrategy::HybridShard) {
    d += " pf=" + std::to_string(prefetch);
    if (max_live_units) d += " live=" + std::to_string(max_live_units);
  }
  d += std::string(" ckpt=") + checkpoint_mode_name(checkpoint);
  if (optimizer != OffloadDevice::None) {
    char r[16];
    std::snprintf(r, sizeof r, "%g", optimizer_ratio);
    d += std::string(" opt=") + offload_device_name(optimizer) + (optimizer == OffloadDevice::Cpu ? std::string(":") + r : "");
  }
  if (params != OffloadDevice::None) d += std::string(" param=") + offload_device_name(params);
  if (activations != OffloadDevice::None) d += std::string(" act=") + offload_device_name(activations);
  d += " mb=" + std::to_string(micro_batch) + "x" + std::to_string(accum);
  if (tensor > 1) d += " tp=" + std::to_string(tensor);
  return d;
}

PlanSetup apply_candidate(const PlanSetup& base, const Candidate& c, const SearchFree* free) {
  PlanSetup s = base;
  s.tensor = c.tensor;
  s.blocks_per_unit = c.blocks_per_unit;
  s.micro_batch = c.micro_batch;
  s.accum = c.accum;
  ShardingPolicy p = ShardingPolicy::for_strategy(c.strategy);
  p.shard_group_size = base.policy.strategy == ShardingStrategy::HybridShard ? base.policy.shard_group_size : 0;
  p.bucket_bytes = base.policy.bucket_bytes;
  p.mixed_precision = base.policy.mixed_precision;
  p.aio = base.policy.aio;
  p.forward_prefetch = p.backward_prefetch = c.prefetch;
  p.max_live_units = c.max_live_units;
  p.activation_checkpointing = ActivationCheckpointing{};
  p.activation_checkpointing.mode = c.checkpoint;
  const std::string nvme = !base.policy.offload_optimizer.nvme_path.empty() ? base.policy.offload_optimizer.nvme_path
                           : !base.policy.offload_param.nvme_path.empty()   ? base.policy.offload_param.nvme_path
                                                                            : base.policy.activation_checkpointing.nvme_path;
  p.activation_checkpointing.offload_cpu = c.activations == OffloadDevice::Cpu;
  p.activation_checkpointing.offload_nvme = c.activations == OffloadDevice::Nvme;
  if (c.activations == OffloadDevice::Nvme) p.activation_checkpointing.nvme_path = nvme;
  p.offload_optimizer.device = c.optimizer;
  p.offload_optimizer.ratio = c.optimizer == OffloadDevice::None ? 1.0 : c.optimizer_ratio;
  p.offload_optimizer.buffer_count = base.policy.offload_optimizer.buffer_count;
  if (c.optimizer == OffloadDevice::Nvme) p.offload_optimizer.nvme_path = nvme;
  p.offload_param.device = c.params;
  p.offload_param.buffer_count = base.policy.offload_param.buffer_count;
  if (c.params == OffloadDevice::Nvme) p.offload_param.nvme_path = nvme;
  if (free) {
    const ShardingPolicy& b = base.policy;
    if (!free->strategy) {
      p.strategy = b.strategy, p.reshard_after_forward = b.reshard_after_forward, p.accum = b.accum;
      p.shard_group_size = b.shard_group_size;
    }
    if (!free->prefetch) {
      p.forward_prefetch = b.forward_prefetch, p.backward_prefetch = b.backward_prefetch;
      p.max_live_units = b.max_live_units;
    }
    if (!free->checkpointing && !free->offload_activations)
      p.activation_checkpointing = b.activation_checkpointing;
    if (!free->offload_optimizer) p.offload_optimizer = b.offload_optimizer;
    if (!free->offload_param) p.offload_param = b.offload_param;
  }
  resolve_group(p, base.world);
  s.policy = p;
  return s;
}

TierUse tier_use(const Candidate& c) {
  TierUse t;
  for (OffloadDevice d : {c.optimizer, c.params, c.activations}) {
    t.nvme |= d == OffloadDevice::Nvme;
    t.host |= d == OffloadDevice::Cpu;
    t.offloaded += d != OffloadDevice::None;
  }
  return t;
}

std::string tie_rule(double noise) {
  char pct[32];
  std::snprintf(pct, sizeof pct, "%g%%", noise * 100);
  return std::string("among the plans that fit and whose predicted step is within ") + pct +
         " of the fastest (the prediction's noise), the one touching fewer tiers: no NVMe over "
         "NVMe, no host over host, then fewer offloaded things (optimizer, parameters, "
         "activations), then the faster";
}

int choose_plan(const std::vector<Evaluated>& ev, double noise) {
  int fastest = -1;
  for (size_t i = 0; i < ev.size(); ++i)
    if (ev[i].fits && (fastest < 0 || ev[i].time.step_s < ev[size_t(fastest)].time.step_s))
      fastest = int(i);
  if (fastest < 0) return -1;
  const double limit = ev[size_t(fastest)].time.step_s * (1.0 + noise);
  auto key = [](const Evaluated& e) {
    const TierUse t = tier_use(e.c);
    return std::make_tuple(t.nvme, t.host, t.offloaded, e.time.step_s, e.device);
  };
  int best = fastest;
  for (size_t i = 0; i < ev.size(); ++i)
    if (ev[i].fits && ev[i].time.step_s <= limit && key(ev[i]) < key(ev[size_t(best)]))
      best = int(i);
  return best;
}

std::string dominant_category(const Evaluated& e) {
  int64_t best = e.workspace;
  std::string name = "kernel workspace";
  for (size_t c = 0; c < e.at_peak.size(); ++c)
    if (e.at_peak[c] > best) best = e.at_peak[c], name = mem_name(static_cast<Mem>(c));
  return name + " " + format_bytes(size_t(best));
}

SearchResult search_plans(const PlanSetup& base_in, const SearchOptions& opt,
                          const HardwareProfile& hw) {
  const auto t0 = std::chrono::steady_clock::now();
  if (opt.budget <= 0) fail("plan", "the memory budget must be positive");
  PlanSetup base = base_in;
  // The nvme_path offload would use: the search's, else the base's (apply_candidate fills it in
  // wherever a candidate offloads to NVMe). Without one, NVMe candidates are evaluated (to say
  // what a path would allow) but never chosen.
  if (!opt.nvme_path.empty()) {
    base.policy.offload_optimizer.nvme_path = opt.nvme_path;
    base.policy.offload_param.nvme_path = opt.nvme_path;
    base.policy.activation_checkpointing.nvme_path = opt.nvme_path;
  }
  const bool nvme = !base.policy.offload_optimizer.nvme_path.empty() ||
                    !base.policy.offload_param.nvme_path.empty() ||
                    !base.policy.activation_checkpointing.nvme_path.empty();
  const int L = base.model.n_layer;
  // Tensor degrees: the configured one, or (SearchFree::tensor) every degree that divides the
  // world and the model's split dimensions. The global batch stays: a data-parallel rank of a
  // mesh with fewer of them takes proportionally more rows.
  std::vector<int> tensors = {std::max(1, base.tensor)};
  if (opt.free.tensor) {
    tensors.clear();
    for (int t = 1; t <= base.world; ++t) {
      if (base.world % t != 0) continue;
      try {
        (void)build_model(base.model, TensorSlice{0, t});
      } catch (const Error&) {
        continue;  // t does not divide the heads, d_ff, the vocabulary or seq_len
      }
      tensors.push_back(t);
    }
  }
  const int64_t global_rows =
      int64_t{base.micro_batch} * base.accum * (base.world / std::max(1, base.tensor));

  const SearchFree& fr = opt.free;
  const ShardingPolicy& bp = base.policy;
  std::vector<int> bpus;
  for (int b : {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48})
    if (b <= L && (b == 1 || L % b == 0)) bpus.push_back(b);
  if (!fr.blocks) bpus = {std::max(1, base.blocks_per_unit)};
  struct Opt { OffloadDevice d; double r; };
  std::vector<Opt> opts = {{OffloadDevice::None, 1.0}, {OffloadDevice::Cpu, 0.5}, {OffloadDevice::Cpu, 1.0}};
  opts.push_back({OffloadDevice::Nvme, 1.0});
  if (!fr.offload_optimizer) opts = {{bp.offload_optimizer.device, bp.offload_optimizer.ratio}};
  std::vector<OffloadDevice> acts = {OffloadDevice::None, OffloadDevice::Cpu, OffloadDevice::Nvme};
  if (!fr.offload_activations)
    acts = {bp.activation_checkpointing.offload_nvme  ? OffloadDevice::Nvme
            : bp.activation_checkpointing.offload_cpu ? OffloadDevice::Cpu
                                                      : OffloadDevice::None};
  std::vector<CheckpointMode> ckpts = {CheckpointMode::Off, CheckpointMode::Selective,
                                       CheckpointMode::Full};
  if (!fr.checkpointing) ckpts = {bp.activation_checkpointing.mode};

  SearchResult res;
  std::vector<Evaluated> all;
  bool have_smallest = false;
  for (int tp : tensors) {
  const int W = base.world / tp;  // the data-parallel ranks
  if (global_rows % W != 0) continue;
  const int G = static_cast<int>(global_rows / W);  // a data-parallel rank's rows, fixed
  std::vector<int> mbs;
  for (int m = 1; m <= G; ++m)
    if (G % m == 0) mbs.push_back(m);
  if (!fr.micro_batch) mbs = {G % base.micro_batch == 0 ? base.micro_batch : G};
  std::vector<ShardingStrategy> strategies;
  if (!fr.strategy)
    strategies = {bp.strategy};
  else if (base.policy.strategy == ShardingStrategy::HybridShard)
    strategies = {ShardingStrategy::HybridShard};
  else if (W == 1)
    strategies = {ShardingStrategy::FullShard};  // one rank: every strategy keeps whole units
  else
    strategies = {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp,
                  ShardingStrategy::ShardOptimizer, ShardingStrategy::NoShard};
  for (int bpu : bpus) {
    Wrapped w{build_model(base.model, TensorSlice{0, tp}), {}, {}};
    wrap_blocks(w.model, bpu);
    for (ShardingStrategy st : strategies) {
      const bool sharded = st == ShardingStrategy::FullShard || st == ShardingStrategy::ShardGradOp ||
                           st == ShardingStrategy::HybridShard;
      std::vector<OffloadDevice> params = {OffloadDevice::None};
      if (sharded || W == 1) params.push_back(OffloadDevice::Cpu);
      if ((sharded || W == 1) && tp == 1) params.push_back(OffloadDevice::Nvme);  // (not with t)
      if (!fr.offload_param) params = {bp.offload_param.device};
      std::vector<std::pair<int, int>> pfs = {{1, 0}};
      if (sharded && W > 1) pfs = {{1, 0}, {2, 0}, {0, 0}};
      if (!fr.prefetch) pfs = {{bp.forward_prefetch, bp.max_live_units}};
      for (OffloadDevice pd : params)
        for (const Opt& o : opts)
          for (OffloadDevice ad : acts)
            for (CheckpointMode ck : ckpts)
              for (auto [pf, live] : pfs)
                for (int mb : mbs) {
                  Candidate c;
                  c.blocks_per_unit = bpu;
                  c.strategy = st;
                  c.prefetch = pf;
                  c.max_live_units = live;
                  c.checkpoint = ck;
                  c.optimizer = o.d;
                  c.optimizer_ratio = o.r;
                  c.params = pd;
                  c.activations = ad;
                  c.micro_batch = mb;
                  c.accum = G / mb;
                  c.tensor = tp;
                  // NVMe parameters at one rank take the sharded path (a group of one).
                  const PlanSetup s = apply_candidate(base, c, &fr);
                  Evaluated e = evaluate(w, s, c, hw);
                  ++res.evaluated;
                  e.needs_nvme_path = !nvme && tier_use(c).nvme;
                  const bool host_ok = opt.host_budget <= 0 || e.host <= opt.host_budget;
                  const bool nvme_ok = opt.nvme_budget <= 0 || e.nvme <= opt.nvme_budget;
                  if (host_ok && nvme_ok && !e.needs_nvme_path &&
                      (!have_smallest || e.device < res.smallest.device ||
                       (e.device == res.smallest.device &&
                        e.time.step_s < res.smallest.time.step_s))) {
                    res.smallest = e;
                    have_smallest = true;
                  }
                  e.fits = host_ok && nvme_ok &&
                           double(e.device) <= double(opt.budget) * (1.0 - opt.margin);
                  all.push_back(std::move(e));
                }
    }
  }
  }
  // What the rule would choose if an NVMe directory were given (all fitting plans), then the
  // choice among the usable ones.
  if (const int with = choose_plan(all, opt.noise);
      with >= 0 && all[size_t(with)].needs_nvme_path) {
    res.nvme_would_help = true;
    res.with_nvme = all[size_t(with)];
  }
  for (Evaluated& e : all) e.fits = e.fits && !e.needs_nvme_path;
  if (!have_smallest) {  // every plan needs more host or NVMe memory than allowed
    int64_t host = INT64_MAX, nv = INT64_MAX;
    for (const Evaluated& e : all)
      if (!e.needs_nvme_path) host = std::min(host, e.host), nv = std::min(nv, e.nvme);
    fail("plan", "no plan keeps within the host budget (" +
                     (opt.host_budget > 0 ? format_bytes(size_t(opt.host_budget)) : std::string("none")) +
                     ") and the NVMe budget (" +
                     (opt.nvme_budget > 0 ? format_bytes(size_t(opt.nvme_budget)) : std::string("none")) +
                     "); the least any plan needs is " + format_bytes(size_t(host)) + " host, " +
                     format_bytes(size_t(nv)) + " NVMe");
  }
  // Pareto frontier over (device memory, step time) among plans within the host/NVMe budgets.
  std::vector<const Evaluated*> ok;
  for (const Evaluated& e : all)
    if ((opt.host_budget <= 0 || e.host <= opt.host_budget) &&
        (opt.nvme_budget <= 0 || e.nvme <= opt.nvme_budget) && !e.needs_nvme_path)
      ok.push_back(&e);
  std::sort(ok.begin(), ok.end(), [](const Evaluated* a, const Evaluated* b) {
    return a->device != b->device ? a->device < b->device : a->time.step_s < b->time.step_s;
  });
  double best_t = 1e300;
  for (const Evaluated* e : ok)
    if (e->time.step_s < best_t * (1 - 1e-9)) {
      res.frontier.push_back(*e);
      best_t = e->time.step_s;
    }
  // The fastest that fits (the last frontier point within the budget), and the plan the
  // tie-break chooses: put on the frontier where it is not (slower by less than the noise and
  // larger than a frontier point).
  for (size_t i = 0; i < res.frontier.size(); ++i)
    if (res.frontier[i].fits) res.best = static_cast<int>(i);
  if (const int chosen = choose_plan(all, opt.noise); chosen >= 0) {
    res.fastest = res.frontier[size_t(res.best)];
    const Evaluated& c = all[size_t(chosen)];
    auto same = [&](const Evaluated& e) { return e.c.describe() == c.c.describe(); };
    auto at = std::find_if(res.frontier.begin(), res.frontier.end(), same);
    if (at == res.frontier.end()) {
      at = std::find_if(res.frontier.begin(), res.frontier.end(), [&](const Evaluated& e) {
        return e.device > c.device || (e.device == c.device && e.time.step_s > c.time.step_s);
      });
      at = res.frontier.insert(at, c);
    }
    res.best = static_cast<int>(at - res.frontier.begin());
    res.chosen_setup = apply_candidate(base, c.c, &fr);
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace sw
