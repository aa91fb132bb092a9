// The parameters on NVMe (zero_optimization.offload_param.device nvme): every offloaded unit's
// fp32 master shard and reduced gradient shard in one file per rank
// (<nvme_path>/rank_<r>/params.bin; unit u: master at master_at(u), gradients at grads_at(u),
// both 4096-aligned). They move through staging buffers in host memory, sized for the largest
// shard:
//   param slots  a gather's master, read ahead of its Gather (pbusy: the upload a gather made
//                from the slot on a device, which the next read into it waits for);
//   grad slots   a reduction's accumulator, read first unless the gradients are zero and
//                written back after (gbusy: its last write; gfetch per unit: the read its next
//                accumulation waits for; sumsq per unit: the accumulated gradients' sum of
//                squares, taken when they were in memory);
//   opt slots    the optimizer's pieces, when the moments have no staging of their own.
// One io queue per rank: the moments file's when it exists (so that staging reuse is ordered
// across both files), else one of its own.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "offload/io_stream.h"
#include "offload/offload_file.h"

namespace sw {

class ParamFile {
 public:
  struct Staging {
    int param_slots = 0, grad_slots = 0, opt_slots = 0;
    int64_t shard_bytes = 0;     // param and grad slots: the largest shard
    int64_t opt_slot_bytes = 0;  // opt slots: the largest optimizer piece
    Tier tier = Tier::Device;    // the plan's tier for them (host memory on a device)
  };
  // shard_floats[u]: unit u's shard in the file, or -1. `shared_io`: the moments file's queue,
  // or null for one of its own. Throws sw::Error naming nvme_path (directory, room, creation).
  ParamFile(const AioConfig& aio, const std::string& nvme_path, int rank,
            const std::vector<int64_t>& shard_floats, IoStream* shared_io, const Staging& st);
  ~ParamFile();  // finishes the io on the file, then removes it
  ParamFile(const ParamFile&) = delete;
  ParamFile& operator=(const ParamFile&) = delete;

  IoStream& io() { return *io_; }
  bool holds(int u) const { return u >= 0 && size_t(u) < moff_.size() && moff_[size_t(u)] >= 0; }
  int64_t master_at(int u) const { return moff_[size_t(u)]; }
  int64_t grads_at(int u) const { return goff_[size_t(u)]; }

  // n floats at byte offset `off` of the file, from or into buf, on the io queue; `after` as
  // IoStream's.
  IoEventPtr read(float* buf, int64_t n, int64_t off, std::shared_ptr<Event> after = nullptr);
  IoEventPtr write(const float* buf, int64_t n, int64_t off);
  // The same, synchronously (throws the io error line).
  void transfer(float* buf, int64_t n, int64_t off, bool write);

  float* param_slot(int k) const { return pslots_[size_t(k)].f32(); }
  float* grad_slot(int k) const { return gslots_[size_t(k)].f32(); }
  float* opt_slot(int k) const { return oslots_[size_t(k)].f32(); }
  std::shared_ptr<Event>& param_busy(int k) { return pbusy_[size_t(k)]; }
  IoEventPtr& grad_busy(int k) { return gbusy_[size_t(k)]; }
  IoEventPtr& grad_read(int u) { return gfetch_[size_t(u)]; }
  double& grad_sumsq(int u) { return sumsq_[size_t(u)]; }
  double grad_sumsq(int u) const { return sumsq_[size_t(u)]; }
  // Every staging buffer in host memory (for the planner's residency figures).
  std::vector<const Buffer*> host_staging() const;

  // Host memory of at least `floats` for an access outside the plan (initialisation, export,
  // checkpoints): grown, never shrunk until release_scratch().
  float* scratch(int64_t floats);
  void release_scratch() { tmp_.release(); }

 private:
  struct Regions {  // unit u: master at moff[u], gradients at goff[u]; -1 elsewhere
    std::vector<int64_t> moff, goff;
    int64_t total = 0;
    int64_t shards = 0;  // bytes of the shards (of each role)
  };
  static Regions regions(const std::vector<int64_t>& shard_floats);
  ParamFile(const AioConfig& aio, const std::string& nvme_path, int rank, Regions r,
            IoStream* shared_io, const Staging& st);

  std::vector<int64_t> moff_, goff_;
  std::unique_ptr<IoStream> own_io_;
  IoStream* io_ = nullptr;
  OffloadFile file_;
  std::vector<Buffer> pslots_, gslots_, oslots_;
  std::vector<std::shared_ptr<Event>> pbusy_;
  std::vector<IoEventPtr> gbusy_, gfetch_;
  std::vector<double> sumsq_;
  Buffer tmp_;
};

}  // namespace sw
