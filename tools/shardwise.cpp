// The `shardwise` command line: train, profile, data prepare, sample, ckpt.
//
// Exit codes: 0 success; 1 an error in what was asked (sw::Error: a bad config, a missing
// file, ...), printed as one line "shardwise: error: <message>"; 2 a usage mistake (unknown
// subcommand or option, missing or malformed argument), printed as one line
// "shardwise: <problem>" followed by a hint naming the right --help.
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <iostream>
#include <iterator>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/export.h"
#include "core/error.h"
#include "core/launch.h"
#include "engine/config.h"
#include "engine/data.h"
#include "engine/sampler.h"
#include "engine/trainer.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "sharding/sharded_model.h"
#include "tools/ckpt_cmd.h"
#include "tools/plan_cmd.h"

#ifndef SW_VERSION
#define SW_VERSION "0.1.0"
#endif

namespace fs = std::filesystem;

namespace {

// A usage mistake: `cmd` names the subcommand whose --help the hint points to ("" = top).
struct UsageError {
  std::string message;
  std::string cmd;
};

[[noreturn]] void usage_fail(const std::string& cmd, const std::string& message) {
  throw UsageError{message, cmd};
}

// ---- Help texts --------------------------------------------------------------------------

const char* kMainHelp =
    "shardwise " SW_VERSION " - sharded (FSDP/ZeRO) training of transformers\n"
    "\n"
    "Usage: shardwise <command> [options]\n"
    "       mpirun -np N shardwise train CONFIG.json   (N ranks; 1 rank needs no mpirun)\n"
    "\n"
    "Commands:\n"
    "  train CONFIG [--set key.path=value]...   train a model described by a JSON config\n"
    "        [--resume DIR|auto] [--init-from FILE]  (continue from a checkpoint / weights)\n"
    "  data prepare TEXT... --out FILE.bin      byte-level tokenize text into a .bin token file\n"
    "  sample --config CFG --prompt TEXT ...    generate text from trained weights\n"
    "  profile CONFIG [--steps N] [--out DIR]   run N steps, write per-rank trace, memory chart\n"
    "                                           and peaks (no checkpoints, no weights)\n"
    "  ckpt export|inspect|verify DIR ...       consolidate, list or check a sharded checkpoint\n"
    "  plan CONFIG [--world-size N] [--json]    predict each rank's memory peak per tier\n"
    "  plan-dump CONFIG [--world-size N]        print the step plan a run executes\n"
    "\n"
    "Options:\n"
    "  -h, --help      show this help (also `shardwise <command> --help`)\n"
    "  --version       print the version\n";

const char* kTrainHelp =
    "Usage: shardwise train CONFIG.json [options]\n"
    "\n"
    "Trains the model described by CONFIG.json (DeepSpeed-style keys; see configs/). Writes\n"
    "<run_dir>/metrics.jsonl (one JSON object per step, validation lines too), the resolved\n"
    "config, and <run_dir>/model.safetensors (Hugging Face tensor names) at the end, then\n"
    "prints a summary: steps, final training and validation loss, the training data's\n"
    "byte-unigram entropy (the loss of a model that ignores context), tokens/s, weights path.\n"
    "\n"
    "Options:\n"
    "  --set KEY=VALUE   override a config key by its dotted path, e.g.\n"
    "                    --set train_steps=50 --set optimizer.params.lr=1e-3\n"
    "                    (VALUE is parsed as JSON, otherwise taken as a string); repeatable\n"
    "  --quiet           no live progress line on stderr\n"
    "  --no-export       do not write model.safetensors\n"
    "  --resume DIR      continue a run from a checkpoint: a step directory (<dir>/step_N) or a\n"
    "                    checkpoint directory (its 'latest' file names the step); 'auto' =\n"
    "                    <checkpoint.dir>/latest when it exists, else start fresh. The run\n"
    "                    continues exactly as if never stopped (same losses, same weights);\n"
    "                    metrics.jsonl is appended to (sets checkpoint.resume)\n"
    "  --init-from FILE  start from the weights in a safetensors file (model.safetensors, or\n"
    "                    `shardwise ckpt export` output) with fresh optimizer state, step 0\n"
    "                    (sets checkpoint.init_from)\n"
    "  -h, --help        show this help\n"
    "\n"
    "Checkpoints: set checkpoint.every_steps (e.g. --set checkpoint.every_steps=500) to save\n"
    "<run_dir>/checkpoints/step_N every N steps (and after the last step); checkpoint.keep_last\n"
    "(default 3), checkpoint.async (write in the background), checkpoint.dir.\n";

const char* kProfileHelp =
    "Usage: shardwise profile CONFIG.json [--steps N] [--out DIR] [--set KEY=VALUE]...\n"
    "       mpirun -np R shardwise profile CONFIG.json ...\n"
    "\n"
    "Runs N optimizer steps of the run CONFIG.json describes, from its start (no resume), with\n"
    "the profile block enabled: step 1 is a warm-up (first allocations, page faults, thread\n"
    "pools) and is not recorded; steps 2..N are. The LR schedule is the full run's (its length\n"
    "stays train_steps). No checkpoint is saved and no weights are exported; config.json and\n"
    "metrics.jsonl of the profiled steps go to DIR, so the run's own run_dir is not touched.\n"
    "Every rank r writes into DIR:\n"
    "  trace_rank<r>.json   Chrome trace events: open in https://ui.perfetto.dev or\n"
    "                       chrome://tracing (one process per rank, one track per queue)\n"
    "  memory_rank<r>.svg   memory in use per category over the recorded steps (stacked)\n"
    "  peaks_rank<r>.json   peak_bytes, peak_action, at_peak {category: bytes},\n"
    "                       peak_per_category\n"
    "  plan_rank<r>.json    what `shardwise plan` predicts for the rank: peak_bytes (the\n"
    "                       step plan replayed), at_peak {category: bytes},\n"
    "                       workspace_estimate_bytes; the chart draws the plan's total dashed\n"
    "                       over the measured one, action by action\n"
    "Rank 0 then prints its peak table and the paths.\n"
    "\n"
    "Options:\n"
    "  --steps N         steps to run, >= 2 (default 3: one warm-up, two recorded)\n"
    "  --out DIR         output directory (default: the config's profile.out, which defaults\n"
    "                    to <run_dir>/profile); created if missing, must be writable\n"
    "  --set KEY=VALUE   config override, as for train; repeatable\n"
    "  --quiet           no live progress line on stderr\n"
    "  --plan            print the plan's prediction beside the measurement: per rank the\n"
    "                    device peak, per category at rank 0's peak\n"
    "  -h, --help        show this help\n";

const char* kDataHelp =
    "Usage: shardwise data prepare TEXT... --out FILE.bin [--val FILE.bin] [--val-fraction F]\n"
    "\n"
    "Subcommands:\n"
    "  prepare   byte-level tokenize text files into llm.c .bin token files\n"
    "\n"
    "Run `shardwise data prepare --help` for details.\n";

const char* kPrepareHelp =
    "Usage: shardwise data prepare TEXT... --out FILE.bin [--val FILE.bin] [--val-fraction F]\n"
    "\n"
    "Tokenizes the TEXT files byte by byte (token = byte value, vocabulary 256) and writes\n"
    "llm.c/nanoGPT .bin token files (256 x int32 header: magic 20240520, version 1, token\n"
    "count; then uint16 tokens). The files are concatenated in the order given, as they are.\n"
    "\n"
    "With --val, a deterministic, evenly spread fraction F of the text goes to the validation\n"
    "file: the concatenated bytes are cut into blocks of min(4096, max(1, N/100)) bytes (N =\n"
    "total bytes) and block i goes to validation when floor((i+1)*F) > floor(i*F), i.e. every\n"
    "(1/F)-th block; the other blocks, in order, form the training file.\n"
    "\n"
    "Options:\n"
    "  --out FILE.bin       training token file to write (required)\n"
    "  --val FILE.bin       validation token file to write\n"
    "  --val-fraction F     fraction of blocks for validation, 0 < F < 1 (default 0.1;\n"
    "                       needs --val)\n"
    "  -h, --help           show this help\n"
    "\n"
    "Example (Debian's fortune-mod text files, not the .dat/.u8 index files):\n"
    "  shardwise data prepare $(ls /usr/share/games/fortunes/* | grep -v '\\.') \\\n"
    "      --out data/fortunes_train.bin --val data/fortunes_val.bin\n";

const char* kSampleHelp =
    "Usage: shardwise sample --config CFG.json [--weights FILE] [options]\n"
    "\n"
    "Builds the model from the config's `model` block, loads weights from a safetensors file\n"
    "(as written by `shardwise train`), and prints the prompt followed by the generated\n"
    "continuation and a newline. Tokens are bytes; bytes are printed as they are.\n"
    "\n"
    "Options:\n"
    "  --config CFG.json   the training config (required; its model block is used)\n"
    "  --weights FILE      safetensors weights (default: <run_dir>/model.safetensors)\n"
    "  --prompt TEXT       text to continue (default: empty, starts from a newline)\n"
    "  --tokens N          tokens to generate (default 200)\n"
    "  --temperature T     softmax temperature, 0 = greedy (default 1.0)\n"
    "  --top-k K           sample only among the K most likely tokens, 0 = all (default 0)\n"
    "  --seed S            random seed (default 0); the same seed gives the same text\n"
    "  --set KEY=VALUE     config override, as for train; repeatable\n"
    "  -h, --help          show this help\n";

// ---- Argument helpers ----------------------------------------------------------------------

bool is_help(const std::string& a) { return a == "-h" || a == "--help"; }

// Reads options of the form "--name value" or "--name=value" from args[i]. Returns true and
// the value (advancing i) when args[i] is that option.
bool take_value(const std::vector<std::string>& args, size_t& i, const std::string& name,
                const std::string& cmd, std::string& value) {
  const std::string& a = args[i];
  if (a == name) {
    if (i + 1 >= args.size()) usage_fail(cmd, "option " + name + " needs a value");
    value = args[++i];
    return true;
  }
  if (a.size() > name.size() && a.compare(0, name.size(), name) == 0 && a[name.size()] == '=') {
    value = a.substr(name.size() + 1);
    return true;
  }
  return false;
}

int64_t parse_int(const std::string& s, const std::string& opt, const std::string& cmd,
                  int64_t lo, int64_t hi) {
  int64_t v = 0;
  const char* b = s.data();
  const char* e = b + s.size();
  auto r = std::from_chars(b, e, v);
  if (s.empty() || r.ec != std::errc() || r.ptr != e)
    usage_fail(cmd, opt + " expects an integer, got '" + s + "'");
  if (v < lo || v > hi)
    usage_fail(cmd, opt + " must be between " + std::to_string(lo) + " and " + std::to_string(hi) +
                        ", got " + s);
  return v;
}

uint64_t parse_u64(const std::string& s, const std::string& opt, const std::string& cmd) {
  uint64_t v = 0;
  const char* b = s.data();
  const char* e = b + s.size();
  auto r = std::from_chars(b, e, v);
  if (s.empty() || r.ec != std::errc() || r.ptr != e)
    usage_fail(cmd, opt + " expects a non-negative integer, got '" + s + "'");
  return v;
}

double parse_double(const std::string& s, const std::string& opt, const std::string& cmd) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || errno == ERANGE || !std::isfinite(v))
    usage_fail(cmd, opt + " expects a number, got '" + s + "'");
  return v;
}

[[noreturn]] void unknown_option(const std::string& cmd, const std::string& a) {
  usage_fail(cmd, "unknown option '" + a + "' for '" + cmd + "'");
}

// The process's rank under mpirun/srun, from the launcher's environment (0 when not launched
// by one): only rank 0 prints the summary.
int launcher_rank() { return sw::launch_env().rank; }

// ---- train ---------------------------------------------------------------------------------

// `s` as a JSON string literal (for --set values that must stay strings).
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
      continue;
    }
    out += c;
  }
  return out + "\"";
}

int cmd_train(const std::vector<std::string>& args) {
  const std::string cmd = "train";
  std::optional<std::string> config;
  std::vector<std::string> overrides;
  sw::TrainOptions opts;
  for (size_t i = 0; i < args.size(); i++) {
    const std::string& a = args[i];
    std::string v;
    if (is_help(a)) {
      std::cout << kTrainHelp;
      return 0;
    } else if (take_value(args, i, "--set", cmd, v)) {
      if (v.find('=') == std::string::npos || v.front() == '=')
        usage_fail(cmd, "--set expects KEY=VALUE, got '" + v + "'");
      overrides.push_back(v);
    } else if (a == "--quiet") {
      opts.progress = false;
    } else if (a == "--no-export") {
      opts.export_weights = false;
    } else if (take_value(args, i, "--resume", cmd, v)) {
      if (v.empty()) usage_fail(cmd, "--resume expects a checkpoint directory or 'auto'");
      overrides.push_back("checkpoint.resume=" + json_string(v));
    } else if (take_value(args, i, "--init-from", cmd, v)) {
      if (v.empty()) usage_fail(cmd, "--init-from expects a safetensors file");
      overrides.push_back("checkpoint.init_from=" + json_string(v));
    } else if (a.size() > 1 && a[0] == '-') {
      unknown_option(cmd, a);
    } else if (!config) {
      config = a;
    } else {
      usage_fail(cmd, "unexpected argument '" + a + "' (one CONFIG file expected)");
    }
  }
  if (!config) usage_fail(cmd, "missing CONFIG file");

  const sw::TrainConfig cfg = sw::load_config(*config, overrides);
  const auto t0 = std::chrono::steady_clock::now();
  const sw::TrainSummary s = sw::train(cfg, opts);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (launcher_rank() != 0) return 0;

  std::printf("shardwise: trained %d steps in %.1f s\n", s.steps, secs);
  std::printf("  final train loss   %.4f\n", s.last_loss);
  if (s.last_val_loss >= 0)
    std::printf("  val loss           %.4f\n", s.last_val_loss);
  else
    std::printf("  val loss           (no validation data)\n");
  std::printf("  unigram entropy    %.4f nats (byte-unigram loss of the training data)\n",
              s.unigram_entropy);
  std::printf("  tokens/s           %.0f\n", s.tokens_per_s);
  if (cfg.fp16)
    std::printf("  fp16 loss scale    %g (%d steps skipped on overflow)\n", s.loss_scale,
                s.skipped_steps);
  if (!s.resumed_from.empty())
    std::printf("  resumed from       %s (step %d)\n", s.resumed_from.c_str(), s.start_step);
  if (s.checkpoints_saved > 0 || s.checkpoints_failed > 0)
    std::printf("  checkpoints        %d saved, %d failed, last step_%lld in %s (stall %.2f s)\n",
                s.checkpoints_saved, s.checkpoints_failed, (long long)s.last_checkpoint,
                cfg.checkpoint.dir.c_str(), s.ckpt_stall_s);
  if (s.profile.steps_recorded > 0)
    std::printf("  profile            %d steps recorded in %s\n", s.profile.steps_recorded,
                s.profile.dir.c_str());
  std::printf("  weights            %s\n", s.weights_path.empty() ? "(not exported)"
                                                                 : s.weights_path.c_str());
  std::fflush(stdout);
  return 0;
}

// ---- profile -------------------------------------------------------------------------------

// `profile --plan`: each rank's plan_rank<r>.json beside its peaks_rank<r>.json (the device's
// peak of the recorded steps), then rank 0's categories at the two peaks.
void print_plan_vs_measured(const std::string& dir, int world) {
  auto load = [&](const std::string& name) -> nlohmann::json {
    std::ifstream f(fs::path(dir) / name);
    if (!f) return nullptr;
    try {
      return nlohmann::json::parse(f);
    } catch (const std::exception&) {
      return nullptr;
    }
  };
  auto mib = [](double b) { return b / (1024.0 * 1024.0); };
  std::printf("plan vs measured (device memory, MiB; measured = the recorded steps' peak):\n");
  std::printf("  %-5s %12s %12s %12s %9s %9s\n", "rank", "plan", "+workspace", "measured",
              "meas/plan", "meas/+ws");
  nlohmann::json plan0, meas0;
  for (int r = 0; r < world; ++r) {
    const std::string tag = "_rank" + std::to_string(r) + ".json";
    const nlohmann::json pl = load("plan" + tag), me = load("peaks" + tag);
    if (pl.is_null() || me.is_null()) {
      std::printf("  %-5d (plan%s or peaks%s missing)\n", r, tag.c_str(), tag.c_str());
      continue;
    }
    if (r == 0) plan0 = pl, meas0 = me;
    const double p = pl.value("peak_bytes", 0.0), w = p + pl.value("workspace_estimate_bytes", 0.0);
    const double m = me.value("peak_bytes", 0.0);
    std::printf("  %-5d %12.1f %12.1f %12.1f %9.3f %9.3f\n", r, mib(p), mib(w), mib(m),
                p > 0 ? m / p : 0.0, w > 0 ? m / w : 0.0);
  }
  std::printf("process RSS (MiB; plan = rss_bytes as `plan` predicts it, measured = peak RSS):\n");
  for (int r = 0; r < world; ++r) {
    const std::string tag = "_rank" + std::to_string(r) + ".json";
    const nlohmann::json pl = load("plan" + tag), me = load("peaks" + tag);
    if (pl.is_null() || me.is_null() || !pl.contains("rss_bytes") || !me.contains("max_rss_bytes"))
      continue;
    const double p = pl["rss_bytes"].get<double>(), m = me["max_rss_bytes"].get<double>();
    std::printf("  %-5d %12.1f %12s %12.1f %9.3f\n", r, mib(p), "", mib(m), p > 0 ? m / p : 0.0);
  }
  if (plan0.is_null()) return;
  std::printf("  rank 0 at each peak:\n  %-14s %12s %12s\n", "category", "plan", "measured");
  for (auto it = plan0["at_peak"].begin(); it != plan0["at_peak"].end(); ++it) {
    const double m = meas0["at_peak"].value(it.key(), 0.0);
    if (it.value().get<double>() == 0 && m == 0) continue;
    std::printf("  %-14s %12.1f %12.1f\n", it.key().c_str(), mib(it.value().get<double>()), mib(m));
  }
}

int cmd_profile(const std::vector<std::string>& args) {
  const std::string cmd = "profile";
  std::optional<std::string> config, out;
  std::vector<std::string> overrides;
  int steps = 3;
  bool with_plan = false;
  sw::TrainOptions opts;
  opts.export_weights = false;
  for (size_t i = 0; i < args.size(); i++) {
    const std::string& a = args[i];
    std::string v;
    if (is_help(a)) {
      std::cout << kProfileHelp;
      return 0;
    } else if (take_value(args, i, "--steps", cmd, v)) {
      steps = static_cast<int>(parse_int(v, "--steps", cmd, 2, 1000000));
    } else if (take_value(args, i, "--out", cmd, v)) {
      if (v.empty()) usage_fail(cmd, "--out expects a directory");
      out = v;
    } else if (take_value(args, i, "--set", cmd, v)) {
      if (v.find('=') == std::string::npos || v.front() == '=')
        usage_fail(cmd, "--set expects KEY=VALUE, got '" + v + "'");
      overrides.push_back(v);
    } else if (a == "--quiet") {
      opts.progress = false;
    } else if (a == "--plan") {
      with_plan = true;
    } else if (a.size() > 1 && a[0] == '-') {
      unknown_option(cmd, a);
    } else if (!config) {
      config = a;
    } else {
      usage_fail(cmd, "unexpected argument '" + a + "' (one CONFIG file expected)");
    }
  }
  if (!config) usage_fail(cmd, "missing CONFIG file");

  // The run as configured, then cut to `steps` steps with the same LR schedule, from scratch,
  // without checkpoints, writing its run files into the profile directory.
  const sw::TrainConfig full = sw::load_config(*config, overrides);
  const std::string dir = out ? *out : full.profile.out;
  if (full.scheduler.total_num_steps == 0)
    overrides.push_back("scheduler.params.total_num_steps=" + std::to_string(full.train_steps));
  overrides.push_back("train_steps=" + std::to_string(steps));
  overrides.push_back("checkpoint.every_steps=0");
  overrides.push_back("checkpoint.resume=\"\"");
  overrides.push_back("run_dir=" + json_string(dir));
  overrides.push_back("profile.enabled=true");
  overrides.push_back("profile.start_step=2");
  overrides.push_back("profile.num_steps=" + std::to_string(steps - 1));
  overrides.push_back("profile.out=" + json_string(dir));
  const sw::TrainConfig cfg = sw::load_config(*config, overrides);
  const sw::TrainSummary s = sw::train(cfg, opts);
  if (launcher_rank() != 0) return 0;

  const sw::ProfileResult& p = s.profile;
  const int world = sw::launch_env().world_size;
  std::printf("shardwise: profiled steps 2-%d of %d (step 1 is warm-up), %d rank%s\n", steps,
              steps, world, world == 1 ? "" : "s");
  std::printf("%s", sw::format_peaks_table(p.peaks).c_str());
  std::printf("  tracker peak       %s (MemTracker over the whole run, warm-up included)\n",
              sw::format_bytes(p.tracker_peak_bytes).c_str());
  std::printf("  trace (Perfetto)   %s\n", p.trace_path.c_str());
  std::printf("  memory chart       %s\n", p.svg_path.c_str());
  std::printf("  peaks              %s\n", p.peaks_path.c_str());
  if (!p.plan_path.empty()) std::printf("  plan prediction    %s\n", p.plan_path.c_str());
  if (with_plan) print_plan_vs_measured(p.dir, world);
  if (world > 1)
    std::printf("  (rank%s %s wrote trace_rank<r>.json, memory_rank<r>.svg, peaks_rank<r>.json "
                "in %s)\n",
                world > 2 ? "s" : "",
                world > 2 ? ("1-" + std::to_string(world - 1)).c_str() : "1", p.dir.c_str());
  std::fflush(stdout);
  return 0;
}

// ---- data prepare --------------------------------------------------------------------------

std::string read_file_bytes(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) sw::fail("data", "input file '" + path + "' does not exist");
  if (fs::is_directory(path, ec)) sw::fail("data", "input '" + path + "' is a directory");
  std::ifstream f(path, std::ios::binary);
  if (!f) sw::fail("data", "cannot open input file '" + path + "'");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) sw::fail("data", "error reading input file '" + path + "'");
  return s;
}

void ensure_parent_dir(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  if (parent.empty()) return;
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) sw::fail("data", "cannot create directory '" + parent.string() + "': " + ec.message());
}

int cmd_data_prepare(const std::vector<std::string>& args) {
  const std::string cmd = "data prepare";
  std::vector<std::string> inputs;
  std::optional<std::string> out, val;
  std::optional<double> frac;
  for (size_t i = 0; i < args.size(); i++) {
    const std::string& a = args[i];
    std::string v;
    if (is_help(a)) {
      std::cout << kPrepareHelp;
      return 0;
    } else if (take_value(args, i, "--out", cmd, v)) {
      out = v;
    } else if (take_value(args, i, "--val", cmd, v)) {
      val = v;
    } else if (take_value(args, i, "--val-fraction", cmd, v)) {
      frac = parse_double(v, "--val-fraction", cmd);
      if (!(*frac > 0.0 && *frac < 1.0))
        usage_fail(cmd, "--val-fraction must be between 0 and 1 (exclusive), got '" + v + "'");
    } else if (a.size() > 1 && a[0] == '-') {
      unknown_option(cmd, a);
    } else {
      inputs.push_back(a);
    }
  }
  if (inputs.empty()) usage_fail(cmd, "no input TEXT files given");
  if (!out) usage_fail(cmd, "missing --out FILE.bin");
  if (frac && !val) usage_fail(cmd, "--val-fraction needs --val FILE.bin");
  if (val && *val == *out) usage_fail(cmd, "--out and --val name the same file");

  std::string text;
  for (const std::string& p : inputs) text += read_file_bytes(p);
  if (text.empty()) sw::fail("data", "the input files are empty");

  std::vector<uint16_t> train, valid;
  if (!val) {
    train.assign(reinterpret_cast<const unsigned char*>(text.data()),
                 reinterpret_cast<const unsigned char*>(text.data()) + text.size());
  } else {
    const double F = frac.value_or(0.1);
    const size_t N = text.size();
    const size_t block = std::min<size_t>(4096, std::max<size_t>(1, N / 100));
    for (size_t i = 0, start = 0; start < N; i++, start += block) {
      const bool to_val = std::floor(static_cast<double>(i + 1) * F) >
                          std::floor(static_cast<double>(i) * F);
      std::vector<uint16_t>& dst = to_val ? valid : train;
      const size_t end = std::min(N, start + block);
      for (size_t k = start; k < end; k++) dst.push_back(static_cast<unsigned char>(text[k]));
    }
    if (valid.empty())
      sw::fail("data", "the input is too small to split: no block went to validation (" +
                           std::to_string(N) + " bytes, --val-fraction " + std::to_string(F) +
                           ")");
    if (train.empty()) sw::fail("data", "the input is too small to split: no training blocks");
  }
  ensure_parent_dir(*out);
  sw::write_token_file(*out, train);
  std::printf("wrote %s: %zu tokens\n", out->c_str(), train.size());
  if (val) {
    ensure_parent_dir(*val);
    sw::write_token_file(*val, valid);
    std::printf("wrote %s: %zu tokens\n", val->c_str(), valid.size());
  }
  std::printf("%zu input files, %zu bytes, vocabulary 256 (bytes)\n", inputs.size(), text.size());
  return 0;
}

int cmd_data(const std::vector<std::string>& args) {
  if (args.empty()) usage_fail("data", "missing data subcommand (expected 'prepare')");
  if (is_help(args[0])) {
    std::cout << kDataHelp;
    return 0;
  }
  if (args[0] == "prepare") return cmd_data_prepare({args.begin() + 1, args.end()});
  usage_fail("data", "unknown data subcommand '" + args[0] + "' (expected 'prepare')");
}

// ---- sample --------------------------------------------------------------------------------

int cmd_sample(const std::vector<std::string>& args) {
  const std::string cmd = "sample";
  std::optional<std::string> config, weights;
  std::vector<std::string> overrides;
  sw::SampleOptions so;
  for (size_t i = 0; i < args.size(); i++) {
    const std::string& a = args[i];
    std::string v;
    if (is_help(a)) {
      std::cout << kSampleHelp;
      return 0;
    } else if (take_value(args, i, "--config", cmd, v)) {
      config = v;
    } else if (take_value(args, i, "--weights", cmd, v)) {
      weights = v;
    } else if (take_value(args, i, "--prompt", cmd, v)) {
      so.prompt = v;
    } else if (take_value(args, i, "--tokens", cmd, v)) {
      so.tokens = static_cast<int>(parse_int(v, "--tokens", cmd, 0, 1 << 24));
    } else if (take_value(args, i, "--temperature", cmd, v)) {
      const double t = parse_double(v, "--temperature", cmd);
      if (t < 0) usage_fail(cmd, "--temperature must be >= 0, got '" + v + "'");
      so.temperature = static_cast<float>(t);
    } else if (take_value(args, i, "--top-k", cmd, v)) {
      so.top_k = static_cast<int>(parse_int(v, "--top-k", cmd, 0, 1 << 30));
    } else if (take_value(args, i, "--seed", cmd, v)) {
      so.seed = parse_u64(v, "--seed", cmd);
    } else if (take_value(args, i, "--set", cmd, v)) {
      if (v.find('=') == std::string::npos || v.front() == '=')
        usage_fail(cmd, "--set expects KEY=VALUE, got '" + v + "'");
      overrides.push_back(v);
    } else if (a.size() > 1 && a[0] == '-') {
      unknown_option(cmd, a);
    } else {
      usage_fail(cmd, "unexpected argument '" + a + "'");
    }
  }
  if (!config) usage_fail(cmd, "missing --config CFG.json");

  const sw::TrainConfig cfg = sw::load_config(*config, overrides);
  const std::string wpath = weights ? *weights : (fs::path(cfg.run_dir) / "model.safetensors").string();
  std::error_code ec;
  if (!fs::is_regular_file(wpath, ec))
    sw::fail("sample", "weights file '" + wpath + "' not found" +
                           (weights ? "" : " (train first, or pass --weights)"));

  sw::Model model = sw::build_model(cfg.model);
  sw::ShardedModel sm(model, sw::ops_for(sw::Device::cpu()), cfg.seed);
  sw::import_safetensors(sm, wpath);
  const std::string text = sw::sample_text(sm, so);
  std::fwrite(so.prompt.data(), 1, so.prompt.size(), stdout);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  return 0;
}

int run(const std::vector<std::string>& args) {
  if (args.empty()) usage_fail("", "missing command");
  const std::string& c = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (is_help(c)) {
    std::cout << kMainHelp;
    return 0;
  }
  if (c == "--version") {
    std::cout << "shardwise " << SW_VERSION << "\n";
    return 0;
  }
  if (c == "train") return cmd_train(rest);
  if (c == "data") return cmd_data(rest);
  if (c == "sample") return cmd_sample(rest);
  if (c == "profile") return cmd_profile(rest);
  if (c == "ckpt") return sw::cmd_ckpt(rest);
  if (c == "plan-dump") return sw::cmd_plan_dump(rest);
  if (c == "plan") return sw::cmd_plan(rest);
  if (c == "help") {
    if (rest.empty()) {
      std::cout << kMainHelp;
      return 0;
    }
    return run({rest[0], "--help"});
  }
  if (c.size() > 1 && c[0] == '-') usage_fail("", "unknown option '" + c + "'");
  usage_fail("", "unknown command '" + c + "' (expected train, profile, plan, plan-dump, data, sample or ckpt)");
}

// One line, no embedded newlines (a multi-line message would break the one-line contract).
std::string one_line(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  for (char& ch : s)
    if (ch == '\n' || ch == '\r') ch = ' ';
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    return run(args);
  } catch (const UsageError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "shardwise: %s\n", one_line(e.message).c_str());
    std::fprintf(stderr, "Try 'shardwise %s%s--help'.\n", e.cmd.c_str(), e.cmd.empty() ? "" : " ");
    return 2;
  } catch (const sw::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "shardwise: error: %s\n", one_line(e.what()).c_str());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    std::fprintf(stderr, "shardwise: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "shardwise: error: internal: %s\n", one_line(e.what()).c_str());
    return 1;
  } catch (...) {
    std::fflush(stdout);
    std::fprintf(stderr, "shardwise: error: internal: unknown exception\n");
    return 1;
  }
}
