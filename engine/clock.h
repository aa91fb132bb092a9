// Wall-clock timing for the engine's metrics (step time, checkpoint stalls).
#pragma once
#include <chrono>

namespace sw {

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace sw
