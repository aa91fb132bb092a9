// A unit's unsharded gradients (internal to sharding/, part of FlatUnit, sharding/unit_state.h):
// the padded buffer (transient for a sharded unit, allocated at its backward and freed by its
// reduction; persistent for stage 1 and one rank, or a region of the NO_SHARD bucket buffer),
// the per-parameter pointers into it, and two things left to whoever reads it next:
//   unwritten  zeroed gradients are not filled at once: each parameter's range stays unwritten
//              (zero in value; the gaps and padding are zeros in memory) until the first op that
//              produces it writes it (UnitCtx::grad_out: a GEMM with beta = 0 instead of a fill
//              and a read of the zeros; UnitCtx::grad zeroes it first to add into it), and every
//              other reader zeroes what is left first (write_unwritten);
//   rounding   one rank's rounding to reduce_dtype, left to readers that round as they read
//              (Ops::rounds_grads_on_read) and done in place by any other reader first.
#pragma once
#include <cstdint>
#include <vector>

#include "core/alloc.h"
#include "kernels/ops.h"
#include "models/unit.h"
#include "sharding/flat_param.h"

namespace sw {

class UnitGrads {
 public:
  // lazy: zeroing leaves the parameters unwritten (not for a bucket's region, which the bucket's
  // all-reduce reads directly). regap: a persistent buffer a 16-bit reduction narrows in place
  // (packed into its first half), whose gaps and padding hold values again after it.
  void init(const FlatLayout& layout, const Ops& ops, DType rdt, bool lazy, bool regap);
  // Persistent: `region` (a bucket's), or a zeroed buffer of its own (Mem::Grads).
  void make_persistent(float* region);
  // Transient (a sharded unit's, Mem::Communication; a released Whole unit's, Mem::Grads):
  // allocated zeroed (unwritten where lazy).
  void allocate(Mem cat = Mem::Communication);
  // Transient: freed (what was left unwritten or unrounded goes with it).
  void release();
  // Zeroed: unwritten where lazy, else filled; a pending rounding dropped.
  void zero();
  bool allocated() const { return data_ != nullptr; }

  float* data() const { return data_; }  // as it is in memory
  const std::vector<float*>& ptrs() const { return ptrs_; }  // per parameter, into data()
  // For a call that may produce gradients: ctx.grads and the flags of what is still unwritten
  // (UnitCtx::grads_fresh), after a pending rounding (the call adds into rounded values).
  void open(UnitCtx& ctx);
  // Any reader but a call: zeroes what is still unwritten, then does a pending rounding.
  void write_unwritten() const {
    zero_unwritten();
    round_now();
  }
  void zero_unwritten() const;  // the first half alone
  // The rounding to reduce_dtype: left to the readers, or done now (after write_unwritten).
  void leave_rounding() { round_pending_ = true; }
  bool rounding_left() const { return round_pending_; }
  void round() const;

 private:
  void round_now() const;  // a pending rounding, in place
  void zero_gaps();        // zeros between the parameters' ranges and in the padding
  void point();

  const FlatLayout* layout_ = nullptr;
  const Ops* ops_ = nullptr;
  DType rdt_ = DType::F32;
  bool lazy_ = false, regap_ = false;
  Buffer buf_;  // (padded) empty when a bucket's region
  float* data_ = nullptr;
  std::vector<float*> ptrs_;
  mutable bool unwritten_ = false;       // some parameter may be unwritten
  mutable bool round_pending_ = false;   // the rounding left to the readers
  mutable std::vector<uint8_t> fresh_;   // per parameter, 1 = unwritten (UnitCtx::grads_fresh)
  std::vector<size_t> n_;                // values per parameter (UnitCtx::grads_n)
};

}  // namespace sw
