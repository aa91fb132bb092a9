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
// Puts the complete directory `tmp` (already fsynced) in the place of `dir`: a `dir` already
// there is first renamed to dir.old, so a failure leaves it (or tmp) in place, never neither;
// dir.old is removed once tmp is dir, and the parent is fsynced. Throws sw::Error(component:...).
void replace_dir(const std::string& tmp, const std::string& dir, const char* component);

}  // namespace sw
