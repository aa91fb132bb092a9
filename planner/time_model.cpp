#include "planner/time_model.h"

#include <algorithm>
#include <array>

#include "core/error.h"
#include "sharding/comm/group.h"

namespace sw {

namespace {

bool ends_with(const std::string& s, const std::string& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

CostOp gemm(int64_t m, int64_t n, int64_t k, bool ta, bool tb) {
  CostOp o;
  o.ta = ta, o.tb = tb;
  o.kind = CostOp::Gemm;
  o.m = m, o.n = n, o.k = k;
  o.flops = 2.0 * double(m) * double(n) * double(k);
  return o;
}
CostOp elementwise(double bytes) {
  CostOp o;
  o.kind = CostOp::Elementwise;
  o.bytes = bytes;
  return o;
}
CostOp flops_op(CostOp::Kind k, double flops) {
  CostOp o;
  o.kind = k;
  o.flops = flops;
  return o;
}

double op_seconds(const CostOp& o, DType dt, const HardwareProfile& hw) {
  switch (o.kind) {
    case CostOp::Gemm: return o.flops / hw.gemm_rate(o.m, o.n, o.k, dt, o.ta, o.tb);
    case CostOp::Attention: return o.flops / hw.attention_rate(dt);
    case CostOp::LmHead: return o.flops / hw.lmhead_rate(dt);
    case CostOp::Elementwise: return o.bytes / hw.elementwise_bps;
  }
  return 0;
}

double ops_seconds(const std::vector<CostOp>& ops, DType dt, const HardwareProfile& hw) {
  double s = 0;
  for (const CostOp& o : ops) s += op_seconds(o, dt, hw);
  return s;
}

double ops_flops(const std::vector<CostOp>& ops) {
  double f = 0;
  for (const CostOp& o : ops) f += o.flops;
  return f;
}

// Ring collective over n ranks: latency + bus bytes / busbw.
double coll_seconds(const CollectiveFit& f, double bytes, int n, bool all_reduce) {
  if (n <= 1) return 0;
  const double bus = bytes * (n - 1) / n * (all_reduce ? 2.0 : 1.0);
  return f.latency_s + bus / f.busbw;
}

// The same over a group spanning `hosts` hosts: the algorithm Auto picks for it, costed with
// the fit inside a host and the profile's across-host link (comm_algo_seconds).
double coll_seconds(const HardwareProfile& hw, const CollectiveFit& f, CollKind kind, double bytes,
                    int n, int hosts) {
  if (hosts <= 1 || hw.across_busbw <= 0) return coll_seconds(f, bytes, n, kind == CollKind::AllReduce);
  return comm_algo_seconds(CommAlgo::Auto, kind, bytes, n, hosts, {f.latency_s, f.busbw},
                           {hw.across_latency_s, hw.across_busbw});
}

// Hosts a group of n ranks spans, W ranks on `hosts` hosts (ranks per host consecutive):
// `stride` 1: n consecutive ranks (a shard group); stride n' > 1: every stride-th rank.
int group_hosts(int W, int hosts, int n, int stride) {
  if (hosts <= 1 || n <= 1) return 1;
  const int per = std::max(1, W / hosts);
  if (stride <= 1) return std::max(1, std::min(hosts, n / per));
  return stride >= per ? std::min(hosts, n) : hosts;
}

// A unit's shard over the host link (its parameters offloaded to the host tier, on a machine
// whose profile has one).
double host_link_seconds(const Action& a, const StepPlan& plan, const PlanInput& in,
                         const HardwareProfile& hw, size_t elem) {
  if (!hw.has_host || a.unit < 0) return 0;
  const PlanUnit& u = in.units[size_t(a.unit)];
  if (!u.params_offloaded || u.params_nvme) return 0;
  return double(u.padded / std::max(1, plan.S)) * double(elem) / hw.host_link_bps;
}

}  // namespace

TimeInputs time_inputs(const Model& model, const PlanInput& in) {
  TimeInputs ti;
  ti.hosts = in.hosts, ti.replicas = in.replicas;
  ti.compute = in.policy.mixed_precision.param_dtype;
  ti.act_offload_nvme = in.policy.activation_checkpointing.offload_nvme;
  for (const PlanUnit& u : in.units) ti.grad_shard_floats += u.padded / in.S;
  const ModelConfig& mc = model.config;
  const int64_t B = in.B, T = in.T, C = model.d_model(), N = B * T;
  // Tensor parallelism: norms and residual adds run on N / t rows, attention over H / t heads
  // (the products' shapes are the units' local ones), the LM head over V / t columns.
  const int t = std::max(1, model.tensor.size);
  const double act = 4.0 * double(N) * double(C) / t;
  const int64_t H = std::max(1, mc.n_head / t);
  const int64_t hd = C / std::max(1, mc.n_head);
  const int P = static_cast<int>(model.schedule.size());
  ti.calls.resize(size_t(P));
  for (int p = 0; p < P; ++p) {
    CallCost& cc = ti.calls[size_t(p)];
    const Unit& unit = *model.units[size_t(model.schedule[size_t(p)].unit)];
    const CallMemory* cm =
        p < static_cast<int>(in.calls.size()) && in.calls[size_t(p)].known ? &in.calls[size_t(p)] : nullptr;
    const bool embed = in.takes_input.size() == size_t(P) ? !in.takes_input[size_t(p)] : p == 0;
    const bool loss = in.is_loss.size() == size_t(P) ? in.is_loss[size_t(p)] != 0 : p + 1 == P;
    if (embed) {  // embedding: a row copy in, a scatter-add back
      cc.fwd = {elementwise(2 * act)};
      cc.bwd = {elementwise(2 * act)};
      cc.recompute = cc.fwd;
      continue;
    }
    if (loss) {  // the loss: norm + fused LM head with its gradients (3 products; with
                       // tensor parallelism 4: its statistics pass, then the gradients' pass)
      const double V = double(mc.vocab_size) / t;
      cc.fwd = {elementwise(3 * act),
                flops_op(CostOp::LmHead, (t > 1 ? 8.0 : 6.0) * double(N) * V * double(C))};
      cc.bwd = {elementwise(4 * act)};
      cc.recompute = cc.fwd;
      continue;
    }
    int blocks = 0;
    for (const ParamSpec& s : unit.params()) {
      if (ends_with(s.name, "attn.c_attn.weight") || ends_with(s.name, "self_attn.q_proj.weight"))
        ++blocks;
      if (s.shape.size() != 2) continue;
      const int64_t OC = s.shape[0], IC = s.shape[1];
      cc.fwd.push_back(gemm(N, OC, IC, false, true));       // y = x W^T
      cc.bwd.push_back(gemm(N, IC, OC, false, false));       // dx = dy W
      cc.bwd.push_back(gemm(OC, IC, N, true, false));       // dW = dy^T x
      cc.bwd_weight.push_back(cc.bwd.back());
    }
    // Causal attention: Q K^T and P V over half the (T, T) scores: 2 * B * H * T^2 * hd flops;
    // backward recomputes the scores and forms dV, dP, dQ, dK: 2.5 times that.
    const double att = 2.0 * double(B) * double(H) * double(T) * double(T) * double(hd);
    for (int b = 0; b < blocks; ++b) {
      cc.fwd.push_back(flops_op(CostOp::Attention, att));
      cc.bwd.push_back(flops_op(CostOp::Attention, 2.5 * att));
    }
    cc.recompute = cc.fwd;
    const double saved = cm ? double(cm->saved) : 8.0 * act * std::max(1, blocks);
    const double cheap = cm ? double(cm->saved_cheap) : 3.0 * act * std::max(1, blocks);
    cc.fwd.push_back(elementwise(saved + 2 * act));
    cc.recompute.push_back(elementwise(saved + 2 * act));
    cc.bwd.push_back(elementwise(2 * saved + 3 * act));
    cc.cheap_bytes = 2 * cheap + act;
  }
  return ti;
}

double action_seconds(const Action& a, const StepPlan& plan, const PlanInput& in,
                      const TimeInputs& ti, const HardwareProfile& hw) {
  const DType dt = ti.compute;
  auto call = [&](int pos) -> const CallCost* {
    return pos >= 0 && pos < static_cast<int>(ti.calls.size()) ? &ti.calls[size_t(pos)] : nullptr;
  };
  switch (a.kind) {
    case ActionKind::Forward:
      if (const CallCost* c = call(a.pos)) return ops_seconds(c->fwd, dt, hw);
      return 0;
    case ActionKind::Backward:  // (zero bubble's deferred: without the weight gradients)
      if (const CallCost* c = call(a.pos))
        return ops_seconds(c->bwd, dt, hw) - (a.defer ? ops_seconds(c->bwd_weight, dt, hw) : 0.0);
      return 0;
    case ActionKind::BackwardWeight: {  // the chunk's deferred weight gradients
      double s = 0;
      if (a.chunk >= 0 && size_t(a.chunk) + 1 < in.pipe.chunk_begin.size())
        for (int p = in.pipe.chunk_begin[size_t(a.chunk)]; p < in.pipe.chunk_begin[size_t(a.chunk) + 1]; ++p)
          if (const CallCost* c = call(p)) s += ops_seconds(c->bwd_weight, dt, hw);
      return s;
    }
    case ActionKind::SendActs:
    case ActionKind::SendGrads:
      return hw.p2p_seconds(double(a.bytes));
    case ActionKind::SyncShared:  // the shared unit's gradient shard summed over its 2 holders
      return coll_seconds(hw.all_reduce, double(a.bytes), 2, true);
    case ActionKind::Recompute:
      if (const CallCost* c = call(a.pos))
        return a.mode == CheckpointMode::Full ? ops_seconds(c->recompute, dt, hw)
                                              : c->cheap_bytes / hw.elementwise_bps;
      return 0;
    case ActionKind::OptimizerUpdate: {
      // (A plan made by hand may name no unit: then only its [lo, hi) counts, on the device.)
      if (a.unit < 0 || a.unit >= static_cast<int>(in.units.size()))
        return a.hi >= 0 ? double(a.hi - a.lo) / hw.optimizer_fps : 0.0;
      const PlanUnit& u = in.units[size_t(a.unit)];
      const int64_t floats = a.hi >= 0 ? a.hi - a.lo : u.padded / in.S;
      if (hw.has_host && ((u.optimizer_offloaded && !u.optimizer_nvme) ||
                          (u.params_offloaded && !u.params_nvme))) {
        // The host's AdamW; with only the moments on the host, the gradient shard goes down
        // and the updated master comes back over the link.
        const double link = u.params_offloaded ? 0.0 : 8.0 * double(floats) / hw.host_link_bps;
        return double(floats) / hw.host_optimizer_fps + link;
      }
      return double(floats) / hw.optimizer_fps;
    }
    case ActionKind::RoundGrads:  // a no-op unless gradients are reduced in bf16 / fp16
      if (in.policy.mixed_precision.reduce_dtype == DType::F32) return 0;
      return 2.0 * 4.0 * double(in.units[size_t(a.unit)].padded) / hw.elementwise_bps;
    case ActionKind::Gather:
    case ActionKind::Regather: {
      // Parameters on the host tier of a GPU machine: the shard crosses the link first.
      const double up = host_link_seconds(a, plan, in, hw, dtype_size(in.policy.mixed_precision.param_dtype));
      if (plan.S <= 1) return up + double(a.bytes) / hw.copy_bps();
      return up + coll_seconds(hw, hw.all_gather, CollKind::AllGather, double(a.bytes), plan.S,
                               group_hosts(plan.W * ti.replicas, ti.hosts, plan.S, 1));
    }
    case ActionKind::ReduceScatter: {
      const double down = host_link_seconds(a, plan, in, hw, 4);
      if (plan.S <= 1) return down;
      return down + coll_seconds(hw, hw.reduce_scatter, CollKind::ReduceScatter, double(a.bytes),
                                 plan.S, group_hosts(plan.W * ti.replicas, ti.hosts, plan.S, 1));
    }
    case ActionKind::AllReduce: {
      const int n = plan.kind == UnitKind::Whole ? plan.W : plan.R;
      return coll_seconds(hw, hw.all_reduce, CollKind::AllReduce, double(a.bytes), n,
                          group_hosts(plan.W, ti.hosts, n, plan.kind == UnitKind::Whole ? 1 : plan.S));
    }
    case ActionKind::OuterReduce:  // local SGD: the pseudo-gradient shard over the replica groups
      return coll_seconds(hw, hw.all_reduce, CollKind::AllReduce, double(a.bytes), ti.replicas,
                          group_hosts(plan.W * ti.replicas, ti.hosts, ti.replicas, plan.W));
    case ActionKind::FetchState:
    case ActionKind::EvictState:
    case ActionKind::FetchActs:
    case ActionKind::EvictActs: {
      const bool disk = a.io != 0 || ti.act_offload_nvme;
      if (!disk) return double(a.bytes) / (hw.has_host ? hw.host_link_bps : hw.copy_bps());
      const bool read = a.kind == ActionKind::FetchState || a.kind == ActionKind::FetchActs;
      return hw.disk_latency_s + double(a.bytes) / (read ? hw.disk_read_bps : hw.disk_write_bps);
    }
    // Tensor parallelism: the tensor group's collectives (one host per group so far).
    case ActionKind::TpGatherRows:
    case ActionKind::TpAllGather:
      return coll_seconds(hw.all_gather, double(a.bytes), in.tensor, false);
    case ActionKind::TpScatterRows:
      return coll_seconds(hw.reduce_scatter, double(a.bytes), in.tensor, false);
    case ActionKind::TpReduceGrads:
      return coll_seconds(hw.all_reduce, double(a.bytes), in.tensor, true);
    default:
      return 0;
  }
}

StepTime predict_step_time(const StepPlan& plan, const PlanInput& in, const TimeInputs& ti,
                           const HardwareProfile& hw, const std::vector<double>* arrive) {
  const bool comm = plan.W > 1;
  if (comm && !hw.has_collectives)
    fail("hardware", "the profile '" + (hw.name.empty() ? std::string("?") : hw.name) +
                         "' has no collectives (calibrated at one rank): calibrate under mpirun "
                         "with several ranks, or give --hardware with a 'collectives' block");
  const size_t n = plan.actions.size();
  std::vector<double> dur(n);
  for (size_t i = 0; i < n; ++i) dur[i] = action_seconds(plan.actions[i], plan, in, ti, hw);
  constexpr int kC = static_cast<int>(Queue::Compute), kG = static_cast<int>(Queue::Gather),
                kR = static_cast<int>(Queue::Reduce), kI = static_cast<int>(Queue::IO),
                kP = static_cast<int>(Queue::P2P);
  constexpr size_t kQ = static_cast<size_t>(Queue::Count);
  auto arrived = [&](size_t i) {
    return arrive && i < arrive->size() ? std::max(0.0, (*arrive)[i]) : 0.0;
  };
  auto queue_of = [&](const Action& a) {
    int q = static_cast<int>(a.queue);
    // Activation offload to the host tier copies on the compute thread (CPU backend).
    // (A GPU machine's profile has a host link: a copy stream, the io queue.)
    if (q == kI && a.io == 0 && a.pos >= 0 && !ti.act_offload_nvme && !hw.has_host) q = kC;
    if (q == kR && !hw.separate_streams) q = kG;  // one communication thread per group
    return q;
  };
  StepTime st;
  double carry_done = 0;
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<double> fin(n, 0), posted(n, -1);
    std::array<double, kQ> qfree{}, busy{};
    double host = 0, idle_comm = 0, idle_io = 0, idle_p2p = 0, tensor = 0;
    for (size_t i = 0; i < n; ++i) {
      const Action& a = plan.actions[i];
      double ready = 0;
      int cause = -1;  // the queue whose action finished last
      for (int w : a.waits) {
        const ActionKind wk = plan.actions[size_t(w)].kind;
        // (a pipeline's sends never block the stage: their buffers linger, PipeStage)
        if (wk == ActionKind::SendActs || wk == ActionKind::SendGrads) continue;
        if (fin[size_t(w)] >= ready) ready = fin[size_t(w)], cause = queue_of(plan.actions[size_t(w)]);
      }
      if (a.kind == ActionKind::WaitGather && a.waits.empty() && carry_done > ready)
        ready = carry_done, cause = kG;
      if (a.queue == Queue::Tensor) {
        // The compute thread waits for each tensor collective (it runs inside a call, or
        // before a reduction): all of it is exposed.
        const double start = std::max(host, ready);
        host = start + dur[i];
        fin[i] = host;
        idle_comm += dur[i];
        tensor += dur[i];
        continue;
      }
      if (a.kind == ActionKind::RecvActs || a.kind == ActionKind::RecvGrads) {
        // Posted at issue (its begin); done when the neighbour's send has arrived.
        fin[i] = std::max({host, ready, arrived(i)});
        posted[i] = host;
        continue;
      }
      if (a.kind == ActionKind::SyncShared) {  // the compute thread waits for it and its peer
        const double start = std::max({host, ready, arrived(i)});
        idle_p2p += start - host;
        host = start + dur[i];
        fin[i] = host;
        idle_comm += dur[i];
        tensor += dur[i];
        continue;
      }
      const int q = queue_of(a);
      if (q == kC) {
        const double start = std::max(host, ready);
        if (start > host)
          (cause == kI ? idle_io : cause == kP ? idle_p2p : idle_comm) += start - host;
        host = start + dur[i];
        fin[i] = host;
      } else {
        const double start = std::max({host, qfree[size_t(q)], ready});
        fin[i] = start + dur[i];
        qfree[size_t(q)] = fin[i];
      }
      busy[size_t(q)] += dur[i];
    }
    st.begin.resize(n);
    st.end = fin;
    for (size_t i = 0; i < n; ++i) st.begin[i] = posted[i] >= 0 ? posted[i] : fin[i] - dur[i];
    // Gathers still in flight when the step ends (the optimizer's prefetch of the next step's
    // first units, stage 1's regathers) finish this much into the next step.
    carry_done = std::max(0.0, qfree[size_t(kG)] - host);
    if (pass == 1 || carry_done == 0) {
      st.compute_s = busy[size_t(kC)];
      st.comm_s = busy[size_t(kG)] + busy[size_t(kR)] + busy[size_t(kP)] + tensor;
      st.io_s = busy[size_t(kI)];
      st.exposed_comm_s = idle_comm;
      st.exposed_io_s = idle_io;
      st.exposed_p2p_s = idle_p2p;
      break;
    }
  }
  // The trainer's step around the plan: the gradient norm (a pass over the gradient shards, an
  // all-gather of one double) and the loss summed over ranks.
  st.compute_s += 4.0 * double(ti.grad_shard_floats) / hw.elementwise_bps;
  if (comm) st.exposed_comm_s += 2 * hw.all_gather.latency_s;
  st.step_s = st.compute_s + st.exposed_comm_s + st.exposed_io_s + st.exposed_p2p_s;
  for (const Action& a : plan.actions) {
    const CallCost* c = a.pos >= 0 && a.pos < static_cast<int>(ti.calls.size()) ? &ti.calls[size_t(a.pos)] : nullptr;
    if (!c) continue;
    if (a.kind == ActionKind::Forward) st.flops += ops_flops(c->fwd);
    if (a.kind == ActionKind::Backward) st.flops += ops_flops(c->bwd);
    if (a.kind == ActionKind::Recompute && a.mode == CheckpointMode::Full) st.flops += ops_flops(c->recompute);
  }
  return st;
}

}  // namespace sw
