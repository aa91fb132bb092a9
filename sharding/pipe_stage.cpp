#include "sharding/pipe_stage.h"

#include <string>

#include "core/error.h"
#include "sharding/unit_state.h"

namespace sw {

PipeStage::PipeStage(const ModelContext& ctx, UnitList& units, Activations& acts,
                     ActionRecords& records)
    : ctx_(ctx), units_(units), acts_(acts), records_(records) {}

// Direction (0: activations, 1: gradients), the receiving stage (< 64), the micro-batch (< 4096).
int PipeStage::tag(int dir, int stage, int micro) const {
  SW_CHECK(stage >= 0 && stage < 64 && micro >= 0 && micro < 4096, "pipeline: tag out of range");
  return (dir * 64 + stage) * 4096 + micro;
}

void PipeStage::begin(SegmentRun&) {
  issued_.clear();
  lingering_.clear();
}

void PipeStage::end(SegmentRun& s) {
  // The sends still in flight complete now (every receive was waited for by a wait_p2p).
  for (int i : lingering_) finish(s, i);
  lingering_.clear();
  for (auto& [i, is] : issued_) is.work.wait();
  issued_.clear();
}

void PipeStage::quiesce() noexcept {
  for (auto& [i, is] : issued_) {
    try {
      is.work.wait_done();
    } catch (...) {
    }
  }
  issued_.clear();
  lingering_.clear();
}

bool PipeStage::run(SegmentRun& s, int i) {
  const Action& a = s.action(i);
  switch (a.kind) {
    case ActionKind::RecvActs:
    case ActionKind::SendActs:
    case ActionKind::RecvGrads:
    case ActionKind::SendGrads:
      issue(s, i);
      return false;  // recorded when waited for
    case ActionKind::WaitP2P:
      for (int j : a.waits) wait(s, j);
      return true;
    case ActionKind::SyncShared:
      sync_shared(s, i);
      return true;
    default:
      SW_CHECK(false, std::string("pipe_stage: not an action of theirs: ") +
                          action_kind_name(a.kind));
  }
  return true;
}

void PipeStage::issue(SegmentRun& s, int i) {
  const Action& a = s.action(i);
  const Model& m = s.model;
  const StageView& st = m.stage;
  SW_CHECK(ctx_.p2p != nullptr, "pipeline action without a pipe group");
  const int P = st.size, S = P * st.chunks;
  const int g = st.stage_of_chunk(a.chunk);
  const Batch& batch = s.args.batch_for(a.micro);
  const size_t n = static_cast<size_t>(batch.B) * batch.T * m.residual_width();
  const int64_t bytes = static_cast<int64_t>(n * sizeof(float));
  const size_t slot = static_cast<size_t>(a.micro), c = static_cast<size_t>(a.chunk);
  const int lo = st.chunk_begin[c];
  Issued is;
  is.t_issue = records_.now();
  switch (a.kind) {
    case ActionKind::RecvActs: {  // the chunk's first input, from stage g - 1
      SW_CHECK(g > 0, "pipeline: the first stage receives no activations");
      Buffer& x = acts_.input(static_cast<size_t>(lo), slot);
      if (x.bytes() != n * sizeof(float)) x = Buffer(n * sizeof(float), Mem::Activations, ctx_.device());
      is.work = ctx_.p2p->recv(x.data(), bytes, (g - 1) % P, tag(0, g, a.micro));
      break;
    }
    case ActionKind::SendActs: {
      SW_CHECK(g + 1 < S, "pipeline: the last stage sends no activations");
      Buffer& y = acts_.edge(Activations::Edge::ActsOut, slot, c);
      SW_CHECK(y.bytes() == n * sizeof(float), "pipeline: no output to send");
      is.work = ctx_.p2p->send(y.data(), bytes, (g + 1) % P, tag(0, g + 1, a.micro));
      break;
    }
    case ActionKind::RecvGrads: {
      SW_CHECK(g + 1 < S, "pipeline: the last stage receives no gradients");
      Buffer& dy = acts_.edge(Activations::Edge::GradIn, slot, c, n);
      is.work = ctx_.p2p->recv(dy.data(), bytes, (g + 1) % P, tag(1, g, a.micro));
      break;
    }
    case ActionKind::SendGrads: {
      SW_CHECK(g > 0, "pipeline: the first stage sends no gradients");
      Buffer& dx = acts_.edge(Activations::Edge::GradOut, slot, c);
      SW_CHECK(dx.bytes() == n * sizeof(float), "pipeline: no input gradient to send");
      is.work = ctx_.p2p->send(dx.data(), bytes, (g - 1) % P, tag(1, g - 1, a.micro));
      break;
    }
    default:
      break;
  }
  issued_[i] = std::move(is);
}

void PipeStage::wait(SegmentRun& s, int j) {
  // Sends left in flight earlier that have completed since: their buffers go now.
  for (size_t k = 0; k < lingering_.size();) {
    const int i = lingering_[k];
    if (issued_.at(i).work.test()) {
      lingering_.erase(lingering_.begin() + static_cast<std::ptrdiff_t>(k));
      finish(s, i);
    } else {
      ++k;
    }
  }
  auto it = issued_.find(j);
  if (it == issued_.end()) return;  // (waited for already)
  const Action& a = s.action(j);
  // A send is never waited for inside the segment: its peer may post the receive only after
  // this rank's next message reaches it (blocking here could deadlock the schedule). It stays
  // in flight, its buffer with it, until seen complete here or at the segment's end.
  const bool send = a.kind == ActionKind::SendActs || a.kind == ActionKind::SendGrads;
  if (send && !it->second.work.test()) {
    lingering_.push_back(j);
    return;
  }
  finish(s, j);
}

void PipeStage::finish(SegmentRun& s, int j) {
  auto it = issued_.find(j);
  Issued is = std::move(it->second);
  issued_.erase(it);
  is.work.wait();
  const Action& a = s.action(j);
  if (records_.on()) {
    const double t1 = is.work.done_at() > 0 ? is.work.done_at() : records_.now();
    const double t0 = is.work.started_at() > 0 ? is.work.started_at() : is.t_issue;
    records_.device_span(records_.add(s.plan, j, t0, t1), std::make_shared<Work>(is.work));
  }
  const size_t slot = static_cast<size_t>(a.micro), c = static_cast<size_t>(a.chunk);
  if (a.kind == ActionKind::SendActs) acts_.edge(Activations::Edge::ActsOut, slot, c).release();
  if (a.kind == ActionKind::SendGrads) acts_.edge(Activations::Edge::GradOut, slot, c).release();
}

// The reduced gradient shard of unit u summed with the other holder's (both then hold the sum:
// the gradient of the tied weight over both its uses, as one rank's backward accumulates it).
void PipeStage::sync_shared(SegmentRun& s, int i) {
  const Action& a = s.action(i);
  SW_CHECK(ctx_.shared != nullptr, "pipeline: sync_shared without the shared group");
  FlatUnit& fu = *units_[static_cast<size_t>(a.unit)];
  SW_CHECK(!fu.params_on_nvme() && fu.grad_device() == ctx_.device(),
           "pipeline: a shared unit's gradients must be in device memory");
  float* g = fu.grad_shard();
  ctx_.shared->all_reduce(g, g, fu.shard_size(), ReduceOp::Sum);
}

CommStats PipeStage::stats() const { return ctx_.p2p ? ctx_.p2p->stats() : CommStats{}; }
void PipeStage::reset_stats() {
  if (ctx_.p2p) ctx_.p2p->reset_stats();
}

}  // namespace sw
