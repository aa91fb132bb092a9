// The environment switches' one declaration (core/env.h): the typed readers, README.md's table,
// and that every SHARDWISE_* name the source tree reads or sets is declared.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>

#include "core/env.h"
#include "core/error.h"

using namespace sw;
namespace fs = std::filesystem;

namespace {

// Sets a variable for one scope and restores what was there.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> before;
  ScopedEnv(const char* n, const char* v) : name(n) {
    if (const char* b = std::getenv(n)) before = b;
    ::setenv(n, v, 1);
  }
  ~ScopedEnv() {
    if (before)
      ::setenv(name.c_str(), before->c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }
};

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool declared(const std::string& name) {
  for (const EnvVar& v : env_vars())
    if (name == v.name) return true;
  return false;
}

// The folders of our own sources, scripts and build files (not .deps, not build trees).
bool skipped_dir(const fs::path& p) {
  const std::string n = p.filename().string();
  return n.empty() || n[0] == '.' || n == "build" || n.rfind("build-", 0) == 0 ||
         n.rfind("build_", 0) == 0;
}

}  // namespace

TEST_CASE("env: every switch is declared once with its table entry") {
  std::set<std::string> names;
  for (const EnvVar& v : env_vars()) {
    INFO(v.name);
    CHECK(std::string(v.name).rfind("SHARDWISE_", 0) == 0);
    CHECK(names.insert(v.name).second);
    CHECK(std::string(v.doc).size() > 10);
    CHECK(std::string(v.fallback).size() > 0);
    const std::string use = v.use;
    CHECK((use == "run" || use == "debug" || use == "test"));
    if (v.kind == EnvKind::Integer || v.kind == EnvKind::Number) CHECK(v.lo <= v.hi);
  }
}

TEST_CASE("env: the typed readers") {
  {
    ScopedEnv e("SHARDWISE_TEST_NO_TMPFS", "1");
    CHECK(env_flag("SHARDWISE_TEST_NO_TMPFS"));
  }
  for (const char* off : {"", "0", "off", "false"}) {
    ScopedEnv e("SHARDWISE_TEST_NO_TMPFS", off);
    CHECK_FALSE(env_flag("SHARDWISE_TEST_NO_TMPFS"));
  }
  CHECK(env_switch("SHARDWISE_CKPT_O_DIRECT"));  // a switch is on unless switched off
  {
    ScopedEnv e("SHARDWISE_CKPT_O_DIRECT", "off");
    CHECK_FALSE(env_switch("SHARDWISE_CKPT_O_DIRECT"));
  }
  {
    ScopedEnv e("SHARDWISE_CKPT_THREADS", "1");
    CHECK(env_int("SHARDWISE_CKPT_THREADS") == 1);
  }
  {
    ScopedEnv e("SHARDWISE_CKPT_THREADS", "");
    CHECK_FALSE(env_int("SHARDWISE_CKPT_THREADS").has_value());
  }
  {
    ScopedEnv e("SHARDWISE_CKPT_THREADS", "3");
    CHECK_THROWS_WITH(env_int("SHARDWISE_CKPT_THREADS"),
                      "env: SHARDWISE_CKPT_THREADS='3': expected an integer in [1, 2]");
  }
  {
    ScopedEnv e("SHARDWISE_COMM_TIMEOUT_S", "7.5");
    CHECK(env_number("SHARDWISE_COMM_TIMEOUT_S") == 7.5);
  }
  {
    ScopedEnv e("SHARDWISE_COMM_TIMEOUT_S", "soon");
    CHECK_THROWS_AS(env_number("SHARDWISE_COMM_TIMEOUT_S"), Error);
  }
  {
    ScopedEnv e("SHARDWISE_HARDWARE", "/tmp/hw.json");
    CHECK(env_text("SHARDWISE_HARDWARE") == "/tmp/hw.json");
  }
  // A name that is not declared, or read as another kind: a programming error.
  const std::string undeclared = std::string("SHARDWISE_") + "NO_SUCH_SWITCH";  // not a literal:
  CHECK_THROWS_AS(env_flag(undeclared.c_str()), std::logic_error);  // the scan below reads this
  CHECK_THROWS_AS(env_flag("SHARDWISE_CKPT_THREADS"), std::logic_error);
  CHECK_THROWS_AS(env_int("SHARDWISE_TEST_VERBOSE"), std::logic_error);
}

TEST_CASE("env: README.md's switch table is the generated one") {
  const std::string text = read_file(fs::path(SW_SOURCE_DIR) / "README.md");
  const std::string begin = "<!-- env-switches:begin -->\n", end = "<!-- env-switches:end -->";
  const size_t b = text.find(begin), e = text.find(end);
  REQUIRE(b != std::string::npos);
  REQUIRE(e != std::string::npos);
  REQUIRE(b < e);
  INFO("Regenerate README.md's tables, from the source directory, with: BUILD_DIR="
       << SW_BINARY_DIR << " scripts/gen_config_table.sh");
  CHECK(text.substr(b + begin.size(), e - b - begin.size()) == env_vars_markdown());
}

TEST_CASE("env: every SHARDWISE_* variable the source tree reads or sets is declared") {
  // C++ and CUDA: a string literal that starts with the name (getenv, setenv, the readers, the
  // messages naming the variable). Scripts and CMake: the name set, exported or expanded.
  const std::regex in_code("\"(SHARDWISE_[A-Z0-9_]*[A-Z0-9])");
  const std::regex in_script("(SHARDWISE_[A-Z0-9_]*[A-Z0-9])(=|\\}|\\b)");
  // Our own variables under another prefix: no SW_* reads.
  const std::regex legacy_read("(getenv|setenv)\\(\"(SW_[A-Z0-9_]+)\"");
  std::set<std::string> undeclared, legacy;
  int files = 0;
  const fs::path root(SW_SOURCE_DIR);
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator();
       ++it) {
    if (it->is_directory()) {
      if (skipped_dir(it->path())) it.disable_recursion_pending();
      continue;
    }
    const fs::path& p = it->path();
    const std::string ext = p.extension().string(), name = p.filename().string();
    const bool code = ext == ".cpp" || ext == ".h" || ext == ".cu" || ext == ".cuh";
    const bool script = ext == ".sh" || ext == ".py" || ext == ".cmake" || name == "CMakeLists.txt";
    if (!code && !script) continue;
    ++files;
    const std::string text = read_file(p);
    const std::string where = fs::relative(p, root).string();
    std::istringstream lines(text);
    std::string line;
    while (std::getline(lines, line)) {
      // A compile definition (SHARDWISE_BIN, the binary's path) is not an environment variable.
      if (line.find("target_compile_definitions") != std::string::npos) continue;
      const std::regex& re = code ? in_code : in_script;
      for (auto m = std::sregex_iterator(line.begin(), line.end(), re); m != std::sregex_iterator();
           ++m)
        if (!declared((*m)[1].str())) undeclared.insert((*m)[1].str() + " (" + where + ")");
      if (code)
        for (auto m = std::sregex_iterator(line.begin(), line.end(), legacy_read);
             m != std::sregex_iterator(); ++m)
          if (!declared((*m)[2].str())) legacy.insert((*m)[2].str() + " (" + where + ")");
    }
  }
  CHECK(files > 100);
  for (const std::string& u : undeclared)
    FAIL_CHECK(u << ": not declared in core/env.cpp (declare it there, with its table line)");
  for (const std::string& u : legacy)
    FAIL_CHECK(u << ": our variables are named SHARDWISE_* (declare it in core/env.cpp)");
}
