// `shardwise ckpt`: export a sharded checkpoint to Hugging Face safetensors, print its table,
// verify every checksum. DIR is a step directory (step_<N>/ with metadata.json) or a
// checkpoint directory whose `latest` file names one.
#include "tools/ckpt_cmd.h"

#include <iostream>
#include <memory>

#include "checkpoint/sharded_checkpoint.h"

namespace sw {

namespace {

const char* kDirHelp =
    "a checkpoint step directory (<checkpoint.dir>/step_<N>, holding\n"
    "metadata.json and rank_<r>.safetensors) or a checkpoint directory\n"
    "whose `latest` file names one";

struct CkptArgs {
  std::string dir, out;
};

int cmd_export(const CkptArgs& a) {
  const std::string step = resolve_checkpoint_dir(a.dir);
  export_checkpoint(step, a.out);
  std::cout << "exported " << step << " -> " << a.out << "\n";
  return 0;
}

int cmd_inspect(const CkptArgs& a) {
  std::cout << inspect_checkpoint(resolve_checkpoint_dir(a.dir));
  return 0;
}

int cmd_verify(const CkptArgs& a) {
  const std::string step = resolve_checkpoint_dir(a.dir);
  verify_checkpoint(step);
  std::cout << "ok " << step << ": every checksum matches\n";
  return 0;
}

}  // namespace

void add_ckpt_command(CLI::App& top, cli::Runs& runs) {
  CLI::App* ckpt = cli::add_command(
      top, "ckpt",
      "export, inspect or verify a sharded checkpoint\n"
      "\n"
      "DIR is a checkpoint step directory (<checkpoint.dir>/step_<N>, holding metadata.json and\n"
      "rank_<r>.safetensors) or a checkpoint directory whose `latest` file names one.");
  auto a = std::make_shared<CkptArgs>();  // one of the subcommands is given
  CLI::App* ex = cli::add_command(
      *ckpt, "export",
      "write the consolidated fp32 weights with Hugging Face names\n"
      "\n"
      "Names and layouts as Hugging Face's (GPT-2: h.0.attn.c_attn.weight ... as (in, out);\n"
      "Llama: model.layers.0...), fp32, written one tensor at a time (memory about twice the\n"
      "largest tensor); the file loads with `train --init-from` and `sample --weights`.");
  ex->add_option("DIR", a->dir, kDirHelp)->required()->type_name("");
  cli::add_text(ex, "--out", a->out, "MODEL.safetensors", "the output file")->required();
  runs[ex] = [a] { return cmd_export(*a); };

  CLI::App* in = cli::add_command(
      *ckpt, "inspect",
      "print a checkpoint's step, world size, strategy, model, parameters\n"
      "\n"
      "Prints the step, world size, strategy, model config, every parameter (shape, dtype,\n"
      "bytes) and every shard file.");
  in->add_option("DIR", a->dir, kDirHelp)->required()->type_name("");
  runs[in] = [a] { return cmd_inspect(*a); };

  CLI::App* ve = cli::add_command(
      *ckpt, "verify",
      "check every checksum of a checkpoint\n"
      "\n"
      "Checks the metadata, every block of every tensor and every file; prints 'ok ...' and\n"
      "exits 0, or one error line naming file and tensor and exits 1.");
  ve->add_option("DIR", a->dir, kDirHelp)->required()->type_name("");
  runs[ve] = [a] { return cmd_verify(*a); };
}

}  // namespace sw
