// What the built-in units share (models/gpt2.cpp, llama.cpp, tensor_units.cpp; internal to
// models/): activation storage, per-call scratch, byte counts for declarations, and the Saved
// slots of a block (the whole block and its tensor-parallel part keep the same buffers, of their
// own rows or columns).
#pragma once
#include <cstddef>
#include <cstdint>

#include "models/unit.h"

namespace sw::units {

// Kept in ctx.saved when training (backward needs it), in ctx.scratch otherwise (eval keeps
// nothing). Same arithmetic either way.
inline float* keep(UnitCtx& ctx, SavedSlot<float> slot, size_t n) {
  return ctx.training ? ctx.saved->put(slot, n) : ctx.scratch->f32(n);
}

// Scratch is per call: released for reuse when the call returns.
struct ScratchScope {
  Scratch* s;
  ~ScratchScope() { s->reset(); }
};

inline size_t sz(int64_t a, int64_t b = 1) { return static_cast<size_t>(a * b); }
// Bytes of a Saved request of n floats, and of a Scratch request (models/unit.h).
inline size_t f32b(size_t n) { return n * sizeof(float); }
inline size_t scrb(size_t n) { return Scratch::bytes_for(n); }

// Keep::Cheap marks what selective checkpointing drops and recompute_cheap rebuilds.
namespace gpt2_block {
constexpr ProductSlot kLn1{0, Keep::Cheap, "ln1"}, kQkv{1, Keep::Always, "qkv"},
    kAtty{2, Keep::Always, "atty"}, kLn2{3, Keep::Cheap, "ln2"}, kFch{4, Keep::Always, "fch"},
    kFchGelu{5, Keep::Cheap, "fch_gelu"};
constexpr SavedSlot<float> kLn1Mean{6, Keep::Always, "ln1_mean"},
    kLn1Rstd{7, Keep::Always, "ln1_rstd"}, kLse{8, Keep::Always, "lse"},
    kX2{9, Keep::Always, "x2"}, kLn2Mean{10, Keep::Always, "ln2_mean"},
    kLn2Rstd{11, Keep::Always, "ln2_rstd"};
}  // namespace gpt2_block

namespace llama_block {
constexpr ProductSlot kXn{0, Keep::Cheap, "xn"}, kQkv{1, Keep::Always, "qkv"},
    kAtty{2, Keep::Always, "atty"}, kXn2{3, Keep::Cheap, "xn2"}, kGu{4, Keep::Always, "gu"},
    kHmlp{5, Keep::Cheap, "hmlp"};
constexpr SavedSlot<float> kRstd1{6, Keep::Always, "rstd1"}, kLse{7, Keep::Always, "lse"},
    kX2{8, Keep::Always, "x2"}, kRstd2{9, Keep::Always, "rstd2"};
}  // namespace llama_block

}  // namespace sw::units
