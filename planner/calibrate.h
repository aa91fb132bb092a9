// `shardwise plan --calibrate`: measures this machine at this world size with the engine's own
// kernels (kernels/ops.h), communication (sharding/comm) and I/O engine (offload/aio.h), and
// returns a HardwareProfile (planner/hardware.h). Every rank measures (so ranks share the
// cores and the disk as in training); the figures of rank 0 are returned on every rank.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "planner/hardware.h"
#include "planner/time_model.h"
#include "sharding/comm/group.h"

namespace sw {

// What to measure: the GEMM shapes (and transposes) of a model's calls, its attention and
// LM-head shapes, an element-wise pass at (N, C).
struct CalibrationShapes {
  std::vector<CostOp> gemms;  // distinct (m, n, k, ta, tb)
  int B = 4, T = 256, H = 12, KVH = 12, hd = 64;  // attention
  int64_t lm_N = 1024, lm_C = 768, lm_V = 50304;  // fused LM head
  int64_t N = 1024, C = 768;                      // element-wise passes
};
// The shapes of `model`'s calls at in.B x in.T (GPT-2 124M's at B=4, T=256 when model is null).
CalibrationShapes calibration_shapes(const Model* model, const PlanInput* in);

struct CalibrateOptions {
  CalibrationShapes shapes;
  bool bf16 = true;              // also measure bf16 products
  std::string disk_path = "/tmp";  // a directory; a temporary file is written and read there
  int64_t disk_bytes = int64_t{256} << 20;  // per rank
  double min_seconds = 0.15;     // each measurement repeats for at least this long
  std::function<void(const std::string&)> log;  // progress lines (rank 0), may be empty
};

// Measures; `world` null or of size 1: no collectives ("collectives": null). At its end, the
// process's RSS without tensors (process.baseline_rss_bytes; hardware.h).
HardwareProfile calibrate(const CalibrateOptions& opt, Group* world);

// This process's resident set now (/proc/self/statm), bytes; -1 when it cannot be read.
int64_t resident_bytes();

}  // namespace sw
