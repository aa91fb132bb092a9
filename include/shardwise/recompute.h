/// Activation checkpointing modes, shared by the unit contract (models/unit.h: what a recompute
/// restores) and the sharding policy (sharding/policy.h: which units are checkpointed). @file
#pragma once
#include <cstdint>

namespace sw {

/// Off: a call keeps its Saved from forward to backward. Full: the Saved is freed after forward
/// and the whole forward re-run before backward (only the call's input is kept). Selective: only
/// the Saved buffers marked Keep::Cheap are freed and rebuilt (element-wise results).
enum class CheckpointMode : uint8_t { Off, Full, Selective };

}  // namespace sw
