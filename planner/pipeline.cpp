// Pipeline parallelism in the planner (pipeline.h).
#include "planner/pipeline.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "core/error.h"
#include "kernels/ops.h"
#include "kernels/threads.h"
#include "sharding/deferred_wgrad.h"
#include "sharding/pipeline_schedule.h"
#include "sharding/wrap.h"

namespace sw {

std::vector<int> balanced_stage_bounds(const Model& whole, int B, int T, int stages) {
  const int P = static_cast<int>(whole.schedule.size());
  if (stages > P)
    fail("pipeline", std::to_string(stages) + " stages need as many schedule positions; the model has " +
                         std::to_string(P));
  PlanInput in = make_plan_input(whole, ShardingPolicy{}, 1);
  in.B = B, in.T = T;
  declare_calls(in, whole);
  const TimeInputs ti = time_inputs(whole, in);
  std::vector<double> cost(size_t(P), 0.0);
  for (int p = 0; p < P; ++p) {
    for (const CostOp& o : ti.calls[size_t(p)].fwd) cost[size_t(p)] += o.flops;
    for (const CostOp& o : ti.calls[size_t(p)].bwd) cost[size_t(p)] += o.flops;
  }
  return balance_stages(cost, stages);
}

std::vector<int> stage_bounds(const Model& whole, const PlanSetup& s) {
  const int S = s.pipeline * s.pipe_chunks;
  const int P = static_cast<int>(whole.schedule.size());
  if (s.split_points.empty()) return balanced_stage_bounds(whole, s.micro_batch, s.model.seq_len, S);
  std::vector<int> b{0};
  for (int x : s.split_points) b.push_back(x);
  b.push_back(P);
  if (static_cast<int>(b.size()) != S + 1)
    fail("config", "parallelism.pipeline_parallel_split_points: " +
                       std::to_string(s.split_points.size()) + " points for " + std::to_string(S) +
                       " stages (need " + std::to_string(S - 1) + ")");
  for (size_t i = 1; i < b.size(); ++i)
    if (b[i] <= b[i - 1])
      fail("config", "parallelism.pipeline_parallel_split_points: position " + std::to_string(b[i]) +
                         " is not after " + std::to_string(b[i - 1]) + " (the model has " +
                         std::to_string(P) + " schedule positions)");
  return b;
}

std::vector<int64_t> measure_deferred(const Model& model, int B, int T, DType compute) {
  const size_t P = model.schedule.size();
  std::vector<int64_t> out(P, 0);
  if (model.tensor.size > 1) return out;  // (a tensor rank's units need their group: not counted)
  const int T0 = std::max(1, std::min(T, 32));
  const double scale = double(B) * double(T) / double(T0);
  const Ops& ops = ops_for(Device::cpu(), compute);
  const int C = model.residual_width(), V = std::max(1, model.config.vocab_size);
  std::vector<int32_t> tok(static_cast<size_t>(T0)), tgt(static_cast<size_t>(T0));
  for (size_t i = 0; i < tok.size(); ++i)
    tok[i] = int32_t(i * 7 % size_t(V)), tgt[i] = int32_t((i * 7 + 3) % size_t(V));
  const Batch batch{tok.data(), tgt.data(), 1, T0};
  const size_t n = size_t(T0) * size_t(C);
  std::vector<float> x(n), y(n), dy(n, 1e-3f), dx(n);
  for (size_t i = 0; i < n; ++i) x[i] = 0.01f * float(i % 97) - 0.4f;
  std::map<std::string, int64_t> seen;  // per kind of call: bytes at T0 rows
  Scratch scratch;
  for (size_t p = 0; p < P; ++p) {
    if (!model.takes_input(p) || model.is_loss(p)) continue;
    const Call& c = model.schedule[p];
    Unit& unit = *model.units[size_t(c.unit)];
    const std::vector<ParamSpec> specs = unit.params();
    std::string key = std::to_string(c.call);
    size_t count = 0;
    for (const ParamSpec& sp : specs) {
      key += "|";
      for (int64_t d : sp.shape) key += std::to_string(d) + "x";
      count += size_t(numel(sp.shape));
    }
    auto it = seen.find(key);
    if (it == seen.end()) {
      std::vector<float> pm(count, 0.02f), gm(count, 0.f);
      std::vector<float*> ps, gs;
      size_t off = 0;
      for (const ParamSpec& sp : specs) {
        ps.push_back(pm.data() + off), gs.push_back(gm.data() + off);
        off += size_t(numel(sp.shape));
      }
      Saved saved;
      UnitCtx ctx;
      ctx.ops = &ops;
      ctx.batch = &batch;
      ctx.params = &ps;
      ctx.grads = &gs;
      ctx.saved = &saved;
      ctx.scratch = &scratch;
      ctx.training = true;
      scratch.reset();
      unit.forward(ctx, c.call, x.data(), y.data());
      DeferredWeightGrads dw(ops);
      dw.begin(0);
      ctx.ops = &dw.ops();
      scratch.reset();
      unit.backward(ctx, c.call, x.data(), dy.data(), dx.data());
      dw.end();
      const int64_t bytes = dw.pending_bytes();
      dw.clear();
      saved.clear();
      scratch.reset();
      it = seen.emplace(key, bytes).first;
    }
    out[p] = static_cast<int64_t>(std::llround(double(it->second) * scale));
  }
  return out;
}

namespace {

// Matching key of a pipeline message: direction (0 activations, 1 gradients), the receiving
// global stage and the micro-batch.
int64_t msg_key(int dir, int stage, int micro) { return (int64_t(dir) * 4096 + stage) * 65536 + micro; }

// Sends never block a stage (sharding/pipe_stage.h): a send's buffer is freed at the first
// wait_p2p that sees it complete, and it completes only once the peer has received it. The
// plan frees it at the wait_p2p after the next op; the latest a stage can be sure of it is when
// a message the peer sent after consuming it arrives. This moves each send's free to the
// wait_p2p that completes the first receive from the peer which the peer sent after the op that
// consumed the message (else to the segment's end): the peak with every send lingering as long
// as it may (measured runs lie between the two; bench/plan_vs_measured_pipeline.sh).
void linger_sends(std::vector<StepPlan*>& plans) {
  const int P = static_cast<int>(plans.size());
  constexpr size_t kAct = static_cast<size_t>(Mem::Activations);
  struct Msg {
    int rank = -1, send = -1, recv_rank = -1, recv = -1;
  };
  std::map<int64_t, Msg> msgs;  // by msg_key
  for (int r = 0; r < P; ++r)
    for (size_t i = 0; i < plans[size_t(r)]->actions.size(); ++i) {
      const Action& a = plans[size_t(r)]->actions[i];
      const int g = a.chunk * P + r;
      if (a.kind == ActionKind::SendActs) msgs[msg_key(0, g + 1, a.micro)].rank = r, msgs[msg_key(0, g + 1, a.micro)].send = int(i);
      if (a.kind == ActionKind::SendGrads) msgs[msg_key(1, g - 1, a.micro)].rank = r, msgs[msg_key(1, g - 1, a.micro)].send = int(i);
      if (a.kind == ActionKind::RecvActs) msgs[msg_key(0, g, a.micro)].recv_rank = r, msgs[msg_key(0, g, a.micro)].recv = int(i);
      if (a.kind == ActionKind::RecvGrads) msgs[msg_key(1, g, a.micro)].recv_rank = r, msgs[msg_key(1, g, a.micro)].recv = int(i);
    }
  // Per rank: where each receive is waited for; per (rank, action) the message it belongs to.
  std::vector<std::map<int, int>> waited(static_cast<size_t>(P));   // recv index -> wait_p2p index
  std::vector<std::map<int, int>> freed(static_cast<size_t>(P));    // send index -> wait_p2p freeing it
  for (int r = 0; r < P; ++r) {
    const StepPlan& pl = *plans[size_t(r)];
    for (size_t i = 0; i < pl.actions.size(); ++i) {
      const Action& a = pl.actions[i];
      if (a.kind != ActionKind::WaitP2P) continue;
      for (int w : a.waits) {
        const ActionKind k = pl.actions[size_t(w)].kind;
        if (k == ActionKind::RecvActs || k == ActionKind::RecvGrads) waited[size_t(r)].emplace(w, int(i));
        if (k == ActionKind::SendActs || k == ActionKind::SendGrads) freed[size_t(r)].emplace(w, int(i));
      }
    }
  }
  std::map<std::pair<int, int>, const Msg*> by_send;  // (rank, send index)
  for (auto& [k, m] : msgs) by_send[{m.rank, m.send}] = &m;
  std::vector<std::map<int, int64_t>> moves(static_cast<size_t>(P));  // rank: action -> bytes freed there
  for (auto& [k, m] : msgs) {
    (void)k;
    StepPlan& pl = *plans[size_t(m.rank)];
    auto f = freed[size_t(m.rank)].find(m.send);
    if (f == freed[size_t(m.rank)].end()) continue;
    // The peer posted its receive (one op ahead of the op that reads it); the first message it
    // sent back after that.
    const StepPlan& peer = *plans[size_t(m.recv_rank)];
    int until = -1;
    if (m.recv >= 0)
      for (size_t j = size_t(m.recv) + 1; j < peer.actions.size() && until < 0; ++j) {
        auto b = by_send.find({m.recv_rank, int(j)});
        if (b == by_send.end() || b->second->recv_rank != m.rank) continue;
        auto w = waited[size_t(m.rank)].find(b->second->recv);
        if (w != waited[size_t(m.rank)].end()) until = w->second;
      }
    int seg_end = f->second;  // the pipeline segment's last action
    for (const Segment& sg : pl.segments)
      if (sg.kind == SegmentKind::Pipeline && f->second >= sg.begin && f->second < sg.end) seg_end = sg.end - 1;
    const int to = until < 0 ? seg_end : std::min(seg_end, std::max(until, f->second));
    if (to == f->second) continue;
    const int64_t b = pl.actions[size_t(m.send)].bytes;
    moves[size_t(m.rank)][f->second] += b;
    moves[size_t(m.rank)][to] -= b;
  }
  for (int r = 0; r < P; ++r)
    for (auto [i, b] : moves[size_t(r)]) plans[size_t(r)]->actions[size_t(i)].mem[kAct] += b;
}

// Each send's buffer freed where the executor sees it complete (the first wait_p2p at or after
// both the send's own transfer and the peer's posting of its receive plus a transfer, by the
// stages' simulated times), not before the plan's own free; else at the segment's end.
void complete_sends(std::vector<StepPlan*>& plans, const std::vector<StepTime>& times,
                    const HardwareProfile& hw) {
  const int P = static_cast<int>(plans.size());
  constexpr size_t kAct = static_cast<size_t>(Mem::Activations);
  std::map<int64_t, std::pair<int, int>> recvs;  // msg_key -> (rank, action)
  for (int r = 0; r < P; ++r)
    for (size_t i = 0; i < plans[size_t(r)]->actions.size(); ++i) {
      const Action& a = plans[size_t(r)]->actions[i];
      const int g = a.chunk * P + r;
      if (a.kind == ActionKind::RecvActs) recvs[msg_key(0, g, a.micro)] = {r, int(i)};
      if (a.kind == ActionKind::RecvGrads) recvs[msg_key(1, g, a.micro)] = {r, int(i)};
    }
  for (int r = 0; r < P; ++r) {
    StepPlan& pl = *plans[size_t(r)];
    const StepTime& t = times[size_t(r)];
    std::map<int, int> freed;  // send -> the wait_p2p the plan frees it at
    for (size_t i = 0; i < pl.actions.size(); ++i)
      if (pl.actions[i].kind == ActionKind::WaitP2P)
        for (int w : pl.actions[i].waits) {
          const ActionKind k = pl.actions[size_t(w)].kind;
          if (k == ActionKind::SendActs || k == ActionKind::SendGrads) freed.emplace(w, int(i));
        }
    std::map<int, int64_t> moves;
    for (auto [send, at] : freed) {
      const Action& a = pl.actions[size_t(send)];
      const int g = a.chunk * P + r;
      const int64_t key = a.kind == ActionKind::SendActs ? msg_key(0, g + 1, a.micro)
                                                         : msg_key(1, g - 1, a.micro);
      double done = t.end[size_t(send)];
      if (auto it = recvs.find(key); it != recvs.end())
        done = std::max(done, times[size_t(it->second.first)].begin[size_t(it->second.second)] +
                                  hw.p2p_seconds(double(a.bytes)));
      int seg_end = at;
      for (const Segment& sg : pl.segments)
        if (sg.kind == SegmentKind::Pipeline && at >= sg.begin && at < sg.end) seg_end = sg.end - 1;
      int to = seg_end;
      for (int j = at; j < seg_end; ++j)
        if (pl.actions[size_t(j)].kind == ActionKind::WaitP2P && t.begin[size_t(j)] >= done) {
          to = j;
          break;
        }
      if (to == at) continue;
      moves[at] += a.bytes;
      moves[to] -= a.bytes;
    }
    for (auto [i, b] : moves) pl.actions[size_t(i)].mem[kAct] += b;
  }
}

}  // namespace

PipelineTime simulate_pipeline(const std::vector<const StepPlan*>& plans,
                               const std::vector<const PlanInput*>& inputs,
                               const std::vector<const TimeInputs*>& tis,
                               const HardwareProfile& hw, std::vector<StepTime>& times) {
  const int P = static_cast<int>(plans.size());
  SW_CHECK(P >= 1 && inputs.size() == plans.size() && tis.size() == plans.size(),
           "simulate_pipeline: one plan, input and time inputs per rank");
  // Where each receive's data comes from (rank, action) and each sync_shared's peer.
  struct Link {
    int rank = -1, action = -1;
    bool peer_start = false;  // sync_shared: the peer's start, not a send's end
  };
  std::vector<std::vector<Link>> from(static_cast<size_t>(P));
  std::map<int64_t, std::pair<int, int>> sends;
  std::vector<std::vector<int>> syncs(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r) {
    const StepPlan& pl = *plans[size_t(r)];
    from[size_t(r)].assign(pl.actions.size(), Link{});
    for (size_t i = 0; i < pl.actions.size(); ++i) {
      const Action& a = pl.actions[i];
      const int g = a.chunk * P + r;
      if (a.kind == ActionKind::SendActs) sends[msg_key(0, g + 1, a.micro)] = {r, int(i)};
      if (a.kind == ActionKind::SendGrads) sends[msg_key(1, g - 1, a.micro)] = {r, int(i)};
      if (a.kind == ActionKind::SyncShared) syncs[size_t(r)].push_back(int(i));
    }
  }
  std::vector<int> sync_ranks;
  for (int r = 0; r < P; ++r)
    if (!syncs[size_t(r)].empty()) sync_ranks.push_back(r);
  for (int r = 0; r < P; ++r) {
    const StepPlan& pl = *plans[size_t(r)];
    for (size_t i = 0; i < pl.actions.size(); ++i) {
      const Action& a = pl.actions[i];
      const int g = a.chunk * P + r;
      int64_t k = -1;
      if (a.kind == ActionKind::RecvActs) k = msg_key(0, g, a.micro);
      if (a.kind == ActionKind::RecvGrads) k = msg_key(1, g, a.micro);
      if (k >= 0)
        if (auto it = sends.find(k); it != sends.end())
          from[size_t(r)][i] = {it->second.first, it->second.second, false};
    }
  }
  // The tied unit's holders (the first and the last rank) sum in the order they list them.
  if (sync_ranks.size() == 2) {
    const int a = sync_ranks[0], b = sync_ranks[1];
    const size_t k = std::min(syncs[size_t(a)].size(), syncs[size_t(b)].size());
    for (size_t j = 0; j < k; ++j) {
      from[size_t(a)][size_t(syncs[size_t(a)][j])] = {b, syncs[size_t(b)][j], true};
      from[size_t(b)][size_t(syncs[size_t(b)][j])] = {a, syncs[size_t(a)][j], true};
    }
  }
  std::vector<std::vector<double>> arrive(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r) arrive[size_t(r)].assign(plans[size_t(r)]->actions.size(), 0.0);
  times.assign(size_t(P), StepTime{});
  PipelineTime pt;
  const int kMaxRounds = 100000;
  for (pt.iterations = 1; pt.iterations <= kMaxRounds; ++pt.iterations) {
    for (int r = 0; r < P; ++r)
      times[size_t(r)] = predict_step_time(*plans[size_t(r)], *inputs[size_t(r)], *tis[size_t(r)],
                                           hw, &arrive[size_t(r)]);
    bool moved = false;
    for (int r = 0; r < P; ++r)
      for (size_t i = 0; i < arrive[size_t(r)].size(); ++i) {
        const Link& l = from[size_t(r)][i];
        if (l.rank < 0) continue;
        const StepTime& o = times[size_t(l.rank)];
        const double t = l.peer_start ? o.begin[size_t(l.action)] : o.end[size_t(l.action)];
        if (t > arrive[size_t(r)][i] + 1e-12) {
          arrive[size_t(r)][i] = t;
          moved = true;
        }
      }
    if (!moved) break;
  }
  // The pipeline segment of each rank: its busy compute and its end.
  double busy = 0;
  for (int r = 0; r < P; ++r) {
    const StepPlan& pl = *plans[size_t(r)];
    const StepTime& t = times[size_t(r)];
    pt.step_s = std::max(pt.step_s, t.step_s);
    for (const Segment& sg : pl.segments) {
      if (sg.kind != SegmentKind::Pipeline) continue;
      for (int i = sg.begin; i < sg.end; ++i) {
        const Action& a = pl.actions[size_t(i)];
        if (a.queue != Queue::Compute) continue;
        busy += t.end[size_t(i)] - t.begin[size_t(i)];
        pt.pipeline_s = std::max(pt.pipeline_s, t.end[size_t(i)]);
      }
    }
  }
  if (pt.pipeline_s > 0) pt.bubble = 1.0 - busy / (double(P) * pt.pipeline_s);
  const PlanInput& in0 = *inputs[0];
  const double V = in0.pipe.chunks, M = std::max(1, in0.accum);
  const bool zb = pipe_schedule_splits_backward(static_cast<PipeSchedule>(in0.pipe.schedule));
  pt.theory_bubble = (P - 1) / ((zb ? 3.0 : 1.0) * V * M + P - 1);
  return pt;
}

PipelinePrediction predict_pipeline(const PlanSetup& s, const HardwareProfile* hw, bool linger) {
  constexpr size_t kActivations = static_cast<size_t>(Mem::Activations);
  const int P = s.pipeline, V = std::max(1, s.pipe_chunks);
  if (P < 2) fail("plan", "predict_pipeline: pipeline_parallel_degree is " + std::to_string(P));
  PipelinePrediction r;
  ShardingPolicy policy = s.policy;
  const int D = s.data_world();
  if (policy.strategy == ShardingStrategy::HybridShard && policy.shard_group_size == 0)
    policy.shard_group_size = D;
  const bool zb = pipe_schedule_splits_backward(static_cast<PipeSchedule>(s.pipe_schedule));
  std::vector<Model> stages;
  std::vector<TimeInputs> tis(static_cast<size_t>(P));
  for (int rank = 0; rank < P; ++rank) {
    Model whole = build_model(s.model, TensorSlice{0, s.tensor});
    if (rank == 0)
      if (const auto u = undeclared_calls(whole, s.micro_batch, s.model.seq_len); !u.empty())
        fail("plan", undeclared_message(u));
    wrap_blocks(whole, s.blocks_per_unit);
    if (rank == 0) r.bounds = stage_bounds(whole, s);
    stages.push_back(stage_model(std::move(whole), r.bounds, P, V, rank));
    const Model& st = stages.back();
    PlanPrediction pr;
    pr.input = make_plan_input(st, policy, D);
    PlanInput& in = pr.input;
    in.pipe.schedule = s.pipe_schedule;
    in.on_device = s.on_device;
    in.B = s.micro_batch;
    in.T = s.model.seq_len;
    in.accum = s.accum;
    declare_calls(in, st);
    if (zb) {
      const std::vector<int64_t> d = measure_deferred(st, in.B, in.T, in.compute);
      for (size_t p = 0; p < d.size() && p < in.calls.size(); ++p) in.calls[p].deferred = d[p];
    }
    pr.plan = plan_step(in);
    r.stages.push_back(std::move(pr));
  }
  if (!linger) return r;  // (plan-dump: the plans as the executor runs them)
  // A chunk's first backward writes the dx it sends into a buffer of its own while its input,
  // Saved and dy are still held (the action's net delta hides it from the replay; zero
  // bubble's deferring backward counts it already, plan_builder.cpp).
  for (PlanPrediction& pr : r.stages)
    for (Action& a : pr.plan.actions) {
      const PlanInput& in = pr.input;
      if (a.kind != ActionKind::Backward || a.defer || a.chunk < 0 ||
          a.pos != in.pipe.chunk_begin[size_t(a.chunk)] || !in.takes_input[size_t(a.pos)])
        continue;
      const int64_t dx = int64_t{4} * in.B * in.T * in.d_model;
      a.transient[kActivations] += dx - std::max<int64_t>(a.mem[kActivations], 0);
    }
  // The stages' time together: with hw, the prediction's figures; without, a nominal machine's,
  // only to order each send's completion against its neighbour's receive.
  const HardwareProfile nominal = nominal_hardware(s.world);
  const HardwareProfile& th = hw ? *hw : nominal;
  std::vector<const StepPlan*> cplans;
  std::vector<const PlanInput*> inputs;
  std::vector<const TimeInputs*> tp;
  std::vector<StepPlan*> plans, bounds;
  std::vector<StepPlan> upper;
  for (int k = 0; k < P; ++k) {
    tis[size_t(k)] = time_inputs(stages[size_t(k)], r.stages[size_t(k)].input);
    cplans.push_back(&r.stages[size_t(k)].plan);
    inputs.push_back(&r.stages[size_t(k)].input);
    tp.push_back(&tis[size_t(k)]);
    plans.push_back(&r.stages[size_t(k)].plan);
    upper.push_back(r.stages[size_t(k)].plan);
  }
  std::vector<StepTime> times;
  const PipelineTime pt = simulate_pipeline(cplans, inputs, tp, th, times);
  for (StepPlan& u : upper) bounds.push_back(&u);
  linger_sends(bounds);  // the bound: each send kept until the peer shows it posted the receive
  complete_sends(plans, times, th);  // the prediction: each send freed once seen complete
  for (int rank = 0; rank < P; ++rank) {
    PlanPrediction& pr = r.stages[size_t(rank)];
    const PlanInput& in = pr.input;
    // The kernels this stage runs: the LM head's only where its loss call is.
    ModelConfig mc = tensor_local_config(s.model, s.tensor);
    bool loss = false;
    for (uint8_t l : in.is_loss) loss |= l != 0;
    if (!loss) mc.vocab_size = 1;
    std::vector<uint8_t> block(in.schedule.size());
    bool blocks = false;
    for (size_t p = 0; p < block.size(); ++p) {
      block[p] = in.takes_input[p] && !in.is_loss[p];
      blocks |= block[p] != 0;
    }
    const MixedPrecisionPolicy& mp = policy.mixed_precision;
    const DType cdt = mp.param_dtype;
    const int threads = plan_threads(s.threads, s.world);
    int64_t tiles = 0;
    if (!blocks && !s.on_device) {  // no attention: its per-thread tiles (what threads multiply)
      const auto ws = [&](int t) {
        return kernel_workspace(DeviceKind::CPU, step_shape(mc, in.B, in.T, cdt, t, mp.fp8)).bytes;
      };
      tiles = int64_t(threads) * (ws(2) - ws(1));
    }
    DevicePeak dp = device_peak(pr.plan, mc, in.B, in.T, mp, s.world, threads, s.on_device, &block);
    dp.workspace -= tiles, dp.total -= tiles;
    if (tiles) dp.decl.what += " (no attention on this stage: its tiles not counted)";
    pr.peak = dp.plan;
    pr.workspace = dp.workspace;
    pr.workspace_what = dp.decl.what;
    pr.device = dp.total;
    pr.host = host_bytes(pr.plan);
    pr.nvme = pr.plan.nvme_bytes;
    pr.rss = predict_rss(pr.plan, in, pr.device, pr.host, s, hw);
    r.device_max.push_back(
        device_peak(upper[size_t(rank)], mc, in.B, in.T, mp, s.world, threads, s.on_device, &block)
            .total - tiles);
  }
  if (hw) {
    r.time = pt;
    for (int k = 0; k < P; ++k) {
      r.stages[size_t(k)].time = times[size_t(k)];
      r.stages[size_t(k)].timed = true;
    }
    r.timed = true;
  }
  return r;
}

std::string PipelineCandidate::describe() const {
  std::string d = "pp=" + std::to_string(pipeline);
  if (pipeline > 1) d += std::string(" ") + pipe_schedule_name(static_cast<PipeSchedule>(schedule));
  return d + " mb=" + std::to_string(micro_batch) + "x" + std::to_string(accum);
}

PipelineSearch search_pipeline(const PlanSetup& base, int64_t budget, const HardwareProfile& hw,
                               double margin) {
  if (budget <= 0) fail("plan", "--memory-budget: the budget must be more than 0 bytes");
  PipelineSearch out;
  const int t = std::max(1, base.tensor);
  const int64_t global = int64_t(base.micro_batch) * base.accum * base.data_world();
  int positions = 0;
  {
    Model m = build_model(base.model, TensorSlice{0, t});
    wrap_blocks(m, base.blocks_per_unit);
    positions = static_cast<int>(m.schedule.size());
  }
  for (int P = 1; P <= base.world / t; ++P) {
    if ((base.world / t) % P) continue;
    const int D = base.world / t / P;
    if (global % D) continue;
    const int64_t rows = global / D;  // micro_batch x micro-batch count per data rank
    for (int sch = 0; sch < (P > 1 ? 4 : 1); ++sch) {
      const bool inter = P > 1 && pipe_schedule_interleaved(static_cast<PipeSchedule>(sch));
      const int V = inter ? 2 : 1;
      if (P * V > positions) continue;
      for (int64_t mb = 1; mb <= rows; mb *= 2) {
        if (rows % mb) continue;
        const int M = static_cast<int>(rows / mb);
        if (P > 1 && (M < P || (inter && M % P))) continue;
        PlanSetup s = base;
        s.pipeline = P, s.pipe_chunks = V, s.pipe_schedule = P > 1 ? sch : 1;
        s.split_points.clear();
        s.micro_batch = static_cast<int>(mb), s.accum = M;
        PipelineEvaluated e;
        e.c = {P, V, s.pipe_schedule, s.micro_batch, M};
        if (P == 1) {
          const PlanPrediction p = predict_plan(s, &hw);
          e.device = p.device;
          e.step_s = p.time.step_s;
        } else {
          const PipelinePrediction p = predict_pipeline(s, &hw);
          for (size_t r = 0; r < p.stages.size(); ++r)
            if (p.stages[r].device > e.device) e.device = p.stages[r].device, e.stage = int(r);
          e.step_s = p.time.step_s;
          e.bubble = p.time.bubble;
        }
        e.fits = double(e.device) <= double(budget) * (1.0 - margin);
        out.evaluated.push_back(e);
        if (!e.fits) continue;
        const int b = out.best;
        const PipelineEvaluated* cur = b >= 0 ? &out.evaluated[size_t(b)] : nullptr;
        const bool better =
            !cur || e.step_s < cur->step_s * (1.0 - kStepTimeNoise) ||
            (e.step_s <= cur->step_s * (1.0 + kStepTimeNoise) && e.device < cur->device);
        if (better) {
          out.best = static_cast<int>(out.evaluated.size()) - 1;
          out.chosen = s;
        }
      }
    }
  }
  return out;
}

}  // namespace sw
