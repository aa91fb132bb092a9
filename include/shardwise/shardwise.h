/// @file
/// @brief Everything of Shardwise's C++ API: `#include <shardwise/shardwise.h>`.
///
/// The topic headers, each usable alone:
///  - shardwise/unit.h, shardwise/model.h: a Model made of Units of your own (parameters,
///    forward and backward with the kernels of shardwise/ops.h), or a built-in GPT-2 / Llama
///    (sw::build_model);
///  - shardwise/trainer.h, shardwise/run_config.h: a whole training run (data, schedule,
///    evaluation, checkpoints, export) configured in code or from a JSON file;
///  - shardwise/sharded_model.h: your own training loop over a sharded model;
///  - shardwise/checkpoint.h: checkpoints on disk; shardwise/planner.h: memory and time
///    predictions; shardwise/version.h: the version macros.
///
/// Link the CMake target Shardwise::shardwise (find_package(Shardwise)), or use
/// `pkg-config --cflags --libs shardwise`.
#pragma once

#include "shardwise/alloc.h"
#include "shardwise/checkpoint.h"
#include "shardwise/device.h"
#include "shardwise/dtype.h"
#include "shardwise/error.h"
#include "shardwise/model.h"
#include "shardwise/ops.h"
#include "shardwise/planner.h"
#include "shardwise/recompute.h"
#include "shardwise/run_config.h"
#include "shardwise/sharded_model.h"
#include "shardwise/stream.h"
#include "shardwise/tensor.h"
#include "shardwise/trainer.h"
#include "shardwise/unit.h"
#include "shardwise/version.h"
