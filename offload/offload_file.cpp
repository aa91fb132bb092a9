#include "offload/offload_file.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/bytes.h"
#include "core/error.h"

namespace sw {

int64_t aio_align_up(int64_t bytes) {
  const int64_t a = static_cast<int64_t>(kAioAlign);
  return (bytes + a - 1) / a * a;
}

OffloadFile::OffloadFile(std::string key, std::string root, int rank, const std::string& name,
                         bool o_direct, int64_t room, const char* what)
    : key_(std::move(key)), root_(std::move(root)), rank_(rank) {
  dir_ = root_ + "/rank_" + std::to_string(rank);
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec)
    fail("offload", key_ + " '" + root_ + "': cannot create " + dir_ + " (" + ec.message() + ")");
  if (room > 0) check_room(room, what);
  path_ = dir_ + "/" + name;
  try {
    file_ = AioFile::create(path_, 0, o_direct);
  } catch (const Error& e) {  // "aio: <path>: cannot create: <strerror> (errno <e>)"
    fail("offload", key_ + " '" + root_ + "': " + std::string(e.what()).substr(5));
  }
}

OffloadFile::~OffloadFile() {
  for (size_t c = 0; c < static_cast<size_t>(Mem::Count); ++c)
    if (tracked_[c]) MemTracker::of(Tier::Nvme).sub(static_cast<Mem>(c), size_t(tracked_[c]));
  if (file_.is_open()) {
    file_.close();
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());  // only if empty
  }
}

void OffloadFile::check_room(int64_t bytes, const char* what) const {
  struct statvfs vfs {};
  if (::statvfs(dir_.c_str(), &vfs) != 0) return;
  const uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  if (free_bytes < static_cast<uint64_t>(bytes))
    fail("offload", key_ + " '" + root_ + "': rank " + std::to_string(rank_) + " needs " +
                        format_bytes(static_cast<size_t>(bytes)) + " for " + what + ", " +
                        format_bytes(free_bytes) + " free");
}

int OffloadFile::reserve(int64_t bytes) {
  int err = ::posix_fallocate(file_.fd(), 0, bytes);
  if (err == EOPNOTSUPP || err == EINVAL) err = ::ftruncate(file_.fd(), bytes) == 0 ? 0 : errno;
  return err;
}

void OffloadFile::reserve_or_fail(int64_t bytes) {
  if (const int err = reserve(bytes); err != 0) reserve_failed(bytes, err);
}

void OffloadFile::reserve_failed(int64_t bytes, int err) const {
  fail("offload",
       path_ + ": cannot reserve " + std::to_string(bytes) + " bytes (" + std::strerror(err) + ")");
}

void OffloadFile::track(Mem cat, int64_t bytes) {
  MemTracker::of(Tier::Nvme).add(cat, static_cast<size_t>(bytes));
  tracked_[static_cast<size_t>(cat)] += bytes;
}

}  // namespace sw
