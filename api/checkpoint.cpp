// The public functions of shardwise/checkpoint.h over checkpoint/sharded_checkpoint.h.
#include "shardwise/checkpoint.h"

#include "checkpoint/sharded_checkpoint.h"

namespace sw::api {

void verify_checkpoint(const std::string& dir) { sw::verify_checkpoint(resolve_checkpoint(dir)); }
std::string describe_checkpoint(const std::string& dir) {
  return sw::inspect_checkpoint(resolve_checkpoint(dir));
}
std::string resolve_checkpoint(const std::string& path) { return resolve_checkpoint_dir(path); }

}  // namespace sw::api
