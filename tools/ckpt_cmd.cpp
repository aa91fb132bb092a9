// `shardwise ckpt`: export a sharded checkpoint to Hugging Face safetensors, print its table,
// verify every checksum. DIR is a step directory (step_<N>/ with metadata.json) or a
// checkpoint directory whose `latest` file names one.
#include "tools/ckpt_cmd.h"

#include <algorithm>
#include <cstdint>
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
  std::string dir, out, tokenizer;
  uint64_t max_shard_bytes = static_cast<uint64_t>(kHfDefaultShardBytes);
};

int cmd_export(const CkptArgs& a) {
  const std::string step = resolve_checkpoint_dir(a.dir);
  HfExportOptions o;
  o.max_shard_bytes = static_cast<int64_t>(std::min<uint64_t>(a.max_shard_bytes, INT64_MAX));
  o.tokenizer = a.tokenizer;
  export_checkpoint(step, a.out, o);
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

void add_ckpt_command(cli::Command& top) {
  cli::Command ckpt = top.sub(
      "ckpt",
      "export, inspect or verify a sharded checkpoint\n"
      "\n"
      "DIR is a checkpoint step directory (<checkpoint.dir>/step_<N>, holding metadata.json and\n"
      "rank_<r>.safetensors) or a checkpoint directory whose `latest` file names one.");
  auto a = std::make_shared<CkptArgs>();  // one of the subcommands is given
  cli::Command ex = ckpt.sub(
      "export",
      "write the fp32 weights as a Hugging Face model directory (or one file)\n"
      "\n"
      "--out DIR: a directory transformers' AutoModelForCausalLM.from_pretrained and\n"
      "AutoTokenizer.from_pretrained load: config.json, model.safetensors (or files of at most\n"
      "--max-shard-bytes with model.safetensors.index.json), the run's tokenizer files. DIR is\n"
      "replaced. --out FILE.safetensors: one file with the same names.\n"
      "Names and layouts as Hugging Face's (GPT-2: h.0.attn.c_attn.weight ... as (in, out);\n"
      "Llama: model.layers.0...), fp32, written one tensor at a time (memory about twice the\n"
      "largest tensor); the weights load with `train --init-from` and `sample --weights`.");
  ex.positional("DIR", a->dir, kDirHelp);
  ex.text("--out", a->out, "OUT", "the output directory, or a file ending in .safetensors")
      .required();
  ex.unsigned_integer("--max-shard-bytes", a->max_shard_bytes, "BYTES",
                      "the largest weights file of a directory (default 5000000000, "
                      "transformers' 5GB)");
  ex.text("--tokenizer", a->tokenizer, "FILE",
          "the tokenizer to copy (tokenizer.json, a .model or a directory; `bytes`: none); "
          "default: the data.tokenizer of the run that saved");
  ex.on_run([a] { return cmd_export(*a); });

  cli::Command in = ckpt.sub(
      "inspect",
      "print a checkpoint's step, world size, strategy, model, parameters\n"
      "\n"
      "Prints the step, world size, strategy, model config, every parameter (shape, dtype,\n"
      "bytes) and every shard file.");
  in.positional("DIR", a->dir, kDirHelp);
  in.on_run([a] { return cmd_inspect(*a); });

  cli::Command ve = ckpt.sub(
      "verify",
      "check every checksum of a checkpoint\n"
      "\n"
      "Checks the metadata, every block of every tensor and every file; prints 'ok ...' and\n"
      "exits 0, or one error line naming file and tensor and exits 1.");
  ve.positional("DIR", a->dir, kDirHelp);
  ve.on_run([a] { return cmd_verify(*a); });
}

}  // namespace sw
