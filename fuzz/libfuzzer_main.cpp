// One libFuzzer binary per target: SW_FUZZ_ENTRY names the function of targets.h.
#include <cstddef>
#include <cstdint>

#include "fuzz/targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return SW_FUZZ_ENTRY(data, size);
}
