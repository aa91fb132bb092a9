#include "sharding/plan_activation_io.h"

#include "sharding/plan_builder.h"

namespace sw {

namespace {
constexpr size_t kAct = static_cast<size_t>(Mem::Activations);
}  // namespace

bool ActivationIoPlan::offloads(int p) const {
  const int P = static_cast<int>(b_.in().schedule.size());
  return b_.in().policy.activation_checkpointing.offloads() && p >= 1 && p + 2 < P;
}

bool ActivationIoPlan::nvme() const { return b_.in().policy.activation_checkpointing.offload_nvme; }
bool ActivationIoPlan::async() const { return nvme() || b_.in().on_device; }

int64_t ActivationIoPlan::kept_bytes(int p) const {
  int64_t bytes = p > 0 ? b_.act_bytes() : 0;
  if (const CallMemory* cm = b_.call_mem(p)) {
    const CheckpointMode m = b_.dropped(p);
    bytes += m == CheckpointMode::Full        ? 0
             : m == CheckpointMode::Selective ? cm->saved - cm->saved_cheap
                                              : cm->saved;
  }
  return bytes;
}

void ActivationIoPlan::begin_micro_step() {
  b_.plan().nvme_bytes -= file_;  // micro-steps reuse the activation file from its start
  file_ = 0;
  fetch_at_.clear();  // (each micro-step fetches what it evicted)
}

void ActivationIoPlan::after_forward(int p, int u) {
  if (!offloads(p)) return;
  Action& e = b_.add(ActionKind::EvictActs, Queue::IO, u, p);
  e.bytes = kept_bytes(p);
  if (async()) {  // freed once copied: observed after the next call's forward
    evicts_.emplace_back(b_.last_index(), e.bytes);
    if (nvme()) {
      file_ += e.bytes;
      b_.plan().nvme_bytes += e.bytes;  // (one micro-step's: each starts at the file's start)
    }
  } else {
    e.mem[kAct] = -e.bytes;
  }
}

void ActivationIoPlan::wait_evicted(int p, int u, int fwd_at) {
  while (async() && !evicts_.empty() && evicts_.front().first < fwd_at) {
    Action& w = b_.add(ActionKind::WaitActs, Queue::Compute, u, p);
    w.waits.push_back(evicts_.front().first);
    w.mem[kAct] = -evicts_.front().second;
    evicts_.erase(evicts_.begin());
  }
}

void ActivationIoPlan::end_forward() {
  for (const auto& [ei, bytes] : evicts_) {  // (none left with two calls after the last)
    Action& w = b_.add(ActionKind::WaitActs, Queue::Compute);
    w.waits.push_back(ei);
    w.mem[kAct] = -bytes;
  }
  evicts_.clear();
}

void ActivationIoPlan::fetch(int q) {
  Action& f = b_.add(ActionKind::FetchActs, Queue::IO, b_.in().schedule[size_t(q)].unit, q);
  f.bytes = kept_bytes(q);
  f.mem[kAct] = f.bytes;
  fetch_at_[q] = b_.last_index();
}

void ActivationIoPlan::before_backward(int q, int u) {
  // Back from the host tier (the CPU copies at issue) or the file / a device's copy stream:
  // those are issued one call ahead, so that they overlap the backward of the call after.
  if (offloads(q) && fetch_at_.count(q) == 0) fetch(q);
  if (async() && q >= 1 && offloads(q - 1)) fetch(q - 1);
  if (offloads(q)) b_.add(ActionKind::WaitActs, Queue::Compute, u, q).waits.push_back(fetch_at_[q]);
}

}  // namespace sw
