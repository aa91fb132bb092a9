// Steady-clock time for metrics and traces. trace_now() is the one timeline shared by the
// memory event log (MemTracker::now) and the step executor's action timestamps: seconds since
// a process-wide epoch (the first call), so events from both can be merged as they are.
#pragma once
#include <chrono>

namespace sw {

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Seconds since the process's trace epoch (steady clock).
inline double trace_now() {
  static const Clock::time_point epoch = Clock::now();
  return seconds_since(epoch);
}

}  // namespace sw
