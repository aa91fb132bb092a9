// fuzz_replay TARGET PATH...: feeds every file (directories: every file inside, recursively)
// to the fuzz entry point TARGET, as libFuzzer would, with the normal compiler and no
// libFuzzer. ctest runs it over the seed corpus and the regression inputs of each target, so
// every crash the fuzzers found stays fixed. Exit 0 when all ran; a finding crashes or
// throws (a non-sw::Error exception) and names the file on stderr first.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz/targets.h"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: fuzz_replay TARGET PATH...\n");
    return 2;
  }
  const sw::fuzz::Entry run = sw::fuzz::entry(argv[1]);
  if (!run) {
    std::fprintf(stderr, "fuzz_replay: unknown target '%s'\n", argv[1]);
    return 2;
  }
  std::vector<fs::path> files;
  for (int i = 2; i < argc; ++i) {
    const fs::path p(argv[i]);
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      for (const auto& e : fs::recursive_directory_iterator(p))
        if (e.is_regular_file() && e.path().filename().string()[0] != '.') files.push_back(e.path());
    } else if (fs::is_regular_file(p, ec)) {
      files.push_back(p);
    } else {
      std::fprintf(stderr, "fuzz_replay: %s: no such file or directory\n", argv[i]);
      return 2;
    }
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& p : files) {
    std::ifstream in(p, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
    std::fprintf(stderr, "%s (%zu bytes)\n", p.c_str(), bytes.size());
    try {
      run(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fuzz_replay: %s: %s: uncaught exception: %s\n", argv[1], p.c_str(),
                   e.what());
      return 1;
    }
  }
  std::printf("fuzz_replay %s: %zu inputs, no finding\n", argv[1], files.size());
  return 0;
}
