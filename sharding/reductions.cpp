#include "sharding/reductions.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/threads.h"
#include "sharding/comm/quantize.h"
#include "sharding/offloaded_state.h"
#include "sharding/unit_state.h"

namespace sw {

void setup_quantized(ModelContext& c) {
  const CommQuantization& q = c.policy.quantized;
  if (!q.any()) return;
  const char* key = q.weights ? "zero_optimization.zero_quantized_weights"
                              : "zero_optimization.zero_quantized_gradients";
  if (!c.ops->device().is_cpu())
    fail("sharding", std::string(key) + " on device " + c.ops->device().str() +
                         " is not implemented yet (the quantised collectives run on the host; "
                         "use device cpu)");
  if (c.tensor || c.pipe)
    fail("sharding", std::string(key) + " with tensor or pipeline parallelism is not "
                                        "implemented yet");
  if (c.S == 1 && c.R > 1)
    fail("sharding", std::string(key) + " with shard groups of one rank (NO_SHARD's bucket "
                                        "all-reduce) is not implemented yet");
  c.quant = QuantSpec{q.bits, q.block};
  // The shard group carries compressed traffic when it is the only data-parallel dimension
  // (it then spans hosts) or with scope "all"; the replica dimension always does.
  const bool shard_dim = c.S > 1 && (c.R == 1 || q.all_dims);
  c.quant_weights = q.weights && shard_dim;
  if (q.gradients && shard_dim) c.qshard = make_peer_comm(*c.shard, "qgz-shard");
  if (q.gradients && c.R > 1 && c.S > 1) c.qrep = make_peer_comm(*c.rep, "qgz-replica");
  if (c.qshard || c.qrep)
    c.qworker = std::make_shared<QuantWorker>([t = num_threads()] { set_num_threads(t); });
}

Reductions::Reductions(const ModelContext& ctx, UnitList& units, ActionRecords& records,
                       OffloadedState& state)
    : ctx_(ctx), units_(units), records_(records), state_(state) {
  // NO_SHARD with replicas: every unit's gradients in one buffer, cut into the plan's buckets.
  const PlanInput& in = ctx.plan_in;
  bucket_at_.assign(in.units.size(), -1);
  if (in.buckets.empty()) return;
  for (const PlanBucket& b : in.buckets) {
    int64_t off = b.lo;
    for (int u : b.members) {
      bucket_at_[size_t(u)] = off;
      off += in.units[size_t(u)].padded;
    }
  }
  const int64_t total = in.buckets.back().hi;
  bucket_buf_ = Buffer(static_cast<size_t>(total) * sizeof(float), Mem::Grads, ctx.device());
  ctx.ops->fill(bucket_buf_.f32(), 0.f, static_cast<size_t>(total));
}

float* Reductions::bucket_region(int u) {
  return bucket_at_[size_t(u)] >= 0 ? bucket_buf_.f32() + bucket_at_[size_t(u)] : nullptr;
}

bool Reductions::run(SegmentRun& s, int i) {
  const Action& a = s.action(i);
  switch (a.kind) {
    case ActionKind::ReduceScatter: {
      FlatUnit& fu = *units_[static_cast<size_t>(a.unit)];
      // NVMe parameters: the staging buffer its completion accumulates into.
      if (fu.params_on_nvme()) state_.stage_reduction(a.slot, fu);
      Pending r;
      r.action = i, r.kind = a.kind, r.unit = a.unit, r.t_issue = s.t0;
      r.finishes = ctx_.R == 1;
      r.bytes = a.bytes;
      r.seq = records_.next_seq();
      r.work = fu.issue_reduce_scatter(ctx_.R);
      pending_.push_back(std::move(r));
      return false;  // recorded when it is completed (wait_reduce)
    }
    case ActionKind::AllReduce:
      if (a.bucket >= 0) {
        issue_bucket(a.bucket, i);
      } else {  // HYBRID: the replica all-reduce, behind its reduce-scatter
        Pending r;
        r.action = i, r.kind = a.kind, r.unit = a.unit, r.bytes = a.bytes;
        issue_follow_up(*units_[static_cast<size_t>(a.unit)], r);
      }
      return false;
    case ActionKind::RoundGrads: {
      FlatUnit& fu = *units_[static_cast<size_t>(a.unit)];
      fu.round_grads();  // where N ranks would narrow them to reduce_dtype
      fu.reduced_in_place();
      return true;
    }
    case ActionKind::WaitReduce:
      if (ends_backward(s.plan, i)) {
        sync_grads();  // the end of backward: everything, units outside the schedule included
      } else {
        int through = -1;
        for (int w : a.waits) through = std::max(through, w);
        complete(through);
      }
      return true;
    default:
      SW_CHECK(false, std::string("reductions: not an action of theirs: ") + action_kind_name(a.kind));
  }
  return false;
}

bool Reductions::ends_backward(const StepPlan& plan, int i) {
  // The last wait_reduce of a micro-step: only the gradients' write-back may follow it.
  for (size_t j = static_cast<size_t>(i) + 1; j < plan.actions.size(); ++j) {
    const ActionKind k = plan.actions[j].kind;
    if (k != ActionKind::EvictState && k != ActionKind::WaitState) return false;
  }
  return true;
}

void Reductions::issue_bucket(int bi, int action) {
  const PlanBucket& b = ctx_.plan_in.buckets[static_cast<size_t>(bi)];
  float* p = bucket_buf_.f32() + b.lo;
  const DType rdt = ctx_.policy.mixed_precision.reduce_dtype;
  const Ops& ops = *ctx_.ops;
  ReduceOp op = ReduceOp::Avg;
  if (rdt != DType::F32) {  // divide, then sum in 16 bits (FlatUnit::issue_reduce_scatter)
    ops.scale(p, 1.f / static_cast<float>(ctx_.R), static_cast<size_t>(b.hi - b.lo));
    ops.narrow(rdt, p, p, static_cast<size_t>(b.hi - b.lo));  // at the front of the range
    op = ReduceOp::Sum;
  }
  Pending r;
  r.action = action, r.kind = ActionKind::AllReduce, r.bucket = bi;
  r.bytes = (b.hi - b.lo) * static_cast<int64_t>(dtype_size(rdt));
  r.t_issue = records_.now();
  r.seq = records_.next_seq();
  r.work = ctx_.rep->issue_all_reduce(p, p, b.hi - b.lo, op, rdt);
  pending_.push_back(std::move(r));
}

void Reductions::issue_follow_up(FlatUnit& fu, Pending& r) {
  SW_CHECK(!pending_.empty() && pending_.back().kind == ActionKind::ReduceScatter &&
               pending_.back().unit == r.unit,
           "executor: HYBRID's all-reduce of unit '" + fu.unit()->name() +
               "' does not follow its reduce-scatter");
  void* blk = fu.reduced_block();
  r.t_issue = records_.now();
  r.seq = records_.next_seq();
  if (ctx_.qrep) {  // quantised, on the worker once its reduce-scatter is done (comm/quantize.h)
    const int64_t n = fu.shard_size();
    float *e1 = quant_residual(r.unit, 0, true), *e2 = quant_residual(r.unit, 1, true);
    PeerComm* pc = ctx_.qrep.get();
    const QuantSpec q = ctx_.quant;
    const float scale = 1.f / static_cast<float>(ctx_.R);
    auto* data = static_cast<float*>(blk);
    r.work = ctx_.qworker->issue([prev = pending_.back().work, pc, data, n, e1, e2, q, scale] {
      prev.wait_done();
      quantized_all_reduce(*pc, data, n, e1, e2, q, scale);
    });
    pending_.push_back(std::move(r));
    return;
  }
  r.work = ctx_.rep->issue_all_reduce_after(
      pending_.back().work, blk, blk, fu.shard_size(),
      fu.reduce_dtype() == DType::F32 ? ReduceOp::Avg : ReduceOp::Sum,  // divided before
      fu.reduce_dtype());
  pending_.push_back(std::move(r));
}

void Reductions::finish(const Pending& done) {
  if (done.bucket >= 0) {
    const PlanBucket& b = ctx_.plan_in.buckets[static_cast<size_t>(done.bucket)];
    float* p = bucket_buf_.f32() + b.lo;
    ctx_.ops->widen(ctx_.policy.mixed_precision.reduce_dtype, p, p, static_cast<size_t>(b.hi - b.lo));
    for (int u : b.members) units_[static_cast<size_t>(u)]->reduced_in_place();
  } else if (done.finishes) {
    FlatUnit& f = *units_[static_cast<size_t>(done.unit)];
    if (state_.keeps_grads(f))
      state_.accumulate(f);  // into the shard on the host or in the file
    else
      f.accumulate_reduced();
  }
}

void Reductions::complete(int through) {
  while (!pending_.empty() && (through < 0 || pending_.front().action <= through)) {
    Pending done = std::move(pending_.front());
    pending_.pop_front();
    done.work.wait();
    finish(done);
    if (records_.on() && done.action >= 0) {
      ActionRecord rec;
      rec.action = done.action;
      rec.kind = done.kind;
      rec.queue = Queue::Reduce;
      rec.unit = done.unit;
      rec.bucket = done.bucket;
      rec.bytes = done.bytes;
      rec.t_begin = done.work.started_at() > 0 ? done.work.started_at() : done.t_issue;
      rec.t_end = done.work.done_at() > 0 ? done.work.done_at() : trace_clock();
      rec.issued = done.seq;
      records_.device_span(records_.push(rec), std::make_shared<Work>(done.work));
    }
  }
}

void Reductions::reduce_now(FlatUnit& fu) {
  switch (fu.kind()) {
    case FlatUnit::Kind::Sharded:
    case FlatUnit::Kind::FullReplicated: {
      Pending r;
      r.kind = ActionKind::ReduceScatter, r.unit = fu.index();
      r.finishes = ctx_.R == 1;
      r.seq = records_.next_seq();
      r.work = fu.issue_reduce_scatter(ctx_.R);
      pending_.push_back(std::move(r));
      if (ctx_.R > 1) {
        Pending ar;
        ar.kind = ActionKind::AllReduce, ar.unit = fu.index();
        issue_follow_up(fu, ar);
      }
      break;
    }
    case FlatUnit::Kind::Whole:
      if (ctx_.R == 1) {
        fu.round_grads();
        fu.reduced_in_place();
      } else {
        issue_bucket(ctx_.plan_in.units[static_cast<size_t>(fu.index())].bucket, -1);
      }
      break;
  }
}

void Reductions::sync_grads() {
  complete(-1);
  std::vector<FlatUnit*> order;
  for (auto& u : units_) order.push_back(u.get());
  std::stable_sort(order.begin(), order.end(),
                   [](FlatUnit* a, FlatUnit* b) { return a->first_pos > b->first_pos; });
  std::vector<bool> bucket_done(ctx_.plan_in.buckets.size());
  for (FlatUnit* fu : order) {
    if (!fu->grads_dirty()) continue;
    if (fu->kind() == FlatUnit::Kind::Whole && ctx_.R > 1) {
      const int b = ctx_.plan_in.units[static_cast<size_t>(fu->index())].bucket;
      if (bucket_done[static_cast<size_t>(b)]) continue;
      bucket_done[static_cast<size_t>(b)] = true;
    }
    reduce_now(*fu);
  }
  complete(-1);
}

void Reductions::quiesce() noexcept {
  for (Pending& p : pending_) {
    try {
      p.work.wait();
    } catch (...) {
    }
  }
  pending_.clear();
}

int64_t Reductions::quant_residual_size(int u, int k) const {
  const int64_t n = units_[static_cast<size_t>(u)]->shard_size();
  return k == 0 ? n : quant_ar_chunk(n, ctx_.R);
}

float* Reductions::quant_residual(int u, int k, bool create) {
  if (!ctx_.qrep) return nullptr;
  if (qerr_.size() < units_.size()) qerr_.resize(units_.size());
  auto& e = qerr_[static_cast<size_t>(u)];
  if (e[0].empty()) {
    if (!create) return nullptr;
    for (int j = 0; j < 2; ++j) {
      e[size_t(j)] = Buffer(static_cast<size_t>(quant_residual_size(u, j)) * 4, Mem::Grads);
      e[size_t(j)].zero();
    }
  }
  return e[static_cast<size_t>(k)].f32();
}

}  // namespace sw
