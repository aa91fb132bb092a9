// `shardwise plan` and `shardwise plan-dump` (tools/plan_cmd.cpp): the predicted per-rank peak
// per tier and category and the step time (plan replay), the search under a memory budget,
// --calibrate; and the step plan a run executes, printed.
#pragma once
#include "tools/cli.h"

namespace sw {

// Declares `plan` and `plan-dump` (their options, with help, and what each runs once parsed)
// under `top`. Usage mistakes exit 2 (tools/cli.h); config errors are sw::Error.
void add_plan_commands(cli::Command& top);

}  // namespace sw
