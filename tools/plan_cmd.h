// `shardwise plan-dump` (tools/plan_cmd.cpp): prints the step plan a run would execute.
#pragma once
#include <string>
#include <vector>

namespace sw {

// args: what follows `plan-dump`. Returns the exit code (0 done, 2 a usage mistake printed as
// "shardwise: <problem>" plus a --help hint); config errors are thrown as sw::Error.
int cmd_plan_dump(const std::vector<std::string>& args);
// `shardwise plan`: the predicted per-rank peak per tier and category (plan replay).
int cmd_plan(const std::vector<std::string>& args);

}  // namespace sw
