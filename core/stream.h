// Moved to the public header set (issue 40): include "shardwise/stream.h".
#pragma once
#include "shardwise/stream.h"
