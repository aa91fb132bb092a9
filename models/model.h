// Moved to the public header set (issue 40): include "shardwise/model.h".
#pragma once
#include "shardwise/model.h"
