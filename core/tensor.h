// Moved to the public header set (issue 40): include "shardwise/tensor.h".
#pragma once
#include "shardwise/tensor.h"
