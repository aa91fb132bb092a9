// The owner of the model state kept off the device (offload_optimizer, offload_param;
// docs/ARCHITECTURE.md, "Offload") and of the io actions that move it: fetch_state (read what
// Action::io names of a unit from its NVMe file into a staging buffer: an optimizer piece, a
// master shard ahead of its gather, the reduced gradients a reduction accumulates into),
// evict_state (write it back) and wait_state (the compute queue waits for them). The store
// itself is offload/'s: the moments and parameter files with their staging and io queue
// (offload/moments_file.h, offload/param_file.h) and the host updater (offload/host_updater.h),
// which runs the AdamW of state in host memory while a device goes on. This component maps
// plan actions onto them and keeps, per action of the segment being run, the io events its
// waits observe.
//
// The other components reach the state through it: a gather of an NVMe master (stage_gather),
// a reduction into a gradient shard off the device (stage_reduction, keeps_grads, accumulate),
// an update of moments in host memory (update_on_host), the gradient norm (grad_sumsq), and the
// accesses outside the plan (stage_whole, the checkpoint transfers).
#pragma once
#include <memory>
#include <vector>

#include "offload/host_updater.h"
#include "offload/moments_file.h"
#include "offload/param_file.h"
#include "sharding/action_records.h"
#include "sharding/component.h"
#include "sharding/model_context.h"

namespace sw {

struct UpdateArgs;

class OffloadedState final : public Component {
 public:
  OffloadedState(const ModelContext& ctx, UnitList& units, ActionRecords& records);
  ~OffloadedState() override;
  const char* name() const override { return "offloaded state"; }
  bool run(SegmentRun& s, int i) override;
  void begin(SegmentRun& s) override;
  void end(SegmentRun& s) override;

  // Once the units exist: creates the NVMe files (after the free-space checks: sw::Error naming
  // the nvme_path key) and their staging, as large as the optimizer plan says.
  void setup(const StepPlan& opt_plan);
  bool on_nvme() const { return moments_ || params_; }

  // ---- For the other components ----------------------------------------------------------
  // A gather (plan action i) of a unit whose master is on NVMe: waits for the fetch it waits
  // for, stages the master from that fetch's buffer and returns the buffer's slot.
  int stage_gather(SegmentRun& s, int i, FlatUnit& fu);
  // The gather copied the master out of `slot`; on a device by an upload the next read into the
  // slot must wait for.
  void gathered_from(int slot, std::shared_ptr<Event> upload);
  // A reduce-scatter of an NVMe-parameter unit accumulates into gradient staging `slot`.
  void stage_reduction(int slot, FlatUnit& fu);
  // Whether unit fu's reduced gradient shard is kept here (host memory on a device, or NVMe),
  // and a completed reduction's accumulation into it.
  bool keeps_grads(const FlatUnit& fu) const;
  void accumulate(FlatUnit& fu);
  // The update of a unit whose moments are in host memory on a device (or staged there from
  // NVMe): posted to the host updater; the unit is the update's until it settles.
  void update_on_host(FlatUnit& fu, const UpdateArgs& a, int64_t lo, int64_t hi);
  // The sum of squares of an NVMe-parameter unit's accumulated gradients.
  double grad_sumsq(int u) const;
  HostUpdater& host() { return host_; }

  // ---- Outside the plan (initialisation, export, checkpoints) ------------------------------
  // Stages unit fu's master (and gradient) shard from the file into host scratch;
  // unstage_whole() writes the master back when `write_master`.
  void stage_whole(FlatUnit& fu, bool grads);
  void unstage_whole(FlatUnit& fu, bool write_master);
  // Floats [lo, hi) of the shard (relative to it) of unit u's master on NVMe, synchronously.
  const float* read_master(int u, int64_t lo, int64_t hi);
  void write_master(int u, int64_t lo, int64_t hi, const float* src);
  // The same for the moments (second: v) on NVMe; read_moments returns a reused buffer.
  const float* read_moments(const FlatUnit& fu, bool second, int64_t lo, int64_t hi);
  void write_moments(const FlatUnit& fu, bool second, int64_t lo, int64_t hi, const float* src);
  // Host staging buffers (for ShardedModel::staging_residency): data and bytes of each.
  std::vector<std::pair<const void*, size_t>> host_staging() const;

 private:
  bool fetch_or_evict(SegmentRun& s, int i);
  void wait_state(SegmentRun& s, int i);
  // Issues io action i (moments, master, gradients).
  void issue_io(const StepPlan& plan, int i, FlatUnit& fu);
  // A carried optimizer read (Action::carry): 1 issued (or already pending), 2 adopted, 0 to
  // adopt but none is pending (the caller reads now).
  int run_carried(const StepPlan& plan, int i);
  // Waits for the events of io action w (recording it as an io-queue action when `rec`).
  void wait_io(const StepPlan& plan, int w, bool rec = true);
  float* opt_slot(int slot);
  // A reduction of an NVMe-parameter unit completing outside the plan (sync_grads): reads,
  // accumulates and writes its gradients synchronously.
  void accumulate_nvme(FlatUnit& fu);
  void accumulate_on_host(FlatUnit& fu);

  const ModelContext& ctx_;
  UnitList& units_;
  ActionRecords& records_;
  std::unique_ptr<MomentsFile> moments_;  // null unless some unit's moments live on NVMe
  std::unique_ptr<ParamFile> params_;     // null unless the parameters live on NVMe
  // Per action of the segment being run: the moments' io event, the parameter file's events.
  std::vector<IoEventPtr> mev_;
  std::vector<std::vector<IoEventPtr>> pev_;
  HostUpdater host_;  // last: joined (its jobs run out) before the files and staging go
};

}  // namespace sw
