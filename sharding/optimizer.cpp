// The optimizer side of a step: the global gradient norm, zeroing, and the optimizer segment of
// the step plan (AdamW per unit on the fp32 master shard; stage 1 regathers the updated slices;
// sharded strategies prefetch the next forward's first units while later updates run).
#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/bytes.h"
#include "core/error.h"
#include "sharding/sharded_model_impl.h"

namespace sw {

double ShardedModel::grad_norm() const {
  Impl& I = *impl_;
  I.sync_grads();
  // Sum of squares of this rank's reduced gradient shard (alignment gaps and padding are never
  // written, so they stay zero), summed over the shard group; replicas hold equal shards.
  double ss = 0;
  for (const auto& fu : I.units)
    ss += I.ops->sum_squares(fu->grad_shard(), static_cast<size_t>(fu->shard_size()));
  return std::sqrt(sum_over_ranks(*I.shard, ss));
}

void ShardedModel::zero_grads() {
  Impl& I = *impl_;
  I.complete_reductions(-1);
  for (auto& fu : I.units) fu->zero_grads();
}

void ShardedModel::optimizer_step(const AdamWParams& p, float lr, float grad_mult, int step) {
  SW_CHECK(step >= 1, "AdamW steps count from 1");
  Impl& I = *impl_;
  I.sync_grads();
  ExecState st;
  Batch none;
  st.batch = &none;
  st.adam = &p;
  st.lr = lr;
  st.grad_mult = grad_mult;
  st.step = step;
  I.run(model_, I.opt_plan, st);
}

void ShardedModel::Impl::update_unit(FlatUnit& fu, const ExecState& st, int64_t lo, int64_t hi) {
  // Stage 1: a previous regather must be complete (it reads this rank's slice). Sharded: a
  // gather prefetched after a previous update reads the master and is stale after this one.
  if (fu.kind() == FlatUnit::Kind::FullReplicated) fu.wait_unshard();
  if (fu.kind() == FlatUnit::Kind::Sharded && fu.holds_gathered()) {
    fu.wait_unshard();
    fu.reshard();
  }
  const AdamWParams& p = *st.adam;
  const Range shard = fu.shard_range();
  const Range part{shard.lo + lo, shard.lo + hi};
  for (size_t s = 0; s < fu.layout().specs.size(); ++s) {
    const FlatEntry& e = fu.layout().entries[s];
    const Range r = intersect(part, {e.offset, e.offset + e.numel});
    if (r.empty()) continue;
    const size_t off = static_cast<size_t>(r.lo - shard.lo);
    const float wd = fu.layout().specs[s].weight_decay ? p.weight_decay : 0.f;
    ops->adamw(fu.master() + off, fu.grad_shard() + off, fu.adam_m() + off, fu.adam_v() + off,
               static_cast<size_t>(r.hi - r.lo), st.lr, p.beta1, p.beta2, p.eps, wd, st.step,
               st.grad_mult);
  }
  // A split fp32 master with one rank re-rounds the compute copy (no communication); stage 1's
  // all-gather of the updated slices is the plan's Regather action.
  if (fu.kind() == FlatUnit::Kind::Whole && hi == fu.shard_size()) fu.issue_regather();
}

}  // namespace sw

// ---- NVMe optimizer offload ------------------------------------------------------------------

namespace sw {

NvmeMoments::~NvmeMoments() {
  io.drain();  // nothing may still use the file
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
    offset[u] = (total + int64_t(kAioAlign) - 1) / int64_t(kAioAlign) * int64_t(kAioAlign);
    total = offset[u] + bytes;
    ++n;
  }
  if (n == 0) return;
  auto nv = std::make_unique<NvmeMoments>(policy.aio);  // throws if a forced io_uring is refused
  const std::string key = "zero_optimization.offload_optimizer.nvme_path";
  nv->dir = oo.nvme_path + "/rank_" + std::to_string(rank);
  std::error_code ec;
  std::filesystem::create_directories(nv->dir, ec);
  if (ec) fail("offload", key + " '" + oo.nvme_path + "': cannot create " + nv->dir + " (" + ec.message() + ")");
  struct statvfs vfs {};
  if (::statvfs(nv->dir.c_str(), &vfs) == 0) {
    const uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    if (free_bytes < static_cast<uint64_t>(total))
      fail("offload", key + " '" + oo.nvme_path + "': rank " + std::to_string(rank) + " needs " +
                          format_bytes(static_cast<size_t>(total)) + " for the optimizer state, " +
                          format_bytes(free_bytes) + " free");
  }
  nv->path = nv->dir + "/optimizer.bin";  // a stale one from a killed run is truncated
  try {
    nv->file = AioFile::create(nv->path, 0, policy.aio.o_direct);
  } catch (const Error& e) {  // "aio: <path>: cannot create: <strerror> (errno <e>)"
    fail("offload", key + " '" + oo.nvme_path + "': " + std::string(e.what()).substr(5));
  }
  nv->fd = nv->file.fd();
  // Zeros (AdamW's initial moments), with the blocks reserved now so that a disk filling up
  // later cannot fail a write in the middle of a step (where the filesystem allows it).
  int err = ::posix_fallocate(nv->fd, 0, total);
  if (err == EOPNOTSUPP || err == EINVAL) err = ::ftruncate(nv->fd, total) == 0 ? 0 : errno;
  if (err != 0)
    fail("offload", nv->path + ": cannot reserve " + std::to_string(total) + " bytes (" +
                        std::strerror(err) + ")");
  nv->offset = std::move(offset);
  for (int i = 0; i < opt_plan.staging_slots; ++i)
    nv->slots.push_back(aligned_staging(static_cast<size_t>(opt_plan.staging_bytes),
                                        Mem::Optimizer, Tier::Device, false));
  nv->io.attach(nv->file);
  nvme = std::move(nv);
}

}  // namespace sw
