#include "sharding/offloaded_activations.h"

#include <algorithm>

#include "core/error.h"

namespace sw {

OffloadedActivations::OffloadedActivations(const ModelContext& ctx, Activations& acts,
                                           ActionRecords& records)
    : ctx_(ctx), acts_(acts), records_(records) {}

OffloadedActivations::~OffloadedActivations() = default;

void OffloadedActivations::reserve(int64_t end) {
  const ActivationCheckpointing& ac = ctx_.policy.activation_checkpointing;
  if (!file_) file_ = std::make_unique<ActivationFile>(ctx_.policy.aio, ac.nvme_path, ctx_.file_rank);
  file_->reserve(end);
}

void OffloadedActivations::begin(SegmentRun& s) {
  if (!ctx_.policy.activation_checkpointing.offload_nvme) return;
  if (!file_) reserve(0);
  ev_.clear();
  reading_.clear();
  ev_.resize(s.plan.actions.size());
  file_->rewind();
}

void OffloadedActivations::end(SegmentRun&) {
  // Every copy's wait is in the segment that issued it; the host buffers the last fetches read
  // go once those copies are complete.
  SW_CHECK(!copies_.pending(), "plan: an activation copy without its wait");
  copies_.release_done(true);
}

bool OffloadedActivations::run(SegmentRun& s, int i) {
  const Action& a = s.action(i);
  switch (a.kind) {
    case ActionKind::EvictActs:
      if (file_) {
        evict_to_file(s, i);
        return false;  // recorded when its wait sees it
      }
      move_between_tiers(s, i);
      return false;  // recorded there
    case ActionKind::FetchActs:
      if (file_) {
        fetch_from_file(s, i);
        return false;
      }
      move_between_tiers(s, i);
      return false;
    case ActionKind::WaitActs:
      for (int w : a.waits) {
        if (file_)
          wait_file(s, w);
        else if (ctx_.plan_in.on_device)  // the copy streams: the copies of action w
          copies_.wait(w, ctx_.ops->stream());
        // (else the CPU's copies ran at issue)
      }
      return true;
    default:
      SW_CHECK(false, std::string("offloaded activations: not an action of theirs: ") +
                          action_kind_name(a.kind));
  }
  return false;
}

// The host tier: evict moves position p's buffers there, fetch back to the device.
void OffloadedActivations::move_between_tiers(SegmentRun& s, int i) {
  const Action& a = s.action(i);
  const size_t p = static_cast<size_t>(a.pos);
  const Tier t = a.kind == ActionKind::EvictActs ? Tier::Host : Tier::Device;
  const Device dev = t == Tier::Device ? ctx_.device() : Device::cpu();
  TierCopies::InFlight& c = copies_.of(i);
  acts_.saved(p).move_to(t, ctx_.device(), c.ev, c.from);
  Buffer& x = acts_.input(p);
  if (!x.empty() && x.tier() != t) {
    Buffer nb(x.bytes(), Mem::Activations, dev, t);
    c.ev.push_back(copy_bytes_async(nb.data(), dev, x.data(), x.device(), x.bytes()));
    c.from.push_back(std::move(x));
    x = std::move(nb);
  }
  // Its record: the host's issue; on a device, where timed, the copies' interval on their
  // copy stream (settled later).
  if (records_.on()) {
    const ActionRecord& r = records_.add(s.plan, i, s.t0, trace_clock());
    for (const std::shared_ptr<Event>& e : c.ev) records_.device_span(r, e);
  }
  // The CPU's copies are memcpys, done now, and its plan frees what they read here; a device's
  // wait waits for them.
  if (!ctx_.plan_in.on_device) copies_.forget(i);
}

void OffloadedActivations::evict_to_file(SegmentRun& s, int i) {
  const size_t p = static_cast<size_t>(s.action(i).pos);
  if (off_.size() < acts_.positions()) {
    off_.resize(acts_.positions(), 0);
    input_bytes_.resize(acts_.positions(), 0);
    writing_.resize(acts_.positions());
  }
  std::vector<IoEventPtr>& evs = ev_[size_t(i)];
  std::vector<Buffer> bufs;
  Buffer& x = acts_.input(p);
  input_bytes_[p] = x.bytes();
  if (!x.empty()) bufs.push_back(std::move(x));
  x = Buffer();
  for (Buffer& b : acts_.saved(p).detach()) bufs.push_back(std::move(b));
  int64_t total = 0;
  for (const Buffer& b : bufs) total += static_cast<int64_t>(b.bytes());
  off_[p] = file_->place(total);
  int64_t off = off_[p];
  const size_t n = bufs.size();
  for (size_t k = 0; k < n; ++k) {
    const Buffer* from = &bufs[k];
    std::shared_ptr<Event> filled;
    if (!from->device().is_cpu()) {
      // A device buffer is written from a pinned host copy made on the download copy stream
      // (after the compute stream's work so far); the io queue starts the write once that copy
      // is done, so the host never waits for the device here. Both buffers are kept until the
      // write is done (the wait), where the plan frees the device bytes.
      Buffer h(from->bytes(), Mem::Activations, Device::cpu(), Tier::Host);
      filled = copy_bytes_async(h.data(), Device::cpu(), from->data(), from->device(),
                                from->bytes());
      bufs.push_back(std::move(h));
      from = &bufs.back();
    }
    evs.push_back(file_->write(from->data(), from->bytes(), off, std::move(filled)));
    off += static_cast<int64_t>(from->bytes());
  }
  writing_[p] = std::move(bufs);
}

void OffloadedActivations::fetch_from_file(SegmentRun& s, int i) {
  const size_t p = static_cast<size_t>(s.action(i).pos);
  std::vector<IoEventPtr>& evs = ev_[size_t(i)];
  std::vector<Buffer*> bufs;
  Buffer& x = acts_.input(p);
  if (input_bytes_[p] > 0) {
    x = Buffer(input_bytes_[p], Mem::Activations, ctx_.device());
    bufs.push_back(&x);
  }
  for (Buffer* b : acts_.saved(p).reattach()) bufs.push_back(b);
  int64_t off = off_[p];
  for (Buffer* b : bufs) {
    void* into = b->data();
    if (!b->device().is_cpu()) {  // read into host memory, uploaded at the wait
      reading_[i].emplace_back(Buffer(b->bytes(), Mem::Activations, Device::cpu(), Tier::Host), b);
      into = reading_[i].back().first.data();
    }
    evs.push_back(file_->read(into, b->bytes(), off));
    off += static_cast<int64_t>(b->bytes());
  }
}

void OffloadedActivations::wait_file(SegmentRun& s, int w) {
  const Action& io = s.action(w);
  Stream& compute = ctx_.ops->stream();
  double t0 = 1e300, t1 = 0;
  for (IoEventPtr& e : ev_[size_t(w)]) {
    compute.wait_event(*e);
    t0 = std::min(t0, e->started_at());
    t1 = std::max(t1, e->done_at());
  }
  if (io.kind == ActionKind::EvictActs) writing_[size_t(io.pos)].clear();  // freed
  if (auto rd = reading_.find(w); rd != reading_.end()) {
    for (auto& [h, d] : rd->second) {  // read into host memory: up to the device
      auto ev = copy_bytes_async(d->data(), d->device(), h.data(), Device::cpu(), h.bytes());
      compute.wait_event(*ev);
      copies_.keep_until(std::move(ev), std::move(h));
    }
    reading_.erase(rd);
    copies_.release_done(false);
  }
  if (records_.on() && !ev_[size_t(w)].empty()) records_.add(s.plan, w, t0, t1, Queue::IO);
  ev_[size_t(w)].clear();
}

}  // namespace sw
