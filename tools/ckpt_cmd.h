// `shardwise ckpt export|inspect|verify` (tools/ckpt_cmd.cpp).
#pragma once
#include <string>
#include <vector>

namespace sw {

// args: what follows `ckpt`. Returns the exit code: 0 done, 2 a usage mistake (printed as
// "shardwise: <problem>" plus a --help hint). Errors in the checkpoint itself are thrown as
// sw::Error (one line, naming file and tensor), which main() prints and turns into exit 1.
int cmd_ckpt(const std::vector<std::string>& args);

}  // namespace sw
