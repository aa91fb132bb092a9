// The optimizer side of a step: the global gradient norm, zeroing, and the optimizer segment of
// the step plan (AdamW per unit on the fp32 master shard; stage 1 regathers the updated slices;
// sharded strategies prefetch the next forward's first units while later updates run).
#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

#include "core/bytes.h"
#include "core/error.h"
#include "core/stream.h"
#include "kernels/threads.h"
#include "sharding/sharded_model_impl.h"

namespace sw {

double ShardedModel::grad_norm() const {
  Impl& I = *impl_;
  I.flush_deferred(model_);  // (zero_grads left those units' gradients for their update)
  I.sync_grads();
  // Sum of squares of this rank's reduced gradient shard (alignment gaps and padding are never
  // written, so they stay zero), summed over the shard group; replicas hold equal shards.
  // Per unit, then added in unit order: the device's shards in one call whose sums stay on
  // the device and come back with the unread micro-steps' losses (read_sums: the step's one
  // host synchronisation on a GPU), shards on the host with the CPU's Ops.
  // One-rank units whose gradients are still to be rounded to reduce_dtype (FlatUnit::
  // round_grads) are summed rounded as they are read, after the others.
  const size_t U = I.units.size();
  std::vector<double> per(U, 0.0);
  std::vector<const float*> xs, xr;
  std::vector<size_t> ns, nr, at, atr;
  DType rdt = DType::F32;
  for (size_t u = 0; u < U; ++u) {
    const FlatUnit& fu = *I.units[u];
    if (fu.params_on_nvme()) {  // summed when its last reduction was accumulated
      per[u] = fu.grads_zero() ? 0.0 : I.pnvme->sumsq[static_cast<size_t>(fu.index())];
    } else if (fu.grad_device() != I.ops->device()) {
      per[u] = fu.ops_on(fu.grad_device()).sum_squares(fu.grad_shard(),
                                                       static_cast<size_t>(fu.shard_size()));
    } else {
      DType r = DType::F32;
      const float* g = fu.grad_shard_rounding(&r);
      const bool round = r != DType::F32;
      if (round) rdt = r;  // (one reduce_dtype for the model)
      (round ? xr : xs).push_back(g);
      (round ? nr : ns).push_back(static_cast<size_t>(fu.shard_size()));
      (round ? atr : at).push_back(u);
    }
  }
  const int k0 = static_cast<int>(xs.size()), k = k0 + static_cast<int>(xr.size());
  double* sums = I.sum_at(Impl::kLossSlots);
  I.ops->sum_squares_into(xs.data(), ns.data(), k0, sums);
  if (!xr.empty())
    I.ops->sum_squares_rounded_into(rdt, xr.data(), nr.data(), k - k0, sums + k0);
  at.insert(at.end(), atr.begin(), atr.end());
  const std::vector<double> got = I.read_sums(k);
  for (size_t i = 0; i < at.size(); ++i) per[at[i]] = got[i];
  double ss = 0;
  for (double v : per) ss += v;
  return std::sqrt(sum_over_ranks(*I.shard_host, ss));
}

void ShardedModel::zero_grads() {
  Impl& I = *impl_;
  I.complete_reductions(-1);
  // A deferred update still needs its unit's gradients: they are zeroed right after it.
  for (auto& fu : I.units)
    if (I.deferred && I.defers[size_t(fu->index())])
      I.zero_after_update[size_t(fu->index())] = true;
    else
      fu->zero_grads();
}

void ShardedModel::optimizer_step(const AdamWParams& p, float lr, float grad_mult, int step) {
  SW_CHECK(step >= 1, "AdamW steps count from 1");
  Impl& I = *impl_;
  I.flush_deferred(model_);  // two steps without a micro-step between them
  I.sync_grads();
  ExecState st;
  Batch none;
  st.batch = &none;
  st.adam = &p;
  st.lr = lr;
  st.grad_mult = grad_mult;
  st.step = step;
  I.run(model_, I.opt_plan, st);
  // The deferred units' updates wait for the next micro-step's forward (or a flush).
  if (!I.flush_plan.actions.empty()) I.deferred = Impl::DeferredStep{p, lr, grad_mult, step};
}

int ShardedModel::host_updates_in_flight() const {
  int n = 0;
  for (const auto& fu : impl_->units) n += fu->update_pending() ? 1 : 0;
  return n;
}

double ShardedModel::host_update_seconds() const { return double(impl_->host_update_ns) * 1e-9; }

void ShardedModel::hold_host_updates(bool on) { impl_->updater().hold(on); }

HostWorker& ShardedModel::Impl::updater() {
  if (!host_updater)
    host_updater = std::make_unique<HostWorker>([t = num_threads()] { set_num_threads(t); });
  return *host_updater;
}

void ShardedModel::Impl::accumulate_on_host(FlatUnit& fu) {
  const size_t Sh = static_cast<size_t>(fu.shard_size());
  const DType rdt = fu.reduce_dtype();
  const size_t bytes = Sh * dtype_size(rdt);
  float* shard = fu.grad_shard();  // host; waits for this unit's earlier host work
  auto block = std::make_shared<Buffer>(bytes, Mem::Communication, Device::cpu(), Tier::Host);
  // The reduction is complete (its Work was waited for): no need to wait for the compute
  // stream. The compute stream waits for the copy before the unsharded gradients are freed
  // or zeroed (release_reduced, in stream order).
  auto down = copy_bytes_async(block->data(), Device::cpu(), fu.reduced_block(), ops->device(),
                               bytes, completed_event().get());
  ops->stream().wait_event(*down);
  fu.release_reduced();
  const Ops& cpu_ops = ops_for(Device::cpu());
  fu.set_pending_update(updater().post([=, &cpu_ops] {
                          down->synchronize();
                          FlatUnit::add_block(cpu_ops, shard, block->data(), rdt, Sh);
                        }),
                        false);
  if (host_update_sync) fu.settle();
}

void ShardedModel::Impl::set_deferred(ExecState& st) const {
  st.adam = &deferred->adam;
  st.lr = deferred->lr;
  st.grad_mult = deferred->grad_mult;
  st.step = deferred->step;
}

void ShardedModel::Impl::flush_deferred(Model& model) {
  if (!deferred) return;
  ExecState st;
  Batch none;
  st.batch = &none;
  set_deferred(st);
  run(model, flush_plan, st);  // zeroes the gradients left for after each update
  deferred.reset();
}

void ShardedModel::Impl::update_unit(FlatUnit& fu, const ExecState& st, int64_t lo, int64_t hi) {
  // Stage 1: a previous regather must be complete (it reads this rank's slice). Sharded: a
  // gather prefetched after a previous update reads the master and is stale after this one.
  if (fu.kind() == FlatUnit::Kind::FullReplicated) fu.wait_unshard();
  if (fu.kind() == FlatUnit::Kind::Sharded && fu.holds_gathered()) {
    fu.wait_unshard();
    fu.reshard();
  }
  if (fu.moments_on_host()) {
    update_on_host(fu, st, lo, hi);
    return;
  }
  if (fu.moments_on_nvme() && !ops->device().is_cpu()) {
    // Moments on NVMe with a device: the piece staged on the host is updated there like
    // offload_optimizer cpu, and waited for here, since its Evict writes the staging next.
    update_on_host(fu, st, lo, hi);
    fu.settle();
    return;
  }
  const AdamWParams& p = *st.adam;
  const Range shard = fu.shard_range();
  const Range part{shard.lo + lo, shard.lo + hi};
  float* master = fu.master() + lo;
  // A one-rank unit keeping its parameters 16-bit, its master beside them on the device: the
  // update writes the compute copies as it goes (Ops::adamw_copies; the alignment gaps keep
  // the zeros finish_init wrote), so no regather reads the master again; it also reads
  // gradients whose rounding to reduce_dtype is pending rounded (FlatUnit::round_grads).
  uint16_t* p16 = fu.kind() == FlatUnit::Kind::Whole && fu.split_master() &&
                          fu.master_device() == ops->device()
                      ? fu.full16()
                      : nullptr;
  DType grad_dt = DType::F32;
  const float* grad = (p16 ? fu.grad_shard_rounding(&grad_dt) : fu.grad_shard()) + lo;
  for (size_t s = 0; s < fu.layout().specs.size(); ++s) {
    const FlatEntry& e = fu.layout().entries[s];
    const Range r = intersect(part, {e.offset, e.offset + e.numel});
    if (r.empty()) continue;
    const size_t off = static_cast<size_t>(r.lo - shard.lo);  // into the shard
    const size_t poff = static_cast<size_t>(r.lo - part.lo);  // into this part
    const float wd = fu.layout().specs[s].weight_decay ? p.weight_decay : 0.f;
    const size_t n = static_cast<size_t>(r.hi - r.lo);
    if (p16) {
      const size_t in = static_cast<size_t>(r.lo - e.offset);  // into the parameter
      float* c32 = fu.params()[s] ? fu.params()[s] + in : nullptr;  // (none: a product weight)
      ops->adamw_copies(master + poff, grad + poff, fu.adam_m() + off, fu.adam_v() + off, n,
                        st.lr, p.beta1, p.beta2, p.eps, wd, st.step, st.grad_mult,
                        fu.param_dtype(), c32, p16 + r.lo, grad_dt);
    } else {
      ops->adamw(master + poff, grad + poff, fu.adam_m() + off, fu.adam_v() + off, n, st.lr,
                 p.beta1, p.beta2, p.eps, wd, st.step, st.grad_mult);
    }
  }
  // A split fp32 master with one rank re-rounds the compute copy (no communication); stage 1's
  // all-gather of the updated slices is the plan's Regather action.
  if (fu.kind() == FlatUnit::Kind::Whole && hi == fu.shard_size() && !p16) fu.issue_regather();
}

// One update's master and gradient copies down to the host (update_on_host). `mark`: the
// compute stream's work when the update was issued (what produced the gradients); the copies
// start after it, into host staging from the Tier::Host pool (pinned once a GPU registered
// pinning). Issued by the updater thread: by the update's own job, or by the job before it,
// so that they run while that one computes.
struct HostCopyDown {
  std::mutex mu;
  bool issued = false;
  std::shared_ptr<Event> mark;
  Device dev;
  float* master = nullptr;  // on the device when copy_master, else on the host
  const float* grad = nullptr;
  bool copy_master = false, copy_grad = false;
  size_t n = 0;
  Buffer stage;
  std::shared_ptr<Event> got_master, got_grad;
  float* hmaster = nullptr;  // the host master updated in place: staging or the master itself
  const float* hgrad = nullptr;
  void issue() {
    std::lock_guard<std::mutex> l(mu);
    if (issued) return;
    issued = true;
    const Device cpu = Device::cpu();
    const size_t nb = n * sizeof(float);
    hmaster = master;
    hgrad = grad;
    if (!copy_master && !copy_grad) return;
    stage = Buffer((copy_master + copy_grad) * nb, Mem::Optimizer, cpu, Tier::Host);
    float* q = stage.f32();
    if (copy_master) {
      got_master = copy_bytes_async(q, cpu, master, dev, nb, mark.get());
      hmaster = q;
      q += n;
    }
    if (copy_grad) {
      got_grad = copy_bytes_async(q, cpu, grad, dev, nb, mark.get());
      hgrad = q;
    }
  }
};

// The updates posted to the host updater whose jobs have not started, in posting order.
struct HostCopyQueue {
  std::mutex mu;
  std::deque<std::shared_ptr<HostCopyDown>> q;
};

// On a device with the moments in host memory (offload_optimizer cpu; offload_param cpu puts
// the master and gradient shards there too): the update runs on the CPU with the CPU's AdamW
// (ZeRO-Offload), on the host updater thread, over host copies of whichever of this part's
// master and gradient are on the device. Here the job is posted with the compute stream's
// mark; the job issues its copies down and the next job's (at most two updates' staging
// exist at once: StepPlan::host_update_staging), waits for its own, updates, and copies an
// updated device master back. The unit is the update's until it settles (FlatUnit::
// set_pending_update): the device meanwhile runs whatever does not touch it, the next step's
// forward of the units updated before it included. Same arithmetic as the device's AdamW where
// that equals the CPU's (the simulated accelerator: bit for bit).
void ShardedModel::Impl::update_on_host(FlatUnit& fu, const ExecState& st, int64_t lo,
                                        int64_t hi) {
  struct Piece {
    size_t off, poff, n;  // into the shard, into this part, floats
    float wd;
  };
  const AdamWParams p = *st.adam;
  const Range shard = fu.shard_range();
  const Range part{shard.lo + lo, shard.lo + hi};
  std::vector<Piece> pieces;
  for (size_t s = 0; s < fu.layout().specs.size(); ++s) {
    const FlatEntry& e = fu.layout().entries[s];
    const Range r = intersect(part, {e.offset, e.offset + e.numel});
    if (r.empty()) continue;
    pieces.push_back({static_cast<size_t>(r.lo - shard.lo), static_cast<size_t>(r.lo - part.lo),
                      static_cast<size_t>(r.hi - r.lo),
                      fu.layout().specs[s].weight_decay ? p.weight_decay : 0.f});
  }
  const Device dev = ops->device(), cpu = Device::cpu();
  auto down = std::make_shared<HostCopyDown>();
  down->dev = dev;
  down->copy_master = !fu.master_device().is_cpu();
  down->copy_grad = !fu.grad_device().is_cpu();
  down->n = static_cast<size_t>(hi - lo);
  float* master = fu.master() + lo;  // on master_device()
  down->master = master;
  down->grad = fu.grad_shard() + lo;
  down->mark = ops->stream().record();
  float* m = fu.adam_m();
  float* v = fu.adam_v();
  const size_t nb = down->n * sizeof(float);
  const float lr = st.lr, grad_mult = st.grad_mult;
  const int step = st.step;
  const Ops& cpu_ops = ops_for(cpu);
  const int delay_us = host_update_delay_us;
  std::atomic<int64_t>* busy_ns = &host_update_ns;
  if (!host_copies) host_copies = std::make_shared<HostCopyQueue>();
  std::shared_ptr<HostCopyQueue> queue = host_copies;
  // The job's own record (Queue::Host), when a recorder is set now.
  std::shared_ptr<HostSpans> spans = recorder ? host_spans : nullptr;
  ActionRecord span;
  span.kind = ActionKind::OptimizerUpdate;
  span.queue = Queue::Host;
  span.unit = fu.index();
  span.bytes = static_cast<int64_t>(nb);
  {
    std::lock_guard<std::mutex> l(queue->mu);
    queue->q.push_back(down);
  }
  auto job = [=, &cpu_ops]() mutable {
    std::shared_ptr<HostCopyDown> next;
    {
      std::lock_guard<std::mutex> l(queue->mu);
      if (!queue->q.empty() && queue->q.front() == down) queue->q.pop_front();
      if (!queue->q.empty()) next = queue->q.front();
    }
    if (delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
    const auto t0 = std::chrono::steady_clock::now();
    if (spans) span.t_begin = trace_clock();
    down->issue();
    if (next) next->issue();  // its copies run while this update computes
    if (down->got_master) down->got_master->synchronize();
    if (down->got_grad) down->got_grad->synchronize();
    for (const Piece& pc : pieces)
      cpu_ops.adamw(down->hmaster + pc.poff, down->hgrad + pc.poff, m + pc.off, v + pc.off, pc.n,
                    lr, p.beta1, p.beta2, p.eps, pc.wd, step, grad_mult);
    // Nothing on the device touches the master until the unit settles: no wait for its work.
    if (down->copy_master)
      copy_bytes_async(master, dev, down->hmaster, cpu, nb, completed_event().get())->synchronize();
    down->stage = Buffer();  // back to the pool, on the worker
    *busy_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::steady_clock::now() - t0).count();
    if (spans) {
      span.t_end = trace_clock();
      std::lock_guard<std::mutex> l(spans->mu);
      spans->done.push_back(span);
    }
  };
  fu.set_pending_update(updater().post(std::move(job)),
                        fu.kind() == FlatUnit::Kind::Whole && hi == fu.shard_size());
  if (host_update_sync) fu.settle();
}

}  // namespace sw

// ---- NVMe optimizer offload ------------------------------------------------------------------

namespace sw {

namespace {

// The three offload files (moments, parameters, activations) share their set-up: a directory
// per rank under the key's path, a free-space check, and blocks reserved with fallocate.
int64_t align_up(int64_t x) {
  const int64_t a = static_cast<int64_t>(kAioAlign);
  return (x + a - 1) / a * a;
}

// Creates <root>/rank_<rank>; sw::Error naming `key` otherwise.
std::string offload_dir(const std::string& key, const std::string& root, int rank) {
  const std::string dir = root + "/rank_" + std::to_string(rank);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail("offload", key + " '" + root + "': cannot create " + dir + " (" + ec.message() + ")");
  return dir;
}

// sw::Error naming `key` when `dir`'s filesystem has less than `bytes` free.
void check_room(const std::string& key, const std::string& root, const std::string& dir,
                int rank, int64_t bytes, const char* what) {
  struct statvfs vfs {};
  if (::statvfs(dir.c_str(), &vfs) != 0) return;
  const uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  if (free_bytes < static_cast<uint64_t>(bytes))
    fail("offload", key + " '" + root + "': rank " + std::to_string(rank) + " needs " +
                        format_bytes(static_cast<size_t>(bytes)) + " for " + what + ", " +
                        format_bytes(free_bytes) + " free");
}

// Reserves [0, bytes) of fd's file (zeros where new), so that a disk filling up later cannot
// fail a write in the middle of a step (where the filesystem allows it). Returns 0 or errno.
int reserve_blocks(int fd, int64_t bytes) {
  int err = ::posix_fallocate(fd, 0, bytes);
  if (err == EOPNOTSUPP || err == EINVAL) err = ::ftruncate(fd, bytes) == 0 ? 0 : errno;
  return err;
}

// Creates (truncates: a killed run's stale file goes) `path` through the aio engine.
AioFile create_file(const std::string& key, const std::string& root, const std::string& path,
                    bool o_direct) {
  try {
    return AioFile::create(path, 0, o_direct);
  } catch (const Error& e) {  // "aio: <path>: cannot create: <strerror> (errno <e>)"
    fail("offload", key + " '" + root + "': " + std::string(e.what()).substr(5));
  }
}

}  // namespace

NvmeMoments::~NvmeMoments() {
  io.drain();  // nothing may still use the file
  MemTracker::of(Tier::Nvme).sub(Mem::Optimizer, static_cast<size_t>(tracked));
  if (file.is_open()) {
    io.detach(fd);
    file.close();
    ::unlink(path.c_str());
    ::rmdir(dir.c_str());  // only if empty
  }
}

void ShardedModel::Impl::setup_nvme(int rank) {
  const OptimizerOffload& oo = policy.offload_optimizer;
  int64_t total = 0;
  int n = 0;
  std::vector<int64_t> offset(units.size(), -1);
  for (size_t u = 0; u < units.size(); ++u) {
    if (!units[u]->moments_on_nvme()) continue;
    const int64_t bytes = 2 * units[u]->shard_size() * static_cast<int64_t>(sizeof(float));
    // Each region starts on a 4096-byte boundary, so the pieces of OptimizerOffload::piece()
    // floats (32 MiB) are all O_DIRECT-aligned.
    offset[u] = align_up(total);
    total = offset[u] + bytes;
    ++n;
  }
  if (n == 0) return;
  auto nv = std::make_unique<NvmeMoments>(policy.aio);  // throws if a forced io_uring is refused
  const std::string key = "zero_optimization.offload_optimizer.nvme_path";
  nv->dir = offload_dir(key, oo.nvme_path, rank);
  check_room(key, oo.nvme_path, nv->dir, rank, total, "the optimizer state");
  nv->path = nv->dir + "/optimizer.bin";
  nv->file = create_file(key, oo.nvme_path, nv->path, policy.aio.o_direct);
  nv->fd = nv->file.fd();
  const int err = reserve_blocks(nv->fd, total);  // zeros: AdamW's initial moments
  if (err != 0)
    fail("offload", nv->path + ": cannot reserve " + std::to_string(total) + " bytes (" +
                        std::strerror(err) + ")");
  nv->offset = std::move(offset);
  for (int i = 0; i < opt_plan.staging_slots; ++i)
    nv->slots.push_back(aligned_staging(static_cast<size_t>(opt_plan.staging_bytes), Mem::Optimizer,
                                        plan_in.on_device ? Tier::Host : Tier::Device, false, true));
  nv->io.attach(nv->file);
  nv->tracked = total;  // the file's bytes, on the NVMe tier (Tier::Nvme counts files)
  MemTracker::of(Tier::Nvme).add(Mem::Optimizer, static_cast<size_t>(total));
  nvme = std::move(nv);
}

}  // namespace sw

// ---- NVMe parameters -------------------------------------------------------------------------

namespace sw {

NvmeParams::~NvmeParams() {
  MemTracker::of(Tier::Nvme).sub(Mem::Params, static_cast<size_t>(tracked_master));
  MemTracker::of(Tier::Nvme).sub(Mem::Grads, static_cast<size_t>(tracked_grads));
  if (io && !own_io) io->drain();  // the moments' stream outlives this: nothing left queued
  own_io.reset();                  // finishes what is queued before the file goes
  if (file.is_open()) {
    file.close();
    ::unlink(path.c_str());
    ::rmdir(dir.c_str());  // only if empty
  }
}

float* NvmeParams::scratch(int64_t floats, const Device& dev) {
  const size_t bytes = static_cast<size_t>(floats) * sizeof(float);
  if (tmp.bytes() < bytes) tmp = Buffer(bytes, Mem::Checkpoint, dev);
  return tmp.f32();
}

void NvmeParams::transfer(float* buf, int64_t n, int64_t off, bool write) {
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  IoEventPtr e = write ? io->write(fd, path, buf, bytes, off) : io->read(fd, path, buf, bytes, off);
  e->synchronize();
}

void ShardedModel::Impl::setup_nvme_params(int rank) {
  int64_t total = 0, largest = 0;
  std::vector<int64_t> moff(units.size(), -1), goff(units.size(), -1);
  for (size_t u = 0; u < units.size(); ++u) {
    if (!units[u]->params_on_nvme()) continue;
    const int64_t bytes = units[u]->shard_size() * static_cast<int64_t>(sizeof(float));
    moff[u] = total;
    goff[u] = align_up(total + bytes);
    total = align_up(goff[u] + bytes);
    largest = std::max(largest, units[u]->shard_size());
  }
  if (total == 0) return;
  auto pv = std::make_unique<NvmeParams>();
  const std::string key = "zero_optimization.offload_param.nvme_path";
  const std::string& root = policy.offload_param.nvme_path;
  pv->dir = offload_dir(key, root, rank);
  check_room(key, root, pv->dir, rank, total, "the parameter and gradient shards");
  pv->path = pv->dir + "/params.bin";
  pv->file = create_file(key, root, pv->path, policy.aio.o_direct);
  pv->fd = pv->file.fd();
  const int err = reserve_blocks(pv->fd, total);
  if (err != 0)
    fail("offload", pv->path + ": cannot reserve " + std::to_string(total) + " bytes (" +
                        std::strerror(err) + ")");
  pv->moff = std::move(moff);
  pv->goff = std::move(goff);
  if (nvme) {
    pv->io = &nvme->io;
  } else {
    pv->own_io = std::make_unique<IoStream>(policy.aio);
    pv->io = pv->own_io.get();
  }
  pv->io->attach(pv->file);
  const Device dev = Device::cpu();  // read and written by the file: host memory on a device too
  const size_t sb = static_cast<size_t>(largest) * sizeof(float);
  // The plan's figures (step_plan.cpp fill_persistent) size what is allocated here.
  SW_CHECK(opt_plan.shard_bytes == static_cast<int64_t>(sb), "NVMe parameter staging size");
  // Memory of their own (Buffer::fresh): sized for the largest shard, most units use part of
  // them, and the planner's RSS model counts the pages no transfer writes out.
  const Tier tier = plan_in.on_device ? Tier::Host : Tier::Device;  // the plan's tier for them
  for (int k = 0; k < opt_plan.param_slots; ++k)
    pv->pslots.push_back(Buffer::fresh(sb, Mem::Params, dev, tier));
  for (int k = 0; k < opt_plan.grad_slots; ++k)
    pv->gslots.push_back(Buffer::fresh(sb, Mem::Grads, dev, tier));
  pv->gbusy.resize(pv->gslots.size());
  pv->pbusy.resize(pv->pslots.size());
  if (!nvme)
    for (int k = 0; k < opt_plan.staging_slots; ++k)
      pv->opt_slots.push_back(
          Buffer::fresh(static_cast<size_t>(opt_plan.staging_bytes), Mem::Optimizer, dev, tier));
  for (size_t u = 0; u < units.size(); ++u)
    if (units[u]->params_on_nvme()) {  // the file's bytes by role, on the NVMe tier
      const int64_t b = units[u]->shard_size() * static_cast<int64_t>(sizeof(float));
      pv->tracked_master += b;
      pv->tracked_grads += b;
    }
  MemTracker::of(Tier::Nvme).add(Mem::Params, static_cast<size_t>(pv->tracked_master));
  MemTracker::of(Tier::Nvme).add(Mem::Grads, static_cast<size_t>(pv->tracked_grads));
  pv->gfetch.resize(units.size());
  pv->sumsq.assign(units.size(), 0.0);
  pnvme = std::move(pv);
}

void ShardedModel::Impl::stage_whole(FlatUnit& fu, bool grads) {
  NvmeParams& pv = *pnvme;
  const int64_t Sh = fu.shard_size();
  const size_t u = static_cast<size_t>(fu.index());
  float* m = pv.scratch(2 * Sh, Device::cpu());
  pv.transfer(m, Sh, pv.moff[u], false);
  fu.stage_master(m);
  if (grads) {
    if (fu.grads_zero())
      ops_for(Device::cpu()).fill(m + Sh, 0.f, static_cast<size_t>(Sh));
    else
      pv.transfer(m + Sh, Sh, pv.goff[u], false);
    fu.stage_grad(m + Sh);
  }
}

void ShardedModel::Impl::unstage_whole(FlatUnit& fu, bool write_master) {
  NvmeParams& pv = *pnvme;
  if (write_master)
    pv.transfer(fu.master(), fu.shard_size(), pv.moff[static_cast<size_t>(fu.index())], true);
  fu.stage_master(nullptr);
  fu.stage_grad(nullptr);
  pv.tmp.release();  // initialisation and exports: not held between steps
}

void ShardedModel::Impl::accumulate_nvme(FlatUnit& fu) {
  NvmeParams& pv = *pnvme;
  const int64_t Sh = fu.shard_size();
  const size_t u = static_cast<size_t>(fu.index());
  float* g = pv.scratch(2 * Sh, Device::cpu()) + Sh;
  if (!fu.grads_zero()) pv.transfer(g, Sh, pv.goff[u], false);
  fu.stage_grad(g);
  fu.accumulate_reduced();
  pv.sumsq[u] = ops_for(Device::cpu()).sum_squares(g, static_cast<size_t>(Sh));
  pv.transfer(g, Sh, pv.goff[u], true);
  fu.stage_grad(nullptr);
  pv.tmp.release();
}

}  // namespace sw

// ---- Activation offload to NVMe --------------------------------------------------------------

namespace sw {

NvmeActs::~NvmeActs() {
  io.drain();
  MemTracker::of(Tier::Nvme).sub(Mem::Activations, static_cast<size_t>(reserved));
  writing.clear();
  if (file.is_open()) {
    file.close();
    ::unlink(path.c_str());
    ::rmdir(dir.c_str());  // only if empty
  }
}

void ShardedModel::Impl::reserve_acts(int64_t end) {
  const std::string key = "activation_checkpointing.nvme_path";
  const std::string& root = policy.activation_checkpointing.nvme_path;
  if (!anvme) {
    auto A = std::make_unique<NvmeActs>(policy.aio);
    A->dir = offload_dir(key, root, rank);
    A->path = A->dir + "/activations.bin";
    A->file = create_file(key, root, A->path, policy.aio.o_direct);
    A->fd = A->file.fd();
    A->io.attach(A->file);
    anvme = std::move(A);
  }
  NvmeActs& A = *anvme;
  if (end <= A.reserved) return;
  const int64_t want = std::max(end, A.reserved * 2);  // grows rarely (the first micro-step)
  check_room(key, root, A.dir, rank, end - A.reserved, "offloaded activations");
  int err = reserve_blocks(A.fd, want);
  if (err == ENOSPC && want > end) {  // the doubling asked too much: exactly what is needed
    err = reserve_blocks(A.fd, end);
    if (err == 0) {
      MemTracker::of(Tier::Nvme).add(Mem::Activations, static_cast<size_t>(end - A.reserved));
      A.reserved = end;
      return;
    }
  }
  if (err != 0)
    fail("offload", A.path + ": cannot reserve " + std::to_string(want) + " bytes (" +
                        std::strerror(err) + ")");
  MemTracker::of(Tier::Nvme).add(Mem::Activations, static_cast<size_t>(want - A.reserved));
  A.reserved = want;
}

}  // namespace sw
