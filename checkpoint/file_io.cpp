#include "checkpoint/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace sw {

namespace fs = std::filesystem;

namespace {
std::string errno_str() { return std::strerror(errno); }
}  // namespace

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("checkpoint", dir + ": cannot open the directory to fsync (" + errno_str() + ")");
  const int rc = ::fsync(fd);
  const std::string err = errno_str();
  ::close(fd);
  if (rc != 0) fail("checkpoint", dir + ": fsync of the directory failed (" + err + ")");
}

std::string parent_dir(const std::string& p) {
  fs::path parent = fs::path(p).lexically_normal().parent_path();
  if (parent.empty()) return ".";
  return parent.string();
}

void replace_dir(const std::string& tmp, const std::string& dir, const char* component) {
  std::error_code ec;
  const std::string old = dir + ".old";
  fs::remove_all(old, ec);
  const bool had = fs::exists(dir, ec);
  if (had) {
    fs::rename(dir, old, ec);
    if (ec) fail(component, "cannot move " + dir + " aside to " + old + " (" + ec.message() + ")");
  }
  fs::rename(tmp, dir, ec);
  if (ec) {
    std::error_code back;
    if (had) fs::rename(old, dir, back);
    fail(component, "cannot rename " + tmp + " to " + dir + " (" + ec.message() + ")");
  }
  fsync_dir(parent_dir(dir));
  if (had) fs::remove_all(old, ec);
}

void write_file_synced(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("checkpoint", path + ": cannot create (" + errno_str() + ")");
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string err = errno_str();
      ::close(fd);
      fail("checkpoint", path + ": write failed (" + err + ")");
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const std::string err = errno_str();
    ::close(fd);
    fail("checkpoint", path + ": fsync failed (" + err + ")");
  }
  if (::close(fd) != 0) fail("checkpoint", path + ": close failed (" + errno_str() + ")");
}

}  // namespace sw
