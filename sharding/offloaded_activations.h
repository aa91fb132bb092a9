// The owner of activation offload (activation_checkpointing.offload; docs/ARCHITECTURE.md,
// "Offload"): evict_acts moves what a call keeps for its backward (its input and its Saved,
// after any checkpointing drop) off the device after its forward, fetch_acts brings it back
// before its backward, wait_acts is the compute queue waiting for them. Two tiers:
//   host  copies between memory tiers (Saved::move_to): the CPU's are memcpys done at issue;
//         a device's run on its copy streams (offload/tier_copies.h keeps what they read until
//         the wait sees them), and the device bytes of an evicted call go once its copy is done
//   nvme  the activation file (offload/activation_file.h): an evicted call's buffers are
//         written contiguously from its place in the file and kept until the wait sees the
//         write done; a fetch allocates them again and reads them back (on a device through
//         host copies, uploaded at the wait)
// The activations themselves are the Activations component's; this one moves them.
#pragma once
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "offload/activation_file.h"
#include "offload/tier_copies.h"
#include "sharding/action_records.h"
#include "sharding/activations.h"

namespace sw {

class OffloadedActivations final : public Component {
 public:
  OffloadedActivations(const ModelContext& ctx, Activations& acts, ActionRecords& records);
  ~OffloadedActivations() override;
  const char* name() const override { return "offloaded activations"; }
  bool run(SegmentRun& s, int i) override;
  void begin(SegmentRun& s) override;
  void end(SegmentRun& s) override;

  // NVMe: creates the file and reserves `end` bytes of it (sw::Error naming
  // activation_checkpointing.nvme_path when the disk has no room).
  void reserve(int64_t end);
  // Waits for every copy in flight and releases what they copied from (a step's end, or
  // abandoned).
  void settle() noexcept { copies_.settle(); }

 private:
  void evict_to_file(SegmentRun& s, int i);
  void fetch_from_file(SegmentRun& s, int i);
  void move_between_tiers(SegmentRun& s, int i);
  void wait_file(SegmentRun& s, int w);

  const ModelContext& ctx_;
  Activations& acts_;
  ActionRecords& records_;
  TierCopies copies_;
  // NVMe: per position, where its buffers start in the file, its input's bytes (0: none) and
  // the buffers being written; per action of the segment, its io events; per fetch, the host
  // buffers read into and the device buffers they go to at its wait (on a device).
  std::vector<int64_t> off_;
  std::vector<size_t> input_bytes_;
  std::vector<std::vector<Buffer>> writing_;
  std::vector<std::vector<IoEventPtr>> ev_;
  std::unordered_map<int, std::vector<std::pair<Buffer, Buffer*>>> reading_;
  std::unique_ptr<ActivationFile> file_;  // last: its io drains before the buffers above go
};

}  // namespace sw
