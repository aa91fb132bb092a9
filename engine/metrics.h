// Run metrics: <run_dir>/metrics.jsonl gets one JSON object per optimizer step, flushed as it is
// written, so a crashed or running job can be read; stderr gets a live progress line.
//
// metrics.jsonl keys: step (1-based count of optimizer steps done), loss (mean training loss of
// the step's micro-batches), lr (used by the step), grad_norm (global L2 norm before clipping),
// tokens_per_s (all ranks together), peak_mem_bytes (MemTracker total peak since train() started,
// this rank), step_time_s, comm_s (time this rank's communication threads spent running
// collectives during the step), exposed_comm_s (time compute waited for communication: what
// overlap did not hide), overflow (true when fp16 gradients overflowed and the optimizer step
// was skipped), skipped_steps (such steps so far), loss_scale (fp16 only: the scale this step's
// backward used), minor_faults, user_s, sys_s (this process's minor page faults and user /
// system CPU seconds during the step, all threads, from getrusage: a steady state that
// allocates nothing from the OS shows ~0 faults and sys_s << user_s), rss_bytes and
// max_rss_bytes (resident set at the end of the step and its peak so far, /proc/self/statm and
// getrusage: what a long run watches for growth; max_rss_bytes is the figure `plan` predicts
// as rss_bytes), host_peak_mem_bytes (the host tier's tracked peak: offloaded state, the same
// RAM on the CPU backend), reserved_peak_bytes (what the caching allocator holds at most, in
// use + cached, all tiers together: the tracked bytes plus rounding and blocks kept free),
// open_fds (descriptors open), norm_read_s (time the host spent reading the gradient norm and
// the losses, the step's one read of a GPU: there, the wait for the work it had issued, so a
// figure near 0 means the host's issuing, not the GPU, sets the pace; on the CPU backend, the
// norm's own reduction), and val_loss on
// evaluation steps only. Non-finite numbers are written
// as null. With several ranks, rank 0 writes the file: loss and grad_norm are global, the
// memory and communication figures are rank 0's.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace sw {

struct StepMetrics {
  int step = 0;
  double loss = 0;
  float lr = 0;  // written as the shortest decimal of the fp32 value the optimizer used
  double grad_norm = 0;
  double tokens_per_s = 0;
  size_t peak_mem_bytes = 0;
  int64_t host_peak_mem_bytes = -1;  // host tier's tracked peak (-1: not measured)
  int64_t reserved_peak_bytes = -1;  // caching allocator's peak reservation, all tiers
  double step_time_s = 0;
  double norm_read_s = -1;    // reading the norm and losses (key omitted when negative)
  double comm_s = 0;          // communication time during the step (this rank)
  double exposed_comm_s = 0;  // time blocked waiting for communication (this rank)
  bool overflow = false;    // fp16 overflow: the optimizer step was skipped
  int skipped_steps = 0;    // overflow-skipped steps so far, this one included
  int64_t epoch = -1;       // the data epoch of the step's first row (-1: key omitted)
  double loss_scale = NAN;  // fp16: the loss scale used (NaN: not fp16, key omitted)
  double val_loss = NAN;  // NaN: no evaluation this step (key omitted)
  bool has_val = false;
  // Checkpoint work since the previous line (keys omitted when there was none): the save
  // after the previous step and this step's commit polling. ckpt_stall_s: time the training
  // thread spent in it; ckpt_saved / ckpt_failed: the step of a checkpoint committed / a save
  // that failed in that interval (-1: none).
  double ckpt_stall_s = -1;
  int64_t ckpt_saved = -1, ckpt_failed = -1;
  // Process CPU use during the step (keys omitted when negative: not measured).
  int64_t minor_faults = -1;
  double user_s = -1, sys_s = -1;
  int64_t rss_bytes = -1, max_rss_bytes = -1, open_fds = -1;
};

// getrusage(RUSAGE_SELF) now: CPU seconds and minor page faults of the whole process.
struct CpuUsage {
  double user_s = 0, sys_s = 0;
  int64_t minor_faults = 0;
  int64_t rss_bytes = -1, max_rss_bytes = -1, open_fds = -1;  // at the time of the call
};
CpuUsage cpu_usage();
// Sets m.minor_faults, m.user_s, m.sys_s to what was used from a to b, and the resident set
// and descriptor figures to b's.
void set_cpu_usage(StepMetrics& m, const CpuUsage& a, const CpuUsage& b);

// The JSON line for one step (no trailing newline).
std::string metrics_json_line(const StepMetrics& m);

class MetricsLog {
 public:
  // Creates (truncates) `path`; throws sw::Error("metrics: <path>: ...") if it cannot.
  // keep_through_step >= 0 (a resumed run): keeps the lines of `path` for steps up to and
  // including it (a killed run may have logged further; those lines are dropped, as is a
  // partly written last line) and appends after them.
  explicit MetricsLog(const std::string& path, int64_t keep_through_step = -1);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  void write(const StepMetrics& m);  // one line, flushed

 private:
  std::string path_;
  FILE* f_ = nullptr;
};

// "step 12/100 | loss 3.4521 | val 3.5012 | 12.3k tok/s | ETA 1m23s", with " | skipped N"
// before the ETA once fp16 overflow skipped steps. On a terminal the line is
// rewritten in place (\r), at most every 50 ms (and on eval steps and the last step); otherwise
// one line every `log_every` steps and at the last. metrics.jsonl always gets every step.
class Progress {
 public:
  // tty < 0: detect from `out`. start_step: steps done before this run (a resumed run),
  // left out of the ETA's step time.
  Progress(int total_steps, int log_every, bool enabled, FILE* out = stderr, int tty = -1,
           int start_step = 0);
  // elapsed_s: wall time since the first step started.
  void update(const StepMetrics& m, double elapsed_s);
  void finish();  // ends an in-place line with a newline

 private:
  int total_, every_, start_;
  bool enabled_, tty_, open_line_ = false;
  FILE* out_;
  double last_val_ = NAN;
  double last_print_s_ = -1;
  double first_step_s_ = -1;  // the first step's time (includes warm-up; left out of the ETA)
};

// "1h02m", "3m07s", "12s".
std::string format_duration(double seconds);

}  // namespace sw
