// `shardwise ckpt`: export a sharded checkpoint to Hugging Face safetensors, print its table,
// verify every checksum. DIR is a step directory (step_<N>/ with metadata.json) or a
// checkpoint directory whose `latest` file names one.
#include "tools/ckpt_cmd.h"

#include <cstdio>
#include <iostream>

#include "checkpoint/sharded_checkpoint.h"

namespace sw {

namespace {

const char* kCkptHelp =
    "Usage: shardwise ckpt export DIR --out MODEL.safetensors\n"
    "       shardwise ckpt inspect DIR\n"
    "       shardwise ckpt verify DIR\n"
    "\n"
    "DIR is a checkpoint step directory (<checkpoint.dir>/step_<N>, holding metadata.json and\n"
    "rank_<r>.safetensors) or a checkpoint directory whose `latest` file names one.\n"
    "\n"
    "  export    write the consolidated fp32 weights with Hugging Face names and layouts\n"
    "            (GPT-2: h.0.attn.c_attn.weight ... as (in, out); Llama: model.layers.0...),\n"
    "            one tensor at a time (memory about twice the largest tensor); the file\n"
    "            loads with `train --init-from` and `sample --weights`\n"
    "  inspect   print step, world size, strategy, model config, every parameter (shape,\n"
    "            dtype, bytes) and every shard file\n"
    "  verify    check every checksum (metadata, every block of every tensor, every file);\n"
    "            prints 'ok ...' and exits 0, or one error line naming file and tensor, exit 1\n"
    "\n"
    "Options:\n"
    "  --out FILE   (export) the output file\n"
    "  -h, --help   show this help\n";

int usage(const std::string& msg) {
  std::fflush(stdout);
  std::fprintf(stderr, "shardwise: %s\nTry 'shardwise ckpt --help'.\n", msg.c_str());
  return 2;
}

bool is_help(const std::string& a) { return a == "-h" || a == "--help"; }

}  // namespace

int cmd_ckpt(const std::vector<std::string>& args) {
  if (args.empty()) return usage("missing ckpt subcommand (expected export, inspect or verify)");
  const std::string& sub = args[0];
  if (is_help(sub)) {
    std::cout << kCkptHelp;
    return 0;
  }
  if (sub != "export" && sub != "inspect" && sub != "verify")
    return usage("unknown ckpt subcommand '" + sub + "' (expected export, inspect or verify)");
  std::string dir, out;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (is_help(a)) {
      std::cout << kCkptHelp;
      return 0;
    }
    if (a == "--out" || a.rfind("--out=", 0) == 0) {
      if (sub != "export") return usage("--out is an option of 'ckpt export'");
      if (a == "--out") {
        if (i + 1 >= args.size()) return usage("option --out needs a value");
        out = args[++i];
      } else {
        out = a.substr(6);
      }
    } else if (a.size() > 1 && a[0] == '-') {
      return usage("unknown option '" + a + "' for 'ckpt " + sub + "'");
    } else if (dir.empty()) {
      dir = a;
    } else {
      return usage("unexpected argument '" + a + "' (one DIR expected)");
    }
  }
  if (dir.empty()) return usage("missing checkpoint DIR");
  if (sub == "export" && out.empty()) return usage("missing --out MODEL.safetensors");

  const std::string step = resolve_checkpoint_dir(dir);
  if (sub == "export") {
    export_checkpoint(step, out);
    std::cout << "exported " << step << " -> " << out << "\n";
  } else if (sub == "inspect") {
    std::cout << inspect_checkpoint(step);
  } else {
    verify_checkpoint(step);
    std::cout << "ok " << step << ": every checksum matches\n";
  }
  return 0;
}

}  // namespace sw
