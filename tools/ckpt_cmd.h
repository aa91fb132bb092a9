// `shardwise ckpt export|inspect|verify` (tools/ckpt_cmd.cpp).
#pragma once
#include "tools/cli.h"

namespace sw {

// Declares `ckpt` and its subcommands (their options, with help, and what each runs once
// parsed) under `top`. Usage mistakes exit 2 (tools/cli.h); errors in the checkpoint itself
// are thrown as sw::Error (one line, naming file and tensor), which main() prints and turns
// into exit 1.
void add_ckpt_command(cli::Command& top);

}  // namespace sw
