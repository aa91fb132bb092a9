// The `shardwise` command line: train, profile, plan, plan-dump, data prepare, sample, eval,
// ckpt.
//
// Each command declares its options with help text (tools/cli.h, on CLI11: the option kinds,
// the help layout, and the exit codes: 0 success or help, 1 an error in what was asked
// (sw::Error, printed as one line "shardwise: error: <message>"), 2 a usage mistake (printed
// as "shardwise <cmd>: <problem>" plus a hint naming the right --help)), parsed into a plain
// struct; its function runs on that struct.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/export.h"
#include "core/error.h"
#include "core/launch.h"
#include "engine/config.h"
#include "engine/data.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"
#include "engine/trainer.h"
#include "shardwise/trainer.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "sharding/sharded_model.h"
#include "tools/ckpt_cmd.h"
#include "tools/data_prepare.h"
#include "tools/eval_cmd.h"
#include "tools/cli.h"
#include "tools/plan_cmd.h"

#ifndef SW_VERSION
#define SW_VERSION "0.1.0"
#endif

namespace fs = std::filesystem;
namespace cli = sw::cli;

namespace {

// The process's rank under mpirun/srun, from the launcher's environment (0 when not launched
// by one): only rank 0 prints the summary.
int launcher_rank() { return sw::launch_env().rank; }

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

// ---- train ---------------------------------------------------------------------------------

struct TrainArgs {
  std::string config;
  std::vector<std::string> overrides;  // --set, in order
  std::string resume, init_from;       // "" = not given
  bool quiet = false, no_export = false;
};

// A thin user of the C++ facade (shardwise/trainer.h): the same reader, run and summary.
int cmd_train(const TrainArgs& a) {
  std::vector<std::string> overrides = a.overrides;
  if (!a.resume.empty()) overrides.push_back("checkpoint.resume=" + json_string(a.resume));
  if (!a.init_from.empty())
    overrides.push_back("checkpoint.init_from=" + json_string(a.init_from));
  sw::TrainerOptions opts;
  opts.progress = !a.quiet;
  opts.export_at_end = !a.no_export;
  sw::Trainer trainer = sw::Trainer::from_file(a.config, overrides, opts);
  trainer.train();
  if (launcher_rank() != 0) return 0;
  std::fputs(trainer.summary_text().c_str(), stdout);
  std::fflush(stdout);
  return 0;
}

void add_train(cli::Command& top) {
  auto a = std::make_shared<TrainArgs>();
  cli::Command c = top.sub(
      "train",
      "train a model described by a JSON config (mpirun -np N for N ranks)\n"
      "\n"
      "Trains the model described by CONFIG.json (DeepSpeed-style keys; see configs/). Writes\n"
      "<run_dir>/metrics.jsonl (one JSON object per step, validation lines too), the resolved\n"
      "config, and <run_dir>/hf/ (a Hugging Face model directory: config.json, weights,\n"
      "tokenizer; transformers' from_pretrained loads it) at the end, then\n"
      "prints a summary: steps, final training and validation loss, the training data's\n"
      "byte-unigram entropy (the loss of a model that ignores context), tokens/s, weights path.\n"
      "Under `mpirun -np N shardwise train CONFIG.json` every rank runs it; rank 0 prints.");
  c.config(a->config);
  c.overrides(a->overrides);
  c.flag("--quiet", a->quiet, "no live progress line on stderr");
  c.flag("--no-export", a->no_export, "do not write the Hugging Face export <run_dir>/hf/");
  c.text("--resume", a->resume, "DIR|auto",
                "continue a run from a checkpoint: a step directory (<dir>/step_N)\n"
                "or a checkpoint directory (its 'latest' file names the step);\n"
                "'auto' = <checkpoint.dir>/latest when it exists, else start\n"
                "fresh. The run continues exactly as if never stopped (same\n"
                "losses, same weights); metrics.jsonl is appended to (sets\n"
                "checkpoint.resume; wins over --set checkpoint.resume)");
  c.text("--init-from", a->init_from, "FILE|DIR",
                "start from the weights in a safetensors file (model.safetensors,\n"
                "or `shardwise ckpt export` output) or a Hugging Face model\n"
                "directory (config.json is then the model block; the config's\n"
                "model keys override it) with fresh optimizer state, step 0\n"
                "(sets checkpoint.init_from)");
  c.footer(
      "Checkpoints: set checkpoint.every_steps (e.g. --set checkpoint.every_steps=500) to save\n"
      "<run_dir>/checkpoints/step_N every N steps (and after the last step); checkpoint.keep_last\n"
      "(default 3), checkpoint.async (write in the background), checkpoint.dir.");
  c.on_run([a] { return cmd_train(*a); });
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

struct ProfileArgs {
  std::string config, out;  // out "" = the config's profile.out
  std::vector<std::string> overrides;
  int steps = 3;
  bool quiet = false, plan = false;
};

int cmd_profile(const ProfileArgs& a) {
  std::vector<std::string> overrides = a.overrides;
  sw::TrainOptions opts;
  opts.export_weights = false;
  opts.progress = !a.quiet;
  // The run as configured, then cut to `steps` steps with the same LR schedule, from scratch,
  // without checkpoints, writing its run files into the profile directory.
  const sw::TrainConfig full = sw::load_config(a.config, overrides);
  const std::string dir = a.out.empty() ? full.profile.out : a.out;
  // (a cosine schedule's length, which defaults to train_steps; the other schedules have none)
  if (full.scheduler.type == "WarmupCosineLR" && full.scheduler.total_num_steps == 0)
    overrides.push_back("scheduler.params.total_num_steps=" + std::to_string(full.train_steps));
  overrides.push_back("train_steps=" + std::to_string(a.steps));
  overrides.push_back("checkpoint.every_steps=0");
  overrides.push_back("checkpoint.resume=\"\"");
  overrides.push_back("run_dir=" + json_string(dir));
  overrides.push_back("profile.enabled=true");
  overrides.push_back("profile.start_step=2");
  overrides.push_back("profile.num_steps=" + std::to_string(a.steps - 1));
  overrides.push_back("profile.out=" + json_string(dir));
  const sw::TrainConfig cfg = sw::load_config(a.config, overrides);
  const sw::TrainSummary s = sw::train(cfg, opts);
  if (launcher_rank() != 0) return 0;

  const sw::ProfileResult& p = s.profile;
  const int world = sw::launch_env().world_size;
  std::printf("shardwise: profiled steps 2-%d of %d (step 1 is warm-up), %d rank%s\n", a.steps,
              a.steps, world, world == 1 ? "" : "s");
  std::printf("%s", sw::format_peaks_table(p.peaks).c_str());
  std::printf("  tracker peak       %s (MemTracker over the whole run, warm-up included)\n",
              sw::format_bytes(p.tracker_peak_bytes).c_str());
  std::printf("  trace (Perfetto)   %s\n", p.trace_path.c_str());
  std::printf("  memory chart       %s\n", p.svg_path.c_str());
  std::printf("  peaks              %s\n", p.peaks_path.c_str());
  if (!p.plan_path.empty()) std::printf("  plan prediction    %s\n", p.plan_path.c_str());
  if (a.plan) print_plan_vs_measured(p.dir, world);
  if (world > 1)
    std::printf("  (rank%s %s wrote trace_rank<r>.json, memory_rank<r>.svg, peaks_rank<r>.json "
                "in %s)\n",
                world > 2 ? "s" : "",
                world > 2 ? ("1-" + std::to_string(world - 1)).c_str() : "1", p.dir.c_str());
  std::fflush(stdout);
  return 0;
}

void add_profile(cli::Command& top) {
  auto a = std::make_shared<ProfileArgs>();
  cli::Command c = top.sub(
      "profile",
      "run N steps; write each rank's trace, memory chart and peaks\n"
      "\n"
      "Also: mpirun -np R shardwise profile CONFIG.json ...\n"
      "\n"
      "Runs N optimizer steps of the run CONFIG.json describes, from its start (no resume), with\n"
      "the profile block enabled: step 1 is a warm-up (first allocations, page faults, thread\n"
      "pools) and is not recorded; steps 2..N are. The LR schedule is the full run's (its length\n"
      "stays train_steps). No checkpoint is saved and no weights are exported; config.json and\n"
      "metrics.jsonl of the profiled steps go to DIR, so the run's own run_dir is not touched.\n"
      "Every rank r writes into DIR:\n"
      "  trace_rank<r>.json   Chrome trace events: open in https://ui.perfetto.dev or\n"
      "                       chrome://tracing (one process per rank, one track per queue\n"
      "                       and, on a GPU, per device stream: compute, NCCL, copies)\n"
      "  memory_rank<r>.svg   memory in use per category over the recorded steps (stacked)\n"
      "  peaks_rank<r>.json   peak_bytes, peak_action, at_peak {category: bytes},\n"
      "                       peak_per_category\n"
      "  plan_rank<r>.json    what `shardwise plan` predicts for the rank: peak_bytes (the\n"
      "                       step plan replayed), at_peak {category: bytes},\n"
      "                       workspace_estimate_bytes; the chart draws the plan's total dashed\n"
      "                       over the measured one, action by action\n"
      "Rank 0 then prints its peak table and the paths.");
  c.config(a->config);
  c.integer("--steps", a->steps, 2, 1000000, "N",
            "steps to run, >= 2 (default 3: one warm-up, two recorded)");
  c.text("--out", a->out, "DIR",
                "output directory (default: the config's profile.out, which\n"
                "defaults to <run_dir>/profile); created if missing, must be\n"
                "writable");
  c.overrides(a->overrides);
  c.flag("--quiet", a->quiet, "no live progress line on stderr");
  c.flag("--plan", a->plan,
              "print the plan's prediction beside the measurement: per rank\n"
              "the device peak, per category at rank 0's peak");
  c.on_run([a] { return cmd_profile(*a); });
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

int cmd_data_prepare(const PrepareArgs& a) {
  if (!a.tokenizer.empty() || a.jsonl) return prepare_tokenized(a);  // tools/data_prepare.cpp
  std::string text;
  for (const std::string& p : a.inputs) text += read_file_bytes(p);
  if (text.empty()) sw::fail("data", "the input files are empty");

  std::vector<uint16_t> train, valid;
  if (a.val.empty()) {
    train.assign(reinterpret_cast<const unsigned char*>(text.data()),
                 reinterpret_cast<const unsigned char*>(text.data()) + text.size());
  } else {
    const double F = a.val_fraction;
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
  ensure_parent_dir(a.out);
  sw::write_token_file(a.out, train);
  std::printf("wrote %s: %zu tokens\n", a.out.c_str(), train.size());
  if (!a.val.empty()) {
    ensure_parent_dir(a.val);
    sw::write_token_file(a.val, valid);
    std::printf("wrote %s: %zu tokens\n", a.val.c_str(), valid.size());
  }
  std::printf("%zu input files, %zu bytes, vocabulary 256 (bytes)\n", a.inputs.size(), text.size());
  return 0;
}

void add_data(cli::Command& top) {
  cli::Command data = top.sub(
      "data",
      "prepare token files (data prepare TEXT... --out FILE.bin)");
  auto a = std::make_shared<PrepareArgs>();
  cli::Command c = data.sub(
      "prepare",
      "tokenize text files or JSONL into llm.c .bin token files\n"
      "\n"
      "Without --tokenizer: the TEXT files byte by byte (token = byte value, vocabulary 256),\n"
      "concatenated in the order given, as they are, into llm.c/nanoGPT .bin token files (256 x\n"
      "int32 header: magic 20240520, version 1, token count; then uint16 tokens). With --val, a\n"
      "deterministic, evenly spread fraction F of the text goes to the validation file: the\n"
      "concatenated bytes are cut into blocks of min(4096, max(1, N/100)) bytes (N = total\n"
      "bytes) and block i goes to validation when floor((i+1)*F) > floor(i*F), i.e. every\n"
      "(1/F)-th block; the other blocks, in order, form the training file.\n"
      "\n"
      "With --tokenizer (a Hugging Face tokenizer.json, a SentencePiece .model, or a directory\n"
      "holding one) or --jsonl: each TEXT file is one document (with --jsonl each line, its\n"
      "\"text\", or \"prompt\" and \"completion\": then a loss mask X.mask is written beside\n"
      "X.bin, prompt tokens 0), each followed by the tokenizer's end-of-text id. Inputs are\n"
      "streamed in pieces of clamp(N/256, 4 KiB, 1 MiB) bytes cut where the tokenizer allows,\n"
      "encoded on --threads threads; piece i goes to validation as block i above. Ids are 2\n"
      "bytes up to a vocabulary of 65,536, else 4 (token file version 2).");
  c.positionals("TEXT", a->inputs, "text files to tokenize, concatenated in this order");
  c.text("--tokenizer", a->tokenizer, "FILE",
         "tokenizer.json, a SentencePiece .model, or a directory\n"
         "(default: bytes)");
  c.flag("--jsonl", a->jsonl, "the inputs are JSONL: one document per line");
  c.integer("--threads", a->threads, 1, 4096, "N", "encoding threads (default: every core)");
  c.flag("--quiet", a->quiet, "no progress bar on stderr");
  c.text("--out", a->out, "FILE.bin", "training token file to write").required();
  const cli::Opt val = c.text("--val", a->val, "FILE.bin", "validation token file to write");
  c.number("--val-fraction", a->val_fraction, 0.0, 1.0, true, "F",
           "fraction of blocks for validation, 0 < F < 1 (default 0.1;\n"
           "needs --val)")
      .needs(val);
  c.footer(
      "Example (Debian's fortune-mod text files, not the .dat/.u8 index files):\n"
      "  shardwise data prepare $(ls /usr/share/games/fortunes/* | grep -v '\\.') \\\n"
      "      --out data/fortunes_train.bin --val data/fortunes_val.bin");
  c.on_run([a, c] {
    if (!a->val.empty() && a->val == a->out) c.usage_fail("--out and --val name the same file");
    return cmd_data_prepare(*a);
  });
}

// ---- sample --------------------------------------------------------------------------------

struct SampleArgs {
  std::string config, weights;  // weights "" = <run_dir>/hf
  std::vector<std::string> overrides;
  sw::SampleOptions so;
  double temperature = 1.0;
};

int cmd_sample(const SampleArgs& a) {
  sw::SampleOptions so = a.so;
  so.temperature = static_cast<float>(a.temperature);
  const std::string wpath =
      a.weights.empty()
          ? (fs::path(sw::load_config(a.config, a.overrides).run_dir) / "hf").string()
          : a.weights;
  // Weights in a Hugging Face directory bring their model block (config.json).
  const sw::TrainConfig cfg = sw::load_config_for_weights(a.config, a.overrides, wpath);
  sw::refuse_tensor_parallel_gaps(cfg, "sample");
  std::error_code ec;
  if (!fs::exists(wpath, ec))
    sw::fail("sample", "weights '" + wpath + "' not found" +
                           (a.weights.empty() ? " (train first, or pass --weights)" : ""));

  sw::Model model = sw::build_model(cfg.model);
  sw::ShardedModel sm(model, sw::ops_for(sw::Device::cpu()), cfg.seed);
  sw::import_safetensors(sm, wpath);
  const auto tokenizer = sw::load_tokenizer(cfg.tokenizer);  // data.tokenizer ("" = bytes)
  so.tokenizer = tokenizer.get();
  const std::string text = sw::sample_text(sm, so);
  std::fwrite(so.prompt.data(), 1, so.prompt.size(), stdout);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  return 0;
}

void add_sample(cli::Command& top) {
  auto a = std::make_shared<SampleArgs>();
  cli::Command c = top.sub(
      "sample",
      "generate text from trained weights\n"
      "\n"
      "Builds the model from the config's `model` block, loads the weights `shardwise train`\n"
      "exported (<run_dir>/hf, or --weights), and prints the prompt followed by the generated\n"
      "continuation and a newline. The prompt is encoded and the continuation decoded with\n"
      "the config's data.tokenizer (bytes when unset, printed as they are); generation stops\n"
      "at its end-of-text id.");
  c.text("--config", a->config, "CFG.json", "the training config (its model block is used)")
      .required();
  c.text("--weights", a->weights, "FILE",
         "weights: a Hugging Face directory, a safetensors file or index\n"
         "(default: <run_dir>/hf, what `shardwise train` exports)");
  c.any_text("--prompt", a->so.prompt, "TEXT",
             "text to continue (default: empty, starts from a newline)");
  c.integer("--tokens", a->so.tokens, 0, 1 << 24, "N", "tokens to generate (default 200)");
  c.number("--temperature", a->temperature, 0.0, std::numeric_limits<double>::infinity(), false,
           "T", "softmax temperature, 0 = greedy (default 1.0)");
  c.integer("--top-k", a->so.top_k, 0, 1 << 30, "K",
            "sample only among the K most likely tokens, 0 = all (default 0)");
  c.unsigned_integer("--seed", a->so.seed, "S",
                     "random seed (default 0); the same seed gives the same text");
  c.overrides(a->overrides);
  c.on_run([a] { return cmd_sample(*a); });
}

// ---- the program ---------------------------------------------------------------------------

int run(const std::vector<std::string>& args) {
  cli::Program program(
      "shardwise",
      "shardwise " SW_VERSION " - sharded (FSDP/ZeRO) training of transformers\n"
      "N ranks: mpirun -np N shardwise train CONFIG.json (1 rank needs no mpirun)\n"
      "`shardwise <command> --help` (or `shardwise help <command>`) shows a\n"
      "command's options.",
      "shardwise " SW_VERSION);
  cli::Command top = program.top();
  add_train(top);
  add_profile(top);
  sw::add_plan_commands(top);
  add_data(top);
  add_sample(top);
  sw::add_eval_command(top);
  sw::add_ckpt_command(top);
  program.add_help_command();
  top.footer(
      "Exit codes: 0 success (and --help, --version); 1 an error in what was asked (a bad\n"
      "config, a missing file, ...: one line 'shardwise: error: ...'); 2 a usage mistake\n"
      "(unknown option, missing or malformed argument: 'shardwise <command>: ...' and a hint).\n"
      "Under mpirun every rank exits with the same code; rank 0 prints help and usage mistakes.");
  return program.run(args);
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
  } catch (const cli::UsageError& e) {
    std::fflush(stdout);
    if (cli::prints_usage()) {
      std::fprintf(stderr, "%s: %s\n", e.cmd.c_str(), one_line(e.message).c_str());
      std::fprintf(stderr, "Try '%s --help'.\n", e.cmd.c_str());
    }
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
