// A file per rank that offload keeps state in: <root>/rank_<r>/<name>. The three offload files
// (the optimizer's moments, the parameters, the activations: moments_file.h, param_file.h,
// activation_file.h) share what is here: the directory, the free-space check, the file made
// through the I/O engine (O_DIRECT where the filesystem takes it), blocks reserved with
// fallocate so that a disk filling up later cannot fail a write in the middle of a step, the
// bytes reported to the NVMe tier's tracker, and removal at a clean exit. Every error is one
// sw::Error line naming the config key that gave the path.
#pragma once
#include <cstdint>
#include <string>

#include "core/alloc.h"
#include "offload/aio.h"

namespace sw {

class OffloadFile {
 public:
  // Creates <root>/rank_<rank> and, after `room` bytes are found free there (for `what`),
  // creates (truncates: a killed run's stale file goes) <name> in it. `key` names the config
  // key in errors ("zero_optimization.offload_optimizer.nvme_path").
  OffloadFile(std::string key, std::string root, int rank, const std::string& name,
              bool o_direct, int64_t room, const char* what);
  // Closes and removes the file, and the rank's directory when it is empty. Whoever does io on
  // it must have drained it first.
  ~OffloadFile();
  OffloadFile(const OffloadFile&) = delete;
  OffloadFile& operator=(const OffloadFile&) = delete;

  const AioFile& file() const { return file_; }
  int fd() const { return file_.fd(); }  // the buffered descriptor
  const std::string& path() const { return path_; }
  const std::string& dir() const { return dir_; }

  // sw::Error naming the key when the directory's filesystem has less than `bytes` free.
  void check_room(int64_t bytes, const char* what) const;
  // Reserves [0, bytes) of the file (zeros where new); 0 or the errno.
  int reserve(int64_t bytes);
  // reserve, or sw::Error("offload: <path>: cannot reserve N bytes (<strerror>)").
  void reserve_or_fail(int64_t bytes);
  [[noreturn]] void reserve_failed(int64_t bytes, int err) const;
  // Reports `bytes` more of category `cat` on the NVMe tier's tracker (Tier::Nvme counts the
  // bytes files hold); given back when the file goes.
  void track(Mem cat, int64_t bytes);

 private:
  std::string key_, root_, dir_, path_;
  int rank_;
  AioFile file_;
  int64_t tracked_[static_cast<size_t>(Mem::Count)] = {};
};

// Bytes rounded up to the engine's O_DIRECT alignment (kAioAlign): where regions of the files
// start, so that whole pieces go through O_DIRECT.
int64_t aio_align_up(int64_t bytes);

}  // namespace sw
