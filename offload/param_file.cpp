#include "offload/param_file.h"

#include <algorithm>

#include "core/error.h"

namespace sw {

namespace {
const char* const kKey = "zero_optimization.offload_param.nvme_path";
}  // namespace

// Each region 4096-aligned.
ParamFile::Regions ParamFile::regions(const std::vector<int64_t>& shard_floats) {
  Regions r;
  r.moff.assign(shard_floats.size(), -1);
  r.goff.assign(shard_floats.size(), -1);
  for (size_t u = 0; u < shard_floats.size(); ++u) {
    if (shard_floats[u] < 0) continue;
    const int64_t bytes = shard_floats[u] * int64_t(sizeof(float));
    r.shards += bytes;
    r.moff[u] = r.total;
    r.goff[u] = aio_align_up(r.total + bytes);
    r.total = aio_align_up(r.goff[u] + bytes);
  }
  return r;
}

ParamFile::ParamFile(const AioConfig& aio, const std::string& nvme_path, int rank,
                     const std::vector<int64_t>& shard_floats, IoStream* shared_io,
                     const Staging& st)
    : ParamFile(aio, nvme_path, rank, regions(shard_floats), shared_io, st) {}

ParamFile::ParamFile(const AioConfig& aio, const std::string& nvme_path, int rank, Regions r,
                     IoStream* shared_io, const Staging& st)
    : moff_(std::move(r.moff)),
      goff_(std::move(r.goff)),
      own_io_(shared_io ? nullptr : std::make_unique<IoStream>(aio)),
      io_(shared_io ? shared_io : own_io_.get()),
      file_(kKey, nvme_path, rank, "params.bin", aio.o_direct, r.total,
            "the parameter and gradient shards") {
  file_.reserve_or_fail(r.total);
  io_->attach(file_.file());
  // Read and written by the file: host memory on a device too. Memory of their own
  // (Buffer::fresh): sized for the largest shard, most units use part of them, and the
  // planner's RSS model counts the pages no transfer writes out.
  const Device cpu = Device::cpu();
  const size_t sb = static_cast<size_t>(st.shard_bytes);
  for (int k = 0; k < st.param_slots; ++k) pslots_.push_back(Buffer::fresh(sb, Mem::Params, cpu, st.tier));
  for (int k = 0; k < st.grad_slots; ++k) gslots_.push_back(Buffer::fresh(sb, Mem::Grads, cpu, st.tier));
  for (int k = 0; k < st.opt_slots; ++k)
    oslots_.push_back(
        Buffer::fresh(static_cast<size_t>(st.opt_slot_bytes), Mem::Optimizer, cpu, st.tier));
  gbusy_.resize(gslots_.size());
  pbusy_.resize(pslots_.size());
  gfetch_.resize(moff_.size());
  sumsq_.assign(moff_.size(), 0.0);
  // The file's bytes by role, on the NVMe tier.
  file_.track(Mem::Params, r.shards);
  file_.track(Mem::Grads, r.shards);
}

ParamFile::~ParamFile() {
  if (!own_io_) {
    io_->drain();  // the moments' queue outlives this: nothing of ours left queued
    io_->detach(file_.fd());
  }
  own_io_.reset();  // finishes what is queued before the file goes
}

IoEventPtr ParamFile::read(float* buf, int64_t n, int64_t off, std::shared_ptr<Event> after) {
  return io_->read(file_.fd(), file_.path(), buf, static_cast<size_t>(n) * sizeof(float), off,
                   std::move(after));
}

IoEventPtr ParamFile::write(const float* buf, int64_t n, int64_t off) {
  return io_->write(file_.fd(), file_.path(), buf, static_cast<size_t>(n) * sizeof(float), off);
}

void ParamFile::transfer(float* buf, int64_t n, int64_t off, bool write_it) {
  IoEventPtr e = write_it ? write(buf, n, off) : read(buf, n, off);
  e->synchronize();
}

std::vector<const Buffer*> ParamFile::host_staging() const {
  std::vector<const Buffer*> out;
  for (const auto* v : {&pslots_, &gslots_, &oslots_})
    for (const Buffer& b : *v)
      if (b.device().is_cpu()) out.push_back(&b);
  return out;
}

float* ParamFile::scratch(int64_t floats) {
  const size_t bytes = static_cast<size_t>(floats) * sizeof(float);
  if (tmp_.bytes() < bytes) tmp_ = Buffer(bytes, Mem::Checkpoint, Device::cpu());
  return tmp_.f32();
}

}  // namespace sw
