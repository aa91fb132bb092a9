// The planner's search under a memory budget (docs/ARCHITECTURE.md, "The planner"): for each
// candidate (wrap policy, ZeRO stage, prefetch / max_live_units, checkpointing, what is
// offloaded where, micro-batch x accumulation at the fixed per-rank batch) it builds the
// StepPlan the engine would run (plan_step, the same code), replays its peak (replay_peak)
// and its time (predict_step_time), and keeps the fastest that fits and the memory-vs-time
// Pareto frontier.
#pragma once
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "models/model.h"
#include "planner/hardware.h"
#include "planner/time_model.h"
#include "sharding/step_plan.h"

namespace sw {

// A budget given on the command line: core/bytes.h parse_budget_bytes (the parser a config's
// memory_budget reads with: "8GiB", "512MiB", "1.5GB", "8e9"), at most INT64_MAX. Throws one
// sw::Error line "plan: <what>: cannot parse '<text>' as bytes (e.g. 8GiB, 512MiB, 8e9)".
int64_t parse_budget(const std::string& text, const std::string& what);

// The shapes of a training step of `mc` at B x T in `compute` precision, as the backends'
// workspace declarations take them (kernels/ops.h StepShape; a Llama's d_ff 0 resolved as the
// model resolves it); threads: the CPU backend's OpenMP threads per rank; fp8: the blocks'
// linears in fp8 (MixedPrecisionPolicy::fp8).
StepShape step_shape(const ModelConfig& mc, int B, int T, DType compute, int threads = 1,
                     bool fp8 = false);
// The threads per rank a run of `world` ranks on this machine uses for a config's `threads`
// (0: the cores shared among the ranks; kernels/threads.h threads_for).
int plan_threads(int threads, int world);
// Memory the step plan does not hold but the tracked peak counts: the kernels' own scratch, as
// the backend that runs the step declares it (kernels/ops.h kernel_workspace: the CUDA
// backend's where on_device, else the CPU's; the planner knows no backend's internals), plus
// `comm_scratch` (comm_scratch_bytes of the plan, counted when world > 1). fp8: as step_shape.
WorkspaceDecl plan_workspace(const ModelConfig& mc, int B, int T, DType compute, int world,
                             int threads, int64_t comm_scratch, bool on_device, bool fp8 = false);
// The CUDA backend's declaration alone for this model (kernel_workspace(DeviceKind::CUDA, ...)).
int64_t cuda_workspace_bytes(const ModelConfig& mc, int B, int T, DType compute);
// What the MPI groups' scratch buffers (sharding/comm/mpi_group.cpp, grown to the largest need
// and kept) reach over the plan's collectives, with the algorithms MpiGroup picks by size and
// the default 512 KiB chunks (16-chunk slices): a ring reduce-scatter (or ring all-reduce)
// takes twice min(slice, per-rank block); a small reduce-scatter (whole buffer <= 16 KiB,
// direct) twice n chunks; a small all-reduce (buffer x n <= 512 KiB, one-shot) buffer x n;
// all-gathers none. The shard group (reduce-scatters) and the replica group (all-reduces) are
// separate groups with their own scratch under HYBRID_SHARD, one group otherwise. Pipeline: the
// tied unit's sync_shared is an all-reduce over its two holders' group (scratch of its own).
int64_t comm_scratch_bytes(const StepPlan& plan);
// The model config a tensor rank's kernels see (heads, KV heads, d_ff and vocabulary per rank;
// KV heads replicated: 1), for the backend's workspace declaration. t = 1: mc.
ModelConfig tensor_local_config(const ModelConfig& mc, int t);

// What a run of the model on `world` ranks is planned from: everything plan_step needs.
struct PlanSetup {
  ModelConfig model;
  ShardingPolicy policy;  // HYBRID_SHARD: shard_group_size resolved
  int world = 1;
  int blocks_per_unit = 1;
  int micro_batch = 1, accum = 1;
  int64_t data_bytes = 0;  // the token files (data.train, data.val): mapped and read whole
  // Checkpoint saves (checkpoint.every_steps > 0, checkpoint.async): their host memory
  // (RssPrediction::checkpoint).
  bool checkpoint_saves = false, checkpoint_async = false;
  bool on_device = false;  // the config's device is not the CPU (PlanInput::on_device)
  int threads = 0;         // the config's threads per rank (0: the cores among the ranks)
  // Tensor parallelism (parallelism.tensor_parallel_degree): world = data-parallel ranks x
  // tensor; a rank's plan is tensor rank 0's (every tensor rank's plan has the same sizes).
  int tensor = 1;
  // Pipeline parallelism (parallelism.pipeline_parallel_*): `pipeline` ranks of `pipe_chunks`
  // stages each, outermost (world = pipeline x data x tensor), the schedule (PipeSchedule) and
  // the split points (empty: balanced by the time model). planner/pipeline.h plans each stage.
  int pipeline = 1, pipe_chunks = 1, pipe_schedule = 1;
  std::vector<int> split_points;
  // Hosts the world's ranks sit on (PlanInput::hosts: the time model's groups across them):
  // the launcher's (world / ranks per node), or `shardwise plan --hosts`.
  int hosts = 1;
  int data_world() const { return world / std::max(1, tensor) / std::max(1, pipeline); }
};

// replay_peak (sharding/step_plan.h) with each action's allocations made before its frees:
// the executor's backward allocates a unit's transient gradients while the call's input and
// Saved are still held, which the net delta of the action hides (GPT-2 d=384 at 2 ranks, 2
// blocks per unit: 14.8 MB more than replay_peak, matching the profile's peak to 0.1%).
PlanPeak replay_peak_alloc_first(const StepPlan& plan);
// The same with `backward_extra` bytes more held during the Backward action of every block (a
// backend's per-call transient, WorkspaceDecl::backward_transient: every schedule position
// but the first, the embedding, and the last, the loss) when choosing the peak; the result's
// figures are the plan's alone, and *extra_at_peak (may be null) says whether the peak chosen
// is at a Backward action (then its extra adds to the total).
// `block` (per schedule position, may be null): which positions are blocks (a pipeline stage's:
// neither the embedding nor the loss); null: all but the plan's first and last.
PlanPeak replay_peak_alloc_first(const StepPlan& plan, int64_t backward_extra,
                                 bool* extra_at_peak, const std::vector<uint8_t>* block = nullptr);

// A step's whole device peak, as the tracking allocator counts it: the plan's peak (replayed
// allocations first) and the kernel workspace held there (plan_workspace's bytes, and its
// backward transient where the peak is at a backward).
struct DevicePeak {
  PlanPeak plan;          // the plan's figures at the peak
  WorkspaceDecl decl;     // what the backend declared (plus the groups' scratch)
  int64_t workspace = 0;  // of it, held at the peak
  int64_t total = 0;      // plan.total + workspace
};
// mp: the products' precision (param_dtype) and whether the linears are fp8.
DevicePeak device_peak(const StepPlan& plan, const ModelConfig& mc, int B, int T,
                       const MixedPrecisionPolicy& mp, int world, int threads, bool on_device,
                       const std::vector<uint8_t>* block = nullptr);

// The process's resident set a rank reaches (its peak RSS, what metrics.jsonl reports as
// max_rss_bytes) on the CPU backend, where the device and host tiers are the same RAM:
//   tracked   the device peak (plan + kernel workspace) + the host tier's bytes
//   rounding  the caching allocator's block rounding (core/alloc.h alloc_block_size) of the
//             buffers the plan knows one by one: each unit's persistent shard buffers
//             (parameters, gradients, AdamW m and v) and its gathered full parameters and
//             gradients; activations' named buffers are not known one by one (not counted)
//   data      the token files: the loader maps them and checks every token at start, so all
//             their pages are resident (file-backed) for the whole run
//   baseline  the process without tensors (hardware profile process.baseline_rss_bytes from
//             `plan --calibrate`, of the run's precision, else default_baseline_rss)
// Not modelled: cached free blocks the allocator keeps beside the peak's (a block freed at one
// size and not reusable at another), the async checkpoint snapshot, the profiler's recording.
// On a device (PlanInput::on_device) the device tier is not resident memory: tracked is the
// host tier alone, no rounding is counted, and the CUDA runtime's own memory is not modelled.
struct RssPrediction {
  // total = tracked + rounding + data + baseline + checkpoint - untouched. untouched: pages of
  // the NVMe staging buffers that no transfer of the plan writes (each buffer is sized for the
  // largest unit's shard or optimizer piece; buffers are not zeroed, so pages nobody writes are
  // never resident). checkpoint: what a save holds (checkpoint/save_memory.h) where the run
  // saves: an async save's snapshot of the rank's master weights and moments, held for the
  // run; a sync save's staging ring while it runs (between steps: the step's blocks stay
  // cached, so it adds to their peak).
  int64_t tracked = 0, rounding = 0, data = 0, baseline = 0, untouched = 0, total = 0;
  int64_t checkpoint = 0;
  bool baseline_measured = false;  // from the profile, not the default
};
// Measured once on the development machine (a 2-core EPYC VM, OpenBLAS, OpenMPI 4, 2 OpenMP
// threads per rank): RSS less the allocator's reservations (reserved_peak_bytes) less the
// 4.7 MiB token file of a `shardwise train` rank of the tiny GPT-2 config (metrics.jsonl at
// its last step): 11 MiB at one rank without mpirun, 21 MiB per rank under mpirun (MPI's
// shared-memory segments and progress threads). Larger fp32 GEMMs touch more of OpenBLAS's
// buffers (GPT-2 d=384, V=50304: 54 MiB; its bf16 run 10 MiB): calibrate.
int64_t default_baseline_rss(int world);
// The bytes of the plan's NVMe staging buffers that none of its transfers writes (whole pages).
int64_t untouched_staging_bytes(const StepPlan& plan);
RssPrediction predict_rss(const StepPlan& plan, const PlanInput& in, int64_t device,
                          int64_t host, const PlanSetup& s, const HardwareProfile* hw);
// The bytes of a rank's checkpoint shard file: its share of every unit's master weights and
// AdamW moments in fp32 (checkpoint/sharded_checkpoint.cpp; the header's few KB aside).
int64_t checkpoint_file_bytes(const PlanInput& in);

// A call of a unit that does not declare its activation sizes (Unit::declare_activations
// returns known = false) at a batch shape.
struct UndeclaredCall {
  int unit = -1, call = -1;
  std::string name;  // the unit's name()
};
std::vector<UndeclaredCall> undeclared_calls(const Model& model, int B, int T);
// "plan: unit 'blocks.0' (call 0) does not declare its activation sizes ..." (one line).
std::string undeclared_message(const std::vector<UndeclaredCall>& u);
// The fallback: each unit with an undeclared call is replaced by one that forwards everything
// to it and declares, at B x T, what one run of each of its calls allocated
// (models/activation_check.h measure_activations: the unit's parameters are allocated and the
// calls run once on synthetic tokens). Returns the calls it measured.
std::vector<UndeclaredCall> measure_undeclared(Model& model, int B, int T);

// One predicted plan.
struct PlanPrediction {
  StepPlan plan;
  PlanInput input;
  PlanPeak peak;
  int64_t workspace = 0;       // the kernel workspace held at the peak (DevicePeak)
  std::string workspace_what;  // what it is made of (plan output)
  int64_t device = 0;          // peak.total + workspace: the whole tracked device peak
  int64_t host = 0;            // the host tier's persistent bytes
  int64_t nvme = 0;            // the NVMe files
  bool timed = false;
  StepTime time;
  RssPrediction rss;
  std::vector<UndeclaredCall> measured;  // calls whose sizes were measured (measure_unknown)
};
// Builds the model, wraps it, plans one training step and replays it; with hw, its time too.
PlanPrediction predict_plan(const PlanSetup& s, const HardwareProfile* hw);
// The same for a model built by the caller (a custom model: s.model describes its shapes for
// the kernel-workspace estimate). A unit that does not declare its activation sizes is an
// error before anything is planned (sw::Error, undeclared_message), unless measure_unknown:
// then measure_undeclared runs those calls once and the plan uses what they allocated.
PlanPrediction predict_plan(Model model, const PlanSetup& s, const HardwareProfile* hw,
                            bool measure_unknown = false);

// Which dimensions the search varies (the others keep the base's values, e.g. a train config's
// "auto" keys vary only what is "auto").
struct SearchFree {
  bool blocks = true, strategy = true, prefetch = true, checkpointing = true;
  bool offload_optimizer = true, offload_param = true, offload_activations = true;
  bool micro_batch = true;
  bool tensor = false;  // the tensor-parallel degree (parallelism.tensor_parallel_degree "auto")
};

struct Candidate {
  int blocks_per_unit = 1;
  ShardingStrategy strategy = ShardingStrategy::FullShard;
  int prefetch = 1;        // forward and backward prefetch depth
  int max_live_units = 0;  // 0: no cap
  CheckpointMode checkpoint = CheckpointMode::Off;
  OffloadDevice optimizer = OffloadDevice::None;
  double optimizer_ratio = 1.0;
  OffloadDevice params = OffloadDevice::None;
  OffloadDevice activations = OffloadDevice::None;  // None, Cpu, Nvme
  int micro_batch = 1, accum = 1;
  int tensor = 1;  // tensor-parallel degree (searched where SearchFree::tensor)
  std::string describe() const;  // "FULL_SHARD bpu=2 pf=1 ckpt=selective opt=cpu:0.5 mb=2x2"
};
// The setup a candidate runs with: base's model and precision, nvme_path and aio settings.
// With `free`: what is not free keeps base's policy as it is (checkpointing's unit list,
// offload ratio and paths, prefetch and max_live_units, reshard_after_forward).
PlanSetup apply_candidate(const PlanSetup& base, const Candidate& c, const SearchFree* free = nullptr);

// Predicted step times closer than this (relative) are a tie for the search (choose_plan).
constexpr double kStepTimeNoise = 0.01;

struct SearchOptions {
  SearchFree free;
  int64_t budget = 0;       // device bytes per rank (required > 0)
  int64_t host_budget = 0;  // 0: no limit
  int64_t nvme_budget = 0;  // 0: no limit
  // The directory NVMe offload writes to; "": the base's nvme_path (a config's), and when that
  // is empty too NVMe plans are evaluated but never chosen (Evaluated::needs_nvme_path).
  std::string nvme_path;
  double margin = 0.02;     // a plan fits when device <= budget * (1 - margin)
  double noise = kStepTimeNoise;  // the tie-break's window (choose_plan)
};

struct Evaluated {
  Candidate c;
  int64_t device = 0, host = 0, nvme = 0;
  MemDeltas at_peak{};  // plan categories at the peak
  int64_t workspace = 0;
  StepTime time;
  bool fits = false;
  bool needs_nvme_path = false;  // it offloads to NVMe and no directory was given
};

// The tie-break between plans that fit (docs/ARCHITECTURE.md, "The planner"). Predicted step
// times within `noise` (relative) of the fastest are not told apart: three calibrations of one
// machine moved the same plans' predicted steps by up to 0.5% (bench/results/
// plan_choice_2026-11-29.md), 1% is twice that, and the prediction's error against measured
// steps is far larger (bench/results/planner_accuracy_*.md). Among those the plan that touches
// fewer tiers wins: no NVMe over NVMe, then no host over host, then fewer offloaded things
// (optimizer state, parameters, activations), then the faster, then the smaller device peak.
// Such a plan is simpler to run (no directory, no host memory it does not need) and loses at
// most `noise` (SearchOptions::noise, kStepTimeNoise) of predicted time.
struct TierUse {
  bool nvme = false, host = false;
  int offloaded = 0;  // of optimizer, parameters, activations: how many leave the device
};
TierUse tier_use(const Candidate& c);
// The rule in one line, as `plan` prints it where it names the choice.
std::string tie_rule(double noise);
// The plan the rule chooses among `ev`'s plans that fit (Evaluated::fits): index, or -1 when
// none fits.
int choose_plan(const std::vector<Evaluated>& ev, double noise);

struct SearchResult {
  // Memory ascending, each faster than every one before, and the chosen plan where the
  // tie-break took one that is not on it. Plans that need an NVMe path nobody gave are not in
  // it.
  std::vector<Evaluated> frontier;
  int best = -1;      // index into frontier of the chosen plan (choose_plan; -1: none fits)
  Evaluated fastest;  // the fastest plan that fits (== the chosen one unless the tie-break)
  Evaluated smallest;  // the least device memory of any usable candidate (no plan fits)
  // Set when no NVMe directory was given and a plan that needs one is what the rule would
  // choose with one: faster than the chosen beyond noise, or the only kind that fits.
  bool nvme_would_help = false;
  Evaluated with_nvme;
  PlanSetup chosen_setup;  // the chosen plan's setup: every path it needs filled in
  int evaluated = 0;
  double seconds = 0;
};

// Throws sw::Error("plan: ...") for a bad base (e.g. no collectives in hw at world > 1).
SearchResult search_plans(const PlanSetup& base, const SearchOptions& opt,
                          const HardwareProfile& hw);

// "params 1.2 GiB" style: the category that dominates a candidate's peak (workspace included).
std::string dominant_category(const Evaluated& e);

}  // namespace sw
