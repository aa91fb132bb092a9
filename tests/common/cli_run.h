// Shared by the tests that run the real `shardwise` binary (SHARDWISE_BIN, a compile
// definition of the test target) in a directory: its exit code, stdout and stderr, and small
// file helpers.
#pragma once
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace clitest {

namespace fs = std::filesystem;

struct Result {
  int rc = -1;
  std::string out, err;
};

inline std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

inline void spit(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

// Shell-quotes one argument.
inline std::string q(const std::string& s) {
  std::string r = "'";
  for (char c : s) r += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return r + "'";
}

// Runs `shardwise ARGS` in `dir` with OMP_NUM_THREADS=threads, capturing stdout, stderr (in
// dir/stdout.txt, dir/stderr.txt) and the exit code (128 + signal when killed).
inline Result sw_run(const fs::path& dir, const std::vector<std::string>& args, int threads) {
  // Appended piece by piece: GCC 12's -Wrestrict misfires on a literal + a temporary string.
  std::string cmd = "cd ";
  cmd += q(dir.string());
  cmd += " && OMP_NUM_THREADS=";
  cmd += std::to_string(threads);
  cmd += ' ';
  cmd += q(SHARDWISE_BIN);
  for (const auto& a : args) {
    cmd += ' ';
    cmd += q(a);
  }
  cmd += " >";
  cmd += q((dir / "stdout.txt").string());
  cmd += " 2>";
  cmd += q((dir / "stderr.txt").string());
  const int st = std::system(cmd.c_str());
  Result r;
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  r.out = slurp(dir / "stdout.txt");
  r.err = slurp(dir / "stderr.txt");
  return r;
}

inline std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> v;
  std::istringstream is(s);
  for (std::string l; std::getline(is, l);) v.push_back(l);
  return v;
}

}  // namespace clitest
