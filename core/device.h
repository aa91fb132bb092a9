// Moved to the public header set (issue 40): include "shardwise/device.h".
#pragma once
#include "shardwise/device.h"
