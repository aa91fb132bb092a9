// Moved to the public header set (issue 40): include "shardwise/error.h".
#pragma once
#include "shardwise/error.h"
