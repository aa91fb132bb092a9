#include "sharding/plan_state_io.h"

#include <algorithm>

#include "sharding/plan_builder.h"

namespace sw {

// ---- Pieces ----------------------------------------------------------------------------------

bool StateIoPlan::streamed(const PlanInput& in, int u) {
  return in.units[size_t(u)].optimizer_nvme || in.units[size_t(u)].params_nvme;
}

uint8_t StateIoPlan::piece_io(const PlanInput& in, int u, bool fetch) {
  const PlanUnit& pu = in.units[size_t(u)];
  return static_cast<uint8_t>((pu.optimizer_nvme ? kIoMoments : 0) |
                              (pu.params_nvme ? kIoMaster | (fetch ? kIoGrads : 0) : 0));
}

int64_t StateIoPlan::io_floats(uint8_t io) {  // floats per element of a piece
  return ((io & kIoMoments) ? 2 : 0) + ((io & kIoMaster) ? 1 : 0) + ((io & kIoGrads) ? 1 : 0);
}

// The pieces of at most piece_floats of each streamed unit's shard, in unit order.
std::vector<StateIoPlan::Piece> StateIoPlan::pieces(const PlanInput& in, Which w) {
  std::vector<Piece> out;
  const int64_t C = in.policy.offload_optimizer.piece();
  for (size_t u = 0; u < in.units.size(); ++u)
    if (streamed(in, static_cast<int>(u)) &&
        (w == Which::All || (w == Which::Deferred) == unit_defers(in, static_cast<int>(u))))
      for (int64_t lo = 0, sh = in.units[u].padded / in.S; lo < sh; lo += C)
        out.push_back({static_cast<int>(u), lo, std::min(sh, lo + C)});
  return out;
}

const PlanInput& StateIoPlan::b_in() const { return b_.in(); }
int StateIoPlan::buffers() const { return std::max(2, b_in().policy.offload_optimizer.buffer_count); }

// The fetch of piece k into staging buffer k % buffers().
Action& StateIoPlan::add_piece_fetch(const std::vector<Piece>& ps, int k) {
  const Piece& pc = ps[size_t(k)];
  Action& a = b_.add(ActionKind::FetchState, Queue::IO, pc.unit);
  a.slot = k % buffers();
  a.lo = pc.lo, a.hi = pc.hi;
  a.io = piece_io(b_in(), pc.unit, true);
  a.bytes = io_floats(a.io) * (pc.hi - pc.lo) * 4;
  return a;
}

// The optimizer's leading pieces that the last micro-step reads ahead: those read before its
// first update (buffers() - 1 at most), while they are moments only. A piece with NVMe
// parameters also reads the gradients that backward is still writing.
int StateIoPlan::carried_pieces(const std::vector<Piece>& ps) const {
  int n = 0;
  while (n < std::min<int>(buffers() - 1, static_cast<int>(ps.size())) &&
         piece_io(b_in(), ps[size_t(n)].unit, true) == kIoMoments)
    ++n;
  return n;
}

bool StateIoPlan::any_deferred() const {
  for (size_t u = 0; u < b_in().units.size(); ++u)
    if (deferred(static_cast<int>(u))) return true;
  return false;
}

// ---- Micro-steps -----------------------------------------------------------------------------

void StateIoPlan::begin_micro_step(int micro, bool last) {
  last_ = last;
  // The step's last micro-step reads the next updates' first pieces (moments only: nothing this
  // segment writes) into their staging buffers, idle until then, so that the reads overlap the
  // forward and backward instead of starting the optimizer's wait. With deferred updates
  // pending, the first micro-step runs them in its forward (and the last one issues those reads
  // once the staging buffers are free again).
  if (b_in().pending && micro == 0 && any_deferred())
    begin_deferred();
  else if (last)
    issue_carried_reads({});
}

// The reads the last micro-step leaves in flight (Action::carry) for the next segment that
// updates: the first pieces of the deferred units when any defer, else of all streamed ones.
// `evicts`: the evict that last used each staging buffer in this segment, by piece.
void StateIoPlan::issue_carried_reads(const std::vector<int>& evicts) {
  const std::vector<Piece> ps = pieces(b_in(), any_deferred() ? Which::Deferred : Which::All);
  const int bc = buffers();
  for (int k = 0; k < carried_pieces(ps); ++k) {
    Action& a = add_piece_fetch(ps, k);
    a.carry = true;
    for (int j = static_cast<int>(evicts.size()) - 1; j >= 0; --j)
      if (j % bc == k % bc) {
        a.waits.push_back(evicts[size_t(j)]);
        break;
      }
  }
}

// Deferred updates in the first micro-step: the pieces stream through the staging buffers as in
// the optimizer (read buffers() - 1 ahead, adopt the carried reads), each unit's pieces updated
// by update_through just before its first gather or forward.
void StateIoPlan::begin_deferred() {
  dpieces_ = pieces(b_in(), Which::Deferred);
  dnext_ = 0;
  devict_at_.clear();
  dfetch_at_.assign(dpieces_.size(), -1);
  dactive_ = true;
  const int carried = carried_pieces(dpieces_);
  for (int k = 0; k < std::min<int>(buffers() - 1, static_cast<int>(dpieces_.size())); ++k)
    deferred_fetch(k, k < carried);
}

void StateIoPlan::deferred_fetch(int k, bool adopt) {
  Action& a = add_piece_fetch(dpieces_, k);
  if (adopt) a.carry = a.adopt = true, a.bytes = 0;
  if (k >= buffers()) a.waits.push_back(devict_at_[size_t(k - buffers())]);
  dfetch_at_[size_t(k)] = b_.last_index();
}

// Runs the pending updates of units 0 .. u (pieces are in unit order); after the last one, the
// last micro-step issues its carried reads into the freed staging buffers.
void StateIoPlan::update_through(int u) {
  if (!dactive_) return;
  const int np = static_cast<int>(dpieces_.size()), bc = buffers();
  while (dnext_ < np && dpieces_[size_t(dnext_)].unit <= u) {
    const int k = dnext_++;
    const Piece pc = dpieces_[size_t(k)];
    // A gather carried from an earlier segment read the master before this update: stale.
    if (pc.lo == 0) b_.drop_stale_gather(pc.unit);
    b_.add(ActionKind::WaitState, Queue::Compute, pc.unit).waits.push_back(dfetch_at_[size_t(k)]);
    Action& up = b_.add(ActionKind::OptimizerUpdate, Queue::Compute, pc.unit);
    up.lo = pc.lo, up.hi = pc.hi;
    Action& e = b_.add(ActionKind::EvictState, Queue::IO, pc.unit);
    e.slot = k % bc;
    e.lo = pc.lo, e.hi = pc.hi;
    e.io = kIoMoments;
    e.bytes = io_floats(e.io) * (pc.hi - pc.lo) * 4;
    e.carry = true;  // as the optimizer's: settled before the next update reads them
    devict_at_.push_back(b_.last_index());
    if (k + bc - 1 < np) deferred_fetch(k + bc - 1, false);
  }
  if (dnext_ == np) {
    dactive_ = false;
    if (last_) issue_carried_reads(devict_at_);
  }
}

void StateIoPlan::stage_reduction(int u, int rs) {
  const PlanUnit& pu = b_in().units[size_t(u)];
  if (!pu.params_nvme) return;
  // Accumulates into a staging buffer, read first unless zero.
  const int slot = next_gslot_++ % std::max(1, b_.plan().grad_slots);
  b_.plan().actions[size_t(rs)].slot = slot;
  Action& f = b_.add(ActionKind::FetchState, Queue::IO, u);
  f.slot = slot;
  f.io = kIoGrads;
  f.bytes = pu.padded / b_in().S * 4;
  if (gslot_evict_.count(f.slot)) f.waits.push_back(gslot_evict_[f.slot]);
}

void StateIoPlan::write_back(const std::vector<int>& done, int wi) {
  for (int last : done) {  // NVMe parameters: the accumulated gradients go back to the file
    const StepPlan& plan = b_.plan();
    const int u = plan.actions[size_t(last)].unit;
    if (u < 0 || !b_in().units[size_t(u)].params_nvme) continue;
    int rs = last;
    while (plan.actions[size_t(rs)].kind != ActionKind::ReduceScatter) --rs;
    const int slot = plan.actions[size_t(rs)].slot;
    Action& e = b_.add(ActionKind::EvictState, Queue::IO, u);
    e.slot = slot;
    e.io = kIoGrads;
    e.bytes = b_in().units[size_t(u)].padded / b_in().S * 4;
    e.waits.push_back(wi);
    gslot_evict_[slot] = b_.last_index();
    grad_evicts_.push_back(b_.last_index());
  }
}

void StateIoPlan::end_backward() {
  if (grad_evicts_.empty()) return;
  Action& w = b_.add(ActionKind::WaitState, Queue::Compute);
  w.waits = grad_evicts_;
  grad_evicts_.clear();
  gslot_evict_.clear();
}

// ---- The optimizer ---------------------------------------------------------------------------

void StateIoPlan::optimizer_fetch(int k) {
  Action& a = add_piece_fetch(opieces_, k);
  if (k < ocarried_) a.carry = a.adopt = true, a.bytes = 0;
  if (k >= buffers()) a.waits.push_back(oevict_at_[size_t(k - buffers())]);
  ofetch_at_[size_t(k)] = b_.last_index();
}

void StateIoPlan::begin_optimizer(bool flush) {
  const bool defer = any_deferred();
  // The first carried_pieces() were read by the last micro-step (Action::carry).
  opieces_ = pieces(b_in(), flush ? Which::Deferred : defer ? Which::Kept : Which::All);
  onext_ = 0;
  ocarried_ = !defer || flush ? carried_pieces(opieces_) : 0;
  ofetch_at_.assign(opieces_.size(), -1);
  oevict_at_.clear();
  oevict_wait_.clear();
  for (int k = 0; k < std::min(buffers() - 1, static_cast<int>(opieces_.size())); ++k)
    optimizer_fetch(k);
}

void StateIoPlan::update_pieces(int u) {
  const int np = static_cast<int>(opieces_.size()), bc = buffers();
  for (; onext_ < np && opieces_[size_t(onext_)].unit == u; ++onext_) {
    const int k = onext_;
    const Piece& pc = opieces_[size_t(k)];
    b_.add(ActionKind::WaitState, Queue::Compute, u).waits.push_back(ofetch_at_[size_t(k)]);
    Action& up = b_.add(ActionKind::OptimizerUpdate, Queue::Compute, u);
    up.lo = pc.lo, up.hi = pc.hi;
    Action& e = b_.add(ActionKind::EvictState, Queue::IO, u);
    e.slot = k % bc;
    e.lo = pc.lo, e.hi = pc.hi;
    e.io = piece_io(b_in(), u, false);
    e.bytes = io_floats(e.io) * (pc.hi - pc.lo) * 4;
    // Moments only: the write may finish during the next step (Action::carry); nothing before
    // the next optimizer reads them, and the io queue orders any read of the same range or
    // buffer after it. A master written back is read by the next gathers: waited.
    e.carry = e.io == kIoMoments;
    oevict_at_.push_back(b_.last_index());
    if (!e.carry) oevict_wait_.push_back(oevict_at_.back());
    if (k + bc - 1 < np) optimizer_fetch(k + bc - 1);
  }
}

void StateIoPlan::end_optimizer() {
  if (oevict_wait_.empty()) return;
  Action& w = b_.add(ActionKind::WaitState, Queue::Compute);
  w.waits = oevict_wait_;
}

// ---- Gathers of NVMe masters -----------------------------------------------------------------

// Each segment's gathers of such units read their master shard into one of param_slots staging
// buffers first. The gather copies the shard out at issue, so a buffer is free again right
// after its gather: gather g of the segment uses buffer g % param_slots and its fetch is inserted
// right after gather g - param_slots (at the segment's start for the first param_slots), as far
// ahead as the buffers allow.
void StateIoPlan::add_param_fetches() {
  StepPlan& plan = b_.plan();
  const PlanInput& in = b_in();
  if (plan.param_slots == 0) return;
  const int n = plan.param_slots;
  std::vector<Action> out;
  std::vector<int> remap(plan.actions.size(), -1);
  std::vector<int> fetch_of;    // per gather of the segment: the new index of its fetch
  std::vector<int> gather_pos;  // old indices of the segment's gathers
  auto fetch = [&](int g) {
    const Action& ga = plan.actions[size_t(gather_pos[size_t(g)])];
    Action f;
    f.kind = ActionKind::FetchState;
    f.queue = Queue::IO;
    f.unit = ga.unit;
    f.micro = ga.micro;
    f.slot = g % n;
    f.io = kIoMaster;
    f.bytes = in.units[size_t(ga.unit)].padded / in.S * 4;
    if (g >= n) f.waits.push_back(remap[size_t(gather_pos[size_t(g - n)])]);
    fetch_of[size_t(g)] = static_cast<int>(out.size());
    out.push_back(std::move(f));
  };
  for (Segment& sg : plan.segments) {
    gather_pos.clear();
    for (int i = sg.begin; i < sg.end; ++i) {
      const Action& a = plan.actions[size_t(i)];
      if (a.kind == ActionKind::Gather && in.units[size_t(a.unit)].params_nvme) gather_pos.push_back(i);
    }
    fetch_of.assign(gather_pos.size(), -1);
    const int begin = static_cast<int>(out.size());
    const int G = static_cast<int>(gather_pos.size());
    for (int g = 0; g < std::min(n, G); ++g) fetch(g);
    int g = 0;
    for (int i = sg.begin; i < sg.end; ++i) {
      Action a = plan.actions[size_t(i)];
      for (int& w : a.waits) w = remap[size_t(w)];
      const bool is_gather = g < G && gather_pos[size_t(g)] == i;
      if (is_gather) a.waits.push_back(fetch_of[size_t(g)]);
      remap[size_t(i)] = static_cast<int>(out.size());
      out.push_back(std::move(a));
      if (is_gather) {
        if (g + n < G) fetch(g + n);
        ++g;
      }
    }
    sg.begin = begin;
    sg.end = static_cast<int>(out.size());
  }
  plan.actions = std::move(out);
}

// ---- Staging ---------------------------------------------------------------------------------

void StateIoPlan::size_staging(const PlanInput& in, StepPlan& plan) {
  {  // the optimizer's pieces (persistent, Optimizer): min(buffer_count, pieces) of the largest
    const std::vector<Piece> ps = pieces(in, Which::All);
    int64_t largest = 0;
    for (const Piece& pc : ps) largest = std::max(largest, pc.hi - pc.lo);
    const int64_t bc = std::max(2, in.policy.offload_optimizer.buffer_count);
    int64_t per = 0;  // floats per element: the most any unit's piece moves
    for (size_t u = 0; u < in.units.size(); ++u)
      if (streamed(in, static_cast<int>(u)))
        per = std::max(per, io_floats(piece_io(in, static_cast<int>(u), true)));
    plan.staging_slots = static_cast<int>(std::min<int64_t>(int64_t(ps.size()), bc));
    plan.staging_bytes = per * largest * 4;
    (in.on_device ? plan.persistent_host : plan.persistent)[static_cast<size_t>(Mem::Optimizer)] +=
        plan.staging_slots * plan.staging_bytes;
  }
  if (plan.shard_bytes > 0) {  // NVMe parameters: gather and gradient staging
    plan.param_slots = std::max(2, in.policy.offload_param.buffer_count);
    plan.grad_slots = 3;  // one reduction completing, one in flight, one unit in backward
    MemDeltas& tier = in.on_device ? plan.persistent_host : plan.persistent;  // (host memory)
    tier[static_cast<size_t>(Mem::Params)] += plan.param_slots * plan.shard_bytes;
    tier[static_cast<size_t>(Mem::Grads)] += plan.grad_slots * plan.shard_bytes;
  }
}

}  // namespace sw
