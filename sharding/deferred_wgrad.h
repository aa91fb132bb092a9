// Deferred weight gradients: the zero-bubble pipeline's split of a backward into its
// input-gradient part (I, run early) and its weight-gradient part (W, run later), as ZB-H1
// (issue 37's InterleavedZeroBubble), without changing any unit. DeferredWeightGrads wraps an
// Ops (kernels/ops.h); a unit's backward is run with ops() while deferring() is on:
//
//  * linear_backward(dinp, dw, db, dout, inp, w, N, C, OC) with dw or db set computes only
//    dinp now (the inner call with dw = db = nullptr; no call where dinp is null too) and
//    records a job under the current key: copies of dout (N, OC) and inp (N, C) in the forms
//    given (fp32 and/or 16-bit; tracked Buffers of Mem::Activations on the inner Ops' device,
//    copied on its stream), and dw / db with their write flags;
//  * every other op, and linear_backward without dw and db, goes to the inner Ops as it is:
//    the parameter gradients other ops produce stay immediate, part of I. In the built-in
//    units: the norms' (layernorm_ / rmsnorm_backward), the embeddings' (embedding_backward;
//    TP: vocab_embedding_ / position_backward), the LM head's (lmhead_xent; TP:
//    xent_shard_backward), and the packed q|k|v and gate|up products' per-matrix fallback
//    (models/packed.cpp: gemm, where the weights or gradients are not contiguous).
//
// Memory: each job holds dout and inp (GPT-2 fp32: 16 N C floats a block, 9 N C of them
// dout). The inp copies duplicate Saved slots the unit keeps until its backward ends; a 16-bit
// form whose address is not 4-byte aligned or whose extent is odd is copied with copy_bytes,
// which waits for the device.
//
// run(key) runs key's jobs in the order they were recorded as the inner
// linear_backward(nullptr, dw, db, dout_copy, inp_copy, nullptr, N, C, OC) and frees their
// copies. Neither backend reads w when dinp is null (kernels/cpu/cpu_ops.cpp passes w.f32
// unread; CUDA's linear_backward_beta reads w only for dinp), so W needs no weights: with
// FULL_SHARD a unit's parameters may be freed between I and W. The values are bit-identical to
// the undeferred backward: the same kernels on the same operands (the products and the bias
// column sum of dout are computed separately for dinp and dw in either call).
//
// Order across micro-batches: a unit's gradient buffers get GradOut::write from their first
// writer of a step (micro 0), and `add` after. The W jobs of one unit must therefore run in
// micro-batch order (W(0) before W(1)): run() keeps the recorded order within a key, and the
// order of run() calls across keys is the caller's (the schedule's) job. Immediate gradients
// (norms' dw) of micro 1's I may meet micro 0's written linear dw only in different buffers,
// so interleaving I(1) before W(0) is safe.
//
// The caller must not read, reduce or round a unit's gradients before its W jobs ran; a job's
// written (GradOut::write) gradient is unwritten until then (and after clear()).
//
// Not thread-safe against concurrent begin / end / run; the ops themselves may be called from
// the compute thread while another thread reads pending_bytes (a mutex guards the job list).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/alloc.h"
#include "kernels/ops.h"

namespace sw {

class DeferredWeightGrads {
 public:
  explicit DeferredWeightGrads(const Ops& inner);
  ~DeferredWeightGrads();
  DeferredWeightGrads(const DeferredWeightGrads&) = delete;
  DeferredWeightGrads& operator=(const DeferredWeightGrads&) = delete;

  // The decorator (same device(), stream(), compute() and preferences as the inner Ops).
  const Ops& ops() const;
  const Ops& inner() const { return inner_; }

  void begin(uint64_t key);  // deferring on; jobs go under key (e.g. micro * 64 + chunk)
  void end();                // deferring off
  bool deferring() const { return deferring_; }
  uint64_t key() const { return key_; }

  void run(uint64_t key);  // runs and frees key's jobs in recorded order (none: nothing)
  void clear();            // drops every job unrun (frees the copies; their dw / db stay as
                           // they are, unwritten); deferring off
  int64_t pending_bytes() const;              // bytes held by recorded copies (all keys)
  int64_t pending_bytes(uint64_t key) const;  // ... of key's jobs
  size_t pending_jobs() const;                // jobs recorded and not yet run (all keys)

  // A recorded weight-gradient job (exposed for tests and the profiler's labels).
  struct Job {
    Buffer dout32, dout16, inp32, inp16;  // the copies (empty where that form was not given)
    GradOut dw = nullptr, db = nullptr;
    int N = 0, C = 0, OC = 0;
    int64_t bytes() const;
  };

 private:
  class Decorator;
  friend class Decorator;
  // Called by the decorator's linear_backward while deferring.
  void record(GradIn dinp, GradOut dw, GradOut db, Operand dout, Operand inp, Operand w, int N,
              int C, int OC);

  const Ops& inner_;
  std::unique_ptr<Decorator> deco_;
  bool deferring_ = false;
  uint64_t key_ = 0;
  mutable std::mutex mu_;
  std::map<uint64_t, std::vector<Job>> jobs_;
};

}  // namespace sw
