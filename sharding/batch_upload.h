// A batch on a device (its tokens and targets copied there), for a non-CPU device: through host
// copies of its own (Tier::Host: pinned once a GPU registered pinning), per input a ring of
// kRing, on the copy stream, which the compute stream waits for. So the caller's arrays are
// free at return, the device's queue is not drained, and the host waits only for the upload
// kRing batches back.
#pragma once
#include <memory>

#include "core/alloc.h"
#include "kernels/ops.h"
#include "models/unit.h"

namespace sw {

class BatchUpload {
 public:
  explicit BatchUpload(const Ops& ops) : ops_(ops) {}
  ~BatchUpload() { quiesce(); }
  // `b` itself on the CPU; else its copy on the device (valid until the next call), with the
  // targets counted (the host cannot read the device's).
  const Batch& on_device(const Batch& b);
  // Waits for the uploads in flight (errors swallowed).
  void quiesce() noexcept;

 private:
  static constexpr int kRing = 3;
  struct Upload {
    Buffer host;
    std::shared_ptr<Event> done;
  };
  const Ops& ops_;
  Buffer tokens_, targets_;
  Upload ring_[2][kRing];
  int next_ = 0;  // the ring entry the next batch uses
  Batch dev_batch_;
};

}  // namespace sw
