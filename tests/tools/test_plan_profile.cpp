// The hardware profile's ranks x threads against the run's (issue 41): `plan --calibrate`
// records them, profiles without them still load, and `shardwise plan` prints one line when the
// run differs from the profile (none when it matches). The profile is written here from
// planner/hardware.h's nominal figures with the shape set by hand, so the expected line follows
// from the test's own numbers, not from what calibration measures.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/hardware.h"
#include "tests/common/cli_run.h"

namespace fs = std::filesystem;

namespace {

using clitest::Result;
using clitest::spit;

fs::path scratch(const std::string& name) {
  fs::path d = fs::path(SW_BINARY_DIR) / "tests" / "tools_tmp" / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

const char* kConfig = R"({
  "model": {"type": "gpt2", "vocab_size": 256, "n_layer": 1, "n_head": 2, "d_model": 32,
            "seq_len": 32},
  "train_micro_batch_size_per_gpu": 4
})";

void write_profile(const fs::path& p, int world, int threads) {
  sw::HardwareProfile hw = sw::nominal_hardware(world);
  hw.name = "test profile";
  hw.world_size = world;
  hw.threads = threads;
  spit(p, sw::hardware_to_json(hw));
}

// The lines of `text` that carry the note.
std::vector<std::string> notes(const std::string& text) {
  std::vector<std::string> r;
  for (const std::string& l : clitest::lines(text))
    if (l.find("was measured with") != std::string::npos) r.push_back(l);
  return r;
}

Result plan(const fs::path& d, int world, int threads, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"plan", "cfg.json", "--hardware", "hw.json", "--world-size",
                                   std::to_string(world), "--set",
                                   "threads=" + std::to_string(threads)};
  args.insert(args.end(), extra.begin(), extra.end());
  return clitest::sw_run(d, args, 1);
}

}  // namespace

TEST_CASE("plan profile: a profile without world_size and threads loads, both 0 (not recorded)") {
  sw::HardwareProfile hw = sw::nominal_hardware(2);
  hw.world_size = 2;
  hw.threads = 1;
  const sw::HardwareProfile back = sw::hardware_from_json_text(sw::hardware_to_json(hw), "t");
  CHECK(back.world_size == 2);
  CHECK(back.threads == 1);
  nlohmann::json old = nlohmann::json::parse(sw::hardware_to_json(hw));
  REQUIRE(old.erase("world_size") == 1);
  REQUIRE(old.erase("threads") == 1);
  const sw::HardwareProfile o = sw::hardware_from_json_text(old.dump(), "old.json");
  CHECK(o.world_size == 0);
  CHECK(o.threads == 0);
  // Not recorded is not a match: the line says so.
  const std::string n = sw::plan_shape_note(o, 2, 1, false);
  CHECK(n.find("? ranks x ? threads (not recorded)") != std::string::npos);
  // A device run compares ranks only.
  hw.threads = 0;
  CHECK(sw::plan_shape_note(hw, 2, 7, true).empty());
  CHECK(sw::plan_shape_note(hw, 4, 7, true).find("2 ranks, this run is 4 ranks") !=
        std::string::npos);
}

TEST_CASE("plan profile: plan says in one line when the run's ranks x threads differ") {
  const fs::path d = scratch("plan_profile");
  spit(d / "cfg.json", kConfig);
  write_profile(d / "hw.json", 2, 1);

  const Result same = plan(d, 2, 1);
  INFO(same.out << same.err);
  REQUIRE(same.rc == 0);
  REQUIRE(same.out.find("step time (hardware 'test profile')") != std::string::npos);
  CHECK(notes(same.out).empty());

  // The issue's case: calibrated with 2 threads per rank, the run uses 1 (and the reverse).
  write_profile(d / "hw.json", 2, 2);
  const Result threads = plan(d, 2, 1);
  INFO(threads.out << threads.err);
  REQUIRE(threads.rc == 0);
  const std::vector<std::string> t = notes(threads.out);
  REQUIRE(t.size() == 1);
  CHECK(t[0].find("'test profile' was measured with 2 ranks x 2 threads, this run is 2 ranks x "
                  "1 thread") != std::string::npos);
  CHECK(t[0].find("not rescaled") != std::string::npos);
  CHECK(t[0].find("mpirun -np 2 shardwise plan CONFIG --calibrate --set threads=1") !=
        std::string::npos);
  CHECK(notes(plan(d, 2, 2).out).empty());

  // Ranks differ, threads the same.
  const Result ranks = plan(d, 1, 2);
  REQUIRE(ranks.rc == 0);
  const std::vector<std::string> r = notes(ranks.out);
  REQUIRE(r.size() == 1);
  CHECK(r[0].find("with 2 ranks x 2 threads, this run is 1 rank x 2 threads") !=
        std::string::npos);

  // The budget search predicts with the profile too.
  const Result search = plan(d, 2, 1, {"--memory-budget", "1GiB"});
  INFO(search.out << search.err);
  REQUIRE(search.rc == 0);
  CHECK(notes(search.out).size() == 1);
  CHECK(notes(plan(d, 2, 2, {"--memory-budget", "1GiB"}).out).empty());
}
