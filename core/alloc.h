// Moved to the public header set (issue 40): include "shardwise/alloc.h".
#pragma once
#include "shardwise/alloc.h"
