// The wrap policy: which transformer blocks form one FSDP unit (one flat buffer, one
// all-gather, one reduce-scatter). More blocks per unit means fewer, larger collectives (less
// latency per byte) and more memory gathered at once.
#pragma once

#include "models/model.h"

namespace sw {

// Groups every run of consecutive "block" calls of the schedule into composite units of
// `blocks_per_unit` blocks (the last one of a run may be smaller). A block is a unit with one
// call that appears once in the schedule and is neither its first nor its last call (so the
// embedding, the head and tied units stay alone). Parameters keep their names and order; the
// composite runs its blocks in sequence, keeping each block's input for backward in its own
// Saved. blocks_per_unit <= 1 leaves the model as it is. Call before ShardedModel is built.
void wrap_blocks(Model& model, int blocks_per_unit);

}  // namespace sw
