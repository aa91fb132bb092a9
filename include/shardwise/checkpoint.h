/// @file
/// @brief Sharded checkpoints on disk: check, describe and find them without a model.
///
/// A checkpoint is a step directory (written by sw::api::ShardedModel::save, or by a
/// training run into `<checkpoint.dir>/step_<N>`): per-rank safetensors shards with a
/// checksum per block and a metadata.json. It loads at any number of ranks and strategy.
#pragma once
#include <string>

namespace sw::api {

/// Reads every block of the step directory `dir` and checks its checksum. Throws sw::Error
/// naming the file and tensor that is missing, truncated or corrupt.
void verify_checkpoint(const std::string& dir);

/// A human-readable table of the checkpoint in `dir`: its step, world size, strategy and each
/// tensor with its shape.
std::string describe_checkpoint(const std::string& dir);

/// The step directory `path` stands for: itself when it is one, else the one named by the
/// `latest` file of the checkpoint directory `path`. Throws sw::Error when neither.
std::string resolve_checkpoint(const std::string& path);

}  // namespace sw::api
