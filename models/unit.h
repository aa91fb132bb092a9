// Moved to the public header set (issue 40): include "shardwise/unit.h".
#pragma once
#include "shardwise/unit.h"
