// Faults around checkpoints with the real `shardwise train` in a child process: SIGKILL during
// training and during a save, a full disk during a save, and a bad --resume path. In each case
// the previous checkpoint must still load, `latest` must not move, and resuming must end with
// the same weights as a run that was never interrupted.
//
// Saves are slowed with SHARDWISE_CKPT_TEST_DELAY_MS (the writer sleeps after creating the
// temporary directory and after writing its files), so the kills land inside a save
// deterministically, whatever the machine's load.
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "checkpoint/sharded_checkpoint.h"
#include "core/env.h"
#include "core/rng.h"
#include "engine/checkpointer.h"
#include "engine/data.h"
#include "engine_test_util.h"

using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

const std::string kShardwise = std::string(SW_BINARY_DIR) + "/tools/shardwise";

fs::path work() {
  static const fs::path d = [] {
    const fs::path p =
        fs::temp_directory_path() / ("sw_test_ckpt_kill_" + std::to_string(getpid()));
    fs::remove_all(p);
    fs::create_directories(p);
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(fs::temp_directory_path() / ("sw_test_ckpt_kill_" + std::to_string(getpid())),
                     ec);
    });
    return p;
  }();
  return d;
}

using sw::enginetest::read_bytes;

// One config for every run here; 40 steps, a checkpoint every 10.
std::string config() {
  const fs::path cfg = work() / "cfg.json";
  if (!fs::exists(cfg)) {
    std::vector<uint16_t> t(8000);
    for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint16_t>(sw::rng_bits(3, 0, i) % 32);
    sw::write_token_file((work() / "train.bin").string(), t);
    std::ofstream(cfg) << R"({
      "model": {"type": "gpt2", "vocab_size": 32, "n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 16},
      "data": {"train": ")"
                       << (work() / "train.bin").string() << R"("},
      "train_micro_batch_size_per_gpu": 4, "train_steps": 40, "threads": 1, "seed": 5,
      "optimizer": {"params": {"lr": 0.003}},
      "checkpoint": {"every_steps": 10, "keep_last": 2}
    })";
  }
  return cfg.string();
}

struct Child {
  pid_t pid = -1;
  std::string log;  // stdout + stderr
};

// Starts `shardwise train CONFIG --quiet --set run_dir=<run> args...` with extra environment,
// through `mpirun -np ranks` when ranks > 1.
Child start(const std::string& run, std::vector<std::string> args,
            std::vector<std::string> env = {}, bool ignore_sigxfsz = false, int ranks = 1) {
  Child c;
  c.log = (work() / (run + ".log")).string();
  std::vector<std::string> argv = {kShardwise, "train", config(),
                                   "--quiet",  "--set", "run_dir=" + (work() / run).string()};
  if (ranks > 1)
    argv.insert(argv.begin(), {SW_MPIEXEC, "--allow-run-as-root", "--oversubscribe", "-np",
                               std::to_string(ranks)});
  argv.insert(argv.end(), args.begin(), args.end());
  c.pid = fork();
  REQUIRE(c.pid >= 0);
  if (c.pid == 0) {
    FILE* f = std::freopen(c.log.c_str(), "w", stdout);
    if (!f) _exit(127);
    dup2(fileno(stdout), 2);
    for (const std::string& e : env) putenv(const_cast<char*>(e.c_str()));
    setenv("OMP_NUM_THREADS", "1", 1);
    if (ignore_sigxfsz) signal(SIGXFSZ, SIG_IGN);  // kept across exec: writes fail with EFBIG
    std::vector<char*> a;
    for (std::string& s : argv) a.push_back(s.data());
    a.push_back(nullptr);
    execv(a[0], a.data());
    _exit(127);
  }
  return c;
}

// Exit status (128 + signal when killed).
int wait_for(const Child& c) {
  int st = 0;
  REQUIRE(waitpid(c.pid, &st, 0) == c.pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int run(const std::string& name, std::vector<std::string> args, std::vector<std::string> env = {}) {
  return wait_for(start(name, std::move(args), std::move(env)));
}

// Polls `cond` every millisecond; false after 60 s or when the child has ended.
template <class F>
bool wait_until(const Child& c, F cond) {
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60)) {
    if (cond()) return true;
    int st = 0;
    if (waitpid(c.pid, &st, WNOHANG) == c.pid) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

std::string latest_of(const std::string& run) {
  try {
    return fs::path(sw::read_latest((work() / run / "checkpoints").string())).filename().string();
  } catch (...) {
    return "";
  }
}

std::vector<double> losses(const std::string& run) {
  std::ifstream f(work() / run / "metrics.jsonl");
  std::vector<double> out;
  for (std::string l; std::getline(f, l);)
    out.push_back(nlohmann::json::parse(l)["loss"].get<double>());
  return out;
}

// The uninterrupted run everything is compared with.
const std::string& reference_weights() {
  static const std::string w = [] {
    const int rc = run("ref", {});
    INFO(read_bytes(work() / "ref.log"));
    REQUIRE(rc == 0);
    return read_bytes(work() / "ref" / "hf" / "model.safetensors");
  }();
  return w;
}

void check_resumes_exactly(const std::string& name, const std::string& from_step) {
  const int rc = run(name, {"--resume", "auto"});
  const std::string log = read_bytes(work() / (name + ".log"));
  INFO(log);
  REQUIRE(rc == 0);
  CHECK_THAT(log, Contains("resumed from " + (work() / name / "checkpoints" / from_step).string()));
  CHECK(read_bytes(work() / name / "hf" / "model.safetensors") == reference_weights());
  CHECK(losses(name) == losses("ref"));  // every step's loss, the killed run's lines kept
}

}  // namespace

TEST_CASE("ckpt kill: SIGKILL during training, then --resume auto gives the same weights") {
  reference_weights();
  // Saves take >= 400 ms here: a kill right after `latest` names step_20 lands in the steps
  // after it or in the save of step_30.
  Child c = start("killtrain", {}, {"SHARDWISE_CKPT_TEST_DELAY_MS=200"});
  REQUIRE(wait_until(c, [] { return latest_of("killtrain") == "step_20"; }));
  kill(c.pid, SIGKILL);
  CHECK(wait_for(c) == 128 + SIGKILL);
  CHECK(latest_of("killtrain") == "step_20");
  check_resumes_exactly("killtrain", "step_20");
}

TEST_CASE("ckpt kill: a two-file corpus: the resumed steps cross a file and an epoch boundary") {
  // data.train is a directory of two token files: 24 + 31 = 55 windows of 17 tokens (engine/
  // data.h), an epoch every 13.75 steps of 4 rows, so steps 21..40 (after the kill) draw from
  // both files, in shuffled order, through epochs 1 and 2.
  const fs::path dir = work() / "corpus2";
  fs::create_directories(dir);
  for (int f = 0; f < 2; ++f) {
    std::vector<uint16_t> t(f == 0 ? 400 : 500);
    for (size_t i = 0; i < t.size(); ++i)
      t[i] = static_cast<uint16_t>(sw::rng_bits(11 + f, 0, i) % 32);
    sw::write_token_file((dir / ("part-00" + std::to_string(f) + ".bin")).string(), t);
  }
  const std::vector<std::string> set = {"--set", "data.train=" + dir.string()};
  const int rc_ref = run("ref2", set);
  INFO(read_bytes(work() / "ref2.log"));
  REQUIRE(rc_ref == 0);
  Child c = start("kill2", set, {"SHARDWISE_CKPT_TEST_DELAY_MS=200"});
  REQUIRE(wait_until(c, [] { return latest_of("kill2") == "step_20"; }));
  kill(c.pid, SIGKILL);
  CHECK(wait_for(c) == 128 + SIGKILL);
  std::vector<std::string> args = set;
  args.insert(args.end(), {"--resume", "auto"});
  const int rc = run("kill2", args);
  INFO(read_bytes(work() / "kill2.log"));
  REQUIRE(rc == 0);
  CHECK_THAT(read_bytes(work() / "kill2.log"),
             Contains("resumed from " + (work() / "kill2" / "checkpoints" / "step_20").string()));
  CHECK(read_bytes(work() / "kill2" / "hf" / "model.safetensors") ==
        read_bytes(work() / "ref2" / "hf" / "model.safetensors"));
  CHECK(losses("kill2") == losses("ref2"));
  CHECK(losses("ref2") != losses("ref"));  // another corpus indeed
  // What the resumed steps drew (seed 5, global batch 4): rows of both files, two epochs.
  const sw::Corpus corpus(dir.string(), 32, 16);
  REQUIRE(corpus.windows() == 55);
  std::set<int> files;
  std::set<int64_t> epochs;
  for (int64_t g = 20 * 4; g < 40 * 4; ++g) {
    files.insert(corpus.window(corpus.train_window(5, g)).file);
    epochs.insert(corpus.epoch_of(g));
  }
  CHECK(files.size() == 2);
  CHECK(epochs == std::set<int64_t>{1, 2});
  // metrics.jsonl names each step's epoch (of its first row).
  std::ifstream mf(work() / "kill2" / "metrics.jsonl");
  std::vector<int64_t> ep;
  for (std::string l; std::getline(mf, l);) ep.push_back(nlohmann::json::parse(l)["epoch"].get<int64_t>());
  REQUIRE(ep.size() == 40);
  for (int s = 0; s < 40; ++s) CHECK(ep[s] == s * 4 / 55);
}

TEST_CASE("ckpt kill: SIGKILL with the optimizer state on NVMe, then resume: the same weights") {
  reference_weights();  // without offload: offload changes no number
  const std::vector<std::string> nvme = {
      "--set", "zero_optimization.offload_optimizer.device=nvme", "--set",
      "zero_optimization.offload_optimizer.nvme_path=" + (work() / "nvme").string()};
  Child c = start("killnvme", nvme, {"SHARDWISE_CKPT_TEST_DELAY_MS=200"});
  REQUIRE(wait_until(c, [] { return latest_of("killnvme") == "step_20"; }));
  kill(c.pid, SIGKILL);
  CHECK(wait_for(c) == 128 + SIGKILL);
  CHECK(fs::exists(work() / "nvme" / "rank_0" / "optimizer.bin"));  // left by the kill
  std::vector<std::string> args = nvme;
  args.insert(args.end(), {"--resume", "auto"});
  const int rc = run("killnvme", args);
  INFO(read_bytes(work() / "killnvme.log"));
  REQUIRE(rc == 0);
  CHECK(read_bytes(work() / "killnvme" / "hf" / "model.safetensors") == reference_weights());
  CHECK(losses("killnvme") == losses("ref"));
  CHECK(!fs::exists(work() / "nvme" / "rank_0"));  // removed at the clean exit
}

// Everything on NVMe: parameters and gradients, optimizer state and activations (one rank:
// the sharded path with a group of one, bit-identical to the whole-unit run at one micro-step).
TEST_CASE("ckpt kill: SIGKILL with parameters, optimizer and activations on NVMe, then resume") {
  reference_weights();
  const std::string dir = (work() / "nvme_all").string();
  const std::vector<std::string> nvme = {
      "--set", "zero_optimization.offload_param.device=nvme",
      "--set", "zero_optimization.offload_param.nvme_path=" + dir,
      "--set", "zero_optimization.offload_optimizer.device=nvme",
      "--set", "zero_optimization.offload_optimizer.nvme_path=" + dir,
      "--set", "activation_checkpointing.offload=nvme"};
  Child c = start("killnvme_all", nvme, {"SHARDWISE_CKPT_TEST_DELAY_MS=200"});
  REQUIRE(wait_until(c, [] { return latest_of("killnvme_all") == "step_20"; }));
  kill(c.pid, SIGKILL);
  CHECK(wait_for(c) == 128 + SIGKILL);
  for (const char* f : {"params.bin", "optimizer.bin", "activations.bin"})
    CHECK(fs::exists(fs::path(dir) / "rank_0" / f));  // left by the kill
  // Resumed with async saves asked for: the state is on NVMe, so they are synchronous,
  // streamed from the files (no snapshot copy of it in memory), and said so.
  std::vector<std::string> args = nvme;
  args.insert(args.end(), {"--resume", "auto", "--set", "checkpoint.async=true"});
  const int rc = run("killnvme_all", args);
  INFO(read_bytes(work() / "killnvme_all.log"));
  REQUIRE(rc == 0);
  CHECK_THAT(read_bytes(work() / "killnvme_all.log"),
             Contains("saves are synchronous, streamed from its files"));
  CHECK(read_bytes(work() / "killnvme_all" / "hf" / "model.safetensors") == reference_weights());
  CHECK(losses("killnvme_all") == losses("ref"));
  CHECK(!fs::exists(fs::path(dir) / "rank_0"));  // removed at the clean exit
}

// An I/O error in the middle of step 11 (SHARDWISE_IO_FAIL_AFTER=70[:errno]: 6 io operations
// per step + 6 per save, per rank) with the optimizer state on NVMe, on `ranks` ranks: every
// rank stops with one line naming its file, the offset and the errno text, the run ends
// non-zero without hanging, and the checkpoint saved before (step_10) verifies.
void check_io_error(const std::string& name, int ranks, const std::string& fail_after,
                    const std::string& errno_text, const std::string& backend) {
  const std::string nv = (work() / (name + "_nvme")).string();
  const auto t0 = std::chrono::steady_clock::now();
  Child c = start(name,
                  {"--set", "zero_optimization.offload_optimizer.device=nvme", "--set",
                   "zero_optimization.offload_optimizer.nvme_path=" + nv, "--set",
                   "aio.backend=" + backend},
                  {"SHARDWISE_IO_FAIL_AFTER=" + fail_after, "OMPI_MCA_mpi_yield_when_idle=1",
                   "SHARDWISE_COMM_TIMEOUT_S=20"},
                  false, ranks);
  // A hang is a failure, not a ctest timeout: give it 90 s (it takes about a second).
  int st = 0;
  while (waitpid(c.pid, &st, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(90)) {
      kill(c.pid, SIGKILL);
      waitpid(c.pid, &st, 0);
      FAIL("the run hung after the I/O error:\n" << read_bytes(c.log));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string log = read_bytes(c.log);
  INFO(log << "(ended after " << secs << " s)");
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) != 0);
  if (ranks == 1) CHECK(WEXITSTATUS(st) == 1);
  // Every rank fails at the same operation and prints its line; the first to finish printing
  // calls MPI_Abort (the CLI's multi-rank error path), which may kill another rank before its
  // own line is out: at least one line, each well-formed and printed once.
  int lines = 0;
  for (int r = 0; r < ranks; ++r) {
    const std::string file = nv + "/rank_" + std::to_string(r) + "/optimizer.bin";
    const std::string who = ranks > 1 ? "rank " + std::to_string(r) + ": " : "";
    const std::string prefix = "shardwise: error: " + who + "io: " + file + ": ";
    const size_t at = log.find(prefix);
    if (at == std::string::npos) continue;
    ++lines;
    const std::string line = log.substr(at, log.find('\n', at) - at);
    CHECK_THAT(line, Contains(" bytes at offset "));
    CHECK_THAT(line, Contains(": " + errno_text));
    CHECK(log.find(prefix, at + 1) == std::string::npos);  // one line per rank
  }
  CHECK(lines >= 1);
  if (ranks == 1) CHECK(lines == 1);
  CHECK(latest_of(name) == "step_10");  // the checkpoint saved before it is intact
  CHECK_NOTHROW(sw::verify_checkpoint((work() / name / "checkpoints" / "step_10").string()));
}

TEST_CASE("ckpt kill: an I/O error on the NVMe optimizer file: one line naming file, offset, errno") {
  check_io_error("ioerr", 1, "70", "Input/output error", "auto");
  check_io_error("ioerr_threads", 1, "70:28", "No space left on device", "threads");
}

// Label mpi (ctest's engine_mpi_io_enospc runs this hidden case): ENOSPC mid-step at 2 ranks.
TEST_CASE("ckpt kill: ENOSPC on the NVMe optimizer file at 2 ranks: every rank stops, no hang",
          "[.mpi]") {
  check_io_error("enospc2", 2, "70:28", "No space left on device", "auto");
}

TEST_CASE("ckpt kill: SIGKILL in the middle of a save keeps the previous checkpoint") {
  reference_weights();
  for (const bool async : {false, true}) {
    const std::string name = async ? "killsave_async" : "killsave_sync";
    fs::remove_all(work() / name);
    Child c = start(name, {"--set", std::string("checkpoint.async=") + (async ? "true" : "false")},
                    {"SHARDWISE_CKPT_TEST_DELAY_MS=300"});
    const fs::path tmp_file = work() / name / "checkpoints" / ".step_30.tmp" / "rank_0.safetensors";
    // The shard file is written; the commit (metadata.json, rename, latest) has not happened.
    REQUIRE(wait_until(c, [&] { return fs::exists(tmp_file); }));
    kill(c.pid, SIGKILL);
    CHECK(wait_for(c) == 128 + SIGKILL);
    const fs::path ck = work() / name / "checkpoints";
    CHECK(latest_of(name) == "step_20");
    CHECK(!fs::exists(ck / "step_30"));
    CHECK(fs::exists(ck / ".step_30.tmp"));
    CHECK_NOTHROW(sw::verify_checkpoint((ck / "step_20").string()));
    check_resumes_exactly(name, "step_20");
    CHECK(!fs::exists(ck / ".step_30.tmp"));  // removed when the resumed run started
  }
}

TEST_CASE("ckpt kill: a full disk during a save: one clear line, previous checkpoint intact") {
  reference_weights();
  const fs::path ref_step = work() / "ref" / "checkpoints" / "step_40";
  uintmax_t step_bytes = 0;
  for (const auto& e : fs::recursive_directory_iterator(ref_step))
    if (e.is_regular_file()) step_bytes += e.file_size();
  REQUIRE(step_bytes > 64 * 1024);
  const fs::path ck = work() / "full_ck";
  fs::create_directories(ck);
  // Room for one checkpoint and a half: step_10 fits, step_20 does not (keep_last prunes only
  // after a commit). Preferred mechanism: a real ENOSPC from a small tmpfs; without the
  // capability to mount, RLIMIT_FSIZE (EFBIG) set on the child once step_10 is committed.
  const uintmax_t size = (step_bytes * 3 / 2 + 8191) / 4096 * 4096;
  // (SHARDWISE_TEST_NO_TMPFS=1 forces the fallback, to test it.)
  const bool tmpfs =
      !sw::env_flag("SHARDWISE_TEST_NO_TMPFS") &&
      mount("tmpfs", ck.c_str(), "tmpfs", 0, ("size=" + std::to_string(size)).c_str()) == 0;
  struct Unmount {
    bool on;
    fs::path p;
    ~Unmount() {
      if (on) umount(p.c_str());
    }
  } unmount{tmpfs, ck};
  WARN("disk-full mechanism: " << (tmpfs ? "tmpfs of " + std::to_string(size) + " bytes (ENOSPC)"
                                         : std::string("RLIMIT_FSIZE (EFBIG)")));
  const std::vector<std::string> args = {"--set", "checkpoint.dir=" + ck.string()};
  Child c = start("full", args,
                  {"SHARDWISE_CKPT_TEST_DELAY_MS=" + std::string(tmpfs ? "0" : "300")}, !tmpfs);
  if (!tmpfs) {
    REQUIRE(wait_until(c, [&] {
      return fs::exists(ck / "step_10" / "metadata.json") && fs::exists(ck / "latest");
    }));
    const rlimit lim{64 * 1024, 64 * 1024};  // below a shard file, above metrics.jsonl
    REQUIRE(prlimit(c.pid, RLIMIT_FSIZE, &lim, nullptr) == 0);
  }
  const int rc = wait_for(c);
  const std::string log = read_bytes(work() / "full.log");
  INFO(log);
  // Periodic saves that fail are warnings; the final one is an error.
  CHECK(rc == 1);
  const char* why = tmpfs ? "No space left on device" : "File too large";
  for (const char* step : {"step_20", "step_30"}) {
    const std::string w = std::string("shardwise: warning: checkpoint ") + step + " not saved: ";
    REQUIRE_THAT(log, Contains(w));
    const std::string line = log.substr(log.find(w), log.find('\n', log.find(w)) - log.find(w));
    CHECK_THAT(line, Contains(why));
    CHECK_THAT(line, Contains("the previous checkpoints and 'latest' are unchanged"));
  }
  CHECK_THAT(log, Contains("shardwise: error: train: the final checkpoint step_40 was not saved"));
  CHECK(fs::path(sw::read_latest(ck.string())).filename() == "step_10");
  CHECK_NOTHROW(sw::verify_checkpoint((ck / "step_10").string()));
  for (const auto& e : fs::directory_iterator(ck))  // no temporary directory left behind
    CHECK(e.path().filename().string().rfind(".step_", 0) != 0);
  // metrics.jsonl records the failures and training went on to the end.
  std::ifstream mf(work() / "full" / "metrics.jsonl");
  std::vector<int64_t> failed;
  int lines = 0;
  for (std::string l; std::getline(mf, l); ++lines) {
    const auto j = nlohmann::json::parse(l);
    if (j.contains("ckpt_failed")) failed.push_back(j["ckpt_failed"].get<int64_t>());
  }
  CHECK(lines == 40);
  CHECK(failed == std::vector<int64_t>{20, 30});
  // The checkpoint that survived resumes exactly (into a directory with room).
  const int rc2 = run("full", {"--resume", (ck / "step_10").string(), "--set",
                               "checkpoint.dir=" + (work() / "full_ck2").string()});
  INFO(read_bytes(work() / "full.log"));
  CHECK(rc2 == 0);
  CHECK(read_bytes(work() / "full" / "hf" / "model.safetensors") == reference_weights());
}

TEST_CASE("ckpt kill: a bad --resume path is one clear error") {
  const std::string bad = (work() / "no_such_ckpt").string();
  const int rc = run("badresume", {"--resume", bad});
  const std::string log = read_bytes(work() / "badresume.log");
  CHECK(rc == 1);
  CHECK(log == "shardwise: error: resume: " + bad +
                   ": no such checkpoint (expected a step directory such as <dir>/step_100, a "
                   "checkpoint directory holding 'latest', or 'auto')\n");
}
