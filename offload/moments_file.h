// The optimizer's moments on NVMe (zero_optimization.offload_optimizer.device nvme): AdamW's m
// and v of the offloaded units in one file per rank (<nvme_path>/rank_<r>/optimizer.bin,
// zeros at start: the initial moments). Unit u's region starts at offset(u), 4096-aligned, and
// holds its shard in pieces of `piece` floats, each piece m then v, so a piece is one
// contiguous transfer. Pieces stream through staging buffers on the store's io queue: the
// engine sends the aligned part of each through the file's O_DIRECT descriptor and the rest
// through the buffered one.
//
// Beyond the bytes, two things outlive a step segment here:
//   carried reads  a read of a piece issued by the last micro-step into a staging buffer and
//                  left in flight, which the optimizer adopts (or finds stale and drops);
//   kept writes    the optimizer's write-backs left in flight past its segment, settled before
//                  the next optimizer or any access to the moments outside the plan.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "offload/io_stream.h"
#include "offload/offload_file.h"

namespace sw {

class MomentsFile {
 public:
  // shard_floats[u]: unit u's shard in the file, or -1 when its moments are elsewhere. `slots`
  // staging buffers of `slot_bytes` each (4096-aligned, Mem::Optimizer) on `staging_tier` (the
  // device tier on the CPU backend; host memory on a device). Throws sw::Error naming
  // nvme_path when the directory cannot be made, the disk has no room, or a forced io_uring
  // is refused.
  MomentsFile(const AioConfig& aio, const std::string& nvme_path, int rank,
              const std::vector<int64_t>& shard_floats, int slots, int64_t slot_bytes,
              Tier staging_tier);
  ~MomentsFile();  // drains the io queue, then removes the file
  MomentsFile(const MomentsFile&) = delete;
  MomentsFile& operator=(const MomentsFile&) = delete;

  IoStream& io() { return io_; }
  bool holds(int u) const { return u >= 0 && size_t(u) < offset_.size() && offset_[size_t(u)] >= 0; }
  float* slot(int k) const { return slots_[size_t(k)].f32(); }
  const std::vector<StagingBuffer>& slots() const { return slots_; }

  // Floats [lo, hi) of unit u's shard, m then v (2 (hi - lo) floats at buf), read from or
  // written to the file: a piece that starts at a multiple of the piece size.
  IoEventPtr read_piece(int u, int64_t lo, int64_t hi, float* buf);
  IoEventPtr write_piece(int u, int64_t lo, int64_t hi, const float* buf);

  // A read the last micro-step left in flight in staging buffer `slot`: of unit u's piece
  // [lo, hi), done when ev completes. None: unit -1, ev null.
  struct Carried {
    int unit = -1;
    int64_t lo = 0, hi = 0;
    IoEventPtr ev;
  };
  Carried& carried(int slot);
  // Waits for the carried reads and forgets them (their staging would be stale after a write of
  // the moments outside the plan).
  void drop_carried();
  // A write-back left in flight past the optimizer's segment; settle_writes waits for all of
  // them and throws the first one's io error line.
  void keep_write(IoEventPtr ev) { pending_writes_.push_back(std::move(ev)); }
  void settle_writes();

  // Checkpoint access: floats [lo, hi) (relative to the shard) of unit u's m (v: second) from or
  // into `buf`, piece by piece (pieces of `piece` floats of a shard of `shard` floats),
  // synchronously, after the kept writes.
  void transfer(int u, int64_t shard, bool second, int64_t lo, int64_t hi, float* buf, bool write,
                int64_t piece);
  // A host buffer of at least `floats` for a checkpoint read (reused, valid until the next).
  float* view(int64_t floats);

 private:
  IoStream io_;  // first: a forced io_uring is refused before anything is created
  std::vector<int64_t> offset_;  // per unit, bytes; -1: not in the file
  OffloadFile file_;
  std::vector<StagingBuffer> slots_;
  std::vector<Carried> carried_;
  std::vector<IoEventPtr> pending_writes_;
  Buffer view_;
};

}  // namespace sw
