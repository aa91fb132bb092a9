// Saved under activation checkpointing: Keep::Cheap marks, drop_cheap(), nested parts, and the
// Mem::Activations accounting of each.
#include <catch2/catch.hpp>

#include "core/alloc.h"
#include "core/error.h"
#include "models/unit.h"

using namespace sw;

TEST_CASE("Saved: drop_cheap frees exactly the Keep::Cheap buffers, parts included",
          "[models][saved][checkpointing]") {
  MemTracker& mt = MemTracker::global();
  const size_t a0 = mt.current(Mem::Activations);
  {
    Saved s;
    float* keep = s.f32("qkv", 100);
    keep[7] = 3.f;
    s.f32("ln", 50, Keep::Cheap);
    s.i32("idx", 10, Keep::Cheap);
    Saved& p = s.part(1);
    p.f32("h", 20);
    p.f32("g", 30, Keep::Cheap);
    CHECK(s.bytes() == (100 + 50 + 10 + 20 + 30) * 4);
    CHECK(s.cheap_bytes() == (50 + 10 + 30) * 4);
    CHECK(mt.current(Mem::Activations) - a0 == s.bytes());

    CHECK(s.drop_cheap() == (50 + 10 + 30) * 4);
    CHECK(s.bytes() == (100 + 20) * 4);
    CHECK(mt.current(Mem::Activations) - a0 == (100 + 20) * 4);
    CHECK(s.get("qkv")[7] == 3.f);  // kept buffers keep their contents
    CHECK(s.has("qkv"));
    CHECK_FALSE(s.has("ln"));
    CHECK_THROWS_AS(s.get("ln"), Error);
    CHECK(s.drop_cheap() == 0);

    // Rebuilt under the same key: marked again, dropped again.
    s.f32("ln", 50, Keep::Cheap);
    CHECK(s.cheap_bytes() == 50 * 4);
    // Re-marking an existing key changes its mark, not its memory.
    s.f32("qkv", 100, Keep::Cheap);
    CHECK(s.get("qkv")[7] == 3.f);
    CHECK(s.cheap_bytes() == 150 * 4);

    s.clear();
    CHECK(s.bytes() == 0);
    CHECK(&s.part(1) == &p);  // parts survive clear(), empty
    CHECK(mt.current(Mem::Activations) == a0);
  }
  CHECK(mt.current(Mem::Activations) == a0);
}
