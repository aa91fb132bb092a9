// Moved to the public header set (issue 40): include "shardwise/ops.h".
#pragma once
#include "shardwise/ops.h"
