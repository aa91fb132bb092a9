// Runs the built `shardwise` binary as a user would and checks exit codes, messages and the
// files it writes. The .bin format is checked byte by byte against the llm.c layout, read
// here independently of engine/data.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/common/cli_run.h"

namespace fs = std::filesystem;

namespace {

using clitest::lines;
using clitest::q;
using clitest::Result;
using clitest::slurp;
using clitest::spit;
Result sw_run(const fs::path& dir, const std::vector<std::string>& args) {
  return clitest::sw_run(dir, args, 2);
}

// A fresh scratch directory per test case.
fs::path scratch(const std::string& name) {
  fs::path d = fs::path(SW_BINARY_DIR) / "tests" / "tools_tmp" / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

bool has(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

// The command path a usage mistake names: "shardwise", then the (sub)command in args.
std::string command_of(const std::vector<std::string>& args) {
  static const std::vector<std::string> top = {"train", "profile", "plan", "plan-dump",
                                               "data",  "sample",  "ckpt"};
  std::string path = "shardwise";
  if (args.empty() || std::find(top.begin(), top.end(), args[0]) == top.end()) return path;
  path += " " + args[0];
  if (args.size() > 1 && ((args[0] == "data" && args[1] == "prepare") ||
                          (args[0] == "ckpt" && (args[1] == "export" || args[1] == "inspect" ||
                                                 args[1] == "verify"))))
    path += " " + args[1];
  return path;
}

// A usage mistake: exit 2, "shardwise <cmd>: <problem>" then "Try 'shardwise <cmd> --help'.",
// nothing else, nothing on stdout.
void check_usage_error(const Result& r, const std::string& cmd, const std::string& needle) {
  INFO("stderr: " << r.err);
  CHECK(r.rc == 2);
  CHECK(r.out.empty());
  const auto ls = lines(r.err);
  REQUIRE(ls.size() == 2);
  CHECK(ls[0].rfind(cmd + ": ", 0) == 0);
  CHECK(has(ls[0], needle));
  CHECK(ls[1] == "Try '" + cmd + " --help'.");
}

void check_usage(const fs::path& d, const std::vector<std::string>& args,
                 const std::string& needle) {
  std::ostringstream shown;
  for (const auto& x : args) shown << ' ' << q(x);
  INFO("args:" << shown.str());
  check_usage_error(sw_run(d, args), command_of(args), needle);
}

// A user error: exit 1 and exactly one line "shardwise: error: ..." naming the problem.
void check_error(const Result& r, const std::vector<std::string>& needles) {
  INFO("stderr: " << r.err);
  CHECK(r.rc == 1);
  const auto ls = lines(r.err);
  REQUIRE(ls.size() == 1);
  CHECK(ls[0].rfind("shardwise: error: ", 0) == 0);
  for (const auto& n : needles) CHECK(has(ls[0], n));
}

// llm.c token file: 256 int32 header (magic 20240520, version 1, count), then uint16 tokens.
std::vector<uint16_t> read_bin(const fs::path& p) {
  const std::string s = slurp(p);
  REQUIRE(s.size() >= 1024);
  int32_t h[256];
  std::memcpy(h, s.data(), 1024);
  CHECK(h[0] == 20240520);
  CHECK(h[1] == 1);
  for (int i = 3; i < 256; i++) CHECK(h[i] == 0);
  REQUIRE(h[2] >= 0);
  REQUIRE(s.size() == 1024 + 2 * static_cast<size_t>(h[2]));
  std::vector<uint16_t> t(static_cast<size_t>(h[2]));
  std::memcpy(t.data(), s.data() + 1024, t.size() * 2);
  return t;
}

std::vector<uint16_t> bytes_of(const std::string& s) {
  std::vector<uint16_t> v;
  for (unsigned char c : s) v.push_back(c);
  return v;
}

// Deterministic English-ish text of about n bytes.
std::string make_text(size_t n) {
  static const char* words[] = {"the", "quick", "brown", "fox", "jumps", "over", "a", "lazy",
                                "dog", "and", "runs", "away", "into", "woods", "at", "night"};
  std::string s;
  uint64_t x = 12345;
  while (s.size() < n) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    s += words[(x >> 33) % 16];
    s += ((x >> 20) % 9 == 0) ? ".\n" : " ";
  }
  return s;
}

std::string tiny_config(const fs::path& dir, const std::string& extra = "") {
  return R"({
  "model": {"type": "gpt2", "vocab_size": 256, "n_layer": 1, "n_head": 2, "d_model": 32,
            "seq_len": 32},
  "data": {"train": ")" + (dir / "train.bin").string() + R"(", "val": ")" +
         (dir / "val.bin").string() + R"("},
  "train_micro_batch_size_per_gpu": 4,
  "train_steps": 6,
  "eval_every_steps": 3,
  "eval_batches": 2,
  "seed": 7,
  "threads": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.003}},
  "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 2}},
  "run_dir": ")" + (dir / "run").string() + R"(")" + extra + R"(
})";
}

}  // namespace

TEST_CASE("cli: --help and --version work for the program and every subcommand") {
  const fs::path d = scratch("help");
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--help"}, {"-h"}, {"help"}, {"train", "--help"}, {"data", "--help"},
           {"data", "prepare", "--help"}, {"sample", "-h"}, {"help", "sample"}}) {
    const Result r = sw_run(d, args);
    INFO("args[0..]: " << args[0] << (args.size() > 1 ? " " + args[1] : ""));
    CHECK(r.rc == 0);
    CHECK(has(r.out, "Usage: shardwise"));
    CHECK(r.err.empty());
  }
  CHECK(has(sw_run(d, {"train", "--help"}).out, "--set"));
  CHECK(has(sw_run(d, {"data", "prepare", "-h"}).out, "--val-fraction"));
  CHECK(has(sw_run(d, {"sample", "--help"}).out, "--temperature"));
  const Result v = sw_run(d, {"--version"});
  CHECK(v.rc == 0);
  CHECK(v.out.rfind("shardwise ", 0) == 0);
}

TEST_CASE("cli: usage mistakes exit 2 with one line naming the problem") {
  const fs::path d = scratch("usage");
  spit(d / "cfg.json", "{}");
  check_usage(d, {}, "missing command");
  check_usage(d, {"frobnicate"}, "unknown command 'frobnicate'");
  check_usage_error(sw_run(d, {"help", "frobnicate"}), "shardwise help",
                    "no command 'frobnicate' (expected train, profile");
  check_usage_error(sw_run(d, {"help", "data", "shuffle"}), "shardwise help",
                    "no data subcommand 'shuffle' (expected prepare)");
  check_usage(d, {"--frob"}, "unknown option '--frob'");
  check_usage(d, {"train"}, "missing CONFIG");
  check_usage(d, {"train", "cfg.json", "--bogus"}, "unknown option '--bogus'");
  check_usage(d, {"train", "cfg.json", "--set"}, "--set needs a value");
  check_usage(d, {"train", "cfg.json", "--set", "novalue"}, "KEY=VALUE");
  check_usage(d, {"train", "a.json", "b.json"}, "unexpected argument 'b.json'");
  check_usage(d, {"data"}, "missing data subcommand");
  check_usage(d, {"data", "shuffle"}, "unknown data subcommand 'shuffle'");
  check_usage(d, {"data", "prepare", "x.txt"}, "missing --out");
  check_usage(d, {"data", "prepare", "--out", "x.bin"}, "missing TEXT");
  check_usage(d, {"data", "prepare", "x.txt", "--out", "a.bin", "--val-fraction",
                               "1.5", "--val", "b.bin"},
                    "--val-fraction");
  check_usage(d, {"data", "prepare", "x.txt", "--out", "a.bin", "--val-fraction",
                               "0.1"},
                    "--val-fraction requires --val");
  check_usage(d, {"sample", "--weights", "w.safetensors"}, "missing --config");
  check_usage(d, {"sample", "--config", "cfg.json", "--tokens", "abc"},
                    "--tokens: expects an integer, got 'abc'");
  check_usage(d, {"sample", "--config", "cfg.json", "--tokens", "12x"},
                    "--tokens: expects an integer, got '12x'");
  check_usage(d, {"sample", "--config", "cfg.json", "--temperature", "hot"},
                    "--temperature: expects a number");
  check_usage(d, {"sample", "--config", "cfg.json", "--temperature", "-1"},
                    "--temperature: must be >= 0");
  check_usage(d, {"sample", "--config", "cfg.json", "--seed", "-3"}, "--seed");
  check_usage(d, {"sample", "--config"}, "--config needs a value");
}

// Every command and subcommand, the same way: --help (and -h, and `help <cmd>`) prints its
// usage line and every option and exits 0; an unknown option, and a missing required argument,
// exit 2 with one line naming it and the subcommand, then the --help hint.
TEST_CASE("cli: every subcommand has --help, names an unknown option and a missing argument") {
  const fs::path d = scratch("subcommands");
  struct Cmd {
    std::vector<std::string> path;     // {"data", "prepare"}; {} = the program
    std::vector<std::string> mention;  // what its --help lists
    std::vector<std::string> given;    // arguments that satisfy every required one
    std::vector<std::string> lacking;  // arguments that leave one out ...
    std::string missing;               // ... and how the error names it
  };
  const std::vector<Cmd> cmds = {
      {{},
       {"--help", "--version", "train", "profile", "plan", "plan-dump", "data", "sample", "ckpt",
        "help", "Exit codes"},
       {},
       {},
       "missing command"},
      {{"train"},
       {"CONFIG.json", "--set", "--quiet", "--no-export", "--resume", "--init-from", "KEY=VALUE",
        "DIR|auto"},
       {"cfg.json"},
       {"--quiet"},
       "missing CONFIG.json"},
      {{"profile"},
       {"CONFIG.json", "--steps", "--out", "--set", "--quiet", "--plan", "trace_rank<r>.json"},
       {"cfg.json"},
       {"--steps", "4"},
       "missing CONFIG.json"},
      {{"plan"},
       {"CONFIG.json", "--world-size", "--json", "--set", "--hardware", "--calibrate",
        "--out-hardware", "--memory-budget", "--host-budget", "--nvme-budget", "--nvme-path",
        "--out", "--timeline"},
       {"cfg.json"},
       {"--json"},
       "missing CONFIG.json"},
      {{"plan-dump"},
       {"CONFIG.json", "--world-size", "--eval", "--set"},
       {"cfg.json"},
       {"--eval"},
       "missing CONFIG.json"},
      {{"data"}, {"prepare"}, {}, {}, "missing data subcommand (expected prepare)"},
      {{"data", "prepare"},
       {"TEXT", "--out", "--val", "--val-fraction"},
       {"x.txt", "--out", "x.bin"},
       {"x.txt"},
       "missing --out FILE.bin"},
      {{"sample"},
       {"--config", "--weights", "--prompt", "--tokens", "--temperature", "--top-k", "--seed",
        "--set"},
       {"--config", "cfg.json"},
       {"--tokens", "5"},
       "missing --config"},
      {{"ckpt"},
       {"export", "inspect", "verify"},
       {},
       {},
       "missing ckpt subcommand (expected export, inspect or verify)"},
      {{"ckpt", "export"},
       {"DIR", "--out"},
       {"d", "--out", "m.safetensors"},
       {"d"},
       "missing --out OUT"},
      {{"ckpt", "inspect"}, {"DIR"}, {"d"}, {}, "missing DIR"},
      {{"ckpt", "verify"}, {"DIR"}, {"d"}, {}, "missing DIR"},
  };
  for (const Cmd& c : cmds) {
    std::string name = "shardwise";
    for (const auto& p : c.path) name += " " + p;
    INFO("command: " << name);
    auto with = [&](std::vector<std::string> extra) {
      std::vector<std::string> a = c.path;
      a.insert(a.end(), extra.begin(), extra.end());
      return a;
    };
    const Result h = sw_run(d, with({"--help"}));
    CHECK(h.rc == 0);
    CHECK(h.err.empty());
    CHECK(h.out.rfind("Usage: " + name + " ", 0) == 0);
    for (const auto& m : c.mention) {
      INFO("--help mentions " << m);
      CHECK(has(h.out, m));
    }
    CHECK(sw_run(d, with({"-h"})).out == h.out);
    std::vector<std::string> help_cmd = {"help"};
    help_cmd.insert(help_cmd.end(), c.path.begin(), c.path.end());
    CHECK(sw_run(d, help_cmd).out == h.out);
    // --help wins over whatever else is on the line (nothing runs).
    CHECK(sw_run(d, with({"--no-such-option", "--help"})).rc == 0);

    std::vector<std::string> unknown = c.given;
    unknown.push_back("--no-such-option");
    check_usage_error(sw_run(d, with(unknown)), name, "unknown option '--no-such-option'");
    check_usage_error(sw_run(d, with(c.lacking)), name, c.missing);
  }
}

// Under mpirun every rank parses the same line: rank 0 alone prints help and usage mistakes,
// every rank exits with the same code (the launcher's rank comes from the environment).
TEST_CASE("cli: a rank other than 0 prints no help or usage mistake, with the same exit code") {
  const fs::path d = scratch("rank1");
  setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  const Result h = sw_run(d, {"train", "--help"});
  const Result u = sw_run(d, {"train", "cfg.json", "--bogus"});
  const Result p = sw_run(d, {"plan", "--calibrate", "--world-size", "many"});
  const Result v = sw_run(d, {"--version"});
  unsetenv("OMPI_COMM_WORLD_RANK");
  unsetenv("OMPI_COMM_WORLD_SIZE");
  CHECK(h.rc == 0);
  CHECK(h.out.empty());
  CHECK(u.rc == 2);
  CHECK(u.err.empty());
  CHECK(p.rc == 2);
  CHECK(p.err.empty());
  CHECK(v.rc == 0);
  CHECK(v.out.empty());
  // Rank 0 of the same launch prints them.
  CHECK(has(sw_run(d, {"train", "--help"}).out, "Usage: shardwise train"));
  check_usage_error(sw_run(d, {"train", "cfg.json", "--bogus"}), "shardwise train",
                    "unknown option '--bogus'");
}

TEST_CASE("cli: data prepare writes llm.c .bin files byte for byte") {
  const fs::path d = scratch("prepare");
  const std::string a = "Hello, world!\n%\nA second \xc3\xa9 fortune.\n";
  std::string b;
  for (int i = 0; i < 256; i++) b.push_back(static_cast<char>(i));  // every byte value
  spit(d / "a.txt", a);
  spit(d / "b.txt", b);

  SECTION("no split: the concatenation, in order") {
    const Result r = sw_run(d, {"data", "prepare", "a.txt", "b.txt", "--out", "sub/all.bin"});
    INFO(r.err);
    REQUIRE(r.rc == 0);
    CHECK(has(r.out, std::to_string(a.size() + b.size()) + " tokens"));
    CHECK(read_bin(d / "sub" / "all.bin") == bytes_of(a + b));
  }
  SECTION("split: evenly spread blocks, train + val = the input, as documented") {
    const std::string text = make_text(50000);
    spit(d / "big.txt", text);
    const Result r = sw_run(d, {"data", "prepare", "big.txt", "--out", "t.bin", "--val",
                                "v.bin", "--val-fraction", "0.2"});
    INFO(r.err);
    REQUIRE(r.rc == 0);
    const auto t = read_bin(d / "t.bin"), v = read_bin(d / "v.bin");
    // The documented rule: blocks of min(4096, max(1, N/100)) bytes; block i is validation
    // when floor((i+1)F) > floor(iF).
    const size_t block = std::min<size_t>(4096, text.size() / 100);
    std::string et, ev;
    for (size_t i = 0; i * block < text.size(); i++) {
      const bool val = std::floor((i + 1) * 0.2) > std::floor(i * 0.2);
      (val ? ev : et) += text.substr(i * block, block);
    }
    CHECK(t == bytes_of(et));
    CHECK(v == bytes_of(ev));
    CHECK(t.size() + v.size() == text.size());
    CHECK(std::abs(static_cast<double>(v.size()) / text.size() - 0.2) < 0.01);
    CHECK(has(r.out, std::to_string(t.size()) + " tokens"));
    CHECK(has(r.out, std::to_string(v.size()) + " tokens"));
    // Deterministic: a second run writes the same files.
    const std::string t1 = slurp(d / "t.bin");
    REQUIRE(sw_run(d, {"data", "prepare", "big.txt", "--out", "t.bin", "--val", "v.bin",
                       "--val-fraction", "0.2"})
                .rc == 0);
    CHECK(slurp(d / "t.bin") == t1);
  }
  SECTION("missing input, directory input, empty input, too small to split") {
    check_error(sw_run(d, {"data", "prepare", "a.txt", "nope.txt", "--out", "x.bin"}),
                {"nope.txt", "does not exist"});
    check_error(sw_run(d, {"data", "prepare", ".", "--out", "x.bin"}), {"directory"});
    spit(d / "empty.txt", "");
    check_error(sw_run(d, {"data", "prepare", "empty.txt", "--out", "x.bin"}), {"empty"});
    spit(d / "one.txt", "z");
    check_error(sw_run(d, {"data", "prepare", "one.txt", "--out", "x.bin", "--val", "y.bin"}),
                {"too small"});
    CHECK(!fs::exists(d / "x.bin"));
  }
}

TEST_CASE("cli: train and sample report user errors as one line, exit 1") {
  const fs::path d = scratch("errors");
  spit(d / "text.txt", make_text(20000));
  REQUIRE(sw_run(d, {"data", "prepare", "text.txt", "--out", "train.bin", "--val", "val.bin"})
              .rc == 0);
  spit(d / "good.json", tiny_config(d));

  check_error(sw_run(d, {"train", "missing.json"}), {"missing.json"});
  spit(d / "typo.json", tiny_config(d, R"(, "optimiser": {})"));
  check_error(sw_run(d, {"train", "typo.json"}), {"optimiser", "optimizer"});
  check_error(sw_run(d, {"train", "good.json", "--set", "optimizer.params.lrr=0.1"}),
              {"lrr", "lr"});
  check_error(sw_run(d, {"train", "good.json", "--set",
                         "data.train=" + (d / "nodata.bin").string()}),
              {"nodata.bin"});
  spit(d / "broken.json", "{\"model\": ");
  check_error(sw_run(d, {"train", "broken.json"}), {"broken.json"});
  check_error(sw_run(d, {"sample", "--config", "good.json", "--weights", "nope.safetensors"}),
              {"nope.safetensors"});
  check_error(sw_run(d, {"sample", "--config", "good.json"}), {"hf' not found"});
  spit(d / "garbage.safetensors", "this is not a safetensors file");
  check_error(sw_run(d, {"sample", "--config", "good.json", "--weights", "garbage.safetensors"}),
              {"garbage.safetensors"});
}

TEST_CASE("cli: tiny train end to end, then deterministic greedy sampling") {
  const fs::path d = scratch("e2e");
  spit(d / "text.txt", make_text(20000));
  REQUIRE(sw_run(d, {"data", "prepare", "text.txt", "--out", "train.bin", "--val", "val.bin"})
              .rc == 0);
  spit(d / "cfg.json", tiny_config(d));

  const Result tr = sw_run(d, {"train", "cfg.json", "--quiet", "--set", "train_steps=6"});
  INFO("train stdout: " << tr.out << "\nstderr: " << tr.err);
  REQUIRE(tr.rc == 0);
  CHECK(has(tr.out, "trained 6 steps"));
  CHECK(has(tr.out, "val loss"));
  CHECK(has(tr.out, "unigram entropy"));
  CHECK(has(tr.out, (fs::path("run") / "hf").string()));
  const fs::path metrics = d / "run" / "metrics.jsonl";
  REQUIRE(fs::exists(metrics));
  CHECK(lines(slurp(metrics)).size() >= 6);
  REQUIRE(fs::exists(d / "run" / "hf" / "model.safetensors"));
  REQUIRE(fs::exists(d / "run" / "hf" / "config.json"));

  const std::string prompt = "the quick ";
  const int N = 40;
  auto sample = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"sample", "--config", "cfg.json", "--weights",
                                     "run/hf/model.safetensors", "--prompt", prompt, "--tokens",
                                     std::to_string(N)};
    args.insert(args.end(), extra.begin(), extra.end());
    return sw_run(d, args);
  };
  const Result g1 = sample({"--temperature", "0"});
  const Result g2 = sample({"--temperature", "0", "--seed", "99"});  // greedy ignores the seed
  INFO("sample stderr: " << g1.err);
  REQUIRE(g1.rc == 0);
  REQUIRE(g2.rc == 0);
  CHECK(g1.out == g2.out);
  // prompt + N bytes + newline; the continuation may contain newlines, so count bytes.
  CHECK(g1.out.size() == prompt.size() + N + 1);
  CHECK(g1.out.rfind(prompt, 0) == 0);
  CHECK(g1.out.back() == '\n');

  const Result s1 = sample({"--temperature", "1", "--top-k", "5", "--seed", "3"});
  const Result s2 = sample({"--temperature", "1", "--top-k", "5", "--seed", "3"});
  REQUIRE(s1.rc == 0);
  CHECK(s1.out == s2.out);
  CHECK(s1.out.size() == prompt.size() + N + 1);

  // The default weights are <run_dir>/hf (the directory); an empty prompt works too.
  const Result e = sw_run(d, {"sample", "--config", "cfg.json", "--tokens", "5",
                              "--temperature", "0"});
  INFO("stderr: " << e.err);
  CHECK(e.rc == 0);
  CHECK(e.out.size() == 5 + 1);
}

TEST_CASE("cli: profile writes trace and memory chart and peaks and names a bad --steps or --out") {
  const fs::path d = scratch("profile");
  spit(d / "text.txt", make_text(20000));
  REQUIRE(sw_run(d, {"data", "prepare", "text.txt", "--out", "train.bin", "--val", "val.bin"})
              .rc == 0);
  spit(d / "cfg.json", tiny_config(d));

  CHECK(has(sw_run(d, {"profile", "--help"}).out, "trace_rank<r>.json"));
  check_usage(d, {"profile"}, "missing CONFIG");
  check_usage(d, {"profile", "cfg.json", "--steps", "many"},
                    "--steps: expects an integer, got 'many'");
  check_usage(d, {"profile", "cfg.json", "--steps", "1"},
                    "--steps: must be between 2 and 1000000, got 1");
  check_usage(d, {"profile", "cfg.json", "--steps"}, "--steps needs a value");
  check_usage(d, {"profile", "cfg.json", "--out", ""}, "--out: expects a value, got ''");
  check_usage(d, {"profile", "cfg.json", "--frob"}, "unknown option '--frob'");
  // An --out that cannot be a directory: one error line naming it, before any step.
  spit(d / "afile", "x");
  const Result bad = sw_run(d, {"profile", "cfg.json", "--quiet", "--out", "afile/sub"});
  check_error(bad, {"profile.out", "afile/sub"});
  CHECK(bad.out.empty());
  // A profile block whose steps are outside the run: the config error names the key.
  check_error(sw_run(d, {"train", "cfg.json", "--set", "profile.enabled=true", "--set",
                         "profile.start_step=7"}),
              {"profile.start_step", "train_steps (6)"});

  const Result r = sw_run(d, {"profile", "cfg.json", "--quiet", "--steps", "4", "--out", "prof"});
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.rc == 0);
  CHECK(has(r.out, "profiled steps 2-4 of 4"));
  CHECK(has(r.out, "rank 0: peak memory"));
  CHECK(has(r.out, "activations"));
  for (const char* f : {"trace_rank0.json", "memory_rank0.svg", "peaks_rank0.json"}) {
    CHECK(fs::file_size(d / "prof" / f) > 100);
    CHECK(has(r.out, (fs::path("prof") / f).string()));
  }
  CHECK(slurp(d / "prof" / "memory_rank0.svg").rfind("<svg", 0) == 0);
  CHECK(has(slurp(d / "prof" / "trace_rank0.json"), "\"thread_name\""));
  // The profiled steps' metrics go to the profile directory; no checkpoint, no weights, and
  // the configured run_dir is untouched.
  CHECK(lines(slurp(d / "prof" / "metrics.jsonl")).size() >= 4);
  CHECK(!fs::exists(d / "prof" / "hf"));
  CHECK(!fs::exists(d / "prof" / "checkpoints"));
  CHECK(!fs::exists(d / "run"));
  // Every scheduler type (the profile keeps a cosine schedule's length; the others have none:
  // a Constant schedule was refused a total_num_steps until 2026-11-28).
  for (const char* sched : {"Constant", "WarmupLR", "WarmupCosineLR"}) {
    const Result q = sw_run(d, {"profile", "cfg.json", "--quiet", "--steps", "2", "--out",
                                std::string("prof_") + sched, "--set",
                                std::string("scheduler={\"type\": \"") + sched + "\"}"});
    INFO(sched << ": " << q.err);
    CHECK(q.rc == 0);
  }
}

// `plan`: the replayed peak per tier and category, as text and JSON, with offload to NVMe:
// the files' bytes are 16 per parameter / N (master, gradients, m, v) plus padding; DeepSpeed's
// ZeRO-3 figure is its formula over the model's own parameter count.
TEST_CASE("cli: plan predicts each rank's peak per tier and category") {
  const fs::path d = scratch("plan");
  spit(d / "cfg.json", tiny_config(d));
  CHECK(has(sw_run(d, {"plan", "--help"}).out, "--json"));
  check_usage(d, {"plan"}, "missing CONFIG");
  check_usage(d, {"plan", "cfg.json", "--eval"}, "unknown option '--eval'");
  check_usage(d, {"plan", "cfg.json", "--world-size", "2x"}, "--world-size: expects an integer");
  check_usage(d, {"plan", "cfg.json", "--memory-budget", "lots"},
              "--memory-budget: cannot parse 'lots' as bytes");
  check_usage(d, {"plan", "cfg.json", "--memory-budget", "0"}, "more than 0 bytes");
  check_usage(d, {"plan", "cfg.json", "--out", "best.json"}, "--out requires --memory-budget");
  check_usage(d, {"plan", "cfg.json", "--host-budget", "1GiB"},
              "--host-budget requires --memory-budget");
  check_usage(d, {"plan", "--calibrate", "--memory-budget", "1GiB"}, "excludes");
  check_usage(d, {"plan", "cfg.json", "--hardware", ""}, "--hardware: expects a value");
  const Result t = sw_run(d, {"plan", "cfg.json", "--world-size", "2"});
  INFO(t.err);
  REQUIRE(t.rc == 0);
  CHECK(has(t.out, "device peak"));
  CHECK(has(t.out, "DeepSpeed's model-states estimate"));
  // What release_grads would save, said where it is off (and only there).
  CHECK(has(t.out, "with release_grads: device peak"));
  const Result tr = sw_run(d, {"plan", "cfg.json", "--world-size", "2", "--set", "release_grads=true"});
  REQUIRE(tr.rc == 0);
  CHECK(has(tr.out, "device peak"));
  CHECK(!has(tr.out, "with release_grads"));
  const Result j = sw_run(d, {"plan", "cfg.json", "--world-size", "2", "--json", "--set",
                              "zero_optimization.offload_param.device=nvme", "--set",
                              "zero_optimization.offload_param.nvme_path=/nonexistent", "--set",
                              "zero_optimization.offload_optimizer.device=nvme", "--set",
                              "zero_optimization.offload_optimizer.nvme_path=/nonexistent"});
  INFO(j.err);
  REQUIRE(j.rc == 0);
  const auto doc = nlohmann::json::parse(j.out);
  REQUIRE(doc["ranks"].size() == 2);
  const double params = doc["params"].get<double>();
  for (const auto& r : doc["ranks"]) {
    const auto& dev = r["tiers"]["device"];
    int64_t sum = 0;
    for (const auto& [k, v] : dev["categories"].items()) sum += v.get<int64_t>();
    CHECK(sum == dev["peak_bytes"].get<int64_t>());
    // The whole tracked peak: the plan's and the backend's declared kernel workspace.
    CHECK(dev["peak_bytes"].get<int64_t>() == dev["plan_peak_bytes"].get<int64_t>() +
                                                   dev["kernel_workspace_bytes"].get<int64_t>());
    CHECK(dev["kernel_workspace_bytes"].get<int64_t>() > 0);
    CHECK(dev["categories"]["kernel_workspace"] == dev["kernel_workspace_bytes"]);
    CHECK(dev["includes"].get<std::string>().find("kernel workspace") != std::string::npos);
    const double nvme = r["tiers"]["nvme"]["peak_bytes"].get<double>();
    CHECK(nvme >= 16 * params / 2);
    CHECK(nvme <= 16 * params / 2 * 1.1);
  }
  const Result z = sw_run(d, {"plan", "cfg.json", "--world-size", "2", "--json"});
  REQUIRE(z.rc == 0);
  const auto zd = nlohmann::json::parse(z.out);
  CHECK(zd["ranks"][0]["tiers"]["nvme"]["peak_bytes"] == 0);
  const int64_t P = zd["params"].get<int64_t>();
  const int64_t ds = zd["deepspeed_estimate"]["bytes"].get<int64_t>();
  CHECK(ds > 18 * P / 2);          // 18 bytes per parameter / N ...
  CHECK(ds <= 18 * P / 2 + 4 * P);  // ... plus 4 x the largest unit
}

TEST_CASE("cli: plan-dump prints the step plan N ranks execute, without the launcher") {
  const fs::path d = scratch("plan_dump");
  spit(d / "cfg.json", tiny_config(d));  // data files need not exist: nothing is read
  CHECK(has(sw_run(d, {"plan-dump", "--help"}).out, "--world-size"));
  check_usage(d, {"plan-dump"}, "missing CONFIG");
  check_usage(d, {"plan-dump", "cfg.json", "--world-size", "0"}, "--world-size");
  check_usage(d, {"plan-dump", "cfg.json", "--world-size", "x"}, "--world-size");
  // HYBRID over 4 ranks in groups of 2: reduce-scatter within the group, then all-reduce
  // across the replicas, as one process that was not launched by mpirun plans it.
  const Result h = sw_run(d, {"plan-dump", "cfg.json", "--world-size", "4", "--set",
                              "sharding_strategy=HYBRID_SHARD", "--set", "shard_group_size=2"});
  INFO(h.err);
  REQUIRE(h.rc == 0);
  CHECK(has(h.out, "world 4 (shard group 2 x 2 replicas)"));
  CHECK(has(h.out, "reduce   reduce_scatter"));
  CHECK(has(h.out, "reduce   all_reduce"));
  CHECK(has(h.out, "-- optimizer"));
  // A group size that does not divide the planned world is the config's error.
  check_error(sw_run(d, {"plan-dump", "cfg.json", "--world-size", "3", "--set",
                         "sharding_strategy=HYBRID_SHARD", "--set", "shard_group_size=2"}),
              {"shard_group_size", "world size (3)"});
  const Result e = sw_run(d, {"plan-dump", "cfg.json", "--eval"});
  REQUIRE(e.rc == 0);
  CHECK(has(e.out, "-- eval"));
  CHECK(!has(e.out, "backward"));
}
