// The hardware profile the planner's time model reads (docs/ARCHITECTURE.md, "The planner"):
// compute rates by kind and shape, collective latency and bandwidth per message size, disk
// bandwidth. Made by `shardwise plan --calibrate` (planner/calibrate.h) on this machine and
// world size, or written by hand from published figures (configs/hardware/*.json), so a user
// can plan for hardware they do not have. Stored as JSON:
//
//   {"name": "...", "source": "...", "world_size": 2, "threads": 1,
//    "compute": {"gemm_flops": {"f32": 1e11, "bf16": 2e11},
//                "gemm_shapes": [{"m": 1024, "n": 2304, "k": 768, "dtype": "f32",
//                                 "flops": 9.1e10}, ...],          (optional)
//                "attention_flops": {"f32": .., "bf16": ..},        (optional: gemm's)
//                "lmhead_flops": {"f32": .., "bf16": ..},           (optional: gemm's)
//                "elementwise_bytes_per_s": 2e10,
//                "optimizer_floats_per_s": 1e9,
//                "memcpy_bytes_per_s": 1e10},                       (optional: elementwise)
//    "collectives": null | {"separate_streams": false,
//                "all_gather": {"latency_s": 2e-5, "busbw_bytes_per_s": 5e9,
//                               "points": [{"bytes": 65536, "time_s": ..}, ...]},
//                "reduce_scatter": {...}, "all_reduce": {...},
//                "p2p": {"latency_s": 1e-5, "bytes_per_s": 1e10}},            (optional)
//    "disk": {"path": "/tmp", "read_bytes_per_s": 2e9, "write_bytes_per_s": 1e9,
//             "latency_s": 1e-4},
//    "host": {"link_bytes_per_s": 55e9, "optimizer_floats_per_s": 2e9},  (optional)
//    "process": {"baseline_rss_bytes": 2.6e7,                          (optional)
//                "baseline_rss_bytes_bf16": 1.1e7}}                    (optional)
//
// "world_size", "threads": the ranks and the threads per rank it was measured with (`plan
// --calibrate` writes both; 0 or absent: not recorded, as in profiles made before them; a
// device's profile has threads 0). The time model uses the rates as measured, whatever the
// run's ranks x threads: plan_shape_note says so when they differ.
// Rates are per rank. bf16 figures also serve fp16. Collectives: time(bytes) = latency +
// bus_bytes / busbw (nccl-tests' busbw: all-gather and reduce-scatter move bytes*(n-1)/n,
// all-reduce 2*bytes*(n-1)/n, `bytes` the whole buffer); `collectives` is null when it was
// calibrated at one rank. "separate_streams": gathers and reductions run concurrently (NCCL
// streams); false: one communication thread runs both in issue order (the CPU backend).
// "p2p": a point-to-point message between pipeline stages (latency + bytes / bytes_per_s);
// missing: the all-gather's latency and busbw (what two ranks' ring moves per byte).
// "host" (a GPU machine): the host tier is across a link (PCIe) and offloaded optimizer state
// is updated by the host's CPU; without it the host tier is the device's own memory (the CPU
// backend), so host offload costs no time.
// "process": the resident set of a shardwise rank that holds no tensors (binary, libraries,
// OpenBLAS and OpenMP thread buffers and stacks, MPI), measured by `plan --calibrate` (RSS
// once the calibration's buffers went back to the OS, less what the allocator still holds):
// after the fp32 products and the collectives; "_bf16" after the bf16 products (measured
// first: bf16 GEMMs leave most of OpenBLAS's buffers untouched, 10 vs 54 MiB for GPT-2 d=384)
// plus what the later steps added. The RSS prediction adds the one of the run's precision.
// Missing: default_baseline_rss() (search.h).
#pragma once
#include <string>
#include <vector>

#include "core/dtype.h"

namespace sw {

struct GemmPoint {
  int64_t m = 0, n = 0, k = 0;
  bool ta = false, tb = false;  // Ops::gemm's transposes (optional in JSON: "ta", "tb")
  DType dtype = DType::F32;
  double flops = 0;  // flop/s measured for that shape
};

struct CollectivePoint {
  int64_t bytes = 0;  // the whole buffer
  double time_s = 0;
};

struct CollectiveFit {
  double latency_s = 0;
  double busbw = 0;  // bytes/s
  std::vector<CollectivePoint> points;
};

struct HardwareProfile {
  std::string name, source;
  int world_size = 0, threads = 0;  // measured with; 0: not recorded
  double gemm_f32 = 0, gemm_bf16 = 0;
  std::vector<GemmPoint> gemm_shapes;
  double attention_f32 = 0, attention_bf16 = 0;
  double lmhead_f32 = 0, lmhead_bf16 = 0;
  double elementwise_bps = 0;
  double optimizer_fps = 0;  // AdamW floats per second
  double memcpy_bps = 0;
  bool has_collectives = false;
  bool separate_streams = false;
  CollectiveFit all_gather, reduce_scatter, all_reduce;
  double p2p_latency_s = 0, p2p_bps = 0;  // "collectives.p2p"; 0: not given (all_gather's)
  // "collectives.across_hosts" {latency_s, busbw}: one rank per host over the link between
  // hosts (bench_collectives on the two namespace hosts); busbw 0: not given (as inside).
  double across_latency_s = 0, across_busbw = 0;
  std::string disk_path;
  double disk_read_bps = 0, disk_write_bps = 0, disk_latency_s = 0;
  bool has_host = false;
  double host_link_bps = 0, host_optimizer_fps = 0;
  double baseline_rss_bytes = 0;       // "process.baseline_rss_bytes"; 0: not measured
  double baseline_rss_bf16_bytes = 0;  // "process.baseline_rss_bytes_bf16"; 0: not measured

  // Rates used by the time model (bf16 serves f16; missing optional figures fall back).
  // The nearest calibrated shape of that precision (an exact transpose match preferred).
  double gemm_rate(int64_t m, int64_t n, int64_t k, DType dt, bool ta = false, bool tb = false) const;
  double attention_rate(DType dt) const;
  double lmhead_rate(DType dt) const;
  double copy_bps() const { return memcpy_bps > 0 ? memcpy_bps : elementwise_bps; }
  // Seconds a point-to-point message of `bytes` takes between two stages.
  double p2p_seconds(double bytes) const;
};

// Parses a profile; `where` names it in messages. A malformed or incomplete profile throws one
// sw::Error line: "hardware: <where>: missing key 'compute.gemm_flops.f32'", "... 'disk.
// read_bytes_per_s' must be a positive number", "... not valid JSON: ...".
HardwareProfile hardware_from_json_text(const std::string& text, const std::string& where);
HardwareProfile load_hardware(const std::string& path);
std::string hardware_to_json(const HardwareProfile& hw);  // pretty-printed; parses back
void save_hardware(const HardwareProfile& hw, const std::string& path);  // creates parents
// One line when a run of `world` ranks x `threads` threads per rank (on_device: the threads
// do not matter) differs from what the profile was measured with, or the profile does not
// record it; "" when they match. It says the prediction assumes the profile's (no rescaling).
std::string plan_shape_note(const HardwareProfile& hw, int world, int threads, bool on_device);
// Round figures of a small CPU machine (2 cores), for choosing among plans when no profile was
// calibrated: the ordering of plans, not their absolute times, is what it is good for.
HardwareProfile nominal_hardware(int world);
// $SHARDWISE_HARDWARE, else $XDG_CACHE_HOME/shardwise/hardware.json, else
// ~/.cache/shardwise/hardware.json.
std::string default_hardware_path();

}  // namespace sw
