// A directory on the build tree's disk (O_DIRECT-capable, unlike a tmpfs /tmp), removed at the
// end: the offload I/O tests' files.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <string>

namespace swtest {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& name) {
    path = std::filesystem::path(SW_BINARY_DIR) / "test_tmp" /
           (name + "." + std::to_string(getpid()));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string file(const std::string& n) const { return (path / n).string(); }
};

}  // namespace swtest
