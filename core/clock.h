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

// Seconds on the steady clock (its own epoch; on Linux, shared by the processes of a machine):
// the one timeline of the executor's action records, collectives' start and end times, the
// allocators' event log and the profiler.
inline double trace_now() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

}  // namespace sw
