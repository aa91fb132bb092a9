// Helpers shared by the checkpoint tests: a scratch directory, raw file builders and the
// launcher of the Python cross-checks.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace sttest {

// A fresh directory under the system temp dir, removed on destruction.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag) {
    path =
        std::filesystem::temp_directory_path() / ("sw_" + tag + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
  size_t count() const {
    size_t n = 0;
    for (auto& e : std::filesystem::directory_iterator(path)) n += e.is_regular_file();
    return n;
  }
};

// Writes a safetensors file byte by byte: the 8-byte length (hlen, or header.size() when
// hlen < 0), the header text, then `data`.
inline void write_raw(const std::string& path, const std::string& header,
                      const std::vector<uint8_t>& data, int64_t hlen = -1) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  uint64_t n = hlen < 0 ? header.size() : static_cast<uint64_t>(hlen);
  for (int i = 0; i < 8; ++i) f.put(static_cast<char>((n >> (8 * i)) & 0xff));
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

inline std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

// Runs `SW_PYTHON tests/checkpoint/<script> <args>`; returns the script's exit status (-1 when
// it did not exit). The command is reported with the caller's next assertion.
inline int run_python_script(const std::string& script, const std::string& args) {
  const std::string cmd =
      std::string(SW_PYTHON) + " " + SW_SOURCE_DIR + "/tests/checkpoint/" + script + " " + args;
  UNSCOPED_INFO(cmd);
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

}  // namespace sttest
