// Moved to the public header set (issue 40): include "shardwise/recompute.h".
#pragma once
#include "shardwise/recompute.h"
