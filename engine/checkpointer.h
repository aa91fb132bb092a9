// The trainer's checkpoints in one directory <dir>:
//   step_<N>/       a complete checkpoint after N optimizer steps (checkpoint/sharded_checkpoint.h)
//   .step_<N>.tmp/  a save in progress (renamed to step_<N> by commit_checkpoint)
//   latest          "step_<N>\n": the newest committed checkpoint; replaced atomically (temp
//                   file, fsync, rename, fsync of <dir>)
// Names starting with '.' are never complete checkpoints: leftovers of a killed save or prune
// are removed when the next run starts. keep_last pruning renames a checkpoint to a '.' name
// before deleting it, so a prune killed midway never leaves a partial step_<N>.
//
// Saving (every call collective: all ranks make the same calls in the same order):
//   save()   completes the previous save if one is pending (wait + commit), copies the model's
//            share into memory (snapshot_checkpoint) and writes it: synchronously, or on a
//            background thread when async (at most one save in flight);
//   poll()   (each step while a save is pending) one tiny all-reduce of the ranks' "written"
//            flags; when all have written, commits. The decision is on the reduced value, so
//            every rank commits at the same step;
//   finish() waits for and commits the pending save.
// A failed save (ENOSPC, EFBIG, EIO...) leaves the previous checkpoints and `latest` as they
// were: commit_checkpoint removes the temporary directory and the call reports the failure
// in its CkptEvents (the trainer prints a warning and continues; see engine/trainer.cpp).
//
// Test hook: SHARDWISE_CKPT_TEST_DELAY_MS=D makes the writer sleep D ms after creating the
// temporary directory and again after writing its files (before the commit), so tests can
// kill a save or change a process's limits at a known point.
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/sharded_checkpoint.h"

namespace sw {

class Group;
class ShardedModel;

// What checkpointing did during one call, for metrics and messages.
struct CkptEvents {
  double stall_s = 0;      // wall time the calling (training) thread spent in the call
  int64_t committed = -1;  // step of a checkpoint committed during the call
  int64_t failed = -1;     // step of a save that failed during the call
  std::string error;       // this rank's error for the failed save ("" if it failed elsewhere)
  void add(const CkptEvents& o);  // merges o into this (stall summed; later steps win)
};

class Checkpointer {
 public:
  // Collective. Rank 0 creates `dir` and removes leftovers of killed saves and prunes (names
  // listed at remove_stale); then a barrier, so no rank starts
  // writing into a directory still being cleaned. keep_last: complete checkpoints kept (0 =
  // all).
  Checkpointer(std::string dir, int keep_last, bool async, Group& group);
  // Waits for a background write but commits nothing: its temporary directory stays behind and
  // is removed at the next start (a destructor cannot make a collective call safely).
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Local; async saving only (a no-op otherwise or when a snapshot exists). Allocates the
  // host memory the async snapshots copy into and faults it in on a background thread, so
  // the first save's stall is the copy alone, as later ones are (without it, the first
  // snapshot takes the page faults of a fresh checkpoint-sized buffer). Call once the model
  // exists; training may run meanwhile (the thread touches only that memory).
  void reserve(const ShardedModel& sm);
  CkptEvents save(const ShardedModel& sm, const TrainState& state);  // collective
  CkptEvents poll();                                                 // collective
  CkptEvents finish();                                               // collective
  bool pending() const { return pending_; }
  const std::string& dir() const { return dir_; }

  static std::string step_name(int64_t step);  // "step_<N>"

 private:
  CkptEvents commit_pending();         // collective; requires pending_ and the writer joined
  void write(const std::string& tmp);  // writer body: never throws, sets error_ and written_

  std::string dir_;
  int keep_last_;
  bool async_;
  Group& group_;
  bool pending_ = false;  // identical on every rank
  int64_t pending_step_ = -1;
  SnapshotPtr snap_;
  std::thread writer_;
  std::thread prefault_;              // reserve()'s page toucher; joined before the first save
  std::atomic<bool> written_{false};  // set by the writer when it is done (success or not)
  std::string error_;                 // the writer's error ("" = success); read after join
};

// The step directory <ckpt_dir>/latest names, or "" when there is no `latest` file.
// Throws sw::Error when `latest` is unreadable or malformed.
std::string read_latest(const std::string& ckpt_dir);
// Replaces <ckpt_dir>/latest with "<step_name>\n" atomically (temp file, fsync, rename, fsync
// of the directory). Throws sw::Error naming the file on failure.
void write_latest(const std::string& ckpt_dir, const std::string& step_name);
// The complete checkpoints in ckpt_dir ("step_<N>" directories), as (N, path) by increasing N.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& ckpt_dir);
// Removes the oldest complete checkpoints beyond the newest keep_last (0 = keep all); never
// the one `latest` names. Returns the names removed.
std::vector<std::string> prune_checkpoints(const std::string& ckpt_dir, int keep_last);
// Removes leftovers of killed saves and prunes: names starting with ".step_", ".latest.tmp",
// "step_*.tmp" and "step_*.old" (commit_checkpoint's aside name). Returns the names removed.
std::vector<std::string> remove_stale(const std::string& ckpt_dir);

// The step directory a run resumes from, for checkpoint.resume = `resume`:
//   "auto": the one <ckpt_dir>/latest names, else the newest complete step_<N> in ckpt_dir,
//           else "" (no checkpoint yet: the run starts fresh);
//   a path: a step directory or a checkpoint directory holding `latest`; throws sw::Error
//           ("resume: <path>: ...") when it is neither.
std::string resolve_resume(const std::string& resume, const std::string& ckpt_dir);

}  // namespace sw
