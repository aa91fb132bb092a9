// Durable small-file writes and directory syncs, shared by the checkpoint writer
// (sharded_checkpoint.cpp) and the engine's checkpointer (the `latest` pointer). Errors throw
// sw::Error("checkpoint: <path>: ...").
#pragma once
#include <string>

namespace sw {

// Writes `text` to `path` (created or truncated) and fsyncs it.
void write_file_synced(const std::string& path, const std::string& text);
// fsync of a directory: makes renames and creations inside it durable.
void fsync_dir(const std::string& dir);
// The directory holding `path` ("." for a bare name).
std::string parent_dir(const std::string& path);

}  // namespace sw
