// Moved to the public header set (issue 40): include "shardwise/dtype.h".
#pragma once
#include "shardwise/dtype.h"
