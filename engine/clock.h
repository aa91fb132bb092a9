// Wall-clock timing for the engine's metrics (step time, checkpoint stalls): the clock lives in
// core/clock.h (shared with the memory event log's timeline).
#pragma once
#include "core/clock.h"
