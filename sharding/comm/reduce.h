// Element-wise reductions used by the collectives (internal to sharding/comm). Pure
// functions of their inputs, so every algorithm's result is fixed by the order it adds in.
// bf16/f16 inputs are widened to fp32, combined, and rounded back once per call.
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "sharding/comm/group.h"

namespace sw::comm {

// dst[i] = a[i] (op) b[i] for i < n. Avg combines like Sum. dst may alias a or b.
void reduce2(void* dst, const void* a, const void* b, int64_t n, DType dt, ReduceOp op);
// dst[i] = ((src[0][i] op src[1][i]) op src[2][i]) ... op src[k-1][i], left to right.
// dst may alias any src (each element is read in full before it is written).
void reduce_n(void* dst, const void* const* src, int k, int64_t n, DType dt, ReduceOp op);
// x[i] = x[i] / d (the Avg finish; a division, not a multiply by 1/d).
void divide(void* x, int64_t n, DType dt, float d);

}  // namespace sw::comm
