#include "offload/moments_file.h"

#include <algorithm>

#include "core/error.h"

namespace sw {

namespace {

const char* const kKey = "zero_optimization.offload_optimizer.nvme_path";

// Each unit's region starts on a 4096-byte boundary, so that pieces of OptimizerOffload::
// piece() floats (32 MiB) are all O_DIRECT-aligned; -1 for units not in the file.
std::vector<int64_t> regions(const std::vector<int64_t>& shard_floats) {
  std::vector<int64_t> off(shard_floats.size(), -1);
  int64_t end = 0;
  for (size_t u = 0; u < shard_floats.size(); ++u) {
    if (shard_floats[u] < 0) continue;
    off[u] = aio_align_up(end);
    end = off[u] + 2 * shard_floats[u] * int64_t(sizeof(float));
  }
  return off;
}

// The file's size: the end of its last region.
int64_t file_bytes(const std::vector<int64_t>& off, const std::vector<int64_t>& shard_floats) {
  int64_t end = 0;
  for (size_t u = 0; u < off.size(); ++u)
    if (off[u] >= 0) end = off[u] + 2 * shard_floats[u] * int64_t(sizeof(float));
  return end;
}

}  // namespace

MomentsFile::MomentsFile(const AioConfig& aio, const std::string& nvme_path, int rank,
                         const std::vector<int64_t>& shard_floats, int slots, int64_t slot_bytes,
                         Tier staging_tier)
    : io_(aio),
      offset_(regions(shard_floats)),
      file_(kKey, nvme_path, rank, "optimizer.bin", aio.o_direct,
            file_bytes(offset_, shard_floats), "the optimizer state") {
  const int64_t total = file_bytes(offset_, shard_floats);
  file_.reserve_or_fail(total);  // zeros: AdamW's initial moments
  for (int i = 0; i < slots; ++i)
    slots_.push_back(aligned_staging(static_cast<size_t>(slot_bytes), Mem::Optimizer, staging_tier,
                                     false, true));
  io_.attach(file_.file());
  file_.track(Mem::Optimizer, total);  // the file's bytes, on the NVMe tier
}

MomentsFile::~MomentsFile() {
  io_.drain();  // nothing may still use the file
  io_.detach(file_.fd());
}

IoEventPtr MomentsFile::read_piece(int u, int64_t lo, int64_t hi, float* buf) {
  SW_CHECK(holds(u), "io action on a unit whose moments are not on NVMe");
  const int64_t off = offset_[size_t(u)] + 2 * lo * int64_t(sizeof(float));
  return io_.read(file_.fd(), file_.path(), buf, size_t(2 * (hi - lo)) * sizeof(float), off);
}

IoEventPtr MomentsFile::write_piece(int u, int64_t lo, int64_t hi, const float* buf) {
  SW_CHECK(holds(u), "io action on a unit whose moments are not on NVMe");
  const int64_t off = offset_[size_t(u)] + 2 * lo * int64_t(sizeof(float));
  return io_.write(file_.fd(), file_.path(), buf, size_t(2 * (hi - lo)) * sizeof(float), off);
}

MomentsFile::Carried& MomentsFile::carried(int slot) {
  if (carried_.size() < slots_.size()) carried_.resize(slots_.size());
  return carried_[size_t(slot)];
}

void MomentsFile::drop_carried() {
  for (Carried& c : carried_)
    if (c.ev) c.ev->synchronize();
  carried_.assign(carried_.size(), Carried{});
}

void MomentsFile::settle_writes() {
  std::vector<IoEventPtr> w;
  w.swap(pending_writes_);
  for (IoEventPtr& e : w) e->synchronize();
}

void MomentsFile::transfer(int u, int64_t shard, bool second, int64_t lo, int64_t hi, float* buf,
                           bool write, int64_t piece) {
  settle_writes();  // the optimizer's last write-backs first (and their errors)
  const int64_t C = piece;
  std::vector<IoEventPtr> evs;
  for (int64_t i = lo; i < hi;) {
    const int64_t plo = i / C * C, phi = std::min(shard, plo + C);
    const int64_t end = std::min(hi, phi);
    const int64_t off =
        offset_[size_t(u)] + (2 * plo + (second ? phi - plo : 0) + (i - plo)) * int64_t(sizeof(float));
    const size_t bytes = static_cast<size_t>(end - i) * sizeof(float);
    evs.push_back(write ? io_.write(file_.fd(), file_.path(), buf + (i - lo), bytes, off)
                        : io_.read(file_.fd(), file_.path(), buf + (i - lo), bytes, off));
    i = end;
  }
  for (IoEventPtr& e : evs) e->synchronize();  // each: an error names its file and offset
}

float* MomentsFile::view(int64_t floats) {
  const size_t bytes = static_cast<size_t>(floats) * sizeof(float);
  if (view_.bytes() < bytes) view_ = Buffer(bytes, Mem::Checkpoint, Device::cpu());
  return view_.f32();
}

}  // namespace sw
