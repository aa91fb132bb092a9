// The profiler's output side: plain data in, files out. Nothing here knows the step plan, the
// executor or the allocators; whoever records a step (the trainer, and in issue 9 the executor's
// action records plus the allocators' event log) fills a ProfileData and hands it over.
//
// Files (one set per rank, written by that rank):
//   trace_rank<r>.json   Chrome trace event JSON (Perfetto, chrome://tracing): pid = rank,
//                        one tid per queue, an "X" event per action, a "memory" counter;
//                        an action with a device interval (TraceAction::stream) also on a
//                        track of its stream ("stream: nccl", ...), its issue in the args
//   memory_rank<r>.svg   stacked step chart of bytes in use per category over time, the
//                        total's peak marked, an optional predicted total dashed over it
//   peaks_rank<r>.json   the peak of the total, when it happened, what each category held then,
//                        and each category's own peak
// Times are seconds on one clock (the trainer uses steady_clock); the trace writes them as
// microseconds since ProfileData::t_origin (default: the earliest time in the data), the SVG
// as milliseconds since then.
#pragma once
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace sw {

// One executed action of the step plan.
struct TraceAction {
  int step = 0, micro = 0;  // optimizer step (1-based), micro-step
  int action = -1;          // index in the plan (-1: not a plan action, e.g. the trainer's own)
  int plan_index = -1;      // index in the whole step's plan (all micro-steps, then the
                            // optimizer), where the recorder knows it
  std::string queue;        // "compute" | "gather" | "reduce" | "io"
  std::string kind;         // "forward", "backward", "gather", "reduce_scatter", "step", ...
  int unit = -1, call = -1;  // -1 when not applicable
  std::string unit_name;
  int64_t bytes = 0;               // bytes moved (collectives, I/O)
  double t_begin = 0, t_end = 0;   // seconds, same clock as MemSample
  // Where the device's interval is known (ActionRecord::stream): the stream that ran the work
  // ("cuda compute", "nccl", "copy h2d", ...; empty: none) with [t_begin, t_end] its interval
  // there, and [host_begin, host_end] when the host issued it.
  std::string stream;
  double host_begin = 0, host_end = 0;
  std::vector<std::pair<std::string, double>> args;  // extra numbers for the trace (loss, ...)
};

// One allocation (delta > 0) or free (delta < 0) of `category` at time t, during `action`.
struct MemSample {
  double t = 0;
  int action = -1;
  std::string category;
  int64_t delta = 0;
};

struct ProfileData {
  int rank = 0, world = 1;
  std::vector<TraceAction> actions;
  std::vector<MemSample> mem;  // in the order they happened (sorted by t, stably, on use)
  std::vector<std::string> categories;         // all category names, fixed order
  std::map<std::string, int64_t> mem_start;    // bytes in use per category when recording began
  // The time that becomes 0 in the trace and on the chart (NaN: the earliest time in the data).
  // The trainer sets rank 0's recording start on every rank, so ranks' traces line up when
  // opened together (same node: one monotonic clock).
  double t_origin = std::numeric_limits<double>::quiet_NaN();
};

// Peaks of the memory timeline: mem_start, then each sample applied in time order.
struct Peaks {
  int rank = 0;
  std::vector<std::string> categories;  // ProfileData::categories, then any others seen
  int64_t peak_bytes = 0;   // peak of the total (not the sum of the categories' peaks)
  double peak_time = 0;     // when the total first reached it (seconds, data's clock)
  int peak_action = -1;     // the action of the sample that reached it (-1: the start state)
  int peak_step = 0;        // the step and kind of the recorded action with that index whose
  std::string peak_kind;    // time span holds peak_time (0 / "": none does, or the start state)
  std::map<std::string, int64_t> at_peak;            // bytes per category at the total's peak
  std::map<std::string, int64_t> peak_per_category;  // each category's own peak
  // The process's peak resident set when the peaks were written (getrusage's ru_maxrss; set by
  // the caller, -1: not measured): what `plan` predicts as rss_bytes.
  int64_t max_rss_bytes = -1;
};

Peaks compute_peaks(const ProfileData& d);

// Each writer creates or replaces `path` (written to path.tmp, then renamed) and throws
// sw::Error("profile: <path>: ...") when it cannot.
void write_chrome_trace(const ProfileData& d, const std::string& path);
// `predicted`: samples of a planned timeline (same fields; applied from the same mem_start),
// drawn as a dashed line of its total.
void write_memory_svg(const ProfileData& d, const std::string& path,
                      const std::vector<MemSample>* predicted = nullptr);
void write_peaks_json(const Peaks& p, const std::string& path);
// Any other file of the profile directory, the same way (path.tmp, then renamed).
void write_profile_file(const std::string& path, const std::string& text);

// The text forms, for tests and for writing elsewhere.
std::string chrome_trace_json(const ProfileData& d);
std::string memory_svg(const ProfileData& d, const std::vector<MemSample>* predicted = nullptr);
std::string peaks_json(const Peaks& p);
// A table for stdout: one row per category (its peak, its bytes at the total's peak) and the
// total, with a title naming the rank, the peak's action and time.
std::string format_peaks_table(const Peaks& p);
// "512 B", "12.0 KiB", "3.25 MiB", "1.50 GiB".
std::string format_bytes(int64_t bytes);

}  // namespace sw
