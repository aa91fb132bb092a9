// The losses of a ShardedModel's micro-steps and evaluation batches. Each adds its sum of token
// losses into a double of the device where the units report it (UnitCtx::loss_total), zeroed
// when it starts, so the host reads nothing then; the host reads them in one copy per step
// (with the gradient norm's per-unit sums: on a GPU the step's one host synchronisation), or
// once kSlots are unread. Layout of the device buffer: [kSlots micro-steps | the norm's per-unit
// sums | kSlots eval batches].
#pragma once
#include <cstdint>
#include <vector>

#include "core/alloc.h"
#include "kernels/ops.h"

namespace sw {

class LossSlots {
 public:
  static constexpr int kSlots = 64;
  LossSlots(const Ops& ops, size_t units) : ops_(ops), units_(units) {}

  // ---- Micro-steps
  // Reads the unread ones when all kSlots are (before a micro-step starts).
  void make_room();
  // The next micro-step's double (the segment that adds into it zeroes it first).
  double* next_micro();
  // That micro-step's end: what units reported on the host and the targets counted.
  void add_micro(double host_sum, int64_t count);
  // The mean loss of each micro-step since the last call, in order (one read of the unread).
  std::vector<double> take_micro();
  // ---- The gradient norm: k per-unit sums written to norm_sums() are read with the unread
  // micro-steps' losses, in one copy.
  double* norm_sums() { return at(kSlots); }
  std::vector<double> read_with(int k);
  // ---- Evaluation, the same way.
  double* next_eval();  // (reads the unread ones first when all kSlots are)
  void add_eval(double host_sum, int64_t count);
  std::vector<double> take_eval();

 private:
  struct StepLoss {
    double sum = 0;
    int64_t count = 0;
  };
  double* at(int i);  // double i of the buffer (allocated on first use)
  void read_evals();

  const Ops& ops_;
  size_t units_;
  Buffer sums_;
  std::vector<StepLoss> losses_;  // each micro-step since take_micro (device sum added once read)
  int unread_ = 0;                // micro-steps [size - unread, size) still to be read
  std::vector<StepLoss> eval_pending_;
  std::vector<double> eval_done_;
};

}  // namespace sw
