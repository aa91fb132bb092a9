// Saved under activation checkpointing: Keep::Cheap marks, drop_cheap(), nested parts, and the
// Mem::Activations accounting of each.
#include <catch2/catch.hpp>

#include "core/alloc.h"
#include "core/error.h"
#include "models/unit.h"

using namespace sw;

TEST_CASE("Saved: drop_cheap frees exactly the Keep::Cheap buffers, parts included",
          "[models][saved][checkpointing]") {
  constexpr SavedSlot<float> kQkv{0, Keep::Always, "qkv"}, kLn{1, Keep::Cheap, "ln"};
  constexpr SavedSlot<int32_t> kIdx{2, Keep::Cheap, "idx"};
  constexpr SavedSlot<float> kH{0, Keep::Always, "h"}, kG{1, Keep::Cheap, "g"};
  MemTracker& mt = MemTracker::global();
  const size_t a0 = mt.current(Mem::Activations);
  {
    Saved s;
    float* keep = s.put(kQkv, 100);
    keep[7] = 3.f;
    s.put(kLn, 50);
    s.put(kIdx, 10);
    Saved& p = s.part(1);
    p.put(kH, 20);
    p.put(kG, 30);
    CHECK(s.bytes() == (100 + 50 + 10 + 20 + 30) * 4);
    CHECK(s.cheap_bytes() == (50 + 10 + 30) * 4);
    CHECK(mt.current(Mem::Activations) - a0 == s.bytes());

    CHECK(s.drop_cheap() == (50 + 10 + 30) * 4);
    CHECK(s.bytes() == (100 + 20) * 4);
    CHECK(mt.current(Mem::Activations) - a0 == (100 + 20) * 4);
    CHECK(s.get(kQkv)[7] == 3.f);  // kept buffers keep their contents
    CHECK(s.has(kQkv));
    CHECK_FALSE(s.has(kLn));
    CHECK_THROWS_AS(s.get(kLn), Error);
    CHECK(s.drop_cheap() == 0);

    // Rebuilt in the same slot: marked again, dropped again.
    s.put(kLn, 50);
    CHECK(s.cheap_bytes() == 50 * 4);
    // The same slot marked otherwise changes its mark, not its memory.
    s.put(SavedSlot<float>{kQkv.id, Keep::Cheap, "qkv"}, 100);
    CHECK(s.get(kQkv)[7] == 3.f);
    CHECK(s.cheap_bytes() == 150 * 4);

    s.clear();
    CHECK(s.bytes() == 0);
    CHECK(&s.part(1) == &p);  // parts survive clear(), empty
    CHECK(mt.current(Mem::Activations) == a0);
  }
  CHECK(mt.current(Mem::Activations) == a0);
}
